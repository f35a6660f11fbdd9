//! Micro-kernels: one MR x NR tile of C per call, and the ISA dispatch that picks them.
//!
//! Every kernel reads the same operand layouts, so packing code and [`crate::PackedB`] are
//! shared by all of them:
//! - B: panels of [`PANEL`] columns; element `(p, j)` of the tile's B is at
//!   `b + (j / PANEL) * b_ps + p * PANEL + j % PANEL`. Panels are zero-padded past N, so a
//!   kernel may always read whole panels (but must not read a panel past the last one).
//! - A, packed: element `(r, p)` at `a + p * MR + r`, zero-padded past M.
//! - A, direct (small M, row-major A, no packing): element `(r, p)` at `a + r * a_rs + p`;
//!   rows past `mv` do not exist and must not be read, so kernels are instantiated per row
//!   count.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::Activation;

pub(crate) mod scalar;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;

/// Width of a packed B panel, in f32 columns: one AVX-512 vector, two AVX2 vectors, four NEON
/// vectors. Fixed across ISAs so that weights packed at compile time run on every kernel.
pub(crate) const PANEL: usize = 16;

/// The instruction set a GEMM runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, no intrinsics: the fallback on every target, and the path tests hold
    /// to the reference everywhere.
    Scalar,
    /// x86-64 AVX2 + FMA (and F16C, which every AVX2 CPU has): a 6x16 tile (12 ymm
    /// accumulators).
    Avx2,
    /// x86-64 AVX-512F: a 12x32 tile (24 zmm accumulators).
    Avx512,
    /// aarch64 NEON (Advanced SIMD, always present on aarch64): a 4x16 tile.
    Neon,
}

