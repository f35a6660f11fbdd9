#!/usr/bin/env bash
# The spin wait's A/B on the GPU machine, in ONE device call: a thread waiting for a value
# that submitted GPU work will signal first polls the semaphore's counter for up to
# RAFTER_VULKAN_SPIN_WAIT_US (default 1000 on a GPU) before it sleeps in the driver
# (crates/rafter-hal-vulkan/src/semaphore.rs, `SemInner::spin`). Variants, alternated
# within each of REPS rounds: `spin` (the default) and `nospin` (RAFTER_VULKAN_SPIN_WAIT_US=0).
# Per round and variant:
#   - midgraph split by support (`--device vulkan`, traced): the handoff medians per
#     direction (issue 26's < 20 us bar) and the call median;
#   - MobileNetV2, ResNet-50, BERT-base f32 on the GPU alone (`--device vulkan`): the call
#     median (the end-of-call wait spins too) and the process's CPU seconds (user + sys:
#     what the spin costs);
#   - the same three as a stream (`--device auto --objective throughput --in-flight 4`):
#     calls/s, where a spinning waiter could take a core from the CPU's share of the calls.
# Carry .gl/ (setup.sh, the loader debs, the stripped rafter) or .devbench/rafter.
#   bash benchmarks/gpu/h200_spin.sh
#   REPS=2 MODELS="mobilenet_v2" bash benchmarks/gpu/h200_spin.sh
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out/raw"
[ -f .gl/setup.sh ] && bash .gl/setup.sh > "$out/raw/setup.txt" 2>&1
R=${RAFTER:-.devbench/rafter}
[ -x "$R" ] || R=.gl/rafter
M=.cache/models
reps=${REPS:-3}
models=${MODELS-"mobilenet_v2 resnet50 bert_base"}
budget=${BUDGET_S:-480}
export RAFTER_DEVICE_PROFILES="$out/raw/profiles.txt"
TIMEFORMAT='cpu %U %S'

left() { [ $SECONDS -lt "$budget" ] || { echo "SKIPPED (budget ${budget}s spent): $*" | tee -a "$out/skipped.txt"; return 1; }; }
inputs_of() { local s=""; for f in $M/$1_inputs/*.npy; do [ -f "$f" ] && s="$s --input $(basename "$f" .npy)=$f"; done; echo "$s"; }

$R devices > "$out/raw/devices.txt" 2>&1
head -3 "$out/raw/devices.txt"
python3 benchmarks/gpu/export_midgraph.py "$M" > "$out/raw/export_midgraph.txt" 2>&1
[ -n "$models" ] && python3 scripts/export_models.py --only $models > "$out/raw/export.txt" 2>&1
tail -1 "$out/raw/export.txt"
# Unmeasured: the pipeline cache fills.
for m in midgraph $models; do
  timeout 120 $R bench $M/$m.onnx --device vulkan $(inputs_of $m) --warmup 2 --iters 3 > /dev/null 2>&1
done

env_of() { case $1 in spin) echo "" ;; nospin) echo "RAFTER_VULKAN_SPIN_WAIT_US=0" ;; esac; }
for r in $(seq 1 "$reps"); do
  for v in spin nospin; do
    e=$(env_of $v)
    left "midgraph $v r$r" || continue
    f="$out/raw/midgraph_${v}_r$r.txt"
    { time env $e timeout 120 $R bench $M/midgraph.onnx --device vulkan $(inputs_of midgraph) \
        --warmup 5 --iters 100 --trace "$out/raw/trace.json" ; } > "$f" 2>&1
    echo "midgraph $v r$r: $(grep '^bench:' "$f" | cut -c1-40) | $(grep '^handoffs' "$f" | cut -c1-150)"
    for m in $models; do
      left "$m $v r$r" || continue
      f="$out/raw/${m}_${v}_r$r.txt"
      { time env $e timeout 120 $R bench $M/$m.onnx --device vulkan $(inputs_of $m) \
          --warmup 5 --iters 200 ; } > "$f" 2>&1
      echo "$m $v r$r: $(grep '^bench:' "$f" | cut -c1-40) $(grep '^cpu ' "$f")"
      left "$m stream $v r$r" || continue
      f="$out/raw/${m}_stream_${v}_r$r.txt"
      env $e timeout 150 $R bench $M/$m.onnx --device auto --objective throughput $(inputs_of $m) \
        --warmup 5 --iters 200 --in-flight 4 > "$f" 2>&1
      echo "$m stream $v r$r: $(grep '^stream:' "$f" | cut -c1-80) $(grep '^spread' "$f" | tr '\n' ' ' | cut -c1-160)"
    done
  done
done
rm -f "$out/raw/trace.json"
echo "measured by ${SECONDS}s"
python3 - "$out/raw" $models <<'PY' | tee "$out/summary.md"
import glob, re, statistics, sys
raw, models = sys.argv[1], sys.argv[2:]
def med(pattern, rx):
    vals = []
    for p in sorted(glob.glob(f"{raw}/{pattern}")):
        m = re.search(rx, open(p).read(), re.M)
        if m:
            vals.append(float(m.group(1)))
    return (statistics.median(vals), len(vals)) if vals else (None, 0)
f = lambda x, d: "-" if x is None else f"{x:.{d}f}"
print("\n| midgraph (split by support) | call ms | vulkan->cpu us | cpu->vulkan us | rounds |")
print("|---|---:|---:|---:|---:|")
for v in ("spin", "nospin"):
    call, n = med(f"midgraph_{v}_r*.txt", r"^bench: median ([\d.]+)")
    g2c, _ = med(f"midgraph_{v}_r*.txt", r"vulkan->cpu: \d+, median ([\d.]+) us")
    c2g, _ = med(f"midgraph_{v}_r*.txt", r"cpu->vulkan: \d+, median ([\d.]+) us")
    print(f"| {v} | {f(call, 3)} | {f(g2c, 1)} | {f(c2g, 1)} | {n} |")
print("\n| model (f32) | vulkan call ms, spin | nospin | CPU s (user+sys), spin | nospin | stream calls/s, spin | nospin |")
print("|---|---:|---:|---:|---:|---:|---:|")
for m in models:
    row = [m]
    for key, rx, d in (("", r"^bench: median ([\d.]+)", 3),
                       ("", r"^cpu ([\d.]+) ", 2),
                       ("stream_", r"([\d.]+) calls/s", 1)):
        for v in ("spin", "nospin"):
            x, _ = med(f"{m}_{key}{v}_r*.txt", rx)
            if rx.startswith("^cpu"):
                # user + sys
                vals = []
                for p in glob.glob(f"{raw}/{m}_{v}_r*.txt"):
                    mm = re.search(r"^cpu ([\d.]+) ([\d.]+)", open(p).read(), re.M)
                    if mm:
                        vals.append(float(mm.group(1)) + float(mm.group(2)))
                x = statistics.median(vals) if vals else None
            row.append(f(x, d))
    print("| " + " | ".join(row) + " |")
PY
