//! Elementwise ops, broadcasting and value arithmetic.

use super::*;
use crate::{BinaryOp, DType, GeluApprox, Op, UnaryOp};

fn bin(op: BinaryOp) -> Op {
    Op::Binary { op }
}

#[test]
fn broadcasting() {
    let add = bin(BinaryOp::Add);
    assert_eq!(
        shape1(&add, &[&In::f32(&["b", "1", "4"]), &In::f32(&["3", "1"])]),
        "f32[b, 3, 4]"
    );
    assert_eq!(
        shape1(&add, &[&In::f32(&["s"]), &In::f32(&["1"])]),
        "f32[s]"
    );
    assert_eq!(
        shape1(&add, &[&In::f32(&["s"]), &In::f32(&["s"])]),
        "f32[s]"
    );
    // A symbol against a known size other than 1 must be that size.
    assert_eq!(
        shape1(&add, &[&In::f32(&["s"]), &In::f32(&["5"])]),
        "f32[5]"
    );
    // Two different symbols: undecidable, fresh.
    assert_eq!(
        shape1(&add, &[&In::f32(&["s"]), &In::f32(&["t"])]),
        "f32[binary_0]"
    );
    assert_eq!(
        shape1(&add, &[&In::f32(&[]), &In::f32(&["2", "0"])]),
        "f32[2, 0]"
    );
    let e = err_all(&add, &[&In::f32(&["2", "3"]), &In::f32(&["2", "4"])], 1);
    assert_eq!(e, "broadcast: dim 1 is 3 in operand 0 and 4 in operand 1");
    let e = err_all(&add, &[&In::f32(&["2"]), &In::t(DType::F16, &["2"])], 1);
    assert!(e.contains("dtypes differ: f32 and f16"), "{e}");
    assert!(err_all(&add, &[&In::f32(&["2"])], 1).contains("expects 2 operand(s), got 1"));
    assert!(err(&add, &[Some(&In::f32(&["2"])), None], 1).contains("operand 1 is missing"));
}

#[test]
fn dtypes() {
    let a = In::f32(&["2", "3"]);
    for op in [BinaryOp::Equal, BinaryOp::Less, BinaryOp::GreaterOrEqual] {
        assert_eq!(shape1(&bin(op), &[&a, &a]), "bool[2, 3]");
    }
    let b = In::t(DType::Bool, &["3"]);
    assert_eq!(shape1(&bin(BinaryOp::Xor), &[&b, &b]), "bool[3]");
    assert_eq!(
        shape1(&bin(BinaryOp::Pow), &[&a, &In::t(DType::I32, &[])]),
        "f32[2, 3]"
    );
    assert_eq!(
        shape1(&bin(BinaryOp::PRelu), &[&a, &In::f32(&["3"])]),
        "f32[2, 3]"
    );
    assert!(err_all(&bin(BinaryOp::PRelu), &[&In::f32(&["3"]), &a], 1).contains("prelu"));
    assert_eq!(
        shape1(&Op::Unary { op: UnaryOp::IsNaN }, &[&a]),
        "bool[2, 3]"
    );
    assert_eq!(shape1(&Op::Unary { op: UnaryOp::Exp }, &[&a]), "f32[2, 3]");
    assert_eq!(
        shape1(
            &Op::IsInf {
                detect_negative: true,
                detect_positive: true
            },
            &[&a]
        ),
        "bool[2, 3]"
    );
    assert_eq!(shape1(&Op::Cast { to: DType::F16 }, &[&a]), "f16[2, 3]");
    assert_eq!(
        shape1(
            &Op::Gelu {
                approximate: GeluApprox::Tanh
            },
            &[&a]
        ),
        "f32[2, 3]"
    );
    assert_eq!(shape1(&Op::LeakyRelu { alpha: 0.1 }, &[&a]), "f32[2, 3]");
    let w = Op::Where;
    let c = In::t(DType::Bool, &["1", "3"]);
    assert_eq!(
        shape1(&w, &[&c, &In::f32(&["2", "1"]), &In::f32(&[])]),
        "f32[2, 3]"
    );
    assert!(err_all(&w, &[&a, &a, &a], 1).contains("must be bool"));
    assert_eq!(
        shape1(&Op::Clip, &[&a, &In::fscalar(0.0), &In::fscalar(6.0)]),
        "f32[2, 3]"
    );
    assert_eq!(
        run(&Op::Clip, &[Some(&a), None, Some(&In::fscalar(6.0))], 1)
            .unwrap()
            .types[0]
            .to_string(),
        "f32[2, 3]"
    );
    assert!(err_all(&Op::Clip, &[&a, &a], 1).contains("must be a scalar"));
}

