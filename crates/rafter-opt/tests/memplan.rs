//! The static memory planner: programs as text in (no offsets, as lowering makes them) and
//! planned programs as text out, with offsets computed by hand; a randomized check that no
//! two buffers live at once overlap; compiled graphs run with their arenas as real bytes.

mod common;

use common::{check_equivalent_with, parse, rand_f32};
use rafter_ir::arena::liveness;
use rafter_ir::program::Arena;
use rafter_ir::program::{BufferDecl, Kernel, KernelKind, Port, Program, Step, Storage};
use rafter_ir::program_text::{parse_program_inline, print_program, WeightMode};
use rafter_ir::{DType, Dim, Graph, Op, Symbol, TensorType, UnaryOp};
use rafter_opt::memplan::{check_plan, memory_report, plan_memory, PlanOptions};
use rafter_opt::{CompileError, CompileOptions};

/// `expected` with every planned offset and arena size removed: what lowering gives.
fn unplanned(expected: &str) -> String {
    expected
        .lines()
        .map(|line| {
            let line = match line.find(" offset ") {
                Some(i) if line.starts_with("buffer ") => &line[..i],
                _ => line,
            };
            match line.find(" size ") {
                Some(i) if line.starts_with("arena ") => &line[..i],
                _ => line,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Plans `unplanned(expected)` and checks the result is the program `expected` describes.
#[track_caller]
fn assert_plans_to(expected: &str, opts: &PlanOptions) -> Program {
    let input = unplanned(expected);
    let mut p = parse_program_inline(&input).unwrap_or_else(|e| panic!("{e}\n{input}"));
    assert!(memory_report(&p).iter().all(|r| r.size.is_none()));
    plan_memory(&mut p, opts).unwrap_or_else(|e| panic!("{e}"));
    let want = parse_program_inline(expected).unwrap_or_else(|e| panic!("{e}\n{expected}"));
    if p != want {
        panic!(
            "planned:\n{}\nexpected:\n{}",
            print_program(&p, WeightMode::Inline),
            print_program(&want, WeightMode::Inline)
        );
    }
    // The text format keeps the plan.
    let text = print_program(&p, WeightMode::Inline);
    assert_eq!(parse_program_inline(&text).unwrap(), p);
    p
}

const SOFTMAX: &str = r#"kernel k0 "sm" reduction on cpu = graph @sm(%a: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = softmax{kind = softmax, axis = 1}(%a)
}"#;

/// Four softmaxes in a row: the three intermediates (128 bytes each) ping-pong between two
/// slots; step 1 holds two of them, so 256 bytes is optimal.
#[test]
fn chain_reuses_dead_buffers() {
    let p = assert_plans_to(
        &format!(
            r#"program @chain(%x: f32[4, 8]) -> (%y: f32[4, 8])
arena a0 on cpu host size 256 lower_bound 256
buffer b0 "x": f32[4, 8] = input 0
buffer b1 "t1": f32[4, 8] = arena a0 offset 0
buffer b2 "t2": f32[4, 8] = arena a0 offset 128
buffer b3 "t3": f32[4, 8] = arena a0 offset 0
buffer b4 "y": f32[4, 8] = output 0
{SOFTMAX}
step dispatch k0 (b0) -> (b1)
step dispatch k0 (b1) -> (b2)
step dispatch k0 (b2) -> (b3)
step dispatch k0 (b3) -> (b4)
"#
        ),
        &PlanOptions::default(),
    );
    let report = memory_report(&p);
    assert_eq!(report.len(), 1);
    assert_eq!(
        report[0].to_string(),
        "memory cpu: arena 256 bytes, lower bound 256 bytes, ratio 1.000"
    );
}

/// A diamond: t1 (128 B, steps 0-2) feeds t2 (256 B, 1-3) and t3 (128 B, 2-3), which join
/// into t4 (384 B, 3-4). Step 3 holds t2 + t3 + t4 = 768 bytes. Largest first: t4 at 0; t2
/// above it at 384; t1 (not live with t4) in the gap 0..384 below t2; t3, live with all
/// three, above them at 640.
#[test]
fn diamond_packs_to_the_lower_bound() {
    let p = assert_plans_to(
        r#"program @diamond(%x: f32[4, 8]) -> (%y: f32[4, 24])
arena a0 on cpu host size 768 lower_bound 768
buffer b0 "x": f32[4, 8] = input 0
buffer b1 "t1": f32[4, 8] = arena a0 offset 0
buffer b2 "t2": f32[4, 16] = arena a0 offset 384
buffer b3 "t3": f32[8, 4] = arena a0 offset 640
buffer b4 "t4": f32[4, 24] = arena a0 offset 0
buffer b5 "y": f32[4, 24] = output 0
kernel k0 "sm" reduction on cpu = graph @sm(%a: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = softmax{kind = softmax, axis = 1}(%a)
}
kernel k1 "cat" data_movement on cpu = graph @cat(%a: f32[4, 8]) -> (%b) {
  %b: f32[4, 16] = concat{axis = 1}(%a, %a)
}
kernel k2 "tr" data_movement on cpu = graph @tr(%a: f32[4, 8]) -> (%b) {
  %b: f32[8, 4] = transpose{perm = [1, 0]}(%a)
}
kernel k3 "join" data_movement on cpu = graph @join(%a: f32[4, 16], %c: f32[8, 4]) -> (%b) {
  %t: f32[4, 8] = transpose{perm = [1, 0]}(%c)
  %b: f32[4, 24] = concat{axis = 1}(%a, %t)
}
kernel k4 "sm24" reduction on cpu = graph @sm24(%a: f32[4, 24]) -> (%b) {
  %b: f32[4, 24] = softmax{kind = softmax, axis = 1}(%a)
}
step dispatch k0 (b0) -> (b1)
step dispatch k1 (b1) -> (b2)
step dispatch k2 (b1) -> (b3)
step dispatch k3 (b2, b3) -> (b4)
step dispatch k4 (b4) -> (b5)
"#,
        &PlanOptions::default(),
    );
    assert_eq!(memory_report(&p)[0].ratio(), Some(1.0));
}

const IN_PLACE: &str = r#"program @inplace(%x: f32[4, 8]) -> (%y: f32[4, 8])
arena a0 on cpu host size 256 lower_bound 256
buffer b0 "x": f32[4, 8] = input 0
buffer b1 "t1": f32[4, 8] = arena a0 offset 0
buffer b2 "t2": f32[4, 8] = arena a0 offset 128
buffer b3 "t3": f32[4, 8] = arena a0 offset 128
buffer b4 "y": f32[4, 8] = output 0
kernel k0 "sm" reduction on cpu = graph @sm(%a: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = softmax{kind = softmax, axis = 1}(%a)
}
kernel k1 "relu" elementwise on cpu = graph @relu(%a: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = unary{op = relu}(%a)
}
kernel k2 "add" elementwise on cpu = graph @add(%a: f32[4, 8], %c: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = binary{op = add}(%a, %c)
}
step dispatch k0 (b0) -> (b1)
step dispatch k1 (b1) -> (b2)
step dispatch k2 (b2, b1) -> (b3)
step dispatch k0 (b3) -> (b4)
"#;

/// `t2 = relu(t1)` cannot take t1's bytes (t1 is read again at step 2); `t3 = t2 + t1`
/// takes t2's, its first operand read for the last time. Without in-place, step 2 holds
/// three buffers.
#[test]
fn elementwise_results_take_over_dying_operands() {
    let p = assert_plans_to(IN_PLACE, &PlanOptions::default());
    check_plan(&p).unwrap();
    let without = IN_PLACE
        .replace("size 256 lower_bound 256", "size 384 lower_bound 384")
        .replace(
            "\"t3\": f32[4, 8] = arena a0 offset 128",
            "\"t3\": f32[4, 8] = arena a0 offset 256",
        );
    assert_plans_to(&without, &PlanOptions { in_place: false });
}

/// `t2 = s + t1` with `s: f32[1, 8]` broadcast: s dies at step 2 but has other dims, so
/// only t1 is taken over. A kernel whose other result is larger than the operand
/// (`t3` of `f32[2, 4, 8]`) takes over nothing. Blocks: t3 (256 B, steps 3-5) at 0; t1+t2
/// (128 B, 0-3) above it at 256; u (128 B, 3-4) above both at 384; s (32 B, 1-2) in the
/// gap below t1+t2, at 0. Step 3 holds t2, u and t3: 512 bytes.
#[test]
fn broadcast_operands_and_larger_index_spaces_are_not_taken_over() {
    assert_plans_to(
        r#"program @bcast(%x: f32[4, 8], %z: f32[8, 1]) -> (%y: f32[4, 8], %w: f32[2, 4, 8])
arena a0 on cpu host size 512 lower_bound 512
buffer b0 "x": f32[4, 8] = input 0
buffer b1 "z": f32[8, 1] = input 1
buffer b2 "t1": f32[4, 8] = arena a0 offset 256
buffer b3 "s": f32[1, 8] = arena a0 offset 0
buffer b4 "t2": f32[4, 8] = arena a0 offset 256
buffer b5 "u": f32[4, 8] = arena a0 offset 384
buffer b6 "t3": f32[2, 4, 8] = arena a0 offset 0
buffer b7 "y": f32[4, 8] = output 0
buffer b8 "w": f32[2, 4, 8] = output 1
kernel k0 "sm" reduction on cpu = graph @sm(%a: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = softmax{kind = softmax, axis = 1}(%a)
}
kernel k1 "tr" data_movement on cpu = graph @tr(%a: f32[8, 1]) -> (%b) {
  %b: f32[1, 8] = transpose{perm = [1, 0]}(%a)
}
kernel k2 "add" elementwise on cpu = graph @add(%a: f32[1, 8], %c: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = binary{op = add}(%a, %c)
}
kernel k3 "two" elementwise on cpu = graph @two(%a: f32[4, 8]) -> (%b, %d) {
  const %k: f32[2, 1, 1] = dense [1.0, 2.0]
  %b: f32[4, 8] = unary{op = relu}(%a)
  %d: f32[2, 4, 8] = binary{op = mul}(%a, %k)
}
kernel k4 "tr3" data_movement on cpu = graph @tr3(%a: f32[2, 4, 8]) -> (%b) {
  %b: f32[2, 4, 8] = transpose{perm = [0, 1, 2]}(%a)
}
step dispatch k0 (b0) -> (b2)
step dispatch k1 (b1) -> (b3)
step dispatch k2 (b3, b2) -> (b4)
step dispatch k3 (b4) -> (b5, b6)
step dispatch k0 (b5) -> (b7)
step dispatch k4 (b6) -> (b8)
"#,
        &PlanOptions::default(),
    );
}

/// A GPU-arena buffer that the CPU writes (a copy into GPU memory) is live for the whole
/// call: the CPU may run its copy while the GPU still runs earlier steps, so it must not
/// share bytes with `g1`, which the GPU reads first (in step order their lives are disjoint,
/// and the planner would otherwise reuse `g1`'s bytes, making the CPU wait for the GPU).
/// Buffers that only the GPU touches still reuse bytes (`g4` over `g1`'s).
#[test]
fn buffers_crossing_devices_live_for_the_whole_call() {
    let text = r#"program @cross(%x: f32[4, 8], %m: f32[4, 8]) -> (%y: f32[4, 8])
arena a0 on cpu host
arena a1 on vulkan host_visible_shared
buffer b0 "x": f32[4, 8] = input 0
buffer b1 "m": f32[4, 8] = input 1
buffer b2 "g1": f32[4, 8] = arena a1
buffer b3 "g2": f32[4, 8] = arena a1
buffer b4 "c": f32[4, 8] = arena a0
buffer b5 "g3": f32[4, 8] = arena a1
buffer b6 "g4": f32[4, 8] = arena a1
buffer b7 "y": f32[4, 8] = output 0
kernel k0 "gpu_sm" reduction on vulkan = graph @sm(%a: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = softmax{kind = softmax, axis = 1}(%a)
}
kernel k1 "cpu_sm" reduction on cpu = graph @sm(%a: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = softmax{kind = softmax, axis = 1}(%a)
}
kernel k2 "gpu_add" elementwise on vulkan = graph @add(%a: f32[4, 8], %c: f32[4, 8]) -> (%b) {
  %b: f32[4, 8] = binary{op = add}(%a, %c)
}
step dispatch k0 (b0) -> (b2)
step dispatch k0 (b2) -> (b3)
step dispatch k1 (b1) -> (b4)
step copy b4 -> b5
step dispatch k2 (b3, b5) -> (b6)
step dispatch k0 (b6) -> (b7)
"#;
    let mut p = parse_program_inline(text).unwrap_or_else(|e| panic!("{e}"));
    plan_memory(&mut p, &PlanOptions { in_place: false }).unwrap();
    let offset = |b: usize| match p.buffers[b].storage {
        Storage::Arena { offset, .. } => offset.expect("planned"),
        _ => panic!("buffer {b} is not in an arena"),
    };
    let printed = print_program(&p, WeightMode::Inline);
    // g3 (written by the CPU's copy) overlaps neither g1 nor g2, though g1 is dead in step
    // order before the copy; g4 (GPU only) takes g1's bytes.
    let bytes = 4 * 8 * 4;
    let disjoint = |a: u64, b: u64| a + bytes <= b || b + bytes <= a;
    assert!(disjoint(offset(5), offset(2)), "{printed}");
    assert!(disjoint(offset(5), offset(3)), "{printed}");
    assert_eq!(offset(6), offset(2), "{printed}");
    check_plan(&p).unwrap();
}

/// Dims with bounded symbols are planned at the bounds (`seq <= 16`: 512 bytes each; the
/// `2*seq` buffer 1024), including polynomial dims.
#[test]
fn symbolic_dims_are_planned_at_their_bounds() {
    assert_plans_to(
        r#"program @sym(%x: f32[seq, 8]) -> (%y: f32[seq, 8])
bounds { seq <= 16 }
arena a0 on cpu host size 1536 lower_bound 1536
buffer b0 "x": f32[seq, 8] = input 0
buffer b1 "t1": f32[seq, 8] = arena a0 offset 1024
buffer b2 "t2": f32[2*seq, 8] = arena a0 offset 0
buffer b3 "t3": f32[seq, 8] = arena a0 offset 1024
buffer b4 "y": f32[seq, 8] = output 0
kernel k0 "sm" reduction on cpu = graph @sm(%a: f32[seq, 8]) -> (%b) {
  %b: f32[seq, 8] = softmax{kind = softmax, axis = 1}(%a)
}
kernel k1 "cat" data_movement on cpu = graph @cat(%a: f32[seq, 8]) -> (%b) {
  %b: f32[2*seq, 8] = concat{axis = 0}(%a, %a)
}
kernel k2 "half" reduction on cpu = graph @half(%a: f32[2*seq, 8]) -> (%b) {
  const %shape: i64[3] = dense [2, -1, 8]
  %r: f32[2, seq, 8] = reshape{allow_zero = false}(%a, %shape)
  %b: f32[seq, 8] = reduce{kind = sum, axes = [0], keep_dims = false, noop_with_empty_axes = false}(%r)
}
step dispatch k0 (b0) -> (b1)
step dispatch k1 (b1) -> (b2)
step dispatch k2 (b2) -> (b3)
step dispatch k0 (b3) -> (b4)
"#,
        &PlanOptions::default(),
    );
}

/// Without a bound on `seq`, buffers sized by it stay unplanned (the runtime places them per
/// call, above the arena); the known-size ones are still planned.
#[test]
fn unbounded_symbols_leave_buffers_to_the_runtime() {
    let p = assert_plans_to(
        r#"program @unb(%x: f32[seq, 8]) -> (%y: f32[8])
arena a0 on cpu host size 32 lower_bound 32
buffer b0 "x": f32[seq, 8] = input 0
buffer b1 "t1": f32[seq, 8] = arena a0
buffer b2 "t2": f32[8] = arena a0 offset 0
buffer b3 "y": f32[8] = output 0
kernel k0 "sm" reduction on cpu = graph @sm(%a: f32[seq, 8]) -> (%b) {
  %b: f32[seq, 8] = softmax{kind = softmax, axis = 1}(%a)
}
kernel k1 "sum" reduction on cpu = graph @sum(%a: f32[seq, 8]) -> (%b) {
  %b: f32[8] = reduce{kind = sum, axes = [0], keep_dims = false, noop_with_empty_axes = false}(%a)
}
kernel k2 "relu" elementwise on cpu = graph @relu(%a: f32[8]) -> (%b) {
  %b: f32[8] = unary{op = relu}(%a)
}
step dispatch k0 (b0) -> (b1)
step dispatch k1 (b1) -> (b2)
step dispatch k2 (b2) -> (b3)
"#,
        &PlanOptions::default(),
    );
    let report = &memory_report(&p)[0];
    assert_eq!((report.planned, report.per_call), (1, 1));
    assert_eq!(
        report.to_string(),
        "memory cpu: arena 32 bytes, lower bound 32 bytes, ratio 1.000, plus 1 buffers placed per call"
    );
}

#[test]
fn bad_bounds_are_errors() {
    let src = IN_PLACE.replace(
        "arena a0 on cpu host size 256 lower_bound 256",
        "bounds { n <= -1 }\narena a0 on cpu host",
    );
    let mut p = parse_program_inline(&unplanned(&src)).unwrap();
    let e = plan_memory(&mut p, &PlanOptions::default()).unwrap_err();
    assert_eq!(
        e,
        CompileError::Plan("symbol `n` has a negative bound -1".into())
    );
}

/// The checker rejects overlapping live buffers and buffers outside their arena.
#[test]
fn the_checker_rejects_bad_plans() {
    let good = parse_program_inline(IN_PLACE).unwrap();
    check_plan(&good).unwrap();
    let mut overlap = good.clone();
    overlap.buffers[2].storage = Storage::Arena {
        arena: 0,
        offset: Some(64),
    };
    let e = check_plan(&overlap).unwrap_err().to_string();
    assert!(e.contains("are live together and overlap"), "{e}");
    let mut outside = good.clone();
    outside.arenas[0].size = Some(200);
    let e = check_plan(&outside).unwrap_err().to_string();
    assert!(e.contains("outside arena 0"), "{e}");
    // t2 taking over t1 is not legal: t1 is read again after t2 is written.
    let mut early = good;
    early.buffers[2].storage = Storage::Arena {
        arena: 0,
        offset: Some(0),
    };
    assert!(check_plan(&early).is_err());
}

// ---------------------------------------------------------------------------------------
// Randomized programs
// ---------------------------------------------------------------------------------------

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random program: one input, steps that each read one to three earlier buffers and write
/// one or two new ones (f32 vectors of a few lengths, some `n`-long), kernels of random kinds
/// (elementwise ones write results of their first operand's dims, so in-place applies), a
/// random buffer copied to the output. `n` is bounded or not.
fn random_program(rng: &mut Rng, bounded: bool) -> Program {
    let lens = [
        Dim::known(16),
        Dim::known(7),
        Dim::known(100),
        Dim::known(48),
        Dim::symbol("n"),
        Dim::symbol("n").scale(3),
    ];
    let f32v = |d: &Dim| TensorType::new(DType::F32, vec![d.clone()]);
    let mut p = Program {
        name: "random".into(),
        inputs: vec![Port {
            name: "x".into(),
            ty: f32v(&lens[0]),
        }],
        outputs: vec![],
        bounds: if bounded {
            vec![(Symbol::new("n"), 33)]
        } else {
            vec![]
        },
        arenas: vec![Arena {
            device: "cpu".into(),
            memory: "host".into(),
            size: None,
            lower_bound: None,
        }],
        dim_bounds: vec![],
        states: vec![],
        ..Program::default()
    };
    p.buffers.push(BufferDecl {
        name: "x".into(),
        ty: f32v(&lens[0]),
        storage: Storage::Input(0),
    });
    let kinds = [
        KernelKind::Elementwise,
        KernelKind::Elementwise,
        KernelKind::Reduction,
        KernelKind::Contraction,
    ];
    let steps = 2 + rng.below(30);
    for si in 0..steps {
        let n_args = 1 + rng.below(3);
        // Prefer recent buffers, as real schedules do.
        let nb = p.buffers.len();
        let args: Vec<usize> = (0..n_args).map(|_| nb - 1 - rng.below(nb.min(6))).collect();
        let kind = kinds[rng.below(kinds.len())];
        let n_res = 1 + rng.below(2);
        let mut body = Graph::new(format!("k{si}"));
        let ins: Vec<_> = args
            .iter()
            .map(|&b| body.add_input(format!("a{b}"), p.buffers[b].ty.clone()))
            .collect();
        let mut results = Vec::new();
        for r in 0..n_res {
            let ty = if kind == KernelKind::Elementwise {
                p.buffers[args[0]].ty.clone()
            } else {
                f32v(&lens[rng.below(lens.len())])
            };
            let out = body.add_node(
                format!("n{r}"),
                Op::Unary { op: UnaryOp::Relu },
                vec![Some(ins[0])],
                vec![Some((format!("r{r}"), ty.clone()))],
            )[0]
            .expect("one output");
            body.outputs.push(out);
            p.buffers.push(BufferDecl {
                name: format!("t{}", p.buffers.len()),
                ty,
                storage: Storage::Arena {
                    arena: 0,
                    offset: None,
                },
            });
            results.push(Some(p.buffers.len() - 1));
        }
        p.kernels.push(Kernel {
            name: format!("k{si}"),
            kind,
            device: "cpu".into(),
            body,
        });
        p.steps.push(Step::Dispatch {
            kernel: si,
            args,
            results,
        });
    }
    let src = 1 + rng.below(p.buffers.len() - 1);
    let ty = p.buffers[src].ty.clone();
    p.outputs.push(Port {
        name: "y".into(),
        ty: ty.clone(),
    });
    p.buffers.push(BufferDecl {
        name: "y".into(),
        ty,
        storage: Storage::Output(0),
    });
    p.steps.push(Step::Copy {
        src,
        dst: p.buffers.len() - 1,
    });
    p
}

/// Bytes of buffer `b` at the bounds (`n <= 33`).
fn bytes_at_bound(p: &Program, b: usize) -> Option<u64> {
    let mut env = std::collections::HashMap::new();
    for (s, v) in &p.bounds {
        env.insert(s.clone(), *v);
    }
    let n: i64 = p.buffers[b]
        .ty
        .dims
        .iter()
        .map(|d| d.eval(&env).ok())
        .product::<Option<i64>>()?;
    Some(n as u64 * 4)
}

/// The independent check: at every step, any two planned buffers live then are byte-disjoint,
/// except a result written over an operand that this step reads last, by an elementwise
/// kernel, at the same offset and of the same type; every planned buffer lies within the
/// arena; the lower bound is the most bytes live at one step (a taken-over operand and its
/// taker counted once); the arena is at least that.
fn brute_force_check(p: &Program) -> Result<usize, String> {
    let live = liveness(p);
    let size = p.arenas[0].size.ok_or("no arena size")?;
    let planned: Vec<(usize, u64, u64)> = (0..p.buffers.len())
        .filter_map(|b| match p.buffers[b].storage {
            Storage::Arena {
                offset: Some(o), ..
            } => Some((b, o, bytes_at_bound(p, b).expect("planned means sized"))),
            _ => None,
        })
        .collect();
    for b in 0..p.buffers.len() {
        let sized = bytes_at_bound(p, b).is_some();
        if let Storage::Arena { offset, .. } = p.buffers[b].storage {
            if offset.is_some() != sized {
                return Err(format!("buffer {b}: planned {offset:?} but sized {sized}"));
            }
        }
    }
    let (mut most, mut taken_over) = (0, 0);
    for (si, step) in p.steps.iter().enumerate() {
        let now: Vec<&(usize, u64, u64)> = planned
            .iter()
            .filter(|(b, ..)| live[*b].is_some_and(|(s, e)| s <= si && si <= e))
            .collect();
        let mut total: u64 = now.iter().map(|x| x.2).sum();
        for (i, &&(b1, o1, s1)) in now.iter().enumerate() {
            if o1 + s1 > size || o1 % 64 != 0 {
                return Err(format!("buffer {b1} outside the arena or misaligned"));
            }
            for &&(b2, o2, s2) in &now[i + 1..] {
                if o1 < o2 + s2 && o2 < o1 + s1 {
                    let taken = |from: usize, to: usize| {
                        step.reads().contains(&from)
                            && step.writes().contains(&to)
                            && live[from].unwrap().1 == si
                            && live[to].unwrap().0 == si
                    };
                    let Step::Dispatch { kernel, .. } = step else {
                        return Err(format!("step {si}: {b1} and {b2} overlap"));
                    };
                    let ok = o1 == o2
                        && p.buffers[b1].ty == p.buffers[b2].ty
                        && p.kernels[*kernel].kind == KernelKind::Elementwise
                        && (taken(b1, b2) || taken(b2, b1));
                    if !ok {
                        return Err(format!("step {si}: buffers {b1} and {b2} overlap"));
                    }
                    total -= s1;
                    taken_over += 1;
                }
            }
        }
        most = most.max(total);
    }
    if p.arenas[0].lower_bound != Some(most) {
        return Err(format!(
            "lower bound {:?}, brute force {most}",
            p.arenas[0].lower_bound
        ));
    }
    if size < most {
        return Err(format!("arena {size} below the lower bound {most}"));
    }
    Ok(taken_over)
}

#[test]
fn random_programs_never_overlap_live_buffers() {
    let mut rng = Rng(0x5eed);
    let (mut in_place, mut sum_ratio, mut count) = (0usize, 0.0, 0usize);
    for case in 0..400 {
        let bounded = case % 4 != 0;
        let mut p = random_program(&mut rng, bounded);
        p.verify()
            .unwrap_or_else(|e| panic!("case {case}: generator: {e}"));
        let opts = PlanOptions {
            in_place: case % 5 != 0,
        };
        plan_memory(&mut p, &opts).unwrap_or_else(|e| panic!("case {case}: {e}"));
        in_place += brute_force_check(&p).unwrap_or_else(|e| {
            panic!(
                "case {case}: {e}\n{}",
                print_program(&p, WeightMode::Inline)
            )
        });
        if let Some(r) = memory_report(&p)[0].ratio() {
            sum_ratio += r;
            count += 1;
        }
    }
    assert!(in_place > 0, "the generator exercises in-place results");
    let mean = sum_ratio / count as f64;
    eprintln!("{count} planned programs, {in_place} results written in place, mean arena / lower bound {mean:.4}");
    assert!(mean < 1.25, "mean arena / lower bound {mean}");
}

// ---------------------------------------------------------------------------------------
// Compiled graphs, run with arenas as bytes
// ---------------------------------------------------------------------------------------

/// An MLP-ish graph with bounded `batch`: compiled, planned at the bound (every arena buffer
/// gets an offset), and run at smaller batches with the arena as real bytes: the results
/// are bitwise the reference's.
#[test]
fn compiled_graphs_run_correctly_in_their_planned_arena() {
    let g = parse(
        r#"graph @mlp(%x: f32[batch, 8]) -> (%y) {
          const %w1: f32[8, 8] = dense [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, -0.7, 0.8, 0.9, -0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, -0.8, 0.9, 0.1, -0.2, 0.3, 0.4, -0.5, 0.6, -0.7, 0.8, 0.9, -0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, -0.8, 0.9, 0.1, -0.2, 0.3, 0.4, -0.5, 0.6, -0.7, 0.8, 0.9, -0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, -0.8, 0.9, 0.1, -0.2, 0.3, 0.4, -0.5, 0.6, -0.7, 0.8, 0.9, -0.1]
          %h: f32[batch, 8] = matmul(%x, %w1)
          %s: f32[batch, 8] = softmax{kind = softmax, axis = 1}(%h)
          %e: f32[batch, 8] = unary{op = exp}(%s)
          %n: f32[batch, 8] = unary{op = neg}(%e)
          %h2: f32[batch, 8] = matmul(%n, %w1)
          %s2: f32[batch, 8] = softmax{kind = softmax, axis = 1}(%h2)
          %y: f32[batch, 8] = binary{op = add}(%s2, %s)
        }"#,
    );
    let opts = CompileOptions {
        bounds: vec![(Symbol::new("batch"), 4)],
        ..CompileOptions::default()
    };
    for batch in [1, 3, 4] {
        let p = check_equivalent_with(&g, vec![rand_f32(&[batch, 8], batch as u64)], &opts);
        let report = &memory_report(&p)[0];
        assert_eq!(report.per_call, 0);
        assert!(report.planned > 0);
        check_plan(&p).unwrap();
    }
}
