//! A tiny program interpreter for tests: runs each kernel body with the reference
//! executor, in step order. Buffers with a planned arena offset live as bytes in their
//! arena (so a plan that lets live buffers overlap corrupts results); others as tensors.

#![allow(dead_code)]

use rafter_ir::program::{Program, Step, Storage};
use rafter_ir::program_text::{parse_program_inline, print_program, WeightMode};
use rafter_ir::text::parse_graph;
use rafter_ir::Graph;
use rafter_reference::{Bindings, Tensor};

/// The interpreter's memory: tensors by buffer, and the bytes of planned arenas.
struct Memory<'p> {
    p: &'p Program,
    tensors: Vec<Option<Tensor>>,
    arenas: Vec<Vec<u8>>,
    /// Shapes of the tensors stored in arena bytes.
    shapes: Vec<Option<Vec<usize>>>,
}

impl Memory<'_> {
    fn planned(&self, b: usize) -> Option<(usize, usize)> {
        match self.p.buffers[b].storage {
            Storage::Arena {
                arena,
                offset: Some(o),
            } => Some((arena, o as usize)),
            _ => None,
        }
    }

    fn read(&self, b: usize) -> Result<Tensor, String> {
        let Some((a, offset)) = self.planned(b) else {
            return self.tensors[b].clone().ok_or("read before written".into());
        };
        let dims = self.shapes[b].as_ref().ok_or("read before written")?;
        let dtype = self.p.buffers[b].ty.dtype;
        let len = dims.iter().product::<usize>() * dtype.size_of();
        let bytes = self.arenas[a]
            .get(offset..offset + len)
            .ok_or_else(|| format!("buffer {b} past the end of arena {a}"))?;
        Tensor::from_le_bytes(dtype, dims, bytes).map_err(|e| e.to_string())
    }

    fn write(&mut self, b: usize, t: Tensor) -> Result<(), String> {
        let Some((a, offset)) = self.planned(b) else {
            self.tensors[b] = Some(t);
            return Ok(());
        };
        let bytes = t.to_le_bytes();
        self.arenas[a]
            .get_mut(offset..offset + bytes.len())
            .ok_or_else(|| {
                format!(
                    "buffer {b} ({} bytes) past the end of arena {a}",
                    bytes.len()
                )
            })?
            .copy_from_slice(&bytes);
        self.shapes[b] = Some(t.shape().to_vec());
        Ok(())
    }
}

/// Runs `p` on `inputs` (in port order) and returns its outputs (in port order). A step
/// reads all its operands before it writes any result (as the CPU runtime does).
pub fn interpret(p: &Program, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    p.verify().map_err(|e| e.to_string())?;
    let nb = p.buffers.len();
    let mut mem = Memory {
        p,
        tensors: vec![None; nb],
        arenas: p
            .arenas
            .iter()
            .map(|a| vec![0xA5; a.size.unwrap_or(0) as usize])
            .collect(),
        shapes: vec![None; nb],
    };
    for (i, b) in p.buffers.iter().enumerate() {
        match b.storage {
            Storage::Input(k) => {
                mem.tensors[i] = Some(inputs.get(k).ok_or("missing input")?.clone())
            }
            Storage::Weight(w) => mem.tensors[i] = Some(Tensor::from_const(&p.weights[w])),
            _ => {}
        }
    }
    // The inputs' symbols, then the defined ones (as the runtime binds them): the reference
    // then checks every kernel's results against the sizes the definitions give.
    let mut bindings = Bindings::default();
    for (port, t) in p.inputs.iter().zip(&inputs) {
        bindings.check(&port.ty, t, &format!("input `{}`", port.name))?;
    }
    let values = |name: &str| {
        let k = p.inputs.iter().position(|port| port.name == name)?;
        inputs.get(k).map(Tensor::to_const)
    };
    rafter_ir::bind_defined(&p.symbol_defs, &mut bindings, &values)?;
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
                    .map(|&b| mem.read(b))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("step {si}: {e}"))?;
                let outs = rafter_reference::run_with(&k.body, args, &mut bindings)
                    .map_err(|e| format!("step {si} kernel `{}`: {e}", k.name))?;
                for (r, t) in results.iter().zip(outs) {
                    if let Some(r) = r {
                        mem.write(*r, t).map_err(|e| format!("step {si}: {e}"))?;
                    }
                }
            }
            Step::Copy { src, dst } => {
                let t = mem.read(*src).map_err(|e| format!("step {si}: {e}"))?;
                mem.write(*dst, t).map_err(|e| format!("step {si}: {e}"))?;
            }
        }
    }
    (0..p.outputs.len())
        .map(|k| {
            let b = p
                .buffers
                .iter()
                .position(|b| b.storage == Storage::Output(k))
                .ok_or("no output buffer")?;
            mem.read(b).map_err(|e| format!("output {k}: {e}"))
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
    check_equivalent_with(g, inputs, &rafter_opt::CompileOptions::default())
}

/// [`check_equivalent`] with compile options (bounds for the memory planner).
pub fn check_equivalent_with(
    g: &Graph,
    inputs: Vec<Tensor>,
    opts: &rafter_opt::CompileOptions,
) -> rafter_ir::program::Program {
    let p = rafter_opt::compile(g, opts).unwrap_or_else(|e| panic!("compile: {e}"));
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
