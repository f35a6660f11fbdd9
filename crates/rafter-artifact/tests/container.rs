//! The container alone (opaque sections): layout, round trip, and the hostile corpus.

mod common;

use bytes::Bytes;
use common::*;
use rafter_artifact::{Container, ContainerWriter, ReadOptions, SectionData, SectionKind};
use rafter_kernels_cpu::artifact_section::CpuDescriptor;

/// A container with opaque program bytes, a real weight table and weights, and two
/// executables (a CPU descriptor and a fake SPIR-V module).
fn sample_container() -> Vec<u8> {
    let mut weights = SectionData::default();
    weights.push_at(0, Bytes::from(vec![0xabu8; 100]));
    weights.push_at(128, Bytes::from(vec![0xcdu8; 8]));
    let mut table = Vec::new();
    for v in [2u32, 64] {
        table.extend_from_slice(&v.to_le_bytes());
    }
    for (dtype, off, len, dims) in [(6u32, 0u64, 100u64, vec![100u64]), (11, 128, 8, vec![])] {
        table.extend_from_slice(&dtype.to_le_bytes());
        table.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        table.extend_from_slice(&off.to_le_bytes());
        table.extend_from_slice(&len.to_le_bytes());
        for d in dims {
            table.extend_from_slice(&d.to_le_bytes());
        }
    }
    let spirv: Vec<u8> = [0x0723_0203u32, 0x0001_0600, 0, 42, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let mut w = ContainerWriter::new();
    w.add(
        SectionKind::Program,
        "program",
        8,
        SectionData::from_bytes(&b"program \"opaque\" {}\n"[..]),
    )
    .unwrap()
    .add(
        SectionKind::WeightTable,
        "weight_table",
        8,
        SectionData::from_bytes(table),
    )
    .unwrap()
    .add(
        SectionKind::Executable,
        "cpu",
        8,
        SectionData::from_bytes(CpuDescriptor { kernels: 3 }.encode()),
    )
    .unwrap()
    .add(
        SectionKind::Executable,
        "vulkan",
        4,
        SectionData::from_bytes(spirv),
    )
    .unwrap()
    .add(SectionKind::Weights, "weights", 4096, weights)
    .unwrap();
    w.layout().unwrap().to_vec()
}

fn parse(b: Bytes) -> Result<Container, rafter_artifact::ArtifactError> {
    Container::parse(b, &ReadOptions::default())
}

fn parse_unchecked(b: Bytes) -> Result<Container, rafter_artifact::ArtifactError> {
    Container::parse(
        b,
        &ReadOptions {
            verify_checksums: false,
        },
    )
}

#[test]
fn layout_and_round_trip() {
    let file = sample_container();
    assert_eq!(&file[..8], b"RAFTRFA\0");
    let c = parse(Bytes::from(file.clone())).unwrap();
    assert_eq!(c.version(), 1);
    let names: Vec<_> = c.sections().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["program", "weight_table", "cpu", "vulkan", "weights"]
    );
    let w = &c.sections()[4];
    assert_eq!(w.offset % 4096, 0, "weights are page-aligned");
    assert_eq!(w.offset + w.len, file.len() as u64, "weights end the file");
    assert_eq!(
        c.section(SectionKind::Weights, "weights").unwrap().len(),
        136
    );
    let vk = c.section(SectionKind::Executable, "vulkan").unwrap();
    assert_eq!(&vk[..4], &0x0723_0203u32.to_le_bytes());
    assert_eq!(
        &c.section(SectionKind::Program, "program").unwrap()[..],
        b"program \"opaque\" {}\n"
    );
    assert!(c.section(SectionKind::Executable, "metal").is_none());
    // Sections are slices of the file, not copies.
    let whole = c.bytes().as_ptr() as usize;
    let p = vk.as_ptr() as usize;
    assert!(p >= whole && p < whole + file.len());
}

