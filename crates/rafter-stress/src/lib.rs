//! Stress and fault-injection harness of rafter's runtime (issue 28, items 2 and 3).
//!
//! The runtime is meant to run unattended with many calls in flight on several devices;
//! ordering bugs there (a lost wake-up, a missed signal on failure) show only under load,
//! at random, and as hangs. This crate holds what the stress tests need to provoke and
//! diagnose them:
//!
//! - [`models`]: a random pool of real models from ONNX's conformance set, each compiled
//!   for a target, with data sets whose expected outputs come from the reference executor.
//! - [`watchdog`]: a registry of calls in flight and a thread that, when one passes its
//!   deadline, prints every call's semaphores and every device's
//!   [`describe`](rafter_hal::Device::describe) dump, then ends the process (a hung call
//!   cannot be cancelled, and a hang must fail, not stall CI).
//! - [`stress`]: rounds of sessions on fresh device sets (random worker, host-thread and
//!   in-flight counts), every output compared with the reference.
//! - [`fault`]: a [`Device`](rafter_hal::Device) wrapper that injects failures (a failed
//!   dispatch, a device lost mid-call, a failed allocation, a semaphore never signalled).
//! - [`rss`]: the process's resident memory, for leak checks.

pub mod fault;
pub mod models;
pub mod rng;
pub mod rss;
pub mod stress;
pub mod watchdog;
