//! Unit tests for shape inference: hand-computed expectations per op family.

mod bert;
mod control;
mod elementwise;
mod misc;
mod nn;
mod robustness;
mod shape_ops;

use super::{infer_node, InferInput, Inferred};
use crate::{ConstData, DType, Dim, Op, TensorType};

/// One operand as the importer would describe it.
#[derive(Clone, Debug)]
pub(super) struct In {
    pub ty: TensorType,
    pub sym: Option<Vec<Dim>>,
    pub konst: Option<ConstData>,
}

/// Parses `"seq"`, `"4"`, `"past+seq"`, `"2*seq"`, `"seq-1"` into a dim.
pub(super) fn d(s: &str) -> Dim {
    let s = s.replace(' ', "");
    let mut out = Dim::known(0);
    let mut term = String::new();
    let mut sign = 1;
    let flush = |term: &str, sign: i64, out: &mut Dim| {
        if term.is_empty() {
            return;
        }
        let mut t = Dim::known(sign);
        for f in term.split('*') {
            t = t.mul(&match f.parse::<i64>() {
                Ok(v) => Dim::known(v),
                Err(_) => Dim::symbol(f),
            });
        }
        *out = out.add(&t);
    };
    for c in s.chars() {
        if c == '+' || c == '-' {
            flush(&term, sign, &mut out);
            term.clear();
            sign = if c == '-' { -1 } else { 1 };
        } else {
            term.push(c);
        }
    }
    flush(&term, sign, &mut out);
    out
}

pub(super) fn dims(s: &[&str]) -> Vec<Dim> {
    s.iter().map(|x| d(x)).collect()
}

pub(super) fn ty(dtype: DType, s: &[&str]) -> TensorType {
    TensorType::new(dtype, dims(s))
}

impl In {
    /// A tensor of unknown contents.
    pub fn t(dtype: DType, s: &[&str]) -> In {
        In {
            ty: ty(dtype, s),
            sym: None,
            konst: None,
        }
    }

    pub fn f32(s: &[&str]) -> In {
        In::t(DType::F32, s)
    }

    /// A 1-D i64 constant.
    pub fn ints(v: &[i64]) -> In {
        In {
            ty: TensorType::known(DType::I64, &[v.len() as i64]),
            sym: Some(v.iter().map(|&x| Dim::known(x)).collect()),
            konst: Some(ConstData::from_i64s(v)),
        }
    }

    /// A 1-D i64 constant given only as data (no `sym`), to test reading constants.
    pub fn ints_konst(v: &[i64]) -> In {
        In {
            sym: None,
            ..In::ints(v)
        }
    }

    /// A 0-D i64 constant.
    pub fn scalar(v: i64) -> In {
        let mut c = ConstData::from_i64s(&[v]);
        c.dims.clear();
        In {
            ty: TensorType::known(DType::I64, &[]),
            sym: Some(vec![Dim::known(v)]),
            konst: Some(c),
        }
    }

    /// A 1-D f32 constant.
    pub fn floats(v: &[f32]) -> In {
        In {
            ty: TensorType::known(DType::F32, &[v.len() as i64]),
            sym: None,
            konst: Some(ConstData::from_f32s(v)),
        }
    }

    /// A 0-D f32 constant.
    pub fn fscalar(v: f32) -> In {
        let mut c = ConstData::from_f32s(&[v]);
        c.dims.clear();
        In {
            ty: TensorType::known(DType::F32, &[]),
            sym: None,
            konst: Some(c),
        }
    }

    /// An i64 vector (or scalar when `scalar`) with symbolic values.
    pub fn syms(v: &[&str]) -> In {
        In {
            ty: TensorType::known(DType::I64, &[v.len() as i64]),
            sym: Some(dims(v)),
            konst: None,
        }
    }

    pub fn sym_scalar(v: &str) -> In {
        In {
            ty: TensorType::known(DType::I64, &[]),
            sym: Some(vec![d(v)]),
            konst: None,
        }
    }

    /// Result `i` of an inference, as the next node's operand.
    pub fn from(r: &Inferred, i: usize) -> In {
        In {
            ty: r.types[i].clone(),
            sym: r.syms[i].clone(),
            konst: None,
        }
    }
}

