//! `CASE.probabilities.zarr`: the class probabilities `predict --save-probabilities` writes
//! beside a segmentation. One Zarr v3 array (the folder is the array: `zarr.json` at its top),
//! float16, shape (classes, z, y, x) on the input's own grid (z, y, x are the input NIfTI's
//! k, j, i axes), chunks of one class and a slab of whole slices, zstd-compressed. Values are
//! the probabilities the segmentation's argmax was taken over (resampled back to the input grid,
//! so they sum to 1 per voxel up to float16 rounding). Its attributes say what each class is
//! and where the voxels are.

use serde::{Deserialize, Serialize};

/// The folder name's ending after the case id.
pub const PROBABILITIES_SUFFIX: &str = ".probabilities.zarr";

/// Version of this array's layout and attributes.
pub const PROBABILITIES_VERSION: u32 = 1;

/// The array's `attributes` in its `zarr.json`, under the key `voxcache`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbabilityAttrs {
    /// [`PROBABILITIES_VERSION`].
    pub version: u32,
    /// "class probabilities" or "region probabilities".
    pub kind: String,
    /// Each class's name, in the array's first axis order.
    pub classes: Vec<String>,
    /// The label value each class (or region) is written as in the segmentation.
    pub values: Vec<u16>,
    /// A region model's regions: the labels each head's region holds (empty for classes,
    /// whose heads sum to 1; regions are sigmoids, written in order where over 0.5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<Vec<u16>>,
    /// The input file whose grid the array is on.
    pub source: String,
    /// The input's voxel (i, j, k) to world affine (rows of a 4x4 matrix), in `unit`.
    pub affine: [[f64; 4]; 4],
    /// The input's spatial unit ("mm", "um", "m" or "unknown").
    pub unit: String,
}

impl ProbabilityAttrs {
    /// What the heads stand for (no ignore label: it is never predicted). Unchecked: a reader
    /// checks the lengths.
    pub fn labels(&self) -> super::labels::Labels {
        use super::labels::{ClassInfo, Labels};
        match self.regions.is_empty() {
            true => {
                let classes = self.values.iter().zip(&self.classes);
                let classes = classes.map(|(&value, name)| ClassInfo {
                    value,
                    name: name.clone(),
                });
                Labels::unchecked_classes(classes.collect(), None)
            }
            false => {
                let regions = self.regions.iter().zip(&self.classes);
                let regions = regions.map(|(values, name)| super::dataset_json::LabelClass {
                    name: name.clone(),
                    values: values.clone(),
                });
                Labels::unchecked_regions(regions.collect(), self.values.clone(), None)
            }
        }
    }
}
