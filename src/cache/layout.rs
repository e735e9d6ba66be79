//! Paths inside a cache folder, temporary folders, and the cache folder as its own storage
//! backend ([`LocalFolder`]: an entry committed by one rename, the manifest merged under a lock).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::store::Backend;
pub use super::store::Commit;
use crate::error::{Error, Result};
use crate::format::{
    Manifest, ManifestDataset, ENTRIES_DIR, MANIFEST_FILE, MANIFEST_LOCK, TMP_DIR, ZARR_JSON,
};
use crate::util::files::replace_via;
use crate::util::sysinfo::{hostname, pid_alive};

/// A cache folder: where entries are built (`tmp/`), and, as its [`Backend`] says, where they
/// are committed: into the folder itself ([`LocalFolder`]), or into a bucket it stages for.
#[derive(Clone, Debug)]
pub struct CacheDir {
    /// The folder.
    pub root: PathBuf,
    backend: Arc<dyn Backend>,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl CacheDir {
    /// The cache folder at `root` (nothing is created before [`CacheDir::prepare`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CacheDir {
            root: root.into(),
            backend: Arc::new(LocalFolder),
        }
    }

    /// The folder `root`, committing its entries and manifest into `backend` (the staging
    /// folder of a cache on S3, say).
    pub fn with_backend(root: impl Into<PathBuf>, backend: Arc<dyn Backend>) -> Self {
        CacheDir {
            root: root.into(),
            backend,
        }
    }

    /// Where committed entries and the manifest live.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Where the entries live, for messages: the folder, or the bucket's URL.
    pub fn location(&self) -> String {
        self.backend.location(&self.root)
    }

    /// `ROOT/manifest.json`.
    pub fn manifest_path(&self) -> PathBuf {
        self.root.join(MANIFEST_FILE)
    }

    /// `ROOT/entries`: committed entries.
    pub fn entries_dir(&self) -> PathBuf {
        self.root.join(ENTRIES_DIR)
    }

    /// `ROOT/tmp`: entries being written.
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join(TMP_DIR)
    }

    /// entries/ab/abcdef... Keys are checked where they enter (manifests, listings: see
    /// [`crate::format::key_is_valid`]); one that is not a key still never panics here.
    pub fn entry_path(&self, key: &str) -> PathBuf {
        match crate::format::entry_rel(key) {
            Some(rel) => self.root.join(rel),
            None => self.entries_dir().join("invalid-key"),
        }
    }

    /// The entry path for a key that looks like one (hex, 2 to 128 digits), else `None`.
    pub fn entry_rel_checked(key: &str) -> Option<String> {
        crate::format::entry_rel(key)
    }

    /// The entry path relative to the root, as the manifest records it, of a key this
    /// process made (a content key).
    pub fn entry_rel(key: &str) -> String {
        crate::format::entry_rel(key).unwrap_or_else(|| format!("{ENTRIES_DIR}/invalid-key"))
    }

    /// Whether the entry of `key` is committed ([`Backend::has_entry`]).
    pub fn has_entry(&self, key: &str) -> bool {
        self.backend.has_entry(&self.root, key)
    }

    /// Commit the complete temporary entry `tmp` as `key` ([`Backend::commit`]).
    pub fn commit(&self, tmp: &Path, key: &str) -> Result<Commit> {
        self.backend.commit(&self.root, tmp, key)
    }

    /// Merge one build's result for dataset `name` into the manifest ([`Backend::record`]).
    pub fn record(&self, name: &str, dataset: ManifestDataset) -> Result<Manifest> {
        self.backend.record(&self.root, name, dataset)
    }

    /// Create the folders and prove we can write there, before any work is done.
    pub fn prepare(&self) -> Result<()> {
        for d in [self.root.clone(), self.entries_dir(), self.tmp_dir()] {
            std::fs::create_dir_all(&d).map_err(|e| Error::io(&d, e))?;
        }
        let probe = self
            .tmp_dir()
            .join(format!(".probe.{}", std::process::id()));
        std::fs::write(&probe, b"ok").map_err(|e| Error::io(&probe, e))?;
        std::fs::remove_file(&probe).map_err(|e| Error::io(&probe, e))?;
        Ok(())
    }

    /// A fresh temporary folder for one entry. Its name says which host and process own it,
    /// so a sweep never deletes a folder another live builder is writing.
    pub fn new_tmp_entry(&self, key: &str) -> Result<PathBuf> {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = self
            .tmp_dir()
            .join(format!("{key}.{}.{}.{n}", hostname(), std::process::id()));
        std::fs::create_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        Ok(p)
    }

    /// Remove temporary folders left by dead builders on this host. Returns what was removed.
    pub fn sweep_tmp(&self) -> Result<Vec<PathBuf>> {
        let me = hostname();
        let mut removed = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.tmp_dir()) else {
            return Ok(removed);
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let parts: Vec<&str> = name.split('.').collect();
            if parts.len() < 4 {
                continue;
            }
            let (host, pid) = (parts[1..parts.len() - 2].join("."), parts[parts.len() - 2]);
            let Ok(pid) = pid.parse::<u32>() else {
                continue;
            };
            if host == me && (pid != std::process::id()) && !pid_alive(pid) {
                let p = e.path();
                let gone = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                gone.map_err(|err| Error::io(&p, err))?;
                removed.push(p);
            }
        }
        Ok(removed)
    }

    /// Replace `manifest.json` atomically. Its temporary file lives in `tmp/`, named like an
    /// entry being written (`manifest.HOST.PID.N`), so a builder killed mid-write leaves
    /// nothing beside the manifest, and the next build on that host sweeps it like any other.
    pub fn write_manifest(&self, bytes: &[u8]) -> Result<()> {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self.tmp_dir().join(format!(
            "manifest.{}.{}.{n}",
            hostname(),
            std::process::id()
        ));
        replace_via(&tmp, &self.manifest_path(), bytes)
    }
}

