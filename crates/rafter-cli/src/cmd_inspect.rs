//! `rafter inspect`: what a model holds and what rafter can run of it.

use anyhow::{Context, Result};
use rafter_onnx_proto::{GraphProto, ModelProto};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

pub fn inspect(path: &Path, ir: bool) -> Result<ExitCode> {
    let bytes =
        rafter_onnx_proto::map_file(path).with_context(|| format!("reading {}", path.display()))?;
    let model = rafter_import::decode_onnx(bytes, &path.display().to_string())?;
    let opsets: Vec<String> = model
        .opset_import
        .iter()
        .map(|o| {
            format!(
                "{}:{}",
                if o.domain.is_empty() {
                    "ai.onnx"
                } else {
                    &o.domain
                },
                o.version
            )
        })
        .collect();
    println!("model: {}", path.display());
    println!(
        "  producer {} {}, ir_version {}, opsets {}",
        model.producer_name,
        model.producer_version,
        model.ir_version,
        opsets.join(" ")
    );
    let graph_ir = print_signature(path, &model);
    let graph = model.graph.as_ref();
    let mut hist = BTreeMap::new();
    if let Some(g) = graph {
        count_ops(g, &mut hist);
    }
    let total: usize = hist.values().sum();
    println!(
        "ops: {total} nodes (subgraphs included), {} kinds",
        hist.len()
    );
    let mut by_count: Vec<_> = hist.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (op, n) in by_count {
        println!("  {n:>6}  {op}");
    }
    let (count, bytes) = graph.map(parameters).unwrap_or((0, 0));
    println!(
        "parameters: {count} elements, {bytes} bytes ({:.2} MB) in initializers",
        bytes as f64 / 1e6
    );
    let unsupported = rafter_import::check_support(&model);
    if unsupported.is_empty() {
        println!("unsupported: none");
    } else {
        println!("unsupported: {}", unsupported.len());
        for u in &unsupported {
            println!("  {u}");
        }
    }
    if let (true, Some(g)) = (ir, graph_ir) {
        println!("ir:");
        print!("{}", rafter_ir::text::print_graph_elided(&g));
    }
    Ok(ExitCode::SUCCESS)
}

/// Inputs and outputs with symbolic dims: from the imported graph when the model imports,
/// else as the file declares them. Returns the imported graph, if any.
fn print_signature(path: &Path, model: &ModelProto) -> Option<rafter_ir::Graph> {
    match rafter_import::import_onnx_model(model, path.parent(), &path.display().to_string()) {
        Ok(imported) => {
            let g = &imported.graph;
            println!("inputs:");
            for &id in &g.inputs {
                println!("  {}: {}", g.value(id).name, g.value(id).ty);
            }
            println!("outputs:");
            for &id in &g.outputs {
                println!("  {}: {}", g.value(id).name, g.value(id).ty);
            }
            Some(imported.graph)
        }
        Err(e) => {
            println!("does not import: {e}");
            let g = model.graph.as_ref()?;
            let inits: std::collections::HashSet<&str> =
                g.initializer.iter().map(|t| t.name.as_str()).collect();
            println!("inputs (as declared):");
            for vi in g.input.iter().filter(|v| !inits.contains(v.name.as_str())) {
                println!("  {}", vi.name);
            }
            println!("outputs (as declared):");
            for vi in &g.output {
                println!("  {}", vi.name);
            }
            None
        }
    }
}

fn count_ops(g: &GraphProto, hist: &mut BTreeMap<String, usize>) {
    for n in &g.node {
        let key = if n.domain.is_empty() || n.domain == "ai.onnx" {
            n.op_type.clone()
        } else {
            format!("{}:{}", n.domain, n.op_type)
        };
        *hist.entry(key).or_insert(0) += 1;
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                count_ops(sub, hist);
            }
        }
    }
}

/// Element count and bytes of the initializers.
fn parameters(g: &GraphProto) -> (u64, u64) {
    g.initializer.iter().fold((0, 0), |(c, b), t| {
        let n: u64 = t.dims.iter().map(|&d| d.max(0) as u64).product();
        let size = rafter_onnx_proto::element_size(t.data_type).unwrap_or(0) as u64;
        (c + n, b + n * size)
    })
}
