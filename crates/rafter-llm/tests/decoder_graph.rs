//! The decoder graph of each architecture, run by the reference executor: the KV cache
//! carried across calls gives the same logits as one call over all the tokens (prefill in
//! chunks and decode one token at a time agree with a single prefill), and the graph
//! passes the verifier and the text format.
//!
//! Agreement with transformers itself is checked against its saved outputs by the
//! end-to-end tests over `scripts/gen_llm_fixtures.py`'s checkpoints.

mod common;

use common::*;
use ndarray::{ArrayD, IxDyn};
use rafter_ir::text::{parse_graph, print_graph};
use rafter_llm::{build_decoder, DecoderOptions, KvType, Logits, ModelSource};
use rafter_reference::{run_with, Bindings, Tensor};
use safetensors::Dtype;

fn source(name: &str, config: &serde_json::Value, dims: &Dims) -> (TempDir, ModelSource) {
    let dir = TempDir::new(name);
    write_hf_folder(dir.path(), config, &dims.hf_tensors(), Dtype::F32, 1);
    let m = ModelSource::open(dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
    (dir, m)
}

/// Runs the graph over `chunks` of token ids in successive calls, carrying the states;
/// returns each call's logits rows (`[positions, vocab]` flattened per position).
fn run_chunks(g: &rafter_ir::Graph, chunks: &[&[i64]]) -> Vec<Vec<f32>> {
    let n_states = g.states.len();
    let cache = &g.value(g.inputs[1]).ty;
    let kv_width = cache.dims[2].as_known().unwrap() as usize;
    let empty = IxDyn(&[1, 0, kv_width]);
    let mut past: Vec<Tensor> = (0..n_states)
        .map(|_| match cache.dtype {
            rafter_ir::DType::F16 => Tensor::F16(ArrayD::from_elem(empty.clone(), half::f16::ZERO)),
            _ => Tensor::F32(ArrayD::zeros(empty.clone())),
        })
        .collect();
    let mut rows = Vec::new();
    for ids in chunks {
        let ids_t =
            Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1, ids.len()]), ids.to_vec()).unwrap());
        let mut inputs = vec![ids_t];
        inputs.append(&mut past);
        let outs = run_with(g, inputs, &mut Bindings::default()).unwrap();
        let Tensor::F32(logits) = &outs[0] else {
            panic!("logits are f32")
        };
        let vocab = *logits.shape().last().unwrap();
        let flat: Vec<f32> = logits.iter().copied().collect();
        rows.extend(flat.chunks(vocab).map(<[f32]>::to_vec));
        past = outs[1..].to_vec();
        assert_eq!(past.len(), n_states);
    }
    rows
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Prefill of all tokens == prefill in chunks then one-token decodes, position by position,
/// with an f32 and with an f16 cache (each call rounds its new keys and values once as they
/// enter the cache, and attention reads the whole cache, so chunking changes nothing).
fn check_cache_consistency(name: &str, config: serde_json::Value, dims: Dims) {
    for kv in [KvType::F32, KvType::F16] {
        check_cache_consistency_as(name, &config, &dims, kv);
    }
}

fn check_cache_consistency_as(name: &str, config: &serde_json::Value, dims: &Dims, kv: KvType) {
    let name = &format!("{name} ({kv} cache)");
    let (_d, m) = source(name, config, dims);
    let opts = |logits| DecoderOptions {
        logits,
        kv_type: Some(kv),
        ..Default::default()
    };
    let all = build_decoder(&m, &opts(Logits::All)).unwrap();
    let g = &all.graph;
    assert_eq!(
        g.value(g.inputs[1]).ty.dtype,
        kv.dtype(),
        "{name}: the cache's dtype"
    );
    rafter_ir::verify(g).unwrap();
    assert_eq!(
        parse_graph(&print_graph(g)).unwrap(),
        *g,
        "{name}: the graph round-trips through the text format"
    );
    let ids: Vec<i64> = (0..11).map(|i| (i * 37 + 5) % dims.vocab as i64).collect();
    let once = run_chunks(g, &[&ids]);
    let split = run_chunks(g, &[&ids[..4], &ids[4..9], &ids[9..10], &ids[10..]]);
    assert_eq!(once.len(), ids.len());
    assert_eq!(split.len(), ids.len());
    for (p, (a, b)) in once.iter().zip(&split).enumerate() {
        let scale = max_abs(a).max(1e-6);
        let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            err <= 1e-5 * scale,
            "{name}: position {p}: cached and uncached logits differ by {err} (max {scale})"
        );
        assert!(a.iter().all(|x| x.is_finite()), "{name}: finite logits");
    }
    // Logits::Last gives the last row of each call.
    let last = build_decoder(&m, &opts(Logits::Last)).unwrap();
    let rows = run_chunks(&last.graph, &[&ids[..6], &ids[6..7]]);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0], once[5], "{name}: last row of the prefill");
    let err = rows[1]
        .iter()
        .zip(&once[6])
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(err <= 1e-5 * max_abs(&once[6]), "{name}: decode step");
}

