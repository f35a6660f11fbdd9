//! Hand-written prost messages for the subset of `onnx.proto3` / `onnx-data.proto`
//! (onnx 1.23, IR version 14) that rafter needs.
//!
//! Field tags are copied from the upstream schema. Messages and fields that are
//! not declared here (training info, device configuration, sharding, ...) are
//! skipped by prost when decoding, so models that use them still parse.
//!
//! Layout follows the conventions of `prost-build` for proto3: singular scalars
//! are plain values (absent == default), singular messages are `Option<_>`,
//! enums are stored as `i32` with an `enumeration` hint, oneofs are
//! `Option<submodule::Enum>`.
//!
//! Large byte payloads (`TensorProto::raw_data`) are `bytes::Bytes`, so decoding
//! from a `Bytes` buffer (for example one wrapping a memory map) slices the
//! buffer instead of copying.

use bytes::Bytes;

/// A model: opsets, metadata and the main graph. (`onnx.ModelProto`)
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(string, tag = "3")]
    pub producer_version: String,
    #[prost(string, tag = "4")]
    pub domain: String,
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    #[prost(string, tag = "6")]
    pub doc_string: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
    /// Model-local functions.
    #[prost(message, repeated, tag = "25")]
    pub functions: Vec<FunctionProto>,
}

/// `(domain, version)` of an imported operator set. Empty domain == `ai.onnx`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorAnnotation {
    #[prost(string, tag = "1")]
    pub tensor_name: String,
    #[prost(message, repeated, tag = "2")]
    pub quant_parameter_tensor_names: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensorProto>,
    #[prost(string, tag = "10")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "14")]
    pub quantization_annotation: Vec<TensorAnnotation>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(string, tag = "7")]
    pub domain: String,
    #[prost(string, tag = "8")]
    pub overload: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    #[prost(string, tag = "6")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "9")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// Inside a function body: name of the function attribute this refers to.
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    #[prost(string, tag = "13")]
    pub doc_string: String,
    #[prost(enumeration = "attribute_proto::AttributeType", tag = "20")]
    pub r#type: i32,
    #[prost(float, tag = "2")]
    pub f: f32,
    #[prost(int64, tag = "3")]
    pub i: i64,
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    #[prost(message, optional, tag = "6")]
    pub g: Option<GraphProto>,
    #[prost(message, optional, tag = "22")]
    pub sparse_tensor: Option<SparseTensorProto>,
    #[prost(message, optional, tag = "14")]
    pub tp: Option<TypeProto>,
    #[prost(float, repeated, tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<GraphProto>,
    #[prost(message, repeated, tag = "23")]
    pub sparse_tensors: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub type_protos: Vec<TypeProto>,
}

pub mod attribute_proto {
    /// Which field of an [`AttributeProto`](super::AttributeProto) holds the value.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum AttributeType {
        Undefined = 0,
        Float = 1,
        Int = 2,
        String = 3,
        Tensor = 4,
        Graph = 5,
        SparseTensor = 11,
        TypeProto = 13,
        Floats = 6,
        Ints = 7,
        Strings = 8,
        Tensors = 9,
        Graphs = 10,
        SparseTensors = 12,
        TypeProtos = 14,
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    #[prost(string, tag = "3")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "4")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// A [`tensor_proto::DataType`] code.
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(message, optional, tag = "3")]
    pub segment: Option<tensor_proto::Segment>,
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// INT32, and bit patterns of INT16, INT8, UINT16, UINT8, BOOL, FLOAT16,
    /// BFLOAT16, FLOAT8*, (U)INT4 (packed), FLOAT4E2M1 (packed).
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(string, tag = "12")]
    pub doc_string: String,
    /// Little-endian packed element bytes. Zero-copy when decoded from `Bytes`.
    #[prost(bytes = "bytes", tag = "9")]
    pub raw_data: Bytes,
    /// Keys `location`, `offset`, `length`, `checksum` when
    /// `data_location == EXTERNAL`.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    #[prost(enumeration = "tensor_proto::DataLocation", tag = "14")]
    pub data_location: i32,
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// UINT64 and UINT32.
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

