//! 2-D convolutions and pooling of f32 or f16 NCHW tensors (one element type per kernel).
//!
//! - An ungrouped convolution is an implicit GEMM: per image, `Y[M, OH·OW] = W[M, C·KH·KW]
//!   · im2col(X)`, run by the matmul kernel ([`crate::matmul`]) with B's tiles gathered
//!   from the image as they are staged (no im2col buffer), the filter as A, and the conv's
//!   bias and elementwise tail (residual add, relu, clip) fused at the store.
//! - A depthwise convolution (one input and one output channel per group), max pooling and
//!   global pooling are window kernels ([`crate::window`]): one invocation per output
//!   element.
//!
//! A 1-D convolution or pooling is generated as the 2-D one on `[N, C, 1, L]` (the same
//! memory), its launch reading 3-D dims as `H = 1`.
//!
//! Channel and spatial dims must be static (they are baked into the module, so address
//! arithmetic divides by constants); the batch may be symbolic.

use rafter_ir::{AutoPad, BinaryOp, Graph, Op, PoolKind, TensorType, ValueDef, ValueId};
use rafter_vulkan_section::Launch;

use crate::coop::emit_coop;
use crate::elem::Elem;
use crate::matmul::{emit, epilogue, BSource, CAxes, ImageGeom, Layout, Src, Step};
use crate::window::{emit_window, WindowGeom, WindowLayout, WindowOp};
use crate::{CodegenError, MatmulTile, WORKGROUP_SIZE};

/// A generated convolution or pooling kernel and how to launch it.
#[derive(Debug, Clone)]
pub struct ConvKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body's inputs, then Y.
    pub spirv: Vec<u32>,
    /// The launch: [`Launch::Conv`] for an implicit GEMM, [`Launch::Elementwise`] (one
    /// invocation per output element) for a window kernel.
    pub launch: Launch,
    /// Invocations per workgroup.
    pub workgroup_size: u32,
    /// The same kernel on cooperative matrices, with the same launch, for devices that
    /// offer them (f16 implicit GEMMs only; see the `coop` module).
    pub coop: Option<Vec<u32>>,
}

/// Compiles a body whose first node is a `conv`, `pool` (max) or `global_pool` (average
/// or max) of static channel and spatial dims, followed by the matmul's epilogue chain.
pub fn conv(body: &Graph) -> Result<ConvKernel, CodegenError> {
    let error = |reason: String| CodegenError {
        kernel: body.name.clone(),
        reason,
    };
    match lift_1d(body).map_err(error)? {
        Some(lifted) => generate(&lifted),
        None => generate(body),
    }
    .map_err(error)
}

/// A 1-D convolution or pooling (`[N, C, L]`) as the 2-D one it equals on `[N, C, 1, L]`
/// (the same memory): every rank-3 value gains a unit dim at 2, and the window attributes
/// a unit leading entry (kernel 1, stride 1, no pads, dilation 1). `None` for a body whose
/// first op is not 1-D; an error where a value would align differently after the lift (a
/// rank-2 operand broadcast against the output's last two dims).
fn lift_1d(body: &Graph) -> Result<Option<Graph>, String> {
    let Some(first) = body.nodes.first() else {
        return Ok(None);
    };
    let x_rank = first.input(0).map(|v| body.value(v).ty.rank());
    let windowed = matches!(
        first.op,
        Op::Conv { .. } | Op::Pool { .. } | Op::GlobalPool { .. }
    );
    if !windowed || x_rank != Some(3) {
        return Ok(None);
    }
    if body
        .values
        .iter()
        .any(|v| v.ty.rank() == 2 || v.ty.rank() > 3)
    {
        return Err("a 1-D window body with a rank-2 or higher-rank value is not generated".into());
    }
    let mut lifted = body.clone();
    for v in &mut lifted.values {
        if v.ty.rank() == 3 {
            v.ty.dims.insert(2, rafter_ir::Dim::known(1));
        }
    }
    let unit = |v: &mut Vec<i64>, one: i64| {
        if !v.is_empty() {
            v.insert(0, one);
        }
    };
    let pads2 = |p: &mut Vec<i64>| {
        if let [b, e] = p.as_slice() {
            *p = vec![0, *b, 0, *e];
        }
    };
    match &mut lifted.nodes[0].op {
        Op::Conv {
            kernel_shape,
            strides,
            pads,
            dilations,
            ..
        }
        | Op::Pool {
            kernel_shape,
            strides,
            pads,
            dilations,
            ..
        } => {
            unit(kernel_shape, 1);
            unit(strides, 1);
            unit(dilations, 1);
            pads2(pads);
        }
        _ => {}
    }
    Ok(Some(lifted))
}

