//! Memory planning: assigns arena offsets and sizes.
//!
//! Placeholder: [`plan_memory`] leaves the program as lowering made it (every arena buffer
//! with `offset: None`, arenas with no size), which means "plan per call at run time".
//! The memory planner replaces this module.

use crate::CompileError;
use rafter_ir::program::Program;

/// Options of [`plan_memory`].
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {}

/// Plans arena offsets and sizes in place. Currently a no-op.
pub fn plan_memory(program: &mut Program, opts: &PlanOptions) -> Result<(), CompileError> {
    let _ = (program, opts);
    Ok(())
}
