//! `is_inf` (ONNX IsInf, each sign detected or not) in an elementwise kernel on the
//! Vulkan device (lavapipe in CI), against the reference executor: infinities of both
//! signs, NaN, the largest finite values, zeros, on f32 and f16.

use crate::common;

use half::f16;
use rafter_codegen_spirv::kernel_module;
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

#[test]
fn is_inf_matches_the_reference() {
    let Some(device) = common::device_or_skip("is_inf") else {
        return;
    };
    let v = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.0,
        -0.0,
        1.5,
        -2.0,
        65504.0,
        -65504.0,
    ];
    for (dt, dtype) in [("f32", DType::F32), ("f16", DType::F16)] {
        let x = match dtype {
            DType::F16 => {
                let bytes: Vec<u8> = v
                    .iter()
                    .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                    .collect();
                Tensor::from_le_bytes(DType::F16, &[9], &bytes).unwrap()
            }
            _ => Tensor::f32s(&[9], v.to_vec()),
        };
        for neg in [false, true] {
            for pos in [false, true] {
                let text = format!(
                    "graph @i(%x: {dt}[9]) -> (%y) {{\n  %y: bool[9] = is_inf{{detect_negative = {neg}, detect_positive = {pos}}}(%x)\n}}"
                );
                let body = parse_graph(&text).unwrap();
                let module = kernel_module(&body, 0).unwrap_or_else(|e| panic!("{text}: {e}"));
                let words: Vec<u32> = module
                    .spirv
                    .chunks(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                common::spirv_val(&words, &format!("is_inf_{dt}_{neg}_{pos}"));
                let inputs = vec![x.clone()];
                let want = rafter_reference::run(&body, inputs.clone())
                    .unwrap()
                    .remove(0);
                let got = common::run_module(&device, &module, &inputs, (DType::Bool, &[9]));
                assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
            }
        }
    }
}
