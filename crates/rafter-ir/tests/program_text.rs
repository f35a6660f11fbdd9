//! The program text format: round trips (inline and by reference), hand-written programs,
//! and errors with their line and column.

use bytes::Bytes;
use half::bf16;
use rafter_ir::program::{Arena, BufferDecl, Kernel, KernelKind, Port, Program, Step, Storage};
use rafter_ir::program_text::{
    parse_program, parse_program_inline, parse_program_unverified, print_program, WeightMode,
};
use rafter_ir::text::{parse_graph, parse_type, ParseError};
use rafter_ir::{ConstData, DType, Symbol};

fn ty(s: &str) -> rafter_ir::TensorType {
    parse_type(s).unwrap()
}

fn port(name: &str, t: &str) -> Port {
    Port {
        name: name.into(),
        ty: ty(t),
    }
}

fn buffer(name: &str, t: &str, storage: Storage) -> BufferDecl {
    BufferDecl {
        name: name.into(),
        ty: ty(t),
        storage,
    }
}

fn kernel(name: &str, kind: KernelKind, device: &str, body: &str) -> Kernel {
    Kernel {
        name: name.into(),
        kind,
        device: device.into(),
        body: parse_graph(body).unwrap(),
    }
}

fn dispatch(kernel: usize, args: &[usize], results: &[Option<usize>]) -> Step {
    Step::Dispatch {
        kernel,
        args: args.to_vec(),
        results: results.to_vec(),
    }
}

fn f32s(dims: &[usize], xs: &[f32]) -> ConstData {
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    ConstData::new(DType::F32, dims.to_vec(), Bytes::from(bytes)).unwrap()
}

/// Every storage, every kernel kind, bounds, arenas with and without sizes, weights that
/// print dense, as hex and that no buffer names, dispatches with absent results, copies,
/// and names that need quoting.
fn every_feature() -> Program {
    let big: Vec<f32> = (0..100).map(|i| i as f32 * 0.25 - 3.0).collect();
    let odd_nan = bf16::from_bits(0x7fc1);
    let halves: Vec<u8> = [bf16::from_f32(1.5), odd_nan, bf16::from_f32(-0.0)]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    Program {
        name: "bert".into(),
        inputs: vec![
            port("input_ids", "i64[batch, seq]"),
            port("odd name", "f32[batch, seq, 2]"),
        ],
        outputs: vec![
            port("out", "f32[batch, seq, 2]"),
            port("nz", "i64[2, n_nz]"),
            port("", "i64[batch, seq]"),
        ],
        bounds: vec![(Symbol::new("batch"), 8), (Symbol::new("seq"), 2048)],
        dim_bounds: vec![],
        symbol_defs: vec![
            rafter_ir::SymbolDef {
                symbol: Symbol::new("half"),
                expr: rafter_ir::SymbolExpr::FloorDiv {
                    num: rafter_ir::Dim::symbol("seq").add(&rafter_ir::Dim::known(1)),
                    den: 2,
                },
            },
            rafter_ir::SymbolDef {
                symbol: Symbol::new("lane"),
                expr: rafter_ir::SymbolExpr::Mod {
                    num: rafter_ir::Dim::symbol("half"),
                    den: 4,
                },
            },
            rafter_ir::SymbolDef {
                symbol: Symbol::new("wide"),
                expr: rafter_ir::SymbolExpr::Broadcast {
                    a: rafter_ir::Dim::symbol("half"),
                    b: rafter_ir::Dim::symbol("batch"),
                },
            },
        ],
        states: vec![],
        weights: vec![
            f32s(&[2, 2], &[1.0, -0.0, 0.1, f32::INFINITY]),
            f32s(&[100], &big),
            ConstData::new(DType::BF16, vec![3], Bytes::from(halves)).unwrap(),
            ConstData::from_i64s(&[7, -1]),
        ],
        arenas: vec![
            Arena {
                device: "cpu".into(),
                memory: "host".into(),
                size: Some(4096),
                lower_bound: Some(3072),
            },
            Arena {
                device: "vulkan".into(),
                memory: "device_local".into(),
                size: None,
                lower_bound: None,
            },
            Arena {
                device: "gpu 1".into(),
                memory: "host_visible_shared".into(),
                size: Some(0),
                lower_bound: None,
            },
        ],
        buffers: vec![
            buffer("input_ids", "i64[batch, seq]", Storage::Input(0)),
            buffer("odd name", "f32[batch, seq, 2]", Storage::Input(1)),
            buffer("encoder.w", "f32[2, 2]", Storage::Weight(0)),
            buffer("big \"quoted\"", "f32[100]", Storage::Weight(1)),
            buffer("halves", "bf16[3]", Storage::Weight(2)),
            buffer(
                "t1",
                "f32[batch, seq, 2]",
                Storage::Arena {
                    arena: 0,
                    offset: Some(0),
                },
            ),
            buffer(
                "t2",
                "f32[batch, seq, 2]",
                Storage::Arena {
                    arena: 1,
                    offset: None,
                },
            ),
            buffer("nz_tmp", "i64[2, n_nz]", Storage::Dynamic),
            buffer("out", "f32[batch, seq, 2]", Storage::Output(0)),
            buffer("nz", "i64[2, n_nz]", Storage::Output(1)),
            buffer("", "i64[batch, seq]", Storage::Output(2)),
            buffer(
                "sum",
                "f32[batch, seq]",
                Storage::Arena {
                    arena: 2,
                    offset: Some(64),
                },
            ),
        ],
        kernels: vec![
            kernel(
                "embed",
                KernelKind::Contraction,
                "cpu",
                "graph @embed(%ids: i64[batch, seq], %x: f32[batch, seq, 2], %w: f32[2, 2]) -> (%y) {
                   const %b: f32[2] = dense [0.5, -0.5]
                   %m: f32[batch, seq, 2] = matmul(%x, %w)
                   %y: f32[batch, seq, 2] = binary{op = add}(%m, %b)
                 }",
            ),
            kernel(
                "act",
                KernelKind::Elementwise,
                "vulkan",
                "graph @act(%x: f32[batch, seq, 2]) -> (%y, %x) {
                   %y: f32[batch, seq, 2] = unary{op = relu}(%x)
                 }",
            ),
            kernel(
                "",
                KernelKind::Reduction,
                "cpu",
                "graph @\"\"(%x: f32[batch, seq, 2]) -> (%s) {
                   %s: f32[batch, seq] = reduce{kind = sum, axes = [2], keep_dims = false, noop_with_empty_axes = false}(%x)
                 }",
            ),
            kernel(
                "transpose",
                KernelKind::DataMovement,
                "gpu 1",
                "graph @t(%x: f32[batch, seq, 2]) -> (%y) {
                   %y: f32[batch, seq, 2] = transpose{perm = [0, 1, 2]}(%x)
                 }",
            ),
            kernel(
                "nonzero",
                KernelKind::Opaque,
                "cpu",
                "graph @nonzero(%x: i64[batch, seq]) -> (%y) {
                   %y: i64[2, n_nz] = non_zero(%x)
                 }",
            ),
        ],
        steps: vec![
            dispatch(0, &[0, 1, 2], &[Some(5)]),
            dispatch(1, &[5], &[Some(6), None]),
            dispatch(2, &[6], &[Some(11)]),
            dispatch(3, &[6], &[Some(8)]),
            dispatch(4, &[0], &[Some(7)]),
            Step::Copy { src: 7, dst: 9 },
            Step::Copy { src: 0, dst: 10 },
        ],
    }
}

