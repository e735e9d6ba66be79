//! Finding image/label pairs and naming cases.
//!
//! Two ways in: a folder in the Medical Segmentation Decathlon / nnU-Net layout
//! (`imagesTr/CASE_0000.nii.gz` or `imagesTr/CASE.nii.gz`, `labelsTr/CASE.nii.gz`), or explicit
//! `--images` / `--labels` globs whose single `*` names the case.

pub mod origin;
pub mod scan;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::dataset_json::DatasetDescription;

/// One case: its image (one file per channel) and, optionally, its label.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CaseSource {
    /// Case id: the file name without extension (and `_0000`), or the glob's `*` part.
    pub id: String,
    /// The image files, one per channel in channel order (`CASE_0000`, `CASE_0001`...); never
    /// empty.
    pub images: Vec<PathBuf>,
    /// The label file; `None` for an unlabelled case.
    pub label: Option<PathBuf>,
    /// The Decathlon's multi-modal layout: one 4-D file holds every channel as a volume of its
    /// 4th dimension (`images` then names that file once per channel).
    pub packed: bool,
}

impl CaseSource {
    /// A case of one channel.
    pub fn single(id: impl Into<String>, image: PathBuf, label: Option<PathBuf>) -> Self {
        CaseSource {
            id: id.into(),
            images: vec![image],
            label,
            packed: false,
        }
    }

    /// The first channel's file: the one whose header gives the case's grid.
    pub fn image(&self) -> &Path {
        &self.images[0]
    }

    /// Channel `k`: its file, and the volume of it that holds the channel when the case is
    /// packed into one 4-D file.
    pub fn channel(&self, k: usize) -> (&Path, Option<usize>) {
        (&self.images[k], self.packed.then_some(k))
    }
}

/// Where a dataset comes from.
#[derive(Clone, Debug)]
pub enum DatasetSource {
    /// A folder with imagesTr/ (and labelsTr/), or a folder of .nii(.gz) images alone.
    Folder(PathBuf),
    /// Glob patterns; the part matched by the single `*` in the file name is the case id.
    Globs {
        /// Glob of the image files, e.g. `data/*_img.nii.gz`.
        images: String,
        /// Glob of the label files; a label pairs with the image of the same case id.
        labels: Option<String>,
    },
    /// Cases already found (predict's inputs), taken as they are.
    Cases(Vec<CaseSource>),
}

const EXTENSIONS: [&str; 2] = [".nii.gz", ".nii"];

/// The file name without its NIfTI extension, if it has one.
pub fn strip_nifti_ext(name: &str) -> Option<&str> {
    EXTENSIONS.iter().find_map(|e| name.strip_suffix(e))
}

/// A case that cannot be built as found, and why (the other cases go on).
#[derive(Debug)]
pub struct CaseProblem {
    /// The case id (for a file name that is not UTF-8, its lossy form).
    pub id: String,
    /// What is wrong, naming the files.
    pub error: Error,
}

/// What discovery found: the cases to build and the per-case problems.
#[derive(Debug, Default)]
pub struct Discovered {
    /// Cases with an image (and a label when there is one), sorted by id.
    pub cases: Vec<CaseSource>,
    /// Cases that cannot be built as found (two images, a label without an image, a name
    /// that is not UTF-8...): reported, never stopping the others.
    pub problems: Vec<CaseProblem>,
    /// The folder's `dataset.json`, when it has one.
    pub description: Option<DatasetDescription>,
}

/// The NIfTI files in `dir` (only those ending in `ending` when a dataset.json names one),
/// sorted; names that are not UTF-8 become problems.
fn list_nifti(
    dir: &Path,
    ending: Option<&str>,
    problems: &mut Vec<CaseProblem>,
) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            let lossy = name.to_string_lossy().to_string();
            if strip_nifti_ext(&lossy).is_some() {
                problems.push(CaseProblem {
                    id: lossy,
                    error: Error::nifti(
                        entry.path(),
                        "the file name is not valid UTF-8, so it cannot name a case; rename it",
                    ),
                });
            }
            continue;
        };
        if name.starts_with('.') || strip_nifti_ext(name).is_none() {
            continue;
        }
        if ending.is_some_and(|e| !name.ends_with(e)) {
            continue;
        }
        out.push(entry.path());
    }
    out.sort();
    Ok(out)
}

