//! The cache report: datasets in the manifest, every entry with its layout and size, entries no
//! manifest refers to, and what interrupted builds left in tmp/.

use std::collections::BTreeMap;
use std::path::Path;

use rayon::prelude::*;
use serde::Serialize;

use super::entry_meta::{
    codec_name, entry_dir, entry_dirs, read_entry, short_key, EntryMeta, Found,
};
use super::verify::{verify_entry, VerifySummary};
use super::{rel_path, Problem};
use crate::cache::CacheDir;
use crate::error::Result;
use crate::format::entry::ClassStats;
use crate::format::{
    Dtype, ImageDtype, FG_ARRAY, IMAGE_ARRAY, LABEL_ARRAY, MANIFEST_FILE, TMP_DIR, ZARR_JSON,
};
use crate::util::sysinfo::{hostname, human_bytes, pid_alive};

/// One dataset of the cache's manifest.
#[derive(Clone, Debug, Serialize)]
pub struct DatasetInfo {
    /// Dataset name in the manifest.
    pub name: String,
    /// Pipeline it was built with.
    pub pipeline: String,
    /// Key of its output parameters.
    pub params_key: String,
    /// Target spacing (x, y, z).
    pub target_spacing_xyz: [f64; 3],
    /// The rule that chose the spacing: "explicit", "median" or "anisotropy rule".
    pub spacing_rule: String,
    /// Why the rule chose it.
    pub spacing_reason: String,
    /// Image channel names, in channel order.
    pub channels: Vec<String>,
    /// Each channel's intensity scheme ("zscore-nonzero", "ct"...), in channel order.
    pub normalization: Vec<String>,
    /// Element type of the cached images.
    pub image_dtype: ImageDtype,
    /// Configured chunk shape (z, y, x).
    pub chunk_zyx: [usize; 3],
    /// Configured shard shape (z, y, x), if sharded.
    pub shard_zyx: Option<[usize; 3]>,
    /// Chunk codec.
    pub compression: String,
    /// Cases in the dataset.
    pub cases: usize,
    /// Cases whose entry is not in entries/.
    pub missing_entries: Vec<String>,
    /// Label classes as "name value" from the dataset's dataset.json, if it had one.
    pub classes: Vec<String>,
    /// Its ignore label.
    pub ignore_label: Option<u16>,
}

/// One entry of entries/.
#[derive(Clone, Debug, Serialize)]
pub struct EntryInfo {
    /// Content key.
    pub key: String,
    /// Folder relative to the cache root.
    pub path: String,
    /// The case it holds.
    pub case_id: String,
    /// Datasets of the manifest that name it.
    pub datasets: Vec<String>,
    /// No dataset names it (a rebuild with other parameters left it).
    pub orphan: bool,
    /// Array shape (z, y, x).
    pub shape_zyx: [usize; 3],
    /// True output spacing (x, y, z).
    pub spacing_xyz: [f64; 3],
    /// Spatial unit.
    pub unit: String,
    /// Element type of the image.
    pub image_dtype: Dtype,
    /// Element type of the label, if any.
    pub label_dtype: Option<Dtype>,
    /// Chunk shape (z, y, x).
    pub chunk_zyx: [usize; 3],
    /// Shard shape (z, y, x), if sharded.
    pub shard_zyx: Option<[usize; 3]>,
    /// Chunk codec.
    pub codec: String,
    /// Bytes the entry takes on disk.
    pub bytes_on_disk: u64,
    /// Bytes of the image, label and fg arrays once decoded.
    pub decoded_bytes: u64,
    /// decoded_bytes / bytes_on_disk.
    pub compression_ratio: f64,
    /// Per-class voxel counts and bounding boxes.
    pub label_classes: BTreeMap<u16, ClassStats>,
}

/// One unfinished build in tmp/.
#[derive(Clone, Debug, Serialize)]
pub struct TmpInfo {
    /// Folder name under tmp/.
    pub name: String,
    /// Path relative to the cache root.
    pub path: String,
    /// Bytes it holds.
    pub bytes: u64,
    /// Host of the builder that made it (from its name).
    pub host: Option<String>,
    /// Process id of that builder.
    pub pid: Option<u32>,
    /// Whether the builder that owns it still runs (known only on its own host).
    pub owner_alive: Option<bool>,
}

/// Sums over the cache.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CacheTotals {
    /// Entries in entries/.
    pub entries: usize,
    /// Entries no dataset names.
    pub orphans: usize,
    /// Bytes of all entries on disk.
    pub bytes_on_disk: u64,
    /// Bytes of their arrays once decoded.
    pub decoded_bytes: u64,
    /// Bytes left in tmp/.
    pub tmp_bytes: u64,
}