/// Runs inference; fresh symbols are `<hint>_<n>` counting from 0.
pub(super) fn run(op: &Op, ins: &[Option<&In>], n: usize) -> Result<Inferred, String> {
    let inputs: Vec<Option<InferInput<'_>>> = ins
        .iter()
        .map(|o| {
            o.map(|i| InferInput {
                ty: &i.ty,
                sym: i.sym.as_deref(),
                konst: i.konst.as_ref(),
            })
        })
        .collect();
    let mut count = 0;
    let mut fresh = |hint: &str| {
        let s = Dim::symbol(&format!("{hint}_{count}"));
        count += 1;
        s
    };
    infer_node(op, &inputs, n, &mut fresh)
}

/// Runs inference with every operand present.
pub(super) fn run_all(op: &Op, ins: &[&In], n: usize) -> Result<Inferred, String> {
    let v: Vec<Option<&In>> = ins.iter().map(|i| Some(*i)).collect();
    run(op, &v, n)
}

/// The single result's type as text, e.g. `f32[batch, seq, 768]`.
pub(super) fn shape1(op: &Op, ins: &[&In]) -> String {
    let r = run_all(op, ins, 1).unwrap_or_else(|e| panic!("{} failed: {e}", op.name()));
    r.types[0].to_string()
}

/// Every result's type as text.
pub(super) fn shapes(op: &Op, ins: &[&In], n: usize) -> Vec<String> {
    let r = run_all(op, ins, n).unwrap_or_else(|e| panic!("{} failed: {e}", op.name()));
    r.types.iter().map(ToString::to_string).collect()
}

/// The single result's values as text, e.g. `[batch, seq, 4]`.
pub(super) fn vals1(op: &Op, ins: &[&In]) -> Option<String> {
    let r = run_all(op, ins, 1).unwrap_or_else(|e| panic!("{} failed: {e}", op.name()));
    r.syms[0].as_ref().map(|v| fmt(v))
}

pub(super) fn fmt(v: &[Dim]) -> String {
    let parts: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// The error of an inference that must fail.
pub(super) fn err(op: &Op, ins: &[Option<&In>], n: usize) -> String {
    match run(op, ins, n) {
        Ok(r) => panic!("{} should fail, got {:?}", op.name(), r.types),
        Err(e) => e,
    }
}

pub(super) fn err_all(op: &Op, ins: &[&In], n: usize) -> String {
    let v: Vec<Option<&In>> = ins.iter().map(|i| Some(*i)).collect();
    err(op, &v, n)
}

#[test]
fn dim_parser_for_tests() {
    assert_eq!(d("past+seq").to_string(), "past + seq");
    assert_eq!(d("2*seq-1").to_string(), "2*seq - 1");
    assert_eq!(d("4"), Dim::known(4));
}

#[test]
fn interface_contract() {
    // Negative operand dims are rejected up front.
    let bad = In::f32(&["2", "-1"]);
    let e = err_all(&Op::Identity, &[&bad], 1);
    assert_eq!(e, "operand 0 has negative dim -1 at axis 1");
    // Fewer results than the op has: the rest are dropped; none at all is fine.
    let x = In::f32(&["b", "4"]);
    let topk = Op::TopK {
        axis: 1,
        largest: true,
        sorted: true,
    };
    let r = run_all(&topk, &[&x, &In::ints(&[2])], 1).unwrap();
    assert_eq!(r.types.len(), 1);
    let r = run_all(&Op::Identity, &[&x], 0).unwrap();
    assert!(r.types.is_empty() && r.syms.is_empty());
    // Fresh symbols are named after the op.
    let r = run_all(&Op::NonZero, &[&x], 1).unwrap();
    assert_eq!(r.types[0].to_string(), "i64[2, non_zero_0]");
    // A sym of the wrong length is ignored, and the constant read instead.
    let mut odd = In::ints(&[4, 8]);
    odd.sym = Some(dims(&["1"]));
    assert_eq!(
        shape1(
            &Op::Reshape { allow_zero: false },
            &[&In::f32(&["32"]), &odd]
        ),
        "f32[4, 8]"
    );
    // Values are only reported for small integer results.
    assert_eq!(vals1(&Op::Identity, &[&In::floats(&[1.0])]), None);
}
