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
//!             workgroup, grid-stride, so any grid size covers every element);
//!             2 = matmul, with the operands' positions and the tile in the upper bytes:
//!             bits 8..16 A's input index, 16..24 B's, bit 24 B shared (2-D), bits 25..
//!             log2 of the C tile side (see [`Launch::matmul_dispatch`]);
//!             3 = convolution as an implicit GEMM: bits 8..16 the image's input index,
//!             16..24 the filter's, bits 25.. log2 of the tile (see
//!             [`Launch::conv_dispatch`])
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

/// A matmul dispatch's push-constant params (after the addresses) and workgroup grid.
pub type MatmulDispatch = (Vec<u8>, [u32; 3]);

/// How the runtime launches a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// One `u32` push-constant param after the bindings' addresses: the element count of
    /// the kernel's first result; grid `[min(ceil(count / workgroup_size), max_x), 1, 1]`.
    Elementwise,
    /// A matrix product `C[batch.., M, N] = A[batch.., M, K] · B[(batch..,) K, N]` with A and B
    /// body inputs `a` and `b` (B 2-D and shared when `b_shared`), computing a `tile`×`tile`
    /// block of C per workgroup: params `M, N, K, b_shared` as `u32`s, grid
    /// `[ceil(N / tile), ceil(M / tile), batch]` ([`Launch::matmul_dispatch`]).
    Matmul {
        a: u8,
        b: u8,
        b_shared: bool,
        tile: u32,
    },
    /// An ungrouped 2-D convolution `Y[N, M, OH, OW]` of the image `x` (`[N, C, H, W]`) by
    /// the filter `w` (`[M, C, KH, KW]`), both body inputs, as the product of the filter
    /// and the image's im2col matrix per image, a `tile`×`tile` block of `Y[n]` as an
    /// `M × OH·OW` matrix per workgroup: params `M, OH·OW, C·KH·KW, 0` as `u32`s (the
    /// matmul kernel's), grid `[ceil(OH·OW / tile), ceil(M / tile), N]`
    /// ([`Launch::conv_dispatch`]). The window geometry is in the module.
    Conv { x: u8, w: u8, tile: u32 },
    /// A 2-D product with B stored transposed (ONNX `Gemm` with `transB`, a classifier's
    /// weight `[N, K]`): `C[M, N] = A[M, K] · B[N, K]ᵀ`, launched like [`Launch::Matmul`]
    /// with B shared (params `M, N, K, 1`, grid `[ceil(N / tile), ceil(M / tile), 1]`,
    /// [`Launch::gemm_dispatch`]).
    GemmTransB { a: u8, b: u8, tile: u32 },
}

impl Launch {
    fn code(self) -> u32 {
        match self {
            Launch::Elementwise => 1,
            Launch::Matmul {
                a,
                b,
                b_shared,
                tile,
            } => {
                2 | (a as u32) << 8
                    | (b as u32) << 16
                    | (b_shared as u32) << 24
                    | tile.trailing_zeros() << 25
            }
            Launch::Conv { x, w, tile } => {
                3 | (x as u32) << 8 | (w as u32) << 16 | tile.trailing_zeros() << 25
            }
            Launch::GemmTransB { a, b, tile } => {
                4 | (a as u32) << 8 | (b as u32) << 16 | tile.trailing_zeros() << 25
            }
        }
    }

    fn from_code(code: u32) -> Option<Launch> {
        match code & 0xFF {
            1 if code == 1 => Some(Launch::Elementwise),
            2 => {
                let log_tile = code >> 25;
                (4..=7).contains(&log_tile).then_some(Launch::Matmul {
                    a: (code >> 8) as u8,
                    b: (code >> 16) as u8,
                    b_shared: (code >> 24) & 1 == 1,
                    tile: 1 << log_tile,
                })
            }
            3 if code & (1 << 24) == 0 => {
                let log_tile = code >> 25;
                (4..=7).contains(&log_tile).then_some(Launch::Conv {
                    x: (code >> 8) as u8,
                    w: (code >> 16) as u8,
                    tile: 1 << log_tile,
                })
            }
            4 if code & (1 << 24) == 0 => {
                let log_tile = code >> 25;
                (4..=7).contains(&log_tile).then_some(Launch::GemmTransB {
                    a: (code >> 8) as u8,
                    b: (code >> 16) as u8,
                    tile: 1 << log_tile,
                })
            }
            _ => None,
        }
    }

