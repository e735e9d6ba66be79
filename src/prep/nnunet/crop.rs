//! nnU-Net's crop to the nonzero region and its normalization schemes, on the transposed grid,
//! a slice at a time.
//!
//! The crop's box is that of the voxels nonzero in any channel (filling the mask's holes, as
//! nnU-Net does, adds only voxels inside the box). The filled mask itself is needed only where
//! a channel is normalized inside it: holes are the background components, 6-connected, that
//! do not touch the box's faces (everything outside the box is background touching the
//! image's border), found slice by slice with [`Components`].

use std::path::Path;

use super::volume::Scratch;
use crate::error::{Error, Result};
use crate::format::nnunet::Plans;
use crate::format::{AppliedNormalization, Normalization, SchemeStatistics};
use crate::geometry::components::{Components, Connectivity};
use crate::nifti_io::VoxelSource;

/// The crop of a case.
pub struct Cropped {
    /// Box in transposed axes, half open.
    pub bbox: [[usize; 2]; 3],
    /// Its shape.
    pub shape: [usize; 3],
    /// The filled nonzero mask over the box (1 inside), when a channel is normalized in it.
    pub mask: Option<Scratch<u8>>,
    /// transpose_forward.
    tf: [usize; 3],
    /// The file's grid (z, y, x).
    shape_zyx: [usize; 3],
}

impl Cropped {
    /// For row `r` (y, in the box) of slice `k` (z, in the box): the original linear index of
    /// its first voxel and the stride between its voxels.
    fn row(&self, k: usize, r: usize) -> (usize, usize) {
        let [_, h, w] = self.shape_zyx;
        let strides = [h * w, w, 1];
        let at = [self.bbox[0][0] + k, self.bbox[1][0] + r, self.bbox[2][0]];
        let base = (0..3).map(|a| at[a] * strides[self.tf[a]]).sum();
        (base, strides[self.tf[2]])
    }

    /// Slice `k` of the box from the channel's voxels (y-major, f32).
    pub fn slice(&self, src: &VoxelSource, k: usize) -> Result<Vec<f32>> {
        let [_, hc, wc] = self.shape;
        let mut out = vec![0f32; hc * wc];
        for (r, row) in out.chunks_exact_mut(wc).enumerate() {
            let (base, stride) = self.row(k, r);
            if stride == 1 {
                src.read_f32(base, row)?;
            } else {
                for (i, v) in row.iter_mut().enumerate() {
                    src.read_f32(base + i * stride, std::slice::from_mut(v))?;
                }
            }
        }
        Ok(out)
    }
}

/// The box of nonzero voxels (any channel), and the filled mask when `use_mask` asks for it.
pub(super) fn crop(
    id: &str,
    sources: &[VoxelSource],
    shape_zyx: [usize; 3],
    tf: [usize; 3],
    use_mask: &[bool],
    tmp: &Path,
) -> Result<Cropped> {
    let [d, h, w] = shape_zyx;
    let want_mask = use_mask.iter().any(|&m| m);
    let raw: Option<Scratch<u8>> = if want_mask {
        Some(Scratch::new(tmp, [1, 1, 1, d * h * w])?)
    } else {
        None
    };
    let mut lo = [usize::MAX; 3];
    let mut hi = [0usize; 3];
    let mut slice = vec![0f32; h * w];
    let mut nonzero = vec![0u8; h * w];
    for z in 0..d {
        nonzero.iter_mut().for_each(|v| *v = 0);
        for s in sources {
            s.read_f32(z * h * w, &mut slice)?;
            for (m, &v) in nonzero.iter_mut().zip(&slice) {
                // NaN != 0 too, as numpy counts it.
                if v != 0.0 {
                    *m = 1;
                }
            }
        }
        for (i, _) in nonzero.iter().enumerate().filter(|(_, &m)| m != 0) {
            let p = [z, i / w, i % w];
            for a in 0..3 {
                lo[a] = lo[a].min(p[a]);
                hi[a] = hi[a].max(p[a] + 1);
            }
        }
        if let Some(m) = &raw {
            m.write_run(0, 0, 0, z * h * w, &nonzero)?;
        }
    }
    if lo[0] == usize::MAX {
        return Err(Error::case(id, "every voxel of every channel is 0: there is no nonzero region to crop to (nnU-Net fails on such an image too)"));
    }
    let bbox = tf.map(|a| [lo[a], hi[a]]);
    let shape = bbox.map(|b| b[1] - b[0]);
    let mut cropped = Cropped {
        bbox,
        shape,
        mask: None,
        tf,
        shape_zyx,
    };
    if let Some(raw) = raw {
        cropped.mask = Some(fill_holes(&cropped, &raw, tmp)?);
    }
    Ok(cropped)
}