/// What `prep inspect CACHE` found.
#[derive(Clone, Debug, Serialize)]
pub struct CacheReport {
    /// format_version of manifest.json, if it has one.
    pub manifest_format_version: Option<u32>,
    /// Datasets of the manifest.
    pub datasets: Vec<DatasetInfo>,
    /// Every entry.
    pub entries: Vec<EntryInfo>,
    /// Unfinished builds in tmp/.
    pub tmp: Vec<TmpInfo>,
    /// Sums over the entries.
    pub totals: CacheTotals,
    /// The result of `--verify`, when asked.
    pub verify: Option<VerifySummary>,
}

pub use crate::cache::layout::dir_bytes;
// The text rendering lives in `cache_render`; its entry point keeps its path here.
pub use super::cache_render::render;

/// `tmp/<key>.<host>.<pid>.<n>`: who owns it.
fn tmp_owner(name: &str) -> (Option<String>, Option<u32>) {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() < 4 {
        return (None, None);
    }
    let pid = parts[parts.len() - 2].parse::<u32>().ok();
    let host = parts[1..parts.len() - 2].join(".");
    (pid.map(|_| host), pid)
}

fn tmp_leftovers(root: &Path, problems: &mut Vec<Problem>) -> Vec<TmpInfo> {
    let Ok(rd) = std::fs::read_dir(root.join(TMP_DIR)) else {
        return Vec::new();
    };
    let mut paths: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    paths.sort();
    let me = hostname();
    paths
        .into_iter()
        .map(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            let (host, pid) = tmp_owner(&name);
            let owner_alive = match (&host, pid) {
                (Some(h), Some(pid)) if *h == me => Some(pid_alive(pid)),
                _ => None,
            };
            let bytes = if p.is_dir() {
                dir_bytes(&p)
            } else {
                p.metadata().map(|m| m.len()).unwrap_or(0)
            };
            let why = match owner_alive {
                Some(true) => "a build in progress (its process is alive)",
                Some(false) => "left by an interrupted build (its process is gone); the next build-cache removes it",
                None => "left by a build on another host, or not voxcache's",
            };
            problems.push(
                Problem::warning("tmp-leftover", format!("{why}; {}", human_bytes(bytes)))
                    .path(rel_path(root, &p)),
            );
            TmpInfo {
                path: rel_path(root, &p),
                name,
                bytes,
                host,
                pid,
                owner_alive,
            }
        })
        .collect()
}

fn decoded_bytes(m: &EntryMeta) -> u64 {
    let voxels: u64 = m.shape_zyx.iter().map(|&v| v as u64).product();
    let image = m.image_dtype.size() as u64;
    let label = m.label_dtype.map_or(0, |d| d.size()) as u64;
    voxels * (image + label) + m.fg_rows * 16
}

/// Nothing inside an entry may be a symbolic link: a link can point outside the cache, and
/// readers would follow it.
fn check_no_links(root: &Path, m: &EntryMeta) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut stack = vec![m.dir.clone()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&p)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "?".into());
            out.push(
                Problem::error(
                    "metadata",
                    format!("a symbolic link (to {target}) inside a cache entry: the cache holds its own files"),
                )
                .case(&m.case_id)
                .path(rel_path(root, &p)),
            );
            continue;
        }
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    out
}

/// Check that the arrays' own zarr.json files parse (cheap; `--verify` opens them for real).
fn check_array_metadata(root: &Path, m: &EntryMeta) -> Vec<Problem> {
    let mut arrays = vec![IMAGE_ARRAY];
    if m.label_dtype.is_some() {
        arrays.push(LABEL_ARRAY);
    }
    if m.fg_rows > 0 {
        arrays.push(FG_ARRAY);
    }
    arrays
        .into_iter()
        .filter_map(|a| {
            super::entry_meta::check_array_json(root, &m.dir.join(a).join(ZARR_JSON))
                .err()
                .map(|p| (*p).case(&m.case_id))
        })
        .collect()
}

/// Which datasets name each entry key, and what each says the entry holds (dataset, case,
/// shape), from the manifest.
#[derive(Default)]
struct Claims {
    refs: BTreeMap<String, Vec<String>>,
    holds: BTreeMap<String, Vec<(String, String, [usize; 3])>>,
}

