//! Device placement for the Vulkan target (the SPIR-V backend as the accelerator): which kernels go to the GPU, the copies at device
//! changes, one arena per device and memory kind, and that the placed program still computes
//! what the graph does (interpreted with its arenas as real bytes).

mod common;

use common::{check_equivalent_with, parse, rand_f32};
use rafter_codegen_spirv::SpirvBackend;
use rafter_ir::program::Program;
use rafter_ir::program::{Step, Storage};
use rafter_opt::{CompileOptions, Target};

fn vulkan() -> CompileOptions {
    CompileOptions {
        target: Target::cpu().with(std::sync::Arc::new(SpirvBackend)),
        ..CompileOptions::default()
    }
}

/// Why the Vulkan backend refuses kernel `k`.
fn vulkan_support(p: &Program, k: usize) -> Result<(), String> {
    rafter_opt::place::support(p, k, &SpirvBackend)
}

/// relu(x) and relu(x)·w (GPU, one fused kernel) → log-sum-exp over an axis (CPU) →
/// sigmoid (GPU), with the input also an output. The GPU reads the input where it lives
/// (first read there) and the weight through its own weight buffer; the reduction reads a
/// CPU replica of the relu, the sigmoid a GPU replica of the sum.
fn graph() -> String {
    let w: Vec<String> = (0..32)
        .map(|i| format!("{:?}", i as f32 * 0.25 - 4.0))
        .collect();
    format!(
        r#"graph @g(%x: f32[4, 8]) -> (%y, %b, %x) {{
  const %w: f32[4, 8] = dense [{}]
  %a: f32[4, 8] = unary{{op = relu}}(%x)
  %b: f32[4, 8] = binary{{op = mul}}(%a, %w)
  %s: f32[4] = reduce{{kind = log_sum_exp, axes = [1], keep_dims = false, noop_with_empty_axes = false}}(%a)
  %y: f32[4] = unary{{op = sigmoid}}(%s)
}}"#,
        w.join(", ")
    )
}

#[test]
fn supported_kernels_go_to_the_gpu_with_copies_at_device_changes() {
    let g = parse(&graph());
    let x = rand_f32(&[4, 8], 3);
    let p = check_equivalent_with(&g, vec![x], &vulkan());
    let devices: Vec<&str> = p.kernels.iter().map(|k| k.device.as_str()).collect();
    assert_eq!(devices, ["vulkan", "cpu", "vulkan"], "{p:#?}");
    let reason = vulkan_support(&p, 1).unwrap_err();
    assert!(reason.contains("reduce"), "{reason}");
    let copies: Vec<(String, String)> = p
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Copy { src, dst } => {
                Some((p.buffers[*src].name.clone(), p.buffers[*dst].name.clone()))
            }
            _ => None,
        })
        .collect();
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert!(copies.contains(&pair("a", "a@cpu")), "{copies:?}");
    assert!(copies.contains(&pair("s", "s@vulkan")), "{copies:?}");
    assert_eq!(copies.len(), 3, "{copies:?}"); // and x → output 2
    let arenas: Vec<(&str, &str)> = p
        .arenas
        .iter()
        .map(|a| (a.device.as_str(), a.memory.as_str()))
        .collect();
    // `a` is read back by the host (host-cached `host` memory on the GPU side); `s@vulkan`
    // is written by the host for the GPU (`host_visible_shared`).
    assert_eq!(
        arenas,
        [
            ("cpu", "host"),
            ("vulkan", "host"),
            ("vulkan", "host_visible_shared")
        ],
        "{p:#?}"
    );
    let storage = |name: &str| {
        p.buffers
            .iter()
            .find(|b| b.name == name)
            .unwrap()
            .storage
            .clone()
    };
    let arena = |name: &str| match storage(name) {
        Storage::Arena { arena, .. } => arena,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(arena("a"), 1);
    assert_eq!(arena("a@cpu"), 0);
    assert_eq!(arena("s"), 0);
    assert_eq!(arena("s@vulkan"), 2);
    assert!(matches!(storage("w"), Storage::Weight(0)));
}

