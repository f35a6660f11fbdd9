//! The importer's core: per-model context, per-graph scopes, node ordering, free names of
//! subgraphs, and graph translation.

use crate::convert::{declared_symbols, dtype_from_onnx, value_info_type};
use crate::node::{
    attr_graphs, display_name, is_default_domain, is_known_domain, is_ml_domain, NodeView,
};
use crate::{ImportError, Imported, MAX_OPSET, MIN_OPSET};
use rafter_ir::builder::{const_syms, wire, InferFn, SymbolNames, ValueSyms};
use rafter_ir::{ConstData, Dim, Graph, Op, TensorType, ValueDef, ValueId};
use rafter_onnx_proto::{GraphProto, ModelProto, NodeProto, TensorLoader, TensorProto};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// State shared by every graph of one model.
pub(crate) struct Ctx<'h> {
    pub file: String,
    pub opset: i64,
    pub loader: TensorLoader,
    infer: Box<InferFn<'h>>,
    /// Symbol names in use (declared by the model or handed out as fresh ones).
    symbols: SymbolNames,
    /// Domains of model-local functions, for a precise error.
    pub function_domains: HashSet<String>,
}

/// One graph under construction and the ONNX names visible in it.
pub(crate) struct Scope {
    pub g: Graph,
    pub names: HashMap<String, ValueId>,
    /// Known element values of small integer values (constants, shape arithmetic).
    pub syms: ValueSyms,
}

impl Scope {
    pub fn new(name: impl Into<String>) -> Scope {
        Scope {
            g: Graph::new(name),
            names: HashMap::new(),
            syms: ValueSyms::new(),
        }
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.g.value(v).ty
    }

    /// Adds a constant, recording its elements as dims when it is a small integer vector.
    pub fn add_const(&mut self, name: impl Into<String>, data: ConstData) -> ValueId {
        let syms = const_syms(&data);
        let v = self.g.add_const(name, data);
        if let Some(s) = syms {
            self.syms.insert(v, s);
        }
        v
    }

    /// The integer elements of a value when they are known at import time: a constant, or
    /// shape arithmetic whose dims are all known.
    pub fn known_i64s(&self, v: ValueId) -> Option<Vec<i64>> {
        if let Some(c) = self.g.const_of(v) {
            return c.to_i64s();
        }
        self.syms.get(&v)?.iter().map(Dim::as_known).collect()
    }

    pub fn is_const(&self, v: ValueId) -> bool {
        matches!(self.g.value(v).def, ValueDef::Const(_))
    }
}

/// Who uses a free name: a node (display name, op type), or the graph's output list.
#[derive(Clone, Debug)]
pub(crate) struct User {
    pub node: Option<(String, String)>,
    pub graph: String,
}

/// Names a graph uses (recursively through its subgraphs) but does not define, in the
/// order of first use.
pub(crate) fn free_names(gp: &GraphProto) -> Vec<(String, User)> {
    let mut defined: HashSet<&str> = HashSet::new();
    defined.extend(gp.input.iter().map(|i| i.name.as_str()));
    defined.extend(gp.initializer.iter().map(|i| i.name.as_str()));
    defined.extend(
        gp.sparse_initializer
            .iter()
            .filter_map(|s| s.values.as_ref().map(|v| v.name.as_str())),
    );
    for n in &gp.node {
        defined.extend(n.output.iter().map(String::as_str));
    }
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    let mut push = |name: &str, user: User, out: &mut Vec<(String, User)>| {
        if !name.is_empty() && !defined.contains(name) && seen.insert(name.to_string()) {
            out.push((name.to_string(), user));
        }
    };
    for (i, n) in gp.node.iter().enumerate() {
        let user = User {
            node: Some((display_name(n, i), n.op_type.clone())),
            graph: gp.name.clone(),
        };
        for inp in &n.input {
            push(inp, user.clone(), &mut out);
        }
        for (_, sub) in attr_graphs(n) {
            for (name, u) in free_names(sub) {
                push(&name, u, &mut out);
            }
        }
    }
    for o in &gp.output {
        let user = User {
            node: None,
            graph: gp.name.clone(),
        };
        push(&o.name, user, &mut out);
    }
    out
}

/// Names a node depends on: its inputs and the free names of its subgraphs.
fn node_deps(n: &NodeProto) -> Vec<String> {
    let mut deps: Vec<String> = n.input.iter().filter(|s| !s.is_empty()).cloned().collect();
    for (_, sub) in attr_graphs(n) {
        deps.extend(free_names(sub).into_iter().map(|(name, _)| name));
    }
    deps
}

