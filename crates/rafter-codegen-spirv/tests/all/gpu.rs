//! Generated kernels run on the Vulkan device (lavapipe in CI) and match the CPU.

use crate::common;

use rafter_codegen_spirv::{elementwise, ElementwiseKernel, Operand};
use rafter_hal::{Device, MemoryKind};
use rafter_hal_vulkan::{VulkanBuffer, VulkanDeviceOptions};
use rafter_ir::text::parse_graph;
use rafter_reference::Tensor;

#[test]
fn relu_of_a_times_b_plus_c_matches_the_cpu() {
    let Some(device) = common::device_or_skip("relu_of_a_times_b_plus_c") else {
        return;
    };
    let body = parse_graph(
        "graph @fused(%a: f32[n], %b: f32[n], %c: f32[n]) -> (%y) {\n  %t0: f32[n] = binary{op = mul}(%a, %b)\n  %t1: f32[n] = binary{op = add}(%t0, %c)\n  %y: f32[n] = unary{op = relu}(%t1)\n}",
    )
    .unwrap();
    let kernel = elementwise(&body).unwrap();
    common::spirv_val(&kernel.spirv, "relu_mul_add");
    let n = 100_003; // not a multiple of the workgroup size
    let a = common::inputs_in((-3.0, 3.0), n, 1);
    let b = common::inputs_in((-3.0, 3.0), n, 2);
    let c = common::inputs_in((-3.0, 3.0), n, 3);
    let inputs = [&a, &b, &c].map(|v| common::upload(&device, v));
    let out = common::run(&device, &kernel, &inputs, n as u64);
    let got = common::f32s(&out[0].read_bytes(0, n as u64 * 4).unwrap());
    for i in 0..n {
        let want = (a[i] * b[i] + c[i]).max(0.0);
        // SPIR-V lets a driver contract `a*b + c` into one fused multiply-add (NVIDIA's
        // does, lavapipe's does not), which skips the product's rounding: the results may
        // then differ by that one rounding, at most half an ulp of the product, plus the
        // final one.
        let tol = f32::EPSILON * ((a[i] * b[i]).abs() + want.abs());
        assert!(
            (got[i] - want).abs() <= tol,
            "element {i}: relu({} * {} + {}) = {} on the device, {want} on the CPU",
            a[i],
            b[i],
            c[i],
            got[i]
        );
    }
}

