//! The text format of a [`Program`]: prints and parses a whole kernel-level program.
//!
//! [`print_program`] writes a program that [`parse_program`] reads back to an equal program,
//! for every program that passes [`Program::verify`]. Kernel bodies are graphs in the graph
//! text format ([`crate::text`]), and the lexer, types, dims and constant data are that
//! format's, so pass tests can be written as program text in and program text out:
//!
//! ```text
//! program @bert(%input_ids: i64[batch, seq]) -> (%out: f32[batch, seq, 2])
//! bounds { batch <= 8, seq <= 2048 }
//!
//! weight w0 "encoder.w": f32[2, 2] = dense [1.0, 0.0, 0.0, 1.0]   // or `= external`
//!
//! arena a0 on cpu host size 4096 lower_bound 3072
//!
//! buffer b0 "input_ids": i64[batch, seq] = input 0
//! buffer b1 "encoder.w": f32[2, 2] = weight w0
//! buffer b2 "t1": f32[batch, seq, 2] = arena a0 offset 0
//! buffer b3 "out": f32[batch, seq, 2] = output 0
//!
//! kernel k0 "embed_matmul" contraction on cpu = graph @k0(%ids: i64[batch, seq], %w: f32[2, 2]) -> (%y) {
//!   ...
//! }
//!
//! step dispatch k0 (b0, b1) -> (b2)
//! step copy b2 -> b3
//! ```
//!
//! # Grammar
//!
//! Tokens, comments, names, types, dims and constant data are the graph format's.
//!
//! ```text
//! program  := 'program' '@' name '(' [port {',' port}] ')' '->' '(' [port {',' port}] ')'
//!             {item}
//! port     := '%' name ':' type
//! item     := 'bounds' '{' [dim '<' '=' integer {',' ...}] '}'   // `seq <= 64`, `past + seq <= 4096`
//!           | 'define' symbol '=' expr            // `define _conv0 = floordiv(h + 5, 2)`
//!           | 'state' sN port '->' port          // output type, then the input it becomes
//!           | 'weight' wN [string] ':' type '=' (data | 'external')
//!           | 'arena' aN 'on' word word ['size' integer] ['lower_bound' integer]
//!           | 'buffer' bN string ':' type '=' storage
//!           | 'kernel' kN string kind 'on' word '=' graph
//!           | 'step' 'dispatch' kN '(' [bN {',' bN}] ')' '->' '(' [(bN | '_') {',' ...}] ')'
//!           | 'step' 'copy' bN '->' bN
//! expr     := ('floordiv' | 'mod') '(' dim ',' integer ')' | 'broadcast' '(' dim ',' dim ')'
//! storage  := 'input' integer | 'output' integer | 'weight' wN
//!           | 'arena' aN ['offset' integer] | 'dynamic' | 'state' sN
//! kind     := 'contraction' | 'elementwise' | 'reduction' | 'data_movement' | 'opaque'
//! word     := identifier | string             // devices (`cpu`) and memory kinds (`host`)
//! ```
//!
//! Details:
//!
//! * **Numbering.** Weights, arenas, buffers and kernels are declared as `w0`, `a0`, `b0`,
//!   `k0`, each kind numbered `0..n` in the order of its declarations; items of different
//!   kinds may interleave, and references may point further down. A reference to something
//!   not declared (`k7` in a program with two kernels) is an error at the reference. Port
//!   numbers (`input 3`) are plain integers that [`Program::verify`] checks.
//! * **Absent sizes.** An arena planned per call leaves out `size` and `lower_bound`; a
//!   buffer whose offset is planned per call leaves out `offset`.
//! * **Weights.** [`WeightMode::Inline`] prints the bytes as the graph format prints a
//!   constant (`dense [...]` up to [`crate::text::DENSE_LIMIT`] elements, else `hex`);
//!   [`WeightMode::Reference`] prints `external`, and the parser asks a resolver for the
//!   data. A weight's string is the name of the first buffer that stores it; it is for
//!   readers and resolvers only (a [`ConstData`] has no name) and may be left out.
//! * **Steps** run in the order written.

use crate::program::{
    Arena, BufferDecl, Kernel, KernelKind, Port, Program, StateDecl, Step, Storage,
};
use crate::text::{error_at, parse_i64, write_const_data, write_name, write_string};
use crate::text::{print_graph, ParseError, Parser, Pos, Tok};
use crate::{is_identifier, ConstData, DType, TensorType};
use std::fmt::Write as _;

