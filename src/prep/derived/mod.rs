//! The label-derived arrays of an entry: a signed distance map per foreground class
//! ([`distance`]) and the skeleton ([`skeleton`]), computed after the label is written, from
//! the label array read back out of the entry's temporary folder, a pencil or a chunk at a time.
//! Memory is bounded by one axis of the volume times a chunk's cross-section, never the volume.

mod distance;
pub mod edt;
mod skeleton;
pub mod thinning;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use zarrs::array::{Array, ArraySubset};

use crate::cache::store::{open_readable, EntryStore, ReadStore};
use crate::cache::writer::{build_array, bytes_of, pad_block, short_hex, ArraySpec};
use crate::error::{Error, Result};
use crate::format::entry::{DerivedInfo, DistanceInfo};
use crate::format::{
    ChunkLayout, DerivedArrays, Dtype, OutputParams, DISTANCE_ARRAY, LABEL_ARRAY, SKELETON_ARRAY,
};

pub use distance::{streamed_signed_distance, BlockSink};
pub use skeleton::{
    block_bounds, chunked_skeleton, chunked_skeleton_with, SkeletonStats, BASE_HALO, MAX_HALO,
};

/// What the derived arrays need to know about the entry being written.
pub(super) struct DerivedInput<'a> {
    pub store: &'a Arc<EntryStore>,
    /// The entry's temporary folder (the label array is read back from it).
    pub dir: &'a Path,
    pub params: &'a OutputParams,
    pub layout: &'a ChunkLayout,
    pub shape_zyx: [usize; 3],
    pub spacing_zyx: [f64; 3],
    pub unit: &'a str,
    pub label_dtype: Dtype,
    /// Foreground classes present, with their voxel counts.
    pub classes: BTreeMap<u16, u64>,
}

/// What was written: the attributes and each array's block checksums.
pub(super) struct DerivedOutput {
    pub info: DerivedInfo,
    pub distance_sums: BTreeMap<String, String>,
    pub skeleton_sums: BTreeMap<String, String>,
}

/// A (z, y, x) box of the label read as u16 (whatever its stored type).
pub trait LabelBoxes: Sync {
    /// The voxels of `lo..hi`, C order; the box lies inside the volume.
    fn read(&self, lo: [usize; 3], hi: [usize; 3]) -> Result<Vec<u16>>;
}

/// A label volume held in memory (tests, measurements, small volumes).
pub struct LabelVolume<'a> {
    /// The voxels, (z, y, x) C order.
    pub voxels: &'a [u16],
    /// Its shape (z, y, x).
    pub shape: [usize; 3],
}

impl LabelBoxes for LabelVolume<'_> {
    fn read(&self, lo: [usize; 3], hi: [usize; 3]) -> Result<Vec<u16>> {
        let s = self.shape;
        let mut out = Vec::with_capacity((0..3).map(|a| hi[a] - lo[a]).product());
        for z in lo[0]..hi[0] {
            for y in lo[1]..hi[1] {
                let row = (z * s[1] + y) * s[2];
                out.extend_from_slice(&self.voxels[row + lo[2]..row + hi[2]]);
            }
        }
        Ok(out)
    }
}

/// The label array of an entry folder, read through zarrs (any codec, sharded or not).
pub(super) struct LabelArray {
    array: Array<ReadStore>,
    dtype: Dtype,
    path: PathBuf,
}

impl LabelArray {
    pub(super) fn open(dir: &Path, dtype: Dtype) -> Result<Self> {
        let path = dir.join(LABEL_ARRAY);
        let store = open_readable(dir)?;
        let array =
            Array::open(store, &format!("/{LABEL_ARRAY}")).map_err(|e| Error::zarr(&path, e))?;
        Ok(LabelArray { array, dtype, path })
    }
}

