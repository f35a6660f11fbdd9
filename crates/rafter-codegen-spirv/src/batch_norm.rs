//! ONNX `BatchNormalization` in inference mode on f32 or f16 `[N, C, spatial...]`, the
//! channel and spatial dims static (the batch may be symbolic): `y = scale · (x - mean) /
//! sqrt(var + epsilon) + bias` per channel, in f32, as the reference's formula.
//!
//! One invocation per element, in the grid-stride loop of [`crate::grid`]; its channel is
//! `(i / spatial) % C`. The four per-channel parameters are kernel inputs, loaded at the
//! channel, or constants the compiler folded into the body (up to 64 bytes: 16 f32
//! channels), chosen by a chain of selects on the channel.

use rafter_ir::{Graph, Op, ValueDef};
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::Word;

use crate::elem::{self, Elem};
use crate::grid::{self, Element};
use crate::matmul::{build, Prelude, R};

/// GLSL.std.450 `Sqrt`.
const SQRT: u32 = 31;

/// A generated batch-norm kernel; launched like an elementwise kernel (one `u32` param,
/// the output's element count).
#[derive(Debug, Clone)]
pub struct BatchNormKernel {
    /// The SPIR-V module (entry point `main`); bindings: the body inputs, then the output.
    pub spirv: Vec<u32>,
}

/// Where a per-channel parameter comes from.
enum Param {
    /// A kernel input of `Elem`, one value per channel.
    Binding(usize, Elem),
    /// Folded constants, one per channel.
    Const(Vec<f32>),
}

struct Layout {
    elem: Elem,
    x: usize,
    channels: u32,
    spatial: u32,
    epsilon: f32,
    /// scale, bias, mean, var.
    params: [Param; 4],
    bindings: usize,
}

/// Generates a body holding one `batch_norm` of a body input, its result the body's one
/// output.
pub fn batch_norm(body: &Graph) -> Result<BatchNormKernel, String> {
    let node = grid::one_node(body, "batch_norm")?;
    let Op::BatchNorm { epsilon } = node.op else {
        return Err(format!("op `{}` is not a batch_norm", node.op.name()));
    };
    let x = grid::body_input(body, node, 0, "batch_norm data")?;
    let ty = &body.value(body.inputs[x]).ty;
    let elem = Elem::of(ty.dtype).map_err(|e| format!("batch_norm data is {e}"))?;
    if ty.rank() < 2 {
        return Err(format!("batch_norm of rank {}", ty.rank()));
    }
    let dims = grid::static_dims_from(ty, 1, "batch_norm data")?;
    let channels = grid::product_u32(&dims[..1], "batch_norm channels")?;
    let spatial = grid::product_u32(&dims[1..], "batch_norm spatial dims")?;
    if channels == 0 {
        return Err("batch_norm of no channels".into());
    }
    let param = |i: usize| -> R<Param> {
        let v = node
            .input(i)
            .ok_or(format!("batch_norm operand {i} is missing"))?;
        let value = body.value(v);
        match &value.def {
            ValueDef::Input(b) => {
                let pd = grid::static_dims(&value.ty, "batch_norm parameter")?;
                if pd != [u64::from(channels)] {
                    return Err(format!("batch_norm parameter {i} is {}, not [C]", value.ty));
                }
                let e = Elem::of(value.ty.dtype)
                    .map_err(|e| format!("batch_norm parameter {i} is {e}"))?;
                Ok(Param::Binding(*b, e))
            }
            ValueDef::Const(c) => {
                let vals: Vec<f32> = body
                    .constant(*c)
                    .to_f64s()
                    .iter()
                    .map(|&v| v as f32)
                    .collect();
                match vals.len() {
                    1 => Ok(Param::Const(vec![vals[0]; channels as usize])),
                    n if n == channels as usize => Ok(Param::Const(vals)),
                    n => Err(format!(
                        "batch_norm parameter {i} holds {n} values for {channels} channels"
                    )),
                }
            }
            _ => Err(format!(
                "batch_norm parameter {i} is computed in the kernel"
            )),
        }
    };
    let params = [param(1)?, param(2)?, param(3)?, param(4)?];
    if body.outputs.len() != 1 || node.outputs.first().copied().flatten() != Some(body.outputs[0]) {
        return Err("the batch_norm's result must be the body's one output".into());
    }
    let layout = Layout {
        elem,
        x,
        channels,
        spatial,
        epsilon,
        params,
        bindings: body.inputs.len() + 1,
    };
    let spirv = grid::module(layout.bindings, |b, t, e| element(b, t, &layout, e))?;
    Ok(BatchNormKernel { spirv })
}

/// Element `i`: its channel, the four parameters there, the formula, the store.
fn element(b: &mut Builder, t: &Prelude, l: &Layout, e: Element) -> R<()> {
    let Prelude {
        glsl,
        f32,
        u32,
        u64,
        ..
    } = *t;
    let (nc, _) = grid::div_mod(b, u32, e.i, l.spatial)?;
    let (_, c) = grid::div_mod(b, u32, nc, l.channels)?;
    let mut p = [0; 4];
    for (k, param) in l.params.iter().enumerate() {
        p[k] = param_at(b, t, param, e.addrs, c)?;
    }
    let [scale, bias, mean, var] = p;
    let i64 = build(b.u_convert(u64, None, e.i))?;
    let src = grid::element_addr(b, u64, e.addrs[l.x], i64, l.elem.bytes())?;
    let x = elem::load(b, l.elem, f32, src)?;
    let eps = b.constant_bit32(f32, l.epsilon.to_bits());
    let ve = build(b.f_add(f32, None, var, eps))?;
    let sd = build(b.ext_inst(f32, None, glsl, SQRT, [Arg::IdRef(ve)]))?;
    let centered = build(b.f_sub(f32, None, x, mean))?;
    let scaled = build(b.f_mul(f32, None, scale, centered))?;
    let q = build(b.f_div(f32, None, scaled, sd))?;
    let y = build(b.f_add(f32, None, q, bias))?;
    let dst = grid::element_addr(b, u64, e.addrs[l.bindings - 1], i64, l.elem.bytes())?;
    elem::store(b, l.elem, f32, dst, y)
}

/// A parameter's value at channel `c` (a `u32`), as an f32.
fn param_at(b: &mut Builder, t: &Prelude, p: &Param, addrs: &[Word], c: Word) -> R<Word> {
    let Prelude {
        f32,
        u32,
        u64,
        bool,
        ..
    } = *t;
    match p {
        Param::Binding(binding, elem) => {
            let c64 = build(b.u_convert(u64, None, c))?;
            let at = grid::element_addr(b, u64, addrs[*binding], c64, elem.bytes())?;
            elem::load(b, *elem, f32, at)
        }
        Param::Const(values) => {
            let mut v = b.constant_bit32(f32, values[0].to_bits());
            for (k, &value) in values.iter().enumerate().skip(1) {
                let kc = b.constant_bit32(u32, k as u32);
                let here = build(b.i_equal(bool, None, c, kc))?;
                let value = b.constant_bit32(f32, value.to_bits());
                v = build(b.select(f32, None, here, value, v))?;
            }
            Ok(v)
        }
    }
}
