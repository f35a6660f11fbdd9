//! The per-core L2 cache size, which kernels size their working blocks by.
//!
//! Read from Linux's sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/`, the level-2
//! data or unified cache), once per process. Elsewhere, or where sysfs does not say,
//! [`FALLBACK_L2_BYTES`]: Zen 2 and 3's 512 KiB, the L2 the kernels' blocks were sized
//! for before the host's own was read (a smaller core's L2 then spills to its L3).

use std::path::Path;
use std::sync::OnceLock;

/// The L2 assumed where the host does not say its own.
pub const FALLBACK_L2_BYTES: usize = 512 * 1024;

/// The per-core L2 cache size in bytes (see the module docs).
pub fn l2_bytes() -> usize {
    static L2: OnceLock<usize> = OnceLock::new();
    *L2.get_or_init(|| {
        sysfs_l2_bytes(Path::new("/sys/devices/system/cpu/cpu0/cache")).unwrap_or(FALLBACK_L2_BYTES)
    })
}

/// The level-2 data or unified cache's size under `dir` (sysfs's `cache` folder of a CPU),
/// if one is listed with a size that parses.
fn sysfs_l2_bytes(dir: &Path) -> Option<usize> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    entries.into_iter().find_map(|entry| {
        let index = entry.path();
        let level = read(&index.join("level"))?;
        let kind = read(&index.join("type"))?;
        if level != "2" || !(kind == "Unified" || kind == "Data") {
            return None;
        }
        parse_size(&read(&index.join("size"))?)
    })
}

/// A sysfs cache size (`2048K`, `1M`, `524288`) in bytes; `None` for anything else or 0.
fn parse_size(text: &str) -> Option<usize> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    digits
        .parse::<usize>()
        .ok()?
        .checked_mul(scale)
        .filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_sizes_parse_with_their_units() {
        assert_eq!(parse_size("2048K"), Some(2 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("524288"), Some(512 << 10));
        for bad in ["", "K", "12Q", "0K", "-1K", "1.5M"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_level_2_data_or_unified_cache_is_found() {
        let dir = std::env::temp_dir().join(format!("rafter-l2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let write = |index: &str, level: &str, kind: &str, size: &str| {
            let d = dir.join(index);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        };
        write("index0", "1", "Data", "48K");
        write("index1", "1", "Instruction", "32K");
        assert_eq!(sysfs_l2_bytes(&dir), None, "no level-2 cache listed");
        write("index2", "2", "Unified", "2048K");
        write("index3", "3", "Unified", "491520K");
        assert_eq!(sysfs_l2_bytes(&dir), Some(2 << 20));
        assert_eq!(sysfs_l2_bytes(&dir.join("missing")), None);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(l2_bytes() >= 64 << 10, "{}", l2_bytes());
    }
}
