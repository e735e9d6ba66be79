//! Reading training patches out of a cache: the trainer's data path.
//!
//! ```no_run
//! use voxcache::cache::reader::CacheReader;
//! # fn main() -> voxcache::Result<()> {
//! let cache = CacheReader::open("cache")?;
//! let entry = cache.open_entry("vessels", "vessels_000")?;
//! let (size, n) = ([32, 64, 64], 32 * 64 * 64);
//! let (mut image, mut label) = (vec![0.0f32; n], vec![0u16; n]);
//! // Boxes may stick out of the volume (negative start, past the end): that part reads as 0.
//! entry.read_patch([-4, 10, 10], size, &mut image, Some(&mut label))?;
//! let centres = entry.fg_coords(1)?;
//! # Ok(()) }
//! ```
//!
//! Uncompressed chunks (plain chunk files, and shards of uncompressed inner chunks) are
//! memory-mapped, each file once, and patch rows are copied straight out of the mapping: no
//! system call per row or per patch once a file is mapped, and no allocation per patch.
//! Compressed chunks are decoded by zarrs (`retrieve_chunk`, or one inner chunk of a shard)
//! into a cache of decoded chunks bounded by bytes, and rows are copied out the same way.
//!
//! Both caches live in a [`ChunkCache`] shared by every entry opened through one
//! [`CacheReader`], so the bounds hold for a whole training run, not per case. Maps are bounded
//! by count, not bytes: a map costs address space and one kernel mapping (`vm.max_map_count`,
//! 65530 by default, is the real limit when thousands of cases are open), while its resident
//! pages are clean page cache the kernel reclaims under pressure. Entry chunk counts are small
//! (tens to thousands), so the default of 4096 maps keeps every file of several typical entries
//! mapped and only evicts on very large datasets.
//!
//! [`EntryReader`] and [`CacheReader`] are `Send + Sync` and cheap to clone (an `Arc`): loader
//! threads share one reader; the caches take a short lock per chunk touched, never while
//! copying.

mod array;
mod cache_reader;
mod chunk_cache;
mod lru;
mod sample;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use zarrs::array::{Array, ArraySubset};

use self::array::{ravel, ArrayReader, Held, Recorded};
pub use self::cache_reader::{CacheReader, CaseInfo};
pub use self::chunk_cache::{ChunkCache, ChunkCacheStats, ReaderOptions};
pub use self::sample::{Sample, StoredDtype};
use crate::error::{Error, Result};
use crate::format::{
    ChunkChecksums, EntryAttrs, DISTANCE_ARRAY, IMAGE_ARRAY, LABEL_ARRAY, SKELETON_ARRAY,
};

/// Rows ahead of the copy whose source is prefetched: rows are short (a patch's width) and
/// 4 KiB pages apart every few rows, which hardware prefetchers do not cross. Far enough
/// ahead to cover a fetch from memory: plain 32x96x96 crops of a case larger than the cache
/// +26% against 4 rows (16: +22%, 64: no better, 128: worse; 16x128x128 alike).
const PREFETCH_ROWS: usize = 32;