fn file_name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// Find the cases of a dataset, sorted by id. Only job-level faults (no such folder, no image
/// at all, a bad glob) are errors; a problem with one case is reported in
/// [`Discovered::problems`] and that case is left out.
pub fn discover(source: &DatasetSource) -> Result<Discovered> {
    let mut found = match source {
        DatasetSource::Folder(dir) => discover_folder(dir)?,
        DatasetSource::Globs { images, labels } => discover_globs(images, labels.as_deref())?,
        DatasetSource::Cases(cases) => {
            let mut cases = cases.clone();
            cases.sort_by(|a, b| a.id.cmp(&b.id));
            Discovered {
                cases,
                ..Discovered::default()
            }
        }
    };
    let bad: std::collections::BTreeSet<String> =
        found.problems.iter().map(|p| p.id.clone()).collect();
    found.cases.retain(|c| !bad.contains(&c.id));
    found.problems.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

/// The channel number of a stem ending in `_NNNN` (nnU-Net's naming), and the case id before it.
fn channel_suffix(stem: &str) -> Option<(&str, usize)> {
    let (id, ch) = stem.rsplit_once('_')?;
    (ch.len() == 4 && ch.bytes().all(|b| b.is_ascii_digit()) && !id.is_empty())
        .then(|| (id, ch.parse().unwrap_or(0)))
}

/// Group image files into cases of channels. nnU-Net names channel `k` of case `ID`
/// `ID_000k`; a file without that suffix is a case of one channel. Without a dataset.json
/// (`declared` 0), a stem ending in `_NNNN` is a channel only when its case has a `_0000`
/// file (so `scan_0001.nii.gz` alone is the case `scan_0001`), and the channel count is the
/// one most cases have. With one, every case must have exactly its `declared` channels. A
/// case with a missing or surplus channel is a problem naming the files; returns the cases
/// (id -> channel files) and the ids of cases left out that way.
fn group_channels(
    files: Vec<PathBuf>,
    declared: usize,
    problems: &mut Vec<CaseProblem>,
) -> (Grouped, std::collections::BTreeSet<String>) {
    group_channels_as(
        files,
        declared,
        declared > 0,
        "dataset.json declares",
        problems,
    )
}

/// [`group_channels`] with the rule spelt out: `strict` reads every `_NNNN` suffix as a
/// channel (else only in cases with a `_0000` file); `why` says where `declared` comes from.
fn group_channels_as(
    files: Vec<PathBuf>,
    declared: usize,
    strict: bool,
    why: &str,
    problems: &mut Vec<CaseProblem>,
) -> (Grouped, std::collections::BTreeSet<String>) {
    // id -> channel -> files (several files on one channel are a problem)
    let mut groups: BTreeMap<String, BTreeMap<usize, Vec<PathBuf>>> = BTreeMap::new();
    let stems: Vec<(String, PathBuf)> = files
        .into_iter()
        .map(|p| {
            (
                strip_nifti_ext(file_name(&p))
                    .unwrap_or_default()
                    .to_string(),
                p,
            )
        })
        .collect();
    let has_first: std::collections::BTreeSet<&str> = stems
        .iter()
        .filter_map(|(s, _)| channel_suffix(s).filter(|c| c.1 == 0).map(|c| c.0))
        .collect();
    for (stem, path) in &stems {
        let (id, ch) = match channel_suffix(stem) {
            Some((id, ch)) if strict || has_first.contains(id) => (id.to_string(), ch),
            _ => (stem.clone(), 0),
        };
        groups
            .entry(id)
            .or_default()
            .entry(ch)
            .or_default()
            .push(path.clone());
    }
    let count = |g: &BTreeMap<usize, Vec<PathBuf>>| g.keys().max().map_or(0, |m| m + 1);
    let expected = if declared > 0 {
        declared
    } else {
        let mut votes: BTreeMap<usize, usize> = BTreeMap::new();
        for g in groups.values() {
            *votes.entry(count(g)).or_default() += 1;
        }
        // The count most cases have; on a tie, the smaller.
        votes
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map_or(1, |(&n, _)| n)
    };
    let why_expected = if declared > 0 { why } else { "most cases have" };
    let mut cases = BTreeMap::new();
    let mut left_out = std::collections::BTreeSet::new();
    let mut packed = std::collections::BTreeSet::new();
    for (id, g) in groups {
        let mut problem = |msg: String, path: Option<&Path>| {
            let error = match path {
                Some(p) => Error::nifti(p, msg),
                None => Error::case(&id, msg),
            };
            problems.push(CaseProblem {
                id: id.clone(),
                error,
            });
        };
        if let Some((_, files)) = g.iter().find(|(_, f)| f.len() > 1) {
            problem(
                format!(
                    "two images: {} and {} (keep one)",
                    files[0].display(),
                    files[1].display()
                ),
                None,
            );
            left_out.insert(id);
            continue;
        }
        let any = &g.values().next().expect("a group has a file")[0];
        let dir = any.parent().unwrap_or(Path::new(""));
        let ext = EXTENSIONS
            .iter()
            .find(|e| file_name(any).ends_with(*e))
            .copied()
            .unwrap_or(".nii.gz");
        if let Some((&ch, files)) = g.range(expected..).next() {
            let range = match expected {
                1 => channel_file(&id, 0, ext),
                n => format!(
                    "{} to {}",
                    channel_file(&id, 0, ext),
                    channel_file(&id, n - 1, ext)
                ),
            };
            problem(
                format!(
                    "channel {ch} of case {id}, but {why_expected} {expected} channel{} ({range})",
                    if expected == 1 { "" } else { "s" },
                ),
                Some(&files[0]),
            );
            left_out.insert(id);
            continue;
        }
        // The Decathlon keeps a case's channels in one 4-D file named after the case.
        if g.len() == 1 && declared > 1 {
            let only = &g[&0][0];
            let bare = strip_nifti_ext(file_name(only)) == Some(id.as_str());
            if bare {
                match crate::nifti_io::read_header_frames(only) {
                    Ok(h) if h.frames == expected => {
                        packed.insert(id.clone());
                        cases.insert(id, vec![only.clone(); expected]);
                        continue;
                    }
                    Ok(h) if h.frames > 1 => {
                        problem(
                            format!(
                                "a 4D image of {} volumes, but {why_expected} {expected} channels",
                                h.frames
                            ),
                            Some(only),
                        );
                        left_out.insert(id);
                        continue;
                    }
                    _ => {}
                }
            }
        }
        if g.len() < expected {
            let missing: Vec<String> = (0..expected)
                .filter(|c| !g.contains_key(c))
                .map(|c| dir.join(channel_file(&id, c, ext)).display().to_string())
                .collect();
            problem(
                format!(
                    "channel file{} missing: {} ({why_expected} {expected} channels)",
                    if missing.len() == 1 { "" } else { "s" },
                    missing.join(", ")
                ),
                None,
            );
            left_out.insert(id);
            continue;
        }
        cases.insert(id, g.into_values().map(|mut f| f.remove(0)).collect());
    }
    (Grouped { cases, packed }, left_out)
}

/// Image files grouped into cases.
struct Grouped {
    /// Case id -> its channel files.
    cases: BTreeMap<String, Vec<PathBuf>>,
    /// Cases whose channels are the volumes of one 4-D file (the Decathlon's layout).
    packed: std::collections::BTreeSet<String>,
}

/// nnU-Net's file name of channel `ch` of case `id`.
fn channel_file(id: &str, ch: usize, ext: &str) -> String {
    format!("{id}_{ch:04}{ext}")
}

fn discover_folder(dir: &Path) -> Result<Discovered> {
    if !dir.is_dir() {
        return Err(Error::Dataset(format!("{}: not a folder", dir.display())));
    }
    let mut problems = Vec::new();
    let json = dir.join("dataset.json");
    // Anything named dataset.json (a folder, a FIFO, a dangling or looping link) is read, so
    // that one that cannot be read as one is an error naming it, never silently ignored.
    let description = if json.symlink_metadata().is_ok() {
        Some(DatasetDescription::read(&json)?)
    } else {
        None
    };
    let ending = description.as_ref().and_then(|d| d.file_ending.clone());
    if let Some(e) = &ending {
        if !EXTENSIONS.contains(&e.as_str()) {
            return Err(Error::Dataset(format!(
                "{}: file_ending {e:?}: voxcache reads NIfTI files (.nii, .nii.gz) only",
                json.display()
            )));
        }
    }
    let ending = ending.as_deref();
    let images_dir = dir.join("imagesTr");
    let (image_files, labels_dir) = if images_dir.is_dir() {
        (
            list_nifti(&images_dir, ending, &mut problems)?,
            Some(dir.join("labelsTr")),
        )
    } else {
        (list_nifti(dir, ending, &mut problems)?, None)
    };
    if image_files.is_empty() && problems.is_empty() {
        return Err(Error::Dataset(format!(
            "{}: no NIfTI images found (expected imagesTr/CASE_0000.nii.gz and labelsTr/CASE.nii.gz, as in nnU-Net, or --images/--labels globs)",
            dir.display()
        )));
    }
    let declared = description.as_ref().map_or(0, |d| d.channels.len());
    let (grouped, multi) = group_channels(image_files, declared, &mut problems);
    let (by_id, packed) = (grouped.cases, grouped.packed);
    let mut labels: BTreeMap<String, PathBuf> = BTreeMap::new();
    if let Some(ld) = labels_dir.filter(|d| d.is_dir()) {
        for path in list_nifti(&ld, ending, &mut problems)? {
            let id = strip_nifti_ext(file_name(&path))
                .unwrap_or_default()
                .to_string();
            if multi.contains(&id) {
                continue;
            }
            if !by_id.contains_key(&id) {
                problems.push(CaseProblem {
                    error: Error::nifti(
                        &path,
                        format!("label without an image (no imagesTr/{id}_0000.nii.gz)"),
                    ),
                    id,
                });
                continue;
            }
            if let Some(prev) = labels.get(&id) {
                problems.push(CaseProblem {
                    error: Error::case(
                        &id,
                        format!(
                            "two labels: {} and {} (keep one)",
                            prev.display(),
                            path.display()
                        ),
                    ),
                    id,
                });
                continue;
            }
            labels.insert(id, path);
        }
    }
    let cases = by_id
        .into_iter()
        .map(|(id, images)| {
            let label = labels.remove(&id);
            let packed = packed.contains(&id);
            CaseSource {
                id,
                images,
                label,
                packed,
            }
        })
        .collect();
    Ok(Discovered {
        cases,
        problems,
        description,
    })
}

/// Case id of `name` under a file-name pattern with one `*`.
fn id_from_pattern(pattern_name: &str, name: &str) -> Option<String> {
    let (prefix, suffix) = pattern_name.split_once('*')?;
    let id = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    let id = strip_nifti_ext(id).unwrap_or(id);
    Some(id.to_string())
}

fn glob_files(pattern: &str) -> Result<BTreeMap<String, PathBuf>> {
    let pattern_name = Path::new(pattern)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if pattern_name.matches('*').count() != 1 || pattern.contains("**") {
        return Err(Error::Config(format!(
            "glob {pattern:?}: the file name must hold exactly one '*', which names the case (e.g. data/*_img.nii.gz)"
        )));
    }
    let paths = glob::glob(pattern).map_err(|e| Error::Config(format!("glob {pattern:?}: {e}")))?;
    let mut out = BTreeMap::new();
    for p in paths {
        let p = p.map_err(|e| Error::io(e.path(), std::io::Error::other(e.to_string())))?;
        let name = file_name(&p);
        if strip_nifti_ext(name).is_none() {
            continue;
        }
        if let Some(id) = id_from_pattern(pattern_name, name) {
            if let Some(prev) = out.insert(id.clone(), p.clone()) {
                return Err(Error::Dataset(format!(
                    "case {id} matches twice: {} and {}",
                    prev.display(),
                    p.display()
                )));
            }
        }
    }
    Ok(out)
}

fn discover_globs(images: &str, labels: Option<&str>) -> Result<Discovered> {
    let image_files = glob_files(images)?;
    if image_files.is_empty() {
        return Err(Error::Dataset(format!(
            "--images {images:?} matches no .nii/.nii.gz file"
        )));
    }
    let mut label_files = match labels {
        Some(l) => glob_files(l)?,
        None => BTreeMap::new(),
    };
    if let Some((id, p)) = label_files
        .iter()
        .find(|(id, _)| !image_files.contains_key(*id))
    {
        return Err(Error::Dataset(format!(
            "{}: label of case {id} has no image",
            p.display()
        )));
    }
    let cases = image_files
        .into_iter()
        .map(|(id, image)| {
            let label = label_files.remove(&id);
            CaseSource::single(id, image, label)
        })
        .collect();
    Ok(Discovered {
        cases,
        problems: Vec::new(),
        description: None,
    })
}

/// Cases from image files given one by one (predict's inputs): grouped into channels as in a
/// folder, `channels` per case (nnU-Net's `CASE_0000`... naming; a file without the suffix is a
/// case of one channel, or the Decathlon's 4-D file of them all). Unlabelled.
pub fn cases_from_files(files: Vec<PathBuf>, channels: usize) -> Discovered {
    let mut problems = Vec::new();
    let strict = channels > 1;
    let (grouped, _) = group_channels_as(files, channels, strict, "the model takes", &mut problems);
    let cases = grouped
        .cases
        .into_iter()
        .map(|(id, images)| CaseSource {
            packed: grouped.packed.contains(&id),
            id,
            images,
            label: None,
        })
        .collect();
    Discovered {
        cases,
        problems,
        description: None,
    }
}

/// The NIfTI files of a folder (hidden files and other names skipped), sorted, with the files
/// whose names cannot name a case.
pub fn nifti_files(dir: &Path) -> Result<(Vec<PathBuf>, Vec<CaseProblem>)> {
    let mut problems = Vec::new();
    let files = list_nifti(dir, None, &mut problems)?;
    Ok((files, problems))
}

/// The NIfTI image files of a folder given to predict: its `imagesTs/` or `imagesTr/` when it
/// has one (nnU-Net's layout), else the folder itself.
pub fn image_files(dir: &Path) -> Result<(Vec<PathBuf>, Vec<CaseProblem>)> {
    let mut problems = Vec::new();
    let sub = ["imagesTs", "imagesTr"]
        .iter()
        .map(|s| dir.join(s))
        .find(|d| d.is_dir());
    let files = list_nifti(sub.as_deref().unwrap_or(dir), None, &mut problems)?;
    Ok((files, problems))
}

/// The names of `n` image channels: dataset.json's when it names that many, else
/// "channel 0", "channel 1"...
pub fn channel_names(description: Option<&DatasetDescription>, n: usize) -> Vec<String> {
    match description {
        Some(d) if d.channels.len() == n => d.channels.clone(),
        _ => (0..n).map(|c| format!("channel {c}")).collect(),
    }
}

/// The number of image channels of a set of cases: the same for all, else an error naming a
/// case that differs (discovery leaves such cases out, so this is a safeguard).
pub fn common_channels<'a>(cases: impl IntoIterator<Item = &'a CaseSource>) -> Result<usize> {
    let mut n = None;
    for c in cases {
        match n {
            None => n = Some((c.images.len(), c.id.as_str())),
            Some((m, first)) if m != c.images.len() => {
                return Err(Error::Dataset(format!(
                    "case {} has {} image channels but case {first} has {m}: every case needs the same channels",
                    c.id,
                    c.images.len()
                )))
            }
            Some(_) => {}
        }
    }
    Ok(n.map_or(1, |n| n.0))
}

/// A short name for a dataset folder (its last path component).
pub fn default_name(source: &DatasetSource) -> String {
    let p = match source {
        DatasetSource::Folder(d) => d.clone(),
        DatasetSource::Globs { images, .. } => Path::new(images)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        DatasetSource::Cases(cases) => cases
            .first()
            .and_then(|c| c.image().parent())
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    let canonical = std::fs::canonicalize(&p).unwrap_or(p);
    canonical
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("dataset")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_ids() {
        assert_eq!(
            id_from_pattern("*_img.nii.gz", "a1_img.nii.gz").as_deref(),
            Some("a1")
        );
        assert_eq!(id_from_pattern("img_*", "img_7.nii").as_deref(), Some("7"));
        assert_eq!(id_from_pattern("*_img.nii.gz", "a1_seg.nii.gz"), None);
    }
}
