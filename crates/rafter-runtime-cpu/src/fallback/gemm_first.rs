//! The tensor path's kernel for bodies that start with a matrix product.
//!
//! When no native kernel covers a body (or a native kernel declines a call's shapes), the
//! CPU runs the body on owned tensors. Contractions are where nearly all the time goes,
//! so a body whose first node is an f32 `matmul` of two body inputs gets a tensor
//! kernel that computes the product with `rafter-kernels-cpu`'s packed GEMM and runs the
//! rest of the body (the fused bias, activation or residual epilogue) with the reference
//! executor, on the product as an extra input. Shapes are checked per call: anything the
//! fast path does not cover (a broadcast between batch dims, empty dims) falls back to the
//! reference executor for the whole body, so results never depend on which path ran
//! beyond floating-point summation order.

use std::sync::Arc;

use rafter_ir::{Bindings, DType, Graph, NodeId, Op, ValueDef, ValueId};
use rafter_kernels_cpu::{sgemm, BRef, Epilogue, MatMut, MatRef, Parallel};
use rafter_reference::{run_with, Tensor};

use super::TensorKernel;
use crate::native::Par;

/// A tensor kernel for `body` when it starts with an f32 matmul of two body inputs, running
/// its GEMMs on `par`; `None` for any other body.
pub(crate) fn matmul_kernel(body: &Graph, par: &Par) -> Option<TensorKernel> {
    let first = body.nodes.first()?;
    if first.op != Op::MatMul || first.inputs.len() != 2 || first.outputs.len() != 1 {
        return None;
    }
    let operand = |v: Option<ValueId>| -> Option<usize> {
        let v = v?;
        match body.value(v).def {
            ValueDef::Input(i) if body.value(v).ty.dtype == DType::F32 => Some(i),
            _ => None,
        }
    };
    let (a, b) = (operand(first.inputs[0])?, operand(first.inputs[1])?);
    let product = first.outputs[0]?;
    let rest = Arc::new(rest_of(body, product)?);
    let full = Arc::new(body.clone());
    let par = par.clone();
    Some(Arc::new(move |inputs: &[Tensor]| {
        let Some(c) = matmul(&inputs[a], &inputs[b], &*par)? else {
            let mut bindings = Bindings::default();
            return run_with(&full, inputs.to_vec(), &mut bindings).map_err(|e| e.to_string());
        };
        if rest.nodes.is_empty() && rest.outputs == [rest.inputs[inputs.len()]] {
            return Ok(vec![c]);
        }
        let mut rest_inputs = inputs.to_vec();
        rest_inputs.push(c);
        let mut bindings = Bindings::default();
        run_with(&rest, rest_inputs, &mut bindings).map_err(|e| e.to_string())
    }))
}

/// `body` without its first node, whose result `product` becomes one more input (the last).
fn rest_of(body: &Graph, product: ValueId) -> Option<Graph> {
    let mut g = body.clone();
    g.nodes.remove(0);
    g.values[product.0 as usize].def = ValueDef::Input(g.inputs.len());
    g.inputs.push(product);
    for v in g.values.iter_mut() {
        if let ValueDef::Node { node, output } = v.def {
            v.def = ValueDef::Node {
                node: NodeId(node.0.checked_sub(1)?),
                output,
            };
        }
    }
    rafter_ir::verify::verify(&g).ok()?;
    Some(g)
}

