//! The container: header, section table and sections, without interpreting what the
//! sections hold. [`Container::parse`] validates the whole structure; [`ContainerWriter`]
//! lays sections out and writes them.

use crate::format::{
    align_up, decode_name, encode_name, is_valid_name, Entry, Header, SectionKind, ENTRY_LEN,
    HEADER_LEN, MAGIC, MAX_SECTION_ALIGN, READABLE_VERSIONS, VERSION, WEIGHTS_SECTION_ALIGN,
};
use crate::{ArtifactError, ReadOptions};
use bytes::Bytes;
use std::io::Write;

/// One section as the table describes it (validated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionInfo {
    pub kind: SectionKind,
    /// `program`, `weight_table`, `weights`, or the device of an executable.
    pub name: String,
    /// Byte offset from the start of the file.
    pub offset: u64,
    pub len: u64,
    /// The alignment the section asked for (`offset` is a multiple of it).
    pub align: u64,
    /// CRC-32 (IEEE) of the section's bytes.
    pub checksum: u32,
}

impl SectionInfo {
    /// How errors name the section: `section 2 (weights)`.
    pub(crate) fn label(&self, index: usize) -> String {
        match self.kind {
            SectionKind::Executable => format!("section {index} (executable `{}`)", self.name),
            SectionKind::Metadata => format!("section {index} (metadata `{}`)", self.name),
            _ => format!("section {index} ({})", self.name),
        }
    }
}

/// A structurally valid artifact file whose sections are still uninterpreted.
#[derive(Clone, Debug)]
pub struct Container {
    bytes: Bytes,
    version: u32,
    sections: Vec<SectionInfo>,
}

