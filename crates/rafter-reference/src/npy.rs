//! Reading and writing NumPy `.npy` files (format versions 1 to 3, little-endian, C order).

use crate::Tensor;
use rafter_ir::DType;
use std::path::Path;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Why a `.npy` file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a .npy file: {msg}")]
    Format { path: String, msg: String },
    #[error("{path}: unsupported .npy dtype `{descr}` (rafter reads f2 f4 f8 i1 u1 i2 u2 i4 u4 i8 u8 b1, little-endian)")]
    Dtype { path: String, descr: String },
}

fn descr_of(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
        DType::I32 => "<i4",
        DType::U32 => "<u4",
        DType::I64 => "<i8",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
        DType::BF16 => return None,
    })
}

fn dtype_of(descr: &str) -> Option<DType> {
    let norm = descr.replace('=', "<");
    DType::ALL.into_iter().find(|&d| {
        descr_of(d).is_some_and(|s| s == norm || (s.starts_with('|') && s[1..] == norm[1..]))
    })
}

/// Value of `'key': value` in the header dict, up to the next top-level comma or brace.
fn header_field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else {
        rest.find([',', '}'])?
    };
    Some(rest[..end].trim())
}

/// Reads a `.npy` file into a tensor.
pub fn read_npy(path: &Path) -> Result<Tensor, NpyError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io {
        path: p.clone(),
        source,
    })?;
    parse_npy(&bytes).map_err(|e| match e {
        ParseFail::Format(msg) => NpyError::Format {
            path: p.clone(),
            msg,
        },
        ParseFail::Dtype(descr) => NpyError::Dtype {
            path: p.clone(),
            descr,
        },
    })
}

enum ParseFail {
    Format(String),
    Dtype(String),
}

fn parse_npy(bytes: &[u8]) -> Result<Tensor, ParseFail> {
    let fmt = |m: &str| ParseFail::Format(m.to_string());
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(fmt("missing \\x93NUMPY magic"));
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        ),
        v => return Err(ParseFail::Format(format!("unsupported format version {v}"))),
    };
    let header = bytes
        .get(hstart..hstart + hlen)
        .ok_or_else(|| fmt("header runs past the end of the file"))?;
    let header = std::str::from_utf8(header).map_err(|_| fmt("header is not text"))?;
    let descr = header_field(header, "descr")
        .ok_or_else(|| fmt("header has no 'descr'"))?
        .trim_matches('\'');
    let fortran = match header_field(header, "fortran_order") {
        Some("False") => false,
        Some("True") => true,
        _ => return Err(fmt("header's 'fortran_order' is neither True nor False")),
    };
    let shape_txt = header_field(header, "shape").ok_or_else(|| fmt("header has no 'shape'"))?;
    let dims: Vec<usize> = shape_txt
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|_| ParseFail::Format(format!("bad shape {shape_txt}")))
        })
        .collect::<Result<_, _>>()?;
    let dtype = dtype_of(descr).ok_or_else(|| ParseFail::Dtype(descr.to_string()))?;
    let payload = &bytes[hstart + hlen..];
    let c_order;
    let payload = if fortran {
        c_order = fortran_to_c(payload, &dims, dtype.size_of())
            .ok_or_else(|| fmt("payload is shorter than its shape"))?;
        &c_order[..]
    } else {
        payload
    };
    Tensor::from_le_bytes(dtype, &dims, payload)
        .map_err(|e| ParseFail::Format(format!("payload: {e}")))
}

