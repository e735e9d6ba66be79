//! `prep inspect`: a dataset's fingerprint and cost forecast before anything is built, and the
//! truth about a cache after. Inspect only reads: it never writes into the folder it inspects.
//!
//! `inspect(PATH)` looks at PATH and decides what it is: a *dataset* (a folder with `imagesTr/`,
//! or with `.nii`/`.nii.gz` files) or a *cache* (a folder with `manifest.json` or `entries/`).
//! Anything else is an error ("not a dataset or voxcache cache: ...").
//!
//! Modules (one job each): [`table`] renders aligned text tables; [`dataset_report`] reads
//! headers and plans; `dataset_voxels` streams each case's voxels for its intensity and label
//! statistics; `dataset_render` draws that report as text; [`cache_report`] lists a cache's
//! datasets, entries, orphans and leftovers; [`entry_meta`] parses one entry's metadata;
//! [`verify`] re-hashes every write block; [`preview`] draws the three middle slices with the
//! label overlay into a PNG.
//!
//! # JSON shape (`prep inspect --json`)
//!
//! One document; every key below is always present (`null` where it does not apply). Paths are
//! relative to PATH, with `/` separators. Shapes and spacings say their axis order in their
//! name: `_xyz` is NIfTI (i, j, k) order, `_zyx` is the cache's array order.
//!
//! ```text
//! {
//!   "kind": "dataset" | "cache",
//!   "voxcache_version": "0.1.0",
//!   "path": "PATH as given",
//!   "dataset": null | {                       // kind == "dataset"
//!     "pipeline": "default", "image_dtype": "float32" | "float16",
//!     "voxels_read": true,                    // false with --headers-only
//!     "n_cases": 10, "n_labelled": 10,
//!     "cases": [{
//!       "id": "case_001", "image": "imagesTr/case_001_0000.nii.gz", "label": "labelsTr/case_001.nii.gz" | null,
//!       "header": null | {"shape_xyz": [x,y,z], "spacing_xyz": [x,y,z], "unit": "mm"|"um"|"m"|"unknown",
//!                         "datatype": "int16", "orientation": "RAS", "qform_code": 0, "sform_code": 1,
//!                         "affine_source": "sform"|"qform"|"pixdim"},
//!       "label_datatype": null | "uint8",
//!       "intensity": null | {"min", "max", "mean": f | null, "non_finite": n},  // finite voxels
//!       "label_values": null | {"0": voxels, "1": voxels, ...},
//!       "forecast": null | {"out_shape_xyz": [..], "out_spacing_xyz": [..], "out_voxels": n,
//!                           "out_bytes": n, "whole_volume_f32_bytes": n, "whole_volume_f64_bytes": n,
//!                           "size_factor": f, "outlier": bool}
//!     }],
//!     "spacing": null | {
//!       "distinct": [{"spacing_xyz": [..], "count": n}],   // most common first
//!       "per_axis": {"x": {"min","p10","p50","p90","max"}, "y": {..}, "z": {..}},
//!       "units": ["mm"],
//!       "auto": null | {"target_xyz", "median_xyz", "rule", "reason"},  // what `auto` chooses
//!       "target": {"target_xyz", "median_xyz", "rule", "reason"}         // what the forecast uses
//!     },
//!     "forecast": null | {"target_xyz": [..], "image_dtype": "float32", "cases": n, "out_bytes": n,
//!                         "whole_volume_f32_bytes": n, "whole_volume_f64_bytes": n,
//!                         "outliers": ["case id", ...], "outlier_factor": 4.0}
//!   },
//!   "cache": null | {                         // kind == "cache"
//!     "manifest_format_version": 1 | null,
//!     "datasets": [{"name", "pipeline", "params_key", "target_spacing_xyz", "spacing_rule",
//!                   "spacing_reason", "channels": [names], "normalization": [one per channel], "image_dtype", "chunk_zyx", "shard_zyx" | null,
//!                   "compression": "none" | "zstd-3" | "blosc-5", "cases": n, "missing_entries": [ids]}],
//!     "entries": [{"key", "path": "entries/ab/abcd...", "case_id", "datasets": [names], "orphan": bool,
//!                  "shape_zyx", "spacing_xyz", "unit", "image_dtype", "label_dtype" | null,
//!                  "chunk_zyx", "shard_zyx" | null, "codec", "bytes_on_disk", "decoded_bytes",
//!                  "compression_ratio",                       // decoded bytes / bytes on disk
//!                  "label_classes": {"1": {"voxels", "bbox_min_zyx", "bbox_max_zyx"}}}],
//!     "tmp": [{"name", "path", "bytes", "host" | null, "pid" | null, "owner_alive" | null}],
//!     "totals": {"entries", "orphans", "bytes_on_disk", "decoded_bytes", "tmp_bytes"},
//!     "verify": null | {"entries", "blocks_checked", "blocks_ok", "blocks_absent", "corrupt",
//!                       "missing", "other"}                      // with --verify
//!   },
//!   "problems": [{"severity": "error" | "warning", "kind": "...", "case": id | null,
//!                 "path": "relative path" | null, "array": "image" | "label" | null,
//!                 "block": "z.y.x" | null, "message": "..."}],
//!   "errors": n, "warnings": n
//! }
//! ```
//!
//! Problem kinds. Errors: `unreadable` (a file whose header or voxels cannot be read),
//! `mismatch` (image and label on different grids), `non-finite` (NaN/inf image voxels),
//! `bad-label` (label values that are not whole numbers 0..65535), `no-cases`, `too-large` (a
//! forecast output over the size limits), `manifest` (unreadable or missing manifest.json),
//! `metadata` (an entry's zarr.json or its checksums missing,
//! truncated, unparsable or inconsistent), `incomplete-entry` (no zarr.json), `missing-entry` (the
//! manifest names an entry that is not there), `corrupt-chunk` (does not decode, or hashes
//! differently from the build), `missing-chunk` (absent, but its block was not all fill value),
//! `unrecorded-chunk`. Warnings: `missing-label`, `empty-label` (no foreground), `mixed-units`,
//! `geometry` (an unusable sform passed over for the qform),
//! `orphan` (an entry no manifest dataset refers to), `tmp-leftover`, `stray-file`.
//!
//! `prep inspect` exits 0 when no problem is an error, 1 when one is, 2 when PATH cannot be
//! inspected at all.

