//! The fixed-size records of the format (header, section table entries) and their codes.
//! Layout and meaning are documented at the crate root.

use crate::ArtifactError;
use rafter_ir::DType;

/// The first eight bytes of every artifact.
pub const MAGIC: [u8; 8] = *b"RAFTRFA\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Versions this build reads.
pub const READABLE_VERSIONS: [u32; 1] = [1];
/// Size of the header.
pub const HEADER_LEN: usize = 64;
/// Size of one section-table entry.
pub const ENTRY_LEN: usize = 64;
/// Alignment of the weights section from the start of the file (a page).
pub const WEIGHTS_SECTION_ALIGN: u64 = 4096;
/// Minimum alignment of each weight inside the weights section.
pub const MIN_WEIGHT_ALIGN: u64 = 64;
/// Largest alignment a section may ask for.
pub const MAX_SECTION_ALIGN: u64 = 1 << 16;
/// Longest section name (device tag).
pub const NAME_LEN: usize = 16;

/// What a section holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SectionKind {
    /// The host program as Program text in weight-reference mode (UTF-8).
    Program,
    /// The weight table: index → dtype, dims, offset and length in the weights section.
    WeightTable,
    /// The weights' bytes, page-aligned, each weight aligned.
    Weights,
    /// One device's executable, opaque to this crate; the section name is the device.
    Executable,
    /// Data a frontend keeps with the program, opaque to this crate and the runtime; the
    /// section name says whose (`llm`: an LLM's tokenizer and generation settings).
    Metadata,
}

impl SectionKind {
    pub const ALL: [SectionKind; 5] = [
        SectionKind::Program,
        SectionKind::WeightTable,
        SectionKind::Weights,
        SectionKind::Executable,
        SectionKind::Metadata,
    ];

    pub fn code(self) -> u32 {
        match self {
            SectionKind::Program => 1,
            SectionKind::WeightTable => 2,
            SectionKind::Weights => 3,
            SectionKind::Executable => 4,
            SectionKind::Metadata => 5,
        }
    }

    pub fn from_code(code: u32) -> Option<SectionKind> {
        SectionKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The name a section of this kind must have (`None` for executables, named by their
    /// device, and metadata, named by its owner).
    pub fn fixed_name(self) -> Option<&'static str> {
        match self {
            SectionKind::Program => Some("program"),
            SectionKind::WeightTable => Some("weight_table"),
            SectionKind::Weights => Some("weights"),
            SectionKind::Executable | SectionKind::Metadata => None,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            SectionKind::Program => "program",
            SectionKind::WeightTable => "weight_table",
            SectionKind::Weights => "weights",
            SectionKind::Executable => "executable",
            SectionKind::Metadata => "metadata",
        }
    }
}

/// The dtype codes of the weight table.
pub fn dtype_code(d: DType) -> u32 {
    match d {
        DType::F32 => 1,
        DType::F64 => 2,
        DType::F16 => 3,
        DType::BF16 => 4,
        DType::I8 => 5,
        DType::U8 => 6,
        DType::I16 => 7,
        DType::U16 => 8,
        DType::I32 => 9,
        DType::U32 => 10,
        DType::I64 => 11,
        DType::U64 => 12,
        DType::Bool => 13,
    }
}

pub fn dtype_from_code(code: u32) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dtype_code(d) == code)
}

/// Whether `name` can name a section or a device: 1 to 16 bytes of `[a-z0-9_]`, starting
/// with a letter.
pub fn is_valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= NAME_LEN
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

/// Reads a NUL-padded name field.
pub fn decode_name(field: &[u8; NAME_LEN]) -> Option<String> {
    let len = field.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
    if field[len..].iter().any(|&c| c != 0) {
        return None;
    }
    let name = std::str::from_utf8(&field[..len]).ok()?;
    is_valid_name(name).then(|| name.to_string())
}

