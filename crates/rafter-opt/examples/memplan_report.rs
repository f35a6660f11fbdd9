//! Compiles an ONNX model with declared bounds and prints its memory plan.
//!
//! ```text
//! cargo run --release -p rafter-opt --example memplan_report -- model.onnx batch<=1 seq<=128
//! ```

use rafter_ir::program::Storage;
use rafter_ir::Symbol;
use rafter_opt::memplan::{check_plan, memory_report, plan_memory, PlanOptions};
use rafter_opt::CompileOptions;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((model, dims)) = args.split_first() else {
        eprintln!("usage: memplan_report MODEL.onnx [SYMBOL<=N ...]");
        return ExitCode::FAILURE;
    };
    let mut bounds = Vec::new();
    for d in dims {
        let parsed = d
            .split_once("<=")
            .and_then(|(s, n)| Some((Symbol::new(s.trim()), n.trim().parse::<i64>().ok()?)));
        let Some(bound) = parsed else {
            eprintln!("expected SYMBOL<=N, found `{d}`");
            return ExitCode::FAILURE;
        };
        bounds.push(bound);
    }
    match report(model, bounds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{model}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn report(model: &str, bounds: Vec<(Symbol, i64)>) -> Result<(), String> {
    let graph = rafter_import::import_onnx_file(std::path::Path::new(model))
        .map_err(|e| e.to_string())?
        .graph;
    let start = std::time::Instant::now();
    let p = rafter_opt::compile(
        &graph,
        &CompileOptions {
            bounds,
            ..CompileOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let compiled = start.elapsed();
    check_plan(&p).map_err(|e| e.to_string())?;
    let arena_buffers = p
        .buffers
        .iter()
        .filter(|b| matches!(b.storage, Storage::Arena { .. }))
        .count();
    println!(
        "{model}: {} kernels, {} steps, {arena_buffers} arena buffers, compiled in {:.2?}",
        p.kernels.len(),
        p.steps.len(),
        compiled
    );
    for port in &p.inputs {
        println!("input {}: {}", port.name, port.ty);
    }
    for r in memory_report(&p) {
        println!("{r}");
    }
    let mut without = p.clone();
    plan_memory(&mut without, &PlanOptions { in_place: false }).map_err(|e| e.to_string())?;
    for r in memory_report(&without) {
        println!("without in-place results: {r}");
    }
    Ok(())
}
