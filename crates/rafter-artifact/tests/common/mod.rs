//! Helpers shared by the integration tests: a sample program, re-signing edited files, and
//! the hostile corpus.
#![allow(dead_code)]

use bytes::Bytes;
use rafter_artifact::{ArtifactError, ArtifactWriter, HEADER_LEN};
use rafter_ir::program::{Arena, BufferDecl, Kernel, KernelKind, Port, Program, Step, Storage};
use rafter_ir::{BinaryOp, ConstData, DType, Dim, Graph, Op, Symbol, TensorType, UnaryOp};
use rafter_kernels_cpu::artifact_section::CpuDescriptor;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub const ENTRY_LEN: usize = 64;

fn ty(dims: Vec<Dim>) -> TensorType {
    TensorType::new(DType::F32, dims)
}

/// A writer for `program` with the `cpu` section its kernels need (the CPU backend's
/// descriptor: the artifact only carries it).
pub fn writer(program: &Program) -> ArtifactWriter<'_> {
    let kernels = program.kernels.iter().filter(|k| k.device == "cpu").count() as u32;
    ArtifactWriter::new(program).executable("cpu", CpuDescriptor { kernels }.encode(), 8)
}

/// `y = relu(x + w)` over `x: f32[batch, 4]` (`batch <= 8`), with two more weights of other
/// dtypes and shapes so the weight table has something to lay out.
pub fn sample_program() -> Program {
    let bt = ty(vec![Dim::symbol("batch"), Dim::known(4)]);
    let wt = ty(vec![Dim::known(4)]);
    let mut add = Graph::new("add");
    let a = add.add_input("a", bt.clone());
    let b = add.add_input("b", wt.clone());
    let s = add.add_node(
        "add",
        Op::Binary { op: BinaryOp::Add },
        vec![Some(a), Some(b)],
        vec![Some(("s".into(), bt.clone()))],
    );
    add.outputs = vec![s[0].unwrap()];
    let mut relu = Graph::new("relu");
    let a = relu.add_input("a", bt.clone());
    let r = relu.add_node(
        "relu",
        Op::Unary { op: UnaryOp::Relu },
        vec![Some(a)],
        vec![Some(("r".into(), bt.clone()))],
    );
    relu.outputs = vec![r[0].unwrap()];

    let w = ConstData::from_f32s(&[0.5, -1.0, 2.0, 3.25]);
    let idx = ConstData::from_i64s(&[1, 2, 3, 4, 5, 6]);
    let bytes: Vec<u8> = (0..2 * 3 * 5 * 2).map(|i| i as u8).collect();
    let h = ConstData::new(DType::F16, vec![2, 3, 5], Bytes::from(bytes)).unwrap();
    let flag = ConstData::new(DType::Bool, vec![], Bytes::from(vec![1u8])).unwrap();
    let buf = |name: &str, ty: TensorType, storage| BufferDecl {
        name: name.into(),
        ty,
        storage,
    };
    Program {
        name: "sample".into(),
        inputs: vec![Port {
            name: "x".into(),
            ty: bt.clone(),
        }],
        outputs: vec![Port {
            name: "y".into(),
            ty: bt.clone(),
        }],
        bounds: vec![(Symbol::new("batch"), 8)],
        dim_bounds: vec![],
        symbol_defs: vec![],
        states: vec![],
        weights: vec![w, idx, h, flag],
        buffers: vec![
            buf("x", bt.clone(), Storage::Input(0)),
            buf("w", wt, Storage::Weight(0)),
            buf(
                "s",
                bt.clone(),
                Storage::Arena {
                    arena: 0,
                    offset: Some(0),
                },
            ),
            buf("y", bt, Storage::Output(0)),
        ],
        arenas: vec![Arena {
            device: "cpu".into(),
            memory: "host".into(),
            size: Some(128),
            lower_bound: Some(128),
        }],
        kernels: vec![
            Kernel {
                name: "add".into(),
                kind: KernelKind::Elementwise,
                device: "cpu".into(),
                body: add,
            },
            Kernel {
                name: "relu".into(),
                kind: KernelKind::Elementwise,
                device: "cpu".into(),
                body: relu,
            },
        ],
        steps: vec![
            Step::Dispatch {
                kernel: 0,
                args: vec![0, 1],
                results: vec![Some(2)],
            },
            Step::Dispatch {
                kernel: 1,
                args: vec![2],
                results: vec![Some(3)],
            },
        ],
    }
}

pub fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

pub fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

pub fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// Where section table entry `i` starts.
pub fn entry_at(b: &[u8], i: usize) -> usize {
    u64_at(b, 24) as usize + i * ENTRY_LEN
}

pub fn section_count(b: &[u8]) -> usize {
    u32_at(b, 16) as usize
}

