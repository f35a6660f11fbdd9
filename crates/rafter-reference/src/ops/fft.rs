//! A mixed-radix complex FFT that rounds like NumPy's (pocketfft's `cfftp`), so a float32
//! transform reproduces the rounding noise of ONNX's expected outputs (an inverse DFT's
//! exact zeros come out as ~1e-7 there, above the suite's absolute tolerance).
//!
//! The length is split into radix-8 factors, then radix 4, then one radix 2 (moved to the
//! front), then odd factors; each pass multiplies by twiddles computed in f64 and rounded
//! to the working type. Only radices 2, 3, 4 and 5 are implemented: other lengths return
//! `None` and the caller falls back to a plain DFT in f64.

use num_traits::Float;

/// A complex number as (re, im).
type Cx<T> = (T, T);

fn add<T: Float>(a: Cx<T>, b: Cx<T>) -> Cx<T> {
    (a.0 + b.0, a.1 + b.1)
}

fn sub<T: Float>(a: Cx<T>, b: Cx<T>) -> Cx<T> {
    (a.0 - b.0, a.1 - b.1)
}

/// `v * w` (backward) or `v * conj(w)` (forward), each product rounded separately.
fn twiddle_mul<T: Float>(fwd: bool, v: Cx<T>, w: Cx<T>) -> Cx<T> {
    if fwd {
        (v.0 * w.0 + v.1 * w.1, v.1 * w.0 - v.0 * w.1)
    } else {
        (v.0 * w.0 - v.1 * w.1, v.0 * w.1 + v.1 * w.0)
    }
}

fn t<T: Float>(x: f64) -> T {
    T::from(x).expect("representable constant")
}

/// The radices of a length, in pass order.
fn factors(n: usize) -> Vec<usize> {
    let mut f = Vec::new();
    let mut len = n;
    while len.is_multiple_of(8) {
        f.push(8);
        len /= 8;
    }
    while len.is_multiple_of(4) {
        f.push(4);
        len /= 4;
    }
    if len.is_multiple_of(2) {
        len /= 2;
        f.push(2);
        let last = f.len() - 1;
        f.swap(0, last);
    }
    let mut d = 3;
    while d * d <= len {
        while len.is_multiple_of(d) {
            f.push(d);
            len /= d;
        }
        d += 2;
    }
    if len > 1 {
        f.push(len);
    }
    f
}

/// `e^{2 pi i k / n}` rounded to `T`.
fn unit_root<T: Float>(k: usize, n: usize) -> Cx<T> {
    let a = 2.0 * std::f64::consts::PI * ((k % n) as f64) / n as f64;
    (t(a.cos()), t(a.sin()))
}

/// One pass of radix `ip` over `l1` blocks of `ido` elements, reading `cc`, writing `ch`.
#[allow(clippy::too_many_arguments)]
fn pass<T: Float>(
    fwd: bool,
    ip: usize,
    ido: usize,
    l1: usize,
    cc: &[Cx<T>],
    ch: &mut [Cx<T>],
    wa: &[Cx<T>],
) {
    let c_at = |a: usize, b: usize, c: usize| cc[a + ido * (b + ip * c)];
    let h_idx = |a: usize, b: usize, c: usize| a + ido * (b + l1 * c);
    let w_at = |x: usize, i: usize| wa[i - 1 + x * (ido - 1)];
    let sign = if fwd { -1.0 } else { 1.0 };
    for k in 0..l1 {
        for i in 0..ido {
            match ip {
                2 => {
                    let (a, b) = (c_at(i, 0, k), c_at(i, 1, k));
                    ch[h_idx(i, k, 0)] = add(a, b);
                    let d = sub(a, b);
                    ch[h_idx(i, k, 1)] = if i == 0 {
                        d
                    } else {
                        twiddle_mul(fwd, d, w_at(0, i))
                    };
                }
                3 => {
                    let (twr, twi) = (t::<T>(-0.5), t::<T>(sign * 0.866_025_403_784_438_6));
                    let t0 = c_at(i, 0, k);
                    let (t1, t2) = (
                        add(c_at(i, 1, k), c_at(i, 2, k)),
                        sub(c_at(i, 1, k), c_at(i, 2, k)),
                    );
                    ch[h_idx(i, k, 0)] = add(t0, t1);
                    let ca = (t0.0 + t1.0 * twr, t0.1 + t1.1 * twr);
                    let cb = (-(t2.1 * twi), t2.0 * twi);
                    let (u, v) = (add(ca, cb), sub(ca, cb));
                    if i == 0 {
                        ch[h_idx(i, k, 1)] = u;
                        ch[h_idx(i, k, 2)] = v;
                    } else {
                        ch[h_idx(i, k, 1)] = twiddle_mul(fwd, u, w_at(0, i));
                        ch[h_idx(i, k, 2)] = twiddle_mul(fwd, v, w_at(1, i));
                    }
                }
                4 => {
                    let (c0, c1, c2, c3) =
                        (c_at(i, 0, k), c_at(i, 1, k), c_at(i, 2, k), c_at(i, 3, k));
                    let (t2, t1) = (add(c0, c2), sub(c0, c2));
                    let (t3, mut t4) = (add(c1, c3), sub(c1, c3));
                    // Rotation by -90 degrees (forward) or +90 (backward).
                    t4 = if fwd { (t4.1, -t4.0) } else { (-t4.1, t4.0) };
                    if i == 0 {
                        ch[h_idx(i, k, 0)] = add(t2, t3);
                        ch[h_idx(i, k, 2)] = sub(t2, t3);
                        ch[h_idx(i, k, 1)] = add(t1, t4);
                        ch[h_idx(i, k, 3)] = sub(t1, t4);
                    } else {
                        ch[h_idx(i, k, 0)] = add(t2, t3);
                        ch[h_idx(i, k, 1)] = twiddle_mul(fwd, add(t1, t4), w_at(0, i));
                        ch[h_idx(i, k, 2)] = twiddle_mul(fwd, sub(t2, t3), w_at(1, i));
                        ch[h_idx(i, k, 3)] = twiddle_mul(fwd, sub(t1, t4), w_at(2, i));
                    }
                }
                5 => {
                    let tw1r = t::<T>(0.309_016_994_374_947_4);
                    let tw1i = t::<T>(sign * 0.951_056_516_295_153_5);
                    let tw2r = t::<T>(-0.809_016_994_374_947_4);
                    let tw2i = t::<T>(sign * 0.587_785_252_292_473_1);
                    let t0 = c_at(i, 0, k);
                    let (t1, t4) = (
                        add(c_at(i, 1, k), c_at(i, 4, k)),
                        sub(c_at(i, 1, k), c_at(i, 4, k)),
                    );
                    let (t2, t3) = (
                        add(c_at(i, 2, k), c_at(i, 3, k)),
                        sub(c_at(i, 2, k), c_at(i, 3, k)),
                    );
                    ch[h_idx(i, k, 0)] = (t0.0 + t1.0 + t2.0, t0.1 + t1.1 + t2.1);
                    // Outputs (u1, u2) from cosines (ar, br) and signed sines (ai, bi).
                    let mut step = |u1: usize, u2: usize, ar: T, br: T, ai: T, bi: T| {
                        let ca = (t0.0 + ar * t1.0 + br * t2.0, t0.1 + ar * t1.1 + br * t2.1);
                        let cb = (-(ai * t4.1 + bi * t3.1), ai * t4.0 + bi * t3.0);
                        let (u, v) = (add(ca, cb), sub(ca, cb));
                        if i == 0 {
                            ch[h_idx(i, k, u1)] = u;
                            ch[h_idx(i, k, u2)] = v;
                        } else {
                            ch[h_idx(i, k, u1)] = twiddle_mul(fwd, u, w_at(u1 - 1, i));
                            ch[h_idx(i, k, u2)] = twiddle_mul(fwd, v, w_at(u2 - 1, i));
                        }
                    };
                    step(1, 4, tw1r, tw2r, tw1i, tw2i);
                    step(2, 3, tw2r, tw1r, tw2i, -tw1i);
                }
                _ => unreachable!("radix {ip} is filtered out by the plan"),
            }
        }
    }
}

