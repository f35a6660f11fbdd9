//! Symbols defined from other symbols: what a polynomial dim cannot say about shape
//! arithmetic, evaluated on the host when a call binds its inputs.
//!
//! Dims are polynomials over symbols, so a convolution's output size over a symbolic input
//! (`floor((height + 5) / 2)`) or a broadcast of two different symbols is a fresh symbol.
//! Left undefined, such a symbol is known only once the kernel producing the buffer has run
//! on the host, and every buffer it sizes must live in host memory (`Storage::Dynamic`),
//! which keeps all the work downstream off the GPU. A [`SymbolDef`] records how to compute
//! the symbol from symbols bound earlier (the inputs', or earlier definitions), so the
//! runtime binds it right after the inputs, before any work runs, and such buffers are
//! sized per call like any other.

use std::collections::HashMap;
use std::fmt;

use crate::{Bindings, Dim, Symbol};

/// How a defined symbol's value follows from symbols bound before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SymbolExpr {
    /// `floor(num / den)`, `den > 0`; a size, so `num` must not be negative.
    FloorDiv { num: Dim, den: i64 },
    /// `num mod den` (non-negative remainder), `den > 0`.
    Mod { num: Dim, den: i64 },
    /// The size two broadcast dims give: `a` where `b` is 1, else `b` (and then `a` must be
    /// 1 or equal to it).
    Broadcast { a: Dim, b: Dim },
}

/// One defined symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolDef {
    pub symbol: Symbol,
    pub expr: SymbolExpr,
}

impl SymbolExpr {
    /// The dims the expression reads.
    pub fn operands(&self) -> Vec<&Dim> {
        match self {
            SymbolExpr::FloorDiv { num, .. } | SymbolExpr::Mod { num, .. } => vec![num],
            SymbolExpr::Broadcast { a, b } => vec![a, b],
        }
    }

    /// The symbols the expression reads.
    pub fn symbols(&self) -> Vec<Symbol> {
        self.operands().into_iter().flat_map(Dim::symbols).collect()
    }

    /// The value under `values`; the error says which symbol is unbound or why the value is
    /// not a size.
    pub fn eval(&self, values: &HashMap<Symbol, i64>) -> Result<i64, String> {
        let ev = |d: &Dim| d.eval(values).map_err(|e| format!("`{d}`: {e}"));
        match self {
            SymbolExpr::FloorDiv { num, den } => {
                let n = ev(num)?;
                if *den <= 0 {
                    return Err(format!("divisor {den} is not positive"));
                }
                if n < 0 {
                    return Err(format!(
                        "`{num}` = {n} is negative (the input is too small)"
                    ));
                }
                Ok(n / den)
            }
            SymbolExpr::Mod { num, den } => {
                if *den <= 0 {
                    return Err(format!("divisor {den} is not positive"));
                }
                Ok(ev(num)?.rem_euclid(*den))
            }
            SymbolExpr::Broadcast { a, b } => {
                let (x, y) = (ev(a)?, ev(b)?);
                match (x, y) {
                    (x, 1) => Ok(x),
                    (1, y) => Ok(y),
                    (x, y) if x == y => Ok(x),
                    (x, y) => Err(format!(
                        "`{a}` = {x} and `{b}` = {y} do not broadcast (neither is 1)"
                    )),
                }
            }
        }
    }
}

impl fmt::Display for SymbolExpr {
    /// `floordiv(height + 5, 2)`, `mod(seq, 4)`, `broadcast(_conv1, _conv2)`: the program
    /// text's form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SymbolExpr::FloorDiv { num, den } => write!(f, "floordiv({num}, {den})"),
            SymbolExpr::Mod { num, den } => write!(f, "mod({num}, {den})"),
            SymbolExpr::Broadcast { a, b } => write!(f, "broadcast({a}, {b})"),
        }
    }
}

impl fmt::Display for SymbolDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}", self.symbol.name(), self.expr)
    }
}

/// Binds every symbol of `defs`, in order, from what `bindings` holds (the inputs' symbols,
/// then each earlier definition). A symbol already bound (a caller's `--dim`) must agree.
pub fn bind_defined(defs: &[SymbolDef], bindings: &mut Bindings) -> Result<(), String> {
    for def in defs {
        let v = def
            .expr
            .eval(&bindings.as_map())
            .map_err(|e| format!("symbol `{}` = {}: {e}", def.symbol.name(), def.expr))?;
        let what = format!("its definition `{def}`");
        let value = usize::try_from(v)
            .map_err(|_| format!("symbol `{}` = {v} is not a size", def.symbol.name()))?;
        bindings.unify(&Dim::from_symbol(def.symbol.clone()), value, &what)?;
    }
    Ok(())
}

