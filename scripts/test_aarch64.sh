#!/usr/bin/env bash
# The aarch64 build's tests, run on this (x86-64) machine under qemu-user: rafter's targets
# are Arm SoCs, and the NEON kernels and the portable paths the x86 build never takes only
# run here. Cross-builds with Debian's aarch64 toolchain into its own target dir
# (target-aarch64, git-ignored; RAFTER_AARCH64_TARGET_DIR overrides) and runs:
#   1. clippy -D warnings of the CPU crates built for aarch64 (x86-only code is cfg-gated, so
#      an aarch64 build can warn where the x86 one does not);
#   2. in one cargo invocation (one feature resolution, so the crates are built once):
#      rafter-kernels-cpu's and rafter-hal-cpu's tests, and the CPU conformance of
#      rafter-conformance without its `vulkan` feature: compiled_suite (the whole ONNX backend
#      suite, 2,033 tests, through compiler, artifact, CPU runtime and kernels, which must pass
#      every test conformance/expected-failures-cpu.txt does not list:
#      RAFTER_COMPILED_SUITE_BASELINE=list) and contrib_ops (ONNX Runtime's contrib-op
#      fixtures, both paths);
#   3. a count check on compiled_suite's output: it held the compiled path to the 2,033 tests
#      minus the list's entries.
# Left out to fit CI's time (each runs on x86 in scripts/test.sh): the reference executor's
# run of the suite, in onnx_backend_suite and in compiled_suite's default baseline (145 s
# under qemu each; on x86 onnx_backend_suite holds the reference to exactly the list, so the
# list is the same baseline, and rafter ships no reference executor on Arm: the deploy
# runtime has none), and corpus (test.sh runs it on x86, CPU and lavapipe). rafter-runtime-cpu's
# own tests (~3 min) are left too: the conformance runs its code on every op.
# Needs the conformance cache that scripts/test.sh generates ($RAFTER_CONFORMANCE_DIR, else
# .cache/onnx-conformance). Installs the rustup target and the apt packages when missing
# (apt as root only, as .ci/run does). Extra arguments go to every cargo command (e.g. -j1).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
TARGET=aarch64-unknown-linux-gnu
start=$SECONDS
# shellcheck source=scripts/phase.sh
. scripts/phase.sh

if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

# The cross linker and C runtime (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) and
# qemu-aarch64 (qemu-user).
APT_PKGS=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if (( ${#missing[@]} )); then
  if [[ $(id -u) != 0 ]]; then
    echo "test_aarch64.sh: missing ${missing[*]} and not root; cannot install" >&2
    exit 1
  fi
  echo "test_aarch64.sh: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi
if ! rustup target list --installed | grep -qx "$TARGET"; then
  echo "test_aarch64.sh: rustup target add $TARGET"
  rustup target add "$TARGET"
fi

CONF=${RAFTER_CONFORMANCE_DIR:-$ROOT/.cache/onnx-conformance}
if [[ ! -f $CONF/STAMP ]]; then
  echo "test_aarch64.sh: no conformance cache at $CONF (run scripts/test.sh first)" >&2
  exit 1
fi
export RAFTER_CONFORMANCE_DIR=$CONF
export CARGO_TARGET_DIR=${RAFTER_AARCH64_TARGET_DIR:-$ROOT/target-aarch64}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
echo "test_aarch64.sh: CARGO_TARGET_DIR=$CARGO_TARGET_DIR RAFTER_CONFORMANCE_DIR=$CONF"
echo "test_aarch64.sh: runner: $CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER ($(qemu-aarch64 --version | head -n1))"

LOG=$(mktemp)
trap 'rm -f "$LOG"; phase_end' EXIT
summary=()
# Runs one step, printing its command and time; keeps its output in $LOG for the counts.
step() {
  local t0=$SECONDS
  phase "$*"
  "$@" 2>&1 | tee "$LOG"
  summary+=("$(printf '%4d s  %s' $((SECONDS - t0)) "$*")")
}
# Sums the passed/failed counts of every `test result:` line in $LOG.
counts() {
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1);
       if ($(i) ~ /^failed;?$/) f += $(i-1) } } END { printf "%d passed, %d failed", p, f }' "$LOG"
}

step cargo clippy --release --target "$TARGET" -p rafter-kernels-cpu -p rafter-hal-cpu \
  -p rafter-runtime-cpu --all-targets "$@" -- -D warnings

# The build first, on its own, so the log times it apart from the run under qemu.
step cargo test --release --target "$TARGET" -p rafter-kernels-cpu -p rafter-hal-cpu \
  -p rafter-conformance --no-default-features --lib --tests --no-run "$@"
RAFTER_COMPILED_SUITE_BASELINE=list \
  step cargo test --release --target "$TARGET" -p rafter-kernels-cpu -p rafter-hal-cpu \
  -p rafter-conformance --no-default-features --lib --tests "$@" -- --show-output \
  --skip onnx_backend_suite_matches_expected_failures --skip corpus_models_match_onnx_runtime
# Per test binary: its passed and failed counts.
while IFS= read -r line; do summary+=("        $line"); done < <(awk '
  /^ +Running / { n = $NF; gsub(/^.*\/|-[0-9a-f]+\)$/, "", n) }
  /^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p = $(i-1);
                    if ($(i) ~ /^failed;?$/) f = $(i-1) }
                    if (n != "") printf "%-20s %4d passed, %d failed\n", n, p, f; n = "" }' "$LOG")
summary+=("        total: $(counts)")

# The baseline compiled_suite held the compiled path to, against the expected-failure list.
line=$(grep -E '^conformance: list [0-9]+ passed' "$LOG") || {
  echo "test_aarch64.sh: compiled_suite printed no 'conformance: list N passed' line" >&2
  exit 1
}
summary+=("        $line")
read -r ref total < <(sed -E 's/^conformance: list ([0-9]+) passed.* of ([0-9]+).*/\1 \2/' <<<"$line")
listed=$(grep -cv '^[[:space:]]*\(#\|$\)' conformance/expected-failures-cpu.txt)
if (( ref != total - listed )); then
  echo "test_aarch64.sh: compiled_suite's baseline held $ref of $total; expected-failures-cpu.txt" \
    "lists $listed, so it should hold $((total - listed))" >&2
  exit 1
fi
summary+=("        baseline = $total - $listed listed in conformance/expected-failures-cpu.txt")

echo "test_aarch64.sh: done in $((SECONDS - start)) s ($TARGET under qemu-user)"
printf '  %s\n' "${summary[@]}"
