//! Merging a build's cases into `manifest.json` (the schema lives in [`crate::format::manifest`]).
//!
//! Several builders (one per array job, say) may finish at once: each takes an exclusive lock
//! on `manifest.lock`, re-reads the manifest, merges its cases and rewrites it atomically.

use std::fs::OpenOptions;

use super::layout::CacheDir;
use crate::error::{Error, Result};
pub use crate::format::manifest::params_key;
use crate::format::MANIFEST_LOCK;
pub use crate::format::{Manifest, ManifestCase, ManifestDataset};

/// The manifest of a cache, or an empty one when no build has finished there yet.
pub fn load_or_empty(cache: &CacheDir) -> Result<Manifest> {
    Ok(Manifest::read(&cache.manifest_path())?.unwrap_or_default())
}

/// Merge one build's result for `name` into `m`: cases join those built with the same
/// parameters; other parameters replace the dataset.
pub fn merge(m: &mut Manifest, name: &str, dataset: ManifestDataset) {
    match m.datasets.get_mut(name) {
        Some(existing) if existing.params_key == dataset.params_key => {
            existing.cases.extend(dataset.cases);
            existing.pipeline = dataset.pipeline;
            existing.dataset_json = dataset.dataset_json;
            if dataset.origin.is_some() {
                existing.origin = dataset.origin;
            }
        }
        _ => {
            m.datasets.insert(name.to_string(), dataset);
        }
    }
}

/// Merge one build's result for `name` into the manifest: on disk under the lock, or on S3 by
/// compare-and-swap when the cache is a staging folder for a bucket.
pub fn record(cache: &CacheDir, name: &str, dataset: ManifestDataset) -> Result<Manifest> {
    if let Some(remote) = &cache.remote {
        return remote.record(name, &dataset);
    }
    let lock_path = cache.root.join(MANIFEST_LOCK);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::io(&lock_path, e))?;
    lock.lock().map_err(|e| Error::io(&lock_path, e))?;
    let mut m = load_or_empty(cache)?;
    merge(&mut m, name, dataset);
    std::fs::create_dir_all(cache.tmp_dir()).map_err(|e| Error::io(cache.tmp_dir(), e))?;
    cache.write_manifest(&m.to_json())?;
    drop(lock);
    Ok(m)
}
