//! Tensor infos: what the GGUF header says about each tensor, after validation.

use crate::ggml_type::GgmlType;

/// One tensor of a GGUF file. Every field was validated when the file was opened: the
/// dims multiply without overflow, rows hold whole blocks, and the data lies aligned,
/// inside the file, and overlapping no other tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub(crate) name: String,
    pub(crate) dims: Vec<u64>,
    pub(crate) ty: GgmlType,
    pub(crate) offset: u64,
    pub(crate) n_elements: u64,
    pub(crate) n_bytes: u64,
    pub(crate) info_offset: u64,
    pub(crate) data_start: u64,
}

impl TensorInfo {
    /// The tensor's name (`"blk.0.attn_q.weight"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions in ggml order: `dims()[0]` is the row length (the fastest-varying,
    /// contiguous dimension). A 2-D weight of logical shape `[out, in]` has dims
    /// `[in, out]`.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Dimensions outermost first (the reverse of [`dims`](Self::dims)), as PyTorch,
    /// numpy and safetensors write shapes: `[out, in]` for a linear weight.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// The element type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Offset of the data from the start of the data section (as stored in the file).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Offset of the data from the start of the file.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Number of elements (the product of the dims; 1 for zero dims).
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// Size of the data in bytes.
    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }

    /// Offset in the file where this tensor's info (its name's length) starts.
    pub fn info_offset(&self) -> u64 {
        self.info_offset
    }
}
