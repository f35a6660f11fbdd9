//! The prefill path (placeholder: decode kernels row block by row block).
use super::{Path, QuantMatRef};
use crate::{Epilogue, Isa, MatMut, MatRef, Parallel};

pub(crate) fn run(
    _isa: Isa,
    path: Path,
    x: MatRef<'_>,
    w: QuantMatRef<'_>,
    y: MatMut<'_>,
    epilogue: &Epilogue<'_>,
    par: &dyn Parallel,
) {
    let (m, n) = (x.rows, w.n());
    let ld = y.ld;
    let data = y.data;
    for r0 in (0..m).step_by(super::DECODE_MAX_M) {
        let r1 = (r0 + super::DECODE_MAX_M).min(m);
        let xs = MatRef {
            data: &x.data[r0 * x.rs..],
            rows: r1 - r0,
            cols: x.cols,
            rs: x.rs,
            cs: x.cs,
        };
        let ys = MatMut {
            data: &mut data[r0 * ld..],
            rows: r1 - r0,
            cols: n,
            ld,
        };
        let e = Epilogue {
            bias: epilogue.bias,
            row_bias: epilogue.row_bias.map(|b| &b[r0..r1]),
            activation: epilogue.activation,
            residual: epilogue.residual.map(|r| crate::Residual {
                data: &r.data[r0 * r.ld..],
                ld: r.ld,
                before_activation: r.before_activation,
            }),
            clamp: epilogue.clamp,
        };
        super::gemv::run(path, xs, w, ys, &e, par);
    }
}

pub(crate) fn act_block_of(path: Path, format: rafter_quant::BlockFormat) -> Option<usize> {
    super::gemv::act_block_of(path, format)
}
