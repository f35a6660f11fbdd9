//! Recordings that serve every length of a session's states (an LLM's decode steps).
//!
//! A recording ([`crate::recorded`]) is keyed by what sizes its buffers: the inputs' shapes
//! and, for a stateful program, the states' lengths. An LLM decode step extends its KV
//! caches by one position, so keyed by lengths every step recorded the call afresh (dims,
//! arena placement, ~600 command-buffer entries): ~1.6 ms of a ~20 ms step of the
//! Qwen3-0.6B-shaped model at q4_0 on 2 cores.
//!
//! When nothing the recording fixes depends on the lengths, this module lets one recording
//! serve all of them: every buffer whose dims mention a length symbol (`past`) is bound at
//! its capacity (its dims at the declared bounds, which is what the memory plan placed it
//! for), the CPU dispatches take the call's symbol values from the call registry when they
//! run ([`crate::DispatchArgs::symbols_at_run`]), and the CPU backend cuts each binding to
//! the bytes the call's dims give it, which are exactly the range an exact-size recording
//! would have bound (same allocation, same start).
//!
//! Whether that holds is decided once per program ([`LengthFree::plan`]): only CPU
//! devices (a GPU's dispatches bake dims into push constants); no output sized by a
//! length (its allocation and dims are the recording's); no length-sized arena buffer
//! that the session places per call (its offset would depend on the lengths); no copy of
//! a length-sized buffer (host copies carry their dims in the recording). Otherwise the
//! recordings stay keyed by the lengths, as before.

use std::collections::HashMap;

use rafter_ir::program::{Program, Step, Storage};
use rafter_ir::{Dim, Symbol, TensorType};

use super::state;

/// Whether the environment asks for recordings keyed by the states' lengths even where one
/// could serve them all (`RAFTER_RECORD_PER_LENGTH=1`): the behaviour before this module,
/// kept so that the two can be timed against each other in one build.
pub(super) fn keyed_by_request() -> bool {
    std::env::var_os("RAFTER_RECORD_PER_LENGTH").is_some_and(|v| v == "1")
}

/// The buffers a length-free recording binds at capacity, and the symbols that size them.
pub(super) struct LengthFree {
    /// The growing states' length symbols.
    symbols: Vec<Symbol>,
    /// The declared bounds by symbol (the smallest where one is bounded twice, as the memory
    /// plan takes them).
    bounds: HashMap<Symbol, i64>,
    /// The declared bounds of sums of symbols (`past + seq <= 4096`).
    sums: Vec<(Dim, i64)>,
}

impl LengthFree {
    /// The plan for `p`, or `None` when its recordings must be keyed by the states'
    /// lengths (see the module docs). `all_cpu`: every device the session uses is a CPU.
    pub(super) fn plan(p: &Program, all_cpu: bool) -> Option<LengthFree> {
        let symbols: Vec<Symbol> = state::length_symbols(p)
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        if symbols.is_empty() || !all_cpu {
            return None;
        }
        let mut bounds: HashMap<Symbol, i64> = HashMap::new();
        for (s, b) in &p.bounds {
            let e = bounds.entry(s.clone()).or_insert(*b);
            *e = (*e).min(*b);
        }
        let plan = LengthFree {
            symbols,
            bounds,
            sums: p.dim_bounds.clone(),
        };
        let sized_by_length = |b: usize| plan.mentions_length(&p.buffers[b].ty);
        for (b, decl) in p.buffers.iter().enumerate() {
            if !sized_by_length(b) {
                continue;
            }
            let fits = match decl.storage {
                // Inputs are keyed by their shapes; states are bound at capacity already;
                // host slots are sized by each call's values.
                Storage::Input(_) | Storage::State(_) | Storage::Dynamic => true,
                Storage::Arena { offset, .. } => offset.is_some(),
                Storage::Output(_) | Storage::Weight(_) => false,
            };
            if !fits || plan.capacity_dims(&decl.ty, &HashMap::new()).is_err() {
                return None;
            }
        }
        let copies_by_length = p.steps.iter().any(|s| match s {
            Step::Copy { src, dst } => sized_by_length(*src) || sized_by_length(*dst),
            Step::Dispatch { .. } => false,
        });
        (!copies_by_length).then_some(plan)
    }

    /// Whether a dim of `ty` mentions a length symbol.
    pub(super) fn mentions_length(&self, ty: &TensorType) -> bool {
        ty.dims
            .iter()
            .any(|d| d.symbols().iter().any(|s| self.symbols.contains(s)))
    }

    /// `ty`'s dims with each dim that mentions a length symbol at its largest under the
    /// bounds (a dim equal to a bounded sum such as `past + seq` at that sum's bound, as the
    /// memory plan sizes it), the others under `map`.
    pub(super) fn capacity_dims(
        &self,
        ty: &TensorType,
        map: &HashMap<Symbol, i64>,
    ) -> Result<Vec<usize>, String> {
        ty.dims
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let v = if d.symbols().iter().any(|s| self.symbols.contains(s)) {
                    self.max_of(d)
                } else {
                    d.eval(map).map_err(|e| e.to_string())
                };
                match v {
                    Ok(v) => usize::try_from(v).map_err(|_| format!("dim {i} `{d}` is {v}")),
                    Err(e) => Err(format!("dim {i} `{d}`: {e}")),
                }
            })
            .collect()
    }

    fn max_of(&self, d: &Dim) -> Result<i64, String> {
        match self.sums.iter().find(|(s, _)| s == d) {
            Some((_, b)) => Ok(*b),
            None => d.max_value(&self.bounds).map_err(|e| e.to_string()),
        }
    }
}
