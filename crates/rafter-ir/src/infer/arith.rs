//! Overflow-checked arithmetic on [`Dim`]s, and what can be proved about their sign.
//!
//! `Dim`'s own operators use plain `i64` arithmetic, which panics (debug) or wraps
//! (release) on overflow. Inference must never panic on any input, so every operation here
//! first bounds the result: the sum of absolute coefficients (the L1 norm) of a sum is at
//! most the sum of the norms, and of a product at most the product of the norms. The
//! coefficients are read back from the dim's canonical text form (`Dim` does not expose
//! its terms); the printer and parser are defined to round-trip, so this is exact.
//!
//! Every symbol stands for a size and so is non-negative. A polynomial whose coefficients
//! are all non-negative is therefore non-negative for every binding, which is what
//! [`nonneg`] and [`le`] use to prove slice bounds.

use crate::Dim;
use std::collections::HashMap;

/// Norm bound for symbolic results: coefficients stay far from `i64` overflow.
const LIMIT: u128 = 1 << 62;

/// One term of a dim: its coefficient and its symbols (with repetition).
pub(super) type Term = (i128, Vec<String>);

/// The terms of `d`, read back from its canonical text form.
pub(super) fn terms(d: &Dim) -> Vec<Term> {
    if let Some(k) = d.as_known() {
        return if k == 0 {
            Vec::new()
        } else {
            vec![(k as i128, Vec::new())]
        };
    }
    let text = d.to_string();
    let mut out = Vec::new();
    let (mut negative, mut rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.as_str()),
    };
    loop {
        let plus = rest.find(" + ");
        let minus = rest.find(" - ");
        let (term, next) = match (plus, minus) {
            (Some(p), Some(m)) if p < m => (&rest[..p], Some((false, &rest[p + 3..]))),
            (Some(_), Some(m)) => (&rest[..m], Some((true, &rest[m + 3..]))),
            (Some(p), None) => (&rest[..p], Some((false, &rest[p + 3..]))),
            (None, Some(m)) => (&rest[..m], Some((true, &rest[m + 3..]))),
            (None, None) => (rest, None),
        };
        let mut pieces = term.split('*').peekable();
        let mut coef: i128 = 1;
        if let Some(first) = pieces.peek() {
            if first.bytes().all(|b| b.is_ascii_digit()) && !first.is_empty() {
                coef = first
                    .parse::<u64>()
                    .map(i128::from)
                    .unwrap_or(i128::MAX / 4);
                pieces.next();
            }
        }
        let syms: Vec<String> = pieces.map(str::to_string).collect();
        out.push((if negative { -coef } else { coef }, syms));
        match next {
            Some((neg, r)) => {
                negative = neg;
                rest = r;
            }
            None => break,
        }
    }
    out
}

/// Sum of the absolute values of the coefficients.
pub(super) fn norm(d: &Dim) -> u128 {
    if let Some(k) = d.as_known() {
        return k.unsigned_abs() as u128;
    }
    terms(d).iter().map(|(c, _)| c.unsigned_abs()).sum()
}

/// Whether `d >= 0` for every binding of its symbols to sizes (all coefficients >= 0).
pub(super) fn nonneg(d: &Dim) -> bool {
    match d.as_known() {
        Some(k) => k >= 0,
        None => terms(d).iter().all(|(c, _)| *c >= 0),
    }
}

/// Whether `a <= b` provably.
pub(super) fn le(a: &Dim, b: &Dim) -> bool {
    sub(b, a).is_some_and(|d| nonneg(&d))
}

pub(super) fn add(a: &Dim, b: &Dim) -> Option<Dim> {
    if let (Some(x), Some(y)) = (a.as_known(), b.as_known()) {
        return x.checked_add(y).map(Dim::known);
    }
    (norm(a) + norm(b) < LIMIT).then(|| a.add(b))
}

pub(super) fn sub(a: &Dim, b: &Dim) -> Option<Dim> {
    if let (Some(x), Some(y)) = (a.as_known(), b.as_known()) {
        return x.checked_sub(y).map(Dim::known);
    }
    (norm(a) + norm(b) < LIMIT).then(|| a.sub(b))
}

pub(super) fn mul(a: &Dim, b: &Dim) -> Option<Dim> {
    if let (Some(x), Some(y)) = (a.as_known(), b.as_known()) {
        return x.checked_mul(y).map(Dim::known);
    }
    if a.as_known() == Some(0) || b.as_known() == Some(0) {
        return Some(Dim::known(0));
    }
    norm(a)
        .checked_mul(norm(b))
        .is_some_and(|n| n < LIMIT)
        .then(|| a.mul(b))
}

pub(super) fn scale(a: &Dim, k: i64) -> Option<Dim> {
    mul(a, &Dim::known(k))
}

