#!/usr/bin/env bash
# chain_gen.py's stage-2 convolutions (`s2_*`) and ResNet-50 on the H200 machine's host
# CPU, every kernel's estimate against its median time (see chain_gen.py). Carry .gl (the
# stripped rafter).
#   OUT=/tmp/out bash benchmarks/gpu/exp/stage2_exp.sh
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
[ -f .gl/setup.sh ] && bash .gl/setup.sh > "$out/setup.txt" 2>&1
R=.gl/rafter; M=.cache/models
export RAFTER_DEVICE_PROFILES="$out/profiles.txt" RAFTER_ESTIMATE_KERNELS=1000
python3 scripts/export_models.py --only resnet50 > "$out/export.txt" 2>&1
python3 benchmarks/gpu/exp/chain_gen.py "$M"
RAFTER_PROFILE_POINTS=1 $R devices --profile > "$out/profile.txt" 2>&1
for m in s2_down s2_up s2_chain resnet50; do
  ins=""; for f in $M/${m}_inputs/*.npy; do [ -f "$f" ] && ins="$ins --input $(basename "$f" .npy)=$f"; done
  timeout 120 $R bench $M/$m.onnx --device cpu $ins --warmup 2 --iters 3 > /dev/null 2>&1
  for r in 1 2; do
    timeout 120 $R bench $M/$m.onnx --device cpu $ins --warmup 5 --iters 40 --estimate > "$out/${m}_cpu_r$r.txt" 2>&1
    echo "$m cpu r$r: $(grep '^estimate:' "$out/${m}_cpu_r$r.txt")"
  done
done
echo "done in ${SECONDS}s"
