//! A hostile corpus: truncated, corrupted and malicious files. Each must give an error
//! naming the file, the byte offset and what is wrong, never a panic or a huge
//! allocation.

use rafter_gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter};

const NAME: &str = "hostile.gguf";

/// Builds raw GGUF bytes field by field, valid or not.
#[derive(Clone, Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
    }
    fn u8(mut self, v: u8) -> Raw {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(4).u32(v)
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    fn pad(mut self, align: usize) -> Raw {
        while self.0.len() % align != 0 {
            self.0.push(0);
        }
        self
    }
    fn zeros(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes_named(bytes.to_vec().into(), NAME)
}

/// The error for `bytes`, checked to name the file and the given offset, and to contain
/// every one of `what`.
#[track_caller]
fn expect_err(bytes: &[u8], offset: u64, what: &[&str]) -> GgufError {
    let e = match parse(bytes) {
        Ok(_) => panic!("accepted a bad file; expected an error containing {what:?}"),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("{NAME}: at byte {offset}: ")),
        "where: {msg}"
    );
    assert_eq!(e.offset(), Some(offset), "{msg}");
    for w in what {
        assert!(msg.contains(w), "expected {w:?} in: {msg}");
    }
    e
}

/// A valid file: two keys (one a string array), two tensors (the second with padding
/// after it).
fn valid() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add(
        "tokenizer.ggml.tokens",
        Array::from_strings(&["<s>", "a", "bc"]),
    )
    .unwrap();
    w.add_tensor("token_embd.weight", &[4, 3], GgmlType::F32, vec![1u8; 48])
        .unwrap();
    w.add_tensor("output_norm.weight", &[4], GgmlType::F16, vec![2u8; 8])
        .unwrap();
    w.to_vec().unwrap()
}

#[test]
fn valid_base_file_parses() {
    let f = parse(&valid()).unwrap();
    assert_eq!(f.tensors().len(), 2);
}

/// Every prefix of the valid file up to the end of its last tensor's data is rejected,
/// with the offset at or before the cut and the file named; at the field boundaries the
/// message names the field.
#[test]
fn truncated_at_every_byte() {
    let full = valid();
    let file = parse(&full).unwrap();
    let last = file.tensors().last().unwrap();
    let data_end = (last.data_start() + last.n_bytes()) as usize;
    for cut in 0..data_end {
        let e = match parse(&full[..cut]) {
            Ok(_) => panic!("prefix of {cut} bytes accepted"),
            Err(e) => e,
        };
        let msg = e.to_string();
        assert!(msg.starts_with(NAME), "{msg}");
        assert!(
            e.offset()
                .is_some_and(|o| o <= cut as u64 || msg.contains("past the end")),
            "{cut}: {msg}"
        );
    }
    // Field boundaries of the header and first key.
    let cases: &[(usize, u64, &str)] = &[
        (0, 0, "magic: needs 4 bytes but the file has only 0 left"),
        (3, 0, "magic"),
        (4, 4, "version: needs 4 bytes"),
        (8, 8, "tensor count: needs 8 bytes"),
        (16, 16, "metadata key-value count: needs 8 bytes"),
        (
            24,
            16,
            "metadata key-value count is 2, but even at 14 bytes each",
        ),
    ];
    for &(cut, offset, what) in cases {
        expect_err(&full[..cut], offset, &[what]);
    }
    // Cut inside the token array's third string, after the metadata count check passes.
    let arr_key = file.entry("tokenizer.ggml.tokens").unwrap().offset() as usize;
    let third = arr_key + 8 + 21 + 4 + 4 + 8 + (8 + 3) + (8 + 1);
    expect_err(
        &full[..third + 9],
        third as u64,
        &["'tokenizer.ggml.tokens': string #2", "needs 2 bytes"],
    );
    // Cut inside the second tensor's data.
    expect_err(
        &full[..data_end - 1],
        file.tensors()[1].info_offset() + 8 + 18 + 4 + 8 + 4,
        &[
            "tensor 'output_norm.weight'",
            "lie past the end of the file",
        ],
    );
}

/// Flipping any single byte of the header never panics; a flipped magic names it.
#[test]
fn flipped_bytes() {
    let full = valid();
    let file = parse(&full).unwrap();
    let header_end = file.data_offset() as usize;
    for i in 0..header_end {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut b = full.clone();
            b[i] ^= mask;
            if let Err(e) = parse(&b) {
                let msg = e.to_string();
                assert!(
                    msg.starts_with(NAME) && msg.len() > NAME.len() + 10,
                    "{msg}"
                );
            }
        }
    }
    let mut b = full.clone();
    b[1] = b'X';
    expect_err(&b, 0, &["not a GGUF file", "magic is [47, 58, 55, 46]"]);
}

#[test]
fn huge_tensor_count() {
    let raw = Raw::header(3, u64::MAX, 0);
    expect_err(
        &raw.0,
        8,
        &[
            "tensor count is 18446744073709551615",
            "24 bytes each",
            "0 bytes left",
        ],
    );
}

