#!/usr/bin/env bash
# Issue 28: an A/B of the NVIDIA stall's suspected conditions, within one budgeted device call.
# Each round runs `rafter conformance --device vulkan --threads THREADS` once per variant on a
# fresh (cold) driver shader cache, the condition under which every earlier stall happened
# (pipelines compiled while other threads' work is in flight). A run counts as stalled as soon
# as the watchdog reports a batch in flight for RAFTER_VULKAN_WATCHDOG_S seconds (default 10):
# it is killed then (the report kept), so a stall costs seconds, not a deadline.
#
# Variants (VARIANTS, default "lock nolock exclusive"):
#   lock       the default: one device-wide lock around every timeline signal
#   nolock     RAFTER_VULKAN_CONCURRENT_SIGNALS=1: no signal lock
#   exclusive  RAFTER_VULKAN_EXCLUSIVE_PIPELINES=1: the signal lock held across pipeline
#              creation too (no submission while the driver compiles)
#   warm       the default, on the cache of the first run of this script that finished
#              (skipped until one has), no breadcrumbs
#
# Usage: scripts/stall_ab.sh [ROUNDS] [THREADS] [DEADLINE_S]   (defaults 3 8 120)
#   BUDGET_S (default 540): no run starts after this many seconds.
#   RAFTER (default target/release/rafter), RAFTER_CONFORMANCE_DIR as usual; FILTER: only
#   the tests matching this regular expression (for a quick local check).
#   OUT (default: a temporary directory): times (variant round seconds outcome), summary.txt,
#   reports.txt (each stalled run's watchdog report) and the stalled runs' logs.
set -u
ROUNDS=${1:-3}
THREADS=${2:-8}
DEADLINE=${3:-120}
BUDGET=${BUDGET_S:-540}
VARIANTS=${VARIANTS:-lock nolock exclusive}
RAFTER=${RAFTER:-target/release/rafter}
OUT=${OUT:-$(mktemp -d /tmp/stall_ab.XXXXXX)}
export RAFTER_VULKAN_WATCHDOG_S=${RAFTER_VULKAN_WATCHDOG_S:-10}
[ -x "$RAFTER" ] || { echo "no rafter binary at $RAFTER" >&2; exit 2; }
mkdir -p "$OUT/runs"
caches=$(mktemp -d /tmp/stall_ab_cache.XXXXXX)
warm_cache=""
: >"$OUT/times"

# VARIANT ROUND CACHE -> "VARIANT ROUND SECONDS OUTCOME" (finished-N | stalled | deadline)
one_run() {
    local variant=$1 round=$2 cache=$3 log="$OUT/runs/$1-$2.log" env=()
    case $variant in
        nolock) env=(RAFTER_VULKAN_CONCURRENT_SIGNALS=1) ;;
        exclusive) env=(RAFTER_VULKAN_EXCLUSIVE_PIPELINES=1) ;;
    esac
    local start outcome
    start=$(date +%s.%N)
    env "${env[@]}" __GL_SHADER_DISK_CACHE_PATH="$cache" MESA_SHADER_CACHE_DIR="$cache" \
        "$RAFTER" conformance --device vulkan --threads "$THREADS" ${FILTER:+--filter "$FILTER"} >"$log" 2>&1 &
    local pid=$! ticks=0
    outcome=""
    while kill -0 "$pid" 2>/dev/null; do
        if grep -q "^RAFTER_VULKAN_WATCHDOG_S" "$log" 2>/dev/null; then
            sleep 1 # the rest of the report
            outcome=stalled
        elif [ $ticks -ge $((DEADLINE * 10)) ]; then
            outcome=deadline
        fi
        if [ -n "$outcome" ]; then
            kill -KILL "$pid" 2>/dev/null
            break
        fi
        sleep 0.1
        ticks=$((ticks + 1))
    done
    wait "$pid" 2>/dev/null
    local status=$?
    [ -n "$outcome" ] || outcome="finished-$status"
    printf "%s %s %.1f %s\n" "$variant" "$round" "$(awk -v a="$start" -v b="$(date +%s.%N)" "BEGIN { print b - a }")" "$outcome"
}

echo "output in $OUT"
for round in $(seq 1 "$ROUNDS"); do
    for variant in $VARIANTS; do
        [ $SECONDS -lt "$BUDGET" ] || { echo "budget spent before $variant round $round" | tee -a "$OUT/times"; break 2; }
        if [ "$variant" = warm ]; then
            [ -n "$warm_cache" ] || continue
            cache=$warm_cache
        else
            cache=$(mktemp -d "$caches/$variant.XXXXXX")
        fi
        line=$(one_run "$variant" "$round" "$cache")
        echo "$line" | tee -a "$OUT/times"
        case $line in
            *finished-*) [ -n "$warm_cache" ] || [ "$variant" = warm ] || warm_cache=$cache ;;
        esac
    done
done

: >"$OUT/reports.txt"
while read -r variant round secs outcome; do
    log="$OUT/runs/$variant-$round.log"
    [ -f "$log" ] || continue
    case $outcome in
        finished-*) tail -3 "$log" >"$log.tail"; rm -f "$log" ;;
        *) { echo "===== $variant round $round: $secs s, $outcome"
             awk '/^RAFTER_VULKAN_WATCHDOG_S/ { on = 1 } on' "$log" | head -60; } >>"$OUT/reports.txt" ;;
    esac
done <"$OUT/times"
awk 'NF == 4 { n[$1]++; if ($4 ~ /^finished/) ok[$1]++; t[$1] = t[$1] " " $3 }
     END { for (v in n) printf "%s: %d runs, %d finished (seconds:%s)\n", v, n[v], ok[v], t[v] }' \
    "$OUT/times" | tee "$OUT/summary.txt"
rm -rf "$caches"
