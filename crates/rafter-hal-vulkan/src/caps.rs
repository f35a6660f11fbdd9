//! What a physical device offers, and what rafter makes of it.
//!
//! rafter needs three things no Vulkan 1.3 driver should lack but some do (old or partial
//! drivers, translation layers): buffer device addresses (every kernel reaches its buffers
//! through 64-bit pointers in push constants, which is how one allocation can exceed the
//! descriptor range), timeline semaphores (the HAL's only synchronisation primitive) and
//! synchronization2 (`vkQueueSubmit2`, `vkCmdPipelineBarrier2`). A device without one of them
//! is refused with an error naming what it lacks. Everything else is optional: a missing
//! feature takes away what depends on it (a dtype, subgroup reductions, cooperative-matrix
//! contractions) and [`VulkanCapabilities::degradations`] says what.

use std::fmt::{self, Write as _};

use ash::vk;

/// One configuration of `VK_KHR_cooperative_matrix`: an `M x N x K` tile with its types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoopMatrixShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Component types, by IR name where one exists (`f16`, `f32`, `i8`, ...).
    pub a: String,
    pub b: String,
    pub c: String,
    pub result: String,
    /// Offered at subgroup scope (the scope rafter's kernels use).
    pub subgroup_scope: bool,
}

/// The device limits that matter to rafter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VulkanLimits {
    /// The largest range one storage-buffer descriptor can cover. rafter binds nothing
    /// through descriptors, so this does *not* bound a tensor; it is reported because it is
    /// the limit the device-address path exists to get around (128 MiB on lavapipe).
    pub max_storage_buffer_range: u64,
    /// `maxBufferSize` (maintenance4): the largest `VkBuffer`.
    pub max_buffer_size: u64,
    /// `maxMemoryAllocationSize`: the largest single `VkDeviceMemory`.
    pub max_memory_allocation_size: u64,
    pub max_push_constants_size: u32,
    pub max_compute_shared_memory_size: u32,
    pub max_compute_workgroup_count: [u32; 3],
    pub max_compute_workgroup_size: [u32; 3],
    pub max_compute_workgroup_invocations: u32,
    pub non_coherent_atom_size: u64,
    /// `maxTimelineSemaphoreValueDifference`.
    pub max_timeline_semaphore_value_difference: u64,
}

/// One memory type, as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryTypeInfo {
    pub flags: vk::MemoryPropertyFlags,
    pub heap: u32,
}

/// One memory heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryHeapInfo {
    pub size: u64,
    pub device_local: bool,
}

/// Everything rafter reads from a physical device: identity, features, subgroup and
/// cooperative-matrix support, limits, memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VulkanCapabilities {
    /// Index in the loader's enumeration (what `RAFTER_VULKAN_DEVICE` selects).
    pub index: usize,
    pub device_name: String,
    /// `discrete`, `integrated`, `virtual`, `cpu` or `other`.
    pub device_type: &'static str,
    /// The device's Vulkan version, `(major, minor, patch)`.
    pub api_version: (u32, u32, u32),
    pub driver_name: String,
    pub driver_info: String,
    pub vendor_id: u32,
    pub device_id: u32,
    pub pipeline_cache_uuid: [u8; 16],

    pub buffer_device_address: bool,
    pub timeline_semaphore: bool,
    pub synchronization2: bool,
    pub maintenance4: bool,
    pub storage_buffer_8bit: bool,
    pub storage_buffer_16bit: bool,
    pub shader_int8: bool,
    pub shader_int16: bool,
    pub shader_float16: bool,
    pub shader_int64: bool,
    pub shader_float64: bool,
    pub vulkan_memory_model: bool,
    pub subgroup_size_control: bool,
    pub compute_full_subgroups: bool,

    /// The default subgroup size.
    pub subgroup_size: u32,
    /// `(min, max)` subgroup sizes a pipeline may request (subgroup size control).
    pub subgroup_size_range: (u32, u32),
    /// Subgroup operations are available in compute shaders.
    pub subgroup_in_compute: bool,
    /// Supported subgroup operation classes (`basic`, `vote`, `arithmetic`, `ballot`,
    /// `shuffle`, `shuffle_relative`, `clustered`, `quad`).
    pub subgroup_ops: Vec<&'static str>,
    /// `None` when `VK_KHR_cooperative_matrix` is absent; otherwise the configurations the
    /// driver lists (possibly empty).
    pub cooperative_matrix: Option<Vec<CoopMatrixShape>>,

    pub limits: VulkanLimits,
    pub memory_types: Vec<MemoryTypeInfo>,
    pub memory_heaps: Vec<MemoryHeapInfo>,
    /// The queue family rafter uses and how many queues it has (`None`: no compute queue).
    pub compute_queue_family: Option<(u32, u32)>,
    /// Picoseconds per timestamp tick, and the valid bits of that queue family's
    /// timestamps (0: no timestamps, so no GPU trace).
    pub timestamp_period_ps: u64,
    pub timestamp_valid_bits: u32,
}

