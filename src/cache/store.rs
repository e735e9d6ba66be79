//! The storage seam: where entry bytes are written and read through zarrs' storage traits.
//! Today both sides are the local filesystem; an object store is another implementation of
//! the same traits, chosen in [`open_readable`] and [`EntryStore`].
//!
//! Writing: a write-only Zarr store for building one entry in its temporary folder.
//!
//! zarrs' FilesystemStore fsyncs every chunk as it is written, which on this kind of disk halves
//! write throughput. An entry only needs to be durable at the moment it is renamed into place,
//! so this store writes plainly and `sync_all` fsyncs everything once, just before the commit;
//! the kernel has been writing back in the background all along.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use zarrs::filesystem::FilesystemStore;
use zarrs::storage::{
    Bytes, OffsetBytesIterator, ReadableStorageTraits, StorageError, StoreKey, StorePrefix,
    WritableStorageTraits,
};

use crate::error::{Error, Result};

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
