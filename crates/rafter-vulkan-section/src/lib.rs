//! The Vulkan device's executable section of an artifact: one SPIR-V module per kernel on
//! `vulkan`, with the launch rule and dim params the runtime dispatches it by.
//!
//! The contract between the two sides of the Vulkan backend: `rafter-codegen-spirv` (the
//! compiler) writes the section, `rafter-runtime-vulkan` (the runtime's loader) reads and
//! checks it ([`VulkanSection::decode`], [`VulkanSection::check`]), and both compute a
//! dispatch's params the same way ([`Launch::dispatch`], [`dim_params`]). The artifact
//! itself carries the section as opaque bytes. A deployed program needs no code
//! generator: this crate has no dependency but `bytes` and the IR.
//!
//! The section has its own magic and descriptor version, so its layout can change without
//! a new container version:
//!
//! ```text
//! offset size field
//!      0    8 magic "RFAVK\0\0\0"
//!      8    4 descriptor version (3; versions 1, without dim params, and 2, without
//!             variants, are still read)
//!     12    4 module count n
//!   then n modules, each starting on a 4-byte boundary:
//!      0    4 kernel index in Program::kernels (its device is `vulkan`)
//!      4    4 launch kind: 1 = elementwise (one u32 param, the element count of the
//!             kernel's first result; a 1-D grid of `workgroup_size` invocations per
//!             workgroup, grid-stride, so any grid size covers every element);
//!             2 = matmul, with the operands' positions and the tile in the upper bytes:
//!             bits 8..16 A's input index, 16..24 B's, bit 24 B shared (2-D), bits 25..
//!             log2 of the C tile side (see [`Launch::matmul_dispatch`]);
//!             3 = rows (version 2): bits 8..16 the lane's dims `l` ≥ 1; one workgroup per
//!             row of the first result (its dims but the last `l`), the element count as
//!             the one param ([`Launch::rows_dispatch`]);
//!             4 = convolution as an implicit GEMM: bits 8..16 the image's input index,
//!             16..24 the filter's, bits 25.. log2 of the tile (see
//!             [`Launch::conv_dispatch`]); 5 = a 2-D
//!             product with B transposed, bits as a convolution's for A and B
//!             ([`Launch::gemm_dispatch`])
//!      8    4 workgroup size (invocations per workgroup along x, ≥ 1)
//!     12    4 entry point name length e (1..=64 bytes of UTF-8)
//!     16    4 SPIR-V length s (a multiple of 4, ≥ 20: the module header)
//!     20    4 dim param count d (0..=16; absent in version 1, where it is 0)
//!     24    4 cooperative-matrix variant length v (a multiple of 4, 0 for none or ≥ 20;
//!             absent before version 3, where it is 0)
//!     28    e entry point name, then zero padding to a multiple of 4
//!      .  4 d dim params, each `binding | axis << 16` ([`DimParam`])
//!      .    s SPIR-V words, little-endian (first word 0x07230203)
//!      .    v the variant's SPIR-V words, little-endian
//! ```
//!
//! The variant (version 3) is the same kernel written with cooperative matrices, with the
//! same launch, entry point and dim params: the runtime loads it instead of the module
//! where the device offers what it needs (`VulkanModule::coop`).
//!
//! Dim params are how a kernel over symbolic dims learns their sizes: after its launch's
//! params (the element count, or matmul's `M, N, K, b_shared`) the runtime pushes, per dim
//! param, the call's size of that axis of that binding as a `u32` ([`dim_params`]).
//!
//! Modules are in increasing kernel order, at most one per kernel; every kernel whose
//! device is `vulkan` has one ([`VulkanSection::check`]).

#![warn(missing_docs)]

use bytes::Bytes;
use rafter_ir::program::Program;

/// Why a section is malformed or does not fit its program: `executable `vulkan`: ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("executable `{device}`: {msg}")]
pub struct SectionError {
    /// The device the section is for.
    pub device: String,
    /// What is wrong, naming the module, kernel or field.
    pub msg: String,
}

