//! Where measured device profiles live between runs, and reading them.
//!
//! `rafter devices --profile` measures each device and stores the descriptions
//! ([`rafter_opt::partition::Profiles`]) in one small text file next to the Vulkan
//! pipeline cache; the cost-model targets (`auto`, `cpu,vulkan`) load it when present
//! and use the built-in defaults for every device it does not describe.

use std::path::{Path, PathBuf};

use rafter_opt::partition::Profiles;

use crate::Error;

/// The profile file: `RAFTER_DEVICE_PROFILES` (empty: none, the built-in defaults),
/// else `$XDG_CACHE_HOME/rafter/device-profiles.txt` or
/// `~/.cache/rafter/device-profiles.txt`.
pub fn profiles_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RAFTER_DEVICE_PROFILES") {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("rafter").join("device-profiles.txt"))
}

/// The profiles stored at `path`; none (the defaults apply) when the file does not
/// exist. A file that exists but cannot be read or parsed is an error naming it.
pub fn load_profiles_from(path: &Path) -> Result<Profiles, Error> {
    match std::fs::read_to_string(path) {
        Ok(text) => Profiles::parse(&text, &path.display().to_string()).map_err(Error::Profiles),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Profiles::default()),
        Err(e) => Err(Error::Profiles(format!("{}: {e}", path.display()))),
    }
}

/// The profiles at [`profiles_path`], or none.
pub fn load_profiles() -> Result<Profiles, Error> {
    profiles_path().map_or_else(|| Ok(Profiles::default()), |p| load_profiles_from(&p))
}

/// Writes `profiles` to `path` (creating its folder), replacing the file atomically.
pub fn save_profiles(profiles: &Profiles, path: &Path) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::Profiles(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, profiles.to_text()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rafter_opt::partition::DeviceDescription;

    #[test]
    fn profiles_are_saved_and_loaded_and_a_missing_file_means_defaults() {
        let dir = std::env::temp_dir().join(format!("rafter-profiles-{}", std::process::id()));
        let path = dir.join("sub").join("device-profiles.txt");
        assert_eq!(load_profiles_from(&path).unwrap(), Profiles::default());
        let mut p = Profiles::default();
        p.insert(DeviceDescription::default_for("vulkan"));
        save_profiles(&p, &path).unwrap();
        assert_eq!(load_profiles_from(&path).unwrap(), p);
        std::fs::write(&path, "rafter-profiles 1\nbogus\n").unwrap();
        let e = load_profiles_from(&path).unwrap_err().to_string();
        assert!(
            e.contains("device-profiles.txt: line 2: unknown record `bogus`"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
