//! The rafter artifact (`.rfa`): one file holding everything a compiled model needs to run.
//!
//! - the **host program** ([`Program`]) as Program text in weight-reference mode; its inputs,
//!   outputs and symbol bounds are the model's **signature** ([`Artifact::signature`]);
//! - each device's **executable section**, opaque bytes per device name, written by the
//!   device's compiler backend and read (and validated) by the device's executable loader
//!   in the runtime: `cpu` holds a small descriptor (the CPU runs the kernel bodies the
//!   program carries; `rafter_kernels_cpu::artifact_section`), `vulkan` the SPIR-V modules
//!   (`rafter-vulkan-section`). This crate never looks inside one, so a new device adds a
//!   section without touching it;
//! - the **weights**, laid out for memory mapping: the section starts on a 4096-byte page
//!   boundary of the file and every weight on a 64-byte boundary, so [`Artifact::open`] maps
//!   the file and every weight's [`ConstData`] is a slice of the map (no copy, and pages
//!   are read from disk only when a kernel touches them).
//!
//! The compiler writes artifacts with [`ArtifactWriter`]; the runtime reads them with
//! [`Artifact::open`] or [`Artifact::from_bytes`], which validate everything before anything
//! is used: a corrupt, truncated or hostile file gives an [`ArtifactError`] naming the
//! section, field and value, never a panic or an out-of-bounds read.
//!
//! # Layout (version 1)
//!
//! All integers are little-endian. Offsets are from the start of the file.
//!
//! ```text
//! 0        64       64+64n                                       4096·k        file_length
//! ┌────────┬────────┬─────────┬───┬──────────────┬───┬───────────┬───┬───────────────────┐
//! │ header │ section│ program │pad│ weight_table │pad│ executable│pad│ weights           │
//! │        │ table  │ (text)  │ 0 │              │ 0 │ `cpu` ... │ 0 │ (page-aligned)    │
//! └────────┴────────┴─────────┴───┴──────────────┴───┴───────────┴───┴───────────────────┘
//!
//! header (64 bytes)
//!   off size field
//!     0    8 magic                  "RAFTRFA\0"
//!     8    4 version                1
//!    12    4 flags                  0 (no flags are defined; set bits are rejected)
//!    16    4 section_count          n
//!    20    4 section_table_checksum CRC-32 of the n·64 table bytes
//!    24    8 section_table_offset   64 (≥ 64, multiple of 8)
//!    32    8 file_length            the exact length of the file
//!    40   20 reserved               zero
//!    60    4 header_checksum        CRC-32 of bytes 0..60
//!
//! section table entry (64 bytes each)
//!   off size field
//!     0    4 kind       1 program, 2 weight_table, 3 weights, 4 executable
//!     4    4 flags      0
//!     8   16 name       [a-z][a-z0-9_]{0,15}, zero-padded: `program`, `weight_table`,
//!                       `weights`, or the device of an executable (`cpu`, `vulkan`)
//!    24    8 offset     multiple of alignment
//!    32    8 length
//!    40    8 alignment  power of two ≤ 65536; ≥ 4096 for weights
//!    48    4 checksum   CRC-32 of the section's bytes
//!    52   12 reserved   zero
//!
//! program section: UTF-8 Program text (`rafter_ir::program_text`, weight-reference mode)
//!
//! weight_table section
//!     0    4 count
//!     4    4 weight_alignment (power of two, 64..=4096; this build writes 64)
//!   then per weight i, in program order (Program::weights[i]):
//!     0    4 dtype   1 f32, 2 f64, 3 f16, 4 bf16, 5 i8, 6 u8, 7 i16, 8 u16, 9 i32,
//!                    10 u32, 11 i64, 12 u64, 13 bool
//!     4    4 rank    ≤ 64
//!     8    8 offset  in the weights section; multiple of weight_alignment
//!    16    8 length  exactly size_of(dtype) · Π dims
//!    24  8·r dims
//!   Entries lie inside the weights section, in increasing offset order, without overlap.
//!
//! weights section: each weight's packed little-endian elements at its offset; zero between.
//!
//! executable section: the device's own bytes (its own magic and version inside; adding
//! a device needs no new container version, since executables were always one section
//! per device).
//! ```
//!
//! Exactly one program, weight_table and weights section; at most one executable per
//! device, and one for every device a kernel runs on. Sections and the table do not overlap
//! each other or the header, and every byte outside them is zero, so with checksums on
//! every single-byte change to a valid file is detected. Checksums are CRC-32 (IEEE,
//! `crc32fast`); they detect corruption, not tampering. The structure is validated
//! independently of them, so turning [`ReadOptions::verify_checksums`] off (fuzzing, or
//! skipping the pass over gigabytes of weights) never makes reading unsafe.
//!
//! A reader accepts exactly the versions in [`READABLE_VERSIONS`]; anything it does not
//! understand (unknown kinds, flags or dtype codes, non-zero reserved bytes) is an error,
//! not something to skip.

