//! Reference kernels: control flow (If, Loop, Scan).
//!
//! Subgraphs run through [`crate::exec::run_with`] with fresh symbol bindings (a loop
//! body may see differently shaped values on every iteration). Captured outer values are
//! explicit operands, passed to the body after its own inputs.

use super::data::{norm_axis, owned, with_dtype, Elem};
use super::{invalid, OpCtx, OpError};
use crate::exec::{run_with, Bindings, ExecError};
use crate::{with_array, Tensor};
use ndarray::{ArrayD, Axis, IxDyn};
use rafter_ir::{Graph, Op};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let outs = match op {
        Op::If {
            then_branch,
            else_branch,
        } => {
            let cond = truth(super::arg(inputs, 0)?, "if condition")?;
            let caps = present(&inputs[1..], "if capture")?;
            let (g, which) = if cond {
                (then_branch, "then_branch")
            } else {
                (else_branch, "else_branch")
            };
            run_body(g, caps, which)?
        }
        Op::Loop { body } => run_loop(body, inputs, ctx)?,
        Op::Scan {
            body,
            num_scan_inputs,
            num_captures,
            scan_input_axes,
            scan_input_directions,
            scan_output_axes,
            scan_output_directions,
        } => run_scan(
            body,
            inputs,
            ctx,
            *num_scan_inputs as usize,
            *num_captures as usize,
            (scan_input_axes, scan_input_directions),
            (scan_output_axes, scan_output_directions),
        )?,
        other => return super::unsupported(format!("`{}` is not a control op", other.name())),
    };
    Ok(outs.into_iter().map(Some).collect())
}

/// Runs a subgraph, turning its failure into this node's (an unsupported op inside stays
/// unsupported).
fn run_body(g: &Graph, inputs: Vec<Tensor>, which: &str) -> Result<Vec<Tensor>, OpError> {
    run_with(g, inputs, &mut Bindings::default()).map_err(|e: ExecError| {
        let msg = format!("in {which}: {e}");
        if e.is_unsupported() {
            OpError::Unsupported(msg)
        } else {
            OpError::Invalid(msg)
        }
    })
}

fn truth(t: &Tensor, what: &str) -> Result<bool, OpError> {
    match t.to_f64_vec()[..] {
        [v] => Ok(v != 0.0),
        _ => invalid(format!(
            "{what} must hold one element, got shape {:?}",
            t.shape()
        )),
    }
}

fn present(ts: &[Option<&Tensor>], what: &str) -> Result<Vec<Tensor>, OpError> {
    ts.iter()
        .enumerate()
        .map(|(i, t)| {
            t.cloned()
                .ok_or_else(|| OpError::Invalid(format!("{what} {i} is missing")))
        })
        .collect()
}

/// Stacks equally shaped tensors along a new axis `axis`.
fn stack(parts: &[Tensor], axis: usize) -> Result<Tensor, OpError> {
    let first = &parts[0];
    let shape = first.shape().to_vec();
    if parts
        .iter()
        .any(|p| p.shape() != &shape[..] || p.dtype() != first.dtype())
    {
        return invalid("scan outputs differ in shape or dtype between iterations");
    }
    fn go<T: Elem>(_: &ArrayD<T>, parts: &[Tensor], shape: &[usize], axis: usize) -> Tensor {
        let mut v = Vec::with_capacity(parts.len() * parts[0].len());
        for p in parts {
            v.extend(T::unwrap(p).unwrap().iter().copied());
        }
        let mut s = vec![parts.len()];
        s.extend_from_slice(shape);
        let a = ArrayD::from_shape_vec(IxDyn(&s), v).unwrap();
        let r = s.len();
        let perm: Vec<usize> = (1..=axis).chain([0]).chain(axis + 1..r).collect();
        T::wrap(owned(a.view().permuted_axes(IxDyn(&perm))))
    }
    Ok(with_array!(first, a => go(a, parts, &shape, axis)))
}

/// An empty tensor for a scan output that saw no iterations, shaped from its IR type
/// (unknown dims become 0).
fn empty_output(ctx: &OpCtx, i: usize) -> Result<Tensor, OpError> {
    let Some(ty) = ctx.output_type(i) else {
        // Unused result: any placeholder will do.
        return Ok(Tensor::f32s(&[0], vec![]));
    };
    let shape: Vec<usize> = ty
        .dims
        .iter()
        .map(|d| d.as_known().unwrap_or(0).max(0) as usize)
        .collect();
    let shape = if shape.iter().product::<usize>() == 0 {
        shape
    } else {
        let mut s = shape;
        s[0] = 0;
        s
    };
    Ok(with_dtype!(ty.dtype, T => T::wrap(ArrayD::from_shape_vec(IxDyn(&shape), vec![]).unwrap())))
}