pub mod tensor_proto {
    /// ONNX element type codes (`TensorProto.DataType`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataType {
        Undefined = 0,
        Float = 1,
        Uint8 = 2,
        Int8 = 3,
        Uint16 = 4,
        Int16 = 5,
        Int32 = 6,
        Int64 = 7,
        String = 8,
        Bool = 9,
        Float16 = 10,
        Double = 11,
        Uint32 = 12,
        Uint64 = 13,
        Complex64 = 14,
        Complex128 = 15,
        Bfloat16 = 16,
        Float8e4m3fn = 17,
        Float8e4m3fnuz = 18,
        Float8e5m2 = 19,
        Float8e5m2fnuz = 20,
        Uint4 = 21,
        Int4 = 22,
        Float4e2m1 = 23,
        Float8e8m0 = 24,
        Uint2 = 25,
        Int2 = 26,
        Float6e2m3 = 27,
        Float6e3m2 = 28,
    }

    /// For very large tensors split across several `TensorProto`s.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Segment {
        #[prost(int64, tag = "1")]
        pub begin: i64,
        #[prost(int64, tag = "2")]
        pub end: i64,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataLocation {
        Default = 0,
        External = 1,
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseTensorProto {
    #[prost(message, optional, tag = "1")]
    pub values: Option<TensorProto>,
    #[prost(message, optional, tag = "2")]
    pub indices: Option<TensorProto>,
    #[prost(int64, repeated, tag = "3")]
    pub dims: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<tensor_shape_proto::Dimension>,
}

pub mod tensor_shape_proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        #[prost(string, tag = "3")]
        pub denotation: String,
        /// `None` means an unknown dimension.
        #[prost(oneof = "dimension::Value", tags = "1, 2")]
        pub value: Option<dimension::Value>,
    }

    pub mod dimension {
        #[derive(Clone, PartialEq, Eq, Hash, prost::Oneof)]
        pub enum Value {
            #[prost(int64, tag = "1")]
            DimValue(i64),
            #[prost(string, tag = "2")]
            DimParam(String),
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    #[prost(string, tag = "6")]
    pub denotation: String,
    #[prost(oneof = "type_proto::Value", tags = "1, 4, 5, 9, 8, 7")]
    pub value: Option<type_proto::Value>,
}

pub mod type_proto {
    use super::{TensorShapeProto, TypeProto};

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Tensor {
        /// A [`DataType`](super::tensor_proto::DataType) code.
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        /// `None` means unknown rank.
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sequence {
        #[prost(message, optional, boxed, tag = "1")]
        pub elem_type: Option<Box<TypeProto>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Map {
        #[prost(int32, tag = "1")]
        pub key_type: i32,
        #[prost(message, optional, boxed, tag = "2")]
        pub value_type: Option<Box<TypeProto>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Optional {
        #[prost(message, optional, boxed, tag = "1")]
        pub elem_type: Option<Box<TypeProto>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SparseTensor {
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Opaque {
        #[prost(string, tag = "1")]
        pub domain: String,
        #[prost(string, tag = "2")]
        pub name: String,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "1")]
        TensorType(Tensor),
        #[prost(message, tag = "4")]
        SequenceType(Sequence),
        #[prost(message, tag = "5")]
        MapType(Map),
        #[prost(message, tag = "9")]
        OptionalType(Optional),
        #[prost(message, tag = "8")]
        SparseTensorType(SparseTensor),
        #[prost(message, tag = "7")]
        OpaqueType(Opaque),
    }
}

/// A model-local function (`ModelProto.functions`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FunctionProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "4")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub output: Vec<String>,
    /// Names of attributes without defaults.
    #[prost(string, repeated, tag = "6")]
    pub attribute: Vec<String>,
    /// Attributes with default values.
    #[prost(message, repeated, tag = "11")]
    pub attribute_proto: Vec<AttributeProto>,
    #[prost(message, repeated, tag = "7")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "8")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "9")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "10")]
    pub domain: String,
    #[prost(string, tag = "13")]
    pub overload: String,
    #[prost(message, repeated, tag = "12")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

// ---- onnx-data.proto: containers used by the backend test data sets ----

#[derive(Clone, PartialEq, prost::Message)]
pub struct SequenceProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// A [`sequence_proto::DataType`] code.
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    #[prost(message, repeated, tag = "3")]
    pub tensor_values: Vec<TensorProto>,
    #[prost(message, repeated, tag = "4")]
    pub sparse_tensor_values: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "5")]
    pub sequence_values: Vec<SequenceProto>,
    #[prost(message, repeated, tag = "6")]
    pub map_values: Vec<MapProto>,
    #[prost(message, repeated, tag = "7")]
    pub optional_values: Vec<OptionalProto>,
}

pub mod sequence_proto {
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataType {
        Undefined = 0,
        Tensor = 1,
        SparseTensor = 2,
        Sequence = 3,
        Map = 4,
        Optional = 5,
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MapProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// A [`DataType`](tensor_proto::DataType) code (integer or string).
    #[prost(int32, tag = "2")]
    pub key_type: i32,
    #[prost(int64, repeated, tag = "3")]
    pub keys: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "4")]
    pub string_keys: Vec<Vec<u8>>,
    #[prost(message, optional, tag = "5")]
    pub values: Option<SequenceProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct OptionalProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// An [`optional_proto::DataType`] code.
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "3")]
    pub tensor_value: Option<TensorProto>,
    #[prost(message, optional, tag = "4")]
    pub sparse_tensor_value: Option<SparseTensorProto>,
    #[prost(message, optional, tag = "5")]
    pub sequence_value: Option<SequenceProto>,
    #[prost(message, optional, tag = "6")]
    pub map_value: Option<MapProto>,
    #[prost(message, optional, boxed, tag = "7")]
    pub optional_value: Option<Box<OptionalProto>>,
}

pub mod optional_proto {
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataType {
        Undefined = 0,
        Tensor = 1,
        SparseTensor = 2,
        Sequence = 3,
        Map = 4,
        Optional = 5,
    }
}

/// Name of an ONNX element type code as spelled in the schema
/// (`"FLOAT"`, `"FLOAT8E4M3FN"`, ...); `"UNKNOWN"` for codes outside it.
pub fn data_type_name(code: i32) -> &'static str {
    match code {
        0 => "UNDEFINED",
        1 => "FLOAT",
        2 => "UINT8",
        3 => "INT8",
        4 => "UINT16",
        5 => "INT16",
        6 => "INT32",
        7 => "INT64",
        8 => "STRING",
        9 => "BOOL",
        10 => "FLOAT16",
        11 => "DOUBLE",
        12 => "UINT32",
        13 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        16 => "BFLOAT16",
        17 => "FLOAT8E4M3FN",
        18 => "FLOAT8E4M3FNUZ",
        19 => "FLOAT8E5M2",
        20 => "FLOAT8E5M2FNUZ",
        21 => "UINT4",
        22 => "INT4",
        23 => "FLOAT4E2M1",
        24 => "FLOAT8E8M0",
        25 => "UINT2",
        26 => "INT2",
        27 => "FLOAT6E2M3",
        28 => "FLOAT6E3M2",
        _ => "UNKNOWN",
    }
}
