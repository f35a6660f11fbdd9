#!/usr/bin/env bash
# Runs fuzz targets for a fixed time each and records what every run did.
#
#   fuzz/run_all.sh SECONDS [TARGET...]
#
# With no TARGET, every target `cargo fuzz list` names runs. Each run continues the
# git-ignored corpus `fuzz/corpus/<target>` (seeded from the committed `fuzz/seeds/<target>`
# when that exists), writes crashes to `fuzz/artifacts/<target>/` and its log to
# `fuzz/logs/<target>-<date>.log`, then appends one row (date, commit, target, seconds,
# execs, coverage edges, corpus size, crashes) to `fuzz/results.md` and prints that table.
#
# Environment:
#   FUZZ_JOBS  targets run at once (default 1; the 2-core dev machine takes 2)
#   FUZZ_NICE  niceness of the fuzzers (default 19: they yield to builds)
#   FUZZ_RSS_MB, FUZZ_TIMEOUT_S  libFuzzer's -rss_limit_mb and per-input -timeout
#
# libFuzzer stops at the first crash, so a crashing run records the seconds it ran before
# the crash; the input is in artifacts/ for a regression test.
set -euo pipefail

usage() {
    echo "usage: fuzz/run_all.sh SECONDS [TARGET...]" >&2
    exit 2
}
[[ $# -ge 1 && $1 =~ ^[0-9]+$ && $1 -gt 0 ]] || usage
SECONDS_PER_TARGET=$1
shift

FUZZ_DIR=$(cd "$(dirname "$0")" && pwd)
cd "$FUZZ_DIR"
JOBS=${FUZZ_JOBS:-1}
NICE=${FUZZ_NICE:-19}
RSS_MB=${FUZZ_RSS_MB:-2048}
TIMEOUT_S=${FUZZ_TIMEOUT_S:-120}
RESULTS="$FUZZ_DIR/results.md"
BIN_DIR="$FUZZ_DIR/target/x86_64-unknown-linux-gnu/release"

if [[ $# -gt 0 ]]; then
    TARGETS=("$@")
else
    mapfile -t TARGETS < <(RUSTC_BOOTSTRAP=1 cargo fuzz list)
fi

# The largest input worth mutating, per target: about the size of the largest useful seed.
max_len() {
    case $1 in
    read_artifact) echo 262144 ;;
    import_onnx) echo 65536 ;;
    read_gguf_model | read_gguf_tokenizer) echo 16384 ;;
    read_ir_text) echo 16384 ;;
    *) echo 8192 ;;
    esac
}

# The commit the binaries are built from; "+dirty" when tracked files differ from it
# (results.md itself excepted).
commit_label() {
    local c
    c=$(git rev-parse --short HEAD)
    if [[ -n $(git status --porcelain --untracked-files=no -- .. ":(exclude)$RESULTS") ]]; then
        c="$c+dirty"
    fi
    echo "$c"
}

# Counts crash, leak, out-of-memory and timeout reproducers in a target's artifact folder.
count_crashes() {
    find "$FUZZ_DIR/artifacts/$1" -maxdepth 1 -type f \
        \( -name 'crash-*' -o -name 'leak-*' -o -name 'oom-*' -o -name 'timeout-*' \) 2>/dev/null | wc -l
}

run_one() {
    local target=$1 date log corpus seeds before after started ended rc
    date=$(date -u +%Y-%m-%dT%H:%MZ)
    log="$FUZZ_DIR/logs/$target-$(date -u +%Y%m%dT%H%M%S).log"
    corpus="$FUZZ_DIR/corpus/$target"
    seeds="$FUZZ_DIR/seeds/$target"
    mkdir -p "$corpus" "$FUZZ_DIR/artifacts/$target"
    local dirs=("$corpus")
    [[ -d $seeds ]] && dirs+=("$seeds")
    before=$(count_crashes "$target")
    started=$(date +%s)
    rc=0
    nice -n "$NICE" "$BIN_DIR/$target" "${dirs[@]}" \
        -max_total_time="$SECONDS_PER_TARGET" -max_len="$(max_len "$target")" \
        -rss_limit_mb="$RSS_MB" -timeout="$TIMEOUT_S" -print_final_stats=1 \
        -artifact_prefix="$FUZZ_DIR/artifacts/$target/" >"$log" 2>&1 || rc=$?
    ended=$(date +%s)
    after=$(count_crashes "$target")
    record "$target" "$date" "$((ended - started))" "$log" "$((after - before))" "$rc"
}

# Appends one results row, read from a finished run's libFuzzer log.
record() {
    local target=$1 date=$2 secs=$3 log=$4 crashes=$5 rc=$6 execs cov corp status
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    status=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")
    corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$status")
    if [[ $rc -ne 0 && $crashes -eq 0 ]]; then
        crashes="exit $rc"
    fi
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$date" "$COMMIT" "$target" "$secs" \
        "${execs:-?}" "${cov:-?}" "${corp:-?}" "$crashes" >>"$RESULTS"
    echo "$target: $secs s, ${execs:-?} execs, cov ${cov:-?}, corpus ${corp:-?}, crashes $crashes (log: $log)"
}

if [[ ! -f $RESULTS ]]; then
    {
        echo "# Fuzz runs (appended by fuzz/run_all.sh)"
        echo
        echo "| date (UTC) | commit | target | seconds | execs | coverage edges | corpus | crashes |"
        echo "|---|---|---|---|---|---|---|---|"
    } >"$RESULTS"
fi
mkdir -p "$FUZZ_DIR/logs"
for t in "${TARGETS[@]}"; do
    RUSTC_BOOTSTRAP=1 cargo fuzz build "$t"
done
COMMIT=$(commit_label)

running=0
for t in "${TARGETS[@]}"; do
    [[ -x $BIN_DIR/$t ]] || {
        echo "no fuzz target named $t (cargo fuzz list names them)" >&2
        exit 2
    }
    run_one "$t" &
    running=$((running + 1))
    if [[ $running -ge $JOBS ]]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait
echo
cat "$RESULTS"
