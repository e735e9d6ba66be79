//! Labels: every voxel must be a whole number from 0 to 65535, checked as the file streams;
//! the largest value decides whether the cache stores them as u8 or u16.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::Dtype;

/// The label values seen so far, block by block in file order.
#[derive(Debug)]
pub struct LabelCheck {
    path: PathBuf,
    seen: u64,
    max: f32,
    /// Values dataset.json lists, as a table by value; `None`: any label value.
    allowed: Option<Vec<bool>>,
}

fn valid(v: f32) -> bool {
    v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= 65535.0
}

impl LabelCheck {
    /// A check of the label file at `path` (named in its error).
    pub fn new(path: &Path) -> Self {
        LabelCheck {
            path: path.to_path_buf(),
            seen: 0,
            max: 0.0,
            allowed: None,
        }
    }

    /// Refuse values not in `values` too (the classes a dataset.json lists).
    pub fn allowing_only(mut self, values: &std::collections::BTreeSet<u16>) -> Self {
        let mut table = vec![false; 1 << 16];
        values.iter().for_each(|&v| table[v as usize] = true);
        self.allowed = Some(table);
        self
    }

    /// Check the next block of voxels (as f32): the first invalid one is an error naming the
    /// file, the voxel's index and its value.
    pub fn block(&mut self, values: &[f32]) -> Result<()> {
        if let Some(i) = values.par_iter().position_first(|&v| !valid(v)) {
            return Err(Error::nifti(
                &self.path,
                format!(
                    "label voxel {} has value {}: labels must be whole numbers from 0 to 65535",
                    self.seen + i as u64,
                    values[i]
                ),
            ));
        }
        if let Some(table) = &self.allowed {
            // Valid values are whole numbers in 0..=65535: an index into the table.
            if let Some(i) = values.par_iter().position_first(|&v| !table[v as usize]) {
                let listed: Vec<String> = (0..table.len())
                    .filter(|&v| table[v])
                    .map(|v| v.to_string())
                    .collect();
                return Err(Error::nifti(
                    &self.path,
                    format!(
                        "label voxel {} has value {}, which dataset.json does not list (its label values: {})",
                        self.seen + i as u64,
                        values[i],
                        listed.join(", ")
                    ),
                ));
            }
        }
        let max = values.par_iter().cloned().reduce(|| 0.0f32, f32::max);
        self.max = self.max.max(max);
        self.seen += values.len() as u64;
        Ok(())
    }

    /// The smallest unsigned type that holds every value seen.
    pub fn dtype(&self) -> Dtype {
        if self.max <= 255.0 {
            Dtype::Uint8
        } else {
            Dtype::Uint16
        }
    }
}

/// A label volume converted to the smallest unsigned type that holds its values.
#[derive(Clone, Debug)]
pub enum LabelData {
    /// Values up to 255.
    U8(Vec<u8>),
    /// Values up to 65535.
    U16(Vec<u16>),
}

impl LabelData {
    /// Voxels.
    pub fn len(&self) -> usize {
        match self {
            LabelData::U8(v) => v.len(),
            LabelData::U16(v) => v.len(),
        }
    }

    /// Whether there are no voxels.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type it is stored as.
    pub fn stored_dtype(&self) -> Dtype {
        match self {
            LabelData::U8(_) => Dtype::Uint8,
            LabelData::U16(_) => Dtype::Uint16,
        }
    }
}

/// Check that label voxels are whole numbers in 0..=65535 and narrow them.
pub fn label_from_f32(path: &Path, data: Vec<f32>) -> Result<LabelData> {
    let mut check = LabelCheck::new(path);
    check.block(&data)?;
    Ok(match check.dtype() {
        Dtype::Uint8 => LabelData::U8(data.par_iter().map(|&v| v as u8).collect()),
        _ => LabelData::U16(data.par_iter().map(|&v| v as u16).collect()),
    })
}

/// Read a 3-D label file once, handing its voxels to `on_slice` one z slice at a time (x
/// fastest) as u16, each value checked as [`LabelCheck`] does (the error names the file and the
/// voxel). Memory is one slice and one block, whatever the volume's size.
pub fn stream_label_slices(
    path: &Path,
    on_slice: &mut dyn FnMut(usize, &[u16]) -> Result<()>,
) -> Result<super::HeaderInfo> {
    let mut check = LabelCheck::new(path);
    let mut values: Vec<f32> = Vec::new();
    let mut slice: Vec<u16> = Vec::new();
    let mut z = 0usize;
    let streamed = super::stream_voxels(path, &mut |h, raw| {
        let per_slice = h.shape_xyz[0] * h.shape_xyz[1];
        values.resize(raw.len() / h.bytes_per_voxel, 0.0);
        super::voxels::decode_f32(h, raw, &mut values);
        check.block(&values)?;
        let mut rest = &values[..];
        while !rest.is_empty() {
            let take = (per_slice - slice.len()).min(rest.len());
            slice.extend(rest[..take].iter().map(|&v| v as u16));
            rest = &rest[take..];
            if slice.len() == per_slice {
                on_slice(z, &slice)?;
                z += 1;
                slice.clear();
            }
        }
        Ok(())
    })?;
    Ok(streamed.header)
}
