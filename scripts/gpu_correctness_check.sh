#!/usr/bin/env bash
# Issue 24, item 3: confirms on a real GPU (the H200: NVIDIA driver 580) the SPIR-V fixes
# that lavapipe cannot show:
#   1. the seven ONNX tests that failed there (test_mod_mixed_sign_int*, test_mod_int64_fmod,
#      test_dynamicquantizelinear_expanded, test_attention_4d_causal_fp16_expanded) and their
#      neighbours (every mod, div, reciprocal and quantizelinear test), with
#      `rafter conformance --device vulkan`;
#   2. rafter-codegen-spirv's device tests on that GPU (division bit-exact against IEEE,
#      integer kernels bit-exact against the reference executor, spirv-val on every module);
#   3. the whole suite on vulkan, ending with its `gpu:` line (kernels placed on the GPU).
#
# Usage: scripts/gpu_correctness_check.sh [THREADS]   (default 8)
#   RAFTER=path/to/rafter (default target/release/rafter, built here if missing),
#   RAFTER_CONFORMANCE_DIR as usual; RAFTER_SPIRV_VAL=path/to/spirv-val to validate modules.
# Exit status: 0 when all three steps pass.
set -u
THREADS=${1:-8}
RAFTER=${RAFTER:-target/release/rafter}
export RAFTER_REQUIRE_VULKAN=1
if [ -n "${RAFTER_SPIRV_VAL:-}" ]; then export RAFTER_REQUIRE_SPIRV_VAL=1; fi
[ -x "$RAFTER" ] || cargo build --release -p rafter-cli || exit 2
status=0

# `rafter conformance` fails on any failing test; a test listed in
# conformance/expected-failures-vulkan.txt (test_attention_4d_causal_fp16_expanded: the
# GPU's f16 softmax is the more precise, ONNX's expected output 1 f16 ulp off) is expected.
conformance() { # ARGS... -> status 1 when a test outside the expected list fails
    local log
    log=$(mktemp)
    "$RAFTER" conformance --device vulkan --threads "$THREADS" "$@" 2>&1 | tee "$log" |
        grep -E '^(FAIL|gpu:|conformance:)'
    local unexpected
    unexpected=$(sed -n 's/^FAIL \([^:]*\):.*/\1/p' "$log" |
        grep -vxF -f <(sed -n 's/^\(test_[^ ]*\).*/\1/p' conformance/expected-failures-vulkan.txt))
    rm -f "$log"
    [ -z "$unexpected" ] || { echo "unexpected failures: $unexpected"; return 1; }
}

echo "== 1. the tests that failed on NVIDIA"
conformance --filter '^test_(mod_|div|reciprocal|quantizelinear|dynamicquantizelinear|attention_4d_causal_fp16)' ||
    status=1

echo "== 2. rafter-codegen-spirv's device tests (division, integer kernels)"
cargo test --release -p rafter-codegen-spirv --test all -- gpu:: integer:: --skip matmul_integer:: || status=1

echo "== 3. the whole suite on vulkan"
conformance || status=1

echo "gpu_correctness_check: $([ $status = 0 ] && echo PASSED || echo FAILED)"
exit $status