mod container;
mod error;
mod format;
mod program_io;
mod weights;

pub use container::{Container, ContainerWriter, Layout, SectionData, SectionInfo};
pub use error::ArtifactError;
pub use format::{
    SectionKind, HEADER_LEN, MAGIC, MIN_WEIGHT_ALIGN, READABLE_VERSIONS, VERSION,
    WEIGHTS_SECTION_ALIGN,
};
pub use weights::WeightEntry;

use bytes::Bytes;
use rafter_ir::program::{Port, Program};
use rafter_ir::{ConstData, Symbol};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How much a reader checks.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Verify the header, section-table and section checksums (default `true`). Off, the
    /// structure is still fully validated (no reads out of bounds), but corrupted bytes
    /// inside a section are not detected; fuzzing turns it off to reach the parsers.
    pub verify_checksums: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            verify_checksums: true,
        }
    }
}

/// A program's signature: its inputs and outputs (with symbolic dims) and the declared
/// bounds of its symbols.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Signature<'a> {
    pub inputs: &'a [Port],
    pub outputs: &'a [Port],
    pub bounds: &'a [(Symbol, i64)],
}

/// A validated artifact: its program (weights are slices of the file) and executables.
#[derive(Debug)]
pub struct Artifact {
    container: Container,
    program: Program,
    weights: Vec<WeightEntry>,
    executables: BTreeMap<String, Bytes>,
    metadata: BTreeMap<String, Bytes>,
    mapped: bool,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ArtifactError + '_ {
    move |source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Artifact {
    /// Memory-maps the file at `path` and validates it (checksums included).
    pub fn open(path: impl AsRef<Path>) -> Result<Artifact, ArtifactError> {
        Artifact::open_with(path, &ReadOptions::default())
    }

    pub fn open_with(
        path: impl AsRef<Path>,
        options: &ReadOptions,
    ) -> Result<Artifact, ArtifactError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(io_error(path))?;
        let len = file.metadata().map_err(io_error(path))?.len();
        let bytes = if len == 0 {
            Bytes::new()
        } else {
            // SAFETY: `Mmap::map` is unsafe because the mapped file may change underneath
            // the map. The invariant we rely on: the file is not truncated or rewritten in
            // place while an `Artifact` (or any `ConstData` sliced from it) is alive.
            // Truncation makes a later access to a page past the new end raise SIGBUS and
            // kill the process; an in-place rewrite changes bytes we already validated. We
            // accept this, as every mmap-based runtime does (ONNX Runtime, llama.cpp,
            // safetensors); `ArtifactWriter::write` replaces files by renaming a new file
            // over the old one, which leaves existing maps on the old, intact inode.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_error(path))?;
            Bytes::from_owner(map)
        };
        let mut a =
            Artifact::from_bytes_with(bytes, options).map_err(|e| ArtifactError::InFile {
                path: path.to_path_buf(),
                error: Box::new(e),
            })?;
        a.mapped = true;
        Ok(a)
    }

    /// Validates an artifact held in memory (checksums included). Weights are slices of
    /// `bytes`.
    pub fn from_bytes(bytes: Bytes) -> Result<Artifact, ArtifactError> {
        Artifact::from_bytes_with(bytes, &ReadOptions::default())
    }

