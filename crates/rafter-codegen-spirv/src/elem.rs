//! Element types of the buffers a kernel reads and writes: f32, or f16 *stored* as 16-bit
//! floats and computed in f32.
//!
//! Every load and store of a buffer element goes through [`load`] and [`store`], the one
//! place that knows the element type: an f16 element is loaded through a
//! `PhysicalStorageBuffer` pointer to a 16-bit float and widened with `OpFConvert`, and an
//! f32 result is narrowed (round to nearest even) with `OpFConvert` before it is stored.
//! All arithmetic and accumulation stay in f32 (what PyTorch's f16 kernels do for their
//! accumulations too), so a matrix product's error is the f16 rounding of its inputs and
//! output, not of every partial sum. An f16 value computed inside a fused kernel is
//! rounded with [`round_to_half`] at the op boundary, as if stored.
//!
//! An f16 module declares the `StorageBuffer16BitAccess` capability (Vulkan's
//! `storageBuffer16BitAccess` feature, which covers `PhysicalStorageBuffer`), and only
//! that: 16-bit loads, stores and `OpFConvert` need no `Float16` (`shaderFloat16`), since no
//! arithmetic is done in f16. An f32-only module declares neither, so it runs on devices
//! without 16-bit storage as before.

use rafter_ir::DType;
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::{Capability, Decoration, FPRoundingMode, MemoryAccess, StorageClass, Word};

/// The element type of a buffer binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    F32,
    F16,
}

impl Elem {
    /// The element type of a tensor of `dtype`, or why it is not generated.
    pub(crate) fn of(dtype: DType) -> Result<Elem, String> {
        match dtype {
            DType::F32 => Ok(Elem::F32),
            DType::F16 => Ok(Elem::F16),
            other => Err(format!("{other}; only f32 and f16 are generated yet")),
        }
    }

    /// Bytes per element (the stride of element addresses and their alignment).
    pub(crate) fn bytes(self) -> u32 {
        match self {
            Elem::F32 => 4,
            Elem::F16 => 2,
        }
    }
}

fn build<T>(r: Result<T, rspirv::dr::Error>) -> Result<T, String> {
    r.map_err(|e| format!("rspirv: {e}"))
}

/// Declares `capability` unless the module already does.
fn require(b: &mut Builder, capability: Capability) {
    let declared = b.module_ref().capabilities.iter().any(|inst| {
        inst.operands
            .first()
            .is_some_and(|o| *o == Arg::Capability(capability))
    });
    if !declared {
        b.capability(capability);
    }
}

/// The 16-bit float type, declaring what a module using it needs.
fn half(b: &mut Builder) -> Word {
    require(b, Capability::StorageBuffer16BitAccess);
    b.type_float(16)
}

/// Loads the element of type `elem` at byte address `addr` (a `u64`), as an f32 (`f32` is
/// the module's 32-bit float type).
pub(crate) fn load(b: &mut Builder, elem: Elem, f32: Word, addr: Word) -> Result<Word, String> {
    let v = load_stored(b, elem, f32, addr)?;
    match elem {
        Elem::F32 => Ok(v),
        Elem::F16 => build(b.f_convert(f32, None, v)),
    }
}

/// Loads the element of type `elem` at byte address `addr` as stored (an f16 stays f16):
/// for kernels that move elements without computing on them (staging a tile in workgroup
/// memory for cooperative matrices).
pub(crate) fn load_stored(
    b: &mut Builder,
    elem: Elem,
    f32: Word,
    addr: Word,
) -> Result<Word, String> {
    let ty = match elem {
        Elem::F32 => f32,
        Elem::F16 => half(b),
    };
    let ptr_ty = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, ty);
    let ptr = build(b.convert_u_to_ptr(ptr_ty, None, addr))?;
    let align = [Arg::LiteralBit32(elem.bytes())];
    build(b.load(ty, None, ptr, Some(MemoryAccess::ALIGNED), align))
}