/// ONNX MatMul of f32 `a` [..., M, K] and `b` [..., K, N] by GEMM, when the batch dims allow
/// it without broadcasting copies: `b` 2-D (the batch folds into M), or both with the same
/// batch dims. `Ok(None)` when the shapes need the general path.
fn matmul(a: &Tensor, b: &Tensor, par: &dyn Parallel) -> Result<Option<Tensor>, String> {
    let (Tensor::F32(a), Tensor::F32(b)) = (a, b) else {
        return Ok(None);
    };
    let (Some(a_data), Some(b_data)) = (a.as_slice(), b.as_slice()) else {
        return Ok(None);
    };
    let (sa, sb) = (a.shape(), b.shape());
    if sa.len() < 2 || sb.len() < 2 || sa.contains(&0) || sb.contains(&0) {
        return Ok(None);
    }
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (kb, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != kb {
        return Err(format!("matmul: {sa:?} times {sb:?}: inner dims differ"));
    }
    let a_batch = &sa[..sa.len() - 2];
    let (batches, rows, out_shape) = if sb.len() == 2 {
        let rows = a_batch.iter().product::<usize>() * m;
        (1, rows, [a_batch, &[m, n]].concat())
    } else if a_batch == &sb[..sb.len() - 2] {
        (
            a_batch.iter().product::<usize>(),
            m,
            [a_batch, &[m, n]].concat(),
        )
    } else {
        return Ok(None);
    };
    let mut c = vec![0f32; batches * rows * n];
    for i in 0..batches {
        let a_i = &a_data[i * rows * k..(i + 1) * rows * k];
        let b_i = &b_data[i * k * n..(i + 1) * k * n];
        let c_i = &mut c[i * rows * n..(i + 1) * rows * n];
        let err = |e: rafter_kernels_cpu::GemmError| format!("matmul: {e}");
        let am = MatRef::row_major(a_i, rows, k, k).map_err(err)?;
        let bm = MatRef::row_major(b_i, k, n, n).map_err(err)?;
        let cm = MatMut::row_major(c_i, rows, n, n).map_err(err)?;
        sgemm(1.0, am, BRef::Mat(bm), 0.0, cm, &Epilogue::none(), par).map_err(err)?;
    }
    Ok(Some(Tensor::f32s(&out_shape, c)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_kernels_cpu::ScopedThreads;

    fn seq(shape: &[usize], scale: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::f32s(
            shape,
            (0..n).map(|i| ((i % 7) as f32 - 3.0) * scale).collect(),
        )
    }

    fn known(shape: &[usize]) -> rafter_ir::TensorType {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        rafter_ir::TensorType::known(DType::F32, &dims)
    }

    /// The reference executor's MatMul of `a` and `b` (whose result has `out` dims).
    fn reference_matmul(a: &Tensor, b: &Tensor, out: &[usize]) -> Tensor {
        let mut g = Graph::new("mm");
        let x = g.add_input("a", known(a.shape()));
        let y = g.add_input("b", known(b.shape()));
        let c = g.add_node(
            "mm",
            Op::MatMul,
            vec![Some(x), Some(y)],
            vec![Some(("c".into(), known(out)))],
        );
        g.outputs.push(c[0].unwrap());
        rafter_reference::run(&g, vec![a.clone(), b.clone()])
            .unwrap()
            .remove(0)
    }

    /// The fast product agrees with the reference executor's matmul.
    fn check(sa: &[usize], sb: &[usize]) {
        let (a, b) = (seq(sa, 0.5), seq(sb, 0.25));
        let got = matmul(&a, &b, &ScopedThreads::new(2)).unwrap().unwrap();
        let want = reference_matmul(&a, &b, got.shape());
        assert_eq!(got.shape(), want.shape());
        for (x, y) in got.to_f64_vec().iter().zip(want.to_f64_vec()) {
            assert!(
                (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                "{sa:?}x{sb:?}: {x} vs {y}"
            );
        }
    }

    #[test]
    fn products_match_the_reference() {
        check(&[1, 1], &[1, 1]);
        check(&[7, 13], &[13, 29]);
        check(&[2, 5, 64], &[64, 33]);
        check(&[2, 3, 17, 8], &[2, 3, 8, 19]);
    }

    #[test]
    fn mismatched_inner_dims_are_an_error() {
        let (a, b) = (seq(&[2, 3], 1.0), seq(&[4, 5], 1.0));
        let e = matmul(&a, &b, &ScopedThreads::new(1)).unwrap_err();
        assert!(e.contains("inner dims differ"), "{e}");
    }

    #[test]
    fn broadcast_batches_take_the_general_path() {
        let (a, b) = (seq(&[2, 4, 3], 1.0), seq(&[1, 3, 5], 1.0));
        assert!(matmul(&a, &b, &ScopedThreads::new(1)).unwrap().is_none());
        let v = seq(&[3], 1.0);
        assert!(matmul(&v, &b, &ScopedThreads::new(1)).unwrap().is_none());
    }
}

#[cfg(test)]
mod model_tests {
    use super::*;

    /// Every matmul-rooted kernel of the bert_tiny fixture gets the fast path.
    #[test]
    fn bert_tiny_matmul_kernels_take_the_fast_path() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/bert_tiny/model.onnx"
        );
        let graph = rafter_import::import_onnx_file(std::path::Path::new(path))
            .unwrap()
            .graph;
        let program = rafter_opt::compile(&graph, &rafter_opt::CompileOptions::default()).unwrap();
        let rooted: Vec<_> = program
            .kernels
            .iter()
            .filter(|k| k.body.nodes.first().is_some_and(|n| n.op == Op::MatMul))
            .collect();
        assert!(!rooted.is_empty());
        for k in rooted {
            let first = &k.body.nodes[0];
            let defs: Vec<_> = first
                .inputs
                .iter()
                .map(|v| k.body.value(v.unwrap()).def)
                .collect();
            assert!(
                matmul_kernel(&k.body, &crate::native::pool(1)).is_some(),
                "{}: {} nodes, operand defs {defs:?}, rest builds: {}",
                k.name,
                k.body.nodes.len(),
                rest_of(&k.body, first.outputs[0].unwrap()).is_some()
            );
        }
    }
}
