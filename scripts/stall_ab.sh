#!/usr/bin/env bash
# Issue 28: an A/B of the NVIDIA stall's suspected conditions, within one budgeted device call.
# Each round runs `rafter conformance --device vulkan --threads THREADS` once per variant,
# on a fresh (cold) driver shader cache per run (CACHE=cold, the default) or on one cache
# filled by a priming run first (CACHE=warm: cheap runs, many per variant). A run counts as
# stalled as soon as the watchdog reports a batch in flight for RAFTER_VULKAN_WATCHDOG_S
# seconds (default 10): it is killed then (the report kept), so a stall costs seconds.
#
# Variants (VARIANTS, default "base lock exclusive"; rafter-hal-vulkan's stall_probe.rs):
#   base       as in production (the batch tail, no signal lock)
#   no-tail    RAFTER_VULKAN_STALL_PROBE=no-tail: without the batch tail (batch_tail.rs)
#   lock       RAFTER_VULKAN_SERIAL_SIGNALS=1: the device-wide signal lock (off by default)
#   exclusive  RAFTER_VULKAN_STALL_PROBE=exclusive: pipeline creation under the signal lock
#   serial     RAFTER_VULKAN_STALL_PROBE=serial: a full barrier opens every command buffer
#              (no two batches execute at once)
#   rerecord   RAFTER_VULKAN_STALL_PROBE=rerecord: a fresh command buffer per submission
#              (never one in flight twice), without breadcrumb markers
#   markers    RAFTER_VULKAN_BREADCRUMBS=1: breadcrumbs' markers (per submission and between
#              commands); submission-markers, command-markers: one kind only
#   warm       (CACHE=cold only) base, on the cache of the first run that finished
#
# Usage: scripts/stall_ab.sh [ROUNDS] [THREADS] [DEADLINE_S]   (defaults 3 8 120)
#   BUDGET_S (default 540): no run starts after this many seconds.
#   CACHE=warm: PRIME_VARIANT (default serial) primes the cache (up to two tries, the
#   second with --threads 2); a run after it compiles nothing.
#   RAFTER (default target/release/rafter), RAFTER_CONFORMANCE_DIR as usual; FILTER: only
#   the tests matching this regular expression (for a quick local check).
#   OUT (default: a temporary directory): times (variant round seconds outcome), summary.txt,
#   reports.txt (each stalled run's watchdog report) and the stalled runs' logs.
set -u
ROUNDS=${1:-3}
THREADS=${2:-8}
DEADLINE=${3:-120}
BUDGET=${BUDGET_S:-540}
VARIANTS=${VARIANTS:-base lock exclusive}
CACHE=${CACHE:-cold}
RAFTER=${RAFTER:-target/release/rafter}
OUT=${OUT:-$(mktemp -d /tmp/stall_ab.XXXXXX)}
export RAFTER_VULKAN_WATCHDOG_S=${RAFTER_VULKAN_WATCHDOG_S:-10}
[ -x "$RAFTER" ] || { echo "no rafter binary at $RAFTER" >&2; exit 2; }
mkdir -p "$OUT/runs"
caches=$(mktemp -d /tmp/stall_ab_cache.XXXXXX)
warm_cache=""
: >"$OUT/times"

# VARIANT ROUND CACHE [THREADS] -> "VARIANT ROUND SECONDS OUTCOME"
# (OUTCOME: finished-STATUS | stalled | deadline)
one_run() {
    local variant=$1 round=$2 cache=$3 threads=${4:-$THREADS} log="$OUT/runs/$1-$2.log" env=()
    case $variant in
        base | warm) ;;
        lock) env=(RAFTER_VULKAN_SERIAL_SIGNALS=1) ;;
        exclusive | serial | rerecord) env=(RAFTER_VULKAN_STALL_PROBE=$variant) ;;
        no-tail) env=(RAFTER_VULKAN_STALL_PROBE=no-tail) ;;
        markers) env=(RAFTER_VULKAN_BREADCRUMBS=1) ;;
        submission-markers | command-markers)
            env=(RAFTER_VULKAN_BREADCRUMBS=1 RAFTER_VULKAN_STALL_PROBE=$variant) ;;
        *) echo "unknown variant $variant" >&2; return 2 ;;
    esac
    local start outcome
    start=$(date +%s.%N)
    env "${env[@]}" __GL_SHADER_DISK_CACHE_PATH="$cache" MESA_SHADER_CACHE_DIR="$cache" \
        "$RAFTER" conformance --device vulkan --threads "$threads" ${FILTER:+--filter "$FILTER"} >"$log" 2>&1 &
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
if [ "$CACHE" = warm ]; then
    warm_cache=$(mktemp -d "$caches/warm.XXXXXX")
    prime=${PRIME_VARIANT:-serial}
    line=$(DEADLINE=$((DEADLINE * 2)) one_run "$prime" prime1 "$warm_cache")
    echo "prime $line" | tee -a "$OUT/times"
    case $line in
        *finished-*) ;;
        *) line=$(one_run "$prime" prime2 "$warm_cache" 2); echo "prime $line" | tee -a "$OUT/times" ;;
    esac
fi
for round in $(seq 1 "$ROUNDS"); do
    for variant in $VARIANTS; do
        [ $SECONDS -lt "$BUDGET" ] || { echo "budget spent before $variant round $round" | tee -a "$OUT/times"; break 2; }
        if [ "$CACHE" = warm ] || [ "$variant" = warm ]; then
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
grep -v "^prime " "$OUT/times" | while read -r variant round secs outcome; do
    log="$OUT/runs/$variant-$round.log"
    [ -f "$log" ] || continue
    case $outcome in
        finished-*) tail -3 "$log" >"$log.tail"; rm -f "$log" ;;
        *) { echo "===== $variant round $round: $secs s, $outcome"
             awk '/^RAFTER_VULKAN_WATCHDOG_S/ { on = 1 } on' "$log" | head -60; } >>"$OUT/reports.txt" ;;
    esac
done
awk 'NF == 4 { n[$1]++; if ($4 ~ /^finished/) ok[$1]++; t[$1] = t[$1] " " $3 }
     END { for (v in n) printf "%s: %d runs, %d finished (seconds:%s)\n", v, n[v], ok[v], t[v] }' \
    "$OUT/times" | tee "$OUT/summary.txt"
rm -rf "$caches"
