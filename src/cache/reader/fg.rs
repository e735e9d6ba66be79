//! An entry's foreground index: the sampled voxel coordinates of each label value, which the
//! sampler centres foreground patches on. Read once, on first use, and checked row by row.

use zarrs::array::{Array, ArraySubset};

use super::EntryReader;
use crate::error::{Error, Result};
use crate::format::FG_ARRAY;

/// A foreground-index class range: rows `start..start + count` of the `fg` array.
#[derive(Clone, Copy, Debug)]
pub(super) struct FgRange {
    pub(super) start: usize,
    pub(super) count: usize,
}

impl EntryReader {
    /// Label values with sampled foreground coordinates, ascending.
    pub fn classes(&self) -> Vec<u16> {
        self.inner.fg_ranges.keys().copied().collect()
    }

    /// The sampled foreground coordinates (z, y, x) of `class` (empty if the class is absent).
    pub fn fg_coords(&self, class: u16) -> Result<Vec<[u32; 3]>> {
        let Some(range) = self.inner.fg_ranges.get(&class).copied() else {
            return Ok(Vec::new());
        };
        let rows = self.fg_rows()?;
        let path = || {
            self.inner
                .dir
                .join(self.inner.fg_array.as_deref().unwrap_or(FG_ARRAY))
        };
        let n = rows.len() / 4;
        let end = range.start.checked_add(range.count).filter(|&e| e <= n);
        let Some(end) = end else {
            return Err(Error::cache(
                path(),
                format!(
                    "class {class}: rows {}..+{} are past the {n} rows of the foreground index",
                    range.start, range.count
                ),
            ));
        };
        let shape = self.inner.shape;
        let mut out = Vec::with_capacity(range.count);
        for r in rows[range.start * 4..end * 4].chunks_exact(4) {
            let p = [r[1], r[2], r[3]];
            if r[0] != class as u32 || (0..3).any(|a| p[a] as usize >= shape[a]) {
                return Err(Error::cache(
                    path(),
                    format!("class {class}: foreground row {r:?} is not a voxel of this class inside {shape:?}"),
                ));
            }
            // Written sorted by position, each voxel once: a repeat or a step back means the
            // index was edited, and a repeated row would bias the sampler toward one voxel.
            if out.last().is_some_and(|last: &[u32; 3]| *last >= p) {
                return Err(Error::cache(
                    path(),
                    format!(
                        "class {class}: foreground row {r:?} repeats or precedes the row before it \
                         (rows are written once each, in voxel order)"
                    ),
                ));
            }
            out.push(p);
        }
        Ok(out)
    }

    fn fg_rows(&self) -> Result<&[u32]> {
        if let Some(rows) = self.inner.fg_rows.get() {
            return Ok(rows.as_slice());
        }
        let rows = match &self.inner.fg_array {
            None => Vec::new(),
            Some(name) => {
                let dir = &self.inner.dir;
                let path = dir.join(name);
                let store = crate::cache::store::open_readable(dir)?;
                let array =
                    Array::open(store, &format!("/{name}")).map_err(|e| Error::zarr(&path, e))?;
                let shape = array.shape().to_vec();
                let dtype = array.data_type().to_string();
                if shape.len() != 2 || shape[1] != 4 || dtype.split(' ').next() != Some("uint32") {
                    return Err(Error::cache(
                        &path,
                        format!(
                            "foreground index is {:?} {}, expected (N, 4) uint32",
                            shape, dtype
                        ),
                    ));
                }
                array
                    .retrieve_array_subset::<Vec<u32>>(&ArraySubset::new_with_shape(shape))
                    .map_err(|e| Error::zarr(&path, e))?
            }
        };
        Ok(self.inner.fg_rows.get_or_init(|| rows).as_slice())
    }
}
