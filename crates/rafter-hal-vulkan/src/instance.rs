//! The Vulkan loader, the instance, and choosing a physical device.

use std::ffi::{c_char, CStr};
use std::sync::Arc;

use ash::vk;

use crate::caps::{
    component_type_name, device_type_name, subgroup_op_names, CoopMatrixShape, MemoryHeapInfo,
    MemoryTypeInfo, VulkanCapabilities, VulkanLimits,
};
use crate::error::VulkanError;
use crate::validation::{self, Validation, ValidationLog};

/// The environment variable that picks a device by its index in the loader's enumeration
/// (as `rafter devices` lists them), overriding the preference for discrete GPUs.
pub const DEVICE_ENV: &str = "RAFTER_VULKAN_DEVICE";

/// The loaded entry points and a Vulkan 1.3 instance; destroyed when the last device made
/// from it is gone.
pub(crate) struct InstanceOwner {
    pub(crate) entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    /// With validation on: the messenger, destroyed before the instance.
    messenger: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    /// What the validation layer reported. On the heap: the layer holds its address as the
    /// messenger's user data, so it must not move; this reference keeps it alive until
    /// after the instance is destroyed (fields drop after `Drop::drop`).
    pub(crate) log: ValidationLog,
    pub(crate) validation: Validation,
    /// With validation on: the layer's Vulkan header version (`specVersion`).
    pub(crate) layer_spec: Option<u32>,
}

impl Drop for InstanceOwner {
    fn drop(&mut self) {
        // SAFETY: every object created from this instance (devices hold an Arc to this owner)
        // has been destroyed before the last Arc is dropped; the messenger was created from
        // this instance and is destroyed once, before it.
        unsafe {
            if let Some((loader, messenger)) = self.messenger.take() {
                loader.destroy_debug_utils_messenger(messenger, None);
            }
            self.instance.destroy_instance(None)
        };
    }
}

/// A physical device with what rafter read from it.
pub(crate) struct Candidate {
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) caps: VulkanCapabilities,
}

/// Loads the loader and creates an instance, with the validation layer and a messenger
/// into the owner's collector when `validation` asks for it. Errors say what was missing, in
/// the words of the "no device" error so a user sees one kind of message.
pub(crate) fn create_instance(validation: Validation) -> Result<Arc<InstanceOwner>, VulkanError> {
    // SAFETY: loading the system's Vulkan loader runs its initialisers; that is the
    // documented way to use Vulkan, and we do it before any other Vulkan call.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| VulkanError::NoDevice {
        drivers: format!("the Vulkan loader (libvulkan.so.1) could not be loaded: {e}"),
    })?;
    // SAFETY: `entry` is a loaded loader; the call has no preconditions.
    let version = unsafe { entry.try_enumerate_instance_version() }
        .ok()
        .flatten()
        .unwrap_or(vk::API_VERSION_1_0);
    if version < vk::API_VERSION_1_3 {
        return Err(VulkanError::NoDevice {
            drivers: format!(
                "the Vulkan loader only offers instance version {}",
                version_string(version)
            ),
        });
    }
    let app = vk::ApplicationInfo::default()
        .application_name(c"rafter")
        .engine_name(c"rafter")
        .api_version(vk::API_VERSION_1_3);
    let log = ValidationLog::default();
    let on = validation != Validation::Off;
    let layer_spec = if on {
        Some(validation::check_layer(&entry)?)
    } else {
        None
    };
    let layers = validation::layers();
    let extensions = validation::extensions();
    let mut features = validation::features_info(validation);
    // SAFETY: the collector is behind an `Arc` the owner holds until after the instance and
    // the messenger are destroyed.
    let mut messages = unsafe { validation::messenger_info(&*log.0) };
    let mut info = vk::InstanceCreateInfo::default().application_info(&app);
    if on {
        // The messenger chained here reports vkCreateInstance and vkDestroyInstance.
        info = info
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions)
            .push_next(&mut features)
            .push_next(&mut messages);
    }
    // SAFETY: `info` and what it points to live across the call.
    let instance =
        unsafe { entry.create_instance(&info, None) }.map_err(|e| VulkanError::NoDevice {
            drivers: if e == vk::Result::ERROR_INCOMPATIBLE_DRIVER {
                "the loader found no Vulkan driver (no ICD manifest in /usr/share/vulkan/icd.d \
                 or VK_DRIVER_FILES; Debian's mesa-vulkan-drivers provides lavapipe)"
                    .to_string()
            } else {
                format!("vkCreateInstance for Vulkan 1.3 failed: {e}")
            },
        })?;
    let mut owner = InstanceOwner {
        entry,
        instance,
        messenger: None,
        log,
        validation,
        layer_spec,
    };
    if on {
        let loader = ash::ext::debug_utils::Instance::new(&owner.entry, &owner.instance);
        // SAFETY: as for the chained messenger above; the info lives across the call.
        let info = unsafe { validation::messenger_info(&*owner.log.0) };
        // SAFETY: the instance enabled VK_EXT_debug_utils; `info` lives across the call.
        let messenger =
            unsafe { loader.create_debug_utils_messenger(&info, None) }.map_err(|result| {
                VulkanError::Call {
                    call: "vkCreateDebugUtilsMessengerEXT",
                    result,
                }
            })?;
        owner.messenger = Some((loader, messenger));
    }
    Ok(Arc::new(owner))
}

