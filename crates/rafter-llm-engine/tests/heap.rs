//! `release_freed_heap` hands freed heap pages back: the process's RSS (from
//! `/proc/self/statm`) drops after it by most of what was freed. Its own test binary, so that
//! no other test allocates meanwhile.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

/// Resident pages of this process, in bytes.
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn freed_heap_pages_leave_the_rss() {
    const BLOCK: usize = 16 << 10; // below glibc's mmap threshold: heap chunks
    const BLOCKS: usize = 2048; // 32 MiB
                                // Each block followed by a small live allocation: the freed blocks cannot merge into the
                                // heap's top, which the allocator trims by itself, so they stay resident until trimmed.
    let (mut blocks, pins): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (0..BLOCKS)
        .map(|i| (vec![i as u8 | 1; BLOCK], vec![7u8; 64]))
        .unzip();
    let touched: usize = blocks.iter().map(|b| b[BLOCK - 1] as usize).sum();
    assert!(touched > 0);
    blocks.clear();
    blocks.shrink_to_fit();
    let before = rss_bytes();
    rafter_llm_engine::release_freed_heap();
    let after = rss_bytes();
    assert!(pins.iter().all(|p| p[63] == 7));
    assert!(
        before.saturating_sub(after) >= (BLOCK * BLOCKS) / 2,
        "RSS {before} -> {after} bytes: less than half of the 32 MiB freed came back"
    );
}
