//! Weights pre-packed at compile time into the CPU GEMM's B layout.
//!
//! A CPU matmul kernel packs its B operand into 16-column panels before the micro-kernels
//! can read it. When B is a weight, that packing is the same on every call: for BERT-base
//! it was a copy of 340 MB of weights per inference. [`prepack_weights`] does it once, here,
//! and the artifact stores the weight *only* in packed form:
//!
//! - the weight becomes an ordinary f32 constant of shape `[ceil(N/16), K, 16]` (panel `q`
//!   holds columns `16q..16q+16` of the `K x N` B as a row-major `K x 16` block, zero-padded
//!   past N; `rafter_kernels_cpu::PackedB::panels`), and its buffer takes that type;
//! - the kernel body reads it through an explicit unpacking prologue,
//!   `transpose[1, 0, 2] → reshape [K, 16·ceil(N/16)] (→ slice [.., 0..N])`, and its
//!   `matmul`/`gemm` takes the unpacked `[K, N]` (a `gemm` with `trans_b` is rewritten to
//!   `trans_b = false`: the transpose is folded into the packing).
//!
//! The program therefore still *means* the same product, in the IR's own ops: the reference
//! executor, a fallback for shapes the native kernel does not cover, `rafter plan` and an
//! older runtime all run the body as written (unpacking on demand, per call), while the
//! native CPU matmul recognises the prologue and hands the weight's bytes, in place in the
//! artifact's map, to the GEMM as `BRef::Packed`: no packing at run time and no second copy
//! of the weight in the file or in memory. The artifact container is unchanged (a packed
//! weight is a weight like any other, 64-byte aligned, so the panels are too).
//!
//! A weight is packed only when every read of it is such a B operand: the step is a
//! dispatch of a `cpu` kernel (dispatched by that one step) whose first node is a 2-D
//! `matmul`, a `gemm` or an ungrouped `conv_nhwc` (whose `[kh, kw, C, M]` weight is the B
//! `[kh·kw·C, M]`; its prologue ends with a `reshape` back to 4-D), the weight is its B and
//! nothing else in the body reads that operand. In a channels-last depthwise block
//! (`crate::fusion`) the later 1×1 convolutions' weights are packed too: their prologues
//! also go at the body's start, and the runtime's block kernel reads every 1×1 weight
//! packed (packing MobileNetV2's projections on every call had cost ~4% of its latency:
//! `rafter bench --threads 2 --iters 400`, 5 alternated runs, median 2.348 → 2.250 ms).
//! Any other reader (a copy, a Vulkan replica, a gather of tied embeddings, an A operand)
//! keeps the weight raw. [`crate::compile`] runs this for the CPU target only: for
//! `--target vulkan`, `rafter plan` explains why a kernel stayed on the CPU from its body,
//! which must remain the body placement judged.

use bytes::Bytes;
use rafter_ir::program::{BlockConv, Program, Step, Storage};
use rafter_ir::{ConstData, DType, Graph, Op, TensorType, ValueDef, ValueId};
use rafter_kernels_cpu::{HalfKind, MatRef, PackedB, PackedHalfB, PACKED_B_NR};

use crate::backend::CPU;

/// One kernel that reads a weight as its B operand.
struct Use {
    kernel: usize,
    /// The body input that is B.
    input: usize,
}

/// How pre-packed matrix-product weights are stored (`rafter compile --cpu-weights`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightFormat {
    /// As the model has them: the program means exactly the model.
    #[default]
    F32,
    /// IEEE half precision: half the bytes, ~3 significant digits (`rafter_kernels_cpu::
    /// gemm_half` widens them in registers). Only `matmul`/`gemm` weights; convolutions'
    /// stay f32.
    F16,
    /// bfloat16: f32's range, ~2-3 significant digits, half the bytes.
    Bf16,
}

impl WeightFormat {
    /// The 16-bit kind, `None` for f32.
    fn half(self) -> Option<HalfKind> {
        match self {
            WeightFormat::F32 => None,
            WeightFormat::F16 => Some(HalfKind::F16),
            WeightFormat::Bf16 => Some(HalfKind::Bf16),
        }
    }
}

