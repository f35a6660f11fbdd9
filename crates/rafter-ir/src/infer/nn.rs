//! Reductions, normalisations, convolution and pooling, resampling, recurrent cells.

use super::arith;
use super::cx::{axes, axis, ck, op_axes, valued, Cx, OpAxes, Res, R};
use super::RUNTIME_AXES_RANK;
use crate::{AspectPolicy, AutoPad, CumKind, DType, Dim, ReduceKind, RnnDirection};

pub(super) fn reduce(
    cx: &mut Cx<'_, '_, '_>,
    kind: ReduceKind,
    ax: &[i64],
    keep: bool,
    noop: bool,
) -> R {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    let ax = match op_axes(cx, ax, 1)? {
        OpAxes::Known(ax) => ax,
        OpAxes::RunTime(len) => {
            // Which axes go is known only at run time: each kept dim is itself or 1.
            let rank = match (keep, len) {
                (true, _) => x.rank(),
                (false, Some(l)) if l <= x.rank() => x.rank() - l,
                (false, Some(l)) => {
                    return Err(format!("{l} axes to reduce for rank {}", x.rank()))
                }
                (false, None) => {
                    return Err(format!(
                        "{RUNTIME_AXES_RANK}: the axes operand has an unknown length and \
                         keep_dims is false"
                    ))
                }
            };
            let all_one = x.dims.iter().all(|d| d.as_known() == Some(1));
            let dims = (0..rank)
                .map(|i| {
                    let one = if keep {
                        x.dims[i].as_known() == Some(1)
                    } else {
                        all_one
                    };
                    if one {
                        Dim::known(1)
                    } else {
                        cx.fresh()
                    }
                })
                .collect();
            return Ok(vec![Res::new(x.dtype, dims)]);
        }
    };
    if ax.is_empty() && noop {
        return Ok(vec![Res::of(x).with_sym(cx.values(0))]);
    }
    let reduced: Vec<usize> = if ax.is_empty() {
        (0..x.rank()).collect()
    } else {
        axes(&ax, x.rank())?
    };
    let mut dims = Vec::with_capacity(x.rank());
    for (i, d) in x.dims.iter().enumerate() {
        if !reduced.contains(&i) {
            dims.push(d.clone());
        } else if keep {
            dims.push(Dim::known(1));
        }
    }
    // Values: a full reduction of a vector (ReduceProd of a Shape is an element count).
    let sym = match (valued(x.dtype) && x.rank() <= 1, cx.values(0)) {
        (true, Some(v)) => match kind {
            ReduceKind::Sum => arith::sum(&v).map(|d| vec![d]),
            ReduceKind::Prod => arith::product(&v).map(|d| vec![d]),
            ReduceKind::Max | ReduceKind::Min => {
                let k: Option<Vec<i64>> = v.iter().map(Dim::as_known).collect();
                let k = k.filter(|k| !k.is_empty());
                k.map(|k| {
                    let m = if kind == ReduceKind::Max {
                        k.iter().max()
                    } else {
                        k.iter().min()
                    };
                    vec![Dim::known(*m.unwrap_or(&0))]
                })
            }
            _ => None,
        },
        _ => None,
    };
    Ok(vec![Res::new(x.dtype, dims).with_sym(sym)])
}

pub(super) fn arg_reduce(cx: &mut Cx<'_, '_, '_>, ax: i64, keep: bool) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let a = axis(ax, x.rank())?;
    let mut dims = x.dims.clone();
    if keep {
        dims[a] = Dim::known(1);
    } else {
        dims.remove(a);
    }
    Ok(vec![Res::new(DType::I64, dims)])
}

