//! 2-D max pooling and global (average or max) pooling of f32 NCHW tensors, on borrowed
//! operands, one task per group of planes; and both of an NHWC tensor whose NCHW transpose
//! the kernel's body starts with, read in place (`rafter_opt::fusion`'s "channels-last
//! pooling head", and "channels-last max pool", whose body ends by transposing the pooled
//! map back to NHWC, which the NHWC pool writes directly).

use std::sync::{Arc, Mutex};

use rafter_ir::{AutoPad, DType, Graph, Op, PoolKind, ValueId};
use rafter_kernels_cpu::{
    max_pool2d, max_pool_nhwc, MaxPool2d, MaxPoolNhwc, Parallel, WindowNhwc, WorkerPool,
};

use super::conv::{geometry, valid_range, Geom};
use super::{input_of, read_once, In, NativeKernel, Out, Par, TO_NCHW, TO_NHWC};

/// Global pools of at least this many input elements split their channels over the threads.
const GLOBAL_PAR_ELEMS: usize = 1 << 16;

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
    /// The input is NHWC (the pool after its NCHW transpose, fused; a max pool's result is
    /// NHWC too).
    nhwc: bool,
    par: Par,
}

/// The first result of `n`.
fn first_out(n: &rafter_ir::Node) -> Option<ValueId> {
    n.outputs.first().copied().flatten()
}

/// Whether `b` transposes by `perm` the first result of `a`, which nothing else in `body`
/// reads.
fn transposed(body: &Graph, a: &rafter_ir::Node, b: &rafter_ir::Node, perm: [i64; 4]) -> bool {
    let Some(v) = first_out(a) else {
        return false;
    };
    matches!(&b.op, Op::Transpose { perm: p } if p.as_slice() == perm)
        && b.input(0) == Some(v)
        && read_once(body, v)
}

/// Whether `t` transposes NHWC to NCHW the value pool `node` reads, and nothing else does.
fn reads_transposed(body: &Graph, t: &rafter_ir::Node, node: &rafter_ir::Node) -> bool {
    let Some(v) = first_out(t) else {
        return false;
    };
    matches!(&t.op, Op::Transpose { perm } if perm.as_slice() == TO_NCHW)
        && node.input(0) == Some(v)
        && read_once(body, v)
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    // (the node reading the body's input, the pool, the node writing the body's output)
    let (first, node, last, nhwc) = match body.nodes.as_slice() {
        [node] => (node, node, node, false),
        [t, node] if reads_transposed(body, t, node) => (t, node, node, true),
        [t, node, back]
            if reads_transposed(body, t, node) && transposed(body, node, back, TO_NHWC) =>
        {
            (t, node, back, true)
        }
        _ => return None,
    };
    if input_of(body, *first.inputs.first()?, DType::F32) != Some(0)
        || body.inputs.len() != 1
        || node.outputs.iter().skip(1).any(Option::is_some)
        || body.outputs.len() != 1
        || body.outputs.first().copied() != first_out(last)
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
    // An NHWC max pool writes NHWC: its body must transpose the result back.
    if nhwc && matches!(kind, Kind::Max { .. }) != matches!(last.op, Op::Transpose { .. }) {
        return None;
    }
    Some(Arc::new(PoolKernel {
        kind,
        nhwc,
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
        if self.nhwc {
            return match &self.kind {
                Kind::Max { .. } => self.max_nhwc(x, &mut outs[0]),
                Kind::GlobalAverage | Kind::GlobalMax => self.global_nhwc(x, &mut outs[0]),
            };
        }
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
            Kind::Max { .. } => {
                let Some(geo) = self.max_geometry([h, w]) else {
                    return Ok(false);
                };
                let [kh, kw] = geo.k;
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

impl PoolKernel {
    /// The window of a 2-D max pool over `[h, w]` maps; `None` for another kind or an
    /// unsupported window (the reference path runs it).
    fn max_geometry(&self, in_sp: [usize; 2]) -> Option<Geom> {
        let Kind::Max {
            kernel_shape,
            strides,
            pads,
            dilations,
            auto_pad,
            ceil_mode,
        } = &self.kind
        else {
            return None;
        };
        let &[kh, kw] = kernel_shape.as_slice() else {
            return None;
        };
        let k = [usize::try_from(kh).ok()?, usize::try_from(kw).ok()?];
        geometry(in_sp, k, strides, pads, dilations, *auto_pad, *ceil_mode)
    }

    /// A 2-D max pool of NHWC `x` (`[n, h, w, c]`) into NHWC `[n, oh, ow, c]`.
    fn max_nhwc(&self, x: &In<'_>, out: &mut Out<'_>) -> Result<bool, String> {
        let &[n, h, w, c] = x.dims.as_slice() else {
            return Ok(false);
        };
        let Some(geo) = self.max_geometry([h, w]).filter(|g| g.d == [1, 1]) else {
            return Ok(false);
        };
        let [oh, ow] = geo.out;
        if out.dims != [n, oh, ow, c] {
            return Ok(false);
        }
        let pool = MaxPoolNhwc {
            window: WindowNhwc {
                input: x.f32s()?,
                h,
                w,
                channels: c,
                kernel: geo.k,
                stride: geo.s,
                pads: geo.pb,
                out: geo.out,
            },
        };
        max_pool_nhwc(&pool, out.f32s()?, &*self.par).map_err(|e| format!("max pool: {e}"))?;
        Ok(true)
    }

    /// A global pool of NHWC `x` (`[n, h, w, c]`) into `[n, c, 1, 1]`: per image, the
    /// pixels' channel rows summed (or maxed) into one row, in pixel order as the NCHW
    /// path sums a plane; channels split over the threads for large maps.
    fn global_nhwc(&self, x: &In<'_>, out: &mut Out<'_>) -> Result<bool, String> {
        let &[n, h, w, c] = x.dims.as_slice() else {
            return Ok(false);
        };
        let pin = h * w;
        if out.dims != [n, c, 1, 1] || pin == 0 {
            return Ok(false);
        }
        let xs = x.f32s()?;
        let y = out.f32s()?;
        let avg = matches!(self.kind, Kind::GlobalAverage);
        let parts = if n * pin * c >= GLOBAL_PAR_ELEMS {
            self.par.threads().min(c.div_ceil(16))
        } else {
            1
        };
        // Output channel ranges, multiples of 16 wide (whole cache lines of a pixel's row).
        let per = c.div_ceil(parts).div_ceil(16) * 16;
        for (img, yi) in y.chunks_exact_mut(c).enumerate() {
            let plane = &xs[img * pin * c..(img + 1) * pin * c];
            let chunks: Vec<Mutex<&mut [f32]>> = yi.chunks_mut(per).map(Mutex::new).collect();
            self.par.run(chunks.len(), &|t| {
                let mut acc = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
                let c0 = t * per;
                acc.fill(if avg { 0.0 } else { f32::NEG_INFINITY });
                for px in 0..pin {
                    let row = &plane[px * c + c0..px * c + c0 + acc.len()];
                    if avg {
                        acc.iter_mut().zip(row).for_each(|(a, &v)| *a += v);
                    } else {
                        acc.iter_mut().zip(row).for_each(|(a, &v)| *a = a.max(v));
                    }
                }
                if avg {
                    acc.iter_mut().for_each(|a| *a /= pin as f32);
                }
            });
        }
        Ok(true)
    }
}