/// Prints inline, parses, compares, and checks that printing is a fixed point.
#[track_caller]
fn round_trip(p: &Program) -> String {
    p.verify().unwrap();
    let text = print_program(p, WeightMode::Inline);
    let back = match parse_program_inline(&text) {
        Ok(b) => b,
        Err(e) => panic!("{e}\n--- text ---\n{text}"),
    };
    assert_eq!(&back, p, "--- text ---\n{text}");
    assert_eq!(print_program(&back, WeightMode::Inline), text);
    text
}

#[test]
fn round_trip_inline() {
    let p = every_feature();
    let text = round_trip(&p);
    for line in [
        "program @bert(%input_ids: i64[batch, seq], %\"odd name\": f32[batch, seq, 2]) -> (%out: f32[batch, seq, 2], %nz: i64[2, n_nz], %\"\": i64[batch, seq])\n",
        "bounds { batch <= 8, seq <= 2048 }\n",
        "weight w0 \"encoder.w\": f32[2, 2] = dense [1.0, -0.0, 0.1, inf]\n",
        "weight w1 \"big \\\"quoted\\\"\": f32[100] = hex \"000040c0",
        "weight w2 \"halves\": bf16[3] = hex \"c03fc17f0080\"\n",
        "weight w3: i64[2] = dense [7, -1]\n",
        "arena a0 on cpu host size 4096 lower_bound 3072\n",
        "arena a1 on vulkan device_local\n",
        "arena a2 on \"gpu 1\" host_visible_shared size 0\n",
        "buffer b0 \"input_ids\": i64[batch, seq] = input 0\n",
        "buffer b2 \"encoder.w\": f32[2, 2] = weight w0\n",
        "buffer b5 \"t1\": f32[batch, seq, 2] = arena a0 offset 0\n",
        "buffer b6 \"t2\": f32[batch, seq, 2] = arena a1\n",
        "buffer b7 \"nz_tmp\": i64[2, n_nz] = dynamic\n",
        "buffer b10 \"\": i64[batch, seq] = output 2\n",
        "kernel k0 \"embed\" contraction on cpu = graph @embed(",
        "  const %b: f32[2] = dense [0.5, -0.5]\n",
        "kernel k2 \"\" reduction on cpu = graph @\"\"(",
        "kernel k3 \"transpose\" data_movement on \"gpu 1\" = graph @t(",
        "kernel k4 \"nonzero\" opaque on cpu = ",
        "step dispatch k0 (b0, b1, b2) -> (b5)\n",
        "step dispatch k1 (b5) -> (b6, _)\n",
        "step copy b7 -> b9\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    for kind in KernelKind::ALL {
        assert!(text.contains(&format!(" {} on ", kind.word())), "{kind:?}");
    }
}

