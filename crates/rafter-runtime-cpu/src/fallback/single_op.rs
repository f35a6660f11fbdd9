//! The tensor path's kernels for single-op bodies the reference executor runs slowly:
//! transposes and layer normalisation of f32 tensors (together ~30% of BERT-base's time on the reference
//! executor, whose general n-d iteration steps one index at a time).
//!
//! Each kernel computes exactly what the reference does — layer norm in f64 with the same
//! two-pass mean and variance, then rounded to f32 — and returns `None` at build time for
//! any body it does not cover, so the reference executor stays the fallback. Shapes come
//! from the operands at run time; the results are checked against the body's types by the
//! caller like any host kernel's.

use std::sync::Arc;

use rafter_ir::{DType, Graph, Op, ValueDef, ValueId};
use rafter_reference::Tensor;

use super::TensorKernel;

/// A tensor kernel for a body of one f32 transpose or layer norm of body inputs.
pub(crate) fn single_op_kernel(body: &Graph) -> Option<TensorKernel> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    let input = |v: Option<ValueId>| -> Option<usize> {
        let v = v?;
        match body.value(v).def {
            ValueDef::Input(i) if body.value(v).ty.dtype == DType::F32 => Some(i),
            _ => None,
        }
    };
    match &node.op {
        Op::Transpose { perm } if node.inputs.len() == 1 => {
            let x = input(node.inputs[0])?;
            let perm: Vec<usize> = perm
                .iter()
                .map(|&p| usize::try_from(p).ok())
                .collect::<Option<_>>()?;
            Some(Arc::new(move |ins: &[Tensor]| {
                Ok(vec![transpose(f32s(&ins[x])?, ins[x].shape(), &perm)?])
            }))
        }
        Op::LayerNorm { axis, epsilon } if node.outputs.iter().skip(1).all(Option::is_none) => {
            let x = input(node.inputs[0])?;
            let scale = input(*node.inputs.get(1)?)?;
            let bias = match node.inputs.get(2) {
                Some(Some(b)) => Some(input(Some(*b))?),
                _ => None,
            };
            let (axis, eps) = (*axis, *epsilon as f64);
            Some(Arc::new(move |ins: &[Tensor]| {
                let shape = ins[x].shape();
                let axis = resolve(axis, shape.len())?;
                let cols: usize = shape[axis..].iter().product();
                let params = |i: usize| -> Result<&[f32], String> {
                    let p = f32s(&ins[i])?;
                    if p.len() != cols {
                        return Err(format!(
                            "layer norm parameter of {} elements, rows of {cols}",
                            p.len()
                        ));
                    }
                    Ok(p)
                };
                let b = bias.map(params).transpose()?;
                let y = layer_norm(f32s(&ins[x])?, cols, params(scale)?, b, eps);
                Ok(vec![Tensor::f32s(shape, y)])
            }))
        }
        _ => None,
    }
}

/// The elements of a contiguous f32 tensor.
fn f32s(t: &Tensor) -> Result<&[f32], String> {
    match t {
        Tensor::F32(a) => a
            .as_slice()
            .ok_or_else(|| "operand is not contiguous".to_string()),
        other => Err(format!("expected f32, got {:?}", other.dtype())),
    }
}

fn resolve(axis: i64, rank: usize) -> Result<usize, String> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| format!("axis {axis} out of range for rank {rank}"))
}

/// `x` of `shape` (row-major) with its axes permuted: output axis `i` is input axis
/// `perm[i]`. Walks the output in order with an odometer over the input strides, copying
/// whole rows when the last axis stays last.
fn transpose(x: &[f32], shape: &[usize], perm: &[usize]) -> Result<Tensor, String> {
    let rank = shape.len();
    let mut seen = vec![false; rank];
    if perm.len() != rank
        || perm
            .iter()
            .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
    {
        return Err(format!(
            "transpose: perm {perm:?} is not a permutation of {rank} axes"
        ));
    }
    let mut in_strides = vec![1usize; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        in_strides[i] = in_strides[i + 1] * shape[i + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let n = x.len();
    let mut y = Vec::with_capacity(n);
    if n == 0 || rank == 0 {
        y.extend_from_slice(x);
        return Ok(Tensor::f32s(&out_shape, y));
    }
    let (inner, inner_stride) = (out_shape[rank - 1], strides[rank - 1]);
    let mut idx = vec![0usize; rank - 1];
    let mut base = 0usize;
    loop {
        if inner_stride == 1 {
            y.extend_from_slice(&x[base..base + inner]);
        } else {
            y.extend((0..inner).map(|j| x[base + j * inner_stride]));
        }
        // Advance the odometer over the outer output axes.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return Ok(Tensor::f32s(&out_shape, y));
            }
            d -= 1;
            idx[d] += 1;
            base += strides[d];
            if idx[d] < out_shape[d] {
                break;
            }
            base -= strides[d] * idx[d];
            idx[d] = 0;
        }
    }
}