    pub fn from_bytes_with(bytes: Bytes, options: &ReadOptions) -> Result<Artifact, ArtifactError> {
        let container = Container::parse(bytes, options)?;
        let section = |kind: SectionKind, name: &str| {
            container
                .section(kind, name)
                .expect("Container::parse checks that the required sections exist")
        };
        let weights_bytes = section(SectionKind::Weights, "weights");
        let table = weights::decode_table(
            &section(SectionKind::WeightTable, "weight_table"),
            weights_bytes.len() as u64,
        )?;
        let text_bytes = section(SectionKind::Program, "program");
        let text = std::str::from_utf8(&text_bytes).map_err(|e| {
            ArtifactError::malformed(
                "section program",
                format!("is not UTF-8 (byte {})", e.valid_up_to()),
            )
        })?;

        let mut resolved = vec![false; table.len()];
        let mut resolve = |index: usize, name: &str, dtype, dims: &[usize]| {
            let entry = table.get(index).ok_or_else(|| {
                format!(
                    "weight {index} `{name}` has no entry in the weight table ({} entries)",
                    table.len()
                )
            })?;
            if entry.dtype != dtype || entry.dims != dims {
                return Err(format!(
                    "weight {index} `{name}` is {dtype}{dims:?} in the program but {}{:?} in the weight table",
                    entry.dtype, entry.dims
                ));
            }
            if std::mem::replace(&mut resolved[index], true) {
                return Err(format!("weight {index} `{name}` is declared twice"));
            }
            // In bounds: `decode_table` checked every entry against the section.
            let start = entry.offset as usize;
            let bytes = weights_bytes.slice(start..start + entry.len as usize);
            ConstData::new(dtype, dims.to_vec(), bytes).map_err(|e| e.to_string())
        };
        let program = program_io::parse(text, &mut resolve).map_err(ArtifactError::Program)?;
        if program.weights.len() != table.len() {
            return Err(ArtifactError::Program(format!(
                "declares {} weights, the weight table has {}",
                program.weights.len(),
                table.len()
            )));
        }
        for (i, (w, e)) in program.weights.iter().zip(&table).enumerate() {
            if w.dtype != e.dtype || w.dims != e.dims || w.bytes.len() as u64 != e.len {
                return Err(ArtifactError::Program(format!(
                    "weight {i} is {}{:?} in the program but {}{:?} in the weight table",
                    w.dtype, w.dims, e.dtype, e.dims
                )));
            }
        }

        let mut executables = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for s in container.sections() {
            match s.kind {
                SectionKind::Executable => {
                    executables.insert(s.name.clone(), section(SectionKind::Executable, &s.name));
                }
                SectionKind::Metadata => {
                    metadata.insert(s.name.clone(), section(SectionKind::Metadata, &s.name));
                }
                _ => {}
            }
        }
        check_executables(&program, &executables).map_err(|e| match e {
            ArtifactError::Write(msg) => ArtifactError::Program(msg),
            e => e,
        })?;
        Ok(Artifact {
            container,
            program,
            weights: table,
            executables,
            metadata,
            mapped: false,
        })
    }

    /// The program; its weights are slices of the file (of the map, for [`Artifact::open`]).
    pub fn program(&self) -> &Program {
        &self.program
    }

    pub fn into_program(self) -> Program {
        self.program
    }

    pub fn signature(&self) -> Signature<'_> {
        Signature {
            inputs: &self.program.inputs,
            outputs: &self.program.outputs,
            bounds: &self.program.bounds,
        }
    }

    /// The executable for `device` (a slice of the file), if the artifact has one.
    pub fn executable(&self, device: &str) -> Option<Bytes> {
        self.executables.get(device).cloned()
    }

    /// The metadata section `name` (a slice of the file), if the artifact has one: data a
    /// frontend stored with the program (`llm`: an LLM's tokenizer and settings).
    pub fn metadata(&self, name: &str) -> Option<Bytes> {
        self.metadata.get(name).cloned()
    }

    /// The devices that have an executable, sorted.
    pub fn devices(&self) -> impl Iterator<Item = &str> {
        self.executables.keys().map(String::as_str)
    }

    /// The format version of the file.
    pub fn version(&self) -> u32 {
        self.container.version()
    }

    pub fn sections(&self) -> &[SectionInfo] {
        self.container.sections()
    }

    /// The weight table (offsets are inside the weights section).
    pub fn weight_entries(&self) -> &[WeightEntry] {
        &self.weights
    }

    /// The whole file.
    pub fn bytes(&self) -> &Bytes {
        self.container.bytes()
    }

    pub fn file_len(&self) -> u64 {
        self.container.bytes().len() as u64
    }

    /// Bytes of the weights section (weights plus alignment padding).
    pub fn weights_section_len(&self) -> u64 {
        self.section_len(SectionKind::Weights)
    }

    /// Bytes of the program text.
    pub fn program_text_len(&self) -> u64 {
        self.section_len(SectionKind::Program)
    }

    /// Bytes of all executable sections.
    pub fn executables_len(&self) -> u64 {
        self.executables.values().map(|b| b.len() as u64).sum()
    }

    fn section_len(&self, kind: SectionKind) -> u64 {
        self.sections()
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| s.len)
            .sum()
    }

    /// Whether the bytes are a memory map of the file ([`Artifact::open`]).
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }
}

/// Every device a kernel runs on has an executable section. What a section holds is its
/// device's business: its loader validates it against the program.
fn check_executables(
    program: &Program,
    executables: &BTreeMap<String, Bytes>,
) -> Result<(), ArtifactError> {
    for (i, k) in program.kernels.iter().enumerate() {
        if !executables.contains_key(&k.device) {
            return Err(ArtifactError::Write(format!(
                "kernel {i} `{}` runs on device `{}`, which has no executable section",
                k.name, k.device
            )));
        }
    }
    Ok(())
}

