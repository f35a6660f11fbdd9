//! `reduce` with its axes read at run time (ONNX opset-18 reductions, opset-13 ReduceSum,
//! `axes` a graph input) on the Vulkan device (lavapipe in CI), against the reference
//! executor: every kind, single, several, negative and empty axes, keepdims or not,
//! `noop_with_empty_axes`, NaNs, an empty lane, f32 and f16.

use crate::common;

use half::f16;
use rafter_codegen_spirv::{kernel_module, reduce_axes};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

const KINDS: [&str; 10] = [
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "l1",
    "l2",
    "log_sum",
    "log_sum_exp",
    "sum_square",
];

/// `values` as a tensor of `dims` and `dtype` (f32 or f16).
fn tensor(dtype: DType, dims: &[usize], values: &[f32]) -> Tensor {
    match dtype {
        DType::F16 => {
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect();
            Tensor::from_le_bytes(DType::F16, dims, &bytes).unwrap()
        }
        _ => Tensor::f32s(dims, values.to_vec()),
    }
}

fn axes_tensor(dtype: DType, axes: &[i64]) -> Tensor {
    let bytes: Vec<u8> = match dtype {
        DType::I32 => axes
            .iter()
            .flat_map(|&a| (a as i32).to_le_bytes())
            .collect(),
        _ => axes.iter().flat_map(|&a| a.to_le_bytes()).collect(),
    };
    Tensor::from_le_bytes(dtype, &[axes.len()], &bytes).unwrap()
}

