//! The portable kernel: plain Rust over a 4x16 accumulator array (LLVM vectorises it with
//! whatever the target's baseline offers). Slow next to the intrinsic kernels, but it is the
//! fallback on any CPU and the path tests check on every machine.

use super::{epilogue_scalar, Tile, PANEL};

const MR: usize = 4;
const NR: usize = 16;

/// # Safety
/// The contract of [`super::Isa::tile`], with `mr == 4` (the scalar blocking's MR).
pub(crate) unsafe fn tile(t: &Tile, packed_a: bool, mr: usize) {
    debug_assert_eq!(mr, MR);
    debug_assert!(t.mv <= MR && t.nv <= NR && NR == PANEL);
    let mut acc = [[0.0f32; NR]; MR];
    for p in 0..t.kc {
        // SAFETY: p < kc, and B's one panel (NR == PANEL) holds kc rows of PANEL floats.
        let brow = unsafe { std::slice::from_raw_parts(t.b.add(p * PANEL), PANEL) };
        for (r, acc_r) in acc.iter_mut().enumerate().take(t.mv) {
            // SAFETY: r < mv <= MR; packed A has MR floats per k, direct A has mv rows of kc.
            let av = unsafe {
                if packed_a {
                    *t.a.add(p * MR + r)
                } else {
                    *t.a.add(r * t.a_rs + p)
                }
            };
            for (acc_rj, bj) in acc_r.iter_mut().zip(brow) {
                *acc_rj += av * bj;
            }
        }
    }
    // SAFETY: forwarded contract.
    unsafe { finish(t, &acc) }
}

/// Stores a tile's `alpha*A*B` accumulators to C: `beta*C`, then the epilogue. Shared with
/// the NEON kernel, which keeps its epilogue scalar.
///
/// # Safety
/// C (and the epilogue operands, when present) valid for the tile's `mv x nv` region, with
/// `mv <= acc.len()` and `nv <= NR`.
pub(crate) unsafe fn finish(t: &Tile, acc: &[[f32; NR]]) {
    for (i, acc_i) in acc.iter().enumerate().take(t.mv) {
        for (j, &ab) in acc_i.iter().enumerate().take(t.nv) {
            // SAFETY: i < mv, j < nv: inside the tile the caller gave us.
            unsafe {
                let cp = t.c.add(i * t.ldc + j);
                let mut x = t.alpha * ab;
                if t.beta != 0.0 {
                    x += t.beta * *cp;
                }
                if let Some(e) = &t.epi {
                    let mut bias = if e.bias.is_null() {
                        0.0
                    } else {
                        *e.bias.add(j)
                    };
                    if !e.row_bias.is_null() {
                        bias += *e.row_bias.add(i);
                    }
                    let r = if e.res.is_null() {
                        0.0
                    } else {
                        *e.res.add(i * e.res_ld + j)
                    };
                    x = epilogue_scalar(x, bias, e.act, r, e.res_before);
                    if let Some((lo, hi)) = e.clamp {
                        x = x.max(lo).min(hi);
                    }
                }
                *cp = x;
            }
        }
    }
}
