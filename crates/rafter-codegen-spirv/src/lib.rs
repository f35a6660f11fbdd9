//! rafter's SPIR-V code generator: kernel bodies (small [`rafter_ir::Graph`]s) to Vulkan
//! compute shaders.
//!
//! # The kernel ABI (shared with `rafter-hal-vulkan`)
//!
//! A kernel takes no descriptors. Its push constants hold, in binding order, each buffer's
//! 64-bit device address (a `PhysicalStorageBuffer` pointer, SPIR-V 1.5 / Vulkan 1.2 core),
//! then the dispatch's `params`. Addressing buffers by pointer is what lets one tensor exceed
//! the device's `maxStorageBufferRange` (128 MiB on lavapipe): a pointer reaches the whole
//! allocation. Binding order is the body's inputs, then its outputs. Element addresses are
//! 64-bit integer arithmetic on the base (`Int64`, the device's `shaderInt64`): NVIDIA's
//! driver drops stores past byte 2^32 reached through an access chain into the buffer.
//!
//! # What is generated today
//!
//! [`elementwise`]: a fused chain of elementwise ops on `f32`, each operand either of the
//! output's shape or a single element broadcast to all (a scalar). One invocation per
//! element over a 1-D grid, in a grid-stride loop, so any element count fits in the device's
//! workgroup-count limit; the count is the one `u32` param.
//!
//! [`matmul`]: f32 matrix products, a 64×64 (or 32×32) tile of C per workgroup staged
//! through workgroup memory with a 4×4 (2×2) register block per invocation; B 2-D or
//! batched like A; a fused bias/scale/residual/relu epilogue.
//! Reductions, data movement,
//! contractions, general broadcasting and other dtypes come next.
//!
//! Every module is SPIR-V 1.5 and is checked with `spirv-val --target-env vulkan1.3` in
//! this crate's tests.

mod elementwise;
mod matmul;

pub use elementwise::{elementwise, ElementwiseKernel, Operand, WORKGROUP_SIZE};
pub use matmul::{matmul, matmul_tiled, MatmulKernel, MatmulShape, MatmulTile, MATMUL_TILE};

/// Why a body could not be compiled to SPIR-V. The message names the node or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot generate SPIR-V for kernel `{kernel}`: {reason}")]
pub struct CodegenError {
    pub kernel: String,
    pub reason: String,
}

/// A module's words as the little-endian bytes an artifact stores and
/// `rafter_hal::ExecutablePayload::Bytes` carries.
pub fn to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
