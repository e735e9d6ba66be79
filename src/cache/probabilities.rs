//! Reading a `CASE.probabilities.zarr` ([`crate::format::probabilities`]) through the cache's
//! read store: ensembles of configurations read the folds' kept validation probabilities, and a
//! cascade's build reads the first stage's.

use std::path::{Path, PathBuf};

use zarrs::array::Array;

use crate::error::{Error, Result};
use crate::format::probabilities::{ProbabilityAttrs, PROBABILITIES_VERSION};

/// A `CASE.probabilities.zarr` opened for reading (ensembles of configurations from the folds'
/// kept validation probabilities).
pub struct ProbabilityReader {
    array: Array<crate::cache::store::ReadStore>,
    path: PathBuf,
    /// What the array says of itself.
    pub attrs: ProbabilityAttrs,
    /// (classes, z, y, x).
    pub shape: [usize; 4],
    /// Slices per chunk.
    pub rows: usize,
}

impl ProbabilityReader {
    /// Open `path`, checking it is a probabilities array of this layout.
    pub fn open(path: &Path) -> Result<ProbabilityReader> {
        let store = crate::cache::store::open_readable(path)?;
        let array = Array::open(store, "/").map_err(|e| Error::zarr(path, e))?;
        let bad = |why: String| Error::cache(path, why);
        let attrs: ProbabilityAttrs = array
            .attributes()
            .get("voxcache")
            .cloned()
            .ok_or_else(|| bad("no voxcache attributes: not a probabilities array".into()))
            .and_then(|v| {
                serde_json::from_value(v).map_err(|e| bad(format!("malformed attributes: {e}")))
            })?;
        if attrs.version != PROBABILITIES_VERSION {
            return Err(bad(format!(
                "probabilities version {} (this voxcache reads {PROBABILITIES_VERSION})",
                attrs.version
            )));
        }
        let shape = array.shape();
        let chunk = array
            .chunk_shape(&[0, 0, 0, 0])
            .map_err(|e| Error::zarr(path, e))?;
        if shape.len() != 4
            || chunk.len() != 4
            || shape[0] as usize != attrs.values.len()
            || attrs.classes.len() != attrs.values.len()
            || !(attrs.regions.is_empty() || attrs.regions.len() == attrs.values.len())
        {
            return Err(bad(format!(
                "shape {shape:?} does not hold {} classes of (z, y, x)",
                attrs.values.len()
            )));
        }
        let shape = [0, 1, 2, 3].map(|a| shape[a] as usize);
        Ok(ProbabilityReader {
            rows: chunk[1].get() as usize,
            array,
            path: path.to_path_buf(),
            attrs,
            shape,
        })
    }

    /// Class `class`'s probabilities of slices `z0..z0 + rows` (whole slices, fewer at the end).
    pub fn read_slab(&self, class: usize, z0: usize, rows: usize) -> Result<Vec<f32>> {
        let [_, nz, ny, nx] = self.shape;
        let end = (z0 + rows).min(nz);
        let ranges = [
            class as u64..class as u64 + 1,
            z0 as u64..end as u64,
            0..ny as u64,
            0..nx as u64,
        ];
        let subset = zarrs::array::ArraySubset::new_with_ranges(&ranges);
        let v: Vec<half::f16> = self
            .array
            .retrieve_array_subset(&subset)
            .map_err(|e| Error::zarr(&self.path, e))?;
        Ok(v.into_iter().map(|h| h.to_f32()).collect())
    }
}
