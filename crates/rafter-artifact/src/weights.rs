//! The weight table: where each weight lies in the weights section, with its dtype and dims.

use crate::format::{dtype_code, dtype_from_code, Reader, MIN_WEIGHT_ALIGN};
use crate::ArtifactError;
use rafter_ir::{ConstData, DType};

/// Largest rank a weight may have.
pub const MAX_RANK: u32 = 64;
/// Alignment this build gives every weight.
pub const WEIGHT_ALIGN: u64 = MIN_WEIGHT_ALIGN;

/// One weight table entry (validated against the weights section).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightEntry {
    pub dtype: DType,
    pub dims: Vec<usize>,
    /// Offset inside the weights section (not the file).
    pub offset: u64,
    pub len: u64,
}

/// Encodes the table for `weights`, placed at `offsets`.
pub fn encode_table(weights: &[ConstData], offsets: &[u64], align: u64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(weights.len() as u32).to_le_bytes());
    out.extend_from_slice(&(align as u32).to_le_bytes());
    for (w, &off) in weights.iter().zip(offsets) {
        out.extend_from_slice(&dtype_code(w.dtype).to_le_bytes());
        out.extend_from_slice(&(w.dims.len() as u32).to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&(w.bytes.len() as u64).to_le_bytes());
        for &d in &w.dims {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
    }
    out
}

/// Decodes and validates the table against a weights section of `section_len` bytes: every
/// entry lies inside it, aligned, in increasing order without overlap, and its length is
/// exactly dtype size × dims.
pub fn decode_table(table: &[u8], section_len: u64) -> Result<Vec<WeightEntry>, ArtifactError> {
    const WHAT: &str = "section weight_table";
    let mut r = Reader::new(table, WHAT);
    let count = r.u32("field `count`")?;
    let align = r.u32("field `weight_alignment`")? as u64;
    if !align.is_power_of_two() || !(MIN_WEIGHT_ALIGN..=4096).contains(&align) {
        return Err(ArtifactError::malformed(
            WHAT,
            format!("weight alignment {align} is not a power of two in {MIN_WEIGHT_ALIGN}..=4096"),
        ));
    }
    // Each entry takes at least 24 bytes: bound the count before allocating for it.
    if count as usize > r.remaining() / 24 {
        return Err(ArtifactError::malformed(
            WHAT,
            format!(
                "{count} entries cannot fit in the {} bytes that follow the count",
                r.remaining()
            ),
        ));
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut prev_end = 0u64;
    for i in 0..count {
        let at = r.pos();
        let field = |f: &str| format!("entry {i} field `{f}`");
        let code = r.u32(&field("dtype"))?;
        let rank = r.u32(&field("rank"))?;
        let offset = r.u64(&field("offset"))?;
        let len = r.u64(&field("length"))?;
        let bad = |msg: String| {
            ArtifactError::malformed(WHAT, format!("entry {i} (at byte {at}): {msg}"))
        };
        let dtype =
            dtype_from_code(code).ok_or_else(|| bad(format!("unknown dtype code {code}")))?;
        if rank > MAX_RANK {
            return Err(bad(format!("rank {rank} exceeds {MAX_RANK}")));
        }
        let mut dims = Vec::with_capacity(rank as usize);
        for k in 0..rank {
            let d = r.u64(&field(&format!("dims[{k}]")))?;
            let d = usize::try_from(d)
                .map_err(|_| bad(format!("dim {k} = {d} does not fit this machine's usize")))?;
            dims.push(d);
        }
        let expected = dims
            .iter()
            .try_fold(dtype.size_of() as u64, |acc, &d| acc.checked_mul(d as u64));
        if expected != Some(len) {
            return Err(bad(match expected {
                Some(e) => format!("{dtype}{dims:?} needs {e} bytes, the entry says {len}"),
                None => format!("{dtype}{dims:?} has a byte size that overflows u64"),
            }));
        }
        if offset % align != 0 {
            return Err(bad(format!(
                "offset {offset} is not a multiple of the weight alignment {align}"
            )));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| bad(format!("offset {offset} + length {len} overflows")))?;
        if end > section_len {
            return Err(bad(format!(
                "bytes {offset}..{end} run past the end of the weights section ({section_len} bytes)"
            )));
        }
        if offset < prev_end {
            return Err(bad(format!(
                "offset {offset} overlaps the previous weight (which ends at {prev_end})"
            )));
        }
        if usize::try_from(len).is_err() {
            return Err(bad(format!(
                "length {len} does not fit this machine's usize"
            )));
        }
        prev_end = end;
        out.push(WeightEntry {
            dtype,
            dims,
            offset,
            len,
        });
    }
    if r.remaining() != 0 {
        return Err(ArtifactError::malformed(
            WHAT,
            format!("{} bytes follow the last entry", r.remaining()),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn w(dtype: DType, dims: &[usize]) -> ConstData {
        let n = dims.iter().product::<usize>() * dtype.size_of();
        ConstData::new(dtype, dims.to_vec(), Bytes::from(vec![1u8; n])).unwrap()
    }

    #[test]
    fn round_trip() {
        let ws = [
            w(DType::F32, &[2, 3]),
            w(DType::Bool, &[]),
            w(DType::I64, &[0]),
        ];
        let t = encode_table(&ws, &[0, 64, 128], 64);
        let e = decode_table(&t, 128).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].dims, vec![2, 3]);
        assert_eq!((e[1].offset, e[1].len), (64, 1));
        assert_eq!(e[2].dtype, DType::I64);
    }

    #[test]
    fn rejects() {
        let ws = [w(DType::F32, &[2, 3])];
        let t = encode_table(&ws, &[0], 64);
        let msg = |t: &[u8], n| decode_table(t, n).unwrap_err().to_string();
        assert!(
            msg(&t, 23).contains("past the end of the weights section"),
            "{}",
            msg(&t, 23)
        );
        let t2 = encode_table(&ws, &[32], 64);
        assert!(msg(&t2, 1000).contains("not a multiple"));
        let mut t3 = t.clone();
        t3[32..40].copy_from_slice(&7u64.to_le_bytes()); // dims[0]
        assert!(msg(&t3, 1000).contains("needs 84 bytes, the entry says 24"));
        let mut t4 = t.clone();
        t4[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(msg(&t4, 1000).contains("overflow") || msg(&t4, 1000).contains("usize"));
        let mut t5 = t.clone();
        t5[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(msg(&t5, 1000).contains("cannot fit"));
        let mut t6 = t.clone();
        t6.push(0);
        assert!(msg(&t6, 1000).contains("follow the last entry"));
        let ws2 = [w(DType::F32, &[20]), w(DType::F32, &[1])];
        let t7 = encode_table(&ws2, &[0, 64], 64);
        assert!(msg(&t7, 1000).contains("overlaps the previous weight"));
    }
}
