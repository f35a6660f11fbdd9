//! Shapes and data movement: reshapes, transposes, slicing, gathers and scatters,
//! padding, resizing, and the generators (Range, OneHot, EyeLike, ...).

use super::registry::OnnxOp;
use super::{trim, Tr, R};
use crate::convert::{dtype_from_onnx, first_scalar, scalar_const};
use crate::node::NodeView;
use rafter_ir::{
    AspectPolicy, ConstData, CoordTransform, DType, DepthToSpaceMode, GridPadding, GridSampleMode,
    NearestMode, Op, PadMode, ResizeMode, Scalar, ScatterReduction,
};

/// The movement ops, each with its translation.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("Reshape", |t| {
        let n = t.n;
        let shape = if n.opset < 5 {
            // Reshape-1: the shape is an attribute.
            let s = n
                .ints("shape")?
                .ok_or_else(|| n.invalid("missing attribute `shape`"))?;
            t.i64_const("shape", &s)
        } else {
            t.req(1)?
        };
        let ins = vec![Some(t.req(0)?), Some(shape)];
        let allow_zero = n.opset >= 14 && n.flag("allowzero", false)?;
        t.finish(Op::Reshape { allow_zero }, ins)
    }),
    OnnxOp::new("Shape", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let (start, end) = if n.opset >= 15 {
            (n.i("start", 0)?, n.i_opt("end")?)
        } else {
            (0, None)
        };
        t.finish(Op::Shape { start, end }, vec![Some(x)])
    }),
    OnnxOp::new("Size", |t| {
        let x = t.req(0)?;
        t.finish(Op::Size, vec![Some(x)])
    }),
    OnnxOp::new("Transpose", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let rank = t.rank(x) as i64;
        let perm = match n.ints("perm")? {
            Some(p) if !p.is_empty() => t.axes(&p, rank as usize)?,
            _ => (0..rank).rev().collect(),
        };
        t.finish(Op::Transpose { perm }, vec![Some(x)])
    }),
    OnnxOp::new("Squeeze", squeeze),
    OnnxOp::new("Unsqueeze", squeeze),
    OnnxOp::new("Flatten", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let rank = t.rank(x) as i64;
        let mut axis = n.i("axis", 1)?;
        if axis < 0 {
            axis += rank;
        }
        if !(0..=rank).contains(&axis) {
            return Err(n.invalid(format!(
                "axis {} is out of range for rank {rank}",
                n.i("axis", 1)?
            )));
        }
        t.finish(Op::Flatten { axis }, vec![Some(x)])
    }),
    OnnxOp::new("Concat", |t| {
        let n = t.n;
        let ins = (0..n.num_inputs())
            .map(|i| t.req(i).map(Some))
            .collect::<R<Vec<_>>>()?;
        let first = ins
            .first()
            .copied()
            .flatten()
            .ok_or_else(|| n.invalid("no inputs"))?;
        // Concat-1 defaults to axis 1; from Concat-4 it is required.
        let axis = if n.opset < 4 {
            n.i("axis", 1)?
        } else {
            n.i_req("axis")?
        };
        let axis = t.axis(axis, t.rank(first))?;
        t.finish(Op::Concat { axis }, ins)
    }),
    OnnxOp::new("Split", |t| t.split()),
    OnnxOp::new("Slice", |t| t.slice()),
    OnnxOp::new("Gather", gather),
    OnnxOp::new("GatherElements", gather),
    OnnxOp::new("GatherND", |t| {
        let n = t.n;
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
        t.finish(
            Op::GatherNd {
                batch_dims: n.i("batch_dims", 0)?,
            },
            ins,
        )
    }),
    OnnxOp::new("ScatterElements", scatter),
    OnnxOp::new("Scatter", scatter),
    OnnxOp::new("ScatterND", scatter),
    OnnxOp::new("Expand", expand_or_tile),
    OnnxOp::new("Tile", |t| {
        if t.n.opset < 6 {
            t.tile1()
        } else {
            expand_or_tile(t)
        }
    }),
    OnnxOp::new("Pad", |t| t.pad()),
    OnnxOp::new("ConstantOfShape", |t| {
        let n = t.n;
        let shape = t.req(0)?;
        let value = match n.tensor("value")? {
            Some(value) => {
                let what = format!("node `{}` (ConstantOfShape) value", n.name);
                let data = t.cx.tensor_data(value, &what)?;
                first_scalar(&data).ok_or_else(|| n.invalid("attribute `value` has no elements"))?
            }
            None => Scalar::Float(DType::F32, 0.0),
        };
        t.finish(Op::ConstantOfShape { value }, vec![Some(shape)])
    })
    .checked(check_constant_of_shape),
    OnnxOp::new("Range", |t| {
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?), Some(t.req(2)?)];
        t.finish(Op::Range, ins)
    }),
    OnnxOp::new("OneHot", |t| {
        let n = t.n;
        let idx = t.req(0)?;
        let axis = t.axis(n.i("axis", -1)?, t.rank(idx) + 1)?;
        let ins = vec![Some(idx), Some(t.req(1)?), Some(t.req(2)?)];
        t.finish(Op::OneHot { axis }, ins)
    }),
    OnnxOp::new("Trilu", |t| {
        let n = t.n;
        let ins = trim(vec![Some(t.req(0)?), t.inp(1)?]);
        t.finish(
            Op::Trilu {
                upper: n.flag("upper", true)?,
            },
            ins,
        )
    }),
    OnnxOp::new("TopK", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let k = if n.opset < 10 {
            let k = n.i_req("k")?;
            t.i64_const("k", &[k])
        } else {
            t.req(1)?
        };
        let axis = t.axis(n.i("axis", -1)?, t.rank(x))?;
        t.finish(
            Op::TopK {
                axis,
                largest: n.flag("largest", true)?,
                sorted: n.flag("sorted", true)?,
            },
            vec![Some(x), Some(k)],
        )
    }),
    OnnxOp::new("NonZero", |t| {
        let x = t.req(0)?;
        t.finish(Op::NonZero, vec![Some(x)])
    }),
    OnnxOp::new("Compress", |t| {
        let n = t.n;
        let (x, c) = (t.req(0)?, t.req(1)?);
        let axis = match n.i_opt("axis")? {
            Some(a) => Some(t.axis(a, t.rank(x))?),
            None => None,
        };
        t.finish(Op::Compress { axis }, vec![Some(x), Some(c)])
    }),
    OnnxOp::new("Unique", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let axis = match n.i_opt("axis")? {
            Some(a) => Some(t.axis(a, t.rank(x))?),
            None => None,
        };
        t.finish(
            Op::Unique {
                axis,
                sorted: n.flag("sorted", true)?,
            },
            vec![Some(x)],
        )
    }),
    OnnxOp::new("ReverseSequence", |t| {
        let n = t.n;
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
        t.finish(
            Op::ReverseSequence {
                batch_axis: n.i("batch_axis", 1)?,
                time_axis: n.i("time_axis", 0)?,
            },
            ins,
        )
    }),
    OnnxOp::new("DepthToSpace", |t| {
        let n = t.n;
        let mode = match n.s("mode", "DCR")?.as_str() {
            "DCR" => DepthToSpaceMode::Dcr,
            "CRD" => DepthToSpaceMode::Crd,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        t.act(Op::DepthToSpace {
            blocksize: n.i_req("blocksize")?,
            mode,
        })
    }),
    OnnxOp::new("SpaceToDepth", |t| t.space_to_depth()),
    OnnxOp::new("EyeLike", |t| {
        let n = t.n;
        let x = t.req(0)?;
        let dtype = match n.i_opt("dtype")? {
            Some(d) => {
                dtype_from_onnx(d as i32).map_err(|e| n.unsupported(format!("unsupported: {e}")))?
            }
            None => t.dtype(x),
        };
        t.finish(
            Op::EyeLike {
                dtype,
                k: n.i("k", 0)?,
            },
            vec![Some(x)],
        )
    })
    .checked(check_eye_like),
    OnnxOp::new("Resize", |t| t.resize(false)).checked(check_resize),
    OnnxOp::new("Upsample", |t| t.resize(true)),
    OnnxOp::new("GridSample", |t| {
        let n = t.n;
        let mode = match n.s("mode", "linear")?.as_str() {
            "linear" | "bilinear" => GridSampleMode::Linear,
            "nearest" => GridSampleMode::Nearest,
            "cubic" | "bicubic" => GridSampleMode::Cubic,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        let padding_mode = match n.s("padding_mode", "zeros")?.as_str() {
            "zeros" => GridPadding::Zeros,
            "border" => GridPadding::Border,
            "reflection" => GridPadding::Reflection,
            m => return Err(n.invalid(format!("unknown padding_mode `{m}`"))),
        };
        let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
        t.finish(
            Op::GridSample {
                mode,
                padding_mode,
                align_corners: n.flag("align_corners", false)?,
            },
            ins,
        )
    }),
    OnnxOp::new("NonMaxSuppression", |t| {
        let n = t.n;
        let ins = vec![
            Some(t.req(0)?),
            Some(t.req(1)?),
            t.inp(2)?,
            t.inp(3)?,
            t.inp(4)?,
        ];
        t.finish(
            Op::NonMaxSuppression {
                center_point_box: n.i("center_point_box", 0)?,
            },
            trim(ins),
        )
    }),
];

/// EyeLike's `dtype`, when given, is an element type the IR has.
fn check_eye_like(n: &NodeView<'_>) -> Result<(), String> {
    if let Some(d) = n.attr("dtype").map(|a| a.i) {
        dtype_from_onnx(d as i32).map_err(|e| format!("unsupported: {e}"))?;
    }
    Ok(())
}

/// ConstantOfShape's `value`, when given, is of an element type the IR has.
fn check_constant_of_shape(n: &NodeView<'_>) -> Result<(), String> {
    if let Some(t) = n.attr("value").and_then(|a| a.t.as_ref()) {
        dtype_from_onnx(t.data_type).map_err(|e| format!("unsupported: {e}"))?;
    }
    Ok(())
}

/// Resize's `tf_half_pixel_for_nn` coordinate mode is not supported.
fn check_resize(n: &NodeView<'_>) -> Result<(), String> {
    let mode = n
        .attr("coordinate_transformation_mode")
        .map(|a| String::from_utf8_lossy(&a.s).into_owned());
    if mode.as_deref() == Some("tf_half_pixel_for_nn") {
        return Err("unsupported: coordinate_transformation_mode `tf_half_pixel_for_nn`".into());
    }
    Ok(())
}

/// `Squeeze` and `Unsqueeze`.
fn squeeze(t: &mut Tr<'_, '_, '_>) -> R {
    let op = t.n.op_type();
    t.squeeze(op == "Unsqueeze")
}

/// `Gather` and `GatherElements` (an axis each).
fn gather(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let op = t.n.op_type();
    let (data, idx) = (t.req(0)?, t.req(1)?);
    let axis = t.axis(n.i("axis", 0)?, t.rank(data))?;
    let op = if op == "Gather" {
        Op::Gather { axis }
    } else {
        Op::GatherElements { axis }
    };
    t.finish(op, vec![Some(data), Some(idx)])
}

/// `ScatterElements`, `Scatter` (its older name) and `ScatterND`, with their reduction.
fn scatter(t: &mut Tr<'_, '_, '_>) -> R {
    let n = t.n;
    let op = t.n.op_type();
    let data = t.req(0)?;
    let ins = vec![Some(data), Some(t.req(1)?), Some(t.req(2)?)];
    let reduction = match n.s("reduction", "none")?.as_str() {
        "none" => ScatterReduction::None,
        "add" => ScatterReduction::Add,
        "mul" => ScatterReduction::Mul,
        "max" => ScatterReduction::Max,
        "min" => ScatterReduction::Min,
        r => return Err(n.invalid(format!("unknown reduction `{r}`"))),
    };
    let op = if op == "ScatterND" {
        Op::ScatterNd { reduction }
    } else {
        Op::ScatterElements {
            axis: t.axis(n.i("axis", 0)?, t.rank(data))?,
            reduction,
        }
    };
    t.finish(op, ins)
}

/// `Expand`, and `Tile` from opset 6 (Tile-1 has its own form, [`Tr::tile1`]).
fn expand_or_tile(t: &mut Tr<'_, '_, '_>) -> R {
    let op = t.n.op_type();
    let ins = vec![Some(t.req(0)?), Some(t.req(1)?)];
    let op = if op == "Expand" { Op::Expand } else { Op::Tile };
    t.finish(op, ins)
}

impl Tr<'_, '_, '_> {
    /// Tile-1 (before opset 6): operands input, tiles, axis (scalars of the input's float
    /// type); repeats the input `tiles` times along `axis`.
    pub(super) fn tile1(&mut self) -> R {
        let n = self.n;
        let (x, tiles, axis) = (self.req(0)?, self.req(1)?, self.req(2)?);
        let rank = self.rank(x);
        let axis = match self.sc.g.const_of(axis).map(|c| c.to_f64s()).as_deref() {
            Some(&[a]) => self.axis(a as i64, rank)? as usize,
            _ => {
                return Err(n.unsupported(format!(
                    "unsupported: dynamic axis (input `{}` is not a one-element constant)",
                    self.sc.g.value(axis).name
                )))
            }
        };
        let reps = match self.sc.g.const_of(tiles).map(|c| c.to_f64s()).as_deref() {
            Some(&[t]) => {
                let mut r = vec![1; rank];
                r[axis] = t as i64;
                self.i64_const("repeats", &r)
            }
            _ => {
                // [1]*axis ++ [tiles] ++ [1]*(rank - axis - 1), built at run time.
                let t = self.tmp("tiles_i64", Op::Cast { to: DType::I64 }, vec![Some(tiles)])?;
                let one = self.i64_const("one_elem", &[1]);
                let t = self.tmp(
                    "tiles_1d",
                    Op::Reshape { allow_zero: false },
                    vec![Some(t), Some(one)],
                )?;
                let mut parts = Vec::new();
                if axis > 0 {
                    parts.push(Some(self.i64_const("ones_before", &vec![1; axis])));
                }
                parts.push(Some(t));
                if axis + 1 < rank {
                    parts.push(Some(
                        self.i64_const("ones_after", &vec![1; rank - axis - 1]),
                    ));
                }
                self.tmp("repeats", Op::Concat { axis: 0 }, parts)?
            }
        };
        self.finish(Op::Tile, vec![Some(x), Some(reps)])
    }

    pub(super) fn space_to_depth(&mut self) -> R {
        let n = self.n;
        let b = n.i_req("blocksize")?;
        let crd = match n.s("mode", "DCR")?.as_str() {
            "DCR" => false,
            "CRD" => true,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        let x = self.req(0)?;
        if !crd {
            return self.finish(Op::SpaceToDepth { blocksize: b }, vec![Some(x)]);
        }
        // The IR's space_to_depth is the DCR order; CRD is spelled out as
        // reshape [N, C, H/b, b, W/b, b] -> transpose -> reshape [N, C*b*b, H/b, W/b].
        let dims = self.ty(x).known_dims().filter(|d| d.len() == 4 && b > 0);
        let Some([nn, c, h, w]) = dims.as_deref().map(|d| [d[0], d[1], d[2], d[3]]) else {
            return Err(n.unsupported(
                "unsupported: SpaceToDepth mode CRD on an input whose shape is not known",
            ));
        };
        let split = self.i64_const("split_shape", &[nn, c, h / b, b, w / b, b]);
        let r = self.tmp(
            "split",
            Op::Reshape { allow_zero: true },
            vec![Some(x), Some(split)],
        )?;
        let t = self.tmp(
            "transpose",
            Op::Transpose {
                perm: vec![0, 1, 3, 5, 2, 4],
            },
            vec![Some(r)],
        )?;
        let merged = self.i64_const("merged_shape", &[nn, c * b * b, h / b, w / b]);
        self.finish(
            Op::Reshape { allow_zero: true },
            vec![Some(t), Some(merged)],
        )
    }

    pub(super) fn squeeze(&mut self, unsqueeze: bool) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let axes = if n.opset >= 13 {
            match self.inp(1)? {
                Some(a) => match self.sc.known_i64s(a) {
                    Some(k) => Some(k),
                    // Known only at run time: the operand.
                    None => {
                        let op = if unsqueeze {
                            Op::Unsqueeze { axes: vec![] }
                        } else {
                            Op::Squeeze { axes: vec![] }
                        };
                        return self.finish(op, vec![Some(x), Some(a)]);
                    }
                },
                None => None,
            }
        } else {
            n.ints("axes")?
        };
        let rank = self.rank(x);
        if unsqueeze {
            let axes = axes.ok_or_else(|| n.invalid("missing axes"))?;
            let mut axes = self.axes(&axes, rank + axes.len())?;
            axes.sort_unstable();
            self.finish(Op::Unsqueeze { axes }, vec![Some(x)])
        } else {
            let mut axes = self.axes(&axes.unwrap_or_default(), rank)?;
            axes.sort_unstable();
            self.finish(Op::Squeeze { axes }, vec![Some(x)])
        }
    }

    pub(super) fn split(&mut self) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let axis = if n.opset < 2 {
            n.i_opt("axis")?.ok_or_else(|| {
                n.unsupported("unsupported: Split-1 without `axis` (its default is unspecified)")
            })?
        } else {
            n.i("axis", 0)?
        };
        let axis = self.axis(axis, self.rank(x))?;
        let sizes = if n.opset < 2 {
            // Split-1: sizes from the attribute or from a second input of the data's
            // (float) type.
            match (n.ints("split")?.filter(|s| !s.is_empty()), self.inp(1)?) {
                (Some(_), Some(_)) => {
                    return Err(n.invalid("sizes given both as attribute `split` and as input"))
                }
                (Some(s), None) => Some(self.i64_const("split", &s)),
                (None, Some(v)) => {
                    Some(self.tmp("split_i64", Op::Cast { to: DType::I64 }, vec![Some(v)])?)
                }
                (None, None) => None,
            }
        } else if n.opset < 13 {
            match n.ints("split")? {
                Some(s) if !s.is_empty() => Some(self.i64_const("split", &s)),
                _ => None,
            }
        } else {
            let s = self.inp(1)?;
            self.non_empty(s)
        };
        if let Some(k) = n.i_opt("num_outputs")? {
            if k as usize != n.p.output.len() {
                return Err(n.invalid(format!(
                    "num_outputs is {k} but the node has {} outputs",
                    n.p.output.len()
                )));
            }
        }
        self.finish(Op::Split { axis }, trim(vec![Some(x), sizes]))
    }

    pub(super) fn slice(&mut self) -> R {
        let n = self.n;
        let data = self.req(0)?;
        let ins = if n.opset < 10 {
            let starts = n
                .ints("starts")?
                .ok_or_else(|| n.invalid("missing required attribute `starts`"))?;
            let ends = n
                .ints("ends")?
                .ok_or_else(|| n.invalid("missing required attribute `ends`"))?;
            let starts = self.i64_const("starts", &starts);
            let ends = self.i64_const("ends", &ends);
            let axes = n.ints("axes")?.map(|a| self.i64_const("axes", &a));
            vec![Some(data), Some(starts), Some(ends), axes]
        } else {
            vec![
                Some(data),
                Some(self.req(1)?),
                Some(self.req(2)?),
                self.inp(3)?,
                self.inp(4)?,
            ]
        };
        self.finish(Op::Slice, trim(ins))
    }

    pub(super) fn pad(&mut self) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let mode = match n.s("mode", "constant")?.as_str() {
            "constant" => PadMode::Constant,
            "reflect" => PadMode::Reflect,
            "edge" => PadMode::Edge,
            "wrap" => PadMode::Wrap,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        let ins = if n.opset < 11 {
            // Pad-1 calls them `paddings` (same layout).
            let key = if n.opset < 2 { "paddings" } else { "pads" };
            let pads = n
                .ints(key)?
                .ok_or_else(|| n.invalid(format!("missing required attribute `{key}`")))?;
            let pads = self.i64_const("pads", &pads);
            let value = n.f("value", 0.0)?;
            let cv = (mode == PadMode::Constant && value != 0.0)
                .then(|| self.konst("value", scalar_const(self.dtype(x), value as f64)));
            vec![Some(x), Some(pads), cv]
        } else {
            let cv = self.inp(2)?;
            vec![
                Some(x),
                Some(self.req(1)?),
                self.non_empty(cv),
                self.inp(3)?,
            ]
        };
        self.finish(Op::Pad { mode }, trim(ins))
    }

    pub(super) fn resize(&mut self, upsample: bool) -> R {
        let n = self.n;
        let x = self.req(0)?;
        let old = upsample || n.opset < 11;
        let (roi, scales, sizes) = if upsample && n.opset < 7 {
            // Upsample-1 scales the last two dims of a 4-D input.
            let h = n
                .f_opt("height_scale")?
                .ok_or_else(|| n.invalid("missing required attribute `height_scale`"))?;
            let w = n
                .f_opt("width_scale")?
                .ok_or_else(|| n.invalid("missing required attribute `width_scale`"))?;
            if self.rank(x) != 4 {
                return Err(n.invalid(format!("input must be 4-D, got {}", self.ty(x))));
            }
            let s = ConstData::from_f32s(&[1.0, 1.0, h, w]);
            (None, Some(self.konst("scales", s)), None)
        } else if upsample && n.opset < 9 {
            let s = n
                .floats("scales")?
                .ok_or_else(|| n.invalid("missing required attribute `scales`"))?;
            (
                None,
                Some(self.konst("scales", ConstData::from_f32s(&s))),
                None,
            )
        } else if old {
            (None, Some(self.req(1)?), None)
        } else {
            let (r, s, z) = (self.inp(1)?, self.inp(2)?, self.inp(3)?);
            (self.non_empty(r), self.non_empty(s), self.non_empty(z))
        };
        let mode = match n.s("mode", "nearest")?.as_str() {
            "nearest" => ResizeMode::Nearest,
            "linear" | "bilinear" => ResizeMode::Linear,
            "cubic" | "bicubic" => ResizeMode::Cubic,
            m => return Err(n.invalid(format!("unknown mode `{m}`"))),
        };
        let (ctm, nearest_mode) = if old {
            // Upsample and Resize-10 map like ONNX's 10→11 version converter does.
            (CoordTransform::Asymmetric, NearestMode::Floor)
        } else {
            let ctm = match n
                .s("coordinate_transformation_mode", "half_pixel")?
                .as_str()
            {
                "half_pixel" => CoordTransform::HalfPixel,
                "half_pixel_symmetric" => CoordTransform::HalfPixelSymmetric,
                "pytorch_half_pixel" => CoordTransform::PytorchHalfPixel,
                "align_corners" => CoordTransform::AlignCorners,
                "asymmetric" => CoordTransform::Asymmetric,
                "tf_crop_and_resize" => CoordTransform::TfCropAndResize,
                m => {
                    return Err(
                        n.unsupported(format!("unsupported: coordinate_transformation_mode `{m}`"))
                    )
                }
            };
            let nm = match n.s("nearest_mode", "round_prefer_floor")?.as_str() {
                "round_prefer_floor" => NearestMode::RoundPreferFloor,
                "round_prefer_ceil" => NearestMode::RoundPreferCeil,
                "floor" => NearestMode::Floor,
                "ceil" => NearestMode::Ceil,
                m => return Err(n.invalid(format!("unknown nearest_mode `{m}`"))),
            };
            (ctm, nm)
        };
        let axes = match n.ints("axes")? {
            Some(a) => self.axes(&a, self.rank(x))?,
            None => Vec::new(),
        };
        let keep_aspect_ratio_policy = match n.s("keep_aspect_ratio_policy", "stretch")?.as_str() {
            "stretch" => AspectPolicy::Stretch,
            "not_larger" => AspectPolicy::NotLarger,
            "not_smaller" => AspectPolicy::NotSmaller,
            p => return Err(n.invalid(format!("unknown keep_aspect_ratio_policy `{p}`"))),
        };
        self.finish(
            Op::Resize {
                mode,
                coordinate_transformation_mode: ctm,
                nearest_mode,
                cubic_coeff_a: n.f("cubic_coeff_a", -0.75)?,
                exclude_outside: n.flag("exclude_outside", false)?,
                extrapolation_value: n.f("extrapolation_value", 0.0)?,
                antialias: n.flag("antialias", false)?,
                axes,
                keep_aspect_ratio_policy,
            },
            trim(vec![Some(x), roi, scales, sizes]),
        )
    }
}