#[test]
fn qwen3_cache_is_consistent() {
    let (c, d) = qwen3_0_6b();
    check_cache_consistency("dg-qwen3", c, d);
}

#[test]
fn qwen3_moe_cache_is_consistent() {
    let (c, d) = qwen3_30b_a3b();
    check_cache_consistency("dg-qwen3moe", c, d);
}

#[test]
fn llama_cache_is_consistent() {
    let (c, d) = llama_3_2_1b();
    check_cache_consistency("dg-llama", c, d);
}

#[test]
fn gemma3_sliding_window_cache_is_consistent() {
    // 11 tokens against a window of 8: the sliding layers drop early keys.
    let (c, d) = gemma3_1b_it();
    check_cache_consistency("dg-gemma3", c, d);
}

/// The decoder compiles with every intermediate planned in the arena (no buffer sized at
/// run time) and its KV caches as session state, at the declared `past + seq` bound.
#[test]
fn decoders_compile_with_planned_memory() {
    use rafter_ir::program::Storage;
    use rafter_ir::{Dim, Symbol};
    for (name, (config, dims)) in [
        ("dc-qwen3", qwen3_0_6b()),
        ("dc-moe", qwen3_30b_a3b()),
        ("dc-gemma3", gemma3_1b_it()),
    ] {
        let (_d, m) = source(name, &config, &dims);
        // An HF checkpoint's cache is f32 by default; an f16 one takes half the bytes.
        for (kv, elem) in [(None, 4), (Some(KvType::F16), 2)] {
            let d = build_decoder(
                &m,
                &DecoderOptions {
                    kv_type: kv,
                    ..Default::default()
                },
            )
            .unwrap();
            let past_seq = Dim::symbol("past").add(&Dim::symbol("seq"));
            let opts = rafter_opt::CompileOptions {
                bounds: vec![(Symbol::new("past"), 64), (Symbol::new("seq"), 64)],
                dim_bounds: vec![(past_seq, 64)],
                half_compute: rafter_opt::HalfCompute::AsIs,
                ..Default::default()
            };
            let p = rafter_opt::compile(&d.graph, &opts).unwrap();
            if std::env::var_os("RAFTER_PRINT_PLAN").is_some() {
                for (i, k) in p.kernels.iter().enumerate() {
                    let ops: Vec<&str> = k.body.nodes.iter().map(|n| n.op.name()).collect();
                    println!("{name} k{i} {} {ops:?}", k.kind.word());
                }
            }
            assert_eq!(p.states.len(), 2 * dims.layers, "{name}");
            assert_eq!(p.inputs.len(), 1, "{name}: only input_ids");
            assert_eq!(p.outputs.len(), 1, "{name}: only logits");
            let width = (dims.kv * dims.head_dim) as u64;
            for s in 0..p.states.len() {
                assert_eq!(
                    p.state_bytes(s),
                    Some(64 * width * elem),
                    "{name}: state {s}"
                );
            }
            for b in &p.buffers {
                assert!(
                    !matches!(b.storage, Storage::Dynamic),
                    "{name}: buffer `{}` {} is sized at run time",
                    b.name,
                    b.ty
                );
            }
        }
    }
}

/// The compiled decoder on the CPU runtime (native kernels, KV caches as session state)
/// gives the reference executor's logits, call after call, with an f32 and an f16 cache.
/// The f16 cache adds only the casts of each layer's new keys and values, native kernels
/// too: the linear products they follow and the attention reading the cache stay native.
fn check_runtime_matches_reference(name: &str, config: serde_json::Value, dims: Dims) {
    let f32 = check_runtime_matches_reference_as(name, &config, &dims, KvType::F32);
    let f16 = check_runtime_matches_reference_as(name, &config, &dims, KvType::F16);
    assert_eq!(
        f16.kernels,
        f32.kernels + 2 * dims.layers,
        "{name}: native kernels with an f16 cache ({f16:?}) and an f32 one ({f32:?})"
    );
}