mod cache_render;
pub mod cache_report;
mod dataset_render;
pub mod dataset_report;
mod dataset_voxels;
pub mod entry_meta;
pub mod nnunet;
pub mod preview;
pub mod table;
pub mod verify;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::prep::settings::Settings;

pub use cache_report::CacheReport;
pub use dataset_report::DatasetReport;
pub use preview::{write_preview, PreviewInfo};

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct InspectOptions {
    /// The dataset or cache folder to inspect.
    pub path: PathBuf,
    /// Pipeline and spacing for the forecast (datasets only): what `build-cache` would use with
    /// the same flags (`config::settings::resolve`).
    pub settings: Settings,
    /// Re-hash every block of every entry (caches only).
    pub verify: bool,
    /// Read voxels for intensity and label statistics (datasets only); headers alone otherwise.
    pub read_voxels: bool,
    /// Cases read at once (each holds about one volume in memory); 0 means 2.
    pub jobs: usize,
}

impl InspectOptions {
    /// Inspect `path` with the default settings, reading voxels, without verifying.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        InspectOptions {
            path: path.into(),
            settings: Settings::default(),
            verify: false,
            read_voxels: true,
            jobs: 0,
        }
    }
}

/// What PATH is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A folder of NIfTI images (and labels).
    Dataset,
    /// A voxcache cache folder.
    Cache,
}