/// The cache folder as its own backend: an entry is committed by one rename into
/// `entries/`, and the manifest is merged under an exclusive lock on `manifest.lock` (several
/// builders, one per array job say, may finish at once) and replaced atomically.
#[derive(Debug, Default)]
pub struct LocalFolder;

impl Backend for LocalFolder {
    fn location(&self, root: &Path) -> String {
        root.display().to_string()
    }

    /// Complete when its group `zarr.json` is there (written last, and renamed in with it).
    fn has_entry(&self, root: &Path, key: &str) -> bool {
        CacheDir::new(root)
            .entry_path(key)
            .join(ZARR_JSON)
            .is_file()
    }

    fn commit(&self, root: &Path, tmp: &Path, key: &str) -> Result<Commit> {
        let dest = CacheDir::new(root).entry_path(key);
        let parent = dest.parent().unwrap_or(root);
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        if dest.exists() {
            std::fs::remove_dir_all(tmp).map_err(|e| Error::io(tmp, e))?;
            return Ok(Commit::AlreadyThere);
        }
        match std::fs::rename(tmp, &dest) {
            Ok(()) => {
                // Make the rename itself durable.
                if let Ok(d) = std::fs::File::open(parent) {
                    let _ = d.sync_all();
                }
                Ok(Commit::Placed)
            }
            Err(_) if dest.join(ZARR_JSON).is_file() => {
                std::fs::remove_dir_all(tmp).map_err(|e| Error::io(tmp, e))?;
                Ok(Commit::AlreadyThere)
            }
            Err(e) => Err(Error::io(&dest, e)),
        }
    }

    fn record(&self, root: &Path, name: &str, dataset: ManifestDataset) -> Result<Manifest> {
        let cache = CacheDir::new(root);
        let lock_path = root.join(MANIFEST_LOCK);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(&lock_path, e))?;
        lock.lock().map_err(|e| Error::io(&lock_path, e))?;
        let mut m = Manifest::read(&cache.manifest_path())?.unwrap_or_default();
        m.merge(name, dataset);
        std::fs::create_dir_all(cache.tmp_dir()).map_err(|e| Error::io(cache.tmp_dir(), e))?;
        cache.write_manifest(&m.to_json())?;
        drop(lock);
        Ok(m)
    }

    fn holds_entries(&self) -> bool {
        true
    }

    /// Temporary folders of dead builders are swept per host ([`CacheDir::sweep_tmp`]).
    fn sweep_abandoned(&self) -> Result<Option<String>> {
        Ok(None)
    }
}

/// Total bytes of the files under `dir` (0 for what cannot be read).
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(_) => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                Err(_) => {}
            }
        }
    }
    total
}
