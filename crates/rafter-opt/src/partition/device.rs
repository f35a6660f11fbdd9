//! Device descriptions: what the partitioner knows of a device, the same type for every
//! kind of device (the host CPU, a Vulkan GPU, a simulated accelerator in tests, an NPU
//! later).
//!
//! A [`DeviceDescription`] holds a device's [`CostProfile`] (achieved rates per kernel
//! class, fixed dispatch and barrier costs) and its memory capacity; which kernels it runs
//! comes from its compiler backend ([`crate::Backend::supports`]), not from here, so the
//! description and the code generator cannot disagree. A [`Link`] describes the path
//! between the host and an accelerator (copy bandwidth and latency, shared memory or not).
//!
//! Profiles come from measurements (`rafter devices --profile` runs calibration kernels
//! and stores them with [`Profiles::to_text`]); [`DeviceDescription::default_for`] is the
//! built-in conservative profile used when none was measured.
//!
//! The text format, one record a line (`#` starts a comment):
//!
//! ```text
//! rafter-profiles 1
//! device vulkan dispatch_s=2e-5 barrier_s=5e-6 half_scale=4 memory_bytes=2147483648 dispatch_overlaps=true
//! class vulkan contraction flops_per_s=1e11 bytes_per_s=2e11 half_flops=1e6
//! class vulkan depthwise_conv flops_per_s=2e10 bytes_per_s=2e11 half_flops=1e5 half_scale=1.5
//! class vulkan conv flops_per_s=5e12 bytes_per_s=2e12 half_flops=1e7 depth_s=1e-8
//! point vulkan conv flops=2.3e8 depth=1152 width=256 ratio=1.3
//! link vulkan bytes_per_s=1e10 latency_s=1e-5 zero_copy=false
//! ```
//!
//! A `point` is a calibration probe's residual ([`Residual`]): its work and its measured
//! time over the class's fitted one.
//!
//! A `cache` record and the `read` records after it say how fast the device reads a
//! working set by its size ([`WeightCache`]), which prices weights that outgrow its cache:
//! `cache cpu cache_bytes_per_s=4.4e10`, `read cpu bytes=6.7e7 bytes_per_s=4.3e10`,
//! `read cpu bytes=1.3e8 bytes_per_s=2.4e10`, ... (sizes growing).
//!
//! A zero-copy link names where its shared tensors live, `shared_memory=device` (the
//! default: the device's own memory, which the host maps) or `shared_memory=host`:
//! `link vulkan bytes_per_s=2e10 latency_s=3e-5 zero_copy=true shared_memory=host`.
//!
//! A `class` is a kernel kind ([`CLASSES`]) or a finer detail class ([`DETAIL_CLASSES`]:
//! gemm, conv, winograd_conv, pointwise_conv, depthwise_conv, attention) that `rafter
//! devices --profile` calibrates apart.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rafter_ir::program::KernelKind;

/// The kernel classes a profile rates separately (the program's [`KernelKind`]s).
pub const CLASSES: [KernelKind; 5] = [
    KernelKind::Contraction,
    KernelKind::Elementwise,
    KernelKind::Reduction,
    KernelKind::DataMovement,
    KernelKind::Opaque,
];

/// A kernel class's name in profiles and plans.
pub fn class_name(kind: KernelKind) -> &'static str {
    match kind {
        KernelKind::Contraction => "contraction",
        KernelKind::Elementwise => "elementwise",
        KernelKind::Reduction => "reduction",
        KernelKind::DataMovement => "data_movement",
        KernelKind::Opaque => "opaque",
    }
}

/// Finer classes a profile may rate apart from their kernel kind, because one rate per
/// kind cannot fit them all: a dense GEMM, a direct convolution, a 1x1 (pointwise)
/// convolution, a depthwise convolution and fused attention reach very different shares
/// of a device's peak. A profile without a detail class rates its kernels by their kind
/// (profiles written before these existed still load and mean what they meant).
///
/// `winograd_conv` is a convolution the CPU runs by Winograd F(2x2, 3x3)
/// (`rafter_ir::program::cpu_winograd`: 3x3, stride 1, one group, 100+ output pixels),
/// 2.25x fewer multiply-adds than its flops count: its rate is in the direct
/// convolution's flops per second, measured on those kernels alone, so that the other
/// convolutions' rate no longer absorbs their speed. Only the CPU's profile has it; a
/// profile without it (any GPU's: the SPIR-V generator has no Winograd; a CPU profile
/// written before it existed) rates them as `conv` ([`parent_class`]), as before.
pub const DETAIL_CLASSES: [&str; 6] = [
    "gemm",
    "conv",
    "winograd_conv",
    "pointwise_conv",
    "depthwise_conv",
    "attention",
];

/// The class a detail class falls back to when a profile does not rate it: a Winograd
/// convolution is a convolution; the others fall back to their kernel kind.
pub fn parent_class(detail: &str) -> Option<&'static str> {
    (detail == "winograd_conv").then_some("conv")
}

/// The profile's spelling of a kind or detail class named `name`, if it is one.
fn known_class(name: &str) -> Option<&'static str> {
    CLASSES
        .into_iter()
        .map(class_name)
        .chain(DETAIL_CLASSES)
        .find(|&c| c == name)
}

/// What a device achieves on one kernel class: a roofline with a ramp. A kernel of `f`
/// flops and `b` bytes takes `max((f + half_flops) / flops_per_s, b / bytes_per_s)`: the
/// `half_flops` term (Hockney's n½, the work at which half the peak rate is reached)
/// models small kernels that cannot fill the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassRate {
    /// Achieved floating-point operations per second on large kernels of the class.
    pub flops_per_s: f64,
    /// Achieved bytes read plus written per second.
    pub bytes_per_s: f64,
    /// Flops at which the class reaches half its peak rate.
    pub half_flops: f64,
    /// Half-precision compute speed over f32 for this class, where it differs from the
    /// device's [`CostProfile::half_scale`]: `rafter devices --profile` on an H200 measured
    /// its f16 GEMM 3.3x its f32 one (matrix units), its f16 3x3, 1x1 and depthwise
    /// convolutions 2.0x, 1.6x and 0.67x.
    pub half_scale: Option<f64>,
    /// Seconds per step of reduction depth (a contraction's `K`, the multiply-adds in
    /// series behind each output): a kernel with few outputs and a long `K` (ResNet's last
    /// 3x3 convolutions over 7x7 maps, a classifier's 2048-long dot products) cannot
    /// spread its work over the device, and its chains set its time. 0 in profiles
    /// written before it was measured.
    pub depth_s: f64,
}