/// How many of the Loop's operands after (max_trip_count, cond) are loop-carried; the rest
/// are captures. The op does not record it: the convention (kept by the importer, which
/// turns captures into loop-carried values when the body also has scan outputs) is that a
/// loop never has both captures and scan outputs, so the count is
/// `min(operands - 2, results)`.
fn loop_carried_count(body: &Graph, ctx: &OpCtx) -> Result<usize, OpError> {
    let n_ops = ctx.node.inputs.len().saturating_sub(2);
    let n_outs = ctx.num_outputs();
    if body.inputs.len() != n_ops + 2 || body.outputs.len() != n_outs + 1 {
        return invalid(format!(
            "loop: {} operands and {} results do not fit a body of {} inputs and {} outputs",
            ctx.node.inputs.len(),
            n_outs,
            body.inputs.len(),
            body.outputs.len()
        ));
    }
    Ok(n_ops.min(n_outs))
}

fn run_loop(body: &Graph, inputs: &[Option<&Tensor>], ctx: &OpCtx) -> Result<Vec<Tensor>, OpError> {
    let n = loop_carried_count(body, ctx)?;
    let max_trip = match inputs.first().copied().flatten() {
        Some(t) => Some(super::data::int_scalar(t, "max_trip_count")?),
        None => None,
    };
    let mut cond = match inputs.get(1).copied().flatten() {
        Some(t) => truth(t, "loop condition")?,
        None => true,
    };
    let mut carried = present(&inputs[2..2 + n], "loop-carried value")?;
    let caps = present(&inputs[2 + n..], "loop capture")?;
    let k = ctx.num_outputs() - n;
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); k];
    let mut it: i64 = 0;
    while cond && max_trip.is_none_or(|m| it < m) {
        let mut args = vec![
            Tensor::I64(ndarray::arr0(it).into_dyn()),
            Tensor::Bool(ndarray::arr0(cond).into_dyn()),
        ];
        args.extend(carried);
        args.extend(caps.iter().cloned());
        let mut outs = run_body(body, args, "loop body")?.into_iter();
        cond = truth(&outs.next().unwrap(), "loop body condition")?;
        carried = outs.by_ref().take(n).collect();
        for (s, t) in scans.iter_mut().zip(outs) {
            s.push(t);
        }
        it += 1;
    }
    let mut res = carried;
    for (j, s) in scans.iter().enumerate() {
        res.push(if s.is_empty() {
            empty_output(ctx, n + j)?
        } else {
            stack(s, 0)?
        });
    }
    Ok(res)
}

