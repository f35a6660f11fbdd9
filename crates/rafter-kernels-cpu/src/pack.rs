//! Packing: copying blocks of A and B into the layouts the micro-kernels stream (see
//! `kernel`'s module docs). Safe code: packing is O(MK + KN) against the GEMM's O(MNK), and
//! the row-contiguous fast paths below keep it near memcpy speed.

use crate::kernel::PANEL;
use crate::MatRef;

/// Packs `A[i0..i0+mc, p0..p0+kc]` into `ceil(mc/mr)` panels of `kc x mr` (k-major), zero-
/// padding rows past `mc`. `dst` must hold `ceil(mc/mr) * mr * kc` floats.
pub(crate) fn pack_a(
    a: &MatRef<'_>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    mr: usize,
    dst: &mut [f32],
) {
    if kc == 0 {
        return;
    }
    let panels = mc.div_ceil(mr);
    for (ip, panel) in dst.chunks_exact_mut(kc * mr).take(panels).enumerate() {
        let rows = (mc - ip * mr).min(mr);
        let r0 = i0 + ip * mr;
        if a.cs == 1 {
            // Row-contiguous A: gather one k column of the panel's rows per step.
            let mut src: [&[f32]; 16] = [&[]; 16];
            debug_assert!(mr <= 16);
            for (r, s) in src.iter_mut().enumerate().take(rows) {
                let start = (r0 + r) * a.rs + p0;
                *s = &a.data[start..start + kc];
            }
            for (p, d) in panel.chunks_exact_mut(mr).enumerate() {
                for (dr, s) in d.iter_mut().zip(&src[..rows]) {
                    *dr = s[p];
                }
                d[rows..].fill(0.0);
            }
        } else {
            for (p, d) in panel.chunks_exact_mut(mr).enumerate() {
                for (r, dr) in d.iter_mut().enumerate().take(rows) {
                    *dr = a.data[(r0 + r) * a.rs + (p0 + p) * a.cs];
                }
                d[rows..].fill(0.0);
            }
        }
    }
}

/// Packs `B[p0..p0+kc, j0..j0+nc]` into `ceil(nc/PANEL)` panels of `kc x PANEL` (row-major),
/// `panel_stride` floats apart, zero-padding columns past `nc`.
pub(crate) fn pack_b(
    b: &MatRef<'_>,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    dst: &mut [f32],
    panel_stride: usize,
) {
    let panels = nc.div_ceil(PANEL);
    for jp in 0..panels {
        let cols = (nc - jp * PANEL).min(PANEL);
        let c0 = j0 + jp * PANEL;
        let panel = &mut dst[jp * panel_stride..jp * panel_stride + kc * PANEL];
        for (p, d) in panel.chunks_exact_mut(PANEL).enumerate() {
            let row = (p0 + p) * b.rs;
            if b.cs == 1 && cols == PANEL {
                // A whole panel row: a fixed-size copy (two vector moves), not a call to
                // memcpy per 64 bytes, which cost ~10% of ResNet-50's time in packing.
                let src: &[f32; PANEL] = b.data[row + c0..row + c0 + PANEL]
                    .try_into()
                    .expect("PANEL floats");
                let dst: &mut [f32; PANEL] = d.try_into().expect("PANEL floats");
                *dst = *src;
                continue;
            }
            if b.cs == 1 {
                d[..cols].copy_from_slice(&b.data[row + c0..row + c0 + cols]);
            } else {
                for (j, dj) in d.iter_mut().enumerate().take(cols) {
                    *dj = b.data[row + (c0 + j) * b.cs];
                }
            }
            d[cols..].fill(0.0);
        }
    }
}