fn check_runtime_matches_reference_as(
    name: &str,
    config: &serde_json::Value,
    dims: &Dims,
    kv: KvType,
) -> rafter_runtime::NativeStats {
    use rafter_ir::{Dim, Symbol};
    let name = &format!("{name} ({kv} cache)");
    let (_d, m) = source(name, config, dims);
    let d = build_decoder(
        &m,
        &DecoderOptions {
            logits: Logits::All,
            kv_type: Some(kv),
            ..Default::default()
        },
    )
    .unwrap();
    let past_seq = Dim::symbol("past").add(&Dim::symbol("seq"));
    let opts = rafter_opt::CompileOptions {
        bounds: vec![(Symbol::new("past"), 32), (Symbol::new("seq"), 32)],
        dim_bounds: vec![(past_seq, 32)],
        half_compute: rafter_opt::HalfCompute::AsIs,
        ..Default::default()
    };
    let p = rafter_opt::compile(&d.graph, &opts).unwrap();
    let devices = rafter_runtime_cpu::devices().unwrap();
    let s = rafter_runtime::Session::new(p, &devices).unwrap();
    let ids: Vec<i64> = (0..11).map(|i| (i * 53 + 3) % dims.vocab as i64).collect();
    let chunks: [&[i64]; 4] = [&ids[..5], &ids[5..6], &ids[6..10], &ids[10..]];
    let want = run_chunks(&d.graph, &chunks);
    let mut got = Vec::new();
    for c in chunks {
        let t = rafter_runtime::Tensor::from_slice(&[1, c.len()], c).unwrap();
        let out = s.run(vec![t], std::time::Duration::from_secs(60)).unwrap();
        let logits = out[0].as_slice::<f32>().unwrap();
        got.extend(logits.chunks(dims.vocab).map(<[f32]>::to_vec));
    }
    assert_eq!(s.state_lengths()[0], ids.len());
    // With an f16 cache the softmax weights are rounded to f16 (llama.cpp's f16 products):
    // a weight within f32 noise of a rounding boundary may round one way in the kernel and
    // the other in the reference, moving it by 2^-11 of itself (seen: 7e-5 of the largest
    // logit). f32 caches agree to f32 noise.
    let tol = if kv == KvType::F16 { 2e-4 } else { 2e-5 };
    for (p, (a, b)) in want.iter().zip(&got).enumerate() {
        let scale = max_abs(a).max(1e-6);
        let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            err <= tol * scale,
            "{name}: position {p}: runtime and reference differ by {err} (max {scale})"
        );
    }
    let stats = s.native_stats();
    println!("{name}: {stats:?}");
    assert_eq!(stats.fallbacks, 0, "{name}: {stats:?}");
    stats
}

#[test]
fn qwen3_runs_on_the_cpu_runtime() {
    let (c, d) = qwen3_0_6b();
    check_runtime_matches_reference("rt-qwen3", c, d);
}

#[test]
fn qwen3_moe_runs_on_the_cpu_runtime() {
    let (c, d) = qwen3_30b_a3b();
    check_runtime_matches_reference("rt-moe", c, d);
}

#[test]
fn gemma3_runs_on_the_cpu_runtime() {
    let (c, d) = gemma3_1b_it();
    check_runtime_matches_reference("rt-gemma3", c, d);
}

#[test]
fn llama_runs_on_the_cpu_runtime() {
    let (c, d) = llama_3_2_1b();
    check_runtime_matches_reference("rt-llama", c, d);
}

/// `quantize: q8_0` re-encodes every linear weight and the embedding (weights with rows of
/// whole blocks), and the logits stay close to the float model's.
#[test]
fn quantized_builds_stay_close_to_the_float_model() {
    use rafter_ir::{Op, WeightFormat};
    let (c, d) = qwen3_0_6b();
    let (_dir, m) = source("dg-quant", &c, &d);
    let all = |quantize| DecoderOptions {
        logits: Logits::All,
        quantize,
        kv_type: None,
    };
    let float = build_decoder(&m, &all(None)).unwrap();
    let ids: Vec<i64> = (0..6).map(|i| (i * 41 + 7) % d.vocab as i64).collect();
    let want = run_chunks(&float.graph, &[&ids]);
    for q in [WeightFormat::Q8_0, WeightFormat::Q4K] {
        let g = build_decoder(&m, &all(Some(q))).unwrap().graph;
        let formats: Vec<WeightFormat> = g
            .nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::Linear { format } | Op::Embedding { format } => Some(format),
                _ => None,
            })
            .collect();
        // Rows of 64 are whole q8_0 blocks; q4_k's 256-value blocks do not fit them.
        let expect = if q == WeightFormat::Q8_0 {
            q
        } else {
            WeightFormat::F32
        };
        assert!(formats.iter().all(|&f| f == expect), "{q:?}: {formats:?}");
        let got = run_chunks(&g, &[&ids]);
        for (a, b) in want.iter().zip(&got) {
            let e = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                e <= 0.05 * max_abs(a),
                "{q:?}: quantized logits differ by {e}"
            );
        }
    }
    let e = build_decoder(&m, &all(Some(WeightFormat::BF16))).unwrap_err();
    assert!(e.to_string().contains("block format"), "{e}");
}