/// The nonzero mask over the box with its holes filled.
fn fill_holes(c: &Cropped, raw: &Scratch<u8>, tmp: &Path) -> Result<Scratch<u8>> {
    let [dc, hc, wc] = c.shape;
    let boxed = |k: usize| -> Result<Vec<u8>> {
        let mut out = vec![0u8; hc * wc];
        for (r, row) in out.chunks_exact_mut(wc).enumerate() {
            let (base, stride) = c.row(k, r);
            if stride == 1 {
                raw.read_run(0, 0, 0, base, row)?;
            } else {
                for (i, v) in row.iter_mut().enumerate() {
                    raw.read_run(0, 0, 0, base + i * stride, std::slice::from_mut(v))?;
                }
            }
        }
        Ok(out)
    };
    let background =
        |k: usize| -> Result<Vec<bool>> { Ok(boxed(k)?.into_iter().map(|v| v == 0).collect()) };
    let mut comps = Components::find(c.shape, Connectivity::Faces, &background)?;
    // Components touching a face of the box reach the image's border.
    let mut outside = vec![false; comps.sizes().len() + 1];
    comps.relabel(&background, |k, labels| {
        for (i, &l) in labels.iter().enumerate() {
            let (y, x) = (i / wc, i % wc);
            if l != 0 && (k == 0 || k + 1 == dc || y == 0 || y + 1 == hc || x == 0 || x + 1 == wc) {
                outside[l as usize] = true;
            }
        }
        Ok(())
    })?;
    let filled: Scratch<u8> = Scratch::new(tmp, [1, dc, hc, wc])?;
    comps.relabel(&background, |k, labels| {
        let row: Vec<u8> = labels
            .iter()
            .map(|&l| u8::from(l == 0 || !outside[l as usize]))
            .collect();
        filled.write_rows(0, k, 0, &row)
    })?;
    Ok(filled)
}

/// The normalization of one channel, in nnU-Net's float32 arithmetic.
enum Norm {
    /// Clip to [lo, hi], subtract, divide.
    Ct {
        lo: f32,
        hi: f32,
        mean: f32,
        std: f32,
    },
    /// Subtract, divide; inside the mask only when `masked`.
    ZScore { mean: f32, std: f32, masked: bool },
    /// Unchanged.
    Identity,
    /// Subtract the minimum, divide by the maximum after it.
    Rescale { min: f32, max: f32 },
    /// Divide by 255.
    Rgb,
}

/// One slice of a channel over the box, with its mask where the channel is normalized in it.
type MaskedSlice = (Vec<f32>, Option<Vec<u8>>);

/// Mean and (population) standard deviation of the selected voxels, two passes in f64.
fn moments(slices: &dyn Fn(usize) -> Result<MaskedSlice>, depth: usize) -> Result<(f64, f64, u64)> {
    let (mut sum, mut n) = (0f64, 0u64);
    for k in 0..depth {
        let (v, m) = slices(k)?;
        for (i, &x) in v.iter().enumerate() {
            if m.as_ref().is_none_or(|m| m[i] != 0) {
                sum += f64::from(x);
                n += 1;
            }
        }
    }
    let mean = if n > 0 { sum / n as f64 } else { f64::NAN };
    let mut sq = 0f64;
    for k in 0..depth {
        let (v, m) = slices(k)?;
        for (i, &x) in v.iter().enumerate() {
            if m.as_ref().is_none_or(|m| m[i] != 0) {
                let d = f64::from(x) - mean;
                sq += d * d;
            }
        }
    }
    Ok((mean, (sq / n.max(1) as f64).sqrt(), n))
}

