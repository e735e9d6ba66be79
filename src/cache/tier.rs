//! A local tier that fills as it is read: the local folder a cache on S3 is read from.
//!
//! The tier is a local cache folder (manifest, entries by content key) whose entries may lack
//! some of their chunk and shard files: those are fetched from the bucket the first time a
//! reader needs one, or earlier by a background prefetch. Readers need not know: a tier is
//! registered for the process, and a reader that finds a block file missing asks
//! [`fetch_missing`] before it concludes that the block is all fill value. Each file is
//! downloaded beside its place and renamed into it, so a reader sees a whole file or none,
//! and two processes filling one tier at once only repeat each other's work.
//!
//! With a budget smaller than the cache, the tier evicts chunk and shard files least recently
//! used first as it fetches (a reader's block check counts as a use), never the most recent
//! ones; a file still memory-mapped stays readable (and on disk) until it is unmapped, and a
//! reader that finds a file gone fetches it again.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use rayon::prelude::*;

use super::s3::RemoteCache;
use crate::error::{Error, Result};
use crate::format::ENTRIES_DIR;

/// Tiers registered in this process.
static TIERS: RwLock<Vec<Arc<Tier>>> = RwLock::new(Vec::new());

/// Downloads a prefetch runs at once (they wait on the network, not the CPU).
const PREFETCHES: usize = 8;

/// A partial download older than this is left over from a process that ended.
const STALE_PART: std::time::Duration = std::time::Duration::from_secs(3600);

/// The most recently used files (this many, at most a quarter of those tracked) are never
/// evicted: a reader may be about to open them.
const PROTECTED: u64 = 256;

/// Tiers registered: lets readers of local caches skip the registry's lock.
static REGISTERED: AtomicU64 = AtomicU64::new(0);

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
    /// A tier at `root` (a cache folder) filled from `remote`, registered for this process's
    /// readers until [`Tier::close`]. With `budget`: `held` bytes are there already, of which
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
        let tier = Arc::new(Tier {
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
        });
        TIERS
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(tier.clone());
        REGISTERED.fetch_add(1, Ordering::Relaxed);
        tier
    }

    /// Stop prefetching and unregister: readers no longer fetch into this tier.
    pub fn close(self: &Arc<Self>) {
        if !self.stop.swap(true, Ordering::Relaxed) {
            REGISTERED.fetch_sub(1, Ordering::Relaxed);
        }
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

/// The registered tier `path` lies in.
fn tier_of(path: &Path) -> Option<Arc<Tier>> {
    if REGISTERED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    TIERS
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|t| path.starts_with(&t.entries))
        .cloned()
}

/// A block file a reader found missing: fetched into its place when it lies in a registered
/// tier and the bucket holds it (`Ok(true)`); `Ok(false)` otherwise.
pub(crate) fn fetch_missing(path: &Path) -> Result<bool> {
    match tier_of(path) {
        Some(t) => t.fetch(path),
        None => Ok(false),
    }
}

/// A reader is about to use the block file at `path`: in a budgeted tier, its use is
/// recorded (the least recently used files go first).
pub(crate) fn touch(path: &Path) {
    if let Some(t) = tier_of(path).filter(|t| t.budget.is_some()) {
        lock(&t.usage).touch(path);
    }
}

/// A reader is about to read the block file at `path` through a store that would take a
/// missing file for fill values: in a budgeted tier, fetched again if it was evicted, and its
/// use recorded. Nothing for other caches.
pub(crate) fn in_use(path: &Path) -> Result<()> {
    let Some(t) = tier_of(path).filter(|t| t.budget.is_some()) else {
        return Ok(());
    };
    if std::fs::symlink_metadata(path).is_err() {
        t.fetch(path)?;
    }
    lock(&t.usage).touch(path);
    Ok(())
}
