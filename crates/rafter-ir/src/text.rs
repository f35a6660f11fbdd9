//! The text format: prints and parses a whole [`Graph`].
//!
//! [`print_graph`] writes a graph that [`parse_graph`] reads back to an equal graph (same
//! values in the same order, same nodes, constants byte for byte, same inputs and outputs),
//! for every graph that passes [`crate::verify()`]. The format is also meant to be written by
//! hand in tests:
//!
//! ```text
//! graph @main(%x: f32[batch, seq, 32], %mask: i64[batch, seq]) -> (%y, %x) {
//!   const %w: f32[2, 2] = dense [1.0, 2.0, 3.0, 4.0]
//!   const %big: f32[4096] = hex "0000803f0000803f..."
//!   %t0: f32[batch, seq, 32] = binary{op = add}(%x, %w) @add_0
//!   %a: f32[batch, seq], _, %c: i64[] = layer_norm{axis = -1, epsilon = 1e-5}(%t0, %w, _)
//!   %y: f32[] = if{then_branch = graph @then(%v: f32[]) -> (%v) {
//!   }, else_branch = graph @else(%v: f32[]) -> (%u) {
//!     %u: f32[] = unary{op = neg}(%v)
//!   }}(%cond, %a)
//! }
//! ```
//!
//! # Grammar
//!
//! Whitespace (newlines included) only separates tokens; `//` starts a comment that runs to
//! the end of the line.
//!
//! ```text
//! graph      := 'graph' '@' name '(' [def {',' def}] ')' '->' '(' [ref {',' ref}] ')'
//!               ['states' '(' [ref '->' ref {',' ref '->' ref}] ')'] '{' {stmt} '}'
//! stmt       := 'const' (def {',' def} | '_') '=' data
//!             | [result {',' result} '='] op ['{' [attr {',' attr}] '}']
//!               '(' [operand {',' operand}] ')' ['@' name]
//! def        := value ':' type            // defines a value
//! ref        := value                     // uses a value
//! result     := def | '_'                 // `_`: an unused optional result
//! operand    := ref | '_'                 // `_`: an absent optional operand
//! value      := '%' name ['#' id] | '%' '#' id
//! name       := bare | string             // bare: [A-Za-z0-9_.:/-]+, no `//`, not ending in `:`
//! type       := dtype '[' [dim {',' dim}] ']'                     // f32[batch, seq + 1, 768]
//! dim        := ['-'] term {('+' | '-') term};  term := factor {'*' factor}
//! factor     := integer | symbol | '(' dim ')' | '-' factor
//! data       := 'dense' ['<' dtype ['[' dims ']'] '>'] '[' [elem {',' elem}] ']'
//!             | 'hex' ['<' dtype ['[' dims ']'] '>'] string   // raw little-endian bytes
//! elem       := number | 'inf' | '-inf' | 'nan' | 'true' | 'false'   // row-major, flat
//! attr       := ident '=' attr_value
//! attr_value := integer | float | 'true' | 'false' | '[' [number {',' number}] ']'
//!             | string | word | dtype | dtype scalar_literal | graph
//! ```
//!
//! Details:
//!
//! * **Value ids.** Values are numbered in the order the text defines them: the graph's
//!   inputs, then the results of `const` and node statements from top to bottom. A
//!   definition may carry an explicit id (`%x#7: f32[]`), and one without takes the id
//!   after the previous definition's (so ids need only be written where the numbering
//!   jumps); the printer writes them there, and on every value whose name is empty or
//!   shared by several values of the graph. The ids of a graph must be exactly `0..n`.
//!   References to values with empty or shared names carry the id too (`%x#7`, or `%#7`
//!   for an empty name); a plain `%x` must name exactly one value.
//!   Each graph (subgraphs included) has its own values; subgraphs see no outer names.
//!   References are resolved after the whole graph is read, so outputs and operands may
//!   name values defined further down.
//! * **Constants** take their dtype and dims from the first defined value's type unless the
//!   data says otherwise (`dense<f32[3]>`); `const _ = ...` is a constant no value names.
//!   The printer writes up to [`DENSE_LIMIT`] elements as a flat list (floats exactly:
//!   `{:?}` of the element; f16/bf16 through their exact f32 value), larger constants and
//!   ones a list cannot hold exactly (NaNs other than the default one, bools other than
//!   0/1) as `hex`.
//! * **Attributes** absent from the braces are [`AttrValue::None`]; the printer leaves out
//!   `None` ones and the braces when there is nothing to print. Integers print as `3`,
//!   floats always with a `.` or an exponent (`1.0`, `1e-7`, `inf`, `-inf`, `nan`), so a
//!   list of floats stays floats; `[]` reads back as an empty int list (float-list
//!   attributes accept it). Scalars print as `f32 1.5`, `i64 -3`, `u8 7`, `bool true`: a
//!   float literal gives [`Scalar::Float`], an integer gives the variant that fits the
//!   dtype.
//! * **States** (`states(%present -> %past)`) name a graph output that the next call
//!   receives as a graph input ([`crate::StateLink`]).
//! * **Node names** follow the operands as `@name`; an empty name is left out.
//!
//! [`print_graph_elided`] prints constants above [`DENSE_LIMIT`] elements as
//! `dense elided` for people to read; its output does not parse.

use crate::attr::{AttrValue, Scalar};
use crate::{ConstData, ConstId, DType, Dim, Graph, Node, NodeId, Op, TensorType, Value};
use crate::{ValueDef, ValueId};
use bytes::Bytes;
use half::{bf16, f16};
use std::collections::HashMap;
use std::fmt::Write as _;

/// Constants with more elements than this print as `hex` (or `elided`), not as a list.
pub const DENSE_LIMIT: usize = 64;

/// Why text is not a valid graph: where (1-based line and column, in characters) and what
/// was expected and found there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

// ---------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------

/// Prints `g` in the text format; [`parse_graph`] reads it back to an equal graph.
pub fn print_graph(g: &Graph) -> String {
    let mut p = Printer {
        out: String::new(),
        elide: false,
    };
    p.graph(g, 0);
    p.out.push('\n');
    p.out
}

/// Prints `g` for people: like [`print_graph`], but constants with more than
/// [`DENSE_LIMIT`] elements print as `dense elided`. The result does not parse.
pub fn print_graph_elided(g: &Graph) -> String {
    let mut p = Printer {
        out: String::new(),
        elide: true,
    };
    p.graph(g, 0);
    p.out.push('\n');
    p.out
}

/// Whether a name prints bare (`%input.1`, `@onnx::Add_3`) rather than quoted.
fn is_bare_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_name_char) && !s.contains("//") && !s.ends_with(':')
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':')
}

pub(crate) fn write_name(out: &mut String, s: &str) {
    if is_bare_name(s) {
        out.push_str(s);
    } else {
        write_string(out, s);
    }
}

pub(crate) fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `%name`, `%name#id`, `%#id` (empty name) or `%"odd name"#id`.
fn write_value_name(out: &mut String, name: &str, id: usize, tag: bool) {
    out.push('%');
    if !name.is_empty() {
        write_name(out, name);
    }
    if tag || name.is_empty() {
        let _ = write!(out, "#{id}");
    }
}

fn fmt_f64(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{v:?}")
    }
}

fn fmt_f32(v: f32) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{v:?}")
    }
}

fn const_type(c: &ConstData) -> TensorType {
    TensorType::new(
        c.dtype,
        c.dims.iter().map(|&d| Dim::known(d as i64)).collect(),
    )
}