/// Inspect a cache folder (and re-hash every block with `verify`).
pub fn build(root: &Path, verify: bool) -> Result<(CacheReport, Vec<Problem>)> {
    let cache = CacheDir::new(root);
    let mut problems = Vec::new();
    let manifest = match crate::cache::manifest::load_or_empty(&cache) {
        Ok(m) => Some(m),
        Err(e) => {
            problems.push(
                Problem::error(
                    "manifest",
                    super::file_message(root, &cache.manifest_path(), &e.to_string()),
                )
                .path(MANIFEST_FILE),
            );
            None
        }
    };
    let have_manifest = cache.manifest_path().is_file() && manifest.is_some();

    let (dirs, stray) = entry_dirs(root);
    problems.extend(stray);
    if !cache.manifest_path().exists() && !dirs.is_empty() {
        problems.push(
            Problem::error(
                "manifest",
                format!("no {MANIFEST_FILE}, yet entries are here: no build finished writing it, or it was deleted; nothing says which entries make up a dataset (build-cache again writes it)"),
            )
            .path(MANIFEST_FILE),
        );
    }
    let parsed: Vec<Found<EntryMeta>> = dirs.par_iter().map(|d| read_entry(root, d)).collect();

    let mut claims = Claims::default();
    let datasets: Vec<DatasetInfo> = manifest
        .iter()
        .flat_map(|m| m.datasets.iter())
        .map(|(name, d)| dataset_info(root, name, d, &mut claims, &mut problems))
        .collect();

    let mut entries = Vec::new();
    let mut metas = Vec::new();
    for r in parsed {
        match r {
            Ok(m) => {
                entries.push(entry_info(root, &m, &claims, have_manifest, &mut problems));
                metas.push(m);
            }
            Err(p) => problems.push(*p),
        }
    }
    entries.sort_by(|a, b| (&a.case_id, &a.key).cmp(&(&b.case_id, &b.key)));
    let verify = verify.then(|| verify_all(root, &metas, &mut problems));

    let tmp = tmp_leftovers(root, &mut problems);
    let totals = CacheTotals {
        entries: entries.len(),
        orphans: entries.iter().filter(|e| e.orphan).count(),
        bytes_on_disk: entries.iter().map(|e| e.bytes_on_disk).sum(),
        decoded_bytes: entries.iter().map(|e| e.decoded_bytes).sum(),
        tmp_bytes: tmp.iter().map(|t| t.bytes).sum(),
    };
    Ok((
        CacheReport {
            manifest_format_version: manifest
                .as_ref()
                .filter(|_| have_manifest)
                .map(|m| m.format_version),
            datasets,
            entries,
            tmp,
            totals,
            verify,
        },
        problems,
    ))
}

/// One dataset of the manifest: its summary, its problems (parameters edited after the
/// build, an entry placed where its key does not put it, a missing entry), and its claims.
fn dataset_info(
    root: &Path,
    name: &str,
    d: &crate::format::ManifestDataset,
    claims: &mut Claims,
    problems: &mut Vec<Problem>,
) -> DatasetInfo {
    // The parameters hash to the key builds merged on: an edited parameter (derived arrays,
    // normalization statistics) no longer does.
    if crate::format::manifest::params_key(&d.params) != d.params_key {
        problems.push(
            Problem::error(
                "manifest",
                format!(
                    "dataset {name}: its params do not hash to its params_key {}: the manifest was edited after the build",
                    short_key(&d.params_key)
                ),
            )
            .path(MANIFEST_FILE),
        );
    }
    let mut missing = Vec::new();
    for (case, c) in &d.cases {
        claims
            .refs
            .entry(c.key.clone())
            .or_default()
            .push(name.to_string());
        claims.holds.entry(c.key.clone()).or_default().push((
            name.to_string(),
            case.clone(),
            c.out_shape_zyx,
        ));
        if c.entry != CacheDir::entry_rel_checked(&c.key).unwrap_or_default() {
            problems.push(
                Problem::error(
                    "manifest",
                    format!(
                        "dataset {name} places entry {} at {:?}, not where its key puts it",
                        short_key(&c.key),
                        c.entry
                    ),
                )
                .case(case)
                .path(MANIFEST_FILE),
            );
        }
        let there = entry_dir(root, &c.key).is_some_and(|p| p.join(ZARR_JSON).is_file());
        if !there {
            missing.push(case.clone());
            problems.push(
                Problem::error(
                    "missing-entry",
                    format!(
                        "dataset {name} names entry {} for this case, and it is not there",
                        short_key(&c.key)
                    ),
                )
                .case(case)
                .path(c.entry.clone()),
            );
        }
    }
    let p = &d.params;
    DatasetInfo {
        name: name.to_string(),
        pipeline: d.pipeline.clone(),
        params_key: d.params_key.clone(),
        target_spacing_xyz: p.target_spacing_xyz,
        spacing_rule: d.spacing_rule.clone(),
        spacing_reason: d.spacing_reason.clone(),
        channels: d.channels.clone(),
        normalization: p
            .channels
            .iter()
            .map(|c| c.normalization.name().to_string())
            .collect(),
        image_dtype: p.image_dtype,
        chunk_zyx: p.chunk_zyx,
        shard_zyx: p.shard_zyx,
        compression: codec_name(&p.compression),
        cases: d.cases.len(),
        classes: d
            .dataset_json
            .iter()
            .flat_map(|j| j.labels.iter())
            .map(|c| c.to_string())
            .collect(),
        ignore_label: d.dataset_json.as_ref().and_then(|j| j.ignore_label),
        missing_entries: missing,
    }
}

