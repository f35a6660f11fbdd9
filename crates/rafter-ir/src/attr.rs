//! Typed op attributes and their one generic form, used by the text format.
//!
//! Every op stores its attributes as typed Rust fields. To print and parse them without one
//! hand-written case per op, each field type converts to and from [`AttrValue`].

use crate::{DType, Graph};

/// A scalar of any dtype (ConstantOfShape's fill value, Pad's default).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Float(DType, f64),
    Int(DType, i64),
    UInt(DType, u64),
    Bool(bool),
}

impl Scalar {
    pub fn dtype(&self) -> DType {
        match *self {
            Scalar::Float(d, _) | Scalar::Int(d, _) | Scalar::UInt(d, _) => d,
            Scalar::Bool(_) => DType::Bool,
        }
    }

    /// The value as f64 (exact for floats and integers below 2^53).
    pub fn as_f64(&self) -> f64 {
        match *self {
            Scalar::Float(_, v) => v,
            Scalar::Int(_, v) => v as f64,
            Scalar::UInt(_, v) => v as f64,
            Scalar::Bool(b) => b as i64 as f64,
        }
    }
}

/// The untyped form of one attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Str(String),
    /// A keyword: an enum variant such as `max` or `half_pixel`.
    Word(String),
    DType(DType),
    Scalar(Scalar),
    Graph(Box<Graph>),
    /// An optional attribute that is absent.
    None,
}

impl AttrValue {
    /// A short name of the variant, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            AttrValue::Int(_) => "int",
            AttrValue::Float(_) => "float",
            AttrValue::Bool(_) => "bool",
            AttrValue::Ints(_) => "int list",
            AttrValue::Floats(_) => "float list",
            AttrValue::Str(_) => "string",
            AttrValue::Word(_) => "keyword",
            AttrValue::DType(_) => "dtype",
            AttrValue::Scalar(_) => "scalar",
            AttrValue::Graph(_) => "graph",
            AttrValue::None => "none",
        }
    }
}

/// A Rust type that can be an op attribute.
pub trait AttrType: Sized {
    fn to_attr(&self) -> AttrValue;
    fn from_attr(v: AttrValue) -> Result<Self, String>;
}

fn wrong(want: &str, got: &AttrValue) -> String {
    format!("expected {want}, found {}", got.kind())
}

impl AttrType for i64 {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Int(*self)
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Int(i) => Ok(i),
            other => Err(wrong("int", &other)),
        }
    }
}

impl AttrType for f32 {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Float(*self as f64)
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Float(f) => Ok(f as f32),
            AttrValue::Int(i) => Ok(i as f32),
            other => Err(wrong("float", &other)),
        }
    }
}

impl AttrType for bool {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Bool(*self)
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Bool(b) => Ok(b),
            other => Err(wrong("bool", &other)),
        }
    }
}

impl AttrType for Vec<i64> {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Ints(self.clone())
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Ints(v) => Ok(v),
            other => Err(wrong("int list", &other)),
        }
    }
}

impl AttrType for Vec<f32> {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Floats(self.iter().map(|&f| f as f64).collect())
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Floats(v) => Ok(v.into_iter().map(|f| f as f32).collect()),
            AttrValue::Ints(v) => Ok(v.into_iter().map(|f| f as f32).collect()),
            other => Err(wrong("float list", &other)),
        }
    }
}

impl AttrType for Vec<f64> {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Floats(self.clone())
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Floats(v) => Ok(v),
            AttrValue::Ints(v) => Ok(v.into_iter().map(|f| f as f64).collect()),
            other => Err(wrong("float list", &other)),
        }
    }
}

impl AttrType for String {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Str(self.clone())
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Str(s) => Ok(s),
            other => Err(wrong("string", &other)),
        }
    }
}

impl AttrType for DType {
    fn to_attr(&self) -> AttrValue {
        AttrValue::DType(*self)
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::DType(d) => Ok(d),
            other => Err(wrong("dtype", &other)),
        }
    }
}

impl AttrType for Scalar {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Scalar(*self)
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Scalar(s) => Ok(s),
            other => Err(wrong("scalar", &other)),
        }
    }
}

impl AttrType for Box<Graph> {
    fn to_attr(&self) -> AttrValue {
        AttrValue::Graph(self.clone())
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::Graph(g) => Ok(g),
            other => Err(wrong("graph", &other)),
        }
    }
}

impl<T: AttrType> AttrType for Option<T> {
    fn to_attr(&self) -> AttrValue {
        match self {
            Some(v) => v.to_attr(),
            None => AttrValue::None,
        }
    }
    fn from_attr(v: AttrValue) -> Result<Self, String> {
        match v {
            AttrValue::None => Ok(None),
            other => T::from_attr(other).map(Some),
        }
    }
}

/// Declares a fieldless enum used as an attribute, with its text-format keywords.
#[macro_export]
macro_rules! attr_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $word:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant),* }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The text-format keyword.
            pub fn word(self) -> &'static str {
                match self { $($name::$variant => $word),* }
            }

            pub fn from_word(w: &str) -> Option<$name> {
                match w { $($word => Some($name::$variant),)* _ => None }
            }
        }

        impl $crate::attr::AttrType for $name {
            fn to_attr(&self) -> $crate::attr::AttrValue {
                $crate::attr::AttrValue::Word(self.word().to_string())
            }
            fn from_attr(v: $crate::attr::AttrValue) -> Result<Self, String> {
                match v {
                    $crate::attr::AttrValue::Word(w) => $name::from_word(&w).ok_or_else(|| {
                        format!("unknown {} `{w}`", stringify!($name))
                    }),
                    other => Err(format!("expected {}, found {}", stringify!($name), other.kind())),
                }
            }
        }
    };
}
