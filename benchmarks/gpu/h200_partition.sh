#!/usr/bin/env bash
# Issue 26's Done-when numbers on the GPU machine (16 cores + H200/H100), in ONE device call
# (a budget of ~8 minutes, checked before each step: what does not fit is skipped and said):
# for ResNet-50, MobileNetV2, BERT-base, MiniLM-L6 (f32, batch 1, BERT seq 128), then the
# f16 variants of ResNet-50, MobileNetV2, BERT-base:
#   1. the device profiles (`rafter devices --profile`, stored in $out/profiles.txt and
#      used by every later command through RAFTER_DEVICE_PROFILES);
#   2. call latency on --device cpu, vulkan and auto, each with the cost model's estimate
#      next to the measured time (`bench --estimate`: per class, device and partition):
#      the accuracy table on the GPU and on the host CPU; REPS rounds (default 3) with the
#      targets alternated, medians of the rounds' medians;
#   (plus `midgraph`, benchmarks/gpu/export_midgraph.py: CPU-only kernels between GPU
#   blocks, where auto must beat greedy-by-support, i.e. `--device vulkan`);
#   3. a stream of calls (`bench --in-flight 4`): each device alone (its own throughput;
#      their sum is the ideal) and `--device auto --objective throughput`, which spreads
#      whole calls over the CPU and the GPU (src/spread.rs): calls per device and idle;
#   4. summary tables: estimate/measured per target, auto vs best single device, and the
#      spread stream's throughput against the ideal.
# Carry: the stripped `rafter` (.devbench/rafter, or RAFTER=path), .gl/ (setup.sh + the
# Vulkan loader debs, as h100_vulkan.sh), scripts/export_models.py and
# benchmarks/gpu/export_f16.py (tracked). Models are exported on the device with its
# python3 (torch + onnx + onnxruntime; random init, fixed seed, no downloads).
#   bash benchmarks/gpu/h200_partition.sh            # everything
#   MODELS="mobilenet_v2" F16_MODELS="" bash benchmarks/gpu/h200_partition.sh
#   MODELS="" F16_MODELS="" STREAMS=0 bash benchmarks/gpu/h200_partition.sh   # midgraph only
#   STREAM_MODELS="mobilenet_v2 resnet50 bert_base" bash ...   # the Done-when's streams only
#   PACK=1 OUT=$OUT/x bash benchmarks/gpu/h200_partition.sh    # results as $OUT/x.tgz
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
[ -f .gl/setup.sh ] && bash .gl/setup.sh > "$out/setup.txt" 2>&1
R=${RAFTER:-.devbench/rafter}
[ -x "$R" ] || R=.gl/rafter
M=.cache/models
models=${MODELS-"mobilenet_v2 resnet50 minilm_l6 bert_base"}
f16_models=${F16_MODELS-"mobilenet_v2 resnet50 bert_base"}
iters=${ITERS:-30}
stream_calls=${STREAM_CALLS:-200}
# The single-device streams (the spread's ideal is their sum); STREAM_TARGETS="vulkan" skips
# the CPU's, which take minutes for the f16 models.
stream_targets=${STREAM_TARGETS-"cpu vulkan"}
budget=${BUDGET_S:-480}
export RAFTER_DEVICE_PROFILES="$out/profiles.txt"
nproc > "$out/nproc.txt"; lscpu | grep -E "Model name|^CPU\(s\)" >> "$out/nproc.txt"
nvidia-smi -L >> "$out/nproc.txt" 2>&1

left() { [ $SECONDS -lt "$budget" ] || { echo "SKIPPED (budget ${budget}s spent): $*" | tee -a "$out/skipped.txt"; return 1; }; }

$R devices > "$out/devices.txt" 2>&1
head -5 "$out/devices.txt"
if [ -n "$models" ]; then
  python3 scripts/export_models.py --only $models > "$out/export.txt" 2>&1
  tail -2 "$out/export.txt"
fi
if [ -n "$f16_models" ]; then
  python3 benchmarks/gpu/export_f16.py --only $f16_models > "$out/export_f16.txt" 2>&1
  tail -2 "$out/export_f16.txt"
fi
# A model with CPU-only kernels between GPU blocks: auto against greedy-by-support
# (`--device vulkan`); MIDGRAPH="" leaves it out.
midgraph=${MIDGRAPH-midgraph}
if [ -n "$midgraph" ]; then
  python3 benchmarks/gpu/export_midgraph.py "$M" > "$out/export_midgraph.txt" 2>&1
  tail -1 "$out/export_midgraph.txt"
fi
echo "exported at ${SECONDS}s"
$R devices --profile > "$out/profile.txt" 2>&1
tail -6 "$out/profile.txt"

