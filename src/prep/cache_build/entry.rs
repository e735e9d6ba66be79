//! Writing one cache entry: a Zarr v3 group with `image`, `label` and `fg` arrays (and the
//! label-derived arrays of [`crate::prep::derived`] when asked for), computed block by block (a
//! block is one chunk, or one shard when sharded) in parallel. Each block is resampled from the
//! input, hashed, encoded and written, then forgotten, so memory holds the input plus a few
//! blocks per thread, whatever the output size.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use zarrs::array::ArrayBuilder;
use zarrs::group::GroupBuilder;

use super::previous_probabilities::PreviousProbabilities;
use crate::cache::fg_index::FgAccumulator;
use crate::cache::store::EntryStore;
use crate::cache::writer::{build_array, bytes_of, pad_block, short_hex, ArraySpec};
use crate::error::{Error, Result};
use crate::format::entry::{
    FgIndexInfo, InputGeometry, LabelInfo, NormMaskInfo, OutputGeometry, RowRange, Sources,
};
use crate::format::{
    AppliedNormalization, ChunkChecksums, Dtype, EntryAttrs, ImageDtype, IntensityStats,
    Normalization, OutputParams, FG_ARRAY, FORMAT_VERSION, IMAGE_ARRAY, LABEL_ARRAY,
    NORM_MASK_ARRAY,
};
use crate::geometry::{blocks, Block, VoxelRead};
use crate::prep::derived;
use crate::prep::resample::{LinearResampler, NearestResampler};

/// What to write for one case.
pub(super) struct EntryInput<'a> {
    /// Case id, recorded in the entry.
    pub case_id: &'a str,
    /// Content key of the entry (its folder name once committed).
    pub key: &'a str,
    /// The normalized input image, one source per channel, each C order (z, y, x), read a
    /// run at a time.
    pub images: &'a [&'a dyn VoxelRead],
    /// Label voxels, C order (z, y, x) on the image grid, as f32 holding whole numbers, and the
    /// type they are cached as (u8 or u16); `None` for an unlabelled case.
    pub label: Option<(&'a dyn VoxelRead, Dtype)>,
    /// The first stage's class probabilities, when the previous stage's channels are made
    /// from them (argmax on this grid) rather than from its segmentation.
    pub previous: Option<&'a PreviousProbabilities>,
    /// nnU-Net's normalization mask (1 inside, 0 outside, on the output grid) and the channels
    /// it masks, for a labelled entry of nnU-Net's preprocessing whose plans mask some.
    pub norm_mask: Option<(&'a dyn VoxelRead, &'a [u16])>,
    /// Input shape (z, y, x) in voxels.
    pub in_shape_zyx: [usize; 3],
    /// Output shape (z, y, x) in voxels.
    pub out_shape_zyx: [usize; 3],
    /// The parameters the entry is built with (dtype, layout, codec, sampling).
    pub params: &'a OutputParams,
    /// The facts known before writing, recorded in the entry's attributes.
    pub source: Sources,
    /// The input image's grid.
    pub input: InputGeometry,
    /// The cached grid.
    pub output: OutputGeometry,
    /// Statistics of each channel before normalization.
    pub intensity: Vec<IntensityStats>,
    /// The normalization already applied to each channel of `images`.
    pub normalization: Vec<AppliedNormalization>,
}

fn block_key(b: &Block, write_block: [usize; 3]) -> (Vec<u64>, String) {
    let idx: Vec<u64> = (0..3)
        .map(|a| (b.start[a] / write_block[a]) as u64)
        .collect();
    let name = format!("{}.{}.{}", idx[0], idx[1], idx[2]);
    (idx, name)
}

/// Checksums of written blocks, by block name.
type Sums = Mutex<BTreeMap<String, String>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What writing one block of an entry needs: the arrays, the resamplers, and where the
/// checksums and the foreground index go.
struct BlockWriter<'a> {
    input: &'a EntryInput<'a>,
    dir: &'a Path,
    write_block: [usize; 3],
    image: zarrs::array::Array<EntryStore>,
    label: Option<zarrs::array::Array<EntryStore>>,
    norm_mask: Option<zarrs::array::Array<EntryStore>>,
    linear: LinearResampler,
    nearest: NearestResampler,
    fg: Mutex<FgAccumulator>,
    image_sums: Sums,
    label_sums: Sums,
    mask_sums: Sums,
}