/// Hint the CPU to fetch `bytes[at..at + len]` into cache; never faults.
#[inline(always)]
fn prefetch(bytes: &[u8], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(p) = bytes.get(at..at + len).filter(|p| !p.is_empty()) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // Every cache line the bytes touch: from the first byte's line to the last byte's (a
        // step of 64 from the first byte missed the last line of a part that starts within
        // a line).
        let skew = p.as_ptr() as usize & 63;
        let first = p.as_ptr().wrapping_sub(skew);
        for k in 0..(skew + len).div_ceil(64) {
            // SAFETY: a prefetch is only a hint, and never faults nor writes; the lines hold
            // bytes of `bytes` (the first and last may reach past them, inside their lines).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(64 * k).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (bytes, at, len);
}

/// Which part of each box row a read copies: the whole row, or its span (a type each, so
/// that the whole-row reads compile to what they were without spans).
trait Spans: Copy {
    /// The number of spans (`None`: every row is whole).
    fn rows(self) -> Option<usize>;
    /// Whether the spans differ from plane to plane.
    fn per_plane(self) -> bool;
    /// The part of volume row `(z, y)`'s piece `x0..x1` to read, for a box from `start`.
    fn piece(self, start: [i64; 3], z: usize, y: usize, x0: usize, x1: usize) -> (usize, usize);
    /// Box row `(z, y)`'s span in box coordinates, cut to the row's `width`.
    fn in_box(self, z: usize, y: usize, width: usize) -> (usize, usize);
}

#[derive(Clone, Copy)]
struct Whole;

impl Spans for Whole {
    #[inline(always)]
    fn rows(self) -> Option<usize> {
        None
    }
    #[inline(always)]
    fn per_plane(self) -> bool {
        false
    }
    #[inline(always)]
    fn piece(self, _: [i64; 3], _: usize, _: usize, x0: usize, x1: usize) -> (usize, usize) {
        (x0, x1)
    }
    #[inline(always)]
    fn in_box(self, _: usize, _: usize, width: usize) -> (usize, usize) {
        (0, width)
    }
}

/// Each box row's x range (box coordinates, start and end): one per row y, the same in every
/// plane, or one per row (z, y) of the box (`planes`, `ny` rows a plane).
#[derive(Clone, Copy)]
struct RowSpans<'a> {
    spans: &'a [(u32, u32)],
    ny: usize,
    planes: bool,
}

impl<'a> RowSpans<'a> {
    /// The spans of a box of `size`: per plane when there is one for each of its rows.
    fn new(spans: &'a [(u32, u32)], size: [usize; 3]) -> Self {
        RowSpans {
            spans,
            ny: size[1],
            planes: spans.len() != size[1],
        }
    }

    #[inline(always)]
    fn at(self, bz: usize, by: usize) -> (u32, u32) {
        self.spans[if self.planes { bz * self.ny + by } else { by }]
    }
}

impl Spans for RowSpans<'_> {
    #[inline(always)]
    fn rows(self) -> Option<usize> {
        Some(self.spans.len())
    }
    #[inline(always)]
    fn per_plane(self) -> bool {
        self.planes
    }
    #[inline(always)]
    fn piece(self, start: [i64; 3], z: usize, y: usize, x0: usize, x1: usize) -> (usize, usize) {
        let (s0, s1) = self.at(
            (z as i64 - start[0]) as usize,
            (y as i64 - start[1]) as usize,
        );
        let a = (start[2] + i64::from(s0)).clamp(x0 as i64, x1 as i64);
        let b = (start[2] + i64::from(s1)).clamp(a, x1 as i64);
        (a as usize, b as usize)
    }
    #[inline(always)]
    fn in_box(self, z: usize, y: usize, width: usize) -> (usize, usize) {
        let (s0, s1) = self.at(z, y);
        let b = (s1 as usize).min(width);
        ((s0 as usize).min(b), b)
    }
}

static NEXT_ENTRY: AtomicU64 = AtomicU64::new(0);

/// A foreground-index class range: rows `start..start + count` of the `fg` array.
#[derive(Clone, Copy, Debug)]
struct FgRange {
    start: usize,
    count: usize,
}

struct EntryInner {
    serial: u64,
    dir: PathBuf,
    case_id: Option<String>,
    key: String,
    /// The input's spatial unit ("mm", "um"...), which the output spacing is in.
    unit: String,
    /// Output spacing (z, y, x).
    spacing: [f64; 3],
    shape: [usize; 3],
    /// One reader per image channel (never empty).
    image: Vec<ArrayReader>,
    label: Option<ArrayReader>,
    /// Signed distance readers, one per class of `distance_classes`; empty when not built.
    distance: Vec<ArrayReader>,
    distance_classes: Vec<u16>,
    /// Whether the entry was built with a distance array at all.
    has_distance: bool,
    skeleton: Option<ArrayReader>,
    fg_array: Option<String>,
    fg_ranges: BTreeMap<u16, FgRange>,
    /// The `fg` array's rows (class, z, y, x), flat, read on first use.
    fg_rows: OnceLock<Vec<u32>>,
    cache: ChunkCache,
}

