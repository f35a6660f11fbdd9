//! What can go wrong, and where it is reported.
//!
//! Errors found before any work is submitted (a missing device, a program the runtime cannot
//! place, inputs that do not match the signature) are returned by the call that found them.
//! Failures while a call runs (a kernel that returns an error) reach the host through the
//! call's timeline semaphores and come back from [`CallHandle::wait`](crate::CallHandle::wait)
//! as [`RuntimeError::CallFailed`], with the device's message naming the kernel.

use rafter_hal::HalError;
use rafter_ir::program::ProgramError;

/// The runtime's error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuntimeError {
    /// A device the program names is not in the [`DeviceSet`](crate::DeviceSet).
    #[error("program needs device `{device}`, which is not available (found: {found})")]
    MissingDevice {
        /// The device's name in the program.
        device: String,
        /// The set's devices, comma-separated (`none` when empty).
        found: String,
    },
    /// The program failed [`Program::verify`](rafter_ir::program::Program::verify).
    #[error(transparent)]
    InvalidProgram(#[from] ProgramError),
    /// The program is valid but asks for something this runtime cannot do (yet); the message
    /// names the step, kernel or buffer.
    #[error("program `{program}`: {msg}")]
    Unsupported {
        /// The program's name.
        program: String,
        /// What, and where.
        msg: String,
    },
    /// The inputs of a call do not match the program's signature.
    #[error("program `{program}`: {msg}")]
    Input {
        /// The program's name.
        program: String,
        /// Which input, and how it differs.
        msg: String,
    },
    /// A synchronous HAL error (allocation, recording, submission), with what the runtime was
    /// doing.
    #[error("{context}: {source}")]
    Hal {
        /// What the runtime was doing.
        context: String,
        /// The HAL's error.
        #[source]
        source: HalError,
    },
    /// Work of a call failed on a device; `reason` is the device's message (for a kernel, it
    /// names the program's kernel and its error).
    #[error("call {call} of program `{program}` failed: {reason}")]
    CallFailed {
        /// The program's name.
        program: String,
        /// The call's number in its session.
        call: u64,
        /// The device's message.
        reason: String,
    },
    /// [`CallHandle::wait`](crate::CallHandle::wait) gave up.
    #[error("call {call} of program `{program}`: {msg}")]
    Timeout {
        /// The program's name.
        program: String,
        /// The call's number in its session.
        call: u64,
        /// The wait's message.
        msg: String,
    },
    /// Reading an output back after the call completed.
    #[error("call {call} of program `{program}`: output `{output}`: {msg}")]
    Output {
        /// The program's name.
        program: String,
        /// The call's number in its session.
        call: u64,
        /// The output's name.
        output: String,
        /// What went wrong.
        msg: String,
    },
    /// An artifact could not be opened (the artifact reader's message names the file,
    /// section and field).
    #[error("{0}")]
    Artifact(String),
    /// The session's state (KV caches) cannot serve the call: over its capacity, or unknown
    /// after a failed call until it is reset.
    #[error("program `{program}`: {msg}")]
    State {
        /// The program's name.
        program: String,
        /// What the state cannot do.
        msg: String,
    },
    /// Writing a trace file.
    #[error("writing trace `{path}`: {msg}")]
    Trace {
        /// The file.
        path: String,
        /// What went wrong.
        msg: String,
    },
}

/// The runtime's result type.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// A [`RuntimeError::Hal`] maker for `map_err`, saying what the runtime (or a backend)
/// was doing.
pub fn hal(context: impl Into<String>) -> impl FnOnce(HalError) -> RuntimeError {
    let context = context.into();
    move |source| RuntimeError::Hal { context, source }
}