/// Index of the section named `name`.
pub fn find_section(b: &[u8], name: &str) -> usize {
    (0..section_count(b))
        .find(|&i| {
            let e = entry_at(b, i);
            let field = &b[e + 8..e + 24];
            let len = field.iter().position(|&c| c == 0).unwrap_or(16);
            &field[..len] == name.as_bytes()
        })
        .unwrap_or_else(|| panic!("no section {name}"))
}

/// (offset, length) of section `i`.
pub fn section_range(b: &[u8], i: usize) -> (usize, usize) {
    let e = entry_at(b, i);
    (u64_at(b, e + 24) as usize, u64_at(b, e + 32) as usize)
}

/// Recomputes every section checksum that can be computed, then the table's and the
/// header's, so an edit reaches the structural checks instead of stopping at a checksum.
pub fn resign(b: &mut [u8]) {
    let table = u64_at(b, 24) as usize;
    let n = section_count(b);
    let Some(table_end) = table.checked_add(n * ENTRY_LEN).filter(|&e| e <= b.len()) else {
        let sum = crc32fast::hash(&b[..60]);
        put_u32(b, 60, sum);
        return;
    };
    for i in 0..n {
        let e = table + i * ENTRY_LEN;
        let (off, len) = (u64_at(b, e + 24), u64_at(b, e + 32));
        if let Some(end) = off.checked_add(len).filter(|&end| end <= b.len() as u64) {
            let sum = crc32fast::hash(&b[off as usize..end as usize]);
            put_u32(b, e + 48, sum);
        }
    }
    let sum = crc32fast::hash(&b[table..table_end]);
    put_u32(b, 20, sum);
    let sum = crc32fast::hash(&b[..60]);
    put_u32(b, 60, sum);
}

