//! State a session carries from one call to the next (`Storage::State`: an LLM's KV
//! caches, an RNN's hidden state).
//!
//! Each state is one buffer per session, allocated when the session is created at its
//! capacity (its type at the program's declared bounds) on the device whose steps use it.
//! Both of a state's buffers in the program (the input a call reads, the output it leaves)
//! are ranges at the start of that buffer, so a kernel that extends the state writes only
//! the new part (see the CPU backend's append path).
//!
//! The session tracks each growing state's length, the value of the symbol its input type
//! grows by (`past`), binds it on every call, and checks that the call keeps it within the
//! capacity. Calls on a stateful session are ordered: each waits for the one submitted
//! before it, whose state it reads. A call that fails leaves the state unknown, so later
//! calls are refused until [`super::Session::reset_state`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rafter_hal::{Buffer, Semaphore};
use rafter_ir::program::{Program, StateDecl};
use rafter_ir::{Bindings, Dim, Symbol};

use crate::error::{Result, RuntimeError};
use crate::host::lock;

/// One state's memory.
pub(super) struct StateMemory {
    /// Capacity bytes, allocated once.
    pub buffer: Buffer,
    /// The most positions it holds along its growth axis (`None`: it does not grow).
    pub capacity: Option<usize>,
}

/// What the session knows of its states between calls.
#[derive(Default)]
pub(super) struct Tracker {
    /// Per state: its length along the growth axis (0 for states that do not grow).
    pub lengths: Vec<usize>,
    /// Why the states are unknown (a call on them failed), until a reset.
    pub poisoned: Option<String>,
    /// The completion semaphores of the last call submitted: the next one waits for them.
    pub last: Vec<(Semaphore, u64)>,
}

/// The tracker, shared with the callbacks that notice a failed call.
pub(super) type SharedTracker = Arc<Mutex<Tracker>>;

/// The capacity of `st` along its growth axis, and the whole buffer's bytes, from the
/// program's bounds; an error naming the state when a dim has no bound.
pub(super) fn capacity(p: &Program, s: usize) -> std::result::Result<(Option<usize>, u64), String> {
    let st = &p.states[s];
    let bytes = p.state_bytes(s).ok_or_else(|| {
        format!(
            "state `{}` ({}) has no bound for its dims: compile with a bound such as \
             `--dim '{} <= N'` so that the session can allocate it once",
            st.name,
            st.output_ty,
            st.growth_axis()
                .map_or_else(|| "...".to_string(), |a| st.output_ty.dims[a].to_string())
        )
    })?;
    let cap = match st.growth_axis() {
        Some(a) => {
            let max = p.max_of(&st.output_ty.dims[a]).unwrap_or(0);
            Some(usize::try_from(max).map_err(|e| format!("state `{}`: {e}", st.name))?)
        }
        None => None,
    };
    Ok((cap, bytes))
}

/// The symbols states bind (their input's growing dim), with the state index.
pub(super) fn length_symbols(p: &Program) -> Vec<(usize, Symbol)> {
    p.states
        .iter()
        .enumerate()
        .filter_map(|(i, st)| st.length_symbol().map(|s| (i, s.clone())))
        .collect()
}

/// Binds each growing state's length symbol to its tracked length.
pub(super) fn bind_lengths(
    p: &Program,
    tracker: &Tracker,
    bindings: &mut Bindings,
) -> std::result::Result<(), String> {
    for (i, sym) in length_symbols(p) {
        let what = format!("state `{}` (the positions cached so far)", p.states[i].name);
        bindings.unify(&Dim::from_symbol(sym), tracker.lengths[i], &what)?;
    }
    Ok(())
}

/// The lengths the call leaves, checked against each state's capacity.
pub(super) fn new_lengths(
    p: &Program,
    memory: &[StateMemory],
    map: &HashMap<Symbol, i64>,
) -> std::result::Result<Vec<usize>, String> {
    p.states
        .iter()
        .zip(memory)
        .map(|(st, m)| {
            let Some(axis) = st.growth_axis() else {
                return Ok(0);
            };
            let d = &st.output_ty.dims[axis];
            let len = d
                .eval(map)
                .map_err(|e| format!("state `{}`: dim `{d}`: {e}", st.name))?;
            let len = usize::try_from(len).map_err(|e| format!("state `{}`: {e}", st.name))?;
            match m.capacity {
                Some(cap) if len > cap => Err(over_capacity(st, d, len, cap)),
                _ => Ok(len),
            }
        })
        .collect()
}

fn over_capacity(st: &StateDecl, d: &Dim, len: usize, cap: usize) -> String {
    format!(
        "the call would make state `{}` hold {len} positions (`{d}`), beyond the {cap} it \
         was compiled for: reset or truncate the state, or compile with a larger bound",
        st.name
    )
}

/// Marks the states unknown when the call with these completion semaphores fails.
pub(super) fn poison_on_failure(tracker: &SharedTracker, done: &[(Semaphore, u64)]) {
    for (s, value) in done {
        let tracker = tracker.clone();
        s.notify_at(
            *value,
            Box::new(move |result| {
                if let Err(e) = result {
                    let mut t = lock(&tracker);
                    t.poisoned.get_or_insert_with(|| e.to_string());
                }
            }),
        );
    }
}

/// Waits for the last call on the states (so that nothing still writes them).
pub(super) fn wait_last(program: &str, tracker: &Tracker, timeout: Duration) -> Result<()> {
    if tracker.last.is_empty() {
        return Ok(());
    }
    Semaphore::wait_all(&tracker.last, timeout).or_else(|e| {
        // A failed call is done too; only a timeout leaves the state in use.
        if tracker
            .last
            .iter()
            .all(|(s, v)| s.value() >= *v || s.failure().is_some())
        {
            Ok(())
        } else {
            Err(RuntimeError::State {
                program: program.to_string(),
                msg: format!("waiting for the last call on the session's state: {e}"),
            })
        }
    })
}