impl SectionError {
    fn new(msg: String) -> SectionError {
        SectionError {
            device: "vulkan".into(),
            msg,
        }
    }
}

/// The section's first eight bytes.
pub const VULKAN_MAGIC: [u8; 8] = *b"RFAVK\0\0\0";
/// The descriptor version this build writes (and the newest it reads).
pub const VULKAN_DESCRIPTOR_VERSION: u32 = 3;
/// The SPIR-V magic number, the first word of every module.
pub const SPIRV_MAGIC: u32 = 0x0723_0203;
const HEADER_LEN: usize = 16;
const MODULE_HEADER_LEN: usize = 28;
const MODULE_HEADER_LEN_V2: usize = 24;
const MODULE_HEADER_LEN_V1: usize = 20;
const MAX_ENTRY_LEN: usize = 64;
/// The most dim params one module takes (push-constant space: 128 bytes are guaranteed).
pub const MAX_DIM_PARAMS: usize = 16;

/// A size a kernel reads at dispatch time: axis `axis` of binding `binding` (the body's
/// inputs, then its outputs), pushed as a `u32` after the launch's own params.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DimParam {
    /// The binding: the body's inputs, then its outputs.
    pub binding: u16,
    /// The axis of that binding's dims.
    pub axis: u16,
}

/// The push-constant bytes of `dims` for a call whose bindings have `binding_dims` (in
/// binding order): each size as a little-endian `u32`. The one rule the runtime and the
/// compiler's tests share.
pub fn dim_params(dims: &[DimParam], binding_dims: &[&[usize]]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(4 * dims.len());
    for p in dims {
        let size = binding_dims
            .get(p.binding as usize)
            .and_then(|d| d.get(p.axis as usize))
            .ok_or_else(|| {
                format!(
                    "dim param: binding {} has no axis {} (bindings' dims {binding_dims:?})",
                    p.binding, p.axis
                )
            })?;
        let size =
            u32::try_from(*size).map_err(|_| format!("dim {size} does not fit in 32 bits"))?;
        out.extend_from_slice(&size.to_le_bytes());
    }
    Ok(out)
}

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
        /// A's body input.
        a: u8,
        /// B's body input.
        b: u8,
        /// B is 2-D, shared by every batch of A.
        b_shared: bool,
        /// The C tile's side.
        tile: u32,
    },
    /// An ungrouped 2-D convolution `Y[N, M, OH, OW]` of the image `x` (`[N, C, H, W]`) by
    /// the filter `w` (`[M, C, KH, KW]`), both body inputs, as the product of the filter
    /// and the image's im2col matrix per image, a `tile`×`tile` block of `Y[n]` as an
    /// `M × OH·OW` matrix per workgroup: params `M, OH·OW, C·KH·KW, 0` as `u32`s (the
    /// matmul kernel's), grid `[ceil(OH·OW / tile), ceil(M / tile), N]`
    /// ([`Launch::conv_dispatch`]). The window geometry is in the module.
    Conv {
        /// The image's body input.
        x: u8,
        /// The filter's body input.
        w: u8,
        /// The output tile's side.
        tile: u32,
    },
    /// A 2-D product with B stored transposed (ONNX `Gemm` with `transB`, a classifier's
    /// weight `[N, K]`): `C[M, N] = A[M, K] · B[N, K]ᵀ`, launched like [`Launch::Matmul`]
    /// with B shared (params `M, N, K, 1`, grid `[ceil(N / tile), ceil(M / tile), 1]`,
    /// [`Launch::gemm_dispatch`]).
    GemmTransB {
        /// A's body input.
        a: u8,
        /// B's body input (`[N, K]`).
        b: u8,
        /// The C tile's side.
        tile: u32,
    },
    /// One workgroup per row of the first result: a row is its last `lane_dims` dims (a
    /// softmax's or layer norm's lane), reduced cooperatively by the workgroup. The one
    /// `u32` param is the element count; grid `[min(rows, max_x), 1, 1]`, the kernel
    /// looping over rows grid-stride ([`Launch::rows_dispatch`]).
    Rows {
        /// How many trailing dims make a row.
        lane_dims: u8,
    },
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
                4 | (x as u32) << 8 | (w as u32) << 16 | tile.trailing_zeros() << 25
            }
            Launch::GemmTransB { a, b, tile } => {
                5 | (a as u32) << 8 | (b as u32) << 16 | tile.trailing_zeros() << 25
            }
            Launch::Rows { lane_dims } => 3 | (lane_dims as u32) << 8,
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
            3 => {
                let lane_dims = (code >> 8) as u8;
                (code >> 16 == 0 && lane_dims >= 1).then_some(Launch::Rows { lane_dims })
            }
            4 if code & (1 << 24) == 0 => {
                let log_tile = code >> 25;
                (4..=7).contains(&log_tile).then_some(Launch::Conv {
                    x: (code >> 8) as u8,
                    w: (code >> 16) as u8,
                    tile: 1 << log_tile,
                })
            }
            5 if code & (1 << 24) == 0 => {
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

    /// The params (before any dim params) and grid of one dispatch, for every launch kind:
    /// the one rule the runtime applies. `inputs` are the dims of the kernel's input
    /// bindings, `first_output` those of its first result, `workgroup_size` the module's,
    /// `max` the device's workgroup-count limits. `Ok(None)` when there is nothing to
    /// compute; an error names what does not fit.
    pub fn dispatch(
        self,
        inputs: &[&[usize]],
        first_output: &[usize],
        workgroup_size: u32,
        max: [u32; 3],
    ) -> Result<Option<MatmulDispatch>, String> {
        let input = |i: u8| {
            inputs.get(i as usize).copied().ok_or_else(|| {
                format!(
                    "the launch reads input {i}, but the kernel has {} inputs",
                    inputs.len()
                )
            })
        };
        match self {
            Launch::Elementwise => {
                let count = first_output
                    .iter()
                    .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
                    .filter(|&c| c <= i32::MAX as u64)
                    .ok_or_else(|| {
                        format!("{first_output:?} is more elements than one dispatch indexes")
                    })?;
                if count == 0 {
                    return Ok(None);
                }
                let groups = count
                    .div_ceil(workgroup_size.max(1) as u64)
                    .min(max[0].max(1) as u64) as u32;
                Ok(Some((
                    (count as u32).to_le_bytes().to_vec(),
                    [groups, 1, 1],
                )))
            }
            Launch::Rows { .. } => self.rows_dispatch(first_output, max[0]),
            Launch::Matmul { a, b, .. } => self.matmul_dispatch(input(a)?, input(b)?, max),
            Launch::GemmTransB { a, b, .. } => self.gemm_dispatch(input(a)?, input(b)?, max),
            Launch::Conv { w, .. } => self.conv_dispatch(first_output, input(w)?, max),
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
        // A 1-D convolution (3-D dims) is generated as the 2-D one with H = 1.
        let (n, m, oh, ow, wm, c, kh, kw) = match (y_dims, w_dims) {
            (&[n, m, oh, ow], &[wm, c, kh, kw]) => (n, m, oh, ow, wm, c, kh, kw),
            (&[n, m, ow], &[wm, c, kw]) => (n, m, 1, ow, wm, c, 1, kw),
            _ => {
                return Err(format!(
                    "convolution to {y_dims:?} by a filter {w_dims:?}: not 3- or 4-D"
                ))
            }
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

    /// For a rows launch: the params (the element count) and the grid for a first result
    /// of `dims`: one workgroup per row, at most `max_x` of them (the kernel loops over rows
    /// grid-stride). `Ok(None)` when the result is empty (nothing to dispatch).
    pub fn rows_dispatch(
        self,
        dims: &[usize],
        max_x: u32,
    ) -> Result<Option<MatmulDispatch>, String> {
        let Launch::Rows { lane_dims } = self else {
            return Err("not a rows launch".into());
        };
        let lane_dims = lane_dims as usize;
        if dims.len() < lane_dims {
            return Err(format!(
                "a rows launch over the last {lane_dims} dims of {dims:?}"
            ));
        }
        let count = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        let count = count
            .filter(|&c| c <= i32::MAX as u64)
            .ok_or_else(|| format!("{dims:?} is more elements than one dispatch indexes"))?;
        let rows: u64 = dims[..dims.len() - lane_dims]
            .iter()
            .map(|&d| d as u64)
            .product();
        if count == 0 {
            return Ok(None);
        }
        let grid = [rows.min(max_x.max(1) as u64) as u32, 1, 1];
        Ok(Some(((count as u32).to_le_bytes().to_vec(), grid)))
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
    /// How the runtime sizes its dispatch.
    pub launch: Launch,
    /// Invocations per workgroup along x.
    pub workgroup_size: u32,
    /// The `GLCompute` entry point's name.
    pub entry_point: String,
    /// Sizes pushed after the launch's params, in order.
    pub dims: Vec<DimParam>,
    /// The module's words as little-endian bytes.
    pub spirv: Bytes,
    /// The same kernel on cooperative matrices (`VK_KHR_cooperative_matrix`), to load
    /// instead of `spirv` where the device offers them; same launch, entry point and dim
    /// params. `None` for kernels without one (everything but f16 products today).
    pub coop: Option<Bytes>,
}

/// The decoded `vulkan` executable section.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VulkanSection {
    /// One module per kernel on the device, in increasing kernel order.
    pub modules: Vec<VulkanModule>,
}

impl VulkanSection {
    /// The section's bytes (the layout in the crate docs).
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
                m.dims.len() as u32,
                m.coop.as_ref().map_or(0, |c| c.len() as u32),
            ] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(m.entry_point.as_bytes());
            out.resize(out.len().next_multiple_of(4), 0);
            for d in &m.dims {
                let word = d.binding as u32 | (d.axis as u32) << 16;
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(&m.spirv);
            if let Some(coop) = &m.coop {
                out.extend_from_slice(coop);
            }
        }
        out
    }

    /// Decodes and validates a section; module bytes are slices of `b` (no copy).
    pub fn decode(b: &Bytes) -> Result<VulkanSection, SectionError> {
        let bad = SectionError::new;
        if b.len() < HEADER_LEN || b[..8] != VULKAN_MAGIC {
            return Err(bad(format!(
                "is {} bytes and does not start with the magic \"RFAVK\\0\\0\\0\"",
                b.len()
            )));
        }
        let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let version = word(8);
        if !(1..=VULKAN_DESCRIPTOR_VERSION).contains(&version) {
            return Err(bad(format!(
                "descriptor version {version} is not readable by this build (reads 1 to \
                 {VULKAN_DESCRIPTOR_VERSION})"
            )));
        }
        let header_len = match version {
            1 => MODULE_HEADER_LEN_V1,
            2 => MODULE_HEADER_LEN_V2,
            _ => MODULE_HEADER_LEN,
        };
        let count = word(12) as usize;
        let mut at = HEADER_LEN;
        let mut modules: Vec<VulkanModule> = Vec::new();
        for i in 0..count {
            let what = |msg: String| bad(format!("module {i}: {msg}"));
            if b.len() - at < header_len {
                return Err(what(format!("header at byte {at} runs past the end")));
            }
            let kernel = word(at);
            let launch = Launch::from_code(word(at + 4))
                .ok_or_else(|| what(format!("unknown launch kind {}", word(at + 4))))?;
            let workgroup_size = word(at + 8);
            let entry_len = word(at + 12) as usize;
            let spirv_len = word(at + 16) as usize;
            let dim_count = if version == 1 {
                0
            } else {
                word(at + 20) as usize
            };
            let coop_len = if version < 3 {
                0
            } else {
                word(at + 24) as usize
            };
            if dim_count > MAX_DIM_PARAMS {
                return Err(what(format!(
                    "{dim_count} dim params (at most {MAX_DIM_PARAMS})"
                )));
            }
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
            if coop_len % 4 != 0 || (coop_len > 0 && coop_len < 20) {
                return Err(what(format!(
                    "cooperative-matrix SPIR-V of {coop_len} bytes (0, or a multiple of 4 \
                     and at least 20)"
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
            let entry_start = at + header_len;
            let dims_start = entry_start + entry_len.next_multiple_of(4);
            let spirv_start = dims_start + 4 * dim_count;
            let spirv_end = spirv_start + spirv_len;
            let end = spirv_end
                .checked_add(coop_len)
                .filter(|&e| e <= b.len())
                .ok_or_else(|| what("runs past the end of the section".into()))?;
            let entry = std::str::from_utf8(&b[entry_start..entry_start + entry_len])
                .map_err(|_| what("entry point name is not UTF-8".into()))?;
            if b[entry_start + entry_len..dims_start]
                .iter()
                .any(|&x| x != 0)
            {
                return Err(what("non-zero padding after the entry point name".into()));
            }
            let dims = (0..dim_count)
                .map(|j| {
                    let w = word(dims_start + 4 * j);
                    DimParam {
                        binding: w as u16,
                        axis: (w >> 16) as u16,
                    }
                })
                .collect();
            for (start, which) in [(spirv_start, "SPIR-V"), (spirv_end, "its variant")] {
                if start < end && word(start) != SPIRV_MAGIC {
                    return Err(what(format!(
                        "{which} starts with {:#010x}, not the magic {SPIRV_MAGIC:#010x}",
                        word(start)
                    )));
                }
            }
            modules.push(VulkanModule {
                kernel,
                launch,
                workgroup_size,
                entry_point: entry.to_string(),
                dims,
                spirv: b.slice(spirv_start..spirv_end),
                coop: (coop_len > 0).then(|| b.slice(spirv_end..end)),
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

    /// Checks the section against `program`, whose kernels on `device` it holds: one module
    /// for each of them and for nothing else, and every dim param an axis of one of its
    /// kernel's bindings. The loader calls it before loading anything.
    pub fn check(&self, program: &Program, device: &str) -> Result<(), SectionError> {
        let bad = |msg: String| SectionError {
            device: device.to_string(),
            msg,
        };
        for m in &self.modules {
            let Some(k) = program
                .kernels
                .get(m.kernel as usize)
                .filter(|k| k.device == device)
            else {
                return Err(bad(format!(
                    "has a module for kernel {}, which is not a kernel on `{device}`",
                    m.kernel
                )));
            };
            let body = &k.body;
            for d in &m.dims {
                let value = body
                    .inputs
                    .iter()
                    .chain(&body.outputs)
                    .nth(d.binding as usize);
                if value.is_none_or(|&v| d.axis as usize >= body.value(v).ty.rank()) {
                    return Err(bad(format!(
                        "kernel {} `{}` reads axis {} of binding {}, which it does not have",
                        m.kernel, k.name, d.axis, d.binding
                    )));
                }
            }
        }
        for (i, k) in program.kernels.iter().enumerate() {
            if k.device == device && self.module(i).is_none() {
                return Err(bad(format!("has no module for kernel {i} `{}`", k.name)));
            }
        }
        Ok(())
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
            dims: if kernel % 2 == 0 {
                vec![
                    DimParam {
                        binding: 0,
                        axis: 1,
                    },
                    DimParam {
                        binding: 2,
                        axis: 0,
                    },
                ]
            } else {
                Vec::new()
            },
            spirv: spirv.clone().into(),
            coop: (kernel % 2 == 1).then(|| {
                let mut coop = spirv;
                coop.extend_from_slice(&[1u8; 8]);
                coop.into()
            }),
        }
    }

    #[test]
    fn cooperative_matrix_variants_round_trip_and_bad_ones_are_refused() {
        let section = VulkanSection {
            modules: vec![module(0), module(1), module(2), module(3)],
        };
        let bytes = section.encode();
        let back = VulkanSection::decode(&bytes.clone().into()).unwrap();
        assert_eq!(back, section);
        assert!(back.module(0).unwrap().coop.is_none());
        assert_eq!(back.module(1).unwrap().coop.as_ref().unwrap().len(), 28);
        // Module 0: header, "main", two dim params, 20 bytes of SPIR-V; module 1: header,
        // "main", its SPIR-V, then the variant.
        let module_1 = HEADER_LEN + MODULE_HEADER_LEN + 4 + 8 + 20;
        let variant = module_1 + MODULE_HEADER_LEN + 4 + 20;
        let mut bad = bytes.clone();
        bad[variant] ^= 1;
        let e = VulkanSection::decode(&bad.into()).unwrap_err().to_string();
        assert!(e.contains("module 1: its variant starts with"), "{e}");
        let mut short = bytes;
        short.truncate(variant + 4);
        let e = VulkanSection::decode(&short.into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("module 1: runs past the end"), "{e}");
    }

    #[test]
    fn dim_params_are_the_bindings_sizes_and_version_1_still_reads() {
        let dims = [
            DimParam {
                binding: 1,
                axis: 2,
            },
            DimParam {
                binding: 0,
                axis: 0,
            },
        ];
        let bytes = dim_params(&dims, &[&[3, 4], &[5, 6, 7]]).unwrap();
        assert_eq!(bytes, [7u32.to_le_bytes(), 3u32.to_le_bytes()].concat());
        let e = dim_params(&dims, &[&[3, 4]]).unwrap_err();
        assert!(e.contains("binding 1"), "{e}");
        let e = dim_params(&dims[1..], &[&[1 << 33]]).unwrap_err();
        assert!(e.contains("32 bits"), "{e}");
        // A version-1 section: 20-byte module headers, no dim params.
        let mut v1 = Vec::new();
        v1.extend_from_slice(&VULKAN_MAGIC);
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&1u32.to_le_bytes());
        for w in [3u32, 1, 64, 4, 20] {
            v1.extend_from_slice(&w.to_le_bytes());
        }
        v1.extend_from_slice(b"main");
        v1.extend_from_slice(&SPIRV_MAGIC.to_le_bytes());
        v1.extend_from_slice(&[0u8; 16]);
        let s = VulkanSection::decode(&v1.into()).unwrap();
        assert_eq!(s.modules.len(), 1);
        assert_eq!(s.modules[0].kernel, 3);
        assert!(s.modules[0].dims.is_empty());
        let mut too_many = module(0);
        too_many.dims = vec![dims[0]; MAX_DIM_PARAMS + 1];
        let bytes = VulkanSection {
            modules: vec![too_many],
        }
        .encode();
        assert!(VulkanSection::decode(&bytes.into())
            .unwrap_err()
            .to_string()
            .contains("dim params"));
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
        let rows = Launch::Rows { lane_dims: 2 };
        assert_eq!(Launch::from_code(rows.code()), Some(rows));
        assert_eq!(Launch::from_code(3), None, "a lane of no dims");
        let (params, grid) = rows.rows_dispatch(&[3, 5, 7, 8], 4).unwrap().unwrap();
        assert_eq!((params, grid), (840u32.to_le_bytes().to_vec(), [4, 1, 1]));
        assert_eq!(rows.rows_dispatch(&[3, 0, 8], 4).unwrap(), None);
        assert!(rows.rows_dispatch(&[8], 4).is_err());
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
    fn dispatch_covers_every_kind() {
        let max = [100, 65535, 65535];
        // Elementwise: ceil(1000 / 64) = 16 groups, capped at max[0].
        let (params, grid) = Launch::Elementwise
            .dispatch(&[], &[10, 100], 64, max)
            .unwrap()
            .unwrap();
        assert_eq!((params, grid), (1000u32.to_le_bytes().to_vec(), [16, 1, 1]));
        let (_, grid) = Launch::Elementwise
            .dispatch(&[], &[1 << 20], 64, max)
            .unwrap()
            .unwrap();
        assert_eq!(grid, [100, 1, 1]);
        assert_eq!(
            Launch::Elementwise.dispatch(&[], &[0, 5], 64, max),
            Ok(None)
        );
        let e = Launch::Elementwise
            .dispatch(&[], &[1 << 16, 1 << 16], 64, max)
            .unwrap_err();
        assert!(e.contains("more elements"), "{e}");
        // The other kinds read the operands the launch names.
        let mm = Launch::Matmul {
            a: 0,
            b: 1,
            b_shared: true,
            tile: 32,
        };
        assert_eq!(
            mm.dispatch(&[&[70, 48], &[48, 100]], &[70, 100], 256, max),
            mm.matmul_dispatch(&[70, 48], &[48, 100], max)
        );
        let e = mm.dispatch(&[&[70, 48]], &[70, 100], 256, max).unwrap_err();
        assert!(e.contains("reads input 1"), "{e}");
        let conv = Launch::Conv {
            x: 0,
            w: 1,
            tile: 16,
        };
        assert_eq!(
            conv.dispatch(&[&[1, 3, 9, 9], &[4, 3, 3, 3]], &[1, 4, 7, 7], 256, max),
            conv.conv_dispatch(&[1, 4, 7, 7], &[4, 3, 3, 3], max)
        );
        let rows = Launch::Rows { lane_dims: 1 };
        assert_eq!(
            rows.dispatch(&[&[6, 8]], &[6, 8], 128, max),
            rows.rows_dispatch(&[6, 8], max[0])
        );
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
            Launch::from_code(4 | 1 << 24 | 6 << 25),
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
        let spirv_at = HEADER_LEN + MODULE_HEADER_LEN + 4; // module 1: no dim params
        bad_magic[spirv_at] ^= 1;
        assert!(VulkanSection::decode(&bad_magic.into())
            .unwrap_err()
            .to_string()
            .contains("magic"));
    }

    /// A program of three kernels, the middle one on `vulkan` (one `f32[4]` input, one
    /// result).
    fn program() -> Program {
        use rafter_ir::program::{Kernel, KernelKind};
        use rafter_ir::{DType, Graph, Op, TensorType, UnaryOp};
        let kernel = |device: &str| {
            let ty = TensorType::known(DType::F32, &[4]);
            let mut g = Graph::new("k");
            let x = g.add_input("x", ty.clone());
            let y = g.add_node(
                "relu",
                Op::Unary { op: UnaryOp::Relu },
                vec![Some(x)],
                vec![Some(("y".into(), ty))],
            );
            g.outputs = vec![y[0].unwrap()];
            Kernel {
                name: format!("k_{device}"),
                kind: KernelKind::Elementwise,
                device: device.into(),
                body: g,
            }
        };
        Program {
            kernels: vec![kernel("cpu"), kernel("vulkan"), kernel("cpu")],
            ..Program::default()
        }
    }

    #[test]
    fn check_holds_the_section_to_its_program() {
        let p = program();
        let section = |kernel: u32, dims: Vec<DimParam>| VulkanSection {
            modules: vec![VulkanModule {
                dims,
                ..module(kernel)
            }],
        };
        section(1, Vec::new()).check(&p, "vulkan").unwrap();
        section(
            1,
            vec![DimParam {
                binding: 1,
                axis: 0,
            }],
        )
        .check(&p, "vulkan")
        .unwrap();
        // A module for a kernel not on `vulkan`, or none for one that is.
        for k in [0, 2] {
            let e = section(k, Vec::new()).check(&p, "vulkan").unwrap_err();
            assert!(e.to_string().starts_with("executable `vulkan`: "), "{e}");
        }
        let e = VulkanSection::default().check(&p, "vulkan").unwrap_err();
        assert!(e.msg.contains("no module for kernel 1 `k_vulkan`"), "{e}");
        // A dim param naming an axis or a binding the kernel does not have.
        for (binding, axis) in [(0, 1), (2, 0)] {
            let e = section(1, vec![DimParam { binding, axis }])
                .check(&p, "vulkan")
                .unwrap_err();
            assert!(e.msg.contains("does not have"), "{e}");
        }
    }
}
