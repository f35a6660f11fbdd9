//! Reading JSON config files field by field, with errors that name the file and field.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::SourceError;

/// Reads and parses a JSON file that must hold an object.
pub(crate) fn read_object(path: &Path) -> Result<Map<String, Value>, SourceError> {
    let text = std::fs::read_to_string(path).map_err(|source| SourceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(SourceError::BadField {
            path: path.to_path_buf(),
            field: "<root>".into(),
            reason: format!("expected a JSON object, found {}", kind(&other)),
        }),
        Err(source) => Err(SourceError::Json {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON object of a config file, read field by field. Fields are looked up under
/// several names (current transformers name first, then older ones); `null` counts as
/// absent, as transformers treats it.
pub(crate) struct Fields<'a> {
    pub path: &'a Path,
    pub obj: &'a Map<String, Value>,
    /// Prefix for field names in messages (`"text_config."`, `"rope_parameters."`).
    pub prefix: String,
    /// The architecture, for "missing field" messages.
    pub arch: String,
}

impl<'a> Fields<'a> {
    pub fn new(path: &'a Path, obj: &'a Map<String, Value>, arch: &str) -> Self {
        Fields {
            path,
            obj,
            prefix: String::new(),
            arch: arch.to_string(),
        }
    }

    /// The same file, looking inside the object field `key` (if it is one).
    pub fn nested(&self, key: &str) -> Result<Option<Fields<'a>>, SourceError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(Fields {
                path: self.path,
                obj,
                prefix: format!("{}{key}.", self.prefix),
                arch: self.arch.clone(),
            })),
            Some(other) => Err(self.bad(key, format!("expected an object, found {}", kind(other)))),
        }
    }

    fn path_buf(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    pub fn bad(&self, key: &str, reason: String) -> SourceError {
        SourceError::BadField {
            path: self.path_buf(),
            field: format!("{}{key}", self.prefix),
            reason,
        }
    }

    /// The first of `keys` present and not null, with its name.
    pub fn raw(&self, keys: &[&str]) -> Option<(&'a str, &'a Value)> {
        keys.iter().find_map(|&k| match self.obj.get_key_value(k) {
            Some((name, v)) if !v.is_null() => Some((name.as_str(), v)),
            _ => None,
        })
    }

    pub fn missing(&self, keys: &[&str]) -> SourceError {
        let p = &self.prefix;
        let field = match keys {
            [first, rest @ ..] if !rest.is_empty() => {
                let alts: Vec<String> = rest.iter().map(|k| format!("'{p}{k}'")).collect();
                format!("'{p}{first}' (or {})", alts.join(", "))
            }
            _ => format!("'{p}{}'", keys.first().unwrap_or(&"")),
        };
        SourceError::MissingField {
            path: self.path_buf(),
            field,
            architecture: self.arch.clone(),
        }
    }

    /// A non-negative integer (JSON `10` or `10.0`).
    pub fn usize(&self, keys: &[&str]) -> Result<Option<usize>, SourceError> {
        let Some((k, v)) = self.raw(keys) else {
            return Ok(None);
        };
        let n = v.as_u64().or_else(|| {
            v.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 2f64.powi(53))
                .map(|f| f as u64)
        });
        match n.and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => Err(self.bad(k, format!("expected a non-negative integer, found {v}"))),
        }
    }

    pub fn req_usize(&self, keys: &[&str]) -> Result<usize, SourceError> {
        self.usize(keys)?.ok_or_else(|| self.missing(keys))
    }

    pub fn f64(&self, keys: &[&str]) -> Result<Option<f64>, SourceError> {
        let Some((k, v)) = self.raw(keys) else {
            return Ok(None);
        };
        v.as_f64()
            .map(Some)
            .ok_or_else(|| self.bad(k, format!("expected a number, found {}", kind(v))))
    }

    pub fn bool(&self, keys: &[&str]) -> Result<Option<bool>, SourceError> {
        let Some((k, v)) = self.raw(keys) else {
            return Ok(None);
        };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| self.bad(k, format!("expected a bool, found {}", kind(v))))
    }

    pub fn str(&self, keys: &[&str]) -> Result<Option<&'a str>, SourceError> {
        let Some((k, v)) = self.raw(keys) else {
            return Ok(None);
        };
        v.as_str()
            .map(Some)
            .ok_or_else(|| self.bad(k, format!("expected a string, found {}", kind(v))))
    }

    /// A token id or a list of them (`eos_token_id: 1` or `[1, 106]`).
    pub fn ids(&self, keys: &[&str]) -> Result<Vec<u32>, SourceError> {
        let Some((k, v)) = self.raw(keys) else {
            return Ok(Vec::new());
        };
        let one = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
        let ids = match v {
            Value::Array(items) => items.iter().map(one).collect::<Option<Vec<_>>>(),
            other => one(other).map(|id| vec![id]),
        };
        ids.ok_or_else(|| {
            self.bad(
                k,
                format!("expected a token id or a list of them, found {v}"),
            )
        })
    }

    /// A list of strings (`layer_types`).
    pub fn strings(&self, keys: &[&str]) -> Result<Option<Vec<&'a str>>, SourceError> {
        let Some((k, v)) = self.raw(keys) else {
            return Ok(None);
        };
        let list = v
            .as_array()
            .and_then(|items| items.iter().map(Value::as_str).collect::<Option<Vec<_>>>());
        list.map(Some)
            .ok_or_else(|| self.bad(k, format!("expected a list of strings, found {v}")))
    }

    /// A list of non-negative integers (`mlp_only_layers`).
    pub fn usizes(&self, keys: &[&str]) -> Result<Option<Vec<usize>>, SourceError> {
        let Some((k, v)) = self.raw(keys) else {
            return Ok(None);
        };
        let list = v.as_array().and_then(|items| {
            items
                .iter()
                .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                .collect::<Option<Vec<_>>>()
        });
        list.map(Some)
            .ok_or_else(|| self.bad(k, format!("expected a list of integers, found {v}")))
    }
}
