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
//!
//! A size may also follow from the *values* of a small input tensor (a Reshape's target
//! shape, an Expand's shape, Pad's pads, Range's limits, Resize's scales, TopK's `k` fed
//! by a graph input): [`SymbolExpr::Values`] keeps the one op that makes the size, and
//! the runtime re-runs that op's shape inference on the call's input values when it binds
//! the inputs (the same rule inference applied at compile time, so the runtime's sizes
//! are the ones every executor checks against).

use std::collections::HashMap;
use std::fmt;

use crate::builder::const_syms;
use crate::infer::{infer_node, InferInput};
use crate::{Bindings, ConstData, Dim, Graph, Symbol, TensorType, ValueDef, ValueId};

/// The values of the call's inputs, by port name, where a [`SymbolExpr::Values`]
/// definition reads them (`None`: the caller has no such input).
pub type InputValues<'a> = dyn Fn(&str) -> Option<ConstData> + 'a;

/// How a defined symbol's value follows from symbols bound before it.
#[derive(Clone, Debug, PartialEq)]
pub enum SymbolExpr {
    /// `floor(num / den)`, `den > 0`; a size, so `num` must not be negative.
    FloorDiv { num: Dim, den: i64 },
    /// `num mod den` (non-negative remainder), `den > 0`.
    Mod { num: Dim, den: i64 },
    /// The size two broadcast dims give: `a` where `b` is 1, else `b` (and then `a` must be
    /// 1 or equal to it).
    Broadcast { a: Dim, b: Dim },
    /// Dim `axis` of output `output` of `body`, whose nodes' shape inference (in order)
    /// reads the values of the body inputs at `reads` (each named after the program
    /// input whose values it is); the other body inputs contribute their dims. The body
    /// is the op that makes the size and the shape arithmetic between it and the inputs.
    Values {
        body: Graph,
        reads: Vec<usize>,
        output: usize,
        axis: usize,
    },
}

