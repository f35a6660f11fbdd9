//! Integer elementwise kernels: bodies whose every value is an integer or a bool, computed
//! in 64-bit integer registers rather than the f32 ones of float kernels.
//!
//! f32 holds integers exactly only up to 2^24, so integer arithmetic (which wraps), integer
//! division and remainders, shifts, bitwise ops and any op on i32/u32/i64/u64 values cannot
//! go through the float kernels' registers. Here every value is an `i64`: loads sign-extend
//! signed types and zero-extend unsigned ones ([`crate::elem::load_int`]), each op's result
//! is wrapped back to its type (`wrap`: the low bits, sign- or zero-extended again), and a
//! store keeps the low bits. Wrapping each result keeps every value in its type's range, so
//! comparisons, division and right shifts see the value the reference sees; a u64 value
//! sits in the register with its bits, and the ops that care (comparison, division,
//! remainder, right shift) use their unsigned forms for unsigned types.
//!
//! The semantics are the reference executor's (`rafter-reference` ops/elementwise.rs):
//! wrapping add/sub/mul/neg/abs; division truncating toward zero and 0 for a zero divisor;
//! `mod` with the divisor's sign, `fmod` with the dividend's, both 0 for a zero divisor; a
//! shift by a negative amount or by the type's width or more gives 0 (a right shift of a
//! negative value: -1).

use std::collections::HashSet;

use rafter_ir::{BinaryOp, DType, Graph, Op, UnaryOp, ValueId};
use rspirv::spirv::Word;

use crate::elem::Elem;
use crate::elementwise::{build, is_view, Emitter, R};

/// Whether `op` is computed by [`Emitter::int_node`], and if not, why.
fn supported(op: &Op) -> bool {
    use BinaryOp::*;
    match op {
        Op::Identity | Op::Expand | Op::Transpose { .. } | Op::Where | Op::Cast { .. } => true,
        op if is_view(op) => true,
        // `neg`, `abs` and `sign` are emitted below but not placed: on lavapipe an i32
        // `neg`/`abs` of -128 gave -128 (tests/integer.rs), not yet understood.
        Op::Unary { op } => matches!(op, UnaryOp::Not | UnaryOp::BitwiseNot),
        Op::Binary { op } => !matches!(op, Pow | PRelu),
        _ => false,
    }
}

/// Checks that `body` can be an integer kernel: every value read or computed (not a
/// reshape's shape operand, `meta`) is an integer or a bool, and every op is one
/// [`Emitter::int_node`] computes. The error says which value or op is not.
pub(crate) fn check(body: &Graph, meta: &HashSet<ValueId>) -> R<()> {
    for (i, value) in body.values.iter().enumerate() {
        if meta.contains(&ValueId(i as u32)) {
            continue;
        }
        if value.ty.dtype.is_float() {
            return Err(format!(
                "an integer kernel takes no float value (%{} is {})",
                value.name, value.ty.dtype
            ));
        }
        Elem::of_any(value.ty.dtype).map_err(|e| format!("value %{} is {e}", value.name))?;
    }
    for node in &body.nodes {
        if !supported(&node.op) {
            return Err(format!(
                "op `{}` (node `{}`) is not generated for integers yet",
                node.op.name(),
                node.name
            ));
        }
    }
    Ok(())
}

/// Bits of a type as kept in an `i64` register (a bool: 1).
fn width(dtype: DType) -> u32 {
    match dtype {
        DType::Bool => 1,
        DType::I8 | DType::U8 => 8,
        DType::I16 | DType::U16 => 16,
        DType::I32 | DType::U32 => 32,
        _ => 64,
    }
}