impl Isa {
    /// The fastest kernel this CPU supports, or the one the environment variable
    /// `RAFTER_CPU_ISA` names (`avx512`, `avx2`, `neon`, `scalar`) when this CPU has it: the
    /// way to run a slower ISA's kernels on a faster machine, e.g. to measure the AVX2 path
    /// on an AVX-512 host. Detected once per process, then cached; a name that is unknown
    /// or not available here is reported on stderr once and ignored.
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let best = Isa::all()
                .iter()
                .copied()
                .find(|isa| *isa != Isa::Scalar && isa.is_available())
                .unwrap_or(Isa::Scalar);
            let Ok(name) = std::env::var("RAFTER_CPU_ISA") else {
                return best;
            };
            match Isa::named(&name) {
                Some(isa) if isa.is_available() => isa,
                _ => {
                    let here: Vec<&str> = Isa::all()
                        .iter()
                        .filter(|i| i.is_available())
                        .map(|i| i.name())
                        .collect();
                    eprintln!(
                        "rafter: RAFTER_CPU_ISA={name} is not a kernel set this CPU runs ({}); \
                         using {}",
                        here.join(", "),
                        best.name()
                    );
                    best
                }
            }
        })
    }

    /// The ISA's name as `RAFTER_CPU_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// The ISA named `name` (as [`Isa::name`] spells it, any case).
    pub fn named(name: &str) -> Option<Isa> {
        Isa::all()
            .iter()
            .copied()
            .find(|i| i.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Every kernel compiled into this build, fastest first.
    pub fn all() -> &'static [Isa] {
        &[Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Scalar]
    }

    /// Whether this CPU can run the kernel (checked at run time, not at compile time, so one
    /// binary serves every CPU of an architecture).
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Tile and cache-block sizes of this kernel.
    pub(crate) fn blocking(self) -> Blocking {
        let b = self.blocking_default();
        let get = |o: &AtomicUsize, d: usize| match o.load(Ordering::Relaxed) {
            0 => d,
            v => v,
        };
        Blocking {
            mc: get(&BLOCKING_OVERRIDE[0], b.mc).div_ceil(b.mr) * b.mr,
            kc: get(&BLOCKING_OVERRIDE[1], b.kc),
            nc: get(&BLOCKING_OVERRIDE[2], b.nc).div_ceil(b.nr) * b.nr,
            ..b
        }
    }

    pub(crate) fn blocking_default(self) -> Blocking {
        match self {
            // Chosen by measurement (`benches/gemm.rs --tune`, best of 21 alternating
            // rounds, on the ResNet-50 and BERT shapes): the differences between candidates
            // were within 5%, so these favour fewer passes over C (larger KC). A is read in
            // place when row-major, so MC only sets how many rows share a sweep of B.
            // KC = 384: the 6x16 kernel's B micro-panel (24 KiB) fits a 32 KiB L1d (Zen 3).
            // NC: a KC x NC block of B (4.5 MiB) stays in L3.
            Isa::Avx2 => Blocking {
                mr: 6,
                nr: 16,
                mc: 144,
                kc: 384,
                nc: 3072,
            },
            // KC = 512: the B micro-panel (2 x 32 KiB) streams from L2 while A's 12 rows stay
            // in L1; 5% faster than KC = 256 on the large shapes here.
            Isa::Avx512 => Blocking {
                mr: 12,
                nr: 32,
                mc: 96,
                kc: 512,
                nc: 3072,
            },
            Isa::Neon => Blocking {
                mr: 4,
                nr: 16,
                mc: 128,
                kc: 256,
                nc: 3072,
            },
            Isa::Scalar => Blocking {
                mr: 4,
                nr: 16,
                mc: 128,
                kc: 256,
                nc: 3072,
            },
        }
    }

    /// Computes one tile.
    ///
    /// # Safety
    /// `t` must satisfy the layout contract of this module: `kc` rows of A and B readable as
    /// described (A with `mv` rows when `packed_a` is false, `MR` packed rows otherwise; B with
    /// `ceil(nv / PANEL)` panels), C writable for `mv x nv` at `ldc`, and the epilogue's
    /// pointers (when present) readable for the same `mv x nv` region. `self` must be
    /// available on this CPU.
    #[inline]
    pub(crate) unsafe fn tile(self, t: &Tile, packed_a: bool) {
        match self {
            // SAFETY: forwarded contract; the ISA was checked by `sgemm_with_isa`.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2::tile(t, packed_a) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as the comment over the match says, for this arm too.
            Isa::Avx512 => unsafe { avx512::tile(t, packed_a) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as the comment over the match says, for this arm too.
            Isa::Neon => unsafe { neon::tile(t, packed_a) },
            // SAFETY: forwarded contract.
            _ => unsafe { scalar::tile(t, packed_a, self.blocking().mr) },
        }
    }
}

/// Cache-block sizes (MC, KC, NC) that replace every kernel's defaults when non-zero: a
/// tuning aid for the bench, which alternates candidates within one run.
/// The fourth entry overrides how row-major A is read: 1 packs it, 2 reads it in place; the
/// fifth turns B prefetching off (1); the sixth forces tasks per thread (1 or 4); the
/// seventh turns the driver's few-row partition off (1).
pub(crate) static BLOCKING_OVERRIDE: [AtomicUsize; 7] = [
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
];

/// Register tile (`mr x nr`) and cache blocks (`mc`, `kc`, `nc`) of a kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocking {
    pub mr: usize,
    pub nr: usize,
    pub mc: usize,
    pub kc: usize,
    pub nc: usize,
}

/// The epilogue of one tile, as raw pointers already offset to the tile's origin.
#[derive(Clone, Copy)]
pub(crate) struct TileEpilogue {
    /// `bias[j]` for the tile's column `j`, or null.
    pub bias: *const f32,
    /// `row_bias[i]` for the tile's row `i`, or null.
    pub row_bias: *const f32,
    pub act: Activation,
    /// `residual[i * res_ld + j]`, or null.
    pub res: *const f32,
    pub res_ld: usize,
    pub res_before: bool,
    /// Clamp to `[lo, hi]` last (`x.max(lo).min(hi)`).
    pub clamp: Option<(f32, f32)>,
}