pub(super) fn cumulative(
    cx: &mut Cx<'_, '_, '_>,
    kind: CumKind,
    exclusive: bool,
    reverse: bool,
) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let a = cx.ty(1)?;
    if a.rank() > 1 || !a.dtype.is_int() {
        return Err(format!(
            "axis (operand 1) must be an integer scalar, got {a}"
        ));
    }
    if let Some(v) = cx.ints(1) {
        if let Some(&v) = v.first() {
            axis(v, x.rank())?;
        }
    }
    let sym = match (valued(x.dtype) && x.rank() == 1, cx.values(0)) {
        (true, Some(mut v)) => {
            if reverse {
                v.reverse();
            }
            let mut acc = Dim::known(if kind == CumKind::Sum { 0 } else { 1 });
            let mut out = Vec::with_capacity(v.len());
            let mut ok = true;
            for d in &v {
                let next = match kind {
                    CumKind::Sum => arith::add(&acc, d),
                    CumKind::Prod => arith::mul(&acc, d),
                };
                let Some(next) = next else {
                    ok = false;
                    break;
                };
                out.push(if exclusive { acc.clone() } else { next.clone() });
                acc = next;
            }
            if reverse {
                out.reverse();
            }
            ok.then_some(out)
        }
        _ => None,
    };
    Ok(vec![Res::of(x).with_sym(sym)])
}

/// Softmax, LpNorm: same type; the axis must be in range.
pub(super) fn along_axis(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    axis(ax, x.rank())?;
    Ok(vec![Res::of(x)])
}

pub(super) fn layer_norm(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(2, 3)?;
    let x = cx.ty(0)?;
    cx.ty(1)?;
    let a = axis(ax, x.rank())?;
    // Mean and InvStdDev: X's shape with the normalised dims kept as 1, in the stash type
    // (float by default).
    let mut stats = x.dims[..a].to_vec();
    stats.resize(x.rank(), Dim::known(1));
    Ok(vec![
        Res::of(x),
        Res::new(DType::F32, stats.clone()),
        Res::new(DType::F32, stats),
    ])
}

pub(super) fn rms_norm(cx: &mut Cx<'_, '_, '_>, ax: i64) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    cx.ty(1)?;
    axis(ax, x.rank())?;
    Ok(vec![Res::of(x)])
}

fn check_channels(cx: &Cx<'_, '_, '_>, min_rank: usize) -> Result<(), String> {
    let x = cx.ty(0)?;
    if x.rank() < min_rank {
        return Err(format!(
            "x must have rank at least {min_rank} (N, C, ...), got {}",
            x.rank()
        ));
    }
    Ok(())
}

pub(super) fn group_norm(cx: &mut Cx<'_, '_, '_>, groups: i64) -> R {
    cx.arity(3, 3)?;
    check_channels(cx, 2)?;
    let x = cx.ty(0)?;
    cx.ty(1)?;
    cx.ty(2)?;
    if groups <= 0 {
        return Err(format!("num_groups must be positive, got {groups}"));
    }
    if let Some(c) = x.dims[1].as_known() {
        if c % groups != 0 {
            return Err(format!("{c} channels do not divide into {groups} groups"));
        }
    }
    Ok(vec![Res::of(x)])
}

/// InstanceNorm, BatchNorm: x [N, C, ...] plus per-channel operands.
pub(super) fn channel_norm(cx: &mut Cx<'_, '_, '_>, min: usize, max: usize) -> R {
    cx.arity(min, max)?;
    for i in 0..min {
        cx.ty(i)?;
    }
    let x = cx.ty(0)?;
    if x.rank() < 1 {
        return Err("x must have rank at least 1".into());
    }
    Ok(vec![Res::of(x)])
}

pub(super) fn lrn(cx: &mut Cx<'_, '_, '_>, size: i64) -> R {
    cx.arity(1, 1)?;
    if size <= 0 {
        return Err(format!("size must be positive, got {size}"));
    }
    check_channels(cx, 2)?;
    Ok(vec![Res::of(cx.ty(0)?)])
}

pub(super) fn mean_variance_norm(cx: &mut Cx<'_, '_, '_>, ax: &[i64]) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    axes(ax, x.rank())?;
    Ok(vec![Res::of(x)])
}

/// The window attributes shared by convolutions and pools.
pub(super) struct ConvAttrs<'a> {
    pub kernel_shape: &'a [i64],
    pub strides: &'a [i64],
    pub pads: &'a [i64],
    pub dilations: &'a [i64],
    pub group: i64,
    pub auto_pad: AutoPad,
}

/// Per-spatial-axis window parameters after defaults and checks.
struct Window {
    /// Kernel sizes; `None` where the kernel dim is symbolic.
    kernel: Vec<Option<i64>>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    pads: Vec<i64>,
}

