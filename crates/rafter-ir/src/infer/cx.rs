//! What every op's inference needs: operand access, known values, axes, broadcasting.

use super::arith;
use super::{Fresh, InferInput};
use crate::{ConstData, DType, Dim, Op, TensorType};

/// One result: its type and, for small integer results, its element values.
#[derive(Clone, Debug)]
pub(super) struct Res {
    pub ty: TensorType,
    pub sym: Option<Vec<Dim>>,
}

impl Res {
    pub fn new(dtype: DType, dims: Vec<Dim>) -> Res {
        Res {
            ty: TensorType::new(dtype, dims),
            sym: None,
        }
    }

    pub fn of(ty: &TensorType) -> Res {
        Res {
            ty: ty.clone(),
            sym: None,
        }
    }

    pub fn with_sym(mut self, sym: Option<Vec<Dim>>) -> Res {
        self.sym = sym;
        self
    }
}

pub(super) type R = Result<Vec<Res>, String>;

/// Results with more elements than this carry no element values.
pub(super) const MAX_SYM: usize = 1024;
/// Operand values beyond this many elements are not read.
const MAX_READ: usize = 1 << 16;
/// Slice bounds at least this large mean "to the end" when the dim is symbolic.
pub(super) const BIG: i64 = i32::MAX as i64;

/// The inference context of one node.
pub(super) struct Cx<'a, 'i, 'f> {
    pub op: &'a Op,
    inputs: &'a [Option<InferInput<'i>>],
    /// How many results the caller asked for.
    pub n_out: usize,
    fresh: &'a mut Fresh<'f>,
}

