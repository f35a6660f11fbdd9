//! Helpers shared by this crate's integration tests: a deterministic generator, the ISAs
//! available here, and f64 references of the activations.

#![allow(dead_code)] // each test file uses its own subset

use rafter_kernels_cpu::Isa;

pub mod ggml;

/// A xorshift generator: the same values on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.f32()).collect()
    }
}

/// Every ISA this CPU runs (the scalar one always).
pub fn isas() -> Vec<Isa> {
    let isas: Vec<Isa> = Isa::all()
        .iter()
        .copied()
        .filter(|i| i.is_available())
        .collect();
    assert!(isas.contains(&Isa::Scalar));
    isas
}

/// GELU's tanh approximation, in f64.
pub fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}