impl Drop for EntryInner {
    fn drop(&mut self) {
        self.cache.purge(self.serial);
    }
}

/// Reads patches and foreground coordinates of one cache entry. Clones share everything.
#[derive(Clone)]
pub struct EntryReader {
    inner: Arc<EntryInner>,
}

impl std::fmt::Debug for EntryReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryReader")
            .field("dir", &self.inner.dir)
            .field("shape_zyx", &self.inner.shape)
            .field("channels", &self.inner.image.len())
            .field("image", &self.inner.image[0].dtype)
            .field("label", &self.inner.label.as_ref().map(|l| l.dtype))
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl EntryReader {
    /// Open one entry folder (`CACHE/entries/ab/KEY`) with its own [`ChunkCache`].
    pub fn open(entry_dir: impl AsRef<Path>) -> Result<EntryReader> {
        Self::open_with(entry_dir, &ChunkCache::new(ReaderOptions::default()))
    }

    /// Open one entry folder, sharing `cache` with other entries.
    pub fn open_with(entry_dir: impl AsRef<Path>, cache: &ChunkCache) -> Result<EntryReader> {
        let dir = entry_dir.as_ref().to_path_buf();
        let meta_path = dir.join("zarr.json");
        let bytes = match std::fs::read(&meta_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::cache(
                    &dir,
                    if dir.is_dir() {
                        "not a cache entry: no zarr.json (an unfinished build, or not voxcache's)"
                    } else {
                        "cache entry not found"
                    },
                ));
            }
            Err(e) => return Err(Error::io(&meta_path, e)),
        };
        let attrs = EntryAttrs::from_group_json(&meta_path, &bytes)?;
        let bad = |msg: String| Error::cache(&meta_path, msg);
        let shape = attrs.output.shape_zyx;
        let mmap = cache.options().mmap;
        // What the build recorded per block: a chunk that differs or is missing is refused.
        let sums_path = dir.join(&attrs.chunk_checksums);
        let sums_bytes = std::fs::read(&sums_path).map_err(|e| Error::io(&sums_path, e))?;
        let sums = ChunkChecksums::from_json(&sums_path, &sums_bytes)?;
        // Ids: the label 0, image channels 1.., then derived arrays (they key the shared chunk
        // caches).
        let mut image =
            ArrayReader::open_channels(&dir, IMAGE_ARRAY, 1, shape, Some(attrs.channels()), mmap)?;
        for ch in &mut image {
            let r = Recorded::new(&sums, IMAGE_ARRAY, ch.channel, ch.block_bytes());
            ch.set_recorded(r);
        }
        if !matches!(image[0].dtype, StoredDtype::Float32 | StoredDtype::Float16) {
            return Err(bad(format!(
                "image data type {} (expected float32 or float16)",
                image[0].dtype.name()
            )));
        }
        let label = match &attrs.label {
            None => None,
            Some(info) => {
                let mut l =
                    ArrayReader::open_channels(&dir, LABEL_ARRAY, 0, shape, None, mmap)?.remove(0);
                l.set_recorded(Recorded::new(&sums, LABEL_ARRAY, None, l.block_bytes()));
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
                    mmap,
                )?;
                next_id += d.classes.len() as u16;
                for ch in &mut v {
                    let r = Recorded::new(&sums, DISTANCE_ARRAY, ch.channel, ch.block_bytes());
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
                    ArrayReader::open_channels(&dir, SKELETON_ARRAY, next_id, shape, None, mmap)?
                        .remove(0);
                s.set_recorded(Recorded::new(&sums, SKELETON_ARRAY, None, s.block_bytes()));
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
                unit: attrs.input.unit.clone(),
                spacing: {
                    let s = attrs.output.spacing_xyz;
                    [s[2], s[1], s[0]]
                },
                key: attrs.key.clone(),
                dir,
                shape,
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

    /// The entry folder.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The content key recorded in the entry.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The case id recorded in the entry.
    pub fn case_id(&self) -> Option<&str> {
        self.inner.case_id.as_deref()
    }

    /// The spatial unit of the entry's spacing ("mm", "um", "m", "unknown").
    pub fn unit(&self) -> &str {
        &self.inner.unit
    }

    /// Volume shape (z, y, x).
    pub fn shape_zyx(&self) -> [usize; 3] {
        self.inner.shape
    }

    /// The chunk (or inner chunk of a shard) shape the image is stored in.
    pub fn chunk_zyx(&self) -> [usize; 3] {
        self.inner.image[0].chunk
    }

    /// Image channels.
    pub fn channels(&self) -> usize {
        self.inner.image.len()
    }

    /// Element type of the stored image: float32 or float16.
    pub fn image_dtype(&self) -> StoredDtype {
        self.inner.image[0].dtype
    }

    /// `None` for an entry built without a label.
    pub fn label_dtype(&self) -> Option<StoredDtype> {
        self.inner.label.as_ref().map(|l| l.dtype)
    }

    /// Whether patches come straight from memory-mapped files (image and label).
    pub fn is_mapped(&self) -> bool {
        self.inner.image.iter().all(|c| c.is_mapped())
            && self.inner.label.as_ref().is_none_or(|l| l.is_mapped())
    }

    /// Copy the box `start_zyx .. start_zyx + size_zyx` into `out_image` (every channel, C
    /// order (c, z, y, x)) and `out_label` (z, y, x). Whatever lies outside the volume reads as
    /// 0; `start` may be negative and the box larger than the volume. float16 images are
    /// widened to f32.
    pub fn read_patch(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out_image: &mut [f32],
        out_label: Option<&mut [u16]>,
    ) -> Result<()> {
        self.read_image(start_zyx, size_zyx, out_image)?;
        if let Some(l) = out_label {
            self.read_label(start_zyx, size_zyx, l)?;
        }
        Ok(())
    }

    /// [`EntryReader::read_patch`] mirrored along each axis of `mirror` (z, y, x): the same
    /// voxels as reading and then mirroring, written where they belong in one pass.
    pub fn read_patch_mirrored(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        mirror: [bool; 3],
        out_image: &mut [f32],
        out_label: Option<&mut [u16]>,
    ) -> Result<()> {
        self.read_image_in(start_zyx, size_zyx, out_image, mirror, Whole)?;
        if let Some(l) = out_label {
            self.read_label_in(start_zyx, size_zyx, l, mirror)?;
        }
        Ok(())
    }

    /// The image part of [`EntryReader::read_patch`]: `out` holds every channel, one after
    /// the other.
    pub fn read_image<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        self.read_image_in(start_zyx, size_zyx, out, [false; 3], Whole)
    }

    /// [`EntryReader::read_image`] of only the x range `spans[y]` of each box row y, or
    /// `spans[z * size_zyx[1] + y]` of each row (z, y) (see
    /// [`crate::cache::PatchSource::read_spans`]).
    pub fn read_image_spans(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        spans: &[(u32, u32)],
        out: &mut [f32],
    ) -> Result<()> {
        self.read_image_in(
            start_zyx,
            size_zyx,
            out,
            [false; 3],
            RowSpans::new(spans, size_zyx),
        )
    }

    /// [`EntryReader::read_label`] of only the spans of [`EntryReader::read_image_spans`].
    pub fn read_label_spans<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        spans: &[(u32, u32)],
        out: &mut [T],
    ) -> Result<()> {
        let label = self
            .inner
            .label
            .as_ref()
            .ok_or_else(|| Error::cache(&self.inner.dir, "entry has no label"))?;
        self.read_region_in(
            label,
            start_zyx,
            size_zyx,
            out,
            [false; 3],
            RowSpans::new(spans, size_zyx),
        )
        .map(|_| ())
    }

    fn read_image_in<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
        mirror: [bool; 3],
        spans: impl Spans,
    ) -> Result<()> {
        let c = self.inner.image.len();
        if c == 1 {
            let arr = &self.inner.image[0];
            let finite = self.read_region_in(arr, start_zyx, size_zyx, out, mirror, spans)?;
            return self.finite_image(arr, start_zyx, size_zyx, finite);
        }
        if !out.len().is_multiple_of(c) {
            return Err(Error::Config(format!(
                "a patch of {c} channels needs a buffer of a multiple of {c} elements, not {}",
                out.len()
            )));
        }
        let n = out.len() / c;
        for (arr, part) in self.inner.image.iter().zip(out.chunks_exact_mut(n)) {
            let finite = self.read_region_in(arr, start_zyx, size_zyx, part, mirror, spans)?;
            self.finite_image(arr, start_zyx, size_zyx, finite)?;
        }
        Ok(())
    }

    /// The error for an image box that read a NaN or an infinity (`!finite`): the build
    /// refuses them and each block's hash is checked when it is first mapped, so one is damage
    /// since (a file changed in place under a running job), named here rather than as a
    /// non-finite loss later.
    fn finite_image(
        &self,
        arr: &ArrayReader,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        finite: bool,
    ) -> Result<()> {
        if finite {
            return Ok(());
        }
        Err(Error::cache(
            &self.inner.dir,
            format!(
                "{}: the box at {start_zyx:?} of size {size_zyx:?} holds a non-finite value: the cache is damaged (prep inspect --verify)",
                arr.name
            ),
        ))
    }

    /// One channel of the image box (z, y, x).
    pub fn read_channel<T: Sample>(
        &self,
        channel: usize,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        let arr = self.inner.image.get(channel).ok_or_else(|| {
            Error::Config(format!(
                "{}: no image channel {channel} (the entry has {})",
                self.inner.dir.display(),
                self.inner.image.len()
            ))
        })?;
        let finite = self.read_region_in(arr, start_zyx, size_zyx, out, [false; 3], Whole)?;
        self.finite_image(arr, start_zyx, size_zyx, finite)
    }

    /// The label part of [`EntryReader::read_patch`], into `u16`, or `u8` for uint8 labels.
    pub fn read_label<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        self.read_label_in(start_zyx, size_zyx, out, [false; 3])
    }

    fn read_label_in<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
        mirror: [bool; 3],
    ) -> Result<()> {
        let label = self
            .inner
            .label
            .as_ref()
            .ok_or_else(|| Error::cache(&self.inner.dir, "entry has no label"))?;
        self.read_region(label, start_zyx, size_zyx, out, mirror)
    }

    /// Output spacing (z, y, x) in [`EntryReader::unit`]s.
    pub fn spacing_zyx(&self) -> [f64; 3] {
        self.inner.spacing
    }

    /// Whether the entry holds signed distance maps (built with `--derived distance`).
    pub fn has_distance(&self) -> bool {
        self.inner.has_distance
    }

    /// Whether the entry holds the label's skeleton (built with `--derived skeleton`).
    pub fn has_skeleton(&self) -> bool {
        self.inner.skeleton.is_some()
    }

    /// The signed distance map of label value `class` over a box (negative inside, in the
    /// output spacing's unit); outside the volume, and for a class absent from the case, 0.
    pub fn read_distance(
        &self,
        class: u16,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [f32],
    ) -> Result<()> {
        self.read_distance_in(class, start_zyx, size_zyx, out, Whole)
    }

    /// [`EntryReader::read_distance`] of only the spans of [`EntryReader::read_image_spans`]
    /// (an absent class reads 0).
    pub fn read_distance_spans(
        &self,
        class: u16,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        spans: &[(u32, u32)],
        out: &mut [f32],
    ) -> Result<()> {
        self.read_distance_in(
            class,
            start_zyx,
            size_zyx,
            out,
            RowSpans::new(spans, size_zyx),
        )
    }

    fn read_distance_in(
        &self,
        class: u16,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [f32],
        spans: impl Spans,
    ) -> Result<()> {
        if !self.inner.has_distance {
            return Err(Error::cache(
                &self.inner.dir,
                "entry has no distance maps: build the cache with --derived distance",
            ));
        }
        match self.inner.distance_classes.iter().position(|&c| c == class) {
            Some(k) => self
                .read_region_in(
                    &self.inner.distance[k],
                    start_zyx,
                    size_zyx,
                    out,
                    [false; 3],
                    spans,
                )
                .map(|_| ()),
            None => {
                out.fill(0.0);
                Ok(())
            }
        }
    }

    /// The skeleton over a box: each skeleton voxel holds its class, 0 elsewhere and outside.
    pub fn read_skeleton<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        self.read_skeleton_in(start_zyx, size_zyx, out, Whole)
    }

    /// [`EntryReader::read_skeleton`] of only the spans of [`EntryReader::read_image_spans`].
    pub fn read_skeleton_spans<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        spans: &[(u32, u32)],
        out: &mut [T],
    ) -> Result<()> {
        self.read_skeleton_in(start_zyx, size_zyx, out, RowSpans::new(spans, size_zyx))
    }

    fn read_skeleton_in<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
        spans: impl Spans,
    ) -> Result<()> {
        let s = self.inner.skeleton.as_ref().ok_or_else(|| {
            Error::cache(
                &self.inner.dir,
                "entry has no skeleton: build the cache with --derived skeleton",
            )
        })?;
        self.read_region_in(s, start_zyx, size_zyx, out, [false; 3], spans)
            .map(|_| ())
    }

    /// The chunk `c` of `arr`, from the shared caches or freshly mapped / decoded.
    fn chunk(&self, arr: &ArrayReader, c: [usize; 3]) -> Result<Held> {
        let cache = &self.inner.cache;
        if arr.is_mapped() {
            let (b, inner) = arr.block_of(c);
            let key = (self.inner.serial, arr.id, ravel(b, arr.block_grid));
            let slot = cache.mapped(key, || Ok(arr.map_block(b)?.map(Arc::new)))?;
            Ok(match slot {
                None => Held::Fill,
                Some(m) => Held::Mapped(m, inner),
            })
        } else {
            let grid = [0, 1, 2].map(|a| arr.shape[a].div_ceil(arr.chunk[a]));
            let key = (self.inner.serial, arr.id, ravel(c, grid));
            let d = cache.decoded(key, || Ok(Arc::new(arr.decode_chunk(c)?)))?;
            Ok(Held::Decoded(d))
        }
    }

    /// The box `start .. start + size` of `arr` into `out`, 0 outside the volume, mirrored
    /// along each axis of `mirror` (as [`crate::geometry::mirror`] would after).
    fn read_region<T: Sample>(
        &self,
        arr: &ArrayReader,
        start: [i64; 3],
        size: [usize; 3],
        out: &mut [T],
        mirror: [bool; 3],
    ) -> Result<()> {
        self.read_region_in(arr, start, size, out, mirror, Whole)
            .map(|_| ())
    }

    /// [`EntryReader::read_region`], with `spans` of only the x range `spans[y]` (box
    /// coordinates, start and end) of each box row y in every plane: chunks and rows outside
    /// them are not read (nor brought into memory), and those voxels of `out` are left as
    /// they were. Where the box reaches outside the volume, its voxels there within the
    /// spans (all of them without spans) are zeroed. Tells whether every value read is finite
    /// ([`Sample::convert_row`]).
    fn read_region_in<T: Sample>(
        &self,
        arr: &ArrayReader,
        start: [i64; 3],
        size: [usize; 3],
        out: &mut [T],
        mirror: [bool; 3],
        spans: impl Spans,
    ) -> Result<bool> {
        if let Some(rows) = spans
            .rows()
            .filter(|&r| r != size[1] && Some(r) != size[0].checked_mul(size[1]))
        {
            return Err(Error::Config(format!(
                "{rows} row spans for a box of {} rows in each of {} planes",
                size[1], size[0]
            )));
        }
        if !T::accepts(arr.dtype) {
            return Err(Error::Config(format!(
                "{}: {} {} cannot be read into {} without loss",
                self.inner.dir.display(),
                arr.name,
                arr.dtype.name(),
                std::any::type_name::<T>()
            )));
        }
        let n = size[0]
            .checked_mul(size[1])
            .and_then(|v| v.checked_mul(size[2]));
        if n != Some(out.len()) {
            return Err(Error::Config(format!(
                "a {}x{}x{} patch needs {} elements but the buffer holds {}",
                size[0],
                size[1],
                size[2],
                n.map_or("too many".to_string(), |n| n.to_string()),
                out.len()
            )));
        }
        if out.is_empty() {
            return Ok(true);
        }
        // The part of the box inside the volume, lo..hi per axis.
        let (mut lo, mut hi) = ([0usize; 3], [0usize; 3]);
        let mut inside = true;
        for a in 0..3 {
            let (s, dim) = (start[a] as i128, arr.shape[a] as i128);
            let e = s + size[a] as i128;
            inside &= s >= 0 && e <= dim;
            lo[a] = s.clamp(0, dim) as usize;
            hi[a] = e.clamp(0, dim) as usize;
        }
        if !inside && mirror.iter().any(|&m| m) {
            out.fill(T::default());
        } else if !inside {
            // Zeros where the box lies outside the volume (the reads below write the rest,
            // and zero absent chunks): rows outside it whole, rows inside their ends past
            // it; with spans, only within them.
            let at = |a: usize, v: usize| start[a] + v as i64;
            let within = |a: usize, v: usize| (lo[a] as i64..hi[a] as i64).contains(&at(a, v));
            let x_lo = (lo[2] as i64 - start[2]).clamp(0, size[2] as i64) as usize;
            let x_hi = (hi[2] as i64 - start[2]).clamp(x_lo as i64, size[2] as i64) as usize;
            for (r, row) in out.chunks_exact_mut(size[2]).enumerate() {
                let (z, y) = (r / size[1], r % size[1]);
                let (a, b) = spans.in_box(z, y, size[2]);
                if !(within(0, z) && within(1, y)) {
                    row[a..b].fill(T::default());
                } else if a < b {
                    row[a..b.min(x_lo).max(a)].fill(T::default());
                    row[a.max(x_hi).min(b)..b].fill(T::default());
                }
            }
        }
        if (0..3).any(|a| lo[a] >= hi[a]) {
            return Ok(true);
        }
        // Position of voxel (z, y, x) in the output: lo - start >= 0 on every axis here.
        let off = [0, 1, 2].map(|a| (lo[a] as i128 - start[a] as i128) as usize);
        let es = arr.dtype.size();
        let c = arr.chunk;
        let mut grown = 0;
        let mut finite = true;
        for cz in lo[0] / c[0]..=(hi[0] - 1) / c[0] {
            let (z0, z1) = (lo[0].max(cz * c[0]), hi[0].min((cz + 1) * c[0]));
            for cy in lo[1] / c[1]..=(hi[1] - 1) / c[1] {
                let (y0, y1) = (lo[1].max(cy * c[1]), hi[1].min((cy + 1) * c[1]));
                for cx in lo[2] / c[2]..=(hi[2] - 1) / c[2] {
                    let (x0, x1) = (lo[2].max(cx * c[2]), hi[2].min((cx + 1) * c[2]));
                    let row = x1 - x0;
                    // The part of row (z, y)'s piece x0..x1 within its span.
                    let piece = |z: usize, y: usize| spans.piece(start, z, y, x0, x1);
                    // (Spans the same in every plane: the first plane's rows tell.)
                    let z_last = if spans.per_plane() { z1 } else { z0 + 1 };
                    if spans.rows().is_some()
                        && (z0..z_last).all(|z| (y0..y1).all(|y| piece(z, y).0 == piece(z, y).1))
                    {
                        continue;
                    }
                    let held = self.chunk(arr, [cz, cy, cx])?;
                    let nrows = (z1 - z0) * (y1 - y0);
                    // Output position of the row piece (z, y0, x0..x1): its first voxel, or
                    // with x mirrored the first of the reversed piece; the next y's row is
                    // `y_step` away.
                    let mirrored = |a: usize, o: usize| if mirror[a] { size[a] - 1 - o } else { o };
                    let x_at = if mirror[2] {
                        size[2] - (x0 - lo[2] + off[2]) - row
                    } else {
                        x0 - lo[2] + off[2]
                    };
                    let dst_at = |z: usize| {
                        (mirrored(0, z - lo[0] + off[0]) * size[1]
                            + mirrored(1, y0 - lo[1] + off[1]))
                            * size[2]
                            + x_at
                    };
                    let y_step = if mirror[1] {
                        (size[2] as isize).wrapping_neg()
                    } else {
                        size[2] as isize
                    };
                    match held.view(arr) {
                        None => {
                            // An absent chunk reads 0 (within the spans).
                            for z in z0..z1 {
                                let mut d = dst_at(z);
                                for y in y0..y1 {
                                    let (a, b) = piece(z, y);
                                    let to = d + if mirror[2] { x1 - b } else { a - x0 };
                                    out[to..to + (b - a)].fill(T::default());
                                    d = d.wrapping_add_signed(y_step);
                                }
                            }
                        }
                        Some((bytes, dims)) => {
                            let (sy, sz) = (dims[2] * es, dims[1] * dims[2] * es);
                            // Byte offset of row (z, y) in the chunk.
                            let src_at = |z: usize, y: usize| {
                                (z - cz * c[0]) * sz + (y - cy * c[1]) * sy + (x0 - cx * c[2]) * es
                            };
                            // The look-ahead row PREFETCH_ROWS ahead (z-major over z0..z1,
                            // y0..y1), stepped along without divisions; the rows before it
                            // first. (Written out twice: a closure here stayed a call per
                            // row.)
                            let (mut az, mut ay) = (z0, y0);
                            for _ in 0..PREFETCH_ROWS.min(nrows) {
                                let (a, b) = piece(az, ay);
                                prefetch(bytes, src_at(az, ay) + (a - x0) * es, (b - a) * es);
                                ay += 1;
                                if ay == y1 {
                                    (az, ay) = (az + 1, y0);
                                }
                            }
                            for z in z0..z1 {
                                let mut d = dst_at(z);
                                let mut s = src_at(z, y0);
                                // The bytes the plane's rows read span (rows of a plane are
                                // adjacent): what this read may bring into the resident set.
                                let (mut first, mut last) = (usize::MAX, 0);
                                for y in y0..y1 {
                                    if az < z1 {
                                        let (a, b) = piece(az, ay);
                                        let at = src_at(az, ay) + (a - x0) * es;
                                        prefetch(bytes, at, (b - a) * es);
                                        ay += 1;
                                        if ay == y1 {
                                            (az, ay) = (az + 1, y0);
                                        }
                                    }
                                    let (a, b) = piece(z, y);
                                    // (Rows outside the spans: no call at all.)
                                    if a < b {
                                        // Where the part goes: reversed pieces end where
                                        // the whole one would.
                                        let to = d + if mirror[2] { x1 - b } else { a - x0 };
                                        let dst = &mut out[to..to + (b - a)];
                                        let from = s + (a - x0) * es;
                                        first = first.min(from);
                                        last = from + (b - a) * es;
                                        let row = &bytes[from..from + (b - a) * es];
                                        finite &= if mirror[2] {
                                            T::convert_row_reversed(arr.dtype, row, dst)
                                        } else {
                                            T::convert_row(arr.dtype, row, dst)
                                        };
                                    }
                                    s += sy;
                                    d = d.wrapping_add_signed(y_step);
                                }
                                if let (Held::Mapped(block, _), true) = (&held, first < last) {
                                    grown += block.touch(&bytes[first..last]);
                                }
                            }
                        }
                    }
                    self.inner
                        .cache
                        .note_mapped_growth(std::mem::take(&mut grown));
                }
            }
        }
        Ok(finite)
    }

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
                .join(self.inner.fg_array.as_deref().unwrap_or("fg"))
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
                let store = super::store::open_readable(dir)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_are_shareable_between_threads() {
        fn send_sync<T: Send + Sync + Clone>() {}
        send_sync::<EntryReader>();
        send_sync::<CacheReader>();
        send_sync::<ChunkCache>();
    }
}
