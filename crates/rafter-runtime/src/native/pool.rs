//! 2-D max pooling and global (average or max) pooling of f32 NCHW tensors, on borrowed
//! operands, one task per group of planes.

use std::sync::{Arc, Mutex};

use rafter_ir::{AutoPad, DType, Graph, Op, PoolKind};
use rafter_kernels_cpu::{max_pool2d, MaxPool2d, Parallel, WorkerPool};

use super::conv::{geometry, valid_range};
use super::{input_of, In, NativeKernel, Out, Par};

enum Kind {
    Max {
        kernel_shape: Vec<i64>,
        strides: Vec<i64>,
        pads: Vec<i64>,
        dilations: Vec<i64>,
        auto_pad: AutoPad,
        ceil_mode: bool,
    },
    GlobalAverage,
    GlobalMax,
}

struct PoolKernel {
    kind: Kind,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    let [node] = body.nodes.as_slice() else {
        return None;
    };
    if input_of(body, *node.inputs.first()?, DType::F32) != Some(0)
        || body.inputs.len() != 1
        || node.outputs.iter().skip(1).any(Option::is_some)
        || body.outputs.len() != 1
        || body.outputs.first().copied() != node.outputs[0]
    {
        return None;
    }
    let kind = match &node.op {
        Op::Pool {
            kind: PoolKind::Max,
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            ceil_mode,
            ..
        } => Kind::Max {
            kernel_shape: kernel_shape.clone(),
            strides: strides.clone(),
            pads: pads.clone(),
            dilations: dilations.clone(),
            auto_pad: *auto_pad,
            ceil_mode: *ceil_mode,
        },
        Op::GlobalPool {
            kind: PoolKind::Average,
            ..
        } => Kind::GlobalAverage,
        Op::GlobalPool {
            kind: PoolKind::Max,
            ..
        } => Kind::GlobalMax,
        _ => return None,
    };
    Some(Arc::new(PoolKernel {
        kind,
        par: par.clone(),
    }))
}

/// Runs `f(plane, out)` over `planes` planes of `pin` input and `pout` output elements.
fn per_plane(
    par: &WorkerPool,
    planes: usize,
    pout: usize,
    work: usize,
    y: &mut [f32],
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let tasks = if work < (1 << 20) {
        1
    } else {
        (par.threads() * 4).min(planes)
    };
    if tasks <= 1 || pout == 0 {
        for (i, out) in y.chunks_exact_mut(pout.max(1)).enumerate() {
            f(i, out);
        }
        return;
    }
    let per = planes.div_ceil(tasks);
    let chunks: Vec<Mutex<&mut [f32]>> = y.chunks_mut(per * pout).map(Mutex::new).collect();
    par.run(chunks.len(), &|t| {
        let mut chunk = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
        for (i, out) in chunk.chunks_exact_mut(pout).enumerate() {
            f(t * per + i, out);
        }
    });
}

impl NativeKernel for PoolKernel {
    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let x = &ins[0];
        let &[n, c, h, w] = x.dims.as_slice() else {
            return Ok(false);
        };
        let xs = x.f32s()?;
        let pin = h * w;
        match &self.kind {
            Kind::GlobalAverage | Kind::GlobalMax => {
                if outs[0].dims != [n, c, 1, 1] || pin == 0 {
                    return Ok(false);
                }
                let y = outs[0].f32s()?;
                let avg = matches!(self.kind, Kind::GlobalAverage);
                per_plane(&self.par, n * c, 1, n * c * pin, y, &|i, out| {
                    let plane = &xs[i * pin..(i + 1) * pin];
                    out[0] = if avg {
                        plane.iter().sum::<f32>() / pin as f32
                    } else {
                        plane.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                    };
                });
                Ok(true)
            }
            Kind::Max {
                kernel_shape,
                strides,
                pads,
                dilations,
                auto_pad,
                ceil_mode,
            } => {
                let &[kh, kw] = kernel_shape.as_slice() else {
                    return Ok(false);
                };
                let (Ok(kh), Ok(kw)) = (usize::try_from(kh), usize::try_from(kw)) else {
                    return Ok(false);
                };
                let Some(geo) = geometry(
                    [h, w],
                    [kh, kw],
                    strides,
                    pads,
                    dilations,
                    *auto_pad,
                    *ceil_mode,
                ) else {
                    return Ok(false);
                };
                let [oh, ow] = geo.out;
                if outs[0].dims != [n, c, oh, ow] {
                    return Ok(false);
                }
                let y = outs[0].f32s()?;
                if geo.d == [1, 1] {
                    // Vectorised, planes split over the threads.
                    let pool = MaxPool2d {
                        h,
                        w,
                        kernel: geo.k,
                        stride: geo.s,
                        pads: geo.pb,
                        out: geo.out,
                    };
                    max_pool2d(&pool, xs, y, &*self.par).map_err(|e| format!("max pool: {e}"))?;
                    return Ok(true);
                }
                let ranges: Vec<(isize, usize, usize)> = (0..kw)
                    .map(|kj| {
                        let off = (kj * geo.d[1]) as isize - geo.pb[1] as isize;
                        let (lo, hi) = valid_range(off, geo.s[1], w, ow);
                        (off, lo, hi)
                    })
                    .collect();
                let work = n * c * oh * ow * kh * kw;
                per_plane(&self.par, n * c, oh * ow, work, y, &|i, out| {
                    let plane = &xs[i * pin..(i + 1) * pin];
                    out.fill(f32::NEG_INFINITY);
                    for (o, orow) in out.chunks_exact_mut(ow).enumerate() {
                        for ki in 0..kh {
                            let ih = (o * geo.s[0] + ki * geo.d[0]) as isize - geo.pb[0] as isize;
                            if ih < 0 || ih >= h as isize {
                                continue;
                            }
                            let xrow = &plane[ih as usize * w..(ih as usize + 1) * w];
                            for &(off, lo, hi) in &ranges {
                                for (j, d) in orow[lo..hi].iter_mut().enumerate() {
                                    // Inside 0..w for lo..hi (`valid_range`).
                                    let iw = ((lo + j) * geo.s[1]) as isize + off;
                                    let v = xrow[iw as usize];
                                    // NaN propagates, as in the reference's comparisons.
                                    if v > *d || v.is_nan() {
                                        *d = v;
                                    }
                                }
                            }
                        }
                    }
                });
                Ok(true)
            }
        }
    }
}
