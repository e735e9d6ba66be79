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
    EntryAttrs, DISTANCE_ARRAY, IMAGE_ARRAY, LABEL_ARRAY, SKELETON_ARRAY, ZARR_JSON,
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
        let bytes = match crate::util::files::read_capped_unlinked(&meta_path, 64 << 20) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::cache(
                    &dir,
                    if dir.is_dir() {
                        format!("not a cache entry: no {ZARR_JSON} (an unfinished build, or not voxcache's)")
                    } else {
                        "cache entry not found".to_string()
                    },
                ));
            }
            Err(e) => return Err(Error::io(&meta_path, e)),
        };
        let attrs = EntryAttrs::from_group_json(&meta_path, &bytes)?;
        let bad = |msg: String| Error::cache(&meta_path, msg);
        let shape = attrs.output.shape_zyx;
        let opts = cache.options();
        // What the build recorded per block: a chunk that differs or is missing is refused.
        let sums = &attrs.chunk_checksums;
        // Ids: the label 0, image channels 1.., then derived arrays (they key the shared chunk
        // caches).
        let mut image =
            ArrayReader::open_channels(&dir, IMAGE_ARRAY, 1, shape, Some(attrs.channels()), opts)?;
        for ch in &mut image {
            let r = Recorded::new(sums, IMAGE_ARRAY, ch.channel, ch.block_bytes());
            ch.set_recorded(r);
        }
        if !matches!(image[0].dtype, StoredDtype::Float32 | StoredDtype::Float16) {
            return Err(bad(format!(
                "image data type {} (expected float32 or float16)",
                image[0].dtype.name()
            )));
        }
        // The arrays are laid out as the entry records (a rewritten chunk shape would read
        // other blocks than the checksums cover).
        let want = (
            attrs.layout.shard_zyx.unwrap_or(attrs.layout.chunk_zyx),
            attrs.layout.chunk_zyx,
        );
        let laid_out = |name: &str, r: &super::array::ArrayReader| {
            if r.block_and_chunk() == want {
                return Ok(());
            }
            Err(bad(format!(
                "array {name:?} has blocks and chunks {:?}, the entry's layout records {want:?}",
                r.block_and_chunk()
            )))
        };
        laid_out(IMAGE_ARRAY, &image[0])?;
        let label = match &attrs.label {
            None => None,
            Some(info) => {
                let mut l =
                    ArrayReader::open_channels(&dir, LABEL_ARRAY, 0, shape, None, opts)?.remove(0);
                laid_out(LABEL_ARRAY, &l)?;
                l.set_recorded(Recorded::new(sums, LABEL_ARRAY, None, l.block_bytes()));
                if !matches!(l.dtype, StoredDtype::Uint8 | StoredDtype::Uint16)
                    || l.dtype != info.dtype
                {
                    return Err(bad(format!(
                        "label data type {} (the entry records {}; expected uint8 or uint16)",
                        l.dtype.name(),
                        info.dtype
                    )));
                }
                Some(l)
            }
        };
        // Ids after the image channels: the distance channels, then the skeleton.
        let mut next_id = 1 + attrs.channels() as u16;
        let (distance, distance_classes) = match &attrs.derived.distance {
            Some(d) if !d.classes.is_empty() => {
                let mut v = ArrayReader::open_channels(
                    &dir,
                    DISTANCE_ARRAY,
                    next_id,
                    shape,
                    Some(d.classes.len()),
                    opts,
                )?;
                next_id += d.classes.len() as u16;
                for ch in &mut v {
                    let r = Recorded::new(sums, DISTANCE_ARRAY, ch.channel, ch.block_bytes());
                    ch.set_recorded(r);
                    if ch.dtype != StoredDtype::Float32 {
                        return Err(bad(format!(
                            "distance data type {} (expected float32)",
                            ch.dtype.name()
                        )));
                    }
                }
                (v, d.classes.clone())
            }
            _ => (Vec::new(), Vec::new()),
        };
        let skeleton = match (&attrs.derived.skeleton, &label) {
            (Some(_), Some(l)) => {
                let mut s =
                    ArrayReader::open_channels(&dir, SKELETON_ARRAY, next_id, shape, None, opts)?
                        .remove(0);
                s.set_recorded(Recorded::new(sums, SKELETON_ARRAY, None, s.block_bytes()));
                if s.dtype != l.dtype {
                    return Err(bad(format!(
                        "skeleton data type {} differs from the label's {}",
                        s.dtype.name(),
                        l.dtype.name()
                    )));
                }
                Some(s)
            }
            _ => None,
        };
        let fg_array = attrs.fg_index.array.clone();
        let mut fg_ranges = BTreeMap::new();
        for (&c, r) in &attrs.fg_index.rows_per_class {
            let field = |v: u64, f: &str| {
                usize::try_from(v)
                    .map_err(|_| bad(format!("fg_index: class {c} {f} {v} is too large")))
            };
            fg_ranges.insert(
                c,
                FgRange {
                    start: field(r.start, "start")?,
                    count: field(r.count, "count")?,
                },
            );
        }
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
                shape,
                normalization: attrs.normalization.clone(),
                image,
                label,
                distance,
                distance_classes,
                has_distance: attrs.derived.distance.is_some(),
                skeleton,
                fg_array,
                fg_ranges,
                fg_rows: OnceLock::new(),
                cache: cache.clone(),
            }),
        })
    }
}
