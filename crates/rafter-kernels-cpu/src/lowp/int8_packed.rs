//! B quantized to int8 per output column, packed for `vpdpbusd`, and its byte format.
//!
//! Quantization (symmetric, per column `n`): `scale[n] = max_k |B[k][n]| / 127`, and
//! `q[k][n] = round_half_even(B[k][n] / scale[n])` clamped to `[-127, 127]`; a column of
//! zeros gets scale 0 and all-zero `q` (no division). -128 is never produced, and bytes
//! holding it are rejected: the range is symmetric so that `-q` is always representable.
//!
//! Byte layout (little-endian), version 1, with `Np = 16 * ceil(N/16)` and
//! `Kp = 4 * ceil(K/4)`:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `RFQ8` |
//! | 4 | 4 | version, `1` |
//! | 8 | 4 | panel width, 16 |
//! | 12 | 4 | k group, 4 |
//! | 16 | 8 | K (rows) |
//! | 24 | 8 | N (columns) |
//! | 32 | `4 Np` | scales, f32, zero past N |
//! | `32 + 4 Np` | `4 Np` | column sums `sum_k q[k][n]`, i32, zero past N |
//! | `32 + 8 Np` | `Np Kp` | panels, i8: panel `w` (columns `16w..16w+16`) is a `[Kp/4][16][4]` block: for each group of 4 consecutive k, the 4 values of column 0, then of column 1, ... (zero-padded past K and N) |
//!
//! One k group of a panel is 64 bytes, one zmm: lane `j` holds column `16w + j`'s 4
//! weights, exactly the `i8` operand of `vpdpbusd` against 4 activations broadcast to every
//! lane. The column sums feed the zero-point correction of the u8 activations (see
//! [`crate::gemm_i8`]); storing them saves a pass over the weights per call.

use thiserror::Error;

use crate::kernel::PANEL;
use crate::{GemmError, MatRef};

/// Size of the header that precedes the scales, in bytes.
pub const PACKED_I8_B_HEADER_BYTES: usize = 32;
/// The first four bytes of a packed int8 B.
pub const PACKED_I8_B_MAGIC: [u8; 4] = *b"RFQ8";
/// The deepest K an int8 B may have: the kernels accumulate `u8 x i8` products (each at
/// most `255 * 127` in magnitude) in i32, which holds `65536 * 255 * 127` but not much
/// more. Deeper products must be split along K by the caller.
pub const I8_MAX_K: usize = 65536;

const VERSION: u32 = 1;
/// Consecutive k values per column in one 32-bit lane (`vpdpbusd`'s group).
pub(crate) const KGROUP: usize = 4;
/// Bytes of one k group of one panel: 16 columns x 4 k.
pub(crate) const GROUP_BYTES: usize = PANEL * KGROUP;
const HEADER_WORDS: usize = PACKED_I8_B_HEADER_BYTES / 4;
/// 64 bytes in u32s: the panels start on a cache line, so a k group never splits one.
const ALIGN_WORDS: usize = 16;

/// Bytes that are not a packed int8 B this build can use, or an f32 B that cannot be
/// quantized. Never a panic: the bytes come from a file. (Each variant's message is its
/// documentation.)
#[allow(missing_docs)]
#[derive(Debug, Error, PartialEq)]
pub enum I8PackError {
    #[error("int8 B: {0}")]
    Matrix(#[from] GemmError),
    #[error("int8 B: B[{row}][{col}] is not finite (NaN or infinite weights cannot be quantized)")]
    NonFinite { row: usize, col: usize },
    #[error("int8 B: K = {k} is deeper than {I8_MAX_K}, past which i32 accumulators can overflow")]
    TooDeep { k: u64 },
    #[error(
        "packed int8 B: {len} bytes is shorter than the {PACKED_I8_B_HEADER_BYTES}-byte header"
    )]
    TooShort { len: usize },
    #[error("packed int8 B: bad magic {found:02x?} (expected \"RFQ8\")")]
    BadMagic { found: [u8; 4] },
    #[error("packed int8 B: unsupported version {0} (this build reads version 1)")]
    Version(u32),
    #[error("packed int8 B: panel width {0}, this build's kernels read 16")]
    PanelWidth(u32),
    #[error("packed int8 B: k group {0}, this build's kernels read 4")]
    KGroup(u32),
    #[error("packed int8 B: {k}x{n} does not fit in memory")]
    Overflow { k: u64, n: u64 },
    #[error("packed int8 B: {k}x{n} needs {expected} bytes {what}, got {actual}")]
    Length {
        what: &'static str,
        k: u64,
        n: u64,
        expected: usize,
        actual: usize,
    },
    #[error("packed int8 B: scales at address {addr:#x} are not 4-byte aligned (copy with PackedI8B::from_bytes)")]
    Misaligned { addr: usize },
    #[error("packed int8 B: scale of column {col} is {value}, not a finite value >= 0")]
    Scale { col: usize, value: f32 },
    #[error(
        "packed int8 B: weight ({row}, {col}) is -128, outside the symmetric range [-127, 127]"
    )]
    Weight { row: usize, col: usize },
    #[error("packed int8 B: column {col} sum is stored as {stored}, the weights sum to {actual}")]
    ColumnSum {
        col: usize,
        stored: i32,
        actual: i64,
    },
}