impl LabelBoxes for LabelArray {
    fn read(&self, lo: [usize; 3], hi: [usize; 3]) -> Result<Vec<u16>> {
        let ranges: Vec<std::ops::Range<u64>> =
            (0..3).map(|a| lo[a] as u64..hi[a] as u64).collect();
        let subset = ArraySubset::new_with_ranges(&ranges);
        let e = |e: zarrs::array::ArrayError| Error::zarr(&self.path, e);
        Ok(match self.dtype {
            Dtype::Uint8 => self
                .array
                .retrieve_array_subset::<Vec<u8>>(&subset)
                .map_err(e)?
                .into_iter()
                .map(u16::from)
                .collect(),
            _ => self
                .array
                .retrieve_array_subset::<Vec<u16>>(&subset)
                .map_err(e)?,
        })
    }
}

/// A label with its ignore label read as background: unannotated voxels are no class.
struct Unignored<L> {
    label: L,
    ignore: Option<u16>,
}

impl<L: LabelBoxes> LabelBoxes for Unignored<L> {
    fn read(&self, lo: [usize; 3], hi: [usize; 3]) -> Result<Vec<u16>> {
        let mut v = self.label.read(lo, hi)?;
        if let Some(i) = self.ignore {
            v.iter_mut().filter(|x| **x == i).for_each(|x| *x = 0);
        }
        Ok(v)
    }
}

/// Build the derived arrays `input.params.derived` asks for.
pub(super) fn write_derived(input: DerivedInput) -> Result<DerivedOutput> {
    let DerivedArrays {
        distance,
        skeleton,
        ignore_label,
    } = input.params.derived;
    let label = LabelArray::open(input.dir, input.label_dtype)?;
    let label = Unignored {
        label,
        ignore: ignore_label,
    };
    let block = input.layout.write_block_zyx();
    let array = |spec: ArraySpec| {
        build_array(
            input.store,
            input.dir,
            input.params,
            input.layout,
            input.shape_zyx,
            spec,
        )
    };
    let mut out = DerivedOutput {
        info: DerivedInfo::default(),
        distance_sums: BTreeMap::new(),
        skeleton_sums: BTreeMap::new(),
    };
    let present: BTreeMap<u16, u64> = input
        .classes
        .iter()
        .filter(|(&c, _)| Some(c) != ignore_label)
        .map(|(&c, &n)| (c, n))
        .collect();
    if distance {
        let classes: Vec<u16> = present.keys().copied().collect();
        let arr = array(ArraySpec {
            name: DISTANCE_ARRAY,
            dtype: Dtype::Float32,
            channels: Some(classes.len()),
        })?;
        let store_path = input.dir.join(DISTANCE_ARRAY);
        let sums = Mutex::new(BTreeMap::new());
        let volume = input.shape_zyx.iter().product::<usize>() as u64;
        for (k, (&class, &count)) in present.iter().enumerate() {
            let sink = |idx: [u64; 3], size: [usize; 3], data: &[f32]| -> Result<()> {
                let data = pad_block(data.to_vec(), size, block, 0f32);
                let cidx = [k as u64, idx[0], idx[1], idx[2]];
                arr.store_chunk(&cidx, data.as_slice())
                    .map_err(|e| Error::zarr(&store_path, e))?;
                let name = format!("{k}.{}.{}.{}", idx[0], idx[1], idx[2]);
                let hash = short_hex(&blake3::hash(bytes_of(&data)));
                sums.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name, hash);
                Ok(())
            };
            streamed_signed_distance(
                &label,
                class,
                count == volume,
                input.shape_zyx,
                block,
                input.spacing_zyx,
                input.dir,
                &sink,
            )?;
        }
        out.distance_sums = sums.into_inner().unwrap_or_else(|p| p.into_inner());
        out.info.distance = Some(DistanceInfo {
            array: DISTANCE_ARRAY.into(),
            classes,
            unit: input.unit.to_string(),
        });
    }
    if skeleton {
        let arr = array(ArraySpec {
            name: SKELETON_ARRAY,
            dtype: input.label_dtype,
            channels: None,
        })?;
        let (sums, stats) = skeleton::write_skeleton(
            &label,
            &arr,
            &input.dir.join(SKELETON_ARRAY),
            input.shape_zyx,
            block,
            input.label_dtype,
        )?;
        out.skeleton_sums = sums;
        out.info.skeleton = Some(stats.info());
    }
    Ok(out)
}
