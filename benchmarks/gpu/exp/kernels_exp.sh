#!/usr/bin/env bash
# Every kernel's estimate against its median time inside the benchmark models, on the
# H200 machine's host CPU and GPU (`RAFTER_ESTIMATE_KERNELS=1000 rafter bench --estimate`):
# which kernels a model runs slower than their probes. Carry .gl (the stripped rafter).
#   OUT=/tmp/out bash benchmarks/gpu/exp/kernels_exp.sh
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
[ -f .gl/setup.sh ] && bash .gl/setup.sh > "$out/setup.txt" 2>&1
R=.gl/rafter; M=.cache/models
export RAFTER_DEVICE_PROFILES="$out/profiles.txt" RAFTER_ESTIMATE_KERNELS=1000
python3 scripts/export_models.py --only ${MODELS:-resnet50 mobilenet_v2 minilm_l6} > "$out/export.txt" 2>&1
RAFTER_PROFILE_POINTS=1 $R devices --profile > "$out/profile.txt" 2>&1
for m in ${MODELS:-resnet50 mobilenet_v2 minilm_l6}; do
  ins=""; for f in $M/${m}_inputs/*.npy; do ins="$ins --input $(basename "$f" .npy)=$f"; done
  for t in ${TARGETS:-cpu vulkan}; do
    timeout 120 $R bench $M/$m.onnx --device $t $ins --warmup 2 --iters 3 > /dev/null 2>&1
    for r in 1 2; do
      timeout 120 $R bench $M/$m.onnx --device $t $ins --warmup 5 --iters 40 --estimate > "$out/${m}_${t}_r$r.txt" 2>&1
      echo "$m $t r$r: $(grep '^estimate:' "$out/${m}_${t}_r$r.txt")"
    done
  done
done
echo "done in ${SECONDS}s"
