//! The cascade's previous stage in a build (`--previous-stage DIR`): each case's segmentation
//! by the first stage (`3d_lowres`), as `predict` or a fold's validation wrote it in the case's
//! own geometry, becomes one more image channel per foreground label: 1 where it holds that
//! label, 0 elsewhere (the trainer's spatial augmentation interpolates it, and takes it back to
//! 0/1 at 0.5). On the cache's grid it is the argmax of the first stage's probabilities when
//! they lie beside the segmentation ([`super::previous_probabilities`]), else the segmentation
//! resampled as labels are. The segmentation must lie on the case's grid: one made for another
//! dataset fails its case, naming both files. A case with no segmentation fails alone, saying
//! where it was looked for and how to make it.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::dataset_json::DatasetDescription;
use crate::format::labels::FileLabels;
use crate::format::{Normalization, OutputParams};
use crate::prep::dataset::{CaseProblem, CaseSource};

/// The channel name of the previous stage's label `value`.
pub fn channel_name(value: u16) -> String {
    format!("previous stage: label {value}")
}

/// The foreground labels a previous stage's segmentation holds (dataset.json's label values
/// but background and the ignore label), in order: one channel each.
pub fn labels(description: Option<&DatasetDescription>, dir: &Path) -> Result<Vec<u16>> {
    let d = description.ok_or_else(|| {
        Error::Dataset(format!(
            "--previous-stage {}: the dataset has no dataset.json, so its labels (one channel each) are unknown: add one",
            dir.display()
        ))
    })?;
    Ok(FileLabels::of(d).foreground_values())
}

/// Where a case's previous-stage segmentation is: `DIR/CASE.nii.gz`, else the one of
/// `DIR/validation/CASE.nii.gz` (a run folder of one fold) and the folds'
/// `DIR/fold_K/validation/CASE.nii.gz` that holds it (a cross-validation's five folds each hold
/// their held-out cases).
fn find(dir: &Path, id: &str) -> Result<Option<PathBuf>> {
    let name = format!("{id}.nii.gz");
    let direct = dir.join(&name);
    if direct.is_file() {
        return Ok(Some(direct));
    }
    // A run folder of one fold holds its validation directly.
    let mut found: Vec<PathBuf> = Some(dir.join("validation").join(&name))
        .filter(|p| p.is_file())
        .into_iter()
        .collect();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let fold = e.file_name().to_string_lossy().starts_with("fold_");
            let p = e.path().join("validation").join(&name);
            if fold && p.is_file() {
                found.push(p);
            }
        }
    }
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(Error::case(
            id,
            format!(
                "two previous-stage segmentations: {} and {} (a case is held out by one fold only: remove the stale one)",
                found[0].display(),
                found[1].display()
            ),
        )),
    }
}

/// Add the previous stage's channels to every case: one copy of its segmentation per label of
/// `values`. Cases without one become problems.
pub fn attach(
    dir: &Path,
    cases: Vec<CaseSource>,
    values: &[u16],
) -> Result<(Vec<CaseSource>, Vec<CaseProblem>)> {
    if !dir.is_dir() {
        return Err(Error::Dataset(format!(
            "--previous-stage {}: no such folder (the first stage's predictions: a 3d_lowres run folder with fold_K/validation/, or a predict --out folder)",
            dir.display()
        )));
    }
    let (mut kept, mut problems) = (Vec::new(), Vec::new());
    for mut c in cases {
        match find(dir, &c.id) {
            Ok(Some(p)) => {
                if c.packed {
                    problems.push(CaseProblem {
                        id: c.id.clone(),
                        error: Error::case(&c.id, "a cascade needs one file per image channel, not a 4-D file of all channels"),
                    });
                    continue;
                }
                c.images.extend(values.iter().map(|_| p.clone()));
                kept.push(c);
            }
            Ok(None) => problems.push(CaseProblem {
                id: c.id.clone(),
                error: Error::case(
                    &c.id,
                    format!(
                        "no previous-stage segmentation {}.nii.gz in {} nor in its validation/ or fold_K/validation/ folders: train the 3d_lowres folds (their validation predicts every case), or predict it with the 3d_lowres model into that folder",
                        c.id,
                        dir.display()
                    ),
                ),
            }),
            Err(error) => problems.push(CaseProblem {
                id: c.id.clone(),
                error,
            }),
        }
    }
    Ok((kept, problems))
}