/// Writes a [`Program`] and its devices' executables as an artifact.
///
/// The program must verify, and every device a kernel runs on needs an executable section
/// (`rafter-compiler` emits them, through each device's compiler backend).
#[derive(Debug)]
pub struct ArtifactWriter<'p> {
    program: &'p Program,
    executables: BTreeMap<String, (Bytes, u64)>,
    metadata: BTreeMap<String, Bytes>,
}

/// Alignment of the program and weight-table sections.
const META_ALIGN: u64 = 8;

impl<'p> ArtifactWriter<'p> {
    pub fn new(program: &'p Program) -> ArtifactWriter<'p> {
        ArtifactWriter {
            program,
            executables: BTreeMap::new(),
            metadata: BTreeMap::new(),
        }
    }

    /// Adds (or replaces) `device`'s executable, placed at a multiple of `align` bytes (a
    /// power of two; 4 for a SPIR-V module, whose words are u32).
    pub fn executable(mut self, device: &str, code: impl Into<Bytes>, align: u64) -> Self {
        self.executables
            .insert(device.to_string(), (code.into(), align));
        self
    }

    /// Adds (or replaces) metadata section `name` (1-16 bytes of `[a-z0-9_]`): bytes a
    /// frontend keeps with the program, opaque to the artifact and the runtime.
    pub fn metadata(mut self, name: &str, bytes: impl Into<Bytes>) -> Self {
        self.metadata.insert(name.to_string(), bytes.into());
        self
    }

    /// Lays the artifact out (checking the program) without writing it.
    pub fn layout(&self) -> Result<Layout, ArtifactError> {
        let p = self.program;
        p.verify()
            .map_err(|e| ArtifactError::Write(e.to_string()))?;
        let executables = self.executables.clone();
        if let Some(bad) = self.metadata.keys().find(|d| !format::is_valid_name(d)) {
            return Err(ArtifactError::Write(format!(
                "metadata name `{bad}` is not 1-16 bytes of [a-z0-9_] starting with a letter"
            )));
        }
        if let Some(bad) = executables.keys().find(|d| !format::is_valid_name(d)) {
            return Err(ArtifactError::Write(format!(
                "device name `{bad}` is not 1-16 bytes of [a-z0-9_] starting with a letter"
            )));
        }
        let code: BTreeMap<String, Bytes> = executables
            .iter()
            .map(|(d, (b, _))| (d.clone(), b.clone()))
            .collect();
        check_executables(p, &code)?;

        // Weights: each at a multiple of 64 inside a page-aligned section.
        let mut data = SectionData::default();
        let mut offsets = Vec::with_capacity(p.weights.len());
        for (i, w) in p.weights.iter().enumerate() {
            ConstData::new(w.dtype, w.dims.clone(), w.bytes.clone())
                .map_err(|e| ArtifactError::Write(format!("weight {i}: {e}")))?;
            let off = format::align_up(data.len(), weights::WEIGHT_ALIGN)
                .ok_or_else(|| ArtifactError::Write("the weights exceed 2^64 bytes".into()))?;
            offsets.push(off);
            data.push_at(off, w.bytes.clone());
        }
        let table = weights::encode_table(&p.weights, &offsets, weights::WEIGHT_ALIGN);
        let text = program_io::print_reference(p);

        let mut w = ContainerWriter::new();
        w.add(
            SectionKind::Program,
            "program",
            META_ALIGN,
            SectionData::from_bytes(text.into_bytes()),
        )?;
        w.add(
            SectionKind::WeightTable,
            "weight_table",
            META_ALIGN,
            SectionData::from_bytes(table),
        )?;
        for (device, (b, align)) in executables {
            w.add(
                SectionKind::Executable,
                &device,
                align,
                SectionData::from_bytes(b),
            )?;
        }
        for (name, b) in &self.metadata {
            w.add(
                SectionKind::Metadata,
                name,
                META_ALIGN,
                SectionData::from_bytes(b.to_vec()),
            )?;
        }
        w.add(SectionKind::Weights, "weights", WEIGHTS_SECTION_ALIGN, data)?;
        w.layout()
    }

    pub fn to_vec(&self) -> Result<Vec<u8>, ArtifactError> {
        Ok(self.layout()?.to_vec())
    }

    /// Writes the artifact to `path` and returns its length. The file is written next to
    /// `path` and renamed over it, so a runtime that has the old file mapped keeps its
    /// (intact) pages.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<u64, ArtifactError> {
        use std::io::Write;
        let path = path.as_ref();
        let layout = self.layout()?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let result = (|| {
            let file = std::fs::File::create(&tmp)?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            layout.write_to(&mut out)?;
            out.flush()?;
            out.get_ref().sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(ArtifactError::Io {
                path: path.to_path_buf(),
                source: e,
            });
        }
        Ok(layout.file_len())
    }
}
