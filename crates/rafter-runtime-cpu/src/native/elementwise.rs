//! Elementwise-only bodies (GELU's erf chain, bias adds, activations) as `rafter-kernels-cpu`
//! tile programs, writing into the output binding.
//!
//! The memory planner may bind the result of such a body to the bytes of an operand it reads
//! last (in place). So this kernel asks for its binding operands as copies
//! ([`NativeKernel::copies_operands`]): each is read into an owned buffer and its view
//! dropped before the result's writable view is taken, which keeps the HAL's aliasing rule
//! and reads every operand element before any result element is written. One copy of the
//! operands replaces the reference path's decode into tensors, fresh result allocation and
//! encode back.

use std::sync::Arc;

use rafter_ir::Graph;
use rafter_kernels_cpu::tile::{TileInput, TileProgram};

use super::{In, NativeKernel, Out, Par};

struct ElementwiseKernel {
    prog: TileProgram,
    par: Par,
}

pub(super) fn select(body: &Graph, par: &Par) -> Option<Arc<dyn NativeKernel>> {
    Some(Arc::new(ElementwiseKernel {
        prog: crate::elementwise_tile::tile_program(body)?,
        par: par.clone(),
    }))
}

impl NativeKernel for ElementwiseKernel {
    fn copies_operands(&self) -> bool {
        true
    }

    /// GELU (erf) over its own operand's bytes: BERT's FFN activation, whose input (the
    /// FFN-up product) the planner binds in place, so the copy of it is skipped.
    fn run_in_place(&self, y: &mut Out<'_>) -> Result<bool, String> {
        if !self.prog.is_gelu_erf() {
            return Ok(false);
        }
        rafter_kernels_cpu::gelu_erf(y.f32s()?, &*self.par)
            .map_err(|e| format!("elementwise: {e}"))?;
        Ok(true)
    }

    /// Any body over the bytes of one of its operands: each tile of that operand is read
    /// into a register just before the tile is written (`tile::run_f32_over_output`).
    fn run_over_output(
        &self,
        ins: &[In<'_>],
        aliased: usize,
        y: &mut Out<'_>,
    ) -> Result<bool, String> {
        let mut args = Vec::with_capacity(ins.len());
        for (i, x) in ins.iter().enumerate() {
            args.push(if i == aliased {
                TileInput::Output
            } else {
                TileInput::Data(x.f32s()?, x.dims.as_slice())
            });
        }
        let out_dims = y.dims.clone();
        let dims: Vec<&[usize]> = ins.iter().map(|x| x.dims.as_slice()).collect();
        if self.prog.out_dims(&dims).ok().as_ref() != Some(&out_dims) {
            return Ok(false);
        }
        rafter_kernels_cpu::tile::run_f32_over_output(
            &self.prog,
            &args,
            y.f32s()?,
            &out_dims,
            &*self.par,
        )
        .map_err(|e| format!("elementwise: {e}"))?;
        Ok(true)
    }

    fn out_dims(&self, ins: &[In<'_>]) -> Option<Vec<usize>> {
        let dims: Vec<&[usize]> = ins.iter().map(|x| x.dims.as_slice()).collect();
        self.prog.out_dims(&dims).ok()
    }

    fn run(&self, ins: &[In<'_>], outs: &mut [Out<'_>]) -> Result<bool, String> {
        let mut args = Vec::with_capacity(ins.len());
        for x in ins {
            args.push((x.f32s()?, x.dims.as_slice()));
        }
        let dims: Vec<&[usize]> = args.iter().map(|a| a.1).collect();
        match self.prog.out_dims(&dims) {
            Ok(d) if d == outs[0].dims => {}
            _ => return Ok(false),
        }
        let out_dims = outs[0].dims.clone();
        let y = outs[0].f32s()?;
        rafter_kernels_cpu::tile::run_f32(&self.prog, &args, y, &out_dims, &*self.par)
            .map_err(|e| format!("elementwise: {e}"))?;
        Ok(true)
    }
}
