//! `rafter conformance`: ONNX's backend test suite.

use anyhow::{bail, Context, Result};
use rafter_conformance::{discover, run_suite, Backend, ExpectedFailures, Outcome, SuiteOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ConformanceArgs {
    /// Device to run on: `cpu`, or `vulkan` (always the compiled path, compiled for
    /// `--target vulkan`: supported kernels on the GPU, the rest on the CPU).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Only tests whose name matches this regular expression.
    #[arg(long)]
    filter: Option<String>,
    /// The generated suite (default: $RAFTER_CONFORMANCE_DIR, else .cache/onnx-conformance).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Write every failing or skipped test with its reason to this file (an
    /// expected-failure list).
    #[arg(long)]
    write_expected: Option<PathBuf>,
    /// Print each test's time.
    #[arg(long)]
    timings: bool,
    /// Run each test through the compiler, an artifact and the runtime (compile, write the
    /// artifact to memory, reopen it, run a session) instead of the reference executor.
    #[arg(long)]
    compiled: bool,
}

pub fn conformance(args: ConformanceArgs) -> Result<ExitCode> {
    let dir = args
        .dir
        .or_else(|| std::env::var_os("RAFTER_CONFORMANCE_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(".cache/onnx-conformance"));
    let cases = discover(&dir, args.filter.as_deref()).map_err(anyhow::Error::msg)?;
    let backend = match (args.device.as_str(), args.compiled) {
        ("cpu", false) => Backend::Reference,
        ("cpu", true) => Backend::Compiled,
        ("vulkan", _) => Backend::Vulkan,
        (other, _) => bail!("unknown device `{other}` (available: cpu, vulkan)"),
    };
    let results = run_suite(
        &cases,
        &SuiteOptions {
            filter: None,
            threads: args.threads,
            backend,
        },
    );
    let (mut passed, mut failed, mut skipped, mut passed_on_gpu) = (0, 0, 0, 0);
    let mut list = ExpectedFailures::default();
    for r in &results {
        let name = &r.case.name;
        match &r.outcome {
            Outcome::Pass => {
                passed += 1;
                passed_on_gpu += usize::from(r.gpu_kernels > 0);
            }
            Outcome::Fail(why) => {
                failed += 1;
                println!("FAIL {name}: {why}");
                list.entries.insert(name.clone(), why.clone());
            }
            Outcome::Skip(why) => {
                skipped += 1;
                println!("SKIP {name}: {why}");
                list.entries.insert(name.clone(), why.clone());
            }
        }
        if args.timings {
            println!("time {name}: {:.3} s", r.elapsed.as_secs_f64());
        }
    }
    if let Some(path) = args.write_expected {
        let command = match backend {
            Backend::Reference => "rafter conformance --device cpu",
            Backend::Compiled => "rafter conformance --device cpu --compiled",
            Backend::Vulkan => "rafter conformance --device vulkan",
        };
        let suite = match backend {
            Backend::Vulkan => {
                "onnx 1.23.2 backend suite, on\n# lavapipe; the compiled path for --target vulkan, \
                 CPU fallback for kernels the GPU lacks"
            }
            _ => "onnx 1.23.2 backend suite",
        };
        let header = format!(
            "# Expected failures of `{command}` ({suite}).\n\
             # One test per line with its reason. This list may only shrink: the test suite fails\n\
             # when a test outside it fails or a test on it passes.\n"
        );
        std::fs::write(&path, list.render(&header))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("path: {}", backend.word());
    if backend == Backend::Vulkan {
        println!(
            "gpu: {passed_on_gpu} of {passed} passing tests ran at least one kernel on vulkan \
             (the others ran wholly on the CPU fallback)"
        );
    }
    println!("conformance: {passed} passed, {failed} failed, {skipped} skipped");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