#[test]
fn results_crossing_to_the_gpu_live_in_host_visible_memory() {
    let g = parse(
        r#"graph @g(%x: f32[16]) -> (%z) {
  %a: f32[16] = unary{op = exp}(%x)
  %s: f32[] = reduce{kind = log_sum_exp, axes = [0], keep_dims = false, noop_with_empty_axes = false}(%x)
  %b: f32[16] = binary{op = div}(%a, %s)
  %z: f32[16] = unary{op = neg}(%b)
}"#,
    );
    let p = check_equivalent_with(&g, vec![rand_f32(&[16], 9)], &vulkan());
    let on: Vec<&str> = p.kernels.iter().map(|k| k.device.as_str()).collect();
    assert!(on.contains(&"vulkan") && on.contains(&"cpu"), "{p:#?}");
    assert!(
        p.arenas
            .iter()
            .any(|a| a.device == "vulkan" && a.memory == "host_visible_shared"),
        "{p:#?}"
    );
}

#[test]
fn a_program_without_supported_kernels_is_the_cpu_program() {
    let g = parse(
        r#"graph @g(%x: f32[4, 8]) -> (%s) {
  %s: f32[4] = reduce{kind = log_sum_exp, axes = [1], keep_dims = false, noop_with_empty_axes = false}(%x)
}"#,
    );
    let cpu = rafter_opt::compile(&g, &CompileOptions::default()).unwrap();
    let vk = check_equivalent_with(&g, vec![rand_f32(&[4, 8], 1)], &vulkan());
    assert_eq!(cpu, vk);
}

/// An attention block over symbolic `b` and `s` (BERT's head split and merge transposes,
/// the scores with a mask broadcast over heads, softmax, the residual add and layer norm)
/// lands on the GPU whole: sizes reach the kernels as dim params. Only the input and the
/// mask are written by the host and only the result read back.
#[test]
fn an_attention_block_over_symbolic_dims_stays_on_the_gpu() {
    let g = parse(
        r#"graph @attn(%x: f32[b, s, 8], %m: f32[b, 1, 1, s], %g: f32[8], %beta: f32[8]) -> (%y) {
  const %split: i64[4] = dense [0, 0, 2, 4]
  const %merge: i64[3] = dense [0, 0, 8]
  const %c: f32[] = dense [0.5]
  %r: f32[b, s, 2, 4] = reshape{allow_zero = false}(%x, %split)
  %q: f32[b, 2, s, 4] = transpose{perm = [0, 2, 1, 3]}(%r)
  %k: f32[b, 2, 4, s] = transpose{perm = [0, 2, 3, 1]}(%r)
  %p: f32[b, 2, s, s] = matmul(%q, %k)
  %t: f32[b, 2, s, s] = binary{op = mul}(%p, %c)
  %u: f32[b, 2, s, s] = binary{op = add}(%t, %m)
  %w: f32[b, 2, s, s] = softmax{kind = softmax, axis = -1}(%u)
  %v: f32[b, 2, s, 4] = matmul(%w, %q)
  %o: f32[b, s, 2, 4] = transpose{perm = [0, 2, 1, 3]}(%v)
  %h: f32[b, s, 8] = reshape{allow_zero = false}(%o, %merge)
  %a: f32[b, s, 8] = binary{op = add}(%h, %x)
  %y: f32[b, s, 8] = layer_norm{axis = -1, epsilon = 1e-5}(%a, %g, %beta)
}"#,
    );
    let inputs = vec![
        rand_f32(&[2, 5, 8], 1),
        rand_f32(&[2, 1, 1, 5], 2),
        rand_f32(&[8], 3),
        rand_f32(&[8], 4),
    ];
    let p = check_equivalent_with(&g, inputs, &vulkan());
    for (k, kernel) in p.kernels.iter().enumerate() {
        assert_eq!(
            kernel.device,
            "vulkan",
            "kernel {k} `{}`: {:?}",
            kernel.name,
            vulkan_support(&p, k)
        );
    }
    let copies = p
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Copy { .. }))
        .count();
    assert_eq!(copies, 0, "{p:#?}");
}

