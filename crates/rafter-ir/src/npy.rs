//! NumPy `.npy` files (format versions 1 to 3, little-endian, C order) as a dtype, dims and
//! packed little-endian element bytes: the codec every tensor type of the project reads and
//! writes through (the reference executor's, the runtime's).

use crate::DType;
use std::borrow::Cow;
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

/// Reads a `.npy` file: its dtype, dims and payload (the packed little-endian elements;
/// its length is checked against the dims).
pub fn read(path: &Path) -> Result<(DType, Vec<usize>, Vec<u8>), NpyError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io {
        path: p.clone(),
        source,
    })?;
    let (dtype, dims, payload) = parse(&bytes).map_err(|e| match e {
        ParseFail::Format(msg) => NpyError::Format {
            path: p.clone(),
            msg,
        },
        ParseFail::Dtype(descr) => NpyError::Dtype {
            path: p.clone(),
            descr,
        },
    })?;
    Ok((dtype, dims, payload.into_owned()))
}

/// Why bytes are not a `.npy` file this codec reads.
#[derive(Debug)]
pub enum ParseFail {
    /// Not the format (magic, header, fortran order, payload length).
    Format(String),
    /// A dtype the IR does not have (the descr).
    Dtype(String),
}

/// A parsed `.npy` file: dtype, dims and the payload in C order.
pub type Parsed<'a> = (DType, Vec<usize>, Cow<'a, [u8]>);

/// Parses a `.npy` file's bytes: dtype, dims and the payload in C order (borrowed; a
/// Fortran-order file's, what `np.save` writes for a transposed array, is reordered), whose
/// length is checked against them.
pub fn parse(bytes: &[u8]) -> Result<Parsed<'_>, ParseFail> {
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
    let want = dims
        .iter()
        .try_fold(dtype.size_of(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| fmt("the shape's size overflows"))?;
    if payload.len() != want {
        return Err(ParseFail::Format(format!(
            "payload: {dtype} tensor of shape {dims:?} needs {want} bytes, got {}",
            payload.len()
        )));
    }
    if fortran {
        let c_order = fortran_to_c(payload, &dims, dtype.size_of());
        return Ok((dtype, dims, Cow::Owned(c_order)));
    }
    Ok((dtype, dims, Cow::Borrowed(payload)))
}

/// Reorders a Fortran-order payload (first axis fastest) into C order (last axis fastest);
/// `payload` holds exactly the shape's elements of `elem` bytes.
fn fortran_to_c(payload: &[u8], dims: &[usize], elem: usize) -> Vec<u8> {
    let count: usize = dims.iter().product();
    // Fortran strides, in elements: axis 0 is contiguous.
    let mut strides = vec![1usize; dims.len()];
    for k in 1..dims.len() {
        strides[k] = strides[k - 1] * dims[k - 1];
    }
    let mut out = Vec::with_capacity(payload.len());
    let mut index = vec![0usize; dims.len()];
    for _ in 0..count {
        let f: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out.extend_from_slice(&payload[f * elem..(f + 1) * elem]);
        // The next C-order index: the last axis counts fastest.
        for k in (0..dims.len()).rev() {
            index[k] += 1;
            if index[k] < dims[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

/// A `.npy` file (version 1) of a `dtype` tensor of `dims` with payload `le_bytes`. bf16
/// has no NumPy dtype and is written as f32.
pub fn encode(dtype: DType, dims: &[usize], le_bytes: &[u8]) -> Vec<u8> {
    let (descr, widened);
    let payload: &[u8] = match descr_of(dtype) {
        Some(d) => {
            descr = d;
            le_bytes
        }
        None => {
            // bf16: the upper half of an f32.
            descr = "<f4";
            widened = le_bytes
                .chunks_exact(2)
                .flat_map(|c| [0, 0, c[0], c[1]])
                .collect::<Vec<u8>>();
            &widened
        }
    };
    let shape = match dims {
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
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_aligned_payloads() {
        let cases: [(DType, &[usize], Vec<u8>); 3] = [
            (DType::F32, &[2, 3], (0..24).collect()),
            (DType::I64, &[], (0..8).collect()),
            (DType::Bool, &[2], vec![1, 0]),
        ];
        for (dtype, dims, payload) in cases {
            let bytes = encode(dtype, dims, &payload);
            assert_eq!(
                (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
                0
            );
            let (d, s, p) = parse(&bytes).unwrap();
            assert_eq!((d, s.as_slice(), &p[..]), (dtype, dims, &payload[..]));
        }
        // bf16 is widened to f32.
        let one = half::bf16::from_f32(1.5).to_le_bytes();
        let file = encode(DType::BF16, &[1], &one);
        let (d, _, p) = parse(&file).unwrap();
        assert_eq!((d, &p[..]), (DType::F32, &1.5f32.to_le_bytes()[..]));
    }

    #[test]
    fn rejects_bad_files() {
        assert!(matches!(parse(b"hello world!"), Err(ParseFail::Format(_))));
        let mut b = encode(DType::F32, &[2], &[0; 8]);
        b.pop();
        assert!(matches!(parse(&b), Err(ParseFail::Format(m)) if m.contains("payload")));
        let mut d = encode(DType::F32, &[1], &[0; 4]);
        let pos = d.windows(3).position(|w| w == b"<f4").unwrap();
        d[pos..pos + 3].copy_from_slice(b"<c8");
        assert!(matches!(parse(&d), Err(ParseFail::Dtype(s)) if s == "<c8"));
    }
}
