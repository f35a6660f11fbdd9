#!/usr/bin/env bash
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/r"
bash .gl/setup.sh > /dev/null 2>&1
R=.gl/rafter
export RAFTER_DEVICE_PROFILES=benchmarks/results/partition-h200-2026-12-01/profiles.txt
mkdir -p /tmp/ce; python3 benchmarks/gpu/exp/cache_gen.py /tmp/ce
python3 scripts/export_models.py --only resnet50 mobilenet_v2 > "$out/r/export.txt" 2>&1
for dev in cpu vulkan; do
  for f in /tmp/ce/*.onnx; do
    n=$(basename $f .onnx)
    $R bench $f --device $dev --estimate --iters 40 > "$out/r/${dev}_$n.txt" 2>&1
  done
done
for m in resnet50 mobilenet_v2; do
  for dev in cpu vulkan; do
    ins=""; for f in .cache/models/${m}_inputs/*.npy; do ins="$ins --input $(basename $f .npy)=$f"; done
    $R bench .cache/models/$m.onnx $ins --device $dev --estimate --iters 40 --trace "$out/r/trace_${m}_$dev.json" > "$out/r/${dev}_$m.txt" 2>&1
  done
done
cd "$out" && tar czf r.tgz r && rm -rf r
