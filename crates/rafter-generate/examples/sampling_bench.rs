//! Time per token of the sampler over LLM-sized vocabularies.
//!
//!     cargo run -p rafter-generate --release --example sampling_bench
//!
//! Two kinds of logits: "flat", a broad bell-shaped bulk with every 997th token lifted 8
//! above it (a worst case for top-p: its nucleus holds a large share of the vocabulary), and
//! "zipf", logits falling as -1.5 ln(rank) in a scrambled order (closer to a trained LM's).
//! 512 history tokens feed the repetition penalty where it is on. Prints the median and 90th
//! percentile of 200 calls per configuration.

use std::time::Instant;

use rafter_generate::{Sampler, SamplerConfig};

fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Sum of 4 uniforms ~ bell-shaped bulk; every 997th token lifted well above it.
            let u = (0..4)
                .map(|k| ((s >> (16 * k)) & 0xffff) as f32 / 65535.0)
                .sum::<f32>();
            (u - 2.0) * 3.0 + if i % 997 == 0 { 8.0 } else { 0.0 }
        })
        .collect()
}

fn zipf_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_add(99);
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let rank = (i * 7919 + seed as usize * 31) % n;
            -1.5 * ((1 + rank) as f32).ln() + ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
        })
        .collect()
}

fn main() {
    let configs: [(&str, SamplerConfig); 6] = [
        ("greedy", SamplerConfig::greedy()),
        (
            "llama.cpp default (k40 p0.95 minp0.05 T0.8)",
            SamplerConfig::default(),
        ),
        (
            "top-p 0.9 alone, T0.7",
            SamplerConfig {
                top_k: 0,
                min_p: 0.0,
                top_p: 0.9,
                temperature: 0.7,
                ..SamplerConfig::default()
            },
        ),
        (
            "min-p 0.05 alone, T1",
            SamplerConfig {
                top_k: 0,
                top_p: 1.0,
                min_p: 0.05,
                temperature: 1.0,
                ..SamplerConfig::default()
            },
        ),
        ("temperature 1 alone", SamplerConfig::temperature(1.0, 0)),
        (
            "default + repetition penalty 1.1",
            SamplerConfig {
                repetition_penalty: 1.1,
                ..SamplerConfig::default()
            },
        ),
    ];
    for (vocab, kind) in [
        (151_936usize, "flat"),
        (262_144, "flat"),
        (151_936, "zipf"),
        (262_144, "zipf"),
    ] {
        let inputs: Vec<Vec<f32>> = (0..8)
            .map(|s| {
                if kind == "flat" {
                    logits(vocab, s)
                } else {
                    zipf_logits(vocab, s)
                }
            })
            .collect();
        for (name, cfg) in configs {
            let mut sampler = Sampler::new(cfg).unwrap();
            for t in 0..512u32 {
                sampler.accept((t * 7919) % vocab as u32);
            }
            let mut times = Vec::new();
            let mut sink = 0u64;
            for i in 0..200 {
                let l = &inputs[i % inputs.len()];
                let t0 = Instant::now();
                sink += sampler.sample(l).unwrap() as u64;
                times.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            times.sort_by(f64::total_cmp);
            println!(
                "vocab {vocab:>7} {kind}  {name:<46} median {:>7.1} us  p90 {:>7.1} us  (sink {sink})",
                times[times.len() / 2],
                times[times.len() * 9 / 10]
            );
        }
    }
}
