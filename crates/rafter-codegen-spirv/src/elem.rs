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
    let ty = match elem {
        Elem::F32 => f32,
        Elem::F16 => half(b),
    };
    let ptr_ty = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, ty);
    let ptr = build(b.convert_u_to_ptr(ptr_ty, None, addr))?;
    let align = [Arg::LiteralBit32(elem.bytes())];
    let v = build(b.load(ty, None, ptr, Some(MemoryAccess::ALIGNED), align))?;
    match elem {
        Elem::F32 => Ok(v),
        Elem::F16 => build(b.f_convert(f32, None, v)),
    }
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
pub(crate) fn round_to_half(b: &mut Builder, f32: Word, v: Word) -> Result<Word, String> {
    let h = half(b);
    let narrow = build(b.f_convert(h, None, v))?;
    b.decorate(
        narrow,
        Decoration::FPRoundingMode,
        [Arg::FPRoundingMode(FPRoundingMode::RTE)],
    );
    build(b.f_convert(f32, None, narrow))
}
