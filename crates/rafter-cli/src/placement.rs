//! The placement flags `rafter compile` and `rafter plan` share: `--memory-limit`,
//! `--deny-fallback`, `--objective`, applied to the target `--target` names.

use anyhow::{bail, Result};
use rafter_compiler::Target;
use rafter_opt::partition::{Objective, Strategy};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct PlacementArgs {
    /// The most memory (weights + arenas) a device may hold, DEVICE=SIZE (vulkan=2GiB;
    /// units B, KiB, MiB, GiB, KB, MB, GB). A model that does not fit one device is split
    /// across devices. Cost-model targets only (`--target auto`, `--target cpu,vulkan`).
    #[arg(long = "memory-limit", value_name = "DEVICE=SIZE")]
    memory_limits: Vec<String>,
    /// Fail compilation, naming the kernel and why, if any kernel would run on the CPU
    /// although the target has an accelerator.
    #[arg(long)]
    deny_fallback: bool,
    /// What the cost model minimises: `latency` (one call) or `throughput` (calls in
    /// flight: the busiest device's time per call). Cost-model targets only.
    #[arg(long, value_name = "latency|throughput")]
    objective: Option<String>,
}

impl PlacementArgs {
    /// `target` with these flags applied.
    pub fn apply(&self, target: Target) -> Result<Target> {
        let mut p = target.placement().clone();
        let cost_model = p.strategy == Strategy::CostModel;
        if !cost_model && (!self.memory_limits.is_empty() || self.objective.is_some()) {
            bail!(
                "--memory-limit and --objective need a cost-model target (--target auto or a \
                 device set such as --target cpu,vulkan; got --target {})",
                target.name()
            );
        }
        for spec in &self.memory_limits {
            let (device, size) = spec
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--memory-limit `{spec}`: expected DEVICE=SIZE"))?;
            let known = device == "cpu" || target.backend(device).is_some();
            if !known {
                bail!(
                    "--memory-limit `{spec}`: device `{device}` is not in --target {}",
                    target.name()
                );
            }
            let bytes = parse_size(size).ok_or_else(|| {
                anyhow::anyhow!("--memory-limit `{spec}`: `{size}` is not a size")
            })?;
            p.memory_limits.insert(device.to_string(), bytes);
        }
        if let Some(o) = &self.objective {
            p.objective = match o.as_str() {
                "latency" => Objective::Latency,
                "throughput" => Objective::Throughput,
                _ => bail!("--objective `{o}`: expected latency or throughput"),
            };
        }
        p.deny_fallback = self.deny_fallback;
        if p.deny_fallback && target.is_cpu_only() {
            bail!("--deny-fallback needs an accelerator in --target (got --target cpu)");
        }
        Ok(target.with_placement(p))
    }
}

/// `2GiB`, `512MB`, `1048576`: bytes.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        _ => return None,
    };
    let bytes = n * scale;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("1.5KiB"), Some(1536));
        assert_eq!(parse_size("512MB"), Some(512_000_000));
        assert_eq!(parse_size("7"), Some(7));
        assert_eq!(parse_size("2 GiB"), Some(2 << 30));
        assert_eq!(parse_size("2TB"), None);
        assert_eq!(parse_size("GiB"), None);
    }

    #[test]
    fn flags_that_need_the_cost_model_say_so() {
        let args = PlacementArgs {
            objective: Some("throughput".into()),
            ..PlacementArgs::default()
        };
        let e = args.apply(Target::cpu()).unwrap_err().to_string();
        assert!(e.contains("need a cost-model target"), "{e}");
        let args = PlacementArgs {
            deny_fallback: true,
            ..PlacementArgs::default()
        };
        let e = args.apply(Target::cpu()).unwrap_err().to_string();
        assert!(e.contains("--deny-fallback needs an accelerator"), "{e}");
    }
}
