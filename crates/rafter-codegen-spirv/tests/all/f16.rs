//! f16 kernels: every kind the generator handles, on f16 buffers (f32 arithmetic), checked
//! with spirv-val and run on the Vulkan device (lavapipe in CI) against the reference
//! executor's f16 results.
//!
//! Tolerance, in units in the last place (ulps) of the output's dtype at each expected
//! element. A kernel rounds every f16 value it computes at the op boundaries, as the
//! reference does, and computes in f32 inside an op, as the reference does too: the two
//! agree bit for bit except where an f32 sum in another order (a matmul's, a layer norm's
//! mean) lands on the other side of a rounding boundary, which costs one ulp. A softmax
//! gets four: the reference follows ONNX's, which rounds the exp terms, their sum and each
//! quotient to f16 step by step, where the kernel keeps them in f32 (as PyTorch does).
//! A wrong index, a missed rounding or an f16 accumulation are off by many ulps.

use crate::common;

use std::sync::Arc;

use half::f16;
use rafter_codegen_spirv::{kernel_module, matmul, matmul_tiled, MatmulTile};
use rafter_hal::{Buffer, Device, ExecutablePayload, ExecutableSpec, MemoryKind, FORMAT_SPIRV};
use rafter_hal_vulkan::{spirv_capabilities, VulkanDevice};
use rafter_ir::text::parse_graph;
use rafter_ir::{DType, Graph};
use rafter_reference::Tensor;
use rafter_vulkan_section::VulkanModule;

/// SPIR-V's `StorageBuffer16BitAccess` and `Float16` capabilities.
const STORAGE_BUFFER_16BIT: u32 = 4433;
const FLOAT16: u32 = 9;

