//! Small integer constants the compiler folds into a body (64 bytes or less: a quantized
//! product's zero points), kept in a grid-launched module as a `Private` array of `u32`
//! words and read a byte at a time, so such a kernel needs no binding for them.

use rafter_ir::{DType, Graph, ValueDef, ValueId};
use rspirv::dr::{Builder, Instruction, Operand};
use rspirv::spirv::{Op, StorageClass, Word};

use crate::grid;
use crate::matmul::{build, Prelude, R};

/// Where a small integer operand's bytes are: a binding, or a constant's bytes.
#[derive(Clone, Debug)]
pub(crate) enum Bytes {
    Binding(usize),
    Const(Vec<u8>),
}

impl Bytes {
    /// Operand `i` of `node`: a body input or a folded constant; `what` names it.
    pub(crate) fn of(body: &Graph, v: ValueId, what: &str) -> R<Bytes> {
        match body.value(v).def {
            ValueDef::Input(i) => Ok(Bytes::Binding(i)),
            ValueDef::Const(c) => Ok(Bytes::Const(body.constant(c).bytes.to_vec())),
            _ => Err(format!("{what} is neither a body input nor a constant")),
        }
    }

    /// Emits what reading the bytes needs (a constant's `Private` array) and returns the
    /// reader, in the function being built.
    pub(crate) fn reader(&self, b: &mut Builder, t: &Prelude, addrs: &[Word]) -> Reader {
        match self {
            Bytes::Binding(i) => Reader::Addr(addrs[*i]),
            Bytes::Const(bytes) => Reader::Private(private_words(b, t, bytes)),
        }
    }
}

/// How a kernel reads a [`Bytes`]: at a buffer address or from a `Private` array.
#[derive(Clone, Copy)]
pub(crate) enum Reader {
    Addr(Word),
    Private(Word),
}

/// `bytes` as a `Private` `u32` array initialized in the module (little-endian words), added
/// to the entry point's interface (SPIR-V 1.4+ lists every global a function uses).
fn private_words(b: &mut Builder, t: &Prelude, bytes: &[u8]) -> Word {
    let words: Vec<u32> = bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        })
        .collect();
    let len = b.constant_bit32(t.u32, words.len().max(1) as u32);
    let arr = b.type_array(t.u32, len);
    let mut elems: Vec<Word> = words.iter().map(|&w| b.constant_bit32(t.u32, w)).collect();
    if elems.is_empty() {
        elems.push(b.constant_bit32(t.u32, 0));
    }
    let init = b.constant_composite(arr, elems);
    let ptr = b.type_pointer(None, StorageClass::Private, arr);
    let var = b.id();
    let inst = Instruction::new(
        Op::Variable,
        Some(ptr),
        Some(var),
        vec![
            Operand::StorageClass(StorageClass::Private),
            Operand::IdRef(init),
        ],
    );
    let module = b.module_mut();
    // Builder::variable would put it in the open block; a Private one is global.
    module.types_global_values.push(inst);
    if let Some(entry) = module.entry_points.first_mut() {
        entry.operands.push(Operand::IdRef(var));
    }
    var
}

/// Byte `index` (a `u32`) as a `u32` (zero-extended).
pub(crate) fn load_byte(b: &mut Builder, t: &Prelude, from: Reader, index: Word) -> R<Word> {
    match from {
        Reader::Addr(base) => {
            let i64t = b.type_int(64, 1);
            let index = build(b.u_convert(t.u64, None, index))?;
            let at = grid::element_addr(b, t.u64, base, index, 1)?;
            let v = crate::elem::load_int(b, crate::elem::Elem::U8, i64t, at)?;
            build(b.u_convert(t.u32, None, v))
        }
        Reader::Private(var) => {
            let (word, byte) = grid::div_mod(b, t.u32, index, 4)?;
            let ptr = b.type_pointer(None, StorageClass::Private, t.u32);
            let at = build(b.access_chain(ptr, None, var, [word]))?;
            let w = build(b.load(t.u32, None, at, None, []))?;
            let eight = b.constant_bit32(t.u32, 8);
            let shift = build(b.i_mul(t.u32, None, byte, eight))?;
            let w = build(b.shift_right_logical(t.u32, None, w, shift))?;
            let mask = b.constant_bit32(t.u32, 0xFF);
            build(b.bitwise_and(t.u32, None, w, mask))
        }
    }
}

/// Byte `index` of an 8-bit integer operand of `dtype` (u8 or i8) as an `i32`.
pub(crate) fn load_int8(
    b: &mut Builder,
    t: &Prelude,
    from: Reader,
    dtype: DType,
    index: Word,
) -> R<Word> {
    let v = load_byte(b, t, from, index)?;
    let i32t = b.type_int(32, 1);
    let v = build(b.bitcast(i32t, None, v))?;
    if dtype != DType::I8 {
        return Ok(v);
    }
    // Sign-extend the low byte: (v ^ 128) - 128.
    let bias = b.constant_bit32(i32t, 128);
    let flipped = build(b.bitwise_xor(i32t, None, v, bias))?;
    build(b.i_sub(i32t, None, flipped, bias))
}
