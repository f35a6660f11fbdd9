//! Whole artifacts: write → read round trips (in memory and memory-mapped, zero-copy),
//! writer checks, program-level validation, and the hostile corpus.

mod common;

use bytes::Bytes;
use common::*;
use rafter_artifact::{
    Artifact, ArtifactError, Container, ContainerWriter, ReadOptions, SectionData, SectionKind,
};
use rafter_ir::program::{Program, Step};
use rafter_ir::program_text::{print_program, WeightMode};
use rafter_ir::DType;
use rafter_kernels_cpu::artifact_section::CpuDescriptor;
use std::path::PathBuf;

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rafter-artifact-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn read(b: Bytes) -> Result<Artifact, ArtifactError> {
    Artifact::from_bytes(b)
}

fn read_unchecked(b: Bytes) -> Result<Artifact, ArtifactError> {
    Artifact::from_bytes_with(
        b,
        &ReadOptions {
            verify_checksums: false,
        },
    )
}

/// Asserts every weight's bytes lie inside `file` (zero-copy) at a 64-byte multiple from
/// its start.
fn assert_weights_in(a: &Artifact, file: &Bytes) {
    let (start, end) = (file.as_ptr() as usize, file.as_ptr() as usize + file.len());
    for (i, w) in a.program().weights.iter().enumerate() {
        let p = w.bytes.as_ptr() as usize;
        assert!(
            p >= start && p + w.bytes.len() <= end,
            "weight {i} is a slice of the file"
        );
        assert_eq!(
            (p - start) % 64,
            0,
            "weight {i} is 64-byte aligned in the file"
        );
    }
}

/// The file with section `name`'s bytes replaced (everything re-laid-out and re-signed).
fn replace_section(file: &[u8], name: &str, new: &[u8]) -> Vec<u8> {
    let c = Container::parse(Bytes::copy_from_slice(file), &ReadOptions::default()).unwrap();
    let mut w = ContainerWriter::new();
    for s in c.sections() {
        let data = if s.name == name {
            Bytes::copy_from_slice(new)
        } else {
            c.section(s.kind, &s.name).unwrap()
        };
        w.add(s.kind, &s.name, s.align, SectionData::from_bytes(data))
            .unwrap();
    }
    w.layout().unwrap().to_vec()
}

fn section_bytes(file: &[u8], kind: SectionKind, name: &str) -> Bytes {
    Container::parse(Bytes::copy_from_slice(file), &ReadOptions::default())
        .unwrap()
        .section(kind, name)
        .unwrap()
}

#[test]
fn round_trip_in_memory() {
    let program = sample_program();
    let file = Bytes::from(writer(&program).to_vec().unwrap());
    let a = Artifact::from_bytes(file.clone()).unwrap();
    assert_eq!(a.program(), &program);
    assert_eq!(a.version(), 1);
    assert!(!a.is_mapped());
    assert_weights_in(&a, &file);
    let sig = a.signature();
    assert_eq!(sig.inputs, &program.inputs[..]);
    assert_eq!(sig.outputs, &program.outputs[..]);
    assert_eq!(sig.bounds, &program.bounds[..]);
    assert_eq!(a.devices().collect::<Vec<_>>(), ["cpu"]);
    let cpu = CpuDescriptor::decode(&a.executable("cpu").unwrap(), "cpu").unwrap();
    assert_eq!(cpu.kernels, 2);
    assert!(a.executable("vulkan").is_none());
    let table = a.weight_entries();
    assert_eq!(table.len(), 4);
    assert_eq!(
        (table[2].dtype, table[2].dims.clone(), table[2].len),
        (DType::F16, vec![2, 3, 5], 60)
    );
    assert!(table.iter().all(|e| e.offset % 64 == 0));
    let weights = a.sections().iter().find(|s| s.name == "weights").unwrap();
    assert_eq!(weights.offset % 4096, 0);
    assert_eq!(a.file_len(), file.len() as u64);
    assert_eq!(a.weights_section_len(), weights.len);
    assert!(a.program_text_len() > 0);
    assert_eq!(a.executables_len(), 16);
    // Writing is deterministic.
    assert_eq!(writer(a.program()).to_vec().unwrap(), file.to_vec());
}

