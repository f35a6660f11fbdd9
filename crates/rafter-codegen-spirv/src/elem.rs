//! Element types of the buffers a kernel reads and writes: f32, or f16 *stored* as 16-bit
//! floats and computed in f32; and, in elementwise kernels only, bool, i8, u8, i16, u16,
//! i32 and i64,
//! also computed in f32 (see [`Elem::of_any`] for what that allows).
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
//!
//! Integer elements are loaded and converted to f32 (`OpConvertSToF`/`OpConvertUToF`; a
//! bool is 1.0 where its byte is nonzero) and stored from f32 the way the reference's
//! `cast` converts: truncation toward zero, saturating at the type's range, NaN to 0 (a
//! bool: nonzero or NaN is true). 8-bit elements need `StorageBuffer8BitAccess` (Vulkan's
//! `storageBuffer8BitAccess`), which only a module touching them declares; i32 and i64 need
//! nothing beyond the `Int64` every module already declares for its addresses.

use rafter_ir::DType;
use rspirv::dr::{Builder, Operand as Arg};
use rspirv::spirv::{Capability, Decoration, FPRoundingMode, MemoryAccess, StorageClass, Word};

/// The element type of a buffer binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    F32,
    F16,
    /// One byte, 0 or 1 (any nonzero byte reads as true).
    Bool,
    I8,
    U8,
    /// 16-bit integers: quantized values (QuantizeLinear's int16 and uint16 results).
    I16,
    U16,
    I32,
    I64,
    /// Unsigned 32- and 64-bit integers: only in integer kernels (see [`load_int`]), and
    /// as casts' sources and results.
    U32,
    U64,
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

    /// The element type of an elementwise kernel's tensor of `dtype`, integers included,
    /// or why it is not generated. Elementwise kernels compute every value in f32, which
    /// holds bool, i8 and u8 values exactly; i32 and i64 ones only up to 2^24, so the
    /// elementwise generator lets a wide integer ([`Elem::is_wide_int`]) only be loaded
    /// for a cast to a float, or stored from one.
    pub(crate) fn of_any(dtype: DType) -> Result<Elem, String> {
        match dtype {
            DType::Bool => Ok(Elem::Bool),
            DType::I8 => Ok(Elem::I8),
            DType::U8 => Ok(Elem::U8),
            DType::I16 => Ok(Elem::I16),
            DType::U16 => Ok(Elem::U16),
            DType::I32 => Ok(Elem::I32),
            DType::I64 => Ok(Elem::I64),
            DType::U32 => Ok(Elem::U32),
            DType::U64 => Ok(Elem::U64),
            DType::F32 | DType::F16 => Elem::of(dtype),
            other => Err(format!(
                "{other}; only f32, f16, bool and 8- to 64-bit integers are generated yet"
            )),
        }
    }

    /// Whether f32 cannot hold every value of the type (i32, i64).
    pub(crate) fn is_wide_int(self) -> bool {
        matches!(self, Elem::I32 | Elem::I64 | Elem::U32 | Elem::U64)
    }

    /// Whether the type is a signed integer (sign-extended when widened).
    pub(crate) fn is_signed(self) -> bool {
        matches!(self, Elem::I8 | Elem::I16 | Elem::I32 | Elem::I64)
    }

    /// Bytes per element (the stride of element addresses and their alignment).
    pub(crate) fn bytes(self) -> u32 {
        match self {
            Elem::I64 | Elem::U64 => 8,
            Elem::F32 | Elem::I32 | Elem::U32 => 4,
            Elem::F16 | Elem::I16 | Elem::U16 => 2,
            Elem::Bool | Elem::I8 | Elem::U8 => 1,
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
        // 8-bit values are widened to 32 bits first: with only 8-bit *storage*, loads,
        // stores and width conversions are all a module may do with them.
        Elem::Bool => {
            let u32t = b.type_int(32, 0);
            let wide = build(b.u_convert(u32t, None, v))?;
            let zero = b.constant_bit32(u32t, 0);
            let boolt = b.type_bool();
            let set = build(b.i_not_equal(boolt, None, wide, zero))?;
            let (one, nil) = (
                b.constant_bit32(f32, 1f32.to_bits()),
                b.constant_bit32(f32, 0),
            );
            build(b.select(f32, None, set, one, nil))
        }
        Elem::U8 | Elem::U16 => {
            let u32t = b.type_int(32, 0);
            let wide = build(b.u_convert(u32t, None, v))?;
            build(b.convert_u_to_f(f32, None, wide))
        }
        Elem::I8 | Elem::I16 => {
            let i32t = b.type_int(32, 1);
            let wide = build(b.s_convert(i32t, None, v))?;
            build(b.convert_s_to_f(f32, None, wide))
        }
        Elem::I32 | Elem::I64 => build(b.convert_s_to_f(f32, None, v)),
        Elem::U32 | Elem::U64 => build(b.convert_u_to_f(f32, None, v)),
    }
}

