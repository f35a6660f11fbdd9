#!/usr/bin/env bash
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/r"
bash .gl/setup.sh > /dev/null 2>&1
R=.gl/rafter
export RAFTER_DEVICE_PROFILES=benchmarks/results/partition-h200-2026-12-01/profiles.txt
mkdir -p /tmp/ce; python3 benchmarks/gpu/exp/cache_gen.py /tmp/ce
for rep in 1 2; do
for f in /tmp/ce/pw256_56_64_r1.onnx /tmp/ce/pw1024_14_256_r1.onnx; do
  n=$(basename $f .onnx)
  $R bench $f --device cpu --warmup 2 --iters 9 --trace $out/r/t_${n}_short_$rep.json > "$out/r/${n}_short_$rep.txt" 2>&1
  $R bench $f --device cpu --warmup 200 --iters 200 --trace $out/r/t_${n}_long_$rep.json > "$out/r/${n}_long_$rep.txt" 2>&1
  sleep 1
done
done
cd "$out" && tar czf r.tgz r && rm -rf r