/// How [`print_program`] writes weight data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightMode {
    /// The bytes, as `dense [...]` or `hex "..."`.
    Inline,
    /// Only the name, dtype and dims (`= external`): the artifact stores the bytes elsewhere.
    Reference,
}

/// Resolves an `external` weight: `(index, name, dtype, dims)` to its data.
pub type WeightResolver<'a> =
    dyn FnMut(usize, &str, DType, &[usize]) -> Result<ConstData, String> + 'a;

// ---------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------

/// Prints `p` in the text format; [`parse_program`] reads it back to an equal program
/// (given, for [`WeightMode::Reference`], a resolver that returns the same weights).
pub fn print_program(p: &Program, weights: WeightMode) -> String {
    let mut out = String::new();
    out.push_str("program @");
    write_name(&mut out, &p.name);
    write_ports(&mut out, &p.inputs);
    out.push_str(" -> ");
    write_ports(&mut out, &p.outputs);
    out.push('\n');
    if !p.bounds.is_empty() || !p.dim_bounds.is_empty() {
        let entries: Vec<String> = p
            .bounds
            .iter()
            .map(|(s, b)| format!("{} <= {b}", s.name()))
            .chain(p.dim_bounds.iter().map(|(d, b)| format!("{d} <= {b}")))
            .collect();
        let _ = writeln!(out, "bounds {{ {} }}", entries.join(", "));
    }
    for def in &p.symbol_defs {
        let _ = writeln!(out, "define {def}");
    }
    if !p.states.is_empty() {
        out.push('\n');
    }
    for (i, st) in p.states.iter().enumerate() {
        let _ = write!(out, "state s{i} %");
        write_name(&mut out, &st.name);
        let _ = write!(out, ": {} -> %", st.output_ty);
        write_name(&mut out, &st.input_name);
        let _ = writeln!(out, ": {}", st.input_ty);
    }

    if !p.weights.is_empty() {
        out.push('\n');
    }
    for (i, c) in p.weights.iter().enumerate() {
        let _ = write!(out, "weight w{i}");
        let name = p
            .buffers
            .iter()
            .find(|b| b.storage == Storage::Weight(i))
            .map(|b| b.name.as_str());
        if let Some(name) = name {
            out.push(' ');
            write_string(&mut out, name);
        }
        let dims: Vec<i64> = c.dims.iter().map(|&d| d as i64).collect();
        let _ = write!(out, ": {} = ", TensorType::known(c.dtype, &dims));
        match weights {
            WeightMode::Inline => write_const_data(&mut out, c, false, false),
            WeightMode::Reference => out.push_str("external"),
        }
        out.push('\n');
    }

    if !p.arenas.is_empty() {
        out.push('\n');
    }
    for (i, a) in p.arenas.iter().enumerate() {
        let _ = write!(out, "arena a{i} on ");
        write_word(&mut out, &a.device);
        out.push(' ');
        write_word(&mut out, &a.memory);
        if let Some(s) = a.size {
            let _ = write!(out, " size {s}");
        }
        if let Some(l) = a.lower_bound {
            let _ = write!(out, " lower_bound {l}");
        }
        out.push('\n');
    }

    if !p.buffers.is_empty() {
        out.push('\n');
    }
    for (i, b) in p.buffers.iter().enumerate() {
        let _ = write!(out, "buffer b{i} ");
        write_string(&mut out, &b.name);
        let _ = write!(out, ": {} = ", b.ty);
        let _ = match b.storage {
            Storage::Input(k) => write!(out, "input {k}"),
            Storage::Output(k) => write!(out, "output {k}"),
            Storage::Weight(w) => write!(out, "weight w{w}"),
            Storage::Arena { arena, offset } => match offset {
                Some(o) => write!(out, "arena a{arena} offset {o}"),
                None => write!(out, "arena a{arena}"),
            },
            Storage::Dynamic => write!(out, "dynamic"),
            Storage::State(st) => write!(out, "state s{st}"),
        };
        out.push('\n');
    }

    for (i, k) in p.kernels.iter().enumerate() {
        let _ = write!(out, "\nkernel k{i} ");
        write_string(&mut out, &k.name);
        let _ = write!(out, " {} on ", k.kind.word());
        write_word(&mut out, &k.device);
        out.push_str(" = ");
        out.push_str(&print_graph(&k.body));
    }

    if !p.steps.is_empty() {
        out.push('\n');
    }
    for s in &p.steps {
        match s {
            Step::Dispatch {
                kernel,
                args,
                results,
            } => {
                let args: Vec<String> = args.iter().map(|b| format!("b{b}")).collect();
                let results: Vec<String> = results
                    .iter()
                    .map(|r| r.map_or("_".into(), |b| format!("b{b}")))
                    .collect();
                let _ = writeln!(
                    out,
                    "step dispatch k{kernel} ({}) -> ({})",
                    args.join(", "),
                    results.join(", ")
                );
            }
            Step::Copy { src, dst } => {
                let _ = writeln!(out, "step copy b{src} -> b{dst}");
            }
        }
    }
    out
}

