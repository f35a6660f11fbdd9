//! A tiny program interpreter for tests: runs each kernel body with the reference
//! executor, in step order, over a vector of buffers.

#![allow(dead_code)]

use rafter_ir::program::{Program, Step, Storage};
use rafter_ir::program_text::{parse_program_inline, print_program, WeightMode};
use rafter_ir::text::parse_graph;
use rafter_ir::Graph;
use rafter_reference::{Bindings, Tensor};

/// Runs `p` on `inputs` (in port order) and returns its outputs (in port order).
pub fn interpret(p: &Program, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    p.verify().map_err(|e| e.to_string())?;
    let mut bufs: Vec<Option<Tensor>> = vec![None; p.buffers.len()];
    for (i, b) in p.buffers.iter().enumerate() {
        match b.storage {
            Storage::Input(k) => bufs[i] = Some(inputs.get(k).ok_or("missing input")?.clone()),
            Storage::Weight(w) => bufs[i] = Some(Tensor::from_const(&p.weights[w])),
            _ => {}
        }
    }
    let mut bindings = Bindings::default();
    for (si, step) in p.steps.iter().enumerate() {
        match step {
            Step::Dispatch {
                kernel,
                args,
                results,
            } => {
                let k = &p.kernels[*kernel];
                let args: Vec<Tensor> = args
                    .iter()
                    .map(|&b| bufs[b].clone().expect("verified: written before read"))
                    .collect();
                let outs = rafter_reference::run_with(&k.body, args, &mut bindings)
                    .map_err(|e| format!("step {si} kernel `{}`: {e}", k.name))?;
                for (r, t) in results.iter().zip(outs) {
                    if let Some(r) = r {
                        bufs[*r] = Some(t);
                    }
                }
            }
            Step::Copy { src, dst } => bufs[*dst] = bufs[*src].clone(),
        }
    }
    (0..p.outputs.len())
        .map(|k| {
            let b = p
                .buffers
                .iter()
                .position(|b| b.storage == Storage::Output(k))
                .ok_or("no output buffer")?;
            bufs[b].clone().ok_or_else(|| "output not written".into())
        })
        .collect()
}

/// Bitwise equality (NaNs compare by payload), with a description of the first difference.
pub fn same_bits(a: &Tensor, b: &Tensor) -> Result<(), String> {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return Err(format!(
            "{}{:?} vs {}{:?}",
            a.dtype(),
            a.shape(),
            b.dtype(),
            b.shape()
        ));
    }
    if a.to_le_bytes() != b.to_le_bytes() {
        let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
        let i = x
            .iter()
            .zip(&y)
            .position(|(p, q)| p.to_bits() != q.to_bits())
            .unwrap_or(0);
        return Err(format!("element {i}: {:?} vs {:?}", x.get(i), y.get(i)));
    }
    Ok(())
}

/// Compiles `g`, interprets the program and runs the graph with the reference; checks the
/// results are bitwise identical, and that the program survives the program text format.
/// Returns the program.
pub fn check_equivalent(g: &Graph, inputs: Vec<Tensor>) -> rafter_ir::program::Program {
    let p = rafter_opt::compile(g, &rafter_opt::CompileOptions::default())
        .unwrap_or_else(|e| panic!("compile: {e}"));
    let text = print_program(&p, WeightMode::Inline);
    let back = parse_program_inline(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(back == p, "program text round trip differs:\n{text}");
    let want =
        rafter_reference::run(g, inputs.clone()).unwrap_or_else(|e| panic!("reference: {e}"));
    let got = interpret(&p, inputs).unwrap_or_else(|e| panic!("interpret: {e}"));
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        same_bits(a, b).unwrap_or_else(|e| panic!("output {i}: {e}"));
    }
    p
}

pub fn parse(src: &str) -> Graph {
    let g = parse_graph(src).unwrap_or_else(|e| panic!("{e}"));
    rafter_ir::verify(&g).unwrap();
    g
}

/// A deterministic pseudo-random f32 tensor in [-2, 2).
pub fn rand_f32(dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect();
    Tensor::f32s(dims, v)
}