/// One kernel body per kind the generator covers, all on f16 (or mixing f16 and f32
/// through casts), static shapes, sizes that leave partial tiles and workgroups.
fn cases() -> Vec<(&'static str, String)> {
    let conv = |k: usize, s: usize, p: usize, group: usize| {
        format!(
            "conv{{kernel_shape = [{k}, {k}], strides = [{s}, {s}], pads = [{p}, {p}, {p}, {p}], \
             dilations = [1, 1], group = {group}, auto_pad = explicit}}"
        )
    };
    vec![
        (
            "elementwise_broadcast_chain",
            "graph @k(%x: f16[4, 3, 8], %b: f16[8], %s: f16[]) -> (%y) {
  %a: f16[4, 3, 8] = binary{op = add}(%x, %b)
  %c: f16[4, 3, 8] = binary{op = mul}(%a, %s)
  %y: f16[4, 3, 8] = unary{op = tanh}(%c)
}"
            .into(),
        ),
        (
            "transpose_add",
            "graph @k(%x: f16[5, 3], %z: f16[3, 5]) -> (%y) {
  %t: f16[3, 5] = transpose{perm = [1, 0]}(%x)
  %y: f16[3, 5] = binary{op = add}(%t, %z)
}"
            .into(),
        ),
        (
            "cast_f16_to_f32",
            "graph @k(%x: f16[37]) -> (%y) {
  %a: f32[37] = cast{to = f32}(%x)
  %y: f32[37] = unary{op = exp}(%a)
}"
            .into(),
        ),
        (
            "cast_f32_to_f16_and_const",
            "graph @k(%x: f32[37]) -> (%y) {
  const %h: f16[] = dense [0.5]
  %a: f16[37] = cast{to = f16}(%x)
  %y: f16[37] = binary{op = mul}(%a, %h)
}"
            .into(),
        ),
        (
            "reduce_mean",
            "graph @k(%x: f16[4, 33]) -> (%y) {
  %y: f16[4] = reduce{kind = mean, axes = [1], keep_dims = false, noop_with_empty_axes = false}(%x)
}"
            .into(),
        ),
        (
            "softmax_last_axis",
            "graph @k(%x: f16[6, 200]) -> (%y) {
  %y: f16[6, 200] = softmax{kind = softmax, axis = -1}(%x)
}"
            .into(),
        ),
        (
            "softmax_inner_axis",
            "graph @k(%x: f16[2, 7, 5]) -> (%y) {
  %y: f16[2, 7, 5] = softmax{kind = softmax, axis = 1}(%x)
}"
            .into(),
        ),
        (
            "residual_layer_norm",
            "graph @k(%x: f16[3, 5, 48], %r: f16[3, 5, 48], %g: f16[48], %b: f16[48]) -> (%y) {
  %h: f16[3, 5, 48] = binary{op = add}(%x, %r)
  %y: f16[3, 5, 48] = layer_norm{axis = -1, epsilon = 1e-5}(%h, %g, %b)
}"
            .into(),
        ),
        (
            "batched_matmul_bias_relu",
            "graph @k(%a: f16[2, 3, 33, 40], %b: f16[2, 3, 40, 45], %c: f16[45]) -> (%y) {
  %p: f16[2, 3, 33, 45] = matmul(%a, %b)
  %q: f16[2, 3, 33, 45] = binary{op = add}(%p, %c)
  %y: f16[2, 3, 33, 45] = unary{op = relu}(%q)
}"
            .into(),
        ),
        (
            "matmul_shared_b_residual_mask",
            "graph @k(%a: f16[2, 70, 80], %b: f16[80, 66], %r: f16[2, 70, 66], %m: f16[2, 1, 66]) -> (%y) {
  %p: f16[2, 70, 66] = matmul(%a, %b)
  %q: f16[2, 70, 66] = binary{op = add}(%p, %r)
  %y: f16[2, 70, 66] = binary{op = add}(%q, %m)
}"
            .into(),
        ),
        (
            // Constants of 64 bytes or less are folded into bodies by the compiler: 32 f16s.
            "matmul_folded_const_bias",
            "graph @k(%a: f16[2, 9, 40], %b: f16[40, 32]) -> (%y) {
  const %c: f16[32] = dense [0.5, -0.25, 1.0, 0.0, -1.5, 2.0, 0.125, -0.75, 0.5, -0.25, 1.0, 0.0, -1.5, 2.0, 0.125, -0.75, 0.5, -0.25, 1.0, 0.0, -1.5, 2.0, 0.125, -0.75, 0.5, -0.25, 1.0, 0.0, -1.5, 2.0, 0.125, -0.75]
  %p: f16[2, 9, 32] = matmul(%a, %b)
  %y: f16[2, 9, 32] = binary{op = add}(%p, %c)
}"
            .into(),
        ),
        (
            "layer_norm_folded_const_scale_bias",
            "graph @k(%x: f16[3, 4, 16]) -> (%y) {
  const %g: f16[16] = dense [0.5, -0.25, 1.0, 0.0, -1.5, 2.0, 0.125, -0.75, 1.5, -1.25, 1.0, 0.25, -0.5, 2.5, 0.375, -1.75]
  const %b: f16[1, 16] = dense [0.25, 0.5, -1.0, 0.0, 1.5, -2.0, 0.125, 0.75, 1.5, -1.25, 1.0, 0.25, -0.5, 2.5, 0.375, -1.75]
  %y: f16[3, 4, 16] = layer_norm{axis = -1, epsilon = 1e-5}(%x, %g, %b)
}"
            .into(),
        ),
        (
            "gemm_trans_b",
            "graph @k(%a: f16[5, 40], %w: f16[70, 40], %c: f16[70]) -> (%y) {
  %y: f16[5, 70] = gemm{alpha = 0.5, beta = 1.0, trans_a = false, trans_b = true}(%a, %w, %c)
}"
            .into(),
        ),
        (
            "conv_bias_residual_relu",
            format!(
                "graph @k(%x: f16[2, 4, 9, 9], %w: f16[6, 4, 3, 3], %b: f16[6], %r: f16[2, 6, 9, 9]) -> (%y) {{
  %c: f16[2, 6, 9, 9] = {}(%x, %w, %b)
  %s: f16[2, 6, 9, 9] = binary{{op = add}}(%c, %r)
  %y: f16[2, 6, 9, 9] = unary{{op = relu}}(%s)
}}",
                conv(3, 1, 1, 1)
            ),
        ),
        (
            "conv_const_bias_relu6",
            format!(
                "graph @k(%x: f16[1, 3, 10, 10], %w: f16[5, 3, 1, 1]) -> (%y) {{
  const %b: f16[5] = dense [0.5, -0.25, 1.0, 0.0, -1.5]
  const %lo: f16[] = dense [0.0]
  const %hi: f16[] = dense [6.0]
  %c: f16[1, 5, 5, 5] = {}(%x, %w, %b)
  %y: f16[1, 5, 5, 5] = clip(%c, %lo, %hi)
}}",
                conv(1, 2, 0, 1)
            ),
        ),
        (
            "depthwise_bias",
            format!(
                "graph @k(%x: f16[2, 4, 8, 8], %w: f16[4, 1, 3, 3], %b: f16[4]) -> (%y) {{
  %y: f16[2, 4, 4, 4] = {}(%x, %w, %b)
}}",
                conv(3, 2, 1, 4)
            ),
        ),
        (
            "max_pool",
            "graph @k(%x: f16[1, 4, 11, 11]) -> (%y) {
  %y: f16[1, 4, 6, 6] = pool{kind = max, kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], dilations = [1, 1], auto_pad = explicit, ceil_mode = false, count_include_pad = false, p = 2, storage_order = 0}(%x)
}"
            .into(),
        ),
        (
            "global_average_pool",
            "graph @k(%x: f16[2, 5, 7, 7]) -> (%y) {
  %y: f16[2, 5, 1, 1] = global_pool{kind = average, p = 2}(%x)
}"
            .into(),
        ),
        (
            "global_max_pool",
            "graph @k(%x: f16[2, 5, 7, 7]) -> (%y) {
  %y: f16[2, 5, 1, 1] = global_pool{kind = max, p = 2}(%x)
}"
            .into(),
        ),
    ]
}