/// Sizes of a `k x n` int8 B: (padded columns `Np`, k groups, panel bytes), or `None` if
/// they overflow.
pub(crate) fn sizes(k: usize, n: usize) -> Option<(usize, usize, usize)> {
    let np = n.div_ceil(PANEL).checked_mul(PANEL)?;
    let kg = k.div_ceil(KGROUP);
    let bytes = np.checked_mul(kg)?.checked_mul(KGROUP)?;
    Some((np, kg, bytes))
}

/// Index of weight `(p, j)` in the panels of a B with `kg` k groups.
fn panel_index(kg: usize, p: usize, j: usize) -> usize {
    (j / PANEL) * kg * GROUP_BYTES + (p / KGROUP) * GROUP_BYTES + (j % PANEL) * KGROUP + p % KGROUP
}

/// The scale of a column whose largest magnitude is `max`: `max / 127`, or 0 (a column
/// treated as zeros) when that underflows, so `b / scale` never divides by zero.
pub(crate) fn scale_of(max: f32) -> f32 {
    let s = max / 127.0;
    if s > 0.0 {
        s
    } else {
        0.0
    }
}

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2^22`: adding and
/// subtracting 1.5 * 2^23 leaves no fraction bits, and the addition rounds as IEEE's
/// default mode does. Unlike `f32::round_ties_even` it needs no SSE4.1 `roundps` (or libm
/// call) on baseline x86-64, so the quantization loops vectorize.
#[inline]
pub(crate) fn round_even_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// `b / scale` quantized to `[-127, 127]` (0 when the scale is 0).
fn quantize(b: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    round_even_small(b / scale).clamp(-127.0, 127.0) as i8
}

/// B (`K x N`) quantized to int8 per column and packed for the int8 kernels, owning its
/// storage (header included, so [`PackedI8B::as_bytes`] is free). The panels are 64-byte
/// aligned.
#[derive(Clone)]
pub struct PackedI8B {
    /// Header, scales, sums then panels, starting at word `start` (chosen so the panels
    /// are 64-byte aligned).
    v: Vec<u32>,
    start: usize,
    k: usize,
    n: usize,
}

impl std::fmt::Debug for PackedI8B {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedI8B")
            .field("k", &self.k)
            .field("n", &self.n)
            .finish()
    }
}

impl PackedI8B {
    /// Quantizes and packs a row-major `k x n` f32 B with leading dimension `ldb`.
    pub fn pack(k: usize, n: usize, b: &[f32], ldb: usize) -> Result<PackedI8B, I8PackError> {
        PackedI8B::pack_mat(MatRef::row_major(b, k, n, ldb)?)
    }

    /// Quantizes and packs any strided B, e.g. `w.t()` for a weight stored `N x K`
    /// (PyTorch `Linear`), folding the transpose into the packing. Fails on a non-finite
    /// weight (it has no int8 value) and on K past [`I8_MAX_K`].
    pub fn pack_mat(b: MatRef<'_>) -> Result<PackedI8B, I8PackError> {
        let (k, n) = (b.rows, b.cols);
        if k > I8_MAX_K {
            return Err(I8PackError::TooDeep { k: k as u64 });
        }
        let (np, kg, bytes) = sizes(k, n).expect("a matrix in memory has a packed size that fits");
        let at = |p: usize, j: usize| b.data[p * b.rs + j * b.cs];
        let mut out = PackedI8B::zeroed(k, n, np, bytes);
        for j in 0..n {
            let mut max = 0.0f32;
            for p in 0..k {
                let x = at(p, j);
                if !x.is_finite() {
                    return Err(I8PackError::NonFinite { row: p, col: j });
                }
                max = max.max(x.abs());
            }
            let scale = scale_of(max);
            let mut sum = 0i32;
            let panels = out.panels_mut();
            for p in 0..k {
                let q = quantize(at(p, j), scale);
                sum += q as i32;
                panels[panel_index(kg, p, j)] = q as u8;
            }
            let s = out.start + HEADER_WORDS;
            out.v[s + j] = scale.to_bits();
            out.v[s + np + j] = sum as u32;
        }
        Ok(out)
    }

    fn zeroed(k: usize, n: usize, np: usize, bytes: usize) -> PackedI8B {
        let words = HEADER_WORDS + 2 * np + bytes.div_ceil(4);
        let v = vec![0u32; words + ALIGN_WORDS - 1];
        // A Vec<u32> is 4-byte aligned, so addresses are in whole u32s.
        let addr = v.as_ptr() as usize / 4;
        let panels_at = HEADER_WORDS + 2 * np;
        let start = (ALIGN_WORDS - (addr + panels_at) % ALIGN_WORDS) % ALIGN_WORDS;
        let mut out = PackedI8B { v, start, k, n };
        let header = header_bytes(k, n);
        for (dst, w) in out.v[start..start + HEADER_WORDS]
            .iter_mut()
            .zip(header.chunks_exact(4))
        {
            *dst = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
        out
    }

    fn np_kg_bytes(&self) -> (usize, usize, usize) {
        sizes(self.k, self.n).unwrap_or((0, 0, 0))
    }

    fn all(&self) -> &[u8] {
        let (np, _, bytes) = self.np_kg_bytes();
        let words = &self.v[self.start..];
        // SAFETY: reinterpreting initialised u32s as bytes: u8 has no alignment or
        // validity requirement, and the length is the u32 slice's bytes. The crate is
        // little-endian only (a compile error elsewhere), so these are the LE bytes.
        let b = unsafe {
            std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words))
        };
        &b[..PACKED_I8_B_HEADER_BYTES + 8 * np + bytes]
    }

    fn panels_mut(&mut self) -> &mut [u8] {
        let (np, _, bytes) = self.np_kg_bytes();
        let words = &mut self.v[self.start + HEADER_WORDS + 2 * np..];
        // SAFETY: as in `all`, and the borrow is unique for the returned lifetime.
        let b = unsafe {
            std::slice::from_raw_parts_mut(
                words.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(words),
            )
        };
        &mut b[..bytes]
    }

    /// The serialised form: header, scales, sums then panels, ready to write into an
    /// artifact.
    pub fn as_bytes(&self) -> &[u8] {
        self.all()
    }

    /// Parses and validates bytes from [`PackedI8B::as_bytes`], copying them into aligned
    /// storage. Use [`PackedI8BRef::from_bytes`] to use them in place.
    pub fn from_bytes(bytes: &[u8]) -> Result<PackedI8B, I8PackError> {
        let (k, n) = parse_header(bytes)?;
        let (np, _, pbytes) = sizes(k, n).ok_or(I8PackError::Overflow {
            k: k as u64,
            n: n as u64,
        })?;
        let mut out = PackedI8B::zeroed(k, n, np, pbytes);
        let s = out.start + HEADER_WORDS;
        let words = &bytes[PACKED_I8_B_HEADER_BYTES..PACKED_I8_B_HEADER_BYTES + 8 * np];
        for (dst, w) in out.v[s..s + 2 * np].iter_mut().zip(words.chunks_exact(4)) {
            *dst = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
        out.panels_mut()
            .copy_from_slice(&bytes[PACKED_I8_B_HEADER_BYTES + 8 * np..]);
        let (scales, sums, panels) = out.parts();
        PackedI8BRef::from_parts(k, n, scales, sums, panels)?;
        Ok(out)
    }

    /// Scales, sums and panels, as slices of the storage.
    fn parts(&self) -> (&[f32], &[i32], &[i8]) {
        let (np, _, _) = self.np_kg_bytes();
        let s = self.start + HEADER_WORDS;
        let scale_words = &self.v[s..s + self.n];
        let sum_words = &self.v[s + np..s + np + self.n];
        // SAFETY: u32 -> f32 and u32 -> i32 have the same size and alignment, and every
        // bit pattern is a valid value of both.
        let (scales, sums) = unsafe {
            (
                std::slice::from_raw_parts(scale_words.as_ptr().cast::<f32>(), self.n),
                std::slice::from_raw_parts(sum_words.as_ptr().cast::<i32>(), self.n),
            )
        };
        let panels = &self.all()[PACKED_I8_B_HEADER_BYTES + 8 * np..];
        // SAFETY: u8 -> i8, same size and alignment, every bit pattern valid.
        let panels =
            unsafe { std::slice::from_raw_parts(panels.as_ptr().cast::<i8>(), panels.len()) };
        (scales, sums, panels)
    }

    /// A borrowed view, what [`crate::gemm_i8`] takes. Free: a `PackedI8B` was validated
    /// (or built valid) once, when it was made.
    pub fn view(&self) -> PackedI8BRef<'_> {
        let (scales, sums, panels) = self.parts();
        PackedI8BRef {
            k: self.k,
            n: self.n,
            scales,
            sums,
            panels,
        }
    }

    /// Rows (the GEMM's K).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns (the GEMM's N).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Per-column scales (length N): column `n` of B is about `scale[n] * q[:, n]`.
    pub fn scales(&self) -> &[f32] {
        self.view().scales
    }

    /// Per-column sums of the quantized weights (length N).
    pub fn col_sums(&self) -> &[i32] {
        self.view().sums
    }

    /// The panels alone, laid out as the module docs say: `ceil(N/16) * 4 ceil(K/4) * 16`
    /// bytes, as [`PackedI8BRef::from_parts`] takes them.
    pub fn panels(&self) -> &[i8] {
        self.view().panels
    }
}

/// A packed int8 B borrowed from elsewhere: a [`PackedI8B`], or validated bytes in place
/// (e.g. a memory-mapped artifact).
#[derive(Clone, Copy, Debug)]
pub struct PackedI8BRef<'a> {
    k: usize,
    n: usize,
    /// N scales.
    scales: &'a [f32],
    /// N column sums.
    sums: &'a [i32],
    /// `ceil(n/16) * ceil(k/4) * 64` bytes.
    panels: &'a [i8],
}

impl<'a> PackedI8BRef<'a> {
    /// Validates bytes from [`PackedI8B::as_bytes`] and uses them without copying. The
    /// bytes must be 4-byte aligned (the scales and sums are read in place); 64-byte
    /// alignment of the panels, i.e. of `bytes + 32 + 8 Np`, is faster.
    ///
    /// Validation reads every weight once (to check the column sums and the range), so a
    /// corrupt file is an error here rather than wrong results later.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<PackedI8BRef<'a>, I8PackError> {
        let (k, n) = parse_header(bytes)?;
        let (np, _, _) = sizes(k, n).ok_or(I8PackError::Overflow {
            k: k as u64,
            n: n as u64,
        })?;
        let body = &bytes[PACKED_I8_B_HEADER_BYTES..];
        if !(body.as_ptr() as usize).is_multiple_of(4) {
            return Err(I8PackError::Misaligned {
                addr: body.as_ptr() as usize,
            });
        }
        // SAFETY: the pointer is 4-byte aligned (checked above); `body` holds at least
        // `8 np` bytes (checked by parse_header), of which these read the first `4 n` and
        // the `4 n` from `4 np` (n <= np); every bit pattern is a valid f32 and i32; the
        // slices borrow `bytes` for 'a, so they are neither freed nor mutated meanwhile.
        let (scales, sums, panels) = unsafe {
            (
                std::slice::from_raw_parts(body.as_ptr().cast::<f32>(), n),
                std::slice::from_raw_parts(body.as_ptr().add(4 * np).cast::<i32>(), n),
                std::slice::from_raw_parts(
                    body.as_ptr().add(8 * np).cast::<i8>(),
                    body.len() - 8 * np,
                ),
            )
        };
        PackedI8BRef::from_parts(k, n, scales, sums, panels)
    }

    /// Uses headerless parts in place (e.g. three tensors of a compiled model): `n` scales,
    /// `n` column sums and the panels laid out as the module docs say. Checks the lengths,
    /// that scales are finite and >= 0, that no weight is -128 and that every column sum
    /// matches its weights. Padding (past K or N) may hold anything: the activations'
    /// padding is zero and padded columns are never stored.
    pub fn from_parts(
        k: usize,
        n: usize,
        scales: &'a [f32],
        sums: &'a [i32],
        panels: &'a [i8],
    ) -> Result<PackedI8BRef<'a>, I8PackError> {
        if k > I8_MAX_K {
            return Err(I8PackError::TooDeep { k: k as u64 });
        }
        let (_, kg, bytes) = sizes(k, n).ok_or(I8PackError::Overflow {
            k: k as u64,
            n: n as u64,
        })?;
        let length = |what, expected: usize, actual: usize| I8PackError::Length {
            what,
            k: k as u64,
            n: n as u64,
            expected,
            actual,
        };
        if scales.len() != n {
            return Err(length("of scales", 4 * n, 4 * scales.len()));
        }
        if sums.len() != n {
            return Err(length("of column sums", 4 * n, 4 * sums.len()));
        }
        if panels.len() != bytes {
            return Err(length("of panels", bytes, panels.len()));
        }
        for (col, &value) in scales.iter().enumerate() {
            if !(value.is_finite() && value >= 0.0) {
                return Err(I8PackError::Scale { col, value });
            }
        }
        for (col, &stored) in sums.iter().enumerate() {
            let mut actual = 0i64;
            for row in 0..k {
                let q = panels[panel_index(kg, row, col)];
                if q == i8::MIN {
                    return Err(I8PackError::Weight { row, col });
                }
                actual += q as i64;
            }
            if actual != stored as i64 {
                return Err(I8PackError::ColumnSum {
                    col,
                    stored,
                    actual,
                });
            }
        }
        Ok(PackedI8BRef {
            k,
            n,
            scales,
            sums,
            panels,
        })
    }

    /// Rows (the GEMM's K).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns (the GEMM's N).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Per-column scales (length N).
    pub fn scales(&self) -> &'a [f32] {
        self.scales
    }

    /// Per-column sums of the quantized weights (length N).
    pub fn col_sums(&self) -> &'a [i32] {
        self.sums
    }

    /// The panels, laid out as the module docs say.
    pub fn panels(&self) -> &'a [i8] {
        self.panels
    }
}

fn header_bytes(k: usize, n: usize) -> [u8; PACKED_I8_B_HEADER_BYTES] {
    let mut h = [0u8; PACKED_I8_B_HEADER_BYTES];
    h[0..4].copy_from_slice(&PACKED_I8_B_MAGIC);
    h[4..8].copy_from_slice(&VERSION.to_le_bytes());
    h[8..12].copy_from_slice(&(PANEL as u32).to_le_bytes());
    h[12..16].copy_from_slice(&(KGROUP as u32).to_le_bytes());
    h[16..24].copy_from_slice(&(k as u64).to_le_bytes());
    h[24..32].copy_from_slice(&(n as u64).to_le_bytes());
    h
}

/// Checks a header and the total length; returns K and N.
fn parse_header(bytes: &[u8]) -> Result<(usize, usize), I8PackError> {
    if bytes.len() < PACKED_I8_B_HEADER_BYTES {
        return Err(I8PackError::TooShort { len: bytes.len() });
    }
    let u32_at =
        |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let u64_at = |i: usize| u32_at(i) as u64 | (u32_at(i + 4) as u64) << 32;
    let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
    if magic != PACKED_I8_B_MAGIC {
        return Err(I8PackError::BadMagic { found: magic });
    }
    if u32_at(4) != VERSION {
        return Err(I8PackError::Version(u32_at(4)));
    }
    if u32_at(8) as usize != PANEL {
        return Err(I8PackError::PanelWidth(u32_at(8)));
    }
    if u32_at(12) as usize != KGROUP {
        return Err(I8PackError::KGroup(u32_at(12)));
    }
    let (k64, n64) = (u64_at(16), u64_at(24));
    let overflow = || I8PackError::Overflow { k: k64, n: n64 };
    if k64 > I8_MAX_K as u64 {
        return Err(I8PackError::TooDeep { k: k64 });
    }
    let k = usize::try_from(k64).map_err(|_| overflow())?;
    let n = usize::try_from(n64).map_err(|_| overflow())?;
    let (np, _, pbytes) = sizes(k, n).ok_or_else(overflow)?;
    let expected = np
        .checked_mul(8)
        .and_then(|s| s.checked_add(pbytes))
        .and_then(|b| b.checked_add(PACKED_I8_B_HEADER_BYTES))
        .ok_or_else(overflow)?;
    if bytes.len() != expected {
        return Err(I8PackError::Length {
            what: "in all",
            k: k64,
            n: n64,
            expected,
            actual: bytes.len(),
        });
    }
    Ok((k, n))
}