#[test]
fn huge_kv_count() {
    let raw = Raw::header(3, 0, 1 << 40).kv_u32("a", 1);
    expect_err(&raw.0, 16, &["metadata key-value count is 1099511627776"]);
}

#[test]
fn huge_array_length() {
    let raw = Raw::header(3, 0, 1)
        .str("tokenizer.ggml.tokens")
        .u32(9)
        .u32(8)
        .u64(u64::MAX / 2);
    let at = (raw.len() - 8) as u64;
    expect_err(
        &raw.0,
        at,
        &[
            "'tokenizer.ggml.tokens': array length is 9223372036854775807",
            "8 bytes each",
        ],
    );
    let raw = Raw::header(3, 0, 1)
        .str("scores")
        .u32(9)
        .u32(6)
        .u64(1 << 62);
    let at = (raw.len() - 8) as u64;
    expect_err(
        &raw.0,
        at,
        &[
            "'scores': array length is 4611686018427387904",
            "4 bytes each",
        ],
    );
}

#[test]
fn huge_string_length() {
    let raw = Raw::header(3, 0, 1).u64(u64::MAX).bytes(b"key and more");
    expect_err(&raw.0, 32, &["metadata key #0 (18446744073709551615 bytes): needs 18446744073709551615 bytes but the file has only 12 left"]);
    let raw = Raw::header(3, 0, 1)
        .str("k")
        .u32(8)
        .u64(1 << 50)
        .bytes(b"short");
    expect_err(
        &raw.0,
        45,
        &[
            "metadata key 'k': str value (1125899906842624 bytes)",
            "only 5 left",
        ],
    );
}

#[test]
fn offset_past_the_end() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[8], 0, 1 << 20)
        .pad(32)
        .zeros(32);
    let field = (24 + 8 + 1 + 4 + 8 + 4) as u64;
    expect_err(
        &raw.0,
        field,
        &[
            "tensor 'w': data bytes 1048640..1048672",
            "past the end of the file (96 bytes)",
        ],
    );
    // An offset that overflows when added to the data start.
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[8], 0, u64::MAX - 31)
        .pad(32)
        .zeros(32);
    expect_err(&raw.0, field, &["tensor 'w'", "past the end"]);
}

#[test]
fn overlapping_tensors() {
    let raw = Raw::header(3, 2, 0)
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    let e = expect_err(
        &raw.0,
        24 + 8 + 1 + 4 + 8 + 4 + 8,
        &["tensors 'a'", "and 'b'", "overlap"],
    );
    assert!(
        e.to_string()
            .contains("'a' (data bytes 96..160) and 'b' (data bytes 128..160)"),
        "{e}"
    );
}

#[test]
fn unknown_tensor_type() {
    let type_at = (24 + 8 + 1 + 4 + 8) as u64;
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[8], 99, 0)
        .pad(32)
        .zeros(32);
    expect_err(&raw.0, type_at, &["tensor 'w': unknown ggml type id 99"]);
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[8], 31, 0)
        .pad(32)
        .zeros(32);
    expect_err(
        &raw.0,
        type_at,
        &["tensor 'w': ggml type 31 (Q4_0_4_4)", "repacks Q4_0"],
    );
}

#[test]
fn version_one_big_endian_and_future_versions() {
    expect_err(
        &Raw::header(1, 0, 0).0,
        4,
        &["GGUF version 1 is not supported", "versions 2 and 3 are"],
    );
    expect_err(
        &Raw::header(3u32.swap_bytes(), 0, 0).0,
        4,
        &["0x03000000", "big-endian"],
    );
    expect_err(&Raw::header(4, 0, 0).0, 4, &["unsupported GGUF version 4"]);
    expect_err(&Raw::header(0, 0, 0).0, 4, &["unsupported GGUF version 0"]);
    // Version 2 has the same layout as 3 and is accepted.
    assert_eq!(parse(&Raw::header(2, 0, 0).0).unwrap().version(), 2);
}

#[test]
fn misaligned_tensor_offset() {
    let raw = Raw::header(3, 1, 0)
        .tensor("w", &[4], 0, 8)
        .pad(32)
        .zeros(32);
    expect_err(
        &raw.0,
        24 + 8 + 1 + 4 + 8 + 4,
        &["tensor 'w': data offset 8 is not a multiple of the alignment 32"],
    );
}

#[test]
fn duplicate_key() {
    let raw = Raw::header(3, 0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2);
    expect_err(
        &raw.0,
        24 + 19,
        &["duplicate metadata key 'a.b' (first defined at byte 24)"],
    );
}

#[test]
fn duplicate_tensor_name() {
    let raw = Raw::header(3, 2, 0)
        .tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    expect_err(
        &raw.0,
        24 + 33,
        &["duplicate tensor name 'w' (first defined at byte 24)"],
    );
}

