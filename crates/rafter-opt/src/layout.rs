//! Channels-last activations for the CPU convolutions.
//!
//! ONNX convolutions are NCHW: a pixel's channels lie `H·W` floats apart. rafter's CPU
//! convolution kernels want them contiguous (NHWC): a 1×1 convolution is then a plain GEMM,
//! `Y[pixels, M] = X[pixels, C] · W[C, M]`, that reads the activations in place with the
//! weights as its pre-packed B ([`crate::prepack`]); a k×k one packs rows of `k·k·C`
//! contiguous runs; a depthwise one vectorises over channels. In NCHW the activations must
//! be packed on every call: ResNet-50's 1×1 convolutions took 0.68–0.93× the NCHW time
//! channels-last even hot in cache (`cargo bench -p rafter-kernels-cpu --bench
//! conv_layout`), and the whole model 50.9–57.9 → 37.6–37.8 ms (`rafter bench resnet50.rfa
//! --threads 2`, builds alternated; `benchmarks/RESULTS.md`, "Channels-last CPU
//! convolutions").
//!
//! [`channels_last`] rewrites every covered `conv` into `conv_nhwc` (its weight permuted at
//! compile time from `[M, C/g, kh, kw]` to `[kh, kw, C/g, M]`) and lets the layout flow: one
//! pass over the nodes in order keeps, per value, the form(s) it exists in, NCHW (the
//! graph's) or NHWC (`<name>.nhwc`), and
//! - an elementwise node whose operands are all of its result's shape, single elements or
//!   per-channel constants (`[C, 1, 1]`, re-laid out as `[1, 1, 1, C]`) runs in NHWC when
//!   one of its operands exists only in NHWC, so biases, ReLUs and residual adds between
//!   convolutions stay channels-last;
//! - every other node reads NCHW, as the graph has it;
//! - a missing form is made by one `transpose` where it is first needed and then reused.
//!
//! So a CNN body becomes NHWC from its first covered convolution to its pooling head with one
//! transpose at each end; the graph's inputs and outputs keep their layout and names. The
//! pass runs for the CPU target only (the SPIR-V generator has no `conv_nhwc`).

use std::collections::HashMap;

use rafter_ir::{ConstData, DType, Dim, Graph, Op, TensorType, ValueDef, ValueId};

use crate::util::is_control_flow;

/// NCHW → NHWC.
pub const TO_NHWC: [i64; 4] = [0, 2, 3, 1];
/// NHWC → NCHW.
pub const TO_NCHW: [i64; 4] = [0, 3, 1, 2];

/// `conv_nhwc`s of at most this many input channels (an RGB stem) keep their weight raw,
/// not pre-packed: the CPU runtime computes them directly
/// (`rafter_kernels_cpu::small_conv_nhwc`), not as a GEMM. ResNet-50's 7×7 stride-2 stem
/// went channels-last too once that kernel matched the NCHW stem kernel's speed (1001–1156
/// against 1063–1186 µs over eight runs of `cargo bench -p rafter-kernels-cpu --bench
/// cnn_layers`, the two kernels in each run): its max pool then runs on the NHWC map, with
/// no transposes around it (see `crate::fusion`).
pub use rafter_ir::program::SMALL_CONV_MAX_CIN;

/// The forms a value of the input graph exists in, in the graph being built.
#[derive(Clone, Copy, Default)]
struct Forms {
    nchw: Option<ValueId>,
    nhwc: Option<ValueId>,
}

/// Rewrites the graph's covered convolutions to channels-last (see the module docs).
/// Returns whether anything changed. Graphs with control flow are left alone (their bodies
/// may capture outer values by name).
pub fn channels_last(g: &mut Graph) -> bool {
    if g.nodes.iter().any(|n| is_control_flow(&n.op)) {
        return false;
    }
    if !g.nodes.iter().any(|n| nhwc_conv(g, n).is_some()) {
        return false;
    }
    let mut b = Builder {
        src: g,
        dst: Graph::new(g.name.clone()),
        forms: vec![Forms::default(); g.values.len()],
        relaid: HashMap::new(),
    };
    for &v in &g.inputs {
        let val = g.value(v);
        let new = b.dst.add_input(val.name.clone(), val.ty.clone());
        b.forms[v.0 as usize].nchw = Some(new);
    }
    for node in &g.nodes {
        b.node(node);
    }
    let outputs: Vec<ValueId> = g.outputs.iter().map(|&v| b.nchw(v)).collect();
    let mut dst = b.dst;
    dst.outputs = outputs;
    *g = dst;
    true
}