/// Writes `c`'s data as `dense [...]` or `hex "..."` (with `<type>` when `explicit`; as
/// `dense elided` when `elide` and it is large): what follows `=` in a `const` statement.
pub(crate) fn write_const_data(out: &mut String, c: &ConstData, explicit: bool, elide: bool) {
    let dense = if c.num_elements() <= DENSE_LIMIT {
        dense_elements(c)
    } else {
        None
    };
    let elided = elide && c.num_elements() > DENSE_LIMIT;
    out.push_str(if dense.is_some() || elided {
        "dense"
    } else {
        "hex"
    });
    if explicit {
        let _ = write!(out, "<{}>", const_type(c));
    }
    if elided {
        out.push_str(" elided");
    } else if let Some(elems) = dense {
        out.push_str(" [");
        out.push_str(&elems.join(", "));
        out.push(']');
    } else {
        out.push_str(" \"");
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.reserve(2 * c.bytes.len() + 1);
        for &b in c.bytes.iter() {
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
        out.push('"');
    }
}

/// The elements of `c` as list items, or `None` when a list cannot hold them exactly.
fn dense_elements(c: &ConstData) -> Option<Vec<String>> {
    let w = c.dtype.size_of();
    let n = c.num_elements();
    if c.bytes.len() != n.checked_mul(w)? {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for e in c.bytes.chunks_exact(w) {
        let s = match c.dtype {
            DType::F32 => {
                let v = f32::from_le_bytes(e.try_into().unwrap());
                if v.is_nan() && v.to_bits() != f32::NAN.to_bits() {
                    return None;
                }
                fmt_f32(v)
            }
            DType::F64 => {
                let v = f64::from_le_bytes(e.try_into().unwrap());
                if v.is_nan() && v.to_bits() != f64::NAN.to_bits() {
                    return None;
                }
                fmt_f64(v)
            }
            DType::F16 => {
                let v = f16::from_le_bytes(e.try_into().unwrap());
                if v.is_nan() && v.to_bits() != f16::NAN.to_bits() {
                    return None;
                }
                fmt_f32(v.to_f32())
            }
            DType::BF16 => {
                let v = bf16::from_le_bytes(e.try_into().unwrap());
                if v.is_nan() && v.to_bits() != bf16::NAN.to_bits() {
                    return None;
                }
                fmt_f32(v.to_f32())
            }
            DType::I8 => (e[0] as i8).to_string(),
            DType::U8 => e[0].to_string(),
            DType::I16 => i16::from_le_bytes(e.try_into().unwrap()).to_string(),
            DType::U16 => u16::from_le_bytes(e.try_into().unwrap()).to_string(),
            DType::I32 => i32::from_le_bytes(e.try_into().unwrap()).to_string(),
            DType::U32 => u32::from_le_bytes(e.try_into().unwrap()).to_string(),
            DType::I64 => i64::from_le_bytes(e.try_into().unwrap()).to_string(),
            DType::U64 => u64::from_le_bytes(e.try_into().unwrap()).to_string(),
            DType::Bool => match e[0] {
                0 => "false".into(),
                1 => "true".into(),
                _ => return None,
            },
        };
        out.push(s);
    }
    Some(out)
}

/// One body statement, in printing order.
#[derive(Clone, Copy)]
enum Stmt {
    Const(usize),
    Node(usize),
}

/// How one graph's values print.
struct Names<'g> {
    g: &'g Graph,
    /// Definitions that need an explicit `#id`.
    tag_def: Vec<bool>,
    /// Values whose references need `#id` (empty or shared names).
    tag_ref: Vec<bool>,
}

impl Names<'_> {
    fn def(&self, out: &mut String, v: ValueId) {
        let i = v.0 as usize;
        match self.g.values.get(i) {
            Some(val) => {
                write_value_name(out, &val.name, i, self.tag_def[i]);
                let _ = write!(out, ": {}", val.ty);
            }
            None => {
                let _ = write!(out, "%#{i}: ?");
            }
        }
    }

    fn reference(&self, out: &mut String, v: ValueId) {
        let i = v.0 as usize;
        match self.g.values.get(i) {
            Some(val) => write_value_name(out, &val.name, i, self.tag_ref[i]),
            None => {
                let _ = write!(out, "%#{i}");
            }
        }
    }
}

struct Printer {
    out: String,
    elide: bool,
}

impl Printer {
    fn indent(&mut self, n: usize) {
        self.out.extend(std::iter::repeat_n(' ', n));
    }

