#!/usr/bin/env bash
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/r"
bash .gl/setup.sh > /dev/null 2>&1
R=.gl/rafter
mkdir -p /tmp/ch; python3 benchmarks/gpu/exp/chain_gen.py /tmp/ch
for rep in 1 2; do
for dev in cpu vulkan; do
for f in /tmp/ch/*.onnx; do
  n=$(basename $f .onnx)
  $R bench $f --device $dev --warmup 20 --iters 60 --trace $out/r/t_${dev}_${n}_$rep.json > "$out/r/${dev}_${n}_$rep.txt" 2>&1
done; done; done
cd "$out" && tar czf r.tgz r && rm -rf r