/// Packs every weight whose readers are all CPU `matmul`/`gemm` kernels taking it as B (see
/// the module docs), rewriting the weight, its buffers and those kernels' bodies. Returns
/// how many weights it packed. The program's meaning is unchanged.
pub fn prepack_weights(p: &mut Program) -> usize {
    prepack_weights_as(p, WeightFormat::F32)
}

/// [`prepack_weights`], storing the weights of 2-D products (`matmul`, `gemm`) in
/// `format`: with a 16-bit format the program's products then use the weights rounded to
/// it, which is the point (half the bytes to stream per call, for memory-bound decoding);
/// the bodies widen them back to f32 by a `cast` before unpacking, so the reference
/// executor computes the same rounded product the native kernels do.
pub fn prepack_weights_as(p: &mut Program, format: WeightFormat) -> usize {
    let mut dispatches = vec![0usize; p.kernels.len()];
    for s in &p.steps {
        if let Step::Dispatch { kernel, .. } = s {
            if let Some(d) = dispatches.get_mut(*kernel) {
                *d += 1;
            }
        }
    }
    let mut packed = 0;
    for w in 0..p.weights.len() {
        let Some((uses, trans)) = packed_uses(p, w, &dispatches) else {
            continue;
        };
        let raw = &p.weights[w];
        // A conv_nhwc weight [kh, kw, C, M] is the row-major B [kh·kw·C, M].
        let dims = raw.dims.clone();
        let (rows, cols) = match dims.as_slice() {
            &[kh, kw, c, m] => (kh * kw * c, m),
            d => (d[0], d[1]),
        };
        let (k, n) = if trans { (cols, rows) } else { (rows, cols) };
        let values: Vec<f32> = raw
            .bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let Ok(mut m) = MatRef::row_major(&values, rows, cols, cols) else {
            continue;
        };
        if trans {
            m = m.t();
        }
        // 16-bit storage only for 2-D products' weights (see `WeightFormat`).
        let half = format.half().filter(|_| dims.len() == 2);
        let (dtype, bytes): (DType, Vec<u8>) = match half {
            None => {
                let panels = PackedB::pack_mat(m);
                let bytes = panels.panels().iter().flat_map(|x| x.to_le_bytes());
                (DType::F32, bytes.collect())
            }
            Some(kind) => {
                let panels = PackedHalfB::pack_mat(kind, m);
                let bytes = panels.panels().iter().flat_map(|x| x.to_le_bytes());
                let dtype = match kind {
                    HalfKind::F16 => DType::F16,
                    HalfKind::Bf16 => DType::BF16,
                };
                (dtype, bytes.collect())
            }
        };
        let np = n.div_ceil(PACKED_B_NR);
        let Ok(data) = ConstData::new(dtype, vec![np, k, PACKED_B_NR], Bytes::from(bytes)) else {
            continue;
        };
        let ty = TensorType::known(dtype, &[np as i64, k as i64, PACKED_B_NR as i64]);
        p.weights[w] = data;
        for b in &mut p.buffers {
            if b.storage == Storage::Weight(w) {
                b.ty = ty.clone();
            }
        }
        for u in uses {
            let body = &p.kernels[u.kernel].body;
            p.kernels[u.kernel].body = with_unpacking(body, u.input, &ty, k, n, &dims);
        }
        packed += 1;
    }
    packed
}

/// The kernels reading weight `w` as B, and whether they read it transposed (`gemm` with
/// `trans_b`), when every read of `w` is one; `None` otherwise.
fn packed_uses(p: &Program, w: usize, dispatches: &[usize]) -> Option<(Vec<Use>, bool)> {
    let raw = &p.weights[w];
    if raw.dtype != DType::F32 || !matches!(raw.dims.len(), 2 | 4) || raw.dims.contains(&0) {
        return None;
    }
    let mut uses = Vec::new();
    let mut trans = None;
    for s in &p.steps {
        let reads_w = |b: &usize| p.buffers[*b].storage == Storage::Weight(w);
        let (kernel, args) = match s {
            Step::Copy { src, .. } if reads_w(src) => return None,
            Step::Copy { .. } => continue,
            Step::Dispatch { kernel, args, .. } => (*kernel, args),
        };
        let positions: Vec<usize> = (0..args.len()).filter(|&i| reads_w(&args[i])).collect();
        match positions.as_slice() {
            [] => continue,
            [i] => {
                let t = b_operand(p, kernel, *i, raw.dims.len())?;
                if dispatches[kernel] != 1 || *trans.get_or_insert(t) != t {
                    return None;
                }
                uses.push(Use { kernel, input: *i });
            }
            _ => return None,
        }
    }
    Some((uses, trans?))
}