fn words(module: &VulkanModule) -> Vec<u32> {
    words_of(&module.spirv)
}

fn words_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn every_f16_kernel_passes_spirv_val_and_needs_only_16_bit_storage() {
    for (label, text) in cases() {
        let body = parse_graph(&text).unwrap_or_else(|e| panic!("{label}: {e}"));
        let module = kernel_module(&body, 0).unwrap_or_else(|e| panic!("{label}: {e}"));
        let spirv = words(&module);
        common::spirv_val(&spirv, &format!("f16_{label}"));
        // Products (a matmul, gemm or ungrouped conv) also come on cooperative matrices.
        let product = ["matmul", "gemm", "conv_bias", "conv_const"]
            .iter()
            .any(|p| label.starts_with(p) || label.contains("_matmul"));
        assert_eq!(module.coop.is_some(), product, "{label}: variant");
        if let Some(coop) = &module.coop {
            common::spirv_val(&words_of(coop), &format!("f16_{label}_coop"));
        }
        let caps = spirv_capabilities(&spirv).unwrap();
        assert!(caps.contains(&STORAGE_BUFFER_16BIT), "{label}: {caps:?}");
        assert!(
            !caps.contains(&FLOAT16),
            "{label}: no f16 arithmetic, {caps:?}"
        );
        // The same body on f32 declares no 16-bit capability (it runs where f16 cannot).
        let f32_text = text.replace("f16", "f32");
        let body = parse_graph(&f32_text).unwrap_or_else(|e| panic!("{label} f32: {e}"));
        let module = kernel_module(&body, 0).unwrap_or_else(|e| panic!("{label} f32: {e}"));
        let caps = spirv_capabilities(&words(&module)).unwrap();
        assert!(
            !caps.contains(&STORAGE_BUFFER_16BIT),
            "{label} f32: {caps:?}"
        );
    }
}