    /// Prints `graph @name(...) -> (...) {`, the body indented by `indent + 2`, and the
    /// closing brace at `indent` (the caller has already positioned the first line).
    fn graph(&mut self, g: &Graph, indent: usize) {
        let n = g.values.len();
        let mut const_values: Vec<Vec<ValueId>> = vec![Vec::new(); g.constants.len()];
        for (i, v) in g.values.iter().enumerate() {
            if let ValueDef::Const(c) = v.def {
                if let Some(list) = const_values.get_mut(c.0 as usize) {
                    list.push(ValueId(i as u32));
                }
            }
        }
        let stmts = statement_order(g, &const_values);

        // Names shared by several values, or empty, need ids at every mention.
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for v in &g.values {
            *counts.entry(v.name.as_str()).or_insert(0) += 1;
        }
        let tag_ref: Vec<bool> = g
            .values
            .iter()
            .map(|v| v.name.is_empty() || counts[v.name.as_str()] > 1)
            .collect();
        // Definitions whose id differs from their position in the text need it there.
        let mut tag_def = tag_ref.clone();
        let mut next = 0usize;
        let mut place = |v: ValueId| {
            let i = v.0 as usize;
            if i != next && i < n {
                tag_def[i] = true;
            }
            next = i + 1;
        };
        g.inputs.iter().copied().for_each(&mut place);
        for s in &stmts {
            match *s {
                Stmt::Const(c) => const_values[c].iter().copied().for_each(&mut place),
                Stmt::Node(k) => g.nodes[k]
                    .outputs
                    .iter()
                    .flatten()
                    .copied()
                    .for_each(&mut place),
            }
        }
        let names = Names {
            g,
            tag_def,
            tag_ref,
        };

        self.out.push_str("graph @");
        write_name(&mut self.out, &g.name);
        self.out.push('(');
        for (i, &v) in g.inputs.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            names.def(&mut self.out, v);
        }
        self.out.push_str(") -> (");
        for (i, &v) in g.outputs.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            names.reference(&mut self.out, v);
        }
        self.out.push(')');
        if !g.states.is_empty() {
            self.out.push_str(" states(");
            for (i, st) in g.states.iter().enumerate() {
                if i > 0 {
                    self.out.push_str(", ");
                }
                // An unverified graph may hold stale indices: print `_` rather than panic.
                match g.outputs.get(st.output) {
                    Some(&v) => names.reference(&mut self.out, v),
                    None => self.out.push('_'),
                }
                self.out.push_str(" -> ");
                match g.inputs.get(st.input) {
                    Some(&v) => names.reference(&mut self.out, v),
                    None => self.out.push('_'),
                }
            }
            self.out.push(')');
        }
        self.out.push_str(" {\n");
        for s in stmts {
            self.indent(indent + 2);
            match s {
                Stmt::Const(c) => self.constant(&names, &g.constants[c], &const_values[c]),
                Stmt::Node(k) => self.node(&names, &g.nodes[k], indent + 2),
            }
            self.out.push('\n');
        }
        self.indent(indent);
        self.out.push('}');
    }

    fn constant(&mut self, names: &Names<'_>, c: &ConstData, vals: &[ValueId]) {
        self.out.push_str("const ");
        if vals.is_empty() {
            self.out.push('_');
        }
        for (i, &v) in vals.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            names.def(&mut self.out, v);
        }
        self.out.push_str(" = ");
        let explicit = match vals.first().and_then(|v| names.g.values.get(v.0 as usize)) {
            Some(v) => v.ty != const_type(c),
            None => true,
        };
        write_const_data(&mut self.out, c, explicit, self.elide);
    }

    fn node(&mut self, names: &Names<'_>, node: &Node, indent: usize) {
        for (i, o) in node.outputs.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            match o {
                Some(v) => names.def(&mut self.out, *v),
                None => self.out.push('_'),
            }
        }
        if !node.outputs.is_empty() {
            self.out.push_str(" = ");
        }
        self.out.push_str(node.op.name());
        let attrs: Vec<(&str, AttrValue)> = node
            .op
            .attrs()
            .into_iter()
            .filter(|(_, v)| !matches!(v, AttrValue::None))
            .collect();
        if !attrs.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in attrs.iter().enumerate() {
                if i > 0 {
                    self.out.push_str(", ");
                }
                self.out.push_str(k);
                self.out.push_str(" = ");
                self.attr(v, indent);
            }
            self.out.push('}');
        }
        self.out.push('(');
        for (i, o) in node.inputs.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            match o {
                Some(v) => names.reference(&mut self.out, *v),
                None => self.out.push('_'),
            }
        }
        self.out.push(')');
        if !node.name.is_empty() {
            self.out.push_str(" @");
            write_name(&mut self.out, &node.name);
        }
    }

    fn attr(&mut self, v: &AttrValue, indent: usize) {
        match v {
            AttrValue::Int(i) => {
                let _ = write!(self.out, "{i}");
            }
            AttrValue::Float(f) => self.out.push_str(&fmt_f64(*f)),
            AttrValue::Bool(b) => {
                let _ = write!(self.out, "{b}");
            }
            AttrValue::Ints(v) => {
                let items: Vec<String> = v.iter().map(|i| i.to_string()).collect();
                let _ = write!(self.out, "[{}]", items.join(", "));
            }
            AttrValue::Floats(v) => {
                let items: Vec<String> = v.iter().map(|&f| fmt_f64(f)).collect();
                let _ = write!(self.out, "[{}]", items.join(", "));
            }
            AttrValue::Str(s) => write_string(&mut self.out, s),
            AttrValue::Word(w) => self.out.push_str(w),
            AttrValue::DType(d) => self.out.push_str(d.name()),
            AttrValue::Scalar(s) => {
                let _ = match *s {
                    Scalar::Float(d, v) => write!(self.out, "{d} {}", fmt_f64(v)),
                    Scalar::Int(d, v) => write!(self.out, "{d} {v}"),
                    Scalar::UInt(d, v) => write!(self.out, "{d} {v}"),
                    Scalar::Bool(b) => write!(self.out, "bool {b}"),
                };
            }
            AttrValue::Graph(g) => self.graph(g, indent),
            AttrValue::None => self.out.push_str("none"),
        }
    }
}

