#!/usr/bin/env bash
# A/B of two rafter builds on the H100, alternated in one device call (issue 4's models,
# batch 1): `bash benchmarks/gpu/h100_ab.sh .gl/rafter.old .gl/rafter [rounds]`.
# Exports the models on the device (scripts/export_models.py), compiles each once with the
# second binary (both must read its artifact), then benches A, B, A, B, ... with
# `--warmup 10 --iters 50`, and finishes with a traced run of B and an output check
# against ONNX Runtime. Writes everything under $OUT (or /tmp/ab).
#   MODELS="bert_base bert_base_f16"  which models (default: the three f32 ones; `_f16`
#                                     names are exported by benchmarks/gpu/export_f16.py)
#   COMPILE_EACH=1                    each build compiles its own artifact (for compiler or
#                                     kernel changes; the first must read its own format)
set -u
if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: $0 OLD_RAFTER NEW_RAFTER [ROUNDS]  (both executable rafter binaries)" >&2
  exit 2
fi
a=$1; b=$2; rounds=${3:-2}
out=${OUT:-/tmp/ab}; mkdir -p "$out"
models=${MODELS:-mobilenet_v2 resnet50 bert_base}
python3 scripts/export_models.py --only bert_base resnet50 mobilenet_v2 > "$out/export.txt" 2>&1; tail -1 "$out/export.txt"
case "$models" in *_f16*) python3 benchmarks/gpu/export_f16.py > "$out/export_f16.txt" 2>&1; tail -1 "$out/export_f16.txt";; esac
M=.cache/models
# The artifact a build runs: its own with COMPILE_EACH=1, else the second build's.
rfa() { if [ "${COMPILE_EACH:-0}" = 1 ]; then echo "/tmp/$1.$(basename "$2").rfa"; else echo "/tmp/$1.rfa"; fi; }
for m in $models; do
  [ -f $M/$m.onnx ] || continue
  "$b" compile $M/$m.onnx --target vulkan -o "$(rfa "$m" "$b")" --dim batch=1 --dim seq=128 > "$out/compile_$m.txt" 2>&1
  [ "${COMPILE_EACH:-0}" = 1 ] && "$a" compile $M/$m.onnx --target vulkan -o "$(rfa "$m" "$a")" --dim batch=1 --dim seq=128 > /dev/null 2>&1
  ins=""
  for f in $M/${m}_inputs/*.npy; do ins="$ins --input $(basename "$f" .npy)=$f"; done
  for r in $(seq "$rounds"); do
    for bin in "$a" "$b"; do
      "$bin" bench "$(rfa "$m" "$bin")" $ins --warmup 10 --iters 50 > "$out/bench_${m}_$(basename "$bin")_$r.txt" 2>&1
      echo "$m $(basename "$bin") round $r: $(grep 'host: submit' "$out/bench_${m}_$(basename "$bin")_$r.txt" | sed 's/ of the call.*//') | $(tail -1 "$out/bench_${m}_$(basename "$bin")_$r.txt")"
    done
  done
  "$b" bench "$(rfa "$m" "$b")" $ins --warmup 5 --iters 20 --trace /tmp/$m.trace.json > /dev/null 2>&1
  python3 benchmarks/gpu/trace_summary.py /tmp/$m.trace.json 20 8 > "$out/trace_$m.txt" 2>&1
  head -24 "$out/trace_$m.txt"
  "$b" run "$(rfa "$m" "$b")" $ins --output-dir /tmp/${m}_out > /dev/null 2>&1
  python3 benchmarks/gpu/check_outputs.py "$m" /tmp/${m}_out
done
