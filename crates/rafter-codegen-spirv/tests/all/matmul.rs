//! The generated matrix product runs on the Vulkan device (lavapipe in CI) and matches a
//! CPU product computed in f64.

use crate::common;

use std::sync::Arc;

use rafter_codegen_spirv::{matmul, matmul_tiled, to_bytes, MatmulKernel, MatmulTile};
use rafter_hal::{Buffer, Device, ExecutablePayload, ExecutableSpec, MemoryKind, FORMAT_SPIRV};
use rafter_hal_vulkan::VulkanDevice;
use rafter_ir::text::parse_graph;

fn body(a: &str, b: &str, c: &str) -> rafter_ir::Graph {
    parse_graph(&format!(
        "graph @mm(%a: f32[{a}], %b: f32[{b}]) -> (%c) {{\n  %c: f32[{c}] = matmul(%a, %b)\n}}"
    ))
    .unwrap()
}

/// Runs `kernel` on `inputs` (in binding order; A and B where the kernel says) and returns
/// C's `c_len` elements.
fn run(
    device: &VulkanDevice,
    kernel: &MatmulKernel,
    inputs: &[&[f32]],
    a_dims: &[usize],
    b_dims: &[usize],
    c_len: usize,
) -> Vec<f32> {
    let max = device.info().limits.max_workgroup_count;
    let launch = kernel.launch().unwrap();
    let dispatch = launch.matmul_dispatch(a_dims, b_dims, max).unwrap();
    let upload = |v: &[f32]| common::upload(device, if v.is_empty() { &[0.0] } else { v });
    let mut buffers: Vec<Buffer> = inputs.iter().map(|v| upload(v)).collect();
    let bytes = c_len.max(1) as u64 * 4;
    let cb = device
        .allocate(bytes, MemoryKind::HostVisibleShared)
        .unwrap();
    cb.write_bytes(0, &vec![0xFF; bytes as usize]).unwrap();
    buffers.push(cb.clone());
    let exe = device
        .load_executable(&ExecutableSpec {
            name: "matmul".into(),
            format: FORMAT_SPIRV.into(),
            payload: ExecutablePayload::Bytes(Arc::from(to_bytes(&kernel.spirv))),
        })
        .unwrap();
    let mut builder = device.create_command_buffer().unwrap();
    // `None`: C is empty, nothing to dispatch.
    if let Some((params, grid)) = dispatch {
        let bindings: Vec<_> = buffers.iter().map(Buffer::whole).collect();
        builder.dispatch(&exe, 0, &bindings, &params, grid).unwrap();
    }
    common::submit_and_wait(device, builder);
    common::f32s(&cb.read_bytes(0, c_len as u64 * 4).unwrap())
}

/// Runs the kernel for `a_dims` × `b_dims` on random data; checks every element against an
/// f64 product (tolerance: a few ulps of the sum of absolute products).
fn check(device: &VulkanDevice, kernel: &MatmulKernel, a_dims: &[usize], b_dims: &[usize]) {
    let (ra, rb) = (a_dims.len(), b_dims.len());
    let (m, k, n) = (a_dims[ra - 2], a_dims[ra - 1], b_dims[rb - 1]);
    let batch: usize = a_dims[..ra - 2].iter().product();
    let a = common::inputs_in((-1.0, 1.0), batch * m * k, 11);
    let b_len = if kernel.b_shared {
        k * n
    } else {
        batch * k * n
    };
    let b = common::inputs_in((-1.0, 1.0), b_len, 12);
    let got = run(device, kernel, &[&a, &b], a_dims, b_dims, batch * m * n);
    for z in 0..batch {
        let bz = if kernel.b_shared { 0 } else { z };
        for i in 0..m {
            for j in 0..n {
                let (mut want, mut mag) = (0f64, 0f64);
                for p in 0..k {
                    let x = a[(z * m + i) * k + p] as f64 * b[(bz * k + p) * n + j] as f64;
                    want += x;
                    mag += x.abs();
                }
                let g = got[(z * m + i) * n + j] as f64;
                assert!(
                    (g - want).abs() <= 4.0 * f32::EPSILON as f64 * mag + 1e-30,
                    "{a_dims:?} x {b_dims:?}: C[{z}][{i}][{j}] = {g}, want {want}"
                );
            }
        }
    }
}

#[test]
fn matmul_modules_pass_spirv_val() {
    let k = matmul(&body("m, k", "k, n", "m, n")).unwrap();
    common::spirv_val(&k.spirv, "matmul_shared_b");
    let k = matmul(&body("b, m, k", "b, k, n", "b, m, n")).unwrap();
    common::spirv_val(&k.spirv, "matmul_batched_b");
}

