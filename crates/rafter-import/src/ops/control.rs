//! Control flow: If, Loop, Scan, whose bodies become subgraphs with explicit captures.

use super::registry::OnnxOp;
use super::{non_empty_or, Tr, R};
use crate::node::NodeView;
use rafter_ir::{DType, Op, TensorType, ValueId};

/// The control ops, each with its translation.
pub(super) const OPS: &[OnnxOp] = &[
    OnnxOp::new("If", |t| t.if_op()),
    OnnxOp::new("Loop", |t| t.loop_op()),
    OnnxOp::new("Scan", |t| t.scan_op()).checked(check_scan),
];

/// Scan-8 (batched, with `sequence_lens`) is not supported.
fn check_scan(n: &NodeView<'_>) -> Result<(), String> {
    if n.opset < 9 {
        return Err(
            "unsupported: Scan-8 (batched, with sequence_lens); Scan from opset 9 is supported"
                .into(),
        );
    }
    Ok(())
}

impl Tr<'_, '_, '_> {
    pub(super) fn if_op(&mut self) -> R {
        let n = self.n;
        let cond = self.req(0)?;
        let (then_gp, else_gp) = (n.graph("then_branch")?, n.graph("else_branch")?);
        if let Some(&[c]) = self.sc.known_i64s(cond).as_deref() {
            // The condition is known at import time: only the taken branch is imported (the
            // other may not even type-check for these inputs).
            return self.inline_branch(if c != 0 { then_gp } else { else_gp });
        }
        let (caps, consts) = self.cx.captures(self.sc, &[then_gp, else_gp])?;
        for (gp, which) in [(then_gp, "then_branch"), (else_gp, "else_branch")] {
            if gp.output.len() != n.p.output.len() {
                return Err(n.invalid(format!(
                    "{which} has {} outputs, the node {}",
                    gp.output.len(),
                    n.p.output.len()
                )));
            }
        }
        let label = |w: &str| format!("{}/{w}", n.name);
        let then_branch = self.cx.import_body(
            self.sc,
            then_gp,
            &label("then_branch"),
            vec![],
            &caps,
            &consts,
        )?;
        let else_branch = self.cx.import_body(
            self.sc,
            else_gp,
            &label("else_branch"),
            vec![],
            &caps,
            &consts,
        )?;
        let mut ins = vec![Some(cond)];
        ins.extend(caps.iter().map(|(_, v)| Some(*v)));
        self.finish(
            Op::If {
                then_branch: Box::new(then_branch),
                else_branch: Box::new(else_branch),
            },
            ins,
        )
    }

    /// Imports a subgraph's nodes into the current graph; its outputs become the node's
    /// outputs (through Identity, so they carry the node's output names).
    pub(super) fn inline_branch(&mut self, gp: &rafter_onnx_proto::GraphProto) -> R {
        let n = self.n;
        if gp.output.len() != n.p.output.len() {
            return Err(n.invalid(format!(
                "the taken branch has {} outputs, the node {}",
                gp.output.len(),
                n.p.output.len()
            )));
        }
        self.cx.import_nodes(self.sc, gp)?;
        for (k, o) in gp.output.iter().enumerate() {
            let v = self.cx.lookup_output(self.sc, &o.name)?;
            if !n.has_output(k) {
                continue;
            }
            let name = n.p.output[k].clone();
            let ids = self.cx.emit(
                self.sc,
                n,
                format!("{}/out{k}", n.name),
                Op::Identity,
                vec![Some(v)],
                vec![Some(name.clone())],
            )?;
            self.sc.names.insert(name, ids[0].expect("requested"));
        }
        Ok(())
    }

    /// Imports a loop-like body whose first `state.len()` outputs feed back into the
    /// inputs at `offset..`. Starts from the initial state types; where an iteration
    /// changes a dim, the body is re-imported with that dim as a fresh symbol.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn state_body(
        &mut self,
        gp: &rafter_onnx_proto::GraphProto,
        label: &str,
        prefix: Vec<TensorType>,
        mut state: Vec<TensorType>,
        suffix: Vec<TensorType>,
        out_offset: usize,
        caps: &[(String, ValueId)],
        consts: &[(String, ValueId)],
    ) -> R<rafter_ir::Graph> {
        let n = self.n;
        let mut generalized: Vec<Vec<bool>> = state.iter().map(|t| vec![false; t.rank()]).collect();
        for _round in 0..4 {
            let mut formal = prefix.clone();
            formal.extend(state.iter().cloned());
            formal.extend(suffix.iter().cloned());
            let body = self
                .cx
                .import_body(self.sc, gp, label, formal, caps, consts)?;
            if body.outputs.len() < out_offset + state.len() {
                return Err(n.invalid(format!(
                    "body has {} outputs, needs at least {}",
                    body.outputs.len(),
                    out_offset + state.len()
                )));
            }
            let mut changed = false;
            for (k, st) in state.iter_mut().enumerate() {
                let out = &body.value(body.outputs[out_offset + k]).ty;
                let name = gp.input.get(prefix.len() + k).map(|v| v.name.as_str());
                let name = name.unwrap_or("?");
                if out.dtype != st.dtype {
                    return Err(n.invalid(format!(
                        "loop-carried value `{name}` is {} on entry but the body returns {}",
                        st.dtype, out.dtype
                    )));
                }
                if out.rank() != st.rank() {
                    return Err(n.unsupported(format!(
                        "unsupported: loop-carried value `{name}` changes rank ({st} to {out})"
                    )));
                }
                for ((od, sd), g) in out.dims.iter().zip(&mut st.dims).zip(&mut generalized[k]) {
                    if od != sd && !*g {
                        *g = true;
                        *sd = self.cx.fresh("loop");
                        changed = true;
                    }
                }
            }
            if !changed {
                return Ok(body);
            }
        }
        Err(n.invalid("loop-carried types do not settle"))
    }

    pub(super) fn loop_op(&mut self) -> R {
        let n = self.n;
        let gp = n.graph("body")?;
        let max_trip = self.inp(0)?;
        let cond = self.inp(1)?;
        let carried = (2..n.num_inputs())
            .map(|i| self.req(i))
            .collect::<R<Vec<_>>>()?;
        if gp.input.len() != 2 + carried.len() {
            return Err(n.invalid(format!(
                "body has {} inputs, expected 2 + {} loop-carried",
                gp.input.len(),
                carried.len()
            )));
        }
        let (caps, consts) = self.cx.captures(self.sc, &[gp])?;
        let prefix = vec![
            TensorType::known(DType::I64, &[]),
            TensorType::known(DType::Bool, &[]),
        ];
        let state = carried.iter().map(|&v| self.ty(v).clone()).collect();
        let label = format!("{}/body", n.name);
        let mut body = self.state_body(gp, &label, prefix, state, vec![], 1, &caps, &consts)?;
        let mut ins = vec![max_trip, cond];
        ins.extend(carried.iter().map(|&v| Some(v)));
        ins.extend(caps.iter().map(|(_, v)| Some(*v)));
        let nc = carried.len();
        let mut outs = n.out_names();
        let scan_outputs = gp.output.len().saturating_sub(1 + nc);
        if !caps.is_empty() && scan_outputs > 0 {
            // `loop` does not record how many trailing operands are captures; with both
            // captures and scan outputs that count is ambiguous. Pass the captures as
            // loop-carried values the body returns unchanged (their final values unused).
            let cap_inputs: Vec<ValueId> = body.inputs[2 + nc..].to_vec();
            body.outputs.splice(1 + nc..1 + nc, cap_inputs);
            let at = nc.min(outs.len());
            outs.splice(at..at, std::iter::repeat_n(None, caps.len()));
        }
        self.finish_outs(
            Op::Loop {
                body: Box::new(body),
            },
            ins,
            outs,
        )
    }

    pub(super) fn scan_op(&mut self) -> R {
        let n = self.n;
        let gp = n.graph("body")?;
        let num_scan_inputs = n.i_req("num_scan_inputs")?;
        let ins = (0..n.num_inputs())
            .map(|i| self.req(i))
            .collect::<R<Vec<_>>>()?;
        let m = num_scan_inputs as usize;
        if m > ins.len() || num_scan_inputs < 0 {
            return Err(n.invalid(format!(
                "num_scan_inputs is {num_scan_inputs} but the node has {} inputs",
                ins.len()
            )));
        }
        let n_state = ins.len() - m;
        if gp.input.len() != ins.len() {
            return Err(n.invalid(format!(
                "body has {} inputs, the node {}",
                gp.input.len(),
                ins.len()
            )));
        }
        let in_axes = non_empty_or(n.ints("scan_input_axes")?, vec![0; m]);
        let in_dirs = non_empty_or(n.ints("scan_input_directions")?, vec![0; m]);
        if in_axes.len() != m || in_dirs.len() != m {
            return Err(n.invalid("scan_input_axes/directions do not match num_scan_inputs"));
        }
        let mut scan_input_axes = Vec::with_capacity(m);
        let mut slices = Vec::with_capacity(m);
        for (k, &v) in ins[n_state..].iter().enumerate() {
            let ty = self.ty(v).clone();
            let axis = self.axis(in_axes[k], ty.rank())?;
            let mut dims = ty.dims.clone();
            dims.remove(axis as usize);
            slices.push(TensorType::new(ty.dtype, dims));
            scan_input_axes.push(axis);
        }
        let (caps, consts) = self.cx.captures(self.sc, &[gp])?;
        let state = ins[..n_state].iter().map(|&v| self.ty(v).clone()).collect();
        let label = format!("{}/body", n.name);
        let body = self.state_body(gp, &label, vec![], state, slices, 0, &caps, &consts)?;
        let n_scan_out = body.outputs.len().saturating_sub(n_state);
        let out_axes = non_empty_or(n.ints("scan_output_axes")?, vec![0; n_scan_out]);
        let out_dirs = non_empty_or(n.ints("scan_output_directions")?, vec![0; n_scan_out]);
        if out_axes.len() != n_scan_out || out_dirs.len() != n_scan_out {
            return Err(n.invalid("scan_output_axes/directions do not match the scan outputs"));
        }
        let scan_output_axes = out_axes
            .iter()
            .enumerate()
            .map(|(k, &a)| {
                let r = body.value(body.outputs[n_state + k]).ty.rank() + 1;
                self.axis(a, r)
            })
            .collect::<R<Vec<_>>>()?;
        let mut operands: Vec<Option<ValueId>> = ins.iter().map(|&v| Some(v)).collect();
        operands.extend(caps.iter().map(|(_, v)| Some(*v)));
        self.finish(
            Op::Scan {
                body: Box::new(body),
                num_scan_inputs,
                num_captures: caps.len() as i64,
                scan_input_axes,
                scan_input_directions: in_dirs,
                scan_output_axes,
                scan_output_directions: out_dirs,
            },
            operands,
        )
    }
}