#[test]
fn round_trip_by_reference() {
    let p = every_feature();
    let text = print_program(&p, WeightMode::Reference);
    assert!(
        text.contains("weight w0 \"encoder.w\": f32[2, 2] = external\n"),
        "{text}"
    );
    assert!(text.contains("weight w3: i64[2] = external\n"), "{text}");
    assert!(
        !text.contains("000040c0"),
        "weight bytes leaked into\n{text}"
    );
    let mut calls = Vec::new();
    let back = parse_program(&text, &mut |i, name, dtype, dims| {
        calls.push((i, name.to_string(), dtype, dims.to_vec()));
        Ok(p.weights[i].clone())
    })
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, p);
    assert_eq!(
        calls,
        vec![
            (0, "encoder.w".to_string(), DType::F32, vec![2, 2]),
            (1, "big \"quoted\"".to_string(), DType::F32, vec![100]),
            (2, "halves".to_string(), DType::BF16, vec![3]),
            (3, String::new(), DType::I64, vec![2]),
        ]
    );
    assert_eq!(print_program(&back, WeightMode::Reference), text);

    // Reference text does not parse without a resolver that knows the weights.
    let e = parse_program_inline(&text).unwrap_err();
    let (line, col) = position(&text, "external");
    assert_eq!((e.line, e.col), (line, col), "{e}");
    assert!(e.message.contains("cannot resolve weight w0"), "{e}");
}

#[test]
fn round_trip_small_programs() {
    round_trip(&Program::default());
    let mut p = Program {
        name: "copy only".into(),
        inputs: vec![port("x", "f32[]")],
        outputs: vec![port("y", "f32[]")],
        buffers: vec![
            buffer("x", "f32[]", Storage::Input(0)),
            buffer("y", "f32[]", Storage::Output(0)),
        ],
        steps: vec![Step::Copy { src: 0, dst: 1 }],
        ..Program::default()
    };
    let text = round_trip(&p);
    assert_eq!(
        text,
        "program @\"copy only\"(%x: f32[]) -> (%y: f32[])\n\n\
         buffer b0 \"x\": f32[] = input 0\n\
         buffer b1 \"y\": f32[] = output 0\n\n\
         step copy b0 -> b1\n"
    );
    // A kernel with no operands and no results, and a negative bound.
    p.kernels.push(kernel(
        "noop",
        KernelKind::Opaque,
        "cpu",
        "graph @noop() -> () {}",
    ));
    p.steps.push(dispatch(0, &[], &[]));
    p.bounds.push((Symbol::new("_odd"), -1));
    round_trip(&p);
}

