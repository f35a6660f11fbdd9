//! Bad lengths are errors that name the format and the sizes, never panics.

use rafter_quant::{dequantize_row, quantize_row, BlockFormat, QuantError};

#[test]
fn wrong_lengths_are_errors() {
    for format in BlockFormat::ALL {
        let (be, bb) = (format.block_elems(), format.block_bytes());
        // Element count not a block multiple.
        let mut out = vec![0.0f32; be + 1];
        let e = dequantize_row(format, &vec![0u8; 2 * bb], &mut out).unwrap_err();
        assert_eq!(
            e,
            QuantError::NotBlockMultiple {
                format,
                elems: be + 1
            }
        );
        let e = quantize_row(format, &vec![0.0; be - 1], &mut vec![0u8; bb]).unwrap_err();
        assert_eq!(
            e,
            QuantError::NotBlockMultiple {
                format,
                elems: be - 1
            }
        );
        // Byte buffer one byte short, one byte long, or a whole block off.
        for got in [bb - 1, bb + 1, 2 * bb, 0] {
            let e = dequantize_row(format, &vec![0u8; got], &mut vec![0.0; be]).unwrap_err();
            let want = QuantError::ByteLength {
                format,
                elems: be,
                expected: bb,
                got,
            };
            assert_eq!(e, want);
            assert!(e.to_string().contains(format.name()), "{e}");
            let e = quantize_row(format, &vec![1.0; be], &mut vec![0u8; got]).unwrap_err();
            assert_eq!(e, want);
        }
        // Empty rows are fine.
        dequantize_row(format, &[], &mut []).unwrap();
        quantize_row(format, &[], &mut []).unwrap();
    }
}

#[test]
fn error_messages_say_what_and_where() {
    let e = QuantError::ByteLength {
        format: BlockFormat::Q4_K,
        elems: 512,
        expected: 288,
        got: 287,
    };
    assert_eq!(
        e.to_string(),
        "q4_K: 512 elements take 288 bytes (2 blocks of 144), got 287"
    );
    let e = QuantError::NotBlockMultiple {
        format: BlockFormat::Q8_0,
        elems: 33,
    };
    assert_eq!(
        e.to_string(),
        "q8_0: 33 elements is not a multiple of its 32-element block"
    );
    assert_eq!(
        BlockFormat::from_ggml_type(1).unwrap_err().to_string(),
        "ggml type 1 is not a supported block format"
    );
}

/// Quantize then dequantize random rows of several blocks: the error per element stays
/// within what each format's step allows (a sanity bound, not the reference test).
#[test]
fn round_trip_error_is_bounded_by_the_step() {
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut rand = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    // (format, largest |error| / largest |x| of a block)
    let bounds = [
        (BlockFormat::Q4_0, 0.126), // -max clamps to level 15: a whole step
        (BlockFormat::Q4_1, 0.07),
        (BlockFormat::Q5_0, 0.063),
        (BlockFormat::Q5_1, 0.035),
        (BlockFormat::Q8_0, 0.0045),
        (BlockFormat::Q8_1, 0.0045),
        (BlockFormat::Q2_K, 0.4),
        (BlockFormat::Q3_K, 0.25),
        (BlockFormat::Q4_K, 0.1),
        (BlockFormat::Q5_K, 0.05),
        (BlockFormat::Q6_K, 0.03),
        (BlockFormat::Q8_K, 0.0045),
    ];
    for (format, bound) in bounds {
        let k = 4 * 256;
        let x: Vec<f32> = (0..k).map(|_| rand()).collect();
        let mut q = vec![0u8; format.row_bytes(k).unwrap()];
        quantize_row(format, &x, &mut q).unwrap();
        let mut y = vec![0.0f32; k];
        dequantize_row(format, &q, &mut y).unwrap();
        let be = format.block_elems();
        for (xb, yb) in x.chunks(be).zip(y.chunks(be)) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let err = xb
                .iter()
                .zip(yb)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= bound * amax,
                "{format}: error {err} for block max {amax}"
            );
        }
    }
}