#[test]
fn round_trip_mapped_is_zero_copy() {
    let program = sample_program();
    let path = temp_path("mapped.rfa");
    let len = writer(&program).write(&path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    let a = Artifact::open(&path).unwrap();
    assert!(a.is_mapped());
    assert_eq!(a.program(), &program);
    assert_weights_in(&a, a.bytes());
    // The map starts on a page, so the weights are aligned in memory too.
    assert_eq!(a.bytes().as_ptr() as usize % 4096, 0);
    for w in &a.program().weights {
        assert_eq!(w.bytes.as_ptr() as usize % 64, 0);
    }
    // Weights outlive the artifact: they hold the map.
    let program = a.into_program();
    assert_eq!(program.weights[0].to_f64s(), vec![0.5, -1.0, 2.0, 3.25]);
    // Rewriting replaces the file by rename, without touching the mapped inode.
    writer(&program).write(&path).unwrap();
    assert_eq!(program.weights[1].to_i64s(), Some(vec![1, 2, 3, 4, 5, 6]));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn open_errors_name_the_file() {
    let missing = temp_path("missing.rfa");
    let e = Artifact::open(&missing).unwrap_err();
    assert!(matches!(e, ArtifactError::Io { .. }), "{e}");
    assert!(e.to_string().contains("missing.rfa"));

    let path = temp_path("short.rfa");
    let file = writer(&sample_program()).to_vec().unwrap();
    std::fs::write(&path, &file[..100]).unwrap();
    let e = Artifact::open(&path).unwrap_err();
    assert!(matches!(e.root(), ArtifactError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("short.rfa: truncated"), "{e}");

    std::fs::write(&path, b"").unwrap();
    let e = Artifact::open(&path).unwrap_err();
    assert!(matches!(e.root(), ArtifactError::Truncated { .. }), "{e}");
    std::fs::remove_file(&path).unwrap();
}

/// Each device's section is opaque bytes: the writer requires one for every device a
/// kernel runs on and a valid device name, and the reader hands the bytes back as they
/// were (their devices' loaders validate them, in the runtime).
#[test]
fn executables_per_device() {
    let mut program = sample_program();
    program.kernels[1].device = "vulkan".into();
    let e = writer(&program).to_vec().unwrap_err();
    assert!(
        e.to_string()
            .contains("device `vulkan`, which has no executable"),
        "{e}"
    );
    // Not even a section format of any device: the artifact does not care.
    let opaque: Vec<u8> = b"any bytes the vulkan loader will judge".to_vec();
    let file = writer(&program)
        .executable("vulkan", opaque.clone(), 4)
        .to_vec()
        .unwrap();
    let a = Artifact::from_bytes(Bytes::from(file)).unwrap();
    assert_eq!(a.devices().collect::<Vec<_>>(), ["cpu", "vulkan"]);
    assert_eq!(&a.executable("vulkan").unwrap()[..], &opaque[..]);
    let vulkan = a.sections().iter().find(|s| s.name == "vulkan").unwrap();
    assert_eq!(vulkan.offset % 4, 0, "placed at its alignment");

    let e = writer(&program)
        .executable("Vulkan!", opaque, 4)
        .to_vec()
        .unwrap_err();
    assert!(e.to_string().contains("`Vulkan!`"), "{e}");
}

#[test]
fn metadata_sections_round_trip_and_are_checksummed() {
    let program = sample_program();
    let blob = br#"{"tokenizer": "..."}"#.to_vec();
    let file = writer(&program)
        .metadata("llm", blob.clone())
        .to_vec()
        .unwrap();
    let a = Artifact::from_bytes(Bytes::from(file.clone())).unwrap();
    assert_eq!(&a.metadata("llm").unwrap()[..], &blob[..]);
    assert!(a.metadata("other").is_none());
    assert_eq!(
        a.devices().collect::<Vec<_>>(),
        ["cpu"],
        "metadata is not a device"
    );
    // A flipped byte inside it fails the section's checksum, naming it.
    let at = section_bytes(&file, SectionKind::Metadata, "llm");
    let start = file.windows(at.len()).position(|w| w == &at[..]).unwrap();
    let mut bad = file.clone();
    bad[start] ^= 0x40;
    let e = read(Bytes::from(bad)).unwrap_err();
    assert!(e.to_string().contains("metadata `llm`"), "{e}");
    let e = writer(&program).metadata("LLM", blob).to_vec().unwrap_err();
    assert!(e.to_string().contains("metadata name `LLM`"), "{e}");
}

#[test]
fn writer_rejects_invalid_programs() {
    let mut p = sample_program();
    p.steps[1] = Step::Dispatch {
        kernel: 1,
        args: vec![9],
        results: vec![Some(3)],
    };
    let e = writer(&p).to_vec().unwrap_err();
    assert!(matches!(e, ArtifactError::Write(_)), "{e}");

    let mut p = sample_program();
    p.weights[0].bytes = Bytes::from_static(&[0; 3]);
    assert!(writer(&p).to_vec().is_err());
}

#[test]
fn program_level_validation() {
    let program = sample_program();
    let file = writer(&program).to_vec().unwrap();
    let msg = |b: Vec<u8>| read(Bytes::from(b)).unwrap_err().to_string();

    // A kernel reading a buffer that does not exist.
    let mut bad = program.clone();
    bad.steps[1] = Step::Dispatch {
        kernel: 1,
        args: vec![9],
        results: vec![Some(3)],
    };
    let text = print_program(&bad, WeightMode::Reference);
    let m = msg(replace_section(&file, "program", text.as_bytes()));
    assert!(
        m.starts_with("program:") && m.contains("unknown buffer `b9`"),
        "{m}"
    );

    // One that parses but does not verify: a step reads a buffer before it is written.
    let mut bad = program.clone();
    bad.steps.swap(0, 1);
    let text = print_program(&bad, WeightMode::Reference);
    let m = msg(replace_section(&file, "program", text.as_bytes()));
    assert!(
        m.starts_with("program:") && m.contains("before anything writes it"),
        "{m}"
    );

    // Text that does not parse, and text that is not UTF-8.
    let m = msg(replace_section(&file, "program", b"this is not a program"));
    assert!(m.starts_with("program:"), "{m}");
    let m = msg(replace_section(&file, "program", b"\xff\xfe"));
    assert!(m.contains("not UTF-8"), "{m}");

    // The program and the weight table disagree on a weight's shape.
    let table = section_bytes(&file, SectionKind::WeightTable, "weight_table").to_vec();
    let mut t = table.clone();
    // Entry 0: f32[4] (16 bytes) → u8[16]: still consistent inside the table.
    put_u32(&mut t, 8, 6);
    put_u64(&mut t, 32, 16);
    let m = msg(replace_section(&file, "weight_table", &t));
    assert!(m.contains("weight 0") && m.contains("weight table"), "{m}");

    // A weight the table does not have (the last entry, the rank-0 bool, dropped).
    let mut t = table[..table.len() - 24].to_vec();
    put_u32(&mut t, 0, 3);
    let m = msg(replace_section(&file, "weight_table", &t));
    assert!(m.contains("weight 3") && m.contains("no entry"), "{m}");
    let weights_len = section_bytes(&file, SectionKind::Weights, "weights").len() as u64;

    // A size that disagrees with dtype × dims.
    let mut t = table.clone();
    put_u64(&mut t, 24, 17);
    let m = msg(replace_section(&file, "weight_table", &t));
    assert!(m.contains("needs 16 bytes, the entry says 17"), "{m}");

    // A weight past the end of the weights section, and a misaligned one.
    let mut t = table.clone();
    put_u64(&mut t, 16, (weights_len + 63) & !63);
    let m = msg(replace_section(&file, "weight_table", &t));
    assert!(m.contains("past the end of the weights section"), "{m}");
    let mut t = table.clone();
    put_u64(&mut t, 16, 8);
    let m = msg(replace_section(&file, "weight_table", &t));
    assert!(
        m.contains("not a multiple of the weight alignment 64"),
        "{m}"
    );

    // A `cpu` section that is not a descriptor, or disagrees with the program, is for the
    // CPU's loader to refuse (rafter-runtime-cpu's tests): the artifact carries any bytes.
    for section in [&CpuDescriptor { kernels: 5 }.encode()[..], b"\x7fELF"] {
        let a = read(Bytes::from(replace_section(&file, "cpu", section))).unwrap();
        assert_eq!(&a.executable("cpu").unwrap()[..], section);
    }
}

#[test]
fn hostile_corpus_artifact() {
    let file = writer(&sample_program()).to_vec().unwrap();
    let tally = hostile_corpus(&file, &read, &read_unchecked);
    eprintln!(
        "{} damaged artifacts rejected: {:#?}",
        tally.cases, tally.messages
    );
    assert!(tally.cases > 1000);
}

/// With checksums off, every single-byte change inside the program text, weight table and
/// cpu section reaches the parsers: none may panic, and whatever is accepted verifies.
#[test]
fn unchecked_section_mutations_never_panic() {
    let file = writer(&sample_program()).to_vec().unwrap();
    let c = Container::parse(Bytes::copy_from_slice(&file), &ReadOptions::default()).unwrap();
    let mut accepted = 0;
    let mut cases = 0;
    for s in c
        .sections()
        .iter()
        .filter(|s| s.kind != SectionKind::Weights)
    {
        for pos in s.offset as usize..(s.offset + s.len) as usize {
            for v in [0u8, b'0', b'9', b' ', b'\n', b'[', 0xff, file[pos] ^ 0x20] {
                let mut b = file.clone();
                b[pos] = v;
                cases += 1;
                match read_no_panic(&read_unchecked, b) {
                    Err(panic) => panic!("byte {pos} = {v:#04x}: panicked: {panic}"),
                    Ok(Ok(a)) => {
                        a.program().verify().unwrap();
                        accepted += 1;
                    }
                    Ok(Err(_)) => {}
                }
            }
        }
    }
    eprintln!("{cases} mutations, {accepted} accepted without checksums");
}

#[allow(dead_code)]
fn _program_is_send(p: Program) -> impl Send {
    p
}