fn write_ports(out: &mut String, ports: &[Port]) {
    out.push('(');
    for (i, p) in ports.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('%');
        write_name(out, &p.name);
        let _ = write!(out, ": {}", p.ty);
    }
    out.push(')');
}

/// A device or memory kind: bare when it is an identifier, else quoted.
fn write_word(out: &mut String, s: &str) {
    if is_identifier(s) {
        out.push_str(s);
    } else {
        write_string(out, s);
    }
}

// ---------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------

/// Parses a program written by [`print_program`] or by hand, then runs
/// [`Program::verify`]; a verifier error becomes a [`ParseError`] at the step or buffer it
/// names (at `program` when it names neither). Inline weights are read from the text;
/// `external` ones come from `resolve(index, name, dtype, dims)`, whose error message
/// becomes a [`ParseError`] at the `external`.
pub fn parse_program(src: &str, resolve: &mut WeightResolver<'_>) -> Result<Program, ParseError> {
    let (program, places) = parse(src, resolve)?;
    program
        .verify()
        .map_err(|e| error_at(places.locate(&e.msg), e.to_string()))?;
    Ok(program)
}

/// Like [`parse_program`] without [`Program::verify`] (for programs that a verifier test
/// means to be wrong). References to undeclared weights, arenas, buffers and kernels are
/// still errors: a [`Program`] built from such text could not even be printed back.
pub fn parse_program_unverified(
    src: &str,
    resolve: &mut WeightResolver<'_>,
) -> Result<Program, ParseError> {
    parse(src, resolve).map(|(p, _)| p)
}

/// [`parse_program`] for text whose weights are all inline; an `external` weight is an
/// error.
pub fn parse_program_inline(src: &str) -> Result<Program, ParseError> {
    parse_program(src, &mut |_, name, _, _| {
        Err(format!(
            "weight `{name}` is `external`, but this parser reads inline weights only"
        ))
    })
}

/// Where the verifier's subjects are written.
struct Places {
    program: Pos,
    buffers: Vec<Pos>,
    steps: Vec<Pos>,
}

impl Places {
    /// The place a verifier message is about: `step N...`, `buffer N...` and `output buffer
    /// N...` name a step or buffer; anything else is about the program.
    fn locate(&self, msg: &str) -> Pos {
        let number = |rest: &str| -> Option<usize> {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let found = if let Some(rest) = msg.strip_prefix("step ") {
            number(rest).and_then(|i| self.steps.get(i))
        } else if let Some(rest) = msg
            .strip_prefix("buffer ")
            .or_else(|| msg.strip_prefix("output buffer "))
        {
            number(rest).and_then(|i| self.buffers.get(i))
        } else {
            None
        };
        found.copied().unwrap_or(self.program)
    }
}

/// The kinds of numbered declarations: the prefix letter and a word for messages.
#[derive(Clone, Copy)]
enum Decl {
    Weight,
    Arena,
    Buffer,
    Kernel,
    State,
}

impl Decl {
    fn letter(self) -> char {
        match self {
            Decl::Weight => 'w',
            Decl::Arena => 'a',
            Decl::Buffer => 'b',
            Decl::Kernel => 'k',
            Decl::State => 's',
        }
    }

    fn word(self) -> &'static str {
        match self {
            Decl::Weight => "weight",
            Decl::Arena => "arena",
            Decl::Buffer => "buffer",
            Decl::Kernel => "kernel",
            Decl::State => "state",
        }
    }
}