/// `(feature, what its absence disables)`, in report order.
const OPTIONAL: &[(&str, &str)] = &[
    (
        "maintenance4",
        "maxBufferSize is unknown, so buffers are capped at maxMemoryAllocationSize",
    ),
    (
        "storageBuffer8BitAccess",
        "i8/u8 tensors (quantized weights) cannot be read or written by kernels",
    ),
    (
        "storageBuffer16BitAccess",
        "f16/i16 tensors cannot be read or written by kernels",
    ),
    (
        "shaderInt8",
        "i8/u8 arithmetic (quantized kernels) is unavailable",
    ),
    ("shaderInt16", "i16/u16 arithmetic is unavailable"),
    (
        "shaderFloat16",
        "f16 arithmetic is unavailable (f16 models run in f32 or not at all)",
    ),
    (
        "shaderInt64",
        "i64 tensors (token ids, shapes) cannot be computed, and generated kernels (which compute \
         element addresses as 64-bit integers) cannot run on this device",
    ),
    (
        "shaderFloat64",
        "f64 tensors cannot be computed on this device",
    ),
    (
        "subgroup arithmetic in compute",
        "reductions fall back to workgroup-memory trees",
    ),
    (
        "subgroupSizeControl",
        "kernels cannot pin their subgroup size",
    ),
    (
        "VK_KHR_cooperative_matrix",
        "contractions use the tiled workgroup-memory kernels, not matrix units",
    ),
];

impl VulkanCapabilities {
    /// Required features the device lacks; a non-empty list means rafter refuses it.
    pub fn missing_required(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.api_version < (1, 3, 0) {
            missing.push("Vulkan 1.3");
        }
        if !self.buffer_device_address {
            missing.push("bufferDeviceAddress");
        }
        if !self.timeline_semaphore {
            missing.push("timelineSemaphore");
        }
        if !self.synchronization2 {
            missing.push("synchronization2");
        }
        if self.compute_queue_family.is_none() {
            missing.push("a compute queue");
        }
        missing
    }