fn window(a: &ConvAttrs<'_>, n: usize, kernel_from_w: Option<&[Dim]>) -> Result<Window, String> {
    let list = |v: &[i64], what: &str, default: i64, len: usize| -> Result<Vec<i64>, String> {
        if v.is_empty() {
            return Ok(vec![default; len]);
        }
        if v.len() != len {
            return Err(format!("{what} has {} values, expected {len}", v.len()));
        }
        Ok(v.to_vec())
    };
    let kernel: Vec<Option<i64>> = if !a.kernel_shape.is_empty() {
        list(a.kernel_shape, "kernel_shape", 1, n)?
            .into_iter()
            .map(Some)
            .collect()
    } else if let Some(w) = kernel_from_w {
        w.iter().map(Dim::as_known).collect()
    } else {
        return Err("kernel_shape is required".into());
    };
    let strides = list(a.strides, "strides", 1, n)?;
    let dilations = list(a.dilations, "dilations", 1, n)?;
    let pads = list(a.pads, "pads", 0, 2 * n)?;
    for (what, v) in [("strides", &strides), ("dilations", &dilations)] {
        if let Some(bad) = v.iter().find(|s| **s <= 0) {
            return Err(format!("{what} must be positive, got {bad}"));
        }
    }
    if let Some(bad) = kernel.iter().flatten().find(|k| **k <= 0) {
        return Err(format!("kernel_shape must be positive, got {bad}"));
    }
    Ok(Window {
        kernel,
        strides,
        dilations,
        pads,
    })
}

/// One output spatial dim of a convolution or pool.
fn window_out(
    cx: &mut Cx<'_, '_, '_>,
    w: &Window,
    i: usize,
    input: &Dim,
    auto_pad: AutoPad,
    ceil_mode: bool,
) -> Result<Dim, String> {
    let n = w.strides.len();
    let s = w.strides[i];
    let Some(k) = w.kernel[i] else {
        return Ok(cx.fresh());
    };
    let eff = (k - 1)
        .checked_mul(w.dilations[i])
        .and_then(|v| v.checked_add(1))
        .ok_or("kernel extent overflows")?;
    match auto_pad {
        AutoPad::SameUpper | AutoPad::SameLower => {
            // ceil(in / stride)
            if let Some(v) = input.as_known() {
                return Ok(Dim::known(arith::ceil_div(v, s).ok_or("overflow")?));
            }
            return Ok(arith::div_exact(input, &Dim::known(s)).unwrap_or_else(|| cx.fresh()));
        }
        _ => {}
    }
    let (pb, pe) = if auto_pad == AutoPad::Valid {
        (0, 0)
    } else {
        (w.pads[i], w.pads[i + n])
    };
    let padded = ck(arith::add_k(
        input,
        pb.checked_add(pe).ok_or("pads overflow")?,
    ))?;
    let num = ck(arith::add_k(&padded, -eff))?;
    if let Some(v) = num.as_known() {
        if v < 0 {
            return Err(format!(
                "window of extent {eff} is larger than the padded input ({padded}) on spatial axis {i}"
            ));
        }
        let q = if ceil_mode {
            arith::ceil_div(v, s)
        } else {
            arith::floor_div(v, s)
        }
        .ok_or("overflow")?;
        let mut out = q + 1;
        // A last window that would start in the right padding is dropped (ONNX, PyTorch).
        if ceil_mode {
            if let Some(inp) = input.as_known() {
                if q as i128 * s as i128 >= inp as i128 + pb as i128 {
                    out -= 1;
                }
            }
        }
        return Ok(Dim::known(out));
    }
    match arith::div_exact(&num, &Dim::known(s)) {
        Some(q) => {
            let drop = ceil_mode && pe >= eff;
            ck(arith::add_k(&q, if drop { 0 } else { 1 }))
        }
        None => Ok(cx.fresh()),
    }
}

fn spatial_rank(x: &crate::TensorType) -> Result<usize, String> {
    if x.rank() < 3 {
        return Err(format!(
            "x must have rank at least 3 (N, C, spatial...), got {}",
            x.rank()
        ));
    }
    Ok(x.rank() - 2)
}

