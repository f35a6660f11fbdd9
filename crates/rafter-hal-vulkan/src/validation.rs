//! Khronos validation layers on demand, with a messenger that records what they report.
//!
//! Why: the driver accepts a missing barrier, a buffer destroyed while the GPU still reads
//! it or a semaphore signalled twice without a word, and the result is a wrong answer or a
//! hang on some other GPU (issue 28's NVIDIA stall). `VK_LAYER_KHRONOS_validation` checks
//! every call against the specification; synchronization validation adds read/write
//! hazards between commands and submissions; GPU-assisted validation instruments shaders
//! and checks every buffer-device-address access against the live buffers, which is how
//! rafter's kernels reach memory. Tests open devices with validation on and assert that
//! [`VulkanDevice::validation_messages`](crate::VulkanDevice::validation_messages) is
//! empty.
//!
//! Debian's `vulkan-validationlayers` (1.3.239 in bookworm) predates
//! `VK_EXT_layer_settings`, so the features are chosen through `VkValidationFeaturesEXT`,
//! which every layer version since 1.2 reads.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::error::VulkanError;

/// The environment variable that turns validation on for every device the process opens
/// whose options leave it unset: `core` for the core checks, `1` (or `sync`) for those and
/// synchronization validation, `gpu` for those plus GPU-assisted validation, `0` or empty
/// for none.
pub const VALIDATION_ENV: &str = "RAFTER_VULKAN_VALIDATION";

/// The Khronos validation layer's name.
const LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Which validation a device runs under (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Validation {
    /// No layer (the default: validation slows every call).
    #[default]
    Off,
    /// The core checks only (object lifetimes, parameters, usage, push-constant ranges).
    Core,
    /// The core checks and synchronization validation.
    Sync,
    /// [`Validation::Sync`] plus GPU-assisted validation: shaders are instrumented to
    /// check buffer-device-address accesses (out of bounds, freed buffers). Much slower.
    GpuAssisted,
}

impl Validation {
    /// Reads [`VALIDATION_ENV`]; an unknown value is an error naming it.
    pub fn from_env() -> Result<Validation, VulkanError> {
        match std::env::var(VALIDATION_ENV) {
            Err(_) => Ok(Validation::Off),
            Ok(value) => Validation::parse(&value).ok_or_else(|| {
                VulkanError::Other(format!(
                    "{VALIDATION_ENV}={value:?}: expected 0, core, 1, sync or gpu"
                ))
            }),
        }
    }

    fn parse(value: &str) -> Option<Validation> {
        match value.trim() {
            "" | "0" | "off" => Some(Validation::Off),
            "core" => Some(Validation::Core),
            "1" | "sync" | "on" => Some(Validation::Sync),
            "gpu" | "gpu-assisted" => Some(Validation::GpuAssisted),
            _ => None,
        }
    }

    fn features(self) -> &'static [vk::ValidationFeatureEnableEXT] {
        match self {
            Validation::Off | Validation::Core => &[],
            Validation::Sync => &[vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION],
            Validation::GpuAssisted => &[
                vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION,
                vk::ValidationFeatureEnableEXT::GPU_ASSISTED,
                vk::ValidationFeatureEnableEXT::GPU_ASSISTED_RESERVE_BINDING_SLOT,
            ],
        }
    }
}

/// One message of the validation layer: an error or a warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationMessage {
    /// `error` or `warning`.
    pub severity: &'static str,
    /// The layer's message id name (`VUID-vkCmdDispatch-None-02697`, `SYNC-HAZARD-WRITE-AFTER-READ`).
    pub id: String,
    /// The layer's text: the call, the objects and the rule.
    pub text: String,
}

impl std::fmt::Display for ValidationMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.id, self.text)
    }
}

/// Message ids that are bugs of the layer Debian ships (1.3.239), not of the application:
/// counted apart ([`ValidationLog::layer_bugs`]), printed once, never failing a test.
///
/// - `UNASSIGNED-VkSemaphore-state-timeout` ("Timeout waiting for timeline semaphore state
///   to update. This is most likely a validation bug"): under synchronization validation the
///   layer's own tracking of a timeline semaphore that the host signals and waits lags the
///   driver, and the layer gives up waiting for itself after a few seconds
///   (KhronosGroup/Vulkan-ValidationLayers#4968, reproduced there by a test that only
///   host-signals and host-waits one semaphore; fixed in later layers). rafter's monitor
///   waits on a host-signalled wake semaphore, so every device meets it.
const LAYER_BUGS: &[&str] = &["UNASSIGNED-VkSemaphore-state-timeout"];

