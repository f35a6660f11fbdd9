//! The CPU device's executable section.
//!
//! The CPU device runs the kernel bodies that the program itself carries (a generated or
//! interpreted implementation per kernel kind), so its executable is only a descriptor:
//!
//! ```text
//! offset size field
//!      0    8 magic "RFACPU\0\0"
//!      8    4 descriptor version (1)
//!     12    4 number of kernels whose device is `cpu`
//! ```
//!
//! A later CPU backend that emits machine code can bump the descriptor version and append
//! its code; other devices' sections (a `vulkan` SPIR-V module) are opaque to this crate.

use crate::ArtifactError;

pub const CPU_MAGIC: [u8; 8] = *b"RFACPU\0\0";
pub const CPU_DESCRIPTOR_VERSION: u32 = 1;
pub const CPU_DESCRIPTOR_LEN: usize = 16;

/// What the `cpu` executable section says (the layout is in the module docs above:
/// magic `RFACPU\0\0`, descriptor version 1, kernel count; 16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuDescriptor {
    pub kernels: u32,
}

impl CpuDescriptor {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CPU_DESCRIPTOR_LEN);
        out.extend_from_slice(&CPU_MAGIC);
        out.extend_from_slice(&CPU_DESCRIPTOR_VERSION.to_le_bytes());
        out.extend_from_slice(&self.kernels.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Result<CpuDescriptor, ArtifactError> {
        const WHAT: &str = "executable `cpu`";
        if b.len() != CPU_DESCRIPTOR_LEN {
            return Err(ArtifactError::malformed(
                WHAT,
                format!("is {} bytes, a descriptor is {CPU_DESCRIPTOR_LEN}", b.len()),
            ));
        }
        if b[..8] != CPU_MAGIC {
            return Err(ArtifactError::malformed(
                WHAT,
                format!("magic {:02x?} is not \"RFACPU\\0\\0\"", &b[..8]),
            ));
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != CPU_DESCRIPTOR_VERSION {
            return Err(ArtifactError::malformed(
                WHAT,
                format!(
                    "descriptor version {version} is not readable by this build (reads {CPU_DESCRIPTOR_VERSION})"
                ),
            ));
        }
        Ok(CpuDescriptor {
            kernels: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }
}