/// Decide whether `path` is a dataset or a cache folder.
pub fn detect(path: &Path) -> Result<Kind> {
    let not_it = |why: &str| {
        Error::Dataset(format!(
            "not a dataset or voxcache cache: {} ({why})",
            path.display()
        ))
    };
    if !path.exists() {
        return Err(not_it("no such file or folder"));
    }
    if !path.is_dir() {
        return Err(not_it("a file, not a folder"));
    }
    if path.join(crate::format::MANIFEST_FILE).is_file()
        || path.join(crate::format::ENTRIES_DIR).is_dir()
    {
        return Ok(Kind::Cache);
    }
    if path.join("imagesTr").is_dir() {
        return Ok(Kind::Dataset);
    }
    let rd = std::fs::read_dir(path).map_err(|e| Error::io(path, e))?;
    let has_nifti = rd.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        !name.starts_with('.') && crate::prep::dataset::strip_nifti_ext(&name).is_some()
    });
    if has_nifti {
        return Ok(Kind::Dataset);
    }
    Err(not_it(&format!(
        "expected imagesTr/ or .nii(.gz) files for a dataset, {} or {}/ for a cache",
        crate::format::MANIFEST_FILE,
        crate::format::ENTRIES_DIR
    )))
}

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Something is wrong: the command exits with an error status.
    Error,
    /// Worth a look; nothing fails.
    Warning,
}

/// One thing wrong, named by the file it is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Error or warning.
    pub severity: Severity,
    /// A short machine-readable name of the problem, e.g. "too-large".
    pub kind: &'static str,
    /// The case it is about, if one.
    pub case: Option<String>,
    /// Relative to the inspected PATH.
    pub path: Option<String>,
    /// The array it is about (with `block`), if one.
    pub array: Option<String>,
    /// The block (chunk or shard) key, if one.
    pub block: Option<String>,
    /// What is wrong, for a person.
    pub message: String,
}

impl Problem {
    /// An error of `kind`.
    pub fn error(kind: &'static str, message: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Error,
            kind,
            case: None,
            path: None,
            array: None,
            block: None,
            message: message.into(),
        }
    }

    /// A warning of `kind`.
    pub fn warning(kind: &'static str, message: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Warning,
            ..Problem::error(kind, message)
        }
    }

    /// The same, about `case`.
    pub fn case(mut self, case: impl Into<String>) -> Self {
        self.case = Some(case.into());
        self
    }

    /// The same, about the file `path` (relative to the inspected folder).
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The same, about block `block` of array `array`.
    pub fn block(mut self, array: &str, block: impl Into<String>) -> Self {
        self.array = Some(array.to_string());
        self.block = Some(block.into());
        self
    }
}

/// Everything `prep inspect` found.
#[derive(Clone, Debug, Serialize)]
pub struct InspectReport {
    /// Dataset or cache.
    pub kind: Kind,
    /// The voxcache version that wrote the report.
    pub voxcache_version: &'static str,
    /// The inspected folder.
    pub path: String,
    /// The dataset fingerprint and forecast (datasets).
    pub dataset: Option<DatasetReport>,
    /// The cache's contents (caches).
    pub cache: Option<CacheReport>,
    /// Everything found wrong.
    pub problems: Vec<Problem>,
    /// Problems of severity error.
    pub errors: usize,
    /// Problems of severity warning.
    pub warnings: usize,
}

impl InspectReport {
    fn new(kind: Kind, path: &Path, mut problems: Vec<Problem>) -> Self {
        problems.sort_by(|a, b| {
            (a.severity, &a.case, &a.path, &a.array, &a.block, a.kind)
                .cmp(&(b.severity, &b.case, &b.path, &b.array, &b.block, b.kind))
        });
        problems.dedup();
        let errors = problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
            .count();
        InspectReport {
            kind,
            voxcache_version: env!("CARGO_PKG_VERSION"),
            path: path.display().to_string(),
            dataset: None,
            cache: None,
            warnings: problems.len() - errors,
            errors,
            problems,
        }
    }