struct ProgramParser<'r, 'a> {
    p: Parser,
    resolve: &'r mut WeightResolver<'a>,
    program: Program,
    places: Places,
    /// References to check once every declaration is read.
    refs: Vec<(Decl, usize, Pos)>,
}

fn parse(src: &str, resolve: &mut WeightResolver<'_>) -> Result<(Program, Places), ParseError> {
    let mut pp = ProgramParser {
        p: Parser::new(src)?,
        resolve,
        program: Program::default(),
        places: Places {
            program: (1, 1),
            buffers: Vec::new(),
            steps: Vec::new(),
        },
        refs: Vec::new(),
    };
    pp.header()?;
    while !matches!(pp.p.peek(), Tok::Eof) {
        pp.item()?;
    }
    pp.check_refs()?;
    Ok((pp.program, pp.places))
}

impl ProgramParser<'_, '_> {
    fn header(&mut self) -> Result<(), ParseError> {
        self.places.program = self.p.pos();
        if !self.p.is_ident("program") {
            return self.p.expected("`program`");
        }
        self.p.next();
        self.program.name = match self.p.peek().clone() {
            Tok::At(name) => {
                self.p.next();
                name
            }
            _ => return self.p.expected("a program name `@name`"),
        };
        self.program.inputs = self.ports()?;
        self.p.expect("->")?;
        self.program.outputs = self.ports()?;
        Ok(())
    }

    fn ports(&mut self) -> Result<Vec<Port>, ParseError> {
        self.p.expect("(")?;
        let mut ports = Vec::new();
        if self.p.eat(")") {
            return Ok(ports);
        }
        loop {
            let (name, id, ty, pos) = self.p.value_def()?;
            if let Some(id) = id {
                return Err(error_at(
                    pos,
                    format!("expected a port `%name: type`, found a value id `#{id}` (ports have no ids)"),
                ));
            }
            ports.push(Port { name, ty });
            if !self.p.list_sep(")")? {
                return Ok(ports);
            }
        }
    }

    fn item(&mut self) -> Result<(), ParseError> {
        let pos = self.p.pos();
        let word = match self.p.peek() {
            Tok::Ident(w) => w.clone(),
            _ => String::new(),
        };
        match word.as_str() {
"bounds" => self.bounds(),
            "define" => self.define(),
            "weight" => self.weight(),
            "arena" => self.arena(),
            "buffer" => self.buffer(pos),
            "kernel" => self.kernel(),
            "step" => self.step(pos),
            "state" => self.state(),
            _ => self.p.expected(
                "an item (`bounds`, `define`, `state`, `weight`, `arena`, `buffer`, `kernel`, `step`) or end of input",
            ),
        }
    }

    fn bounds(&mut self) -> Result<(), ParseError> {
        self.p.next();
        self.p.expect("{")?;
        if self.p.eat("}") {
            return Ok(());
        }
        loop {
            let dim_pos = self.p.pos();
            let dim = self.p.dim()?;
            if dim.symbols().is_empty() {
                return Err(error_at(
                    dim_pos,
                    format!("expected a symbol or a sum of symbols to bound, found {dim}"),
                ));
            }
            self.p.expect("<")?;
            self.p.expect("=")?;
            let pos = self.p.pos();
            let neg = self.p.eat("-");
            let bound = match self.p.peek().clone() {
                Tok::Int(s) => {
                    self.p.next();
                    parse_i64(&format!("{}{s}", if neg { "-" } else { "" }), pos)?
                }
                _ => return self.p.expected("an integer bound"),
            };
            match dim.as_symbol() {
                Some(sym) => self.program.bounds.push((sym.clone(), bound)),
                None => self.program.dim_bounds.push((dim, bound)),
            }
            if !self.p.list_sep("}")? {
                return Ok(());
            }
        }
    }

