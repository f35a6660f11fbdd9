//! rafter's reference executor.
//!
//! Every graph op in plain, obviously-correct Rust over `ndarray` arrays. It is the oracle
//! every backend is tested against and the CPU fallback of the partitioner; speed is not
//! its job.

pub mod exec;
pub mod npy;
pub mod ops;
mod tensor;

pub use exec::{run, run_with, Bindings, ExecError};
pub use tensor::{BytesSizeError, Tensor};
