//! Finding image/label pairs and naming cases.
//!
//! Two ways in: a folder in the Medical Segmentation Decathlon / nnU-Net layout
//! (`imagesTr/CASE_0000.nii.gz` or `imagesTr/CASE.nii.gz`, `labelsTr/CASE.nii.gz`), or explicit
//! `--images` / `--labels` globs whose single `*` names the case.

pub mod scan;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::dataset_json::DatasetDescription;

/// One case: an image and, optionally, its label.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CaseSource {
    /// Case id: the file name without extension (and `_0000`), or the glob's `*` part.
    pub id: String,
    /// The image file.
    pub image: PathBuf,
    /// The label file; `None` for an unlabelled case.
    pub label: Option<PathBuf>,
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
    };
    let bad: std::collections::BTreeSet<String> =
        found.problems.iter().map(|p| p.id.clone()).collect();
    found.cases.retain(|c| !bad.contains(&c.id));
    found.problems.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

fn discover_folder(dir: &Path) -> Result<Discovered> {
    if !dir.is_dir() {
        return Err(Error::Dataset(format!("{}: not a folder", dir.display())));
    }
    let mut problems = Vec::new();
    let json = dir.join("dataset.json");
    let description = if json.is_file() {
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
    let mut by_id: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut multi = std::collections::BTreeSet::new();
    for path in image_files {
        let stem = strip_nifti_ext(file_name(&path))
            .unwrap_or_default()
            .to_string();
        // nnU-Net names channels CASE_0000, CASE_0001, ...; one channel is supported today.
        let (id, channel) = match stem.rsplit_once('_') {
            Some((id, ch)) if ch.len() == 4 && ch.bytes().all(|b| b.is_ascii_digit()) => {
                (id.to_string(), Some(ch.to_string()))
            }
            _ => (stem.clone(), None),
        };
        // A dataset.json of several channels: say so once per case, naming them.
        let channels = description.as_ref().map_or(&[][..], |d| &d.channels[..]);
        if channels.len() > 1 {
            if channel.as_deref() == Some("0000") || channel.is_none() {
                multi.insert(id.clone());
                problems.push(CaseProblem {
                    error: Error::case(
                        &id,
                        format!(
                            "dataset.json declares {} channels ({}): multi-channel images are not supported yet",
                            channels.len(),
                            channels.join(", ")
                        ),
                    ),
                    id,
                });
            }
            continue;
        }
        if let Some(ch) = channel.as_deref() {
            if ch != "0000" {
                problems.push(CaseProblem {
                    error: Error::nifti(
                        &path,
                        format!(
                            "channel {ch} of case {id}: multi-channel images are not supported yet"
                        ),
                    ),
                    id,
                });
                continue;
            }
        }
        if let Some(prev) = by_id.get(&id) {
            problems.push(CaseProblem {
                error: Error::case(
                    &id,
                    format!(
                        "two images: {} and {} (keep one)",
                        prev.display(),
                        path.display()
                    ),
                ),
                id,
            });
            continue;
        }
        by_id.insert(id, path);
    }
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
        .map(|(id, image)| {
            let label = labels.remove(&id);
            CaseSource { id, image, label }
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
            CaseSource { id, image, label }
        })
        .collect();
    Ok(Discovered {
        cases,
        problems: Vec::new(),
        description: None,
    })
}

/// A short name for a dataset folder (its last path component).
pub fn default_name(source: &DatasetSource) -> String {
    let p = match source {
        DatasetSource::Folder(d) => d.clone(),
        DatasetSource::Globs { images, .. } => Path::new(images)
            .parent()
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