#[test]
fn every_supported_op_matches_the_reference_executor() {
    let Some(device) = common::device_or_skip("every_supported_op_matches_the_reference") else {
        return;
    };
    let mut failures = Vec::new();
    for case in common::op_cases() {
        let body = parse_graph(&case.text).unwrap();
        let kernel = elementwise(&body).unwrap();
        // Shapes: every symbol of a full-shape input gets a size making 2,000-odd elements.
        let full: Vec<usize> = body
            .value(body.inputs[0])
            .ty
            .dims
            .iter()
            .map(|d| d.as_known().map_or(0, |k| k as usize))
            .collect();
        let known: usize = full.iter().filter(|&&d| d > 0).product();
        let symbols = full.iter().filter(|&&d| d == 0).count() as u32;
        let per_symbol = ((2053.0 / known as f64)
            .powf(1.0 / symbols.max(1) as f64)
            .ceil() as usize)
            .max(1);
        let shape: Vec<usize> = full
            .iter()
            .map(|&d| if d == 0 { per_symbol } else { d })
            .collect();
        let count: usize = shape.iter().product();
        let mut host_inputs = Vec::new();
        let mut tensors = Vec::new();
        for (i, (&input, kind)) in body.inputs.iter().zip(&kernel.inputs).enumerate() {
            let dims: Vec<usize> = match kind {
                Operand::Tensor => shape.clone(),
                Operand::Scalar => vec![1; body.value(input).ty.rank()],
                Operand::Broadcast | Operand::Unread | Operand::Lane | Operand::Repeated => {
                    unreachable!("the op cases read full tensors and scalars")
                }
            };
            let len: usize = dims.iter().product();
            let values = common::inputs_in(case.domain, len, 17 + i as u64);
            tensors.push(Tensor::f32s(&dims, values.clone()));
            host_inputs.push(values);
        }
        let want =
            rafter_reference::run(&body, tensors).unwrap_or_else(|e| panic!("{}: {e}", case.label));
        let buffers: Vec<_> = host_inputs
            .iter()
            .map(|v| common::upload(&device, v))
            .collect();
        let outputs = common::run(&device, &kernel, &buffers, count as u64);
        for (o, (buffer, want)) in outputs.iter().zip(&want).enumerate() {
            let got = common::f32s(&buffer.read_bytes(0, count as u64 * 4).unwrap());
            let want: Vec<f32> = want.to_f64_vec().into_iter().map(|v| v as f32).collect();
            let (atol, rtol) = case.tolerance;
            let bad: Vec<String> = (0..count)
                .filter(|&i| !common::close(got[i], want[i], atol, rtol))
                .take(3)
                .map(|i| {
                    let args: Vec<f32> = host_inputs
                        .iter()
                        .map(|v| if v.len() == 1 { v[0] } else { v[i] })
                        .collect();
                    format!("[{i}] args {args:?}: got {} want {}", got[i], want[i])
                })
                .collect();
            if !bad.is_empty() {
                failures.push(format!("{} output {o}: {}", case.label, bad.join("; ")));
            }
        }
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

/// A tensor larger than lavapipe's 128 MiB `maxStorageBufferRange`: no descriptor could bind
/// it whole, a device address reaches every byte.
#[test]
fn a_tensor_larger_than_the_storage_buffer_range_is_computed_through_device_addresses() {
    let Some(device) = common::device_or_skip("a_tensor_larger_than_the_storage_buffer_range")
    else {
        return;
    };
    let range = device.capabilities().limits.max_storage_buffer_range;
    let bytes: u64 = 160 << 20;
    let count = bytes / 4;
    eprintln!("maxStorageBufferRange {range} bytes; tensors of {bytes} bytes ({count} f32)");
    if bytes <= range {
        eprintln!("note: this device's storage-buffer range is larger; the test still runs");
    }
    let body = parse_graph(
        "graph @add(%a: f32[n], %b: f32[n]) -> (%y) {\n  %y: f32[n] = binary{op = add}(%a, %b)\n}",
    )
    .unwrap();
    let kernel = elementwise(&body).unwrap();
    // Inputs computable from the index, so the check needs no 160 MiB host copies.
    let a_of = |i: u64| (i % 1000) as f32;
    let b_of = |i: u64| (i / 1000) as f32 * 0.5;
    let make = |f: &dyn Fn(u64) -> f32| {
        let buffer = device
            .allocate(bytes, MemoryKind::HostVisibleShared)
            .unwrap();
        buffer
            .map_write(0, bytes, |out| {
                for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
                    chunk.copy_from_slice(&f(i as u64).to_le_bytes());
                }
            })
            .unwrap();
        buffer
    };
    let a = make(&a_of);
    let b = make(&b_of);
    let max_x = device.info().limits.max_workgroup_count[0];
    let grid = ElementwiseKernel::workgroups(count, max_x);
    eprintln!(
        "grid {grid:?} of {} invocations each",
        rafter_codegen_spirv::WORKGROUP_SIZE
    );
    let out = common::run(&device, &kernel, &[a.clone(), b.clone()], count);
    let address = out[0]
        .downcast_ref::<VulkanBuffer>()
        .unwrap()
        .device_address();
    eprintln!(
        "output at device address {address:#x}, {} bytes",
        out[0].size()
    );
    let mut mismatches = 0u64;
    out[0]
        .map_read(0, bytes, |got| {
            for (i, chunk) in got.chunks_exact(4).enumerate() {
                let got = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                let want = a_of(i as u64) + b_of(i as u64);
                if got != want {
                    if mismatches < 5 {
                        eprintln!("element {i}: got {got}, want {want}");
                    }
                    mismatches += 1;
                }
            }
        })
        .unwrap();
    assert_eq!(
        mismatches,
        0,
        "elements differ (the last lies at byte {})",
        bytes - 4
    );
}

#[test]
fn the_pipeline_cache_is_written_on_drop_and_read_by_the_next_device() {
    let dir = std::env::temp_dir().join(format!("rafter-pipeline-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("vulkan.cache");
    let options = VulkanDeviceOptions {
        pipeline_cache_path: Some(path.clone()),
        ..Default::default()
    };
    let Some(device) = common::device_with_or_skip("the_pipeline_cache", options.clone()) else {
        return;
    };
    assert!(
        device.pipeline_cache_status().contains("does not exist"),
        "{}",
        device.pipeline_cache_status()
    );
    let body = parse_graph("graph @k(%x: f32[n]) -> (%y) {\n  %y: f32[n] = unary{op = exp}(%x)\n}")
        .unwrap();
    let kernel = elementwise(&body).unwrap();
    let executable = common::load(&device, &kernel, "exp");
    assert_eq!(executable.entry_points(), ["main"]);
    drop(executable);
    drop(device);
    let written = std::fs::metadata(&path)
        .expect("the cache file was written")
        .len();
    eprintln!("pipeline cache: {written} bytes at {}", path.display());
    let device = common::device_with_or_skip("the_pipeline_cache", options).unwrap();
    assert!(
        device.pipeline_cache_status().starts_with("loaded"),
        "{}",
        device.pipeline_cache_status()
    );
    common::load(&device, &kernel, "exp");
    // A corrupt file is ignored, not handed to the driver.
    drop(device);
    std::fs::write(&path, b"not a pipeline cache").unwrap();
    let device = common::device_with_or_skip(
        "the_pipeline_cache",
        VulkanDeviceOptions {
            pipeline_cache_path: Some(path.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        device.pipeline_cache_status().contains("ignored"),
        "{}",
        device.pipeline_cache_status()
    );
    drop(device);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `text` (a body with f32 inputs of `shapes`) on the device and checks every output
/// element equals the reference executor's, bit for bit (these bodies only add, multiply
/// and move values). Returns the kernel's operand kinds.
fn check_against_reference(
    device: &rafter_hal_vulkan::VulkanDevice,
    text: &str,
    shapes: &[&[usize]],
) -> Vec<Operand> {
    check_within(device, text, shapes, 0.0)
}

/// [`check_against_reference`] within a relative tolerance (reductions sum in f32 on the
/// GPU, in f64 in the reference).
fn check_within(
    device: &rafter_hal_vulkan::VulkanDevice,
    text: &str,
    shapes: &[&[usize]],
    rtol: f64,
) -> Vec<Operand> {
    check_close(device, text, shapes, rtol, 0.0)
}

/// [`check_within`] with an absolute tolerance too (a norm's outputs near 0, where
/// `x - mean` cancels).
fn check_close(
    device: &rafter_hal_vulkan::VulkanDevice,
    text: &str,
    shapes: &[&[usize]],
    rtol: f64,
    atol: f64,
) -> Vec<Operand> {
    let body = parse_graph(text).unwrap();
    let kernel = elementwise(&body).unwrap_or_else(|e| panic!("{e}"));
    common::spirv_val(&kernel.spirv, &body.name);
    let host: Vec<Vec<f32>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| common::inputs_in((-3.0, 3.0), s.iter().product(), 40 + i as u64))
        .collect();
    let buffers: Vec<_> = host.iter().map(|v| common::upload(device, v)).collect();
    let tensors = shapes
        .iter()
        .zip(&host)
        .map(|(s, v)| Tensor::f32s(s, v.clone()))
        .collect();
    let want = rafter_reference::run(&body, tensors).unwrap().remove(0);
    let out_dims = want.shape().to_vec();
    let want = want.to_f64_vec();
    let count = want.len();
    let binding_dims: Vec<&[usize]> = shapes
        .iter()
        .copied()
        .chain([out_dims.as_slice()])
        .collect();
    let out = common::run_shaped(device, &kernel, &buffers, count as u64, &binding_dims);
    let got = common::f32s(&out[0].read_bytes(0, count as u64 * 4).unwrap());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = *g as f64;
        let close = g == *w || (g - w).abs() <= atol + rtol * w.abs() || (g.is_nan() && w.is_nan());
        assert!(close, "{}: element {i}: got {g}, want {w}", body.name);
    }
    kernel.inputs
}

/// Broadcast operands (a row, a column, a leading-dims-missing vector) read the element
/// NumPy broadcasting gives each output element; checked against the reference executor.
#[test]
fn broadcast_operands_match_the_reference() {
    let Some(device) = common::device_or_skip("broadcast_operands_match_the_reference") else {
        return;
    };
    let kinds = check_against_reference(
        &device,
        "graph @bcast(%x: f32[5, 3, 70], %b: f32[70], %c: f32[5, 1, 1], %d: f32[3, 1]) -> (%y) {\n  %a: f32[5, 3, 70] = binary{op = add}(%x, %b)\n  %e: f32[5, 3, 1] = binary{op = mul}(%c, %d)\n  %y: f32[5, 3, 70] = binary{op = sub}(%a, %e)\n}",
        &[&[5, 3, 70], &[70], &[5, 1, 1], &[3, 1]],
    );
    assert_eq!(kinds[1..], [Operand::Broadcast; 3]);
}

/// Transposes read their input through permuted strides; reshape-like ops keep linear
/// order (their shape operands are bound but never read); expand is a broadcast.
#[test]
fn transpose_reshape_and_expand_match_the_reference() {
    let Some(device) = common::device_or_skip("transpose_reshape_and_expand") else {
        return;
    };
    let kinds = check_against_reference(
        &device,
        "graph @tr(%x: f32[2, 3, 40]) -> (%y) {\n  %y: f32[40, 2, 3] = transpose{perm = [2, 0, 1]}(%x)\n}",
        &[&[2, 3, 40]],
    );
    assert_eq!(kinds, [Operand::Broadcast]);
    check_against_reference(
        &device,
        "graph @tr_add(%x: f32[7, 9], %z: f32[9, 7]) -> (%y) {\n  %t: f32[9, 7] = transpose{perm = [1, 0]}(%x)\n  %y: f32[9, 7] = binary{op = add}(%t, %z)\n}",
        &[&[7, 9], &[9, 7]],
    );
    check_against_reference(
        &device,
        "graph @rs(%x: f32[6, 35]) -> (%y) {\n  const %s: i64[3] = dense [5, 6, 7]\n  %r: f32[5, 6, 7] = reshape{allow_zero = false}(%x, %s)\n  %y: f32[5, 6, 7] = unary{op = neg}(%r)\n}",
        &[&[6, 35]],
    );
    check_against_reference(
        &device,
        "graph @ex(%x: f32[3, 1]) -> (%y) {\n  const %s: i64[3] = dense [2, 3, 50]\n  %y: f32[2, 3, 50] = expand(%x, %s)\n}",
        &[&[3, 1]],
    );
}

/// A `reduce` alone: one invocation per output element loops over its lane. Every kind
/// but log_sum_exp, axes as attribute or constant operand, kept or dropped dims, an empty
/// lane (each kind's identity).
#[test]
fn reductions_match_the_reference() {
    let Some(device) = common::device_or_skip("reductions_match_the_reference") else {
        return;
    };
    for (kind, tol) in [
        ("sum", 1e-5),
        ("mean", 1e-5),
        ("prod", 1e-4),
        ("l1", 1e-5),
        ("l2", 1e-5),
        ("sum_square", 1e-5),
        ("max", 0.0),
        ("min", 0.0),
    ] {
        check_within(
            &device,
            &format!("graph @r_{kind}(%x: f32[4, 6, 5]) -> (%y) {{\n  %y: f32[4, 1, 5] = reduce{{kind = {kind}, axes = [1], keep_dims = true, noop_with_empty_axes = false}}(%x)\n}}"),
            &[&[4, 6, 5]],
            tol,
        );
        check_within(
            &device,
            &format!("graph @r_{kind}_02(%x: f32[4, 6, 5]) -> (%y) {{\n  const %a: i64[2] = dense [0, -1]\n  %y: f32[6] = reduce{{kind = {kind}, axes = [], keep_dims = false, noop_with_empty_axes = false}}(%x, %a)\n}}"),
            &[&[4, 6, 5]],
            tol,
        );
    }
    check_within(
        &device,
        "graph @r_all(%x: f32[3, 70]) -> (%y) {\n  %y: f32[] = reduce{kind = log_sum, axes = [], keep_dims = false, noop_with_empty_axes = false}(%x)\n}",
        &[&[3, 70]],
        1e-5,
    );
    check_within(
        &device,
        "graph @r_empty(%x: f32[2, 0, 3]) -> (%y) {\n  %y: f32[2, 1, 3] = reduce{kind = max, axes = [1], keep_dims = true, noop_with_empty_axes = false}(%x)\n}",
        &[&[2, 0, 3]],
        0.0,
    );
}

/// Softmax, log-softmax, hardmax and lp_norm alone: one invocation per lane, on the last,
/// a middle and the first axis (a workgroup per lane on the last).
#[test]
fn softmax_matches_the_reference() {
    let Some(device) = common::device_or_skip("softmax_matches_the_reference") else {
        return;
    };
    for kind in ["softmax", "log_softmax", "hardmax"] {
        // log_softmax's `x - max - log(sum)` cancels to values near 0 from terms near 1, so
        // a few ulps of those terms (the driver's exp and log are not correctly rounded:
        // NVIDIA's were 1.5e-7 off at -0.0119) need an absolute tolerance.
        let atol = if kind == "log_softmax" { 1e-6 } else { 0.0 };
        for axis in [2, 1, 0, -1] {
            check_close(
                &device,
                &format!("graph @{kind}_{}(%x: f32[3, 70, 5]) -> (%y) {{\n  %y: f32[3, 70, 5] = softmax{{kind = {kind}, axis = {axis}}}(%x)\n}}", axis + 1),
                &[&[3, 70, 5]],
                1e-5,
                atol,
            );
        }
    }
    // lp_norm takes the same row kernels (a sum of |x| or x², then x / norm).
    for p in [1, 2] {
        for axis in [2, 1, 0, -1] {
            check_close(
                &device,
                &format!("graph @lp{p}_{}(%x: f32[3, 70, 5]) -> (%y) {{\n  %y: f32[3, 70, 5] = lp_norm{{axis = {axis}, p = {p}}}(%x)\n}}", axis + 1),
                &[&[3, 70, 5]],
                1e-5,
                0.0,
            );
        }
    }
}

/// A reduce with a pointwise prologue (what fusion makes of `ReduceSumSquare`-like
/// patterns and norms): the prologue is evaluated at each lane element, with a scalar
/// input and a constant.
#[test]
fn a_reduce_with_a_prologue_matches_the_reference() {
    let Some(device) = common::device_or_skip("a_reduce_with_a_prologue") else {
        return;
    };
    check_within(
        &device,
        "graph @sq(%x: f32[6, 40], %m: f32[6, 40], %s: f32[]) -> (%y) {\n  const %h: f32[] = dense [0.5]\n  %d: f32[6, 40] = binary{op = sub}(%x, %m)\n  %e: f32[6, 40] = binary{op = mul}(%d, %d)\n  %f: f32[6, 40] = binary{op = mul}(%e, %s)\n  %g: f32[6, 40] = binary{op = add}(%f, %h)\n  %y: f32[6, 1] = reduce{kind = mean, axes = [1], keep_dims = true, noop_with_empty_axes = false}(%g)\n}",
        &[&[6, 40], &[6, 40], &[]],
        1e-5,
    );
}

/// Data movement over symbolic dims: BERT's head split and merge (`[b, s, h, d]` to
/// `[b, h, s, d]`, `[b, h, d, s]` and back) and a mask broadcast over heads, with the
/// sizes pushed as dim params.
#[test]
fn transposes_and_broadcasts_over_symbolic_dims_match_the_reference() {
    let Some(device) = common::device_or_skip("symbolic transposes") else {
        return;
    };
    for (perm, out) in [
        ("0, 2, 1, 3", "b, 4, s, 8"),
        ("0, 2, 3, 1", "b, 4, 8, s"),
        ("2, 0, 3, 1", "4, b, 8, s"),
    ] {
        let kinds = check_against_reference(
            &device,
            &format!("graph @tr(%x: f32[b, s, 4, 8]) -> (%y) {{\n  %y: f32[{out}] = transpose{{perm = [{perm}]}}(%x)\n}}"),
            &[&[3, 5, 4, 8]],
        );
        assert_eq!(kinds, [Operand::Broadcast]);
    }
    let text = "graph @mask(%x: f32[b, 4, s, s], %m: f32[b, 1, 1, s], %c: f32[s, 1]) -> (%y) {\n  %t: f32[b, 4, s, s] = binary{op = add}(%x, %m)\n  %y: f32[b, 4, s, s] = binary{op = mul}(%t, %c)\n}";
    let kinds = check_against_reference(&device, text, &[&[2, 4, 7, 7], &[2, 1, 1, 7], &[7, 1]]);
    assert_eq!(
        kinds,
        [Operand::Tensor, Operand::Broadcast, Operand::Broadcast]
    );
    let kernel = elementwise(&parse_graph(text).unwrap()).unwrap();
    // b and s, each once, from the first binding that has them.
    assert_eq!(kernel.dims.len(), 2, "{:?}", kernel.dims);
    // A dim that is neither the output's nor 1 is not a broadcast.
    let e = elementwise(
        &parse_graph("graph @bad(%x: f32[b, s], %m: f32[t, s]) -> (%y) {\n  %y: f32[b, s] = binary{op = add}(%x, %m)\n}")
            .unwrap(),
    )
    .unwrap_err();
    assert!(e.reason.contains("does not broadcast"), "{e}");
}

/// Softmax over symbolic dims: the lane length and inner stride come from dim params.
#[test]
fn softmax_over_symbolic_dims_matches_the_reference() {
    let Some(device) = common::device_or_skip("symbolic softmax") else {
        return;
    };
    for kind in ["softmax", "log_softmax"] {
        for axis in [-1, 1, 2] {
            check_within(
                &device,
                &format!("graph @{kind}_s{}(%x: f32[b, 4, s, s]) -> (%y) {{\n  %y: f32[b, 4, s, s] = softmax{{kind = {kind}, axis = {axis}}}(%x)\n}}", axis + 1),
                &[&[2, 4, 9, 9]],
                1e-5,
            );
        }
    }
}

/// A softmax over the last axis runs a workgroup per lane, reduced through workgroup
/// memory: lanes shorter and longer than the workgroup, symbolic.
#[test]
fn softmax_rows_longer_than_a_workgroup_match_the_reference() {
    let Some(device) = common::device_or_skip("softmax rows") else {
        return;
    };
    for (kind, n) in [("softmax", 333), ("log_softmax", 1000), ("softmax", 3)] {
        check_within(
            &device,
            &format!("graph @{kind}_{n}(%x: f32[r, {n}]) -> (%y) {{\n  %y: f32[r, {n}] = softmax{{kind = {kind}, axis = 1}}(%x)\n}}"),
            &[&[5, n]],
            1e-5,
        );
    }
}

/// Layer norm over the last axis (or two), with scale and bias (or without a bias), after
/// a residual add: one invocation per row, three passes; symbolic row counts and lengths.
#[test]
fn layer_norm_matches_the_reference() {
    let Some(device) = common::device_or_skip("layer_norm") else {
        return;
    };
    let kinds = check_within(
        &device,
        "graph @ln(%x: f32[b, s, 40], %g: f32[40], %bb: f32[40]) -> (%y) {\n  %y: f32[b, s, 40] = layer_norm{axis = -1, epsilon = 1e-5}(%x, %g, %bb)\n}",
        &[&[2, 3, 40], &[40], &[40]],
        1e-5,
    );
    assert_eq!(kinds, [Operand::Tensor, Operand::Lane, Operand::Lane]);
    let kinds = check_within(
        &device,
        "graph @add_ln(%x: f32[b, s, 48], %r: f32[b, s, 48], %g: f32[48], %bb: f32[48]) -> (%y) {\n  %t: f32[b, s, 48] = binary{op = add}(%x, %r)\n  %y: f32[b, s, 48] = layer_norm{axis = 2, epsilon = 1e-12}(%t, %g, %bb)\n}",
        &[&[1, 7, 48], &[1, 7, 48], &[48], &[48]],
        1e-5,
    );
    assert_eq!(
        kinds,
        [
            Operand::Tensor,
            Operand::Tensor,
            Operand::Lane,
            Operand::Lane
        ]
    );
    // BERT's embedding sum: word and token-type embeddings of x's shape, the position
    // embeddings `[1, s, 48]` repeated over the batch (symbolic s), then the norm.
    let kinds = check_close(
        &device,
        "graph @emb_ln(%w: f32[b, s, 48], %t: f32[b, s, 48], %p: f32[1, s, 48], %g: f32[48], %bb: f32[48]) -> (%y) {\n  %a: f32[b, s, 48] = binary{op = add}(%w, %t)\n  %c: f32[b, s, 48] = binary{op = add}(%a, %p)\n  %y: f32[b, s, 48] = layer_norm{axis = -1, epsilon = 1e-12}(%c, %g, %bb)\n}",
        &[&[3, 5, 48], &[3, 5, 48], &[1, 5, 48], &[48], &[48]],
        1e-5,
        1e-6,
    );
    assert_eq!(
        kinds,
        [
            Operand::Tensor,
            Operand::Tensor,
            Operand::Repeated,
            Operand::Lane,
            Operand::Lane
        ]
    );
    // A [s, 48] operand with one fewer dim repeats too; [b, 1, 48] does not (it is
    // broadcast inside the rows, not repeated whole), and says why.
    check_close(
        &device,
        "graph @emb_ln2(%w: f32[b, s, 48], %p: f32[s, 48], %g: f32[48]) -> (%y) {\n  %c: f32[b, s, 48] = binary{op = add}(%w, %p)\n  %y: f32[b, s, 48] = layer_norm{axis = -1, epsilon = 1e-5}(%c, %g)\n}",
        &[&[2, 4, 48], &[4, 48], &[48]],
        1e-5,
        1e-6,
    );
    let e = elementwise(
        &parse_graph("graph @bad(%w: f32[b, s, 48], %p: f32[b, 1, 48], %g: f32[48]) -> (%y) {\n  %c: f32[b, s, 48] = binary{op = add}(%w, %p)\n  %y: f32[b, s, 48] = layer_norm{axis = -1, epsilon = 1e-5}(%c, %g)\n}")
            .unwrap(),
    )
    .unwrap_err();
    assert!(e.reason.contains("repeated over its leading ones"), "{e}");
    // Over two axes, a symbolic row length, no bias, the scale of shape [1, s, 6].
    check_within(
        &device,
        "graph @ln2(%x: f32[3, s, 6], %g: f32[1, s, 6]) -> (%y) {\n  %y: f32[3, s, 6] = layer_norm{axis = 1, epsilon = 1e-3}(%x, %g)\n}",
        &[&[3, 5, 6], &[1, 5, 6]],
        1e-5,
    );
    // Rows longer than a row kernel's workgroup (each invocation sums several elements),
    // more rows than one workgroup.
    let kinds = check_close(
        &device,
        "graph @ln_long(%x: f32[b, s, 300], %g: f32[300], %bb: f32[300]) -> (%y) {\n  %y: f32[b, s, 300] = layer_norm{axis = -1, epsilon = 1e-5}(%x, %g, %bb)\n}",
        &[&[2, 9, 300], &[300], &[300]],
        1e-5,
        1e-6,
    );
    assert_eq!(kinds, [Operand::Tensor, Operand::Lane, Operand::Lane]);
    let kernel = elementwise(
        &parse_graph("graph @ln_long(%x: f32[b, s, 300], %g: f32[300]) -> (%y) {\n  %y: f32[b, s, 300] = layer_norm{axis = -1, epsilon = 1e-5}(%x, %g)\n}")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        kernel.launch,
        rafter_vulkan_section::Launch::Rows { lane_dims: 1 }
    );
    // The statistics come after the normalised result (tests/layer_norm_stats.rs runs
    // them); another order is refused.
    let e = elementwise(
        &parse_graph("graph @ln3(%x: f32[4, 8], %g: f32[4, 8]) -> (%m, %y) {\n  %y: f32[4, 8], %m: f32[4, 1] = layer_norm{axis = -1, epsilon = 1e-5}(%x, %g)\n}")
            .unwrap(),
    )
    .unwrap_err();
    assert!(e.reason.contains("in that order"), "{e}");
}

/// RMS norm (no mean subtracted, no bias): alone, after a residual add (an LLM block's
/// `x + attn` then norm), over rows longer than a workgroup, with a symbolic row count.
#[test]
fn rms_norm_matches_the_reference() {
    let Some(device) = common::device_or_skip("rms_norm") else {
        return;
    };
    let kinds = check_close(
        &device,
        "graph @rms(%x: f32[b, s, 40], %g: f32[40]) -> (%y) {\n  %y: f32[b, s, 40] = rms_norm{axis = -1, epsilon = 1e-5}(%x, %g)\n}",
        &[&[2, 3, 40], &[40]],
        1e-5,
        1e-6,
    );
    assert_eq!(kinds, [Operand::Tensor, Operand::Lane]);
    check_close(
        &device,
        "graph @add_rms(%x: f32[b, s, 300], %r: f32[b, s, 300], %g: f32[300]) -> (%y) {\n  %t: f32[b, s, 300] = binary{op = add}(%x, %r)\n  %y: f32[b, s, 300] = rms_norm{axis = 2, epsilon = 1e-6}(%t, %g)\n}",
        &[&[2, 9, 300], &[2, 9, 300], &[300]],
        1e-5,
        1e-6,
    );
    // Over two axes, the scale of shape [s, 6].
    check_close(
        &device,
        "graph @rms2(%x: f32[3, s, 6], %g: f32[s, 6]) -> (%y) {\n  %y: f32[3, s, 6] = rms_norm{axis = 1, epsilon = 1e-3}(%x, %g)\n}",
        &[&[3, 5, 6], &[5, 6]],
        1e-5,
        1e-6,
    );
}

/// ONNX's `Div` is IEEE division: every quotient equals Rust's `a / b` bit for bit,
/// including quotients that land exactly on a .5 tie (which a quantization then rounds:
/// NVIDIA's 2.5-ulp `OpFDiv` put 25.5 just below the tie), and the special values the
/// correction step must leave alone (division by zero, infinities, NaN, signed zeros,
/// subnormal and huge quotients).
#[test]
fn division_is_correctly_rounded() {
    let Some(device) = common::device_or_skip("division_is_correctly_rounded") else {
        return;
    };
    let scale = 0.011_764_706_f32; // (3 - 0) / 255, as DynamicQuantizeLinear computes it
    let mut a: Vec<f32> = (0..200).map(|i| i as f32 * scale * 0.5).collect();
    let mut b: Vec<f32> = vec![scale; 200];
    let specials: [(f32, f32); 16] = [
        (1.0, 0.0),
        (-1.0, 0.0),
        (0.0, 0.0),
        (-0.0, 3.0),
        (0.0, -3.0),
        (f32::INFINITY, 2.0),
        (2.0, f32::INFINITY),
        (f32::INFINITY, f32::INFINITY),
        (f32::NAN, 1.0),
        (1.0, f32::NAN),
        (1e-38, 3.0),
        (f32::MAX, 0.5),
        (3.0e38, 1e-3),
        (1.0, 3.0),
        (2.0, 3.0),
        (-7.0, 3.0),
    ];
    for (x, y) in specials {
        a.push(x);
        b.push(y);
    }
    for i in 1..=64 {
        // Quotients of odd numerators by primes: rounding in every direction.
        a.push((2 * i + 1) as f32 * 1.000_123);
        b.push([3.0f32, 7.0, 11.0, 13.0][i % 4] * 0.999_87);
    }
    // Random pairs over many magnitudes (a fixed linear congruential sequence).
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let mantissa = 1.0 + (state >> 40) as f32 / (1u64 << 24) as f32;
        let exponent = ((state >> 32) & 31) as i32 - 16;
        mantissa * 2f32.powi(exponent)
    };
    for _ in 0..4000 {
        a.push(next());
        b.push(next());
    }
    let n = a.len();
    let body = parse_graph(&format!(
        "graph @div(%a: f32[{n}], %b: f32[{n}]) -> (%y) {{\n  %y: f32[{n}] = binary{{op = div}}(%a, %b)\n}}"
    ))
    .unwrap();
    let kernel = elementwise(&body).unwrap_or_else(|e| panic!("{e}"));
    common::spirv_val(&kernel.spirv, "division");
    let buffers = [common::upload(&device, &a), common::upload(&device, &b)];
    let dims: [&[usize]; 3] = [&[n], &[n], &[n]];
    let out = common::run_shaped(&device, &kernel, &buffers, n as u64, &dims);
    let got = common::f32s(&out[0].read_bytes(0, n as u64 * 4).unwrap());
    for i in 0..n {
        let want = a[i] / b[i];
        let same = got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan());
        assert!(
            same,
            "{} / {}: got {:e} want {:e}",
            a[i], b[i], got[i], want
        );
    }
}

/// `exp` stays within a few f32 ulps of the exact value over its whole finite range, also
/// for large-magnitude arguments where Vulkan lets a plain `Exp` be `3 + 2|x|` ulps off (a
/// softmax's `x - max` of -20 may be 43 ulps off on NVIDIA; the kernel range-reduces), and
/// gives 0 and infinity where f32 `exp` rounds to them, NaN for NaN.
#[test]
fn exp_is_accurate_over_its_range() {
    let Some(device) = common::device_or_skip("exp_is_accurate_over_its_range") else {
        return;
    };
    let mut x: Vec<f32> = (0..=4000)
        .map(|i| -87.0 + 175.0 * i as f32 / 4000.0)
        .collect();
    x.extend([
        0.0,
        -0.0,
        1e-30,
        88.722_83,
        88.722_84,
        89.0,
        -104.5,
        -1000.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let n = x.len();
    let body = parse_graph(&format!(
        "graph @k(%x: f32[{n}]) -> (%y) {{\n  %y: f32[{n}] = unary{{op = exp}}(%x)\n}}"
    ))
    .unwrap();
    let kernel = elementwise(&body).unwrap();
    common::spirv_val(&kernel.spirv, "exp");
    let buffers = [common::upload(&device, &x)];
    let dims: [&[usize]; 2] = [&[n], &[n]];
    let out = common::run_shaped(&device, &kernel, &buffers, n as u64, &dims);
    let got = common::f32s(&out[0].read_bytes(0, n as u64 * 4).unwrap());
    let mut worst = 0f64;
    for (&x, &got) in x.iter().zip(&got) {
        let exact = f64::from(x).exp();
        let want = exact as f32;
        if x.is_nan() {
            assert!(got.is_nan(), "exp(NaN) = {got}");
        } else if want == 0.0 || want.is_infinite() {
            assert_eq!(got, want, "exp({x:e})");
        } else if want.is_normal() {
            let ulp = 2f64.powi(want.abs().log2().floor() as i32 - 23);
            let err = (f64::from(got) - exact).abs() / ulp;
            worst = worst.max(err);
            assert!(
                err <= 6.0,
                "exp({x:e}) = {got:e}, want {want:e}: {err:.1} ulps"
            );
        }
    }
    eprintln!("exp: worst error {worst:.2} ulps");
}

/// A reshape to dims read at run time (ONNX Reshape with a `shape` input): the result's
/// dims are symbols the call's values bind, and the kernel counts its elements through the
/// reshape as its static operand's (a view keeps the count), then a pointwise op on it.
#[test]
fn a_reshape_to_run_time_dims_matches_the_reference() {
    let Some(device) = common::device_or_skip("a_reshape_to_run_time_dims") else {
        return;
    };
    let text = "graph @rs(%x: f32[2, 3, 4], %s: i64[2]) -> (%y) {\n  %r: f32[_r0, _r1] = reshape{allow_zero = false}(%x, %s)\n  %y: f32[_r0, _r1] = unary{op = neg}(%r)\n}";
    let body = parse_graph(text).unwrap();
    let module = rafter_codegen_spirv::kernel_module(&body, 0).unwrap_or_else(|e| panic!("{e}"));
    let x: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    for shape in [[4i64, 6], [-1, 2], [24, 1]] {
        let bytes: Vec<u8> = shape.iter().flat_map(|v| v.to_le_bytes()).collect();
        let inputs = vec![
            Tensor::f32s(&[2, 3, 4], x.clone()),
            Tensor::from_le_bytes(rafter_ir::DType::I64, &[2], &bytes).unwrap(),
        ];
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap()
            .remove(0);
        let dims = want.shape().to_vec();
        let got = common::run_module(&device, &module, &inputs, (rafter_ir::DType::F32, &dims));
        assert_eq!(got.shape(), want.shape());
        assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "shape {shape:?}");
    }
}