/// One defined symbol.
#[derive(Clone, Debug, PartialEq)]
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
            SymbolExpr::Values { body, .. } => body
                .inputs
                .iter()
                .flat_map(|&v| body.value(v).ty.dims.iter())
                .collect(),
        }
    }

    /// The program inputs whose values the expression reads (by port name).
    pub fn value_inputs(&self) -> Vec<&str> {
        match self {
            SymbolExpr::Values { body, reads, .. } => reads
                .iter()
                .filter_map(|&i| body.inputs.get(i))
                .map(|&v| body.value(v).name.as_str())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The symbols the expression reads.
    pub fn symbols(&self) -> Vec<Symbol> {
        self.operands().into_iter().flat_map(Dim::symbols).collect()
    }

    /// The value under `values`; the error says which symbol is unbound or why the value is
    /// not a size. A [`SymbolExpr::Values`] needs the inputs' values: see [`Self::eval_with`].
    pub fn eval(&self, values: &HashMap<Symbol, i64>) -> Result<i64, String> {
        self.eval_with(values, &|_| None)
    }

    /// The value under `values`, reading the call's input tensors through `inputs`.
    pub fn eval_with(
        &self,
        values: &HashMap<Symbol, i64>,
        inputs: &InputValues<'_>,
    ) -> Result<i64, String> {
        let ev = |d: &Dim| d.eval(values).map_err(|e| format!("`{d}`: {e}"));
        match self {
            SymbolExpr::Values {
                body,
                reads,
                output,
                axis,
            } => eval_values(body, reads, *output, *axis, values, inputs),
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
            SymbolExpr::Values {
                body,
                reads,
                output,
                axis,
            } => {
                let reads: Vec<String> = reads.iter().map(usize::to_string).collect();
                write!(
                    f,
                    "values({output}, {axis}, [{}]) {}",
                    reads.join(", "),
                    crate::text::print_graph(body).trim_end()
                )
            }
        }
    }
}

/// Runs the shape inference of `body`'s nodes in order, on the call's dims and on the
/// values of the inputs at `reads`, and returns dim `axis` of body output `output`, which
/// those must fix. Integer values the nodes compute (a `Max` of a shape and an input, a
/// `Cast`, a `Squeeze`) are carried from node to node as inference's symbolic element
/// values, known numbers here; so a size several ops of shape arithmetic away from the
/// inputs is fixed as surely as one op away.
fn eval_values(
    body: &Graph,
    reads: &[usize],
    output: usize,
    axis: usize,
    values: &HashMap<Symbol, i64>,
    inputs: &InputValues<'_>,
) -> Result<i64, String> {
    if body.nodes.is_empty() {
        return Err("its body has no nodes".to_string());
    }
    let mut types: HashMap<ValueId, TensorType> = HashMap::new();
    let mut konsts: HashMap<ValueId, ConstData> = HashMap::new();
    let mut syms: HashMap<ValueId, Vec<Dim>> = HashMap::new();
    for (i, &v) in body.inputs.iter().enumerate() {
        let val = body.value(v);
        let ty = if reads.contains(&i) {
            let c = inputs(&val.name)
                .ok_or_else(|| format!("it reads input `{}`, which the call lacks", val.name))?;
            let dims = c.dims.iter().map(|&d| d as i64).collect::<Vec<_>>();
            if let Some(s) = const_syms(&c) {
                syms.insert(v, s);
            }
            konsts.insert(v, c.clone());
            TensorType::known(c.dtype, &dims)
        } else {
            let dims = val
                .ty
                .dims
                .iter()
                .map(|d| d.eval(values).map(Dim::known))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("input `{}`: {e}", val.name))?;
            TensorType::new(val.ty.dtype, dims)
        };
        types.insert(v, ty);
    }
    for (i, val) in body.values.iter().enumerate() {
        if let ValueDef::Const(c) = val.def {
            let v = ValueId(i as u32);
            types.insert(v, val.ty.clone());
            if let Some(s) = const_syms(body.constant(c)) {
                syms.insert(v, s);
            }
        }
    }
    for node in &body.nodes {
        let inferred = {
            let mut operands = Vec::with_capacity(node.inputs.len());
            for v in &node.inputs {
                operands.push(match v {
                    None => None,
                    Some(v) => {
                        let ty = types.get(v).ok_or_else(|| {
                            format!("operand `{}` is defined after its use", body.value(*v).name)
                        })?;
                        let konst = match body.value(*v).def {
                            ValueDef::Const(c) => Some(body.constant(c)),
                            _ => konsts.get(v),
                        };
                        Some(InferInput {
                            ty,
                            sym: syms.get(v).map(Vec::as_slice),
                            konst,
                        })
                    }
                });
            }
            let mut fresh = |_: &str| Dim::symbol("_unfixed");
            infer_node(&node.op, &operands, node.outputs.len(), &mut fresh)
                .map_err(|e| format!("`{}` ({}): {e}", node.name, node.op.name()))?
        };
        for ((o, ty), sym) in node.outputs.iter().zip(inferred.types).zip(inferred.syms) {
            if let Some(o) = o {
                types.insert(*o, ty);
                if let Some(s) = sym {
                    syms.insert(*o, s);
                }
            }
        }
    }
    let out = body
        .outputs
        .get(output)
        .ok_or_else(|| format!("its body has no output {output}"))?;
    let producer = || match body.value(*out).def {
        ValueDef::Node { node, .. } => {
            let n = &body.nodes[node.0 as usize];
            format!("`{}` ({})", n.name, n.op.name())
        }
        _ => format!("`{}`", body.value(*out).name),
    };
    let dim = types
        .get(out)
        .and_then(|t| t.dims.get(axis))
        .ok_or_else(|| format!("{} has no axis {axis}", producer()))?;
    dim.as_known().ok_or_else(|| {
        format!(
            "{}: the input values do not fix its result's dim {axis}",
            producer()
        )
    })
}