/// Where a convolution's channel axes lie.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ConvLayout {
    /// `conv`, `conv_integer`: x [N, C, s...], w [M, C/group, k...]; result [N, M, o...].
    ChannelsFirst,
    /// `conv_nhwc`: x [N, s..., C], w [k..., C/group, M]; result [N, o..., M].
    ChannelsLast,
}

/// Conv, ConvInteger (`dtype` I32) and ConvNhwc, by `layout`; b? [M] for the float ones.
pub(super) fn conv(
    cx: &mut Cx<'_, '_, '_>,
    a: &ConvAttrs<'_>,
    dtype: Option<DType>,
    layout: ConvLayout,
) -> R {
    let integer = dtype.is_some();
    cx.arity(2, if integer { 4 } else { 3 })?;
    let x = cx.ty(0)?;
    let w = cx.ty(1)?;
    let n = spatial_rank(x)?;
    if w.rank() != x.rank() {
        return Err(format!(
            "weights have rank {}, x has rank {}",
            w.rank(),
            x.rank()
        ));
    }
    if a.group <= 0 {
        return Err(format!("group must be positive, got {}", a.group));
    }
    // (x's channel axis, x's first spatial axis, w's input and output channel axes, w's
    // first kernel axis)
    let (xc, xs, wi, wo, wk) = match layout {
        ConvLayout::ChannelsFirst => (1, 2, 1, 0, 2),
        ConvLayout::ChannelsLast => (n + 1, 1, n, n + 1, 0),
    };
    if let (Some(c), Some(wc)) = (x.dims[xc].as_known(), w.dims[wi].as_known()) {
        if wc.checked_mul(a.group) != Some(c) {
            return Err(format!(
                "x has {c} channels, weights expect {wc} x {} groups",
                a.group
            ));
        }
    }
    if !integer {
        if let Some(b) = cx.opt_ty(2) {
            if b.rank() != 1 {
                return Err(format!("bias must be 1-D, got {b}"));
            }
        }
    }
    let win = window(a, n, Some(&w.dims[wk..wk + n]))?;
    let mut spatial = Vec::with_capacity(n);
    for i in 0..n {
        spatial.push(window_out(cx, &win, i, &x.dims[xs + i], a.auto_pad, false)?);
    }
    let (batch, m) = (x.dims[0].clone(), w.dims[wo].clone());
    let dims = match layout {
        ConvLayout::ChannelsFirst => [vec![batch, m], spatial].concat(),
        ConvLayout::ChannelsLast => [vec![batch], spatial, vec![m]].concat(),
    };
    Ok(vec![Res::new(dtype.unwrap_or(x.dtype), dims)])
}

/// ConvTranspose: x [N, C, s...], w [C, M/group, k...].
pub(super) fn conv_transpose(
    cx: &mut Cx<'_, '_, '_>,
    a: &ConvAttrs<'_>,
    output_padding: &[i64],
    output_shape: &[i64],
) -> R {
    cx.arity(2, 3)?;
    let x = cx.ty(0)?;
    let w = cx.ty(1)?;
    let n = spatial_rank(x)?;
    if w.rank() != x.rank() {
        return Err(format!(
            "weights have rank {}, x has rank {}",
            w.rank(),
            x.rank()
        ));
    }
    if a.group <= 0 {
        return Err(format!("group must be positive, got {}", a.group));
    }
    if let (Some(c), Some(wc)) = (x.dims[1].as_known(), w.dims[0].as_known()) {
        if c != wc {
            return Err(format!("x has {c} channels, weights expect {wc}"));
        }
    }
    let win = window(a, n, Some(&w.dims[2..]))?;
    let out_pad = if output_padding.is_empty() {
        vec![0; n]
    } else if output_padding.len() == n {
        output_padding.to_vec()
    } else {
        return Err(format!(
            "output_padding has {} values, expected {n}",
            output_padding.len()
        ));
    };
    let channels = ck(arith::scale(&w.dims[1], a.group))?;
    let mut dims = vec![x.dims[0].clone(), channels];
    if !output_shape.is_empty() {
        let spatial = match output_shape.len() {
            l if l == n => output_shape,
            l if l == n + 2 => &output_shape[2..],
            l => return Err(format!("output_shape has {l} values, expected {n}")),
        };
        dims.extend(spatial.iter().map(|&v| Dim::known(v)));
        return Ok(vec![Res::new(x.dtype, dims)]);
    }
    for (i, &extra) in out_pad.iter().enumerate() {
        let input = &x.dims[2 + i];
        let s = win.strides[i];
        let d = match a.auto_pad {
            AutoPad::SameUpper | AutoPad::SameLower => ck(arith::scale(input, s))?,
            _ => match win.kernel[i] {
                None => cx.fresh(),
                Some(k) => {
                    let (pb, pe) = if a.auto_pad == AutoPad::Valid {
                        (0, 0)
                    } else {
                        (win.pads[i], win.pads[i + n])
                    };
                    // stride * (in - 1) + output_padding + (k - 1) * dilation + 1 - pads
                    let konst = (|| {
                        let eff = (k - 1).checked_mul(win.dilations[i])?.checked_add(1)?;
                        extra
                            .checked_add(eff)?
                            .checked_sub(pb)?
                            .checked_sub(pe)?
                            .checked_sub(s)
                    })()
                    .ok_or("conv_transpose attribute arithmetic overflows")?;
                    ck(arith::scale(input, s).and_then(|v| arith::add_k(&v, konst)))?
                }
            },
        };
        dims.push(d);
    }
    Ok(vec![Res::new(x.dtype, dims)])
}

