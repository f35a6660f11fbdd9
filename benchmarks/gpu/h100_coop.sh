#!/usr/bin/env bash
# Cooperative-matrix (tensor core) variants on the H100, in one device call: the f16 test
# binary with RAFTER_REQUIRE_COOP=1 (every tile's variant against the reference), then
# issue 4's f16 models benched with the variants and without (RAFTER_VULKAN_NO_COOP=1),
# alternated `rounds` times (`--warmup 10 --iters 50`), a traced run with them, their
# outputs against ONNX Runtime f32 and PyTorch f16, and PyTorch's f16 times beside.
#   bash benchmarks/gpu/h100_coop.sh [rounds]
# Expects .gl/ to hold setup.sh with the loader debs, the stripped `rafter` and f16-*.
set -u
rounds=${1:-2}
out=${OUT:-/tmp/coop}; mkdir -p "$out"
bash .gl/setup.sh
# Test binaries look for fixtures under the checkout they were built in.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
.gl/rafter devices > "$out/devices.txt" 2>&1; grep -i "cooperative" "$out/devices.txt"
for t in .gl/f16-* .gl/gather-*; do
  RAFTER_REQUIRE_VULKAN=1 RAFTER_REQUIRE_COOP=1 timeout 120 "$t" --test-threads 1 > "$out/$(basename "$t").txt" 2>&1
  echo "$t: $(grep 'test result' "$out/$(basename "$t").txt")"
  grep -A3 "panicked" "$out/$(basename "$t").txt" | head -8
done
python3 scripts/export_models.py --only bert_base resnet50 mobilenet_v2 > "$out/export.txt" 2>&1; tail -1 "$out/export.txt"
python3 benchmarks/gpu/export_f16.py > "$out/export_f16.txt" 2>&1; tail -1 "$out/export_f16.txt"
M=.cache/models
for m in resnet50_f16 mobilenet_v2_f16 bert_base_f16; do
  [ -f $M/$m.onnx ] || { echo "$m: not exported"; continue; }
  .gl/rafter compile $M/$m.onnx --target vulkan -o /tmp/$m.rfa --dim batch=1 --dim seq=128 > "$out/compile_$m.txt" 2>&1 || { tail -3 "$out/compile_$m.txt"; continue; }
  ins=""
  for f in $M/${m}_inputs/*.npy; do ins="$ins --input $(basename "$f" .npy)=$f"; done
  # An untimed process first: the first process to run a model after the exports was slow
  # in every call (median 2-3x, p10 near the later medians), later ones nearly never.
  # Not GPU clocks (at 1980 MHz throughout); see RESULTS.md, "The slow first process".
  .gl/rafter bench /tmp/$m.rfa $ins --warmup 3 --iters 20 > /dev/null 2>&1
  for r in $(seq "$rounds"); do
    for mode in plain coop; do
      no=0; [ $mode = plain ] && no=1
      RAFTER_VULKAN_NO_COOP=$no .gl/rafter bench /tmp/$m.rfa $ins --warmup 10 --iters 50 > "$out/bench_${m}_${mode}_$r.txt" 2>&1
      echo "$m $mode round $r: $(tail -1 "$out/bench_${m}_${mode}_$r.txt")"
    done
  done
  .gl/rafter bench /tmp/$m.rfa $ins --warmup 5 --iters 20 --trace /tmp/$m.trace.json > /dev/null 2>&1
  python3 benchmarks/gpu/trace_summary.py /tmp/$m.trace.json 20 8 > "$out/trace_$m.txt" 2>&1
  head -6 "$out/trace_$m.txt"
  .gl/rafter run /tmp/$m.rfa $ins --output-dir /tmp/${m}_out > /dev/null 2>&1
  python3 benchmarks/gpu/check_outputs.py "$m" /tmp/${m}_out
done
python3 benchmarks/gpu/torch_models.py > "$out/torch.txt" 2>&1; grep float16 "$out/torch.txt"
