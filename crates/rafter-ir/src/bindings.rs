//! Symbol values bound from the tensors a graph or program is run on.
//!
//! Every executor checks its inputs against their symbolic types and binds the symbols on
//! first sight (`seq` = 7 from `input_ids`), so that a later tensor contradicting a symbol
//! (`seq` = 13 in `attention_mask`) is an error naming both places. The reference executor,
//! the runtime and the command line share this one implementation; each passes its own
//! tensor type through [`Shaped`].

use std::collections::HashMap;

use crate::{DType, Dim, Symbol, TensorType};

/// What [`Bindings::check`] reads of a tensor: its element type and shape.
pub trait Shaped {
    /// The element type.
    fn dtype(&self) -> DType;
    /// The dims, outermost first.
    fn shape(&self) -> &[usize];
}

/// Symbol values bound while running, with where each was bound (for error messages).
#[derive(Default, Debug, Clone)]
pub struct Bindings {
    values: HashMap<Symbol, (i64, String)>,
}

impl Bindings {
    /// Pre-binds symbols (the CLI's `--dim seq=128`).
    pub fn with(values: impl IntoIterator<Item = (Symbol, i64)>) -> Bindings {
        let values = values
            .into_iter()
            .map(|(s, v)| (s, (v, "--dim".to_string())))
            .collect();
        Bindings { values }
    }

    /// The value of `s`, if bound.
    pub fn get(&self, s: &Symbol) -> Option<i64> {
        self.values.get(s).map(|v| v.0)
    }

    /// Plain symbol → value map, for `Dim::eval`.
    pub fn as_map(&self) -> HashMap<Symbol, i64> {
        self.values.iter().map(|(k, v)| (k.clone(), v.0)).collect()
    }

    /// Checks `actual` against the dim `d`, binding `d`'s symbol if it is a lone unbound
    /// symbol. `what` says where the value came from ("input `x` dim 1").
    pub fn unify(&mut self, d: &Dim, actual: usize, what: &str) -> Result<(), String> {
        let actual = actual as i64;
        if let Some(s) = d.as_symbol() {
            return match self.values.get(s) {
                Some((v, _)) if *v == actual => Ok(()),
                Some((v, from)) => Err(format!(
                    "{what} is {actual} but symbol `{}` is {v} (bound by {from})",
                    s.name()
                )),
                None => {
                    self.values.insert(s.clone(), (actual, what.to_string()));
                    Ok(())
                }
            };
        }
        match d.eval(&self.as_map()) {
            Ok(v) if v == actual => Ok(()),
            Ok(v) => Err(format!("{what} is {actual} but its type says `{d}` = {v}")),
            // An expression over a symbol not bound yet: nothing to check against.
            Err(_) => Ok(()),
        }
    }

    /// Checks a whole tensor against a type (dtype, rank, dims), binding its symbols.
    pub fn check(&mut self, ty: &TensorType, t: &impl Shaped, what: &str) -> Result<(), String> {
        if t.dtype() != ty.dtype {
            return Err(format!(
                "{what} has dtype {} but {} is expected",
                t.dtype(),
                ty.dtype
            ));
        }
        let shape = t.shape();
        if shape.len() != ty.rank() {
            return Err(format!(
                "{what} has shape {shape:?} (rank {}) but {ty} (rank {}) is expected",
                shape.len(),
                ty.rank()
            ));
        }
        for (i, (d, &a)) in ty.dims.iter().zip(shape).enumerate() {
            self.unify(d, a, &format!("{what} dim {i}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct T(DType, Vec<usize>);

    impl Shaped for T {
        fn dtype(&self) -> DType {
            self.0
        }
        fn shape(&self) -> &[usize] {
            &self.1
        }
    }

    #[test]
    fn symbols_bind_once_and_contradictions_name_both_places() {
        let seq = Dim::symbol("seq");
        let ty = TensorType::new(DType::I64, vec![Dim::from(1), seq.clone()]);
        let mut b = Bindings::default();
        b.check(&ty, &T(DType::I64, vec![1, 7]), "input `ids`")
            .unwrap();
        assert_eq!(b.get(seq.as_symbol().unwrap()), Some(7));
        let e = b
            .check(&ty, &T(DType::I64, vec![1, 13]), "input `mask`")
            .unwrap_err();
        assert!(
            e.contains("input `mask` dim 1 is 13") && e.contains("input `ids` dim 1"),
            "{e}"
        );
        let e = b.check(&ty, &T(DType::F32, vec![1, 7]), "x").unwrap_err();
        assert!(e.contains("dtype f32"), "{e}");
        let e = b.check(&ty, &T(DType::I64, vec![7]), "x").unwrap_err();
        assert!(e.contains("rank 1"), "{e}");
        let twice = TensorType::new(DType::I64, vec![seq.add(&seq)]);
        b.check(&twice, &T(DType::I64, vec![14]), "y").unwrap();
        assert!(b.check(&twice, &T(DType::I64, vec![15]), "y").is_err());
    }
}
