//! Symbolic dimensions: integer polynomials over named symbols.
//!
//! ONNX exports leave sequence length and batch size open (`batch`, `seq`). Shape arithmetic
//! in exported graphs (Shape → Gather → Concat → Reshape) produces sums (`past + seq`),
//! scalings (`2*seq`) and products (`batch*seq` when heads are merged), so a dim is a
//! polynomial with integer coefficients. That is closed under +, - and *, and exact division
//! is decided syntactically. Anything else (floor division of a symbol by a stride, a
//! data-dependent size) becomes a fresh symbol chosen by the caller.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

/// A named symbol such as `seq`. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Symbol(Arc<str>);

impl Symbol {
    /// Makes a symbol; `name` must be a valid identifier (see [`is_identifier`]).
    pub fn new(name: &str) -> Symbol {
        debug_assert!(is_identifier(name), "bad symbol name {name:?}");
        Symbol(Arc::from(name))
    }

    pub fn name(&self) -> &str {
        &self.0
    }
}

/// Whether `s` can name a symbol: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Turns any string into a valid symbol name (used for ONNX `dim_param`s like `batch size`).
pub fn sanitize_identifier(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    out
}

/// A product of symbols (sorted, with repetition); empty for the constant term.
type Monomial = Vec<Symbol>;

/// One dimension: a polynomial with integer coefficients over symbols.
///
/// Invariant: `terms` has no zero coefficients, so two equal polynomials compare equal and a
/// known dim is exactly a map with at most the empty monomial.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Dim {
    terms: BTreeMap<Monomial, i64>,
}

/// Why a symbolic dim could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DimError {
    #[error("symbol `{0}` is not bound")]
    Unbound(String),
    #[error("dim `{0}` overflows i64")]
    Overflow(String),
}

impl Dim {
    /// A known dim.
    pub fn known(n: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if n != 0 {
            terms.insert(Vec::new(), n);
        }
        Dim { terms }
    }

    /// A dim equal to one symbol.
    pub fn symbol(name: &str) -> Dim {
        Dim::from_symbol(Symbol::new(name))
    }

    pub fn from_symbol(s: Symbol) -> Dim {
        let mut terms = BTreeMap::new();
        terms.insert(vec![s], 1);
        Dim { terms }
    }

    /// The value if the dim has no symbols.
    pub fn as_known(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    pub fn is_known(&self) -> bool {
        self.as_known().is_some()
    }

    /// The one symbol this dim is, if it is exactly a symbol (`seq`, not `2*seq`).
    pub fn as_symbol(&self) -> Option<&Symbol> {
        match self.terms.iter().next() {
            Some((m, 1)) if self.terms.len() == 1 && m.len() == 1 => Some(&m[0]),
            _ => None,
        }
    }

    /// Every symbol the dim mentions.
    pub fn symbols(&self) -> Vec<Symbol> {
        let mut out: Vec<Symbol> = self.terms.keys().flatten().cloned().collect();
        out.sort();
        out.dedup();
        out
    }

    fn from_terms(terms: impl IntoIterator<Item = (Monomial, i64)>) -> Dim {
        let mut map: BTreeMap<Monomial, i64> = BTreeMap::new();
        for (m, c) in terms {
            *map.entry(m).or_insert(0) += c;
        }
        map.retain(|_, c| *c != 0);
        Dim { terms: map }
    }

    pub fn add(&self, other: &Dim) -> Dim {
        Dim::from_terms(
            self.terms
                .iter()
                .chain(&other.terms)
                .map(|(m, c)| (m.clone(), *c)),
        )
    }

    pub fn sub(&self, other: &Dim) -> Dim {
        self.add(&other.scale(-1))
    }

    pub fn scale(&self, k: i64) -> Dim {
        Dim::from_terms(self.terms.iter().map(|(m, c)| (m.clone(), c * k)))
    }

    pub fn mul(&self, other: &Dim) -> Dim {
        let mut out = Vec::new();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m: Monomial = ma.iter().chain(mb).cloned().collect();
                m.sort();
                out.push((m, ca * cb));
            }
        }
        Dim::from_terms(out)
    }

    /// `self / other` when the division is exact for every value of the symbols:
    /// `other` is a single term (`k`, `seq`, `3*batch`) dividing every term of `self`.
    pub fn div_exact(&self, other: &Dim) -> Option<Dim> {
        if other.terms.len() != 1 {
            return if self == other {
                Some(Dim::known(1))
            } else {
                None
            };
        }
        let (dm, dc) = other.terms.iter().next().unwrap();
        let mut out = Vec::new();
        for (m, c) in &self.terms {
            if c % dc != 0 {
                return None;
            }
            let mut rest = m.clone();
            for s in dm {
                let pos = rest.iter().position(|x| x == s)?;
                rest.remove(pos);
            }
            out.push((rest, c / dc));
        }
        Some(Dim::from_terms(out))
    }

    /// The value under `bindings`, checked for overflow.
    pub fn eval(&self, bindings: &HashMap<Symbol, i64>) -> Result<i64, DimError> {
        let overflow = || DimError::Overflow(self.to_string());
        let mut total: i64 = 0;
        for (m, c) in &self.terms {
            let mut term = *c;
            for s in m {
                let v = *bindings
                    .get(s)
                    .ok_or_else(|| DimError::Unbound(s.name().to_string()))?;
                term = term.checked_mul(v).ok_or_else(overflow)?;
            }
            total = total.checked_add(term).ok_or_else(overflow)?;
        }
        Ok(total)
    }

    /// The largest value the dim can take when every symbol lies in `0..=bounds[s]`, checked
    /// for overflow: each term with a positive coefficient at its symbols' bounds, each
    /// non-constant term with a negative one at 0 (its largest value, as symbols are never
    /// negative). Exact for polynomials with non-negative coefficients (`768*batch*seq`,
    /// `past + seq`); an upper bound for the others (`seq - 1`).
    pub fn max_value(&self, bounds: &HashMap<Symbol, i64>) -> Result<i64, DimError> {
        let overflow = || DimError::Overflow(self.to_string());
        let mut total: i64 = 0;
        for (m, c) in &self.terms {
            if *c < 0 && !m.is_empty() {
                continue;
            }
            let mut term = *c;
            for s in m {
                let v = *bounds
                    .get(s)
                    .ok_or_else(|| DimError::Unbound(s.name().to_string()))?;
                term = term.checked_mul(v.max(0)).ok_or_else(overflow)?;
            }
            total = total.checked_add(term).ok_or_else(overflow)?;
        }
        Ok(total)
    }

    /// Substitutes symbols that `bindings` names by their dims; others stay.
    pub fn substitute(&self, bindings: &HashMap<Symbol, Dim>) -> Dim {
        let mut out = Dim::known(0);
        for (m, c) in &self.terms {
            let mut term = Dim::known(*c);
            for s in m {
                let f = bindings
                    .get(s)
                    .cloned()
                    .unwrap_or_else(|| Dim::from_symbol(s.clone()));
                term = term.mul(&f);
            }
            out = out.add(&term);
        }
        out
    }
}