    /// The device features a SPIR-V module needs (from the capabilities it declares) that
    /// this device lacks, by their Vulkan names. The loader refuses such a module with
    /// this list rather than hand it to the driver.
    pub fn missing_for_module(&self, words: &[u32]) -> Result<Vec<&'static str>, String> {
        // SPIR-V capability numbers (the SPIR-V spec's Capability table).
        const FLOAT16: u32 = 9;
        const FLOAT64: u32 = 10;
        const INT64: u32 = 11;
        const INT16: u32 = 22;
        const INT8: u32 = 39;
        const STORAGE_BUFFER_16BIT: u32 = 4433;
        const STORAGE_BUFFER_8BIT: u32 = 4448;
        const GROUP_NON_UNIFORM: u32 = 61;
        const VULKAN_MEMORY_MODEL: u32 = 5345;
        const COOPERATIVE_MATRIX: u32 = 6022;
        let mut missing = Vec::new();
        for capability in crate::executable::spirv_capabilities(words)? {
            let (feature, present) = match capability {
                FLOAT16 => ("shaderFloat16", self.shader_float16),
                FLOAT64 => ("shaderFloat64", self.shader_float64),
                INT64 => ("shaderInt64", self.shader_int64),
                INT16 => ("shaderInt16", self.shader_int16),
                INT8 => ("shaderInt8", self.shader_int8),
                STORAGE_BUFFER_16BIT => ("storageBuffer16BitAccess", self.storage_buffer_16bit),
                STORAGE_BUFFER_8BIT => ("storageBuffer8BitAccess", self.storage_buffer_8bit),
                GROUP_NON_UNIFORM => (
                    "subgroup operations in compute",
                    self.subgroup_in_compute && self.subgroup_ops.contains(&"basic"),
                ),
                VULKAN_MEMORY_MODEL => ("vulkanMemoryModel", self.vulkan_memory_model),
                COOPERATIVE_MATRIX => (
                    "cooperativeMatrix (16x16x16 f16*f16+f32 at subgroup scope, 32-wide \
                     subgroups)",
                    self.has_coop_f16(),
                ),
                _ => continue,
            };
            if !present && !missing.contains(&feature) {
                missing.push(feature);
            }
        }
        Ok(missing)
    }

    /// `(declared, offered)` bytes of workgroup memory when a SPIR-V module declares more
    /// than the device's `maxComputeSharedMemorySize` (the loader refuses it, so that a
    /// variant written for a bigger device falls back to its plain kernel); `None` when
    /// it fits.
    pub fn workgroup_memory_excess(&self, words: &[u32]) -> Result<Option<(u64, u64)>, String> {
        let declared = crate::executable::spirv_workgroup_bytes(words)?;
        let offered = u64::from(self.limits.max_compute_shared_memory_size);
        Ok((declared > offered).then_some((declared, offered)))
    }

    /// Whether the device runs rafter's cooperative-matrix kernels: the 16×16×16
    /// configuration of f16 A and B with f32 accumulator and result, at subgroup scope,
    /// with 32-invocation subgroups (`rafter_codegen_spirv`'s `COOP_*` constants).
    pub fn has_coop_f16(&self) -> bool {
        self.subgroup_size == 32
            && self.cooperative_matrix.as_ref().is_some_and(|shapes| {
                shapes.iter().any(|s| {
                    (s.m, s.n, s.k) == (16, 16, 16)
                        && (s.a.as_str(), s.b.as_str()) == ("f16", "f16")
                        && (s.c.as_str(), s.result.as_str()) == ("f32", "f32")
                        && s.subgroup_scope
                })
            })
    }

    /// Whether a feature of [`OPTIONAL`] is present.
    fn has_optional(&self, name: &str) -> bool {
        match name {
            "maintenance4" => self.maintenance4,
            "storageBuffer8BitAccess" => self.storage_buffer_8bit,
            "storageBuffer16BitAccess" => self.storage_buffer_16bit,
            "shaderInt8" => self.shader_int8,
            "shaderInt16" => self.shader_int16,
            "shaderFloat16" => self.shader_float16,
            "shaderInt64" => self.shader_int64,
            "shaderFloat64" => self.shader_float64,
            "subgroup arithmetic in compute" => {
                self.subgroup_in_compute && self.subgroup_ops.contains(&"arithmetic")
            }
            "subgroupSizeControl" => self.subgroup_size_control,
            "VK_KHR_cooperative_matrix" => self.cooperative_matrix.is_some(),
            _ => false,
        }
    }

    /// Optional features the device lacks, each with what its absence disables.
    pub fn degradations(&self) -> Vec<(&'static str, &'static str)> {
        OPTIONAL
            .iter()
            .filter(|(name, _)| !self.has_optional(name))
            .copied()
            .collect()
    }

    /// IR dtypes kernels on this device can load, store and compute in.
    pub fn dtypes(&self) -> Vec<&'static str> {
        let mut dtypes = vec!["f32", "i32", "u32", "bool"];
        if self.shader_float16 && self.storage_buffer_16bit {
            dtypes.push("f16");
        }
        if self.shader_int16 && self.storage_buffer_16bit {
            dtypes.extend(["i16", "u16"]);
        }
        if self.shader_int8 && self.storage_buffer_8bit {
            dtypes.extend(["i8", "u8"]);
        }
        if self.shader_int64 {
            dtypes.extend(["i64", "u64"]);
        }
        if self.shader_float64 {
            dtypes.push("f64");
        }
        dtypes
    }

    /// Named features for [`rafter_hal::Capabilities::features`].
    pub fn feature_names(&self) -> Vec<String> {
        let mut features = Vec::new();
        let mut push = |on: bool, name: &str| {
            if on {
                features.push(name.to_string());
            }
        };
        push(self.buffer_device_address, "buffer-device-address");
        push(self.timeline_semaphore, "timeline-semaphore");
        push(self.synchronization2, "synchronization2");
        push(self.maintenance4, "maintenance4");
        push(self.storage_buffer_8bit, "storage-buffer-8bit");
        push(self.storage_buffer_16bit, "storage-buffer-16bit");
        push(self.shader_int8, "shader-int8");
        push(self.shader_int16, "shader-int16");
        push(self.shader_float16, "shader-float16");
        push(self.shader_int64, "shader-int64");
        push(self.shader_float64, "shader-float64");
        push(self.subgroup_size_control, "subgroup-size-control");
        if self.subgroup_in_compute {
            push(true, "subgroups");
            for op in &self.subgroup_ops {
                features.push(format!("subgroup-{}", op.replace('_', "-")));
            }
        }
        if self.cooperative_matrix.is_some() {
            features.push("cooperative-matrix".to_string());
        }
        features
    }

    /// A multi-line, human-readable report: identity, required and optional features with
    /// what a missing one disables, subgroups, cooperative matrix, limits and memory.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let yes = |b: bool| if b { "yes" } else { "NO" };
        let (ma, mi, pa) = self.api_version;
        let _ = writeln!(
            out,
            "vulkan device {}: {} ({}), Vulkan {ma}.{mi}.{pa}, driver {} {}",
            self.index, self.device_name, self.device_type, self.driver_name, self.driver_info
        );
        let _ = writeln!(
            out,
            "  required: bufferDeviceAddress {}, timelineSemaphore {}, synchronization2 {}",
            yes(self.buffer_device_address),
            yes(self.timeline_semaphore),
            yes(self.synchronization2)
        );
        let _ = writeln!(
            out,
            "  optional: maintenance4 {}, storageBuffer8BitAccess {}, storageBuffer16BitAccess {}, \
             shaderInt8 {}, shaderInt16 {}, shaderFloat16 {}, shaderInt64 {}, shaderFloat64 {}, \
             vulkanMemoryModel {}",
            yes(self.maintenance4),
            yes(self.storage_buffer_8bit),
            yes(self.storage_buffer_16bit),
            yes(self.shader_int8),
            yes(self.shader_int16),
            yes(self.shader_float16),
            yes(self.shader_int64),
            yes(self.shader_float64),
            yes(self.vulkan_memory_model),
        );
        let _ = writeln!(
            out,
            "  subgroups: size {} (control {}: {}..{}), in compute {}, ops [{}]",
            self.subgroup_size,
            yes(self.subgroup_size_control),
            self.subgroup_size_range.0,
            self.subgroup_size_range.1,
            yes(self.subgroup_in_compute),
            self.subgroup_ops.join(", ")
        );
        match &self.cooperative_matrix {
            None => {
                let _ = writeln!(
                    out,
                    "  cooperative matrix: NO (VK_KHR_cooperative_matrix absent)"
                );
            }
            Some(shapes) => {
                let listed: Vec<String> = shapes
                    .iter()
                    .map(|s| {
                        format!(
                            "{}x{}x{} {}*{}+{}->{}",
                            s.m, s.n, s.k, s.a, s.b, s.c, s.result
                        )
                    })
                    .collect();
                let _ = writeln!(out, "  cooperative matrix: yes [{}]", listed.join(", "));
            }
        }
        let l = &self.limits;
        let _ = writeln!(
            out,
            "  limits: maxStorageBufferRange {}, maxBufferSize {}, maxMemoryAllocationSize {}, \
             maxPushConstantsSize {}, shared memory {}, workgroup count {:?}, workgroup size {:?} \
             ({} invocations)",
            bytes(l.max_storage_buffer_range),
            bytes(l.max_buffer_size),
            bytes(l.max_memory_allocation_size),
            l.max_push_constants_size,
            bytes(l.max_compute_shared_memory_size as u64),
            l.max_compute_workgroup_count,
            l.max_compute_workgroup_size,
            l.max_compute_workgroup_invocations,
        );
        for (i, heap) in self.memory_heaps.iter().enumerate() {
            let types: Vec<String> = self
                .memory_types
                .iter()
                .enumerate()
                .filter(|(_, t)| t.heap as usize == i)
                .map(|(ti, t)| format!("type {ti} {}", memory_flags(t.flags)))
                .collect();
            let _ = writeln!(
                out,
                "  memory heap {i}: {}{}: {}",
                bytes(heap.size),
                if heap.device_local {
                    " device-local"
                } else {
                    ""
                },
                types.join("; ")
            );
        }
        match self.compute_queue_family {
            Some((family, count)) => {
                let _ = writeln!(out, "  compute queues: family {family}, {count} queues");
            }
            None => {
                let _ = writeln!(out, "  compute queues: NONE");
            }
        }
        for (feature, disables) in self.degradations() {
            let _ = writeln!(out, "  missing {feature}: {disables}");
        }
        let missing = self.missing_required();
        if !missing.is_empty() {
            let _ = writeln!(
                out,
                "  REFUSED: lacks {} (rafter needs them all)",
                missing.join(", ")
            );
        }
        out
    }
}