#[test]
fn a_matmul_mixing_f16_and_f32_operands_says_why() {
    let body = parse_graph(
        "graph @k(%a: f16[4, 8], %b: f32[8, 4]) -> (%y) {\n  %y: f16[4, 4] = matmul(%a, %b)\n}",
    )
    .unwrap();
    let e = matmul(&body).unwrap_err().to_string();
    assert!(e.contains("one element type"), "{e}");
    let body = parse_graph(
        "graph @k(%a: f16[4, 8], %b: f16[8, 4], %c: f32[4]) -> (%y) {\n  %p: f16[4, 4] = matmul(%a, %b)\n  %y: f16[4, 4] = binary{op = add}(%p, %c)\n}",
    )
    .unwrap();
    let e = matmul(&body).unwrap_err().to_string();
    assert!(e.contains("one element type"), "{e}");
}

/// Every binding's static dims.
fn dims_of(body: &Graph, v: rafter_ir::ValueId) -> Vec<usize> {
    body.value(v)
        .ty
        .dims
        .iter()
        .map(|d| d.as_known().expect("static dims") as usize)
        .collect()
}

/// A random input of `dtype` (values in [-2, 2], rounded to f16 for an f16 tensor).
fn input(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let n = dims.iter().product();
    let values = common::inputs_in((-2.0, 2.0), n, seed);
    match dtype {
        DType::F16 => {
            let bytes: Vec<u8> = values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect();
            Tensor::from_le_bytes(DType::F16, dims, &bytes).unwrap()
        }
        _ => Tensor::f32s(dims, values),
    }
}

/// The ulps of tolerance for a case (see the module doc); the f32 `exp` of the cast case
/// gets the 3 + 2|x| f32 ulps Vulkan allows an `exp` (|x| <= 2 here).
fn allowed_ulps(label: &str) -> f64 {
    match label {
        "cast_f16_to_f32" => 7.0,
        l if l.contains("softmax") => 4.0,
        _ => 1.0,
    }
}

/// One ulp of `dtype` at `x` (its subnormal spacing below the smallest normal).
fn ulp(x: f64, dtype: DType) -> f64 {
    let (mantissa, min_exp) = match dtype {
        DType::F16 => (10, -14),
        _ => (23, -126),
    };
    2f64.powi((x.abs().log2().floor() as i32).max(min_exp) - mantissa)
}

/// The elements of `got` more than `ulps` ulps from `want` (at most 3).
fn mismatches(got: &Tensor, want: &Tensor, ulps: f64) -> Vec<String> {
    let dtype = want.dtype();
    let (got, want) = (got.to_f64_vec(), want.to_f64_vec());
    (0..want.len())
        .filter(|&i| {
            let ok = (got[i] - want[i]).abs() <= ulps * ulp(want[i], dtype);
            !ok
        })
        .take(3)
        .map(|i| format!("[{i}] got {} want {}", got[i], want[i]))
        .collect()
}

#[test]
fn f16_kernels_of_every_kind_match_the_reference() {
    let Some(device) = common::device_or_skip("f16_kernels_of_every_kind_match_the_reference")
    else {
        return;
    };
    let caps = device.capabilities();
    assert!(
        caps.storage_buffer_16bit,
        "{} lacks storageBuffer16BitAccess: f16 kernels cannot run on it",
        caps.device_name
    );
    for (label, text) in cases() {
        let body = parse_graph(&text).unwrap_or_else(|e| panic!("{label}: {e}"));
        let module = kernel_module(&body, 0).unwrap_or_else(|e| panic!("{label}: {e}"));
        let inputs: Vec<Tensor> = body
            .inputs
            .iter()
            .enumerate()
            .map(|(i, &v)| input(body.value(v).ty.dtype, &dims_of(&body, v), 7 + i as u64))
            .collect();
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap_or_else(|e| panic!("{label}: reference: {e}"))
            .remove(0);
        let out = body.outputs[0];
        let out_dims = dims_of(&body, out);
        let got = common::run_module(
            &device,
            &module,
            &inputs,
            (body.value(out).ty.dtype, &out_dims),
        );
        assert_eq!(got.dtype(), want.dtype(), "{label}");
        let bad = mismatches(&got, &want, allowed_ulps(label));
        assert!(bad.is_empty(), "{label}: {} elements: {bad:?}", want.len());
    }
}

