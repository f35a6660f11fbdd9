//! Handing back the heap pages that opening a model freed.
//!
//! Opening a GGUF file or HF folder builds the decoder graph, parses the GGUF's metadata
//! (151k-entry vocabularies), runs the compiler's passes and serialises the tokenizer: tens of
//! MB of short-lived allocations, all freed before the first token. glibc's allocator keeps
//! freed pages inside its heap resident (only the top of the heap is trimmed, and long-lived
//! allocations made along the way pin it), so they stayed in the process's RSS for its whole
//! life: ~20 MB of the peak at q8_0 (Qwen3-0.6B shape, `rafter generate`, 737 MB against
//! llama.cpp's 698). `malloc_trim(0)` returns every wholly free page to the kernel
//! (`MADV_DONTNEED`); later allocations fault fresh pages in as they need them.

/// Returns the allocator's wholly free pages to the kernel (glibc only; elsewhere nothing).
pub fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes the allocator's own locks and only releases pages of free
    // chunks; it may be called from any thread at any time and touches no memory of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}