/// The 8-bit integer type (signed or not), declaring what a module using it needs.
fn byte(b: &mut Builder, signed: bool) -> Word {
    require(b, Capability::StorageBuffer8BitAccess);
    b.type_int(8, u32::from(signed))
}

/// The type an element of `elem` is stored as.
fn stored_type(b: &mut Builder, elem: Elem, f32: Word) -> Word {
    match elem {
        Elem::F32 => f32,
        Elem::F16 => half(b),
        Elem::Bool | Elem::U8 => byte(b, false),
        Elem::I8 => byte(b, true),
        Elem::I16 | Elem::U16 => {
            require(b, Capability::StorageBuffer16BitAccess);
            b.type_int(16, u32::from(elem == Elem::I16))
        }
        Elem::I32 => b.type_int(32, 1),
        Elem::I64 => b.type_int(64, 1),
        Elem::U32 => b.type_int(32, 0),
        Elem::U64 => b.type_int(64, 0),
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
    let ty = stored_type(b, elem, f32);
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
        Elem::Bool => {
            // Nonzero or NaN is true, as the reference's cast to bool.
            let boolt = b.type_bool();
            let zero = b.constant_bit32(f32, 0);
            let set = build(b.f_unord_not_equal(boolt, None, v, zero))?;
            let u32t = b.type_int(32, 0);
            let (one, nil) = (b.constant_bit32(u32t, 1), b.constant_bit32(u32t, 0));
            let wide = build(b.select(u32t, None, set, one, nil))?;
            let u8t = byte(b, false);
            (u8t, build(b.u_convert(u8t, None, wide))?)
        }
        Elem::I8
        | Elem::U8
        | Elem::I16
        | Elem::U16
        | Elem::I32
        | Elem::I64
        | Elem::U32
        | Elem::U64 => {
            let ty = stored_type(b, elem, f32);
            (ty, saturating_int(b, elem, f32, ty, v)?)
        }
    };
    let ptr_ty = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, ty);
    let ptr = build(b.convert_u_to_ptr(ptr_ty, None, addr))?;
    let align = [Arg::LiteralBit32(elem.bytes())];
    build(b.store(ptr, v, Some(MemoryAccess::ALIGNED), align))
}

/// `v` (an f32) as the integer type `ty` of `elem`, as the reference's cast converts:
/// truncated toward zero, saturated at the type's range, NaN to 0. The bounds of i32 and
/// i64 are not f32 values: an f32 at or past 2^31 (2^63) is the maximum, checked before the
/// conversion, whose result is undefined out of range.
fn saturating_int(
    b: &mut Builder,
    elem: Elem,
    f32: Word,
    ty: Word,
    v: Word,
) -> Result<Word, String> {
    let (lo, hi, bits): (f64, f64, u32) = match elem {
        Elem::I8 => (-128.0, 127.0, 8),
        Elem::U8 => (0.0, 255.0, 8),
        Elem::I16 => (-32768.0, 32767.0, 16),
        Elem::U16 => (0.0, 65535.0, 16),
        Elem::I32 => (-(2f64.powi(31)), 2f64.powi(31), 32),
        Elem::U32 => (0.0, 2f64.powi(32), 32),
        Elem::U64 => (0.0, 2f64.powi(64), 64),
        _ => (-(2f64.powi(63)), 2f64.powi(63), 64),
    };
    let boolt = b.type_bool();
    let glsl = glsl_import(b);
    let c = |b: &mut Builder, x: f64| b.constant_bit32(f32, (x as f32).to_bits());
    let (lo_c, hi_c, zero) = (c(b, lo), c(b, hi), c(b, 0.0));
    let nan = build(b.is_nan(boolt, None, v))?;
    let v = build(b.select(f32, None, nan, zero, v))?;
    let clamped = build(b.ext_inst(
        f32,
        None,
        glsl,
        GLSL_FCLAMP,
        [Arg::IdRef(v), Arg::IdRef(lo_c), Arg::IdRef(hi_c)],
    ))?;
    if bits <= 16 {
        // Every value in range is exact in f32 and in i32: convert, then narrow.
        let i32t = b.type_int(32, 1);
        let wide = build(b.convert_f_to_s(i32t, None, clamped))?;
        return if matches!(elem, Elem::U8 | Elem::U16) {
            build(b.u_convert(ty, None, wide))
        } else {
            build(b.s_convert(ty, None, wide))
        };
    }
    // `hi` (2^31 or 2^63) is past the range: below it convert, at it take the maximum.
    let over = build(b.f_ord_greater_than_equal(boolt, None, clamped, hi_c))?;
    let safe = build(b.select(f32, None, over, zero, clamped))?;
    let unsigned = matches!(elem, Elem::U32 | Elem::U64);
    let converted = if unsigned {
        build(b.convert_f_to_u(ty, None, safe))?
    } else {
        build(b.convert_f_to_s(ty, None, safe))?
    };
    let max = match (bits, unsigned) {
        (32, false) => b.constant_bit32(ty, i32::MAX as u32),
        (32, true) => b.constant_bit32(ty, u32::MAX),
        (_, false) => b.constant_bit64(ty, i64::MAX as u64),
        (_, true) => b.constant_bit64(ty, u64::MAX),
    };
    build(b.select(ty, None, over, max, converted))
}