/// Constants in table order and nodes in node order, merged so that values come out in id
/// order where the graph allows it (the order a builder created them in).
fn statement_order(g: &Graph, const_values: &[Vec<ValueId>]) -> Vec<Stmt> {
    let const_key: Vec<u32> = const_values
        .iter()
        .map(|vs| vs.iter().map(|v| v.0).min().unwrap_or(0))
        .collect();
    let node_key: Vec<u32> = g
        .nodes
        .iter()
        .map(|n| n.outputs.iter().flatten().map(|v| v.0).min().unwrap_or(0))
        .collect();
    let (mut ci, mut ni) = (0, 0);
    let mut out = Vec::with_capacity(const_key.len() + node_key.len());
    while ci < const_key.len() || ni < node_key.len() {
        if ci < const_key.len() && (ni >= node_key.len() || const_key[ci] < node_key[ni]) {
            out.push(Stmt::Const(ci));
            ci += 1;
        } else {
            out.push(Stmt::Node(ni));
            ni += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Lexing
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    /// Decimal digits, no sign.
    Int(String),
    /// Digits with a fraction or an exponent, no sign.
    Float(String),
    Str(String),
    /// `%name`, `%name#id`, `%#id`.
    Value(String, Option<u32>),
    /// `@name`.
    At(String),
    Punct(&'static str),
    Eof,
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
    col: usize,
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Ident(s) | Tok::Int(s) | Tok::Float(s) => format!("`{s}`"),
        Tok::Str(s) => {
            let short: String = s.chars().take(24).collect();
            let mut q = String::new();
            write_string(&mut q, &short);
            if short.len() < s.len() {
                q.pop();
                q.push_str("...\"");
            }
            format!("string {q}")
        }
        Tok::Value(name, id) => format!("`{}`", ref_text(name, *id)),
        Tok::At(name) => {
            let mut s = String::from("`@");
            write_name(&mut s, name);
            s.push('`');
            s
        }
        Tok::Punct(p) => format!("`{p}`"),
        Tok::Eof => "end of input".into(),
    }
}

struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    line: usize,
    col: usize,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek2(&self) -> Option<char> {
        let mut it = self.src[self.pos..].chars();
        it.next();
        it.next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn error(&self, line: usize, col: usize, message: String) -> ParseError {
        ParseError { line, col, message }
    }

    fn skip_trivia(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('/') if self.peek2() == Some('/') => {
                    while !matches!(self.peek(), None | Some('\n')) {
                        self.bump();
                    }
                }
                _ => return,
            }
        }
    }

    fn tokens(mut self) -> Result<Vec<Token>, ParseError> {
        let mut out = Vec::new();
        loop {
            self.skip_trivia();
            let (line, col) = (self.line, self.col);
            let Some(c) = self.peek() else {
                out.push(Token {
                    tok: Tok::Eof,
                    line,
                    col,
                });
                return Ok(out);
            };
            let tok = match c {
                c if c.is_ascii_alphabetic() || c == '_' => {
                    let mut s = String::new();
                    while let Some(c) = self
                        .peek()
                        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                    {
                        s.push(c);
                        self.bump();
                    }
                    Tok::Ident(s)
                }
                c if c.is_ascii_digit() => self.number()?,
                '"' => Tok::Str(self.string()?),
                '%' => {
                    self.bump();
                    let (name, quoted) = self.name()?;
                    let id = if self.peek() == Some('#') {
                        self.bump();
                        Some(self.id()?)
                    } else {
                        None
                    };
                    if name.is_empty() && !quoted && id.is_none() {
                        let found = self
                            .peek()
                            .map_or("end of input".into(), |c| format!("`{c}`"));
                        return Err(self.error(
                            self.line,
                            self.col,
                            format!("expected a value name after `%`, found {found}"),
                        ));
                    }
                    Tok::Value(name, id)
                }
                '@' => {
                    self.bump();
                    let (name, quoted) = self.name()?;
                    if name.is_empty() && !quoted {
                        let found = self
                            .peek()
                            .map_or("end of input".into(), |c| format!("`{c}`"));
                        return Err(self.error(
                            self.line,
                            self.col,
                            format!("expected a name after `@`, found {found}"),
                        ));
                    }
                    Tok::At(name)
                }
                '-' if self.peek2() == Some('>') => {
                    self.bump();
                    self.bump();
                    Tok::Punct("->")
                }
                _ => {
                    const PUNCT: [&str; 13] = [
                        "(", ")", "[", "]", "{", "}", "<", ">", ",", "=", ":", "*", "+",
                    ];
                    let p = if c == '-' {
                        "-"
                    } else {
                        match PUNCT.iter().find(|p| p.starts_with(c)) {
                            Some(p) => p,
                            None => {
                                return Err(self.error(
                                    line,
                                    col,
                                    format!("unexpected character `{}`", c.escape_debug()),
                                ))
                            }
                        }
                    };
                    self.bump();
                    Tok::Punct(p)
                }
            };
            out.push(Token { tok, line, col });
        }
    }

    fn digits(&mut self, s: &mut String) {
        while let Some(c) = self.peek().filter(char::is_ascii_digit) {
            s.push(c);
            self.bump();
        }
    }

    fn number(&mut self) -> Result<Tok, ParseError> {
        let (line, col) = (self.line, self.col);
        let mut s = String::new();
        let mut float = false;
        self.digits(&mut s);
        if self.peek() == Some('.') && self.peek2().is_some_and(|c| c.is_ascii_digit()) {
            float = true;
            s.push('.');
            self.bump();
            self.digits(&mut s);
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let mut it = self.src[self.pos..].chars().skip(1);
            let ok = match it.next() {
                Some('+' | '-') => it.next().is_some_and(|c| c.is_ascii_digit()),
                Some(c) => c.is_ascii_digit(),
                None => false,
            };
            if ok {
                float = true;
                s.push('e');
                self.bump();
                if let Some(sign @ ('+' | '-')) = self.peek() {
                    s.push(sign);
                    self.bump();
                }
                self.digits(&mut s);
            }
        }
        if let Some(c) = self
            .peek()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        {
            return Err(self.error(
                line,
                col,
                format!(
                    "malformed number: expected a digit or a separator after `{s}`, found `{c}`"
                ),
            ));
        }
        Ok(if float { Tok::Float(s) } else { Tok::Int(s) })
    }

    fn id(&mut self) -> Result<u32, ParseError> {
        let (line, col) = (self.line, self.col);
        let mut s = String::new();
        self.digits(&mut s);
        if s.is_empty() {
            let found = self
                .peek()
                .map_or("end of input".into(), |c| format!("`{c}`"));
            return Err(self.error(
                line,
                col,
                format!("expected a value id after `#`, found {found}"),
            ));
        }
        s.parse()
            .map_err(|_| self.error(line, col, format!("value id `{s}` is out of range")))
    }

    /// A bare or quoted name after `%` or `@`; returns whether it was quoted.
    fn name(&mut self) -> Result<(String, bool), ParseError> {
        if self.peek() == Some('"') {
            return Ok((self.string()?, true));
        }
        let rest = &self.src.as_bytes()[self.pos..];
        let mut end = 0;
        while end < rest.len()
            && is_name_char(rest[end] as char)
            && !(rest[end] == b'/' && rest.get(end + 1) == Some(&b'/'))
        {
            end += 1;
        }
        // `%x: f32[]`: the colon after a name separates it from its type.
        while end > 0 && rest[end - 1] == b':' {
            end -= 1;
        }
        let name = self.src[self.pos..self.pos + end].to_string();
        for _ in 0..end {
            self.bump();
        }
        Ok((name, false))
    }

    fn string(&mut self) -> Result<String, ParseError> {
        let (line, col) = (self.line, self.col);
        self.bump();
        let mut s = String::new();
        loop {
            let (el, ec) = (self.line, self.col);
            match self.bump() {
                None | Some('\n') => {
                    return Err(self.error(line, col, "unterminated string".into()));
                }
                Some('"') => return Ok(s),
                Some('\\') => match self.bump() {
                    Some('"') => s.push('"'),
                    Some('\\') => s.push('\\'),
                    Some('n') => s.push('\n'),
                    Some('t') => s.push('\t'),
                    Some('r') => s.push('\r'),
                    Some('0') => s.push('\0'),
                    Some('u') if self.peek() == Some('{') => {
                        self.bump();
                        let mut hex = String::new();
                        while let Some(c) = self.peek().filter(char::is_ascii_hexdigit) {
                            hex.push(c);
                            self.bump();
                        }
                        let c = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                        match (c, self.bump()) {
                            (Some(c), Some('}')) => s.push(c),
                            _ => {
                                return Err(self.error(
                                    el,
                                    ec,
                                    "malformed escape: expected `\\u{hex}` naming a character"
                                        .into(),
                                ))
                            }
                        }
                    }
                    other => {
                        let found = other.map_or("end of input".into(), |c| format!("`{c}`"));
                        return Err(self.error(
                            el,
                            ec,
                            format!(
                                "malformed escape: expected one of \\\" \\\\ \\n \\t \\r \\0 \\u{{..}}, found \\{found}"
                            ),
                        ));
                    }
                },
                Some(c) => s.push(c),
            }
        }
    }
}

fn lex(src: &str) -> Result<Vec<Token>, ParseError> {
    Lexer {
        src,
        pos: 0,
        line: 1,
        col: 1,
    }
    .tokens()
}

// ---------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------

/// Parses a graph written by [`print_graph`] or by hand.
pub fn parse_graph(src: &str) -> Result<Graph, ParseError> {
    let mut p = Parser::new(src)?;
    let g = p.graph()?;
    p.expect_eof()?;
    Ok(g)
}

/// Parses a dim expression: integers, symbols, `+`, `-`, `*` and parentheses
/// (`past + seq`, `2*(seq - 1)`, `768*batch*seq`). Reads back every [`Dim`]'s `Display`.
pub fn parse_dim(src: &str) -> Result<Dim, ParseError> {
    let mut p = Parser::new(src)?;
    let d = p.dim()?;
    p.expect_eof()?;
    Ok(d)
}

/// Parses a tensor type such as `f32[batch, seq, 768]` or `i64[]`.
pub fn parse_type(src: &str) -> Result<TensorType, ParseError> {
    let mut p = Parser::new(src)?;
    let t = p.ty()?;
    p.expect_eof()?;
    Ok(t)
}

/// A number literal with its sign; inf and nan are floats.
enum Num {
    Int(String),
    Float(String),
}

impl Num {
    fn is_float(&self) -> bool {
        matches!(self, Num::Float(_))
    }

    fn text(&self) -> &str {
        match self {
            Num::Int(s) | Num::Float(s) => s,
        }
    }

    fn to_f64(&self) -> f64 {
        match self.text() {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            "nan" => f64::NAN,
            t => t.parse().unwrap_or(f64::NAN),
        }
    }

    fn to_f32(&self) -> f32 {
        match self.text() {
            "inf" => f32::INFINITY,
            "-inf" => f32::NEG_INFINITY,
            "nan" => f32::NAN,
            t => t.parse().unwrap_or(f32::NAN),
        }
    }
}

/// A 1-based line and column.
pub(crate) type Pos = (usize, usize);

pub(crate) fn error_at(pos: Pos, message: String) -> ParseError {
    ParseError {
        line: pos.0,
        col: pos.1,
        message,
    }
}

/// A reference not yet resolved to an id.
struct RawRef {
    name: String,
    id: Option<u32>,
    pos: Pos,
}

struct RawDef {
    name: String,
    id: Option<u32>,
    ty: TensorType,
    def: ValueDef,
    pos: Pos,
}

struct RawNode {
    name: String,
    op: Op,
    inputs: Vec<Option<RawRef>>,
    /// Indices into the definitions.
    outputs: Vec<Option<usize>>,
}

