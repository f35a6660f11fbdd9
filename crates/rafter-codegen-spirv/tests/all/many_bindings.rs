//! Kernels of more than `INLINE_BINDINGS` (8) buffers on the Vulkan device (lavapipe in
//! CI): their binding addresses and params go through an argument block in memory instead
//! of push constants. Each binding holds distinct values and each one's place in the
//! result differs, so a block written in the wrong order, at the wrong offset, or read at
//! the wrong offset by the module fails: a 12-operand concat (a grid kernel), a fused
//! elementwise chain of 10 inputs (the elementwise generator's own push block), and two
//! such dispatches in one command buffer (two blocks in one argument buffer), exactly
//! against the reference executor.

use crate::common;

use std::sync::Arc;

use rafter_codegen_spirv::{concat, kernel_module, INLINE_BINDINGS, MAX_BINDINGS};
use rafter_hal::{Buffer, Device, ExecutablePayload, ExecutableSpec, MemoryKind, FORMAT_SPIRV};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

#[test]
fn the_codegen_and_the_hal_agree_on_the_inline_limit() {
    assert_eq!(INLINE_BINDINGS, rafter_hal_vulkan::INLINE_BINDINGS);
    const { assert!(MAX_BINDINGS <= rafter_hal_vulkan::MAX_BINDINGS) };
}

/// A concat of `n` operands `[2, k + 1]` along axis 1, each of values `1000 k + i`.
fn concat_case(n: usize) -> (String, Vec<Tensor>, Vec<usize>) {
    let params: Vec<String> = (0..n)
        .map(|k| format!("%x{k}: f32[2, {}]", k + 1))
        .collect();
    let args: Vec<String> = (0..n).map(|k| format!("%x{k}")).collect();
    let width: usize = (1..=n).sum();
    let text = format!(
        "graph @c({}) -> (%y) {{\n  %y: f32[2, {width}] = concat{{axis = 1}}({})\n}}",
        params.join(", "),
        args.join(", ")
    );
    let inputs = (0..n)
        .map(|k| {
            let len = 2 * (k + 1);
            Tensor::f32s(
                &[2, k + 1],
                (0..len).map(|i| (1000 * k + i) as f32).collect(),
            )
        })
        .collect();
    (text, inputs, vec![2, width])
}

#[test]
fn a_concat_of_twelve_operands_matches_the_reference() {
    let (text, inputs, out) = concat_case(12);
    let body = parse_graph(&text).unwrap();
    let kernel = concat(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
    common::spirv_val(&kernel.spirv, "concat_12");
    let Some(device) = common::device_or_skip("many_bindings") else {
        return;
    };
    let want = rafter_reference::run(&body, inputs.clone())
        .unwrap()
        .remove(0);
    let module = kernel_module(&body, 0).unwrap();
    let got = common::run_module(&device, &module, &inputs, (DType::F32, &out));
    assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
}

#[test]
fn a_fused_chain_of_ten_inputs_matches_the_reference() {
    // y = (((x0 * 2 + x1) * 2 + x2) ...) * 2 + x9: input k weighs 2^(9 - k), exact in f32.
    let n = 10;
    let params: Vec<String> = (0..n).map(|k| format!("%x{k}: f32[37]")).collect();
    let mut lines = vec!["  const %two: f32[] = dense [2.0]".to_string()];
    let mut acc = "%x0".to_string();
    for k in 1..n {
        let out = if k == n - 1 {
            "%y".to_string()
        } else {
            format!("%s{k}")
        };
        lines.push(format!(
            "  %m{k}: f32[37] = binary{{op = mul}}({acc}, %two)"
        ));
        lines.push(format!(
            "  {out}: f32[37] = binary{{op = add}}(%m{k}, %x{k})"
        ));
        acc = out;
    }
    let text = format!(
        "graph @chain({}) -> (%y) {{\n{}\n}}",
        params.join(", "),
        lines.join("\n")
    );
    let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let module = kernel_module(&body, 0).unwrap_or_else(|e| panic!("{text}: {e}"));
    let words: Vec<u32> = module
        .spirv
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    common::spirv_val(&words, "chain_10");
    let Some(device) = common::device_or_skip("many_bindings") else {
        return;
    };
    let inputs: Vec<Tensor> = (0..n)
        .map(|k| {
            Tensor::f32s(
                &[37],
                (0..37).map(|i| ((i * 7 + k * 3) % 11) as f32).collect(),
            )
        })
        .collect();
    let want = rafter_reference::run(&body, inputs.clone())
        .unwrap()
        .remove(0);
    let got = common::run_module(&device, &module, &inputs, (DType::F32, &[37]));
    assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
}

#[test]
fn two_argument_blocks_in_one_command_buffer_stay_apart() {
    // A 9-operand and a 10-operand concat in one command buffer: two blocks of different
    // sizes in one argument buffer. A second block written over the first, or a dispatch
    // pointed at the other's block, binds the wrong operands and fails.
    let Some(device) = common::device_or_skip("many_bindings") else {
        return;
    };
    let max = device.info().limits.max_workgroup_count;
    let mut builder = device.create_command_buffer().unwrap();
    let mut checks = Vec::new();
    for n in [9, 10] {
        let (text, inputs, out) = concat_case(n);
        let body = parse_graph(&text).unwrap();
        let module = kernel_module(&body, 0).unwrap();
        let want = rafter_reference::run(&body, inputs.clone())
            .unwrap()
            .remove(0);
        let exe = device
            .load_executable(&ExecutableSpec {
                name: format!("concat{n}"),
                format: FORMAT_SPIRV.into(),
                payload: ExecutablePayload::Bytes(Arc::from(&module.spirv[..])),
            })
            .unwrap();
        let input_dims: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        let (params, grid) = module
            .launch
            .dispatch(&input_dims, &out, module.workgroup_size, max)
            .unwrap()
            .unwrap();
        let mut buffers: Vec<Buffer> = inputs
            .iter()
            .map(|t| {
                let bytes = t.to_le_bytes();
                let b = device
                    .allocate(bytes.len() as u64, MemoryKind::HostVisibleShared)
                    .unwrap();
                b.write_bytes(0, &bytes).unwrap();
                b
            })
            .collect();
        let bytes = 4 * out.iter().product::<usize>();
        let y = device
            .allocate(bytes as u64, MemoryKind::HostVisibleShared)
            .unwrap();
        y.write_bytes(0, &vec![0xFF; bytes]).unwrap();
        buffers.push(y.clone());
        let bindings: Vec<_> = buffers.iter().map(Buffer::whole).collect();
        builder.dispatch(&exe, 0, &bindings, &params, grid).unwrap();
        checks.push((text, y, bytes, out, want));
    }
    common::submit_and_wait(&device, builder);
    for (text, y, bytes, out, want) in checks {
        let got = y.read_bytes(0, bytes as u64).unwrap();
        let got = Tensor::from_le_bytes(DType::F32, &out, &got).unwrap();
        assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "{text}");
    }
}
