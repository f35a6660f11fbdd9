#!/usr/bin/env bash
# Whether the host CPU's untraced calls are slower than its traced ones (run r of
# 2026-12-01: BERT-base's untraced median 32.3 ms against 28.9 of traced kernel time):
# `bench` plain and `bench --trace` alternated in separate processes, three rounds, for
# MiniLM-L6 and BERT-base on --device cpu; the traces kept for the gaps between kernels.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/g"
R=.gl/rafter
M=.cache/models
python3 scripts/export_models.py --only minilm_l6 bert_base > "$out/g/export.txt" 2>&1
inputs() { for f in $M/$1_inputs/*.npy; do printf -- '--input %s=%s ' "$(basename "$f" .npy)" "$f"; done; }
for round in 1 2 3; do
  for m in minilm_l6 bert_base; do
    $R bench $M/$m.onnx $(inputs $m) --device cpu --warmup 5 --iters 40 > "$out/g/${m}_plain_r$round.txt" 2>&1
    $R bench $M/$m.onnx $(inputs $m) --device cpu --warmup 5 --iters 40 --trace "$out/g/${m}_r$round.json" \
      > "$out/g/${m}_traced_r$round.txt" 2>&1
  done
done
cd "$out" && tar czf g.tgz g && rm -rf g