impl Norm {
    /// The record of what was applied (`scheme`: the plans' scheme of the channel).
    fn applied(&self, scheme: Normalization) -> AppliedNormalization {
        let (shift, scale, clip, only_nonzero) = match *self {
            Norm::Ct { lo, hi, mean, std } => (mean, std, Some([lo, hi].map(f64::from)), false),
            Norm::ZScore { mean, std, masked } => (mean, std, None, masked),
            Norm::Identity => (0.0, 1.0, None, false),
            Norm::Rescale { min, max } => (min, max, None, false),
            Norm::Rgb => (0.0, 255.0, None, false),
        };
        AppliedNormalization {
            scheme,
            shift: f64::from(shift),
            scale: f64::from(scale),
            clip,
            only_nonzero,
        }
    }
}

/// Normalize every channel over the box into a new scratch volume (channels, box); returns
/// what each channel was given.
pub(super) fn normalize(
    id: &str,
    sources: &[VoxelSource],
    c: &Cropped,
    plans: &Plans,
    tmp: &Path,
) -> Result<(Scratch<f32>, Vec<AppliedNormalization>)> {
    let [dc, hc, wc] = c.shape;
    let out: Scratch<f32> = Scratch::new(tmp, [sources.len(), dc, hc, wc])?;
    let mut applied = Vec::with_capacity(sources.len());
    let cfg = &plans.configuration;
    for (ch, src) in sources.iter().enumerate() {
        let masked = cfg.use_mask_for_norm[ch];
        let slices = |k: usize| -> Result<MaskedSlice> {
            let v = c.slice(src, k)?;
            let m = match (&c.mask, masked) {
                (Some(m), true) => Some(m.slice(0, k)?),
                _ => None,
            };
            Ok((v, m))
        };
        let scheme = cfg.normalization_schemes[ch];
        let norm = match scheme.statistics() {
            SchemeStatistics::DatasetForeground => {
                let p = plans.intensity_properties[ch].ok_or_else(|| Error::Model {
                    path: plans.path.clone(),
                    message: format!("channel {ch}: no intensity properties for CT normalization"),
                })?;
                Norm::Ct {
                    lo: p.percentile_00_5 as f32,
                    hi: p.percentile_99_5 as f32,
                    mean: p.mean as f32,
                    std: p.std.max(1e-8) as f32,
                }
            }
            SchemeStatistics::ImageMoments => {
                let (mean, std, n) = moments(&slices, dc)?;
                if n == 0 {
                    return Err(Error::case(
                        id,
                        format!("channel {ch}: no voxel to normalize"),
                    ));
                }
                Norm::ZScore {
                    mean: mean as f32,
                    std: (std as f32).max(1e-8),
                    masked,
                }
            }
            SchemeStatistics::ImageRange => {
                // NaN voxels were refused as the case was read, so min and max see them all.
                let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
                for k in 0..dc {
                    for &x in &c.slice(src, k)? {
                        min = min.min(x);
                        max = max.max(x);
                    }
                }
                if scheme == Normalization::RgbTo01 {
                    if min < 0.0 || max > 255.0 {
                        return Err(Error::case(
                            id,
                            format!(
                                "channel {ch} is RGB-normalized (0..255) but holds values from {min} to {max}: {}",
                                src.header().path.display()
                            ),
                        ));
                    }
                    Norm::Rgb
                } else {
                    Norm::Rescale {
                        min,
                        max: (max - min).max(1e-8),
                    }
                }
            }
            // NoNormalization: the plans hold nnU-Net's five schemes only.
            SchemeStatistics::Fixed => Norm::Identity,
        };
        applied.push(norm.applied(scheme));
        for k in 0..dc {
            let (mut v, m) = slices(k)?;
            for (i, x) in v.iter_mut().enumerate() {
                *x = match norm {
                    Norm::Ct { lo, hi, mean, std } => (x.clamp(lo, hi) - mean) / std,
                    Norm::ZScore { mean, std, masked } => {
                        if masked && m.as_ref().is_some_and(|m| m[i] == 0) {
                            *x
                        } else {
                            (*x - mean) / std
                        }
                    }
                    Norm::Identity => *x,
                    Norm::Rescale { min, max } => (*x - min) / max,
                    Norm::Rgb => *x / 255.0,
                };
            }
            out.write_rows(ch, k, 0, &v)?;
        }
    }
    Ok((out, applied))
}