impl<'a, 'i, 'f> Cx<'a, 'i, 'f> {
    pub fn new(
        op: &'a Op,
        inputs: &'a [Option<InferInput<'i>>],
        n_out: usize,
        fresh: &'a mut Fresh<'f>,
    ) -> Result<Self, String> {
        for (i, inp) in inputs.iter().enumerate() {
            let Some(inp) = inp else { continue };
            for (j, d) in inp.ty.dims.iter().enumerate() {
                if let Some(v) = d.as_known().filter(|v| *v < 0) {
                    return Err(format!("operand {i} has negative dim {v} at axis {j}"));
                }
            }
        }
        Ok(Cx {
            op,
            inputs,
            n_out,
            fresh,
        })
    }

    /// A fresh symbol named after the op.
    pub fn fresh(&mut self) -> Dim {
        let hint = self.op.name();
        (self.fresh)(hint)
    }

    pub fn fresh_n(&mut self, n: usize) -> Vec<Dim> {
        (0..n).map(|_| self.fresh()).collect()
    }

    /// Runs `f` on a context whose operands are this one's at `picks`, in order (`None`
    /// for an absent one): reuses a rule written for another operand layout.
    pub fn with_operands<T>(
        &mut self,
        picks: &[Option<usize>],
        f: impl FnOnce(&mut Cx<'_, 'i, '_>) -> T,
    ) -> T {
        let inputs: Vec<Option<InferInput<'i>>> = picks
            .iter()
            .map(|p| p.and_then(|i| self.input(i)))
            .collect();
        let mut sub = Cx {
            op: self.op,
            inputs: &inputs,
            n_out: self.n_out,
            fresh: &mut *self.fresh,
        };
        f(&mut sub)
    }

    /// Number of operand positions (present or not).
    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    /// Checks the operand count is in `min..=max`.
    pub fn arity(&self, min: usize, max: usize) -> Result<(), String> {
        let n = self.inputs.len();
        if n >= min && n <= max {
            return Ok(());
        }
        Err(if min == max {
            format!("expects {min} operand(s), got {n}")
        } else if max == usize::MAX {
            format!("expects at least {min} operand(s), got {n}")
        } else {
            format!("expects {min} to {max} operands, got {n}")
        })
    }

    pub fn input(&self, i: usize) -> Option<InferInput<'i>> {
        self.inputs.get(i).copied().flatten()
    }

    pub fn present(&self, i: usize) -> bool {
        self.input(i).is_some()
    }

    /// The type of a required operand.
    pub fn ty(&self, i: usize) -> Result<&'i TensorType, String> {
        self.input(i)
            .map(|x| x.ty)
            .ok_or_else(|| format!("operand {i} is missing"))
    }

    pub fn opt_ty(&self, i: usize) -> Option<&'i TensorType> {
        self.input(i).map(|x| x.ty)
    }

    /// The type of a required operand whose dtype must be an integer type.
    pub fn int_ty(&self, i: usize, what: &str) -> Result<&'i TensorType, String> {
        let t = self.ty(i)?;
        if !t.dtype.is_int() {
            return Err(format!(
                "{what} (operand {i}) must be integer, got {}",
                t.dtype
            ));
        }
        Ok(t)
    }

    /// The type of a required operand of rank `rank`.
    pub fn ranked(&self, i: usize, rank: usize, what: &str) -> Result<&'i TensorType, String> {
        let t = self.ty(i)?;
        if t.rank() != rank {
            return Err(format!(
                "{what} (operand {i}) must have rank {rank}, got {}",
                t.rank()
            ));
        }
        Ok(t)
    }

    /// The elements of an integer (or bool) operand, row-major, when known.
    pub fn values(&self, i: usize) -> Option<Vec<Dim>> {
        let inp = self.input(i)?;
        let ty = inp.ty;
        if !(ty.dtype.is_int() || ty.dtype == DType::Bool) {
            return None;
        }
        let n = elem_count(&ty.dims).filter(|n| *n <= MAX_READ)?;
        if let Some(s) = inp.sym {
            if s.len() == n {
                return Some(s.to_vec());
            }
        }
        let k = inp.konst.filter(|k| konst_ok(k) && k.num_elements() == n)?;
        Some(k.to_i64s()?.into_iter().map(Dim::known).collect())
    }

    /// The elements of an integer operand when all are known numbers.
    pub fn ints(&self, i: usize) -> Option<Vec<i64>> {
        self.values(i)?.iter().map(Dim::as_known).collect()
    }

    /// The elements of any operand as f64 when it is a constant or known integers.
    pub fn floats(&self, i: usize) -> Option<Vec<f64>> {
        let inp = self.input(i)?;
        let n = elem_count(&inp.ty.dims).filter(|n| *n <= MAX_READ)?;
        if let Some(k) = inp.konst.filter(|k| konst_ok(k) && k.num_elements() == n) {
            return Some(k.to_f64s());
        }
        Some(self.ints(i)?.into_iter().map(|v| v as f64).collect())
    }

    /// The single element of an operand holding one value.
    pub fn scalar(&self, i: usize) -> Option<Dim> {
        let v = self.values(i)?;
        (v.len() == 1).then(|| v[0].clone())
    }

    /// NumPy multidirectional broadcasting. `shapes` pairs an operand index (for messages)
    /// with its dims. Two different symbolic dims give a fresh symbol; a symbolic dim and a
    /// known dim other than 1 give the known dim.
    pub fn broadcast(&mut self, shapes: &[(usize, &[Dim])]) -> Result<Vec<Dim>, String> {
        let rank = shapes.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
        let mut out = Vec::with_capacity(rank);
        for p in 0..rank {
            let mut known: Option<(i64, usize)> = None;
            let mut symbolic: Vec<&Dim> = Vec::new();
            for (j, s) in shapes {
                let off = rank - s.len();
                if p < off {
                    continue;
                }
                let d = &s[p - off];
                match d.as_known() {
                    Some(1) => {}
                    Some(v) => match known {
                        Some((k, kj)) if k != v => {
                            return Err(format!(
                                "broadcast: dim {p} is {k} in operand {kj} and {v} in operand {j}"
                            ))
                        }
                        Some(_) => {}
                        None => known = Some((v, *j)),
                    },
                    None => {
                        if !symbolic.contains(&d) {
                            symbolic.push(d);
                        }
                    }
                }
            }
            out.push(match (known, symbolic.len()) {
                (Some((k, _)), _) => Dim::known(k),
                (None, 0) => Dim::known(1),
                (None, 1) => symbolic[0].clone(),
                (None, _) => self.fresh(),
            });
        }
        Ok(out)
    }
}

/// Normalises an axis against `rank` (negative counts from the end).
pub(super) fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    if a < -r || a >= r {
        return Err(format!("axis {a} out of range for rank {rank}"));
    }
    Ok(if a < 0 { a + r } else { a } as usize)
}

/// Normalises a list of distinct axes.
pub(super) fn axes(list: &[i64], rank: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(list.len());
    for &a in list {
        let n = axis(a, rank)?;
        if out.contains(&n) {
            return Err(format!("axis {a} is repeated"));
        }
        out.push(n);
    }
    Ok(out)
}

/// The axes of an op that takes them in an attribute or as an optional operand
/// (Reduce, Squeeze, Unsqueeze).
pub(super) enum OpAxes {
    /// The attribute's, or the operand's when its values are known at compile time.
    Known(Vec<i64>),
    /// Decided at run time by an operand of this length (`None`: unknown).
    RunTime(Option<usize>),
}

