//! A local tier that fills as it is read: the local folder a cache on S3 is read from.
//!
//! The tier is a local cache folder (manifest, entries by content key) whose entries may lack
//! some of their chunk and shard files: those are fetched from the bucket the first time a
//! reader needs one, or earlier by a background prefetch. Readers need not know: the tier is
//! the [`BlockSource`] they are given, and a reader that finds a block file missing asks it
//! before it concludes that the block is all fill value. Each file is downloaded beside its
//! place and renamed into it, so a reader sees a whole file or none, and two processes filling
//! one tier at once only repeat each other's work.
//!
//! With a budget smaller than the cache, the tier evicts chunk and shard files least recently
//! used first as it fetches (a reader's block check counts as a use), never the most recent
//! ones; a file still memory-mapped stays readable (and on disk) until it is unmapped, and a
//! reader that finds a file gone fetches it again.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rayon::prelude::*;

use super::RemoteCache;
use crate::cache::store::BlockSource;
use crate::error::{Error, Result};
use crate::format::ENTRIES_DIR;

/// Downloads a prefetch runs at once (they wait on the network, not the CPU).
const PREFETCHES: usize = 8;

/// The most recently used files (this many, at most a quarter of those tracked) are never
/// evicted: a reader may be about to open them.
const PROTECTED: u64 = 256;

/// The files a budgeted tier may evict, by last use.
#[derive(Default)]
struct Usage {
    /// Bytes the tier holds.
    bytes: u64,
    tick: u64,
    /// File -> (last use, bytes).
    files: HashMap<PathBuf, (u64, u64)>,
    /// Last use -> file: the eviction order.
    order: BTreeMap<u64, PathBuf>,
}

impl Usage {
    fn touch(&mut self, path: &Path) {
        if let Some((t, _)) = self.files.get_mut(path) {
            self.order.remove(t);
            self.tick += 1;
            *t = self.tick;
            self.order.insert(self.tick, path.to_path_buf());
        }
    }

    fn add(&mut self, path: PathBuf, len: u64) {
        self.tick += 1;
        if let Some((old, n)) = self.files.insert(path.clone(), (self.tick, len)) {
            self.order.remove(&old);
            self.bytes -= n;
        }
        self.order.insert(self.tick, path);
        self.bytes += len;
    }

    /// Remove least recently used files until the tier holds at most `budget`; how many.
    fn evict(&mut self, budget: u64) -> u64 {
        let mut n = 0;
        while self.bytes > budget {
            let Some((&t, _)) = self.order.first_key_value() else {
                break;
            };
            if t + PROTECTED.min(self.files.len() as u64 / 4) > self.tick {
                break;
            }
            let Some(p) = self.order.remove(&t) else {
                break;
            };
            let len = self.files.remove(&p).map_or(0, |f| f.1);
            match std::fs::remove_file(&p) {
                Ok(()) => n += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Not removable: count it as held, and stop trying it.
                Err(_) => continue,
            }
            self.bytes -= len;
        }
        n
    }
}

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
    evicted: AtomicU64,
    /// Bytes the tier may hold (`None`: unbounded, nothing tracked).
    budget: Option<u64>,
    usage: Mutex<Usage>,
    /// The chunk and shard files the bucket lists for the entries in use, and their sizes:
    /// the only files fetched, each bounded by its size.
    listed: HashMap<PathBuf, u64>,
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

/// Files and bytes a tier has fetched on demand or by prefetch, and files it evicted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Files fetched.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files removed to stay within the budget.
    pub evicted: u64,
}

impl Tier {
    /// A tier at `root` (a cache folder) filled from `remote`, for readers given it as their
    /// block source (`Blocks::new(tier)`). With `budget`: `held` bytes are there already, of which
    /// `evictable` (chunk and shard files, oldest use first) may be removed to make room.
    /// `listed`: the files the bucket holds for the entries in use, with their sizes.
    pub fn open(
        root: &Path,
        remote: Arc<RemoteCache>,
        budget: Option<u64>,
        held: u64,
        evictable: Vec<(PathBuf, u64)>,
        listed: HashMap<PathBuf, u64>,
    ) -> Arc<Tier> {
        let mut usage = Usage::default();
        if budget.is_some() {
            for (p, n) in evictable {
                usage.add(p, n);
            }
            usage.bytes = held.max(usage.bytes);
        }
        Arc::new(Tier {
            entries: root.join(ENTRIES_DIR),
            remote,
            inflight: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            serial: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            budget,
            usage: Mutex::new(usage),
            listed,
        })
    }