#[test]
fn products_match_the_cpu_at_edge_sizes() {
    let Some(device) = common::device_or_skip("matmul products") else {
        return;
    };
    let shared = matmul(&body("b, m, k", "k, n", "b, m, n")).unwrap();
    assert!(shared.b_shared);
    // Tiles partly outside (65, 17), one row, K not a multiple of the 16-step, K = 1.
    for (a, b) in [
        (vec![1, 65, 17], vec![17, 70]),
        (vec![2, 1, 33], vec![33, 1]),
        (vec![1, 128, 64], vec![64, 128]),
        (vec![3, 7, 1], vec![1, 9]),
    ] {
        check(&device, &shared, &a, &b);
    }
    let small = matmul_tiled(&body("b, m, k", "k, n", "b, m, n"), MatmulTile::Small).unwrap();
    common::spirv_val(&small.spirv, "matmul_small_tile");
    for (a, b) in [
        (vec![1, 33, 17], vec![17, 70]),
        (vec![2, 128, 48], vec![48, 96]),
    ] {
        check(&device, &small, &a, &b);
    }
    // K split over four slices of the workgroup: K below one slice's step, not a multiple
    // of the 4 × 16 round, and long; edge tiles in M and N.
    let sliced = matmul_tiled(&body("b, m, k", "k, n", "b, m, n"), MatmulTile::Sliced).unwrap();
    common::spirv_val(&sliced.spirv, "matmul_sliced_tile");
    for (a, b) in [
        (vec![1, 33, 9], vec![9, 70]),
        (vec![2, 40, 100], vec![100, 48]),
        (vec![1, 128, 768], vec![768, 96]),
    ] {
        check(&device, &sliced, &a, &b);
    }
    let tiny = matmul_tiled(&body("b, m, k", "k, n", "b, m, n"), MatmulTile::Tiny).unwrap();
    common::spirv_val(&tiny.spirv, "matmul_tiny_tile");
    for (a, b) in [
        (vec![1, 17, 40], vec![40, 49]),
        (vec![2, 64, 33], vec![33, 16]),
    ] {
        check(&device, &tiny, &a, &b);
    }
    let batched = matmul(&body("h, m, k", "h, k, n", "h, m, n")).unwrap();
    assert!(!batched.b_shared);
    check(&device, &batched, &[12, 20, 64], &[12, 64, 20]);
    check(&device, &batched, &[2, 64, 0], &[2, 0, 5]);
}

#[test]
fn unsupported_bodies_and_shapes_are_errors() {
    let e = matmul(&body("b, m, k", "c, k, n", "b, m, n")).unwrap_err();
    assert!(e.reason.contains("broadcasting"), "{e}");
    let g =
        parse_graph("graph @x(%a: f32[2, 2]) -> (%y) {\n  %y: f32[2, 2] = unary{op = relu}(%a)\n}")
            .unwrap();
    assert!(matmul(&g).unwrap_err().reason.contains("not matmul"));
    let launch = matmul(&body("m, k", "k, n", "m, n"))
        .unwrap()
        .launch()
        .unwrap();
    let max = [65535; 3];
    let e = launch.matmul_dispatch(&[2, 3], &[4, 5], max).unwrap_err();
    assert!(e.contains("inner dims"), "{e}");
    let e = launch
        .matmul_dispatch(&[2, 2, 3], &[2, 3, 5], max)
        .unwrap_err();
    assert!(e.contains("2-D B"), "{e}");
}

#[test]
fn fused_epilogue_matches_the_cpu() {
    // relu(0.5 * (A·W + bias) + residual), the bias a row over C's columns and the scale a
    // constant; bindings in body order: a, w, bias, res, then C.
    let g = parse_graph(
        "graph @mm(%a: f32[b, m, 40], %w: f32[40, 24], %bias: f32[24], %res: f32[b, m, 24]) -> (%y) {
  %p: f32[b, m, 24] = matmul(%a, %w)
  %q: f32[b, m, 24] = binary{op = add}(%p, %bias)
  const %half: f32[] = dense [0.5]
  %s: f32[b, m, 24] = binary{op = mul}(%half, %q)
  %t: f32[b, m, 24] = binary{op = add}(%s, %res)
  %y: f32[b, m, 24] = unary{op = relu}(%t)
}",
    )
    .unwrap();
    let kernel = matmul(&g).unwrap();
    common::spirv_val(&kernel.spirv, "matmul_epilogue");
    assert_eq!((kernel.a_input, kernel.b_input, kernel.bindings), (0, 1, 5));
    let Some(device) = common::device_or_skip("matmul epilogue") else {
        return;
    };
    let (batch, m, k, n) = (2, 70, 40, 24);
    let a = common::inputs_in((-1.0, 1.0), batch * m * k, 1);
    let w = common::inputs_in((-1.0, 1.0), k * n, 2);
    let bias = common::inputs_in((-1.0, 1.0), n, 3);
    let res = common::inputs_in((-1.0, 1.0), batch * m * n, 4);
    let got = run(
        &device,
        &kernel,
        &[&a, &w, &bias, &res],
        &[batch, m, k],
        &[k, n],
        batch * m * n,
    );
    for z in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let (mut p, mut mag) = (0f64, 0f64);
                for q in 0..k {
                    let x = a[(z * m + i) * k + q] as f64 * w[q * n + j] as f64;
                    p += x;
                    mag += x.abs();
                }
                let at = (z * m + i) * n + j;
                let want = (0.5 * (p + bias[j] as f64) + res[at] as f64).max(0.0);
                let tol =
                    4.0 * f32::EPSILON as f64 * (mag + bias[j].abs() as f64 + res[at].abs() as f64);
                assert!(
                    (got[at] as f64 - want).abs() <= tol,
                    "C[{z}][{i}][{j}] = {}, want {want}",
                    got[at]
                );
            }
        }
    }
}