/// Reads the axes from operand `i` (a 1-D integer tensor) when it is present, else from
/// the attribute `attr`. Both at once is an error.
pub(super) fn op_axes(cx: &Cx<'_, '_, '_>, attr: &[i64], i: usize) -> Result<OpAxes, String> {
    if !cx.present(i) {
        return Ok(OpAxes::Known(attr.to_vec()));
    }
    if !attr.is_empty() {
        return Err(format!(
            "axes given both as the attribute {attr:?} and as operand {i}"
        ));
    }
    let t = cx.int_ty(i, "axes")?;
    if t.rank() != 1 {
        return Err(format!("axes (operand {i}) must be 1-D, got {t}"));
    }
    if let Some(v) = cx.ints(i) {
        return Ok(OpAxes::Known(v));
    }
    Ok(match t.dims[0].as_known() {
        Some(0) => OpAxes::Known(vec![]),
        Some(l) => {
            let l = usize::try_from(l).map_err(|_| format!("axes (operand {i}) has length {l}"))?;
            check_inferred_rank(l, &format!("axes (operand {i})"))?;
            OpAxes::RunTime(Some(l))
        }
        None => OpAxes::RunTime(None),
    })
}

/// The most dims a result whose rank is read from an operand's length (Reshape's shape,
/// Unsqueeze's axes, ConstantOfShape's shape) may have. No real model comes near it; a
/// hostile length would otherwise make inference allocate that many symbols.
pub(super) const MAX_INFERRED_RANK: usize = 256;

/// Refuses a rank, read from `what`'s length, above [`MAX_INFERRED_RANK`].
pub(super) fn check_inferred_rank(len: usize, what: &str) -> Result<(), String> {
    if len > MAX_INFERRED_RANK {
        return Err(format!(
            "{what} has length {len}, which would give a result of rank {len}; \
             at most {MAX_INFERRED_RANK} is supported"
        ));
    }
    Ok(())
}

/// The element count when every dim is known (checked).
pub(super) fn elem_count(dims: &[Dim]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, d| {
        acc.checked_mul(usize::try_from(d.as_known()?).ok()?)
    })
}

/// The dims as sizes when all are known.
pub(super) fn known_shape(dims: &[Dim]) -> Option<Vec<usize>> {
    dims.iter()
        .map(|d| usize::try_from(d.as_known()?).ok())
        .collect()
}

/// Whether a constant's bytes match its shape (so reading it cannot go out of bounds).
pub(super) fn konst_ok(k: &ConstData) -> bool {
    k.dims
        .iter()
        .try_fold(k.dtype.size_of(), |acc, &d| acc.checked_mul(d))
        == Some(k.bytes.len())
}

/// An arithmetic result that must exist for a shape.
pub(super) fn ck(d: Option<Dim>) -> Result<Dim, String> {
    d.ok_or_else(|| "dim arithmetic overflows i64".to_string())
}

/// Whether element values make sense for this dtype.
pub(super) fn valued(dtype: DType) -> bool {
    dtype.is_int() || dtype == DType::Bool
}

/// For each element of a result of shape `out`, the flat index it reads in each operand
/// (NumPy broadcasting). `None` if the result is too large to enumerate.
pub(super) fn broadcast_index(out: &[usize], operands: &[Vec<usize>]) -> Option<Vec<Vec<usize>>> {
    let n = out.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if n > MAX_SYM {
        return None;
    }
    let mut res = Vec::with_capacity(n);
    let mut coord = vec![0usize; out.len()];
    for flat in 0..n {
        let mut rem = flat;
        for k in (0..out.len()).rev() {
            coord[k] = rem % out[k].max(1);
            rem /= out[k].max(1);
        }
        let mut idx = Vec::with_capacity(operands.len());
        for shape in operands {
            let off = out.len().checked_sub(shape.len())?;
            let mut f = 0usize;
            for (k, &d) in shape.iter().enumerate() {
                let c = if d == 1 { 0 } else { coord[off + k] };
                f = f * d + c;
            }
            idx.push(f);
        }
        res.push(idx);
    }
    Some(res)
}

/// Elementwise values of a broadcast op: `f` combines one element of each operand.
pub(super) fn broadcast_values(
    out: &[Dim],
    operands: &[(&[Dim], &[Dim])],
    mut f: impl FnMut(&[&Dim]) -> Option<Dim>,
) -> Option<Vec<Dim>> {
    let out = known_shape(out)?;
    let shapes: Vec<Vec<usize>> = operands
        .iter()
        .map(|(dims, _)| known_shape(dims))
        .collect::<Option<_>>()?;
    let index = broadcast_index(&out, &shapes)?;
    let mut res = Vec::with_capacity(index.len());
    for idx in index {
        let args: Vec<&Dim> = idx
            .iter()
            .zip(operands)
            .map(|(&i, (_, vals))| vals.get(i))
            .collect::<Option<_>>()?;
        res.push(f(&args)?);
    }
    Some(res)
}

/// The product of dims as a shape dim.
pub(super) fn prod(dims: &[Dim]) -> Result<Dim, String> {
    ck(arith::product(dims))
}
