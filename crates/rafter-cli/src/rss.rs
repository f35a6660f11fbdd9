//! Resident-memory snapshots of this process, for `rafter run --memory-report`.
//!
//! The split matters more than the total: weights of an artifact are memory-mapped, so
//! once touched they show up as file-backed pages (`RssFile`, shared with the page cache
//! and dropped under pressure without swap), while copies would be anonymous (`RssAnon`).
//! Linux only (`/proc/self/status`); elsewhere the report says it is unavailable.

/// Resident set of the process, in KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rss {
    /// All resident pages (`VmRSS`).
    pub total_kib: u64,
    /// Anonymous pages: heap, stacks, copies (`RssAnon`).
    pub anon_kib: u64,
    /// File-backed pages: the binary, and mapped weights (`RssFile`).
    pub file_kib: u64,
    /// The peak of `total_kib` so far (`VmHWM`).
    pub peak_kib: u64,
}

impl Rss {
    /// The current snapshot, or `None` where `/proc/self/status` is unavailable.
    pub fn now() -> Option<Rss> {
        Rss::parse(&std::fs::read_to_string("/proc/self/status").ok()?)
    }

    /// Reads the fields from the text of a `/proc/PID/status` file.
    pub fn parse(status: &str) -> Option<Rss> {
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            let rest = line[name.len()..].trim_start_matches(':').trim();
            rest.strip_suffix("kB")?.trim().parse().ok()
        };
        Some(Rss {
            total_kib: field("VmRSS")?,
            anon_kib: field("RssAnon")?,
            file_kib: field("RssFile")?,
            peak_kib: field("VmHWM")?,
        })
    }
}

/// Prints one `memory WHEN: ...` line (MiB, one decimal).
pub fn report(when: &str) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    match Rss::now() {
        Some(r) => println!(
            "memory {when}: rss {:.1} MiB (anonymous {:.1} MiB, file-backed {:.1} MiB), peak {:.1} MiB",
            mib(r.total_kib),
            mib(r.anon_kib),
            mib(r.file_kib),
            mib(r.peak_kib)
        ),
        None => println!("memory {when}: unavailable (no /proc/self/status)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_status() {
        let text = "Name:\trafter\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t   600 kB\nRssFile:\t   400 kB\nRssShmem:\t 24 kB\n";
        let r = Rss::parse(text).unwrap();
        assert_eq!(
            r,
            Rss {
                total_kib: 1024,
                anon_kib: 600,
                file_kib: 400,
                peak_kib: 2048
            }
        );
        assert_eq!(Rss::parse("VmRSS: 12 kB\n"), None);
    }
}