pub(super) fn add_k(a: &Dim, k: i64) -> Option<Dim> {
    add(a, &Dim::known(k))
}

/// `a / b` when exact for every binding (see [`Dim::div_exact`]); `None` for `b == 0`.
pub(super) fn div_exact(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a.as_known(), b.as_known()) {
        (_, Some(0)) => None,
        (Some(x), Some(y)) => match x.checked_rem(y) {
            Some(0) => x.checked_div(y).map(Dim::known),
            _ => None,
        },
        _ if norm(a) < LIMIT && norm(b) < LIMIT => a.div_exact(b),
        _ => None,
    }
}

/// Product of dims; `None` on overflow.
pub(super) fn product<'d>(dims: impl IntoIterator<Item = &'d Dim>) -> Option<Dim> {
    dims.into_iter()
        .try_fold(Dim::known(1), |acc, d| mul(&acc, d))
}

/// Sum of dims; `None` on overflow.
pub(super) fn sum<'d>(dims: impl IntoIterator<Item = &'d Dim>) -> Option<Dim> {
    dims.into_iter()
        .try_fold(Dim::known(0), |acc, d| add(&acc, d))
}

/// `ceil(a / b)` for known numbers, `b > 0`.
pub(super) fn ceil_div(a: i64, b: i64) -> Option<i64> {
    if b <= 0 {
        return None;
    }
    let (a, b) = (a as i128, b as i128);
    i64::try_from(-((-a).div_euclid(b))).ok()
}

/// `floor(a / b)` for known numbers, `b > 0`.
pub(super) fn floor_div(a: i64, b: i64) -> Option<i64> {
    if b <= 0 {
        return None;
    }
    Some(a.div_euclid(b))
}

/// Replaces the symbols of `d` by the dims `map` gives; `None` if a symbol is unmapped or
/// the result overflows.
pub(super) fn substitute(d: &Dim, map: &HashMap<String, Dim>) -> Option<Dim> {
    if d.is_known() {
        return Some(d.clone());
    }
    let mut out = Dim::known(0);
    for (c, syms) in terms(d) {
        let mut term = Dim::known(i64::try_from(c).ok()?);
        for s in &syms {
            term = mul(&term, map.get(s)?)?;
        }
        out = add(&out, &term)?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_read_back() {
        let seq = Dim::symbol("seq");
        let past = Dim::symbol("past");
        let d = past.add(&seq.scale(3)).sub(&Dim::known(7));
        let mut t = terms(&d);
        t.sort();
        assert_eq!(
            t,
            vec![
                (-7, vec![]),
                (1, vec!["past".to_string()]),
                (3, vec!["seq".to_string()]),
            ]
        );
        let neg = seq.mul(&past).scale(-2).add(&Dim::known(1));
        assert_eq!(norm(&neg), 3);
        assert!(!nonneg(&neg));
        assert!(nonneg(&seq.add(&past)));
        assert!(le(&Dim::known(0), &seq));
        assert!(!le(&Dim::known(1), &seq));
        assert!(le(&seq, &seq.add(&past)));
        assert_eq!(terms(&Dim::known(0)), vec![]);
        let sq = seq.mul(&seq);
        assert_eq!(
            terms(&sq),
            vec![(1, vec!["seq".to_string(), "seq".to_string()])]
        );
    }

    #[test]
    fn overflow_is_refused() {
        let big = Dim::known(i64::MAX);
        assert_eq!(add(&big, &Dim::known(1)), None);
        assert_eq!(mul(&big, &Dim::known(2)), None);
        let s = Dim::symbol("s");
        assert_eq!(mul(&s.scale(1 << 40), &Dim::known(1 << 30)), None);
        assert_eq!(div_exact(&Dim::known(i64::MIN), &Dim::known(-1)), None);
        assert_eq!(div_exact(&Dim::known(6), &Dim::known(0)), None);
        assert_eq!(div_exact(&s.scale(6), &Dim::known(3)), Some(s.scale(2)));
        assert_eq!(ceil_div(7, 2), Some(4));
        assert_eq!(ceil_div(-7, 2), Some(-3));
        assert_eq!(floor_div(-7, 2), Some(-4));
    }

    #[test]
    fn substitution() {
        let d = Dim::symbol("a").mul(&Dim::symbol("b")).add(&Dim::known(2));
        let mut map = HashMap::new();
        map.insert("a".to_string(), Dim::symbol("seq"));
        assert_eq!(substitute(&d, &map), None);
        map.insert("b".to_string(), Dim::known(4));
        assert_eq!(
            substitute(&d, &map),
            Some(Dim::symbol("seq").scale(4).add(&Dim::known(2)))
        );
    }
}