fn run_scan(
    body: &Graph,
    inputs: &[Option<&Tensor>],
    ctx: &OpCtx,
    m: usize,
    c: usize,
    (in_axes, in_dirs): (&[i64], &[i64]),
    (out_axes, out_dirs): (&[i64], &[i64]),
) -> Result<Vec<Tensor>, OpError> {
    let all = present(inputs, "scan operand")?;
    if all.len() < m + c || m == 0 {
        return invalid(format!(
            "scan: {} operands for {m} scan inputs and {c} captures",
            all.len()
        ));
    }
    let ns = all.len() - m - c;
    let k = body.outputs.len().checked_sub(ns).ok_or_else(|| {
        OpError::Invalid("scan: the body has fewer outputs than state values".into())
    })?;
    let mut state: Vec<Tensor> = all[..ns].to_vec();
    let scan_in = &all[ns..ns + m];
    let caps = &all[ns + m..];
    let axes: Vec<usize> = (0..m)
        .map(|i| {
            norm_axis(
                in_axes.get(i).copied().unwrap_or(0),
                scan_in[i].shape().len(),
            )
        })
        .collect::<Result<_, _>>()?;
    let len = scan_in[0].shape()[axes[0]];
    if (0..m).any(|i| scan_in[i].shape()[axes[i]] != len) {
        return invalid("scan: scan inputs differ in sequence length");
    }
    let mut outs: Vec<Vec<Tensor>> = vec![Vec::new(); k];
    for t in 0..len {
        let mut args = state;
        for i in 0..m {
            let pos = if in_dirs.get(i).copied().unwrap_or(0) == 1 {
                len - 1 - t
            } else {
                t
            };
            args.push(
                with_array!(&scan_in[i], a => Elem::wrap(owned(a.index_axis(Axis(axes[i]), pos)))),
            );
        }
        args.extend(caps.iter().cloned());
        let mut res = run_body(body, args, "scan body")?.into_iter();
        state = res.by_ref().take(ns).collect();
        for (o, r) in outs.iter_mut().zip(res) {
            o.push(r);
        }
    }
    let mut result = state;
    for (j, mut o) in outs.into_iter().enumerate() {
        if o.is_empty() {
            result.push(empty_output(ctx, ns + j)?);
            continue;
        }
        if out_dirs.get(j).copied().unwrap_or(0) == 1 {
            o.reverse();
        }
        let axis = norm_axis(
            out_axes.get(j).copied().unwrap_or(0),
            o[0].shape().len() + 1,
        )?;
        result.push(stack(&o, axis)?);
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::run;
    use rafter_ir::{BinaryOp, ConstData, DType, TensorType};

    fn f32t(dims: &[i64]) -> TensorType {
        TensorType::known(DType::F32, dims)
    }

    /// `if c { x + 1 } else { x * x }` with `x` captured.
    #[test]
    fn if_runs_the_chosen_branch_with_captures() {
        let branch = |op: BinaryOp, with_const: bool| {
            let mut g = Graph::new("b");
            let x = g.add_input("x", f32t(&[2]));
            let rhs = if with_const {
                g.add_const("one", ConstData::from_f32s(&[1.0, 1.0]))
            } else {
                x
            };
            let y = g.add_node(
                "op",
                Op::Binary { op },
                vec![Some(x), Some(rhs)],
                vec![Some(("y".into(), f32t(&[2])))],
            )[0]
            .unwrap();
            g.outputs.push(y);
            Box::new(g)
        };
        let mut g = Graph::new("main");
        let c = g.add_input("c", TensorType::known(DType::Bool, &[]));
        let x = g.add_input("x", f32t(&[2]));
        let y = g.add_node(
            "if",
            Op::If {
                then_branch: branch(BinaryOp::Add, true),
                else_branch: branch(BinaryOp::Mul, false),
            },
            vec![Some(c), Some(x)],
            vec![Some(("y".into(), f32t(&[2])))],
        )[0]
        .unwrap();
        g.outputs.push(y);
        let x = Tensor::f32s(&[2], vec![2.0, 3.0]);
        let t = Tensor::Bool(ndarray::arr0(true).into_dyn());
        let f = Tensor::Bool(ndarray::arr0(false).into_dyn());
        let out = run(&g, vec![t, x.clone()]).unwrap();
        assert_eq!(out[0], Tensor::f32s(&[2], vec![3.0, 4.0]));
        let out = run(&g, vec![f, x]).unwrap();
        assert_eq!(out[0], Tensor::f32s(&[2], vec![4.0, 9.0]));
    }

    /// A loop of identity bodies: carried value passes through, scan output stacks the
    /// capture (which, as the importer does when there are scan outputs, is passed as a
    /// loop-carried value the body returns unchanged).
    #[test]
    fn loop_carries_and_stacks() {
        let mut body = Graph::new("body");
        let _i = body.add_input("i", TensorType::known(DType::I64, &[]));
        let c = body.add_input("c", TensorType::known(DType::Bool, &[]));
        let v = body.add_input("v", f32t(&[2]));
        let cap = body.add_input("cap", f32t(&[3]));
        body.outputs = vec![c, v, cap, cap];
        let mut g = Graph::new("main");
        let m = g.add_input("m", TensorType::known(DType::I64, &[]));
        let v0 = g.add_input("v0", f32t(&[2]));
        let cap0 = g.add_input("cap0", f32t(&[3]));
        let outs = g.add_node(
            "loop",
            Op::Loop {
                body: Box::new(body),
            },
            vec![Some(m), None, Some(v0), Some(cap0)],
            vec![
                Some(("vf".into(), f32t(&[2]))),
                None,
                Some(("scan".into(), f32t(&[3, 3]))),
            ],
        );
        g.outputs = outs.into_iter().flatten().collect();
        let node = &g.nodes[0];
        let ctx = OpCtx { graph: &g, node };
        let mt = Tensor::I64(ndarray::arr0(3).into_dyn());
        let v = Tensor::f32s(&[2], vec![1.0, 2.0]);
        let cp = Tensor::f32s(&[3], vec![7.0, 8.0, 9.0]);
        let r = eval(&node.op, &[Some(&mt), None, Some(&v), Some(&cp)], &ctx).unwrap();
        assert_eq!(r[0].as_ref().unwrap(), &v);
        let s = r[2].as_ref().unwrap();
        assert_eq!(s.shape(), &[3, 3]);
        assert_eq!(s.to_f64_vec(), [7., 8., 9., 7., 8., 9., 7., 8., 9.]);
    }

    #[test]
    fn stack_on_inner_axis() {
        let a = Tensor::f32s(&[2], vec![1.0, 2.0]);
        let b = Tensor::f32s(&[2], vec![3.0, 4.0]);
        let s = stack(&[a, b], 1).unwrap();
        assert_eq!(s.shape(), &[2, 2]);
        assert_eq!(s.to_f64_vec(), [1.0, 3.0, 2.0, 4.0]);
    }
}
