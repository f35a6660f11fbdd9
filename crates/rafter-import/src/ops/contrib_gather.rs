//! ONNX Runtime's `GatherBlockQuantized` (com.microsoft): a gather of rows whose values
//! are block-quantized to 2, 4 or 8 bits, dequantized on the way out. ORT GenAI's model
//! builder writes it for a tied embedding: the token embedding reads the same packed
//! 4-bit weights as the `lm_head` MatMulNBits, so the table is stored once.
//!
//! Decomposed at import into ops every device runs: a gather of the packed rows (and of
//! their scales and zero points), the bit fields unpacked with shifts and masks,
//! `(value - zero_point) * scale` per block, in f32 as ORT computes it, then the scale's
//! type. Only the gathered rows are unpacked, so the table stays packed in the artifact.
//!
//! ORT's semantics, from its CPU kernel: uint8 data holds `8 / bits` values per byte,
//! lowest bits first; gather_axis must be 0 and quantize_axis the last axis; the last
//! block of a row may be short; zero points are packed like the data (absent:
//! `2^(bits-1)`); indices in `[-rows, 0)` count from the end and indices outside
//! `[-rows, rows)` give rows of zeros.
//!
//! Refused at import: other data types (ORT's int4/uint4 and FP8/FP4 forms), and tables of
//! no rows or no values (the decomposition's clamped index 0 needs a row to read).

use super::registry::OnnxOp;
use super::{Tr, R};
use rafter_ir::{BinaryOp, ConstData, DType, Op, ValueId};

pub(super) const OPS: &[OnnxOp] = &[OnnxOp::new("GatherBlockQuantized", gather_block_quantized)];

/// The node's attributes and the static sizes the decomposition needs.
struct Layout {
    bits: i64,
    block: i64,
    /// Rows of the table (data's gather axis).
    rows: i64,
    /// Values per row along the quantize axis (bytes times values per byte).
    q: i64,
    /// Blocks per row (scales' last dim).
    blocks: i64,
}

fn gather_block_quantized(t: &mut Tr<'_, '_, '_>) -> R {
    let (data, idx, scales) = (t.req(0)?, t.req(1)?, t.req(2)?);
    let zp = t.inp(3)?;
    let l = t.gbq_layout(data, scales, zp)?;
    let (idx, valid) = t.gbq_indices(idx, l.rows)?;
    let gather = Op::Gather { axis: 0 };
    let packed = t.tmp("rows", gather.clone(), vec![Some(data), Some(idx)])?;
    let values = t.unpack_fields("values", packed, l.bits)?;
    let values = t.cast_to("values_f32", values, DType::F32)?;
    let out_dt = t.dtype(scales);
    let s = t.tmp("scale_rows", gather.clone(), vec![Some(scales), Some(idx)])?;
    let s = t.cast_to("scale_f32", s, DType::F32)?;
    let z = match zp {
        Some(zp) => {
            let z = t.tmp("zero_point_rows", gather, vec![Some(zp), Some(idx)])?;
            let z = t.unpack_fields("zero_points", z, l.bits)?;
            let z = t.trim_last("zero_points_trimmed", z, l.blocks)?;
            Some(t.cast_to("zero_points_f32", z, DType::F32)?)
        }
        None => None,
    };
    let y = t.dequantize_blocks(values, s, z, &l)?;
    let y = match valid {
        Some(valid) => t.zero_outside(y, valid)?,
        None => y,
    };
    let op = match out_dt {
        DType::F32 => Op::Identity,
        to => Op::Cast { to },
    };
    t.finish(op, vec![Some(y)])
}