/// The largest value of each defined symbol when the symbols it reads are at most their
/// `bounds` (which it extends): what static memory planning needs. A definition whose
/// operands lack a bound gets none.
pub fn extend_bounds(defs: &[SymbolDef], bounds: &mut HashMap<Symbol, i64>) {
    for def in defs {
        let max = |d: &Dim| d.max_value(bounds).ok();
        let value = match &def.expr {
            SymbolExpr::FloorDiv { num, den } => max(num).map(|n| n.max(0) / den.max(&1)),
            SymbolExpr::Mod { den, .. } => Some(den - 1),
            SymbolExpr::Broadcast { a, b } => max(a).zip(max(b)).map(|(x, y)| x.max(y)),
        };
        if let Some(v) = value {
            bounds.entry(def.symbol.clone()).or_insert(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, i64)]) -> HashMap<Symbol, i64> {
        pairs.iter().map(|(s, v)| (Symbol::new(s), *v)).collect()
    }

    #[test]
    fn floor_division_matches_a_strided_window() {
        // A 7x7 conv, stride 2, pads 3+3 over 224 and 223: floor((h + 6 - 7 + 2) / 2).
        let e = SymbolExpr::FloorDiv {
            num: Dim::symbol("h").add(&Dim::known(1)),
            den: 2,
        };
        assert_eq!(e.eval(&map(&[("h", 224)])), Ok(112));
        assert_eq!(e.eval(&map(&[("h", 223)])), Ok(112));
        assert_eq!(e.eval(&map(&[("h", 1)])), Ok(1));
        let neg = SymbolExpr::FloorDiv {
            num: Dim::symbol("h").sub(&Dim::known(5)),
            den: 2,
        };
        assert!(neg
            .eval(&map(&[("h", 2)]))
            .unwrap_err()
            .contains("negative"));
        assert!(e.eval(&map(&[])).unwrap_err().contains("h"));
    }

    #[test]
    fn mod_and_broadcast_follow_their_definitions() {
        let m = SymbolExpr::Mod {
            num: Dim::symbol("s"),
            den: 4,
        };
        assert_eq!(m.eval(&map(&[("s", 10)])), Ok(2));
        let b = SymbolExpr::Broadcast {
            a: Dim::symbol("x"),
            b: Dim::symbol("y"),
        };
        assert_eq!(b.eval(&map(&[("x", 1), ("y", 5)])), Ok(5));
        assert_eq!(b.eval(&map(&[("x", 5), ("y", 1)])), Ok(5));
        assert_eq!(b.eval(&map(&[("x", 5), ("y", 5)])), Ok(5));
        assert!(b
            .eval(&map(&[("x", 4), ("y", 5)]))
            .unwrap_err()
            .contains("do not broadcast"));
    }

    #[test]
    fn binding_goes_in_order_and_checks_a_preset_value() {
        let defs = vec![
            SymbolDef {
                symbol: Symbol::new("a"),
                expr: SymbolExpr::FloorDiv {
                    num: Dim::symbol("h").add(&Dim::known(1)),
                    den: 2,
                },
            },
            SymbolDef {
                symbol: Symbol::new("b"),
                expr: SymbolExpr::FloorDiv {
                    num: Dim::symbol("a").add(&Dim::known(1)),
                    den: 2,
                },
            },
        ];
        let mut bindings = Bindings::with([(Symbol::new("h"), 9)]);
        bind_defined(&defs, &mut bindings).unwrap();
        assert_eq!(bindings.get(&Symbol::new("a")), Some(5));
        assert_eq!(bindings.get(&Symbol::new("b")), Some(3));
        let mut clash = Bindings::with([(Symbol::new("h"), 9), (Symbol::new("a"), 4)]);
        let e = bind_defined(&defs, &mut clash).unwrap_err();
        assert!(e.contains("symbol `a`"), "{e}");

        let mut bounds = map(&[("h", 224)]);
        extend_bounds(&defs, &mut bounds);
        assert_eq!(bounds[&Symbol::new("a")], 112);
        assert_eq!(bounds[&Symbol::new("b")], 56);
    }
}