    /// For a [`Launch::GemmTransB`]: the params and grid for A `[M, K]` and B `[N, K]`,
    /// checked like [`Launch::matmul_dispatch`]. `Ok(None)` when C is empty.
    pub fn gemm_dispatch(
        self,
        a_dims: &[usize],
        b_dims: &[usize],
        max: [u32; 3],
    ) -> Result<Option<MatmulDispatch>, String> {
        let Launch::GemmTransB { a, b, tile } = self else {
            return Err("not a transposed-B gemm launch".into());
        };
        let (&[m, k], &[n, kb]) = (a_dims, b_dims) else {
            return Err(format!("gemm of {a_dims:?} and {b_dims:?}: not 2-D"));
        };
        // The same checks and params as a matmul of A and Bᵀ with B shared.
        let plain = Launch::Matmul {
            a,
            b,
            b_shared: true,
            tile,
        };
        plain.matmul_dispatch(&[m, k], &[kb, n], max)
    }

    /// For a convolution launch: the params and the grid for an output `y_dims`
    /// (`[N, M, OH, OW]`) and a filter `w_dims` (`[M, C, KH, KW]`), checked (ranks, M
    /// agrees, sizes fit `u32`, the grid fits `max`). `Ok(None)` when Y is empty.
    pub fn conv_dispatch(
        self,
        y_dims: &[usize],
        w_dims: &[usize],
        max: [u32; 3],
    ) -> Result<Option<MatmulDispatch>, String> {
        let Launch::Conv { tile, .. } = self else {
            return Err("not a convolution launch".into());
        };
        let (&[n, m, oh, ow], &[wm, c, kh, kw]) = (y_dims, w_dims) else {
            return Err(format!(
                "convolution to {y_dims:?} by a filter {w_dims:?}: not 4-D"
            ));
        };
        if m != wm {
            return Err(format!(
                "convolution to {y_dims:?} by a filter {w_dims:?}: {m} and {wm} channels"
            ));
        }
        let small = |v: usize| {
            u32::try_from(v).map_err(|_| format!("convolution size {v} does not fit in 32 bits"))
        };
        let (n, m) = (small(n)?, small(m)?);
        let (p, k) = (small(oh * ow)?, small(c * kh * kw)?);
        if n == 0 || m == 0 || p == 0 {
            return Ok(None);
        }
        let grid = [p.div_ceil(tile), m.div_ceil(tile), n];
        if grid.iter().zip(max).any(|(&g, lim)| g > lim) {
            return Err(format!(
                "convolution grid {grid:?} exceeds the device's workgroup counts {max:?}"
            ));
        }
        let params = [m, p, k, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(Some((params, grid)))
    }

    /// For a matmul launch: the params and the grid for operands of `a_dims` and `b_dims`,
    /// checked (inner dims agree, B's batch dims are A's or B is 2-D as generated, sizes fit
    /// `u32`, the grid fits `max`). `Ok(None)` when C is empty (nothing to dispatch).
    pub fn matmul_dispatch(
        self,
        a_dims: &[usize],
        b_dims: &[usize],
        max: [u32; 3],
    ) -> Result<Option<MatmulDispatch>, String> {
        let Launch::Matmul { b_shared, tile, .. } = self else {
            return Err("not a matmul launch".into());
        };
        let (ra, rb) = (a_dims.len(), b_dims.len());
        if ra < 2 || rb < 2 {
            return Err(format!(
                "matmul of {a_dims:?} and {b_dims:?}: ranks below 2"
            ));
        }
        let (m, k) = (a_dims[ra - 2], a_dims[ra - 1]);
        let (kb, n) = (b_dims[rb - 2], b_dims[rb - 1]);
        if k != kb {
            return Err(format!(
                "matmul of {a_dims:?} and {b_dims:?}: inner dims {k} and {kb} differ"
            ));
        }
        if b_shared != (rb == 2) || (rb > 2 && b_dims[..rb - 2] != a_dims[..ra - 2]) {
            return Err(format!(
                "matmul of {a_dims:?} and {b_dims:?}: the kernel was generated for {}",
                if b_shared {
                    "a 2-D B"
                } else {
                    "B with A's batch dims"
                }
            ));
        }
        let batch: usize = a_dims[..ra - 2].iter().product();
        let small = |v: usize| {
            u32::try_from(v).map_err(|_| format!("matmul size {v} does not fit in 32 bits"))
        };
        let (batch, m, n, k) = (small(batch)?, small(m)?, small(n)?, small(k)?);
        if batch == 0 || m == 0 || n == 0 {
            return Ok(None);
        }
        let grid = [n.div_ceil(tile), m.div_ceil(tile), batch];
        if grid.iter().zip(max).any(|(&g, lim)| g > lim) {
            return Err(format!(
                "matmul grid {grid:?} exceeds the device's workgroup counts {max:?}"
            ));
        }
        let params = [m, n, k, b_shared as u32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        Ok(Some((params, grid)))
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
    fn matmul_launches_round_trip_and_dispatch() {
        let l = Launch::Matmul {
            a: 0,
            b: 3,
            b_shared: true,
            tile: 32,
        };
        assert_eq!(Launch::from_code(l.code()), Some(l));
        assert_eq!(
            Launch::from_code(2 | 3 << 25),
            None,
            "a tile of 8 is not generated"
        );
        assert_eq!(Launch::from_code(1 | 1 << 8), None);
        let max = [65535; 3];
        // [2, 70, 48] x [48, 100]: 4 x 3 tiles of 32, 2 batch entries.
        let (params, grid) = l
            .matmul_dispatch(&[2, 70, 48], &[48, 100], max)
            .unwrap()
            .unwrap();
        assert_eq!(grid, [4, 3, 2]);
        let words: Vec<u32> = params
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(words, [70, 100, 48, 1]);
        assert_eq!(
            l.matmul_dispatch(&[0, 70, 48], &[48, 100], max).unwrap(),
            None
        );
        let e = l.matmul_dispatch(&[70, 48], &[47, 100], max).unwrap_err();
        assert!(e.contains("inner dims"), "{e}");
        let e = l
            .matmul_dispatch(&[2, 70, 48], &[2, 48, 100], max)
            .unwrap_err();
        assert!(e.contains("2-D B"), "{e}");
        let e = l
            .matmul_dispatch(&[1, 70_000, 48], &[48, 100], [65535, 1000, 1])
            .unwrap_err();
        assert!(e.contains("exceeds"), "{e}");
        assert!(Launch::Elementwise
            .matmul_dispatch(&[1, 1], &[1, 1], max)
            .is_err());
    }

    #[test]
    fn conv_launch_codes_and_dispatch() {
        let l = Launch::Conv {
            x: 0,
            w: 1,
            tile: 64,
        };
        assert_eq!(Launch::from_code(l.code()), Some(l));
        assert_eq!(
            Launch::from_code(3 | 1 << 24 | 6 << 25),
            None,
            "bit 24 is not a conv's"
        );
        let max = [65535; 3];
        // Y [2, 100, 10, 13] by W [100, 3, 7, 7]: 130 pixels (3 tiles) x 100 channels (2).
        let (params, grid) = l
            .conv_dispatch(&[2, 100, 10, 13], &[100, 3, 7, 7], max)
            .unwrap()
            .unwrap();
        assert_eq!(grid, [3, 2, 2]);
        let words: Vec<u32> = params
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(words, [100, 130, 147, 0]);
        assert_eq!(
            l.conv_dispatch(&[0, 100, 10, 13], &[100, 3, 7, 7], max)
                .unwrap(),
            None
        );
        let e = l
            .conv_dispatch(&[1, 99, 10, 13], &[100, 3, 7, 7], max)
            .unwrap_err();
        assert!(e.contains("channels"), "{e}");
        let e = l
            .conv_dispatch(&[1, 100, 130], &[100, 3, 7, 7], max)
            .unwrap_err();
        assert!(e.contains("4-D"), "{e}");
        assert!(Launch::Elementwise
            .conv_dispatch(&[1; 4], &[1; 4], max)
            .is_err());
        let g = Launch::GemmTransB {
            a: 0,
            b: 1,
            tile: 32,
        };
        assert_eq!(Launch::from_code(g.code()), Some(g));
        // A [1, 2048] by B [1000, 2048]: 32 column tiles, one row tile.
        let (params, grid) = g
            .gemm_dispatch(&[1, 2048], &[1000, 2048], max)
            .unwrap()
            .unwrap();
        assert_eq!(grid, [32, 1, 1]);
        assert_eq!(&params[..4], &1u32.to_le_bytes());
        let e = g.gemm_dispatch(&[1, 2048], &[1000, 2047], max).unwrap_err();
        assert!(e.contains("inner dims"), "{e}");
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