fn generate(body: &Graph) -> Result<ConvKernel, String> {
    let Some((first, rest)) = body.nodes.split_first() else {
        return Err("the body is empty".into());
    };
    let input_index = |v: Option<ValueId>| match v.map(|v| &body.value(v).def) {
        Some(ValueDef::Input(i)) => Some(*i),
        _ => None,
    };
    let [Some(out)] = first.outputs.as_slice() else {
        return Err(format!("`{}` must have one result", first.op.name()));
    };
    let x = input_index(first.input(0)).ok_or("the input must be a body input")?;
    let y_ty = &body.value(*out).ty;
    let x_ty = &body.value(body.inputs[x]).ty;
    let (xd, yd) = (static_nchw(x_ty, "input")?, static_nchw(y_ty, "output")?);
    // One element type for every binding: the output's.
    let elem = Elem::of(y_ty.dtype).map_err(|e| format!("the output is {e}"))?;
    let axes = CAxes {
        row: 1,
        col_is_last: false,
    };
    let mut const_rows = Vec::new();
    let (mut steps, last) = epilogue(body, rest, *out, y_ty, axes, &mut const_rows)?;
    if body.outputs != [last] {
        return Err("the body's one output must be the end of the epilogue chain".into());
    }
    let bindings = body.inputs.len() + 1;
    let window = |op: WindowOp,
                  geom: WindowGeom,
                  w: Option<usize>,
                  steps: Vec<Step>,
                  const_rows: Vec<Vec<f32>>| {
        let spirv = emit_window(&WindowLayout {
            op,
            geom,
            x,
            w,
            y: bindings - 1,
            bindings,
            steps,
            const_rows,
            elem,
        })?;
        Ok(ConvKernel {
            spirv,
            launch: Launch::Elementwise,
            workgroup_size: WORKGROUP_SIZE,
            coop: None,
        })
    };
    match &first.op {
        Op::Conv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } => {
            let w = input_index(first.input(1)).ok_or("the filter must be a body input")?;
            let wd = static_dims(&body.value(body.inputs[w]).ty, "filter", 4)?;
            if !kernel_shape.is_empty() && kernel_shape != &[wd[2] as i64, wd[3] as i64] {
                return Err("kernel_shape disagrees with the filter".into());
            }
            let geom = window_geom(
                (xd, yd),
                [wd[2], wd[3]],
                (strides, pads, dilations),
                *auto_pad,
            )?;
            // The bias, added first.
            if let Some(bias) = first.inputs.get(2).copied().flatten() {
                let b_ty = &body.value(bias).ty;
                if b_ty.dtype != y_ty.dtype || b_ty.dims.len() != 1 || b_ty.dims[0] != y_ty.dims[1]
                {
                    return Err(format!("bias of type {b_ty} is not [M] {}", y_ty.dtype));
                }
                // A body input, or a small constant the compiler copied into the body.
                let src = match (input_index(Some(bias)), &body.value(bias).def) {
                    (Some(b), _) => Src::PerRow(b),
                    (None, ValueDef::Const(id)) => {
                        let values = body.constant(*id).to_f64s();
                        const_rows.push(values.into_iter().map(|v| v as f32).collect());
                        Src::ConstRow(const_rows.len() - 1)
                    }
                    _ => return Err("the bias is computed inside the kernel".into()),
                };
                steps.insert(0, Step::Binary(BinaryOp::Add, src, true));
            }
            check_dtype(body, first.inputs.iter().flatten().copied(), y_ty)?;
            let (c, m) = (xd[1], yd[1]);
            if *group == 1 && wd[1] == c && wd[0] == m {
                let tile = conv_tile(m, geom.oh * geom.ow, c * geom.k[0] * geom.k[1]);
                let layout = Layout {
                    a: w,
                    b: x,
                    c: bindings - 1,
                    bindings,
                    steps,
                    tile,
                    const_rows,
                    elem,
                    b_source: BSource::Image(ImageGeom {
                        c,
                        h: geom.h,
                        w: geom.w,
                        k: geom.k,
                        s: geom.s,
                        p: geom.p,
                        d: geom.d,
                        ow: geom.ow,
                    }),
                    // Measured: convolutions ran slower with two products per step on the
                    // H100, even with long K (ResNet-50 f16 1.74 -> 2.10 ms; RESULTS.md).
                    long_k: false,
                    rows_of_8: false,
                };
                let spirv = emit(&layout)?;
                let coop = emit_coop(&layout)?;
                let index = |i: usize| {
                    u8::try_from(i).map_err(|_| format!("operand {i} is past binding 255"))
                };
                Ok(ConvKernel {
                    spirv,
                    coop,
                    launch: Launch::Conv {
                        x: index(x)?,
                        w: index(w)?,
                        tile: tile.size(),
                    },
                    workgroup_size: 256,
                })
            } else if *group as u32 == c && m == c && wd[1] == 1 {
                window(WindowOp::Depthwise, geom, Some(w), steps, const_rows)
            } else {
                Err(format!(
                    "grouped convolution (group {group}, {c} -> {m} channels) other than \
                     depthwise is not generated yet"
                ))
            }
        }
        Op::Pool {
            kind: PoolKind::Max,
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            ceil_mode,
            ..
        } => {
            if first.outputs.len() != 1 {
                return Err("max pooling with indices is not generated yet".into());
            }
            let &[kh, kw] = kernel_shape.as_slice() else {
                return Err("pooling window is not 2-D".into());
            };
            let k = [dim_u32(kh)?, dim_u32(kw)?];
            // ceil_mode only changes the output size, which is static here: the last
            // window may hang past the padded input, whose taps are skipped anyway.
            let _ = ceil_mode;
            check_dtype(body, first.inputs.iter().flatten().copied(), y_ty)?;
            let geom = window_geom((xd, yd), k, (strides, pads, dilations), *auto_pad)?;
            window(WindowOp::MaxPool, geom, None, steps, const_rows)
        }
        Op::Pool {
            kind: PoolKind::Average,
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            count_include_pad,
            ..
        } => {
            let &[kh, kw] = kernel_shape.as_slice() else {
                return Err("pooling window is not 2-D".into());
            };
            let k = [dim_u32(kh)?, dim_u32(kw)?];
            check_dtype(body, first.inputs.iter().flatten().copied(), y_ty)?;
            let geom = window_geom((xd, yd), k, (strides, pads, dilations), *auto_pad)?;
            if *count_include_pad && !windows_fit_padding(&geom, pads, *auto_pad)? {
                return Err(
                    "average pooling counting pads with a window past the padded input                      (ceil_mode) is not generated yet"
                        .into(),
                );
            }
            let op = WindowOp::AvgPool {
                include_pad: *count_include_pad,
            };
            window(op, geom, None, steps, const_rows)
        }
        Op::Pool {
            kind: PoolKind::Lp,
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            p,
            ..
        } => {
            let &[kh, kw] = kernel_shape.as_slice() else {
                return Err("pooling window is not 2-D".into());
            };
            let k = [dim_u32(kh)?, dim_u32(kw)?];
            let p = u32::try_from(*p)
                .ok()
                .filter(|p| (1..=8).contains(p))
                .ok_or_else(|| format!("Lp pooling with p = {p} is not generated (1 to 8 are)"))?;
            check_dtype(body, first.inputs.iter().flatten().copied(), y_ty)?;
            let geom = window_geom((xd, yd), k, (strides, pads, dilations), *auto_pad)?;
            window(WindowOp::LpPool { p }, geom, None, steps, const_rows)
        }
        Op::GlobalPool { kind, .. } => {
            let op = match kind {
                PoolKind::Average => WindowOp::GlobalAverage,
                PoolKind::Max => WindowOp::GlobalMax,
                PoolKind::Lp => return Err("global Lp pooling is not generated yet".into()),
            };
            check_dtype(body, first.inputs.iter().flatten().copied(), y_ty)?;
            if yd[2] != 1 || yd[3] != 1 {
                return Err("a global pool's output plane must be 1×1".into());
            }
            let geom = WindowGeom {
                c: xd[1],
                h: xd[2],
                w: xd[3],
                k: [xd[2], xd[3]],
                s: [1, 1],
                p: [0, 0],
                d: [1, 1],
                oh: 1,
                ow: 1,
            };
            window(op, geom, None, steps, const_rows)
        }
        op => Err(format!(
            "op `{}` is not a convolution or pooling",
            op.name()
        )),
    }
}

