//! Helpers shared by the runtime's tests: hand-built programs, a node-per-kernel lowering
//! of whole graphs, and a small JSON reader for trace files.
#![allow(dead_code)]

pub mod json;

use std::collections::HashMap;
use std::time::Duration;

use rafter_ir::program::{Arena, BufferDecl, Kernel, KernelKind, Port, Program, Step, Storage};
use rafter_ir::{ConstId, Dim, Graph, Op, Symbol, TensorType, ValueDef, ValueId};

/// Long enough never to expire when things work; a broken ordering fails after it.
pub const LONG: Duration = Duration::from_secs(60);

pub fn f32_ty(dims: &[Dim]) -> TensorType {
    TensorType::new(rafter_ir::DType::F32, dims.to_vec())
}

pub fn n() -> Dim {
    Dim::symbol("n")
}

/// A kernel whose body is one op over `inputs`, giving `outputs`.
pub fn one_op_kernel(
    name: &str,
    op: Op,
    inputs: &[TensorType],
    outputs: &[TensorType],
    device: &str,
) -> Kernel {
    let mut body = Graph::new(name);
    let ins: Vec<Option<ValueId>> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| Some(body.add_input(format!("{name}_in{i}"), t.clone())))
        .collect();
    let outs = body.add_node(
        name,
        op,
        ins,
        outputs
            .iter()
            .enumerate()
            .map(|(i, t)| Some((format!("{name}_out{i}"), t.clone())))
            .collect(),
    );
    body.outputs = outs.into_iter().flatten().collect();
    Kernel {
        name: name.to_string(),
        kind: KernelKind::Opaque,
        device: device.to_string(),
        body,
    }
}

pub fn buffer(name: &str, ty: TensorType, storage: Storage) -> BufferDecl {
    BufferDecl {
        name: name.to_string(),
        ty,
        storage,
    }
}

pub fn host_arena() -> Arena {
    Arena {
        device: "cpu".into(),
        memory: "host".into(),
        size: None,
        lower_bound: None,
    }
}

/// Lowers a graph with one kernel per node (the shape `rafter-opt` output takes, without
/// fusion): graph inputs are program inputs, constants read by nodes are weights (sharing
/// the graph's bytes), node results are arena buffers planned per call (or host slots when
/// their dims name a symbol the inputs do not bind), graph outputs are output buffers.
pub fn lower_per_node(g: &Graph) -> Program {
    let mut p = Program {
        name: g.name.clone(),
        arenas: vec![host_arena()],
        ..Program::default()
    };
    let input_symbols: Vec<Symbol> = g
        .inputs
        .iter()
        .flat_map(|&v| g.value(v).ty.dims.iter().flat_map(|d| d.symbols()))
        .collect();
    for &v in &g.inputs {
        let val = g.value(v);
        p.inputs.push(Port {
            name: val.name.clone(),
            ty: val.ty.clone(),
        });
    }
    for &v in &g.outputs {
        let val = g.value(v);
        p.outputs.push(Port {
            name: val.name.clone(),
            ty: val.ty.clone(),
        });
    }
    let mut buf_of: HashMap<ValueId, usize> = HashMap::new();
    let mut weight_of: HashMap<ConstId, usize> = HashMap::new();
    for (i, &v) in g.inputs.iter().enumerate() {
        let val = g.value(v);
        buf_of.insert(v, p.buffers.len());
        p.buffers
            .push(buffer(&val.name, val.ty.clone(), Storage::Input(i)));
    }
    let mut operand = |p: &mut Program, buf_of: &mut HashMap<ValueId, usize>, v: ValueId| {
        if let Some(&b) = buf_of.get(&v) {
            return b;
        }
        let val = g.value(v);
        let ValueDef::Const(c) = val.def else {
            panic!("value `{}` used before definition", val.name)
        };
        let w = *weight_of.entry(c).or_insert_with(|| {
            p.weights.push(g.constant(c).clone());
            p.weights.len() - 1
        });
        p.buffers
            .push(buffer(&val.name, val.ty.clone(), Storage::Weight(w)));
        buf_of.insert(v, p.buffers.len() - 1);
        p.buffers.len() - 1
    };
    for node in &g.nodes {
        let mut body = Graph::new(&node.name);
        let mut args = Vec::new();
        let body_inputs: Vec<Option<ValueId>> = node
            .inputs
            .iter()
            .map(|i| {
                i.map(|v| {
                    args.push(operand(&mut p, &mut buf_of, v));
                    let val = g.value(v);
                    body.add_input(&val.name, val.ty.clone())
                })
            })
            .collect();
        let outs = body.add_node(
            &node.name,
            node.op.clone(),
            body_inputs,
            node.outputs
                .iter()
                .map(|o| o.map(|v| (g.value(v).name.clone(), g.value(v).ty.clone())))
                .collect(),
        );
        body.outputs = outs.into_iter().flatten().collect();
        let mut results = Vec::new();
        for &v in node.outputs.iter().flatten() {
            let val = g.value(v);
            let storage = if let Some(k) = g.outputs.iter().position(|&o| o == v) {
                Storage::Output(k)
            } else if val
                .ty
                .dims
                .iter()
                .flat_map(|d| d.symbols())
                .all(|s| input_symbols.contains(&s))
            {
                Storage::Arena {
                    arena: 0,
                    offset: None,
                }
            } else {
                Storage::Dynamic
            };
            buf_of.insert(v, p.buffers.len());
            p.buffers.push(buffer(&val.name, val.ty.clone(), storage));
            results.push(Some(p.buffers.len() - 1));
        }
        p.kernels.push(Kernel {
            name: node.name.clone(),
            kind: KernelKind::Opaque,
            device: "cpu".into(),
            body,
        });
        p.steps.push(Step::Dispatch {
            kernel: p.kernels.len() - 1,
            args,
            results,
        });
    }
    // Graph outputs that no node produces (inputs, constants) are copied.
    for (k, &v) in g.outputs.iter().enumerate() {
        if matches!(g.value(v).def, ValueDef::Node { .. }) {
            continue;
        }
        let src = operand(&mut p, &mut buf_of, v);
        let val = g.value(v);
        p.buffers
            .push(buffer(&val.name, val.ty.clone(), Storage::Output(k)));
        p.steps.push(Step::Copy {
            src,
            dst: p.buffers.len() - 1,
        });
    }
    p.verify().unwrap_or_else(|e| panic!("{e}"));
    p
}

/// A `.npy` file as the runtime's tensor.
#[allow(dead_code)]
pub fn read_npy(path: &std::path::Path) -> rafter_runtime::Tensor {
    let t = rafter_reference::npy::read_npy(path).unwrap_or_else(|e| panic!("{e}"));
    rafter_runtime_cpu::from_reference(&t).unwrap()
}

/// The reference executor's outputs of `g` on `inputs`: the oracle, in the runtime's type.
#[allow(dead_code)]
pub fn reference_run(g: &Graph, inputs: &[rafter_runtime::Tensor]) -> Vec<rafter_runtime::Tensor> {
    let inputs = inputs
        .iter()
        .map(|t| rafter_runtime_cpu::to_reference(t).unwrap())
        .collect();
    rafter_reference::run(g, inputs)
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .map(|t| rafter_runtime_cpu::from_reference(t).unwrap())
        .collect()
}

/// Max |a - b| over two tensors of one shape.
pub fn max_abs_diff(a: &rafter_runtime::Tensor, b: &rafter_runtime::Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}
