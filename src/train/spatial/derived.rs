//! The label-derived arrays (signed distance maps, skeleton) of a patch through the same map
//! as its image and label: distances linearly (divided by the scale), the skeleton by the
//! nearest voxel, through the same paths (columns, footprint spans, vector rows).

use crate::cache::source::SpanOut;
use crate::cache::PatchSource;
use crate::error::Result;
use crate::util::simd::Simd;

#[cfg(target_arch = "x86_64")]
use super::columns;
use super::first_n;
use super::footprint::{footprint_spans_3d, needed_box};
#[cfg(target_arch = "x86_64")]
use super::in_plane::COLUMN_PLANES;
use super::reader::{Sampling, TransformedReader};
use super::sample::{cell, trilinear};
use super::transform::{centre_of, Transform};

impl TransformedReader {
    /// The label-derived arrays of the same patch through the same map: the signed distance of
    /// each of `classes` into `distance` (one patch after the other; linear, divided by the
    /// map's scale since the patch shows the source shrunk by it; 0 outside the volume) and the
    /// skeleton into `skeleton` (nearest voxel: a skeleton voxel is never blended).
    #[allow(clippy::too_many_arguments)]
    pub fn read_derived(
        &mut self,
        src: &dyn PatchSource,
        start_zyx: [i64; 3],
        size: [usize; 3],
        t: &Transform,
        classes: &[u16],
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) -> Result<()> {
        let n: usize = size.iter().product();
        if t.is_identity() {
            for (&c, out) in classes.iter().zip(distance.chunks_exact_mut(n)) {
                src.read_distance(c, start_zyx, size, out)?;
            }
            if let Some(s) = skeleton {
                src.read_skeleton(start_zyx, size, s)?;
            }
            return Ok(());
        }
        let Some((box_start, bs)) = needed_box(t, start_zyx, size, src.shape_zyx())? else {
            distance.fill(0.0);
            if let Some(s) = skeleton {
                s.fill(0);
            }
            return Ok(());
        };
        let bn: usize = bs.iter().product();
        let mut skeleton = skeleton;
        let inv_scale = 1.0 / t.scale;
        let centre = centre_of(start_zyx, size);
        let local_centre = [0, 1, 2].map(|a| centre[a] - box_start[a] as f64);
        #[cfg(target_arch = "x86_64")]
        {
            let simd = self.simd();
            if simd > Simd::Portable && bn < i32::MAX as usize {
                let job = Sampling {
                    t,
                    local_centre,
                    size,
                    bs,
                    channels: classes.len(),
                };
                let flat = t.keeps_z_planes();
                // In-plane maps of many planes through the box's columns, as the image: the
                // distance maps' lerps and the skeleton's nearest voxel once per patch column
                // for every plane (16x128x128 patches rotated and scaled, read with a distance
                // map and the skeleton: +43%).
                if flat
                    && t.elastic.is_none()
                    && (!t.axis_aligned() || size[0] >= 2 * COLUMN_PLANES)
                {
                    // SAFETY: as below.
                    let done = unsafe {
                        let sk = skeleton.as_deref_mut();
                        self.derived_in_plane_avx2(src, box_start, &job, classes, distance, sk)
                    }?;
                    if done {
                        for v in distance.iter_mut() {
                            *v = (*v as f64 * inv_scale) as f32;
                        }
                        return Ok(());
                    }
                }
                let spans = self.rotation_spans(t, local_centre, size, bs);
                self.read_derived_boxes(src, box_start, bs, classes, skeleton.is_some(), spans)?;
                // SAFETY: the CPU has AVX2 (`simd` checked it) and the box is under 2^31 voxels.
                unsafe { self.derived_avx2(flat, &job, distance, skeleton) };
                // The same product and rounding as the loop below, after the interpolation.
                for v in distance.iter_mut() {
                    *v = (*v as f64 * inv_scale) as f32;
                }
                return Ok(());
            }
        }
        let spans = self.rotation_spans(t, local_centre, size, bs);
        self.read_derived_boxes(src, box_start, bs, classes, skeleton.is_some(), spans)?;
        let (sy, sz) = (bs[2], bs[1] * bs[2]);
        self.row.resize(size[2], [0.0; 3]);
        for z in 0..size[0] {
            for y in 0..size[1] {
                t.row(
                    local_centre,
                    size,
                    (z, y),
                    0,
                    &mut self.row,
                    &mut self.scratch,
                );
                let at = (z * size[1] + y) * size[2];
                for (x, c) in self.row.iter().enumerate() {
                    let Some((base, f)) = cell(c, bs) else {
                        for k in 0..classes.len() {
                            distance[k * n + at + x] = 0.0;
                        }
                        if let Some(s) = skeleton.as_deref_mut() {
                            s[at + x] = 0;
                        }
                        continue;
                    };
                    for k in 0..classes.len() {
                        let b = &self.image_box[k * bn..(k + 1) * bn];
                        distance[k * n + at + x] =
                            (trilinear::<false>(b, base, sy, sz, f.map(|v| v as f32)) as f64
                                * inv_scale) as f32;
                    }
                    if let Some(s) = skeleton.as_deref_mut() {
                        let near = [0, 1, 2].map(|a| usize::from(f[a] >= 0.5));
                        s[at + x] = self.skeleton_box[base + near[0] * sz + near[1] * sy + near[2]];
                    }
                }
            }
        }
        Ok(())
    }

