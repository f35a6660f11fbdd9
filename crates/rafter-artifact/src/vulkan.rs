//! The Vulkan device's executable section: one SPIR-V module per kernel on `vulkan`.
//!
//! The compiler generates the SPIR-V (`rafter-codegen-spirv`) and the runtime only loads
//! it, so a deployed program needs no code generator. The section has its own magic and
//! descriptor version, like the `cpu` section, so its layout can change without a new
//! container version:
//!
//! ```text
//! offset size field
//!      0    8 magic "RFAVK\0\0\0"
//!      8    4 descriptor version (1)
//!     12    4 module count n
//!   then n modules, each starting on a 4-byte boundary:
//!      0    4 kernel index in Program::kernels (its device is `vulkan`)
//!      4    4 launch kind: 1 = elementwise (one u32 param, the element count of the
//!             kernel's first result; a 1-D grid of `workgroup_size` invocations per
//!             workgroup, grid-stride, so any grid size covers every element)
//!      8    4 workgroup size (invocations per workgroup along x, ≥ 1)
//!     12    4 entry point name length e (1..=64 bytes of UTF-8)
//!     16    4 SPIR-V length s (a multiple of 4, ≥ 20: the module header)
//!     20    e entry point name, then zero padding to a multiple of 4
//!      .    s SPIR-V words, little-endian (first word 0x07230203)
//! ```
//!
//! Modules are in increasing kernel order, at most one per kernel; the artifact reader
//! checks that every kernel whose device is `vulkan` has one (see `check_executables`).

use bytes::Bytes;

use crate::ArtifactError;

pub const VULKAN_MAGIC: [u8; 8] = *b"RFAVK\0\0\0";
pub const VULKAN_DESCRIPTOR_VERSION: u32 = 1;
/// The SPIR-V magic number, the first word of every module.
pub const SPIRV_MAGIC: u32 = 0x0723_0203;
const HEADER_LEN: usize = 16;
const MODULE_HEADER_LEN: usize = 20;
const MAX_ENTRY_LEN: usize = 64;

/// How the runtime launches a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// One `u32` push-constant param after the bindings' addresses: the element count of
    /// the kernel's first result; grid `[min(ceil(count / workgroup_size), max_x), 1, 1]`.
    Elementwise,
}

impl Launch {
    fn code(self) -> u32 {
        match self {
            Launch::Elementwise => 1,
        }
    }

    fn from_code(code: u32) -> Option<Launch> {
        match code {
            1 => Some(Launch::Elementwise),
            _ => None,
        }
    }
}

/// One kernel's SPIR-V module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VulkanModule {
    /// Index of the kernel in `Program::kernels`.
    pub kernel: u32,
    pub launch: Launch,
    pub workgroup_size: u32,
    pub entry_point: String,
    /// The module's words as little-endian bytes.
    pub spirv: Bytes,
}

/// The decoded `vulkan` executable section.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VulkanSection {
    pub modules: Vec<VulkanModule>,
}

const WHAT: &str = "executable `vulkan`";

