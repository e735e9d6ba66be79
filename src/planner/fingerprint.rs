//! A dataset's fingerprint from its files' headers: every labelled case's spacing and shape,
//! the label count from dataset.json, the training case count. nnU-Net crops each case to its
//! nonzero region first; we plan on the whole volume (the same for data without a zero
//! border: both reference datasets keep 100% of their voxels), and read no voxel.

use super::experiment::Fingerprint;
use crate::error::{Error, Result};
use crate::nifti_io::unit_in_mm;
use crate::prep::dataset::scan::scan;
use crate::prep::dataset::{discover, DatasetSource};

/// A dataset's fingerprint and what planning it needs to say.
#[derive(Clone, Debug)]
pub struct DatasetFingerprint {
    /// The planner's input (spacings in mm).
    pub fingerprint: Fingerprint,
    /// The first case's spatial unit ("mm", "um"...): plans are written back in it.
    pub unit: String,
    /// Millimetres in one `unit`.
    pub mm_per_unit: f64,
    /// Image channels of a case (files per case, or a multi-volume file's volumes).
    pub channels: usize,
    /// What was assumed or left out, one line each.
    pub notes: Vec<String>,
}

/// Scan `source`'s labelled cases' headers into a fingerprint.
pub fn fingerprint_dataset(source: &DatasetSource) -> Result<DatasetFingerprint> {
    let found = discover(source)?;
    let labelled: Vec<_> = found
        .cases
        .iter()
        .filter(|c| c.label.is_some())
        .cloned()
        .collect();
    if labelled.is_empty() {
        return Err(Error::Dataset(
            "no labelled case to plan for: planning needs imagesTr/ with labelsTr/".into(),
        ));
    }
    let mut notes = Vec::new();
    let (mut spacings, mut shapes) = (Vec::new(), Vec::new());
    let mut unit: Option<(String, f64)> = None;
    for (case, scanned) in scan(&labelled) {
        let s = match scanned {
            Ok(s) => s,
            Err(e) => {
                notes.push(format!("{} left out: {e}", case.id));
                continue;
            }
        };
        let h = &s.image;
        let mm = unit_in_mm(h.unit).unwrap_or_else(|| {
            notes.push(format!("{}: spatial unit unknown, taken as mm", case.id));
            1.0
        });
        unit.get_or_insert_with(|| (h.unit.to_string(), mm));
        // The stored single-precision values, as nnU-Net reads them (see spacing_exact_xyz).
        let [x, y, z] = h.spacing_exact_xyz();
        spacings.push([z * mm, y * mm, x * mm]);
        let [nx, ny, nz] = h.shape_xyz;
        shapes.push([nz, ny, nx]);
    }
    let (unit, mm_per_unit) = unit.ok_or_else(|| {
        Error::Dataset("no labelled case could be read: nothing to plan for".into())
    })?;
    let num_classes = match found.description.as_ref().map(|d| d.labels.len()) {
        Some(n) if n >= 2 => n,
        _ => {
            notes.push("no dataset.json labels: planned for 2 classes (background and one)".into());
            2
        }
    };
    // nnU-Net sizes the batch cap by dataset.json's numTraining, not by the cases it read.
    let num_training = match found.description.as_ref().and_then(|d| d.num_training) {
        Some(n) if n > 0 => {
            if n != spacings.len() {
                notes.push(format!(
                    "dataset.json says numTraining {n}, {} labelled cases were read: planned with {n}, as nnU-Net",
                    spacings.len()
                ));
            }
            n
        }
        Some(_) => {
            notes.push(format!(
                "dataset.json says numTraining 0, {} labelled cases were read: planned with {} (nnU-Net would plan with 0, which caps its batch at the minimum of 2); fix numTraining",
                spacings.len(),
                spacings.len()
            ));
            spacings.len()
        }
        None => spacings.len(),
    };
    Ok(DatasetFingerprint {
        fingerprint: Fingerprint {
            spacings,
            shapes,
            num_classes,
            num_training,
        },
        unit: if unit == "unknown" { "mm".into() } else { unit },
        mm_per_unit,
        channels: found
            .description
            .as_ref()
            .map(|d| d.channels.len())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| labelled[0].images.len().max(1)),
        notes,
    })
}