impl BlockWriter<'_> {
    /// Block `b` of every array: resampled, hashed, encoded, written.
    fn block(&self, b: &Block) -> Result<()> {
        let (idx, name) = block_key(b, self.write_block);
        let previous = match self.input.previous {
            Some(p) => Some(p.labels(&self.linear, *b)?),
            None => None,
        };
        for (c, image) in self.input.images.iter().enumerate() {
            self.image_block(b, (c, *image), &idx, &name, previous.as_deref())?;
        }
        if let (Some(arr), Some((mask, _))) = (&self.norm_mask, self.input.norm_mask) {
            self.mask_block(b, arr, mask, &idx, name.clone())?;
        }
        if let (Some(arr), Some(label)) = (&self.label, self.input.label) {
            self.label_block(b, arr, label, &idx, name)?;
        }
        Ok(())
    }

    /// The normalization mask in block `b` (0/1 voxels, stored as bytes).
    fn mask_block(
        &self,
        b: &Block,
        arr: &zarrs::array::Array<EntryStore>,
        mask: &dyn VoxelRead,
        idx: &[u64],
        name: String,
    ) -> Result<()> {
        let mut m = vec![0.0f32; b.len()];
        self.nearest.fill_from(mask, *b, &mut m)?;
        let m: Vec<u8> = m.iter().map(|&v| u8::from(v != 0.0)).collect();
        let m = pad_block(m, b.size, self.write_block, 0u8);
        arr.store_chunk(idx, m.as_slice())
            .map_err(|e| Error::zarr(self.dir.join(NORM_MASK_ARRAY), e))?;
        lock(&self.mask_sums).insert(name, short_hex(&blake3::hash(&m)));
        Ok(())
    }

    /// Channel `c` of the image in block `b`.
    fn image_block(
        &self,
        b: &Block,
        (c, image): (usize, &dyn VoxelRead),
        idx: &[u64],
        name: &str,
        previous: Option<&[f32]>,
    ) -> Result<()> {
        let params = self.input.params;
        let cidx: Vec<u64> = std::iter::once(c as u64)
            .chain(idx.iter().copied())
            .collect();
        let cname = format!("{c}.{name}");
        let chunk_path = || {
            self.dir
                .join(IMAGE_ARRAY)
                .join(format!("c/{}", cname.replace('.', "/")))
        };
        let mut img = vec![0.0f32; b.len()];
        // A previous stage's channel: the argmax of its probabilities on this grid, or its
        // segmentation resampled as labels are; either way it stays 0/1.
        match (params.channels.get(c).map(|p| p.normalization), previous) {
            (Some(Normalization::Indicator(v)), Some(labels)) => img
                .iter_mut()
                .zip(labels)
                .for_each(|(o, &l)| *o = (l == v as f32) as u8 as f32),
            (Some(Normalization::Indicator(_)), None) => {
                self.nearest.fill_from(image, *b, &mut img)?
            }
            _ => self.linear.fill_from(image, *b, &mut img)?,
        }
        let img = pad_block(img, b.size, self.write_block, 0.0f32);
        let hash = match params.image_dtype {
            ImageDtype::Float32 => {
                let h = blake3::hash(bytes_of(&img));
                self.image
                    .store_chunk(&cidx, img.as_slice())
                    .map_err(|e| Error::zarr(chunk_path(), e))?;
                h
            }
            ImageDtype::Float16 => {
                // Past float16's range a value would be stored as an infinity (and the reader
                // refuses those as damage): refuse the case here, saying why.
                if let Some(v) = img.iter().find(|v| v.abs() > half::f16::MAX.to_f32()) {
                    return Err(Error::Dataset(format!(
                        "case {}: image value {v} is beyond float16's range (65504): build it with --image-dtype float32 (or --layout raw), or normalize the intensities",
                        self.input.case_id
                    )));
                }
                let half: Vec<half::f16> = img.iter().map(|&v| half::f16::from_f32(v)).collect();
                let h = blake3::hash(bytes_of(&half));
                self.image
                    .store_chunk(&cidx, half.as_slice())
                    .map_err(|e| Error::zarr(chunk_path(), e))?;
                h
            }
        };
        lock(&self.image_sums).insert(cname, short_hex(&hash));
        Ok(())
    }

    /// The label in block `b`, and its foreground into the index.
    fn label_block(
        &self,
        b: &Block,
        arr: &zarrs::array::Array<EntryStore>,
        (label, dtype): (&dyn VoxelRead, Dtype),
        idx: &[u64],
        name: String,
    ) -> Result<()> {
        let mut local = lock(&self.fg).child();
        let mut labf = vec![0.0f32; b.len()];
        self.nearest.fill_from(label, *b, &mut labf)?;
        let at = |e| Error::zarr(self.dir.join(LABEL_ARRAY), e);
        // Values were checked to be whole numbers that fit the label's type.
        let hash = match dtype {
            Dtype::Uint8 => {
                let lab: Vec<u8> = labf.iter().map(|&v| v as u8).collect();
                local.observe(*b, &lab);
                let lab = pad_block(lab, b.size, self.write_block, 0u8);
                arr.store_chunk(idx, lab.as_slice()).map_err(at)?;
                blake3::hash(&lab)
            }
            _ => {
                let lab: Vec<u16> = labf.iter().map(|&v| v as u16).collect();
                local.observe(*b, &lab);
                let lab = pad_block(lab, b.size, self.write_block, 0u16);
                arr.store_chunk(idx, lab.as_slice()).map_err(at)?;
                blake3::hash(bytes_of(&lab))
            }
        };
        lock(&self.label_sums).insert(name, short_hex(&hash));
        lock(&self.fg).merge(local);
        Ok(())
    }
}

