#!/usr/bin/env bash
# The CPU kernels' smallest task (rafter-kernels-cpu `par_blocks`, RAFTER_EXP_MIN_TASK
# elements) on the H200 machine's 16-core host: MobileNetV2, MiniLM-L6, BERT-base on
# --device cpu, sizes alternated over three rounds. BERT-base's 128x768 layer norms ran
# 55 us there in 6 tasks (16K elements each), 43 us on the 2-core dev machine.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/t"
R=.gl/rafter
M=.cache/models
python3 scripts/export_models.py --only mobilenet_v2 minilm_l6 bert_base > "$out/t/export.txt" 2>&1
inputs() { for f in $M/$1_inputs/*.npy; do printf -- '--input %s=%s ' "$(basename "$f" .npy)" "$f"; done; }
for round in 1 2 3; do
  for m in mobilenet_v2 minilm_l6 bert_base; do
    for t in ${SIZES:-16384 8192 4096 2048}; do
      RAFTER_EXP_MIN_TASK=$t $R bench $M/$m.onnx $(inputs $m) --device cpu --warmup 5 --iters 40 \
        > "$out/t/${m}_t${t}_r$round.txt" 2>&1
    done
  done
done
RAFTER_EXP_MIN_TASK=4096 RAFTER_ESTIMATE_KERNELS=1000 $R bench $M/bert_base.onnx $(inputs bert_base) --device cpu --warmup 5 --iters 40 --trace "$out/t/bert_4096.json" > "$out/t/bert_4096_traced.txt" 2>&1
RAFTER_EXP_MIN_TASK=16384 $R bench $M/bert_base.onnx $(inputs bert_base) --device cpu --warmup 5 --iters 40 --trace "$out/t/bert_16384.json" > "$out/t/bert_16384_traced.txt" 2>&1
cd "$out" && tar czf t.tgz t && rm -rf t