/// `Some(trans_b)` when body input `i` of CPU kernel `k` is only the B operand of the
/// body's first node: a 2-D f32 `matmul` or a `gemm` (`rank` 2), or an ungrouped
/// `conv_nhwc`, whose `[kh, kw, C, M]` weight is the B `[kh·kw·C, M]` (`rank` 4).
fn b_operand(p: &Program, k: usize, i: usize, rank: usize) -> Option<bool> {
    let kernel = &p.kernels[k];
    if kernel.device != CPU {
        return None;
    }
    let body = &kernel.body;
    let v = *body.inputs.get(i)?;
    let first = body.nodes.first()?;
    if first.input(1) != Some(v) {
        return block_pointwise_weight(body, v, rank);
    }
    let a = first.input(0)?;
    if body.value(a).ty.dtype != DType::F32 {
        return None;
    }
    let reads = body
        .nodes
        .iter()
        .flat_map(|n| &n.inputs)
        .filter(|&&x| x == Some(v))
        .count();
    if reads != 1 || body.outputs.contains(&v) {
        return None;
    }
    match (&first.op, rank) {
        (Op::MatMul, 2) if first.inputs.len() == 2 => Some(false),
        (Op::Gemm { trans_b, .. }, 2) => Some(*trans_b),
        // A convolution of few input channels runs directly on the raw weight.
        (Op::ConvNhwc { group: 1, .. }, 4)
            if body.value(v).ty.dims[2]
                .as_known()
                .is_some_and(|c| c > crate::layout::SMALL_CONV_MAX_CIN) =>
        {
            Some(false)
        }
        _ => None,
    }
}

/// `Some(false)` when body input `v` is the weight of a later 1×1 convolution of a
/// channels-last depthwise block (`crate::fusion`: two or three `conv_nhwc` in one body),
/// read by it alone: the CPU runtime's block kernel takes every 1×1 weight pre-packed
/// (unpacked by prologues at the body's start), where a raw one was packed on every call.
fn block_pointwise_weight(body: &Graph, v: ValueId, rank: usize) -> Option<bool> {
    let convs = body
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::ConvNhwc { .. }))
        .count();
    if rank != 4 || convs < 2 || body.outputs.contains(&v) {
        return None;
    }
    let mut readers = body.nodes.iter().filter(|n| n.inputs.contains(&Some(v)));
    let node = readers.next()?;
    if readers.next().is_some()
        || node.input(1) != Some(v)
        || node.inputs.iter().filter(|&&x| x == Some(v)).count() != 1
    {
        return None;
    }
    let a = node.input(0)?;
    let dims: Option<Vec<i64>> = body.value(v).ty.dims.iter().map(|d| d.as_known()).collect();
    let stage = BlockConv::of(&node.op, dims?.try_into().ok()?)?;
    (stage == BlockConv::Pointwise && body.value(a).ty.dtype == DType::F32).then_some(false)
}

