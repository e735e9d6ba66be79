//! Opening one cache entry: its group attributes, its checksums, and one [`ArrayReader`] per
//! array (and image channel), each checked against what the entry records before any read.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::array::{ArrayReader, Recorded};
use super::{ChunkCache, EntryInner, EntryReader, FgRange, ReaderOptions, StoredDtype};
use crate::error::{Error, Result};
use crate::format::{
    EntryAttrs, DISTANCE_ARRAY, IMAGE_ARRAY, LABEL_ARRAY, NORM_MASK_ARRAY, SKELETON_ARRAY,
    ZARR_JSON,
};

/// Each entry opened gets its own serial: it keys the entry's chunks in the shared caches.
static NEXT_ENTRY: AtomicU64 = AtomicU64::new(0);

impl EntryReader {
    /// Open one entry folder (`CACHE/entries/ab/KEY`) with its own [`ChunkCache`].
    pub fn open(entry_dir: impl AsRef<Path>) -> Result<EntryReader> {
        Self::open_with(entry_dir, &ChunkCache::new(ReaderOptions::default()))
    }

    /// Open one entry folder, sharing `cache` with other entries.
    pub fn open_with(entry_dir: impl AsRef<Path>, cache: &ChunkCache) -> Result<EntryReader> {
        let dir = entry_dir.as_ref().to_path_buf();
        let meta_path = dir.join(ZARR_JSON);
        let bytes = read_meta(&dir, &meta_path)?;
        let attrs = EntryAttrs::from_group_json(&meta_path, &bytes)?;
        let o = Opening {
            dir: &dir,
            meta_path: &meta_path,
            attrs: &attrs,
            opts: cache.options(),
        };
        // Ids: the label 0, image channels 1.., then derived arrays (they key the shared chunk
        // caches).
        let image = o.image()?;
        let label = o.label()?;
        // Ids after the image channels: the distance channels, then the skeleton.
        let mut next_id = 1 + attrs.channels() as u16;
        let (distance, distance_classes) = o.distance(&mut next_id)?;
        let skeleton = o.skeleton(next_id, label.as_ref())?;
        let norm_mask = o.norm_mask(next_id + 1, label.as_ref())?;
        let fg_ranges = o.fg_ranges()?;
        Ok(EntryReader {
            inner: Arc::new(EntryInner {
                serial: NEXT_ENTRY.fetch_add(1, Ordering::Relaxed),
                case_id: Some(attrs.case_id.clone()),
                sources: attrs.source.clone(),
                unit: attrs.input.unit.clone(),
                spacing: {
                    let s = attrs.output.spacing_xyz;
                    [s[2], s[1], s[0]]
                },
                key: attrs.key.clone(),
                dir,
                shape: attrs.output.shape_zyx,
                normalization: attrs.normalization.clone(),
                image,
                label,
                distance,
                distance_classes,
                has_distance: attrs.derived.distance.is_some(),
                skeleton,
                norm_mask_channels: match &norm_mask {
                    Some(_) => attrs
                        .derived
                        .norm_mask
                        .as_ref()
                        .map(|m| m.channels.clone())
                        .unwrap_or_default(),
                    None => Vec::new(),
                },
                norm_mask,
                fg_array: attrs.fg_index.array.clone(),
                fg_ranges,
                fg_rows: OnceLock::new(),
                cache: cache.clone(),
            }),
        })
    }
}

/// The entry's group metadata (`meta_path` in `dir`), or an error that tells a folder that
/// is no entry from one that is not there.
fn read_meta(dir: &Path, meta_path: &Path) -> Result<Vec<u8>> {
    match crate::util::files::read_capped_unlinked(meta_path, 64 << 20) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let what = if dir.is_dir() {
                format!(
                    "not a cache entry: no {ZARR_JSON} (an unfinished build, or not voxcache's)"
                )
            } else {
                "cache entry not found".to_string()
            };
            Err(Error::cache(dir, what))
        }
        Err(e) => Err(Error::io(meta_path, e)),
    }
}

/// What opening one entry's arrays shares: its folder, and what its metadata records.
struct Opening<'a> {
    dir: &'a Path,
    meta_path: &'a Path,
    attrs: &'a EntryAttrs,
    opts: &'a ReaderOptions,
}