impl VulkanSection {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&VULKAN_MAGIC);
        out.extend_from_slice(&VULKAN_DESCRIPTOR_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.modules.len() as u32).to_le_bytes());
        for m in &self.modules {
            for word in [
                m.kernel,
                m.launch.code(),
                m.workgroup_size,
                m.entry_point.len() as u32,
                m.spirv.len() as u32,
            ] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(m.entry_point.as_bytes());
            out.resize(out.len().next_multiple_of(4), 0);
            out.extend_from_slice(&m.spirv);
        }
        out
    }

    /// Decodes and validates a section; module bytes are slices of `b` (no copy).
    pub fn decode(b: &Bytes) -> Result<VulkanSection, ArtifactError> {
        let bad = |msg: String| ArtifactError::malformed(WHAT, msg);
        if b.len() < HEADER_LEN || b[..8] != VULKAN_MAGIC {
            return Err(bad(format!(
                "is {} bytes and does not start with the magic \"RFAVK\\0\\0\\0\"",
                b.len()
            )));
        }
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let version = word(8);
        if version != VULKAN_DESCRIPTOR_VERSION {
            return Err(bad(format!(
                "descriptor version {version} is not readable by this build (reads \
                 {VULKAN_DESCRIPTOR_VERSION})"
            )));
        }
        let count = word(12) as usize;
        let mut at = HEADER_LEN;
        let mut modules: Vec<VulkanModule> = Vec::new();
        for i in 0..count {
            let what = |msg: String| bad(format!("module {i}: {msg}"));
            if b.len() - at < MODULE_HEADER_LEN {
                return Err(what(format!("header at byte {at} runs past the end")));
            }
            let kernel = word(at);
            let launch = Launch::from_code(word(at + 4))
                .ok_or_else(|| what(format!("unknown launch kind {}", word(at + 4))))?;
            let workgroup_size = word(at + 8);
            let entry_len = word(at + 12) as usize;
            let spirv_len = word(at + 16) as usize;
            if workgroup_size == 0 {
                return Err(what("workgroup size 0".into()));
            }
            if entry_len == 0 || entry_len > MAX_ENTRY_LEN {
                return Err(what(format!(
                    "entry point name of {entry_len} bytes (1..={MAX_ENTRY_LEN})"
                )));
            }
            if spirv_len % 4 != 0 || spirv_len < 20 {
                return Err(what(format!(
                    "SPIR-V of {spirv_len} bytes (a multiple of 4, at least 20)"
                )));
            }
            if let Some(prev) = modules.last() {
                if prev.kernel >= kernel {
                    return Err(what(format!(
                        "kernel {kernel} follows kernel {} (modules are in increasing \
                         kernel order, one per kernel)",
                        prev.kernel
                    )));
                }
            }
            let entry_start = at + MODULE_HEADER_LEN;
            let spirv_start = entry_start + entry_len.next_multiple_of(4);
            let end = spirv_start
                .checked_add(spirv_len)
                .filter(|&e| e <= b.len())
                .ok_or_else(|| what("runs past the end of the section".into()))?;
            let entry = std::str::from_utf8(&b[entry_start..entry_start + entry_len])
                .map_err(|_| what("entry point name is not UTF-8".into()))?;
            if b[entry_start + entry_len..spirv_start]
                .iter()
                .any(|&x| x != 0)
            {
                return Err(what("non-zero padding after the entry point name".into()));
            }
            if word(spirv_start) != SPIRV_MAGIC {
                return Err(what(format!(
                    "SPIR-V starts with {:#010x}, not the magic {SPIRV_MAGIC:#010x}",
                    word(spirv_start)
                )));
            }
            modules.push(VulkanModule {
                kernel,
                launch,
                workgroup_size,
                entry_point: entry.to_string(),
                spirv: b.slice(spirv_start..end),
            });
            at = end;
        }
        if at != b.len() {
            return Err(bad(format!(
                "{} trailing bytes after the last module",
                b.len() - at
            )));
        }
        Ok(VulkanSection { modules })
    }

    /// The module of kernel `k`, if any.
    pub fn module(&self, k: usize) -> Option<&VulkanModule> {
        self.modules
            .binary_search_by_key(&k, |m| m.kernel as usize)
            .ok()
            .map(|i| &self.modules[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(kernel: u32) -> VulkanModule {
        let mut spirv = SPIRV_MAGIC.to_le_bytes().to_vec();
        spirv.extend_from_slice(&[0u8; 16]);
        VulkanModule {
            kernel,
            launch: Launch::Elementwise,
            workgroup_size: 64,
            entry_point: "main".into(),
            spirv: spirv.into(),
        }
    }

    #[test]
    fn round_trips_and_rejects_every_truncation_and_bad_fields() {
        let s = VulkanSection {
            modules: vec![module(1), module(4)],
        };
        let bytes = Bytes::from(s.encode());
        assert_eq!(VulkanSection::decode(&bytes).unwrap(), s);
        assert_eq!(s.module(4).unwrap().kernel, 4);
        assert!(s.module(2).is_none());
        for cut in 0..bytes.len() {
            assert!(
                VulkanSection::decode(&bytes.slice(..cut)).is_err(),
                "cut {cut}"
            );
        }
        let mut v = bytes.to_vec();
        v.push(0);
        assert!(VulkanSection::decode(&v.into())
            .unwrap_err()
            .to_string()
            .contains("trailing"));
        let out_of_order = VulkanSection {
            modules: vec![module(4), module(1)],
        };
        assert!(VulkanSection::decode(&out_of_order.encode().into())
            .unwrap_err()
            .to_string()
            .contains("increasing"));
        let mut bad_magic = bytes.to_vec();
        let spirv_at = HEADER_LEN + MODULE_HEADER_LEN + 4;
        bad_magic[spirv_at] ^= 1;
        assert!(VulkanSection::decode(&bad_magic.into())
            .unwrap_err()
            .to_string()
            .contains("magic"));
    }
}
