//! In-plane maps without deformation in the vector builds: every patch plane has the same
//! (y, x) coordinates, so one plane's cells serve all planes; many planes go through the box
//! turned on its side ([`super::columns`]), few plane by plane.

use crate::cache::PatchSource;
use crate::error::Result;

use super::footprint::footprint_spans;
use super::reader::{Sampling, TransformedReader};
use super::sample::TILE;
use super::transform::Transform;
use super::{columns, first_n, gather, put_row, separable};

/// Rotated in-plane patches of at least this many planes take the box as columns of planes
/// ([`columns`]): from 4 planes faster than plane by plane (9% for 4, 46% for 8, 48% for 16
/// planes of 128x128), slower below (25% for 2). Scaled ones from twice as many.
#[cfg(target_arch = "x86_64")]
pub(super) const COLUMN_PLANES: usize = 4;

impl TransformedReader {
    /// [`TransformedReader::read`] for in-plane maps without deformation: every patch plane
    /// has the same (y, x) coordinates (the z terms of those axes are zero), so the cells of
    /// one plane's rows within a box plane are computed once for all planes. Patches of
    /// [`COLUMN_PLANES`] planes or more in the box go through its columns ([`columns`]),
    /// reading only the rows' parts their cells need (a rotated patch's footprint is down to
    /// half its box); fewer plane by plane, each reading one box plane (which stays in
    /// cache). The same values as the portable path.
    ///
    /// # Safety
    /// The CPU must have AVX2; the box must be under 2^31 voxels.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn in_plane_avx2(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) -> Result<()> {
        self.in_plane(src, box_start, job, image, label)
    }

    /// An in-plane map's cells of box plane 0 for the first patch plane's rows (z coordinate
    /// 0, inside: boxes have at least 2 planes) into `plane_rows` and `plane_frac`, each box
    /// row's x range they read (from the patch plane's corners) into `spans`, and the patch
    /// planes inside the box's range into `column_planes` (one run of them, in the order their
    /// box planes run: the columns' lanes); returns the first of those box planes.
    ///
    /// # Safety
    /// The CPU must have AVX2 (inlined into callers compiled for it); the box must be under
    /// 2^31 voxels.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn plane_cells(
        &mut self,
        t: &Transform,
        local_centre: [f64; 3],
        size: [usize; 3],
        bs: [usize; 3],
    ) -> usize {
        self.plane_rows.clear();
        self.plane_frac.clear();
        let corner = |y: usize, x: usize| {
            let c = t.row8(local_centre, size, (0, y), x);
            [c[1][0], c[2][0]]
        };
        let (ye, xe) = (size[1] - 1, size[2] - 1);
        let corners = [corner(0, 0), corner(0, xe), corner(ye, xe), corner(ye, 0)];
        footprint_spans(corners, bs, &mut self.spans);
        for y in 0..size[1] {
            for tx in (0..size[2]).step_by(TILE[2]) {
                let mut coords = t.row8(local_centre, size, (0, y), tx);
                coords[0] = [0.0; 8];
                let cells = gather::cells8(&coords, bs);
                self.plane_rows.push(gather::PlaneRow::new(&cells));
                self.plane_frac.push([cells.frac[1], cells.frac[2]]);
            }
        }
        // Each patch plane's box plane is whole; those inside the box's range run along
        // consecutive box planes (z maps to itself or its mirror), the others read 0.
        self.column_planes.clear();
        let mut lo = usize::MAX;
        for z in 0..size[0] {
            let cz = t.row8(local_centre, size, (z, 0), 0)[0][0];
            if cz >= 0.0 && cz < (bs[0] - 1) as f64 {
                lo = lo.min(cz as usize);
                self.column_planes.push(z);
            }
        }
        if t.matrix[0][0] < 0.0 {
            self.column_planes.reverse();
        }
        lo
    }

    /// The part of the box (start, sides) that holds the box planes of `column_planes` (from
    /// `lo`, as [`TransformedReader::plane_cells`] gives it), and their first plane in it (0).
    /// An in-plane map's cells lie in those planes; its upper z neighbours weigh 0 and are
    /// not read by the columns.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn column_box(
        &self,
        box_start: [i64; 3],
        bs: [usize; 3],
        lo: usize,
    ) -> ([i64; 3], [usize; 3], usize) {
        let k = self.column_planes.len();
        debug_assert!(lo + k <= bs[0]);
        (
            [box_start[0] + lo as i64, box_start[1], box_start[2]],
            [k, bs[1], bs[2]],
            0,
        )
    }

    /// Zeros in the patch planes outside the run of `column_planes` (every channel of
    /// `image`, and `label`).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn zero_planes_outside(
        &self,
        size: [usize; 3],
        channels: usize,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) {
        let n: usize = size.iter().product();
        let plane = size[1] * size[2];
        let (a, b) = (
            self.column_planes[0],
            self.column_planes[self.column_planes.len() - 1],
        );
        let inside = a.min(b)..=a.max(b);
        let mut label = label;
        for z in (0..size[0]).filter(|z| !inside.contains(z)) {
            for ch in 0..channels {
                image[ch * n + z * plane..][..plane].fill(0.0);
            }
            if let Some(l) = label.as_deref_mut() {
                l[z * plane..][..plane].fill(0);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn in_plane(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        image: &mut [f32],
        mut label: Option<&mut [u16]>,
    ) -> Result<()> {
        let Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        } = *job;
        let n: usize = size.iter().product();
        let bn: usize = bs.iter().product();
        let (sy, sz) = (bs[2], bs[1] * bs[2]);
        let plane = size[1] * size[2];
        let lo = self.plane_cells(t, local_centre, size, bs);
        if self.column_planes.len() >= COLUMN_PLANES {
            self.zero_planes_outside(size, channels, image, label.as_deref_mut());
            // Scalings: the image by two passes over whole box rows ([`separable`]: the same
            // lerps, so the same bits), which stream where turning the box into columns and
            // the columns' lerps wait on the cache (scaled 16x128x128 patches +7%); the label
            // still through the columns, whose outcome tables weigh a mixed column once for
            // every plane.
            let separable_image = t.axis_aligned();
            // Rotations read only the box planes their patch planes lie in (the columns'),
            // not the plane below and the two above that the box holds for maps that mix
            // planes: 16 of 19 for a 16-plane patch.
            let (box_start, bs, lo) = if separable_image {
                (box_start, bs, lo)
            } else {
                self.column_box(box_start, bs, lo)
            };
            self.read_box_spans(src, box_start, bs, channels, label.is_some())?;
            if separable_image {
                self.separable
                    .prepare(t.axis_coordinates(local_centre, size), bs);
                separable::sample_in(
                    self.simd(),
                    &mut self.separable,
                    true,
                    &self.image_box,
                    bs,
                    channels,
                    size,
                    image,
                    None,
                );
                if label.is_none() {
                    return Ok(());
                }
            }
            let job = columns::Job {
                rows: &self.plane_rows,
                frac: &self.plane_frac,
                lo,
                planes: &self.column_planes,
                spans: &self.spans,
                size,
                bs,
                channels: if separable_image { 0 } else { channels },
            };
            // SAFETY: AVX2 is enabled here; the rows' cells are of box plane 0, inside lanes
            // at most one voxel before the plane's y and x ends, and within the spans read;
            // the planes from `lo` are box planes below its last.
            self.columns.sample(
                &job,
                &self.image_box,
                image,
                label.map(|l| (self.labels.planes(), l)),
            );
            return Ok(());
        }
        src.read_image(box_start, bs, first_n(&mut self.image_box, channels * bn))?;
        if label.is_some() {
            self.labels.read(src, box_start, bs)?;
            self.labels.prepare::<true>(bs);
        }
        for z in 0..size[0] {
            // The plane's z coordinate, whole (in-plane maps), and its box plane.
            let cz = t.row8(local_centre, size, (z, 0), 0)[0][0];
            if !(cz >= 0.0 && cz < (bs[0] - 1) as f64) {
                for ch in 0..channels {
                    image[ch * n + z * plane..][..plane].fill(0.0);
                }
                if let Some(l) = label.as_deref_mut() {
                    l[z * plane..][..plane].fill(0);
                }
                continue;
            }
            let plane_at = (cz as usize * sz) as i32;
            let mut k = 0;
            for y in 0..size[1] {
                for tx in (0..size[2]).step_by(TILE[2]) {
                    let row = &self.plane_rows[k];
                    k += 1;
                    let base = row.base.map(|b| b + plane_at);
                    let w = (tx + TILE[2]).min(size[2]) - tx;
                    let at = z * plane + y * size[2] + tx;
                    let (out, out_n, out_at) = if w == TILE[2] {
                        (&mut *image, n, at)
                    } else {
                        self.short_row.resize(channels * TILE[2], 0.0);
                        (&mut self.short_row[..], TILE[2], 0)
                    };
                    // SAFETY: AVX2 is enabled here; the box is under 2^31 voxels (checked by
                    // the caller), each base is a cell of this box plane or its first voxel.
                    gather::lerp8_at::<true>(
                        &base,
                        row.inside,
                        [std::arch::x86_64::_mm256_setzero_ps(), row.fy, row.fx],
                        bs,
                        &self.image_box,
                        bn,
                        channels,
                        out,
                        out_n,
                        out_at,
                    );
                    if w < TILE[2] {
                        for ch in 0..channels {
                            image[ch * n + at..][..w]
                                .copy_from_slice(&self.short_row[ch * TILE[2]..][..w]);
                        }
                    }
                    if let Some(l) = label.as_deref_mut() {
                        let (vals, mixed) = self.labels.uniform_row8(&base, row.inside);
                        put_row(l, at, &vals, w);
                        // (Lanes past a short row's end are dropped.)
                        let mixed = mixed & ((1u32 << w) - 1);
                        if mixed != 0 {
                            self.deferred.push((k - 1, at, mixed));
                        }
                    }
                }
            }
            // The plane's mixed label lanes, after its table lookups (see `uniform_row8`).
            if let Some(l) = label.as_deref_mut() {
                for &(k, at, mut mixed) in &self.deferred {
                    let (row, frac) = (&self.plane_rows[k], &self.plane_frac[k]);
                    while mixed != 0 {
                        let j = mixed.trailing_zeros() as usize;
                        mixed &= mixed - 1;
                        let base = (row.base[j] + plane_at) as usize;
                        let f = [0.0, frac[0][j], frac[1][j]];
                        l[at + j] = self.labels.weighed_at::<true>(base, sy, sz, f);
                    }
                }
                self.deferred.clear();
            }
        }
        Ok(())
    }
}
