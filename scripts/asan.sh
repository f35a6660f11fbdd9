#!/usr/bin/env bash
# Runs the unsafe-heavy crates' tests under AddressSanitizer (issue 28, item 5): where Miri
# cannot go, the SIMD paths (AVX-512, AVX2, VNNI: Miri runs no intrinsics) of
# rafter-kernels-cpu, the CPU HAL and the runtime, natively, with every out-of-bounds
# access, use-after-free or leak in our code reported by ASan. The standard library is not
# rebuilt with the sanitizer (no -Zbuild-std), so accesses inside std go unchecked; ours are
# checked. On demand, not in CI (~10 min cold on the 2-core dev machine).
#
#   scripts/asan.sh [CRATE...]     needs the nightly toolchain (rustup toolchain install nightly)
#                                  default crates: rafter-kernels-cpu rafter-hal-cpu rafter-runtime
#
# ASAN_OPTIONS defaults to detect_leaks=1 (LeakSanitizer too); the separate target dir
# (target-asan, git-ignored) keeps the instrumented build apart from the normal one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export RUSTFLAGS="${RUSTFLAGS:-} -Zsanitizer=address"
export RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -Zsanitizer=address"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target-asan}
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
crates=("$@")
[[ ${#crates[@]} -gt 0 ]] || crates=(rafter-kernels-cpu rafter-hal-cpu rafter-runtime)
for c in "${crates[@]}"; do
    # The unit and integration tests (the kernels' numeric sweeps over every ISA live in
    # tests/); the runtime's integration tests compile models end to end, so its unit
    # tests only.
    which=--tests
    [[ $c == rafter-runtime ]] && which=--lib
    echo "asan.sh: cargo +nightly test -p $c --release $which --target $host"
    # --target: the sanitizer applies to the target's crates only, not to build scripts
    # and proc macros (which run on the host and would need a sanitized runtime too).
    cargo +nightly test -p "$c" --release "$which" --target "$host"
done
echo "asan.sh: no AddressSanitizer report in ${crates[*]}"