#[test]
fn value_arithmetic() {
    let v = |op: BinaryOp, a: &In, b: &In| vals1(&bin(op), &[a, b]);
    let s = In::syms(&["b", "s"]);
    assert_eq!(v(BinaryOp::Mul, &s, &In::scalar(2)).unwrap(), "[2*b, 2*s]");
    assert_eq!(
        v(BinaryOp::Add, &s, &In::ints(&[1, 2])).unwrap(),
        "[b + 1, s + 2]"
    );
    assert_eq!(
        v(BinaryOp::Sub, &In::sym_scalar("p+s"), &In::sym_scalar("p")).unwrap(),
        "[s]"
    );
    assert_eq!(
        v(BinaryOp::Div, &In::scalar(-7), &In::scalar(2)).unwrap(),
        "[-3]"
    );
    assert_eq!(
        v(BinaryOp::Mod, &In::scalar(-7), &In::scalar(2)).unwrap(),
        "[1]"
    );
    assert_eq!(
        v(BinaryOp::FMod, &In::scalar(-7), &In::scalar(2)).unwrap(),
        "[-1]"
    );
    assert_eq!(
        v(BinaryOp::Max, &In::scalar(3), &In::scalar(5)).unwrap(),
        "[5]"
    );
    assert_eq!(v(BinaryOp::Min, &In::sym_scalar("s"), &In::scalar(5)), None);
    assert_eq!(v(BinaryOp::Equal, &s, &In::syms(&["b", "t"])), None);
    assert_eq!(
        v(BinaryOp::Equal, &In::ints(&[3, 4]), &In::scalar(4)).unwrap(),
        "[0, 1]"
    );
    assert_eq!(
        v(BinaryOp::Equal, &In::sym_scalar("s"), &In::sym_scalar("s")).unwrap(),
        "[1]"
    );
    // Sizes are non-negative: a symbol is never -1, `s + 1 > s`; `s` vs `t` stays unknown.
    assert_eq!(
        v(BinaryOp::Equal, &s, &In::ints(&[-1, -1])).unwrap(),
        "[0, 0]"
    );
    let s1 = In::sym_scalar("s+1");
    let ss = In::sym_scalar("s");
    for (op, want) in [
        (BinaryOp::Less, "[1]"),
        (BinaryOp::LessOrEqual, "[1]"),
        (BinaryOp::Greater, "[0]"),
        (BinaryOp::GreaterOrEqual, "[0]"),
        (BinaryOp::Equal, "[0]"),
    ] {
        assert_eq!(v(op, &ss, &s1).unwrap(), want, "{op:?}(s, s + 1)");
    }
    assert_eq!(
        v(BinaryOp::GreaterOrEqual, &ss, &In::scalar(0)).unwrap(),
        "[1]"
    );
    assert_eq!(v(BinaryOp::Greater, &ss, &In::scalar(0)), None);
    assert_eq!(v(BinaryOp::Less, &ss, &In::sym_scalar("t")), None);
    assert_eq!(v(BinaryOp::Div, &In::scalar(1), &In::scalar(0)), None);
    // Overflowing products carry no value, and never panic.
    assert_eq!(
        v(BinaryOp::Mul, &In::scalar(i64::MAX), &In::scalar(2)),
        None
    );

    // Unary on values.
    assert_eq!(
        vals1(&Op::Unary { op: UnaryOp::Neg }, &[&s]).unwrap(),
        "[-b, -s]"
    );
    assert_eq!(
        vals1(&Op::Unary { op: UnaryOp::Abs }, &[&In::scalar(-3)]).unwrap(),
        "[3]"
    );
    // Cast between integer types keeps values; to float drops them.
    let c = run_all(&Op::Cast { to: DType::I32 }, &[&s], 1).unwrap();
    assert_eq!(c.types[0].to_string(), "i32[2]");
    assert_eq!(fmt(c.syms[0].as_ref().unwrap()), "[b, s]");
    assert_eq!(vals1(&Op::Cast { to: DType::F32 }, &[&s]), None);
    assert_eq!(
        vals1(&Op::Cast { to: DType::I64 }, &[&In::floats(&[2.7, -1.5])]).unwrap(),
        "[2, -1]"
    );
    assert_eq!(
        vals1(&Op::Cast { to: DType::U8 }, &[&In::ints(&[300])]).unwrap(),
        "[44]"
    );
    // Where with a known condition.
    let cond = In {
        ty: crate::TensorType::known(DType::Bool, &[2]),
        sym: Some(dims(&["1", "0"])),
        konst: None,
    };
    assert_eq!(
        vals1(&Op::Where, &[&cond, &s, &In::scalar(7)]).unwrap(),
        "[b, 7]"
    );
    // Clip with known bounds.
    assert_eq!(
        vals1(
            &Op::Clip,
            &[&In::ints(&[-5, 3, 50]), &In::scalar(0), &In::scalar(10)]
        )
        .unwrap(),
        "[0, 3, 10]"
    );
    // Identity.
    assert_eq!(vals1(&Op::Identity, &[&s]).unwrap(), "[b, s]");
    // Float results carry no values.
    assert_eq!(
        vals1(
            &bin(BinaryOp::Add),
            &[&In::floats(&[1.0]), &In::floats(&[2.0])]
        ),
        None
    );
}
