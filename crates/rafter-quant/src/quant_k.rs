//! ggml's reference quantizers of the K formats (`quantize_row_q2_K_ref` ..
//! `quantize_row_q8_K_ref`) and the scale searches they use (`make_qkx2_quants`,
//! `make_qx_quants`, `make_q3_quants`), one super-block per call.
//!
//! The searches are ports of ggml's float code, statement by statement: the order of every
//! sum and product matters for bit-exactness, so they read like the C rather than like
//! idiomatic Rust. Integer conversions ggml does implicitly (`int` to `uint8_t` keeps the
//! low byte) are spelled `as u8` / `as i8`.

use crate::fp::{f16_to_f32, f32_to_f16, nearest_int};
use crate::layout::{self, k4_scale_min};

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

fn put_f16(y: &mut [u8], at: usize, v: f32) {
    y[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

fn get_f16(y: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([y[at], y[at + 1]]))
}

/// `make_qkx2_quants`: the scale and min of an asymmetric `nmax`-level group minimising
/// the weighted error (absolute if `use_mad`, squared otherwise) over `nstep + 1` trial
/// scales. Writes the levels to `l`; returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min));
        l[i] = q.clamp(0, nmax) as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `make_qx_quants` with `rmse_type == 1` and no importance weights (weights `x^2`): the
/// scale of a symmetric `2 nmax`-level group, from 19 trial scales. Levels (offset by
/// `nmax`) go to `l`.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -nmax as f32 / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let q = level(iscale, v);
        l[i] = (q + nmax) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l[i] = (nmax + level(iscale, v)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` with `do_rmse`: a symmetric 8-level group's scale, refined by moving
/// single levels (weights `x^2`) for up to 5 rounds. Levels (offset by `nmax`) go to `l`.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let iscale = -nmax as f32 / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        l[i] = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let li = l[i] as f32;
            let mut slx = sumlx - w * v * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for q in l[..x.len()].iter_mut() {
        *q += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Packs 256 two-bit levels as Q2_K and Q3_K store them: byte `32 h + l` of `qs` holds
/// elements `128 h + l + 32 s` in bits `2 s`.
fn pack_2bit(levels: &[u8; 256], qs: &mut [u8]) {
    for h in 0..2 {
        for l in 0..32 {
            let e = |s: usize| levels[128 * h + l + 32 * s];
            qs[32 * h + l] = e(0) | (e(1) << 2) | (e(2) << 4) | (e(3) << 6);
        }
    }
}

pub(crate) fn q2_k(x: &[f32], y: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let mut levels = [0u8; 256];
    let mut scales = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..][..16];
        let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
        let (scale, min) =
            make_qkx2_quants(3, xs, &weights, &mut levels[16 * j..], -0.5, 0.1, 15, true);
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let (sc, rest) = y.split_at_mut(layout::q2_k::QS);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(rest, layout::q2_k::D - 16, max_scale / Q4SCALE);
    } else {
        sc.fill(0);
        put_f16(rest, layout::q2_k::D - 16, 0.0);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            let l = nearest_int(iscale * mins[j]);
            sc[j] |= (l << 4) as u8;
        }
        put_f16(rest, layout::q2_k::DMIN - 16, max_min / Q4SCALE);
    } else {
        put_f16(rest, layout::q2_k::DMIN - 16, 0.0);
    }
    let dd = get_f16(y, layout::q2_k::D);
    let dmin = get_f16(y, layout::q2_k::DMIN);
    for j in 0..16 {
        let d = dd * (y[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * (y[j] >> 4) as f32;
        for ii in 0..16 {
            let l = nearest_int((x[16 * j + ii] + dm) / d);
            levels[16 * j + ii] = l.clamp(0, 3) as u8;
        }
    }
    pack_2bit(&levels, &mut y[layout::q2_k::QS..][..64]);
}

pub(crate) fn q3_k(x: &[f32], y: &mut [u8]) {
    let mut levels = [0i8; 256];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..][..16], &mut levels[16 * j..]);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    let sc = &mut y[layout::q3_k::SCALES..][..12];
    sc.fill(0);
    let d_at = layout::q3_k::D;
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            // `int8_t l = nearest_int(..)` truncates first, then clamps and offsets.
            let mut l = nearest_int(iscale * scales[j]) as i8;
            l = (l.clamp(-32, 31) as i32 + 32) as i8;
            if j < 8 {
                sc[j] = (l & 0xF) as u8;
            } else {
                sc[j - 8] |= ((l & 0xF) << 4) as u8;
            }
            l >>= 4;
            sc[j % 4 + 8] |= (l << (2 * (j / 4))) as u8;
        }
        put_f16(y, d_at, 1.0 / iscale);
    } else {
        put_f16(y, d_at, 0.0);
    }
    let d_all = get_f16(y, d_at);
    let sc: [i8; 16] = crate::layout::q3_k_scales(&y[layout::q3_k::SCALES..][..12]);
    for j in 0..16 {
        let d = d_all * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            levels[16 * j + ii] = (l + 4) as i8;
        }
    }
    let hmask = &mut y[..32];
    hmask.fill(0);
    let mut m = 0;
    let mut hm = 1u8;
    let mut low = [0u8; 256];
    for j in 0..256 {
        let mut l = levels[j];
        if l > 3 {
            hmask[m] |= hm;
            l -= 4;
        }
        low[j] = l as u8;
        m += 1;
        if m == 32 {
            m = 0;
            hm <<= 1;
        }
    }
    pack_2bit(&low, &mut y[layout::q3_k::QS..][..64]);
}

/// The 32-element sub-block searches of Q4_K and Q5_K (`nmax` 15 or 31) and the packing of
/// their 6-bit scales and mins; returns the levels, requantized against the stored scales.
fn k4_quants(x: &[f32], y: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; 256] {
    let mut levels = [0u8; 256];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..][..32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        let (scale, min) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut levels[32 * j..],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut y[layout::q4_k::SCALES..][..12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(y, 0, max_scale / 63.0);
    put_f16(y, layout::q4_k::DMIN, max_min / 63.0);
    let (dd, dmin) = (get_f16(y, 0), get_f16(y, layout::q4_k::DMIN));
    for j in 0..8 {
        let (sc, m) = k4_scale_min(&y[layout::q4_k::SCALES..], j);
        let d = dd * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / d);
            levels[32 * j + ii] = l.clamp(0, nmax) as u8;
        }
    }
    levels
}

pub(crate) fn q4_k(x: &[f32], y: &mut [u8]) {
    let levels = k4_quants(x, y, 15, -1.0, 20);
    let qs = &mut y[layout::q4_k::QS..][..128];
    for c in 0..4 {
        for l in 0..32 {
            qs[32 * c + l] = levels[64 * c + l] | (levels[64 * c + l + 32] << 4);
        }
    }
}

pub(crate) fn q5_k(x: &[f32], y: &mut [u8]) {
    let levels = k4_quants(x, y, 31, -0.5, 15);
    let (head, qs) = y.split_at_mut(layout::q5_k::QS);
    let qh = &mut head[layout::q5_k::QH..][..32];
    qh.fill(0);
    let (mut m1, mut m2) = (1u8, 2u8);
    for c in 0..4 {
        for j in 0..32 {
            let mut l1 = levels[64 * c + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = levels[64 * c + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            qs[32 * c + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

pub(crate) fn q6_k(x: &[f32], y: &mut [u8]) {
    let mut levels = [0i8; 256];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(32, &x[16 * ib..][..16], &mut levels[16 * ib..]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(y, layout::q6_k::D, 1.0 / iscale);
    for ib in 0..16 {
        y[layout::q6_k::SCALES + ib] = nearest_int(iscale * scales[ib]).min(127) as u8;
    }
    let dd = get_f16(y, layout::q6_k::D);
    for j in 0..16 {
        let d = dd * y[layout::q6_k::SCALES + j] as i8 as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            levels[16 * j + ii] = (l + 32) as i8;
        }
    }
    let (ql, rest) = y.split_at_mut(layout::q6_k::QH);
    let qh = &mut rest[..64];
    for h in 0..2 {
        for l in 0..32 {
            let e = |s: usize| levels[128 * h + l + 32 * s] as u8;
            ql[64 * h + l] = (e(0) & 0xF) | ((e(2) & 0xF) << 4);
            ql[64 * h + l + 32] = (e(1) & 0xF) | ((e(3) & 0xF) << 4);
            qh[32 * h + l] =
                (e(0) >> 4) | ((e(1) >> 4) << 2) | ((e(2) >> 4) << 4) | ((e(3) >> 4) << 6);
        }
    }
}

pub(crate) fn q8_k(x: &[f32], y: &mut [u8]) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        y.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    let qs = &mut y[layout::q8_k::QS..][..256];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as u8;
    }
    let mut bsums = [0i16; 16];
    for (j, s) in bsums.iter_mut().enumerate() {
        *s = qs[16 * j..][..16]
            .iter()
            .map(|&q| q as i8 as i32)
            .sum::<i32>() as i16;
    }
    for (j, s) in bsums.iter().enumerate() {
        y[layout::q8_k::BSUMS + 2 * j..][..2].copy_from_slice(&s.to_le_bytes());
    }
    y[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}
