//! The ops that read LLM weights in any [`WeightFormat`]: `linear`, `embedding`, `moe_ffn`.
//!
//! As every reference kernel, these favour the obvious over the fast: a weight row is
//! decoded to f32 where it is read (block formats through `rafter-quant`, bit-exact with
//! ggml), and products accumulate in f64 before rounding to f32 once, so the oracle's own
//! rounding stays far below any kernel's.

use super::{arg, invalid, unsupported, OpCtx, OpError};
use crate::Tensor;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::{FfnActivation, Op, WeightFormat};

pub fn eval(
    op: &Op,
    inputs: &[Option<&Tensor>],
    _ctx: &OpCtx,
) -> Result<Vec<Option<Tensor>>, OpError> {
    let out = match op {
        Op::Linear { format } => linear(*format, inputs)?,
        Op::Embedding { format } => embedding(*format, inputs)?,
        Op::MoeFfn {
            top_k,
            normalize,
            activation,
            gate_format,
            up_format,
            down_format,
        } => moe_ffn(
            inputs,
            *top_k,
            *normalize,
            *activation,
            [*gate_format, *up_format, *down_format],
        )?,
        _ => return unsupported(format!("{} is not a weight op", op.name())),
    };
    Ok(vec![Some(Tensor::F32(out))])
}

/// A weight tensor seen as a stack of rows of `cols` values in `format`.
struct Rows<'a> {
    format: WeightFormat,
    /// The stored tensor's raw little-endian bytes.
    bytes: Vec<u8>,
    /// Stored bytes per row.
    row_bytes: usize,
    /// Values per row.
    cols: usize,
    /// Leading dims (all but the last), whose product is the row count.
    lead: Vec<usize>,
    what: &'a str,
}

impl<'a> Rows<'a> {
    fn new(t: &Tensor, format: WeightFormat, what: &'a str) -> Result<Rows<'a>, OpError> {
        if t.dtype() != format.storage_dtype() {
            return invalid(format!(
                "{what} in format {} must be stored as {}, got {}",
                format.word(),
                format.storage_dtype(),
                t.dtype()
            ));
        }
        let shape = t.shape().to_vec();
        let Some((&last, lead)) = shape.split_last() else {
            return invalid(format!("{what} must have rank at least 1"));
        };
        let row_bytes = last * format.storage_dtype().size_of();
        let cols = format.row_values(last).ok_or_else(|| {
            OpError::Invalid(format!(
                "{what}: a row of {last} bytes is not a whole number of {} blocks",
                format.word()
            ))
        })?;
        Ok(Rows {
            format,
            bytes: t.to_le_bytes(),
            row_bytes,
            cols,
            lead: lead.to_vec(),
            what,
        })
    }

    fn count(&self) -> usize {
        self.lead.iter().product()
    }

    /// Row `r` decoded to f32.
    fn row(&self, r: usize) -> Result<Vec<f32>, OpError> {
        let raw = self
            .bytes
            .get(r * self.row_bytes..(r + 1) * self.row_bytes)
            .ok_or_else(|| OpError::Invalid(format!("{} has no row {r}", self.what)))?;
        decode_row(self.format, raw, self.cols)
    }
}

/// One row of `cols` values stored in `format` as `raw`, decoded to f32.
fn decode_row(format: WeightFormat, raw: &[u8], cols: usize) -> Result<Vec<f32>, OpError> {
    Ok(match format {
        WeightFormat::F32 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        WeightFormat::F16 => halves(raw)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect(),
        WeightFormat::BF16 => halves(raw)
            .map(|b| half::bf16::from_bits(b).to_f32())
            .collect(),
        block => {
            let format = block_format(block)?;
            let mut out = vec![0f32; cols];
            rafter_quant::dequantize_row(format, raw, &mut out)
                .map_err(|e| OpError::Invalid(format!("{}: {e}", block.word())))?;
            out
        }
    })
}

/// `rafter-quant`'s name for a block format of the IR.
pub fn block_format(f: WeightFormat) -> Result<rafter_quant::BlockFormat, OpError> {
    rafter_quant::BlockFormat::named(f.word())
        .ok_or_else(|| OpError::Unsupported(format!("{} is not a block format", f.word())))
}

/// 16-bit little-endian words.
fn halves(raw: &[u8]) -> impl Iterator<Item = u16> + '_ {
    raw.chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// `y[..., n] = Σ_k x[..., k] · w[n, k] (+ bias[n])`.
fn linear(format: WeightFormat, inputs: &[Option<&Tensor>]) -> Result<ArrayD<f32>, OpError> {
    let x = f32_view(arg(inputs, 0)?, "x")?;
    let w = Rows::new(arg(inputs, 1)?, format, "w")?;
    if w.lead.len() != 1 {
        return invalid(format!("w must have rank 2, got {}", w.lead.len() + 1));
    }
    let bias = match inputs.get(2).copied().flatten() {
        Some(b) => Some(f32_view(b, "bias")?.iter().copied().collect::<Vec<f32>>()),
        None => None,
    };
    let k = *x.shape().last().unwrap_or(&0);
    if x.ndim() == 0 || k != w.cols {
        return invalid(format!(
            "linear: x of shape {:?} against w of {} columns",
            x.shape(),
            w.cols
        ));
    }
    let n = w.count();
    if bias.as_ref().is_some_and(|b| b.len() != n) {
        return invalid(format!("linear: bias does not have {n} elements"));
    }
    let rows: Vec<Vec<f32>> = (0..n).map(|r| w.row(r)).collect::<Result<_, _>>()?;
    let xs: Vec<f32> = x.as_standard_layout().iter().copied().collect();
    let mut shape = x.shape().to_vec();
    let lead: usize = shape[..shape.len() - 1].iter().product();
    *shape.last_mut().expect("rank >= 1") = n;
    let mut out = Vec::with_capacity(lead * n);
    for r in 0..lead {
        let xr = &xs[r * k..(r + 1) * k];
        for (j, wr) in rows.iter().enumerate() {
            let b = bias.as_ref().map_or(0.0, |b| b[j] as f64);
            out.push((dot(xr, wr) + b) as f32);
        }
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out)
        .map_err(|e| OpError::Invalid(format!("linear result: {e}")))
}

/// Rows of the table by index.
fn embedding(format: WeightFormat, inputs: &[Option<&Tensor>]) -> Result<ArrayD<f32>, OpError> {
    let table = Rows::new(arg(inputs, 0)?, format, "table")?;
    if table.lead.len() != 1 {
        return invalid(format!(
            "table must have rank 2, got {}",
            table.lead.len() + 1
        ));
    }
    let ids_t = arg(inputs, 1)?;
    let ids = ids_t
        .to_i64_vec()
        .ok_or_else(|| OpError::Invalid(format!("ids must be integers, got {}", ids_t.dtype())))?;
    let vocab = table.count();
    let mut out = Vec::with_capacity(ids.len() * table.cols);
    for (i, &id) in ids.iter().enumerate() {
        if id < 0 || id as usize >= vocab {
            return invalid(format!(
                "embedding: id {id} (element {i}) is outside the table of {vocab} rows"
            ));
        }
        out.extend(table.row(id as usize)?);
    }
    let mut shape = ids_t.shape().to_vec();
    shape.push(table.cols);
    ArrayD::from_shape_vec(IxDyn(&shape), out)
        .map_err(|e| OpError::Invalid(format!("embedding result: {e}")))
}

fn f32_view<'t>(t: &'t Tensor, what: &str) -> Result<&'t ArrayD<f32>, OpError> {
    match t {
        Tensor::F32(a) => Ok(a),
        other => invalid(format!("{what} must be f32, got {}", other.dtype())),
    }
}

