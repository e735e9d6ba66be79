//! A local tier that fills as it is read: the local folder a cache on S3 is read from.
//!
//! The tier is a local cache folder (manifest, entries by content key) whose entries may lack
//! some of their chunk and shard files: those are fetched from the bucket the first time a
//! reader needs one, or earlier by a background prefetch. Readers need not know: a tier is
//! registered for the process, and a reader that finds a block file missing asks
//! [`fetch_missing`] before it concludes that the block is all fill value. Each file is
//! downloaded beside its place and renamed into it, so a reader sees a whole file or none,
//! and two processes filling one tier at once only repeat each other's work.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use rayon::prelude::*;

use super::remote::RemoteCache;
use crate::error::{Error, Result};
use crate::format::ENTRIES_DIR;

/// Tiers registered in this process.
static TIERS: RwLock<Vec<Arc<Tier>>> = RwLock::new(Vec::new());

/// Downloads a prefetch runs at once (they wait on the network, not the CPU).
const PREFETCHES: usize = 8;

/// A partial download older than this is left over from a process that ended.
const STALE_PART: std::time::Duration = std::time::Duration::from_secs(3600);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One local tier and the bucket its missing files come from.
pub struct Tier {
    entries: PathBuf,
    remote: Arc<RemoteCache>,
    /// One gate per file being fetched, so concurrent readers of one block download it once.
    inflight: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
    stop: AtomicBool,
    serial: AtomicU64,
    fetched: AtomicU64,
    fetched_bytes: AtomicU64,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tier({} <- {})",
            self.entries.display(),
            self.remote.url()
        )
    }
}

/// Files and bytes a tier has fetched on demand or by prefetch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Files fetched.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Tier {
    /// A tier at `root` (a cache folder) filled from `remote`, registered for this process's
    /// readers until [`Tier::close`].
    pub fn open(root: &Path, remote: Arc<RemoteCache>) -> Arc<Tier> {
        let tier = Arc::new(Tier {
            entries: root.join(ENTRIES_DIR),
            remote,
            inflight: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            serial: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
        });
        TIERS
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(tier.clone());
        tier
    }

    /// Stop prefetching and unregister: readers no longer fetch into this tier.
    pub fn close(self: &Arc<Self>) {
        self.stop.store(true, Ordering::Relaxed);
        TIERS
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|t| !Arc::ptr_eq(t, self));
    }

    /// What was fetched so far.
    pub fn stats(&self) -> TierStats {
        TierStats {
            files: self.fetched.load(Ordering::Relaxed),
            bytes: self.fetched_bytes.load(Ordering::Relaxed),
        }
    }

    /// Bring the file at `path` (under the tier's entries) from the bucket. `Ok(false)`: the
    /// bucket holds no such object.
    pub fn fetch(&self, path: &Path) -> Result<bool> {
        let Ok(rel) = path.strip_prefix(&self.entries) else {
            return Ok(false);
        };
        let rel = rel.to_string_lossy().replace('\\', "/");
        let gate = lock(&self.inflight)
            .entry(path.to_path_buf())
            .or_default()
            .clone();
        let got = {
            let _held = lock(&gate);
            self.fetch_once(path, &rel)
        };
        lock(&self.inflight).remove(path);
        got
    }

    fn fetch_once(&self, path: &Path, rel: &str) -> Result<bool> {
        // Another reader (or the prefetch) may have brought it while this one waited.
        if std::fs::symlink_metadata(path).is_ok() {
            return Ok(true);
        }
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Ok(false);
        };
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let part = dir.join(format!(
            ".{}.part-{}-{}",
            name.to_string_lossy(),
            std::process::id(),
            self.serial.fetch_add(1, Ordering::Relaxed)
        ));
        let got = self.remote.get_entry_object(rel, &part);
        if !matches!(got, Ok(true)) {
            let _ = std::fs::remove_file(&part);
            return got;
        }
        let len = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        std::fs::rename(&part, path).map_err(|e| Error::io(path, e))?;
        self.fetched.fetch_add(1, Ordering::Relaxed);
        self.fetched_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(true)
    }

    /// Fetch `files` (paths under the tier's entries) that are not there yet, several at
    /// once. `wait`: return when done, with the first failure; else in the background, where
    /// a failure is left for the reader that needs the file to meet and report.
    pub fn prefetch(self: &Arc<Self>, files: Vec<PathBuf>, wait: bool) -> Result<()> {
        let tier = self.clone();
        let work = move || -> Result<()> {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(PREFETCHES)
                .thread_name(|i| format!("s3-prefetch-{i}"))
                .build()
                .map_err(|e| Error::Config(format!("cannot start prefetch threads: {e}")))?;
            pool.install(|| {
                files.par_iter().try_for_each(|p| {
                    if tier.stop.load(Ordering::Relaxed) || std::fs::symlink_metadata(p).is_ok() {
                        return Ok(());
                    }
                    match tier.fetch(p) {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(Error::remote(
                            tier.remote.url().to_string(),
                            format!(
                                "{}: listed in the bucket, then gone when fetched",
                                p.display()
                            ),
                        )),
                        Err(e) => Err(e),
                    }
                })
            })
        };
        if wait {
            return work();
        }
        std::thread::Builder::new()
            .name("s3-prefetch".into())
            .spawn(move || {
                let _ = work();
            })
            .map(|_| ())
            .map_err(|e| Error::Config(format!("cannot start the prefetch thread: {e}")))
    }
}

/// Remove partial downloads under `dir` that a process which ended left behind.
pub fn sweep_parts(dir: &Path) {
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

/// A block file a reader found missing: fetched into its place when it lies in a registered
/// tier and the bucket holds it (`Ok(true)`); `Ok(false)` otherwise.
pub(crate) fn fetch_missing(path: &Path) -> Result<bool> {
    let tier = TIERS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|t| path.starts_with(&t.entries))
        .cloned();
    match tier {
        Some(t) => t.fetch(path),
        None => Ok(false),
    }
}