/// A device's costs, as the cost model reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct CostProfile {
    /// Rate per kernel class (a kind's name, or one of [`DETAIL_CLASSES`]); a kind
    /// missing here uses [`KernelKind::Opaque`]'s, a detail class its kind's.
    pub classes: BTreeMap<&'static str, ClassRate>,
    /// Fixed cost of one kernel dispatch (launch, argument binding), seconds.
    pub dispatch_s: f64,
    /// Cost of a semaphore signal/wait pair at a device boundary, seconds, beyond the
    /// link's latency (0 where the latency was measured as the handoff itself, which
    /// holds it: `rafter devices --profile`).
    pub barrier_s: f64,
    /// The device's compute rate on half-precision (f16/bf16) kernels relative to f32
    /// ones (1: the same). Measured apart because it differs by orders of magnitude
    /// between devices: a GPU's f16 matrix units run f16 faster than f32, while a CPU
    /// without f16 arithmetic converts and may run it 20-40x slower.
    pub half_scale: f64,
    /// Whether the device prepares a kernel's launch while the kernel before it runs (a
    /// GPU's command processor), so a kernel costs the longer of `dispatch_s` and its
    /// work; else (a CPU thread that launches, then works) their sum. On the H200,
    /// `dispatch_s` (a chain of 33 near-empty kernels, untraced) was 2.4 us, while in
    /// MobileNetV2 and BERT-base the untraced call took no longer than its kernels'
    /// traced spans alone: charged on top, dispatches put the GPU's estimates 27-38%
    /// over its calls. Text key `dispatch_overlaps=true`; absent: false.
    pub dispatch_overlaps: bool,
    /// Per class, the calibration probes' residuals: where the class's fitted rate missed
    /// a measured probe, which [`CostProfile::correction`] carries over to kernels of
    /// nearby work. Text records `point DEVICE CLASS flops=F depth=D ratio=R`; none in
    /// profiles written before them (the fit alone).
    pub residuals: BTreeMap<&'static str, Vec<Residual>>,
    /// How the device reads a program's weights once they outgrow its cache (`None`: not
    /// measured, weights cost what the probes measured). Text record `cache DEVICE ...`.
    pub weight_cache: Option<WeightCache>,
}

/// Where a program's weights come from on a device, by how much of them there is. A
/// calibration probe runs one kernel over and over, so its weights come from the cache;
/// in a model whose weights outgrow the cache, every kernel reads its weights from memory
/// each call. On the 2-core dev machine ResNet-50's stage-3 3x3 convolution ran 545 us
/// alone and among 8 replicas of distinct weights (34 MB of them), but 750-870 us among
/// 48 replicas (200 MB; `benchmarks/results/cost-experiments-2026-12-01/`) and inside
/// ResNet-50 (102 MB of weights), and its 1x1 convolutions of stage 4 0.34 ms by their
/// probes against 0.47-0.49 in the model
/// (`benchmarks/results/cost-experiments-2026-12-01-b/xeon/`). A kernel then
/// pays the difference between reading its weights at memory and at cache speed
/// ([`WeightCache::stream_s`]); small models (MobileNetV2's 14 MB, MiniLM's 43 MB) pay
/// nothing.
///
/// Measured by `rafter devices --profile` as read bandwidth against working-set size
/// (all the device's threads summing a buffer over and over). The step from cache to
/// memory speed is gradual on a shared last-level cache (the dev machine: 40 GB/s at
/// 64 MiB, 29 at 96, 24 at 128, 18-19 from 256 on,
/// `benchmarks/results/cpu-estimate-xeon-2026-12-01-cache/profiles.txt`), so the whole
/// curve is kept, not a size.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightCache {
    /// Read bandwidth of a working set the cache holds, bytes per second: what a
    /// calibration probe's weights were read at.
    pub cache_bytes_per_s: f64,
    /// The sweep: read bandwidth by working-set size, smallest first.
    pub reads: Vec<ReadPoint>,
}

/// One working-set size of a [`WeightCache`] sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReadPoint {
    /// Working-set bytes.
    pub bytes: f64,
    /// Bytes read per second.
    pub bytes_per_s: f64,
}

impl WeightCache {
    /// Read bandwidth at a working set of `footprint` bytes: the sweep interpolated in log
    /// size, clamped to its ends, and never below what a larger working set read at (a
    /// small set's own figure can be low from the threads' start-up, not the cache).
    pub fn bytes_per_s_at(&self, footprint: f64) -> f64 {
        let envelope = |i: usize| {
            self.reads[i..]
                .iter()
                .map(|p| p.bytes_per_s)
                .fold(0.0, f64::max)
        };
        let Some(last) = self.reads.len().checked_sub(1) else {
            return self.cache_bytes_per_s;
        };
        let Some(hi) = self.reads.iter().position(|p| p.bytes >= footprint) else {
            return envelope(last);
        };
        if hi == 0 {
            return envelope(0);
        }
        let (a, b) = (self.reads[hi - 1], self.reads[hi]);
        let t = (footprint / a.bytes).ln() / (b.bytes / a.bytes).ln();
        envelope(hi - 1) + t * (envelope(hi) - envelope(hi - 1))
    }

    /// Seconds a kernel reading `weight_bytes` of weights takes beyond its probe-rated
    /// time in a program whose weights total `footprint` bytes on the device: its weights
    /// at the working set's read speed less the cache's (which the probe paid). Added to
    /// the kernel's time rather than hidden under its compute: on the dev machine the
    /// difference between memory and cache speed (30 us a MB: 18.6 against 41.3 GB/s,
    /// `benchmarks/results/cpu-estimate-xeon-2026-12-01-cache/profiles.txt`) matched what
    /// ResNet-50's stage-4 convolutions (25-35 us a MB of weights,
    /// `cost-experiments-2026-12-01-b/xeon/`) and distinct-weight chains of BERT's 768x768
    /// GEMM (24, `benchmarks/gpu/exp/gemm_chain_gen.py`) ran beyond their probes.
    pub fn stream_s(&self, weight_bytes: f64, footprint: f64) -> f64 {
        let at = self.bytes_per_s_at(footprint);
        weight_bytes * (1.0 / at - 1.0 / self.cache_bytes_per_s).max(0.0)
    }

    /// Seconds a contraction kernel takes beyond its probe-rated time to read `bytes` of
    /// activations in its epilogue (a residual: [`crate::partition::cost::epilogue_operand_bytes`]),
    /// which its probe has none of: the bytes at memory speed (the largest working set's),
    /// added. ResNet-50's 1x1 convolutions with a residual add ran this much beyond those
    /// without one on both CPUs measured (2026-12-01,
    /// `benchmarks/results/cost-experiments-2026-12-01-b/`): on the dev machine 0.09-0.24
    /// ms for 1.6-3.2 MB of residual (17-21 GB/s, against its 18.6 from memory), on the
    /// H200 host 23-41 us for 3.2 MB (its memory: 73-98 GB/s). 0 without a sweep.
    pub fn epilogue_s(&self, bytes: f64) -> f64 {
        self.reads
            .last()
            .map_or(0.0, |memory| bytes / memory.bytes_per_s)
    }
}

