#!/usr/bin/env bash
# Runs the unit tests of the unsafe-heavy crates under Miri (issue 28, item 5): the CPU HAL
# (its allocator, worker pool, semaphores and their threads: the whole suite), the runtime's
# tensors and borrowed buffers, the artifact format, and the kernels' portable paths (Miri
# runs no AVX-512 or AVX2 intrinsics: feature detection reports none under it, so the
# portable code is what runs). Miri interprets ~10^4x slower than a release build, so the
# kernels run a fixed list: the tests that take <= 2 ms natively (memory, pool, driver,
# layout, tile and norm code), not the large numeric sweeps. On demand, not in CI: ~35 min
# on the 2-core dev machine under load.
#
#   scripts/miri.sh            needs the nightly toolchain with miri
#                              (rustup toolchain install nightly --component miri,rust-src)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export MIRIFLAGS=${MIRIFLAGS:--Zmiri-disable-isolation}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target-miri}
miri() { echo "miri.sh: cargo +nightly miri test $*"; cargo +nightly miri test "$@"; }

miri -p rafter-hal-cpu
miri -p rafter-runtime --lib
miri -p rafter-artifact --lib
KERNEL_TESTS=(
  activation::tests::special_values artifact_section::tests::round_trips_and_rejects_bad_bytes
  attention::tests::bad_shapes_are_errors attention::tests::f16_loads_widen_exactly
  attention::tests::f16_rounding_matches_half attention::tests::windows_and_softcaps
  block_nhwc::tests::bad_blocks_are_errors block_nhwc::tests::bad_stem_blocks_are_errors
  buffer::tests::a_pair_held_up_the_stack_is_not_handed_out_again
  buffer::tests::grow_keeps_the_contents_and_the_alignment
  buffer::tests::new_is_aligned_after_the_prefix
  driver::tests::a_single_row_against_large_packed_weights_is_split_over_the_threads
  driver::tests::columns_are_split_in_whole_panels moe::tests::picks_the_largest_and_renormalises
  nhwc::tests::depthwise_bad_sizes_are_errors nhwc::tests::im2col_rows_are_the_windows
  nhwc::tests::max_pool_matches_direct_loops norm::tests::bad_operands_are_errors
  norm::tests::constant_rows_normalise_to_beta norm::tests::layer_norm_matches_reference_numerics
  norm::tests::rms_norm_matches_reference_numerics
  pool::tests::a_thread_takes_its_own_chunk_first_then_steals_in_turn
  pool::tests::every_task_runs_exactly_once pool::tests::sums_match_sequential
  quant::x86_vnni_gemm::tests::transpose16_is_a_transpose
  recurrent::tests::gates_match_f64_for_every_isa recurrent::tests::gemv_checks_lengths
  recurrent::tests::gemv_matches_f64_on_odd_sizes_for_every_isa rope::tests::bad_tables_are_errors
  rope::tests::rotates_the_pairs_each_mode_names simd::tests::interleave_is_the_inverse_of_deinterleave
  softmax::tests::bad_operands_are_errors softmax::tests::degenerate_rows
  softmax::tests::masks_broadcast_like_bert softmax::tests::matches_naive_on_odd_lengths_and_magnitudes
  spatial::tests::copy_strided_matches stem::tests::bad_shapes_are_errors
  tile::tests::bad_operands_are_errors tile::tests::bias_add_gelu_with_broadcast_matches_naive
  tile::tests::erf_gelu_chain_is_fused_and_dead_code_dropped
  tile::tests::every_op_matches_scalar_definitions
  tile::tests::registers_are_reused_and_constants_broadcast
  transpose::tests::permutations_that_move_the_last_axis_are_errors
  transpose::tests::wrong_lengths_are_errors winograd::tests::bad_sizes_are_errors
  winograd_nhwc::tests::bad_sizes_are_errors
)
miri -p rafter-kernels-cpu --lib -- --exact "${KERNEL_TESTS[@]}"
echo "miri.sh: all passed"