/// The largest C tile that still gives enough workgroups to fill a big GPU (an H100 has
/// 132 multiprocessors): 64×64 with at least 256 workgroups, 32×32 with at least 128,
/// else 16×16 (ResNet's 14×14 and 7×7 stages: 196 and 49 columns), with K split over the
/// workgroup when it is long (`k` = C·KH·KW of 1,024 or more).
fn conv_tile(m: u32, n: u32, k: u32) -> MatmulTile {
    let groups = |t: u32| m.div_ceil(t) as u64 * n.div_ceil(t) as u64;
    if groups(64) >= 256 {
        MatmulTile::Large
    } else if groups(32) >= 128 {
        MatmulTile::Small
    } else if k >= 1024 {
        MatmulTile::TinySliced
    } else {
        MatmulTile::Tiny
    }
}

/// Every operand of the first node has the output's element type (a kernel is generated
/// on one).
fn check_dtype(
    body: &Graph,
    values: impl Iterator<Item = ValueId>,
    y: &TensorType,
) -> Result<(), String> {
    for v in values {
        let ty = &body.value(v).ty;
        if ty.dtype != y.dtype {
            return Err(format!(
                "operand %{} is {} for a {} result; a kernel is generated on one element type",
                body.value(v).name,
                ty.dtype,
                y.dtype
            ));
        }
    }
    Ok(())
}