/// Every physical device the loader reports, with its capabilities.
pub(crate) fn enumerate(owner: &InstanceOwner) -> Result<Vec<Candidate>, VulkanError> {
    // SAFETY: the instance is alive for the duration of the call.
    let physicals = unsafe { owner.instance.enumerate_physical_devices() }.map_err(|e| {
        VulkanError::NoDevice {
            drivers: format!("vkEnumeratePhysicalDevices failed: {e}"),
        }
    })?;
    Ok(physicals
        .into_iter()
        .enumerate()
        .map(|(index, physical)| Candidate {
            physical,
            caps: query(owner, physical, index),
        })
        .collect())
}

/// Picks the device to open: `requested` (or `RAFTER_VULKAN_DEVICE`) by index, else the
/// first discrete GPU, then integrated, virtual, CPU, other, among the suitable ones.
pub(crate) fn select(
    candidates: Vec<Candidate>,
    requested: Option<usize>,
) -> Result<Candidate, VulkanError> {
    let requested = match requested {
        Some(index) => Some(index),
        None => match std::env::var(DEVICE_ENV) {
            Ok(value) if !value.trim().is_empty() => Some(value.trim().parse::<usize>().map_err(
                |_| VulkanError::BadSelection {
                    reason: format!(
                        "{DEVICE_ENV}={value:?} is not a device index (0..{})",
                        candidates.len()
                    ),
                },
            )?),
            _ => None,
        },
    };
    if candidates.is_empty() {
        return Err(VulkanError::NoDevice {
            drivers: "the loader found no physical device (is an ICD installed? \
                      Debian: mesa-vulkan-drivers for lavapipe; VK_DRIVER_FILES names one)"
                .into(),
        });
    }
    if let Some(index) = requested {
        let count = candidates.len();
        let candidate =
            candidates
                .into_iter()
                .nth(index)
                .ok_or_else(|| VulkanError::BadSelection {
                    reason: format!("device index {index} requested, but there are only {count}"),
                })?;
        let missing = candidate.caps.missing_required();
        if !missing.is_empty() {
            return Err(VulkanError::Unsuitable {
                index,
                name: candidate.caps.device_name.clone(),
                missing: missing.join(", "),
            });
        }
        return Ok(candidate);
    }
    let rank = |t: &str| match t {
        "discrete" => 0,
        "integrated" => 1,
        "virtual" => 2,
        "cpu" => 3,
        _ => 4,
    };
    let summary: Vec<String> = candidates.iter().map(describe).collect();
    candidates
        .into_iter()
        .filter(|c| c.caps.missing_required().is_empty())
        .min_by_key(|c| (rank(c.caps.device_type), c.caps.index))
        .ok_or_else(|| VulkanError::NoDevice {
            drivers: summary.join("; "),
        })
}

