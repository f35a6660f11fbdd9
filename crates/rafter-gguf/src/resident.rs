//! Weights read into process memory backed by huge pages, instead of mapped from the file.
//!
//! Why: an LLM's decode step streams every weight once, so its speed is memory bandwidth,
//! and with 4 KiB pages that stream also walks a page table entry every 4 KiB (a
//! Qwen3-0.6B-sized q4_0 step: ~96,000 pages). A file's pages in the page cache are 4 KiB;
//! anonymous memory advised with `MADV_HUGEPAGE` gets 2 MiB pages where the kernel has
//! transparent huge pages (`/sys/kernel/mm/transparent_hugepage/enabled` `always` or
//! `madvise`). Measured on a 2-core Zen 4 (Qwen3-0.6B-shaped q4_0 GGUF, 128 tokens after a
//! 128-token prompt, three alternated runs each; benchmarks/RESULTS.md): decode 52-55 tok/s
//! mapped, 55-58 copied into 4 KiB pages, 59-61 into huge pages. llama.cpp reads weights into
//! memory too when asked (`--no-mmap`, llama-bench `-lm none`), and repacks its Q4_0 weights
//! into its own buffers either way.
//!
//! The cost: the bytes are copied once at open (a few hundred MB/s to GB/s from the page
//! cache), and the kernel can no longer drop and re-read them under memory pressure, as it
//! can a file's clean pages. Where that matters (a device short of memory), map instead.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

/// The huge page size the copy's start is aligned to (x86-64 and arm64 with 4 KiB base
/// pages): a huge page can only back a 2 MiB-aligned range.
const HUGE_PAGE: usize = 2 << 20;

/// Read-only anonymous memory as the owner of a [`Bytes`] buffer.
struct Resident(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for Resident {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// `len` bytes of `file` from `offset`, copied into anonymous memory that starts on a huge
/// page boundary and is advised for huge pages (Linux; elsewhere, or where the kernel has
/// none, ordinary pages), then made read-only. The returned buffer keeps the memory alive.
pub fn read_resident(file: &File, offset: u64, len: usize) -> std::io::Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    // Room to start on a huge page boundary: the slack before it is never touched, so it
    // costs address space only.
    let reserve = len.checked_add(HUGE_PAGE).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "weights too large")
    })?;
    let mut anon = memmap2::MmapMut::map_anon(reserve)?;
    let start = anon.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
    #[cfg(target_os = "linux")]
    {
        // A hint: without transparent huge pages it fails or does nothing, and the copy
        // below lands in ordinary pages, which is still correct.
        let _ = anon.advise_range(memmap2::Advice::HugePage, start, len);
    }
    read_exact_at(file, &mut anon[start..start + len], offset)?;
    let ro = anon.make_read_only()?;
    Ok(Bytes::from_owner(Resident(Arc::new(ro))).slice(start..start + len))
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn copies_the_range_exactly() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut tmp = tempfile_in_target();
        tmp.1.write_all(&data).unwrap();
        let file = File::open(&tmp.0).unwrap();
        for (off, len) in [(0usize, data.len()), (1, 999), (4096, 50_000), (99_999, 1)] {
            let got = read_resident(&file, off as u64, len).unwrap();
            assert_eq!(&got[..], &data[off..off + len], "offset {off}, {len} bytes");
            assert_eq!(
                got.as_ptr() as usize % HUGE_PAGE,
                0,
                "starts on a huge page"
            );
        }
        assert!(read_resident(&file, 0, 0).unwrap().is_empty());
        // Past the end of the file: an error, not a short buffer.
        let err = read_resident(&file, 99_000, 2_000).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        std::fs::remove_file(&tmp.0).unwrap();
    }

    fn tempfile_in_target() -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!(
            "rafter-gguf-resident-{}-{:?}.bin",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = File::create(&path).unwrap();
        (path, f)
    }
}
