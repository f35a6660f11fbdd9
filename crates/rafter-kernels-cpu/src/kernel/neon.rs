//! aarch64 NEON micro-kernel: a 4x16 tile in 16 q-register accumulators. Minimal on purpose:
//! the FMA loop is vectorised, the epilogue reuses the scalar one. This file was not compiled
//! in the session that wrote it (no aarch64 target installed); see the crate's notes.

use std::arch::aarch64::*;

use super::{scalar, Tile, PANEL};

const MR: usize = 4;

/// # Safety
/// The contract of [`super::Isa::tile`] (NEON is always present on aarch64).
pub(crate) unsafe fn tile(t: &Tile, packed_a: bool) {
    debug_assert!(t.mv >= 1 && t.mv <= MR && t.nv >= 1 && t.nv <= PANEL);
    let mut acc = [[0.0f32; PANEL]; MR];
    // SAFETY: forwarded contract: A has MR packed rows or `mv` direct rows of kc values, B one
    // panel of kc rows; the accumulator array is MR x 16.
    unsafe {
        kernel(t, packed_a, &mut acc);
        scalar::finish(t, &acc);
    }
}

#[target_feature(enable = "neon")]
unsafe fn kernel(t: &Tile, packed_a: bool, out: &mut [[f32; PANEL]; MR]) {
    let zero = vdupq_n_f32(0.0);
    let mut acc = [[zero; 4]; MR];
    let rows = if packed_a { MR } else { t.mv };
    for p in 0..t.kc {
        // SAFETY: this k step's B row (16 floats) and A values for `rows` rows are in bounds.
        unsafe {
            let bp = t.b.add(p * PANEL);
            let bv = [
                vld1q_f32(bp),
                vld1q_f32(bp.add(4)),
                vld1q_f32(bp.add(8)),
                vld1q_f32(bp.add(12)),
            ];
            for (r, acc_r) in acc.iter_mut().enumerate().take(rows) {
                let av = if packed_a {
                    *t.a.add(p * MR + r)
                } else {
                    *t.a.add(r * t.a_rs + p)
                };
                let av = vdupq_n_f32(av);
                for (acc_rv, &b) in acc_r.iter_mut().zip(&bv) {
                    *acc_rv = vfmaq_f32(*acc_rv, av, b);
                }
            }
        }
    }
    for (acc_r, out_r) in acc.iter().zip(out.iter_mut()) {
        for (v, &x) in acc_r.iter().enumerate() {
            // SAFETY: out_r has 16 floats; v*4+4 <= 16.
            unsafe { vst1q_f32(out_r.as_mut_ptr().add(v * 4), x) };
        }
    }
}