/// `body` with input `b` of type `packed` (`[ceil(n/16), k, 16]`) unpacked to `[k, n]` by a
/// prologue before the first node, which reads the unpacked value (untransposed), reshaped
/// back to the weight's own `dims` when they are a conv's 4-D weight.
fn with_unpacking(
    body: &Graph,
    b: usize,
    packed: &TensorType,
    k: usize,
    n: usize,
    dims: &[usize],
) -> Graph {
    let mut g = Graph::new(body.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; body.values.len()];
    let old_b = body.inputs[b];
    for (i, &v) in body.inputs.iter().enumerate() {
        let val = body.value(v);
        let ty = if i == b {
            packed.clone()
        } else {
            val.ty.clone()
        };
        let new = g.add_input(val.name.clone(), ty);
        map[v.0 as usize] = Some(new);
    }
    for (i, val) in body.values.iter().enumerate() {
        if let ValueDef::Const(c) = val.def {
            map[i] = Some(g.add_const(val.name.clone(), body.constant(c).clone()));
        }
    }
    let mut x = map[old_b.0 as usize].expect("mapped above");
    let name = body.value(old_b).name.clone();
    let np = n.div_ceil(PACKED_B_NR);
    let f32s = |dims: &[usize]| {
        let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        TensorType::known(DType::F32, &d)
    };
    if packed.dtype != DType::F32 {
        // 16-bit panels are widened first: the rest of the prologue is the f32 one.
        x = g.add_node(
            format!("{name}.unpack_widen"),
            Op::Cast { to: DType::F32 },
            vec![Some(x)],
            vec![Some((
                format!("{name}.panels_f32"),
                f32s(&[np, k, PACKED_B_NR]),
            ))],
        )[0]
        .expect("one output");
    }
    let t = g.add_node(
        format!("{name}.unpack_transpose"),
        Op::Transpose {
            perm: vec![1, 0, 2],
        },
        vec![Some(x)],
        vec![Some((
            format!("{name}.panels_by_row"),
            f32s(&[k, np, PACKED_B_NR]),
        ))],
    )[0];
    let shape = g.add_const(
        format!("{name}.unpacked_shape"),
        ConstData::from_i64s(&[k as i64, (np * PACKED_B_NR) as i64]),
    );
    let mut unpacked = g.add_node(
        format!("{name}.unpack_reshape"),
        Op::Reshape { allow_zero: false },
        vec![t, Some(shape)],
        vec![Some((
            format!("{name}.unpacked_padded"),
            f32s(&[k, np * PACKED_B_NR]),
        ))],
    )[0];
    if np * PACKED_B_NR != n {
        let c = |g: &mut Graph, what: &str, v: i64| {
            Some(g.add_const(format!("{name}.unpack_{what}"), ConstData::from_i64s(&[v])))
        };
        let (starts, ends, axes) = (
            c(&mut g, "start", 0),
            c(&mut g, "end", n as i64),
            c(&mut g, "axis", 1),
        );
        unpacked = g.add_node(
            format!("{name}.unpack_slice"),
            Op::Slice,
            vec![unpacked, starts, ends, axes],
            vec![Some((format!("{name}.unpacked"), f32s(&[k, n])))],
        )[0];
    }
    if dims.len() == 4 {
        let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let shape = g.add_const(format!("{name}.weight_shape"), ConstData::from_i64s(&shape));
        unpacked = g.add_node(
            format!("{name}.unpack_weight"),
            Op::Reshape { allow_zero: false },
            vec![unpacked, Some(shape)],
            vec![Some((format!("{name}.unpacked_weight"), f32s(dims)))],
        )[0];
    }
    map[old_b.0 as usize] = unpacked;
    for (ni, node) in body.nodes.iter().enumerate() {
        let inputs = node
            .inputs
            .iter()
            .map(|v| v.map(|v| map[v.0 as usize].expect("defined before use")))
            .collect();
        let op = match &node.op {
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                ..
            } if ni == 0 => Op::Gemm {
                alpha: *alpha,
                beta: *beta,
                trans_a: *trans_a,
                trans_b: false,
            },
            op => op.clone(),
        };
        let outputs = node
            .outputs
            .iter()
            .map(|o| o.map(|o| (body.value(o).name.clone(), body.value(o).ty.clone())))
            .collect();
        let outs = g.add_node(node.name.clone(), op, inputs, outputs);
        for (old, new) in node.outputs.iter().zip(outs) {
            if let (Some(old), Some(new)) = (old, new) {
                map[old.0 as usize] = Some(new);
            }
        }
    }
    g.outputs = body
        .outputs
        .iter()
        .map(|v| map[v.0 as usize].expect("every output is defined"))
        .collect();
    g
}