fn dim_u32(v: i64) -> Result<u32, String> {
    u32::try_from(v)
        .ok()
        .filter(|&x| x > 0 && x < 1 << 16)
        .ok_or_else(|| format!("window size {v} is not generated"))
}

/// `[N, C, H, W]` with C, H, W static (N is whatever; 0 stands for a symbolic batch).
fn static_nchw(ty: &TensorType, what: &str) -> Result<[u32; 4], String> {
    Elem::of(ty.dtype).map_err(|e| format!("the {what} is {e}"))?;
    if ty.rank() != 4 {
        return Err(format!("the {what} {ty} is not 4-D (NCHW)"));
    }
    let mut out = [0u32; 4];
    for (i, d) in ty.dims.iter().enumerate() {
        match d.as_known() {
            Some(v) => out[i] = u32::try_from(v).map_err(|_| format!("the {what} is too large"))?,
            None if i == 0 => {}
            None => {
                return Err(format!(
                    "the {what} {ty} has symbolic channel or spatial dims (not generated yet)"
                ))
            }
        }
    }
    let plane = out[1] as u64 * out[2] as u64 * out[3] as u64;
    if plane >= 1 << 31 {
        return Err(format!("the {what} {ty} has too many elements per image"));
    }
    Ok(out)
}

fn static_dims(ty: &TensorType, what: &str, rank: usize) -> Result<Vec<u32>, String> {
    if ty.rank() != rank {
        return Err(format!("the {what} {ty} is not {rank}-D"));
    }
    ty.dims
        .iter()
        .map(|d| {
            d.as_known()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| format!("the {what} {ty} is not static"))
        })
        .collect()
}

