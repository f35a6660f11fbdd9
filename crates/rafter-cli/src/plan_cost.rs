//! A kernel's estimated cost for `rafter plan`'s placement summary: how much of a model's
//! work (not only how many of its kernels) runs on the GPU.
//!
//! There is no measured cost model yet, so the estimate is a roofline on nominal figures:
//! a kernel takes `flops / FLOPS + bytes / BANDWIDTH`, where `bytes` is what its operands and
//! results hold and `flops` counts two per multiply-add of a matrix product or convolution
//! and one per output element of every other op. It ranks kernels well enough to tell a
//! model whose convolutions run on the GPU from one where only its glue does, which is
//! what the share is for; it is not a prediction of either device's time.

use std::collections::HashMap;

use rafter_ir::program::{Program, Step};
use rafter_ir::{Dim, Graph, Op, Symbol, TensorType};

/// Nominal multiply-add throughput of the host the estimate is made for (FLOP/s): a few
/// cores with 512-bit FMA units.
const FLOPS: f64 = 100e9;
/// Nominal memory bandwidth of that host (bytes/s).
const BANDWIDTH: f64 = 20e9;

/// Estimated seconds of every kernel of `p`, in kernel order, with each symbol at its
/// declared bound (a symbol without one counts as 1).
pub fn kernel_seconds(p: &Program) -> Vec<f64> {
    let bindings: HashMap<Symbol, i64> = p.bounds.iter().cloned().collect();
    let size = |d: &Dim| -> f64 {
        let mut b = bindings.clone();
        for s in d.symbols() {
            b.entry(s).or_insert(1);
        }
        d.eval(&b).map_or(1.0, |v| v.max(0) as f64)
    };
    let elements = |ty: &TensorType| -> f64 { ty.dims.iter().map(size).product() };
    let bytes = |ty: &TensorType| elements(ty) * ty.dtype.size_of() as f64;

    let mut seconds = vec![0.0; p.kernels.len()];
    for step in &p.steps {
        let Step::Dispatch {
            kernel,
            args,
            results,
        } = step
        else {
            continue;
        };
        if p.is_placed_view(step) {
            continue;
        }
        let moved: f64 = args
            .iter()
            .chain(results.iter().flatten())
            .map(|&b| bytes(&p.buffers[b].ty))
            .sum();
        let flops = body_flops(&p.kernels[*kernel].body, &elements, &size);
        seconds[*kernel] += flops / FLOPS + moved / BANDWIDTH;
    }
    seconds
}

/// Floating-point operations of one run of `body`: `2·M·N·K` for products, `2·out·C/g·k`
/// for convolutions, one per result element for every other op.
fn body_flops(
    body: &Graph,
    elements: &dyn Fn(&TensorType) -> f64,
    size: &dyn Fn(&Dim) -> f64,
) -> f64 {
    let mut total = 0.0;
    for node in &body.nodes {
        let out = node
            .outputs
            .first()
            .copied()
            .flatten()
            .map_or(0.0, |v| elements(&body.value(v).ty));
        let operand = |i: usize| node.input(i).map(|v| &body.value(v).ty);
        let reduced = match &node.op {
            Op::MatMul => operand(0).and_then(|a| a.dims.last()).map(size),
            Op::Gemm { trans_a, .. } => operand(0).and_then(|a| {
                let k = if *trans_a {
                    a.dims.first()
                } else {
                    a.dims.last()
                };
                k.map(size)
            }),
            // w: [M, C/group, kernel...] for both layouts' weights.
            Op::Conv { .. } | Op::ConvNhwc { .. } => {
                operand(1).map(|w| w.dims.iter().skip(1).map(size).product::<f64>())
            }
            _ => None,
        };
        total += match reduced {
            Some(k) => 2.0 * out * k,
            None => out,
        };
    }
    total
}