impl From<i64> for Dim {
    fn from(n: i64) -> Dim {
        Dim::known(n)
    }
}

impl fmt::Display for Dim {
    /// Prints `768`, `seq`, `2*seq`, `past + seq`, `batch*seq - 1`: terms of higher degree
    /// first, the constant last, so the text parser reads it back to an equal `Dim`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let mut ordered: Vec<(&Monomial, i64)> = self.terms.iter().map(|(m, c)| (m, *c)).collect();
        ordered.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
        for (i, (m, c)) in ordered.into_iter().enumerate() {
            let mag = c.unsigned_abs();
            if i == 0 {
                if c < 0 {
                    f.write_str("-")?;
                }
            } else {
                f.write_str(if c < 0 { " - " } else { " + " })?;
            }
            let names: Vec<&str> = m.iter().map(|s| s.name()).collect();
            match (mag, names.is_empty()) {
                (_, true) => write!(f, "{mag}")?,
                (1, false) => write!(f, "{}", names.join("*"))?,
                (_, false) => write!(f, "{mag}*{}", names.join("*"))?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_normalises() {
        let seq = Dim::symbol("seq");
        let past = Dim::symbol("past");
        let total = past.add(&seq);
        assert_eq!(total.to_string(), "past + seq");
        assert_eq!(total.sub(&seq), past);
        assert_eq!(seq.scale(2).to_string(), "2*seq");
        let b = Dim::symbol("batch");
        let prod = b.mul(&seq).mul(&Dim::known(768));
        assert_eq!(prod.to_string(), "768*batch*seq");
        assert_eq!(prod.div_exact(&b.mul(&seq)), Some(Dim::known(768)));
        assert_eq!(prod.div_exact(&Dim::known(12)), Some(b.mul(&seq).scale(64)));
        assert_eq!(seq.div_exact(&Dim::known(2)), None);
        assert_eq!(seq.sub(&Dim::known(1)).to_string(), "seq - 1");
        assert_eq!(Dim::known(-3).to_string(), "-3");
        assert_eq!(Dim::known(0).as_known(), Some(0));
    }

    #[test]
    fn eval_and_errors() {
        let d = Dim::symbol("past").add(&Dim::symbol("seq").scale(2));
        let mut env = HashMap::new();
        env.insert(Symbol::new("past"), 5);
        assert_eq!(d.eval(&env), Err(DimError::Unbound("seq".into())));
        env.insert(Symbol::new("seq"), 7);
        assert_eq!(d.eval(&env), Ok(19));
        env.insert(Symbol::new("seq"), i64::MAX);
        assert!(matches!(d.eval(&env), Err(DimError::Overflow(_))));
    }

    #[test]
    fn max_value_bounds_every_value() {
        let mut bounds = HashMap::new();
        bounds.insert(Symbol::new("seq"), 128);
        bounds.insert(Symbol::new("batch"), 2);
        let (seq, batch) = (Dim::symbol("seq"), Dim::symbol("batch"));
        let prod = batch.mul(&seq).scale(768);
        assert_eq!(prod.max_value(&bounds), Ok(768 * 2 * 128));
        // A negative term is largest at 0; a negative constant is exact.
        assert_eq!(seq.sub(&batch).max_value(&bounds), Ok(128));
        assert_eq!(seq.sub(&Dim::known(1)).max_value(&bounds), Ok(127));
        assert_eq!(
            Dim::symbol("past").max_value(&bounds),
            Err(DimError::Unbound("past".into()))
        );
        bounds.insert(Symbol::new("seq"), i64::MAX);
        assert!(matches!(
            prod.max_value(&bounds),
            Err(DimError::Overflow(_))
        ));
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("batch_size"));
        assert!(!is_identifier("2x"));
        assert_eq!(sanitize_identifier("batch size"), "batch_size");
        assert_eq!(sanitize_identifier("3d"), "_3d");
    }
}
