#!/usr/bin/env bash
# Issue 28: which dispatch never ends in the NVIDIA stall. Repeated warm
# `rafter conformance --device vulkan --threads N` runs with the watchdog and breadcrumbs
# on (rafter-hal-vulkan/src/breadcrumbs.rs), alternating breadcrumb modes, each run killed
# at a deadline; every stalled run's watchdog report is kept.
#
# Breadcrumb modes (RAFTER_VULKAN_BREADCRUMBS):
#   1         command buffers recorded once with SIMULTANEOUS_USE (as in production) plus
#             markers: a stall here is issue 28's stall, and the report says for each
#             in-flight batch whether it started, the last command it finished, and whether
#             its VkCommandBuffer is in flight in another batch too.
#   rerecord  a fresh VkCommandBuffer per submission (never in flight twice): if stalls
#             vanish here but not under `1`, a command buffer in flight twice is implicated.
#
# Usage: scripts/stall_breadcrumbs.sh [RUNS_PER_MODE] [THREADS] [DEADLINE_S]  (defaults 8 8 25)
#   MODES="1 rerecord" (the order within each round), RAFTER, RAFTER_CONFORMANCE_DIR as for
#   scripts/stall_check.sh; RAFTER_VULKAN_WATCHDOG_S defaults to 10 here.
#   OUT (default: a temporary directory): gets times (mode run seconds status),
#   summary.txt, and for every stalled or killed run its log and thread snapshot, plus
#   reports.txt: each stalled run's watchdog report (the `RAFTER_VULKAN_WATCHDOG_S` block).
#   CACHE_DIR: the driver's shader cache for every run (default: a fresh temporary one).
# Warm-up: one untimed run (no breadcrumbs, deadline 4x) fills the driver's shader cache.
set -u
RUNS=${1:-8}
THREADS=${2:-8}
DEADLINE=${3:-25}
MODES=${MODES:-1 rerecord}
OUT=${OUT:-$(mktemp -d /tmp/stall_breadcrumbs.XXXXXX)}
export RAFTER_VULKAN_WATCHDOG_S=${RAFTER_VULKAN_WATCHDOG_S:-10}
LOG_DIR=$OUT/runs
# shellcheck source=scripts/stall_check.sh
. "$(dirname "$0")/stall_check.sh" "$RUNS" "$THREADS" "$DEADLINE"
mkdir -p "$LOG_DIR"
[ -x "$RAFTER" ] || { echo "no rafter binary at $RAFTER (cargo build --release -p rafter-cli --features vulkan?)" >&2; exit 2; }
# The driver's shader cache stays outside $OUT (it is large, and $OUT comes back).
cache=${CACHE_DIR:-$(mktemp -d /tmp/stall_breadcrumbs_cache.XXXXXX)}
mkdir -p "$cache"
echo "output in $OUT"
: >"$LOG_DIR/times"

warm_deadline=$DEADLINE
DEADLINE=$((DEADLINE * 4))
RAFTER_VULKAN_BREADCRUMBS=0 one_run warmup 0 "$cache" | tee -a "$LOG_DIR/times"
DEADLINE=$warm_deadline

for run in $(seq 1 "$RUNS"); do
    for mode in $MODES; do
        RAFTER_VULKAN_BREADCRUMBS=$mode one_run "bc-$mode" "$run" "$cache" | tee -a "$LOG_DIR/times"
    done
done

# Keep only the stalled (or failed) runs' files; collect their watchdog reports.
: >"$OUT/reports.txt"
while read -r mode run secs status; do
    log="$LOG_DIR/$mode-$run.log"
    if [ "$status" = 0 ] && ! grep -q "RAFTER_VULKAN_WATCHDOG_S" "$log" 2>/dev/null; then
        rm -f "$log"
        continue
    fi
    {
        echo "===== $mode run $run: ${secs} s, status $status"
        # The report: from the watchdog's first line to the end of its indented block.
        awk '/^RAFTER_VULKAN_WATCHDOG_S:/ { on = 1 }
             on && !/^(RAFTER_VULKAN_WATCHDOG_S:|Vulkan device| )/ { on = 0 }
             on' "$log"
    } >>"$OUT/reports.txt"
done <"$LOG_DIR/times"
cp "$LOG_DIR/times" "$OUT/times"

{
    for mode in $MODES; do
        grep "^bc-$mode " "$OUT/times" | awk -v m="$mode" '
            { n++; if ($4 != 0) bad++; if ($4 == 124) killed++ }
            END { printf "RAFTER_VULKAN_BREADCRUMBS=%s: %d runs, %d failed or killed (%d killed at the deadline)\n", m, n, bad, killed }'
    done
    echo "in-flight batches of stalled runs, by breadcrumb state:"
    grep -h "breadcrumbs: submission" "$OUT/reports.txt" | sed 's/^ *//' | sort | uniq -c
    echo "command buffers in flight twice: $(grep -c 'ALSO IN FLIGHT' "$OUT/reports.txt")"
} | tee "$OUT/summary.txt"