/// Runs one reduce of `data` (`dims`) by `axes` on the device and the reference; asserts
/// they agree within `rtol` (NaN where the reference has NaN).
#[allow(clippy::too_many_arguments)]
fn check(
    device: &rafter_hal_vulkan::VulkanDevice,
    (dt, dtype): (&str, DType),
    kind: &str,
    dims: &[usize],
    data: &[f32],
    (axes, axes_dtype): (&[i64], DType),
    (keep, noop): (bool, bool),
    rtol: f64,
) {
    let rank = if keep || (axes.is_empty() && noop) {
        dims.len()
    } else if axes.is_empty() {
        0
    } else {
        dims.len() - axes.len()
    };
    let shown = |d: &[usize]| {
        d.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let out: Vec<String> = (0..rank).map(|i| format!("_r{i}")).collect();
    let at = if axes_dtype == DType::I32 {
        "i32"
    } else {
        "i64"
    };
    let text = format!(
        "graph @r(%x: {dt}[{}], %a: {at}[{}]) -> (%y) {{\n  %y: {dt}[{}] = reduce{{kind = {kind}, axes = [], keep_dims = {keep}, noop_with_empty_axes = {noop}}}(%x, %a)\n}}",
        shown(dims),
        axes.len(),
        out.join(", ")
    );
    let body = parse_graph(&text).unwrap();
    let kernel = reduce_axes(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, &format!("reduce_axes_{kind}"));
    let module = kernel_module(&body, 0).unwrap();
    let inputs = vec![tensor(dtype, dims, data), axes_tensor(axes_dtype, axes)];
    let want = rafter_reference::run(&body, inputs.clone())
        .unwrap()
        .remove(0);
    let shape = want.shape().to_vec();
    let got = common::run_module(device, &module, &inputs, (dtype, &shape));
    let ctx = format!("{text}\naxes {axes:?}");
    assert_eq!(got.shape(), want.shape(), "{ctx}");
    for (g, w) in got.to_f64_vec().iter().zip(want.to_f64_vec()) {
        let same =
            (g.is_nan() && w.is_nan()) || g == &w || (g - w).abs() <= rtol * w.abs().max(1.0);
        assert!(same, "{ctx}: got {g}, want {w}");
    }
}

/// A `[3, 4, 5]` tensor of values in (-1.5, 1.5), positive (logs) where `positive`.
fn data(positive: bool) -> Vec<f32> {
    (0..60u32)
        .map(|i| {
            let v = ((i * 37) % 29) as f32 / 10.0 - 1.4;
            if positive {
                v.abs() + 0.1
            } else {
                v
            }
        })
        .collect()
}

#[test]
fn reductions_by_run_time_axes_match_the_reference() {
    let Some(device) = common::device_or_skip("reduce_axes") else {
        return;
    };
    let dims = [3usize, 4, 5];
    let axes_cases: [&[i64]; 6] = [&[1], &[-1], &[0, 2], &[2, 0], &[0, 1, 2], &[]];
    for (dt, dtype, tol) in [("f32", DType::F32, 1e-5), ("f16", DType::F16, 2e-3)] {
        for kind in KINDS {
            let x = data(kind == "log_sum");
            for axes in axes_cases {
                for keep in [true, false] {
                    // `noop_with_empty_axes` matters only without axes.
                    for noop in [false, true].into_iter().filter(|&n| !n || axes.is_empty()) {
                        let axes_dtype = if keep { DType::I32 } else { DType::I64 };
                        let rtol = if kind == "prod" { tol * 10.0 } else { tol };
                        let t = (dt, dtype);
                        let a = (axes, axes_dtype);
                        check(&device, t, kind, &dims, &x, a, (keep, noop), rtol);
                    }
                }
            }
        }
    }
}

/// NaN wins a max or min; a lane over an empty axis gives the reduction's identity.
#[test]
fn nans_and_empty_lanes_match_the_reference() {
    let Some(device) = common::device_or_skip("reduce_axes_nan") else {
        return;
    };
    let mut x = data(false);
    x[7] = f32::NAN;
    x[33] = f32::INFINITY;
    for kind in KINDS {
        let t = ("f32", DType::F32);
        for axes in [&[1i64][..], &[0, 2]] {
            let a = (axes, DType::I64);
            check(&device, t, kind, &[3, 4, 5], &x, a, (true, false), 1e-5);
        }
        let a = (&[1i64][..], DType::I64);
        check(&device, t, kind, &[2, 0, 3], &[], a, (true, false), 0.0);
    }
}

#[test]
fn reductions_the_kernel_cannot_do_say_why() {
    let cases = [
        (
            "graph @r(%x: f32[n, 4], %a: i64[1]) -> (%y) {\n  %y: f32[_r0, _r1] = reduce{kind = sum, axes = [], keep_dims = true, noop_with_empty_axes = false}(%x, %a)\n}",
            "dim n is not static",
        ),
        (
            "graph @r(%x: i32[3, 4], %a: i64[1]) -> (%y) {\n  %y: i32[_r0, _r1] = reduce{kind = sum, axes = [], keep_dims = true, noop_with_empty_axes = false}(%x, %a)\n}",
            "reduce data is i32",
        ),
    ];
    for (text, want) in cases {
        let e = reduce_axes(&parse_graph(text).unwrap()).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}

/// ONNX's expansions of ReduceL1 and ReduceSumSquare (`abs` or `x * x`, then a sum by
/// run-time axes), and a longer prologue, fused into the kernel; f32 and f16 (each f16
/// prologue value rounded as if stored, as the reference computes op by op).
#[test]
fn prologues_match_the_reference() {
    let Some(device) = common::device_or_skip("reduce_axes_prologue") else {
        return;
    };
    let x = data(false);
    let prologues = [
        "  %p: {dt}[3, 4, 5] = unary{op = abs}(%x)\n",
        "  %p: {dt}[3, 4, 5] = binary{op = mul}(%x, %x)\n",
        "  %q: {dt}[3, 4, 5] = unary{op = exp}(%x)\n  %r: {dt}[3, 4, 5] = binary{op = sub}(%q, %x)\n  %p: {dt}[3, 4, 5] = unary{op = sqrt}(%r)\n",
    ];
    for (dt, dtype, tol) in [("f32", DType::F32, 1e-5), ("f16", DType::F16, 2e-3)] {
        for prologue in prologues {
            for axes in [&[1i64][..], &[-1, 0], &[]] {
                let text = format!(
                    "graph @r(%x: {dt}[3, 4, 5], %a: i64[{}]) -> (%y) {{\n{}  %y: {dt}[_r0, _r1, _r2] = reduce{{kind = sum, axes = [], keep_dims = true, noop_with_empty_axes = false}}(%p, %a)\n}}",
                    axes.len(),
                    prologue.replace("{dt}", dt)
                );
                let body = parse_graph(&text).unwrap();
                let kernel = reduce_axes(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
                common::spirv_val(&kernel.spirv, "reduce_axes_prologue");
                let module = kernel_module(&body, 0).unwrap();
                let inputs = vec![tensor(dtype, &[3, 4, 5], &x), axes_tensor(DType::I64, axes)];
                let want = rafter_reference::run(&body, inputs.clone())
                    .unwrap()
                    .remove(0);
                let shape = want.shape().to_vec();
                let got = common::run_module(&device, &module, &inputs, (dtype, &shape));
                for (g, w) in got.to_f64_vec().iter().zip(want.to_f64_vec()) {
                    let ok = (g - w).abs() <= tol * w.abs().max(1.0);
                    assert!(ok, "{text}\naxes {axes:?}: got {g}, want {w}");
                }
            }
        }
    }
}