/// A cast to f16 rounds to the nearest f16 (ties to even) both when it is stored and
/// inside a chain: bit-exact against the reference, on values chosen to sit between f16s
/// (1 + 2^-11 is a tie, rounding to 1; 1 + 3·2^-12 rounds up).
#[test]
fn a_cast_to_f16_rounds_like_the_reference() {
    let Some(device) = common::device_or_skip("a_cast_to_f16_rounds_like_the_reference") else {
        return;
    };
    let body = parse_graph(
        "graph @k(%x: f32[8]) -> (%y, %z) {
  %y: f16[8] = cast{to = f16}(%x)
  %a: f16[8] = cast{to = f16}(%x)
  %b: f32[8] = cast{to = f32}(%a)
  %z: f32[8] = binary{op = sub}(%x, %b)
}",
    )
    .unwrap();
    let x: Vec<f32> = vec![
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-12),
        -(1.0 + 2f32.powi(-11) + 2f32.powi(-20)),
        65504.0,
        1e-3,
        -0.0,
        3.333_3,
        -2.222_2,
    ];
    let module = kernel_module(&body, 0).unwrap();
    assert_eq!(rafter_codegen_spirv::elementwise(&body).unwrap().outputs, 2);
    let inputs = vec![Tensor::f32s(&[8], x)];
    let want = rafter_reference::run(&body, inputs.clone()).unwrap();
    // The kernel's two outputs: run it with both bound.
    let got = run_two(&device, &module, &inputs);
    assert_eq!(got[0].to_f64_vec(), want[0].to_f64_vec(), "stored cast");
    assert_eq!(
        got[1].to_f64_vec(),
        want[1].to_f64_vec(),
        "cast inside a chain"
    );
}

/// [`run`] for the two-output cast kernel: `y` f16[8], `z` f32[8].
fn run_two(device: &VulkanDevice, module: &VulkanModule, inputs: &[Tensor]) -> Vec<Tensor> {
    let x = inputs[0].to_le_bytes();
    let buffers: Vec<Buffer> = [x.len(), 16, 32]
        .iter()
        .map(|&n| {
            device
                .allocate(n as u64, MemoryKind::HostVisibleShared)
                .unwrap()
        })
        .collect();
    buffers[0].write_bytes(0, &x).unwrap();
    let exe = device
        .load_executable(&ExecutableSpec {
            name: "cast".into(),
            format: FORMAT_SPIRV.into(),
            payload: ExecutablePayload::Bytes(Arc::from(&module.spirv[..])),
        })
        .unwrap();
    let max = device.info().limits.max_workgroup_count;
    let (params, grid) = module
        .launch
        .dispatch(&[&[8]], &[8], module.workgroup_size, max)
        .unwrap()
        .unwrap();
    let bindings: Vec<_> = buffers.iter().map(Buffer::whole).collect();
    let mut builder = device.create_command_buffer().unwrap();
    builder.dispatch(&exe, 0, &bindings, &params, grid).unwrap();
    common::submit_and_wait(device, builder);
    let read = |b: &Buffer, dtype: DType| {
        let bytes = b.read_bytes(0, 8 * dtype.size_of() as u64).unwrap();
        Tensor::from_le_bytes(dtype, &[8], &bytes).unwrap()
    };
    vec![read(&buffers[1], DType::F16), read(&buffers[2], DType::F32)]
}