/// Pool: x [N, C, s...]; results y and (max pool) indices.
pub(super) fn pool(cx: &mut Cx<'_, '_, '_>, a: &ConvAttrs<'_>, ceil_mode: bool) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let n = spatial_rank(x)?;
    let win = window(a, n, None)?;
    let mut dims = x.dims[..2].to_vec();
    for i in 0..n {
        dims.push(window_out(
            cx,
            &win,
            i,
            &x.dims[2 + i],
            a.auto_pad,
            ceil_mode,
        )?);
    }
    Ok(vec![
        Res::new(x.dtype, dims.clone()),
        Res::new(DType::I64, dims),
    ])
}

pub(super) fn global_pool(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    if x.rank() < 2 {
        return Err(format!(
            "x must have rank at least 2 (N, C, ...), got {}",
            x.rank()
        ));
    }
    let mut dims = x.dims[..2].to_vec();
    dims.resize(x.rank(), Dim::known(1));
    Ok(vec![Res::new(x.dtype, dims)])
}

pub(super) fn max_unpool(
    cx: &mut Cx<'_, '_, '_>,
    kernel: &[i64],
    strides: &[i64],
    pads: &[i64],
) -> R {
    cx.arity(2, 3)?;
    let x = cx.ty(0)?;
    cx.int_ty(1, "indices")?;
    let n = spatial_rank(x)?;
    if let Some(s) = cx.opt_ty(2) {
        if s.rank() != 1 || s.dims[0].as_known().is_some_and(|l| l != x.rank() as i64) {
            return Err(format!(
                "output_shape (operand 2) must be a vector of {} values, got {s}",
                x.rank()
            ));
        }
        let dims = match cx.values(2) {
            Some(v) => v,
            None => cx.fresh_n(x.rank()),
        };
        return Ok(vec![Res::new(x.dtype, dims)]);
    }
    let attrs = ConvAttrs {
        kernel_shape: kernel,
        strides,
        pads,
        dilations: &[],
        group: 1,
        auto_pad: AutoPad::NotSet,
    };
    let win = window(&attrs, n, None)?;
    let mut dims = x.dims[..2].to_vec();
    for i in 0..n {
        // (in - 1) * stride + kernel - pad_begin - pad_end
        let k = win.kernel[i].unwrap_or(1);
        let konst = k
            .checked_sub(win.strides[i])
            .and_then(|v| v.checked_sub(win.pads[i]))
            .and_then(|v| v.checked_sub(win.pads[i + n]))
            .ok_or("max_unpool attribute arithmetic overflows")?;
        dims.push(ck(
            arith::scale(&x.dims[2 + i], win.strides[i]).and_then(|v| arith::add_k(&v, konst))
        )?);
    }
    Ok(vec![Res::new(x.dtype, dims)])
}

fn rank4(cx: &Cx<'_, '_, '_>, block: i64) -> Result<(), String> {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    if x.rank() != 4 {
        return Err(format!("x must have rank 4, got {}", x.rank()));
    }
    if block <= 0 {
        return Err(format!("blocksize must be positive, got {block}"));
    }
    Ok(())
}

