//! Fuzzes the artifact reader with arbitrary bytes: it must return an artifact or an error,
//! never panic, hang or read out of bounds. Checksums are verified in one pass and skipped
//! in another (`verify_checksums: false`), so mutated files get past them to the section
//! table, weight table, program text and executable parsers. Whatever is accepted must
//! verify and survive a write → read round trip.
//!
//! Seed the corpus with a valid artifact so mutations start past the header:
//! `cargo run -p rafter-artifact --example sample_artifact -- fuzz/corpus/read_artifact/sample.rfa`
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rafter_artifact::{Artifact, ArtifactWriter, Container, ReadOptions};

fn rewrite(a: &Artifact) -> Vec<u8> {
    let mut w = ArtifactWriter::new(a.program());
    for s in a.sections() {
        if let Some(code) = a.executable(&s.name) {
            w = w.executable(&s.name, code, s.align);
        }
    }
    w.to_vec().expect("an accepted program can be written")
}

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    let unchecked = ReadOptions {
        verify_checksums: false,
    };
    let _ = Container::parse(bytes.clone(), &unchecked);
    let _ = Artifact::from_bytes(bytes.clone());
    if let Ok(a) = Artifact::from_bytes_with(bytes, &unchecked) {
        a.program().verify().expect("accepted programs verify");
        for w in &a.program().weights {
            let size = w.dims.iter().product::<usize>() * w.dtype.size_of();
            assert_eq!(w.bytes.len(), size, "weight sizes agree with their shapes");
        }
        let first = rewrite(&a);
        let b = Artifact::from_bytes(Bytes::from(first.clone())).expect("rewritten artifacts read");
        assert_eq!(rewrite(&b), first, "write → read → write is a fixpoint");
    }
});