    /// The human report: aligned tables no wider than 100 columns.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if let Some(d) = &self.dataset {
            out.push_str(&dataset_report::render(d, &self.path));
        }
        if let Some(c) = &self.cache {
            out.push_str(&cache_report::render(c, &self.path));
        }
        out.push_str(&render_problems(&self.problems));
        out
    }
}

/// Inspect a dataset or a cache folder.
pub fn inspect(opts: &InspectOptions) -> Result<InspectReport> {
    let kind = detect(&opts.path)?;
    Ok(match kind {
        Kind::Dataset => {
            let (d, problems) = dataset_report::build(opts)?;
            let mut r = InspectReport::new(kind, &opts.path, problems);
            r.dataset = Some(d);
            r
        }
        Kind::Cache => {
            let (c, problems) = cache_report::build(&opts.path, opts.verify)?;
            let mut r = InspectReport::new(kind, &opts.path, problems);
            r.cache = Some(c);
            r
        }
    })
}

fn render_problems(problems: &[Problem]) -> String {
    if problems.is_empty() {
        return "\nproblems: none\n".into();
    }
    // One problem per paragraph: what kind and where, the file on its own line (never cut),
    // then the message wrapped under it.
    let mut out = format!("\nproblems ({})\n", problems.len());
    for p in problems {
        let severity = match p.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        out.push_str(&format!("{severity:<7}  {}", p.kind));
        if let Some(c) = &p.case {
            out.push_str(&format!("  case {c}"));
        }
        if let (Some(a), Some(b)) = (&p.array, &p.block) {
            out.push_str(&format!("  {a} block {b}"));
        }
        out.push('\n');
        if let Some(path) = &p.path {
            out.push_str(&format!("         {path}\n"));
        }
        out.push_str("         ");
        out.push_str(&table::wrap(&p.message, 100, 9, 9));
    }
    out
}

/// `p` relative to `root`, with `/` separators (or `p` itself when it is not under `root`).
pub(crate) fn rel_path(root: &Path, p: &Path) -> String {
    let r = p.strip_prefix(root).unwrap_or(p);
    r.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Replace `root/` where it starts a path in a message, so messages name files relative to PATH.
pub(crate) fn rel_message(root: &Path, msg: &str) -> String {
    let prefix = format!("{}/", root.display().to_string().trim_end_matches('/'));
    if prefix == "/" {
        return msg.to_string();
    }
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(i) = rest.find(&prefix) {
        let prev = rest[..i].chars().last().or_else(|| out.chars().last());
        let starts_path = prev.is_none_or(|c| c.is_whitespace() || "(\"'[:,".contains(c));
        out.push_str(&rest[..i]);
        if !starts_path {
            out.push_str(&prefix);
        }
        rest = &rest[i + prefix.len()..];
    }
    out.push_str(rest);
    out
}

/// An error's message about `file`, without the leading "file: " (the problem names the file).
pub(crate) fn file_message(root: &Path, file: &Path, msg: &str) -> String {
    let m = rel_message(root, msg);
    let prefix = format!("{}: ", rel_path(root, file));
    m.strip_prefix(&prefix).map(str::to_string).unwrap_or(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_files_relative_to_the_root() {
        let root = Path::new("/tmp/ds");
        assert_eq!(
            rel_message(root, "/tmp/ds/imagesTr/a.nii.gz: bad"),
            "imagesTr/a.nii.gz: bad"
        );
        assert_eq!(
            rel_message(root, "image /tmp/ds/a.nii and label /tmp/ds/b.nii"),
            "image a.nii and label b.nii"
        );
        assert_eq!(rel_message(root, "x/tmp/ds/a"), "x/tmp/ds/a");
        assert_eq!(
            rel_path(root, Path::new("/tmp/ds/labelsTr/b.nii")),
            "labelsTr/b.nii"
        );
    }
}
