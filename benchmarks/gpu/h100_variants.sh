#!/usr/bin/env bash
# Alternates several variants of rafter on the H100 in one device call: builds, or one build
# under different environment settings (compile-time knobs such as RAFTER_COOP_KSTEPS are
# read by `rafter compile`, runtime ones by `rafter bench`; each variant compiles its own
# artifact with its settings and benches it with them).
#   bash benchmarks/gpu/h100_variants.sh ROUNDS LABEL=BINARY[:NAME=VALUE[,NAME=VALUE...]] ...
#   e.g. bash benchmarks/gpu/h100_variants.sh 2 old=.gl/rafter.old new=.gl/rafter \
#        k8=.gl/rafter:RAFTER_COOP_KSTEPS=8
# Models: MODELS (default "bert_base_f16"; `_f16` names come from
# benchmarks/gpu/export_f16.py, the others from scripts/export_models.py). Per model: one
# untimed process per variant first (the first process on a model runs slow on this
# machine, benchmarks/RESULTS.md), then ROUNDS rounds of every variant in turn with
# `--warmup 10 --iters 50`, then a traced run of the last variant (summary, gaps, and the
# trace itself, xz-compressed) and every variant's output check.
# Writes everything under $OUT (or /tmp/variants).
set -u
usage() { echo "usage: $0 ROUNDS LABEL=BINARY[:NAME=VALUE,...] ..." >&2; exit 2; }
[ $# -ge 2 ] || usage
rounds=$1; shift
case "$rounds" in ''|*[!0-9]*) usage;; esac
labels=(); bins=(); envs=()
for v in "$@"; do
  label=${v%%=*}; rest=${v#*=}
  bin=${rest%%:*}; env=""
  [ "$bin" != "$rest" ] && env=${rest#*:}
  [ -n "$label" ] && [ -x "$bin" ] || { echo "variant '$v': no executable '$bin'" >&2; usage; }
  labels+=("$label"); bins+=("$bin"); envs+=("${env//,/ }")
done
out=${OUT:-/tmp/variants}; mkdir -p "$out"
models=${MODELS:-bert_base_f16}
# f32 exports first: an f16 model is converted from its f32 one and checked against its
# outputs.
f32s=$(for m in $models; do echo "${m%_f16}"; done | sort -u)
f16s=$(for m in $models; do case $m in *_f16) echo "${m%_f16}";; esac; done)
python3 scripts/export_models.py --only $f32s > "$out/export.txt" 2>&1; tail -1 "$out/export.txt"
[ -n "$f16s" ] && { python3 benchmarks/gpu/export_f16.py --only $f16s > "$out/export_f16.txt" 2>&1; tail -1 "$out/export_f16.txt"; }
M=.cache/models
# run VARIANT_INDEX ARGS...: the variant's binary under its settings.
run() { local i=$1; shift; env ${envs[$i]} "${bins[$i]}" "$@"; }
for m in $models; do
  [ -f $M/$m.onnx ] || { echo "$m: not exported"; continue; }
  ins=""
  for f in $M/${m}_inputs/*.npy; do ins="$ins --input $(basename "$f" .npy)=$f"; done
  for i in "${!labels[@]}"; do
    run "$i" compile $M/$m.onnx --target vulkan -o "/tmp/$m.${labels[$i]}.rfa" --dim batch=1 --dim seq=128 > "$out/compile_${m}_${labels[$i]}.txt" 2>&1 \
      || { echo "$m ${labels[$i]}: compile failed"; tail -3 "$out/compile_${m}_${labels[$i]}.txt"; }
    run "$i" bench "/tmp/$m.${labels[$i]}.rfa" $ins --warmup 10 --iters 50 > /dev/null 2>&1
  done
  for r in $(seq "$rounds"); do
    for i in "${!labels[@]}"; do
      f="$out/bench_${m}_${labels[$i]}_$r.txt"
      run "$i" bench "/tmp/$m.${labels[$i]}.rfa" $ins --warmup 10 --iters 50 > "$f" 2>&1
      echo "$m ${labels[$i]} round $r: $(tail -1 "$f")"
    done
  done
  last=$((${#labels[@]} - 1))
  run "$last" bench "/tmp/$m.${labels[$last]}.rfa" $ins --warmup 5 --iters 20 --trace /tmp/$m.trace.json > /dev/null 2>&1
  python3 benchmarks/gpu/trace_summary.py /tmp/$m.trace.json 20 10 > "$out/trace_$m.txt" 2>&1
  head -14 "$out/trace_$m.txt"
  python3 benchmarks/gpu/trace_gaps.py /tmp/$m.trace.json 20 > "$out/gaps_$m.txt" 2>&1
  xz -c /tmp/$m.trace.json > "$out/trace_$m.json.xz"
  for i in "${!labels[@]}"; do
    run "$i" run "/tmp/$m.${labels[$i]}.rfa" $ins --output-dir /tmp/${m}_out > /dev/null 2>&1
    echo "$m ${labels[$i]} output: $(python3 benchmarks/gpu/check_outputs.py "$m" /tmp/${m}_out 2>&1 | tail -1)"
  done
done