/// `llvmpipe (cpu, Vulkan 1.3.230, lvp): lacks bufferDeviceAddress` for the error message.
fn describe(c: &Candidate) -> String {
    let (ma, mi, pa) = c.caps.api_version;
    let missing = c.caps.missing_required();
    let verdict = if missing.is_empty() {
        "usable".to_string()
    } else {
        format!("lacks {}", missing.join(", "))
    };
    format!(
        "{} ({}, Vulkan {ma}.{mi}.{pa}, driver {}): {verdict}",
        c.caps.device_name, c.caps.device_type, c.caps.driver_name
    )
}

pub(crate) fn version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

fn c_string(chars: &[c_char]) -> String {
    // SAFETY: reinterpreting c_char (i8 or u8) as u8 is a same-size, same-alignment cast.
    let bytes: &[u8] = unsafe { std::slice::from_raw_parts(chars.as_ptr().cast(), chars.len()) };
    CStr::from_bytes_until_nul(bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether the device offers the extension called `name`.
pub(crate) fn has_extension(
    owner: &InstanceOwner,
    physical: vk::PhysicalDevice,
    name: &CStr,
) -> bool {
    // SAFETY: `physical` came from this instance, which is alive.
    let extensions = unsafe {
        owner
            .instance
            .enumerate_device_extension_properties(physical)
    }
    .unwrap_or_default();
    extensions
        .iter()
        .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
}

/// Reads properties, features, limits and memory of one physical device.
fn query(owner: &InstanceOwner, physical: vk::PhysicalDevice, index: usize) -> VulkanCapabilities {
    let instance = &owner.instance;
    // SAFETY: (for every call in this function) `physical` was enumerated from `instance`,
    // which outlives the calls; each out-structure chain is built from locals that live
    // across the call that fills it.
    let base = unsafe { instance.get_physical_device_properties(physical) };
    let api = base.api_version;
    let is_13 = api >= vk::API_VERSION_1_3;
    let coop_ext = has_extension(owner, physical, ash::khr::cooperative_matrix::NAME);

    let mut p11 = vk::PhysicalDeviceVulkan11Properties::default();
    let mut p12 = vk::PhysicalDeviceVulkan12Properties::default();
    let mut p13 = vk::PhysicalDeviceVulkan13Properties::default();
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let base_features = if is_13 {
        {
            let mut props = vk::PhysicalDeviceProperties2::default()
                .push_next(&mut p11)
                .push_next(&mut p12)
                .push_next(&mut p13);
            // SAFETY: as the comment at the top of this function says.
            unsafe { instance.get_physical_device_properties2(physical, &mut props) };
        }
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut f11)
            .push_next(&mut f12)
            .push_next(&mut f13);
        // SAFETY: as the comment at the top of this function says.
        unsafe { instance.get_physical_device_features2(physical, &mut features) };
        features.features
    } else {
        // SAFETY: as the comment at the top of this function says.
        unsafe { instance.get_physical_device_features(physical) }
    };
    let cooperative_matrix = if is_13 && coop_ext {
        let loader = ash::khr::cooperative_matrix::Instance::new(&owner.entry, instance);
        // SAFETY: as the comment at the top of this function says.
        let shapes = unsafe { loader.get_physical_device_cooperative_matrix_properties(physical) }
            .unwrap_or_default();
        Some(
            shapes
                .iter()
                .map(|s| CoopMatrixShape {
                    m: s.m_size,
                    n: s.n_size,
                    k: s.k_size,
                    a: component_type_name(s.a_type),
                    b: component_type_name(s.b_type),
                    c: component_type_name(s.c_type),
                    result: component_type_name(s.result_type),
                    subgroup_scope: s.scope == vk::ScopeKHR::SUBGROUP,
                })
                .collect(),
        )
    } else {
        None
    };
    // SAFETY: as the comment at the top of this function says.
    let memory = unsafe { instance.get_physical_device_memory_properties(physical) };
    // SAFETY: as the comment at the top of this function says.
    let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
    let compute_queue_family = pick_queue_family(&families);
    let limits = &base.limits;
    let on = |b: vk::Bool32| b == vk::TRUE;
    VulkanCapabilities {
        index,
        device_name: c_string(&base.device_name),
        device_type: device_type_name(base.device_type),
        api_version: (
            vk::api_version_major(api),
            vk::api_version_minor(api),
            vk::api_version_patch(api),
        ),
        driver_name: c_string(&p12.driver_name),
        driver_info: c_string(&p12.driver_info),
        vendor_id: base.vendor_id,
        device_id: base.device_id,
        pipeline_cache_uuid: base.pipeline_cache_uuid,
        buffer_device_address: on(f12.buffer_device_address),
        timeline_semaphore: on(f12.timeline_semaphore),
        synchronization2: on(f13.synchronization2),
        maintenance4: on(f13.maintenance4),
        storage_buffer_8bit: on(f12.storage_buffer8_bit_access),
        storage_buffer_16bit: on(f11.storage_buffer16_bit_access),
        shader_int8: on(f12.shader_int8),
        shader_int16: on(base_features.shader_int16),
        shader_float16: on(f12.shader_float16),
        shader_int64: on(base_features.shader_int64),
        shader_float64: on(base_features.shader_float64),
        vulkan_memory_model: on(f12.vulkan_memory_model),
        subgroup_size_control: on(f13.subgroup_size_control),
        compute_full_subgroups: on(f13.compute_full_subgroups),
        subgroup_size: p11.subgroup_size,
        subgroup_size_range: (p13.min_subgroup_size, p13.max_subgroup_size),
        subgroup_in_compute: p11
            .subgroup_supported_stages
            .contains(vk::ShaderStageFlags::COMPUTE),
        subgroup_ops: subgroup_op_names(p11.subgroup_supported_operations),
        cooperative_matrix,
        limits: VulkanLimits {
            max_storage_buffer_range: limits.max_storage_buffer_range as u64,
            max_buffer_size: if on(f13.maintenance4) {
                p13.max_buffer_size
            } else {
                p11.max_memory_allocation_size
            },
            max_memory_allocation_size: p11.max_memory_allocation_size,
            max_push_constants_size: limits.max_push_constants_size,
            max_compute_shared_memory_size: limits.max_compute_shared_memory_size,
            max_compute_workgroup_count: limits.max_compute_work_group_count,
            max_compute_workgroup_size: limits.max_compute_work_group_size,
            max_compute_workgroup_invocations: limits.max_compute_work_group_invocations,
            non_coherent_atom_size: limits.non_coherent_atom_size,
            max_timeline_semaphore_value_difference: p12.max_timeline_semaphore_value_difference,
        },
        memory_types: memory
            .memory_types_as_slice()
            .iter()
            .map(|t| MemoryTypeInfo {
                flags: t.property_flags,
                heap: t.heap_index,
            })
            .collect(),
        memory_heaps: memory
            .memory_heaps_as_slice()
            .iter()
            .map(|h| MemoryHeapInfo {
                size: h.size,
                device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
            })
            .collect(),
        compute_queue_family,
        timestamp_period_ps: (limits.timestamp_period as f64 * 1000.0).round() as u64,
        timestamp_valid_bits: compute_queue_family
            .and_then(|(f, _)| families.get(f as usize))
            .map_or(0, |f| f.timestamp_valid_bits),
    }
}

/// A compute-only family when there is one (an async-compute engine on discrete GPUs), else
/// the first family that can compute.
fn pick_queue_family(families: &[vk::QueueFamilyProperties]) -> Option<(u32, u32)> {
    let compute = |f: &vk::QueueFamilyProperties| {
        f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0
    };
    let dedicated = families
        .iter()
        .position(|f| compute(f) && !f.queue_flags.contains(vk::QueueFlags::GRAPHICS));
    let any = families.iter().position(compute);
    dedicated
        .or(any)
        .map(|i| (i as u32, families[i].queue_count))
}

/// Describes every physical device the loader finds, whether rafter could use it or not
/// (what `rafter devices` prints). An error only when there is no loader or instance.
pub fn list_devices() -> Result<Vec<VulkanCapabilities>, VulkanError> {
    let owner = create_instance(Validation::from_env()?)?;
    Ok(enumerate(&owner)?.into_iter().map(|c| c.caps).collect())
}