/// The loader refuses an f16 module on a device without 16-bit storage by naming the
/// feature (checked on the real device's capabilities with that feature switched off:
/// the same function the loader calls).
#[test]
fn a_device_without_16_bit_storage_is_named_as_the_reason() {
    let Some(device) = common::device_or_skip("a_device_without_16_bit_storage") else {
        return;
    };
    let body = parse_graph(&cases()[0].1).unwrap();
    let spirv = words(&kernel_module(&body, 0).unwrap());
    let mut caps = device.capabilities().clone();
    assert_eq!(caps.missing_for_module(&spirv).unwrap(), Vec::<&str>::new());
    caps.storage_buffer_16bit = false;
    assert_eq!(
        caps.missing_for_module(&spirv).unwrap(),
        ["storageBuffer16BitAccess"]
    );
    // An f32 module does not need it.
    let f32_body = parse_graph(&cases()[0].1.replace("f16", "f32")).unwrap();
    let f32_spirv = words(&kernel_module(&f32_body, 0).unwrap());
    assert_eq!(
        caps.missing_for_module(&f32_spirv).unwrap(),
        Vec::<&str>::new()
    );
}

/// A cooperative variant's workgroup memory, hand-computed, is what the loader's SPIR-V
/// scan reads; a device offering less refuses the variant by that limit's name (checked on
/// the real device's capabilities with the limit lowered: the function the loader calls).
#[test]
fn a_variant_needing_more_workgroup_memory_than_offered_is_refused() {
    let Some(device) = common::device_or_skip("a_variant_needing_more_workgroup_memory") else {
        return;
    };
    // M = 128, K = 768, N = 768: the sliced 32×32 tile, K ≥ 512, rows of 8 elements.
    let body = parse_graph(
        "graph @k(%a: f16[128, 768], %b: f16[768, 768]) -> (%y) {
           %y: f16[128, 768] = matmul(%a, %b)
         }",
    )
    .unwrap();
    let module = kernel_module(&body, 0).unwrap();
    let coop = words_of(module.coop.as_ref().expect("an f16 product has a variant"));
    // Eight 16-deep products per step over two K groups: KC = 256. A: 32 rows of 256 + 8
    // f16s; B: 256 rows of 32 + 8; the f32 tile of each K group: 2 × 32 × 32.
    let declared = 32 * 264 * 2 + 256 * 40 * 2 + 2 * 32 * 32 * 4;
    assert_eq!(declared, 45_568);
    assert_eq!(
        rafter_hal_vulkan::spirv_workgroup_bytes(&coop).unwrap(),
        declared
    );
    let mut caps = device.capabilities().clone();
    caps.limits.max_compute_shared_memory_size = 49_152;
    assert_eq!(caps.workgroup_memory_excess(&coop).unwrap(), None);
    caps.limits.max_compute_shared_memory_size = 32_768;
    assert_eq!(
        caps.workgroup_memory_excess(&coop).unwrap(),
        Some((declared, 32_768))
    );
    // The plain kernel (the sliced tile's staged f32 slices and partial sums: 28,928
    // bytes) fits 32 KiB, what mobile GPUs offer, not the 16 KiB Vulkan guarantees.
    let plain = words(&module);
    assert_eq!(caps.workgroup_memory_excess(&plain).unwrap(), None);
    caps.limits.max_compute_shared_memory_size = 16_384;
    assert_eq!(
        caps.workgroup_memory_excess(&plain).unwrap(),
        Some((28_928, 16_384))
    );
}

