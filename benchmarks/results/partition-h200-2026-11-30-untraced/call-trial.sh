#!/usr/bin/env bash
# H200: the spread with its trial (spread vs the fastest device alone) against the GPU
# alone, untraced.
set -u
bash .gl/setup.sh > /dev/null 2>&1
R=.devbench/rafter; xz -dkf .devbench/rafter.xz; chmod +x $R
M=.cache/models; mkdir -p $M
python3 benchmarks/gpu/export_midgraph.py $M > /tmp/exp.txt 2>&1
python3 scripts/export_models.py --only mobilenet_v2 bert_base > /tmp/export.txt 2>&1
python3 benchmarks/gpu/export_f16.py --only bert_base > /tmp/export16.txt 2>&1
echo "exported at ${SECONDS}s"
ins() { local m=$1 s=""; for f in $M/${m}_inputs/*.npy; do [ -f "$f" ] && s="$s --input $(basename $f .npy)=$f"; done; echo "$s"; }
for m in mobilenet_v2 bert_base_f16 midgraph bert_base; do
  I=$(ins $m)
  echo "$m vulkan: $(timeout 100 $R bench $M/$m.onnx --device vulkan $I --warmup 5 --iters 200 --in-flight 4 2>&1 | grep '^stream' | cut -c1-70)"
  echo "$m auto: $(timeout 150 $R bench $M/$m.onnx --device auto --objective throughput $I --warmup 5 --iters 200 --in-flight 4 2>&1 | grep -E '^spread' | tr '\n' ' ' | cut -c1-420)"
done
echo "done in ${SECONDS}s"