/// One calibration probe's residual: its measured time over the time its class's fitted
/// rate gives its work. A class's fit (a rate, a ramp and a depth cost over five or six
/// probes) follows the trend across shapes but misses single shapes by up to 2x: on the
/// H200 machine's host, ResNet-50's stride-2 3x3 convolutions ran at 0.45 TFLOP/s where
/// the direct convolutions' fit gave 0.8, and on the H200 a 128x384x384 GEMM (MiniLM's
/// projections) took 20 us where the GEMM fit, pulled down by the attention products,
/// gave 13.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Residual {
    /// The probe's flops (of its class's part).
    pub flops: f64,
    /// Its reduction depth ([`crate::partition::cost::KernelWork::detail_depth`]).
    pub depth: f64,
    /// Its output width ([`crate::partition::cost::KernelWork::detail_width`]: a GEMM's
    /// N, a convolution's output channels); 0 when unknown (profiles written before it),
    /// which matches every width. Flops and depth alone do not tell ResNet-50's stage-2
    /// 512->128 1x1 convolution over 28x28 from its stage-4 512->2048 one over 7x7 (the
    /// same flops and depth), yet on the H200 machine's 16-core host the first ran 157 us
    /// and the second 93.
    pub width: f64,
    /// Measured over fitted time (beyond the device's per-kernel floor).
    pub ratio: f64,
}

/// How far, in the natural logarithm of flops, of reduction depth and of output width, a
/// probe's residual reaches: a kernel with 1.28x a probe's flops takes 0.6 of its weight, one with 2x
/// 0.02 ([`CostProfile::correction`]).
const RESIDUAL_REACH: f64 = 0.25;

/// The fit's own weight against the probes' (each at most 1): a kernel matching a probe
/// exactly takes 1/1.1 of its residual (in logarithm), one far from every probe none.
const FIT_WEIGHT: f64 = 0.1;

impl CostProfile {
    /// Seconds a kernel whose own work takes `work_s` costs on this device, its dispatch
    /// included ([`CostProfile::dispatch_overlaps`]).
    pub fn with_dispatch(&self, work_s: f64) -> f64 {
        if self.dispatch_overlaps {
            self.dispatch_s.max(work_s)
        } else {
            self.dispatch_s + work_s
        }
    }

    /// The rate for `kind` (the opaque class's when the profile lacks `kind`).
    pub fn rate(&self, kind: KernelKind) -> ClassRate {
        self.classes
            .get(class_name(kind))
            .or_else(|| self.classes.get(class_name(KernelKind::Opaque)))
            .copied()
            .unwrap_or(ClassRate {
                flops_per_s: 1e9,
                bytes_per_s: 1e9,
                half_flops: 0.0,
                half_scale: None,
                depth_s: 0.0,
            })
    }

    /// The rate for a kernel of `kind` whose detail class is `detail`: the detail's own
    /// when the profile rates it, else its [`parent_class`]'s, else the kind's
    /// ([`CostProfile::rate`]).
    pub fn rate_of(&self, detail: Option<&str>, kind: KernelKind) -> ClassRate {
        let parent = detail.and_then(parent_class);
        detail
            .and_then(|d| self.classes.get(d))
            .or_else(|| parent.and_then(|p| self.classes.get(p)))
            .copied()
            .unwrap_or_else(|| self.rate(kind))
    }

    /// The factor on the fitted time of a part of class `detail` (resolved as
    /// [`CostProfile::rate_of`] does) with `flops` and reduction `depth`: the geometric
    /// mean of the class's probe residuals, each weighted by a Gaussian of its distance in
    /// log flops, log depth and log output width ([`RESIDUAL_REACH`]), against the fit's own weight
    /// ([`FIT_WEIGHT`]) at ratio 1 (Nadaraya-Watson smoothing of the residuals: a kernel
    /// shaped like a probe costs about what the probe measured, one unlike any costs the
    /// fit).
    pub fn correction(
        &self,
        detail: Option<&str>,
        kind: KernelKind,
        flops: f64,
        depth: f64,
        width: f64,
    ) -> f64 {
        let class = detail
            .filter(|d| self.classes.contains_key(d))
            .or_else(|| {
                detail
                    .and_then(parent_class)
                    .filter(|p| self.classes.contains_key(p))
            })
            .unwrap_or(class_name(kind));
        self.residuals
            .get(class)
            .map_or(1.0, |points| residual_factor(points, flops, depth, width))
    }
}

/// The smoothed residual of `points` at `flops`, `depth` and `width`
/// ([`CostProfile::correction`]); a width of 0 on either side is no distance.
pub fn residual_factor(points: &[Residual], flops: f64, depth: f64, width: f64) -> f64 {
    let (mut weights, mut logs) = (0.0, 0.0);
    for p in points {
        let df = (flops.max(1.0) / p.flops.max(1.0)).ln();
        let dd = (depth.max(1.0) / p.depth.max(1.0)).ln();
        let dw = if width > 0.0 && p.width > 0.0 {
            (width / p.width).ln()
        } else {
            0.0
        };
        let d2 = df * df + dd * dd + dw * dw;
        let w = (-d2 / (2.0 * RESIDUAL_REACH * RESIDUAL_REACH)).exp();
        weights += w;
        logs += w * p.ratio.ln();
    }
    (logs / (FIT_WEIGHT + weights)).exp()
}

/// The path between the host and a device: how a tensor crosses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Copy bandwidth, bytes per second.
    pub bytes_per_s: f64,
    /// Fixed cost of one crossing (the copy's start, the wait on the producer), seconds.
    pub latency_s: f64,
    /// Whether a crossing needs no copy (both sides address the same memory and the
    /// runtime hands the tensor over by semaphore alone).
    pub zero_copy: bool,
    /// Where a zero-copy crossing's tensor lives (ignored when `zero_copy` is false).
    pub shared_memory: SharedMemory,
}

/// The memory a zero-copy link's crossing tensors live in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SharedMemory {
    /// The device's own memory, mapped by the host: unified-memory GPUs and lavapipe, where
    /// that memory *is* host memory. A crossing then costs its latency alone.
    #[default]
    Device,
    /// The host's cached memory, which the device's kernels reach over its bus: a discrete
    /// GPU, whose own host-visible memory (the resizable BAR) the CPU reads uncached, orders
    /// of magnitude slower than cached memory (BERT-base on the H100: 2.6 s a call when
    /// results were read from it). The bytes still cross the bus, inside the kernels that
    /// touch the tensor, at the link's rate; what goes is the host's copy and its step.
    Host,
}

