//! `rafter run`: one call of a model on the CPU.

use anyhow::{anyhow, bail, Context, Result};
use rafter_ir::{DType, Graph, Symbol};
use rafter_reference::npy;
use rafter_reference::{Bindings, Tensor};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// The built-in demo model: a 2-layer BERT-like encoder exported from PyTorch with dynamic
/// `batch` and `seq` (see tests/fixtures/bert_tiny/README.md).
const DEMO_MODEL: &[u8] = include_bytes!("../../../tests/fixtures/bert_tiny/model.onnx");

#[derive(clap::Args)]
pub struct RunArgs {
    /// The model (.onnx). Omit it to run the built-in demo encoder.
    model: Option<PathBuf>,
    /// Device to run on.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// An input as NAME=FILE.npy; repeat for several. Inputs not given are random.
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// A symbolic dim's value as SYMBOL=N (e.g. --dim seq=128), for random inputs.
    #[arg(long = "dim", value_name = "SYMBOL=N")]
    dims: Vec<String>,
    /// Seed of the random inputs (default: from the clock; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Write each output to DIR/NAME.npy.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    if args.device != "cpu" {
        bail!("unknown device `{}` (available: cpu)", args.device);
    }
    let (graph, mut dims) = match &args.model {
        Some(path) => (rafter_import::import_onnx_file(path)?.graph, Vec::new()),
        None => {
            println!(
                "no model given: running the built-in demo encoder (tests/fixtures/bert_tiny)"
            );
            let imported =
                rafter_import::import_onnx_bytes(bytes_static(), None, "built-in demo model")?;
            (
                imported.graph,
                vec!["batch=1".to_string(), "seq=8".to_string()],
            )
        }
    };
    dims.extend(args.dims.iter().cloned());
    let mut bindings = Bindings::with(parse_dims(&dims)?);
    let inputs = gather_inputs(&graph, &args.inputs, &mut bindings, args.seed)?;
    let start = Instant::now();
    let outputs = rafter_reference::run_with(&graph, inputs, &mut bindings)?;
    println!(
        "ran in {:.2} ms on cpu (reference executor)",
        start.elapsed().as_secs_f64() * 1e3
    );
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for (&id, t) in graph.outputs.iter().zip(&outputs) {
        let name = &graph.value(id).name;
        println!("output {name}: {}", summary(t));
        if let Some(dir) = &args.output_dir {
            let path = dir.join(format!("{}.npy", file_stem(name)));
            npy::write_npy(&path, t).with_context(|| format!("writing {}", path.display()))?;
            println!("  wrote {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn bytes_static() -> rafter_onnx_proto::Bytes {
    rafter_onnx_proto::Bytes::from_static(DEMO_MODEL)
}

/// An output name as a file stem: every character outside `[A-Za-z0-9._-]` becomes `_`.
pub fn file_stem(name: &str) -> String {
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

fn parse_dims(dims: &[String]) -> Result<Vec<(Symbol, i64)>> {
    dims.iter()
        .map(|d| {
            let (k, v) = d
                .split_once('=')
                .ok_or_else(|| anyhow!("--dim `{d}`: expected SYMBOL=N"))?;
            if !rafter_ir::is_identifier(k) {
                bail!("--dim `{d}`: `{k}` is not a symbol name");
            }
            let n: i64 = v
                .parse()
                .map_err(|_| anyhow!("--dim `{d}`: `{v}` is not an integer"))?;
            if n < 0 {
                bail!("--dim `{d}`: dims cannot be negative");
            }
            Ok((Symbol::new(k), n))
        })
        .collect()
}

/// The graph's inputs in order: from files where given (binding their symbols first), the
/// rest random with shapes from the bound symbols.
fn gather_inputs(
    graph: &Graph,
    given: &[String],
    bindings: &mut Bindings,
    seed: Option<u64>,
) -> Result<Vec<Tensor>> {
    let names: Vec<&str> = graph
        .inputs
        .iter()
        .map(|&id| graph.value(id).name.as_str())
        .collect();
    let mut slots: Vec<Option<Tensor>> = vec![None; names.len()];
    for spec in given {
        let (name, file) = spec
            .split_once('=')
            .ok_or_else(|| anyhow!("--input `{spec}`: expected NAME=FILE.npy"))?;
        let pos = names.iter().position(|n| *n == name).ok_or_else(|| {
            anyhow!(
                "--input `{spec}`: the model has no input `{name}` (inputs: {})",
                names.join(", ")
            )
        })?;
        let t = npy::read_npy(Path::new(file))?;
        let ty = &graph.value(graph.inputs[pos]).ty;
        bindings
            .check(ty, &t, &format!("input `{name}` ({file})"))
            .map_err(anyhow::Error::msg)?;
        slots[pos] = Some(t);
    }
    if slots.iter().any(Option::is_none) {
        let seed = seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        println!("random inputs with seed {seed} (repeat with --seed {seed})");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for (pos, slot) in slots.iter_mut().enumerate() {
            if slot.is_none() {
                *slot = Some(random_input(graph, pos, bindings, &mut rng)?);
            }
        }
    }
    Ok(slots
        .into_iter()
        .map(|s| s.expect("filled above"))
        .collect())
}

fn random_input(
    graph: &Graph,
    pos: usize,
    bindings: &Bindings,
    rng: &mut impl Rng,
) -> Result<Tensor> {
    let v = graph.value(graph.inputs[pos]);
    let env = bindings.as_map();
    let dims: Vec<usize> = v
        .ty
        .dims
        .iter()
        .map(|d| {
            d.eval(&env).map(|n| n as usize).map_err(|_| {
                let missing: Vec<String> = d.symbols().iter().filter(|s| bindings.get(s).is_none()).map(|s| format!("--dim {}=N", s.name())).collect();
                anyhow!("input `{}` has symbolic dim `{d}`: give its value with {} or pass the input with --input", v.name, missing.join(" "))
            })
        })
        .collect::<Result<_>>()?;
    let n: usize = dims.iter().product();
    let dtype = v.ty.dtype;
    let t = if dtype.is_float() {
        let vals: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let f32s = Tensor::f32s(&dims, vals.iter().map(|&x| x as f32).collect());
        cast_f32(f32s, dtype)
    } else if dtype == DType::Bool {
        let bytes: Vec<u8> = (0..n).map(|_| rng.gen_range(0..2u8)).collect();
        Tensor::from_le_bytes(DType::Bool, &dims, &bytes)?
    } else {
        // Small non-negative integers: valid as token ids, indices and masks alike.
        let vals: Vec<i64> = (0..n).map(|_| rng.gen_range(0..10)).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|&x| int_bytes(x, dtype)).collect();
        Tensor::from_le_bytes(dtype, &dims, &bytes)?
    };
    Ok(t)
}

fn int_bytes(x: i64, d: DType) -> Vec<u8> {
    x.to_le_bytes()[..d.size_of()].to_vec()
}

fn cast_f32(t: Tensor, d: DType) -> Tensor {
    let Tensor::F32(a) = t else {
        unreachable!("built as f32")
    };
    match d {
        DType::F64 => Tensor::F64(a.mapv(|x| x as f64)),
        DType::F16 => Tensor::F16(a.mapv(half::f16::from_f32)),
        DType::BF16 => Tensor::BF16(a.mapv(half::bf16::from_f32)),
        _ => Tensor::F32(a),
    }
}

/// `f32[1, 8, 32] mean 0.0123 min -1.2 max 2.3` (numeric summary of any dtype).
fn summary(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    let shape = t
        .shape()
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if v.is_empty() {
        return format!("{}[{shape}] (empty)", t.dtype());
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{}[{shape}] mean {mean:.6} min {min:.6} max {max:.6}",
        t.dtype()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_file_names() {
        assert_eq!(file_stem("last_hidden_state"), "last_hidden_state");
        assert_eq!(file_stem("onnx::Add/12 x"), "onnx__Add_12_x");
    }

    #[test]
    fn dims_parse_and_reject() {
        assert_eq!(
            parse_dims(&["seq=128".into()]).unwrap(),
            vec![(Symbol::new("seq"), 128)]
        );
        assert!(parse_dims(&["seq".into()])
            .unwrap_err()
            .to_string()
            .contains("SYMBOL=N"));
        assert!(parse_dims(&["seq=-1".into()]).is_err());
        assert!(parse_dims(&["2x=1".into()]).is_err());
    }
}
