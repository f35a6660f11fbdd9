//! `rafter-deploy`: runs a compiled artifact, and nothing else (see the crate docs).
//!
//! ```text
//! rafter-deploy MODEL.rfa --input NAME=FILE.npy ... [--output-dir DIR] [--threads N] [--iters N]
//! ```
//!
//! Every input is read from a `.npy` file. Each output is summarised on stdout and, with
//! `--output-dir`, written as `DIR/NAME.npy`. With `--iters N` the call is repeated N
//! times and the last line gives the median time.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rafter_deploy::{open, read_npy, write_npy, DeployError, Options, Tensor};

const USAGE: &str = "usage: rafter-deploy MODEL.rfa --input NAME=FILE.npy ... \
                     [--output-dir DIR] [--threads N] [--iters N]";

/// How long one call may take before it is reported as hung.
const CALL_TIMEOUT: Duration = Duration::from_secs(3600);

struct Args {
    model: PathBuf,
    inputs: Vec<(String, PathBuf)>,
    output_dir: Option<PathBuf>,
    threads: usize,
    iters: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        model: PathBuf::new(),
        inputs: Vec::new(),
        output_dir: None,
        threads: 0,
        iters: 1,
    };
    let mut model = None;
    while let Some(a) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |flag: &str, v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag} {v}: not a number"))
        };
        match a.as_str() {
            "--input" => {
                let v = value("--input")?;
                let (name, file) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--input {v}: expected NAME=FILE.npy"))?;
                parsed.inputs.push((name.to_string(), PathBuf::from(file)));
            }
            "--output-dir" => parsed.output_dir = Some(PathBuf::from(value("--output-dir")?)),
            "--threads" => parsed.threads = number("--threads", value("--threads")?)?,
            "--iters" => parsed.iters = number("--iters", value("--iters")?)?.max(1),
            "-h" | "--help" => return Err(USAGE.to_string()),
            flag if flag.starts_with('-') => return Err(format!("unknown flag {flag}\n{USAGE}")),
            _ if model.is_none() => model = Some(PathBuf::from(a)),
            extra => return Err(format!("unexpected argument {extra}\n{USAGE}")),
        }
    }
    parsed.model = model.ok_or_else(|| USAGE.to_string())?;
    Ok(parsed)
}

/// `f32[1, 1000] mean 0.01 min -1.2 max 2.3`.
fn summary(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    if v.is_empty() {
        return format!("{}[{}] (empty)", t.dtype(), dims.join(", "));
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{}[{}] mean {mean:.6} min {min:.6} max {max:.6}",
        t.dtype(),
        dims.join(", ")
    )
}

/// An output name as a file stem: every character outside `[A-Za-z0-9._-]` becomes `_`.
fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn run(args: Args) -> Result<(), DeployError> {
    let session = open(
        &args.model,
        &Options {
            threads: args.threads,
        },
    )?;
    let program = session.program();
    let mut inputs = Vec::with_capacity(program.inputs.len());
    for port in &program.inputs {
        let file = args
            .inputs
            .iter()
            .find(|(n, _)| *n == port.name)
            .map(|(_, f)| f)
            .ok_or_else(|| {
                let names: Vec<&str> = program.inputs.iter().map(|p| p.name.as_str()).collect();
                DeployError::Device(format!(
                    "input `{}` ({}) is not given: pass --input {}=FILE.npy (inputs: {})",
                    port.name,
                    port.ty,
                    port.name,
                    names.join(", ")
                ))
            })?;
        inputs.push(read_npy(file)?);
    }
    if let Some((extra, _)) = args
        .inputs
        .iter()
        .find(|(n, _)| !program.inputs.iter().any(|p| p.name == *n))
    {
        return Err(DeployError::Device(format!(
            "--input {extra}: the model has no input `{extra}`"
        )));
    }
    let mut times = Vec::with_capacity(args.iters);
    let mut outputs = Vec::new();
    for _ in 0..args.iters {
        let start = Instant::now();
        outputs = session.run(inputs.clone(), CALL_TIMEOUT)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| DeployError::Tensor {
            path: dir.display().to_string(),
            msg: e.to_string(),
        })?;
    }
    for (port, t) in program.outputs.iter().zip(&outputs) {
        println!("output {}: {}", port.name, summary(t));
        if let Some(dir) = &args.output_dir {
            let path = dir.join(format!("{}.npy", file_stem(&port.name)));
            write_npy(&path, t).map_err(|e| DeployError::Tensor {
                path: path.display().to_string(),
                msg: e.to_string(),
            })?;
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "ran {} call(s): median {:.3} ms",
        times.len(),
        times[times.len() / 2]
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