/// The messages kept per instance; beyond this only the count grows (a bug repeated every
/// dispatch would otherwise fill memory).
const KEPT: usize = 200;

/// What the messenger collects for one instance. Lives in the `InstanceOwner`, whose
/// address the layer gets as user data.
#[derive(Default)]
pub(crate) struct Collector {
    kept: Mutex<Vec<ValidationMessage>>,
    total: AtomicUsize,
    layer_bugs: AtomicUsize,
}

/// What the validation layer reported for one device (its instance), readable after the
/// device is gone: messages about destroying objects arrive as the device closes.
#[derive(Clone, Default)]
pub struct ValidationLog(pub(crate) Arc<Collector>);

impl ValidationLog {
    /// The errors and warnings so far (at most the first 200) and how many there were in
    /// all; known bugs of the layer itself are not among them.
    pub fn messages(&self) -> (Vec<ValidationMessage>, usize) {
        let kept = self
            .0
            .kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (kept, self.0.total.load(Ordering::Acquire))
    }

    /// Records a rule rafter checks itself under validation (one the layer cannot see), as
    /// an error with `id`.
    pub(crate) fn report(&self, id: &str, text: String) {
        self.0.record(ValidationMessage {
            severity: "error",
            id: id.to_string(),
            text,
        });
    }

    /// How many messages were known bugs of the layer (see `LAYER_BUGS` in validation.rs).
    pub fn layer_bugs(&self) -> usize {
        self.0.layer_bugs.load(Ordering::Acquire)
    }
}

impl Collector {
    fn record(&self, message: ValidationMessage) {
        if LAYER_BUGS.contains(&message.id.as_str()) {
            if self.layer_bugs.fetch_add(1, Ordering::AcqRel) == 0 {
                eprintln!(
                    "Vulkan validation: ignoring {} (a bug of this validation layer, not of \
                     rafter: see LAYER_BUGS in rafter-hal-vulkan's validation.rs)",
                    message.id
                );
            }
            return;
        }
        let count = self.total.fetch_add(1, Ordering::AcqRel);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        // Each message id is printed the first time it appears, so a run shows what broke
        // without a test having to ask.
        if !kept.iter().any(|m| m.id == message.id) {
            eprintln!("Vulkan validation {message}");
        }
        if count < KEPT {
            kept.push(message);
        }
    }
}

/// Checks that the layer is installed, for a clear error rather than the loader's
/// `VK_ERROR_LAYER_NOT_PRESENT`, and returns its Vulkan header version (`specVersion`).
pub(crate) fn check_layer(entry: &ash::Entry) -> Result<u32, VulkanError> {
    // SAFETY: `entry` is a loaded loader; the call has no preconditions.
    let layers = unsafe { entry.enumerate_instance_layer_properties() }.map_err(|result| {
        VulkanError::Call {
            call: "vkEnumerateInstanceLayerProperties",
            result,
        }
    })?;
    layers
        .iter()
        .find(|l| l.layer_name_as_c_str().is_ok_and(|n| n == LAYER))
        .map(|l| l.spec_version)
        .ok_or_else(|| {
            VulkanError::Other(format!(
                "Vulkan validation was asked for ({VALIDATION_ENV} or VulkanDeviceOptions::\
                 validation), but the loader has no {} layer (Debian: apt-get install \
                 vulkan-validationlayers; VK_LAYER_PATH names a directory of layer manifests)",
                LAYER.to_string_lossy()
            ))
        })
}

/// The Vulkan header version that introduced `VK_KHR_cooperative_matrix` (1.3.255). A
/// validation layer built from older headers cannot know the extension: it rejects the
/// feature struct in `vkCreateDevice` and every cooperative-matrix module as invalid SPIR-V
/// (seen with Debian's 1.3.239 layer on NVIDIA), so its verdict on those kernels is noise.
pub(crate) const COOPERATIVE_MATRIX_HEADER: u32 = vk::make_api_version(0, 1, 3, 255);