impl fmt::Display for VulkanCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.report())
    }
}

/// `DEVICE_LOCAL|HOST_VISIBLE|...` in short words.
pub(crate) fn memory_flags(flags: vk::MemoryPropertyFlags) -> String {
    let names = [
        (vk::MemoryPropertyFlags::DEVICE_LOCAL, "device-local"),
        (vk::MemoryPropertyFlags::HOST_VISIBLE, "host-visible"),
        (vk::MemoryPropertyFlags::HOST_COHERENT, "host-coherent"),
        (vk::MemoryPropertyFlags::HOST_CACHED, "host-cached"),
        (vk::MemoryPropertyFlags::LAZILY_ALLOCATED, "lazy"),
        (vk::MemoryPropertyFlags::PROTECTED, "protected"),
    ];
    let words: Vec<&str> = names
        .iter()
        .filter(|(f, _)| flags.contains(*f))
        .map(|(_, n)| *n)
        .collect();
    if words.is_empty() {
        "(no flags)".to_string()
    } else {
        words.join("|")
    }
}

/// Bytes in the largest binary unit that divides them evenly enough to read.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size {
            let value = n as f64 / size as f64;
            return if n % size == 0 {
                format!("{} {unit}", n / size)
            } else {
                format!("{value:.1} {unit}")
            };
        }
    }
    format!("{n} B")
}