#[test]
fn hand_written_program_parses() {
    let src = r#"
// A hand-written program: items interleave, and references may point further down.
program @mlp(%x: f32[batch, 4]) -> (%y: f32[batch, 4])
bounds {}
bounds { batch <= 16 }

step dispatch k0 (b0, b1) -> (b2, _)   // fused matmul + relu
step copy b2 -> b3

kernel k0 "mm_relu" contraction on cpu = graph @k0(%x: f32[batch, 4], %w: f32[4, 4]) -> (%y, %m) {
  %m: f32[batch, 4] = matmul(%x, %w)
  %y: f32[batch, 4] = unary{op = relu}(%m)
}

weight w0: f32[4, 4] = dense<f32[4, 4]> [1, 0, 0, 0,  0, 1, 0, 0,  0, 0, 1, 0,  0, 0, 0, 1]
arena a0 on cpu "host" lower_bound 64

buffer b0 "x": f32[batch, 4] = input 0
buffer b1 "w": f32[4, 4] = weight w0
buffer b2 "t": f32[batch, 4] = arena a0
buffer b3 "y": f32[batch, 4] = output 0
"#;
    let mut eye = vec![0.0f32; 16];
    for i in 0..4 {
        eye[i * 5] = 1.0;
    }
    let want = Program {
        name: "mlp".into(),
        inputs: vec![port("x", "f32[batch, 4]")],
        outputs: vec![port("y", "f32[batch, 4]")],
        bounds: vec![(Symbol::new("batch"), 16)],
        dim_bounds: vec![],
        symbol_defs: vec![],
        states: vec![],
        weights: vec![f32s(&[4, 4], &eye)],
        buffers: vec![
            buffer("x", "f32[batch, 4]", Storage::Input(0)),
            buffer("w", "f32[4, 4]", Storage::Weight(0)),
            buffer(
                "t",
                "f32[batch, 4]",
                Storage::Arena {
                    arena: 0,
                    offset: None,
                },
            ),
            buffer("y", "f32[batch, 4]", Storage::Output(0)),
        ],
        arenas: vec![Arena {
            device: "cpu".into(),
            memory: "host".into(),
            size: None,
            lower_bound: Some(64),
        }],
        kernels: vec![kernel(
            "mm_relu",
            KernelKind::Contraction,
            "cpu",
            "graph @k0(%x: f32[batch, 4], %w: f32[4, 4]) -> (%y, %m) {
               %m: f32[batch, 4] = matmul(%x, %w)
               %y: f32[batch, 4] = unary{op = relu}(%m)
             }",
        )],
        steps: vec![
            dispatch(0, &[0, 1], &[Some(2), None]),
            Step::Copy { src: 2, dst: 3 },
        ],
    };
    let got = parse_program_inline(src).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, want);
    round_trip(&got);
}

#[test]
fn unverified_parse_keeps_programs_the_verifier_rejects() {
    // Writes a read-only input and leaves the output unwritten.
    let src = "program @bad(%x: f32[2]) -> (%y: f32[2])\n\
               buffer b0 \"x\": f32[2] = input 0\n\
               buffer b1 \"y\": f32[2] = output 0\n\
               step copy b1 -> b0\n";
    let mut no_weights = |_: usize, _: &str, _: DType, _: &[usize]| Err("none".to_string());
    let p = parse_program_unverified(src, &mut no_weights).unwrap();
    assert!(p.verify().is_err());
    assert_eq!(p.steps, vec![Step::Copy { src: 1, dst: 0 }]);
    let e = parse_program(src, &mut no_weights).unwrap_err();
    assert_eq!((e.line, e.col), (4, 1), "{e}");
    assert!(e.message.contains("reads buffer 1 `y` before"), "{e}");
}

/// A small deterministic generator (no dependency on `rand`).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    fn maybe(&mut self, n: u64) -> Option<u64> {
        (self.below(2) == 0).then(|| self.next() % n)
    }
}

