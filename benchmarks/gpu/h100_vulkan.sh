#!/usr/bin/env bash
# The H100 run of issue 4 (see benchmarks/RESULTS.md): rafter's Vulkan conformance, the
# GPU tests, and the three models on --device vulkan next to PyTorch CUDA, in one call;
# `h100_vulkan.sh f16` runs only the f16 models (`tests`, `models`: only those parts).
# Expects .gl/ to hold the loader debs + setup.sh, the stripped `rafter`, the test binaries
# (gpu-*, matmul-*, vulkan-*) and conf.tar.xz (the generated ONNX conformance suite).
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
bash .gl/setup.sh
part=${1:-all}
# Test binaries look for fixtures under the checkout they were built in.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
.gl/rafter devices > "$out/devices.txt" 2>&1
if [ "$part" = all ] || [ "$part" = tests ]; then
mkdir -p /tmp/conf && tar -C /tmp/conf -xJf .gl/conf.tar.xz
# One worker thread: with 16 (the default there) the run did not finish in 10 minutes
# (under investigation); with 1 it takes ~20 s.
timeout 300 .gl/rafter conformance --device vulkan --dir /tmp/conf/onnx-conformance --threads 1 > "$out/conformance_vulkan.txt" 2>&1
tail -3 "$out/conformance_vulkan.txt"
# One test thread (see above); the 160 MiB lavapipe test is skipped: reading 160 MiB back
# through the H100's mapped BAR memory takes minutes (uncached reads).
for t in .gl/gpu-* .gl/matmul-* .gl/vulkan-* .gl/conv-* .gl/f16-* .gl/gather-*; do
  RAFTER_REQUIRE_VULKAN=1 RAFTER_REQUIRE_COOP=1 timeout 120 "$t" --test-threads 1 --skip larger_than_the_storage_buffer_range > "$out/$(basename "$t").txt" 2>&1
  echo "$t: $(grep 'test result' "$out/$(basename "$t").txt")"
done
fi
# Compiles .cache/models/$1.onnx for Vulkan, benches it, and compares its outputs with
# .cache/models/$1_outputs/ (ONNX Runtime f32); with .cache/models/$1_torch/ (an f16
# model's PyTorch f16 outputs) also prints PyTorch's own error against the same reference.
bench_model() {
  local m=$1 M=.cache/models ins=""
  [ -f $M/$m.onnx ] || { echo "$m: no $M/$m.onnx"; return; }
  .gl/rafter compile $M/$m.onnx --target vulkan -o /tmp/$m.rfa --dim batch=1 --dim seq=128 > "$out/compile_$m.txt" 2>&1
  .gl/rafter plan /tmp/$m.rfa 2>&1 | grep placement >> "$out/compile_$m.txt"
  for f in $M/${m}_inputs/*.npy; do ins="$ins --input $(basename "$f" .npy)=$f"; done
  # An untimed process first (see h100_coop.sh: the first process after the exports ran slow).
  .gl/rafter bench /tmp/$m.rfa $ins --warmup 3 --iters 20 > /dev/null 2>&1
  .gl/rafter bench /tmp/$m.rfa $ins --warmup 10 --iters 50 > "$out/bench_$m.txt" 2>&1
  echo "$m: $(grep placement "$out/compile_$m.txt") | $(tail -1 "$out/bench_$m.txt")"
  # GPU time per kernel class, from the GPU timestamps of a traced run.
  .gl/rafter bench /tmp/$m.rfa $ins --warmup 5 --iters 20 --trace /tmp/$m.trace.json > /dev/null 2>&1
  python3 benchmarks/gpu/trace_summary.py /tmp/$m.trace.json 20 8 > "$out/trace_$m.txt" 2>&1
  head -12 "$out/trace_$m.txt"
  .gl/rafter run /tmp/$m.rfa $ins --output-dir /tmp/${m}_out > /dev/null 2>&1
  python3 benchmarks/gpu/check_outputs.py "$m" /tmp/${m}_out >> "$out/bench_$m.txt" 2>&1
  tail -1 "$out/bench_$m.txt"
}
if [ "$part" = all ] || [ "$part" = models ]; then
python3 scripts/export_models.py --only bert_base resnet50 mobilenet_v2 > "$out/export.txt" 2>&1; tail -2 "$out/export.txt"
for m in resnet50 mobilenet_v2 bert_base; do bench_model $m; done
python3 benchmarks/gpu/torch_models.py > "$out/torch.txt" 2>&1; cat "$out/torch.txt"
fi
# f16: the same models exported with model.half() (benchmarks/gpu/export_f16.py; needs
# the f32 exports above for the weights' seed, inputs and reference outputs). PyTorch's
# f16 times come from torch_models.py (run here unless the models part already did).
if [ "$part" = all ] || [ "$part" = f16 ]; then
[ -d .cache/models/resnet50_outputs ] || python3 scripts/export_models.py --only bert_base resnet50 mobilenet_v2 > "$out/export.txt" 2>&1
python3 benchmarks/gpu/export_f16.py > "$out/export_f16.txt" 2>&1; grep -E "torch f16|cannot" "$out/export_f16.txt"
for m in resnet50 mobilenet_v2 bert_base; do bench_model ${m}_f16; done
[ -f "$out/torch.txt" ] || python3 benchmarks/gpu/torch_models.py > "$out/torch.txt" 2>&1
grep float16 "$out/torch.txt"
fi