impl Emitter<'_> {
    /// The module's signed 64-bit integer type (every value of an integer kernel).
    pub(crate) fn i64(&mut self) -> Word {
        self.b.type_int(64, 1)
    }

    /// An `i64` constant.
    pub(crate) fn i64_const(&mut self, v: i64) -> Word {
        let t = self.i64();
        self.b.constant_bit64(t, v as u64)
    }

    /// `v` wrapped to `dtype`: its low bits, sign-extended for a signed type and
    /// zero-extended otherwise (a bool: 1 where `v` is nonzero).
    fn wrap(&mut self, v: Word, dtype: DType) -> R<Word> {
        let t = self.i64();
        let bits = width(dtype);
        if dtype == DType::Bool {
            let zero = self.i64_const(0);
            let set = build(self.b.i_not_equal(self.bool, None, v, zero))?;
            return self.bool_to_int(set);
        }
        if bits == 64 {
            return Ok(v);
        }
        if bits == 32 {
            // Through a 32-bit value: lavapipe returned the unwrapped operand of a
            // negation wrapped by the shift pair below (an i32 `neg` of -128 gave -128).
            let signed = dtype.is_signed_int();
            let narrow = self.b.type_int(32, u32::from(signed));
            return if signed {
                let n = build(self.b.s_convert(narrow, None, v))?;
                build(self.b.s_convert(t, None, n))
            } else {
                let n = build(self.b.u_convert(narrow, None, v))?;
                let u = self.b.type_int(64, 0);
                let w = build(self.b.u_convert(u, None, n))?;
                build(self.b.bitcast(t, None, w))
            };
        }
        if dtype.is_signed_int() {
            let by = self.i64_const(i64::from(64 - bits));
            let up = build(self.b.shift_left_logical(t, None, v, by))?;
            build(self.b.shift_right_arithmetic(t, None, up, by))
        } else {
            let mask = self.i64_const((1i64 << bits) - 1);
            build(self.b.bitwise_and(t, None, v, mask))
        }
    }

    /// A SPIR-V bool as the `i64` 1 or 0.
    fn bool_to_int(&mut self, c: Word) -> R<Word> {
        let t = self.i64();
        let (one, zero) = (self.i64_const(1), self.i64_const(0));
        build(self.b.select(t, None, c, one, zero))
    }

    /// `a < b` for values of `dtype` (unsigned compare for unsigned types).
    fn int_less(&mut self, a: Word, b: Word, dtype: DType) -> R<Word> {
        if dtype.is_signed_int() {
            build(self.b.s_less_than(self.bool, None, a, b))
        } else {
            build(self.b.u_less_than(self.bool, None, a, b))
        }
    }

    /// The value of `node`'s result `out` in an integer kernel, as an `i64` wrapped to
    /// `out`'s type.
    pub(crate) fn int_node(
        &mut self,
        node: &rafter_ir::Node,
        args: &[Option<Word>],
        out: ValueId,
    ) -> R<Word> {
        let arg = |i: usize| {
            args.get(i)
                .copied()
                .flatten()
                .ok_or_else(|| format!("node `{}`: operand {i} is missing", node.name))
        };
        let body = self.body;
        let out_dtype = body.value(out).ty.dtype;
        // The operands' type (binary ops take two of one type; comparisons yield bool).
        let in_dtype = node
            .input(0)
            .map(|v| body.value(v).ty.dtype)
            .unwrap_or(out_dtype);
        let t = self.i64();
        let v = match &node.op {
            Op::Identity | Op::Expand | Op::Transpose { .. } => arg(0)?,
            op if is_view(op) => arg(0)?,
            // Between integer types a cast wraps (the reference's `as`); to bool, nonzero
            // is true.
            Op::Cast { .. } => arg(0)?,
            Op::Where => {
                let zero = self.i64_const(0);
                let cond = build(self.b.i_not_equal(self.bool, None, arg(0)?, zero))?;
                build(self.b.select(t, None, cond, arg(1)?, arg(2)?))?
            }
            Op::Unary { op } => self.int_unary(*op, arg(0)?, in_dtype)?,
            Op::Binary { op } => self.int_binary(*op, arg(0)?, arg(1)?, in_dtype)?,
            other => {
                return Err(format!(
                    "op `{}` (node `{}`) is not generated for integers",
                    other.name(),
                    node.name
                ))
            }
        };
        self.wrap(v, out_dtype)
    }

    fn int_unary(&mut self, op: UnaryOp, x: Word, dtype: DType) -> R<Word> {
        let t = self.i64();
        let zero = self.i64_const(0);
        Ok(match op {
            UnaryOp::Not => {
                let c = build(self.b.i_equal(self.bool, None, x, zero))?;
                self.bool_to_int(c)?
            }
            UnaryOp::BitwiseNot => build(self.b.not(t, None, x))?,
            UnaryOp::Neg => build(self.b.s_negate(t, None, x))?,
            UnaryOp::Abs if dtype.is_signed_int() => {
                let neg = build(self.b.s_negate(t, None, x))?;
                let below = build(self.b.s_less_than(self.bool, None, x, zero))?;
                build(self.b.select(t, None, below, neg, x))?
            }
            UnaryOp::Abs => x,
            UnaryOp::Sign => {
                let one = self.i64_const(1);
                let minus = self.i64_const(-1);
                let nonzero = build(self.b.i_not_equal(self.bool, None, x, zero))?;
                let pos = build(self.b.select(t, None, nonzero, one, zero))?;
                if dtype.is_signed_int() {
                    let below = build(self.b.s_less_than(self.bool, None, x, zero))?;
                    build(self.b.select(t, None, below, minus, pos))?
                } else {
                    pos
                }
            }
            other => return Err(format!("unary `{}` on integers", other.word())),
        })
    }

    fn int_binary(&mut self, op: BinaryOp, a: Word, b: Word, dtype: DType) -> R<Word> {
        use BinaryOp::*;
        let t = self.i64();
        let signed = dtype.is_signed_int();
        let zero = self.i64_const(0);
        Ok(match op {
            Add => build(self.b.i_add(t, None, a, b))?,
            Sub => build(self.b.i_sub(t, None, a, b))?,
            Mul => build(self.b.i_mul(t, None, a, b))?,
            Div | Mod | FMod => self.int_divide(op, a, b, dtype)?,
            Max | Min => {
                let less = self.int_less(a, b, dtype)?;
                let (lo, hi) = (
                    build(self.b.select(t, None, less, a, b))?,
                    build(self.b.select(t, None, less, b, a))?,
                );
                if op == Max {
                    hi
                } else {
                    lo
                }
            }
            Equal => {
                let c = build(self.b.i_equal(self.bool, None, a, b))?;
                self.bool_to_int(c)?
            }
            Less => {
                let c = self.int_less(a, b, dtype)?;
                self.bool_to_int(c)?
            }
            Greater => {
                let c = self.int_less(b, a, dtype)?;
                self.bool_to_int(c)?
            }
            LessOrEqual => {
                let c = self.int_less(b, a, dtype)?;
                let c = build(self.b.logical_not(self.bool, None, c))?;
                self.bool_to_int(c)?
            }
            GreaterOrEqual => {
                let c = self.int_less(a, b, dtype)?;
                let c = build(self.b.logical_not(self.bool, None, c))?;
                self.bool_to_int(c)?
            }
            // Bools are 0 or 1: bitwise ops are the logic ops.
            And | BitAnd => build(self.b.bitwise_and(t, None, a, b))?,
            Or | BitOr => build(self.b.bitwise_or(t, None, a, b))?,
            Xor | BitXor => build(self.b.bitwise_xor(t, None, a, b))?,
            ShiftLeft | ShiftRight => {
                // A negative amount is, as unsigned, past the width too. The amount is
                // clamped to 63 (in range for the 64-bit shift): a signed right shift by
                // 63 of a sign-extended value is its fill (-1 or 0), what a shift past the
                // width gives; the others are zeroed past the width.
                let w = self.i64_const(i64::from(width(dtype)));
                let bad = build(self.b.u_greater_than_equal(self.bool, None, b, w))?;
                let max = self.i64_const(63);
                let u = self.b.type_int(64, 0);
                let ub = build(self.b.bitcast(u, None, b))?;
                let umax = build(self.b.bitcast(u, None, max))?;
                let by = self.ext_umin(u, ub, umax)?;
                let by = build(self.b.bitcast(t, None, by))?;
                if op == ShiftRight && signed {
                    build(self.b.shift_right_arithmetic(t, None, a, by))?
                } else {
                    let r = if op == ShiftLeft {
                        build(self.b.shift_left_logical(t, None, a, by))?
                    } else {
                        build(self.b.shift_right_logical(t, None, a, by))?
                    };
                    build(self.b.select(t, None, bad, zero, r))?
                }
            }
            Pow | PRelu => return Err(format!("binary `{}` on integers", op.word())),
        })
    }

    /// `x` as an unsigned 64-bit magnitude: `|x|` for a signed `x` (`negative` says whether
    /// it is below 0), its bits otherwise.
    fn magnitude(
        &mut self,
        (t, u): (Word, Word),
        x: Word,
        negative: Word,
        signed: bool,
    ) -> R<Word> {
        let x = if signed {
            self.negate_if(t, negative, x)?
        } else {
            x
        };
        build(self.b.bitcast(u, None, x))
    }

    /// `-x` (wrapping) where `cond`, else `x`.
    fn negate_if(&mut self, t: Word, cond: Word, x: Word) -> R<Word> {
        let minus = build(self.b.s_negate(t, None, x))?;
        build(self.b.select(t, None, cond, minus, x))
    }

    /// GLSL.std.450 `UMin` of two `u64`s of type `u`.
    fn ext_umin(&mut self, u: Word, a: Word, b: Word) -> R<Word> {
        let glsl = self.glsl;
        build(self.b.ext_inst(
            u,
            None,
            glsl,
            38, // UMin
            [rspirv::dr::Operand::IdRef(a), rspirv::dr::Operand::IdRef(b)],
        ))
    }

    /// Integer `div` (truncating), `mod` (the divisor's sign) and `fmod` (the dividend's
    /// sign), 0 for a zero divisor.
    ///
    /// Signed operands are divided as unsigned magnitudes and the signs applied after:
    /// NVIDIA's driver (580, H200) computed the 64-bit `OpSRem` of 7 by -3 as 7, as if the
    /// divisor were unsigned (ONNX's `test_mod_mixed_sign_*` and `test_mod_int64_fmod` failed
    /// there, passed on lavapipe), and lavapipe computed `OpSMod` with the dividend's sign; so
    /// no signed division instruction is emitted at all. Types of 32 bits or fewer divide in
    /// 32-bit registers: lavapipe got 64-bit magnitudes of sign-extended i32 values wrong
    /// (-7 / 3 gave (2^32 - 7) / 3; tests/integer.rs). The magnitude of the minimum is the
    /// unsigned 2^(w-1), so the minimum divided by -1 wraps to itself, as the reference's
    /// wrapping division does.
    fn int_divide(&mut self, op: BinaryOp, a: Word, b: Word, dtype: DType) -> R<Word> {
        let signed = dtype.is_signed_int();
        // Types of 32 bits or fewer divide in 32-bit registers (their values fit), 64-bit
        // types in 64-bit ones.
        let width = if dtype.size_of() == 8 { 64 } else { 32 };
        let (t, u) = (self.b.type_int(width, 1), self.b.type_int(width, 0));
        let narrow = |e: &mut Self, v: Word| -> R<Word> {
            if width == 64 {
                Ok(v)
            } else {
                build(e.b.s_convert(t, None, v))
            }
        };
        let (a, b) = (narrow(self, a)?, narrow(self, b)?);
        let constant = |e: &mut Self, v: i64| {
            if width == 64 {
                e.b.constant_bit64(t, v as u64)
            } else {
                e.b.constant_bit32(t, v as u32)
            }
        };
        let (zero, one) = (constant(self, 0), constant(self, 1));
        let by_zero = build(self.b.i_equal(self.bool, None, b, zero))?;
        // A safe divisor: 1 where b is 0; those lanes are replaced by 0 below.
        let d = build(self.b.select(t, None, by_zero, one, b))?;
        let (a_neg, d_neg) = if signed {
            (
                build(self.b.s_less_than(self.bool, None, a, zero))?,
                build(self.b.s_less_than(self.bool, None, d, zero))?,
            )
        } else {
            let no = self.b.constant_false(self.bool);
            (no, no)
        };
        let ua = self.magnitude((t, u), a, a_neg, signed)?;
        let ud = self.magnitude((t, u), d, d_neg, signed)?;
        let r = match op {
            BinaryOp::Div => {
                let q = build(self.b.u_div(u, None, ua, ud))?;
                let q = build(self.b.bitcast(t, None, q))?;
                if signed {
                    let differ = build(self.b.logical_not_equal(self.bool, None, a_neg, d_neg))?;
                    self.negate_if(t, differ, q)?
                } else {
                    q
                }
            }
            BinaryOp::Mod | BinaryOp::FMod => {
                let r = build(self.b.u_mod(u, None, ua, ud))?;
                let r = build(self.b.bitcast(t, None, r))?;
                if !signed {
                    r
                } else {
                    // fmod: the dividend's sign.
                    let r = self.negate_if(t, a_neg, r)?;
                    if op == BinaryOp::FMod {
                        r
                    } else {
                        // mod: the divisor's sign; a nonzero remainder of the other sign
                        // moves by one divisor.
                        let differ =
                            build(self.b.logical_not_equal(self.bool, None, a_neg, d_neg))?;
                        let nonzero = build(self.b.i_not_equal(self.bool, None, r, zero))?;
                        let fix = build(self.b.logical_and(self.bool, None, differ, nonzero))?;
                        let shifted = build(self.b.i_add(t, None, r, d))?;
                        build(self.b.select(t, None, fix, shifted, r))?
                    }
                }
            }
            _ => return Err(format!("`{}` is not a division", op.word())),
        };
        let r = build(self.b.select(t, None, by_zero, zero, r))?;
        // Back to the kernel's i64 registers: sign-extended for signed types, zero-extended
        // for unsigned ones (as loads do).
        let i64t = self.i64();
        if width == 64 {
            Ok(r)
        } else if signed {
            build(self.b.s_convert(i64t, None, r))
        } else {
            let u64t = self.b.type_int(64, 0);
            let bits = build(self.b.bitcast(u, None, r))?;
            let wide = build(self.b.u_convert(u64t, None, bits))?;
            build(self.b.bitcast(i64t, None, wide))
        }
    }
}