/// One entry folder: its summary and its problems (a folder named for another key, its
/// arrays' metadata, links, what the manifest says it holds, no dataset naming it while a
/// manifest exists: `orphan_possible`).
fn entry_info(
    root: &Path,
    m: &EntryMeta,
    claims: &Claims,
    orphan_possible: bool,
    problems: &mut Vec<Problem>,
) -> EntryInfo {
    let folder = m.dir.file_name().map(|n| n.to_string_lossy().to_string());
    if folder.as_deref() != Some(m.key.as_str()) {
        problems.push(
            Problem::error(
                "metadata",
                format!(
                    "the entry says its key is {}, but its folder is named otherwise",
                    short_key(&m.key)
                ),
            )
            .case(&m.case_id)
            .path(format!("{}/{ZARR_JSON}", m.rel)),
        );
    }
    problems.extend(check_array_metadata(root, m));
    problems.extend(check_no_links(root, m));
    for (name, case, shape) in folder
        .as_ref()
        .and_then(|f| claims.holds.get(f))
        .into_iter()
        .flatten()
    {
        if *case != m.case_id {
            problems.push(
                Problem::error(
                    "manifest",
                    format!(
                        "dataset {name} files case {case} under this entry, which holds case {}: entries swapped or edited",
                        m.case_id
                    ),
                )
                .case(case)
                .path(m.rel.clone()),
            );
        }
        if *shape != m.shape_zyx {
            problems.push(
                Problem::error(
                    "manifest",
                    format!(
                        "dataset {name} says the entry is {shape:?} voxels (z, y, x); it is {:?}",
                        m.shape_zyx
                    ),
                )
                .case(case)
                .path(MANIFEST_FILE),
            );
        }
    }
    let names = folder
        .as_ref()
        .and_then(|f| claims.refs.get(f))
        .cloned()
        .unwrap_or_default();
    let orphan = orphan_possible && names.is_empty();
    if orphan {
        problems.push(
            Problem::warning(
                "orphan",
                "no dataset in the manifest refers to this entry (a rebuild with other parameters replaced it); it is safe to delete",
            )
            .case(&m.case_id)
            .path(m.rel.clone()),
        );
    }
    let bytes_on_disk = dir_bytes(&m.dir);
    let decoded = decoded_bytes(m);
    EntryInfo {
        key: m.key.clone(),
        path: m.rel.clone(),
        case_id: m.case_id.clone(),
        datasets: names,
        orphan,
        shape_zyx: m.shape_zyx,
        spacing_xyz: m.spacing_xyz,
        unit: m.unit.clone(),
        image_dtype: m.image_dtype,
        label_dtype: m.label_dtype,
        chunk_zyx: m.chunk_zyx,
        shard_zyx: m.shard_zyx,
        codec: m.codec.clone(),
        bytes_on_disk,
        decoded_bytes: decoded,
        compression_ratio: if bytes_on_disk > 0 {
            decoded as f64 / bytes_on_disk as f64
        } else {
            0.0
        },
        label_classes: m.classes.clone(),
    }
}

/// Re-hash every block of every entry. One entry at a time: blocks are checked in parallel
/// within it, and a shard can be a gigabyte decoded.
fn verify_all(root: &Path, metas: &[EntryMeta], problems: &mut Vec<Problem>) -> VerifySummary {
    let mut total = VerifySummary {
        entries: metas.len(),
        ..VerifySummary::default()
    };
    for m in metas {
        let (s, p) = verify_entry(root, m);
        total.add(&s);
        problems.extend(p);
    }
    total
}
