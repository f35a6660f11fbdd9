//! ONNX Runtime's convolution contrib ops, decomposed at import:
//!
//! - `FusedConv` (ORT's CPU fusion of Conv with an activation, and with an `Add` of a
//!   second tensor `Z`): `act(conv(X, W, B) + Z)`, the activation named by `activation`
//!   with its `activation_params` (MLAS's fused activations: Relu, LeakyRelu, Tanh,
//!   Sigmoid, Clip, HardSigmoid).
//! - `NhwcConv` (what ORT's NHWC layout transform writes): X `[N, spatial..., C]` and W
//!   `[M, kernel..., C/group]`, both channels last, transposed to the ONNX layouts around
//!   an ordinary conv; the result is channels last again.
//!
//! The compiler's own layout pass picks the CPU kernels' layout afterwards, so the
//! transposes cost nothing once it folds them into its own.

use super::registry::OnnxOp;
use super::{trim, Tr, R};
use crate::node::NodeView;
use rafter_ir::{BinaryOp, DType, Op, UnaryOp, ValueId};

/// The convolution contrib ops.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("FusedConv", fused_conv).checked(check_fused_conv),
    OnnxOp::new("NhwcConv", nhwc_conv),
];

/// The activations MLAS fuses into a convolution.
const ACTIVATIONS: &[&str] = &[
    "Relu",
    "LeakyRelu",
    "Tanh",
    "Sigmoid",
    "Clip",
    "HardSigmoid",
];

fn check_fused_conv(n: &NodeView<'_>) -> Result<(), String> {
    let Some(a) = n.attr("activation") else {
        return Ok(());
    };
    let name = String::from_utf8_lossy(&a.s).into_owned();
    if !name.is_empty() && !ACTIVATIONS.contains(&name.as_str()) {
        return Err(format!("unsupported: activation `{name}`"));
    }
    Ok(())
}

impl Tr<'_, '_, '_> {
    /// A `conv` of the node's attributes on `x`, `w`, `b` (ONNX layouts).
    fn conv_of(&mut self, suffix: &str, x: ValueId, w: ValueId, b: Option<ValueId>) -> R<ValueId> {
        let c = self.conv_params(x, Some(w), true)?;
        let op = Op::Conv {
            kernel_shape: c.kernel,
            strides: c.strides,
            pads: c.pads,
            dilations: c.dilations,
            group: self.n.i("group", 1)?,
            auto_pad: c.auto_pad,
        };
        self.tmp(suffix, op, trim(vec![Some(x), Some(w), b]))
    }
}

/// `FusedConv` (X, W, B?, Z?): `activation(conv(X, W, B) + Z)`.
fn fused_conv(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let (x, w, b, z) = (t.req(0)?, t.req(1)?, t.inp(2)?, t.inp(3)?);
    let activation = n.s("activation", "")?;
    let params = n.floats("activation_params")?.unwrap_or_default();
    let param = |i: usize, what: &str| {
        params.get(i).copied().ok_or_else(|| {
            n.invalid(format!(
                "activation {activation} needs activation_params[{i}] ({what}); got {params:?}"
            ))
        })
    };
    let mut y = t.conv_of("conv", x, w, b)?;
    if let Some(z) = z {
        y = t.bin("sum", BinaryOp::Add, y, z)?;
    }
    let dt = t.dtype(y);
    let (op, ins) = match activation.as_str() {
        "" => (Op::Identity, vec![Some(y)]),
        "Relu" => (Op::Unary { op: UnaryOp::Relu }, vec![Some(y)]),
        "Tanh" => (Op::Unary { op: UnaryOp::Tanh }, vec![Some(y)]),
        "Sigmoid" => (
            Op::Unary {
                op: UnaryOp::Sigmoid,
            },
            vec![Some(y)],
        ),
        "LeakyRelu" => {
            let alpha = param(0, "alpha")?;
            (Op::LeakyRelu { alpha }, vec![Some(y)])
        }
        "HardSigmoid" => {
            let (alpha, beta) = (param(0, "alpha")?, param(1, "beta")?);
            (Op::HardSigmoid { alpha, beta }, vec![Some(y)])
        }
        "Clip" => {
            let (lo, hi) = (param(0, "min")?, param(1, "max")?);
            let lo = t.scalar("min", lo as f64, dt)?;
            let hi = t.scalar("max", hi as f64, dt)?;
            (Op::Clip, vec![Some(y), Some(lo), Some(hi)])
        }
        a => return Err(n.unsupported(format!("unsupported: activation `{a}`"))),
    };
    if dt != DType::F32 && activation == "Clip" {
        return Err(n.unsupported(format!("unsupported: Clip of {dt}")));
    }
    t.finish(op, ins)
}

/// `NhwcConv` (X, W, B?): channels-last X and W.
fn nhwc_conv(t: &mut Tr<'_, '_, '_>) -> R {
    let (x, w, b) = (t.req(0)?, t.req(1)?, t.inp(2)?);
    if t.rank(x) < 3 || t.rank(w) != t.rank(x) {
        return Err(t.n.invalid(format!(
            "X {} and W {} are not channels-last tensors of one rank >= 3",
            t.ty(x),
            t.ty(w)
        )));
    }
    let xc = t.as_channels_first("x_nchw", x)?;
    let wc = t.as_channels_first("w_oihw", w)?;
    let y = t.conv_of("conv", xc, wc, b)?;
    let r = t.rank(y) as i64;
    let perm: Vec<i64> = [0].into_iter().chain(2..r).chain([1]).collect();
    t.finish(Op::Transpose { perm }, vec![Some(y)])
}