/// Products of every tile on cooperative matrices, each shape leaving partial tiles and
/// a partial last K step: `(label, body, tile)`. A 16×16 tile splits K eight ways
/// (KC = 128, or 256 for a long K), so K = 300 leaves a last step of 44 and K = 600 one
/// of 88.
fn coop_cases() -> Vec<(String, String, MatmulTile)> {
    let matmul = "graph @k(%a: f16[2, 70, 300], %b: f16[300, 90], %c: f16[90]) -> (%y) {
  %p: f16[2, 70, 90] = matmul(%a, %b)
  %q: f16[2, 70, 90] = binary{op = add}(%p, %c)
  %y: f16[2, 70, 90] = unary{op = relu}(%q)
}";
    let conv = "graph @k(%x: f16[2, 40, 9, 9], %w: f16[24, 40, 3, 3], %b: f16[24]) -> (%y) {
  %y: f16[2, 24, 9, 9] = conv{kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1, auto_pad = explicit}(%x, %w, %b)
}";
    let mut out = Vec::new();
    for tile in [
        MatmulTile::Large,
        MatmulTile::Small,
        MatmulTile::Sliced,
        MatmulTile::Tiny,
        MatmulTile::TinySliced,
    ] {
        out.push((format!("matmul_{tile:?}"), matmul.to_string(), tile));
    }
    // K of 512 or more: two 16-deep products per staged step, a partial last step.
    let long_k = "graph @k(%a: f16[40, 600], %b: f16[600, 70]) -> (%y) {
  %y: f16[40, 70] = matmul(%a, %b)
}";
    for tile in [
        MatmulTile::Large,
        MatmulTile::Sliced,
        MatmulTile::TinySliced,
    ] {
        out.push((format!("matmul_long_k_{tile:?}"), long_k.to_string(), tile));
    }
    // Rows of multiples of 8 (K, and N or Bᵀ's K): staged 16 bytes at a time, with
    // partial tiles in M and N, short and long K, batched and transposed B.
    let rows8 = |k: usize| {
        format!(
            "graph @k(%a: f16[2, 70, {k}], %b: f16[{k}, 72]) -> (%y) {{
  %y: f16[2, 70, 72] = matmul(%a, %b)
}}"
        )
    };
    for tile in [MatmulTile::Small, MatmulTile::Tiny] {
        out.push((format!("matmul_rows8_{tile:?}"), rows8(96), tile));
    }
    for tile in [
        MatmulTile::Large,
        MatmulTile::Sliced,
        MatmulTile::TinySliced,
    ] {
        out.push((format!("matmul_rows8_long_k_{tile:?}"), rows8(640), tile));
    }
    let gemm = "graph @k(%a: f16[37, 96], %w: f16[72, 96], %c: f16[72]) -> (%y) {
  %y: f16[37, 72] = gemm{alpha = 1.0, beta = 1.0, trans_a = false, trans_b = true}(%a, %w, %c)
}";
    for tile in [MatmulTile::Large, MatmulTile::Tiny] {
        out.push((
            format!("gemm_trans_b_rows8_{tile:?}"),
            gemm.to_string(),
            tile,
        ));
    }
    out.push(("conv".into(), conv.to_string(), MatmulTile::Large));
    out
}

/// `t` with every element's sign cleared (an f16 tensor stays f16).
fn abs_of(t: &Tensor) -> Tensor {
    assert_eq!(t.dtype(), DType::F16, "the variants' cases are f16");
    let mut bytes = t.to_le_bytes();
    for pair in bytes.chunks_exact_mut(2) {
        pair[1] &= 0x7F;
    }
    Tensor::from_le_bytes(t.dtype(), t.shape(), &bytes).unwrap()
}

/// `body`'s first node alone (the product, a convolution without its bias), on the same
/// inputs: its value per output element, before the epilogue.
fn product_of(body: &Graph) -> Graph {
    let mut product = body.clone();
    let first = product.nodes[0].clone();
    product.nodes.truncate(1);
    if let rafter_ir::Op::Conv { .. } = first.op {
        product.nodes[0].inputs.truncate(2);
    }
    product.outputs = vec![first.outputs[0].expect("the product has a result")];
    product
}

/// The cooperative-matrix variant of a body's module, `tile` for a matmul (a conv gets
/// the generator's choice): the plain module with the variant's SPIR-V in its place.
fn coop_module(body: &Graph, tile: MatmulTile) -> VulkanModule {
    let mut module = kernel_module(body, 0).unwrap();
    if matches!(
        body.nodes[0].op,
        rafter_ir::Op::MatMul | rafter_ir::Op::Gemm { .. }
    ) {
        let kernel = matmul_tiled(body, tile).unwrap();
        module.launch = kernel.launch().unwrap();
        module.coop = kernel
            .coop
            .map(|c| rafter_codegen_spirv::to_bytes(&c).into());
    }
    let coop = module.coop.clone().expect("an f16 product has a variant");
    module.spirv = coop;
    module
}

