//! The CPU's executable section of an artifact: a descriptor.
//!
//! The CPU runs the kernel bodies the program itself carries (native kernels, or the
//! interpreter), so its section is only a descriptor:
//!
//! ```text
//! offset size field
//!      0    8 magic "RFACPU\0\0"
//!      8    4 descriptor version (1)
//!     12    4 number of kernels whose device is `cpu`
//! ```
//!
//! It lives here because both sides of the CPU backend depend on this crate, as they do
//! for the packed-weight layouts: the compiler's CPU backend (`rafter-opt`) writes it, the
//! CPU's executable loader (`rafter-runtime-cpu`) checks it; the artifact carries it as
//! opaque bytes. A later CPU backend that emits machine code can bump the descriptor
//! version and append its code.

/// The descriptor's first eight bytes.
pub const CPU_MAGIC: [u8; 8] = *b"RFACPU\0\0";
/// The descriptor version this build writes and reads.
pub const CPU_DESCRIPTOR_VERSION: u32 = 1;
/// The descriptor's length in bytes.
pub const CPU_DESCRIPTOR_LEN: usize = 16;

/// What the `cpu` executable section says (the layout is in the module docs above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuDescriptor {
    /// How many of the program's kernels run on the device.
    pub kernels: u32,
}

/// Why a `cpu` section is malformed: `executable `cpu`: ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("executable `{device}`: {msg}")]
pub struct CpuSectionError {
    /// The device the section is for.
    pub device: String,
    /// What is wrong.
    pub msg: String,
}

impl CpuDescriptor {
    /// The section's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CPU_DESCRIPTOR_LEN);
        out.extend_from_slice(&CPU_MAGIC);
        out.extend_from_slice(&CPU_DESCRIPTOR_VERSION.to_le_bytes());
        out.extend_from_slice(&self.kernels.to_le_bytes());
        out
    }

    /// Reads the section of device `device` (for errors), checking its length, magic and
    /// version.
    pub fn decode(b: &[u8], device: &str) -> Result<CpuDescriptor, CpuSectionError> {
        let bad = |msg: String| CpuSectionError {
            device: device.to_string(),
            msg,
        };
        if b.len() != CPU_DESCRIPTOR_LEN {
            return Err(bad(format!(
                "is {} bytes, a descriptor is {CPU_DESCRIPTOR_LEN}",
                b.len()
            )));
        }
        if b[..8] != CPU_MAGIC {
            return Err(bad(format!(
                "magic {:02x?} is not \"RFACPU\\0\\0\"",
                &b[..8]
            )));
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != CPU_DESCRIPTOR_VERSION {
            return Err(bad(format!(
                "descriptor version {version} is not readable by this build (reads \
                 {CPU_DESCRIPTOR_VERSION})"
            )));
        }
        Ok(CpuDescriptor {
            kernels: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_bad_bytes() {
        let d = CpuDescriptor { kernels: 98 };
        let bytes = d.encode();
        assert_eq!(bytes.len(), CPU_DESCRIPTOR_LEN);
        assert_eq!(CpuDescriptor::decode(&bytes, "cpu").unwrap(), d);
        for cut in 0..bytes.len() {
            let e = CpuDescriptor::decode(&bytes[..cut], "cpu").unwrap_err();
            assert!(e.to_string().starts_with("executable `cpu`: is"), "{e}");
        }
        let mut magic = bytes.clone();
        magic[0] ^= 1;
        assert!(CpuDescriptor::decode(&magic, "cpu")
            .unwrap_err()
            .msg
            .contains("magic"));
        let mut version = bytes;
        version[8] = 2;
        let e = CpuDescriptor::decode(&version, "cpu2").unwrap_err();
        assert!(
            e.to_string()
                .contains("executable `cpu2`: descriptor version 2"),
            "{e}"
        );
    }
}