    /// `define _conv0 = floordiv(h + 5, 2)`: a [`crate::SymbolDef`].
    fn define(&mut self) -> Result<(), ParseError> {
        self.p.next();
        let pos = self.p.pos();
        let dim = self.p.dim()?;
        let Some(symbol) = dim.as_symbol().cloned() else {
            return Err(error_at(
                pos,
                format!("expected a symbol to define, found {dim}"),
            ));
        };
        self.p.expect("=")?;
        let pos = self.p.pos();
        let kind = match self.p.peek() {
            Tok::Ident(w) => w.clone(),
            _ => String::new(),
        };
        self.p.next();
        self.p.expect("(")?;
        if kind == "values" {
            return self.define_values(symbol);
        }
        let first = self.p.dim()?;
        self.p.expect(",")?;
        let expr = match kind.as_str() {
            "floordiv" | "mod" => {
                let den = self.uint("a divisor")?;
                let den = i64::try_from(den)
                    .map_err(|_| error_at(pos, format!("divisor {den} is too large")))?;
                if kind == "mod" {
                    crate::SymbolExpr::Mod { num: first, den }
                } else {
                    crate::SymbolExpr::FloorDiv { num: first, den }
                }
            }
            "broadcast" => crate::SymbolExpr::Broadcast {
                a: first,
                b: self.p.dim()?,
            },
            _ => {
                return Err(error_at(
                    pos,
                    format!("expected `floordiv`, `mod`, `broadcast` or `values`, found `{kind}`"),
                ))
            }
        };
        self.p.expect(")")?;
        self.program
            .symbol_defs
            .push(crate::SymbolDef { symbol, expr });
        Ok(())
    }

    /// The rest of `define _r = values(0, 1, [1]) graph @d(...) -> (...) { ... }` (after
    /// `values(`): body output, axis, the body inputs whose values are read, the body (the
    /// sized op and the shape arithmetic before it).
    fn define_values(&mut self, symbol: crate::Symbol) -> Result<(), ParseError> {
        let output = self.index_number("a result index")?;
        self.p.expect(",")?;
        let axis = self.index_number("an axis")?;
        self.p.expect(",")?;
        self.p.expect("[")?;
        let mut reads = Vec::new();
        while !self.p.is_punct("]") {
            if !reads.is_empty() {
                self.p.expect(",")?;
            }
            reads.push(self.index_number("a body input index")?);
        }
        self.p.expect("]")?;
        self.p.expect(")")?;
        let body = self.p.graph()?;
        let expr = crate::SymbolExpr::Values {
            body,
            reads,
            output,
            axis,
        };
        self.program
            .symbol_defs
            .push(crate::SymbolDef { symbol, expr });
        Ok(())
    }

