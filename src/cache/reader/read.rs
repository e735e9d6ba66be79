//! The one read path of an entry: [`EntryReader::read`] of any of its arrays
//! ([`ArrayKind`]) over a box ([`Region`], whole rows or row spans), mirrored or not. The
//! named reads (`read_image`, `read_label`, `read_patch`...) and the
//! [`crate::cache::PatchSource`] implementation are one line each over it.

use super::array::ArrayReader;
use super::sample::Sample;
use super::spans::{RowSpans, Spans, Whole};
use super::EntryReader;
use crate::error::{Error, Result};

/// Which array of an entry a read fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayKind {
    /// The image, every channel: `out` holds one box per channel, one after the other
    /// (C order (c, z, y, x)).
    Image,
    /// One channel of the image (z, y, x).
    Channel(usize),
    /// The label; an error when the entry has none.
    Label,
    /// The signed distance map of a label value (negative inside, in the output spacing's
    /// unit); 0 for a value the case does not hold; an error when the entry has no distance
    /// maps.
    Distance(u16),
    /// The label's skeleton (each skeleton voxel holds its class, 0 elsewhere); an error when
    /// the entry has none.
    Skeleton,
    /// nnU-Net's normalization mask (1 inside, 0 outside and beyond the volume); an error when
    /// the entry has none.
    NormMask,
}

/// The box a read covers, `start .. start + size` (z, y, x), and which part of its rows.
/// Whatever lies outside the volume reads as 0: `start` may be negative and the box larger
/// than the volume.
#[derive(Clone, Copy, Debug)]
pub struct Region<'a> {
    /// First voxel of the box (z, y, x).
    pub start: [i64; 3],
    /// Box size (z, y, x).
    pub size: [usize; 3],
    /// `None`: whole rows. Otherwise only the x range `spans[y]` (box coordinates, start and
    /// end) of each box row y, the same in every plane, or with one span for each row of the
    /// box, row (z, y)'s `spans[z * size[1] + y]`; the rest of the box is left as it was in
    /// `out` (see [`crate::cache::PatchSource::read_spans`]).
    pub spans: Option<&'a [(u32, u32)]>,
}

impl<'a> Region<'a> {
    /// The whole box `start .. start + size`.
    pub fn new(start: [i64; 3], size: [usize; 3]) -> Self {
        Region {
            start,
            size,
            spans: None,
        }
    }

    /// Only the parts of the box's rows that `spans` name (see [`Region::spans`]).
    pub fn with_spans(self, spans: &'a [(u32, u32)]) -> Region<'a> {
        Region {
            spans: Some(spans),
            ..self
        }
    }
}

/// No axis mirrored.
pub const NO_MIRROR: [bool; 3] = [false; 3];

impl EntryReader {
    /// Copy `region` of `array` into `out`, mirrored along each axis of `mirror` (z, y, x):
    /// the same voxels as reading and then mirroring ([`crate::geometry::mirror`]), written
    /// where they belong in one pass. Spans name parts of the box before mirroring. `out` is
    /// `f32` (any stored type; float16 is widened), `u16` (uint8 and uint16 arrays) or `u8`
    /// (uint8 arrays). An image box holding a NaN or an infinity is an error (damage since
    /// the build).
    pub fn read<T: Sample>(
        &self,
        array: ArrayKind,
        region: Region,
        mirror: [bool; 3],
        out: &mut [T],
    ) -> Result<()> {
        let Region { start, size, spans } = region;
        match spans {
            None => self.read_in(array, start, size, out, mirror, Whole),
            Some(s) => self.read_in(array, start, size, out, mirror, RowSpans::new(s, size)),
        }
    }

    fn read_in<T: Sample>(
        &self,
        array: ArrayKind,
        start: [i64; 3],
        size: [usize; 3],
        out: &mut [T],
        mirror: [bool; 3],
        spans: impl Spans,
    ) -> Result<()> {
        let dir = &self.inner.dir;
        let region = |arr: &ArrayReader, out: &mut [T]| {
            self.read_region_in(arr, start, size, out, mirror, spans)
        };
        match array {
            ArrayKind::Image => {
                let image = &self.inner.image;
                let c = image.len();
                if c == 1 {
                    let finite = region(&image[0], out)?;
                    return self.finite_image(&image[0], start, size, finite);
                }
                if !out.len().is_multiple_of(c) {
                    return Err(Error::Config(format!(
                        "a patch of {c} channels needs a buffer of a multiple of {c} elements, not {}",
                        out.len()
                    )));
                }
                let n = out.len() / c;
                for (arr, part) in image.iter().zip(out.chunks_exact_mut(n)) {
                    let finite = region(arr, part)?;
                    self.finite_image(arr, start, size, finite)?;
                }
                Ok(())
            }
            ArrayKind::Channel(channel) => {
                let arr = self.inner.image.get(channel).ok_or_else(|| {
                    Error::Config(format!(
                        "{}: no image channel {channel} (the entry has {})",
                        dir.display(),
                        self.inner.image.len()
                    ))
                })?;
                let finite = region(arr, out)?;
                self.finite_image(arr, start, size, finite)
            }
            ArrayKind::Label => {
                let label = self
                    .inner
                    .label
                    .as_ref()
                    .ok_or_else(|| Error::cache(dir, "entry has no label"))?;
                region(label, out).map(|_| ())
            }
            ArrayKind::Distance(class) => {
                if !self.inner.has_distance {
                    return Err(Error::cache(
                        dir,
                        "entry has no distance maps: build the cache with --derived distance",
                    ));
                }
                match self.inner.distance_classes.iter().position(|&c| c == class) {
                    Some(k) => region(&self.inner.distance[k], out).map(|_| ()),
                    None => {
                        out.fill(T::default());
                        Ok(())
                    }
                }
            }
            ArrayKind::Skeleton => {
                let s = self.inner.skeleton.as_ref().ok_or_else(|| {
                    Error::cache(
                        dir,
                        "entry has no skeleton: build the cache with --derived skeleton",
                    )
                })?;
                region(s, out).map(|_| ())
            }
            ArrayKind::NormMask => {
                let m = self
                    .inner
                    .norm_mask
                    .as_ref()
                    .ok_or_else(|| Error::cache(dir, "entry has no normalization mask"))?;
                region(m, out).map(|_| ())
            }
        }
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
}
