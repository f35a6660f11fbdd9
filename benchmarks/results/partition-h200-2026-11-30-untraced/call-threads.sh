#!/usr/bin/env bash
# H200: latency/estimate table with overlapped GPU dispatch; MobileNetV2 spread with CPU
# threads 16 / 15 / 14 against the GPU alone (untraced), alternated.
set -u
bash .gl/setup.sh > /dev/null 2>&1
R=.devbench/rafter; xz -dkf .devbench/rafter.xz; chmod +x $R
mkdir -p /tmp/out
STREAMS=0 REPS=3 ITERS=60 BUDGET_S=300 OUT=/tmp/out bash benchmarks/gpu/h200_partition.sh > /tmp/out/log.txt 2>&1
grep -E "calibrate vulkan: hand|link|dispatch" /tmp/out/profile.txt
head -12 /tmp/out/summary.md
export RAFTER_DEVICE_PROFILES=/tmp/out/profiles.txt
M=.cache/models
ins() { local m=$1 s=""; for f in $M/${m}_inputs/*.npy; do [ -f "$f" ] && s="$s --input $(basename $f .npy)=$f"; done; echo "$s"; }
for m in mobilenet_v2 resnet50; do
  I=$(ins $m)
  for r in 1 2; do
    echo "$m vulkan r$r: $(timeout 100 $R bench $M/$m.onnx --device vulkan $I --warmup 5 --iters 400 --in-flight 4 2>&1 | grep '^stream' | cut -c1-80)"
    for t in 0 15 14; do
      echo "$m spread t=$t r$r: $(timeout 100 $R bench $M/$m.onnx --device auto --objective throughput --threads $t $I --warmup 5 --iters 400 --in-flight 4 2>&1 | grep '^spread' | tr '\n' ' ' | cut -c1-200)"
    done
    echo "$m cpu t=15 r$r: $(timeout 100 $R bench $M/$m.onnx --device cpu --threads 15 $I --warmup 5 --iters 200 --in-flight 4 2>&1 | grep '^stream' | cut -c1-80)"
  done
done
tar czf $OUT/results.tgz -C /tmp out
echo "done in ${SECONDS}s"
