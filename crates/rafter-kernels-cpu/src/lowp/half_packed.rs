//! B packed as f16 or bf16 panels, and their byte format.
//!
//! Byte layout (little-endian), version 1:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `RFPH` |
//! | 4 | 4 | version, `1` |
//! | 8 | 4 | panel width, 16 |
//! | 12 | 4 | element type, `1` = f16 (IEEE binary16), `2` = bf16 |
//! | 16 | 8 | K (rows) |
//! | 24 | 8 | N (columns) |
//! | 32 | `2 * ceil(N/16) * K * 16` | panels: panel `q` holds columns `16q..16q+16` as a `K x 16` row-major block of 16-bit values, zero-padded past N |
//!
//! The layout is [`crate::PackedB`]'s with 2-byte elements, so one k step of a panel is a
//! 32-byte load, and a `KC` block of a panel is contiguous whatever `KC` is.

use thiserror::Error;

use crate::kernel::PANEL;
use crate::{GemmError, MatRef};

/// Size of the header that precedes the panels, in bytes.
pub const PACKED_HALF_B_HEADER_BYTES: usize = 32;
/// The first four bytes of a packed half-precision B.
pub const PACKED_HALF_B_MAGIC: [u8; 4] = *b"RFPH";

const VERSION: u32 = 1;
const HEADER_HALVES: usize = PACKED_HALF_B_HEADER_BYTES / 2;
/// 64 bytes in u16s: the panels start on a cache line, so a panel row never splits one.
const ALIGN_HALVES: usize = 32;

/// Which 16-bit float format the weights are stored in.
///
/// f16 keeps 10 mantissa bits but only a 5-bit exponent (magnitudes above 65504 become
/// infinite, below about 6e-8 zero); bf16 keeps f32's 8-bit exponent with 7 mantissa bits,
/// so it never overflows where f32 does not but is 8x coarser. Which one a model tolerates
/// is the model's business; both round to nearest, ties to even.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalfKind {
    /// IEEE 754 binary16.
    F16,
    /// bfloat16: the top 16 bits of an f32 (rounded, not truncated).
    Bf16,
}

impl HalfKind {
    fn code(self) -> u32 {
        match self {
            HalfKind::F16 => 1,
            HalfKind::Bf16 => 2,
        }
    }

    fn from_code(code: u32) -> Option<HalfKind> {
        match code {
            1 => Some(HalfKind::F16),
            2 => Some(HalfKind::Bf16),
            _ => None,
        }
    }

    /// `x` rounded to this format (to nearest, ties to even; NaN stays NaN), as its bits.
    pub fn from_f32(self, x: f32) -> u16 {
        match self {
            HalfKind::F16 => half::f16::from_f32(x).to_bits(),
            HalfKind::Bf16 => half::bf16::from_f32(x).to_bits(),
        }
    }

    /// The f32 value of `bits` in this format (exact: both formats are subsets of f32).
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            HalfKind::F16 => half::f16::from_bits(bits).to_f32(),
            HalfKind::Bf16 => half::bf16::from_bits(bits).to_f32(),
        }
    }
}

/// Bytes that are not a packed half B this build can use. Never a panic: the bytes come
/// from a file. (Each variant's message is its documentation.)
#[allow(missing_docs)]
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum HalfPackError {
    #[error(
        "packed half B: {len} bytes is shorter than the {PACKED_HALF_B_HEADER_BYTES}-byte header"
    )]
    TooShort { len: usize },
    #[error("packed half B: bad magic {found:02x?} (expected \"RFPH\")")]
    BadMagic { found: [u8; 4] },
    #[error("packed half B: unsupported version {0} (this build reads version 1)")]
    Version(u32),
    #[error("packed half B: panel width {0}, this build's kernels read 16")]
    PanelWidth(u32),
    #[error("packed half B: element type {0} is neither f16 (1) nor bf16 (2)")]
    Kind(u32),
    #[error("packed half B: {k}x{n} does not fit in memory")]
    Overflow { k: u64, n: u64 },
    #[error("packed half B: {k}x{n} needs {expected} bytes, got {actual}")]
    Length {
        k: u64,
        n: u64,
        expected: usize,
        actual: usize,
    },
    #[error("packed half B: panels at address {addr:#x} are not 2-byte aligned (copy with PackedHalfB::from_bytes)")]
    Misaligned { addr: usize },
}

/// Number of 16-bit panel elements of a `k x n` B.
pub(crate) fn panel_halves(k: usize, n: usize) -> Option<usize> {
    n.div_ceil(PANEL).checked_mul(PANEL)?.checked_mul(k)
}

/// B (`K x N`) rounded to f16 or bf16 and packed into 16-wide panels, owning its storage
/// (header included, so [`PackedHalfB::as_bytes`] is free). The panels are 64-byte aligned.
#[derive(Clone)]
pub struct PackedHalfB {
    /// Header then panels, starting at `start` (chosen so the panels are 64-byte aligned).
    v: Vec<u16>,
    start: usize,
    kind: HalfKind,
    k: usize,
    n: usize,
}