/// `d / k`, an error when both are known and it is not exact, else a fresh symbol.
fn divide(cx: &mut Cx<'_, '_, '_>, d: &Dim, k: i64, what: &str) -> Result<Dim, String> {
    if let Some(q) = arith::div_exact(d, &Dim::known(k)) {
        return Ok(q);
    }
    if d.is_known() {
        return Err(format!("{what} {d} is not divisible by {k}"));
    }
    Ok(cx.fresh())
}

pub(super) fn depth_to_space(cx: &mut Cx<'_, '_, '_>, b: i64) -> R {
    rank4(cx, b)?;
    let x = cx.ty(0)?;
    let bb = b.checked_mul(b).ok_or("blocksize overflows")?;
    let c = divide(cx, &x.dims[1], bb, "channel count")?;
    let dims = vec![
        x.dims[0].clone(),
        c,
        ck(arith::scale(&x.dims[2], b))?,
        ck(arith::scale(&x.dims[3], b))?,
    ];
    Ok(vec![Res::new(x.dtype, dims)])
}

pub(super) fn space_to_depth(cx: &mut Cx<'_, '_, '_>, b: i64) -> R {
    rank4(cx, b)?;
    let x = cx.ty(0)?;
    let bb = b.checked_mul(b).ok_or("blocksize overflows")?;
    let h = divide(cx, &x.dims[2], b, "height")?;
    let w = divide(cx, &x.dims[3], b, "width")?;
    let dims = vec![x.dims[0].clone(), ck(arith::scale(&x.dims[1], bb))?, h, w];
    Ok(vec![Res::new(x.dtype, dims)])
}

/// Resize: x, roi?, scales?, sizes?.
pub(super) fn resize(cx: &mut Cx<'_, '_, '_>, ax: &[i64], policy: AspectPolicy) -> R {
    cx.arity(1, 4)?;
    let x = cx.ty(0)?;
    let r = x.rank();
    let targets: Vec<usize> = if ax.is_empty() {
        (0..r).collect()
    } else {
        axes(ax, r)?
    };
    // An empty scales or sizes tensor counts as absent (older exports pass `[]`).
    let given = |i: usize| {
        cx.opt_ty(i)
            .filter(|t| !(t.rank() == 1 && t.dims[0].as_known() == Some(0)))
    };
    let check_len = |t: &crate::TensorType, what: &str| -> Result<(), String> {
        if t.rank() != 1
            || t.dims[0]
                .as_known()
                .is_some_and(|l| l != targets.len() as i64)
        {
            return Err(format!(
                "{what} must be a vector of {} values, got {t}",
                targets.len()
            ));
        }
        Ok(())
    };
    let mut dims = x.dims.clone();
    if let Some(t) = given(3) {
        check_len(t, "sizes")?;
        let Some(sizes) = cx.values(3) else {
            for &a in &targets {
                dims[a] = cx.fresh();
            }
            return Ok(vec![Res::new(x.dtype, dims)]);
        };
        if let Some(bad) = sizes.iter().find(|d| d.as_known().is_some_and(|v| v < 0)) {
            return Err(format!("sizes has negative value {bad}"));
        }
        if policy == AspectPolicy::Stretch {
            for (&a, s) in targets.iter().zip(&sizes) {
                dims[a] = s.clone();
            }
            return Ok(vec![Res::new(x.dtype, dims)]);
        }
        // One scale for every axis: the smallest (not_larger) or largest (not_smaller)
        // ratio, then out = round(scale * in).
        let pairs: Option<Vec<(i64, i64)>> = targets
            .iter()
            .zip(&sizes)
            .map(|(&a, s)| Some((x.dims[a].as_known()?, s.as_known()?)))
            .collect();
        match pairs.filter(|p| p.iter().all(|(i, _)| *i > 0)) {
            Some(p) => {
                let ratios = p.iter().map(|(i, s)| *s as f64 / *i as f64);
                let scale = if policy == AspectPolicy::NotLarger {
                    ratios.fold(f64::INFINITY, f64::min)
                } else {
                    ratios.fold(0.0, f64::max)
                };
                for (&a, (i, _)) in targets.iter().zip(&p) {
                    dims[a] = Dim::known(float_dim(scale * *i as f64, true)?);
                }
            }
            None => {
                for &a in &targets {
                    dims[a] = cx.fresh();
                }
            }
        }
        return Ok(vec![Res::new(x.dtype, dims)]);
    }
    let Some(t) = given(2) else {
        return Err("resize needs scales (operand 2) or sizes (operand 3)".into());
    };
    check_len(t, "scales")?;
    let Some(scales) = cx.floats(2) else {
        for &a in &targets {
            dims[a] = cx.fresh();
        }
        return Ok(vec![Res::new(x.dtype, dims)]);
    };
    for (&a, &s) in targets.iter().zip(&scales) {
        if !(s.is_finite() && s > 0.0) {
            return Err(format!("scale {s} must be positive"));
        }
        let d = &x.dims[a];
        dims[a] = if let Some(v) = d.as_known() {
            Dim::known(float_dim(v as f64 * s, false)?)
        } else if s.fract() == 0.0 && s < (1u64 << 31) as f64 {
            ck(arith::scale(d, s as i64))?
        } else {
            cx.fresh()
        };
    }
    Ok(vec![Res::new(x.dtype, dims)])
}