impl SharedMemory {
    /// Every kind, in the order profile errors name them.
    pub const ALL: [SharedMemory; 2] = [SharedMemory::Device, SharedMemory::Host];

    /// The memory-kind keyword of the arena holding the shared tensors
    /// (`rafter_ir::program::Arena::memory`).
    pub fn arena_memory(self) -> &'static str {
        match self {
            SharedMemory::Device => "host_visible_shared",
            SharedMemory::Host => "host",
        }
    }

    /// Its word in profile files.
    pub fn word(self) -> &'static str {
        match self {
            SharedMemory::Device => "device",
            SharedMemory::Host => "host",
        }
    }
}

impl Link {
    /// Where the crossing tensors of this link live when it is zero-copy, else `None`.
    pub fn shared(&self) -> Option<SharedMemory> {
        self.zero_copy.then_some(self.shared_memory)
    }

    /// Whether the device's own memory is the host's: tensors crossing cost no bus
    /// transfer at all (a zero-copy link in [`SharedMemory::Device`]).
    pub fn in_place(&self) -> bool {
        self.shared() == Some(SharedMemory::Device)
    }
}

/// Everything the partitioner knows of one device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceDescription {
    /// The device's name in programs (`cpu`, `vulkan`).
    pub name: String,
    /// Its costs.
    pub profile: CostProfile,
    /// Memory the device may hold for one program (weights + arenas), bytes; `None`: no
    /// limit known.
    pub memory_bytes: Option<u64>,
    /// How tensors reach it from the host (`None` for the host itself).
    pub link: Option<Link>,
}

fn rates(contraction: (f64, f64, f64), streaming: (f64, f64)) -> BTreeMap<&'static str, ClassRate> {
    let (cf, cb, ch) = contraction;
    let (sf, sb) = streaming;
    CLASSES
        .into_iter()
        .map(|k| {
            let rate = match k {
                KernelKind::Contraction => ClassRate {
                    flops_per_s: cf,
                    bytes_per_s: cb,
                    half_flops: ch,
                    half_scale: None,
                    depth_s: 0.0,
                },
                // The interpreter-run class is an order of magnitude slower.
                KernelKind::Opaque => ClassRate {
                    flops_per_s: sf / 10.0,
                    bytes_per_s: sb / 10.0,
                    half_flops: 0.0,
                    half_scale: None,
                    depth_s: 0.0,
                },
                _ => ClassRate {
                    flops_per_s: sf,
                    bytes_per_s: sb,
                    half_flops: 0.0,
                    half_scale: None,
                    depth_s: 0.0,
                },
            };
            (class_name(k), rate)
        })
        .collect()
}

/// How much faster than its other contractions the built-in CPU profile rates a Winograd
/// convolution's flops (those of the direct convolution it computes): F(2x2, 3x3) does
/// 2.25x fewer multiply-adds, less its transforms. Measured on the 2-core dev machine
/// (`rafter devices --profile`): 212 GFLOP/s for `winograd_conv` against 117 for the
/// direct `conv` and 103 for `gemm`, so 1.8x, the lower of the two.
const WINOGRAD_DEFAULT_GAIN: f64 = 1.8;

impl DeviceDescription {
    /// The built-in conservative profile for a device named `name`: a small multi-core
    /// CPU for `cpu` (50 GFLOP/s GEMM, [`WINOGRAD_DEFAULT_GAIN`] times that for Winograd
    /// convolutions, 10 GB/s streaming, 2 µs dispatch); for any other
    /// device a modest discrete GPU behind a copying link (1 TFLOP/s, 100 GB/s, 20 µs
    /// dispatch, 10 GB/s copies with 20 µs latency). Real numbers come from
    /// `rafter devices --profile`; these only have to rank the obvious cases right.
    pub fn default_for(name: &str) -> DeviceDescription {
        if name == crate::backend::CPU {
            let mut classes = rates((50e9, 20e9, 2e5), (2.5e9, 10e9));
            let contraction = classes[class_name(KernelKind::Contraction)];
            classes.insert(
                "winograd_conv",
                ClassRate {
                    flops_per_s: contraction.flops_per_s * WINOGRAD_DEFAULT_GAIN,
                    ..contraction
                },
            );
            return DeviceDescription {
                name: name.to_string(),
                profile: CostProfile {
                    classes,
                    dispatch_s: 2e-6,
                    barrier_s: 1e-6,
                    half_scale: 1.0,
                    dispatch_overlaps: false,
                    residuals: BTreeMap::new(),
                    weight_cache: None,
                },
                memory_bytes: None,
                link: None,
            };
        }
        DeviceDescription {
            name: name.to_string(),
            profile: CostProfile {
                classes: rates((1e12, 100e9, 5e7), (25e9, 100e9)),
                dispatch_s: 20e-6,
                barrier_s: 10e-6,
                half_scale: 1.0,
                dispatch_overlaps: false,
                residuals: BTreeMap::new(),
                weight_cache: None,
            },
            memory_bytes: None,
            link: Some(Link {
                bytes_per_s: 10e9,
                latency_s: 20e-6,
                zero_copy: false,
                shared_memory: SharedMemory::Device,
            }),
        }
    }
}

/// Descriptions by device name: what a profile file holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profiles {
    /// One per device, by name.
    pub devices: BTreeMap<String, DeviceDescription>,
}

/// The first line of a profile file.
const MAGIC: &str = "rafter-profiles 1";

impl Profiles {
    /// The description of `name`: the stored one, else the built-in default.
    pub fn get(&self, name: &str) -> DeviceDescription {
        self.devices
            .get(name)
            .cloned()
            .unwrap_or_else(|| DeviceDescription::default_for(name))
    }

    /// Adds or replaces `d`.
    pub fn insert(&mut self, d: DeviceDescription) {
        self.devices.insert(d.name.clone(), d);
    }

