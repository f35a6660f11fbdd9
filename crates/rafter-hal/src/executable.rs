//! Executables: device code with named entry points.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::device::DeviceId;
use crate::error::{HalError, Result};

/// The format tag of CPU executables made of in-process kernel closures
/// (`rafter-hal-cpu`'s `CpuKernels`).
pub const FORMAT_CPU_KERNELS: &str = "cpu-kernels";
/// The format tag of SPIR-V modules (a Vulkan device).
pub const FORMAT_SPIRV: &str = "spirv";

/// What an executable is loaded from: a name, a format tag, and a payload whose meaning the
/// format decides. Each device accepts the formats it knows
/// ([`Device::load_executable`](crate::Device::load_executable)) and rejects the others with
/// [`HalError::UnsupportedExecutableFormat`].
#[derive(Clone, Debug)]
pub struct ExecutableSpec {
    /// A name for errors and traces (`"block3_fused"`).
    pub name: String,
    /// The format tag: [`FORMAT_CPU_KERNELS`], [`FORMAT_SPIRV`], or a plug-in device's own.
    pub format: String,
    /// The code: the format's bytes, or an in-process object (the CPU's kernel closures).
    pub payload: ExecutablePayload,
}

/// The contents of an [`ExecutableSpec`].
#[derive(Clone)]
pub enum ExecutablePayload {
    /// Serialized code (a SPIR-V module, an object file), as stored in an artifact.
    Bytes(Arc<[u8]>),
    /// An in-process object the device downcasts (the CPU device's kernel closures). Never
    /// stored in an artifact; built by the runtime at load time.
    Native(Arc<dyn Any + Send + Sync>),
}

impl fmt::Debug for ExecutablePayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecutablePayload::Bytes(bytes) => write!(f, "Bytes({} bytes)", bytes.len()),
            ExecutablePayload::Native(_) => f.write_str("Native(..)"),
        }
    }
}

/// What a device implements for a loaded executable.
///
/// # Thread safety
/// `Send + Sync`: an executable is used by command buffers recorded and run on any thread.
pub trait ExecutableImpl: Send + Sync + fmt::Debug + 'static {
    /// The spec's name.
    fn name(&self) -> &str;
    /// Entry point names; a dispatch names an entry by its index in this list.
    fn entry_points(&self) -> &[String];
    /// The device that loaded it; only that device's command buffers may dispatch it.
    fn device_id(&self) -> DeviceId;
    /// For the device to recognise its own executables.
    fn as_any(&self) -> &dyn Any;
}

/// A loaded executable: device-specific compiled code with named entry points.
/// Cheap to clone (shared handle); immutable.
#[derive(Clone)]
pub struct Executable(Arc<dyn ExecutableImpl>);

impl Executable {
    /// Wraps a device's executable implementation.
    pub fn from_impl(inner: Arc<dyn ExecutableImpl>) -> Executable {
        Executable(inner)
    }

    /// The implementation, when it is a `T` (a device reads back its own executables).
    pub fn downcast_ref<T: ExecutableImpl>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }

    /// The name given in the [`ExecutableSpec`].
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// The entry points, indexed by [`Dispatch::entry`](crate::Dispatch::entry).
    pub fn entry_points(&self) -> &[String] {
        self.0.entry_points()
    }

    /// The device that loaded it.
    pub fn device_id(&self) -> DeviceId {
        self.0.device_id()
    }

    /// The index of the entry point called `name`.
    pub fn entry_index(&self, name: &str) -> Result<usize> {
        self.entry_points()
            .iter()
            .position(|entry| entry == name)
            .ok_or_else(|| HalError::EntryPointNotFound {
                executable: self.name().to_string(),
                name: name.to_string(),
            })
    }

    /// The name of entry point `index`, or [`HalError::UnknownEntryPoint`].
    pub fn entry_name(&self, index: usize) -> Result<&str> {
        self.entry_points()
            .get(index)
            .map(String::as_str)
            .ok_or_else(|| HalError::UnknownEntryPoint {
                executable: self.name().to_string(),
                entry: index,
                count: self.entry_points().len(),
            })
    }
}

impl fmt::Debug for Executable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