#[test]
fn writer_rejects_bad_sections() {
    let mut w = ContainerWriter::new();
    assert!(w
        .add(SectionKind::Executable, "Vulkan", 4, SectionData::default())
        .is_err());
    assert!(w
        .add(SectionKind::Weights, "weights", 64, SectionData::default())
        .is_err());
    assert!(w
        .add(SectionKind::Executable, "cpu", 3, SectionData::default())
        .is_err());
    w.add(SectionKind::Executable, "cpu", 4, SectionData::default())
        .unwrap();
    assert!(w
        .add(SectionKind::Executable, "cpu", 4, SectionData::default())
        .is_err());
}

#[test]
fn specific_errors() {
    let file = sample_container();
    let msg = |b: Vec<u8>| parse(Bytes::from(b)).unwrap_err().to_string();

    let mut b = file.clone();
    put_u32(&mut b, 8, 7);
    assert_eq!(
        msg(b),
        "version 7 is not readable by this build (reads version 1)"
    );

    let mut b = file.clone();
    b[0] = b'P';
    assert!(msg(b).starts_with("not a rafter artifact"));

    let cut = file[..file.len() - 10].to_vec();
    assert_eq!(
        msg(cut.clone()),
        format!(
            "truncated: the file length in the header needs {} bytes, the file has {}",
            file.len(),
            cut.len()
        )
    );

    let w = find_section(&file, "weights");
    let e = entry_at(&file, w);
    let mut b = file.clone();
    put_u64(&mut b, e + 32, u64::MAX);
    resign(&mut b);
    let m = msg(b);
    assert!(m.contains("(weights)") && m.contains("overflows"), "{m}");

    let mut b = file.clone();
    put_u64(&mut b, e + 32, 1 << 40);
    resign(&mut b);
    let m = msg(b);
    assert!(m.contains("runs past the end of the file"), "{m}");

    let mut b = file.clone();
    put_u64(&mut b, e + 24, 4096 + 64);
    resign(&mut b);
    let m = msg(b);
    assert!(m.contains("not a multiple of its alignment 4096"), "{m}");

    let mut b = file.clone();
    put_u64(&mut b, e + 40, 64);
    resign(&mut b);
    let m = msg(b);
    assert!(
        m.contains("alignment 64 is not a power of two in 4096"),
        "{m}"
    );

    // Overlap: the vulkan section moved onto the cpu one.
    let (cpu_off, _) = section_range(&file, find_section(&file, "cpu"));
    let mut b = file.clone();
    put_u64(
        &mut b,
        entry_at(&file, find_section(&file, "vulkan")) + 24,
        cpu_off as u64,
    );
    resign(&mut b);
    let m = msg(b);
    assert!(m.contains("overlap"), "{m}");

    // A body byte: the section's checksum names it.
    let (off, len) = section_range(&file, w);
    let mut b = file.clone();
    b[off + len / 2] ^= 1;
    let m = msg(b);
    assert!(
        m.starts_with("section 4 (weights): checksum mismatch"),
        "{m}"
    );

    // Padding between sections.
    let mut b = file.clone();
    b[off - 1] = 1;
    let m = msg(b);
    assert!(m.contains("padding") && m.contains("not zero"), "{m}");

    // A duplicate executable.
    let mut b = file.clone();
    let vk = entry_at(&file, find_section(&file, "vulkan"));
    b[vk + 8..vk + 24].copy_from_slice(&{
        let mut n = [0u8; 16];
        n[..3].copy_from_slice(b"cpu");
        n
    });
    resign(&mut b);
    let m = msg(b);
    assert!(m.contains("duplicates section 2 (executable `cpu`)"), "{m}");
}

#[test]
fn hostile_corpus_container() {
    let file = sample_container();
    let tally = hostile_corpus(&file, &parse, &parse_unchecked);
    eprintln!(
        "{} damaged containers rejected: {:#?}",
        tally.cases, tally.messages
    );
    assert!(tally.cases > 1000);
}
