//! Errors of the HAL.
//!
//! Two kinds of failure exist, and they travel differently:
//!
//! - **Synchronous** errors ([`HalError`]) are returned by the call that detected them:
//!   allocation, recording a command, validating a submission, mapping a buffer. Nothing was
//!   enqueued and no semaphore changed when one of these is returned.
//! - **Asynchronous** failures (a kernel that returns an error or panics, a device that is
//!   lost while work is in flight) cannot be returned to the caller of
//!   [`Queue::submit`](crate::Queue::submit), which has long since returned. They are
//!   delivered by *failing* the submission's signal semaphores
//!   ([`Semaphore::fail`](crate::Semaphore::fail)); every waiter on those semaphores, on the
//!   host or on any other device's queue, then sees [`SemaphoreError::Failed`] with the reason.

use std::time::Duration;

use crate::device::DeviceId;
use crate::memory::MemoryKind;

/// Result of a synchronous HAL call.
pub type Result<T, E = HalError> = std::result::Result<T, E>;

/// An error returned synchronously by a HAL call.
///
/// Messages name the object concerned (the binding index, the entry point, the device) so an
/// error can be understood without a debugger.
// The variants' fields are the values their messages print (`#[error(...)]`), which
// say what each is; the variants themselves are documented.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HalError {
    /// A byte range does not fit in its buffer. `what` says which range: `binding 2`,
    /// `copy source`, `fill destination`, `map`.
    #[error("{what}: range {start}..{end} exceeds buffer of {size} bytes")]
    OutOfRange {
        what: String,
        start: u64,
        end: u64,
        size: u64,
    },
    /// `offset + len` overflowed `u64`.
    #[error("{what}: range at offset {offset} with length {len} overflows")]
    RangeOverflow { what: String, offset: u64, len: u64 },
    /// A dispatch named an entry point index the executable does not have.
    #[error("unknown entry point {entry}: executable '{executable}' has {count} entry points")]
    UnknownEntryPoint {
        executable: String,
        entry: usize,
        count: usize,
    },
    /// An entry point looked up by name does not exist.
    #[error("executable '{executable}' has no entry point named '{name}'")]
    EntryPointNotFound { executable: String, name: String },
    /// The device cannot allocate this kind of memory.
    #[error("device '{device}' does not offer memory kind {kind:?}")]
    UnsupportedMemoryKind { device: String, kind: MemoryKind },
    /// The buffer's memory cannot be mapped by the host.
    #[error("buffer of memory kind {kind:?} is not host-visible on this device")]
    NotHostVisible { kind: MemoryKind },
    /// A single allocation larger than the device's `max_buffer_size`.
    #[error("buffer of {size} bytes exceeds the device's maximum buffer size of {max} bytes")]
    BufferTooLarge { size: u64, max: u64 },
    /// The allocator could not satisfy a request.
    #[error("out of memory allocating {size} bytes: {reason}")]
    OutOfMemory { size: u64, reason: String },
    /// The device does not load executables of this format.
    #[error("device '{device}' cannot load executables of format '{format}'")]
    UnsupportedExecutableFormat { device: String, format: String },
    /// The executable's payload is malformed for its format.
    #[error("invalid executable '{name}': {reason}")]
    InvalidExecutable { name: String, reason: String },
    /// An object created by one device was handed to another that cannot use it.
    #[error("{what} belongs to device {owner}, not to device {device}")]
    WrongDevice {
        what: String,
        owner: DeviceId,
        device: DeviceId,
    },
    /// A buffer or semaphore implementation this device cannot use (another device's
    /// device-local memory, for instance).
    #[error("{what} is not usable by device '{device}': {reason}")]
    IncompatibleObject {
        what: String,
        device: String,
        reason: String,
    },
    /// `Device::queue(index)` with `index >= queue_count()`.
    #[error("queue index {index} out of range: the device has {count} queues")]
    NoSuchQueue { index: usize, count: usize },
    /// A device limit (bindings per dispatch, push-constant bytes, workgroup count) exceeded.
    #[error("{what} is {value}, above the device limit of {max}")]
    LimitExceeded { what: String, value: u64, max: u64 },
    /// A copy whose source and destination overlap in the same buffer.
    #[error("copy: source {src_start}..{src_end} and destination {dst_start}..{dst_end} overlap in the same buffer")]
    CopyOverlap {
        src_start: u64,
        src_end: u64,
        dst_start: u64,
        dst_end: u64,
    },
    /// A command that is malformed in itself (a copy between ranges of different lengths, a
    /// fill that is not a whole number of patterns). The message names the command.
    #[error("{0}")]
    InvalidCommand(String),
    /// The range is in use by a mapping or a running command that conflicts with this access
    /// (see the aliasing rules of the device).
    #[error("{what}: bytes {start}..{end} are in use by a conflicting access")]
    BufferBusy { what: String, start: u64, end: u64 },
    /// The device is gone (dropped, reset, or lost by the driver). Nothing more can run on it.
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// A host-side semaphore operation failed.
    #[error(transparent)]
    Semaphore(#[from] SemaphoreError),
    /// Anything else the device does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// An error from a [`Semaphore`](crate::Semaphore) operation.
// The variants' fields are the values their messages print (`#[error(...)]`), which
// say what each is; the variants themselves are documented.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SemaphoreError {
    /// The wait's timeout elapsed before the semaphore reached the value.
    #[error(
        "timed out after {waited:?} waiting for semaphore value {value} (current value {current})"
    )]
    Timeout {
        value: u64,
        current: u64,
        waited: Duration,
    },
    /// The semaphore was failed: the work that was to signal it (or work it depended on)
    /// failed. The reason is the original failure's message, propagated unchanged.
    #[error("semaphore failed: {0}")]
    Failed(String),
    /// A signal that would not advance the timeline (`value <= current`).
    #[error(
        "semaphore signal to {requested} does not advance the timeline (current value {current})"
    )]
    NotMonotonic { current: u64, requested: u64 },
}

impl SemaphoreError {
    /// The failure reason, when this is [`SemaphoreError::Failed`].
    pub fn failure_reason(&self) -> Option<&str> {
        match self {
            SemaphoreError::Failed(reason) => Some(reason),
            _ => None,
        }
    }
}