/// Orders the nodes so every node comes after the producers of the names it uses. Keeps
/// the given order when it already is one. On a cycle, returns the nodes on it.
pub(crate) fn topo_order(nodes: &[NodeProto]) -> Result<Vec<usize>, Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in &n.output {
            if !o.is_empty() {
                producer.entry(o.as_str()).or_insert(i);
            }
        }
    }
    let deps: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            node_deps(n)
                .iter()
                .filter_map(|d| producer.get(d.as_str()).copied())
                .collect()
        })
        .collect();
    // 0 = unvisited, 1 = on the DFS stack, 2 = done.
    let mut state = vec![0u8; nodes.len()];
    let mut order = Vec::with_capacity(nodes.len());
    for root in 0..nodes.len() {
        if state[root] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = 1;
        while let Some(top) = stack.last_mut() {
            let (u, k) = *top;
            if k < deps[u].len() {
                top.1 += 1;
                let d = deps[u][k];
                match state[d] {
                    0 => {
                        state[d] = 1;
                        stack.push((d, 0));
                    }
                    1 => {
                        let start = stack.iter().position(|&(x, _)| x == d).unwrap_or(0);
                        return Err(stack[start..].iter().map(|&(x, _)| x).collect());
                    }
                    _ => {}
                }
            } else {
                state[u] = 2;
                order.push(u);
                stack.pop();
            }
        }
    }
    Ok(order)
}

/// The default-domain opset of a model, checked against the supported range.
pub(crate) fn model_opset(model: &ModelProto, file: &str) -> Result<i64, ImportError> {
    let opset = model
        .opset_import
        .iter()
        .filter(|o| is_default_domain(&o.domain))
        .map(|o| o.version)
        .max();
    // A model of ai.onnx.ml ops only (Binarizer, LabelEncoder, ...) imports no default
    // opset; its nodes are checked against their own list, so any version serves.
    let ml_only = model.opset_import.iter().any(|o| is_ml_domain(&o.domain));
    let Some(opset) = opset.or(ml_only.then_some(MAX_OPSET)) else {
        return Err(ImportError::Model {
            file: file.to_string(),
            msg: "the model imports no opset of the default ONNX domain".into(),
        });
    };
    if !(MIN_OPSET..=MAX_OPSET).contains(&opset) {
        return Err(ImportError::UnsupportedOpset {
            file: file.to_string(),
            version: opset,
        });
    }
    Ok(opset)
}

