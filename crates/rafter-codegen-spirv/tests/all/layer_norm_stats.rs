//! `layer_norm` with its optional results (ONNX LayerNormalization's Mean and
//! InvStdDev, one per row) on the Vulkan device (lavapipe in CI), against the reference
//! executor: every axis of a 3-D tensor, the mean alone or both, rows of one workgroup's
//! width and of many.

use crate::common;

use rafter_codegen_spirv::kernel_module;
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| ((i * 37 + seed) % 53) as f32 / 13.0 - 2.0)
        .collect()
}

#[test]
fn layer_norm_statistics_match_the_reference() {
    let Some(device) = common::device_or_skip("layer_norm_stats") else {
        return;
    };
    let dims = [3usize, 4, 150];
    for axis in [0usize, 1, 2] {
        for stats in [1usize, 2] {
            let lane = &dims[axis..];
            let shown = |d: &[usize]| {
                d.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let stat_dims: Vec<usize> =
                (0..3).map(|d| if d < axis { dims[d] } else { 1 }).collect();
            let names = ["%m", "%v"];
            let results: Vec<String> = std::iter::once(format!("%y: f32[{}]", shown(&dims)))
                .chain((0..stats).map(|j| format!("{}: f32[{}]", names[j], shown(&stat_dims))))
                .collect();
            let outputs: Vec<&str> = std::iter::once("%y")
                .chain(names[..stats].iter().copied())
                .collect();
            let text = format!(
                "graph @ln(%x: f32[{}], %g: f32[{}], %b: f32[{}]) -> ({}) {{\n  {} = layer_norm{{axis = {axis}, epsilon = 1e-5}}(%x, %g, %b)\n}}",
                shown(&dims),
                shown(lane),
                shown(lane),
                outputs.join(", "),
                results.join(", ")
            );
            let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let module = kernel_module(&body, 0).unwrap_or_else(|e| panic!("{text}: {e}"));
            let words: Vec<u32> = module
                .spirv
                .chunks(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            common::spirv_val(&words, &format!("layer_norm_stats_{axis}_{stats}"));
            let n: usize = dims.iter().product();
            let l: usize = lane.iter().product();
            let inputs = vec![
                Tensor::f32s(&dims, values(n, 1)),
                Tensor::f32s(lane, values(l, 5)),
                Tensor::f32s(lane, values(l, 9)),
            ];
            let want = rafter_reference::run(&body, inputs.clone()).unwrap();
            let shapes: Vec<Vec<usize>> = want.iter().map(|t| t.shape().to_vec()).collect();
            let got = common::run_outputs(&device, &module, &inputs, DType::F32, &shapes);
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
                    let ok = (a - b).abs() <= 1e-4 * b.abs().max(1.0);
                    assert!(ok, "{text}\noutput {o}: got {a}, want {b}");
                }
            }
        }
    }
}
