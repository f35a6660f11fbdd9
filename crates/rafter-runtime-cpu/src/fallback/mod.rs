//! The tensor path: kernel bodies run on owned tensors, for everything the native kernels
//! do not cover.
//!
//! Operands are decoded into the reference executor's tensors, the body runs, and results
//! are encoded back (see [`crate::dispatch`]). By default the reference executor runs the
//! body; three body shapes have faster tensor kernels that compute exactly what it does
//! (up to summation order), chosen once when the session is built:
//!
//! - [`gemm_first`]: a body starting with an f32 `matmul` (the packed GEMM, then the rest
//!   of the body on the reference executor);
//! - [`single_op`]: one f32 transpose or layer norm;
//! - [`crate::elementwise_tile::tile_kernel`]: an f32 elementwise body as a tile program.
//!
//! A caller's own kernel ([`rafter_runtime::SessionOptions::host_kernel`]) takes the place
//! of all of these for its kernel.

pub(crate) mod gemm_first;
pub(crate) mod single_op;

use std::sync::Arc;

use rafter_hal_cpu::DispatchContext;
use rafter_ir::Graph;
use rafter_reference::{run_with, Tensor};
use rafter_runtime::host::{lock, Slots};
use rafter_runtime::HostKernel;

use crate::convert::{from_reference, to_reference};
use crate::dispatch::{eval_dims, store_slot, write_binding, KernelShared, Operand, Params};
use crate::native::Par;

/// A kernel on the tensor path: the body's inputs in, its outputs out, as reference tensors
/// (checked against the body's types by the caller).
pub(crate) type TensorKernel = Arc<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>, String> + Send + Sync>;

/// The fastest tensor kernel for `body`, if one covers it (else the reference executor
/// runs it), running parallel work on `par`.
pub(crate) fn select(body: &Graph, par: &Par) -> Option<TensorKernel> {
    gemm_first::matmul_kernel(body, par)
        .or_else(|| single_op::single_op_kernel(body))
        .or_else(|| crate::elementwise_tile::tile_kernel(body, par))
}

/// A caller's host kernel, on the runtime's tensors, as a tensor kernel.
pub(crate) fn host(f: HostKernel) -> TensorKernel {
    Arc::new(move |ins: &[Tensor]| {
        let ins = ins
            .iter()
            .map(from_reference)
            .collect::<Result<Vec<_>, _>>()?;
        f(&ins)?.iter().map(to_reference).collect()
    })
}

impl KernelShared {
    /// Runs kernel `k` on the tensor path: operands decoded into owned tensors (each read
    /// view dropped at once), the body run by its tensor kernel or the reference executor
    /// (which checks every result against the body's types), results encoded into their
    /// bindings or slots only after the body has returned.
    pub(crate) fn run_tensor_path(
        &self,
        k: usize,
        ctx: &DispatchContext<'_>,
        params: &Params,
    ) -> Result<(), String> {
        let body = &self.program.kernels[k].body;
        let (n_in, n_out) = (body.inputs.len(), body.outputs.len());
        let mut bindings = self.bindings(params)?;
        let map = bindings.as_map();
        let mut slots: Option<Slots> = None;
        let mut slots = |call: u64| -> Result<Slots, String> {
            if slots.is_none() {
                slots = Some(self.registry.slots(call)?);
            }
            Ok(slots.clone().expect("just set"))
        };
        let mut inputs = Vec::with_capacity(n_in);
        for (&id, &operand) in body.inputs.iter().zip(&params.operands) {
            let v = body.value(id);
            let what = |msg: String| format!("operand `{}`: {msg}", v.name);
            let t = match operand {
                Operand::Binding(b) => {
                    let dims = eval_dims(&v.ty, &map).map_err(what)?;
                    let view = ctx.read(b).map_err(what)?;
                    Tensor::from_le_bytes(v.ty.dtype, &dims, &view)
                        .map_err(|e| what(e.to_string()))?
                }
                Operand::Weight(w) => {
                    // Decoded straight from the weight's bytes (the artifact's map).
                    let c = self.weight(w).map_err(what)?;
                    Tensor::from_le_bytes(c.dtype, &c.dims, &c.bytes)
                        .map_err(|e| what(e.to_string()))?
                }
                Operand::Slot(b) => lock(&*slots(params.call)?)
                    .get(b)
                    .and_then(Option::as_ref)
                    .map(to_reference)
                    .ok_or_else(|| what(format!("host slot {b} has not been written")))?
                    .map_err(what)?,
                Operand::Absent | Operand::Foreign(_) => {
                    return Err(what("no CPU buffer is bound".into()))
                }
            };
            inputs.push(t);
        }
        let outputs = match &self.tensor_kernels[k] {
            Some(f) => {
                let outputs = f(&inputs)?;
                if outputs.len() != n_out {
                    return Err(format!(
                        "host kernel returned {} results, the kernel has {n_out}",
                        outputs.len()
                    ));
                }
                for (&id, t) in body.outputs.iter().zip(&outputs) {
                    let v = body.value(id);
                    bindings.check(&v.ty, t, &format!("result `{}`", v.name))?;
                }
                outputs
            }
            None => run_with(body, inputs, &mut bindings).map_err(|e| e.to_string())?,
        };
        for ((&id, t), &operand) in body
            .outputs
            .iter()
            .zip(outputs)
            .zip(&params.operands[n_in..])
        {
            let name = &body.value(id).name;
            match operand {
                Operand::Binding(b) => write_binding(ctx, b, &from_reference(&t)?, name)?,
                Operand::Slot(b) => store_slot(&slots(params.call)?, b, from_reference(&t)?)?,
                Operand::Absent => {}
                Operand::Weight(_) | Operand::Foreign(_) => {
                    return Err(format!(
                        "result `{name}` targets a weight or foreign memory"
                    ))
                }
            }
        }
        Ok(())
    }
}