/// Runs `read` on `bytes` without letting a panic escape: `Err` carries the panic message.
pub fn read_no_panic<T>(
    read: &dyn Fn(Bytes) -> Result<T, ArtifactError>,
    bytes: Vec<u8>,
) -> Result<Result<T, ArtifactError>, String> {
    catch_unwind(AssertUnwindSafe(|| read(Bytes::from(bytes)))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// Expects `read` to reject `bytes` with an error (not a panic) and returns its message.
#[track_caller]
pub fn expect_rejected<T>(
    read: &dyn Fn(Bytes) -> Result<T, ArtifactError>,
    bytes: Vec<u8>,
    case: &str,
) -> String {
    match read_no_panic(read, bytes) {
        Err(panic) => panic!("{case}: the reader panicked: {panic}"),
        Ok(Ok(_)) => panic!("{case}: a damaged file was accepted"),
        Ok(Err(e)) => e.to_string(),
    }
}

/// Tallies of one corpus run.
#[derive(Debug, Default)]
pub struct Tally {
    pub cases: usize,
    pub messages: std::collections::BTreeMap<String, usize>,
}

impl Tally {
    fn note(&mut self, msg: &str) {
        self.cases += 1;
        // Group by the message's first words (its kind), for the summary.
        let key: String = msg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect();
        *self.messages.entry(key).or_default() += 1;
    }
}

/// The hostile corpus: every variant of `valid` must be rejected by `read` with an error,
/// never a panic. `read` verifies checksums. With `read_unchecked` (checksums off) the same
/// variants must not panic (they may be accepted when only section bytes changed).
pub fn hostile_corpus<T, U>(
    valid: &[u8],
    read: &dyn Fn(Bytes) -> Result<T, ArtifactError>,
    read_unchecked: &dyn Fn(Bytes) -> Result<U, ArtifactError>,
) -> Tally {
    let mut tally = Tally::default();
    assert!(
        read(Bytes::copy_from_slice(valid)).is_ok(),
        "the valid file reads"
    );
    let n = valid.len();
    let table = u64_at(valid, 24) as usize;
    let count = section_count(valid);
    let table_end = table + count * ENTRY_LEN;
    let mut reject = |bytes: Vec<u8>, case: String| {
        let unchecked = bytes.clone();
        let msg = expect_rejected(read, bytes, &case);
        tally.note(&msg);
        if let Err(panic) = read_no_panic(read_unchecked, unchecked) {
            panic!("{case}: the unchecked reader panicked: {panic}");
        }
    };

    // (a) Truncation at every boundary and at sampled offsets.
    let mut cuts: Vec<usize> = vec![0, 1, 7, 8, 11, 12, 63, HEADER_LEN, table, table_end];
    for i in 0..count {
        let (off, len) = section_range(valid, i);
        cuts.extend([
            off,
            off + 1,
            off + len / 2,
            off + len,
            (off + len).saturating_sub(1),
        ]);
    }
    cuts.extend((0..n).step_by(97));
    cuts.extend(n.saturating_sub(8)..n);
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts.into_iter().filter(|&c| c < n) {
        reject(valid[..cut].to_vec(), format!("truncated at {cut}"));
    }
    // Trailing bytes.
    let mut longer = valid.to_vec();
    longer.extend_from_slice(&[0; 3]);
    reject(longer, "three trailing bytes".into());

    // (b) Byte flips: every header and table byte, sampled body bytes, each section's ends.
    let mut flips: Vec<usize> = (0..table_end).collect();
    flips.extend((table_end..n).step_by(13));
    for i in 0..count {
        let (off, len) = section_range(valid, i);
        if len > 0 {
            flips.extend([off, off + len - 1, off + len / 2]);
        }
    }
    flips.extend(n - 1..n);
    flips.sort_unstable();
    flips.dedup();
    for &pos in &flips {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut b = valid.to_vec();
            b[pos] ^= mask;
            reject(b, format!("byte {pos} ^ {mask:#04x}"));
        }
    }

    // (c), (d) Offsets past the end and huge sizes, in every table entry, re-signed so the
    // structural checks (not the checksums) must catch them; and unsigned.
    let huge = [
        n as u64,
        n as u64 + 4096,
        (n as u64 + 4095) & !4095,
        1 << 40,
        u64::MAX,
        u64::MAX - 63,
        !4095u64,
    ];
    for i in 0..count {
        let e = table + i * ENTRY_LEN;
        let bad_align = [0u64, 3, 4097, 1 << 17, 1 << 40, u64::MAX];
        for (field, what, values) in [
            (24, "offset", &huge[..]),
            (32, "length", &huge[..]),
            (40, "alignment", &bad_align[..]),
        ] {
            for &v in values {
                for signed in [true, false] {
                    let mut b = valid.to_vec();
                    put_u64(&mut b, e + field, v);
                    if signed {
                        resign(&mut b);
                    }
                    reject(b, format!("section {i} {what} = {v} (re-signed: {signed})"));
                }
            }
        }
        // Every other field of the entry set to garbage, re-signed.
        for (field, v) in [
            (0, 0u32),
            (0, 99),
            (4, 1),
            (8, 0),
            (8, u32::from_le_bytes(*b"ABCD")),
            (52, 1),
            (60, 7),
        ] {
            let mut b = valid.to_vec();
            put_u32(&mut b, e + field, v);
            resign(&mut b);
            reject(b, format!("section {i} byte {field} = {v} (re-signed)"));
        }
    }
    // Header fields, re-signed.
    for (field, v) in [
        (16usize, 0u64),
        (16, count as u64 + 1),
        (16, u32::MAX as u64),
        (16, count as u64 - 1),
    ] {
        let mut b = valid.to_vec();
        put_u32(&mut b, field, v as u32);
        resign(&mut b);
        reject(b, format!("header section_count = {v} (re-signed)"));
    }
    for v in [
        0u64,
        8,
        63,
        65,
        n as u64,
        n as u64 - 8,
        1 << 40,
        u64::MAX,
        u64::MAX - 7,
    ] {
        let mut b = valid.to_vec();
        put_u64(&mut b, 24, v);
        resign(&mut b);
        reject(b, format!("header section_table_offset = {v} (re-signed)"));
    }
    for v in [0u64, 64, n as u64 - 1, n as u64 + 1, 1 << 40, u64::MAX] {
        let mut b = valid.to_vec();
        put_u64(&mut b, 32, v);
        resign(&mut b);
        reject(b, format!("header file_length = {v} (re-signed)"));
    }
    for v in [1u32, 0x8000_0000] {
        let mut b = valid.to_vec();
        put_u32(&mut b, 12, v);
        resign(&mut b);
        reject(b, format!("header flags = {v:#x} (re-signed)"));
    }
    let mut b = valid.to_vec();
    b[45] = 1;
    resign(&mut b);
    reject(b, "header reserved byte (re-signed)".into());

    // Two sections swapped in place (overlap, misplacement), re-signed.
    if count >= 2 {
        let mut b = valid.to_vec();
        let (e0, e1) = (table, table + ENTRY_LEN);
        let off1 = u64_at(&b, e1 + 24);
        put_u64(&mut b, e0 + 24, off1);
        resign(&mut b);
        reject(b, "two sections at one offset (re-signed)".into());
    }

    // (e) Wrong magic and versions.
    for (pos, v) in [(0usize, b'X'), (6, b'B'), (7, b'!')] {
        let mut b = valid.to_vec();
        b[pos] = v;
        let msg = expect_rejected(read, b, "magic");
        assert!(msg.contains("not a rafter artifact"), "{msg}");
    }
    for v in [0u32, 2, 7, u32::MAX] {
        let mut b = valid.to_vec();
        put_u32(&mut b, 8, v);
        let msg = expect_rejected(read, b, "version");
        assert_eq!(
            msg,
            format!("version {v} is not readable by this build (reads version 1)")
        );
    }
    let msg = expect_rejected(read, b"GGUF\x03\0\0\0".to_vec(), "another format");
    assert!(msg.contains("not a rafter artifact"), "{msg}");
    let msg = expect_rejected(read, Vec::new(), "empty file");
    assert!(msg.contains("truncated"), "{msg}");
    tally
}