/// Whether a validation layer of header version `layer_spec` can check cooperative-matrix
/// kernels; when it cannot, devices leave the extension off so every kernel that runs is one
/// the layer checks (the plain variants of the same kernels).
pub(crate) fn layer_knows_cooperative_matrix(layer_spec: u32) -> bool {
    layer_spec >= COOPERATIVE_MATRIX_HEADER
}

/// The layer and instance extensions to enable for `validation`.
pub(crate) fn layers() -> [*const std::ffi::c_char; 1] {
    [LAYER.as_ptr()]
}

pub(crate) fn extensions() -> [*const std::ffi::c_char; 2] {
    [
        ash::ext::debug_utils::NAME.as_ptr(),
        ash::ext::validation_features::NAME.as_ptr(),
    ]
}

pub(crate) fn features_info(validation: Validation) -> vk::ValidationFeaturesEXT<'static> {
    vk::ValidationFeaturesEXT::default().enabled_validation_features(validation.features())
}

/// The messenger's create info: errors and warnings of every type, into `collector`.
///
/// # Safety
/// `collector` must stay at its address for as long as a messenger made from this info
/// lives (the instance's, when chained into `VkInstanceCreateInfo`).
pub(crate) unsafe fn messenger_info(
    collector: *const Collector,
) -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(on_message))
        .user_data(collector as *mut c_void)
}

/// A C string of the layer's, or `""` for a null pointer.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string valid for the call.
unsafe fn text(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// The messenger callback: records the message and lets the call proceed (`VK_FALSE`).
unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    if data.is_null() || user.is_null() {
        return vk::FALSE;
    }
    // A panic must not unwind into the layer's C++ frames.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the layer passes a valid callback data for the call's duration, and
        // `user` is the collector given in `messenger_info`, alive per its contract.
        let (data, collector) = unsafe { (&*data, &*(user as *const Collector)) };
        // SAFETY: the layer's strings are NUL-terminated or null, valid during the call.
        let (id, message) = unsafe { (text(data.p_message_id_name), text(data.p_message)) };
        let severity = if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
            "error"
        } else {
            "warning"
        };
        collector.record(ValidationMessage {
            severity,
            id: if id.is_empty() {
                format!("message {:#x}", data.message_id_number)
            } else {
                id
            },
            text: message,
        });
    });
    vk::FALSE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_older_than_the_extension_do_not_check_cooperative_matrices() {
        // Debian 12's layer, the one that rejected every cooperative-matrix module on NVIDIA.
        assert!(!layer_knows_cooperative_matrix(vk::make_api_version(
            0, 1, 3, 239
        )));
        assert!(!layer_knows_cooperative_matrix(vk::make_api_version(
            0, 1, 3, 254
        )));
        assert!(layer_knows_cooperative_matrix(vk::make_api_version(
            0, 1, 3, 255
        )));
        assert!(layer_knows_cooperative_matrix(vk::make_api_version(
            0, 1, 4, 0
        )));
    }

    #[test]
    fn the_environment_values_are_read_and_others_refused() {
        assert_eq!(Validation::parse("1"), Some(Validation::Sync));
        assert_eq!(Validation::parse("sync"), Some(Validation::Sync));
        assert_eq!(Validation::parse(" gpu "), Some(Validation::GpuAssisted));
        assert_eq!(Validation::parse("0"), Some(Validation::Off));
        assert_eq!(Validation::parse(""), Some(Validation::Off));
        assert_eq!(Validation::parse("yes please"), None);
    }

    #[test]
    fn the_collector_keeps_a_bounded_list_and_counts_all() {
        let log = ValidationLog::default();
        log.0.record(ValidationMessage {
            severity: "error",
            id: LAYER_BUGS[0].into(),
            text: "a layer bug".into(),
        });
        for i in 0..KEPT + 5 {
            log.0.record(ValidationMessage {
                severity: "error",
                id: "VUID-test".into(),
                text: format!("message {i}"),
            });
        }
        let (kept, total) = log.messages();
        assert_eq!(log.layer_bugs(), 1);
        assert_eq!(kept.len(), KEPT);
        assert_eq!(total, KEPT + 5);
        assert_eq!(kept[3].text, "message 3");
    }
}