pub(crate) fn device_type_name(t: vk::PhysicalDeviceType) -> &'static str {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => "discrete",
        vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated",
        vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual",
        vk::PhysicalDeviceType::CPU => "cpu",
        _ => "other",
    }
}

pub(crate) fn subgroup_op_names(flags: vk::SubgroupFeatureFlags) -> Vec<&'static str> {
    [
        (vk::SubgroupFeatureFlags::BASIC, "basic"),
        (vk::SubgroupFeatureFlags::VOTE, "vote"),
        (vk::SubgroupFeatureFlags::ARITHMETIC, "arithmetic"),
        (vk::SubgroupFeatureFlags::BALLOT, "ballot"),
        (vk::SubgroupFeatureFlags::SHUFFLE, "shuffle"),
        (
            vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE,
            "shuffle_relative",
        ),
        (vk::SubgroupFeatureFlags::CLUSTERED, "clustered"),
        (vk::SubgroupFeatureFlags::QUAD, "quad"),
    ]
    .iter()
    .filter(|(f, _)| flags.contains(*f))
    .map(|(_, n)| *n)
    .collect()
}

pub(crate) fn component_type_name(t: vk::ComponentTypeKHR) -> String {
    match t {
        vk::ComponentTypeKHR::FLOAT16 => "f16".into(),
        vk::ComponentTypeKHR::FLOAT32 => "f32".into(),
        vk::ComponentTypeKHR::FLOAT64 => "f64".into(),
        vk::ComponentTypeKHR::SINT8 => "i8".into(),
        vk::ComponentTypeKHR::SINT16 => "i16".into(),
        vk::ComponentTypeKHR::SINT32 => "i32".into(),
        vk::ComponentTypeKHR::SINT64 => "i64".into(),
        vk::ComponentTypeKHR::UINT8 => "u8".into(),
        vk::ComponentTypeKHR::UINT16 => "u16".into(),
        vk::ComponentTypeKHR::UINT32 => "u32".into(),
        vk::ComponentTypeKHR::UINT64 => "u64".into(),
        other => format!("type{}", other.as_raw()),
    }
}
