//! Compiler errors.

use rafter_ir::program::ProgramError;
use rafter_ir::VerifyError;

/// Why compilation failed. Every variant but `Plan` means a malformed input graph or a
/// compiler bug (a pass or lowering produced something the verifiers reject).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompileError {
    /// The graph fails [`rafter_ir::verify()`] before (`pass` = `input`) or after a pass.
    #[error("graph invalid after `{pass}`: {source}")]
    Verify {
        pass: &'static str,
        source: VerifyError,
    },
    /// The lowered program fails [`rafter_ir::program::Program::verify`].
    #[error("lowered program invalid: {0}")]
    Program(#[from] ProgramError),
    /// Memory planning failed.
    #[error("memory planning: {0}")]
    Plan(String),
    /// No placement meets what was asked (`--deny-fallback`, memory limits); the message
    /// names the kernel or the devices.
    #[error("placement: {0}")]
    Placement(String),
    /// The graph is valid but asks for something the compiler does not do (named).
    #[error("unsupported: {0}")]
    Unsupported(String),
}
