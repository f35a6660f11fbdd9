//! Every format against vectors made by ggml's C reference quantizers and gguf-py's
//! dequantizers (`tests/data/gen_reference.py` says exactly how): quantize must give the
//! reference bytes and dequantize the reference floats, bit for bit.

use rafter_quant::{dequantize_row, quantize_row, BlockFormat};

struct Case {
    name: String,
    x: Option<Vec<f32>>,
    q: Vec<u8>,
    y: Vec<f32>,
}

fn floats(hex: &str) -> Vec<f32> {
    hex.split_whitespace()
        .map(|h| f32::from_bits(u32::from_str_radix(h, 16).expect("f32 hex")))
        .collect()
}

fn bytes(hex: &str) -> Vec<u8> {
    let hex = hex.trim();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("byte hex"))
        .collect()
}

fn cases(format: BlockFormat) -> Vec<Case> {
    let path = format!(
        "{}/tests/data/{}.txt",
        env!("CARGO_MANIFEST_DIR"),
        format.name().to_lowercase()
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out: Vec<Case> = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (tag, rest) = line.split_once(' ').expect("tagged line");
        match tag {
            "case" => out.push(Case {
                name: rest.to_string(),
                x: None,
                q: Vec::new(),
                y: Vec::new(),
            }),
            "x" => out.last_mut().unwrap().x = Some(floats(rest)),
            "q" => out.last_mut().unwrap().q = bytes(rest),
            "y" => out.last_mut().unwrap().y = floats(rest),
            _ => panic!("{path}: unknown line tag {tag}"),
        }
    }
    assert!(out.len() >= 10, "{path}: only {} cases", out.len());
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    for format in BlockFormat::ALL {
        for case in cases(format) {
            let mut y = vec![f32::NAN; case.y.len()];
            dequantize_row(format, &case.q, &mut y).unwrap();
            assert_eq!(bits(&y), bits(&case.y), "{format} case {}", case.name);
        }
    }
}

#[test]
fn quantize_matches_ggml_reference_bit_for_bit() {
    for format in BlockFormat::ALL {
        let mut checked = 0;
        for case in cases(format) {
            let Some(x) = &case.x else { continue };
            let mut q = vec![0xAAu8; case.q.len()];
            quantize_row(format, x, &mut q).unwrap();
            if q != case.q {
                let bb = format.block_bytes();
                let first = (0..q.len()).find(|&i| q[i] != case.q[i]).unwrap();
                panic!(
                    "{format} case {}: first difference at byte {first} (block {}, offset {}): \
                     got {:#04x}, want {:#04x}",
                    case.name,
                    first / bb,
                    first % bb,
                    q[first],
                    case.q[first]
                );
            }
            checked += 1;
        }
        assert!(checked >= 10, "{format}: {checked} quantize cases");
    }
}