/// One graph while it is being read.
#[derive(Default)]
struct GraphBuild {
    defs: Vec<RawDef>,
    inputs: Vec<usize>,
    outputs: Vec<RawRef>,
    /// `states(%out -> %in)` pairs as written: (output, input).
    states: Vec<(RawRef, RawRef)>,
    nodes: Vec<RawNode>,
    constants: Vec<ConstData>,
}

/// A value as written: `%x`, `%x#3`, `%#3`, `%""`.
fn ref_text(name: &str, id: Option<u32>) -> String {
    let mut s = String::new();
    match id {
        Some(id) => write_value_name(&mut s, name, id as usize, true),
        None if name.is_empty() => s.push_str("%\"\""),
        None => write_value_name(&mut s, name, 0, false),
    }
    s
}

impl GraphBuild {
    fn finish(self, name: String) -> Result<Graph, ParseError> {
        let n = self.defs.len();
        let mut ids = vec![0usize; n];
        let mut taken: Vec<Option<usize>> = vec![None; n];
        let mut next = 0usize;
        for (k, d) in self.defs.iter().enumerate() {
            let id = d.id.map_or(next, |i| i as usize);
            next = id + 1;
            if id >= n {
                return Err(error_at(
                    d.pos,
                    format!(
                        "expected a value id below {n} (this graph defines {n} values), found #{id}"
                    ),
                ));
            }
            if let Some(other) = taken[id] {
                let o = &self.defs[other];
                let how = if d.id.is_some() {
                    "explicit id"
                } else {
                    "implicit id, one past the previous definition's; give it an explicit `#id`"
                };
                return Err(error_at(
                    d.pos,
                    format!(
                        "value id #{id} of `{}` ({how}) is already taken by `{}` at {}:{}",
                        ref_text(&d.name, d.id),
                        ref_text(&o.name, o.id),
                        o.pos.0,
                        o.pos.1
                    ),
                ));
            }
            taken[id] = Some(k);
            ids[k] = id;
        }
        let mut slots: Vec<Option<Value>> = vec![None; n];
        let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
        for (k, d) in self.defs.into_iter().enumerate() {
            by_name.entry(d.name.clone()).or_default().push(ids[k]);
            slots[ids[k]] = Some(Value {
                name: d.name,
                ty: d.ty,
                def: d.def,
            });
        }
        let values: Vec<Value> = slots.into_iter().map(|v| v.unwrap()).collect();
        let resolve = |r: &RawRef| -> Result<ValueId, ParseError> {
            match r.id {
                Some(id) => {
                    let Some(v) = values.get(id as usize) else {
                        return Err(error_at(
                            r.pos,
                            format!(
                                "expected a value id below {n} (this graph defines {n} values), found `{}`",
                                ref_text(&r.name, r.id)
                            ),
                        ));
                    };
                    if v.name != r.name {
                        return Err(error_at(
                            r.pos,
                            format!(
                                "value #{id} is `{}`, found `{}`",
                                ref_text(&v.name, Some(id)),
                                ref_text(&r.name, r.id)
                            ),
                        ));
                    }
                    Ok(ValueId(id))
                }
                None => match by_name.get(&r.name).map(Vec::as_slice) {
                    Some([id]) => Ok(ValueId(*id as u32)),
                    None | Some([]) => Err(error_at(
                        r.pos,
                        format!(
                            "expected a value defined in graph `@{name}`, found unknown value `{}`",
                            ref_text(&r.name, None)
                        ),
                    )),
                    Some(many) => {
                        let list: Vec<String> = many
                            .iter()
                            .map(|i| ref_text(&r.name, Some(*i as u32)))
                            .collect();
                        Err(error_at(
                            r.pos,
                            format!(
                                "`{}` is ambiguous: it names {} values; write one of {}",
                                ref_text(&r.name, None),
                                many.len(),
                                list.join(", ")
                            ),
                        ))
                    }
                },
            }
        };
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for rn in &self.nodes {
            let inputs = rn
                .inputs
                .iter()
                .map(|r| r.as_ref().map(&resolve).transpose())
                .collect::<Result<Vec<_>, _>>()?;
            nodes.push(Node {
                name: rn.name.clone(),
                op: rn.op.clone(),
                inputs,
                outputs: rn
                    .outputs
                    .iter()
                    .map(|o| o.map(|k| ValueId(ids[k] as u32)))
                    .collect(),
            });
        }
        let outputs = self
            .outputs
            .iter()
            .map(resolve)
            .collect::<Result<Vec<_>, _>>()?;
        let inputs: Vec<ValueId> = self
            .inputs
            .iter()
            .map(|&k| ValueId(ids[k] as u32))
            .collect();
        let mut states = Vec::with_capacity(self.states.len());
        for (out, inp) in &self.states {
            let (o, i) = (resolve(out)?, resolve(inp)?);
            let output = outputs.iter().position(|&v| v == o).ok_or_else(|| {
                error_at(
                    out.pos,
                    format!(
                        "`{}` in `states` is not a graph output",
                        ref_text(&out.name, out.id)
                    ),
                )
            })?;
            let input = inputs.iter().position(|&v| v == i).ok_or_else(|| {
                error_at(
                    inp.pos,
                    format!(
                        "`{}` in `states` is not a graph input",
                        ref_text(&inp.name, inp.id)
                    ),
                )
            })?;
            states.push(crate::StateLink { input, output });
        }
        Ok(Graph {
            name,
            values,
            nodes,
            constants: self.constants,
            inputs,
            outputs,
            states,
        })
    }
}

pub(crate) struct Parser {
    toks: Vec<Token>,
    i: usize,
    /// Recursive constructs (parenthesised or negated dims, subgraphs) open now.
    depth: usize,
}

/// The deepest nesting of recursive constructs the parser accepts: far beyond any real
/// model (subgraphs of subgraphs, dims like `2*(seq - 1)`), and far below what exhausts a
/// thread's stack, so hostile text is an error rather than a stack overflow.
pub const MAX_NESTING: usize = 128;

impl Parser {
    pub(crate) fn new(src: &str) -> Result<Parser, ParseError> {
        Ok(Parser {
            toks: lex(src)?,
            i: 0,
            depth: 0,
        })
    }

    /// Runs `f` one nesting level deeper; past [`MAX_NESTING`] an error at the current
    /// token instead.
    fn nested<T>(
        &mut self,
        f: impl FnOnce(&mut Parser) -> Result<T, ParseError>,
    ) -> Result<T, ParseError> {
        if self.depth >= MAX_NESTING {
            return Err(error_at(
                self.pos(),
                format!("nesting deeper than {MAX_NESTING} levels"),
            ));
        }
        self.depth += 1;
        let result = f(self);
        self.depth -= 1;
        result
    }

    pub(crate) fn peek(&self) -> &Tok {
        &self.toks[self.i].tok
    }

    pub(crate) fn pos(&self) -> Pos {
        let t = &self.toks[self.i];
        (t.line, t.col)
    }

    pub(crate) fn next(&mut self) {
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
    }

    pub(crate) fn expected<T>(&self, what: &str) -> Result<T, ParseError> {
        Err(error_at(
            self.pos(),
            format!("expected {what}, found {}", describe(self.peek())),
        ))
    }