/// Reorders a Fortran-order (first axis fastest) payload into C order (last axis
/// fastest): what `np.save` writes for a transposed array, read as the array it shows.
/// `None` if `payload` holds fewer than the shape's elements.
fn fortran_to_c(payload: &[u8], dims: &[usize], elem: usize) -> Option<Vec<u8>> {
    let count = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    let bytes = count.checked_mul(elem)?;
    let payload = payload.get(..bytes)?;
    // Fortran strides, in elements: axis 0 is contiguous.
    let mut strides = vec![1usize; dims.len()];
    for k in 1..dims.len() {
        strides[k] = strides[k - 1] * dims[k - 1];
    }
    let mut out = Vec::with_capacity(bytes);
    let mut index = vec![0usize; dims.len()];
    for _ in 0..count {
        let f: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out.extend_from_slice(&payload[f * elem..(f + 1) * elem]);
        // Next C-order index: the last axis counts fastest.
        for k in (0..dims.len()).rev() {
            index[k] += 1;
            if index[k] < dims[k] {
                break;
            }
            index[k] = 0;
        }
    }
    Some(out)
}

/// Serialises a tensor as `.npy` (version 1). bf16 has no NumPy dtype and is written as f32.
pub fn to_npy_bytes(t: &Tensor) -> Vec<u8> {
    let (descr, payload) = match t {
        Tensor::BF16(a) => (
            "<f4",
            a.iter().flat_map(|x| x.to_f32().to_le_bytes()).collect(),
        ),
        other => (
            descr_of(other.dtype()).expect("all but bf16 have a descr"),
            other.to_le_bytes(),
        ),
    };
    let shape = match t.shape() {
        [d] => format!("({d},)"),
        s => format!(
            "({})",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so that the payload starts on a 64-byte boundary, ending the header with '\n'.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Writes a tensor as a `.npy` file.
pub fn write_npy(path: &Path, t: &Tensor) -> std::io::Result<()> {
    std::fs::write(path, to_npy_bytes(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for t in [
            Tensor::f32s(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]),
            Tensor::i64s(&[4], vec![1, -2, 3, i64::MAX]),
            Tensor::i64s(&[], vec![7]),
            Tensor::from_le_bytes(DType::Bool, &[2], &[1, 0]).unwrap(),
        ] {
            let bytes = to_npy_bytes(&t);
            assert_eq!(
                (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
                0
            );
            match parse_npy(&bytes) {
                Ok(back) => assert_eq!(back, t),
                Err(_) => panic!("round trip failed"),
            }
        }
    }

    /// A file written by NumPy (the committed BERT fixture's inputs).
    #[test]
    fn reads_numpy_output() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/bert_tiny/seq7/input_ids.npy");
        let t = read_npy(&path).unwrap();
        assert_eq!((t.dtype(), t.shape()), (DType::I64, &[1usize, 7][..]));
    }

    /// Fortran-order files as NumPy writes them (`np.save` of `np.asfortranarray(a)` and of
    /// a transposed array; tests/fixtures/npy): read as the arrays they show.
    #[test]
    fn reads_fortran_order() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/npy");
        let t = read_npy(&dir.join("fortran_i32_2x3x4.npy")).unwrap();
        assert_eq!(
            t,
            Tensor::from_le_bytes(
                DType::I32,
                &[2, 3, 4],
                &(0..24i32).flat_map(i32::to_le_bytes).collect::<Vec<_>>()
            )
            .unwrap()
        );
        // np.arange(6).reshape(2, 3).T
        let t = read_npy(&dir.join("transposed_f32_3x2.npy")).unwrap();
        assert_eq!(t, Tensor::f32s(&[3, 2], vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
    }

    #[test]
    fn rejects_bad_files() {
        assert!(matches!(
            parse_npy(b"hello world!"),
            Err(ParseFail::Format(_))
        ));
        let mut b = to_npy_bytes(&Tensor::f32s(&[2], vec![1.0, 2.0]));
        b.pop();
        assert!(matches!(parse_npy(&b), Err(ParseFail::Format(m)) if m.contains("payload")));
        let mut d = to_npy_bytes(&Tensor::f32s(&[1], vec![1.0]));
        let pos = d.windows(3).position(|w| w == b"<f4").unwrap();
        d[pos..pos + 3].copy_from_slice(b"<c8");
        assert!(matches!(parse_npy(&d), Err(ParseFail::Dtype(s)) if s == "<c8"));
    }
}