impl fmt::Display for SymbolDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}", self.symbol.name(), self.expr)
    }
}

/// Binds every symbol of `defs`, in order, from what `bindings` holds (the inputs' symbols,
/// then each earlier definition), reading the call's input values through `inputs` where a
/// definition needs them. A symbol already bound (a caller's `--dim`) must agree.
pub fn bind_defined(
    defs: &[SymbolDef],
    bindings: &mut Bindings,
    inputs: &InputValues<'_>,
) -> Result<(), String> {
    for def in defs {
        let v = def
            .expr
            .eval_with(&bindings.as_map(), inputs)
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
            SymbolExpr::Values { .. } => None,
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

    /// `reshape(x: f32[n, 6], shape: i64[2]) -> f32[_r0, _r1]`, reading `shape`'s values.
    fn reshape_body() -> Graph {
        let mut g = Graph::new("reshape");
        let x = g.add_input(
            "x",
            TensorType::new(crate::DType::F32, vec![Dim::symbol("n"), Dim::known(6)]),
        );
        let shape = g.add_input("shape", TensorType::known(crate::DType::I64, &[2]));
        let out = TensorType::new(
            crate::DType::F32,
            vec![Dim::symbol("_r0"), Dim::symbol("_r1")],
        );
        let y = g.add_node(
            "r",
            crate::Op::Reshape { allow_zero: false },
            vec![Some(x), Some(shape)],
            vec![Some(("y".to_string(), out))],
        );
        g.outputs.push(y[0].unwrap());
        g
    }

    fn i64s(v: &[i64]) -> ConstData {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        ConstData::new(crate::DType::I64, vec![v.len()], bytes.into()).unwrap()
    }

    #[test]
    fn values_rerun_the_ops_shape_rule_on_the_inputs_values() {
        let values = |axis| SymbolExpr::Values {
            body: reshape_body(),
            reads: vec![1],
            output: 0,
            axis,
        };
        let n3 = map(&[("n", 3)]);
        // 3 x 6 = 18 elements: [-1, 9] is [2, 9]; [0, 6] copies n; [9, 2] as given.
        let shape = |v: &'static [i64]| move |name: &str| (name == "shape").then(|| i64s(v));
        assert_eq!(values(0).eval_with(&n3, &shape(&[-1, 9])), Ok(2));
        assert_eq!(values(1).eval_with(&n3, &shape(&[-1, 9])), Ok(9));
        assert_eq!(values(0).eval_with(&n3, &shape(&[0, 6])), Ok(3));
        assert_eq!(values(0).eval_with(&n3, &shape(&[9, 2])), Ok(9));
        // A target that does not hold the elements, a missing input, an unbound symbol.
        let bad = values(0).eval_with(&n3, &shape(&[4, 4])).unwrap_err();
        assert!(bad.contains("`r` (reshape)"), "{bad}");
        let missing = values(0).eval(&n3).unwrap_err();
        assert!(missing.contains("`shape`"), "{missing}");
        let unbound = values(0).eval_with(&map(&[]), &shape(&[-1, 9]));
        assert!(unbound.unwrap_err().contains("`n`"));
        assert_eq!(values(0).value_inputs(), vec!["shape"]);
        assert_eq!(values(0).symbols(), vec![Symbol::new("n")]);
    }

    /// `range(0, squeeze(max(shape(pk)[2:3], cast(total))), 1)`: the rows of a KV buffer
    /// that grows to the larger of its past length and an input's value.
    fn rows_body() -> Graph {
        use crate::{BinaryOp, DType, Op};
        let mut g = Graph::new("rows");
        let dims = ["b", "h", "past", "d"].map(Dim::symbol).to_vec();
        let pk = g.add_input("pk", TensorType::new(DType::F32, dims));
        let total = g.add_input("total", TensorType::known(DType::I32, &[1]));
        let i64_1 = || Some(("t".to_string(), TensorType::known(DType::I64, &[1])));
        let s = g.add_node(
            "s",
            Op::Shape {
                start: 2,
                end: Some(3),
            },
            vec![Some(pk)],
            vec![i64_1()],
        )[0];
        let c = g.add_node(
            "c",
            Op::Cast { to: DType::I64 },
            vec![Some(total)],
            vec![i64_1()],
        )[0];
        let m = g.add_node(
            "m",
            Op::Binary { op: BinaryOp::Max },
            vec![s, c],
            vec![i64_1()],
        )[0];
        let scalar = Some(("sq".to_string(), TensorType::known(DType::I64, &[])));
        let sq = g.add_node("sq", Op::Squeeze { axes: vec![0] }, vec![m], vec![scalar])[0];
        let scalar_of = |v: i64| ConstData {
            dims: vec![],
            ..ConstData::from_i64s(&[v])
        };
        let zero = g.add_const("zero", scalar_of(0));
        let one = g.add_const("one", scalar_of(1));
        let out = TensorType::new(DType::I64, vec![Dim::symbol("_rows")]);
        let r = g.add_node(
            "r",
            Op::Range,
            vec![Some(zero), sq, Some(one)],
            vec![Some(("cols".to_string(), out))],
        );
        g.outputs.push(r[0].unwrap());
        g
    }

    #[test]
    fn values_rerun_several_nodes_of_shape_arithmetic() {
        let e = SymbolExpr::Values {
            body: rows_body(),
            reads: vec![1],
            output: 0,
            axis: 0,
        };
        let dims = map(&[("b", 2), ("h", 4), ("past", 7), ("d", 8)]);
        let total = |v: i32| {
            move |name: &str| {
                (name == "total").then(|| {
                    ConstData::new(crate::DType::I32, vec![1], v.to_le_bytes().to_vec().into())
                        .unwrap()
                })
            }
        };
        // max(past = 7, total): the input's value where larger, else the past length.
        assert_eq!(e.eval_with(&dims, &total(12)), Ok(12));
        assert_eq!(e.eval_with(&dims, &total(3)), Ok(7));
        assert_eq!(
            e.symbols(),
            ["b", "h", "past", "d"].map(Symbol::new).to_vec()
        );
        let missing = e.eval(&dims).unwrap_err();
        assert!(missing.contains("`total`"), "{missing}");
    }

    #[test]
    fn values_definitions_bind_in_order_and_have_no_bound() {
        let defs = [0, 1].map(|axis| SymbolDef {
            symbol: Symbol::new(&format!("_r{axis}")),
            expr: SymbolExpr::Values {
                body: reshape_body(),
                reads: vec![1],
                output: 0,
                axis,
            },
        });
        let mut b = Bindings::default();
        b.unify(&Dim::symbol("n"), 2, "x").unwrap();
        let shape = |name: &str| (name == "shape").then(|| i64s(&[3, -1]));
        bind_defined(&defs, &mut b, &shape).unwrap();
        assert_eq!(b.get(&Symbol::new("_r0")), Some(3));
        assert_eq!(b.get(&Symbol::new("_r1")), Some(4));
        let mut bounds = map(&[("n", 8)]);
        extend_bounds(&defs, &mut bounds);
        assert!(!bounds.contains_key(&Symbol::new("_r0")));
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
        bind_defined(&defs, &mut bindings, &|_| None).unwrap();
        assert_eq!(bindings.get(&Symbol::new("a")), Some(5));
        assert_eq!(bindings.get(&Symbol::new("b")), Some(3));
        let mut clash = Bindings::with([(Symbol::new("h"), 9), (Symbol::new("a"), 4)]);
        let e = bind_defined(&defs, &mut clash, &|_| None).unwrap_err();
        assert!(e.contains("symbol `a`"), "{e}");

        let mut bounds = map(&[("h", 224)]);
        extend_bounds(&defs, &mut bounds);
        assert_eq!(bounds[&Symbol::new("a")], 112);
        assert_eq!(bounds[&Symbol::new("b")], 56);
    }
}
