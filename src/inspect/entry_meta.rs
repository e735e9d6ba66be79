//! One cache entry's metadata, parsed defensively: a missing, truncated or foreign `zarr.json`
//! becomes a [`Problem`] naming the file, never a panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{rel_path, Problem};
use crate::cache::CacheDir;
use crate::error::{Error, Result};
use crate::format::entry::ClassStats;
use crate::format::{Compression, Dtype, EntryAttrs, ENTRIES_DIR, ZARR_JSON};

/// What an entry's group `zarr.json` says about it.
#[derive(Clone, Debug)]
pub struct EntryMeta {
    /// The entry's folder.
    pub dir: PathBuf,
    /// Relative to the cache root: entries/ab/abcd...
    pub rel: String,
    /// Its content key (the folder's name).
    pub key: String,
    /// The case it holds.
    pub case_id: String,
    /// Array shape (z, y, x) in voxels.
    pub shape_zyx: [usize; 3],
    /// Image channels: the image array is (c, z, y, x).
    pub channels: usize,
    /// True output spacing (x, y, z).
    pub spacing_xyz: [f64; 3],
    /// Spatial unit of the spacing.
    pub unit: String,
    /// Element type of the image.
    pub image_dtype: Dtype,
    /// Element type of the label, if the entry has one.
    pub label_dtype: Option<Dtype>,
    /// Channels of the signed distance array, if the entry has one (may be 0: no class).
    pub distance_channels: Option<usize>,
    /// Whether the entry has a skeleton array (of the label's type).
    pub skeleton: bool,
    /// Whether the entry has nnU-Net's normalization mask (uint8).
    pub norm_mask: bool,
    /// Chunk shape (z, y, x).
    pub chunk_zyx: [usize; 3],
    /// Shard shape (z, y, x), if sharded.
    pub shard_zyx: Option<[usize; 3]>,
    /// Chunk codec ("none", "zstd", "blosc").
    pub codec: String,
    /// Per-class voxel counts and bounding boxes.
    pub classes: BTreeMap<u16, ClassStats>,
    /// Rows of the `fg` array (0 when there is none).
    pub fg_rows: u64,
}

/// A result whose error is a problem to report (boxed: problems are large).
pub type Found<T> = std::result::Result<T, Box<Problem>>;

/// Check that an array's `zarr.json` reads as Zarr v3 array metadata, or say what is wrong.
pub fn check_array_json(root: &Path, path: &Path) -> Found<()> {
    let rel = rel_path(root, path);
    let problem = |msg: String| Box::new(Problem::error("metadata", msg).path(rel.clone()));
    let bytes = std::fs::read(path).map_err(|e| problem(format!("cannot read: {e}")))?;
    crate::format::array::parse_metadata(path, &bytes)
        .map(|_| ())
        .map_err(|e| problem(super::file_message(root, path, &e.to_string())))
}

/// "none", "zstd-3", "blosc-5".
pub fn codec_name(c: &Compression) -> String {
    match c {
        Compression::None => "none".into(),
        Compression::Zstd { level } => format!("zstd-{level}"),
        Compression::Blosc { level } => format!("blosc-{level}"),
        Compression::BloscLz4 { level } => format!("blosc-lz4-{level}"),
    }
}

/// Parse the entry in `dir` (entries/ab/KEY under `root`).
pub fn read_entry(root: &Path, dir: &Path) -> Found<EntryMeta> {
    let rel = rel_path(root, dir);
    let zj = dir.join(ZARR_JSON);
    if !zj.is_file() {
        return Err(Box::new(
            Problem::error(
                "incomplete-entry",
                format!("no {ZARR_JSON}: not a complete entry (builds write it last)"),
            )
            .path(rel),
        ));
    }
    let zrel = rel_path(root, &zj);
    let bytes = std::fs::read(&zj).map_err(|e| {
        Box::new(Problem::error("metadata", format!("cannot read: {e}")).path(zrel.clone()))
    })?;
    let a = EntryAttrs::from_group_json(&zj, &bytes).map_err(|e| {
        let msg = super::file_message(root, &zj, &e.to_string());
        Box::new(Problem::error("metadata", msg).path(zrel.clone()))
    })?;
    let channels = a.channels();
    Ok(EntryMeta {
        channels,
        dir: dir.to_path_buf(),
        rel,
        key: a.key,
        case_id: a.case_id,
        shape_zyx: a.output.shape_zyx,
        spacing_xyz: a.output.spacing_xyz,
        unit: a.input.unit,
        image_dtype: a.params.image_dtype.dtype(),
        label_dtype: a.label.as_ref().map(|l| l.dtype),
        distance_channels: a.derived.distance.as_ref().map(|d| d.classes.len()),
        skeleton: a.derived.skeleton.is_some(),
        norm_mask: a.derived.norm_mask.is_some(),
        chunk_zyx: a.layout.chunk_zyx,
        shard_zyx: a.layout.shard_zyx,
        codec: codec_name(&a.params.compression),
        fg_rows: a.fg_index.total_rows(),
        classes: a.label.map(|l| l.classes).unwrap_or_default(),
    })
}