/// Write the foreground index's rows (class, z, y, x) as the `fg` array.
fn write_fg(store: &Arc<EntryStore>, dir: &Path, rows: &[u32]) -> Result<()> {
    let n_rows = rows.len() / 4;
    let store_fg = |e: crate::error::BoxError| Error::zarr(dir.join(FG_ARRAY), e);
    let mut b = ArrayBuilder::new(
        vec![n_rows as u64, 4],
        vec![n_rows as u64, 4],
        Dtype::Uint32.zarrs(),
        Dtype::Uint32.zero_fill(),
    );
    b.dimension_names(Some(["sample", "class_z_y_x"]));
    let arr = b
        .build(store.clone(), &format!("/{FG_ARRAY}"))
        .map_err(|e| store_fg(e.into()))?;
    arr.store_metadata().map_err(|e| store_fg(e.into()))?;
    arr.store_chunk(&[0, 0], rows)
        .map_err(|e| store_fg(e.into()))
}

/// Write the entry's arrays and metadata into `store` (a fresh temporary folder `dir`). Nothing
/// is synced here: the caller makes it durable (`EntryStore::sync_all`) before the commit.
pub(super) fn write_entry(
    store: &Arc<EntryStore>,
    dir: &Path,
    input: EntryInput,
    on_voxels: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let params = input.params;
    let out_shape = input.out_shape_zyx;
    let layout = params.layout_for(out_shape);
    let array = |spec: ArraySpec| build_array(store, dir, params, &layout, out_shape, spec);
    let channels = input.images.len();
    if channels == 0 || channels != params.channels.len() {
        return Err(Error::Config(format!(
            "{}: {channels} image channels given for {} channel parameters",
            input.case_id,
            params.channels.len()
        )));
    }
    let label_dtype = input.label.map(|l| l.1);
    let write_block = layout.write_block_zyx();
    let writer = BlockWriter {
        input: &input,
        dir,
        write_block,
        image: array(ArraySpec {
            name: IMAGE_ARRAY,
            dtype: params.image_dtype.dtype(),
            channels: Some(channels),
        })?,
        label: match label_dtype {
            None => None,
            Some(dtype) => Some(array(ArraySpec {
                name: LABEL_ARRAY,
                dtype,
                channels: None,
            })?),
        },
        norm_mask: match (label_dtype, input.norm_mask) {
            (Some(_), Some(_)) => Some(array(ArraySpec {
                name: NORM_MASK_ARRAY,
                dtype: Dtype::Uint8,
                channels: None,
            })?),
            _ => None,
        },
        linear: LinearResampler::new(input.in_shape_zyx, out_shape),
        nearest: NearestResampler::new(input.in_shape_zyx, out_shape),
        fg: Mutex::new(FgAccumulator::new(
            params.fg_samples,
            params.seed,
            out_shape,
        )),
        image_sums: Default::default(),
        label_sums: Default::default(),
        mask_sums: Default::default(),
    };
    blocks(out_shape, write_block)
        .par_iter()
        .try_for_each(|b| -> Result<()> {
            writer.block(b)?;
            on_voxels(b.len() as u64);
            Ok(())
        })?;
    let BlockWriter {
        fg,
        image_sums,
        label_sums,
        mask_sums,
        norm_mask,
        ..
    } = writer;

    let fg = fg.into_inner().unwrap_or_else(|p| p.into_inner()).finish();
    let (rows, ranges) = fg.rows();
    let n_rows = rows.len() / 4;
    if n_rows > 0 {
        write_fg(store, dir, &rows)?;
    }

    // The label is complete: the arrays derived from it are read back from it.
    let derived = match label_dtype {
        Some(dtype) if params.derived.any() => {
            Some(derived::write_derived(derived::DerivedInput {
                store,
                dir,
                params,
                layout: &layout,
                shape_zyx: out_shape,
                spacing_zyx: {
                    let s = input.output.spacing_xyz;
                    [s[2], s[1], s[0]]
                },
                unit: &input.input.unit,
                label_dtype: dtype,
                classes: fg.classes.iter().map(|(&c, s)| (c, s.voxels)).collect(),
            })?)
        }
        _ => None,
    };
    let (mut derived_info, distance_sums, skeleton_sums) = match derived {
        Some(d) => (d.info, d.distance_sums, d.skeleton_sums),
        None => Default::default(),
    };
    if let (Some(_), Some((_, channels))) = (&norm_mask, input.norm_mask) {
        derived_info.norm_mask = Some(NormMaskInfo {
            array: NORM_MASK_ARRAY.to_string(),
            channels: channels.to_vec(),
        });
    }
    let checksums = ChunkChecksums {
        image: image_sums.into_inner().unwrap_or_else(|p| p.into_inner()),
        label: label_sums.into_inner().unwrap_or_else(|p| p.into_inner()),
        distance: distance_sums,
        skeleton: skeleton_sums,
        norm_mask: mask_sums.into_inner().unwrap_or_else(|p| p.into_inner()),
        ..ChunkChecksums::new(write_block)
    };

    let attrs = EntryAttrs {
        format_version: FORMAT_VERSION,
        case_id: input.case_id.to_string(),
        key: input.key.to_string(),
        created_by: format!("voxcache {}", env!("CARGO_PKG_VERSION")),
        source: input.source,
        input: input.input,
        output: input.output,
        params: params.clone(),
        layout,
        intensity: input.intensity,
        normalization: input.normalization,
        label: label_dtype.map(|dtype| LabelInfo {
            dtype,
            classes: fg.classes.clone(),
        }),
        fg_index: FgIndexInfo {
            array: (n_rows > 0).then(|| FG_ARRAY.to_string()),
            columns: ["class", "z", "y", "x"].map(String::from),
            rows_per_class: ranges
                .iter()
                .map(|(c, r)| {
                    let range = RowRange {
                        start: r[0] as u64,
                        count: r[1] as u64,
                    };
                    (*c, range)
                })
                .collect(),
        },
        derived: derived_info,
        chunk_checksums: checksums,
    };
    let group = GroupBuilder::new()
        .attributes(attrs.to_group_attributes()?)
        .build(store.clone(), "/")
        .map_err(|e| Error::zarr(dir, e))?;
    // The group's zarr.json is written last: an entry without it is never treated as complete.
    group.store_metadata().map_err(|e| Error::zarr(dir, e))?;
    Ok(())
}
