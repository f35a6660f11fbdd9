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
/// declared bound; a symbol without one (a size fixed at run time) at the largest declared
/// bound, an upper estimate (1 where nothing is bounded).
pub fn kernel_seconds(p: &Program) -> Vec<f64> {
    let bindings: HashMap<Symbol, i64> = p.bounds.iter().cloned().collect();
    let unbound = bindings.values().copied().max().unwrap_or(1);
    let size = |d: &Dim| -> f64 {
        let mut b = bindings.clone();
        for s in d.symbols() {
            b.entry(s).or_insert(unbound);
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
        let body = &p.kernels[*kernel].body;
        // `shape` and `size` read only their operand's dims, not its bytes.
        let reads_dims_only = body
            .nodes
            .iter()
            .all(|n| matches!(n.op, Op::Shape { .. } | Op::Size));
        let read: f64 = if reads_dims_only {
            0.0
        } else {
            args.iter().map(|&b| bytes(&p.buffers[b].ty)).sum()
        };
        let written: f64 = results
            .iter()
            .flatten()
            .map(|&b| bytes(&p.buffers[b].ty))
            .sum();
        let moved = read + written;
        let flops = body_flops(body, &elements, &size);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One product [8, 64] × [64, 32]: 2·8·64·32 FLOPs and its three operands' bytes,
    /// computed by hand; a `shape` kernel costs only its result.
    #[test]
    fn a_product_costs_its_flops_and_bytes() {
        let g = rafter_ir::text::parse_graph(
            "graph @g(%a: f32[8, 64], %b: f32[64, 32]) -> (%y, %s) {\n  %y: f32[8, 32] = matmul(%a, %b)\n  %s: i64[2] = shape{start = 0}(%a)\n}",
        )
        .unwrap();
        let p = rafter_opt::compile(&g, &rafter_opt::CompileOptions::default()).unwrap();
        let seconds = kernel_seconds(&p);
        let matmul = p
            .kernels
            .iter()
            .position(|k| k.body.nodes.iter().any(|n| matches!(n.op, Op::MatMul)))
            .unwrap();
        let want = 2.0 * 8.0 * 64.0 * 32.0 / FLOPS
            + 4.0 * (8.0 * 64.0 + 64.0 * 32.0 + 8.0 * 32.0) / BANDWIDTH;
        assert!(
            (seconds[matmul] - want).abs() < 1e-12 * want.max(1.0),
            "{seconds:?} vs {want}"
        );
        if let Some(shape) = p.kernels.iter().position(|k| {
            k.body
                .nodes
                .iter()
                .all(|n| matches!(n.op, Op::Shape { .. }))
        }) {
            assert!(
                (seconds[shape] - 16.0 / BANDWIDTH).abs() < 1e-15,
                "{seconds:?}"
            );
        }
    }
}
