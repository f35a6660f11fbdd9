//! The devices a session may use, by the names programs give them, and the executable
//! loaders that run kernels on them.

use std::fmt;
use std::sync::Arc;

use rafter_hal::Device;

use crate::backend::ExecutableLoader;

/// Open devices, each under the name a [`Program`](rafter_ir::program::Program) uses for it
/// (`cpu`, `vulkan`), and the [`ExecutableLoader`]s registered for their kinds. A session
/// takes the devices its program needs and, for each, the first loader that serves it;
/// several sessions may share one set (and so the devices' queues and worker threads).
///
/// A device backend crate offers the pair: `rafter_runtime_cpu::devices()` is a set with
/// the CPU device and its loader, and `rafter_runtime_vulkan::add_device` adds a Vulkan
/// device and the SPIR-V loader.
#[derive(Clone, Default)]
pub struct DeviceSet {
    devices: Vec<(String, Arc<dyn Device>)>,
    loaders: Vec<Arc<dyn ExecutableLoader>>,
}

impl DeviceSet {
    /// An empty set.
    pub fn new() -> DeviceSet {
        DeviceSet::default()
    }

    /// Adds `device` under `name` (replacing a device of the same name).
    pub fn with(mut self, name: impl Into<String>, device: Arc<dyn Device>) -> DeviceSet {
        self.insert(name, device);
        self
    }

    /// Adds `device` under `name` (replacing a device of the same name).
    pub fn insert(&mut self, name: impl Into<String>, device: Arc<dyn Device>) {
        let name = name.into();
        self.devices.retain(|(n, _)| *n != name);
        self.devices.push((name, device));
    }

    /// Registers `loader` (after those already registered; a loader of the same name is
    /// replaced).
    pub fn with_loader(mut self, loader: Arc<dyn ExecutableLoader>) -> DeviceSet {
        self.register(loader);
        self
    }

    /// Registers `loader` (a loader of the same name is replaced).
    pub fn register(&mut self, loader: Arc<dyn ExecutableLoader>) {
        self.loaders.retain(|l| l.name() != loader.name());
        self.loaders.push(loader);
    }

    /// The device called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Device>> {
        self.devices.iter().find(|(n, _)| n == name).map(|(_, d)| d)
    }

    /// The first registered loader serving `device`.
    pub fn loader_for(&self, device: &dyn Device) -> Option<&Arc<dyn ExecutableLoader>> {
        self.loaders.iter().find(|l| l.serves(device.info()))
    }

    /// The names, in insertion order.
    pub fn names(&self) -> Vec<&str> {
        self.devices.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The registered loaders' names, in registration order.
    pub fn loader_names(&self) -> Vec<&str> {
        self.loaders.iter().map(|l| l.name()).collect()
    }

    /// Whether the set has no device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

impl fmt::Debug for DeviceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSet")
            .field(
                "devices",
                &self
                    .devices
                    .iter()
                    .map(|(n, d)| (n, &d.info().name))
                    .collect::<Vec<_>>(),
            )
            .field("loaders", &self.loader_names())
            .finish()
    }
}
