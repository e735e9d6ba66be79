//! Marking a local folder as voxcache's copy of one URL, so that a tier never adopts (and then
//! evicts from) another cache or a user's folder; and sweeping partial downloads.

use std::path::Path;

use crate::error::{Error, Result};

/// A partial download older than this is left over from a process that ended.
const STALE_PART: std::time::Duration = std::time::Duration::from_secs(3600);

/// The file that marks a folder as voxcache's local copy of one URL (a cache's tier and
/// staging folder, or a model's folder): `{"url": ..., "holds": ...}`.
pub const LOCAL_COPY_MARK: &str = ".voxcache-local-copy.json";

/// What a local copy is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// A cache on S3 (its tier, where reads come from, and its staging, where builds write).
    Cache,
    /// A model on S3 (`predict --model s3://...`).
    Model,
}

impl Holds {
    fn name(self) -> &'static str {
        match self {
            Holds::Cache => "cache",
            Holds::Model => "model",
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Mark {
    url: String,
    holds: String,
}

/// Make `dir` the local copy of `url` before anything is written or removed there: a new or
/// empty folder is marked as such; a marked one must be `url`'s, of the same kind; any other
/// folder is refused, since the tier replaces its manifest and evicts its entries. With
/// `given` false (the default location, under voxcache's own folder and named after the URL)
/// an unmarked folder from before marks were written is taken over.
pub fn claim(dir: &Path, url: &str, holds: Holds, given: bool) -> Result<()> {
    let mark = dir.join(LOCAL_COPY_MARK);
    let refuse = |why: String| {
        Error::cache(
            dir,
            format!(
                "--local-cache: {why}; voxcache writes the local copy of {url} only into a new \
                 or empty folder, or one it marked for {url} ({LOCAL_COPY_MARK}): give another"
            ),
        )
    };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(refuse("not a folder".into())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(dir, e)),
    }
    match crate::util::files::read_capped(&mark, 1 << 16) {
        Ok(bytes) => {
            let m: Mark = serde_json::from_slice(&bytes)
                .map_err(|e| Error::cache(&mark, format!("not a mark voxcache wrote: {e}")))?;
            if m.url != url || m.holds != holds.name() {
                return Err(refuse(format!(
                    "this folder is the local copy of the {} at {}",
                    m.holds, m.url
                )));
            }
            return Ok(());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(&mark, e)),
    }
    let mut others = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if !others.is_empty() && given {
        others.sort();
        others.truncate(4);
        return Err(refuse(format!(
            "this folder is not empty ({}) and is not marked as a local copy",
            others.join(", ")
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let json = serde_json::to_vec_pretty(&Mark {
        url: url.to_string(),
        holds: holds.name().to_string(),
    })
    .map_err(|e| Error::Config(e.to_string()))?;
    crate::util::files::write_atomic(&mark, &json)
}

/// Remove partial downloads under `dir` that a process which ended left behind.
pub(super) fn sweep_parts(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            sweep_parts(&p);
        } else if e.file_name().to_string_lossy().contains(".part-") {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_PART);
            if old {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}
