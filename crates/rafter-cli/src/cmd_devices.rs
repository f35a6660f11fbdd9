//! `rafter devices`: the devices the HAL finds on this machine and what each offers.
//!
//! Each backend contributes a probe ([`PROBES`]) that opens its devices and describes them
//! as a [`DeviceReport`]; a probe that finds nothing (no driver) says why instead of
//! failing the command. The Vulkan probe lists every physical device the loader reports,
//! usable or not, with what a missing feature disables, and opens the one rafter would pick
//! to show its HAL description.

use anyhow::Result;
use rafter_hal::{Device, DeviceInfo, DeviceKind, MemoryKind};
use rafter_hal_cpu::{CpuDevice, CpuDeviceOptions};
use std::process::ExitCode;

/// One device, as printed: a title line and `key: value` lines.
pub struct DeviceReport {
    pub title: String,
    pub fields: Vec<(&'static str, String)>,
}

/// What a backend's probe found: its devices, or why it has none.
type Probe = fn() -> Result<Vec<DeviceReport>, String>;

/// The backends, in the order they are listed.
const PROBES: [(&str, Probe); 2] = [("cpu", probe_cpu), ("vulkan", probe_vulkan)];

/// A build without the `vulkan` feature has no Vulkan backend to probe.
#[cfg(not(feature = "vulkan"))]
fn probe_vulkan() -> Result<Vec<DeviceReport>, String> {
    Err("this build has no Vulkan support (built without the `vulkan` feature)".into())
}

#[derive(clap::Args)]
pub struct DevicesArgs {
    /// Measure each device's costs (a GEMM, a streaming kernel, an empty dispatch) and
    /// store them for the cost-model placement (`--target auto`), next to the pipeline
    /// cache (RAFTER_DEVICE_PROFILES overrides the file).
    #[arg(long)]
    profile: bool,
}

pub fn devices(args: DevicesArgs) -> Result<ExitCode> {
    if args.profile {
        return profile();
    }
    let mut found = 0;
    for (backend, probe) in PROBES {
        match probe() {
            Ok(reports) => {
                for r in &reports {
                    println!("{}", r.title);
                    for (k, v) in &r.fields {
                        println!("  {k}: {v}");
                    }
                }
                found += reports.len();
            }
            Err(why) => println!("{backend}: no devices ({why})"),
        }
    }
    println!("devices: {found}");
    Ok(if found > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The host CPU, opened as the runtime opens it (default options).
fn probe_cpu() -> Result<Vec<DeviceReport>, String> {
    let device = CpuDevice::new(CpuDeviceOptions::default()).map_err(|e| e.to_string())?;
    let info = device.info();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut fields = vec![
        ("kind", "cpu".to_string()),
        ("model", cpu_model().unwrap_or_else(|| "unknown".into())),
        ("cores", cores.to_string()),
        ("worker threads", device.worker_threads().to_string()),
        ("queues", device.queue_count().to_string()),
        ("memory", memory_kinds(info)),
        ("isa", isa_features()),
    ];
    fields.extend(common_fields(info));
    Ok(vec![DeviceReport {
        title: format!("{}: {}", info.name, kind_words(info)),
        fields,
    }])
}

/// Every Vulkan physical device, and the HAL description of the one rafter opens.
#[cfg(feature = "vulkan")]
fn probe_vulkan() -> Result<Vec<DeviceReport>, String> {
    use rafter_hal_vulkan::{VulkanDevice, VulkanDeviceOptions};
    let listed = rafter_hal_vulkan::list_devices().map_err(|e| e.to_string())?;
    if listed.is_empty() {
        return Err("the Vulkan loader found no physical device".into());
    }
    let opened = VulkanDevice::new(VulkanDeviceOptions::default());
    let selected = opened.as_ref().ok().map(|d| d.capabilities().index);
    let yes = |b: bool| if b { "yes" } else { "NO" };
    Ok(listed
        .iter()
        .map(|caps| {
            let (major, minor, patch) = caps.api_version;
            let missing = caps.missing_required();
            let status = if !missing.is_empty() {
                format!("refused: lacks {}", missing.join(", "))
            } else if Some(caps.index) == selected {
                "usable, selected (RAFTER_VULKAN_DEVICE=index picks another)".to_string()
            } else {
                "usable".to_string()
            };
            let limits = &caps.limits;
            let mut fields = vec![
                ("kind", "vulkan".to_string()),
                (
                    "name",
                    format!("{} ({})", caps.device_name, caps.device_type),
                ),
                ("api", format!("Vulkan {major}.{minor}.{patch}")),
                (
                    "driver",
                    format!("{} {}", caps.driver_name, caps.driver_info),
                ),
                ("status", status),
                (
                    "required",
                    format!(
                        "bufferDeviceAddress {}, timelineSemaphore {}, synchronization2 {}",
                        yes(caps.buffer_device_address),
                        yes(caps.timeline_semaphore),
                        yes(caps.synchronization2)
                    ),
                ),
                (
                    "subgroups",
                    format!(
                        "size {}, in compute {}, ops {}",
                        caps.subgroup_size,
                        yes(caps.subgroup_in_compute),
                        caps.subgroup_ops.join(" ")
                    ),
                ),
                (
                    "cooperative matrix",
                    match &caps.cooperative_matrix {
                        None => "NO".to_string(),
                        Some(shapes) => format!("yes ({} configurations)", shapes.len()),
                    },
                ),
                (
                    "storage buffer range",
                    format!(
                        "{} bytes (kernels address buffers directly; max buffer {} bytes)",
                        limits.max_storage_buffer_range, limits.max_buffer_size
                    ),
                ),
            ];
            for (feature, disables) in caps.degradations() {
                fields.push(("missing", format!("{feature}: {disables}")));
            }
            if let Some(device) = opened
                .as_ref()
                .ok()
                .filter(|_| Some(caps.index) == selected)
            {
                let info = device.info();
                fields.push(("queues", device.queue_count().to_string()));
                fields.push(("memory", memory_kinds(info)));
                fields.extend(common_fields(info));
            }
            DeviceReport {
                title: format!("vulkan{}: Vulkan device", caps.index),
                fields,
            }
        })
        .collect())
}

/// Fields every device has: dtypes, executable formats, buffer limit.
fn common_fields(info: &DeviceInfo) -> Vec<(&'static str, String)> {
    let join =
        |s: &std::collections::BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(" ");
    vec![
        ("dtypes", join(&info.capabilities.dtypes)),
        ("features", join(&info.capabilities.features)),
        (
            "executable formats",
            join(&info.capabilities.executable_formats),
        ),
        (
            "max buffer",
            format!("{} bytes", info.limits.max_buffer_size),
        ),
    ]
}

/// `CPU device`, `Vulkan device`, `<driver> device`.
fn kind_words(info: &DeviceInfo) -> String {
    match &info.kind {
        DeviceKind::Cpu => "CPU device".into(),
        DeviceKind::Vulkan => "Vulkan device".into(),
        DeviceKind::Other(driver) => format!("{driver} device"),
    }
}

/// The memory kinds by the words programs use (`host`, `device_local`), with properties.
fn memory_kinds(info: &DeviceInfo) -> String {
    info.memory
        .iter()
        .map(|m| {
            let mut props = Vec::new();
            if m.host_visible {
                props.push("host-visible".to_string());
            }
            if m.host_coherent {
                props.push("coherent".to_string());
            }
            props.push(match m.capacity {
                Some(c) => format!("{c} bytes"),
                None => "no limit".to_string(),
            });
            format!("{} ({})", memory_word(m.kind), props.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn memory_word(kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::DeviceLocal => "device_local",
        MemoryKind::HostVisibleShared => "host_visible_shared",
        MemoryKind::Host => "host",
    }
}

/// The CPU's model name, where the OS says (Linux: /proc/cpuinfo).
fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The SIMD features the running CPU has (detected now, not assumed from the build), then
/// the ones it lacks.
fn isa_features() -> String {
    let (have, lack): (Vec<_>, Vec<_>) = detect_features().into_iter().partition(|f| f.1);
    let names = |v: Vec<(&str, bool)>| v.into_iter().map(|f| f.0).collect::<Vec<_>>().join(" ");
    let mut out = format!("{} {}", std::env::consts::ARCH, names(have));
    if !lack.is_empty() {
        out.push_str(&format!(" (not: {})", names(lack)));
    }
    out
}

#[cfg(target_arch = "x86_64")]
fn detect_features() -> Vec<(&'static str, bool)> {
    macro_rules! detect {
        ($($f:tt),*) => { vec![$(($f, std::is_x86_feature_detected!($f))),*] };
    }
    detect!(
        "sse4.2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512vnni",
        "avx512bf16",
        "avx512fp16"
    )
}

#[cfg(target_arch = "aarch64")]
fn detect_features() -> Vec<(&'static str, bool)> {
    macro_rules! detect {
        ($($f:tt),*) => { vec![$(($f, std::arch::is_aarch64_feature_detected!($f))),*] };
    }
    detect!("neon", "fp16", "dotprod", "i8mm", "bf16", "sve", "sve2")
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_features() -> Vec<(&'static str, bool)> {
    Vec::new()
}

/// `--profile`: calibrates the CPU and, when present, the Vulkan device; stores the
/// descriptions (keeping those of other devices already in the file).
fn profile() -> Result<ExitCode> {
    let path = rafter_compiler::profiles_path().ok_or_else(|| {
        anyhow::anyhow!("no place to store profiles (RAFTER_DEVICE_PROFILES is empty, no HOME)")
    })?;
    let mut profiles = rafter_compiler::load_profiles_from(&path).unwrap_or_default();
    let target = crate::model::parse_target("auto")?;
    let names = rafter_opt::place::device_names(target.accelerators());
    for name in &names {
        let load_from = crate::host_load::CpuTimes::now();
        let d = crate::calibrate::profile_device(name)?;
        crate::host_load::report_since(load_from, &format!("calibrating {name}"));
        let c = d.profile.rate(rafter_ir::program::KernelKind::Contraction);
        let e = d.profile.rate(rafter_ir::program::KernelKind::Elementwise);
        println!(
            "{name}: gemm {:.1} GFLOP/s (half at {:.2} MFLOP), f16 x{:.3}, streaming {:.1} GB/s, \
             dispatch {:.1} us",
            c.flops_per_s / 1e9,
            c.half_flops / 1e6,
            d.profile.half_scale,
            e.bytes_per_s / 1e9,
            d.profile.dispatch_s * 1e6
        );
        if let Some((c, memory)) = d
            .profile
            .weight_cache
            .as_ref()
            .and_then(|c| Some((c, c.reads.last()?)))
        {
            println!(
                "{name}: weights read at {:.1} GB/s from the cache, {:.1} GB/s from memory \
                 ({:.0} MiB working set)",
                c.cache_bytes_per_s / 1e9,
                memory.bytes_per_s / 1e9,
                memory.bytes / 1048576.0
            );
        }
        if let Some(l) = d.link {
            println!(
                "{name}: link {:.1} GB/s, latency {:.1} us",
                l.bytes_per_s / 1e9,
                l.latency_s * 1e6
            );
        }
        profiles.insert(d);
    }
    rafter_compiler::save_profiles(&profiles, &path)?;
    println!("wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}