impl Tr<'_, '_, '_> {
    /// Checks the attributes and operand types against ORT's rules for uint8 data and
    /// reads the static sizes. Every check is an error naming the node: ranks are checked
    /// before dims are read, and the size arithmetic is checked (a graph input may declare
    /// any dims).
    fn gbq_layout(&self, data: ValueId, scales: ValueId, zp: Option<ValueId>) -> R<Layout> {
        let (bits, block) = self.gbq_attrs()?;
        self.gbq_data(data)?;
        let [rows, bytes] = self.outer_dims(data, "data")?;
        let n = self.n;
        if rows == 0 || bytes == 0 {
            return Err(n.unsupported(format!(
                "unsupported: data {} has no rows or no values per row",
                self.ty(data)
            )));
        }
        let per_byte = 8 / bits;
        let q = bytes
            .checked_mul(per_byte)
            .filter(|q| q.checked_add(block).is_some())
            .ok_or_else(|| n.invalid(format!("data {}: too many values per row", self.ty(data))))?;
        let l = Layout {
            bits,
            block,
            rows,
            q,
            blocks: (q + block - 1) / block,
        };
        self.gbq_scales(data, scales, &l)?;
        if let Some(zp) = zp {
            self.gbq_zero_points(zp, scales, &l)?;
        }
        Ok(l)
    }

    /// `bits` (2, 4 or 8, ORT's for uint8 data) and `block_size` (a power of 2 >= 16).
    fn gbq_attrs(&self) -> R<(i64, i64)> {
        let n = self.n;
        let bits = n.i("bits", 4)?;
        let block = n.i("block_size", 128)?;
        if ![2, 4, 8].contains(&bits) {
            return Err(n.unsupported(format!("unsupported: bits={bits} (2, 4 and 8 are)")));
        }
        if block < 16 || (block as u64).count_ones() != 1 {
            return Err(n.invalid(format!("block_size {block} is not a power of 2 >= 16")));
        }
        Ok((bits, block))
    }

    /// Data is packed uint8 of rank >= 2, gathered along axis 0 and quantized along the
    /// last (ORT's rule for uint8 data; int4/uint4 and FP8/FP4 data are not imported).
    fn gbq_data(&self, data: ValueId) -> R<()> {
        let n = self.n;
        let ty = self.ty(data);
        if ty.dtype != DType::U8 {
            return Err(n.unsupported(format!(
                "unsupported: data of type {} (packed uint8 is supported)",
                ty.dtype
            )));
        }
        let r = ty.rank() as i64;
        if r < 2 {
            return Err(n.invalid(format!(
                "data {ty} must have rank 2 or more (rows, then the packed values)"
            )));
        }
        let axis = |name: &str, default: i64| -> R<i64> {
            let a = n.i(name, default)?;
            let norm = if a < 0 { a + r } else { a };
            if !(0..r).contains(&norm) {
                return Err(n.invalid(format!("{name} {a} is out of range for data of rank {r}")));
            }
            Ok(norm)
        };
        let (gather_axis, quantize_axis) = (axis("gather_axis", 0)?, axis("quantize_axis", 1)?);
        if gather_axis != 0 || quantize_axis != r - 1 {
            return Err(n.invalid(format!(
                "uint8 data {ty} needs gather_axis 0 and quantize_axis the last axis (got {gather_axis} and {quantize_axis})"
            )));
        }
        Ok(())
    }

    /// Scales are f32, f16 or bf16 of data's shape but for the last dim, the blocks.
    fn gbq_scales(&self, data: ValueId, scales: ValueId, l: &Layout) -> R<()> {
        let n = self.n;
        let (ty_d, ty_s) = (self.ty(data), self.ty(scales));
        if !ty_s.dtype.is_float() || ty_s.dtype == DType::F64 {
            return Err(n.unsupported(format!(
                "unsupported: scales of type {} (f32, f16 or bf16)",
                ty_s.dtype
            )));
        }
        let r = ty_d.rank();
        let mismatch = || {
            n.invalid(format!(
                "scales {ty_s} do not match data {ty_d}: want [{}, ..., {}] ({} values per row in blocks of {})",
                l.rows, l.blocks, l.q, l.block
            ))
        };
        if ty_s.rank() != r || ty_d.dims[1..r - 1] != ty_s.dims[1..r - 1] {
            return Err(mismatch());
        }
        if self.outer_dims(scales, "scales")? != [l.rows, l.blocks] {
            return Err(mismatch());
        }
        Ok(())
    }

    /// Zero points are uint8 of scales' shape but for the last dim, the blocks packed
    /// like the data (`8 / bits` a byte).
    fn gbq_zero_points(&self, zp: ValueId, scales: ValueId, l: &Layout) -> R<()> {
        let n = self.n;
        let (ty_z, ty_s) = (self.ty(zp), self.ty(scales));
        let per_byte = 8 / l.bits;
        let want_last = (l.blocks + per_byte - 1) / per_byte;
        let mismatch = || {
            n.invalid(format!(
                "zero_points {ty_z} do not match scales {ty_s}: want uint8 [{}, ..., {want_last}] ({} packed {}-bit values per row)",
                l.rows, l.blocks, l.bits
            ))
        };
        let r = ty_s.rank();
        if ty_z.dtype != DType::U8 || ty_z.rank() != r || ty_z.dims[..r - 1] != ty_s.dims[..r - 1] {
            return Err(mismatch());
        }
        if self.outer_dims(zp, "zero_points")?[1] != want_last {
            return Err(mismatch());
        }
        Ok(())
    }

    /// The first and last dims of `v` (rank >= 1), which must be known.
    fn outer_dims(&self, v: ValueId, what: &str) -> R<[i64; 2]> {
        let ty = self.ty(v);
        let (first, last) = (ty.dims.first(), ty.dims.last());
        match (
            first.and_then(|d| d.as_known()),
            last.and_then(|d| d.as_known()),
        ) {
            (Some(a), Some(b)) => Ok([a, b]),
            _ => Err(self.n.invalid(format!(
                "{what} {ty}: its first and last dims must be known at import"
            ))),
        }
    }

    /// The indices as i64 with those outside `[-rows, rows)` replaced by 0, and the mask
    /// of the valid ones (`None` when every index is a constant in range).
    fn gbq_indices(&mut self, idx: ValueId, rows: i64) -> R<(ValueId, Option<ValueId>)> {
        let dt = self.dtype(idx);
        if dt != DType::I32 && dt != DType::I64 {
            return Err(self
                .n
                .invalid(format!("indices {} must be int32 or int64", self.ty(idx))));
        }
        let in_range = |c: Vec<i64>| c.iter().all(|&i| (-rows..rows).contains(&i));
        let constant = self.sc.g.const_of(idx).and_then(|c| c.to_i64s());
        let idx = self.cast_to("indices_i64", idx, DType::I64)?;
        if constant.is_some_and(in_range) {
            return Ok((idx, None));
        }
        let lo = self.konst("rows_neg", ConstData::from_i64s(&[-rows]));
        let hi = self.konst("rows", ConstData::from_i64s(&[rows]));
        let ge = self.bin("at_least_neg_rows", BinaryOp::GreaterOrEqual, idx, lo)?;
        let lt = self.bin("below_rows", BinaryOp::Less, idx, hi)?;
        let valid = self.bin("valid", BinaryOp::And, ge, lt)?;
        let zero = self.konst("index_zero", ConstData::from_i64s(&[0]));
        let safe = self.tmp(
            "indices_safe",
            Op::Where,
            vec![Some(valid), Some(idx), Some(zero)],
        )?;
        Ok((safe, Some(valid)))
    }

    /// `x` as `dt` (itself when it has that type).
    fn cast_to(&mut self, suffix: &str, x: ValueId, dt: DType) -> R<ValueId> {
        if self.dtype(x) == dt {
            return Ok(x);
        }
        self.tmp(suffix, Op::Cast { to: dt }, vec![Some(x)])
    }

    /// uint8 `x [..., p]` holding `8 / bits` fields per byte, lowest bits first, as the
    /// uint8 values `[..., p * 8 / bits]`.
    fn unpack_fields(&mut self, what: &str, x: ValueId, bits: i64) -> R<ValueId> {
        let per_byte = 8 / bits;
        if per_byte == 1 {
            return Ok(x);
        }
        let r = self.rank(x);
        let u8c = |v: u8| ConstData::new(DType::U8, vec![], vec![v].into()).expect("one byte");
        let mask = self.konst(&format!("{what}_mask"), u8c(((1u16 << bits) - 1) as u8));
        let mut fields = Vec::with_capacity(per_byte as usize);
        for j in 0..per_byte {
            let shift = (j * bits) as u8;
            let mut f = x;
            if shift > 0 {
                let s = self.konst(&format!("{what}_shift{j}"), u8c(shift));
                f = self.bin(&format!("{what}_shifted{j}"), BinaryOp::ShiftRight, f, s)?;
            }
            // The top field needs no mask: the shift leaves only its bits.
            if j + 1 < per_byte {
                f = self.bin(&format!("{what}_field{j}"), BinaryOp::BitAnd, f, mask)?;
            }
            let axes = vec![r as i64];
            fields.push(Some(self.tmp(
                &format!("{what}_field{j}_last"),
                Op::Unsqueeze { axes },
                vec![Some(f)],
            )?));
        }
        let stacked = self.tmp(
            &format!("{what}_fields"),
            Op::Concat { axis: r as i64 },
            fields,
        )?;
        self.merge_last_two(&format!("{what}_unpacked"), stacked)
    }

    /// `x [..., a, b]` as `[..., a * b]`.
    fn merge_last_two(&mut self, suffix: &str, x: ValueId) -> R<ValueId> {
        let r = self.rank(x);
        let mut shape = vec![0i64; r - 2];
        shape.push(-1);
        let s = self.i64_const(&format!("{suffix}_shape"), &shape);
        self.tmp(
            suffix,
            Op::Reshape { allow_zero: false },
            vec![Some(x), Some(s)],
        )
    }

    /// `x [..., m]` as `[..., n]` (its first `n` along the last axis); `x` when `m == n`.
    fn trim_last(&mut self, suffix: &str, x: ValueId, n: i64) -> R<ValueId> {
        let r = self.rank(x);
        if self.ty(x).dims[r - 1].as_known() == Some(n) {
            return Ok(x);
        }
        self.slice_axis(suffix, x, r as i64 - 1, 0, n)
    }

    /// `(values - z) * s`, f32, with `s` and `z` (per block, `[..., blocks]`; `z` absent
    /// means `2^(bits-1)`) applied to each block of `values [..., q]`.
    fn dequantize_blocks(
        &mut self,
        values: ValueId,
        s: ValueId,
        z: Option<ValueId>,
        l: &Layout,
    ) -> R<ValueId> {
        let z = match z {
            Some(z) => z,
            None => self.scalar(
                "default_zero_point",
                (1u32 << (l.bits - 1)) as f64,
                DType::F32,
            )?,
        };
        let r = self.rank(values);
        if l.q == l.blocks * l.block {
            // Whole blocks: view the values as [..., blocks, block] and broadcast.
            let mut shape = vec![0i64; r - 1];
            shape.extend([l.blocks, l.block]);
            let shape = self.i64_const("block_shape", &shape);
            let v = self.tmp(
                "values_in_blocks",
                Op::Reshape { allow_zero: false },
                vec![Some(values), Some(shape)],
            )?;
            let per_block = |t: &mut Self, x: ValueId, what: &str| -> R<ValueId> {
                if t.rank(x) == 0 {
                    return Ok(x);
                }
                let axes = vec![r as i64];
                t.tmp(
                    &format!("{what}_per_block"),
                    Op::Unsqueeze { axes },
                    vec![Some(x)],
                )
            };
            let (s, z) = (
                per_block(self, s, "scale")?,
                per_block(self, z, "zero_point")?,
            );
            let c = self.bin("centred", BinaryOp::Sub, v, z)?;
            let y = self.bin("scaled", BinaryOp::Mul, c, s)?;
            return self.merge_last_two("dequantized", y);
        }
        // A short last block: spread the per-block values over the row, then trim.
        let s = self.per_value(s, "scale", l, r)?;
        let z = if self.rank(z) == 0 {
            z
        } else {
            self.per_value(z, "zero_point", l, r)?
        };
        let c = self.bin("centred", BinaryOp::Sub, values, z)?;
        self.bin("dequantized", BinaryOp::Mul, c, s)
    }

    /// Per-block `x [..., blocks]` repeated over each block's values: `[..., q]`.
    fn per_value(&mut self, x: ValueId, what: &str, l: &Layout, r: usize) -> R<ValueId> {
        let axes = vec![r as i64];
        let x = self.tmp(
            &format!("{what}_col"),
            Op::Unsqueeze { axes },
            vec![Some(x)],
        )?;
        let mut shape = vec![1i64; r];
        shape.push(l.block);
        let shape = self.i64_const(&format!("{what}_repeat"), &shape);
        let x = self.tmp(
            &format!("{what}_repeated"),
            Op::Expand,
            vec![Some(x), Some(shape)],
        )?;
        let x = self.merge_last_two(&format!("{what}_spread"), x)?;
        self.trim_last(&format!("{what}_per_value"), x, l.q)
    }

    /// `y` with the rows of invalid indices zeroed (`valid` has the indices' shape, which
    /// leads `y`'s).
    fn zero_outside(&mut self, y: ValueId, valid: ValueId) -> R<ValueId> {
        let (k, r) = (self.rank(valid), self.rank(y));
        let axes: Vec<i64> = (k as i64..r as i64).collect();
        let v = self.tmp("valid_rows", Op::Unsqueeze { axes }, vec![Some(valid)])?;
        let zero = self.scalar("zero", 0.0, DType::F32)?;
        self.tmp("in_range", Op::Where, vec![Some(v), Some(y), Some(zero)])
    }
}