    fn weight(&mut self) -> Result<(), ParseError> {
        self.p.next();
        let index = self.declare(Decl::Weight, self.program.weights.len())?;
        let name = match self.p.peek().clone() {
            Tok::Str(s) => {
                self.p.next();
                s
            }
            _ => String::new(),
        };
        self.p.expect(":")?;
        let ty_pos = self.p.pos();
        let ty = self.p.ty()?;
        self.p.expect("=")?;
        let data_pos = self.p.pos();
        let data = if self.p.is_ident("external") {
            self.p.next();
            let dims = ty
                .dims
                .iter()
                .map(|d| d.as_known().and_then(|k| usize::try_from(k).ok()))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| {
                    error_at(
                        ty_pos,
                        format!("expected a weight type with known non-negative dims, found {ty}"),
                    )
                })?;
            let data = (self.resolve)(index, &name, ty.dtype, &dims)
                .map_err(|m| error_at(data_pos, format!("cannot resolve weight w{index}: {m}")))?;
            let expected = dims
                .iter()
                .try_fold(ty.dtype.size_of(), |a, &d| a.checked_mul(d));
            if data.dtype != ty.dtype || data.dims != dims || expected != Some(data.bytes.len()) {
                return Err(error_at(
                    data_pos,
                    format!(
                        "weight w{index} is {ty}, but its resolver gave {}{:?} in {} bytes",
                        data.dtype,
                        data.dims,
                        data.bytes.len()
                    ),
                ));
            }
            data
        } else {
            let data = self.p.const_data(Some(&ty))?;
            let dims: Vec<i64> = data.dims.iter().map(|&d| d as i64).collect();
            let data_ty = TensorType::known(data.dtype, &dims);
            if data_ty != ty {
                return Err(error_at(
                    data_pos,
                    format!("weight w{index} is declared {ty}, but its data is {data_ty}"),
                ));
            }
            data
        };
        self.program.weights.push(data);
        Ok(())
    }

    fn arena(&mut self) -> Result<(), ParseError> {
        self.p.next();
        self.declare(Decl::Arena, self.program.arenas.len())?;
        if !self.p.is_ident("on") {
            return self.p.expected("`on` and a device");
        }
        self.p.next();
        let device = self.word("a device (`cpu`, `vulkan`)")?;
        let memory = self.word("a memory kind (`host`, `device_local`, ...)")?;
        let mut arena = Arena {
            device,
            memory,
            size: None,
            lower_bound: None,
        };
        if self.p.is_ident("size") {
            self.p.next();
            arena.size = Some(self.uint("a size in bytes")?);
        }
        if self.p.is_ident("lower_bound") {
            self.p.next();
            arena.lower_bound = Some(self.uint("a lower bound in bytes")?);
        }
        self.program.arenas.push(arena);
        Ok(())
    }

    fn buffer(&mut self, pos: Pos) -> Result<(), ParseError> {
        self.p.next();
        self.declare(Decl::Buffer, self.program.buffers.len())?;
        let name = self.string("a buffer name (a string)")?;
        self.p.expect(":")?;
        let ty = self.p.ty()?;
        self.p.expect("=")?;
        let word = match self.p.peek() {
            Tok::Ident(w) => w.clone(),
            _ => String::new(),
        };
        let storage = match word.as_str() {
            "input" => {
                self.p.next();
                Storage::Input(self.index_number("an input number")?)
            }
            "output" => {
                self.p.next();
                Storage::Output(self.index_number("an output number")?)
            }
            "weight" => {
                self.p.next();
                Storage::Weight(self.reference(Decl::Weight)?)
            }
            "arena" => {
                self.p.next();
                let arena = self.reference(Decl::Arena)?;
                let offset = if self.p.is_ident("offset") {
                    self.p.next();
                    Some(self.uint("an offset in bytes")?)
                } else {
                    None
                };
                Storage::Arena { arena, offset }
            }
            "dynamic" => {
                self.p.next();
                Storage::Dynamic
            }
            "state" => {
                self.p.next();
                Storage::State(self.reference(Decl::State)?)
            }
            _ => return self.p.expected(
                "a storage (`input N`, `output N`, `weight wN`, `arena aN [offset N]`, `dynamic`, `state sN`)",
            ),
        };
        self.program.buffers.push(BufferDecl { name, ty, storage });
        self.places.buffers.push(pos);
        Ok(())
    }

    /// `state sN %present: type -> %past: type`.
    fn state(&mut self) -> Result<(), ParseError> {
        self.p.next();
        self.declare(Decl::State, self.program.states.len())?;
        let (name, output_ty) = self.state_port()?;
        self.p.expect("->")?;
        let (input_name, input_ty) = self.state_port()?;
        self.program.states.push(StateDecl {
            name,
            input_name,
            input_ty,
            output_ty,
        });
        Ok(())
    }

    fn state_port(&mut self) -> Result<(String, TensorType), ParseError> {
        let (name, id, ty, pos) = self.p.value_def()?;
        if let Some(id) = id {
            return Err(error_at(
                pos,
                format!("expected a state port `%name: type`, found a value id `#{id}`"),
            ));
        }
        Ok((name, ty))
    }

    fn kernel(&mut self) -> Result<(), ParseError> {
        self.p.next();
        self.declare(Decl::Kernel, self.program.kernels.len())?;
        let name = self.string("a kernel name (a string)")?;
        let kind = match self.p.peek() {
            Tok::Ident(w) => KernelKind::from_word(w),
            _ => None,
        };
        let Some(kind) = kind else {
            let words: Vec<&str> = KernelKind::ALL.iter().map(|k| k.word()).collect();
            return self
                .p
                .expected(&format!("a kernel kind ({})", words.join(", ")));
        };
        self.p.next();
        if !self.p.is_ident("on") {
            return self.p.expected("`on` and a device");
        }
        self.p.next();
        let device = self.word("a device (`cpu`, `vulkan`)")?;
        self.p.expect("=")?;
        let body = self.p.graph()?;
        self.program.kernels.push(Kernel {
            name,
            kind,
            device,
            body,
        });
        Ok(())
    }

    fn step(&mut self, pos: Pos) -> Result<(), ParseError> {
        self.p.next();
        let step = if self.p.is_ident("dispatch") {
            self.p.next();
            let kernel = self.reference(Decl::Kernel)?;
            self.p.expect("(")?;
            let mut args = Vec::new();
            if !self.p.eat(")") {
                loop {
                    args.push(self.reference(Decl::Buffer)?);
                    if !self.p.list_sep(")")? {
                        break;
                    }
                }
            }
            self.p.expect("->")?;
            self.p.expect("(")?;
            let mut results = Vec::new();
            if !self.p.eat(")") {
                loop {
                    if self.p.is_ident("_") {
                        self.p.next();
                        results.push(None);
                    } else {
                        results.push(Some(self.reference(Decl::Buffer)?));
                    }
                    if !self.p.list_sep(")")? {
                        break;
                    }
                }
            }
            Step::Dispatch {
                kernel,
                args,
                results,
            }
        } else if self.p.is_ident("copy") {
            self.p.next();
            let src = self.reference(Decl::Buffer)?;
            self.p.expect("->")?;
            let dst = self.reference(Decl::Buffer)?;
            Step::Copy { src, dst }
        } else {
            return self.p.expected("`dispatch` or `copy`");
        };
        self.program.steps.push(step);
        self.places.steps.push(pos);
        Ok(())
    }

    // ---- pieces ----

    /// The number of a `wN`, `aN`, `bN` or `kN` token, or `None` when the token is not one.
    fn numbered(&self, decl: Decl) -> Option<usize> {
        let Tok::Ident(s) = self.p.peek() else {
            return None;
        };
        let digits = s.strip_prefix(decl.letter())?;
        let canonical = digits == "0" || (!digits.starts_with('0') && !digits.is_empty());
        if !canonical || !digits.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// A declaration's number, which must be the next of its kind.
    fn declare(&mut self, decl: Decl, next: usize) -> Result<usize, ParseError> {
        let l = decl.letter();
        match self.numbered(decl) {
            Some(i) if i == next => {
                self.p.next();
                Ok(i)
            }
            Some(i) => Err(error_at(
                self.p.pos(),
                format!(
                    "expected `{l}{next}` ({}s are numbered in order of declaration), found `{l}{i}`",
                    decl.word()
                ),
            )),
            None => self.p.expected(&format!("`{l}{next}`")),
        }
    }

    /// A reference to a declaration, checked once the whole program is read.
    fn reference(&mut self, decl: Decl) -> Result<usize, ParseError> {
        match self.numbered(decl) {
            Some(i) => {
                self.refs.push((decl, i, self.p.pos()));
                self.p.next();
                Ok(i)
            }
            None => self
                .p
                .expected(&format!("a {} `{}N`", decl.word(), decl.letter())),
        }
    }

    fn check_refs(&self) -> Result<(), ParseError> {
        for &(decl, i, pos) in &self.refs {
            let n = match decl {
                Decl::Weight => self.program.weights.len(),
                Decl::Arena => self.program.arenas.len(),
                Decl::Buffer => self.program.buffers.len(),
                Decl::Kernel => self.program.kernels.len(),
                Decl::State => self.program.states.len(),
            };
            if i >= n {
                let l = decl.letter();
                let declared = if n == 0 {
                    format!("the program declares no {}s", decl.word())
                } else {
                    format!(
                        "the program declares {n} {}{} (`{l}0` to `{l}{}`)",
                        decl.word(),
                        if n == 1 { "" } else { "s" },
                        n - 1
                    )
                };
                return Err(error_at(
                    pos,
                    format!("unknown {} `{l}{i}`: {declared}", decl.word()),
                ));
            }
        }
        Ok(())
    }

    fn word(&mut self, what: &str) -> Result<String, ParseError> {
        match self.p.peek().clone() {
            Tok::Ident(s) | Tok::Str(s) => {
                self.p.next();
                Ok(s)
            }
            _ => self.p.expected(what),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        match self.p.peek().clone() {
            Tok::Str(s) => {
                self.p.next();
                Ok(s)
            }
            _ => self.p.expected(what),
        }
    }

    fn uint(&mut self, what: &str) -> Result<u64, ParseError> {
        let pos = self.p.pos();
        match self.p.peek().clone() {
            Tok::Int(s) => {
                self.p.next();
                s.parse().map_err(|_| {
                    error_at(pos, format!("expected a u64, found `{s}` (out of range)"))
                })
            }
            _ => self.p.expected(what),
        }
    }

    fn index_number(&mut self, what: &str) -> Result<usize, ParseError> {
        let pos = self.p.pos();
        let n = self.uint(what)?;
        usize::try_from(n).map_err(|_| error_at(pos, format!("{n} is out of range")))
    }
}