/// The experts a token picks and their weights: the `top_k` largest softmax
/// probabilities (ties to the lower index), renormalised to sum to 1 when `normalize`.
pub fn route(logits: &[f32], top_k: usize, normalize: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = logits.iter().map(|&l| ((l - max) as f64).exp()).collect();
    let sum: f64 = exps.iter().sum();
    let probs: Vec<f32> = exps.iter().map(|&e| (e / sum) as f32).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    // Stable: equal probabilities keep the lower index first.
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    order.truncate(top_k);
    let chosen_sum: f32 = order.iter().map(|&e| probs[e]).sum();
    order
        .into_iter()
        .map(|e| {
            let p = probs[e];
            (e, if normalize { p / chosen_sum } else { p })
        })
        .collect()
}

fn activate(act: FfnActivation, x: f64) -> f64 {
    match act {
        FfnActivation::Silu => x / (1.0 + (-x).exp()),
        FfnActivation::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

fn moe_ffn(
    inputs: &[Option<&Tensor>],
    top_k: i64,
    normalize: bool,
    act: FfnActivation,
    formats: [WeightFormat; 3],
) -> Result<ArrayD<f32>, OpError> {
    let x = f32_view(arg(inputs, 0)?, "x")?;
    let logits = f32_view(arg(inputs, 1)?, "router_logits")?;
    let gate = Rows::new(arg(inputs, 2)?, formats[0], "gate")?;
    let up = Rows::new(arg(inputs, 3)?, formats[1], "up")?;
    let down = Rows::new(arg(inputs, 4)?, formats[2], "down")?;
    let (&[t, h], &[lt, e]) = (x.shape(), logits.shape()) else {
        return invalid("moe_ffn: x and router_logits must have rank 2");
    };
    let ok3 = |r: &Rows, rows: usize, cols: usize| {
        r.lead.len() == 2 && r.lead == [e, rows] && r.cols == cols
    };
    let f = gate.lead.get(1).copied().unwrap_or(0);
    if lt != t || !ok3(&gate, f, h) || !ok3(&up, f, h) || !ok3(&down, h, f) {
        return invalid(format!(
            "moe_ffn: x {:?}, router_logits {:?} and the expert weights do not agree",
            x.shape(),
            logits.shape()
        ));
    }
    if top_k < 1 || top_k as usize > e {
        return invalid(format!("moe_ffn: top_k {top_k} must be in 1..={e}"));
    }
    let xs: Vec<f32> = x.as_standard_layout().iter().copied().collect();
    let ls: Vec<f32> = logits.as_standard_layout().iter().copied().collect();
    let mut out = vec![0f32; t * h];
    for tok in 0..t {
        let xr = &xs[tok * h..(tok + 1) * h];
        let mut acc = vec![0f64; h];
        for (expert, p) in route(&ls[tok * e..(tok + 1) * e], top_k as usize, normalize) {
            // hidden[j] = act(gate_j · x) * (up_j · x), rounded to f32 as a kernel stores it.
            let hidden: Vec<f32> = (0..f)
                .map(|j| {
                    let g = dot(xr, &gate.row(expert * f + j)?) as f32;
                    let u = dot(xr, &up.row(expert * f + j)?) as f32;
                    Ok((activate(act, g as f64) * u as f64) as f32)
                })
                .collect::<Result<_, OpError>>()?;
            for (i, a) in acc.iter_mut().enumerate() {
                let y = dot(&hidden, &down.row(expert * h + i)?) as f32;
                *a += p as f64 * y as f64;
            }
        }
        for (o, a) in out[tok * h..(tok + 1) * h].iter_mut().zip(acc) {
            *o = a as f32;
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[t, h]), out)
        .map_err(|e| OpError::Invalid(format!("moe_ffn result: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use ndarray::arr2;

    fn run(op: Op, inputs: &[Option<&Tensor>]) -> Result<ArrayD<f32>, OpError> {
        let g = rafter_ir::Graph::new("t");
        let node = rafter_ir::Node {
            name: "n".into(),
            op: op.clone(),
            inputs: vec![],
            outputs: vec![None],
        };
        let ctx = OpCtx {
            graph: &g,
            node: &node,
        };
        match eval(&op, inputs, &ctx)?.remove(0) {
            Some(Tensor::F32(a)) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    fn f32t(rows: &[&[f32]]) -> Tensor {
        let (r, c) = (rows.len(), rows[0].len());
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[r, c]), flat).unwrap())
    }

    #[test]
    fn linear_multiplies_by_the_transposed_weight() {
        let x = f32t(&[&[1.0, 2.0, 3.0]]);
        let w = f32t(&[&[1.0, 0.0, 0.0], &[0.5, 0.5, 0.5], &[-1.0, 2.0, -3.0]]);
        let b = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[3]), vec![0.0, 1.0, 10.0]).unwrap());
        let y = run(
            Op::Linear {
                format: WeightFormat::F32,
            },
            &[Some(&x), Some(&w), Some(&b)],
        )
        .unwrap();
        // [1, 3 + 1, (-1 + 4 - 9) + 10]
        assert_eq!(y, arr2(&[[1.0f32, 4.0, 4.0]]).into_dyn());
    }

    #[test]
    fn linear_decodes_bf16_weights() {
        let x = f32t(&[&[2.0, 4.0]]);
        // 1.00390625 is not a bf16: it rounds to 1.0.
        let w: Vec<bf16> = [1.003_906_3f32, -0.5]
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        let w = Tensor::BF16(ArrayD::from_shape_vec(IxDyn(&[1, 2]), w).unwrap());
        let y = run(
            Op::Linear {
                format: WeightFormat::BF16,
            },
            &[Some(&x), Some(&w), None],
        )
        .unwrap();
        assert_eq!(y, arr2(&[[0.0f32]]).into_dyn());
        // The wrong storage dtype for the format is an error naming both.
        let e = run(
            Op::Linear {
                format: WeightFormat::F16,
            },
            &[Some(&x), Some(&w), None],
        )
        .unwrap_err();
        assert!(
            format!("{e:?}").contains("stored as f16, got bf16"),
            "{e:?}"
        );
    }

    #[test]
    fn the_ir_block_table_is_rafter_quants() {
        for f in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
            let q = block_format(f).unwrap();
            assert_eq!(
                (f.block_elems(), f.block_bytes()),
                (q.block_elems(), q.block_bytes()),
                "{}",
                f.word()
            );
        }
    }

    #[test]
    fn linear_decodes_block_weights_where_it_reads_them() {
        // Two rows of 64 values in q8_0 (2 blocks each), against their dequantized copy.
        let vals: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.07)
            .collect();
        let q = rafter_quant::BlockFormat::Q8_0;
        let mut blocks = vec![0u8; 2 * q.row_bytes(64).unwrap()];
        rafter_quant::quantize_row(q, &vals, &mut blocks).unwrap();
        let mut deq = vec![0f32; 128];
        rafter_quant::dequantize_row(q, &blocks, &mut deq).unwrap();
        let w = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[2, 68]), blocks).unwrap());
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.1).sin()).collect();
        let xt = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 64]), x.clone()).unwrap());
        let y = run(
            Op::Linear {
                format: WeightFormat::Q8_0,
            },
            &[Some(&xt), Some(&w), None],
        )
        .unwrap();
        for r in 0..2 {
            let want = dot(&x, &deq[r * 64..(r + 1) * 64]) as f32;
            assert_eq!(y[[0, r]], want);
        }
        // A row of bytes that is not whole blocks is an error, not a panic.
        let bad = Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[1, 67]), vec![0; 67]).unwrap());
        assert!(run(
            Op::Linear {
                format: WeightFormat::Q8_0,
            },
            &[Some(&xt), Some(&bad), None],
        )
        .is_err());
    }

    #[test]
    fn embedding_picks_rows_and_rejects_bad_ids() {
        let table = f32t(&[&[0.0, 0.5], &[1.0, 1.5], &[2.0, 2.5]]);
        let ids = Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![2, 0]).unwrap());
        let op = Op::Embedding {
            format: WeightFormat::F32,
        };
        let y = run(op.clone(), &[Some(&table), Some(&ids)]).unwrap();
        assert_eq!(y.shape(), &[1, 2, 2]);
        assert_eq!(
            y.iter().copied().collect::<Vec<_>>(),
            vec![2.0, 2.5, 0.0, 0.5]
        );
        let bad = Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1]), vec![3]).unwrap());
        let e = run(op, &[Some(&table), Some(&bad)]).unwrap_err();
        assert!(format!("{e:?}").contains("id 3 (element 0) is outside the table of 3 rows"));
    }

    #[test]
    fn routing_takes_the_largest_and_breaks_ties_low() {
        // softmax of [0, ln 3, ln 3, ln 2] = [1, 3, 3, 2] / 9
        let l = [0.0, 3f32.ln(), 3f32.ln(), 2f32.ln()];
        let r = route(&l, 2, false);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((r[0].1 - 3.0 / 9.0).abs() < 1e-6);
        let r = route(&l, 3, true);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!((r[2].1 - 2.0 / 8.0).abs() < 1e-6);
    }

    #[test]
    fn moe_sums_the_chosen_experts() {
        // H = 2, F = 1, E = 3. Expert e: gate row g_e, up row u_e, down column d_e.
        let x = f32t(&[&[1.0, 2.0]]);
        // Expert 2 dominates, then expert 0; expert 1 is never chosen with top_k 2.
        let logits = f32t(&[&[1.0, -5.0, 2.0]]);
        let t3 =
            |v: Vec<f32>, d: [usize; 3]| Tensor::F32(ArrayD::from_shape_vec(IxDyn(&d), v).unwrap());
        let gate = t3(vec![1.0, 0.0, 9.0, 9.0, 0.0, 1.0], [3, 1, 2]);
        let up = t3(vec![1.0, 1.0, 9.0, 9.0, 0.5, 0.0], [3, 1, 2]);
        let down = t3(vec![1.0, -1.0, 9.0, 9.0, 2.0, 4.0], [3, 2, 1]);
        let y = run(
            Op::MoeFfn {
                top_k: 2,
                normalize: true,
                activation: FfnActivation::Silu,
                gate_format: WeightFormat::F32,
                up_format: WeightFormat::F32,
                down_format: WeightFormat::F32,
            },
            &[Some(&x), Some(&logits), Some(&gate), Some(&up), Some(&down)],
        )
        .unwrap();
        let silu = |v: f64| v / (1.0 + (-v).exp());
        // expert 0: hidden = silu(1) * 3; expert 2: hidden = silu(2) * 0.5
        let (h0, h2) = (
            (silu(1.0) * 3.0) as f32 as f64,
            (silu(2.0) * 0.5) as f32 as f64,
        );
        let (p0, p2) = (1f64.exp(), 2f64.exp());
        let (w0, w2) = (p0 / (p0 + p2), p2 / (p0 + p2));
        let want = [w0 * h0 * 1.0 + w2 * h2 * 2.0, -(w0 * h0) + w2 * h2 * 4.0];
        for (got, want) in y.iter().zip(want) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
    }
}