    /// [`TransformedReader::read_derived`]'s interpolation in vectors: the distance maps
    /// (the channels of `job`) linearly as images are, the skeleton by the nearest voxel; the
    /// same values as its scalar loop (in-plane maps read 4 neighbours instead of 8, whose
    /// upper plane weighs exactly 0). The caller checks the CPU and the box's size.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn derived_avx2(
        &mut self,
        flat: bool,
        job: &Sampling,
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) {
        if flat {
            self.sample_rows::<true, true>(job, distance, skeleton);
        } else {
            self.sample_rows::<false, true>(job, distance, skeleton);
        }
    }

    /// [`TransformedReader::read_derived`] of an in-plane map without deformation through the
    /// box's columns ([`columns`]): the distance maps (the channels of `job`, their boxes in
    /// `image_box`) as the image is read there, the skeleton (`skeleton_box`) by the nearest
    /// voxel, the same values as [`TransformedReader::derived_avx2`] (before the scale's
    /// division). `false` (nothing written) when fewer than [`COLUMN_PLANES`] patch planes lie
    /// in the box.
    ///
    /// # Safety
    /// The CPU must have AVX2; the box must be under 2^31 voxels.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn derived_in_plane(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        classes: &[u16],
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) -> Result<bool> {
        let Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        } = *job;
        let lo = self.plane_cells(t, local_centre, size, bs);
        if self.column_planes.len() < COLUMN_PLANES {
            return Ok(false);
        }
        // Only the box rows' x ranges that the cells read (`plane_cells` set them), of the
        // planes the patch planes lie in, as the image's.
        let (box_start, bs, lo) = self.column_box(box_start, bs, lo);
        self.read_derived_boxes(src, box_start, bs, classes, skeleton.is_some(), true)?;
        let mut skeleton = skeleton;
        self.zero_planes_outside(size, channels, distance, skeleton.as_deref_mut());
        let cj = columns::Job {
            rows: &self.plane_rows,
            frac: &self.plane_frac,
            lo,
            planes: &self.column_planes,
            spans: &self.spans,
            size,
            bs,
            channels,
        };
        // SAFETY: AVX2 is enabled here (the caller's); the rows' cells are of box plane 0,
        // inside lanes at most one voxel before the plane's y and x ends, within the spans
        // read.
        if channels > 0 {
            self.columns.sample(&cj, &self.image_box, distance, None);
        }
        if let Some(sk) = skeleton {
            self.columns.nearest(&cj, &self.skeleton_box, sk);
        }
        Ok(true)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn derived_in_plane_avx2(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        classes: &[u16],
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) -> Result<bool> {
        self.derived_in_plane(src, box_start, job, classes, distance, skeleton)
    }

    /// Whether `t` reads only its footprint of the box (rotations without deformation, as
    /// in [`TransformedReader::read`]): then its rows' x ranges are in `spans`.
    fn rotation_spans(
        &mut self,
        t: &Transform,
        local_centre: [f64; 3],
        size: [usize; 3],
        bs: [usize; 3],
    ) -> bool {
        !t.axis_aligned()
            && t.elastic.is_none()
            && footprint_spans_3d(t, local_centre, size, bs, &mut self.spans)
    }

    /// The boxes of the distance maps of `classes` (one after the other in `image_box`) and
    /// of the skeleton (`skeleton_box`, when `skeleton`): with `spans`, only the x ranges of
    /// `spans` (see [`PatchSource::read_spans`]), else whole.
    fn read_derived_boxes(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        bs: [usize; 3],
        classes: &[u16],
        skeleton: bool,
        spans: bool,
    ) -> Result<()> {
        let bn: usize = bs.iter().product();
        let boxes = first_n(&mut self.image_box, classes.len() * bn);
        for (&c, b) in classes.iter().zip(boxes.chunks_exact_mut(bn)) {
            if spans {
                src.read_spans(box_start, bs, &self.spans, SpanOut::Distance(c, b))?;
            } else {
                src.read_distance(c, box_start, bs, b)?;
            }
        }
        if skeleton {
            let b = first_n(&mut self.skeleton_box, bn);
            if spans {
                src.read_spans(box_start, bs, &self.spans, SpanOut::Skeleton(b))?;
            } else {
                src.read_skeleton(box_start, bs, b)?;
            }
        }
        Ok(())
    }
}