impl Opening<'_> {
    /// An error in the entry's metadata, or in an array against it.
    fn bad(&self, msg: String) -> Error {
        Error::cache(self.meta_path, msg)
    }

    /// The arrays are laid out as the entry records (a rewritten chunk shape would read
    /// other blocks than the checksums cover).
    fn laid_out(&self, name: &str, r: &ArrayReader) -> Result<()> {
        let layout = &self.attrs.layout;
        let want = (
            layout.shard_zyx.unwrap_or(layout.chunk_zyx),
            layout.chunk_zyx,
        );
        if r.block_and_chunk() == want {
            return Ok(());
        }
        Err(self.bad(format!(
            "array {name:?} has blocks and chunks {:?}, the entry's layout records {want:?}",
            r.block_and_chunk()
        )))
    }

    /// The image channels, ids 1.. (float32 or float16).
    fn image(&self) -> Result<Vec<ArrayReader>> {
        let shape = self.attrs.output.shape_zyx;
        let channels = Some(self.attrs.channels());
        let mut image =
            ArrayReader::open_channels(self.dir, IMAGE_ARRAY, 1, shape, channels, self.opts)?;
        // What the build recorded per block: a chunk that differs or is missing is refused.
        let sums = &self.attrs.chunk_checksums;
        for ch in &mut image {
            let r = Recorded::new(sums, IMAGE_ARRAY, ch.channel, ch.block_bytes());
            ch.set_recorded(r);
        }
        if !matches!(image[0].dtype, StoredDtype::Float32 | StoredDtype::Float16) {
            return Err(self.bad(format!(
                "image data type {} (expected float32 or float16)",
                image[0].dtype.name()
            )));
        }
        self.laid_out(IMAGE_ARRAY, &image[0])?;
        Ok(image)
    }

    /// The label, id 0, when the entry has one (uint8 or uint16, as recorded).
    fn label(&self) -> Result<Option<ArrayReader>> {
        let Some(info) = &self.attrs.label else {
            return Ok(None);
        };
        let shape = self.attrs.output.shape_zyx;
        let mut l =
            ArrayReader::open_channels(self.dir, LABEL_ARRAY, 0, shape, None, self.opts)?.remove(0);
        self.laid_out(LABEL_ARRAY, &l)?;
        let sums = &self.attrs.chunk_checksums;
        l.set_recorded(Recorded::new(sums, LABEL_ARRAY, None, l.block_bytes()));
        if !matches!(l.dtype, StoredDtype::Uint8 | StoredDtype::Uint16) || l.dtype != info.dtype {
            return Err(self.bad(format!(
                "label data type {} (the entry records {}; expected uint8 or uint16)",
                l.dtype.name(),
                info.dtype
            )));
        }
        Ok(Some(l))
    }

    /// The distance channels (float32) and their classes, ids from `next_id` on (moved past
    /// them); none when the entry has no distance classes.
    fn distance(&self, next_id: &mut u16) -> Result<(Vec<ArrayReader>, Vec<u16>)> {
        let d = match &self.attrs.derived.distance {
            Some(d) if !d.classes.is_empty() => d,
            _ => return Ok((Vec::new(), Vec::new())),
        };
        let mut v = ArrayReader::open_channels(
            self.dir,
            DISTANCE_ARRAY,
            *next_id,
            self.attrs.output.shape_zyx,
            Some(d.classes.len()),
            self.opts,
        )?;
        *next_id += d.classes.len() as u16;
        let sums = &self.attrs.chunk_checksums;
        for ch in &mut v {
            let r = Recorded::new(sums, DISTANCE_ARRAY, ch.channel, ch.block_bytes());
            ch.set_recorded(r);
            if ch.dtype != StoredDtype::Float32 {
                return Err(self.bad(format!(
                    "distance data type {} (expected float32)",
                    ch.dtype.name()
                )));
            }
        }
        Ok((v, d.classes.clone()))
    }

    /// The skeleton, id `id`, when the entry has one and a `label` (whose data type it has).
    fn skeleton(&self, id: u16, label: Option<&ArrayReader>) -> Result<Option<ArrayReader>> {
        let (Some(_), Some(l)) = (&self.attrs.derived.skeleton, label) else {
            return Ok(None);
        };
        let shape = self.attrs.output.shape_zyx;
        let mut s =
            ArrayReader::open_channels(self.dir, SKELETON_ARRAY, id, shape, None, self.opts)?
                .remove(0);
        let sums = &self.attrs.chunk_checksums;
        s.set_recorded(Recorded::new(sums, SKELETON_ARRAY, None, s.block_bytes()));
        if s.dtype != l.dtype {
            return Err(self.bad(format!(
                "skeleton data type {} differs from the label's {}",
                s.dtype.name(),
                l.dtype.name()
            )));
        }
        Ok(Some(s))
    }

    /// nnU-Net's normalization mask, id `id`, when the entry has one (and a `label`).
    fn norm_mask(&self, id: u16, label: Option<&ArrayReader>) -> Result<Option<ArrayReader>> {
        let (Some(_), Some(_)) = (&self.attrs.derived.norm_mask, label) else {
            return Ok(None);
        };
        let shape = self.attrs.output.shape_zyx;
        let mut m =
            ArrayReader::open_channels(self.dir, NORM_MASK_ARRAY, id, shape, None, self.opts)?
                .remove(0);
        let sums = &self.attrs.chunk_checksums;
        m.set_recorded(Recorded::new(sums, NORM_MASK_ARRAY, None, m.block_bytes()));
        if m.dtype != crate::format::Dtype::Uint8 {
            return Err(self.bad(format!(
                "normalization mask data type {} (expected uint8)",
                m.dtype.name()
            )));
        }
        Ok(Some(m))
    }

    /// The foreground index's rows per class, as in-memory positions.
    fn fg_ranges(&self) -> Result<BTreeMap<u16, FgRange>> {
        let mut fg_ranges = BTreeMap::new();
        for (&c, r) in &self.attrs.fg_index.rows_per_class {
            let field = |v: u64, f: &str| {
                usize::try_from(v)
                    .map_err(|_| self.bad(format!("fg_index: class {c} {f} {v} is too large")))
            };
            fg_ranges.insert(
                c,
                FgRange {
                    start: field(r.start, "start")?,
                    count: field(r.count, "count")?,
                },
            );
        }
        Ok(fg_ranges)
    }
}
