//! A case's voxels, read for the dataset report: each image channel's intensities and the
//! label's voxels per value, streamed block by block with the problems they show.

use std::collections::BTreeMap;
use std::path::Path;

use super::dataset_report::IntensityFacts;
use super::{file_message, rel_path, Problem};
use crate::error::{Error, Result};
use crate::nifti_io;
use crate::prep::dataset::CaseSource;

/// Voxel facts of one case.
#[derive(Default)]
pub(super) struct VoxelFacts {
    pub(super) intensity: Option<IntensityFacts>,
    /// Channels 1..: `None` where unreadable.
    pub(super) other_intensity: Vec<Option<IntensityFacts>>,
    pub(super) label_values: Option<BTreeMap<String, u64>>,
    pub(super) problems: Vec<Problem>,
}

/// Range, mean and non-finite count of an image, streamed block by block (in file order, so
/// the sum is the same however the file is read).
fn intensity_of(path: &Path, frame: Option<usize>) -> Result<IntensityFacts> {
    let mut fold = IntensityFold::default();
    nifti_io::stream_f32_frame(path, frame, &mut |_, data| {
        fold.add(data);
        Ok(())
    })?;
    Ok(fold.finish())
}

/// The running sums behind [`IntensityFacts`].
struct IntensityFold {
    lo: f32,
    hi: f32,
    sum: f64,
    n: u64,
    bad: u64,
}

impl Default for IntensityFold {
    fn default() -> Self {
        IntensityFold {
            lo: f32::INFINITY,
            hi: f32::NEG_INFINITY,
            sum: 0.0,
            n: 0,
            bad: 0,
        }
    }
}

impl IntensityFold {
    fn add(&mut self, data: &[f32]) {
        for &v in data {
            if v.is_finite() {
                self.lo = self.lo.min(v);
                self.hi = self.hi.max(v);
                self.sum += v as f64;
                self.n += 1;
            } else {
                self.bad += 1;
            }
        }
    }

    fn finish(&self) -> IntensityFacts {
        let n = self.n;
        IntensityFacts {
            min: (n > 0).then_some(self.lo as f64),
            max: (n > 0).then_some(self.hi as f64),
            mean: (n > 0).then(|| self.sum / n as f64),
            non_finite: self.bad,
        }
    }
}

/// Voxels per label value, streamed. The outer error: the file cannot be read; the inner one:
/// a value that is not a label (negative, fractional, over 65535), naming the file.
fn label_counts(
    path: &Path,
    allowed: Option<&std::collections::BTreeSet<u16>>,
) -> Result<Result<BTreeMap<String, u64>>> {
    let mut counts = vec![0u64; 1 << 16];
    let mut check = nifti_io::LabelCheck::new(path);
    if let Some(v) = allowed {
        check = check.allowing_only(v);
    }
    let mut bad = None;
    let read = nifti_io::stream_f32(path, &mut |_, data| {
        if let Err(e) = check.block(data) {
            bad = Some(e);
            return Err(Error::Dataset("label values refused".into()));
        }
        data.iter().for_each(|&c| counts[c as usize] += 1);
        Ok(())
    });
    if let Some(e) = bad {
        return Ok(Err(e));
    }
    read?;
    Ok(Ok(counts
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(c, &n)| (c.to_string(), n))
        .collect()))
}

/// Read one case's voxels: the image, then (after the image is dropped) the label, so one
/// worker holds about one volume at a time.
pub(super) fn read_voxels(
    root: &Path,
    c: &CaseSource,
    image_ok: bool,
    label_ok: bool,
    allowed: Option<&std::collections::BTreeSet<u16>>,
) -> VoxelFacts {
    let mut f = VoxelFacts::default();
    let unreadable = |p: &Path, e: Error| {
        Problem::error("unreadable", file_message(root, p, &e.to_string()))
            .case(&c.id)
            .path(rel_path(root, p))
    };
    if image_ok {
        for k in 0..c.images.len() {
            let (path, frame) = c.channel(k);
            let facts = match intensity_of(path, frame) {
                Ok(facts) => {
                    if facts.non_finite > 0 {
                        f.problems.push(
                            Problem::error(
                                "non-finite",
                                format!(
                                    "{} voxels are NaN or infinite (build-cache refuses this image)",
                                    facts.non_finite
                                ),
                            )
                            .case(&c.id)
                            .path(rel_path(root, path)),
                        );
                    }
                    Some(facts)
                }
                Err(e) => {
                    f.problems.push(unreadable(path, e));
                    None
                }
            };
            if k == 0 {
                f.intensity = facts;
            } else {
                f.other_intensity.push(facts);
            }
        }
    }
    if let (Some(lp), true) = (&c.label, label_ok) {
        match label_counts(lp, allowed) {
            Ok(Ok(counts)) => {
                if counts.keys().all(|k| k == "0") {
                    f.problems.push(
                        Problem::warning("empty-label", "the label has no foreground voxel")
                            .case(&c.id)
                            .path(rel_path(root, lp)),
                    );
                }
                f.label_values = Some(counts);
            }
            Ok(Err(e)) => f.problems.push(
                Problem::error("bad-label", file_message(root, lp, &e.to_string()))
                    .case(&c.id)
                    .path(rel_path(root, lp)),
            ),
            Err(e) => f.problems.push(unreadable(lp, e)),
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intensities_skip_non_finite_voxels() {
        let fold = |v: &[f32]| {
            let mut f = IntensityFold::default();
            f.add(v);
            f.finish()
        };
        let f = fold(&[1.0, f32::NAN, 3.0, f32::INFINITY]);
        assert_eq!(
            (f.min, f.max, f.mean, f.non_finite),
            (Some(1.0), Some(3.0), Some(2.0), 2)
        );
        let f = fold(&[f32::NAN]);
        assert_eq!((f.min, f.non_finite), (None, 1));
    }
}
