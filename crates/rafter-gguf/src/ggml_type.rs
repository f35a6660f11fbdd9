//! ggml's tensor element types as GGUF files name them: id, name, and block geometry.
//!
//! The table mirrors `enum ggml_type` in ggml's `ggml.h` and the `type_traits` table in
//! `ggml.c` (block sizes also in gguf-py's `GGML_QUANT_SIZES`). It is rafter's own and
//! depends on nothing else: the container only needs to know how many bytes a tensor of a
//! given type and shape occupies, whatever kernels exist for it. Ids that ggml once defined
//! and later removed from GGUF files are known by name ([`RemovedGgmlType`]), so an error
//! can say what the file holds instead of just "unknown type 31".

use std::fmt;

/// One of the tensor types ggml currently defines, with its GGUF type id.
///
/// A tensor's elements are stored in blocks of [`block_elems`](Self::block_elems)
/// elements that take [`block_bytes`](Self::block_bytes) bytes each; plain types have
/// one-element blocks. Rows (the first ggml dimension) hold a whole number of blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// `QK_K`, the super-block size of the k-quants and i-quants.
const QK_K: u32 = 256;

/// (type, name as ggml prints it, elements per block, bytes per block), in id order.
const TABLE: &[(GgmlType, &str, u32, u32)] = &[
    (GgmlType::F32, "f32", 1, 4),
    (GgmlType::F16, "f16", 1, 2),
    (GgmlType::Q4_0, "q4_0", 32, 2 + 16),
    (GgmlType::Q4_1, "q4_1", 32, 2 + 2 + 16),
    (GgmlType::Q5_0, "q5_0", 32, 2 + 4 + 16),
    (GgmlType::Q5_1, "q5_1", 32, 2 + 2 + 4 + 16),
    (GgmlType::Q8_0, "q8_0", 32, 2 + 32),
    (GgmlType::Q8_1, "q8_1", 32, 2 + 2 + 32),
    (GgmlType::Q2_K, "q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    (GgmlType::Q3_K, "q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    (GgmlType::Q4_K, "q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    (
        GgmlType::Q5_K,
        "q5_K",
        QK_K,
        2 + 2 + QK_K / 2 + QK_K / 8 + 12,
    ),
    (
        GgmlType::Q6_K,
        "q6_K",
        QK_K,
        2 + QK_K / 2 + QK_K / 4 + QK_K / 16,
    ),
    (GgmlType::Q8_K, "q8_K", QK_K, 4 + QK_K + QK_K / 8),
    (GgmlType::IQ2_XXS, "iq2_xxs", QK_K, 2 + QK_K / 4),
    (GgmlType::IQ2_XS, "iq2_xs", QK_K, 2 + QK_K / 4 + QK_K / 32),
    (GgmlType::IQ3_XXS, "iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8),
    (GgmlType::IQ1_S, "iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16),
    (GgmlType::IQ4_NL, "iq4_nl", 32, 2 + 16),
    (
        GgmlType::IQ3_S,
        "iq3_s",
        QK_K,
        2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
    ),
    (GgmlType::IQ2_S, "iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16),
    (
        GgmlType::IQ4_XS,
        "iq4_xs",
        QK_K,
        2 + 2 + QK_K / 2 + QK_K / 64,
    ),
    (GgmlType::I8, "i8", 1, 1),
    (GgmlType::I16, "i16", 1, 2),
    (GgmlType::I32, "i32", 1, 4),
    (GgmlType::I64, "i64", 1, 8),
    (GgmlType::F64, "f64", 1, 8),
    (
        GgmlType::IQ1_M,
        "iq1_m",
        QK_K,
        QK_K / 8 + QK_K / 16 + QK_K / 32,
    ),
    (GgmlType::BF16, "bf16", 1, 2),
    (GgmlType::TQ1_0, "tq1_0", QK_K, 2 + 4 * 13),
    (GgmlType::TQ2_0, "tq2_0", QK_K, 2 + 64),
    (GgmlType::MXFP4, "mxfp4", 32, 1 + 16),
    (GgmlType::NVFP4, "nvfp4", 64, 4 + 32),
    (GgmlType::Q1_0, "q1_0", 128, 2 + 16),
    (GgmlType::Q2_0, "q2_0", 64, 2 + 16),
];

/// Type ids ggml once defined and has since removed from GGUF files, with their names and
/// what replaced them (from the comments in `ggml.h` and the `type_traits` table).
const REMOVED: &[(u32, &str, &str)] = &[
    (4, "Q4_2", "support was removed from ggml in 2023"),
    (5, "Q4_3", "support was removed from ggml in 2023"),
    (
        31,
        "Q4_0_4_4",
        "removed from GGUF files; ggml now repacks Q4_0 at load time",
    ),
    (
        32,
        "Q4_0_4_8",
        "removed from GGUF files; ggml now repacks Q4_0 at load time",
    ),
    (
        33,
        "Q4_0_8_8",
        "removed from GGUF files; ggml now repacks Q4_0 at load time",
    ),
    (
        36,
        "IQ4_NL_4_4",
        "removed from GGUF files; ggml now repacks IQ4_NL at load time",
    ),
    (
        37,
        "IQ4_NL_4_8",
        "removed from GGUF files; ggml now repacks IQ4_NL at load time",
    ),
    (
        38,
        "IQ4_NL_8_8",
        "removed from GGUF files; ggml now repacks IQ4_NL at load time",
    ),
];

/// A type id that ggml defined once but no longer accepts in GGUF files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemovedGgmlType {
    pub id: u32,
    pub name: &'static str,
    pub note: &'static str,
}

/// Why a type id does not name a current [`GgmlType`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownGgmlType {
    /// An id ggml used to define (see [`RemovedGgmlType`]).
    Removed(RemovedGgmlType),
    /// An id ggml never defined (as of the types listed in [`GgmlType`]).
    Unknown(u32),
}

impl fmt::Display for UnknownGgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnknownGgmlType::Removed(r) => {
                write!(f, "ggml type {} ({}): {}", r.id, r.name, r.note)
            }
            UnknownGgmlType::Unknown(id) => write!(
                f,
                "unknown ggml type id {id} (ggml defines ids 0..={})",
                GgmlType::Q2_0 as u32
            ),
        }
    }
}