/// The labels of a cache's previous-stage channels (those its parameters normalize as a
/// label's indicator), in channel order; empty for any other cache.
pub fn indicator_values(params: &OutputParams) -> Vec<u16> {
    params
        .channels
        .iter()
        .filter_map(|c| match c.normalization {
            Normalization::Indicator(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// A model's input cases with the previous stage's channels it takes (`values`, from
/// [`indicator_values`] of its preprocessing) from `dir`: an error when it takes some and no
/// folder is given while there are cases, or it takes none and one is given.
pub fn for_model(
    model: &Path,
    values: &[u16],
    dir: Option<&Path>,
    cases: Vec<CaseSource>,
) -> Result<(Vec<CaseSource>, Vec<CaseProblem>)> {
    match (dir, values.is_empty()) {
        (Some(dir), false) => attach(dir, cases, values),
        (None, false) if !cases.is_empty() => Err(Error::Config(format!(
            "{}: the model is a cascade's second stage (it takes a first stage's segmentation as {} channels): give --previous-stage DIR, the 3d_lowres model's predictions of these inputs",
            model.display(),
            values.len()
        ))),
        (Some(dir), true) => Err(Error::Config(format!(
            "--previous-stage {}: {} takes no previous stage's segmentation",
            dir.display(),
            model.display()
        ))),
        _ => Ok((cases, Vec::new())),
    }
}

/// The schemes of a build's channels when the last `values.len()` are the previous stage's:
/// each of those is the indicator of its label.
pub fn with_indicators(mut schemes: Vec<Normalization>, values: &[u16]) -> Vec<Normalization> {
    let first = schemes.len().saturating_sub(values.len());
    for (s, &v) in schemes[first..].iter_mut().zip(values) {
        *s = Normalization::Indicator(v);
    }
    schemes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segmentations_are_found_beside_or_in_one_fold() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::write(d.join("a.nii.gz"), b"x").unwrap();
        for k in [0, 3] {
            std::fs::create_dir_all(d.join(format!("fold_{k}/validation"))).unwrap();
        }
        std::fs::write(d.join("fold_3/validation/b.nii.gz"), b"x").unwrap();
        std::fs::write(d.join("fold_0/validation/c.nii.gz"), b"x").unwrap();
        std::fs::create_dir_all(d.join("validation")).unwrap();
        std::fs::write(d.join("validation/v.nii.gz"), b"x").unwrap();
        assert_eq!(find(d, "v").unwrap(), Some(d.join("validation/v.nii.gz")));
        std::fs::write(d.join("fold_3/validation/c.nii.gz"), b"x").unwrap();
        assert_eq!(find(d, "a").unwrap(), Some(d.join("a.nii.gz")));
        assert_eq!(
            find(d, "b").unwrap(),
            Some(d.join("fold_3/validation/b.nii.gz"))
        );
        assert!(find(d, "c").unwrap_err().to_string().contains("two"));
        assert_eq!(find(d, "z").unwrap(), None);
        let cases = vec![
            CaseSource::single("a", d.join("a_0000.nii.gz"), None),
            CaseSource::single("z", d.join("z_0000.nii.gz"), None),
        ];
        let (kept, problems) = attach(d, cases, &[1, 2]).unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].images.len(), 3);
        assert_eq!(kept[0].images[2], d.join("a.nii.gz"));
        let e = problems[0].error.to_string();
        assert!(e.contains("z.nii.gz") && e.contains("3d_lowres"), "{e}");
    }
}