pub fn encode_name(name: &str) -> [u8; NAME_LEN] {
    debug_assert!(is_valid_name(name));
    let mut out = [0u8; NAME_LEN];
    out[..name.len()].copy_from_slice(name.as_bytes());
    out
}

/// A little-endian cursor over a byte slice whose every read is bounds-checked.
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    what: &'a str,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], what: &'a str) -> Reader<'a> {
        Reader {
            bytes,
            pos: 0,
            what,
        }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], ArtifactError> {
        if n > self.remaining() {
            return Err(ArtifactError::malformed(
                self.what,
                format!(
                    "{field} at byte {} needs {n} bytes, {} remain",
                    self.pos,
                    self.remaining()
                ),
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn u32(&mut self, field: &str) -> Result<u32, ArtifactError> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, field: &str) -> Result<u64, ArtifactError> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

/// The fixed header at offset 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub flags: u32,
    pub section_count: u32,
    pub table_checksum: u32,
    pub table_offset: u64,
    pub file_len: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&self.version.to_le_bytes());
        h[12..16].copy_from_slice(&self.flags.to_le_bytes());
        h[16..20].copy_from_slice(&self.section_count.to_le_bytes());
        h[20..24].copy_from_slice(&self.table_checksum.to_le_bytes());
        h[24..32].copy_from_slice(&self.table_offset.to_le_bytes());
        h[32..40].copy_from_slice(&self.file_len.to_le_bytes());
        // 40..60 reserved, zero.
        let sum = crc32fast::hash(&h[..60]);
        h[60..64].copy_from_slice(&sum.to_le_bytes());
        h
    }
}

/// One section-table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: u32,
    pub flags: u32,
    pub name: [u8; NAME_LEN],
    pub offset: u64,
    pub len: u64,
    pub align: u64,
    pub checksum: u32,
    pub reserved: [u8; 12],
}

impl Entry {
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut e = [0u8; ENTRY_LEN];
        e[0..4].copy_from_slice(&self.kind.to_le_bytes());
        e[4..8].copy_from_slice(&self.flags.to_le_bytes());
        e[8..24].copy_from_slice(&self.name);
        e[24..32].copy_from_slice(&self.offset.to_le_bytes());
        e[32..40].copy_from_slice(&self.len.to_le_bytes());
        e[40..48].copy_from_slice(&self.align.to_le_bytes());
        e[48..52].copy_from_slice(&self.checksum.to_le_bytes());
        e[52..64].copy_from_slice(&self.reserved);
        e
    }

    pub fn decode(b: &[u8; ENTRY_LEN]) -> Entry {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let mut name = [0u8; NAME_LEN];
        name.copy_from_slice(&b[8..24]);
        let mut reserved = [0u8; 12];
        reserved.copy_from_slice(&b[52..64]);
        Entry {
            kind: u32_at(0),
            flags: u32_at(4),
            name,
            offset: u64_at(24),
            len: u64_at(32),
            align: u64_at(40),
            checksum: u32_at(48),
            reserved,
        }
    }
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub fn align_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(dtype_from_code(dtype_code(d)), Some(d));
        }
        assert_eq!(dtype_from_code(0), None);
        for k in SectionKind::ALL {
            assert_eq!(SectionKind::from_code(k.code()), Some(k));
        }
    }

    #[test]
    fn names() {
        assert!(is_valid_name("cpu"));
        assert!(is_valid_name("weight_table"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("Vulkan"));
        assert!(!is_valid_name("0cpu"));
        assert!(!is_valid_name("a_name_that_is_too_long"));
        assert_eq!(
            decode_name(&encode_name("vulkan")).as_deref(),
            Some("vulkan")
        );
        let mut f = encode_name("cpu");
        f[10] = b'x';
        assert_eq!(decode_name(&f), None);
    }

    #[test]
    fn aligns() {
        assert_eq!(align_up(0, 64), Some(0));
        assert_eq!(align_up(1, 64), Some(64));
        assert_eq!(align_up(4096, 4096), Some(4096));
        assert_eq!(align_up(u64::MAX, 64), None);
    }
}
