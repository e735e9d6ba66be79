//! Scanning: every case's headers read (never voxels) and checked against each other.

use rayon::prelude::*;
use serde::Serialize;

use super::CaseSource;
use crate::error::{Error, Result};
use crate::nifti_io::{self, HeaderInfo};

/// A case's headers, checked against each other.
#[derive(Clone, Debug, Serialize)]
pub struct ScannedCase {
    /// The case's files.
    pub source: CaseSource,
    /// The first channel's header: the case's grid.
    pub image: HeaderInfo,
    /// The headers of channels 1.. (empty for one channel), each on the first one's grid.
    pub other_channels: Vec<HeaderInfo>,
    /// The label header (same grid as the image's); `None` for an unlabelled case.
    pub label: Option<HeaderInfo>,
}

/// Check that an image and its label describe the same grid.
pub fn check_pair(id: &str, image: &HeaderInfo, label: &HeaderInfo) -> Result<()> {
    check_same_grid(id, image, label, ("image", "label"))
}

/// Check that channel `other` of a case lies on the first channel's grid.
pub fn check_channel(id: &str, first: &HeaderInfo, other: &HeaderInfo) -> Result<()> {
    check_same_grid(id, first, other, ("image", "channel"))
}

/// Check that a prediction lies on its reference segmentation's grid (`evaluate`).
pub fn check_prediction(id: &str, prediction: &HeaderInfo, reference: &HeaderInfo) -> Result<()> {
    check_same_grid(id, prediction, reference, ("prediction", "reference"))
}

/// `image` and `label` (the case's label or another channel, or a prediction and its
/// reference: `names`) on one grid.
fn check_same_grid(
    id: &str,
    image: &HeaderInfo,
    label: &HeaderInfo,
    names: (&str, &str),
) -> Result<()> {
    let (first, what) = names;
    if image.shape_xyz != label.shape_xyz {
        return Err(Error::case(
            id,
            format!(
                "{first} {} is {:?} voxels but {what} {} is {:?}",
                image.path.display(),
                image.shape_xyz,
                label.path.display(),
                label.shape_xyz
            ),
        ));
    }
    let scale = image
        .affine
        .0
        .iter()
        .flatten()
        .fold(1.0f64, |m, v| m.max(v.abs()));
    let diff = image.affine.max_abs_diff(&label.affine);
    if diff > 1e-4 * scale {
        return Err(Error::case(
            id,
            format!(
                "{first} {} and {what} {} have different geometry (affines differ by up to {diff:.3e}; spacings {:?} vs {:?})",
                image.path.display(),
                label.path.display(),
                image.spacing_xyz,
                label.spacing_xyz
            ),
        ));
    }
    Ok(())
}

/// Read and check every case's headers (in parallel; only header bytes are read).
pub fn scan(cases: &[CaseSource]) -> Vec<(CaseSource, Result<ScannedCase>)> {
    cases
        .par_iter()
        .map(|c| {
            let r = (|| {
                let (path, frame) = c.channel(0);
                let image = nifti_io::read_frame_header(path, frame)?;
                let mut other_channels = Vec::new();
                for k in 1..c.images.len() {
                    let (path, frame) = c.channel(k);
                    let h = nifti_io::read_frame_header(path, frame)?;
                    check_channel(&c.id, &image, &h)?;
                    other_channels.push(h);
                }
                let label = match &c.label {
                    Some(l) => {
                        let h = nifti_io::read_header(l)?;
                        check_pair(&c.id, &image, &h)?;
                        Some(h)
                    }
                    None => None,
                };
                Ok(ScannedCase {
                    source: c.clone(),
                    image,
                    other_channels,
                    label,
                })
            })();
            (c.clone(), r)
        })
        .collect()
}
