//! One cache entry's metadata, parsed defensively: a missing, truncated or foreign `zarr.json`
//! becomes a [`Problem`] naming the file, never a panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{rel_path, Problem};
use crate::cache::fg_index::ClassStats;
use crate::cache::manifest::Manifest;
use crate::cache::CacheDir;
use crate::error::{Error, Result};

/// What an entry's group `zarr.json` says about it.
#[derive(Clone, Debug)]
pub struct EntryMeta {
    pub dir: PathBuf,
    /// Relative to the cache root: entries/ab/abcd...
    pub rel: String,
    pub key: String,
    pub case_id: String,
    pub shape_zyx: [usize; 3],
    pub spacing_xyz: [f64; 3],
    pub unit: String,
    pub image_dtype: String,
    pub label_dtype: Option<String>,
    pub chunk_zyx: [usize; 3],
    pub shard_zyx: Option<[usize; 3]>,
    pub codec: String,
    pub classes: BTreeMap<String, ClassStats>,
    /// Rows of the `fg` array (0 when there is none).
    pub fg_rows: u64,
    /// Name of the checksums file, when the entry records one.
    pub checksums: Option<String>,
}

/// A result whose error is a problem to report (boxed: problems are large).
pub type Found<T> = std::result::Result<T, Box<Problem>>;

/// Read and parse a JSON file, or say what is wrong with it.
pub fn read_json(root: &Path, path: &Path) -> Found<Value> {
    let rel = rel_path(root, path);
    let bytes = std::fs::read(path).map_err(|e| {
        Box::new(Problem::error("metadata", format!("cannot read: {e}")).path(rel.clone()))
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        let what = if e.is_eof() {
            "truncated JSON"
        } else {
            "unparsable JSON"
        };
        Box::new(Problem::error("metadata", format!("{what} ({e})")).path(rel))
    })
}

fn usize3(v: &Value) -> Option<[usize; 3]> {
    let a = v.as_array()?;
    if a.len() != 3 {
        return None;
    }
    let n = |i: usize| a[i].as_u64().map(|x| x as usize);
    Some([n(0)?, n(1)?, n(2)?])
}

fn f64x3(v: &Value) -> Option<[f64; 3]> {
    let a = v.as_array()?;
    if a.len() != 3 {
        return None;
    }
    Some([a[0].as_f64()?, a[1].as_f64()?, a[2].as_f64()?])
}

/// "none", "zstd-3", "blosc-5" from the entry's `params.compression`.
pub fn codec_name(c: &Value) -> String {
    let name = c.get("codec").and_then(Value::as_str).unwrap_or("?");
    match c.get("level").and_then(Value::as_i64) {
        Some(l) => format!("{name}-{l}"),
        None => name.to_string(),
    }
}

/// Parse the entry in `dir` (entries/ab/KEY under `root`).
pub fn read_entry(root: &Path, dir: &Path) -> Found<EntryMeta> {
    let rel = rel_path(root, dir);
    let zj = dir.join("zarr.json");
    if !zj.is_file() {
        return Err(Box::new(
            Problem::error(
                "incomplete-entry",
                "no zarr.json: not a complete entry (builds write it last)",
            )
            .path(rel),
        ));
    }
    let doc = read_json(root, &zj)?;
    let zrel = rel_path(root, &zj);
    let bad = |what: &str| {
        Box::new(
            Problem::error(
                "metadata",
                format!("not a voxcache entry: {what} is missing or malformed"),
            )
            .path(zrel.clone()),
        )
    };
    let a = doc
        .get("attributes")
        .and_then(|a| a.get("voxcache"))
        .ok_or_else(|| bad("attributes.voxcache"))?;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let key = s(a, "key").ok_or_else(|| bad("key"))?;
    let case_id = s(a, "case_id").ok_or_else(|| bad("case_id"))?;
    let out = a.get("output").ok_or_else(|| bad("output"))?;
    let shape_zyx = out
        .get("shape_zyx")
        .and_then(usize3)
        .ok_or_else(|| bad("output.shape_zyx"))?;
    let spacing_xyz = out
        .get("spacing_xyz")
        .and_then(f64x3)
        .ok_or_else(|| bad("output.spacing_xyz"))?;
    let params = a.get("params").ok_or_else(|| bad("params"))?;
    let layout = a.get("layout").unwrap_or(params);
    let chunk_zyx = layout
        .get("chunk_zyx")
        .and_then(usize3)
        .ok_or_else(|| bad("layout.chunk_zyx"))?;
    let shard_zyx = layout.get("shard_zyx").and_then(usize3);
    let label = a.get("label").filter(|l| !l.is_null());
    let classes: BTreeMap<String, ClassStats> = label
        .and_then(|l| l.get("classes"))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let fg_rows = a
        .get("fg_index")
        .and_then(|f| f.get("rows_per_class"))
        .and_then(Value::as_object)
        .map(|m| {
            m.values()
                .filter_map(|r| r.get("count").and_then(Value::as_u64))
                .sum()
        })
        .unwrap_or(0);
    Ok(EntryMeta {
        dir: dir.to_path_buf(),
        rel,
        key,
        case_id,
        shape_zyx,
        spacing_xyz,
        unit: a
            .get("input")
            .and_then(|i| s(i, "unit"))
            .unwrap_or_else(|| "unknown".into()),
        image_dtype: s(params, "image_dtype").ok_or_else(|| bad("params.image_dtype"))?,
        label_dtype: label.and_then(|l| s(l, "dtype")),
        chunk_zyx,
        shard_zyx,
        codec: params
            .get("compression")
            .map(codec_name)
            .unwrap_or_else(|| "?".into()),
        classes,
        fg_rows,
        checksums: s(a, "chunk_checksums"),
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

/// Bytes per element of a Zarr data type name.
pub fn dtype_bytes(name: &str) -> Option<usize> {
    Some(match name {
        "uint8" | "int8" => 1,
        "float16" | "uint16" | "int16" => 2,
        "float32" | "uint32" | "int32" => 4,
        "float64" | "uint64" | "int64" => 8,
        _ => return None,
    })
}

/// Every folder under entries/ab/, sorted; anything else there is a problem.
pub fn entry_dirs(root: &Path) -> (Vec<PathBuf>, Vec<Problem>) {
    let mut dirs = Vec::new();
    let mut problems = Vec::new();
    let entries = root.join("entries");
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
                    Problem::warning("stray-file", format!("not an entry of entries/{prefix}/"))
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
    let manifest = Manifest::load(&cache).unwrap_or_default();
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