/// GLSL.std.450 `FClamp`.
const GLSL_FCLAMP: u32 = 43;

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

/// Loads the integer or bool element of type `elem` at byte address `addr` (a `u64`) as
/// an `i64` (`i64` is the module's signed 64-bit type): signed types sign-extended,
/// unsigned ones zero-extended (a u64 keeps its bits), a bool 1 where its byte is nonzero.
/// Integer kernels compute every value this way, so arithmetic on any integer type up to
/// 64 bits is exact before the result is wrapped to its type.
pub(crate) fn load_int(b: &mut Builder, elem: Elem, i64: Word, addr: Word) -> Result<Word, String> {
    if matches!(elem, Elem::F32 | Elem::F16) {
        return Err(format!("{elem:?} loaded as an integer"));
    }
    let ty = stored_type(b, elem, i64);
    let ptr_ty = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, ty);
    let ptr = build(b.convert_u_to_ptr(ptr_ty, None, addr))?;
    let align = [Arg::LiteralBit32(elem.bytes())];
    let v = build(b.load(ty, None, ptr, Some(MemoryAccess::ALIGNED), align))?;
    match elem {
        Elem::I64 | Elem::U64 => build(b.bitcast(i64, None, v)),
        Elem::Bool => {
            let u32t = b.type_int(32, 0);
            let wide = build(b.u_convert(u32t, None, v))?;
            let zero = b.constant_bit32(u32t, 0);
            let boolt = b.type_bool();
            let set = build(b.i_not_equal(boolt, None, wide, zero))?;
            let (one, nil) = (b.constant_bit64(i64, 1), b.constant_bit64(i64, 0));
            build(b.select(i64, None, set, one, nil))
        }
        e => {
            let u64t = b.type_int(64, 0);
            let wide = build(b.u_convert(u64t, None, v))?;
            let wide = build(b.bitcast(i64, None, wide))?;
            if !e.is_signed() {
                return Ok(wide);
            }
            // Sign-extended by hand, `(v ^ 2^(n-1)) - 2^(n-1)` on the zero-extended bits,
            // not by `OpSConvert`: lavapipe's `OpSConvert` of a loaded i32 gave a
            // zero-extended value (an axis of -1 read as 2^32 - 1; see gather.rs too).
            let sign = b.constant_bit64(i64, 1u64 << (8 * e.bytes() - 1));
            let flipped = build(b.bitwise_xor(i64, None, wide, sign))?;
            build(b.i_sub(i64, None, flipped, sign))
        }
    }
}

/// Stores the `i64` `v` as an integer or bool element of type `elem` at byte address
/// `addr`, keeping its low bits (a bool: 1 where `v` is nonzero). Integer kernels wrap
/// every result to its type before it is used, so the low bits are the value.
pub(crate) fn store_int(
    b: &mut Builder,
    elem: Elem,
    i64: Word,
    addr: Word,
    v: Word,
) -> Result<(), String> {
    if matches!(elem, Elem::F32 | Elem::F16) {
        return Err(format!("an integer stored as {elem:?}"));
    }
    let ty = stored_type(b, elem, i64);
    let v = match elem {
        Elem::I64 => v,
        Elem::U64 => build(b.bitcast(ty, None, v))?,
        Elem::Bool => {
            let boolt = b.type_bool();
            let zero = b.constant_bit64(i64, 0);
            let set = build(b.i_not_equal(boolt, None, v, zero))?;
            let u32t = b.type_int(32, 0);
            let (one, nil) = (b.constant_bit32(u32t, 1), b.constant_bit32(u32t, 0));
            let wide = build(b.select(u32t, None, set, one, nil))?;
            build(b.u_convert(ty, None, wide))?
        }
        e if e.is_signed() => build(b.s_convert(ty, None, v))?,
        _ => build(b.u_convert(ty, None, v))?,
    };
    let ptr_ty = b.type_pointer(None, StorageClass::PhysicalStorageBuffer, ty);
    let ptr = build(b.convert_u_to_ptr(ptr_ty, None, addr))?;
    let align = [Arg::LiteralBit32(elem.bytes())];
    build(b.store(ptr, v, Some(MemoryAccess::ALIGNED), align))
}
