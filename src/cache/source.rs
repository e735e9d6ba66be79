//! The seam between where patches come from and the code that trains on them: the sampler,
//! the loader and validation take any [`PatchSource`]. The memory-mapped cache entry
//! ([`EntryReader`]) is the fast implementation; another store (an object store, a
//! preprocessed volume in memory for predict) implements the same few methods.

use super::reader::{ArrayKind, EntryReader, Region, NO_MIRROR};
use crate::error::Result;
use crate::geometry::mirror;

/// The array a [`PatchSource::read_spans`] fills.
pub enum SpanOut<'a> {
    /// The image, every channel (as [`PatchSource::read_image`]).
    Image(&'a mut [f32]),
    /// The label (as [`PatchSource::read_label`]).
    Label(&'a mut [u16]),
    /// The label as bytes (as [`PatchSource::read_label_u8`]).
    LabelBytes(&'a mut [u8]),
    /// The signed distance map of a label value (as [`PatchSource::read_distance`]).
    Distance(u16, &'a mut [f32]),
    /// The label's skeleton (as [`PatchSource::read_skeleton`]).
    Skeleton(&'a mut [u16]),
    /// nnU-Net's normalization mask (as [`PatchSource::read_norm_mask`]).
    NormMask(&'a mut [u16]),
}

/// The error of a read `src` cannot serve: it lacks `what`.
fn lacks<S: PatchSource + ?Sized>(src: &S, what: &str) -> Result<()> {
    Err(crate::error::Error::Config(format!(
        "{}: {what}",
        src.name()
    )))
}

/// One case's arrays on one grid: an image, optionally a label, and a foreground index.
pub trait PatchSource: Send + Sync {
    /// What to call the case in messages (its id, else where it is stored).
    fn name(&self) -> String;

    /// Volume shape (z, y, x).
    fn shape_zyx(&self) -> [usize; 3];

    /// Whether the case has a label array.
    fn has_label(&self) -> bool;

    /// Image channels (a patch's image holds them one after the other).
    fn channels(&self) -> usize {
        1
    }

    /// Whether every image read fails, naming the case's store, on a NaN or an infinity it
    /// reads (so that the loader need not scan each patch for them after the read).
    fn image_reads_checked(&self) -> bool {
        false
    }

    /// Label values with sampled foreground coordinates, ascending.
    fn classes(&self) -> Vec<u16>;

    /// The sampled foreground coordinates (z, y, x) of `class` (empty if absent).
    fn fg_coords(&self, class: u16) -> Result<Vec<[u32; 3]>>;

    /// Copy the box `start_zyx .. start_zyx + size_zyx` of the image into `out` (C order
    /// (c, z, y, x): `channels()` boxes one after the other); whatever lies outside the volume
    /// reads as 0.
    fn read_image(&self, start_zyx: [i64; 3], size_zyx: [usize; 3], out: &mut [f32]) -> Result<()>;

    /// The same box of the label (an error when the case has none).
    fn read_label(&self, start_zyx: [i64; 3], size_zyx: [usize; 3], out: &mut [u16]) -> Result<()>;

    /// Whether the label is stored one byte a voxel (uint8), so that
    /// [`PatchSource::read_label_u8`] can read it.
    fn label_bytes(&self) -> bool {
        false
    }

    /// [`PatchSource::read_label`] into bytes, for a label stored as uint8
    /// ([`PatchSource::label_bytes`]); an error otherwise.
    fn read_label_u8(
        &self,
        _start_zyx: [i64; 3],
        _size_zyx: [usize; 3],
        _out: &mut [u8],
    ) -> Result<()> {
        lacks(self, "the label is not stored as uint8")
    }

    /// Part of a box: of each box row y only the x range `spans[y]` (box coordinates, start
    /// and end; the same in every plane), or with a span for each row of the box, row (z, y)'s
    /// `spans[z * size_zyx[1] + y]`, of the array `out` names; the rest of `out` may be left
    /// as it was. For transformed patches, whose footprint is a part of the box they need.
    /// By default the whole box.
    fn read_spans(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        spans: &[(u32, u32)],
        out: SpanOut,
    ) -> Result<()> {
        let _ = spans;
        match out {
            SpanOut::Image(o) => self.read_image(start_zyx, size_zyx, o),
            SpanOut::Label(o) => self.read_label(start_zyx, size_zyx, o),
            SpanOut::LabelBytes(o) => self.read_label_u8(start_zyx, size_zyx, o),
            SpanOut::Distance(c, o) => self.read_distance(c, start_zyx, size_zyx, o),
            SpanOut::Skeleton(o) => self.read_skeleton(start_zyx, size_zyx, o),
            SpanOut::NormMask(o) => self.read_norm_mask(start_zyx, size_zyx, o),
        }
    }

    /// Voxel spacing (z, y, x) in the grid's unit (1 where unknown).
    fn spacing_zyx(&self) -> [f64; 3] {
        [1.0; 3]
    }

    /// Whether the case holds signed distance maps of its classes.
    fn has_distance(&self) -> bool {
        false
    }

    /// Whether the case holds its label's skeleton.
    fn has_skeleton(&self) -> bool {
        false
    }

    /// The signed distance map of label value `class` over a box (0 outside the volume and for
    /// an absent class); an error when the case has none.
    fn read_distance(
        &self,
        _class: u16,
        _start_zyx: [i64; 3],
        _size_zyx: [usize; 3],
        _out: &mut [f32],
    ) -> Result<()> {
        lacks(
            self,
            "no distance maps (build the cache with --derived distance)",
        )
    }

    /// The label's skeleton over a box (each voxel its class, 0 elsewhere); an error when the
    /// case has none.
    fn read_skeleton(
        &self,
        _start_zyx: [i64; 3],
        _size_zyx: [usize; 3],
        _out: &mut [u16],
    ) -> Result<()> {
        lacks(
            self,
            "no skeleton (build the cache with --derived skeleton)",
        )
    }

    /// The image channels to zero outside the normalization mask after augmentation, as
    /// nnU-Net's training does (its MaskImageTransform); empty for most cases.
    fn norm_mask_channels(&self) -> Vec<u16> {
        Vec::new()
    }

    /// nnU-Net's normalization mask over a box (1 inside, 0 outside it and outside the
    /// volume); an error when the case has none.
    fn read_norm_mask(
        &self,
        _start_zyx: [i64; 3],
        _size_zyx: [usize; 3],
        _out: &mut [u16],
    ) -> Result<()> {
        lacks(self, "no normalization mask")
    }

    /// [`PatchSource::read_patch`] mirrored along each axis of `mirror` (z, y, x), as
    /// [`mirror`] after reading would; the cache reader writes each voxel where it belongs
    /// instead (one pass fewer over the patch).
    fn read_patch_mirrored(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        flips: [bool; 3],
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) -> Result<()> {
        let n: usize = size_zyx.iter().product();
        self.read_image(start_zyx, size_zyx, image)?;
        image
            .chunks_exact_mut(n.max(1))
            .for_each(|c| mirror(c, size_zyx, flips));
        if let Some(l) = label {
            self.read_label(start_zyx, size_zyx, l)?;
            mirror(l, size_zyx, flips);
        }
        Ok(())
    }

    /// Image and label of one box.
    fn read_patch(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) -> Result<()> {
        self.read_image(start_zyx, size_zyx, image)?;
        if let Some(l) = label {
            self.read_label(start_zyx, size_zyx, l)?;
        }
        Ok(())
    }
}

/// Each read of the [`PatchSource`] implementation below: `region` of the array `out` names.
fn read_entry(e: &EntryReader, region: Region, out: SpanOut) -> Result<()> {
    match out {
        SpanOut::Image(o) => e.read(ArrayKind::Image, region, NO_MIRROR, o),
        SpanOut::Label(o) => e.read(ArrayKind::Label, region, NO_MIRROR, o),
        SpanOut::LabelBytes(o) => e.read(ArrayKind::Label, region, NO_MIRROR, o),
        SpanOut::Distance(c, o) => e.read(ArrayKind::Distance(c), region, NO_MIRROR, o),
        SpanOut::Skeleton(o) => e.read(ArrayKind::Skeleton, region, NO_MIRROR, o),
        SpanOut::NormMask(o) => e.read(ArrayKind::NormMask, region, NO_MIRROR, o),
    }
}

impl PatchSource for EntryReader {
    fn name(&self) -> String {
        self.case_id()
            .map(String::from)
            .unwrap_or_else(|| self.dir().display().to_string())
    }

    fn shape_zyx(&self) -> [usize; 3] {
        EntryReader::shape_zyx(self)
    }

    fn has_label(&self) -> bool {
        self.label_dtype().is_some()
    }

    fn channels(&self) -> usize {
        EntryReader::channels(self)
    }

    fn image_reads_checked(&self) -> bool {
        true
    }

    fn classes(&self) -> Vec<u16> {
        EntryReader::classes(self)
    }

    fn fg_coords(&self, class: u16) -> Result<Vec<[u32; 3]>> {
        EntryReader::fg_coords(self, class)
    }

    fn read_image(&self, start: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
        read_entry(self, Region::new(start, size), SpanOut::Image(out))
    }

    fn read_label(&self, start: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        read_entry(self, Region::new(start, size), SpanOut::Label(out))
    }

    fn label_bytes(&self) -> bool {
        self.label_dtype() == Some(crate::cache::reader::StoredDtype::Uint8)
    }

    fn read_label_u8(&self, start: [i64; 3], size: [usize; 3], out: &mut [u8]) -> Result<()> {
        read_entry(self, Region::new(start, size), SpanOut::LabelBytes(out))
    }

    fn read_spans(
        &self,
        start: [i64; 3],
        size: [usize; 3],
        spans: &[(u32, u32)],
        out: SpanOut,
    ) -> Result<()> {
        read_entry(self, Region::new(start, size).with_spans(spans), out)
    }

    fn read_patch_mirrored(
        &self,
        start_zyx: [i64; 3],
        size_zyx: [usize; 3],
        flips: [bool; 3],
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) -> Result<()> {
        EntryReader::read_patch_mirrored(self, start_zyx, size_zyx, flips, image, label)
    }

    fn has_distance(&self) -> bool {
        EntryReader::has_distance(self)
    }

    fn spacing_zyx(&self) -> [f64; 3] {
        EntryReader::spacing_zyx(self)
    }

    fn has_skeleton(&self) -> bool {
        EntryReader::has_skeleton(self)
    }

    fn read_distance(
        &self,
        class: u16,
        start: [i64; 3],
        size: [usize; 3],
        out: &mut [f32],
    ) -> Result<()> {
        read_entry(
            self,
            Region::new(start, size),
            SpanOut::Distance(class, out),
        )
    }

    fn read_skeleton(&self, start: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        read_entry(self, Region::new(start, size), SpanOut::Skeleton(out))
    }

    fn norm_mask_channels(&self) -> Vec<u16> {
        EntryReader::norm_mask_channels(self).to_vec()
    }

    fn read_norm_mask(&self, start: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        read_entry(self, Region::new(start, size), SpanOut::NormMask(out))
    }
}