fn truncated(what: impl Into<String>, needed: u64, actual: u64) -> ArtifactError {
    ArtifactError::Truncated {
        what: what.into(),
        needed,
        actual,
    }
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

/// `bytes[start..start + len]` as a checked range of a buffer of `total` bytes.
fn range(start: u64, len: u64, total: usize) -> Option<std::ops::Range<usize>> {
    let end = start.checked_add(len)?;
    if end > total as u64 {
        return None;
    }
    Some(start as usize..end as usize)
}

impl Container {
    /// Validates the header, the section table and every section's placement (and, when
    /// `options.verify_checksums`, every checksum). Never panics, whatever `bytes` holds.
    pub fn parse(bytes: Bytes, options: &ReadOptions) -> Result<Container, ArtifactError> {
        let b: &[u8] = &bytes;
        let actual = b.len() as u64;

        // Magic first, so that any other file is "not a rafter artifact", even a short one.
        let prefix = b.len().min(MAGIC.len());
        if b[..prefix] != MAGIC[..prefix] {
            return Err(ArtifactError::NotAnArtifact {
                found: b[..prefix].to_vec(),
            });
        }
        if b.len() < 12 {
            return Err(truncated("the header", HEADER_LEN as u64, actual));
        }
        // The version before anything else: a later version may lay its header out
        // differently.
        let version = u32_at(b, 8);
        if !READABLE_VERSIONS.contains(&version) {
            return Err(ArtifactError::UnsupportedVersion {
                found: version,
                reads: VERSION,
            });
        }
        if b.len() < HEADER_LEN {
            return Err(truncated("the header", HEADER_LEN as u64, actual));
        }
        if options.verify_checksums {
            let stored = u32_at(b, 60);
            let computed = crc32fast::hash(&b[..60]);
            if stored != computed {
                return Err(ArtifactError::Checksum {
                    what: "header".into(),
                    stored,
                    computed,
                });
            }
        }
        let header = Header {
            version,
            flags: u32_at(b, 12),
            section_count: u32_at(b, 16),
            table_checksum: u32_at(b, 20),
            table_offset: u64_at(b, 24),
            file_len: u64_at(b, 32),
        };
        if header.flags != 0 {
            return Err(ArtifactError::malformed(
                "header field `flags`",
                format!(
                    "{:#x} sets bits version {version} does not define",
                    header.flags
                ),
            ));
        }
        if let Some(i) = (40..60).find(|&i| b[i] != 0) {
            return Err(ArtifactError::malformed(
                "header",
                format!("reserved byte {i} is {:#04x}, not zero", b[i]),
            ));
        }
        if header.file_len > actual {
            return Err(truncated(
                "the file length in the header",
                header.file_len,
                actual,
            ));
        }
        if header.file_len < actual {
            return Err(ArtifactError::malformed(
                "header field `file_length`",
                format!(
                    "says {} bytes but the file has {actual} (trailing bytes)",
                    header.file_len
                ),
            ));
        }

        // The section table.
        let table_len = (header.section_count as u64)
            .checked_mul(ENTRY_LEN as u64)
            .expect("u32 * 64 fits u64");
        let table_what = format!(
            "section table (offset {}, {} entries)",
            header.table_offset, header.section_count
        );
        if header.table_offset < HEADER_LEN as u64 || header.table_offset % 8 != 0 {
            return Err(ArtifactError::malformed(
                "header field `section_table_offset`",
                format!(
                    "{} is inside the header or not a multiple of 8",
                    header.table_offset
                ),
            ));
        }
        let Some(table_range) = range(header.table_offset, table_len, b.len()) else {
            return Err(ArtifactError::malformed(
                table_what,
                format!(
                    "{table_len} bytes at offset {} run past the end of the file ({actual} bytes)",
                    header.table_offset
                ),
            ));
        };
        let table = &b[table_range.clone()];
        if options.verify_checksums {
            let computed = crc32fast::hash(table);
            if computed != header.table_checksum {
                return Err(ArtifactError::Checksum {
                    what: "section table".into(),
                    stored: header.table_checksum,
                    computed,
                });
            }
        }

        let mut sections = Vec::with_capacity(header.section_count as usize);
        let mut covered: Vec<(u64, u64, String)> = vec![
            (0, HEADER_LEN as u64, "the header".into()),
            (
                table_range.start as u64,
                table_range.end as u64,
                "the section table".into(),
            ),
        ];
        for (i, chunk) in table.chunks_exact(ENTRY_LEN).enumerate() {
            let raw: &[u8; ENTRY_LEN] = chunk.try_into().expect("chunks_exact");
            let e = Entry::decode(raw);
            let what = format!("section table entry {i}");
            let kind = SectionKind::from_code(e.kind).ok_or_else(|| {
                ArtifactError::malformed(&what, format!("unknown section kind {}", e.kind))
            })?;
            let name = decode_name(&e.name).ok_or_else(|| {
                ArtifactError::malformed(
                    &what,
                    format!(
                        "name field {:02x?} is not 1-16 bytes of [a-z0-9_] padded with zeros",
                        e.name
                    ),
                )
            })?;
            if let Some(fixed) = kind.fixed_name() {
                if name != fixed {
                    return Err(ArtifactError::malformed(
                        &what,
                        format!(
                            "a {} section must be named `{fixed}`, not `{name}`",
                            kind.word()
                        ),
                    ));
                }
            }
            let info = SectionInfo {
                kind,
                name,
                offset: e.offset,
                len: e.len,
                align: e.align,
                checksum: e.checksum,
            };
            let what = format!("{what}: {}", info.label(i));
            if e.flags != 0 {
                return Err(ArtifactError::malformed(
                    &what,
                    format!("flags {:#x} are not defined", e.flags),
                ));
            }
            if e.reserved.iter().any(|&c| c != 0) {
                return Err(ArtifactError::malformed(
                    &what,
                    "reserved bytes are not zero",
                ));
            }
            let min_align = if kind == SectionKind::Weights {
                WEIGHTS_SECTION_ALIGN
            } else {
                1
            };
            if !e.align.is_power_of_two() || e.align < min_align || e.align > MAX_SECTION_ALIGN {
                return Err(ArtifactError::malformed(
                    &what,
                    format!(
                        "alignment {} is not a power of two in {min_align}..={MAX_SECTION_ALIGN}",
                        e.align
                    ),
                ));
            }
            if e.offset % e.align != 0 {
                return Err(ArtifactError::malformed(
                    &what,
                    format!(
                        "offset {} is not a multiple of its alignment {}",
                        e.offset, e.align
                    ),
                ));
            }
            let end = e.offset.checked_add(e.len).ok_or_else(|| {
                ArtifactError::malformed(
                    &what,
                    format!("offset {} + length {} overflows", e.offset, e.len),
                )
            })?;
            if end > actual {
                return Err(ArtifactError::malformed(
                    &what,
                    format!(
                        "offset {} + length {} = {end} runs past the end of the file ({actual} bytes)",
                        e.offset, e.len
                    ),
                ));
            }
            if let Some((j, other)) = sections
                .iter()
                .enumerate()
                .find(|(_, s): &(usize, &SectionInfo)| s.kind == kind && s.name == info.name)
            {
                return Err(ArtifactError::malformed(
                    &what,
                    format!("duplicates {}", other.label(j)),
                ));
            }
            covered.push((e.offset, end, info.label(i)));
            sections.push(info);
        }
        for kind in [
            SectionKind::Program,
            SectionKind::WeightTable,
            SectionKind::Weights,
        ] {
            if !sections.iter().any(|s| s.kind == kind) {
                return Err(ArtifactError::malformed(
                    "section table",
                    format!("has no {} section", kind.word()),
                ));
            }
        }

        // No two regions overlap; whatever lies between them is zero padding.
        covered.sort_by_key(|c| (c.0, c.1));
        let mut prev_end = 0u64;
        let mut prev_what = "the start of the file".to_string();
        for (start, end, what) in &covered {
            if *start < prev_end {
                return Err(ArtifactError::malformed(
                    what,
                    format!("bytes {start}..{end} overlap {prev_what} (ends at {prev_end})"),
                ));
            }
            // In bounds: every region was checked against the file length above.
            if let Some(p) = b[prev_end as usize..*start as usize]
                .iter()
                .position(|&c| c != 0)
            {
                return Err(ArtifactError::malformed(
                    "padding",
                    format!(
                        "byte {} between {prev_what} and {what} is {:#04x}, not zero",
                        prev_end + p as u64,
                        b[prev_end as usize + p]
                    ),
                ));
            }
            prev_end = *end;
            prev_what = what.clone();
        }
        if prev_end < actual {
            if let Some(p) = b[prev_end as usize..].iter().position(|&c| c != 0) {
                return Err(ArtifactError::malformed(
                    "padding",
                    format!(
                        "byte {} after {prev_what} is {:#04x}, not zero",
                        prev_end + p as u64,
                        b[prev_end as usize + p]
                    ),
                ));
            }
        }

        if options.verify_checksums {
            for (i, s) in sections.iter().enumerate() {
                let computed = crc32fast::hash(&b[s.offset as usize..(s.offset + s.len) as usize]);
                if computed != s.checksum {
                    return Err(ArtifactError::Checksum {
                        what: s.label(i),
                        stored: s.checksum,
                        computed,
                    });
                }
            }
        }

        Ok(Container {
            bytes,
            version,
            sections,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The whole file.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    pub fn sections(&self) -> &[SectionInfo] {
        &self.sections
    }

    /// The bytes of the section of `kind` named `name` (a slice of the file, not a copy).
    pub fn section(&self, kind: SectionKind, name: &str) -> Option<Bytes> {
        let s = self
            .sections
            .iter()
            .find(|s| s.kind == kind && s.name == name)?;
        // In bounds: checked by `parse`.
        Some(
            self.bytes
                .slice(s.offset as usize..(s.offset + s.len) as usize),
        )
    }
}

/// The bytes of one section, as pieces at offsets inside it; the gaps are zero. Lets the
/// weights section be written straight from the weights' own buffers, without gathering it
/// in memory first.
#[derive(Clone, Debug, Default)]
pub struct SectionData {
    pieces: Vec<(u64, Bytes)>,
    len: u64,
}

impl SectionData {
    pub fn from_bytes(b: impl Into<Bytes>) -> SectionData {
        let b: Bytes = b.into();
        SectionData {
            len: b.len() as u64,
            pieces: vec![(0, b)],
        }
    }

    /// Adds `b` at `offset`, which must be at or past the end of what is there.
    pub fn push_at(&mut self, offset: u64, b: Bytes) {
        assert!(offset >= self.len, "pieces must not overlap");
        self.len = offset + b.len() as u64;
        self.pieces.push((offset, b));
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn checksum(&self) -> u32 {
        let mut h = crc32fast::Hasher::new();
        let mut at = 0u64;
        for (off, b) in &self.pieces {
            zeros(*off - at, |z| h.update(z));
            h.update(b);
            at = off + b.len() as u64;
        }
        h.finalize()
    }

    fn write_to(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let mut at = 0u64;
        for (off, b) in &self.pieces {
            write_zeros(w, *off - at)?;
            w.write_all(b)?;
            at = off + b.len() as u64;
        }
        Ok(())
    }
}

fn zeros(mut n: u64, mut f: impl FnMut(&[u8])) {
    const Z: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(Z.len() as u64) as usize;
        f(&Z[..k]);
        n -= k as u64;
    }
}

fn write_zeros(w: &mut dyn Write, n: u64) -> std::io::Result<()> {
    let mut r = Ok(());
    zeros(n, |z| {
        if r.is_ok() {
            r = w.write_all(z);
        }
    });
    r
}

/// Lays sections out after the header and the table, each at its alignment, in the order
/// they were added.
#[derive(Debug, Default)]
pub struct ContainerWriter {
    sections: Vec<(SectionKind, String, u64, SectionData)>,
}

/// A laid-out container, ready to write.
#[derive(Debug)]
pub struct Layout {
    header: [u8; HEADER_LEN],
    table: Vec<u8>,
    sections: Vec<(u64, SectionData)>,
    file_len: u64,
}

impl ContainerWriter {
    pub fn new() -> ContainerWriter {
        ContainerWriter::default()
    }

    /// Adds a section. `align` must be a power of two (at least 4096 for weights).
    pub fn add(
        &mut self,
        kind: SectionKind,
        name: &str,
        align: u64,
        data: SectionData,
    ) -> Result<&mut Self, ArtifactError> {
        if !is_valid_name(name) {
            return Err(ArtifactError::Write(format!(
                "section name `{name}` is not 1-16 bytes of [a-z0-9_] starting with a letter"
            )));
        }
        let min = if kind == SectionKind::Weights {
            WEIGHTS_SECTION_ALIGN
        } else {
            1
        };
        if !align.is_power_of_two() || align < min || align > MAX_SECTION_ALIGN {
            return Err(ArtifactError::Write(format!(
                "section `{name}`: alignment {align} is not a power of two in {min}..={MAX_SECTION_ALIGN}"
            )));
        }
        if self.sections.iter().any(|s| s.0 == kind && s.1 == name) {
            return Err(ArtifactError::Write(format!(
                "two {} sections named `{name}`",
                kind.word()
            )));
        }
        self.sections.push((kind, name.to_string(), align, data));
        Ok(self)
    }

    /// Places every section and computes the checksums.
    pub fn layout(self) -> Result<Layout, ArtifactError> {
        let too_big = || ArtifactError::Write("the artifact would exceed 2^64 bytes".into());
        let count = u32::try_from(self.sections.len())
            .map_err(|_| ArtifactError::Write("too many sections".into()))?;
        let table_offset = HEADER_LEN as u64;
        let mut at = table_offset + count as u64 * ENTRY_LEN as u64;
        let mut table = Vec::with_capacity(self.sections.len() * ENTRY_LEN);
        let mut placed = Vec::with_capacity(self.sections.len());
        for (kind, name, align, data) in self.sections {
            let offset = align_up(at, align).ok_or_else(too_big)?;
            at = offset.checked_add(data.len()).ok_or_else(too_big)?;
            let entry = Entry {
                kind: kind.code(),
                flags: 0,
                name: encode_name(&name),
                offset,
                len: data.len(),
                align,
                checksum: data.checksum(),
                reserved: [0; 12],
            };
            table.extend_from_slice(&entry.encode());
            placed.push((offset, data));
        }
        let header = Header {
            version: VERSION,
            flags: 0,
            section_count: count,
            table_checksum: crc32fast::hash(&table),
            table_offset,
            file_len: at,
        }
        .encode();
        Ok(Layout {
            header,
            table,
            sections: placed,
            file_len: at,
        })
    }
}

impl Layout {
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    pub fn write_to(&self, w: &mut dyn Write) -> std::io::Result<()> {
        w.write_all(&self.header)?;
        w.write_all(&self.table)?;
        let mut at = (HEADER_LEN + self.table.len()) as u64;
        for (offset, data) in &self.sections {
            write_zeros(w, offset - at)?;
            data.write_to(w)?;
            at = offset + data.len();
        }
        Ok(())
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(usize::try_from(self.file_len).unwrap_or(0));
        self.write_to(&mut out)
            .expect("writing to a Vec cannot fail");
        out
    }
}
