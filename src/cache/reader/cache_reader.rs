//! A whole cache: its manifest, its datasets and cases, and entries opened with one shared
//! [`ChunkCache`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{ChunkCache, EntryReader, ReaderOptions};
use crate::cache::layout::CacheDir;
use crate::error::{Error, Result};
use crate::format::{Manifest, ManifestDataset, ENTRIES_DIR, MANIFEST_FILE};

/// One case of a dataset in the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaseInfo {
    /// Case id in the manifest.
    pub case_id: String,
    /// Content key of its entry.
    pub key: String,
    /// The entry folder, under the cache root.
    pub entry_dir: PathBuf,
    /// Output shape (z, y, x) in voxels, as the manifest records it.
    pub shape_zyx: [usize; 3],
}

/// A whole cache: its manifest, and entries opened with one shared [`ChunkCache`].
#[derive(Clone)]
pub struct CacheReader {
    root: PathBuf,
    manifest: Arc<Manifest>,
    cache: ChunkCache,
}

impl std::fmt::Debug for CacheReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheReader")
            .field("root", &self.root)
            .field("datasets", &self.datasets())
            .finish()
    }
}

impl CacheReader {
    /// Open a cache folder written by `prep build-cache`, with default [`ReaderOptions`].
    pub fn open(cache_dir: impl AsRef<Path>) -> Result<CacheReader> {
        Self::open_with(cache_dir, ReaderOptions::default())
    }

    /// Open a cache folder, reading its entries as `options` say.
    pub fn open_with(cache_dir: impl AsRef<Path>, options: ReaderOptions) -> Result<CacheReader> {
        let root = cache_dir.as_ref().to_path_buf();
        if !root.is_dir() {
            return Err(Error::cache(&root, "cache folder not found"));
        }
        let path = CacheDir::new(&root).manifest_path();
        let Some(manifest) = Manifest::read(&path)? else {
            return Err(Error::cache(
                &root,
                if root.join(ENTRIES_DIR).is_dir() {
                    format!("no {MANIFEST_FILE}: no build has finished in this cache yet")
                } else {
                    format!(
                        "not a voxcache cache: no {MANIFEST_FILE} (build one with prep build-cache)"
                    )
                },
            ));
        };
        Ok(CacheReader {
            root,
            manifest: Arc::new(manifest),
            cache: ChunkCache::new(options),
        })
    }

    /// The cache folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The manifest as read when the cache was opened.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The cache shared by every entry opened through this reader.
    pub fn chunk_cache(&self) -> &ChunkCache {
        &self.cache
    }

    /// Dataset names, sorted.
    pub fn datasets(&self) -> Vec<&str> {
        self.manifest.datasets.keys().map(String::as_str).collect()
    }

    /// One dataset's record in the manifest; the error names the datasets there.
    pub fn dataset(&self, name: &str) -> Result<&ManifestDataset> {
        self.manifest.datasets.get(name).ok_or_else(|| {
            Error::cache(
                self.root.join(MANIFEST_FILE),
                format!(
                    "no dataset {name:?} in this cache (it has: {})",
                    self.datasets().join(", ")
                ),
            )
        })
    }

    /// The cases of a dataset, sorted by case id.
    pub fn cases(&self, dataset: &str) -> Result<Vec<CaseInfo>> {
        let ds = self.dataset(dataset)?;
        ds.cases
            .iter()
            .map(|(id, c)| {
                // format::Manifest checked on reading that the path stays inside entries/.
                let rel = Path::new(&c.entry);
                Ok(CaseInfo {
                    case_id: id.clone(),
                    key: c.key.clone(),
                    entry_dir: self.root.join(rel),
                    shape_zyx: c.out_shape_zyx,
                })
            })
            .collect()
    }

    /// An entry folder must be a real folder inside the cache, reached by no symbolic link.
    fn check_inside(&self, dir: &Path) -> Result<()> {
        let mut p = self.root.clone();
        let rel = dir.strip_prefix(&self.root).unwrap_or(dir);
        for part in rel.components() {
            p.push(part);
            let linked = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink());
            if linked {
                return Err(Error::cache(
                    &p,
                    "a symbolic link inside the cache: refused (an entry must be the cache's own folder)",
                ));
            }
        }
        Ok(())
    }

    /// Open the entry of one case: inside the cache, reached by no link, and holding the case
    /// and key the manifest says.
    pub fn open_entry(&self, dataset: &str, case_id: &str) -> Result<EntryReader> {
        let case = self
            .cases(dataset)?
            .into_iter()
            .find(|c| c.case_id == case_id)
            .ok_or_else(|| {
                Error::cache(
                    self.root.join(MANIFEST_FILE),
                    format!("no case {case_id:?} in dataset {dataset:?}"),
                )
            })?;
        self.check_inside(&case.entry_dir)?;
        let entry = EntryReader::open_with(&case.entry_dir, &self.cache)?;
        if entry.case_id() != Some(case_id) || entry.key() != case.key {
            return Err(Error::cache(
                &case.entry_dir,
                format!(
                    "the manifest files case {case_id} (key {}) here, but the entry holds case {} (key {}): entries swapped or edited",
                    short(&case.key),
                    entry.case_id().unwrap_or("?"),
                    short(entry.key())
                ),
            ));
        }
        if entry.shape_zyx() != case.shape_zyx {
            return Err(Error::cache(
                &case.entry_dir,
                format!(
                    "entry shape {:?} differs from the manifest's {:?}",
                    entry.shape_zyx(),
                    case.shape_zyx
                ),
            ));
        }
        Ok(entry)
    }
}

/// The first 8 characters of a key, for messages (by character: a tampered manifest may hold
/// any text, and slicing bytes could split one).
fn short(key: &str) -> String {
    key.chars().take(8).collect()
}
