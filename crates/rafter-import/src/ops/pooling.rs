//! Pooling: windowed, global and MaxUnpool.

use super::registry::OnnxOp;
use super::{non_empty_or, trim, Tr, R};
use rafter_ir::{Op, PoolKind};

/// The pooling ops, each with its translation.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("MaxPool", |t| t.pool()),
    OnnxOp::new("AveragePool", |t| t.pool()),
    OnnxOp::new("LpPool", |t| t.pool()),
    OnnxOp::new("GlobalAveragePool", global_pool),
    OnnxOp::new("GlobalMaxPool", global_pool),
    OnnxOp::new("GlobalLpPool", global_pool),
    OnnxOp::new("MaxUnpool", |t| {
        let n = t.n;
        let kernel_shape = n
            .ints("kernel_shape")?
            .ok_or_else(|| n.invalid("missing required attribute `kernel_shape`"))?;
        let sp = kernel_shape.len();
        let strides = non_empty_or(n.ints("strides")?, vec![1; sp]);
        let pads = non_empty_or(n.ints("pads")?, vec![0; 2 * sp]);
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?), t.inp(2)?];
        t.finish(
            Op::MaxUnpool {
                kernel_shape,
                strides,
                pads,
            },
            trim(ins),
        )
    }),
];

/// `GlobalAveragePool`, `GlobalMaxPool` and `GlobalLpPool`.
fn global_pool(t: &mut Tr<'_, '_, '_>) -> R {
    let op = t.n.op_type();
    let (kind, p) = match op {
        "GlobalAveragePool" => (PoolKind::Average, 0),
        "GlobalMaxPool" => (PoolKind::Max, 0),
        _ => (PoolKind::Lp, t.lp_p()?),
    };
    let x = t.req(0)?;
    t.finish(Op::GlobalPool { kind, p }, vec![Some(x)])
}

impl Tr<'_, '_, '_> {
    /// LpPool/GlobalLpPool's `p`: an int, but a float before opset 2.
    pub(super) fn lp_p(&self) -> R<i64> {
        let n = self.n;
        if n.opset >= 2 {
            return n.i("p", 2);
        }
        let p = n.f("p", 2.0)?;
        if p.fract() != 0.0 || p < 1.0 {
            return Err(n.unsupported(format!("unsupported: p = {p} (only whole p >= 1)")));
        }
        Ok(p as i64)
    }

    pub(super) fn pool(&mut self) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let c = self.conv_params(x, None, false)?;
        let (kind, p) = match n.op_type() {
            "MaxPool" => (PoolKind::Max, 0),
            "AveragePool" => (PoolKind::Average, 0),
            _ => (PoolKind::Lp, self.lp_p()?),
        };
        // AveragePool-1 has no count_include_pad (it never counts the padding).
        let count_include_pad = n.opset >= 7 && n.flag("count_include_pad", false)?;
        self.finish(
            Op::Pool {
                kind,
                kernel_shape: c.kernel,
                strides: c.strides,
                pads: c.pads,
                dilations: c.dilations,
                auto_pad: c.auto_pad,
                ceil_mode: n.flag("ceil_mode", false)?,
                count_include_pad,
                p,
                storage_order: n.i("storage_order", 0)?,
            },
            vec![Some(x)],
        )
    }
}
