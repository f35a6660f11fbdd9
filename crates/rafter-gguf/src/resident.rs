//! Weights read into process memory backed by huge pages, instead of mapped from the file.
//!
//! Why: an LLM's decode step streams every weight once, so its speed is memory bandwidth,
//! and with 4 KiB pages that stream also walks a page table entry every 4 KiB (a
//! Qwen3-0.6B-sized q4_0 step: ~96,000 pages). A file's pages in the page cache are 4 KiB;
//! anonymous memory advised with `MADV_HUGEPAGE` gets 2 MiB pages where the kernel has
//! transparent huge pages (`/sys/kernel/mm/transparent_hugepage/enabled` `always` or
//! `madvise`). Measured on a 2-core Zen 4 (`rafter generate qwen3-0.6b-shape-q4_0.gguf
//! --prompt-ids prompt-128.txt -n 128 --threads 2 --ignore-eos [--mmap]`, three alternated
//! runs each; benchmarks/RESULTS.md): decode 52-55 tok/s mapped, 59-61 into huge pages (and
//! 55-58 copied into 4 KiB pages, through a switch since removed). llama.cpp reads weights into
//! memory too when asked (`--no-mmap`, llama-bench `-lm none`), and repacks its Q4_0 weights
//! into its own buffers either way.
//!
//! The cost: the bytes are copied once at open, on every core (the kernel zeroes each fresh
//! huge page first), and the kernel can no longer drop and re-read them under memory
//! pressure, as it can a file's clean pages. Opening the 1.2 GB f16 GGUF and generating one
//! token (`/usr/bin/time rafter generate qwen3-0.6b-shape-f16.gguf --prompt-ids
//! prompt-128.txt -n 1 --threads 2 [--mmap]`, four alternated runs on the 2-core Zen 4) took
//! 1.2-1.9 s against 1.1-1.4 s mapped. Where memory is short, map instead.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::TensorMemory;

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
    read_parallel(file, &mut anon[start..start + len], offset, READ_CHUNK)?;
    let ro = anon.make_read_only()?;
    Ok(Bytes::from_owner(Resident(Arc::new(ro))).slice(start..start + len))
}

/// The whole file at `path` where `memory` says: mapped (every page up front, as
/// [`crate::map_file`]) or read into memory backed by huge pages ([`read_resident`]). For
/// files whose every byte is used in place (a safetensors shard, an LLM artifact).
pub fn read_file(path: &Path, memory: TensorMemory) -> std::io::Result<Bytes> {
    match memory {
        TensorMemory::Mapped => crate::map_file(path),
        TensorMemory::Resident => {
            let file = File::open(path)?;
            let len = usize::try_from(file.metadata()?.len()).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "file too large")
            })?;
            read_resident(&file, 0, len)
        }
    }
}

/// Bytes one thread reads at a time: whole huge pages.
const READ_CHUNK: usize = 16 * HUGE_PAGE;

/// Fills `buf` from `file` at `offset`, `chunk` bytes at a time per thread across the
/// machine's cores. Why: most of the time goes to the kernel zeroing each fresh huge page
/// as the copy first touches it (`perf record` of `rafter generate` on the q4_0 GGUF: 14%
/// of the main thread's samples in `clear_page_erms` under `read_resident`), which runs on
/// as many cores as fault at once: the f16 GGUF's open + one token (the command above)
/// took 2.8 and 5.2 s read by one thread, 1.2-1.9 s by two.
fn read_parallel(file: &File, buf: &mut [u8], offset: u64, chunk: usize) -> std::io::Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunks: Vec<(usize, &mut [u8])> = buf
        .chunks_mut(chunk)
        .enumerate()
        .map(|(i, c)| (i * chunk, c))
        .collect();
    // Off Unix, `read_exact_at` moves the file's one cursor: one thread only.
    if !cfg!(unix) || threads <= 1 || chunks.len() <= 1 {
        return read_exact_at(file, buf, offset);
    }
    let next = std::sync::Mutex::new(chunks.into_iter());
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> std::io::Result<()> {
                    loop {
                        let Some((at, chunk)) =
                            next.lock().unwrap_or_else(|e| e.into_inner()).next()
                        else {
                            return Ok(());
                        };
                        read_exact_at(file, chunk, offset + at as u64)?;
                    }
                })
            })
            .collect();
        // The scope joins any worker left when one fails.
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Seeks the file's cursor, then reads: callers must not read the file concurrently.
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
        // Many chunks over the threads (a 4 KiB chunk here; 32 MiB in use).
        let mut buf = vec![0u8; 90_001];
        read_parallel(&file, &mut buf, 7, 4096).unwrap();
        assert_eq!(&buf[..], &data[7..90_008]);
        let err = read_parallel(&file, &mut vec![0u8; 20_000], 90_000, 4096).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        // Past the end of the file: an error, not a short buffer.
        let err = read_resident(&file, 99_000, 2_000).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        std::fs::remove_file(&tmp.0).unwrap();
    }

    #[test]
    fn read_file_maps_or_reads_the_same_bytes() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 253) as u8).collect();
        let mut tmp = tempfile_in_target();
        tmp.1.write_all(&data).unwrap();
        for memory in [TensorMemory::Mapped, TensorMemory::Resident] {
            assert_eq!(
                &read_file(&tmp.0, memory).unwrap()[..],
                &data[..],
                "{memory:?}"
            );
        }
        std::fs::remove_file(&tmp.0).unwrap();
        for memory in [TensorMemory::Mapped, TensorMemory::Resident] {
            let err = read_file(&tmp.0, memory).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{memory:?}");
        }
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
