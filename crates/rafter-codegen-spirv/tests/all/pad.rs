//! `pad` on the Vulkan device (lavapipe in CI), against the reference executor: every mode
//! (constant with a folded or run-time value, edge, reflect, wrap), pads on some axes
//! (negative: a crop), f32 and f16; run-time pads say why.

use crate::common;

use rafter_codegen_spirv::{kernel_module, pad};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn show(d: &[i64]) -> String {
    d.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn tensor(dtype: DType, dims: &[usize], v: Vec<f32>) -> Tensor {
    if dtype == DType::F16 {
        let bytes: Vec<u8> = v
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        Tensor::from_le_bytes(DType::F16, dims, &bytes).unwrap()
    } else {
        Tensor::f32s(dims, v)
    }
}

#[test]
fn pads_match_the_reference() {
    let Some(device) = common::device_or_skip("pad") else {
        return;
    };
    let dims = [2usize, 3, 4];
    let x: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 4.0).collect();
    // (pads, axes): all axes; two axes with a crop; one negative axis.
    let cases: [(&[i64], Option<&[i64]>); 3] = [
        (&[0, 2, 1, 1, 1, 3], None),
        (&[1, -1, 2, 2], Some(&[1, 2])),
        (&[3, 1], Some(&[-1])),
    ];
    for (dt, dtype) in [("f32", DType::F32), ("f16", DType::F16)] {
        for mode in ["constant", "edge", "reflect", "wrap"] {
            for (pads, axes) in cases {
                let mut out: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
                let all: Vec<i64> = (0..3).collect();
                let ax = axes.unwrap_or(&all);
                for (k, &a) in ax.iter().enumerate() {
                    let a = a.rem_euclid(3) as usize;
                    out[a] += pads[k] + pads[k + ax.len()];
                }
                let axes_const = axes.map_or(String::new(), |a| {
                    format!("  const %a: i64[{}] = dense [{}]\n", a.len(), show(a))
                });
                let axes_arg = if axes.is_some() { ", %a" } else { "" };
                for runtime_value in [false, true] {
                    let (param, value) = if runtime_value {
                        (format!(", %v: {dt}[]"), "%v")
                    } else {
                        (String::new(), "%c")
                    };
                    let value_const = if runtime_value {
                        String::new()
                    } else {
                        format!("  const %c: {dt}[] = dense [2.5]\n")
                    };
                    let text = format!(
                        "graph @p(%x: {dt}[2, 3, 4]{param}) -> (%y) {{\n  const %p: i64[{}] = dense [{}]\n{value_const}{axes_const}  %y: {dt}[{}] = pad{{mode = {mode}}}(%x, %p, {value}{axes_arg})\n}}",
                        pads.len(),
                        show(pads),
                        show(&out)
                    );
                    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                    let kernel = pad(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                    common::spirv_val(&kernel.spirv, &format!("pad_{mode}_{dt}"));
                    let mut inputs = vec![tensor(dtype, &dims, x.clone())];
                    if runtime_value {
                        inputs.push(tensor(dtype, &[], vec![-7.0]));
                    }
                    let want = rafter_reference::run(&body, inputs.clone())
                        .unwrap()
                        .remove(0);
                    let module = kernel_module(&body, 0).unwrap();
                    let out_u: Vec<usize> = out.iter().map(|&d| d as usize).collect();
                    let got = common::run_module(&device, &module, &inputs, (dtype, &out_u));
                    assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
                }
            }
        }
    }
}

#[test]
fn run_time_pads_say_why() {
    let text = "graph @p(%x: f32[2, 3], %p: i64[4]) -> (%y) {\n  %y: f32[a, b] = pad{mode = constant}(%x, %p, _)\n}";
    let e = pad(&parse_graph(text).unwrap()).unwrap_err();
    assert!(e.contains("not a constant"), "{e}");
}
