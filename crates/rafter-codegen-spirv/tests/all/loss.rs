//! `nll_loss` and `softmax_cross_entropy` on the Vulkan device (lavapipe in CI), against
//! the reference executor: every reduction, with and without class weights and
//! `ignore_index` (a negative one too), negative targets, i32 and i64 targets, `[N, C]`
//! and `[N, C, d1, d2]` inputs, the cross-entropy's log-probabilities, f32 and f16.

use crate::common;

use rafter_codegen_spirv::{kernel_module, loss};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

fn targets(dtype: DType, dims: &[usize], v: &[i64]) -> Tensor {
    let bytes: Vec<u8> = if dtype == DType::I32 {
        v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
    } else {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    };
    Tensor::from_le_bytes(dtype, dims, &bytes).unwrap()
}

/// One loss case: the op, its reduction and ignore index, whether it is weighted and
/// returns the log-probabilities.
struct Case<'a> {
    op: &'a str,
    reduction: &'a str,
    ignore: Option<i64>,
    weighted: bool,
    log_prob: bool,
}

/// The body text of `case` on an input of `dims` (`dt` its element type) and targets of
/// `idt`.
fn body_text(case: &Case, dims: &[usize], dt: &str, idt: &str) -> String {
    let mut t_dims = vec![dims[0]];
    t_dims.extend(&dims[2..]);
    let attrs = match case.ignore {
        Some(i) => format!("reduction = {}, ignore_index = {i}", case.reduction),
        None => format!("reduction = {}", case.reduction),
    };
    let loss_dims = if case.reduction == "none" {
        common::dims_text(&t_dims)
    } else {
        String::new()
    };
    let (w_in, w_arg) = if case.weighted {
        (format!(", %w: {dt}[{}]", dims[1]), ", %w")
    } else {
        (String::new(), "")
    };
    let (outs, results) = if case.log_prob {
        (
            "%y, %lp".to_string(),
            format!(
                "%y: {dt}[{loss_dims}], %lp: {dt}[{}]",
                common::dims_text(dims)
            ),
        )
    } else {
        ("%y".to_string(), format!("%y: {dt}[{loss_dims}]"))
    };
    format!(
        "graph @g(%x: {dt}[{d}], %t: {idt}[{td}]{w_in}) -> ({outs}) {{\n  {results} = {op}{{{attrs}}}(%x, %t{w_arg})\n}}",
        d = common::dims_text(dims),
        td = common::dims_text(&t_dims),
        op = case.op,
    )
}

/// Runs `case` on the device and the reference; asserts every result agrees within `rtol`.
fn check(
    device: &rafter_hal_vulkan::VulkanDevice,
    case: &Case,
    dims: &[usize],
    dt: DType,
    idt: DType,
    rtol: f32,
) {
    let text = body_text(case, dims, &dt.to_string(), &idt.to_string());
    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let kernel = loss(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(
        &kernel.spirv,
        &format!("loss_{}_{}", case.op, case.reduction),
    );
    let count: usize = dims.iter().product();
    let x: Vec<f32> = (0..count)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.3)
        .collect();
    let positions = count / dims[1];
    let c = dims[1] as i64;
    // Every class, a negative one (from the end) and the ignore index in turn.
    let t: Vec<i64> = (0..positions as i64)
        .map(|p| match p % 7 {
            6 => case.ignore.unwrap_or(-1),
            5 => -2,
            _ => (p * 3) % c,
        })
        .collect();
    let mut t_dims = vec![dims[0]];
    t_dims.extend(&dims[2..]);
    let mut inputs = vec![common::floats(dt, dims, &x), targets(idt, &t_dims, &t)];
    if case.weighted {
        let w: Vec<f32> = (0..dims[1]).map(|j| 0.5 + j as f32 * 0.25).collect();
        inputs.push(common::floats(dt, &[dims[1]], &w));
    }
    let want =
        rafter_reference::run(&body, inputs.clone()).unwrap_or_else(|e| panic!("{text}: {e}"));
    let module = kernel_module(&body, 0).unwrap();
    let shapes: Vec<Vec<usize>> = want.iter().map(|w| w.shape().to_vec()).collect();
    let got = common::run_outputs(device, &module, &inputs, dt, &shapes);
    for (g, w) in got.iter().zip(&want) {
        for (k, (g, w)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!(
                common::close(*g as f32, w as f32, 1e-6, rtol),
                "{text}: element {k}: {g} vs reference {w}"
            );
        }
    }
}

#[test]
fn losses_match_the_reference() {
    let Some(device) = common::device_or_skip("loss") else {
        return;
    };
    for op in ["nll_loss", "softmax_cross_entropy"] {
        for reduction in ["none", "sum", "mean"] {
            for ignore in [None, Some(1), Some(-1)] {
                for weighted in [false, true] {
                    for log_prob in [false, true] {
                        if log_prob && op == "nll_loss" {
                            continue;
                        }
                        let case = Case {
                            op,
                            reduction,
                            ignore,
                            weighted,
                            log_prob,
                        };
                        for dims in [&[5usize, 4][..], &[2, 3, 4, 5]] {
                            check(&device, &case, dims, DType::F32, DType::I64, 1e-5);
                        }
                        check(&device, &case, &[3, 5, 2], DType::F32, DType::I32, 1e-5);
                        check(&device, &case, &[3, 5, 2], DType::F16, DType::I64, 2e-3);
                    }
                }
            }
        }
    }
}

#[test]
fn a_target_outside_the_classes_gives_nan() {
    let Some(device) = common::device_or_skip("loss out of range") else {
        return;
    };
    let body = parse_graph(
        "graph @g(%x: f32[2, 3], %t: i64[2]) -> (%y) {\n  %y: f32[2] = nll_loss{reduction = none}(%x, %t)\n}",
    )
    .unwrap();
    let module = kernel_module(&body, 0).unwrap();
    let x = Tensor::f32s(&[2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let inputs = vec![x, targets(DType::I64, &[2], &[3, 2])];
    let got = common::run_module(&device, &module, &inputs, (DType::F32, &[2])).to_f64_vec();
    assert!(got[0].is_nan(), "{got:?}");
    assert_eq!(got[1], -5.0);
}

#[test]
fn a_loss_of_bf16_is_refused_with_the_reason() {
    let body = parse_graph(
        "graph @g(%x: bf16[2, 3], %t: i64[2]) -> (%y) {\n  %y: bf16[] = nll_loss{reduction = sum}(%x, %t)\n}",
    )
    .unwrap();
    let e = loss(&body).unwrap_err();
    assert!(e.contains("bf16"), "{e}");
}
