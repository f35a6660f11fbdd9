//! The process's resident set size, read from `/proc/self/status` (Linux).

/// Resident memory in KiB (`VmRSS`), or `None` where `/proc` does not say.
pub fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