impl TileEpilogue {
    /// Epilogue `e` (checked against C's shape) offset to the tile whose origin is C's row
    /// `i`, column `j`.
    pub(crate) fn at(e: &crate::Epilogue<'_>, i: usize, j: usize) -> TileEpilogue {
        TileEpilogue {
            bias: e.bias.map_or(std::ptr::null(), |b| b[j..].as_ptr()),
            row_bias: e.row_bias.map_or(std::ptr::null(), |b| b[i..].as_ptr()),
            act: e.activation,
            res: e
                .residual
                .map_or(std::ptr::null(), |r| r.data[i * r.ld + j..].as_ptr()),
            res_ld: e.residual.map_or(0, |r| r.ld),
            res_before: e.residual.is_some_and(|r| r.before_activation),
            clamp: e.clamp,
        }
    }
}

/// One micro-kernel call. See the module docs for the layouts.
pub(crate) struct Tile {
    pub kc: usize,
    pub a: *const f32,
    /// Row stride of direct (unpacked) A; unused when A is packed.
    pub a_rs: usize,
    pub b: *const f32,
    /// Distance between consecutive B panels, in f32s.
    #[cfg_attr(
        not(target_arch = "x86_64"),
        expect(dead_code, reason = "x86 kernels only")
    )]
    pub b_ps: usize,
    /// Non-zero: this tile's B comes from memory and nothing prefetched it (a task's first
    /// pre-packed micro-panel), so the kernel prefetches each of its B panels this many
    /// floats ahead of its k loop.
    #[cfg_attr(
        not(target_arch = "x86_64"),
        expect(dead_code, reason = "x86 kernels only")
    )]
    pub b_prefetch: usize,
    /// `pf_lines` rows of one B panel from `pf_next` (16 floats, one cache line, each) that
    /// a later tile will read from memory: the kernel prefetches them into L2, one every
    /// other k step, so the next weight block's trip from memory overlaps this tile's
    /// compute instead of stalling the tile that reads it first. Null/0: none.
    /// Kernels without prefetching ignore both fields (they are hints: the addresses may lie
    /// past B's end and are never dereferenced).
    #[cfg_attr(
        not(target_arch = "x86_64"),
        expect(dead_code, reason = "x86 kernels only")
    )]
    pub pf_next: *const f32,
    #[cfg_attr(
        not(target_arch = "x86_64"),
        expect(dead_code, reason = "x86 kernels only")
    )]
    pub pf_lines: usize,
    pub c: *mut f32,
    pub ldc: usize,
    /// Valid rows (`1..=MR`) and columns (`1..=NR`) of the tile.
    pub mv: usize,
    pub nv: usize,
    pub alpha: f32,
    /// `0.0`: C is not read.
    pub beta: f32,
    /// Applied after the last K block only.
    pub epi: Option<TileEpilogue>,
}

impl Tile {
    /// The tile's epilogue when it is only a per-column bias, ReLU and a clamp on `AB`
    /// (alpha 1, beta 0): a convolution's, which the kernels finish on a fast path (the bias
    /// loaded once per tile, nothing tested per vector).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn column_epilogue(&self) -> Option<&TileEpilogue> {
        self.epi.as_ref().filter(|e| {
            self.alpha == 1.0
                && self.beta == 0.0
                && e.row_bias.is_null()
                && e.res.is_null()
                && matches!(e.act, crate::Activation::None | crate::Activation::Relu)
        })
    }
}

/// The scalar epilogue of one element, shared by the scalar kernel and vector kernels'
/// reference tests: `act(x + bias (+ r)) (+ r)`.
#[inline]
pub(crate) fn epilogue_scalar(mut x: f32, bias: f32, act: Activation, r: f32, before: bool) -> f32 {
    x += bias;
    if before {
        x += r;
    }
    x = match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::GeluTanh => gelu_tanh(x),
    };
    if !before {
        x += r;
    }
    x
}

/// GELU, tanh approximation, as `x * sigmoid(2u)` (the same identity the vector kernels use).
#[inline]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const S: f32 = 0.797_884_6; // sqrt(2/pi)
    let u = S * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * u).exp())
}