/// The folder of the entry with this key, if the key looks like one (hex, at least 2 long).
pub fn entry_dir(root: &Path, key: &str) -> Option<PathBuf> {
    let ok = key.len() >= 2 && key.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| CacheDir::new(root).entry_path(key))
}

/// The first 8 characters of a key: enough to tell entries apart.
pub fn short_key(key: &str) -> String {
    key.chars().take(8).collect()
}

/// Every folder under entries/ab/, sorted; anything else there is a problem.
pub fn entry_dirs(root: &Path) -> (Vec<PathBuf>, Vec<Problem>) {
    let mut dirs = Vec::new();
    let mut problems = Vec::new();
    let entries = root.join(ENTRIES_DIR);
    let Ok(rd) = std::fs::read_dir(&entries) else {
        return (dirs, problems);
    };
    let mut prefixes: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    prefixes.sort();
    for p in prefixes {
        if !p.is_dir() {
            problems.push(
                Problem::warning("stray-file", "not an entry folder").path(rel_path(root, &p)),
            );
            continue;
        }
        let prefix = p
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let Ok(rd) = std::fs::read_dir(&p) else {
            continue;
        };
        let mut inner: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        inner.sort();
        for d in inner {
            let name = d
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            if !d.is_dir() || !name.starts_with(&prefix) {
                problems.push(
                    Problem::warning(
                        "stray-file",
                        format!("not an entry of {ENTRIES_DIR}/{prefix}/"),
                    )
                    .path(rel_path(root, &d)),
                );
                continue;
            }
            dirs.push(d);
        }
    }
    (dirs, problems)
}

/// The entry of `case` in a cache: a case id the manifest knows (in exactly one dataset, or with
/// one key across them), else a key prefix, else a case id found in the entries' metadata.
pub fn find_entry(root: &Path, case: &str) -> Result<EntryMeta> {
    let cache = CacheDir::new(root);
    let manifest = crate::cache::manifest::load_or_empty(&cache).unwrap_or_default();
    let mut keys: Vec<(String, String)> = manifest
        .datasets
        .iter()
        .filter_map(|(name, d)| d.cases.get(case).map(|c| (name.clone(), c.key.clone())))
        .collect();
    keys.sort();
    let mut distinct: Vec<&String> = keys.iter().map(|(_, k)| k).collect();
    distinct.sort();
    distinct.dedup();
    let open = |dir: PathBuf| {
        read_entry(root, &dir).map_err(|p| {
            let p = *p;
            Error::cache(
                root.join(p.path.unwrap_or_default()),
                format!("{}: {}", p.kind, p.message),
            )
        })
    };
    match distinct.as_slice() {
        [one] => {
            let dir = entry_dir(root, one).ok_or_else(|| {
                Error::cache(cache.manifest_path(), format!("case {case}: bad entry key {one:?}"))
            })?;
            return open(dir);
        }
        [] => {}
        _ => {
            return Err(Error::Dataset(format!(
                "case {case} is in several datasets of this cache with different entries ({}): give the entry's key (or a prefix of it) instead",
                keys.iter()
                    .map(|(n, k)| format!("{n}: {}", short_key(k)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
    let (dirs, _) = entry_dirs(root);
    let by_key: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(case))
        })
        .collect();
    if case.len() >= 4 {
        match by_key.as_slice() {
            [one] => return open((*one).clone()),
            [] => {}
            _ => {
                return Err(Error::Dataset(format!(
                    "key prefix {case} matches {} entries: give more of it",
                    by_key.len()
                )))
            }
        }
    }
    let mut found: Vec<EntryMeta> = dirs
        .iter()
        .filter_map(|d| read_entry(root, d).ok())
        .filter(|m| m.case_id == case)
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::Dataset(format!(
            "no entry for case {case} in {} (give a case id from the manifest or an entry key)",
            root.display()
        ))),
        n => Err(Error::Dataset(format!(
            "case {case} has {n} entries in {}: give the entry's key (or a prefix of it) instead",
            root.display()
        ))),
    }
}
