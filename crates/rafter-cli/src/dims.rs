//! `--dim` arguments: a symbol's value (`seq=128`) or its upper bound (`seq<=2048`).
//!
//! `run` binds values (the shapes of random inputs); `compile` and `plan` declare bounds,
//! which the memory planner sizes arenas for. Every command takes both spellings, so one
//! `--dim` list can be reused: to `compile`, `seq=128` is the bound 128; to `run --compiled`,
//! `seq<=64` is a bound to compile for (the reference executor and artifacts reject it).

use anyhow::{anyhow, bail, Result};
use rafter_ir::Symbol;

/// One parsed `--dim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimSpec {
    pub symbol: Symbol,
    pub value: i64,
    /// `seq<=N` (an upper bound) rather than `seq=N` (the value).
    pub is_bound: bool,
}

/// A bound on a sum of symbols (`past + seq <= 4096`).
pub type SumBound = (rafter_ir::Dim, i64);

/// `--dim` arguments bounding a sum of symbols (`past+seq<=4096`) taken out of `dims`:
/// returns the others, and each sum as a [`Dim`] with its bound. Every symbol of a sum is
/// also bounded by it (sizes are non-negative), so memory can be planned per symbol.
pub fn split_sum_bounds(dims: &[String]) -> Result<(Vec<String>, Vec<SumBound>)> {
    let mut rest = Vec::new();
    let mut sums = Vec::new();
    for d in dims {
        let Some((lhs, rhs)) = d.split_once("<=").filter(|(l, _)| l.contains('+')) else {
            rest.push(d.clone());
            continue;
        };
        let mut sum = rafter_ir::Dim::known(0);
        for term in lhs.split('+') {
            let term = term.trim();
            if !rafter_ir::is_identifier(term) {
                bail!("--dim `{d}`: `{term}` is not a symbol name");
            }
            sum = sum.add(&rafter_ir::Dim::symbol(term));
        }
        let bound: i64 = rhs
            .trim()
            .parse()
            .map_err(|_| anyhow!("--dim `{d}`: `{}` is not an integer", rhs.trim()))?;
        if bound < 0 {
            bail!("--dim `{d}`: dims cannot be negative");
        }
        sums.push((sum, bound));
    }
    Ok((rest, sums))
}

/// Parses every `--dim`; the error names the argument and what is wrong with it.
pub fn parse_dims(dims: &[String]) -> Result<Vec<DimSpec>> {
    dims.iter().map(|d| parse_dim(d)).collect()
}

fn parse_dim(d: &str) -> Result<DimSpec> {
    let (symbol, value, is_bound) = if let Some((k, v)) = d.split_once("<=") {
        (k, v, true)
    } else if let Some((k, v)) = d.split_once('=') {
        (k, v, false)
    } else {
        bail!("--dim `{d}`: expected SYMBOL=N or SYMBOL<=N");
    };
    let symbol = symbol.trim();
    if !rafter_ir::is_identifier(symbol) {
        bail!("--dim `{d}`: `{symbol}` is not a symbol name");
    }
    let value: i64 = value
        .trim()
        .parse()
        .map_err(|_| anyhow!("--dim `{d}`: `{value}` is not an integer"))?;
    if value < 0 {
        bail!("--dim `{d}`: dims cannot be negative");
    }
    Ok(DimSpec {
        symbol: Symbol::new(symbol),
        value,
        is_bound,
    })
}

