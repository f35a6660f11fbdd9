#!/usr/bin/env bash
# Which products take MatmulTile::Sliced (K split over four warp groups) on the GPU:
# RAFTER_EXP_SLICED_K / _N (the least K, the most N; 512 / 1024 before) for MiniLM-L6
# (K = 384 projections, 48 tiles of 32x32 at M = 128) and BERT-base, --device vulkan,
# configurations alternated over three rounds; one traced run each for per-kernel times.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/s"
bash .gl/setup.sh > /dev/null 2>&1
R=.gl/rafter
M=.cache/models
python3 scripts/export_models.py --only minilm_l6 bert_base > "$out/s/export.txt" 2>&1
inputs() { for f in $M/$1_inputs/*.npy; do printf -- '--input %s=%s ' "$(basename "$f" .npy)" "$f"; done; }
for round in 1 2 3; do
  for cfg in 512:1024 384:1024 256:1024 256:2048; do
    k=${cfg%:*}; n=${cfg#*:}
    for m in minilm_l6 bert_base; do
      RAFTER_EXP_SLICED_K=$k RAFTER_EXP_SLICED_N=$n $R bench $M/$m.onnx $(inputs $m) --device vulkan \
        --warmup 20 --iters 200 > "$out/s/${m}_k${k}_n${n}_r$round.txt" 2>&1
      [ $round = 1 ] && RAFTER_EXP_SLICED_K=$k RAFTER_EXP_SLICED_N=$n $R bench $M/$m.onnx $(inputs $m) \
        --device vulkan --warmup 20 --iters 30 --trace "$out/s/${m}_k${k}_n${n}.json" > /dev/null 2>&1
    done
  done
done
cd "$out" && tar czf s.tgz s && rm -rf s