/// The dims `[M, C/g, kh, kw]` of the conv's weight when the conv is one the CPU's NHWC
/// kernels cover: 2-D, f32, a constant weight, no dilation, ungrouped or depthwise.
fn nhwc_conv(g: &Graph, n: &rafter_ir::Node) -> Option<[usize; 4]> {
    let Op::Conv {
        dilations, group, ..
    } = &n.op
    else {
        return None;
    };
    let (x, w) = (g.value(n.input(0)?), n.input(1)?);
    let wc = g.const_of(w)?;
    if x.ty.dtype != DType::F32 || x.ty.rank() != 4 || wc.dtype != DType::F32 {
        return None;
    }
    if wc.dims.len() != 4 || !dilations.iter().all(|&d| d == 1) || n.outputs.len() != 1 {
        return None;
    }
    let [m, cg, kh, kw] = [wc.dims[0], wc.dims[1], wc.dims[2], wc.dims[3]];
    let c = x.ty.dims[1].as_known()?;
    let depthwise = cg == 1 && *group == c && m as i64 == c;
    if !(*group == 1 && cg as i64 == c || depthwise) {
        return None;
    }
    Some([m, cg, kh, kw])
}

/// An `[M, I, kh, kw]` f32 weight permuted to `[kh, kw, I, M]`.
fn hwio(w: &ConstData, [m, i, kh, kw]: [usize; 4]) -> ConstData {
    let src: Vec<f32> = w
        .bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut dst = vec![0f32; src.len()];
    for o in 0..m {
        for ci in 0..i {
            for t in 0..kh * kw {
                dst[(t * i + ci) * m + o] = src[(o * i + ci) * kh * kw + t];
            }
        }
    }
    let bytes: Vec<u8> = dst.iter().flat_map(|x| x.to_le_bytes()).collect();
    ConstData::new(DType::F32, vec![kh, kw, i, m], bytes.into())
        .expect("same element count as the source weight")
}

fn permuted(ty: &TensorType, perm: &[i64; 4]) -> TensorType {
    let dims: Vec<Dim> = perm.iter().map(|&p| ty.dims[p as usize].clone()).collect();
    TensorType::new(ty.dtype, dims)
}

struct Builder<'a> {
    src: &'a Graph,
    dst: Graph,
    forms: Vec<Forms>,
    /// Re-laid-out constants (a permuted weight, a per-channel constant) by source value,
    /// made once however many nodes read them.
    relaid: HashMap<ValueId, ValueId>,
}