/// Two CPU reductions (log-sum-exp stays on the CPU) feeding GPU work at different points:
/// the GPU steps that need only the first go before the second reduction, so the GPU can
/// start while the CPU computes it (`rafter_opt::schedule`), and the program still computes
/// what the graph does.
#[test]
fn cpu_work_a_gpu_step_needs_later_is_scheduled_after_the_gpu_work_before_it() {
    let w: Vec<String> = (0..64)
        .map(|i| format!("{:?}", (i % 7) as f32 * 0.125 - 0.4))
        .collect();
    let text = format!(
        r#"graph @g(%x: f32[4, 8]) -> (%z) {{
  const %w: f32[8, 8] = dense [{}]
  %s1: f32[4, 1] = reduce{{kind = log_sum_exp, axes = [1], keep_dims = true, noop_with_empty_axes = false}}(%x)
  %x2: f32[4, 8] = binary{{op = mul}}(%x, %x)
  %s2: f32[4, 1] = reduce{{kind = log_sum_exp, axes = [1], keep_dims = true, noop_with_empty_axes = false}}(%x2)
  %a: f32[4, 8] = binary{{op = sub}}(%x, %s1)
  %m: f32[4, 8] = matmul(%a, %w)
  %z: f32[4, 8] = binary{{op = add}}(%m, %s2)
}}"#,
        w.join(", ")
    );
    let g = parse(&text);
    let p = check_equivalent_with(&g, vec![rand_f32(&[4, 8], 5)], &vulkan());
    let on = |s: &Step| match s {
        Step::Dispatch { kernel, .. } => p.kernels[*kernel].device.as_str(),
        Step::Copy { .. } => "copy",
    };
    let order: Vec<&str> = p.steps.iter().map(on).collect();
    let first_gpu = order
        .iter()
        .position(|d| *d == "vulkan")
        .expect("GPU steps");
    let last_cpu = order.iter().rposition(|d| *d == "cpu").expect("CPU steps");
    assert!(
        first_gpu < last_cpu,
        "the second reduction should follow the first GPU step: {order:?}"
    );
}

/// A size only tensor values fix (the count of a `non_zero`) keeps what it sizes on the
/// host, and the refusal names the symbol and the op that made it, the one to lift; the
/// comparison before it (a bool result) runs on the GPU.
#[test]
fn a_value_sized_buffer_names_the_op_that_sized_it() {
    let g = parse(
        r#"graph @nz(%x: f32[6]) -> (%y) {
          const %zero: f32[] = dense [0.0]
          %m: bool[6] = binary{op = greater}(%x, %zero)
          %nz: i64[1, nnz] = non_zero(%m)
          %f: i64[nnz] = squeeze{axes = [0]}(%nz)
          %g: f32[nnz] = gather{axis = 0}(%x, %f)
          %y: f32[nnz] = unary{op = exp}(%g)
        }"#,
    );
    let p = check_equivalent_with(&g, vec![rand_f32(&[6], 2)], &vulkan());
    let kernel_of = |op: &str| {
        p.kernels
            .iter()
            .position(|k| k.body.nodes.iter().any(|n| n.op.name() == op))
            .unwrap_or_else(|| panic!("no {op} kernel: {p:#?}"))
    };
    assert_eq!(p.kernels[kernel_of("binary")].device, "vulkan", "{p:#?}");
    let exp = kernel_of("unary");
    assert_eq!(p.kernels[exp].device, "cpu");
    let reason = vulkan_support(&p, exp).unwrap_err();
    assert!(
        reason.contains("sized by `nnz`") && reason.contains("op `non_zero`"),
        "{reason}"
    );
}