/// Every tile's variant passes spirv-val, and runs where the device offers the
/// configuration, matching the reference within an ulp of the output, plus one of the
/// product before the epilogue, plus 2^-20 of the element's sum of |a·b|: the tensor
/// cores add their f32 sums in another order and with their own rounding (measured on
/// the H100: 2^-25 of it where a sum of 600 terms cancels), so the product's rounding to
/// f16 may land one ulp apart, which the bias carries into a smaller output. A wrong
/// index or a lost K step is off by a sizeable fraction of the sum of |a·b|. Elsewhere (lavapipe) the loader refuses it, naming the feature, which
/// is what makes the runtime fall back to the plain module. `RAFTER_REQUIRE_COOP=1` (the
/// H100 run) fails instead of skipping the comparison.
#[test]
fn cooperative_matrix_variants_match_the_reference_or_are_refused_by_name() {
    for (label, text, tile) in coop_cases() {
        let body = parse_graph(&text).unwrap_or_else(|e| panic!("{label}: {e}"));
        common::spirv_val(&words(&coop_module(&body, tile)), &format!("coop_{label}"));
    }
    let Some(device) = common::device_or_skip("cooperative_matrix_variants") else {
        return;
    };
    let required = std::env::var("RAFTER_REQUIRE_COOP").is_ok_and(|v| v == "1");
    if !device.capabilities().has_coop_f16() {
        assert!(
            !required,
            "RAFTER_REQUIRE_COOP=1 but the device has no f16 coop"
        );
        let (_, text, tile) = &coop_cases()[0];
        let module = coop_module(&parse_graph(text).unwrap(), *tile);
        let e = device
            .load_executable(&ExecutableSpec {
                name: "coop".into(),
                format: FORMAT_SPIRV.into(),
                payload: ExecutablePayload::Bytes(Arc::from(&module.spirv[..])),
            })
            .expect_err("refused")
            .to_string();
        assert!(e.contains("cooperativeMatrix"), "{e}");
        eprintln!("note: no f16 cooperative matrices on this device; variants not run");
        return;
    }
    for (label, text, tile) in coop_cases() {
        let body = parse_graph(&text).unwrap();
        let module = coop_module(&body, tile);
        let inputs: Vec<Tensor> = body
            .inputs
            .iter()
            .enumerate()
            .map(|(i, &v)| input(body.value(v).ty.dtype, &dims_of(&body, v), 3 + i as u64))
            .collect();
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap()
            .remove(0);
        let out = body.outputs[0];
        let got = common::run_module(
            &device,
            &module,
            &inputs,
            (DType::F16, &dims_of(&body, out)),
        );
        let product = rafter_reference::run(&product_of(&body), inputs.clone())
            .unwrap()
            .remove(0)
            .to_f64_vec();
        let abs: Vec<Tensor> = inputs.iter().map(abs_of).collect();
        let sum_abs = rafter_reference::run(&product_of(&body), abs)
            .unwrap()
            .remove(0)
            .to_f64_vec();
        let (got_v, want_v) = (got.to_f64_vec(), want.to_f64_vec());
        let bad: Vec<String> = (0..want_v.len())
            .filter(|&i| {
                let allowed = ulp(want_v[i], DType::F16)
                    + ulp(product[i], DType::F16)
                    + sum_abs[i] * 2f64.powi(-20);
                (got_v[i] - want_v[i]).abs() > allowed
            })
            .take(3)
            .map(|i| {
                format!(
                    "[{i}] got {} want {} (product {})",
                    got_v[i], want_v[i], product[i]
                )
            })
            .collect();
        assert!(
            bad.is_empty(),
            "{label}: {} elements: {bad:?}",
            want_v.len()
        );
    }
}