impl Builder<'_> {
    /// The NCHW form of source value `v`, transposing its NHWC form on first need.
    fn nchw(&mut self, v: ValueId) -> ValueId {
        let f = self.form(v);
        if let Some(x) = f.nchw {
            return x;
        }
        let nhwc = f.nhwc.expect("every value has a form once defined");
        let val = self.src.value(v);
        let out = self.transpose(nhwc, &TO_NCHW, val.name.clone(), val.ty.clone());
        self.forms[v.0 as usize].nchw = Some(out);
        out
    }

    /// The NHWC form of 4-D source value `v`, transposing its NCHW form on first need.
    fn nhwc(&mut self, v: ValueId) -> ValueId {
        let f = self.form(v);
        if let Some(x) = f.nhwc {
            return x;
        }
        let nchw = f.nchw.expect("every value has a form once defined");
        let val = self.src.value(v);
        let ty = permuted(&val.ty, &TO_NHWC);
        let out = self.transpose(nchw, &TO_NHWC, format!("{}.nhwc", val.name), ty);
        self.forms[v.0 as usize].nhwc = Some(out);
        out
    }

    /// The forms of `v`, adding a constant to the new graph on its first use.
    fn form(&mut self, v: ValueId) -> Forms {
        let f = self.forms[v.0 as usize];
        if f.nchw.is_some() || f.nhwc.is_some() {
            return f;
        }
        let val = self.src.value(v);
        let ValueDef::Const(c) = val.def else {
            panic!("value {} used before its definition", val.name);
        };
        let new = self
            .dst
            .add_const(val.name.clone(), self.src.constant(c).clone());
        self.forms[v.0 as usize].nchw = Some(new);
        self.forms[v.0 as usize]
    }

    /// Constant `data`, source value `v` re-laid out, named `<v's name>.<suffix>`: added on
    /// first use, then shared.
    fn relaid(
        &mut self,
        v: ValueId,
        suffix: &str,
        data: impl FnOnce(&ConstData) -> ConstData,
    ) -> ValueId {
        if let Some(&c) = self.relaid.get(&v) {
            return c;
        }
        let src = self
            .src
            .const_of(v)
            .expect("only constants are re-laid out");
        let name = format!("{}.{suffix}", self.src.value(v).name);
        let c = self.dst.add_const(name, data(src));
        self.relaid.insert(v, c);
        c
    }

    fn transpose(&mut self, x: ValueId, perm: &[i64; 4], name: String, ty: TensorType) -> ValueId {
        self.dst.add_node(
            format!("{name}.transpose"),
            Op::Transpose {
                perm: perm.to_vec(),
            },
            vec![Some(x)],
            vec![Some((name, ty))],
        )[0]
        .expect("one result")
    }

    fn node(&mut self, n: &rafter_ir::Node) {
        if let Some(w) = nhwc_conv(self.src, n) {
            return self.conv(n, w);
        }
        if self.runs_nhwc(n) {
            return self.elementwise_nhwc(n);
        }
        let inputs: Vec<Option<ValueId>> =
            n.inputs.iter().map(|v| v.map(|v| self.nchw(v))).collect();
        let outputs = n
            .outputs
            .iter()
            .map(|o| o.map(|o| (self.src.value(o).name.clone(), self.src.value(o).ty.clone())))
            .collect();
        let outs = self
            .dst
            .add_node(n.name.clone(), n.op.clone(), inputs, outputs);
        for (old, new) in n.outputs.iter().zip(outs) {
            if let (Some(old), Some(new)) = (old, new) {
                self.forms[old.0 as usize].nchw = Some(new);
            }
        }
    }

    fn conv(&mut self, n: &rafter_ir::Node, w_dims: [usize; 4]) {
        let Op::Conv {
            kernel_shape,
            strides,
            pads,
            dilations,
            group,
            auto_pad,
        } = &n.op
        else {
            unreachable!("nhwc_conv matched a conv");
        };
        let x = self.nhwc(n.inputs[0].expect("a conv has x"));
        let w = self.relaid(n.inputs[1].expect("a conv has w"), "hwio", |w| {
            hwio(w, w_dims)
        });
        let bias = n.input(2).map(|b| self.nchw(b));
        let y = n.outputs[0].expect("one result");
        let val = self.src.value(y);
        let op = Op::ConvNhwc {
            kernel_shape: kernel_shape.clone(),
            strides: strides.clone(),
            pads: pads.clone(),
            dilations: dilations.clone(),
            group: *group,
            auto_pad: *auto_pad,
        };
        let out = self.dst.add_node(
            n.name.clone(),
            op,
            vec![Some(x), Some(w), bias],
            vec![Some((
                format!("{}.nhwc", val.name),
                permuted(&val.ty, &TO_NHWC),
            ))],
        )[0];
        self.forms[y.0 as usize].nhwc = out;
    }

    /// Whether elementwise node `n` is better run in NHWC: its result is 4-D, every operand
    /// is of the result's dims or a single element (so it reads the same in either layout),
    /// and some operand exists only in NHWC.
    fn runs_nhwc(&self, n: &rafter_ir::Node) -> bool {
        if rafter_ir::program::KernelKind::of(&n.op) != rafter_ir::program::KernelKind::Elementwise
        {
            return false;
        }
        let [Some(y)] = n.outputs.as_slice() else {
            return false;
        };
        let dims = &self.src.value(*y).ty.dims;
        if dims.len() != 4 {
            return false;
        }
        let one = Dim::known(1);
        let mut nhwc_only = false;
        for v in n.inputs.iter().flatten() {
            let d = &self.src.value(*v).ty.dims;
            if d.iter().all(|x| *x == one) && d.len() <= 4 {
                continue;
            }
            if d != dims {
                if self.src.const_of(*v).and_then(channel_const).is_some() {
                    continue;
                }
                return false;
            }
            let f = self.forms[v.0 as usize];
            nhwc_only |= f.nhwc.is_some() && f.nchw.is_none();
        }
        nhwc_only
    }

    fn elementwise_nhwc(&mut self, n: &rafter_ir::Node) {
        let dims = &self.src.value(n.outputs[0].expect("checked")).ty.dims;
        let inputs: Vec<Option<ValueId>> = n
            .inputs
            .iter()
            .map(|v| {
                v.map(|v| {
                    let val = self.src.value(v);
                    if &val.ty.dims == dims {
                        return self.nhwc(v);
                    }
                    match self.src.const_of(v).and_then(channel_const) {
                        Some(c) if !val.ty.dims.iter().all(|d| *d == Dim::known(1)) => {
                            self.relaid(v, "nhwc", |_| c)
                        }
                        _ => self.nchw(v),
                    }
                })
            })
            .collect();
        let y = n.outputs[0].expect("checked");
        let val = self.src.value(y);
        let out = self.dst.add_node(
            n.name.clone(),
            n.op.clone(),
            inputs,
            vec![Some((
                format!("{}.nhwc", val.name),
                permuted(&val.ty, &TO_NHWC),
            ))],
        )[0];
        self.forms[y.0 as usize].nhwc = out;
    }
}

/// A per-channel constant of an NCHW operand (`[C, 1, 1]`, `[1, C, 1, 1]`: a bias added after
/// a convolution) as the same values broadcast along NHWC's channels, `[1, 1, 1, C]`; `None`
/// for any other shape.
fn channel_const(c: &ConstData) -> Option<ConstData> {
    if c.dims.len() > 4 || c.dims.len() < 3 {
        return None;
    }
    let mut aligned = vec![1usize; 4 - c.dims.len()];
    aligned.extend(&c.dims);
    if aligned[0] != 1 || aligned[2] != 1 || aligned[3] != 1 {
        return None;
    }
    ConstData::new(c.dtype, vec![1, 1, 1, aligned[1]], c.bytes.clone()).ok()
}