    /// The text form (see the module doc); [`Profiles::parse`] reads it back exactly.
    pub fn to_text(&self) -> String {
        let mut s = format!("{MAGIC}\n");
        for d in self.devices.values() {
            let p = &d.profile;
            let _ = write!(
                s,
                "device {} dispatch_s={:e} barrier_s={:e}",
                d.name, p.dispatch_s, p.barrier_s
            );
            if p.half_scale != 1.0 {
                let _ = write!(s, " half_scale={:e}", p.half_scale);
            }
            if let Some(m) = d.memory_bytes {
                let _ = write!(s, " memory_bytes={m}");
            }
            if p.dispatch_overlaps {
                s.push_str(" dispatch_overlaps=true");
            }
            s.push('\n');
            for (class, r) in &p.classes {
                let _ = write!(
                    s,
                    "class {} {class} flops_per_s={:e} bytes_per_s={:e} half_flops={:e}",
                    d.name, r.flops_per_s, r.bytes_per_s, r.half_flops
                );
                if let Some(h) = r.half_scale {
                    let _ = write!(s, " half_scale={h:e}");
                }
                if r.depth_s > 0.0 {
                    let _ = write!(s, " depth_s={:e}", r.depth_s);
                }
                s.push('\n');
            }
            for (class, points) in &p.residuals {
                for r in points {
                    let _ = write!(
                        s,
                        "point {} {class} flops={:e} depth={:e}",
                        d.name, r.flops, r.depth
                    );
                    if r.width > 0.0 {
                        let _ = write!(s, " width={:e}", r.width);
                    }
                    let _ = writeln!(s, " ratio={:e}", r.ratio);
                }
            }
            if let Some(c) = &p.weight_cache {
                let _ = writeln!(
                    s,
                    "cache {} cache_bytes_per_s={:e}",
                    d.name, c.cache_bytes_per_s
                );
                for r in &c.reads {
                    let _ = writeln!(
                        s,
                        "read {} bytes={:e} bytes_per_s={:e}",
                        d.name, r.bytes, r.bytes_per_s
                    );
                }
            }
            if let Some(l) = d.link {
                let _ = write!(
                    s,
                    "link {} bytes_per_s={:e} latency_s={:e} zero_copy={}",
                    d.name, l.bytes_per_s, l.latency_s, l.zero_copy
                );
                if l.shared_memory != SharedMemory::Device {
                    let _ = write!(s, " shared_memory={}", l.shared_memory.word());
                }
                s.push('\n');
            }
        }
        s
    }

    /// Reads [`Profiles::to_text`]'s form. `origin` names the source in errors (a path),
    /// which also give the line and the field.
    pub fn parse(text: &str, origin: &str) -> Result<Profiles, String> {
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, l)) if l.trim() == MAGIC => {}
            _ => return Err(format!("{origin}: line 1: expected `{MAGIC}`")),
        }
        let mut out = Profiles::default();
        for (i, line) in lines {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            parse_line(&mut out, line).map_err(|e| format!("{origin}: line {}: {e}", i + 1))?;
        }
        Ok(out)
    }
}

/// `key=value` fields of a record, checked against the keys it allows.
struct Fields<'a>(BTreeMap<&'a str, &'a str>);

impl<'a> Fields<'a> {
    fn new(words: &[&'a str], allowed: &[&str]) -> Result<Fields<'a>, String> {
        let mut map = BTreeMap::new();
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| format!("`{w}` is not key=value"))?;
            if !allowed.contains(&k) {
                return Err(format!("unknown field `{k}` (expected one of {allowed:?})"));
            }
            map.insert(k, v);
        }
        Ok(Fields(map))
    }

    fn num(&self, key: &str) -> Result<f64, String> {
        let v = self.0.get(key).ok_or_else(|| format!("missing `{key}`"))?;
        let x: f64 = v
            .parse()
            .map_err(|_| format!("`{key}={v}` is not a number"))?;
        if !x.is_finite() || x < 0.0 {
            return Err(format!("`{key}={v}` must be finite and non-negative"));
        }
        Ok(x)
    }

    fn rate(&self, key: &str) -> Result<f64, String> {
        let x = self.num(key)?;
        if x == 0.0 {
            return Err(format!("`{key}` must be positive"));
        }
        Ok(x)
    }
}