/// The window geometry of a conv or pool from its attributes and its static input and
/// output planes; the output size is the IR's (shape inference already applied ONNX's
/// rules), the leading pads are resolved here.
/// Whether every window of `g` lies inside the padded input (leading and trailing pads),
/// so that average pooling counting pads divides every output by the window size. Only
/// explicit pads with `ceil_mode` can leave a window hanging past the trailing pad.
fn windows_fit_padding(g: &WindowGeom, pads: &[i64], auto_pad: AutoPad) -> Result<bool, String> {
    if auto_pad != AutoPad::NotSet {
        return Ok(true);
    }
    let end = match pads {
        [] => [0, 0],
        [_, _, b, r] => [attr(*b)?, attr(*r)?],
        _ => return Err(format!("pads {pads:?} are not 2-D")),
    };
    let fits = |o: u32, s: u32, k: u32, d: u32, n: u32, pb: u32, pe: u32| {
        let last = u64::from(o.max(1) - 1) * u64::from(s) + u64::from(k - 1) * u64::from(d);
        last < u64::from(n) + u64::from(pb) + u64::from(pe)
    };
    Ok(fits(g.oh, g.s[0], g.k[0], g.d[0], g.h, g.p[0], end[0])
        && fits(g.ow, g.s[1], g.k[1], g.d[1], g.w, g.p[1], end[1]))
}

fn window_geom(
    (xd, yd): ([u32; 4], [u32; 4]),
    k: [u32; 2],
    (strides, pads, dilations): (&[i64], &[i64], &[i64]),
    auto_pad: AutoPad,
) -> Result<WindowGeom, String> {
    let per = |v: &[i64], default: i64| -> Result<[u32; 2], String> {
        match v {
            [] => Ok([default as u32; 2]),
            [a, b] => Ok([attr(*a)?, attr(*b)?]),
            _ => Err(format!("{v:?} is not 2-D")),
        }
    };
    let s = per(strides, 1)?;
    let d = per(dilations, 1)?;
    if s.contains(&0) || d.contains(&0) {
        return Err("zero stride or dilation".into());
    }
    let (h, w, oh, ow) = (xd[2], xd[3], yd[2], yd[3]);
    let p = match auto_pad {
        AutoPad::NotSet => match pads {
            [] => [0, 0],
            [t, l, _, _] => [attr(*t)?, attr(*l)?],
            _ => return Err(format!("pads {pads:?} are not 2-D")),
        },
        AutoPad::Valid => [0, 0],
        AutoPad::SameUpper | AutoPad::SameLower => {
            let lead = |n: u32, o: u32, k: u32, s: u32, d: u32| {
                let eff = (k - 1) * d + 1;
                let total = ((o.max(1) - 1) * s + eff).saturating_sub(n);
                if auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                }
            };
            [lead(h, oh, k[0], s[0], d[0]), lead(w, ow, k[1], s[1], d[1])]
        }
    };
    if xd[0] != yd[0] {
        return Err("input and output batch differ".into());
    }
    Ok(WindowGeom {
        c: xd[1],
        h,
        w,
        k,
        s,
        p,
        d,
        oh,
        ow,
    })
}

fn attr(v: i64) -> Result<u32, String> {
    u32::try_from(v)
        .ok()
        .filter(|&x| x < 1 << 16)
        .ok_or_else(|| format!("attribute value {v} is not generated"))
}