    pub(crate) fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Tok::Punct(q) if *q == p)
    }

    pub(crate) fn is_ident(&self, s: &str) -> bool {
        matches!(self.peek(), Tok::Ident(q) if q == s)
    }

    pub(crate) fn eat(&mut self, p: &str) -> bool {
        let hit = self.is_punct(p);
        if hit {
            self.next();
        }
        hit
    }

    pub(crate) fn expect(&mut self, p: &str) -> Result<(), ParseError> {
        if self.eat(p) {
            Ok(())
        } else {
            self.expected(&format!("`{p}`"))
        }
    }

    pub(crate) fn expect_eof(&self) -> Result<(), ParseError> {
        match self.peek() {
            Tok::Eof => Ok(()),
            _ => self.expected("end of input"),
        }
    }

    /// After an item of a comma-separated list: `true` when another item follows.
    pub(crate) fn list_sep(&mut self, close: &str) -> Result<bool, ParseError> {
        if self.eat(",") {
            Ok(true)
        } else if self.eat(close) {
            Ok(false)
        } else {
            self.expected(&format!("`,` or `{close}`"))
        }
    }

    pub(crate) fn graph(&mut self) -> Result<Graph, ParseError> {
        if !self.is_ident("graph") {
            return self.expected("`graph`");
        }
        self.next();
        let name = match self.peek().clone() {
            Tok::At(name) => {
                self.next();
                name
            }
            _ => return self.expected("a graph name `@name`"),
        };
        let mut b = GraphBuild::default();
        self.expect("(")?;
        if !self.eat(")") {
            loop {
                let (vname, id, ty, pos) = self.value_def()?;
                b.inputs.push(b.defs.len());
                b.defs.push(RawDef {
                    name: vname,
                    id,
                    ty,
                    def: ValueDef::Input(b.inputs.len() - 1),
                    pos,
                });
                if !self.list_sep(")")? {
                    break;
                }
            }
        }
        self.expect("->")?;
        self.expect("(")?;
        if !self.eat(")") {
            loop {
                let r = self.value_ref()?;
                b.outputs.push(r);
                if !self.list_sep(")")? {
                    break;
                }
            }
        }
        if self.is_ident("states") {
            self.next();
            self.expect("(")?;
            if !self.eat(")") {
                loop {
                    let out = self.value_ref()?;
                    self.expect("->")?;
                    let inp = self.value_ref()?;
                    b.states.push((out, inp));
                    if !self.list_sep(")")? {
                        break;
                    }
                }
            }
        }
        self.expect("{")?;
        while !self.eat("}") {
            self.statement(&mut b)?;
        }
        b.finish(name)
    }

    fn value_ref(&mut self) -> Result<RawRef, ParseError> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Value(name, id) => {
                self.next();
                Ok(RawRef { name, id, pos })
            }
            _ => self.expected("a value `%name`"),
        }
    }

    pub(crate) fn value_def(
        &mut self,
    ) -> Result<(String, Option<u32>, TensorType, Pos), ParseError> {
        let pos = self.pos();
        let Tok::Value(name, id) = self.peek().clone() else {
            return self.expected("a value definition `%name: type`");
        };
        self.next();
        if !self.eat(":") {
            let hint = if name.contains(':') && id.is_none() {
                " (names may contain `:`; put a space between the `:` and the type)"
            } else {
                ""
            };
            return Err(error_at(
                self.pos(),
                format!(
                    "expected `:` and a type after `{}`, found {}{hint}",
                    ref_text(&name, id),
                    describe(self.peek())
                ),
            ));
        }
        let ty = self.ty()?;
        Ok((name, id, ty, pos))
    }

    fn dtype(&mut self) -> Result<DType, ParseError> {
        if let Tok::Ident(s) = self.peek() {
            if let Some(d) = DType::from_name(s) {
                self.next();
                return Ok(d);
            }
        }
        self.expected("a dtype (f32, f64, f16, bf16, i8, u8, i16, u16, i32, u32, i64, u64, bool)")
    }

    fn dims(&mut self) -> Result<Vec<Dim>, ParseError> {
        self.expect("[")?;
        let mut dims = Vec::new();
        if !self.eat("]") {
            loop {
                dims.push(self.dim()?);
                if !self.list_sep("]")? {
                    break;
                }
            }
        }
        Ok(dims)
    }

    pub(crate) fn ty(&mut self) -> Result<TensorType, ParseError> {
        let dtype = self.dtype()?;
        let dims = self.dims()?;
        Ok(TensorType::new(dtype, dims))
    }

    // ---- dims ----

    pub(crate) fn dim(&mut self) -> Result<Dim, ParseError> {
        let neg = self.eat("-");
        let mut acc = self.dim_term(neg)?;
        loop {
            let pos = self.pos();
            let neg = if self.eat("+") {
                false
            } else if self.eat("-") {
                true
            } else {
                return Ok(acc);
            };
            let t = self.dim_term(neg)?;
            acc = match (acc.as_known(), t.as_known()) {
                (Some(a), Some(b)) => Dim::known(
                    a.checked_add(b)
                        .ok_or_else(|| error_at(pos, "dim overflows i64".into()))?,
                ),
                _ => acc.add(&t),
            };
        }
    }

    /// A product; `neg` negates it (a literal right after the minus takes the sign, so
    /// `-9223372036854775808` reads).
    fn dim_term(&mut self, neg: bool) -> Result<Dim, ParseError> {
        let mut acc = match self.peek().clone() {
            Tok::Int(s) if neg => {
                let pos = self.pos();
                self.next();
                Dim::known(parse_i64(&format!("-{s}"), pos)?)
            }
            _ => {
                let f = self.dim_factor()?;
                if neg {
                    self.negate(f)?
                } else {
                    f
                }
            }
        };
        loop {
            let pos = self.pos();
            if !self.eat("*") {
                return Ok(acc);
            }
            let f = self.dim_factor()?;
            acc = match (acc.as_known(), f.as_known()) {
                (Some(a), Some(b)) => Dim::known(
                    a.checked_mul(b)
                        .ok_or_else(|| error_at(pos, "dim overflows i64".into()))?,
                ),
                _ => acc.mul(&f),
            };
        }
    }

    fn negate(&self, d: Dim) -> Result<Dim, ParseError> {
        if d.as_known() == Some(i64::MIN) {
            return Err(error_at(self.pos(), "dim overflows i64".into()));
        }
        Ok(d.scale(-1))
    }

    fn dim_factor(&mut self) -> Result<Dim, ParseError> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Int(s) => {
                self.next();
                Ok(Dim::known(parse_i64(&s, pos)?))
            }
            Tok::Ident(s) => {
                self.next();
                Ok(Dim::symbol(&s))
            }
            Tok::Punct("(") => {
                self.next();
                let d = self.nested(Parser::dim)?;
                self.expect(")")?;
                Ok(d)
            }
            Tok::Punct("-") => {
                self.next();
                let f = self.nested(Parser::dim_factor)?;
                self.negate(f)
            }
            _ => self.expected("a dim (an integer, a symbol or `(`)"),
        }
    }

    // ---- statements ----

    fn statement(&mut self, b: &mut GraphBuild) -> Result<(), ParseError> {
        match self.peek().clone() {
            Tok::Ident(s) if s == "const" => {
                self.next();
                self.constant(b)
            }
            Tok::Value(..) | Tok::Ident(_) => self.node(b),
            _ => self.expected("a statement (`const`, `%result: type = op(...)`) or `}`"),
        }
    }

    fn constant(&mut self, b: &mut GraphBuild) -> Result<(), ParseError> {
        let cid = ConstId(b.constants.len() as u32);
        let mut first_ty = None;
        if self.is_ident("_") {
            self.next();
        } else {
            loop {
                let (name, id, ty, pos) = self.value_def()?;
                first_ty.get_or_insert_with(|| ty.clone());
                b.defs.push(RawDef {
                    name,
                    id,
                    ty,
                    def: ValueDef::Const(cid),
                    pos,
                });
                if !self.eat(",") {
                    break;
                }
            }
        }
        if !self.eat("=") {
            return self.expected("`=` (or `,` and another value)");
        }
        let data = self.const_data(first_ty.as_ref())?;
        b.constants.push(data);
        Ok(())
    }

    pub(crate) fn const_data(
        &mut self,
        value_ty: Option<&TensorType>,
    ) -> Result<ConstData, ParseError> {
        let kw_pos = self.pos();
        let dense = match self.peek() {
            Tok::Ident(s) if s == "dense" => true,
            Tok::Ident(s) if s == "hex" => false,
            _ => return self.expected("constant data (`dense [...]` or `hex \"...\"`)"),
        };
        self.next();
        let (mut dtype, mut dims) = (None, None);
        if self.eat("<") {
            dtype = Some(self.dtype()?);
            if self.is_punct("[") {
                dims = Some(self.dims()?);
            }
            self.expect(">")?;
        }
        let dtype = match (dtype, value_ty) {
            (Some(d), _) => d,
            (None, Some(t)) => t.dtype,
            (None, None) => {
                return Err(error_at(
                    kw_pos,
                    "a constant no value names needs its type: expected `dense<dtype[dims]>`"
                        .into(),
                ))
            }
        };
        let dims = match (dims, value_ty) {
            (Some(d), _) => d,
            (None, Some(t)) => t.dims.clone(),
            (None, None) => {
                return Err(error_at(
                    kw_pos,
                    "a constant no value names needs its dims: expected `dense<dtype[dims]>`"
                        .into(),
                ))
            }
        };
        let ty = TensorType::new(dtype, dims);
        let udims = ty
            .dims
            .iter()
            .map(|d| d.as_known().and_then(|k| usize::try_from(k).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                error_at(
                    kw_pos,
                    format!("expected a constant type with known non-negative dims, found {ty}"),
                )
            })?;
        let n = udims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| error_at(kw_pos, format!("constant type {ty} is too large")))?;
        if self.is_ident("elided") {
            return Err(error_at(
                self.pos(),
                "expected constant data, found `elided` (text from print_graph_elided does not parse)"
                    .into(),
            ));
        }
        let bytes = if dense {
            let open = self.pos();
            self.expect("[")?;
            let mut bytes = Vec::with_capacity(n.saturating_mul(dtype.size_of()).min(1 << 20));
            let mut count = 0usize;
            if !self.eat("]") {
                loop {
                    self.element(dtype, &mut bytes)?;
                    count += 1;
                    if !self.list_sep("]")? {
                        break;
                    }
                }
            }
            if count != n {
                return Err(error_at(
                    open,
                    format!("expected {n} elements for {ty}, found {count}"),
                ));
            }
            bytes
        } else {
            let pos = self.pos();
            if !matches!(self.peek(), Tok::Str(_)) {
                return self.expected("a string of hex digits");
            }
            // Weights can be large: move the string out instead of copying it.
            let Tok::Str(s) =
                std::mem::replace(&mut self.toks[self.i].tok, Tok::Str(String::new()))
            else {
                unreachable!()
            };
            self.next();
            let bytes = decode_hex(&s).ok_or_else(|| {
                error_at(
                    pos,
                    "expected an even number of hex digits (the raw little-endian bytes)".into(),
                )
            })?;
            let want = n.saturating_mul(dtype.size_of());
            if bytes.len() != want {
                return Err(error_at(
                    pos,
                    format!("expected {want} bytes for {ty}, found {}", bytes.len()),
                ));
            }
            bytes
        };
        Ok(ConstData {
            dtype,
            dims: udims,
            bytes: Bytes::from(bytes),
        })
    }

    fn element(&mut self, dtype: DType, out: &mut Vec<u8>) -> Result<(), ParseError> {
        let pos = self.pos();
        if dtype == DType::Bool {
            let b = match self.peek() {
                Tok::Ident(s) if s == "true" => 1u8,
                Tok::Ident(s) if s == "false" => 0,
                Tok::Int(s) if s == "1" => 1,
                Tok::Int(s) if s == "0" => 0,
                _ => return self.expected("`true` or `false`"),
            };
            self.next();
            out.push(b);
            return Ok(());
        }
        let num = self.number(&format!("a {dtype} element"))?;
        if dtype.is_float() {
            match dtype {
                DType::F32 => out.extend(num.to_f32().to_le_bytes()),
                DType::F64 => out.extend(num.to_f64().to_le_bytes()),
                DType::F16 => out.extend(f16::from_f32(num.to_f32()).to_le_bytes()),
                _ => out.extend(bf16::from_f32(num.to_f32()).to_le_bytes()),
            }
            return Ok(());
        }
        if num.is_float() {
            return Err(error_at(
                pos,
                format!(
                    "expected an integer {dtype} element, found `{}`",
                    num.text()
                ),
            ));
        }
        let v: i128 = num.text().parse().map_err(|_| {
            error_at(
                pos,
                format!("integer `{}` is out of range for {dtype}", num.text()),
            )
        })?;
        let w = dtype.size_of();
        let (lo, hi): (i128, i128) = if dtype.is_signed_int() {
            (-(1i128 << (8 * w - 1)), (1i128 << (8 * w - 1)) - 1)
        } else {
            (0, (1i128 << (8 * w)) - 1)
        };
        if v < lo || v > hi {
            return Err(error_at(
                pos,
                format!("expected a {dtype} element in {lo}..={hi}, found {v}"),
            ));
        }
        out.extend_from_slice(&v.to_le_bytes()[..w]);
        Ok(())
    }

    /// `[-] (integer | float | inf)` or `nan`.
    fn number(&mut self, what: &str) -> Result<Num, ParseError> {
        let start = self.i;
        let neg = self.eat("-");
        let sign = if neg { "-" } else { "" };
        let num = match self.peek() {
            Tok::Int(s) => Num::Int(format!("{sign}{s}")),
            Tok::Float(s) => Num::Float(format!("{sign}{s}")),
            Tok::Ident(s) if s == "inf" => Num::Float(format!("{sign}inf")),
            Tok::Ident(s) if s == "nan" && !neg => Num::Float("nan".into()),
            _ => {
                self.i = start;
                return self.expected(what);
            }
        };
        self.next();
        Ok(num)
    }

    fn node(&mut self, b: &mut GraphBuild) -> Result<(), ParseError> {
        let node_id = NodeId(b.nodes.len() as u32);
        let mut outputs = Vec::new();
        if matches!(self.peek(), Tok::Value(..)) || self.is_ident("_") {
            loop {
                if self.is_ident("_") {
                    self.next();
                    outputs.push(None);
                } else {
                    let (name, id, ty, pos) = self.value_def()?;
                    outputs.push(Some(b.defs.len()));
                    b.defs.push(RawDef {
                        name,
                        id,
                        ty,
                        def: ValueDef::Node {
                            node: node_id,
                            output: outputs.len() - 1,
                        },
                        pos,
                    });
                }
                if !self.eat(",") {
                    break;
                }
            }
            if !self.eat("=") {
                return self.expected("`=` (or `,` and another result)");
            }
        }
        let op = self.op()?;
        self.expect("(")?;
        let mut inputs = Vec::new();
        if !self.eat(")") {
            loop {
                if self.is_ident("_") {
                    self.next();
                    inputs.push(None);
                } else if matches!(self.peek(), Tok::Value(..)) {
                    inputs.push(Some(self.value_ref()?));
                } else {
                    return self.expected("an operand `%name` or `_`");
                }
                if !self.list_sep(")")? {
                    break;
                }
            }
        }
        let name = match self.peek().clone() {
            Tok::At(name) => {
                self.next();
                name
            }
            _ => String::new(),
        };
        b.nodes.push(RawNode {
            name,
            op,
            inputs,
            outputs,
        });
        Ok(())
    }

    fn op(&mut self) -> Result<Op, ParseError> {
        let op_pos = self.pos();
        let name = match self.peek() {
            Tok::Ident(s) if Op::NAMES.contains(&s.as_str()) => s.clone(),
            Tok::Ident(s) => {
                return Err(error_at(
                    op_pos,
                    format!("expected an op name, found unknown op `{s}`"),
                ))
            }
            _ => return self.expected("an op name"),
        };
        self.next();
        let mut attrs: HashMap<String, (AttrValue, Pos)> = HashMap::new();
        let mut order: Vec<String> = Vec::new();
        if self.eat("{") && !self.eat("}") {
            loop {
                let pos = self.pos();
                let key = match self.peek() {
                    Tok::Ident(k) => k.clone(),
                    _ => return self.expected("an attribute name"),
                };
                self.next();
                self.expect("=")?;
                let v = self.attr_value()?;
                if attrs.insert(key.clone(), (v, pos)).is_some() {
                    return Err(error_at(pos, format!("duplicate attribute `{key}`")));
                }
                order.push(key);
                if !self.list_sep("}")? {
                    break;
                }
            }
        }
        let mut last: Option<Pos> = None;
        let result = Op::from_parts(&name, |k| match attrs.remove(k) {
            Some((v, p)) => {
                last = Some(p);
                v
            }
            None => {
                last = None;
                AttrValue::None
            }
        });
        let op = result.map_err(|m| error_at(last.unwrap_or(op_pos), m))?;
        if let Some(k) = order.iter().find(|k| attrs.contains_key(*k)) {
            let known: Vec<&str> = op.attrs().iter().map(|(k, _)| *k).collect();
            let expected = if known.is_empty() {
                format!("`{name}` takes no attributes")
            } else {
                format!("expected one of {}", known.join(", "))
            };
            return Err(error_at(
                attrs[k].1,
                format!("unknown attribute `{k}` of `{name}`: {expected}"),
            ));
        }
        Ok(op)
    }

    fn attr_value(&mut self) -> Result<AttrValue, ParseError> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Int(_) | Tok::Float(_) | Tok::Punct("-") => {
                let num = self.number("a number")?;
                num_attr(num, pos)
            }
            Tok::Ident(s) => match s.as_str() {
                "true" | "false" => {
                    self.next();
                    Ok(AttrValue::Bool(s == "true"))
                }
                "inf" | "nan" => {
                    let num = self.number("a number")?;
                    num_attr(num, pos)
                }
                "graph" => Ok(AttrValue::Graph(Box::new(self.nested(Parser::graph)?))),
                _ => {
                    if let Some(d) = DType::from_name(&s) {
                        self.next();
                        let scalar_follows = match self.peek() {
                            Tok::Int(_) | Tok::Float(_) | Tok::Punct("-") => true,
                            Tok::Ident(w) => matches!(w.as_str(), "true" | "false" | "inf" | "nan"),
                            _ => false,
                        };
                        return if scalar_follows {
                            Ok(AttrValue::Scalar(self.scalar(d)?))
                        } else {
                            Ok(AttrValue::DType(d))
                        };
                    }
                    self.next();
                    Ok(AttrValue::Word(s))
                }
            },
            Tok::Str(s) => {
                self.next();
                Ok(AttrValue::Str(s))
            }
            Tok::Punct("[") => {
                self.next();
                let mut nums = Vec::new();
                if !self.eat("]") {
                    loop {
                        let p = self.pos();
                        nums.push((self.number("a number")?, p));
                        if !self.list_sep("]")? {
                            break;
                        }
                    }
                }
                if nums.iter().any(|(n, _)| n.is_float()) {
                    Ok(AttrValue::Floats(
                        nums.iter().map(|(n, _)| n.to_f64()).collect(),
                    ))
                } else {
                    let ints = nums
                        .iter()
                        .map(|(n, p)| parse_i64(n.text(), *p))
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok(AttrValue::Ints(ints))
                }
            }
            _ => self.expected("an attribute value"),
        }
    }

    fn scalar(&mut self, d: DType) -> Result<Scalar, ParseError> {
        let pos = self.pos();
        if d == DType::Bool {
            let b = match self.peek() {
                Tok::Ident(s) if s == "true" => true,
                Tok::Ident(s) if s == "false" => false,
                Tok::Int(s) if s == "1" => true,
                Tok::Int(s) if s == "0" => false,
                _ => return self.expected("`true` or `false`"),
            };
            self.next();
            return Ok(Scalar::Bool(b));
        }
        let num = self.number(&format!("a {d} value"))?;
        if num.is_float() || d.is_float() {
            return Ok(Scalar::Float(d, num.to_f64()));
        }
        if d.is_unsigned_int() {
            let v = num.text().parse::<u64>().map_err(|_| {
                error_at(pos, format!("expected a {d} value, found `{}`", num.text()))
            })?;
            Ok(Scalar::UInt(d, v))
        } else {
            Ok(Scalar::Int(d, parse_i64(num.text(), pos)?))
        }
    }
}

