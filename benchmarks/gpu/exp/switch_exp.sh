#!/usr/bin/env bash
# switch_gen.py's graphs on the GPU (and the host CPU): each kernel traced, and the calls'
# untraced wall time, twice each. Per-kernel medians: `rafter bench --estimate` with
# RAFTER_ESTIMATE_KERNELS lists every kernel against its estimate (a profile is made
# first, as `rafter devices --profile` stores it). ~2-3 minutes on the H200 machine.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/r"
bash .gl/setup.sh > /dev/null 2>&1
R=.gl/rafter
export RAFTER_DEVICE_PROFILES=$out/r/profiles.txt
RAFTER_PROFILE_POINTS=1 $R devices --profile > "$out/r/profile.txt" 2>&1
mkdir -p /tmp/sw; python3 benchmarks/gpu/exp/switch_gen.py /tmp/sw
for rep in 1 2; do
for dev in vulkan cpu; do
for f in /tmp/sw/*.onnx; do
  n=$(basename $f .onnx)
  RAFTER_ESTIMATE_KERNELS=1000 $R bench $f --device $dev --warmup 20 --iters 60 --estimate \
    > "$out/r/${dev}_${n}_$rep.txt" 2>&1
  $R bench $f --device $dev --warmup 20 --iters 200 > "$out/r/${dev}_${n}_plain_$rep.txt" 2>&1
done; done; done
cd "$out" && tar czf r.tgz r && rm -rf r
