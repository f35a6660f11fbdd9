#!/usr/bin/env bash
# gemm_chain_gen.py's GEMM chains and switch_gen.py's layer-norm chain on the GPU, against
# one profile (PROFILE=file, else a fresh `rafter devices --profile`): per-kernel traced
# times (`bench --estimate`, RAFTER_ESTIMATE_KERNELS) and untraced call medians. What a
# GPU kernel costs inside a chain of dependent kernels against the probe's lone kernel,
# and whether it grows once the chain's weights outgrow the GPU's L2. ~1-2 minutes.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/g"
bash .gl/setup.sh > /dev/null 2>&1
R=.gl/rafter
export RAFTER_DEVICE_PROFILES=$out/g/profiles.txt
if [ -n "${PROFILE:-}" ]; then cp "$PROFILE" "$RAFTER_DEVICE_PROFILES"
else RAFTER_PROFILE_POINTS=1 $R devices --profile > "$out/g/profile.txt" 2>&1; fi
mkdir -p /tmp/gc; python3 benchmarks/gpu/exp/gemm_chain_gen.py /tmp/gc
python3 benchmarks/gpu/exp/switch_gen.py /tmp/gc
for rep in $(seq 1 ${REPS:-2}); do
for n in h1 h12 h64 h160 g1 g4 g16 g64 g160 ln_chain mm_ln; do
  f=/tmp/gc/$n.onnx
  RAFTER_ESTIMATE_KERNELS=1000 $R bench $f --device vulkan --warmup 20 --iters 60 --estimate \
    > "$out/g/${n}_$rep.txt" 2>&1
  $R bench $f --device vulkan --warmup 20 --iters 200 > "$out/g/${n}_plain_$rep.txt" 2>&1
done; done
cd "$out" && tar czf g.tgz g && rm -rf g
