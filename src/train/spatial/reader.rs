//! The reader of transformed patches: its buffers (kept between patches), and the choice of
//! path for each map (plain crop, in-plane columns, separable passes, footprint of a
//! rotation, general loop) in [`TransformedReader::read`].

use crate::cache::source::SpanOut;
use crate::cache::PatchSource;
use crate::error::Result;
use crate::geometry::mirror;
use crate::util::simd::{self, Simd};

#[cfg(target_arch = "x86_64")]
use super::columns;
use super::footprint::{footprint_spans_3d, needed_box};
#[cfg(target_arch = "x86_64")]
use super::gather;
#[cfg(target_arch = "x86_64")]
use super::in_plane::COLUMN_PLANES;
use super::sample::Cell;
use super::transform::{centre_of, Transform};
use super::{first_n, label, separable};

/// Reads patches through a transform: the source box once, then one interpolation per array.
/// Holds the box buffers between patches (a loader worker keeps one).
#[derive(Default)]
pub struct TransformedReader {
    pub(super) image_box: Vec<f32>,
    pub(super) labels: label::LabelBox,
    /// The skeleton's box ([`TransformedReader::read_derived`]).
    pub(super) skeleton_box: Vec<u16>,
    pub(super) row: Vec<[f64; 3]>,
    pub(super) scratch: Vec<[f64; 3]>,
    /// One tile's voxels (see [`Cell`]).
    pub(super) cells: Vec<Cell>,
    /// The vector build to take instead of the widest ([`simd::best`]; tests compare them).
    pub(super) build: Option<Simd>,
    /// A short tile row's 8-lane output, channel after channel (vector paths).
    #[cfg(target_arch = "x86_64")]
    pub(super) short_row: Vec<f32>,
    /// The cells of one patch plane's rows of 8 within a box plane (in-plane maps), and
    /// their fractions in f64 (y, x) for the label's mixed lanes.
    #[cfg(target_arch = "x86_64")]
    pub(super) plane_rows: Vec<gather::PlaneRow>,
    #[cfg(target_arch = "x86_64")]
    pub(super) plane_frac: Vec<[[f64; 8]; 2]>,
    /// Label lanes left to weigh (in-plane maps: plane row index, patch index and mixed lanes
    /// of a row of 8; 3D maps: each lane's patch index, box index and fractions, the lanes
    /// alone: a row's whole cells, copied for each row with a mixed lane, were a tenth of a
    /// 3D rotation's time).
    #[cfg(target_arch = "x86_64")]
    pub(super) deferred: Vec<(usize, usize, u32)>,
    #[cfg(target_arch = "x86_64")]
    pub(super) deferred_cells: Vec<(usize, usize, [f64; 3])>,
    /// In-plane maps' box as columns of planes ([`columns`]), and for each column lane the
    /// patch plane it fills.
    #[cfg(target_arch = "x86_64")]
    pub(super) columns: columns::Columns,
    #[cfg(target_arch = "x86_64")]
    pub(super) column_planes: Vec<usize>,
    /// The x range of each box row the cells need (in-plane maps: the same in every plane).
    pub(super) spans: Vec<(u32, u32)>,
    /// Tables and planes of maps without rotation ([`separable`]).
    pub(super) separable: separable::Separable,
    /// Take the general loop for maps without rotation too (tests compare the two).
    #[cfg(test)]
    pub(super) general_only: bool,
}

impl TransformedReader {
    /// A reader that takes the given vector build (or, on a CPU without it, the widest it
    /// has): for tests and benchmarks comparing builds.
    pub fn with_build(build: Simd) -> Self {
        TransformedReader {
            build: Some(build),
            ..TransformedReader::default()
        }
    }

    /// [`TransformedReader::read`] with the patch mirrored along each axis of `flips` (as
    /// [`crate::geometry::mirror`] after reading would, bit for bit): plain crops are
    /// read mirrored, other maps mirrored in their matrix, at no cost either way.
    #[allow(clippy::too_many_arguments)]
    pub fn read_mirrored(
        &mut self,
        src: &dyn PatchSource,
        start_zyx: [i64; 3],
        size: [usize; 3],
        t: &Transform,
        flips: [bool; 3],
        image: &mut [f32],
        mut label: Option<&mut [u16]>,
    ) -> Result<()> {
        if flips == [false; 3] {
            return self.read(src, start_zyx, size, t, image, label);
        }
        if t.is_identity() {
            return src.read_patch_mirrored(start_zyx, size, flips, image, label);
        }
        if t.elastic.is_some() {
            // Read, then mirrored (the field is laid out on the patch).
            self.read(src, start_zyx, size, t, image, label.as_deref_mut())?;
            let n: usize = size.iter().product();
            for c in image.chunks_exact_mut(n.max(1)) {
                mirror(c, size, flips);
            }
            if let Some(l) = label {
                mirror(l, size, flips);
            }
            return Ok(());
        }
        self.read(src, start_zyx, size, &t.mirrored(flips), image, label)
    }

