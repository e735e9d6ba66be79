//! Writing `CASE.probabilities.zarr` ([`crate::format::probabilities`]): the export hands over
//! each slab's resampled class probabilities, which go out as float16 chunks of one class and
//! one slab. The array is built in a temporary folder and renamed into place when complete.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zarrs::array::codec::ZstdCodec;
use zarrs::array::{Array, ArrayBuilder};

use crate::cache::store::EntryStore;
use crate::error::{Error, Result};
use crate::format::labels::Labels;
use crate::format::probabilities::{ProbabilityAttrs, PROBABILITIES_VERSION};
use crate::format::Dtype;
use crate::nifti_io::HeaderInfo;

/// A probabilities array being written.
pub struct ProbabilityZarr {
    array: Array<EntryStore>,
    store: Arc<EntryStore>,
    tmp: PathBuf,
    /// Slices per chunk.
    rows: usize,
    plane: usize,
}

impl ProbabilityZarr {
    /// Start the array in `tmp` for an input with header `input`, one array per head of
    /// `outputs`, chunks of `rows` whole slices (the export's slab).
    pub fn create(
        tmp: &Path,
        input: &HeaderInfo,
        outputs: &Labels,
        rows: usize,
    ) -> Result<ProbabilityZarr> {
        let _ = std::fs::remove_dir_all(tmp);
        std::fs::create_dir_all(tmp).map_err(|e| Error::io(tmp, e))?;
        let [nx, ny, nz] = input.shape_xyz;
        let kind = match outputs.is_regions() {
            false => "class probabilities",
            true => "region probabilities",
        };
        let (names, values) = (outputs.head_names(), outputs.head_values());
        let regions = outputs.regions().iter().map(|r| r.values.clone()).collect();
        let attrs = ProbabilityAttrs {
            version: PROBABILITIES_VERSION,
            kind: kind.into(),
            classes: names,
            values: values.clone(),
            regions,
            source: input.path.display().to_string(),
            affine: input.affine.0,
            unit: input.unit.to_string(),
        };
        let mut map = serde_json::Map::new();
        map.insert(
            "voxcache".into(),
            serde_json::to_value(&attrs).map_err(|e| Error::zarr(tmp, e))?,
        );
        let store = Arc::new(EntryStore::new(tmp));
        let rows = rows.clamp(1, nz.max(1));
        let mut b = ArrayBuilder::new(
            vec![values.len() as u64, nz as u64, ny as u64, nx as u64],
            vec![1, rows as u64, ny as u64, nx as u64],
            Dtype::Float16.zarrs(),
            Dtype::Float16.zero_fill(),
        );
        b.dimension_names(Some(["c", "z", "y", "x"]));
        b.bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))]);
        b.attributes(map);
        let array = b
            .build(store.clone(), "/")
            .map_err(|e| Error::zarr(tmp, e))?;
        array.store_metadata().map_err(|e| Error::zarr(tmp, e))?;
        Ok(ProbabilityZarr {
            array,
            store,
            tmp: tmp.to_path_buf(),
            rows,
            plane: nx * ny,
        })
    }

    /// The slices per chunk: slabs handed to [`Self::write_slab`] start at multiples of it.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Class `class`'s probabilities of the slab starting at slice `z0` (whole slices).
    pub fn write_slab(&self, class: usize, z0: usize, values: &[f32]) -> Result<()> {
        // A chunk is always whole: the last slab is padded (zarrs keeps only what is inside).
        let mut chunk = vec![half::f16::ZERO; self.rows * self.plane];
        for (o, v) in chunk.iter_mut().zip(values) {
            *o = half::f16::from_f32(*v);
        }
        let index = [class as u64, (z0 / self.rows) as u64, 0, 0];
        self.array
            .store_chunk(&index, chunk.as_slice())
            .map_err(|e| Error::zarr(&self.tmp, e))
    }

    /// Make everything durable and move the array to `dest` (replacing what is there).
    pub fn finish(self, dest: &Path) -> Result<()> {
        self.store.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        if dest.exists() {
            std::fs::remove_dir_all(dest).map_err(|e| Error::io(dest, e))?;
        }
        std::fs::rename(&self.tmp, dest).map_err(|e| Error::io(dest, e))
    }
}