inputs_of() {
  local m=$1 ins=""
  for f in $M/${m}_inputs/*.npy; do ins="$ins --input $(basename "$f" .npy)=$f"; done
  echo "$ins"
}

all=""
for m in $models; do all="$all $m"; done
for m in $f16_models; do all="$all ${m}_f16"; done
all="$all $midgraph"
# Latency and the accuracy table first (every model), then the streams.
# REPS rounds, the targets alternated within each (a GPU call's median moves by ~10%
# between processes: auto and vulkan often run the same plan, and one process each
# compared noise); the summary takes the median of the rounds' medians. The f16 models'
# CPU runs (seconds a call) take one round.
reps=${REPS:-3}
for m in $all; do
  [ -f $M/$m.onnx ] || { echo "$m: no $M/$m.onnx"; continue; }
  ins=$(inputs_of $m)
  for r in $(seq 1 "$reps"); do
    for t in cpu vulkan auto; do
      [ "$t" = cpu ] && [ "$r" -gt 1 ] && [ "${m%_f16}" != "$m" ] && continue
      left "latency $m $t round $r" || continue
      # An untimed process first (the first run after an export runs slow; the Vulkan
      # pipeline cache fills).
      [ "$r" = 1 ] && timeout 120 $R bench $M/$m.onnx --device $t $ins --warmup 2 --iters 3 > /dev/null 2>&1
      f="$out/latency_${m}_${t}_r$r.txt"
      timeout 120 $R bench $M/$m.onnx --device $t $ins --warmup 5 --iters $iters --estimate > "$f" 2>&1
      echo "$m $t r$r: $(grep '^bench:' "$f") | $(grep '^estimate:' "$f")"
    done
  done
done
# STREAMS=0: latency only (no streams); STREAM_MODELS="a b": streams of those models only.
stream_models=${STREAM_MODELS-${all_streams-$all}}
[ "${STREAMS:-1}" = 1 ] || stream_models=""
for m in $stream_models; do
  [ -f $M/$m.onnx ] || continue
  ins=$(inputs_of $m)
  for t in $stream_targets; do
    left "stream $m $t" || continue
    # Untraced, as the spread below is: a traced Vulkan stream runs up to 1.6x slower
    # (timestamps around every dispatch), which flattered the spread against this ideal
    # before 2026-11-30's twentieth session.
    timeout 120 $R bench $M/$m.onnx --device $t $ins --warmup 5 --iters $stream_calls --in-flight 4 \
      > "$out/stream_${m}_$t.txt" 2>&1
    echo "$m $t: $(grep '^stream:' "$out/stream_${m}_$t.txt") $(grep '^device ' "$out/stream_${m}_$t.txt" | tr '\n' ' ')"
  done
  left "stream $m auto/throughput" || continue
  timeout 150 $R bench $M/$m.onnx --device auto --objective throughput $ins --warmup 5 \
    --iters $stream_calls --in-flight 4 > "$out/stream_${m}_auto.txt" 2>&1
  echo "$m auto/throughput: $(grep '^spread' "$out/stream_${m}_auto.txt" | tr '\n' ' ')"
  grep -i error "$out/stream_${m}_auto.txt" | head -3
done
echo "measured by ${SECONDS}s"

python3 - "$out" $all <<'EOF' | tee "$out/summary.md"
import glob, re, statistics, sys
out, models = sys.argv[1], sys.argv[2:]
def grab(path, pat):
    try:
        m = re.search(pat, open(path).read(), re.M)
        return float(m.group(1)) if m else None
    except OSError:
        return None
def rounds(m, t, pat):
    """The median over the rounds' files (latency_M_T_rN.txt) of what `pat` grabs."""
    vals = [v for p in sorted(glob.glob(f"{out}/latency_{m}_{t}_r*.txt")) if (v := grab(p, pat)) is not None]
    return statistics.median(vals) if vals else None
f = lambda x: "-" if x is None else f"{x:.3f}"
print("\n| model | cpu ms | vulkan ms | auto ms | auto / best | est/meas cpu | vulkan | auto | cpu steal |")
print("|---|---|---|---|---|---|---|---|---|")
for m in models:
    lat = {t: rounds(m, t, r"^bench: median ([\d.]+)") for t in ("cpu", "vulkan", "auto")}
    est = {t: rounds(m, t, r"^estimate: .*est/meas ([\d.]+)") for t in ("cpu", "vulkan", "auto")}
    singles = [v for v in (lat["cpu"], lat["vulkan"]) if v]
    best = min(singles) if singles else None
    ratio = f"{lat['auto'] / best:.2f}" if lat["auto"] and best else "-"
    # The hypervisor's steal while the CPU's calls were timed (`rafter bench`'s host line).
    steal = rounds(m, "cpu", r"^host: while timing, ([\d.]+)% of the CPU time stolen")
    steal = "-" if steal is None else f"{steal:.1f}%"
    print(f"| {m} | {f(lat['cpu'])} | {f(lat['vulkan'])} | {f(lat['auto'])} | {ratio} | {f(est['cpu'])} | {f(est['vulkan'])} | {f(est['auto'])} | {steal} |")
print("\n| model | cpu calls/s | vulkan calls/s | ideal (sum) | spread calls/s | of ideal | cpu share | cpu idle | vulkan idle |")
print("|---|---|---|---|---|---|---|---|---|")
for m in models:
    s = {t: grab(f"{out}/stream_{m}_{t}.txt", r"^stream: .* ([\d.]+) calls/s") for t in ("cpu", "vulkan")}
    s["auto"] = grab(f"{out}/stream_{m}_auto.txt", r"^spread: .* ([\d.]+) calls/s")
    if not all(s.values()):
        print(f"| {m} | missing stream results: {s} |"); continue
    ideal = s["cpu"] + s["vulkan"]
    share = grab(f"{out}/stream_{m}_auto.txt", r"^spread device cpu: \d+ calls \(([\d.]+)%\)")
    idle = {d: grab(f"{out}/stream_{m}_auto.txt", rf"^spread device {d}: .* idle ([\d.]+)%") for d in ("cpu", "vulkan")}
    print(f"| {m} | {s['cpu']:.1f} | {s['vulkan']:.1f} | {ideal:.1f} | {s['auto']:.1f} | {s['auto'] / ideal:.0%} | {share}% | {idle['cpu']}% | {idle['vulkan']}% |")
EOF
echo "done in ${SECONDS}s"
# PACK=1: the results as one archive, $out.tgz, the folder removed (a device call brings
# back a limited count of files).
if [ "${PACK:-0}" = 1 ]; then
  tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
fi
