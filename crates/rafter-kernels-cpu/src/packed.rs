//! Weights packed ahead of time into the micro-kernels' B layout, and their byte format.
//!
//! Packing is a copy of all of B, which a per-call GEMM would redo on every inference; for
//! weights it is done once, by the compiler, and the result is stored in the artifact.
//!
//! Byte layout (little-endian), version 1:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `RFPB` |
//! | 4 | 4 | version, `1` |
//! | 8 | 4 | panel width, [`PACKED_B_NR`] (16) |
//! | 12 | 4 | element type, `0` = f32 |
//! | 16 | 8 | K (rows) |
//! | 24 | 8 | N (columns) |
//! | 32 | `4 * ceil(N/16) * K * 16` | panels: panel `q` holds columns `16q..16q+16` as a `K x 16` row-major block, zero-padded past N |
//!
//! The panel layout does not depend on the K blocking (a K block is a contiguous run of
//! rows inside each panel), so tuning KC never invalidates packed weights. There is no
//! checksum: the artifact format around this owns integrity.

use thiserror::Error;

use crate::buffer::Aligned;
use crate::kernel::PANEL;
use crate::pack::pack_b;
use crate::{GemmError, MatRef};

/// Size of the header that precedes the panels, in bytes.
pub const PACKED_B_HEADER_BYTES: usize = 32;
/// The first four bytes of a packed B.
pub const PACKED_B_MAGIC: [u8; 4] = *b"RFPB";
/// Width, in columns, of a packed B panel (the same for every kernel).
pub const PACKED_B_NR: usize = PANEL;

const VERSION: u32 = 1;
const DTYPE_F32: u32 = 0;
const HEADER_FLOATS: usize = PACKED_B_HEADER_BYTES / 4;

/// Bytes that are not a packed B this build can use. Never a panic: the bytes come from a
/// file. (Each variant's message is its documentation.)
#[allow(missing_docs)]
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PackError {
    #[error("packed B: {len} bytes is shorter than the {PACKED_B_HEADER_BYTES}-byte header")]
    TooShort { len: usize },
    #[error("packed B: bad magic {found:02x?} (expected \"RFPB\")")]
    BadMagic { found: [u8; 4] },
    #[error("packed B: unsupported version {0} (this build reads version 1)")]
    Version(u32),
    #[error("packed B: panel width {0}, this build's kernels read {PACKED_B_NR}")]
    PanelWidth(u32),
    #[error("packed B: element type {0} is not f32 (0)")]
    Dtype(u32),
    #[error("packed B: {k}x{n} does not fit in memory")]
    Overflow { k: u64, n: u64 },
    #[error("packed B: {k}x{n} needs {expected} bytes, got {actual}")]
    Length {
        k: u64,
        n: u64,
        expected: usize,
        actual: usize,
    },
    #[error("packed B: panels at address {addr:#x} are not 4-byte aligned (copy with PackedB::from_bytes)")]
    Misaligned { addr: usize },
}

/// B packed for the micro-kernels, owning its storage (header included, so
/// [`PackedB::as_bytes`] is free). The panels are 64-byte aligned.
#[derive(Clone)]
pub struct PackedB {
    buf: Aligned,
    k: usize,
    n: usize,
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedB")
            .field("k", &self.k)
            .field("n", &self.n)
            .finish()
    }
}

fn panel_floats(k: usize, n: usize) -> Option<usize> {
    n.div_ceil(PANEL).checked_mul(PANEL)?.checked_mul(k)
}

impl PackedB {
    /// Packs a row-major `k x n` B with leading dimension `ldb`.
    pub fn pack(k: usize, n: usize, b: &[f32], ldb: usize) -> Result<PackedB, GemmError> {
        Ok(PackedB::pack_mat(MatRef::row_major(b, k, n, ldb)?))
    }

    /// Packs any strided B, e.g. `w.t()` for a weight stored `N x K` (ONNX `Gemm` with
    /// `transB = 1`, PyTorch `Linear`), folding the transpose into the packing.
    pub fn pack_mat(b: MatRef<'_>) -> PackedB {
        let (k, n) = (b.rows, b.cols);
        let floats = panel_floats(k, n).expect("a matrix in memory has a packed size that fits");
        let mut buf = Aligned::new(HEADER_FLOATS, floats);
        let all = buf.as_mut_slice();
        write_header(&mut all[..HEADER_FLOATS], k, n);
        if k > 0 && n > 0 {
            pack_b(&b, 0, k, 0, n, &mut all[HEADER_FLOATS..], k * PANEL);
        }
        PackedB { buf, k, n }
    }

    /// The serialised form: header then panels, ready to write into an artifact.
    pub fn as_bytes(&self) -> &[u8] {
        let all = self.buf.as_slice();
        // SAFETY: reinterpreting initialised f32s as bytes: u8 has no alignment or validity
        // requirement, f32 has no padding, and the length is exactly the f32 slice's bytes.
        unsafe { std::slice::from_raw_parts(all.as_ptr().cast::<u8>(), std::mem::size_of_val(all)) }
    }

    /// Parses and validates bytes from [`PackedB::as_bytes`], copying them into aligned
    /// storage. Use [`PackedBRef::from_bytes`] to use them in place (e.g. from a memory map).
    pub fn from_bytes(bytes: &[u8]) -> Result<PackedB, PackError> {
        let (k, n, floats) = parse_header(bytes)?;
        let mut buf = Aligned::new(HEADER_FLOATS, floats);
        let all = buf.as_mut_slice();
        for (dst, src) in all.iter_mut().zip(bytes.chunks_exact(4)) {
            *dst = f32::from_bits(u32::from_le_bytes([src[0], src[1], src[2], src[3]]));
        }
        Ok(PackedB { buf, k, n })
    }