/// Stores the f32 `v` as an element of type `elem` at byte address `addr` (a `u64`).
pub(crate) fn store(
    b: &mut Builder,
    elem: Elem,
    f32: Word,
    addr: Word,
    v: Word,
) -> Result<(), String> {
    let (ty, v) = match elem {
        Elem::F32 => (f32, v),
        Elem::F16 => {
            let h = half(b);
            let narrow = build(b.f_convert(h, None, v))?;
            // Round to nearest even, as the reference and PyTorch do: Vulkan leaves an
            // undecorated conversion's rounding to the driver (RTE or RTZ).
            b.decorate(
                narrow,
                Decoration::FPRoundingMode,
                [Arg::FPRoundingMode(FPRoundingMode::RTE)],
            );
            (h, narrow)
        }
    };
    let ptr_ty = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, ty);
    let ptr = build(b.convert_u_to_ptr(ptr_ty, None, addr))?;
    let align = [Arg::LiteralBit32(elem.bytes())];
    build(b.store(ptr, v, Some(MemoryAccess::ALIGNED), align))
}

/// `v` (an f32) rounded to the nearest f16 (ties to even) and widened back: an f16 value
/// computed inside a fused kernel, whose values stay in f32 registers, as if it had been
/// stored.
///
/// Done in f32 arithmetic, not as an `OpFConvert` to f16 and back: with only 16-bit
/// *storage*, a rounding-mode-decorated conversion is meant to feed a store, and NVIDIA's
/// driver (580, H100) returned 0 for every such round trip while spirv-val and lavapipe
/// accepted it. Here `ulp` is the f16 spacing at `v`'s binade (2^(e-10), at least 2^-24
/// for f16 subnormals), `v * (1/ulp)` is exact (a power of two), `RoundEven` rounds it to
/// an integer with ties to even, and scaling back is exact; beyond 65504 the result is
/// ±infinity, and infinities and NaNs pass through.
pub(crate) fn round_to_half(b: &mut Builder, f32: Word, v: Word) -> Result<Word, String> {
    let u32t = b.type_int(32, 0);
    let boolt = b.type_bool();
    let glsl = glsl_import(b);
    let c = |b: &mut Builder, x: u32| b.constant_bit32(u32t, x);
    let bits = build(b.bitcast(u32t, None, v))?;
    let exp_mask = c(b, 0x7F80_0000);
    let exp = build(b.bitwise_and(u32t, None, bits, exp_mask))?;
    // f16's smallest normal binade, 2^-14: below it the spacing stays 2^-24.
    let floor = c(b, 113 << 23);
    let low = build(b.u_less_than(boolt, None, exp, floor))?;
    let e = build(b.select(u32t, None, low, floor, exp))?;
    let ten = c(b, 10 << 23);
    let ulp_bits = build(b.i_sub(u32t, None, e, ten))?;
    let ulp = build(b.bitcast(f32, None, ulp_bits))?;
    let two_254 = c(b, 254 << 23);
    let inv_bits = build(b.i_sub(u32t, None, two_254, ulp_bits))?;
    let inv = build(b.bitcast(f32, None, inv_bits))?;
    let q = build(b.f_mul(f32, None, v, inv))?;
    let r = build(b.ext_inst(f32, None, glsl, GLSL_ROUND_EVEN, [Arg::IdRef(q)]))?;
    let y = build(b.f_mul(f32, None, r, ulp))?;
    let abs = build(b.ext_inst(f32, None, glsl, GLSL_FABS, [Arg::IdRef(y)]))?;
    let max = b.constant_bit32(f32, 65504f32.to_bits());
    let over = build(b.f_ord_greater_than(boolt, None, abs, max))?;
    let sign_mask = c(b, 0x8000_0000);
    let sign = build(b.bitwise_and(u32t, None, bits, sign_mask))?;
    let inf_bits = build(b.bitwise_or(u32t, None, sign, exp_mask))?;
    let inf = build(b.bitcast(f32, None, inf_bits))?;
    let y = build(b.select(f32, None, over, inf, y))?;
    let special = build(b.i_equal(boolt, None, exp, exp_mask))?;
    build(b.select(f32, None, special, v, y))
}

/// GLSL.std.450 `RoundEven` and `FAbs`.
const GLSL_ROUND_EVEN: u32 = 2;
const GLSL_FABS: u32 = 4;

/// The module's GLSL.std.450 import, added if it has none yet.
fn glsl_import(b: &mut Builder) -> Word {
    let existing = b
        .module_ref()
        .ext_inst_imports
        .iter()
        .find(|i| {
            matches!(i.operands.first(), Some(Arg::LiteralString(name)) if name == "GLSL.std.450")
        })
        .and_then(|i| i.result_id);
    existing.unwrap_or_else(|| b.ext_inst_import("GLSL.std.450"))
}