impl<'h> Ctx<'h> {
    pub fn new(
        file: String,
        opset: i64,
        base_dir: Option<&Path>,
        infer: Box<InferFn<'h>>,
    ) -> Ctx<'h> {
        Ctx {
            file,
            opset,
            loader: TensorLoader::new(base_dir),
            infer,
            symbols: SymbolNames::default(),
            function_domains: HashSet::new(),
        }
    }

    pub fn reserve_symbols(&mut self, gp: &GraphProto) {
        for vi in gp.input.iter().chain(&gp.output).chain(&gp.value_info) {
            for name in declared_symbols(vi) {
                self.symbols.reserve(name);
            }
        }
        for n in &gp.node {
            for (_, sub) in attr_graphs(n) {
                self.reserve_symbols(sub);
            }
        }
    }

    /// A fresh symbol `_<hint><n>`, unique within the model.
    pub fn fresh(&mut self, hint: &str) -> Dim {
        self.symbols.fresh(hint)
    }

    /// Decodes a tensor proto into constant data (zero-copy for raw and external data).
    pub fn tensor_data(&mut self, t: &TensorProto, what: &str) -> Result<ConstData, ImportError> {
        let file = &self.file;
        let tensor_err = |source| ImportError::Tensor {
            file: file.clone(),
            what: what.to_string(),
            source: Box::new(source),
        };
        let dec = self.loader.decode(t).map_err(tensor_err)?;
        let dtype = dtype_from_onnx(t.data_type).map_err(|reason| ImportError::Model {
            file: file.clone(),
            msg: format!("{what}: {reason}"),
        })?;
        let dims = dec.dims.iter().map(|&d| d as usize).collect();
        ConstData::new(dtype, dims, dec.data.into_bytes()).map_err(|e| ImportError::Model {
            file: self.file.clone(),
            msg: format!("{what}: {e}"),
        })
    }

    /// Appends one IR node after inferring its result types (`rafter_ir::builder::wire`,
    /// the graph builder's own path). `outs` names each result (`None` for an unused
    /// optional one). Errors name the ONNX node `n`.
    pub fn emit(
        &mut self,
        sc: &mut Scope,
        n: &NodeView<'_>,
        name: String,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        outs: Vec<Option<String>>,
    ) -> Result<Vec<Option<ValueId>>, ImportError> {
        wire(
            &mut sc.g,
            &mut sc.syms,
            &mut self.symbols,
            &mut *self.infer,
            name,
            op,
            inputs,
            outs,
        )
        .map_err(|msg| {
            // A rank only the run time knows is a limit of rafter, not a malformed node.
            if msg.starts_with(rafter_ir::infer::RUNTIME_AXES_RANK) {
                n.unsupported(format!("unsupported: {msg}"))
            } else {
                n.shape_err(msg)
            }
        })
    }

    /// Fills `sc` from a graph whose inputs (and captures) are already bound:
    /// initializers, nodes in dependency order, outputs.
    pub fn import_contents(&mut self, sc: &mut Scope, gp: &GraphProto) -> Result<(), ImportError> {
        self.import_nodes(sc, gp)?;
        for o in &gp.output {
            let v = self.lookup_output(sc, &o.name)?;
            sc.g.outputs.push(v);
        }
        Ok(())
    }

    /// The value a subgraph output names.
    pub fn lookup_output(&self, sc: &Scope, name: &str) -> Result<ValueId, ImportError> {
        sc.names
            .get(name)
            .copied()
            .ok_or_else(|| ImportError::UndefinedOutput {
                file: self.file.clone(),
                graph: sc.g.name.clone(),
                name: name.to_string(),
            })
    }

    /// Adds a graph's initializers and nodes (in dependency order) to `sc`.
    pub fn import_nodes(&mut self, sc: &mut Scope, gp: &GraphProto) -> Result<(), ImportError> {
        if let Some(s) = gp.sparse_initializer.first() {
            let name = s
                .values
                .as_ref()
                .map(|v| v.name.clone())
                .unwrap_or_default();
            return Err(ImportError::UnsupportedInput {
                file: self.file.clone(),
                name,
                reason: "sparse initializers are not supported".into(),
            });
        }
        for t in &gp.initializer {
            let data = self.tensor_data(t, &format!("initializer `{}`", t.name))?;
            let v = sc.add_const(t.name.clone(), data);
            sc.names.insert(t.name.clone(), v);
        }
        let order = topo_order(&gp.node).map_err(|cycle| ImportError::Cycle {
            file: self.file.clone(),
            graph: sc.g.name.clone(),
            nodes: cycle
                .iter()
                .map(|&i| {
                    format!(
                        "`{}` ({})",
                        display_name(&gp.node[i], i),
                        gp.node[i].op_type
                    )
                })
                .collect(),
        })?;
        for i in order {
            let p = &gp.node[i];
            let file = self.file.clone();
            let n = NodeView::new(p, i, self.opset, &file);
            if !is_known_domain(&p.domain) {
                let reason = if self.function_domains.contains(&p.domain) {
                    format!(
                        "unsupported op in domain `{}` (model-local functions are not supported)",
                        p.domain
                    )
                } else {
                    format!("unsupported op in domain `{}`", p.domain)
                };
                return Err(n.unsupported(reason));
            }
            let op = crate::support::static_check(&n).map_err(|r| n.unsupported(r))?;
            crate::ops::translate(self, sc, &n, op)?;
            if let Some(a) = n.unread_attr() {
                return Err(n.unsupported(format!("unsupported: attribute `{a}`")));
            }
        }
        Ok(())
    }

    /// Imports a subgraph. `formal` gives its declared inputs' types (in order); the
    /// captures become further inputs after them, and outer constants it uses are copied in
    /// (they share bytes). `label` names the graph when the proto has no name.
    pub fn import_body(
        &mut self,
        outer: &Scope,
        gp: &GraphProto,
        label: &str,
        formal: Vec<TensorType>,
        captures: &[(String, ValueId)],
        consts: &[(String, ValueId)],
    ) -> Result<Graph, ImportError> {
        let name = if gp.name.is_empty() {
            label.to_string()
        } else {
            gp.name.clone()
        };
        let mut sc = Scope::new(name);
        for (vi, ty) in gp.input.iter().zip(formal) {
            let v = sc.g.add_input(vi.name.clone(), ty);
            sc.names.insert(vi.name.clone(), v);
        }
        for (name, ov) in captures {
            let v = sc.g.add_input(name.clone(), outer.ty(*ov).clone());
            if let Some(s) = outer.syms.get(ov) {
                sc.syms.insert(v, s.clone());
            }
            sc.names.insert(name.clone(), v);
        }
        let used: HashSet<String> = free_names(gp).into_iter().map(|(n, _)| n).collect();
        for (name, ov) in consts {
            if used.contains(name) {
                let data = outer
                    .g
                    .const_of(*ov)
                    .expect("capture is a constant")
                    .clone();
                let v = sc.add_const(name.clone(), data);
                sc.names.insert(name.clone(), v);
            }
        }
        self.import_contents(&mut sc, gp)?;
        Ok(sc.g)
    }

    /// Resolves the free names of `graphs` in `outer`: non-constant values become
    /// captures (explicit operands), constants are copied into the bodies.
    #[allow(clippy::type_complexity)]
    pub fn captures(
        &self,
        outer: &Scope,
        graphs: &[&GraphProto],
    ) -> Result<(Vec<(String, ValueId)>, Vec<(String, ValueId)>), ImportError> {
        let mut seen = HashSet::new();
        let (mut caps, mut consts) = (Vec::new(), Vec::new());
        for gp in graphs {
            for (name, user) in free_names(gp) {
                if !seen.insert(name.clone()) {
                    continue;
                }
                let Some(&v) = outer.names.get(&name) else {
                    return Err(match user.node {
                        Some((node, op_type)) => ImportError::UndefinedInput {
                            file: self.file.clone(),
                            node,
                            op_type,
                            input: name,
                        },
                        None => ImportError::UndefinedOutput {
                            file: self.file.clone(),
                            graph: user.graph,
                            name,
                        },
                    });
                };
                if outer.is_const(v) {
                    consts.push((name, v));
                } else {
                    caps.push((name, v));
                }
            }
        }
        Ok((caps, consts))
    }
}