    /// A borrowed view, what [`crate::sgemm`] takes.
    pub fn view(&self) -> PackedBRef<'_> {
        PackedBRef {
            k: self.k,
            n: self.n,
            data: &self.buf.as_slice()[HEADER_FLOATS..],
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

    /// The panels alone, without the header: `ceil(n/16)` blocks of `k x 16` floats, i.e. a
    /// row-major `[ceil(n/16), k, 16]` tensor. The compiler stores weights in this form as
    /// ordinary tensors (see [`PackedBRef::from_panels`]).
    pub fn panels(&self) -> &[f32] {
        &self.buf.as_slice()[HEADER_FLOATS..]
    }
}

/// A packed B borrowed from elsewhere: a [`PackedB`], or validated bytes in place.
#[derive(Clone, Copy, Debug)]
pub struct PackedBRef<'a> {
    k: usize,
    n: usize,
    /// `ceil(n/16) * k * 16` floats of panels.
    data: &'a [f32],
}

impl<'a> PackedBRef<'a> {
    /// Validates bytes from [`PackedB::as_bytes`] and uses them without copying, so weights
    /// in a memory-mapped artifact cost no extra memory. The bytes must be 4-byte aligned
    /// (64-byte alignment of the panels, i.e. of `bytes` + 32, is faster).
    pub fn from_bytes(bytes: &'a [u8]) -> Result<PackedBRef<'a>, PackError> {
        let (k, n, floats) = parse_header(bytes)?;
        let payload = &bytes[PACKED_B_HEADER_BYTES..];
        if !(payload.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>()) {
            return Err(PackError::Misaligned {
                addr: payload.as_ptr() as usize,
            });
        }
        // SAFETY: the pointer is 4-byte aligned (checked above), `payload` holds exactly
        // `floats * 4` bytes (checked by parse_header), every bit pattern is a valid f32, and
        // the f32 slice borrows `bytes` for 'a, so it is neither freed nor mutated meanwhile.
        let data = unsafe { std::slice::from_raw_parts(payload.as_ptr().cast::<f32>(), floats) };
        Ok(PackedBRef { k, n, data })
    }

    /// Uses headerless panels in place: `ceil(n/16) * k * 16` floats laid out as a row-major
    /// `[ceil(n/16), k, 16]` tensor (panel `q` holds columns `16q..16q+16` of B, `K x 16`
    /// row-major). This is how a compiled program stores a pre-packed weight: as an ordinary
    /// f32 tensor of that shape, whose dims already carry K and the panel count, so no
    /// header is needed. Padding columns past `n` may hold anything: the kernels never
    /// write the results they feed.
    pub fn from_panels(k: usize, n: usize, panels: &'a [f32]) -> Result<PackedBRef<'a>, PackError> {
        let floats = panel_floats(k, n).ok_or(PackError::Overflow {
            k: k as u64,
            n: n as u64,
        })?;
        if panels.len() != floats {
            return Err(PackError::Length {
                k: k as u64,
                n: n as u64,
                expected: floats * 4,
                actual: panels.len() * 4,
            });
        }
        Ok(PackedBRef { k, n, data: panels })
    }

    /// Rows (the GEMM's K).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns (the GEMM's N).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The panels (see the module docs for the layout).
    pub(crate) fn panels(&self) -> &'a [f32] {
        self.data
    }
}

fn write_header(h: &mut [f32], k: usize, n: usize) {
    let words = [
        u32::from_le_bytes(PACKED_B_MAGIC),
        VERSION,
        PACKED_B_NR as u32,
        DTYPE_F32,
        k as u64 as u32,
        ((k as u64) >> 32) as u32,
        n as u64 as u32,
        ((n as u64) >> 32) as u32,
    ];
    for (dst, w) in h.iter_mut().zip(words) {
        *dst = f32::from_bits(w);
    }
}

/// Checks a header and the total length; returns K, N and the number of panel floats.
fn parse_header(bytes: &[u8]) -> Result<(usize, usize, usize), PackError> {
    if bytes.len() < PACKED_B_HEADER_BYTES {
        return Err(PackError::TooShort { len: bytes.len() });
    }
    let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    let magic: [u8; 4] = bytes[..4].try_into().unwrap();
    if magic != PACKED_B_MAGIC {
        return Err(PackError::BadMagic { found: magic });
    }
    if word(1) != VERSION {
        return Err(PackError::Version(word(1)));
    }
    if word(2) as usize != PACKED_B_NR {
        return Err(PackError::PanelWidth(word(2)));
    }
    if word(3) != DTYPE_F32 {
        return Err(PackError::Dtype(word(3)));
    }
    let k64 = word(4) as u64 | (word(5) as u64) << 32;
    let n64 = word(6) as u64 | (word(7) as u64) << 32;
    let overflow = PackError::Overflow { k: k64, n: n64 };
    let k = usize::try_from(k64).map_err(|_| overflow.clone())?;
    let n = usize::try_from(n64).map_err(|_| overflow.clone())?;
    let floats = panel_floats(k, n).ok_or(overflow.clone())?;
    let expected = floats
        .checked_mul(4)
        .and_then(|b| b.checked_add(PACKED_B_HEADER_BYTES))
        .ok_or(overflow)?;
    if bytes.len() != expected {
        return Err(PackError::Length {
            k: k64,
            n: n64,
            expected,
            actual: bytes.len(),
        });
    }
    Ok((k, n, floats))
}