#[test]
fn epilogues_outside_the_supported_forms_are_errors() {
    let text = |op: &str, other: &str| {
        format!(
            "graph @mm(%a: f32[4, 8], %w: f32[8, 6], %o: f32[{other}]) -> (%y) {{
  %p: f32[4, 6] = matmul(%a, %w)
  %y: f32[4, 6] = {op}(%p, %o)
}}"
        )
    };
    // A column vector broadcasts (a convolution's per-channel bias is one); a [1, 3] operand
    // is neither a scalar, a row or column of C, nor broadcast to C.
    matmul(&parse_graph(&text("binary{op = add}", "4, 1")).unwrap()).unwrap();
    let e = matmul(&parse_graph(&text("binary{op = add}", "1, 3")).unwrap()).unwrap_err();
    assert!(e.reason.contains("neither a scalar"), "{e}");
    let e = matmul(&parse_graph(&text("binary{op = pow}", "4, 6")).unwrap()).unwrap_err();
    assert!(e.reason.contains("not generated after a matmul"), "{e}");
}

/// BERT's attention scores: `Q·Kᵀ` batched over `[b, h]`, scaled, plus a mask broadcast
/// over the heads (`[b, 1, 1, s]` or `[b, 1, s, s]`), with symbolic `b` and `s`.
#[test]
fn attention_scores_with_a_mask_broadcast_over_heads_match_the_cpu() {
    let Some(device) = common::device_or_skip("attention scores") else {
        return;
    };
    let (batch, heads, s, d) = (2, 3, 37, 16);
    for (mask_text, mask_rows) in [("b, 1, 1, s", 1), ("b, 1, s, s", s)] {
        let g = parse_graph(&format!(
            "graph @scores(%q: f32[b, 3, s, 16], %k: f32[b, 3, 16, s], %m: f32[{mask_text}]) -> (%y) {{
  %p: f32[b, 3, s, s] = matmul(%q, %k)
  const %scale: f32[] = dense [0.25]
  %t: f32[b, 3, s, s] = binary{{op = mul}}(%p, %scale)
  %y: f32[b, 3, s, s] = binary{{op = add}}(%t, %m)
}}"
        ))
        .unwrap();
        let kernel = matmul_tiled(&g, MatmulTile::Small).unwrap_or_else(|e| panic!("{e}"));
        common::spirv_val(&kernel.spirv, "matmul_mask");
        let q = common::inputs_in((-1.0, 1.0), batch * heads * s * d, 5);
        let k = common::inputs_in((-1.0, 1.0), batch * heads * d * s, 6);
        let m = common::inputs_in((-3.0, 3.0), batch * mask_rows * s, 7);
        let got = run(
            &device,
            &kernel,
            &[&q, &k, &m],
            &[batch, heads, s, d],
            &[batch, heads, d, s],
            batch * heads * s * s,
        );
        for z in 0..batch * heads {
            for i in 0..s {
                for j in 0..s {
                    let (mut p, mut mag) = (0f64, 0f64);
                    for c in 0..d {
                        let x = q[(z * s + i) * d + c] as f64 * k[(z * d + c) * s + j] as f64;
                        p += x;
                        mag += x.abs();
                    }
                    let row = if mask_rows == 1 { 0 } else { i };
                    let mv = m[((z / heads) * mask_rows + row) * s + j] as f64;
                    let want = 0.25 * p + mv;
                    let at = (z * s + i) * s + j;
                    assert!(
                        (got[at] as f64 - want).abs()
                            <= 4.0 * f32::EPSILON as f64 * (mag + mv.abs()),
                        "mask {mask_text}: C[{z}][{i}][{j}] = {}, want {want}",
                        got[at]
                    );
                }
            }
        }
    }
}
