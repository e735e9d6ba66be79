//! The storage seam: where a cache's entries are committed and where a reader's block files
//! come from. Everything above it (the build, the reader, the trainer) is given a [`Backend`]
//! and a [`Blocks`] and never asks where the cache lives.
//!
//! - [`Backend`]: where committed entries and the manifest live. The cache folder itself
//!   ([`super::layout::LocalFolder`]), or a bucket the folder stages for
//!   ([`super::s3::RemoteCache`]). A builder writes each entry whole in the folder's `tmp/`
//!   through an [`EntryStore`], then hands it to [`Backend::commit`].
//! - [`BlockSource`]: what a reader does when a block file of an entry is not in the folder.
//!   A complete folder ([`Complete`]) has nothing more to give; a local tier of a cache on S3
//!   ([`super::s3::Tier`]) fetches it. Chunk bytes are always read from the folder (memory
//!   maps, zarrs' filesystem store): the seam decides only how files get there.
//!
//! Both implementations pass one conformance suite (tests/suite/store_conformance.rs).
//!
//! Writing one entry: zarrs' FilesystemStore fsyncs every chunk as it is written, which on
//! this kind of disk halves write throughput. An entry only needs to be durable at the moment
//! it is committed, so [`EntryStore`] writes plainly and `sync_all` fsyncs everything once,
//! just before the commit; the kernel has been writing back in the background all along.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use zarrs::filesystem::FilesystemStore;
use zarrs::storage::{
    Bytes, OffsetBytesIterator, ReadableStorageTraits, StorageError, StoreKey, StorePrefix,
    WritableStorageTraits,
};

use crate::error::{Error, Result};
use crate::format::{Manifest, ManifestDataset};

/// What happened when an entry was committed.
#[derive(Debug, PartialEq, Eq)]
pub enum Commit {
    /// Ours is in place now.
    Placed,
    /// Another builder placed the same key first; ours was discarded (same content).
    AlreadyThere,
}

/// Where a cache's committed entries and its manifest live. `root` is the cache folder the
/// entries are built in (the cache itself, or the staging folder of a bucket).
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Where the entries live, for messages: a folder or a URL.
    fn location(&self, root: &Path) -> String;
    /// Whether the entry of `key` is committed. A question the store cannot answer counts as
    /// "no": the build then fails at the commit, naming the problem.
    fn has_entry(&self, root: &Path, key: &str) -> bool;
    /// Commit the complete entry written in the folder `tmp` as `key`. Afterwards `tmp` is
    /// gone, whatever the outcome but an error.
    fn commit(&self, root: &Path, tmp: &Path, key: &str) -> Result<Commit>;
    /// Merge one build's result for dataset `name` into the manifest, so that builders
    /// finishing at once each land their cases; the manifest as written.
    fn record(&self, root: &Path, name: &str, dataset: ManifestDataset) -> Result<Manifest>;
    /// Whether committed entries stay in the folder (and so take its disk).
    fn holds_entries(&self) -> bool;
    /// Before a build: remove what interrupted builders left in the store long ago. A line
    /// to print when something was removed. Best effort: the build goes on after a failure.
    fn sweep_abandoned(&self) -> Result<Option<String>>;
}

/// What a reader does when a block file of an entry is not in the cache folder.
pub trait BlockSource: Send + Sync + std::fmt::Debug {
    /// Bring the missing block file at `path` into its place: `Ok(true)` when the store held
    /// it, `Ok(false)` when there is none (a block the build recorded as all fill value).
    fn fetch_missing(&self, path: &Path) -> Result<bool>;
    /// A reader is about to use the block file at `path` (it is there).
    fn touch(&self, path: &Path);
    /// A reader is about to read `path` through a store that would take a missing file for
    /// fill values: make sure it is there if the store holds it, and count the use.
    fn ensure(&self, path: &Path) -> Result<()>;
}

/// A cache folder that holds every block its entries have: a missing file is missing.
#[derive(Debug, Default)]
pub struct Complete;

impl BlockSource for Complete {
    fn fetch_missing(&self, _path: &Path) -> Result<bool> {
        Ok(false)
    }
    fn touch(&self, _path: &Path) {}
    fn ensure(&self, _path: &Path) -> Result<()> {
        Ok(())
    }
}

/// The block source a reader is given (shared by every entry it opens).
#[derive(Clone, Debug)]
pub struct Blocks(Arc<dyn BlockSource>);

impl Blocks {
    /// Blocks from `source`.
    pub fn new(source: Arc<dyn BlockSource>) -> Self {
        Blocks(source)
    }
}

impl Default for Blocks {
    /// A complete folder.
    fn default() -> Self {
        Blocks(Arc::new(Complete))
    }
}

impl std::ops::Deref for Blocks {
    type Target = dyn BlockSource;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// A readable store, as every reading module takes it.
pub type ReadStore = dyn ReadableStorageTraits;

/// Open an entry folder (or any folder of Zarr nodes) for reading through zarrs.
pub fn open_readable(dir: &Path) -> Result<Arc<ReadStore>> {
    let store = FilesystemStore::new(dir).map_err(|e| Error::zarr(dir, e))?;
    Ok(Arc::new(store))
}

/// Writes one entry's files; durable only after [`EntryStore::sync_all`].
pub struct EntryStore {
    root: PathBuf,
    written: Mutex<Vec<PathBuf>>,
}

fn io(e: std::io::Error) -> StorageError {
    StorageError::IOError(Arc::new(e))
}

impl EntryStore {
    /// A store writing under `root` (the entry's temporary folder).
    pub fn new(root: &Path) -> Self {
        EntryStore {
            root: root.to_path_buf(),
            written: Mutex::new(Vec::new()),
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key.trim_start_matches('/'))
    }

    /// Make every file written so far, and the folders holding them, durable.
    pub fn sync_all(&self) -> std::io::Result<()> {
        let files = std::mem::take(&mut *self.written.lock().unwrap_or_else(|p| p.into_inner()));
        files
            .par_iter()
            .try_for_each(|p| match std::fs::File::open(p) {
                Ok(f) => f.sync_all(),
                // Erased after writing (an all-fill chunk): nothing to sync.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            })?;
        let mut dirs: Vec<&Path> = files.iter().filter_map(|p| p.parent()).collect();
        dirs.sort();
        dirs.dedup();
        for d in dirs {
            if let Ok(f) = std::fs::File::open(d) {
                f.sync_all()?;
            }
        }
        Ok(())
    }
}

impl WritableStorageTraits for EntryStore {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        let path = self.path(key.as_str());
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&path, &value).map_err(io)?;
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path);
        Ok(())
    }

    fn set_partial_many(
        &self,
        _key: &StoreKey,
        _values: OffsetBytesIterator,
    ) -> Result<(), StorageError> {
        Err(io(std::io::Error::other(
            "partial writes are not used when building an entry",
        )))
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        match std::fs::remove_file(self.path(key.as_str())) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()),
        }
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        match std::fs::remove_dir_all(self.path(prefix.as_str())) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()),
        }
    }

    fn supports_set_partial(&self) -> bool {
        false
    }
}