    /// Stop prefetching; readers still holding the tier no longer fetch into it (a block
    /// missing then is reported as missing).
    pub fn close(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// What was fetched so far.
    pub fn stats(&self) -> TierStats {
        TierStats {
            files: self.fetched.load(Ordering::Relaxed),
            bytes: self.fetched_bytes.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }

    /// Whether `bytes` more fit the budget without evicting.
    fn has_room(&self, bytes: u64) -> bool {
        self.budget
            .is_none_or(|b| lock(&self.usage).bytes.saturating_add(bytes) <= b)
    }

    /// Bring the file at `path` (under the tier's entries) from the bucket. `Ok(false)`: the
    /// bucket listed no such object (a block that is all fill value has none).
    pub fn fetch(&self, path: &Path) -> Result<bool> {
        if self.stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let Ok(rel) = path.strip_prefix(&self.entries) else {
            return Ok(false);
        };
        let Some(&size) = self.listed.get(path) else {
            return Ok(false);
        };
        let rel = rel.to_string_lossy().replace('\\', "/");
        let gate = lock(&self.inflight)
            .entry(path.to_path_buf())
            .or_default()
            .clone();
        let got = {
            let _held = lock(&gate);
            self.fetch_once(path, &rel, size)
        };
        lock(&self.inflight).remove(path);
        got
    }

    fn fetch_once(&self, path: &Path, rel: &str, size: u64) -> Result<bool> {
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
        let got = self.remote.get_entry_object(rel, &part, size);
        if !matches!(got, Ok(true)) {
            let _ = std::fs::remove_file(&part);
            return got;
        }
        let len = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        std::fs::rename(&part, path).map_err(|e| Error::io(path, e))?;
        self.fetched.fetch_add(1, Ordering::Relaxed);
        self.fetched_bytes.fetch_add(len, Ordering::Relaxed);
        if let Some(budget) = self.budget {
            let mut u = lock(&self.usage);
            u.add(path.to_path_buf(), len);
            let n = u.evict(budget);
            self.evicted.fetch_add(n, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Fetch `files` (paths under the tier's entries, and their sizes) that are not there
    /// yet, several at once, as long as they fit the budget without evicting. `wait`: return
    /// when done, with the first failure; else in the background, where a failure is left for
    /// the reader that needs the file to meet and report.
    pub fn prefetch(self: &Arc<Self>, files: Vec<(PathBuf, u64)>, wait: bool) -> Result<()> {
        let tier = self.clone();
        let work = move || -> Result<()> {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(PREFETCHES)
                .thread_name(|i| format!("s3-prefetch-{i}"))
                .build()
                .map_err(|e| Error::Config(format!("cannot start prefetch threads: {e}")))?;
            pool.install(|| {
                files.par_iter().try_for_each(|(p, n)| {
                    if tier.stop.load(Ordering::Relaxed)
                        || std::fs::symlink_metadata(p).is_ok()
                        || !tier.has_room(*n)
                    {
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

/// The tier as a reader's block source: a missing block file the bucket lists is fetched into
/// its place; with a budget, each use is counted for the least-recently-used order.
impl BlockSource for Tier {
    fn fetch_missing(&self, path: &Path) -> Result<bool> {
        self.fetch(path)
    }

    fn touch(&self, path: &Path) {
        if self.budget.is_some() {
            lock(&self.usage).touch(path);
        }
    }

    /// Only a budgeted tier removes files after they were checked: fetched again then.
    fn ensure(&self, path: &Path) -> Result<()> {
        if self.budget.is_none() {
            return Ok(());
        }
        if std::fs::symlink_metadata(path).is_err() {
            self.fetch(path)?;
        }
        lock(&self.usage).touch(path);
        Ok(())
    }
}