/// The unnormalised DFT of `data` (forward: `e^{-2 pi i k t / n}`), every output then
/// multiplied by `fct` unless it is 1. `None` when the length has a factor other than
/// 2, 3, 4 or 5.
pub(crate) fn cfft<T: Float>(data: &[Cx<T>], fwd: bool, fct: T) -> Option<Vec<Cx<T>>> {
    let n = data.len();
    if n == 0 {
        return Some(Vec::new());
    }
    let f = factors(n);
    if f.iter().any(|&r| !matches!(r, 2..=5)) {
        return None;
    }
    let mut p1 = data.to_vec();
    let mut p2 = vec![(T::zero(), T::zero()); n];
    let mut l1 = 1;
    for &ip in &f {
        let ido = n / (l1 * ip);
        let mut wa = Vec::with_capacity((ip - 1) * ido.saturating_sub(1));
        for j in 1..ip {
            for i in 1..ido {
                wa.push(unit_root::<T>(j * l1 * i, n));
            }
        }
        pass(fwd, ip, ido, l1, &p1, &mut p2, &wa);
        std::mem::swap(&mut p1, &mut p2);
        l1 *= ip;
    }
    if fct != T::one() {
        for v in &mut p1 {
            *v = (v.0 * fct, v.1 * fct);
        }
    }
    Some(p1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_follow_pocketfft_order() {
        assert_eq!(factors(10), [2, 5]);
        assert_eq!(factors(16), [2, 8]);
        assert_eq!(factors(12), [4, 3]);
        assert_eq!(factors(7), [7]);
    }

    #[test]
    fn matches_the_definition() {
        // Lengths 2..=60 whose radices are implemented, against an f64 DFT.
        for n in 1..=60usize {
            let x: Vec<(f64, f64)> = (0..n)
                .map(|i| (i as f64 * 0.7 - 3.0, (i * i % 7) as f64))
                .collect();
            for fwd in [true, false] {
                let Some(y) = cfft(&x, fwd, 1.0) else {
                    continue;
                };
                let s = if fwd { -1.0 } else { 1.0 };
                for (k, &(yr, yi)) in y.iter().enumerate() {
                    let (mut re, mut im) = (0.0, 0.0);
                    for (j, &(xr, xi)) in x.iter().enumerate() {
                        let a = s * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                        re += xr * a.cos() - xi * a.sin();
                        im += xr * a.sin() + xi * a.cos();
                    }
                    assert!(
                        (yr - re).abs() < 1e-9 && (yi - im).abs() < 1e-9,
                        "n {n} k {k}"
                    );
                }
            }
        }
    }

    #[test]
    fn float32_inverse_keeps_numpys_rounding() {
        // numpy.fft.ifft(np.arange(10, dtype=np.complex64))[5] is -0.5 - 2.3841858e-08j,
        // not an exact zero.
        let x: Vec<(f32, f32)> = (0..10).map(|i| (i as f32, 0.0)).collect();
        let y = cfft(&x, false, 1.0f32 / 10.0).unwrap();
        assert_eq!(y[5].0, -0.5);
        assert_eq!(y[5].1, -2.384_185_8e-8, "{:?}", y[5]);
    }
}