/// Layer norm of each `cols`-element row of `x`, as the reference computes it: mean and
/// (biased) variance in f64, two passes, then `(x - mean) / sqrt(var + eps) * scale + bias`.
fn layer_norm(x: &[f32], cols: usize, scale: &[f32], bias: Option<&[f32]>, eps: f64) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len());
    if cols == 0 {
        return y;
    }
    for row in x.chunks(cols) {
        let n = cols as f64;
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = row
            .iter()
            .map(|&v| (v as f64 - mean) * (v as f64 - mean))
            .sum::<f64>()
            / n;
        let inv = 1.0 / (var + eps).sqrt();
        y.extend(row.iter().enumerate().map(|(j, &v)| {
            let b = bias.map_or(0.0, |b| b[j] as f64);
            ((v as f64 - mean) * inv * scale[j] as f64 + b) as f32
        }));
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_ir::TensorType;

    fn known(shape: &[usize]) -> TensorType {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        TensorType::known(DType::F32, &dims)
    }

    fn data(shape: &[usize], seed: u32) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n).map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32 / 250.0
                - 2.0
        });
        Tensor::f32s(shape, v.collect())
    }

    /// A one-node body of `op` over inputs of `shapes`, and its single result of `out`.
    fn body(op: Op, shapes: &[&[usize]], out: &[usize], outputs: usize) -> Graph {
        let mut g = Graph::new("k");
        let ins: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| Some(g.add_input(format!("x{i}"), known(s))))
            .collect();
        let mut outs = vec![Some(("y".to_string(), known(out)))];
        outs.resize(outputs, None);
        let y = g.add_node("n", op, ins, outs);
        g.outputs.push(y[0].unwrap());
        g
    }

    /// The host kernel's result is bitwise the reference executor's.
    fn same_as_reference(g: &Graph, inputs: Vec<Tensor>) {
        let k = single_op_kernel(g).expect("the fast path takes this body");
        let got = k(&inputs).unwrap();
        let want = rafter_reference::run(g, inputs).unwrap();
        assert_eq!(got[0].shape(), want[0].shape());
        let (g, w) = (got[0].to_f64_vec(), want[0].to_f64_vec());
        assert!(
            g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{g:?}\nvs\n{w:?}"
        );
    }

    #[test]
    fn transposes_match_the_reference() {
        for (shape, perm) in [
            (vec![1, 5, 3, 4], vec![0, 2, 1, 3]),
            (vec![2, 3, 4], vec![2, 0, 1]),
            (vec![7, 9], vec![1, 0]),
            (vec![6], vec![0]),
            (vec![2, 0, 3], vec![1, 2, 0]),
        ] {
            let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let op = Op::Transpose {
                perm: perm.iter().map(|&p| p as i64).collect(),
            };
            same_as_reference(&body(op, &[&shape], &out, 1), vec![data(&shape, 3)]);
        }
    }

    #[test]
    fn layer_norms_match_the_reference() {
        let shape = [2, 5, 8];
        for (axis, bias) in [(-1i64, true), (2, false), (1, true)] {
            let cols: usize = shape[axis.rem_euclid(3) as usize..].iter().product();
            let op = Op::LayerNorm {
                axis,
                epsilon: 1e-5,
            };
            let mut shapes: Vec<&[usize]> = vec![&shape];
            let pshape = shape[axis.rem_euclid(3) as usize..].to_vec();
            shapes.push(&pshape);
            if bias {
                shapes.push(&pshape);
            }
            let mut inputs = vec![data(&shape, 1), data(&pshape, 2)];
            if bias {
                inputs.push(data(&pshape, 5));
            }
            assert_eq!(pshape.iter().product::<usize>(), cols);
            same_as_reference(&body(op, &shapes, &shape, 3), inputs);
        }
    }

    #[test]
    fn malformed_operands_are_errors() {
        let e = transpose(&[0.0; 6], &[2, 3], &[0, 0]).unwrap_err();
        assert!(e.contains("not a permutation of 2 axes"), "{e}");
        let e = transpose(&[0.0; 6], &[2, 3], &[1]).unwrap_err();
        assert!(e.contains("not a permutation"), "{e}");
        let ln = body(
            Op::LayerNorm {
                axis: -1,
                epsilon: 1e-5,
            },
            &[&[2, 4], &[4]],
            &[2, 4],
            1,
        );
        let k = single_op_kernel(&ln).unwrap();
        let e = k(&[data(&[2, 4], 1), data(&[3], 2)]).unwrap_err();
        assert!(e.contains("parameter of 3 elements, rows of 4"), "{e}");
        let e = k(&[
            data(&[2, 4], 1),
            Tensor::from_le_bytes(DType::F64, &[4], &[0; 32]).unwrap(),
        ]);
        assert!(e.unwrap_err().contains("expected f32"));
    }

    #[test]
    fn other_bodies_are_left_to_the_reference() {
        let op = Op::Transpose { perm: vec![1, 0] };
        let mut g = body(op, &[&[2, 3]], &[3, 2], 1);
        g.values[0].ty.dtype = DType::F64;
        assert!(single_op_kernel(&g).is_none());
        let ln = body(
            Op::LayerNorm {
                axis: -1,
                epsilon: 1e-5,
            },
            &[&[2, 4], &[4]],
            &[2, 4],
            2,
        );
        let mut with_mean = ln.clone();
        with_mean.nodes[0].outputs[1] = Some(with_mean.outputs[0]);
        assert!(single_op_kernel(&with_mean).is_none());
        assert!(single_op_kernel(&ln).is_some());
    }
}
