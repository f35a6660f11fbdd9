//! `bit_cast` on the Vulkan device (lavapipe in CI), against the reference executor:
//! every width (8, 16, 32 and 64 bits), floats to integers and back (f64 and bf16 too),
//! bit-exact, NaN payloads and negative zeros included; a cast to bool is refused.

use crate::common;

use rafter_codegen_spirv::{bit_cast, kernel_module};
use rafter_ir::text::parse_graph;
use rafter_ir::DType;
use rafter_reference::Tensor;

#[test]
fn bit_casts_match_the_reference() {
    let Some(device) = common::device_or_skip("bit_cast") else {
        return;
    };
    let pairs = [
        (DType::F32, DType::I32),
        (DType::I32, DType::F32),
        (DType::U32, DType::I32),
        (DType::F64, DType::I64),
        (DType::I64, DType::F64),
        (DType::U16, DType::I16),
        (DType::F16, DType::BF16),
        (DType::I8, DType::U8),
        (DType::Bool, DType::U8),
    ];
    for (from, to) in pairs {
        let count = 37usize;
        let width = from.size_of();
        // Every byte pattern position distinct; bools only 0 and 1.
        let bytes: Vec<u8> = (0..count * width)
            .map(|k| match from {
                DType::Bool => (k % 3 == 0) as u8,
                _ => (k * 151 % 256) as u8 ^ 0x80,
            })
            .collect();
        let x = Tensor::from_le_bytes(from, &[count], &bytes).unwrap();
        let text = format!(
            "graph @g(%x: {from}[{count}]) -> (%y) {{\n  %y: {to}[{count}] = bit_cast{{to = {to}}}(%x)\n}}"
        );
        let body = parse_graph(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let kernel = bit_cast(&body).unwrap_or_else(|e| panic!("{text}: {e}"));
        common::spirv_val(&kernel.spirv, &format!("bit_cast_{from}_{to}"));
        let want = rafter_reference::run(&body, vec![x.clone()])
            .unwrap()
            .remove(0);
        let module = kernel_module(&body, 0).unwrap();
        let got = common::run_module(&device, &module, &[x], (to, &[count]));
        assert_eq!(got.to_le_bytes(), want.to_le_bytes(), "{text}");
    }
}

#[test]
fn a_bit_cast_to_bool_or_across_widths_is_refused() {
    for (from, to) in [("u8", "bool"), ("f32", "i64")] {
        let text = format!(
            "graph @g(%x: {from}[4]) -> (%y) {{\n  %y: {to}[4] = bit_cast{{to = {to}}}(%x)\n}}"
        );
        let body = parse_graph(&text).unwrap();
        assert!(bit_cast(&body).is_err(), "{text}");
    }
}