/// A random program whose references are all in range (it need not verify).
fn random_program(r: &mut Lcg) -> Program {
    const NAMES: [&str; 6] = ["x", "", "odd name", "a.b/c:d", "q\"uote", "ü"];
    const TYPES: [&str; 5] = [
        "f32[]",
        "i64[batch, seq]",
        "f16[2*seq - 1]",
        "bool[0]",
        "u8[3, n]",
    ];
    const DEVICES: [&str; 4] = ["cpu", "vulkan", "gpu 1", "_"];
    const DTYPES: [DType; 6] = [
        DType::F32,
        DType::I64,
        DType::Bool,
        DType::F16,
        DType::U8,
        DType::F64,
    ];
    const BODIES: [&str; 3] = [
        "graph @a(%x: f32[]) -> (%x) {}",
        "graph @b() -> () {}",
        "graph @c(%x: f32[4], %y: f32[4]) -> (%z, %x) {\n  %z: f32[4] = binary{op = mul}(%x, %y)\n}",
    ];
    let ports = |r: &mut Lcg| -> Vec<Port> {
        (0..r.below(4))
            .map(|_| port(r.pick(&NAMES), r.pick(&TYPES)))
            .collect()
    };
    let mut p = Program {
        name: r.pick(&NAMES).to_string(),
        inputs: ports(r),
        outputs: ports(r),
        ..Program::default()
    };
    for _ in 0..r.below(3) {
        let sym = r.pick(&["batch", "seq", "n"]);
        p.bounds
            .push((Symbol::new(sym), r.next() as i64 - (1 << 30)));
    }
    for _ in 0..r.below(4) {
        let dtype = r.pick(&DTYPES);
        let dims: Vec<usize> = (0..r.below(3)).map(|_| r.below(5)).collect();
        let len = dtype.size_of() * dims.iter().product::<usize>();
        let bytes: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
        p.weights
            .push(ConstData::new(dtype, dims, Bytes::from(bytes)).unwrap());
    }
    for _ in 0..r.below(3) {
        p.arenas.push(Arena {
            device: r.pick(&DEVICES).to_string(),
            memory: r.pick(&["host", "device_local", "odd memory"]).to_string(),
            size: r.maybe(1 << 40),
            lower_bound: r.maybe(1 << 20),
        });
    }
    for _ in 0..r.below(6) {
        let storage = match r.below(5) {
            0 => Storage::Input(r.below(4)),
            1 => Storage::Output(r.below(4)),
            2 if !p.weights.is_empty() => Storage::Weight(r.below(p.weights.len())),
            3 if !p.arenas.is_empty() => Storage::Arena {
                arena: r.below(p.arenas.len()),
                offset: r.maybe(u64::MAX),
            },
            _ => Storage::Dynamic,
        };
        p.buffers
            .push(buffer(r.pick(&NAMES), r.pick(&TYPES), storage));
    }
    let kinds = KernelKind::ALL;
    for _ in 0..r.below(3) {
        p.kernels.push(kernel(
            r.pick(&NAMES),
            r.pick(&kinds),
            r.pick(&DEVICES),
            r.pick(&BODIES),
        ));
    }
    let nb = p.buffers.len();
    for _ in 0..r.below(5) {
        if nb == 0 {
            break;
        }
        if r.below(2) == 0 || p.kernels.is_empty() {
            p.steps.push(Step::Copy {
                src: r.below(nb),
                dst: r.below(nb),
            });
        } else {
            let args = (0..r.below(3)).map(|_| r.below(nb)).collect();
            let results = (0..r.below(3))
                .map(|_| (r.below(3) > 0).then(|| r.below(nb)))
                .collect();
            p.steps.push(Step::Dispatch {
                kernel: r.below(p.kernels.len()),
                args,
                results,
            });
        }
    }
    p
}

#[test]
fn random_programs_round_trip_unverified() {
    let mut r = Lcg(0x5eed);
    for case in 0..300 {
        let p = random_program(&mut r);
        for mode in [WeightMode::Inline, WeightMode::Reference] {
            let text = print_program(&p, mode);
            let mut resolve = |i: usize, _: &str, dtype: DType, dims: &[usize]| {
                assert_eq!((dtype, dims), (p.weights[i].dtype, &p.weights[i].dims[..]));
                Ok(p.weights[i].clone())
            };
            let back = parse_program_unverified(&text, &mut resolve)
                .unwrap_or_else(|e| panic!("case {case}: {e}\n{text}"));
            assert_eq!(back, p, "case {case}\n{text}");
            assert_eq!(print_program(&back, mode), text);
        }
    }
}

// ---- errors ----

