//! Element types, value types and small constants.

use bytes::Bytes;
use rafter_ir::{sanitize_identifier, ConstData, DType, Dim, Scalar, TensorType};
use rafter_onnx_proto::tensor_shape_proto::dimension;
use rafter_onnx_proto::{data_type_name, type_proto, ValueInfoProto};

/// The IR dtype of an ONNX element type code, or an error text naming the ONNX type. Public
/// so that readers of ONNX tensor files (the conformance runner, tests) map types exactly
/// as the importer does.
pub fn dtype_from_onnx(code: i32) -> Result<DType, String> {
    Ok(match code {
        1 => DType::F32,
        2 => DType::U8,
        3 => DType::I8,
        4 => DType::U16,
        5 => DType::I16,
        6 => DType::I32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        12 => DType::U32,
        13 => DType::U64,
        16 => DType::BF16,
        0 => return Err("element type is undefined".into()),
        other => {
            return Err(format!(
                "element type {} is not supported",
                data_type_name(other)
            ))
        }
    })
}

/// The type of a graph input from its declaration. Dims with a `dim_param` become that
/// symbol (sanitized); dims with neither value nor param become `<input>_d<i>`.
pub(crate) fn value_info_type(vi: &ValueInfoProto) -> Result<TensorType, String> {
    let Some(ty) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err("has no type".into());
    };
    let t = match ty {
        type_proto::Value::TensorType(t) => t,
        type_proto::Value::SequenceType(_) => {
            return Err("sequence values are not supported (only tensors)".into())
        }
        type_proto::Value::MapType(_) => {
            return Err("map values are not supported (only tensors)".into())
        }
        type_proto::Value::OptionalType(_) => {
            return Err("optional values are not supported (only tensors)".into())
        }
        type_proto::Value::SparseTensorType(_) => {
            return Err("sparse tensors are not supported".into())
        }
        type_proto::Value::OpaqueType(_) => return Err("opaque values are not supported".into()),
    };
    let dtype = dtype_from_onnx(t.elem_type)?;
    let Some(shape) = &t.shape else {
        return Err("has unknown rank (rafter needs every input's rank)".into());
    };
    let dims = shape
        .dim
        .iter()
        .enumerate()
        .map(|(i, d)| match &d.value {
            Some(dimension::Value::DimValue(v)) if *v >= 0 => Dim::known(*v),
            Some(dimension::Value::DimParam(p)) if !p.is_empty() => {
                Dim::symbol(&sanitize_identifier(p))
            }
            _ => Dim::symbol(&sanitize_identifier(&format!("{}_d{i}", vi.name))),
        })
        .collect();
    Ok(TensorType::new(dtype, dims))
}

/// Every symbol name a value declaration introduces (to keep fresh symbols distinct).
pub(crate) fn declared_symbols(vi: &ValueInfoProto) -> Vec<String> {
    match value_info_type(vi) {
        Ok(t) => t
            .dims
            .iter()
            .flat_map(|d| d.symbols())
            .map(|s| s.name().to_string())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Packs `values` (given as f64) into little-endian elements of `dtype`.
pub(crate) fn pack_f64s(dtype: DType, values: &[f64]) -> Bytes {
    let mut out = Vec::with_capacity(values.len() * dtype.size_of());
    for &v in values {
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            DType::I8 => out.push(v as i8 as u8),
            DType::U8 => out.push(v as u8),
            DType::I16 => out.extend_from_slice(&(v as i16).to_le_bytes()),
            DType::U16 => out.extend_from_slice(&(v as u16).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            DType::U64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
            DType::Bool => out.push((v != 0.0) as u8),
        }
    }
    Bytes::from(out)
}

/// A 0-D constant of `dtype` holding `v`.
pub(crate) fn scalar_const(dtype: DType, v: f64) -> ConstData {
    ConstData {
        dtype,
        dims: vec![],
        bytes: pack_f64s(dtype, &[v]),
    }
}

/// The first element of a constant as a [`Scalar`] of its dtype.
pub(crate) fn first_scalar(c: &ConstData) -> Option<Scalar> {
    if c.num_elements() == 0 {
        return None;
    }
    let d = c.dtype;
    Some(if d.is_float() {
        Scalar::Float(d, c.to_f64s()[0])
    } else if d == DType::Bool {
        Scalar::Bool(c.bytes[0] != 0)
    } else if d == DType::U64 {
        Scalar::UInt(d, u64::from_le_bytes(c.bytes[..8].try_into().ok()?))
    } else if d.is_unsigned_int() {
        Scalar::UInt(d, c.to_i64s()?[0] as u64)
    } else {
        Scalar::Int(d, c.to_i64s()?[0])
    })
}

/// Resolves a possibly negative axis against a rank.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Result<i64, String> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(if axis < 0 { axis + r } else { axis })
}

pub(crate) fn norm_axes(axes: &[i64], rank: usize) -> Result<Vec<i64>, String> {
    axes.iter().map(|&a| norm_axis(a, rank)).collect()
}
