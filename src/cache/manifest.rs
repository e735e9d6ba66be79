//! manifest.json: which entries make up each dataset built into this cache.
//!
//! Several builders (one per array job, say) may finish at once: each takes an exclusive lock
//! on `manifest.lock`, re-reads the manifest, merges its cases and rewrites it atomically.

use std::collections::BTreeMap;
use std::fs::OpenOptions;

use serde::{Deserialize, Serialize};

use super::layout::{write_atomic, CacheDir};
use crate::error::{Error, Result};
use crate::pipeline::{OutputParams, FORMAT_VERSION};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ManifestCase {
    pub key: String,
    pub entry: String,
    pub out_shape_zyx: [usize; 3],
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ManifestDataset {
    pub pipeline: String,
    /// blake3 of the canonical parameters: builds with equal params_key merge their cases.
    pub params_key: String,
    pub params: OutputParams,
    /// How the target spacing was chosen (rule and reason).
    pub spacing_rule: String,
    pub spacing_reason: String,
    pub cases: BTreeMap<String, ManifestCase>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format_version: u32,
    pub datasets: BTreeMap<String, ManifestDataset>,
}

impl Default for Manifest {
    fn default() -> Self {
        Manifest {
            format_version: FORMAT_VERSION,
            datasets: BTreeMap::new(),
        }
    }
}

pub fn params_key(params: &OutputParams) -> String {
    blake3::hash(params.canonical_json().as_bytes()).to_hex()[..16].to_string()
}

impl Manifest {
    /// Read the manifest; a cache without one has an empty manifest.
    pub fn load(cache: &CacheDir) -> Result<Manifest> {
        let path = cache.manifest_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Manifest::default()),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let m: Manifest = serde_json::from_str(&text)
            .map_err(|e| Error::cache(&path, format!("not a voxcache manifest: {e}")))?;
        if m.format_version != FORMAT_VERSION {
            return Err(Error::cache(
                &path,
                format!("cache format version {} (this voxcache reads version {FORMAT_VERSION}); rebuild into a new cache folder", m.format_version),
            ));
        }
        Ok(m)
    }

    /// Merge one build's result for `name` into the manifest on disk, under the lock.
    pub fn record(cache: &CacheDir, name: &str, dataset: ManifestDataset) -> Result<Manifest> {
        let lock_path = cache.root.join("manifest.lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(&lock_path, e))?;
        lock.lock().map_err(|e| Error::io(&lock_path, e))?;
        let mut m = Manifest::load(cache)?;
        match m.datasets.get_mut(name) {
            Some(existing) if existing.params_key == dataset.params_key => {
                existing.cases.extend(dataset.cases);
                existing.pipeline = dataset.pipeline;
            }
            _ => {
                m.datasets.insert(name.to_string(), dataset);
            }
        }
        let bytes = serde_json::to_vec_pretty(&m).unwrap_or_default();
        write_atomic(&cache.manifest_path(), &bytes)?;
        drop(lock);
        Ok(m)
    }
}
