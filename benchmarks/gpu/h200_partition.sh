#!/usr/bin/env bash
# Issue 26's Done-when numbers on the GPU machine (16 cores + H200/H100), in one call:
# for ResNet-50, MobileNetV2, BERT-base and MiniLM-L6 (f32, batch 1, BERT seq 128):
#   1. the device profiles (`rafter devices --profile`, stored in $out/profiles.txt and
#      used by every later command through RAFTER_DEVICE_PROFILES);
#   2. call latency on --device cpu, vulkan and auto, each with the cost model's estimate
#      next to the measured time (`bench --estimate`: per class, device and partition);
#   3. a stream of calls (`bench --in-flight 4`): each device alone (its own throughput;
#      their sum is the ideal) and `--device auto --objective throughput`, traced, with
#      each device's busy time and idle fraction;
#   4. a summary table: estimate/measured per target, auto vs best single device, and the
#      stream's throughput against the ideal.
# Needs only the stripped `rafter` in .gl/ (and .gl/setup.sh for the Vulkan loader, as
# h100_vulkan.sh) and python3 with torch + onnx + onnxruntime to export the models
# (scripts/export_models.py: random init with a fixed seed, no downloads).
#   bash benchmarks/gpu/h200_partition.sh            # everything
#   MODELS="mobilenet_v2" bash benchmarks/gpu/h200_partition.sh
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
[ -f .gl/setup.sh ] && bash .gl/setup.sh
R=${RAFTER:-.gl/rafter}
M=.cache/models
models=${MODELS:-"mobilenet_v2 resnet50 minilm_l6 bert_base"}
iters=${ITERS:-50}
stream_calls=${STREAM_CALLS:-300}
export RAFTER_DEVICE_PROFILES="$out/profiles.txt"

$R devices > "$out/devices.txt" 2>&1
python3 scripts/export_models.py --only $models > "$out/export.txt" 2>&1
tail -2 "$out/export.txt"
$R devices --profile > "$out/profile.txt" 2>&1
cat "$out/profile.txt"

inputs_of() {
  local m=$1 ins=""
  for f in $M/${m}_inputs/*.npy; do ins="$ins --input $(basename "$f" .npy)=$f"; done
  echo "$ins"
}

for m in $models; do
  [ -f $M/$m.onnx ] || { echo "$m: no $M/$m.onnx"; continue; }
  ins=$(inputs_of $m)
  for t in cpu vulkan auto; do
    # An untimed process first (the first run after an export runs slow; the Vulkan
    # pipeline cache fills).
    $R bench $M/$m.onnx --device $t $ins --warmup 3 --iters 5 > /dev/null 2>&1
    $R bench $M/$m.onnx --device $t $ins --warmup 10 --iters $iters --estimate \
      > "$out/latency_${m}_$t.txt" 2>&1
    echo "$m $t: $(grep '^bench:' "$out/latency_${m}_$t.txt") | $(grep '^estimate:' "$out/latency_${m}_$t.txt")"
  done
  for t in cpu vulkan; do
    $R bench $M/$m.onnx --device $t $ins --warmup 10 --iters $stream_calls --in-flight 4 \
      > "$out/stream_${m}_$t.txt" 2>&1
    echo "$m $t: $(grep '^stream:' "$out/stream_${m}_$t.txt")"
  done
  $R bench $M/$m.onnx --device auto --objective throughput $ins --warmup 10 \
    --iters $stream_calls --in-flight 4 --trace /tmp/stream_$m.json \
    > "$out/stream_${m}_auto.txt" 2>&1
  $R plan $M/$m.onnx --target auto --objective throughput > "$out/plan_${m}_throughput.txt" 2>&1
  echo "$m auto/throughput: $(grep '^stream:' "$out/stream_${m}_auto.txt")"
  grep '^device ' "$out/stream_${m}_auto.txt"
done

python3 - "$out" $models <<'EOF'
import re, sys, os
out, models = sys.argv[1], sys.argv[2:]
def grab(path, pat):
    try:
        m = re.search(pat, open(path).read(), re.M)
        return float(m.group(1)) if m else None
    except OSError:
        return None
print("\n| model | cpu ms | vulkan ms | auto ms | auto / best | est/meas cpu | vulkan | auto |")
print("|---|---|---|---|---|---|---|---|")
for m in models:
    lat = {t: grab(f"{out}/latency_{m}_{t}.txt", r"^bench: median ([\d.]+)") for t in ("cpu", "vulkan", "auto")}
    est = {t: grab(f"{out}/latency_{m}_{t}.txt", r"^estimate: .*est/meas ([\d.]+)") for t in ("cpu", "vulkan", "auto")}
    best = min(v for v in (lat["cpu"], lat["vulkan"]) if v) if any((lat["cpu"], lat["vulkan"])) else None
    ratio = f"{lat['auto'] / best:.2f}" if lat["auto"] and best else "-"
    f = lambda x: "-" if x is None else f"{x:.3f}"
    print(f"| {m} | {f(lat['cpu'])} | {f(lat['vulkan'])} | {f(lat['auto'])} | {ratio} | {f(est['cpu'])} | {f(est['vulkan'])} | {f(est['auto'])} |")
print("\n| model | cpu calls/s | vulkan calls/s | ideal (sum) | auto throughput calls/s | of ideal | vs vulkan alone |")
print("|---|---|---|---|---|---|---|")
for m in models:
    s = {t: grab(f"{out}/stream_{m}_{t}.txt", r"^stream: .* ([\d.]+) calls/s") for t in ("cpu", "vulkan", "auto")}
    if not all(s.values()):
        print(f"| {m} | missing stream results |"); continue
    ideal = s["cpu"] + s["vulkan"]
    print(f"| {m} | {s['cpu']:.1f} | {s['vulkan']:.1f} | {ideal:.1f} | {s['auto']:.1f} | {s['auto'] / ideal:.0%} | {s['auto'] / s['vulkan']:.2f}x |")
EOF