/// `floor(v)` (or `round(v)`) as a dim.
fn float_dim(v: f64, round: bool) -> Result<i64, String> {
    let v = if round { v.round() } else { v.floor() };
    if !(v.is_finite() && v >= 0.0 && v < (1u64 << 62) as f64) {
        return Err(format!("resize output size {v} is out of range"));
    }
    Ok(v as i64)
}

/// GridSample: x [N, C, in...], grid [N, out..., r-2] → [N, C, out...].
pub(super) fn grid_sample(cx: &mut Cx<'_, '_, '_>) -> R {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let g = cx.ty(1)?;
    let n = spatial_rank(x)?;
    if g.rank() != x.rank() {
        return Err(format!(
            "grid has rank {}, x has rank {}",
            g.rank(),
            x.rank()
        ));
    }
    if g.dims[x.rank() - 1]
        .as_known()
        .is_some_and(|v| v != n as i64)
    {
        return Err(format!(
            "grid's last dim is {}, expected {n}",
            g.dims[x.rank() - 1]
        ));
    }
    let mut dims = x.dims[..2].to_vec();
    dims.extend_from_slice(&g.dims[1..x.rank() - 1]);
    Ok(vec![Res::new(x.dtype, dims)])
}

/// LSTM, GRU, RNN: results y, y_h (and y_c for LSTM).
pub(super) fn rnn(
    cx: &mut Cx<'_, '_, '_>,
    direction: RnnDirection,
    hidden: i64,
    layout: i64,
    max_operands: usize,
    results: usize,
) -> R {
    cx.arity(3, max_operands)?;
    let x = cx.ranked(0, 3, "x")?;
    let w = cx.ranked(1, 3, "w")?;
    let r = cx.ranked(2, 3, "r")?;
    let dirs: i64 = if direction == RnnDirection::Bidirectional {
        2
    } else {
        1
    };
    if w.dims[0].as_known().is_some_and(|d| d != dirs) {
        return Err(format!(
            "w has {} directions, direction {} needs {dirs}",
            w.dims[0],
            direction.word()
        ));
    }
    let (seq, batch) = match layout {
        0 => (&x.dims[0], &x.dims[1]),
        1 => (&x.dims[1], &x.dims[0]),
        l => return Err(format!("layout must be 0 or 1, got {l}")),
    };
    let h = if hidden > 0 {
        Dim::known(hidden)
    } else {
        r.dims[2].clone()
    };
    let dirs = Dim::known(dirs);
    let (y, yh) = if layout == 0 {
        (
            vec![seq.clone(), dirs.clone(), batch.clone(), h.clone()],
            vec![dirs, batch.clone(), h],
        )
    } else {
        (
            vec![batch.clone(), seq.clone(), dirs.clone(), h.clone()],
            vec![batch.clone(), dirs, h],
        )
    };
    let mut out = vec![Res::new(x.dtype, y), Res::new(x.dtype, yh.clone())];
    if results == 3 {
        out.push(Res::new(x.dtype, yh));
    }
    Ok(out)
}
