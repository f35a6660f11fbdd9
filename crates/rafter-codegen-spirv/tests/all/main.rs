//! rafter-codegen-spirv's integration tests, one module per kernel family, in one test binary.
//!
//! Why one binary and not one per file: each integration test file is its own crate that
//! links the whole Vulkan stack, so 38 files meant 38 links (and 38 compiles of `common`)
//! in every `cargo test`; and cargo runs test binaries one after another, so a file with one
//! long test (a few hundred kernels compiled by lavapipe) kept the other cores idle. Here the
//! libtest harness runs all of them on its worker threads. Run one family with a filter:
//! `cargo test --release -p rafter-codegen-spirv --test all -- cumulative::`.

mod common;

mod arg_reduce;
mod attention;
mod batch_norm;
mod bert_tiny;
mod bit_cast;
mod block_quant;
mod concat;
mod const_arrays;
mod conv;
mod conv_transpose;
mod cumulative;
mod dynamic_quantize;
mod epilogue_activation;
mod eye_like;
mod f16;
mod gather;
mod gather_elements;
mod gather_nd;
mod gpu;
mod grid_sample;
mod gru;
mod integer;
mod is_inf;
mod layer_norm_stats;
mod loss;
mod lstm;
mod many_bindings;
mod matmul;
mod matmul_integer;
mod pad;
mod qlinear_conv;
mod reduce_axes;
mod rotary;
mod scatter_elements;
mod slice;
mod space_to_depth;
mod split;
mod swiglu;
mod symbolic_dims;
mod trilu;
mod validate;
mod window_nd;
