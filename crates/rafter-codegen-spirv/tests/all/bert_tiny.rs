//! The elementwise kernels rafter-opt fuses out of a real model (the committed bert_tiny
//! fixture) compile to valid SPIR-V and compute what the reference executor computes.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use rafter_codegen_spirv::{elementwise, kernel_module, Operand};
use rafter_ir::program::KernelKind;
use rafter_ir::{DType, Symbol};
use rafter_opt::{CompileOptions, Target};
use rafter_reference::{Bindings, Tensor};

#[test]
fn bert_tiny_elementwise_kernels_compile_validate_and_match_the_reference() {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert_tiny/model.onnx");
    let graph = rafter_import::import_onnx_file(&model).unwrap().graph;
    let program = rafter_opt::compile(
        &graph,
        &CompileOptions {
            target: Target::cpu(),
            bounds: vec![(Symbol::new("seq"), 64)],
            ..CompileOptions::default()
        },
    )
    .unwrap();
    let device = common::device_or_skip("bert_tiny_elementwise_kernels");
    let sizes: HashMap<&str, usize> = [("batch", 2), ("seq", 13)].into();
    let mut generated = 0;
    let mut masks = 0;
    for kernel in program
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::Elementwise)
    {
        let body = &kernel.body;
        let all_f32 = body.values.iter().all(|v| v.ty.dtype == DType::F32);
        let result = elementwise(body);
        // Inputs at batch=2, seq=13; the reference is the oracle.
        let dims = |input: rafter_ir::ValueId| -> Vec<usize> {
            body.value(input)
                .ty
                .dims
                .iter()
                .map(|d| match d.as_known() {
                    Some(k) => k as usize,
                    None => sizes[d.as_symbol().expect("a plain symbol").name()],
                })
                .collect()
        };
        if !all_f32 {
            // The attention mask's kernel (a `cast` of the i64 mask to f32, then its
            // scaling): run on a mask of ones and zeros.
            let module = kernel_module(body, 0).unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
            let words: Vec<u32> = module
                .spirv
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            common::spirv_val(&words, &kernel.name);
            masks += 1;
            let Some(device) = &device else { continue };
            let inputs: Vec<Tensor> = body
                .inputs
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let shape = dims(v);
                    let n: usize = shape.iter().product();
                    let dtype = body.value(v).ty.dtype;
                    let values: Vec<f64> = if dtype.is_float() {
                        common::inputs_in((-4.0, 4.0), n, 40 + i as u64)
                            .into_iter()
                            .map(f64::from)
                            .collect()
                    } else {
                        (0..n).map(|j| ((j * 7 + i) % 3 % 2) as f64).collect()
                    };
                    rafter_reference::ops::elementwise::from_f64s(dtype, &shape, values)
                })
                .collect();
            let want = rafter_reference::run_with(body, inputs.clone(), &mut Bindings::default())
                .unwrap()
                .remove(0);
            let out = body.outputs[0];
            let got = common::run_module(
                device,
                &module,
                &inputs,
                (body.value(out).ty.dtype, &dims(out)),
            );
            for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                assert!(
                    common::close(*g as f32, w as f32, 2e-6, 2e-5),
                    "{} [{i}]: got {g}, want {w}",
                    kernel.name
                );
            }
            eprintln!("{}: the mask kernel matches the reference", kernel.name);
            continue;
        }
        let spirv = result.unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
        common::spirv_val(&spirv.spirv, &kernel.name);
        generated += 1;
        let Some(device) = &device else { continue };
        let mut tensors = Vec::new();
        let mut buffers = Vec::new();
        for (i, (&input, kind)) in body.inputs.iter().zip(&spirv.inputs).enumerate() {
            assert_eq!(*kind, Operand::Tensor);
            let shape = dims(input);
            let values = common::inputs_in((-4.0, 4.0), shape.iter().product(), 40 + i as u64);
            buffers.push(common::upload(device, &values));
            tensors.push(Tensor::f32s(&shape, values));
        }
        let want = rafter_reference::run_with(body, tensors, &mut Bindings::default()).unwrap();
        let count = want[0].len() as u64;
        let outputs = common::run(device, &spirv, &buffers, count);
        for (buffer, want) in outputs.iter().zip(&want) {
            let got = common::f32s(&buffer.read_bytes(0, count * 4).unwrap());
            for (i, (g, w)) in got.iter().zip(want.to_f64_vec()).enumerate() {
                assert!(
                    common::close(*g, w as f32, 2e-6, 2e-5),
                    "{} [{i}]: got {g}, want {w}",
                    kernel.name
                );
            }
        }
        eprintln!("{}: {count} elements match the reference", kernel.name);
    }
    assert!(
        generated >= 2,
        "bert_tiny's two GELU chains are f32 elementwise kernels"
    );
    assert!(masks >= 1, "bert_tiny's attention mask kernel is generated");
}