/// Line and column (1-based) of the first occurrence of `needle` in `src`.
fn position(src: &str, needle: &str) -> (usize, usize) {
    let at = src
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in {src}"));
    let before = &src[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.chars().rev().take_while(|&c| c != '\n').count() + 1;
    (line, col)
}

/// Parses `src` (inline weights), expecting an error at the `nth` occurrence of `at`
/// (counted from 0) whose message contains `message`.
#[track_caller]
fn error_at(src: &str, at: &str, message: &str) -> ParseError {
    let e = match parse_program_inline(src) {
        Ok(p) => panic!("parsed, expected an error at {at:?}: {p:?}"),
        Err(e) => e,
    };
    assert_eq!((e.line, e.col), position(src, at), "{e}\n{src}");
    assert!(e.message.contains(message), "{e}\nwanted: {message}");
    e
}

const HEAD: &str = "program @p(%x: f32[2]) -> (%y: f32[2])\n\
                    buffer b0 \"x\": f32[2] = input 0\n\
                    buffer b1 \"y\": f32[2] = output 0\n";

#[test]
fn unknown_references() {
    let src = format!("{HEAD}step dispatch k3 (b0) -> (b1)\n");
    let e = error_at(&src, "k3", "unknown kernel `k3`");
    assert_eq!(
        e.to_string(),
        "4:15: unknown kernel `k3`: the program declares no kernels"
    );
    let src = format!(
        "{HEAD}kernel k0 \"id\" elementwise on cpu = graph @id(%a: f32[2]) -> (%a) {{}}\n\
         step dispatch k0 (b0) -> (b2)\n"
    );
    error_at(
        &src,
        "b2)",
        "unknown buffer `b2`: the program declares 2 buffers (`b0` to `b1`)",
    );
    let src = format!("{HEAD}buffer b2 \"w\": f32[2] = weight w0\n");
    error_at(&src, "w0", "unknown weight `w0`");
    let src = format!("{HEAD}buffer b2 \"t\": f32[2] = arena a1 offset 0\n");
    error_at(&src, "a1", "unknown arena `a1`");
}

#[test]
fn syntax_errors() {
    error_at(
        &format!("{HEAD}buffer b2 \"t\": f32[2] = stack 0\n"),
        "stack",
        "expected a storage (`input N`, `output N`, `weight wN`, `arena aN [offset N]`, `dynamic`, `state sN`), found `stack`",
    );
    error_at(
        &format!("{HEAD}buffer b3 \"t\": f32[2] = dynamic\n"),
        "b3",
        "expected `b2` (buffers are numbered in order of declaration), found `b3`",
    );
    error_at(
        &format!("{HEAD}buffer b02 \"t\": f32[2] = dynamic\n"),
        "b02",
        "expected `b2`, found `b02`",
    );
    error_at(
        &format!("{HEAD}buffer b2 t: f32[2] = dynamic\n"),
        "t:",
        "expected a buffer name (a string)",
    );
    error_at(
        &format!("{HEAD}kernel k0 \"k\" fused on cpu = graph @k() -> () {{}}\n"),
        "fused",
        "expected a kernel kind (contraction, elementwise, reduction, data_movement, opaque), found `fused`",
    );
    error_at(
        &format!("{HEAD}kernel k0 \"k\" opaque on cpu = graph @k() -> (%nope) {{}}\n"),
        "%nope",
        "unknown value `%nope`",
    );
    error_at(
        &format!("{HEAD}step launch k0 () -> ()\n"),
        "launch",
        "expected `dispatch` or `copy`",
    );
    error_at(
        &format!("{HEAD}step copy b0 -> _\n"),
        "_",
        "expected a buffer `bN`",
    );
    error_at(
        &format!("{HEAD}arena a0 cpu host\n"),
        "cpu",
        "expected `on` and a device",
    );
    error_at(
        &format!("{HEAD}arena a0 on cpu host size -1\n"),
        "-1",
        "expected a size in bytes",
    );
    error_at(
        &format!("{HEAD}bounds {{ seq < 5 }}\n"),
        "5",
        "expected `=`",
    );
    error_at(
        &format!("{HEAD}buffers\n"),
        "buffers",
        "expected an item (`bounds`, `define`, `state`, `weight`, `arena`, `buffer`, `kernel`, `step`) or end of input",
    );
    error_at(
        "program @p(%x#0: f32[2]) -> ()\n",
        "%x#0",
        "ports have no ids",
    );
    error_at("graph @g() -> () {}", "graph", "expected `program`");
}

#[test]
fn malformed_weights() {
    error_at(
        &format!("{HEAD}weight w0 \"w\": f32[2, 2] = dense [1.0, 2.0, 3.0]\n"),
        "[1.0",
        "expected 4 elements for f32[2, 2], found 3",
    );
    error_at(
        &format!("{HEAD}weight w0 \"w\": f32[2] = hex \"0000803\"\n"),
        "\"0000803\"",
        "expected an even number of hex digits",
    );
    error_at(
        &format!("{HEAD}weight w0 \"w\": f32[2] = dense<f32[1, 2]> [1.0, 2.0]\n"),
        "dense<",
        "weight w0 is declared f32[2], but its data is f32[1, 2]",
    );
    error_at(
        &format!("{HEAD}weight w0 \"w\": i8[2] = dense [1, 300]\n"),
        "300",
        "expected a i8 element in -128..=127, found 300",
    );
    error_at(
        &format!("{HEAD}weight w0 \"w\": f32[n] = external\n"),
        "f32[n]",
        "expected a weight type with known non-negative dims, found f32[n]",
    );
    error_at(
        &format!("{HEAD}weight w0 \"w\": f32[2] = 1.0\n"),
        "1.0",
        "expected constant data",
    );

    // A resolver's error, and a resolver that gives the wrong shape.
    let src = format!("{HEAD}weight w0 \"enc.w\": f32[2] = external\n");
    let mut missing = |_: usize, name: &str, _: DType, _: &[usize]| {
        Err(format!("no tensor `{name}` in the artifact"))
    };
    let e = parse_program(&src, &mut missing).unwrap_err();
    assert_eq!((e.line, e.col), position(&src, "external"));
    assert_eq!(
        e.message,
        "cannot resolve weight w0: no tensor `enc.w` in the artifact"
    );
    let mut wrong = |_: usize, _: &str, _: DType, _: &[usize]| Ok(ConstData::from_i64s(&[1, 2]));
    let e = parse_program(&src, &mut wrong).unwrap_err();
    assert_eq!((e.line, e.col), position(&src, "external"));
    assert!(
        e.message
            .contains("weight w0 is f32[2], but its resolver gave i64[2]"),
        "{e}"
    );
}

#[test]
fn verifier_errors_point_at_their_item() {
    // An input number out of range: at the buffer.
    let src = "program @p(%x: f32[2]) -> (%y: f32[2])\n\
               buffer b0 \"x\": f32[2] = input 4\n\
               buffer b1 \"y\": f32[2] = output 0\n";
    let e = error_at(
        src,
        "buffer b0",
        "buffer 0 `x` is input 4, but there are 1 inputs",
    );
    assert!(e.message.starts_with("program `p`: "), "{e}");
    // A type that disagrees with its weight: at the buffer.
    error_at(
        &format!("{HEAD}weight w0: f32[3] = dense [1.0, 2.0, 3.0]\nbuffer b2 \"w\": f32[2] = weight w0\n"),
        "buffer b2",
        "buffer 2 `w` has type f32[2] but weight 0 is f32[3]",
    );
    // An arity mismatch: at the step.
    let src = format!(
        "{HEAD}kernel k0 \"id\" elementwise on cpu = graph @id(%a: f32[2]) -> (%a) {{}}\n\
         step dispatch k0 (b0, b0) -> (b1)\n"
    );
    error_at(
        &src,
        "step",
        "kernel `id` takes 1 operands and gives 1 results",
    );
    // A step that writes an input: at the step.
    error_at(
        &format!("{HEAD}step copy b0 -> b1\nstep copy b1 -> b0\n"),
        "step copy b1",
        "step 1 writes read-only buffer 0 `x`",
    );
    // An output nobody writes: at the buffer.
    error_at(HEAD, "buffer b1", "output buffer 1 `y` is never written");
    // An output without a buffer: at `program`.
    error_at(
        "// leading comment\nprogram @p() -> (%y: f32[2])\n",
        "program",
        "output 0 `y` has no buffer",
    );
}

/// A one-step KV cache: the state's input and output buffers share `state s0`, sum bounds
/// print and parse, and the growth axis and length symbol come from the declaration.
const KV_STEP: &str = r#"program @kv(%x: f32[1, seq, 4]) -> (%y: f32[1, past + seq, 4])
bounds { past <= 16, seq <= 16, past + seq <= 16 }

state s0 %present: f32[1, past + seq, 4] -> %past: f32[1, past, 4]

buffer b0 "x": f32[1, seq, 4] = input 0
buffer b1 "past": f32[1, past, 4] = state s0
buffer b2 "present": f32[1, past + seq, 4] = state s0
buffer b3 "y": f32[1, past + seq, 4] = output 0

kernel k0 "append" data_movement on cpu = graph @k0(%p: f32[1, past, 4], %x: f32[1, seq, 4]) -> (%c) {
  %c: f32[1, past + seq, 4] = concat{axis = 1}(%p, %x)
}

step dispatch k0 (b1, b0) -> (b2)
step copy b2 -> b3
"#;

#[test]
fn states_and_sum_bounds_round_trip() {
    let p = parse_program_inline(KV_STEP).unwrap();
    assert_eq!(p.states.len(), 1);
    assert_eq!(p.states[0].growth_axis(), Some(1));
    assert_eq!(p.states[0].length_symbol(), Some(&Symbol::new("past")));
    assert_eq!(p.bounds.len(), 2);
    assert_eq!(p.dim_bounds.len(), 1);
    let past_seq = parse_type("f32[past + seq]").unwrap().dims[0].clone();
    // A sum bound is used as it is, not as the sum of its symbols' bounds.
    assert_eq!(p.max_of(&past_seq), Some(16));
    assert_eq!(p.max_of(&past_seq.add(&rafter_ir::Dim::known(1))), Some(33));
    let text = print_program(&p, WeightMode::Inline);
    assert_eq!(parse_program_inline(&text).unwrap(), p);
    assert_eq!(
        text, KV_STEP,
        "the printer writes the hand-written text back"
    );
}

#[test]
fn bad_states_are_errors() {
    let e =
        parse_program_inline(&KV_STEP.replace("= state s0\nbuffer b2", "= state s1\nbuffer b2"))
            .unwrap_err();
    assert!(e.message.contains("unknown state `s1`"), "{e}");
    // Both ends grow behind a dim of 2: not a prefix of the state's buffer.
    let e = parse_program_inline(
        &KV_STEP
            .replace("f32[1, past + seq, 4]", "f32[2, past + seq, 4]")
            .replace("f32[1, past, 4]", "f32[2, past, 4]"),
    )
    .unwrap_err();
    assert!(e.message.contains("must be 1"), "{e}");
    let e = parse_program_inline(&KV_STEP.replace("bounds { past", "bounds { 3 <= 4, past"))
        .unwrap_err();
    assert!(e.message.contains("a symbol or a sum of symbols"), "{e}");
    let e = parse_program_inline(&KV_STEP.replace(
        "buffer b1 \"past\": f32[1, past, 4]",
        "buffer b1 \"past\": f32[1, seq, 4]",
    ))
    .unwrap_err();
    assert!(e.message.contains("but state 0 `present` is"), "{e}");
}

/// A definition reads only symbols bound before it; the verifier names the one it lacks,
/// and the parser names a definition it cannot read.
#[test]
fn symbol_definitions_are_checked() {
    let src = |def: &str| {
        format!(
            "program @p(%x: f32[h]) -> (%y: f32[h])\n{def}\n\
             kernel k0 \"id\" elementwise on cpu = graph @k0(%x: f32[h]) -> (%y) {{\n  \
             %y: f32[h] = unary{{op = relu}}(%x)\n}}\n\
             buffer b0 \"x\": f32[h] = input 0\nbuffer b1 \"y\": f32[h] = output 0\n\
             step dispatch k0 (b0) -> (b1)\n"
        )
    };
    let p = parse_program_inline(&src("define q = floordiv(h + 3, 4)")).unwrap();
    assert_eq!(p.symbol_defs.len(), 1);
    let e = parse_program_inline(&src("define q = floordiv(g + 3, 4)")).unwrap_err();
    assert!(e.to_string().contains("reads `g`"), "{e}");
    let e = parse_program_inline(&src("define q = ceil(h, 4)")).unwrap_err();
    assert!(
        e.to_string()
            .contains("`floordiv`, `mod`, `broadcast` or `values`"),
        "{e}"
    );
    let e = parse_program_inline(&src("define h = mod(h, 4)")).unwrap_err();
    assert!(e.to_string().contains("already bound"), "{e}");
}

/// A size read from an input's values (`define _r0 = values(...)` with the reshape that
/// makes it) round-trips through the text, and the verifier rejects one that reads the
/// values of something that is not an input.
#[test]
fn value_definitions_round_trip() {
    let src = |reads: &str| {
        format!(
            "program @p(%x: f32[h, 6], %shape: i64[2]) -> (%y: f32[h, 6])\n\
             define _r0 = values(0, 0, [1]) graph @d(%x: f32[h, 6], %{reads}: i64[2]) -> (%z) {{\n  \
             %z: f32[_r0, 3] = reshape{{allow_zero = false}}(%x, %{reads})\n}}\n\
             kernel k0 \"id\" elementwise on cpu = graph @k0(%x: f32[h, 6]) -> (%y) {{\n  \
             %y: f32[h, 6] = unary{{op = relu}}(%x)\n}}\n\
             buffer b0 \"x\": f32[h, 6] = input 0\nbuffer b1 \"shape\": i64[2] = input 1\n\
             buffer b2 \"y\": f32[h, 6] = output 0\n\
             step dispatch k0 (b0) -> (b2)\n"
        )
    };
    let p = parse_program_inline(&src("shape")).unwrap();
    assert_eq!(p.symbol_defs.len(), 1);
    assert!(matches!(
        &p.symbol_defs[0].expr,
        rafter_ir::SymbolExpr::Values { reads, axis: 0, output: 0, .. } if reads == &[1]
    ));
    let text = print_program(&p, WeightMode::Inline);
    assert!(
        text.contains("define _r0 = values(0, 0, [1]) graph @d("),
        "{text}"
    );
    assert_eq!(parse_program_inline(&text).unwrap(), p);
    let e = parse_program_inline(&src("target")).unwrap_err();
    assert!(e.to_string().contains("values of `target`"), "{e}");
}

/// The `read_ir_text` fuzz target's program seeds: the printed [`every_feature`] program
/// and the KV-cache step. `cargo test -p rafter-ir --test program_text -- --ignored`
/// rewrites them; `tests/fuzz_seeds.rs` checks every seed still parses.
#[test]
#[ignore = "rewrites fuzz/seeds/read_ir_text/program_*.txt"]
fn write_fuzz_seeds() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/read_ir_text");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("program_every_feature.txt"),
        round_trip(&every_feature()),
    )
    .unwrap();
    let kv = parse_program_inline(KV_STEP).unwrap();
    std::fs::write(dir.join("program_kv_step.txt"), round_trip(&kv)).unwrap();
}