/// The symbols of a model's dims, sorted: what a `--dim` may name.
pub fn model_symbols<'a>(
    types: impl IntoIterator<Item = &'a rafter_ir::TensorType>,
) -> Vec<String> {
    let mut names: Vec<String> = types
        .into_iter()
        .flat_map(|t| t.dims.iter().flat_map(|d| d.symbols()))
        .map(|s| s.name().to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Every symbol `specs` and `sums` name must be one of the model's (`known`, from
/// [`model_symbols`]): a misspelt `--dim` would otherwise bind nothing, silently.
pub fn check_symbols(specs: &[DimSpec], sums: &[SumBound], known: &[String]) -> Result<()> {
    let named = specs
        .iter()
        .map(|s| s.symbol.clone())
        .chain(sums.iter().flat_map(|(d, _)| d.symbols()));
    for s in named {
        if !known.iter().any(|k| k == s.name()) {
            let list = if known.is_empty() {
                "it has none: every dim is fixed".to_string()
            } else {
                format!("its symbols: {}", known.join(", "))
            };
            bail!("--dim: the model has no symbol `{}` ({list})", s.name());
        }
    }
    Ok(())
}

/// The model must hold together at the declared bounds: a bound above what the model can
/// reach (`seq<=2048` where a 64-row position table is sliced `[0:seq]`) is an error naming
/// the node that limits it and the largest value that works.
pub fn check_bounds_reachable(graph: &rafter_ir::Graph, bounds: &[(Symbol, i64)]) -> Result<()> {
    let at = |values: &[(Symbol, i64)]| {
        rafter_ir::check_at_values(graph, &values.iter().cloned().collect())
    };
    let Err(err) = at(bounds) else {
        return Ok(());
    };
    // Per symbol, with the others at their bounds: the largest value that works.
    for (i, (s, bound)) in bounds.iter().enumerate() {
        let mut values = bounds.to_vec();
        let mut works = |v: i64| {
            values[i].1 = v;
            at(&values).is_ok()
        };
        if works(*bound) {
            continue;
        }
        if *bound <= 1 || !works(1) {
            break;
        }
        // works(lo) and !works(hi) hold throughout.
        let (mut lo, mut hi) = (1i64, *bound);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if works(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        bail!(
            "--dim {}<={bound}: the model only holds together up to {} = {lo} ({err})",
            s.name(),
            s.name()
        );
    }
    let list: Vec<String> = bounds
        .iter()
        .map(|(s, v)| format!("{}<={v}", s.name()))
        .collect();
    bail!(
        "--dim {}: the model does not hold together at these bounds ({err})",
        list.join(" ")
    )
}

/// The values (`seq=N`) of `specs`; a bound is an error naming it (`run` on the reference
/// executor has nothing to check a bound against).
pub fn values_only(specs: &[DimSpec]) -> Result<Vec<(Symbol, i64)>> {
    specs
        .iter()
        .map(|s| {
            if s.is_bound {
                bail!(
                    "--dim {}<={}: a bound only means something when compiling (use it with \
                     `rafter compile`, or with `run --compiled`)",
                    s.symbol.name(),
                    s.value
                );
            }
            Ok((s.symbol.clone(), s.value))
        })
        .collect()
}

/// Bounds for the compiler: `seq<=N` and `seq=N` both bound `seq` by N. A symbol given
/// twice keeps its smallest bound.
pub fn bounds(specs: &[DimSpec]) -> Vec<(Symbol, i64)> {
    let mut out: Vec<(Symbol, i64)> = Vec::new();
    for s in specs {
        match out.iter_mut().find(|(sym, _)| *sym == s.symbol) {
            Some((_, v)) => *v = (*v).min(s.value),
            None => out.push((s.symbol.clone(), s.value)),
        }
    }
    out
}

/// `target` set to partition for the sizes of the calls at hand: the values among
/// `specs` (`--dim seq=128`) and the shapes of the `--input NAME=FILE.npy` files (a graph
/// input's symbolic dim takes that file's extent). Only a cost-model target reads them
/// (`rafter_opt::partition::PlacementOptions::nominal`); a file that cannot be read is
/// left to the input loading that follows to report.
pub fn with_nominal_sizes(
    target: rafter_compiler::Target,
    graph: &rafter_ir::Graph,
    specs: &[DimSpec],
    input_files: &[String],
) -> Result<rafter_compiler::Target> {
    if target.placement().strategy != rafter_opt::partition::Strategy::CostModel {
        return Ok(target);
    }
    let mut nominal: Vec<(Symbol, i64)> = Vec::new();
    let mut set = |s: &Symbol, v: i64| {
        if !nominal.iter().any(|(k, _)| k == s) {
            nominal.push((s.clone(), v));
        }
    };
    for s in specs.iter().filter(|s| !s.is_bound) {
        set(&s.symbol, s.value);
    }
    for spec in input_files {
        let Some((name, file)) = spec.split_once('=') else {
            continue;
        };
        let Some(&v) = graph.inputs.iter().find(|&&v| graph.value(v).name == name) else {
            continue;
        };
        let Ok((_, shape, _)) = rafter_ir::npy::read(std::path::Path::new(file)) else {
            continue;
        };
        for (d, &n) in graph.value(v).ty.dims.iter().zip(&shape) {
            if let Some(s) = d.as_symbol() {
                set(s, n as i64);
            }
        }
    }
    let mut placement = target.placement().clone();
    placement.nominal = nominal;
    Ok(target.with_placement(placement))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(d: &str) -> Result<DimSpec> {
        parse_dim(d)
    }

    #[test]
    fn sums_are_split_out() {
        let args = vec!["seq<=8".to_string(), "past + seq<=4096".to_string()];
        let (rest, sums) = split_sum_bounds(&args).unwrap();
        assert_eq!(rest, vec!["seq<=8".to_string()]);
        assert_eq!(sums.len(), 1);
        assert_eq!(sums[0].1, 4096);
        assert_eq!(sums[0].0.to_string(), "past + seq");
        let e = split_sum_bounds(&["past+2<=4".to_string()]).unwrap_err();
        assert!(e.to_string().contains("`2` is not a symbol"), "{e}");
        let e = split_sum_bounds(&["a+b<=x".to_string()]).unwrap_err();
        assert!(e.to_string().contains("not an integer"), "{e}");
    }

    #[test]
    fn unknown_symbols_are_errors_listing_the_known_ones() {
        let known = vec!["batch".to_string(), "seq".to_string()];
        let specs = parse_dims(&["seq=3".to_string()]).unwrap();
        check_symbols(&specs, &[], &known).unwrap();
        let specs = parse_dims(&["foo=3".to_string()]).unwrap();
        let e = check_symbols(&specs, &[], &known).unwrap_err().to_string();
        assert_eq!(
            e,
            "--dim: the model has no symbol `foo` (its symbols: batch, seq)"
        );
        let (_, sums) = split_sum_bounds(&["past+seq<=8".to_string()]).unwrap();
        let e = check_symbols(&[], &sums, &known).unwrap_err().to_string();
        assert!(e.contains("no symbol `past`"), "{e}");
        let e = check_symbols(&specs, &[], &[]).unwrap_err().to_string();
        assert!(e.contains("every dim is fixed"), "{e}");
    }

    #[test]
    fn values_and_bounds_parse() {
        let v = one("seq=128").unwrap();
        assert_eq!((v.symbol.name(), v.value, v.is_bound), ("seq", 128, false));
        let b = one("seq<=2048").unwrap();
        assert_eq!((b.symbol.name(), b.value, b.is_bound), ("seq", 2048, true));
    }

    #[test]
    fn bad_syntax_is_named() {
        assert!(one("seq").unwrap_err().to_string().contains("SYMBOL=N"));
        assert!(one("seq=-1").unwrap_err().to_string().contains("negative"));
        assert!(one("2x=1")
            .unwrap_err()
            .to_string()
            .contains("not a symbol"));
        assert!(one("seq<=lots")
            .unwrap_err()
            .to_string()
            .contains("not an integer"));
        assert!(one("seq>=3").is_err());
    }

    #[test]
    fn bounds_merge_and_values_reject_bounds() {
        let specs = parse_dims(&["seq<=64".into(), "batch=2".into(), "seq=32".into()]).unwrap();
        assert_eq!(
            bounds(&specs),
            vec![(Symbol::new("seq"), 32), (Symbol::new("batch"), 2)]
        );
        assert!(values_only(&specs).is_err());
        assert_eq!(
            values_only(&specs[1..2]).unwrap(),
            vec![(Symbol::new("batch"), 2)]
        );
    }

    #[test]
    fn nominal_sizes_come_from_values_and_input_files() {
        let graph = rafter_ir::text::parse_graph(
            "graph @g(%x: f32[batch, seq], %y: f32[seq]) -> (%z) {\n  \
             %z: f32[batch, seq] = binary{op = add}(%x, %y)\n}",
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("rafter-nominal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("x.npy");
        std::fs::write(
            &file,
            rafter_ir::npy::encode(rafter_ir::DType::F32, &[2, 128], &[0; 1024]),
        )
        .unwrap();
        let cost_model = rafter_compiler::Target::cpu().with_placement(
            rafter_opt::partition::PlacementOptions {
                strategy: rafter_opt::partition::Strategy::CostModel,
                ..Default::default()
            },
        );
        let specs = [one("batch=4").unwrap(), one("seq<=512").unwrap()];
        let inputs = [format!("x={}", file.display())];
        let t = with_nominal_sizes(cost_model, &graph, &specs, &inputs).unwrap();
        // `--dim batch=4` wins over the file's 2; seq comes from the file; a bound is
        // not a size.
        assert_eq!(
            t.placement().nominal,
            vec![(Symbol::new("batch"), 4), (Symbol::new("seq"), 128)]
        );
        // A greedy target ignores them.
        let greedy = with_nominal_sizes(rafter_compiler::Target::cpu(), &graph, &specs, &inputs);
        assert!(greedy.unwrap().placement().nominal.is_empty());
        std::fs::remove_dir_all(&dir).ok();
    }
}