#[test]
fn empty_key() {
    let raw = Raw::header(3, 0, 1).str("").u32(4).u32(1).zeros(8);
    expect_err(&raw.0, 24, &["metadata key #0 is empty"]);
}

#[test]
fn invalid_value_type() {
    let raw = Raw::header(3, 0, 1).str("k").u32(13).u32(0).zeros(8);
    expect_err(&raw.0, 33, &["metadata key 'k': invalid value type id 13"]);
    let raw = Raw::header(3, 0, 1).str("k").u32(9).u32(77).u64(1).zeros(8);
    expect_err(&raw.0, 37, &["metadata key 'k': invalid value type id 77"]);
}

#[test]
fn invalid_bool() {
    let raw = Raw::header(3, 0, 1).str("k").u32(7).u8(2);
    expect_err(
        &raw.0,
        37,
        &["metadata key 'k': bool value 2 is neither 0 nor 1"],
    );
    let raw = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(7)
        .u64(3)
        .bytes(&[1, 0, 5]);
    expect_err(&raw.0, 51, &["metadata key 'k[2]': bool value 5"]);
}

#[test]
fn invalid_utf8() {
    let raw = Raw::header(3, 0, 1)
        .u64(2)
        .bytes(&[0xc3, 0x28])
        .u32(4)
        .u32(0);
    expect_err(&raw.0, 24, &["metadata key #0 is not valid UTF-8"]);
    let raw = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(8)
        .u64(2)
        .str("ok")
        .u64(1)
        .u8(0xff);
    expect_err(
        &raw.0,
        59,
        &["metadata key 'k': string #1 is not valid UTF-8"],
    );
}

#[test]
fn nesting_too_deep() {
    let mut raw = Raw::header(3, 0, 1).str("deep").u32(9);
    for _ in 0..20 {
        raw = raw.u32(9).u64(1);
    }
    raw = raw.u32(4).u64(0);
    let e = parse(&raw.0).unwrap_err().to_string();
    assert!(e.starts_with("hostile.gguf: at byte "), "{e}");
    assert!(
        e.contains(
            "metadata key 'deep[0][0][0][0][0][0][0][0]': arrays nested deeper than 8 levels"
        ),
        "{e}"
    );
}

#[test]
fn too_many_dims_and_huge_dims() {
    let raw = Raw::header(3, 1, 0).tensor("w", &[1, 1, 1, 1, 1], 0, 0);
    expect_err(
        &raw.0,
        24 + 9,
        &["tensor 'w': 5 dimensions, but ggml allows at most 4"],
    );
    let raw = Raw::header(3, 1, 0).tensor("w", &[u64::MAX], 0, 0);
    expect_err(
        &raw.0,
        24 + 13,
        &["tensor 'w': dimension 0 is 18446744073709551615, which exceeds i64::MAX"],
    );
    let raw = Raw::header(3, 1, 0).tensor("w", &[1 << 32, 1 << 32], 0, 0);
    expect_err(
        &raw.0,
        24 + 9,
        &["tensor 'w': element count of dims [4294967296, 4294967296] overflows i64"],
    );
    // Elements fit in i64 but bytes do not fit in u64.
    let raw = Raw::header(3, 1, 0).tensor("w", &[1 << 31, 1 << 31], 0, 0);
    expect_err(
        &raw.0,
        24 + 9,
        &["tensor 'w' (f32, dims [2147483648, 2147483648]): byte size overflows u64"],
    );
}

#[test]
fn row_not_a_whole_number_of_blocks() {
    let raw = Raw::header(3, 1, 0).tensor("w", &[100, 2], GgmlType::Q4_K.id(), 0);
    expect_err(
        &raw.0,
        24 + 9,
        &["tensor 'w' (q4_K): rows of 100 elements are not a whole number of 256-element blocks"],
    );
}

#[test]
fn bad_alignment() {
    let raw = Raw::header(3, 0, 1).kv_u32("general.alignment", 48);
    expect_err(
        &raw.0,
        24,
        &["'general.alignment' is 48, which is not a non-zero power of two"],
    );
    let raw = Raw::header(3, 0, 1).kv_u32("general.alignment", 0);
    expect_err(&raw.0, 24, &["'general.alignment' is 0"]);
    let raw = Raw::header(3, 0, 1)
        .str("general.alignment")
        .u32(10)
        .u64(32);
    expect_err(
        &raw.0,
        24,
        &["'general.alignment' must be a u32 but holds u64"],
    );
}

/// Alignment applies to the data section start too: with alignment 256 a tensor at offset
/// 0 starts at 256, and a file that ends before it is rejected.
#[test]
fn data_section_uses_custom_alignment() {
    let raw = Raw::header(3, 1, 1)
        .kv_u32("general.alignment", 256)
        .tensor("w", &[4], 0, 0)
        .pad(32)
        .zeros(16);
    // Header 24 + alignment entry (8 + 17 + 4 + 4) = 57; the offset field is 25 bytes in.
    expect_err(&raw.0, 57 + 25, &["tensor 'w'", "data bytes 256..272"]);
}
