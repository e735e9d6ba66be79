//! `manifest.json`: per dataset, the parameters it was built with and its cases' entries.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use super::params::OutputParams;
use super::{check_version, positive3, FORMAT_VERSION};
use crate::error::{Error, Result};

/// The manifest's file name in the cache folder.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The lock file builds take while they merge their cases into the manifest.
pub const MANIFEST_LOCK: &str = "manifest.lock";
/// The cache's folder of committed entries (`entries/ab/KEY`).
pub const ENTRIES_DIR: &str = "entries";
/// The file nnU-Net keeps its cross-validation splits in (beside the cache, or in a run).
pub const SPLITS_FILE: &str = "splits_final.json";
/// The cache's folder of entries being written (renamed into [`ENTRIES_DIR`] when complete).
pub const TMP_DIR: &str = "tmp";

/// One case of a dataset.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ManifestCase {
    /// Content key of the case's entry.
    pub key: String,
    /// The entry folder relative to the cache root: `entries/ab/KEY`.
    pub entry: String,
    /// Output shape (z, y, x) in voxels.
    #[serde(deserialize_with = "positive3")]
    pub out_shape_zyx: [usize; 3],
}

/// One dataset: the parameters every one of its entries was built with.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ManifestDataset {
    /// Name of the pipeline of the latest build that recorded cases here.
    pub pipeline: String,
    /// blake3 of the canonical parameters: builds with equal params_key merge their cases.
    pub params_key: String,
    /// Everything predict needs to preprocess a new volume the same way (target spacing,
    /// normalization and its dataset statistics, dtype).
    pub params: OutputParams,
    /// The rule that chose the target spacing: "explicit", "median" or "anisotropy rule".
    pub spacing_rule: String,
    /// Why, in a sentence.
    pub spacing_reason: String,
    /// Image channel names in channel order (dataset.json's, else "channel 0"...); as many as
    /// `params.channels`.
    pub channels: Vec<String>,
    /// Case id -> its entry.
    pub cases: BTreeMap<String, ManifestCase>,
    /// The dataset's `dataset.json` (channels, label classes, ignore label), when it has one:
    /// what train and predict need to name and map classes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_json: Option<super::dataset_json::DatasetDescription>,
    /// Where the dataset's files were at its latest build: fold validation reads its cases'
    /// images and labels (in their own geometry) from there. Absent in caches built before it
    /// was recorded, and for predict's scratch caches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<DatasetOrigin>,
}

/// Where a dataset's input files were found: a folder, or glob patterns.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DatasetOrigin {
    /// The dataset folder (absolute) for a folder dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<std::path::PathBuf>,
    /// The image glob (absolute) for a glob dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<String>,
    /// The label glob (absolute) for a glob dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<String>,
    /// A cascade's first-stage segmentations (absolute; `--previous-stage`): fold validation
    /// gives its cases those channels again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_stage: Option<std::path::PathBuf>,
}

/// `manifest.json`: every dataset built into the cache.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    /// [`FORMAT_VERSION`] of the writer; other versions are refused.
    pub format_version: u32,
    /// Dataset name -> its parameters and cases.
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

/// The short key of a parameter set: builds with equal keys share a dataset's case list.
pub fn params_key(params: &OutputParams) -> String {
    blake3::hash(params.canonical_json().as_bytes()).to_hex()[..16].to_string()
}

/// An entry path from a manifest: `entries/...`, plain components only (nothing may point
/// outside the cache folder).
pub fn entry_path_is_safe(rel: &str) -> bool {
    let p = Path::new(rel);
    p.components().all(|c| matches!(c, Component::Normal(_)))
        && p.components().next() == Some(Component::Normal(ENTRIES_DIR.as_ref()))
}

/// Whether `key` has the form of a content key: ASCII hex digits, 2 to 128 of them (ours are
/// 64). Keys come from manifests and bucket listings that anyone may have written; one that
/// is not checked could name a folder outside the cache, or split inside a character.
pub fn key_is_valid(key: &str) -> bool {
    (2..=128).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The entry folder of a valid `key`, relative to the cache root: `entries/ab/abcdef...`.
/// `None` for a key that is not one ([`key_is_valid`]).
pub fn entry_rel(key: &str) -> Option<String> {
    key_is_valid(key).then(|| format!("{ENTRIES_DIR}/{}/{key}", &key[..2]))
}

/// Whether `rel`, a `/`-separated path from an object store's listing or a manifest, is a
/// relative path of plain components: no empty component (`a//b`, a leading `/`), no `.` or
/// `..`, no backslash or NUL (object stores keep any key verbatim, and `Path::join` with an
/// absolute path replaces the base).
pub fn rel_path_is_plain(rel: &str) -> bool {
    !rel.is_empty()
        && rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains(['\\', '\0']))
}

impl Manifest {
    /// Merge one build's result for dataset `name`: cases join those built with the same
    /// parameters; other parameters replace the dataset.
    pub fn merge(&mut self, name: &str, dataset: ManifestDataset) {
        match self.datasets.get_mut(name) {
            Some(existing) if existing.params_key == dataset.params_key => {
                existing.cases.extend(dataset.cases);
                existing.pipeline = dataset.pipeline;
                existing.dataset_json = dataset.dataset_json;
                if dataset.origin.is_some() {
                    existing.origin = dataset.origin;
                }
            }
            _ => {
                self.datasets.insert(name.to_string(), dataset);
            }
        }
    }

    /// Parse a manifest's bytes (`path` names it in errors).
    pub fn from_json(path: &Path, bytes: &[u8]) -> Result<Manifest> {
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::cache(path, format!("not a voxcache manifest: {e}")))?;
        check_version(path, "manifest", value.get("format_version"))?;
        let m = Manifest::deserialize(value)
            .map_err(|e| Error::cache(path, format!("not a voxcache manifest: {e}")))?;
        for (name, d) in &m.datasets {
            for (id, c) in &d.cases {
                if !key_is_valid(&c.key) {
                    return Err(Error::cache(
                        path,
                        format!(
                            "dataset {name}, case {id}: key {:?} is not a content key (2 to 128 \
                             hex digits)",
                            c.key
                        ),
                    ));
                }
                if entry_rel(&c.key).as_deref() != Some(c.entry.as_str()) {
                    return Err(Error::cache(
                        path,
                        format!(
                            "dataset {name}, case {id}: entry path {:?} is not its key's folder \
                             {:?}",
                            c.entry,
                            entry_rel(&c.key).unwrap_or_default()
                        ),
                    ));
                }
                if !entry_path_is_safe(&c.entry) {
                    return Err(Error::cache(
                        path,
                        format!(
                            "dataset {name}, case {id}: entry path {:?} leaves the cache's entries/ folder",
                            c.entry
                        ),
                    ));
                }
            }
        }
        Ok(m)
    }

    /// Read `path`; `Ok(None)` when there is no such file.
    pub fn read(path: &Path) -> Result<Option<Manifest>> {
        // A manifest of 100,000 cases is about 60 MiB.
        match crate::util::files::read_capped(path, 1 << 30) {
            Ok(b) => Manifest::from_json(path, &b).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// Pretty JSON, as written to `manifest.json`.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }
}
