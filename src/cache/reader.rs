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
mod copy;
mod fg;
mod lru;
mod open;
mod read;
mod sample;
mod spans;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use self::array::ArrayReader;
pub use self::cache_reader::{CacheReader, CaseInfo};
pub use self::chunk_cache::{ChunkCache, ChunkCacheStats, ReaderOptions};
use self::fg::FgRange;
pub use self::read::{ArrayKind, Region, NO_MIRROR};
pub use self::sample::{Sample, StoredDtype};
use crate::error::Result;

struct EntryInner {
    serial: u64,
    dir: PathBuf,
    case_id: Option<String>,
    /// The input files the entry was built from (names, sizes, hashes).
    sources: crate::format::entry::Sources,
    key: String,
    /// The input's spatial unit ("mm", "um"...), which the output spacing is in.
    unit: String,
    /// Output spacing (z, y, x).
    spacing: [f64; 3],
    shape: [usize; 3],
    /// The normalization each image channel got (what a raw zero became).
    normalization: Vec<crate::format::AppliedNormalization>,
    /// One reader per image channel (never empty).
    image: Vec<ArrayReader>,
    label: Option<ArrayReader>,
    /// Signed distance readers, one per class of `distance_classes`; empty when not built.
    distance: Vec<ArrayReader>,
    distance_classes: Vec<u16>,
    /// Whether the entry was built with a distance array at all.
    has_distance: bool,
    skeleton: Option<ArrayReader>,
    /// nnU-Net's normalization mask and the channels masked by it (empty without one).
    norm_mask: Option<ArrayReader>,
    norm_mask_channels: Vec<u16>,
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
    /// The input files the entry was built from (names, sizes, hashes).
    pub fn sources(&self) -> &crate::format::entry::Sources {
        &self.inner.sources
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

    /// The normalization each image channel got before resampling, in channel order.
    pub fn normalization(&self) -> &[crate::format::AppliedNormalization] {
        &self.inner.normalization
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

    /// The label values whose signed distance maps the entry holds (empty without them).
    pub fn distance_classes(&self) -> &[u16] {
        &self.inner.distance_classes
    }

    /// nnU-Net's normalization mask over a box: 1 inside, 0 outside it and outside the volume
    /// ([`ArrayKind::NormMask`]); an error when the entry has none.
    pub fn read_norm_mask<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        let region = Region::new(start_zyx, size_zyx);
        self.read(ArrayKind::NormMask, region, NO_MIRROR, out)
    }

    /// The image channels nnU-Net's training zeroes outside the entry's normalization mask
    /// (empty when the entry has none).
    pub fn norm_mask_channels(&self) -> &[u16] {
        &self.inner.norm_mask_channels
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
        self.read_patch_mirrored(start_zyx, size_zyx, NO_MIRROR, out_image, out_label)
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
        let region = Region::new(start_zyx, size_zyx);
        self.read(ArrayKind::Image, region, mirror, out_image)?;
        if let Some(l) = out_label {
            self.read(ArrayKind::Label, region, mirror, l)?;
        }
        Ok(())
    }

    /// The image part of [`EntryReader::read_patch`]: `out` holds every channel, one after
    /// the other ([`ArrayKind::Image`]).
    pub fn read_image<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        let region = Region::new(start_zyx, size_zyx);
        self.read(ArrayKind::Image, region, NO_MIRROR, out)
    }

    /// One channel of the image box (z, y, x) ([`ArrayKind::Channel`]).
    pub fn read_channel<T: Sample>(
        &self,
        channel: usize,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        let region = Region::new(start_zyx, size_zyx);
        self.read(ArrayKind::Channel(channel), region, NO_MIRROR, out)
    }

    /// The label part of [`EntryReader::read_patch`], into `u16`, or `u8` for uint8 labels
    /// ([`ArrayKind::Label`]).
    pub fn read_label<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        let region = Region::new(start_zyx, size_zyx);
        self.read(ArrayKind::Label, region, NO_MIRROR, out)
    }

    /// The signed distance map of label value `class` over a box (negative inside, in the
    /// output spacing's unit); outside the volume, and for a class absent from the case, 0
    /// ([`ArrayKind::Distance`]).
    pub fn read_distance(
        &self,
        class: u16,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [f32],
    ) -> Result<()> {
        let region = Region::new(start_zyx, size_zyx);
        self.read(ArrayKind::Distance(class), region, NO_MIRROR, out)
    }

    /// The skeleton over a box: each skeleton voxel holds its class, 0 elsewhere and outside
    /// ([`ArrayKind::Skeleton`]).
    pub fn read_skeleton<T: Sample>(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        out: &mut [T],
    ) -> Result<()> {
        let region = Region::new(start_zyx, size_zyx);
        self.read(ArrayKind::Skeleton, region, NO_MIRROR, out)
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