/// Imports a decoded model.
pub(crate) fn import_model(
    model: &ModelProto,
    file: &str,
    base_dir: Option<&Path>,
    infer: Box<InferFn<'_>>,
) -> Result<Imported, ImportError> {
    // Checked first: an empty file decodes as a ModelProto with nothing in it, and "no
    // graph" is what is wrong with it, not its missing opset.
    if model.graph.is_none() {
        return Err(ImportError::Model {
            file: file.to_string(),
            msg: "the model has no graph (an empty or truncated file decodes as an empty model)"
                .into(),
        });
    }
    let opset = match model_opset(model, file) {
        Ok(v) => v,
        Err(e @ ImportError::Model { .. }) => {
            // A model of other domains only (ai.onnx.ml, training): name the first node.
            if let Some(gp) = &model.graph {
                if let Some((node, op_type, domain)) = first_foreign_node(gp) {
                    return Err(ImportError::UnsupportedOp {
                        file: file.to_string(),
                        node,
                        op_type,
                        reason: format!("unsupported op in domain `{domain}`"),
                        domain,
                    });
                }
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let Some(gp) = model.graph.as_ref() else {
        return Err(ImportError::Model {
            file: file.to_string(),
            msg: "the model has no graph".into(),
        });
    };
    let mut cx = Ctx::new(file.to_string(), opset, base_dir, infer);
    cx.function_domains = model.functions.iter().map(|f| f.domain.clone()).collect();
    cx.reserve_symbols(gp);

    // Every name used must be defined somewhere in the top graph.
    if let Some((name, user)) = free_names(gp).into_iter().next() {
        return Err(match user.node {
            Some((node, op_type)) => ImportError::UndefinedInput {
                file: file.to_string(),
                node,
                op_type,
                input: name,
            },
            None => ImportError::UndefinedOutput {
                file: file.to_string(),
                graph: user.graph,
                name,
            },
        });
    }

    let graph_name = if gp.name.is_empty() {
        Path::new(file)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "main".into())
    } else {
        gp.name.clone()
    };
    let mut sc = Scope::new(graph_name);
    let init_names: HashSet<&str> = gp.initializer.iter().map(|t| t.name.as_str()).collect();
    for vi in &gp.input {
        // Old IR versions list weights as inputs too; those become constants.
        if init_names.contains(vi.name.as_str()) {
            continue;
        }
        let ty = value_info_type(vi).map_err(|reason| ImportError::UnsupportedInput {
            file: file.to_string(),
            name: vi.name.clone(),
            reason,
        })?;
        let v = sc.g.add_input(vi.name.clone(), ty);
        sc.names.insert(vi.name.clone(), v);
    }
    cx.import_contents(&mut sc, gp)?;
    let graph = sc.g;
    rafter_ir::verify(&graph).map_err(|source| ImportError::Verify {
        file: file.to_string(),
        source: Box::new(source),
    })?;
    Ok(Imported {
        graph,
        opset,
        ir_version: model.ir_version,
        producer: model.producer_name.clone(),
        producer_version: model.producer_version.clone(),
        opsets: model
            .opset_import
            .iter()
            .map(|o| (o.domain.clone(), o.version))
            .collect(),
    })
}

/// The first node outside the default domain (subgraphs included): name, op type, domain.
fn first_foreign_node(gp: &GraphProto) -> Option<(String, String, String)> {
    for (i, n) in gp.node.iter().enumerate() {
        if !is_default_domain(&n.domain) {
            return Some((display_name(n, i), n.op_type.clone(), n.domain.clone()));
        }
        for (_, sub) in attr_graphs(n) {
            if let Some(found) = first_foreign_node(sub) {
                return Some(found);
            }
        }
    }
    None
}
