//! `json.dumps` as Python writes it, for the `tojson` filter of chat templates.
//!
//! transformers replaces Jinja's `tojson` with `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)`; templates print tool schemas and tool-call arguments
//! through it, so the model sees Python's spacing (`{"a": 1, "b": [1, 2]}`), float spelling
//! (`1.0`, `1e-05`) and escapes, which serde_json's compact output does not give.

use serde_json::Value;

/// Options of Python's `json.dumps` that templates pass.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    /// `indent`: None for one line, else the string repeated per level (an int n is n spaces).
    pub indent: Option<String>,
    /// `separators` (item, key); default `(", ", ": ")`, or `(",", ": ")` with an indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

/// `json.dumps(value, ...)`.
pub fn dumps(value: &Value, opts: &DumpOptions) -> String {
    let (item, key) = opts.separators.clone().unwrap_or_else(|| {
        let item = if opts.indent.is_some() { "," } else { ", " };
        (item.to_string(), ": ".to_string())
    });
    let mut out = String::new();
    write_value(&mut out, value, opts, &item, &key, 0);
    out
}

fn newline(out: &mut String, opts: &DumpOptions, level: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_value(
    out: &mut String,
    v: &Value,
    opts: &DumpOptions,
    item: &str,
    key: &str,
    level: usize,
) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                out.push_str(&py_float(f));
            } else {
                out.push_str(&n.to_string());
            }
        }
        Value::String(s) => write_str(out, s, opts.ensure_ascii),
        Value::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                newline(out, opts, level + 1);
                write_value(out, x, opts, item, key, level + 1);
            }
            newline(out, opts, level);
            out.push(']');
        }
        Value::Object(m) => {
            if m.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                newline(out, opts, level + 1);
                write_str(out, k, opts.ensure_ascii);
                out.push_str(key);
                write_value(out, x, opts, item, key, level + 1);
            }
            newline(out, opts, level);
            out.push('}');
        }
    }
}

fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && (c as u32) > 0x7f => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-trip digits, positional for exponents in
/// [-4, 16), else `d.ddde±XX`.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let sci = format!("{f:e}"); // shortest digits: "-1.2345e-7"
    let (mant, exp) = sci
        .split_once('e')
        .expect("LowerExp always writes an exponent");
    let exp: i32 = exp.parse().expect("LowerExp writes an integer exponent");
    let (sign, mant) = mant.strip_prefix('-').map_or(("", mant), |m| ("-", m));
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let s = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        format!(
            "{sign}{m}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Expected strings are what CPython 3.11's json.dumps prints.
    #[test]
    fn spacing_matches_python() {
        let v = json!({"b": [1, 2.0, {"c": null}], "a": "x", "e": {}, "f": []});
        assert_eq!(
            dumps(&v, &DumpOptions::default()),
            r#"{"b": [1, 2.0, {"c": null}], "a": "x", "e": {}, "f": []}"#
        );
        let o = DumpOptions {
            indent: Some("  ".into()),
            sort_keys: true,
            ..Default::default()
        };
        assert_eq!(
            dumps(&json!({"b": [1, true], "a": {}}), &o),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    true\n  ]\n}"
        );
        let o = DumpOptions {
            separators: Some((",".into(), ":".into())),
            ..Default::default()
        };
        assert_eq!(dumps(&json!({"a": [1, 2]}), &o), r#"{"a":[1,2]}"#);
    }

    #[test]
    fn floats_are_spelt_as_python_does() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (-2.5e-7, "-2.5e-07"),
            (123.456, "123.456"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(py_float(f), s, "{f}");
        }
    }

    #[test]
    fn strings_escape_as_python_does() {
        let s = json!("a\"b\\c\nd\u{1}é😀");
        assert_eq!(
            dumps(&s, &DumpOptions::default()),
            "\"a\\\"b\\\\c\\nd\\u0001é😀\""
        );
        let o = DumpOptions {
            ensure_ascii: true,
            ..Default::default()
        };
        assert_eq!(
            dumps(&s, &o),
            "\"a\\\"b\\\\c\\nd\\u0001\\u00e9\\ud83d\\ude00\""
        );
    }
}