impl std::fmt::Debug for PackedHalfB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedHalfB")
            .field("kind", &self.kind)
            .field("k", &self.k)
            .field("n", &self.n)
            .finish()
    }
}

impl PackedHalfB {
    /// Rounds and packs a row-major `k x n` f32 B with leading dimension `ldb`.
    pub fn pack(
        kind: HalfKind,
        k: usize,
        n: usize,
        b: &[f32],
        ldb: usize,
    ) -> Result<PackedHalfB, GemmError> {
        Ok(PackedHalfB::pack_mat(
            kind,
            MatRef::row_major(b, k, n, ldb)?,
        ))
    }

    /// Rounds and packs any strided B, e.g. `w.t()` for a weight stored `N x K` (PyTorch
    /// `Linear`), folding the transpose into the packing.
    pub fn pack_mat(kind: HalfKind, b: MatRef<'_>) -> PackedHalfB {
        let (k, n) = (b.rows, b.cols);
        let halves = panel_halves(k, n).expect("a matrix in memory has a packed size that fits");
        let mut out = PackedHalfB::zeroed(kind, k, n, halves);
        let panels = out.panels_mut();
        for q in 0..n.div_ceil(PANEL) {
            let panel = &mut panels[q * k * PANEL..(q + 1) * k * PANEL];
            for (p, row) in panel.chunks_exact_mut(PANEL).enumerate() {
                for (jj, dst) in row.iter_mut().enumerate() {
                    let j = q * PANEL + jj;
                    if j < n {
                        *dst = kind.from_f32(b.data[p * b.rs + j * b.cs]);
                    }
                }
            }
        }
        out
    }

    fn zeroed(kind: HalfKind, k: usize, n: usize, halves: usize) -> PackedHalfB {
        let v = vec![0u16; HEADER_HALVES + halves + ALIGN_HALVES - 1];
        // A Vec<u16> is 2-byte aligned, so addresses are in whole u16s.
        let addr = v.as_ptr() as usize / 2;
        let start = (ALIGN_HALVES - (addr + HEADER_HALVES) % ALIGN_HALVES) % ALIGN_HALVES;
        let mut out = PackedHalfB {
            v,
            start,
            kind,
            k,
            n,
        };
        let header = header_bytes(kind, k, n);
        for (dst, pair) in out.v[start..start + HEADER_HALVES]
            .iter_mut()
            .zip(header.chunks_exact(2))
        {
            *dst = u16::from_le_bytes([pair[0], pair[1]]);
        }
        out
    }

    fn all(&self) -> &[u16] {
        let halves = panel_halves(self.k, self.n).unwrap_or(0);
        &self.v[self.start..self.start + HEADER_HALVES + halves]
    }

    fn panels_mut(&mut self) -> &mut [u16] {
        let halves = panel_halves(self.k, self.n).unwrap_or(0);
        let s = self.start + HEADER_HALVES;
        &mut self.v[s..s + halves]
    }

    /// The serialised form: header then panels, ready to write into an artifact.
    pub fn as_bytes(&self) -> &[u8] {
        let all = self.all();
        // SAFETY: reinterpreting initialised u16s as bytes: u8 has no alignment or validity
        // requirement, and the length is exactly the u16 slice's bytes. The crate is
        // little-endian only (a compile error elsewhere), so these are the LE bytes.
        unsafe { std::slice::from_raw_parts(all.as_ptr().cast::<u8>(), std::mem::size_of_val(all)) }
    }

    /// Parses and validates bytes from [`PackedHalfB::as_bytes`], copying them into aligned
    /// storage. Use [`PackedHalfBRef::from_bytes`] to use them in place.
    pub fn from_bytes(bytes: &[u8]) -> Result<PackedHalfB, HalfPackError> {
        let (kind, k, n, halves) = parse_header(bytes)?;
        let mut out = PackedHalfB::zeroed(kind, k, n, halves);
        let payload = &bytes[PACKED_HALF_B_HEADER_BYTES..];
        for (dst, src) in out.panels_mut().iter_mut().zip(payload.chunks_exact(2)) {
            *dst = u16::from_le_bytes([src[0], src[1]]);
        }
        Ok(out)
    }

    /// A borrowed view, what [`crate::gemm_half`] takes.
    pub fn view(&self) -> PackedHalfBRef<'_> {
        PackedHalfBRef {
            kind: self.kind,
            k: self.k,
            n: self.n,
            data: &self.all()[HEADER_HALVES..],
        }
    }

    /// The element format.
    pub fn kind(&self) -> HalfKind {
        self.kind
    }

    /// Rows (the GEMM's K).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns (the GEMM's N).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The panels alone (bits of the 16-bit values), without the header: a row-major
    /// `[ceil(n/16), k, 16]` tensor, as [`PackedHalfBRef::from_panels`] takes it.
    pub fn panels(&self) -> &[u16] {
        &self.all()[HEADER_HALVES..]
    }
}

