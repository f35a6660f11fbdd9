//! The devices a session may use, by the names programs give them.

use std::fmt;
use std::sync::Arc;

use rafter_hal::Device;
use rafter_hal_cpu::{CpuDevice, CpuDeviceOptions};

use crate::error::{hal, Result};

/// Open devices, each under the name a [`Program`](rafter_ir::program::Program) uses for it
/// (`cpu`, `vulkan`). A session takes the ones its program needs; several sessions may share
/// one set (and so the devices' queues and worker threads).
#[derive(Clone, Default)]
pub struct DeviceSet {
    devices: Vec<(String, Arc<dyn Device>)>,
}

impl DeviceSet {
    /// An empty set.
    pub fn new() -> DeviceSet {
        DeviceSet::default()
    }

    /// A set holding one CPU device named `cpu`, with default options (a worker per core).
    pub fn cpu() -> Result<DeviceSet> {
        DeviceSet::cpu_with(CpuDeviceOptions::default())
    }

    /// A set holding one CPU device built with `options`, under `options.name` (`cpu` by
    /// default). Pass a [`ChromeTrace`](crate::ChromeTrace) as `trace_sink` to trace it.
    pub fn cpu_with(options: CpuDeviceOptions) -> Result<DeviceSet> {
        let name = options.name.clone();
        let device = CpuDevice::new(options).map_err(hal("opening the CPU device"))?;
        Ok(DeviceSet::new().with(name, Arc::new(device)))
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

    /// The device called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Device>> {
        self.devices.iter().find(|(n, _)| n == name).map(|(_, d)| d)
    }

    /// The names, in insertion order.
    pub fn names(&self) -> Vec<&str> {
        self.devices.iter().map(|(n, _)| n.as_str()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

impl fmt::Debug for DeviceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.devices.iter().map(|(n, d)| (n, &d.info().name)))
            .finish()
    }
}
