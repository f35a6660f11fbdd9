#!/usr/bin/env bash
# Issue 28, item 1: repeated `rafter conformance --device vulkan --threads N` runs, each
# under a deadline, with a cold and a warm driver shader cache, timing each run.
#
# `rafter conformance` opens its Vulkan device without a rafter pipeline-cache file, so the
# only cache between runs is the driver's own on-disk shader cache (NVIDIA:
# __GL_SHADER_DISK_CACHE_PATH; Mesa: MESA_SHADER_CACHE_DIR). "cold" points it at a fresh
# empty directory for every run; "warm" at one directory warmed by a first, untimed run.
#
# Usage: scripts/stall_check.sh [RUNS] [THREADS] [DEADLINE_S]   (defaults: 20 8 60)
#   RAFTER=path/to/rafter (default target/release/rafter), RAFTER_CONFORMANCE_DIR as usual.
#   COLD_RUNS, WARM_RUNS (default RUNS each): how many runs of each mode.
#   SINGLE=1: first a `--threads 1` run on the warm cache, the reference for "within 2x".
#   BUDGET_S: no run starts after this many seconds (a device call's limit); what was
#   skipped is said in the summary.
# Output: one line per run (mode, run, seconds, exit status; 124/137 = killed at the
# deadline), a summary per mode, and for a stalled run a thread snapshot
# (/proc/PID/task/*/stat states and wchan) taken just before the kill, in $LOG_DIR.
# Done (issue 28): 200 runs, none killed, each within 2x the --threads 1 time.
# scripts/stall_breadcrumbs.sh sources this file for `one_run` (and its settings above).
set -u
RUNS=${1:-20}
THREADS=${2:-8}
DEADLINE=${3:-60}
RAFTER=${RAFTER:-target/release/rafter}
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/stall_check.XXXXXX)}
mkdir -p "$LOG_DIR"
# A run still going after this many seconds prints the Vulkan scheduler's state to its log
# (rafter-hal-vulkan's watchdog: which semaphore values its pending work waits for).
export RAFTER_VULKAN_WATCHDOG_S=${RAFTER_VULKAN_WATCHDOG_S:-$((DEADLINE / 2))}
[ -x "$RAFTER" ] || { echo "no rafter binary at $RAFTER (cargo build --release -p rafter-cli --features vulkan?)" >&2; exit 2; }

snapshot() { # PID FILE: thread states, for a run about to be killed
    local pid=$1 out=$2
    for t in /proc/"$pid"/task/*; do
        printf '%s %s %s\n' "$(cat "$t/comm" 2>/dev/null)" \
            "$(awk '{print $3}' "$t/stat" 2>/dev/null)" "$(cat "$t/wchan" 2>/dev/null)"
    done >"$out" 2>/dev/null
}

one_run() { # MODE RUN CACHE_DIR -> prints "MODE RUN SECONDS STATUS"
    local mode=$1 run=$2 cache=$3 log="$LOG_DIR/$1-$2.log"
    local start end status
    start=$(date +%s.%N)
    __GL_SHADER_DISK_CACHE_PATH=$cache MESA_SHADER_CACHE_DIR=$cache \
        "$RAFTER" conformance --device vulkan --threads "$THREADS" >"$log" 2>&1 &
    local pid=$!
    local waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge $((DEADLINE * 10)) ]; then
            snapshot "$pid" "$LOG_DIR/$mode-$run.threads"
            kill -TERM "$pid" 2>/dev/null
            sleep 5
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null && echo "needed SIGKILL" >>"$log"
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    wait "$pid"
    status=$?
    [ "$waited" -ge $((DEADLINE * 10)) ] && status=124
    end=$(date +%s.%N)
    printf '%s %d %.2f %d\n' "$mode" "$run" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "$status"
}

summary() { # MODE: killed = stopped at the deadline (124); failed = another non-zero exit
    grep "^$1 " "$LOG_DIR/times" | sort -k3,3n | awk -v m="$1" '
        { t[NR]=$3; if ($4 == 124) killed++; else if ($4 != 0) failed++ }
        END { if (NR) printf "%s: %d runs, %d killed, %d exited non-zero, median %.2f s, max %.2f s\n",
              m, NR, killed, failed, t[int((NR+1)/2)], t[NR] }'
}

BUDGET=${BUDGET_S:-0}
in_budget() { [ "$BUDGET" -eq 0 ] || [ "$SECONDS" -lt "$BUDGET" ]; }

# Sourced (scripts/stall_breadcrumbs.sh): the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

echo "logs in $LOG_DIR"
: >"$LOG_DIR/times"
for run in $(seq 1 "${COLD_RUNS:-$RUNS}"); do
    in_budget || { echo "budget spent: cold runs from $run on skipped"; break; }
    cold=$(mktemp -d "$LOG_DIR/cold.XXXXXX")
    one_run cold "$run" "$cold" | tee -a "$LOG_DIR/times"
    rm -rf "$cold"
done
warm="$LOG_DIR/warm-cache"
mkdir -p "$warm"
one_run warmup 0 "$warm" | tee -a "$LOG_DIR/times"
if [ "${SINGLE:-0}" = 1 ]; then
    DEADLINE=300 THREADS=1 one_run single 0 "$warm" | tee -a "$LOG_DIR/times"
fi
for run in $(seq 1 "${WARM_RUNS:-$RUNS}"); do
    in_budget || { echo "budget spent: warm runs from $run on skipped"; break; }
    one_run warm "$run" "$warm" | tee -a "$LOG_DIR/times"
done
summary cold
summary single
summary warm
