//! Extra check over ONNX's node tests (when generated into `.cache/onnx-conformance`):
//! every model that imports and runs on the reference executor compiles, survives the
//! program text format, and computes bitwise the same outputs.

mod common;

use common::{interpret, same_bits};
use rafter_ir::program_text::{parse_program_inline, print_program, WeightMode};
use rafter_onnx_proto::{decode_tensor, load_tensor_file};
use rafter_reference::Tensor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

fn load(path: &Path) -> Option<Tensor> {
    let (proto, _) = load_tensor_file(path).ok()?;
    let t = decode_tensor(&proto, path.parent()).ok()?;
    let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    Tensor::from_le_bytes(
        rafter_import::dtype_from_onnx(t.data_type).ok()?,
        &dims,
        &t.data,
    )
    .ok()
}

enum Outcome {
    /// Does not import, load or run on the reference: not this crate's concern.
    Skipped,
    Same,
    Failed(String),
}

fn check(dir: &Path) -> Outcome {
    let Ok(model) = rafter_import::import_onnx_file(&dir.join("model.onnx")) else {
        return Outcome::Skipped;
    };
    let set = dir.join("test_data_set_0");
    let inputs: Option<Vec<Tensor>> = (0..)
        .map(|i| set.join(format!("input_{i}.pb")))
        .take_while(|p| p.is_file())
        .map(|p| load(&p))
        .collect();
    let Some(inputs) = inputs else {
        return Outcome::Skipped;
    };
    let g = &model.graph;
    let Ok(want) = rafter_reference::run(g, inputs.clone()) else {
        return Outcome::Skipped;
    };
    // Half precision as the graph has it: computing f16 in f32 (the CPU default) changes
    // the bits on purpose; tests/widen.rs checks that it is the f32 graph rounded once,
    // and rafter-conformance checks it against ONNX's expected outputs.
    let opts = rafter_opt::CompileOptions {
        half_compute: rafter_opt::HalfCompute::AsIs,
        ..Default::default()
    };
    let p = match rafter_opt::compile(g, &opts) {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(format!("compile: {e}")),
    };
    let text = print_program(&p, WeightMode::Inline);
    match parse_program_inline(&text) {
        Ok(back) if back == p => {}
        Ok(_) => return Outcome::Failed("program text round trip differs".into()),
        Err(e) => return Outcome::Failed(format!("program text: {e}")),
    }
    let got = match interpret(&p, inputs) {
        Ok(o) => o,
        Err(e) => return Outcome::Failed(format!("interpret: {e}")),
    };
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        if let Err(e) = same_bits(a, b) {
            return Outcome::Failed(format!("output {i}: {e}"));
        }
    }
    Outcome::Same
}

#[test]
fn onnx_node_tests_compile_to_equivalent_programs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/onnx-conformance/node");
    let Ok(entries) = std::fs::read_dir(&root) else {
        eprintln!(
            "note: {} not found; skipping (generate it with scripts/gen_conformance_data.py)",
            root.display()
        );
        return;
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    dirs.sort();
    let next = Mutex::new(0usize);
    let results = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    *n += 1;
                    *n - 1
                };
                let Some(dir) = dirs.get(i) else { break };
                let outcome = catch_unwind(AssertUnwindSafe(|| check(dir)))
                    .unwrap_or_else(|_| Outcome::Failed("panic".into()));
                results.lock().unwrap().push((dir.clone(), outcome));
            });
        }
    });
    let results = results.into_inner().unwrap();
    let same = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Same))
        .count();
    let skipped = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Skipped))
        .count();
    let mut failed: Vec<String> = results
        .iter()
        .filter_map(|(d, o)| match o {
            Outcome::Failed(e) => {
                Some(format!("{}: {e}", d.file_name().unwrap().to_string_lossy()))
            }
            _ => None,
        })
        .collect();
    failed.sort();
    eprintln!(
        "onnx node tests: {} models, {same} compiled and identical, {skipped} skipped (no import or reference run), {} mismatches",
        results.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