    /// Fill `image` (channels x patch, C order) and `label` (patch) with the case's arrays
    /// sampled through `t` for the patch whose untransformed box starts at `start_zyx`.
    pub fn read(
        &mut self,
        src: &dyn PatchSource,
        start_zyx: [i64; 3],
        size: [usize; 3],
        t: &Transform,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) -> Result<()> {
        if t.is_identity() {
            return src.read_patch(start_zyx, size, image, label);
        }
        let channels = src.channels();
        let Some((box_start, bs)) = needed_box(t, start_zyx, size, src.shape_zyx())? else {
            // The whole patch lies more than a voxel outside the volume.
            image.fill(0.0);
            if let Some(l) = label {
                l.fill(0);
            }
            return Ok(());
        };
        let bn: usize = bs.iter().product();
        let centre = centre_of(start_zyx, size);
        // Coordinates relative to the box: the map's centre moved by the box's start.
        let local_centre = [0, 1, 2].map(|a| centre[a] - box_start[a] as f64);
        let job = Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        };
        // In-plane maps keep z on whole voxels: 4 neighbours instead of 8 (the same values,
        // since the upper plane's weight is exactly 0).
        let flat = t.keeps_z_planes();
        // In-plane maps without deformation in the vector builds: `in_plane` (which reads
        // what it needs itself). Scalings of 8 planes or more too: their label through the
        // columns is faster than the separable path's (the whole patch measured 19% faster
        // for 8 planes, 23% for 16, 13% slower for 4); their image takes the separable passes
        // there.
        #[cfg(target_arch = "x86_64")]
        if flat
            && t.elastic.is_none()
            && (!t.axis_aligned() || size[0] >= 2 * COLUMN_PLANES)
            && self.simd() != Simd::Portable
            && bn < i32::MAX as usize
        {
            // SAFETY: the CPU has AVX2 (`simd` checked it); the box is under 2^31 voxels.
            return unsafe { self.in_plane_avx2(src, box_start, &job, image, label) };
        }
        #[cfg(test)]
        let separable = t.axis_aligned() && !self.general_only;
        #[cfg(not(test))]
        let separable = t.axis_aligned();
        // Rotations read only their footprint (36% of the box of a 32x96x96 patch at
        // nnU-Net's ranges, fewer pages to bring in); the separable passes read all of theirs.
        if !separable
            && t.elastic.is_none()
            && footprint_spans_3d(t, local_centre, size, bs, &mut self.spans)
        {
            self.read_box_spans(src, box_start, bs, channels, label.is_some())?;
        } else {
            src.read_image(box_start, bs, first_n(&mut self.image_box, channels * bn))?;
            if label.is_some() {
                self.labels.read(src, box_start, bs)?;
            }
        }
        if separable {
            let coords = t.axis_coordinates(local_centre, size);
            self.separable.prepare(coords, bs);
            separable::sample_in(
                self.simd(),
                &mut self.separable,
                flat,
                &self.image_box,
                bs,
                channels,
                size,
                image,
                label.map(|l| (&mut self.labels, l)),
            );
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        match self.simd() {
            Simd::Portable => {}
            // SAFETY: the CPU has AVX2 (`simd` checked it).
            Simd::Avx2 => {
                unsafe { self.sample_avx2(flat, &job, image, label) };
                return Ok(());
            }
        }
        if flat {
            self.sample::<true>(&job, image, label);
        } else {
            self.sample::<false>(&job, image, label);
        }
        Ok(())
    }

    /// The parts of the box that `spans` name (see [`PatchSource::read_spans`]) into
    /// `image_box`, and of the label box when `label`.
    pub(super) fn read_box_spans(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        bs: [usize; 3],
        channels: usize,
        label: bool,
    ) -> Result<()> {
        let n = channels * bs.iter().product::<usize>();
        src.read_spans(
            box_start,
            bs,
            &self.spans,
            SpanOut::Image(first_n(&mut self.image_box, n)),
        )?;
        if label {
            self.labels.read_spans(src, box_start, bs, &self.spans)?;
        }
        Ok(())
    }

    /// The vector build this reader takes: its `build` if set, else the widest; never one the
    /// CPU lacks.
    pub(super) fn simd(&self) -> Simd {
        self.build.unwrap_or_else(simd::best).min(simd::detected())
    }
}

/// What [`TransformedReader::sample`] interpolates: the map, the centre in box coordinates,
/// the patch and box sizes, the image's channels.
#[derive(Clone, Copy)]
pub(super) struct Sampling<'a> {
    pub(super) t: &'a Transform,
    pub(super) local_centre: [f64; 3],
    pub(super) size: [usize; 3],
    pub(super) bs: [usize; 3],
    pub(super) channels: usize,
}