fn parse_line(out: &mut Profiles, line: &str) -> Result<(), String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let device_of = |out: &mut Profiles, name: &str| -> Result<(), String> {
        if out.devices.contains_key(name) {
            Ok(())
        } else {
            Err(format!("device `{name}` used before its `device` record"))
        }
    };
    match words.as_slice() {
        ["device", name, rest @ ..] => {
            let f = Fields::new(
                rest,
                &[
                    "dispatch_s",
                    "barrier_s",
                    "half_scale",
                    "memory_bytes",
                    "dispatch_overlaps",
                ],
            )?;
            let memory_bytes = match f.0.get("memory_bytes") {
                Some(v) => Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("`memory_bytes={v}` is not a byte count"))?,
                ),
                None => None,
            };
            out.insert(DeviceDescription {
                name: name.to_string(),
                profile: CostProfile {
                    classes: BTreeMap::new(),
                    dispatch_s: f.num("dispatch_s")?,
                    barrier_s: f.num("barrier_s")?,
                    // Profiles written before it existed rate half precision as f32.
                    half_scale: match f.0.contains_key("half_scale") {
                        true => f.rate("half_scale")?,
                        false => 1.0,
                    },
                    dispatch_overlaps: match f.0.get("dispatch_overlaps") {
                        None | Some(&"false") => false,
                        Some(&"true") => true,
                        Some(v) => {
                            return Err(format!("`dispatch_overlaps={v}` is not true or false"))
                        }
                    },
                    residuals: BTreeMap::new(),
                    weight_cache: None,
                },
                memory_bytes,
                link: None,
            });
        }
        ["class", name, class, rest @ ..] => {
            device_of(out, name)?;
            let class = known_class(class).ok_or_else(|| format!("unknown class `{class}`"))?;
            let f = Fields::new(
                rest,
                &[
                    "flops_per_s",
                    "bytes_per_s",
                    "half_flops",
                    "half_scale",
                    "depth_s",
                ],
            )?;
            let rate = ClassRate {
                flops_per_s: f.rate("flops_per_s")?,
                bytes_per_s: f.rate("bytes_per_s")?,
                half_flops: f.num("half_flops")?,
                half_scale: match f.0.contains_key("half_scale") {
                    true => Some(f.rate("half_scale")?),
                    false => None,
                },
                depth_s: match f.0.contains_key("depth_s") {
                    true => f.num("depth_s")?,
                    false => 0.0,
                },
            };
            let d = out.devices.get_mut(*name).expect("checked above");
            d.profile.classes.insert(class, rate);
        }
        ["link", name, rest @ ..] => {
            device_of(out, name)?;
            let f = Fields::new(
                rest,
                &["bytes_per_s", "latency_s", "zero_copy", "shared_memory"],
            )?;
            let zero_copy = match f.0.get("zero_copy").copied() {
                Some("true") => true,
                Some("false") | None => false,
                Some(v) => return Err(format!("`zero_copy={v}` is not true or false")),
            };
            let shared_memory = match f.0.get("shared_memory").copied() {
                None => SharedMemory::Device,
                Some(v) => SharedMemory::ALL
                    .into_iter()
                    .find(|m| m.word() == v)
                    .ok_or_else(|| format!("`shared_memory={v}` is not device or host"))?,
            };
            let link = Link {
                bytes_per_s: f.rate("bytes_per_s")?,
                latency_s: f.num("latency_s")?,
                zero_copy,
                shared_memory,
            };
            out.devices.get_mut(*name).expect("checked above").link = Some(link);
        }
        ["point", name, class, rest @ ..] => {
            device_of(out, name)?;
            let class = known_class(class).ok_or_else(|| format!("unknown class `{class}`"))?;
            let f = Fields::new(rest, &["flops", "depth", "width", "ratio"])?;
            let point = Residual {
                flops: f.num("flops")?,
                depth: f.num("depth")?,
                // Points written before it: any width.
                width: match f.0.contains_key("width") {
                    true => f.num("width")?,
                    false => 0.0,
                },
                ratio: f.rate("ratio")?,
            };
            let profile = &mut out.devices.get_mut(*name).expect("checked above").profile;
            profile.residuals.entry(class).or_default().push(point);
        }
        ["cache", name, rest @ ..] => {
            device_of(out, name)?;
            let f = Fields::new(rest, &["cache_bytes_per_s"])?;
            let profile = &mut out.devices.get_mut(*name).expect("checked above").profile;
            profile.weight_cache = Some(WeightCache {
                cache_bytes_per_s: f.rate("cache_bytes_per_s")?,
                reads: Vec::new(),
            });
        }
        ["read", name, rest @ ..] => {
            device_of(out, name)?;
            let f = Fields::new(rest, &["bytes", "bytes_per_s"])?;
            let point = ReadPoint {
                bytes: f.rate("bytes")?,
                bytes_per_s: f.rate("bytes_per_s")?,
            };
            let profile = &mut out.devices.get_mut(*name).expect("checked above").profile;
            let cache = profile
                .weight_cache
                .as_mut()
                .ok_or_else(|| format!("`read` for `{name}` before its `cache` record"))?;
            if cache.reads.last().is_some_and(|p| p.bytes >= point.bytes) {
                return Err(format!(
                    "`read` sizes must grow: bytes={:e} after {:e}",
                    point.bytes,
                    cache.reads.last().map_or(0.0, |p| p.bytes)
                ));
            }
            cache.reads.push(point);
        }
        [kind, ..] => return Err(format!("unknown record `{kind}`")),
        [] => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_round_trip_through_text() {
        let mut p = Profiles::default();
        p.insert(DeviceDescription::default_for("cpu"));
        let mut gpu = DeviceDescription::default_for("vulkan");
        gpu.memory_bytes = Some(2 << 30);
        gpu.profile.half_scale = 3.5;
        gpu.profile.dispatch_overlaps = true;
        p.insert(gpu);
        let text = p.to_text();
        assert!(text.contains("half_scale=3.5e0"), "{text}");
        assert!(text.contains("dispatch_overlaps=true"), "{text}");
        assert_eq!(Profiles::parse(&text, "t").unwrap(), p);
    }

    #[test]
    fn probe_residuals_round_trip_and_correct_kernels_near_them_only() {
        let mut cpu = DeviceDescription::default_for("cpu");
        let probe = Residual {
            flops: 2.3e8,
            depth: 1152.0,
            width: 256.0,
            ratio: 2.0,
        };
        let contraction = cpu.profile.rate(KernelKind::Contraction);
        cpu.profile.classes.insert("conv", contraction);
        // Without a Winograd rate, a Winograd part takes the conv class's (below).
        cpu.profile.classes.remove("winograd_conv");
        cpu.profile.residuals.insert("conv", vec![probe]);
        let mut p = Profiles::default();
        p.insert(cpu);
        let text = p.to_text();
        assert!(
            text.contains("point cpu conv flops=2.3e8 depth=1.152e3 width=2.56e2 ratio=2e0"),
            "{text}"
        );
        let back = Profiles::parse(&text, "t").unwrap();
        assert_eq!(back, p);
        let prof = &back.devices["cpu"].profile;
        let at = |flops: f64, depth: f64| {
            prof.correction(Some("conv"), KernelKind::Contraction, flops, depth, 256.0)
        };
        // At the probe: its ratio less the fit's weight, 2^(1/1.1).
        assert!((at(2.3e8, 1152.0) - 2f64.powf(1.0 / 1.1)).abs() < 1e-12);
        // A winograd part falls back to the conv class's rate and residuals.
        let wino = prof.correction(
            Some("winograd_conv"),
            KernelKind::Contraction,
            2.3e8,
            1152.0,
            256.0,
        );
        assert!((wino - at(2.3e8, 1152.0)).abs() < 1e-12);
        // Nearby (1.28x the flops, weight 0.61): 2^(0.61 / 0.71); 4x the flops or the
        // depth: the fit alone.
        let near = at(2.3e8 * 1.284, 1152.0);
        assert!((near - 2f64.powf(0.6065 / 0.7065)).abs() < 1e-3, "{near}");
        assert!((at(9.2e8, 1152.0) - 1.0).abs() < 1e-3);
        assert!((at(2.3e8, 4608.0) - 1.0).abs() < 1e-3);
        // Another class, or a profile without points: 1.
        assert_eq!(
            prof.correction(Some("gemm"), KernelKind::Contraction, 2.3e8, 1152.0, 256.0),
            1.0
        );
        // Two probes at the same work, ratios 2 and 0.5: their geometric mean, 1.
        let pair = [
            probe,
            Residual {
                ratio: 0.5,
                ..probe
            },
        ];
        assert!((residual_factor(&pair, 2.3e8, 1152.0, 256.0) - 1.0).abs() < 1e-12);
        // The same work at widths 128 and 2048 (ResNet-50's stage-2 and stage-4 1x1
        // convolutions): each width takes its own probe's ratio; an unknown width (0)
        // both, as do points without a width.
        let by_width = [
            Residual {
                width: 128.0,
                ..probe
            },
            Residual {
                width: 2048.0,
                ratio: 0.5,
                ..probe
            },
        ];
        let own = 2f64.powf(1.0 / 1.1);
        assert!((residual_factor(&by_width, 2.3e8, 1152.0, 128.0) - own).abs() < 1e-9);
        assert!((residual_factor(&by_width, 2.3e8, 1152.0, 2048.0) - 1.0 / own).abs() < 1e-9);
        assert!((residual_factor(&by_width, 2.3e8, 1152.0, 0.0) - 1.0).abs() < 1e-12);
        let old = Profiles::parse(
            "rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\n\
             point g conv flops=1 depth=1 ratio=2\n",
            "p.txt",
        )
        .unwrap();
        assert_eq!(old.devices["g"].profile.residuals["conv"][0].width, 0.0);
    }

    fn sweep(points: &[(f64, f64)]) -> WeightCache {
        WeightCache {
            cache_bytes_per_s: 40e9,
            reads: points
                .iter()
                .map(|&(mb, gbs)| ReadPoint {
                    bytes: mb * 1e6,
                    bytes_per_s: gbs * 1e9,
                })
                .collect(),
        }
    }

    #[test]
    fn a_weight_cache_round_trips_and_charges_only_weights_beyond_it() {
        let cache = sweep(&[(8.0, 20.0), (16.0, 40.0), (64.0, 40.0), (256.0, 16.0)]);
        let mut cpu = DeviceDescription::default_for("cpu");
        cpu.profile.weight_cache = Some(cache.clone());
        let mut p = Profiles::default();
        p.insert(cpu);
        let text = p.to_text();
        assert!(
            text.contains(
                "cache cpu cache_bytes_per_s=4e10\nread cpu bytes=8e6 bytes_per_s=2e10\n\
                 read cpu bytes=1.6e7 bytes_per_s=4e10\n"
            ),
            "{text}"
        );
        assert_eq!(Profiles::parse(&text, "t").unwrap(), p);
        // Interpolated in log size: halfway (128 MB) between 40 and 16 GB/s.
        assert!((cache.bytes_per_s_at(128e6) - 28e9).abs() < 1e3);
        // Beyond the sweep, its last point; below it, never under a larger set's speed
        // (8 MB's 20 GB/s is the threads' start-up).
        assert_eq!(cache.bytes_per_s_at(1e9), 16e9);
        assert_eq!(cache.bytes_per_s_at(4e6), 40e9);
        assert_eq!(cache.bytes_per_s_at(8e6), 40e9);
        // 1 MB of weights: 1e6 * (1/16e9 - 1/40e9) = 37.5 us from memory; none within
        // the cache.
        assert!((cache.stream_s(1e6, 500e6) - 37.5e-6).abs() < 1e-12);
        assert_eq!(cache.stream_s(1e6, 32e6), 0.0);
        assert_eq!(cache.stream_s(1e6, 4e6), 0.0);
        // No sweep: the cache's speed everywhere, nothing charged.
        assert_eq!(sweep(&[]).stream_s(1e6, 1e9), 0.0);
    }

    #[test]
    fn cache_and_read_records_name_their_errors() {
        let text =
            |recs: &str| format!("rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\n{recs}");
        let e = Profiles::parse(&text("read g bytes=1 bytes_per_s=1\n"), "p.txt").unwrap_err();
        assert_eq!(e, "p.txt: line 3: `read` for `g` before its `cache` record");
        let two = "cache g cache_bytes_per_s=1\nread g bytes=2 bytes_per_s=1\n\
                   read g bytes=2 bytes_per_s=1\n";
        let e = Profiles::parse(&text(two), "p.txt").unwrap_err();
        assert_eq!(
            e,
            "p.txt: line 5: `read` sizes must grow: bytes=2e0 after 2e0"
        );
        let e = Profiles::parse(&text("cache g cache_bytes_per_s=0\n"), "p.txt").unwrap_err();
        assert_eq!(e, "p.txt: line 3: `cache_bytes_per_s` must be positive");
        let e = Profiles::parse(&text("cache g\nread g bytes=1\n"), "p.txt").unwrap_err();
        assert_eq!(e, "p.txt: line 3: missing `cache_bytes_per_s`");
        let e = Profiles::parse("rafter-profiles 1\ncache g cache_bytes_per_s=1\n", "p.txt")
            .unwrap_err();
        assert_eq!(
            e,
            "p.txt: line 2: device `g` used before its `device` record"
        );
    }

    #[test]
    fn a_point_needs_its_device_and_a_positive_ratio() {
        let e = Profiles::parse(
            "rafter-profiles 1\npoint g conv flops=1 depth=1 ratio=1\n",
            "p.txt",
        )
        .unwrap_err();
        assert_eq!(
            e,
            "p.txt: line 2: device `g` used before its `device` record"
        );
        let text = "rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\n\
                    point g conv flops=1 depth=1 ratio=0\n";
        let e = Profiles::parse(text, "p.txt").unwrap_err();
        assert_eq!(e, "p.txt: line 3: `ratio` must be positive");
        let text = "rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\n\
                    point g conv flops=1 ratio=2\n";
        let e = Profiles::parse(text, "p.txt").unwrap_err();
        assert_eq!(e, "p.txt: line 3: missing `depth`");
    }

    #[test]
    fn dispatch_overlaps_defaults_to_false_and_must_be_a_bool() {
        let device =
            |extra: &str| format!("rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0{extra}\n");
        let old = Profiles::parse(&device(""), "p.txt").unwrap();
        assert!(!old.devices["g"].profile.dispatch_overlaps);
        let e = Profiles::parse(&device(" dispatch_overlaps=yes"), "p.txt").unwrap_err();
        assert_eq!(
            e,
            "p.txt: line 2: `dispatch_overlaps=yes` is not true or false"
        );
    }

    #[test]
    fn a_links_shared_memory_round_trips_and_defaults_to_the_devices() {
        let line = |extra: &str| {
            format!(
                "rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\n\
                 link g bytes_per_s=1e10 latency_s=1e-5 zero_copy=true{extra}\n"
            )
        };
        // Profiles written before the field: a zero-copy link is in the device's memory.
        let old = Profiles::parse(&line(""), "p.txt").unwrap();
        let link = old.devices["g"].link.unwrap();
        assert_eq!(link.shared(), Some(SharedMemory::Device));
        assert!(link.in_place());
        let host = Profiles::parse(&line(" shared_memory=host"), "p.txt").unwrap();
        let link = host.devices["g"].link.unwrap();
        assert_eq!(link.shared(), Some(SharedMemory::Host));
        assert!(!link.in_place());
        assert!(host.to_text().contains("zero_copy=true shared_memory=host"));
        assert_eq!(Profiles::parse(&host.to_text(), "t").unwrap(), host);
        let e = Profiles::parse(&line(" shared_memory=bar"), "p.txt").unwrap_err();
        assert_eq!(
            e,
            "p.txt: line 3: `shared_memory=bar` is not device or host"
        );
        // Not zero-copy: nothing is shared, whatever the field says.
        let mut copy = link;
        copy.zero_copy = false;
        assert_eq!(copy.shared(), None);
    }

    #[test]
    fn a_profile_without_half_scale_rates_half_as_f32() {
        let p = Profiles::parse(
            "rafter-profiles 1\ndevice cpu dispatch_s=1e-6 barrier_s=0\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.devices["cpu"].profile.half_scale, 1.0);
        let e = Profiles::parse(
            "rafter-profiles 1\ndevice cpu dispatch_s=1e-6 barrier_s=0 half_scale=0\n",
            "p.txt",
        )
        .unwrap_err();
        assert_eq!(e, "p.txt: line 2: `half_scale` must be positive");
    }

    #[test]
    fn bad_profiles_name_the_line_and_field() {
        let e = Profiles::parse("nope\n", "p.txt").unwrap_err();
        assert_eq!(e, "p.txt: line 1: expected `rafter-profiles 1`");
        let e = Profiles::parse(
            "rafter-profiles 1\ndevice cpu dispatch_s=1e-6 barrier_s=x\n",
            "p.txt",
        )
        .unwrap_err();
        assert_eq!(e, "p.txt: line 2: `barrier_s=x` is not a number");
        let e = Profiles::parse(
            "rafter-profiles 1\nclass gpu contraction flops_per_s=1\n",
            "p.txt",
        )
        .unwrap_err();
        assert!(e.contains("line 2: device `gpu` used before"), "{e}");
        let e = Profiles::parse(
            "rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\nclass g matmul flops_per_s=1\n",
            "p.txt",
        )
        .unwrap_err();
        assert_eq!(e, "p.txt: line 3: unknown class `matmul`");
        let e = Profiles::parse(
            "rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\nclass g opaque flops_per_s=0 bytes_per_s=1 half_flops=0\n",
            "p.txt",
        )
        .unwrap_err();
        assert_eq!(e, "p.txt: line 3: `flops_per_s` must be positive");
        let e = Profiles::parse(
            "rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\nclass g conv flops_per_s=1 bytes_per_s=1 half_flops=0 half_scale=0\n",
            "p.txt",
        )
        .unwrap_err();
        assert_eq!(e, "p.txt: line 3: `half_scale` must be positive");
        // The depth cost: optional (0 when absent), never negative or not a number.
        let line = |depth: &str| {
            format!(
                "rafter-profiles 1\ndevice g dispatch_s=0 barrier_s=0\nclass g conv \
                 flops_per_s=1 bytes_per_s=1 half_flops=0 depth_s={depth}\n"
            )
        };
        let e = Profiles::parse(&line("-1e-9"), "p.txt").unwrap_err();
        assert_eq!(
            e,
            "p.txt: line 3: `depth_s=-1e-9` must be finite and non-negative"
        );
        let e = Profiles::parse(&line("fast"), "p.txt").unwrap_err();
        assert_eq!(e, "p.txt: line 3: `depth_s=fast` is not a number");
        let p = Profiles::parse(&line("2e-8"), "p.txt").unwrap();
        assert_eq!(Profiles::parse(&p.to_text(), "t").unwrap(), p);
    }

    /// A profile written before `winograd_conv` existed still loads, and rates those
    /// convolutions as it did: at its `conv` rate, else its contraction rate.
    #[test]
    fn an_old_profile_rates_winograd_convolutions_as_convolutions() {
        let text = "rafter-profiles 1\ndevice cpu dispatch_s=1e-6 barrier_s=0\n\
                    class cpu contraction flops_per_s=5e10 bytes_per_s=1e10 half_flops=0\n\
                    class cpu conv flops_per_s=2e11 bytes_per_s=1e10 half_flops=1e5\n";
        let mut p = Profiles::parse(text, "old.txt").unwrap().get("cpu").profile;
        let wino = p.rate_of(Some("winograd_conv"), KernelKind::Contraction);
        assert_eq!(wino, p.classes["conv"]);
        p.classes.remove("conv");
        let wino = p.rate_of(Some("winograd_conv"), KernelKind::Contraction);
        assert_eq!(wino, p.classes["contraction"]);
        // Its own rate, once measured, round-trips.
        let own = ClassRate {
            flops_per_s: 4e11,
            ..p.classes["contraction"]
        };
        p.classes.insert("winograd_conv", own);
        assert_eq!(
            p.rate_of(Some("winograd_conv"), KernelKind::Contraction),
            own
        );
        let mut all = Profiles::default();
        all.insert(DeviceDescription {
            name: "cpu".into(),
            profile: p,
            memory_bytes: None,
            link: None,
        });
        assert_eq!(Profiles::parse(&all.to_text(), "t").unwrap(), all);
    }

    /// The built-in CPU profile rates Winograd convolutions above its other contractions;
    /// the built-in accelerator profile (no Winograd there) rates them as any.
    #[test]
    fn only_the_default_cpu_rates_winograd_faster() {
        let k = KernelKind::Contraction;
        let cpu = DeviceDescription::default_for("cpu").profile;
        let wino = cpu.rate_of(Some("winograd_conv"), k).flops_per_s;
        let conv = cpu.rate_of(Some("conv"), k).flops_per_s;
        assert_eq!(wino, conv * WINOGRAD_DEFAULT_GAIN);
        let gpu = DeviceDescription::default_for("vulkan").profile;
        assert_eq!(
            gpu.rate_of(Some("winograd_conv"), k),
            gpu.rate_of(Some("conv"), k)
        );
    }

    #[test]
    fn a_missing_class_falls_back_to_the_opaque_rate() {
        let mut d = DeviceDescription::default_for("npu");
        let opaque = d.profile.rate(KernelKind::Opaque);
        d.profile.classes.remove("reduction");
        assert_eq!(d.profile.rate(KernelKind::Reduction), opaque);
    }

    #[test]
    fn a_detail_class_is_rated_on_its_own_or_by_its_kind() {
        let mut d = DeviceDescription::default_for("cpu");
        let gemm = d.profile.rate(KernelKind::Contraction);
        assert_eq!(
            d.profile.rate_of(Some("conv"), KernelKind::Contraction),
            gemm
        );
        let conv = ClassRate {
            flops_per_s: 7e9,
            bytes_per_s: 3e9,
            half_flops: 1e5,
            half_scale: Some(1.5),
            depth_s: 0.0,
        };
        d.profile.classes.insert("conv", conv);
        assert_eq!(
            d.profile.rate_of(Some("conv"), KernelKind::Contraction),
            conv
        );
        assert_eq!(d.profile.rate_of(None, KernelKind::Contraction), gemm);
        let mut p = Profiles::default();
        p.insert(d);
        assert_eq!(Profiles::parse(&p.to_text(), "t").unwrap(), p);
    }
}