/// A packed half B borrowed from elsewhere: a [`PackedHalfB`], or validated bytes in place
/// (e.g. a memory-mapped artifact).
#[derive(Clone, Copy, Debug)]
pub struct PackedHalfBRef<'a> {
    kind: HalfKind,
    k: usize,
    n: usize,
    /// `ceil(n/16) * k * 16` panel elements.
    data: &'a [u16],
}

impl<'a> PackedHalfBRef<'a> {
    /// Validates bytes from [`PackedHalfB::as_bytes`] and uses them without copying. The
    /// bytes must be 2-byte aligned (64-byte alignment of the panels, i.e. of `bytes` + 32,
    /// is faster).
    pub fn from_bytes(bytes: &'a [u8]) -> Result<PackedHalfBRef<'a>, HalfPackError> {
        let (kind, k, n, halves) = parse_header(bytes)?;
        let payload = &bytes[PACKED_HALF_B_HEADER_BYTES..];
        if !(payload.as_ptr() as usize).is_multiple_of(std::mem::align_of::<u16>()) {
            return Err(HalfPackError::Misaligned {
                addr: payload.as_ptr() as usize,
            });
        }
        // SAFETY: the pointer is 2-byte aligned (checked above), `payload` holds exactly
        // `halves * 2` bytes (checked by parse_header), every bit pattern is a valid u16,
        // and the slice borrows `bytes` for 'a, so it is neither freed nor mutated meanwhile.
        let data = unsafe { std::slice::from_raw_parts(payload.as_ptr().cast::<u16>(), halves) };
        Ok(PackedHalfBRef { kind, k, n, data })
    }

    /// Uses headerless panels in place: `ceil(n/16) * k * 16` 16-bit values laid out as a
    /// row-major `[ceil(n/16), k, 16]` tensor (see the module docs). Padding columns past
    /// `n` may hold anything: the kernels never store the results they feed.
    pub fn from_panels(
        kind: HalfKind,
        k: usize,
        n: usize,
        panels: &'a [u16],
    ) -> Result<PackedHalfBRef<'a>, HalfPackError> {
        let halves = panel_halves(k, n).ok_or(HalfPackError::Overflow {
            k: k as u64,
            n: n as u64,
        })?;
        if panels.len() != halves {
            return Err(HalfPackError::Length {
                k: k as u64,
                n: n as u64,
                expected: halves * 2,
                actual: panels.len() * 2,
            });
        }
        Ok(PackedHalfBRef {
            kind,
            k,
            n,
            data: panels,
        })
    }

    /// The element format.
    pub fn kind(&self) -> HalfKind {
        self.kind
    }

    /// Rows (the GEMM's K).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns (the GEMM's N).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The panels (bits), laid out as the module docs say.
    pub fn panels(&self) -> &'a [u16] {
        self.data
    }
}

fn header_bytes(kind: HalfKind, k: usize, n: usize) -> [u8; PACKED_HALF_B_HEADER_BYTES] {
    let mut h = [0u8; PACKED_HALF_B_HEADER_BYTES];
    h[0..4].copy_from_slice(&PACKED_HALF_B_MAGIC);
    h[4..8].copy_from_slice(&VERSION.to_le_bytes());
    h[8..12].copy_from_slice(&(PANEL as u32).to_le_bytes());
    h[12..16].copy_from_slice(&kind.code().to_le_bytes());
    h[16..24].copy_from_slice(&(k as u64).to_le_bytes());
    h[24..32].copy_from_slice(&(n as u64).to_le_bytes());
    h
}

/// Checks a header and the total length; returns the kind, K, N and the panel elements.
fn parse_header(bytes: &[u8]) -> Result<(HalfKind, usize, usize, usize), HalfPackError> {
    if bytes.len() < PACKED_HALF_B_HEADER_BYTES {
        return Err(HalfPackError::TooShort { len: bytes.len() });
    }
    let u32_at =
        |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let u64_at = |i: usize| u32_at(i) as u64 | (u32_at(i + 4) as u64) << 32;
    let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
    if magic != PACKED_HALF_B_MAGIC {
        return Err(HalfPackError::BadMagic { found: magic });
    }
    if u32_at(4) != VERSION {
        return Err(HalfPackError::Version(u32_at(4)));
    }
    if u32_at(8) as usize != PANEL {
        return Err(HalfPackError::PanelWidth(u32_at(8)));
    }
    let kind = HalfKind::from_code(u32_at(12)).ok_or(HalfPackError::Kind(u32_at(12)))?;
    let (k64, n64) = (u64_at(16), u64_at(24));
    let overflow = HalfPackError::Overflow { k: k64, n: n64 };
    let k = usize::try_from(k64).map_err(|_| overflow.clone())?;
    let n = usize::try_from(n64).map_err(|_| overflow.clone())?;
    let halves = panel_halves(k, n).ok_or(overflow.clone())?;
    let expected = halves
        .checked_mul(2)
        .and_then(|b| b.checked_add(PACKED_HALF_B_HEADER_BYTES))
        .ok_or(overflow)?;
    if bytes.len() != expected {
        return Err(HalfPackError::Length {
            k: k64,
            n: n64,
            expected,
            actual: bytes.len(),
        });
    }
    Ok((kind, k, n, halves))
}
