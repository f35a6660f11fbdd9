#!/usr/bin/env bash
# What a GPU -> CPU handoff waits for (issue 26's < 20 us bar), in ONE device call: the
# `midgraph` model (benchmarks/gpu/export_midgraph.py: three CPU-only LRNs between GPU
# convolutions) split by support (`--device vulkan`), so each call crosses GPU -> CPU and
# CPU -> GPU three times; traced (`bench --trace`), whose `handoffs between devices` line
# gives each direction's median. Variants, alternated within each of REPS rounds:
#   default        as in production
#   no-tail        RAFTER_VULKAN_STALL_PROBE=no-tail: no batch tail (barrier, 4-byte fill,
#                  host barrier; issue 28's stall fix): what the tail adds
#   early-signal   RAFTER_VULKAN_STALL_PROBE=early-signal: the tail in a second batch, so
#                  the boundary's signal does not wait for it
#   direct         RAFTER_VULKAN_DIRECT_WAITS=1: the CPU's helper thread waits in the driver
#                  itself (no monitor hop)
#   spin100, spin1000  RAFTER_VULKAN_SPIN_WAIT_US=100 / 1000: the helper first polls the
#                  semaphore's counter for up to that long per wait
#   spin-early     spin1000 and early-signal together
# If no-tail and early-signal are no faster than default, the tail is not the cost and the
# remainder is the driver's signal or the CPU's start. Neither probe is for production:
# scripts/stall_check.sh must pass with a variant before it could become the default.
#   bash benchmarks/gpu/h200_handoff.sh                 # carry .gl/ and .devbench/rafter
#   REPS=2 ITERS=100 VARIANTS="default no-tail" bash benchmarks/gpu/h200_handoff.sh
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
[ -f .gl/setup.sh ] && bash .gl/setup.sh > "$out/setup.txt" 2>&1
R=${RAFTER:-.devbench/rafter}
[ -x "$R" ] || R=.gl/rafter
M=.cache/models
reps=${REPS:-3}
iters=${ITERS:-100}
variants=${VARIANTS:-"default no-tail early-signal direct"}
budget=${BUDGET_S:-420}
export RAFTER_DEVICE_PROFILES="$out/profiles.txt"

left() { [ $SECONDS -lt "$budget" ] || { echo "SKIPPED (budget ${budget}s spent): $*" | tee -a "$out/skipped.txt"; return 1; }; }

$R devices > "$out/devices.txt" 2>&1
head -3 "$out/devices.txt"
python3 benchmarks/gpu/export_midgraph.py "$M" > "$out/export_midgraph.txt" 2>&1
tail -1 "$out/export_midgraph.txt"
ins=""
for f in $M/midgraph_inputs/*.npy; do ins="$ins --input $(basename "$f" .npy)=$f"; done
# Unmeasured: the pipeline cache fills.
timeout 120 $R bench $M/midgraph.onnx --device vulkan $ins --warmup 2 --iters 3 > /dev/null 2>&1

run_variant() {
  local v=$1 f=$2 e=()
  case $v in
    default) ;;
    no-tail) e=(RAFTER_VULKAN_STALL_PROBE=no-tail) ;;
    early-signal) e=(RAFTER_VULKAN_STALL_PROBE=early-signal) ;;
    direct) e=(RAFTER_VULKAN_DIRECT_WAITS=1) ;;
    spin100) e=(RAFTER_VULKAN_SPIN_WAIT_US=100) ;;
    spin1000) e=(RAFTER_VULKAN_SPIN_WAIT_US=1000) ;;
    spin-early) e=(RAFTER_VULKAN_SPIN_WAIT_US=1000 RAFTER_VULKAN_STALL_PROBE=early-signal) ;;
    spin0) e=(RAFTER_VULKAN_SPIN_WAIT_US=0) ;;
    *) echo "unknown variant $v" > "$f"; return 1 ;;
  esac
  timeout 120 env "${e[@]}" $R bench $M/midgraph.onnx --device vulkan $ins --warmup 5 \
    --iters "$iters" --trace "$out/trace_$v.json" > "$f" 2>&1
}

for r in $(seq 1 "$reps"); do
  for v in $variants; do
    left "$v round $r" || continue
    f="$out/handoff_${v}_r$r.txt"
    run_variant "$v" "$f"
    echo "$v r$r: $(grep '^bench:' "$f" | cut -c1-60) | $(grep '^handoffs' "$f")"
  done
done
rm -f "$out"/trace_*.json

python3 - "$out" $variants <<'EOF' | tee "$out/summary.md"
import glob, re, statistics, sys
out, variants = sys.argv[1], sys.argv[2:]
def med(paths, pat):
    vals = []
    for p in paths:
        m = re.search(pat, open(p).read(), re.M)
        if m:
            vals.append(float(m.group(1)))
    return (statistics.median(vals), len(vals)) if vals else (None, 0)
print("\n| variant | call ms | vulkan->cpu us | cpu->vulkan us | rounds |")
print("|---|---:|---:|---:|---:|")
for v in variants:
    paths = sorted(glob.glob(f"{out}/handoff_{v}_r*.txt"))
    call, n = med(paths, r"^bench: median ([\d.]+)")
    g2c, _ = med(paths, r"vulkan->cpu: \d+, median ([\d.]+) us")
    c2g, _ = med(paths, r"cpu->vulkan: \d+, median ([\d.]+) us")
    f = lambda x, d: "-" if x is None else f"{x:.{d}f}"
    print(f"| {v} | {f(call, 3)} | {f(g2c, 1)} | {f(c2g, 1)} | {n} |")
EOF
