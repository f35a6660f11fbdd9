//! AVX2 decode kernels (none yet: every format runs the dequantizing fallback).
use super::act::Act;
use super::gemv::AlignedBytes;
use rafter_quant::BlockFormat;

pub(crate) fn supports(_format: BlockFormat) -> bool {
    false
}

pub(crate) fn prepare(_format: BlockFormat, _act: &Act, _aux: &mut AlignedBytes) {}

/// # Safety
/// Never called while `supports` is false.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_tile(
    _f: BlockFormat,
    _w: &[u8],
    _act: &Act,
    _aux: &[u8],
    _r0: usize,
    _m: usize,
    _out: &mut [f32],
    _ld: usize,
) {
    unreachable!()
}