fn num_attr(num: Num, pos: Pos) -> Result<AttrValue, ParseError> {
    match num {
        Num::Int(s) => Ok(AttrValue::Int(parse_i64(&s, pos)?)),
        f => Ok(AttrValue::Float(f.to_f64())),
    }
}

pub(crate) fn parse_i64(s: &str, pos: Pos) -> Result<i64, ParseError> {
    s.parse()
        .map_err(|_| error_at(pos, format!("expected an i64, found `{s}` (out of range)")))
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let pairs = s.as_bytes().chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return None;
    }
    let nib = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    pairs.map(|p| Some(nib(p[0])? << 4 | nib(p[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_parse() {
        for s in [
            "0",
            "768",
            "-3",
            "seq",
            "2*seq",
            "past + seq",
            "768*batch*seq",
            "seq - 1",
            "batch*seq - 1",
            "-2*seq + 5",
            "-9223372036854775808",
            "past - 9223372036854775808*seq",
        ] {
            let d = parse_dim(s).unwrap();
            assert_eq!(d.to_string(), s);
        }
        let seq = Dim::symbol("seq");
        assert_eq!(
            parse_dim("2*(seq - 1) + 2").unwrap(),
            seq.scale(2),
            "parentheses and folding"
        );
        assert_eq!(parse_dim("-(-seq)").unwrap(), seq);
        let e = parse_dim("seq +").unwrap_err();
        assert_eq!((e.line, e.col), (1, 6));
        assert!(parse_dim("99999999999*99999999999").is_err());
    }

    #[test]
    fn names() {
        for s in [
            "x",
            "input.1",
            "onnx::Reshape_12",
            "gpu_0/conv1_w_0",
            "1",
            "-",
        ] {
            assert!(is_bare_name(s), "{s}");
        }
        for s in ["", "a b", "x:", "a//b", "a#b", "ü"] {
            assert!(!is_bare_name(s), "{s}");
        }
    }
}
