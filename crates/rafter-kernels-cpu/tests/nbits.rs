//! `nbits_matmul` (ONNX Runtime's MatMulNBits layout) against an f64 product of weights
//! dequantized here from the packing rules written out again (element 2i of a 4-bit block
//! in the low nibble of byte i; zero points packed the same way per row of blocks; absent
//! zero point 2^(bits-1)), on every path: the fused few-rows path (SIMD and portable) and
//! the dequantized-panel GEMM, with and without zero points and bias, blocks of 16..128,
//! K not a multiple of the block or of 32, 1 and 3 threads.

use rafter_kernels_cpu::{nbits_matmul, MatMut, MatRef, NBitsRef, ScopedThreads, Sequential};

/// A small deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() % 20001) as f32 / 10000.0 - 1.0
    }
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
    bits: usize,
    block: usize,
    zp: bool,
    bias: bool,
    /// ORT's accuracy_level 4.
    int8: bool,
}

fn run(c: &Case, threads: usize) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (c.m * 131 + c.k * 7 + c.block) as u64);
    let kb = c.k.div_ceil(c.block);
    let blob = c.block * c.bits / 8;
    let packed: Vec<u8> = (0..c.n * kb * blob).map(|_| rng.next() as u8).collect();
    let scales: Vec<f32> = (0..c.n * kb).map(|_| rng.f32() * 0.1).collect();
    let zp_row = (kb * c.bits).div_ceil(8);
    let zps: Vec<u8> = (0..c.n * zp_row).map(|_| rng.next() as u8).collect();
    let bias: Vec<f32> = (0..c.n).map(|_| rng.f32()).collect();
    let x: Vec<f32> = (0..c.m * c.k).map(|_| rng.f32()).collect();

    // At accuracy_level 4 ORT rounds each block of x to int8: q = round_even(x * 127 /
    // max|x|), standing for q * max|x| / 127 (checked against ORT 1.32 in
    // scripts/gen_contrib_fixtures.py's accuracy_level cases).
    let mut xr = x.clone();
    if c.int8 {
        for row in xr.chunks_mut(c.k) {
            for blk in row.chunks_mut(c.block) {
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                for v in blk.iter_mut() {
                    *v = (*v * (127.0 / amax)).round_ties_even() * (amax / 127.0);
                }
            }
        }
    }
    // The reference: W dequantized element by element, products in f64.
    let mask = (1u32 << c.bits) - 1;
    let elem = |bytes: &[u8], i: usize| -> u32 {
        let per = 8 / c.bits;
        (bytes[i / per] as u32 >> (c.bits * (i % per))) & mask
    };
    let mut expected = vec![0f64; c.m * c.n];
    for j in 0..c.n {
        for i in 0..c.k {
            let b = i / c.block;
            let q = elem(&packed[(j * kb + b) * blob..], i % c.block);
            let z = if c.zp {
                elem(&zps[j * zp_row..], b)
            } else {
                1 << (c.bits - 1)
            };
            let wv = (q as f64 - z as f64) * scales[j * kb + b] as f64;
            for r in 0..c.m {
                expected[r * c.n + j] += xr[r * c.k + i] as f64 * wv;
            }
        }
        if c.bias {
            for r in 0..c.m {
                expected[r * c.n + j] += bias[j] as f64;
            }
        }
    }

    let w = NBitsRef::new(
        &packed,
        &scales,
        c.zp.then_some(&zps[..]),
        c.n,
        c.k,
        c.bits,
        c.block,
    )
    .unwrap()
    .with_int8_activations(c.int8);
    let mut y = vec![f32::NAN; c.m * c.n];
    let xm = MatRef::row_major(&x, c.m, c.k, c.k).unwrap();
    let ym = MatMut::row_major(&mut y, c.m, c.n, c.n).unwrap();
    let b = c.bias.then_some(&bias[..]);
    if threads == 1 {
        nbits_matmul(xm, w, b, ym, &Sequential).unwrap();
    } else {
        nbits_matmul(xm, w, b, ym, &ScopedThreads::new(threads)).unwrap();
    }
    for (i, (&got, &want)) in y.iter().zip(&expected).enumerate() {
        // f32 accumulation over k terms of magnitude <= ~0.75.
        let tol = 1e-5 * (c.k as f64).sqrt() * 4.0 + 1e-5 * want.abs();
        assert!(
            (got as f64 - want).abs() <= tol,
            "m {} n {} k {} bits {} block {} zp {} bias {} int8 {}: y[{}, {}] = {got}, want {want}",
            c.m,
            c.n,
            c.k,
            c.bits,
            c.block,
            c.zp,
            c.bias,
            c.int8,
            i / c.n,
            i % c.n
        );
    }
}

#[test]
fn every_path_matches_the_dequantized_product() {
    for &m in &[1, 2, 3, 4, 5, 8, 9, 20] {
        for &(k, block) in &[
            (64, 32),
            (100, 32),
            (96, 16),
            (256, 64),
            (300, 128),
            (40, 16),
        ] {
            for &bits in &[4, 8] {
                for &zp in &[true, false] {
                    let c = Case {
                        m,
                        n: 37,
                        k,
                        bits,
                        block,
                        zp,
                        bias: m % 2 == 1,
                        int8: (m + k) % 3 == 0,
                    };
                    run(&c, 1);
                    if m == 1 || m == 20 {
                        run(&c, 3);
                    }
                }
            }
        }
    }
}

#[test]
fn more_columns_than_a_panel() {
    // 300 columns: the panel path takes three panels, the last partial.
    for m in [2, 33] {
        run(
            &Case {
                m,
                n: 300,
                k: 128,
                bits: 4,
                block: 32,
                zp: true,
                bias: true,
                int8: m == 33,
            },
            2,
        );
    }
}

#[test]
fn bad_sizes_are_errors_naming_the_operand() {
    let packed = vec![0u8; 4 * 2 * 16];
    let scales = vec![1f32; 4 * 2];
    let e = NBitsRef::new(&packed, &scales[..7], None, 4, 64, 4, 32).unwrap_err();
    assert!(e.to_string().contains("scales"), "{e}");
    let e = NBitsRef::new(&packed[..100], &scales, None, 4, 64, 4, 32).unwrap_err();
    assert!(e.to_string().contains("W"), "{e}");
    let e = NBitsRef::new(&packed, &scales, Some(&[0u8; 3]), 4, 64, 4, 32).unwrap_err();
    assert!(e.to_string().contains("zero points"), "{e}");
    let e = NBitsRef::new(&packed, &scales, None, 4, 64, 3, 32).unwrap_err();
    assert!(e.to_string().contains("3-bit"), "{e}");
    let e = NBitsRef::new(&packed, &scales, None, 4, 64, 4, 24).unwrap_err();
    assert!(e.to_string().contains("block"), "{e}");
    let w = NBitsRef::new(&packed, &scales, None, 4, 64, 4, 32).unwrap();
    let x = vec![0f32; 63];
    let mut y = vec![0f32; 4];
    let e = nbits_matmul(
        MatRef::row_major(&x, 1, 63, 63).unwrap(),
        w,
        None,
        MatMut::row_major(&mut y, 1, 4, 4).unwrap(),
        &Sequential,
    )
    .unwrap_err();
    assert!(e.to_string().contains("W"), "{e}");
}