impl GgmlType {
    /// Every type, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|row| row.0)
    }

    /// The type with GGUF type id `id`, or why there is none.
    pub fn from_id(id: u32) -> Result<GgmlType, UnknownGgmlType> {
        if let Some(row) = TABLE.iter().find(|row| row.0 as u32 == id) {
            return Ok(row.0);
        }
        match REMOVED.iter().find(|r| r.0 == id) {
            Some(&(id, name, note)) => {
                Err(UnknownGgmlType::Removed(RemovedGgmlType { id, name, note }))
            }
            None => Err(UnknownGgmlType::Unknown(id)),
        }
    }

    /// The type ggml prints as `name` (`"q4_K"`, `"bf16"`; case-insensitive).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|row| row.1.eq_ignore_ascii_case(name))
            .map(|row| row.0)
    }

    fn row(self) -> &'static (GgmlType, &'static str, u32, u32) {
        // The table lists every variant exactly once (checked by a unit test), so the
        // search always succeeds; the fallback row is never taken.
        TABLE.iter().find(|row| row.0 == self).unwrap_or(&TABLE[0])
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name for the type (`"q4_K"`, `"bf16"`, ...).
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// Elements per block (1 for plain types).
    pub fn block_elems(self) -> u32 {
        self.row().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u32 {
        self.row().3
    }

    /// Whether the type stores elements in multi-element quantization blocks.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes taken by `elems` elements, or `None` when `elems` is not a whole number of
    /// blocks or the size overflows `u64`.
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        let block = u64::from(self.block_elems());
        if elems % block != 0 {
            return None;
        }
        (elems / block).checked_mul(u64::from(self.block_bytes()))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_complete_and_ordered() {
        let ids: Vec<u32> = TABLE.iter().map(|r| r.0 as u32).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(ids, sorted, "ids are unique and in order");
        for t in GgmlType::all() {
            assert_eq!(GgmlType::from_id(t.id()), Ok(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        // Every id below the highest one is either a current type or a removed one.
        for id in 0..=GgmlType::Q2_0 as u32 {
            let known = GgmlType::from_id(id).is_ok()
                || matches!(GgmlType::from_id(id), Err(UnknownGgmlType::Removed(_)));
            assert!(known, "id {id} is accounted for");
        }
        assert_eq!(GgmlType::from_id(43), Err(UnknownGgmlType::Unknown(43)));
    }

    /// Block sizes against ggml-common.h's static_asserts, written out by hand.
    #[test]
    fn block_geometry_matches_ggml_common() {
        let expect = [
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q8_1, 32, 36),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::Q8_K, 256, 292),
            (GgmlType::IQ2_XXS, 256, 66),
            (GgmlType::IQ2_XS, 256, 74),
            (GgmlType::IQ3_XXS, 256, 98),
            (GgmlType::IQ1_S, 256, 50),
            (GgmlType::IQ4_NL, 32, 18),
            (GgmlType::IQ3_S, 256, 110),
            (GgmlType::IQ2_S, 256, 82),
            (GgmlType::IQ4_XS, 256, 136),
            (GgmlType::IQ1_M, 256, 56),
            (GgmlType::TQ1_0, 256, 54),
            (GgmlType::TQ2_0, 256, 66),
            (GgmlType::MXFP4, 32, 17),
            (GgmlType::NVFP4, 64, 36),
            (GgmlType::Q1_0, 128, 18),
            (GgmlType::Q2_0, 64, 18),
            (GgmlType::BF16, 1, 2),
            (GgmlType::F64, 1, 8),
        ];
        for (t, elems, bytes) in expect {
            assert_eq!((t.block_elems(), t.block_bytes()), (elems, bytes), "{t}");
        }
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
    }

    #[test]
    fn removed_ids_are_named() {
        let err = GgmlType::from_id(31).unwrap_err();
        assert!(err.to_string().contains("Q4_0_4_4"), "{err}");
        assert!(err.to_string().contains("repacks"), "{err}");
    }
}
