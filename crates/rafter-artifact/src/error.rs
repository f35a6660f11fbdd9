//! What can be wrong with an artifact, naming the section, field and value concerned.

use std::path::PathBuf;

/// Why an artifact could not be read or written.
///
/// Every check the reader makes has a variant or a message here: the reader never panics
/// and never reads out of bounds, whatever the bytes.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The file could not be opened, mapped, created or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The first eight bytes are not `RAFTRFA\0`.
    #[error("not a rafter artifact (the file starts with {found:02x?}, an artifact with \"RAFTRFA\\0\")")]
    NotAnArtifact { found: Vec<u8> },
    /// A format version this build cannot read.
    #[error("version {found} is not readable by this build (reads version {reads})")]
    UnsupportedVersion { found: u32, reads: u32 },
    /// The file ends before something it declares.
    #[error("truncated: {what} needs {needed} bytes, the file has {actual}")]
    Truncated {
        what: String,
        needed: u64,
        actual: u64,
    },
    /// A stored checksum does not match the bytes it covers.
    #[error("{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        what: String,
        stored: u32,
        computed: u32,
    },
    /// A field has a value the format does not allow (out of range, overlapping, misaligned,
    /// inconsistent with another field).
    #[error("{what}: {msg}")]
    Malformed { what: String, msg: String },
    /// The program text does not parse, or the parsed program does not verify, or it does not
    /// agree with the weight table or the executables.
    #[error("program: {0}")]
    Program(String),
    /// A program or executable that cannot be written into an artifact.
    #[error("cannot write an artifact: {0}")]
    Write(String),
    /// An error in the file at `path`.
    #[error("{path}: {error}")]
    InFile {
        path: PathBuf,
        error: Box<ArtifactError>,
    },
}

impl ArtifactError {
    /// The error without the file it was found in.
    pub fn root(&self) -> &ArtifactError {
        match self {
            ArtifactError::InFile { error, .. } => error.root(),
            e => e,
        }
    }

    pub(crate) fn malformed(what: impl Into<String>, msg: impl Into<String>) -> ArtifactError {
        ArtifactError::Malformed {
            what: what.into(),
            msg: msg.into(),
        }
    }
}
