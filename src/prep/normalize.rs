//! Intensity normalization, applied to the input volume before resampling (as nnU-Net does),
//! with the statistics recorded in the cache entry.

use crate::error::{Error, Result};
pub use crate::format::{
    AppliedNormalization, ForegroundStats, IntensityStats, Normalization, SchemeStatistics,
};
use crate::geometry::VoxelRead;
use rayon::prelude::*;

/// Fixed-size pieces for parallel reductions: partial sums are added in piece order, so the
/// result is the same whatever the number of threads (entries must be byte-reproducible).
const PIECE: usize = 1 << 16;

/// Running moments of a set of values: count, mean and sum of squared deviations (M2).
#[derive(Clone, Copy, Debug, Default)]
struct Moments {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Moments {
    /// Moments of one piece in one pass, from sums shifted by the piece's first value (exact
    /// enough in f64 for a piece of 65,536 values, and branch-free so it vectorizes).
    fn of(values: &[f32], keep: impl Fn(f32) -> bool) -> Moments {
        let c = values
            .first()
            .copied()
            .filter(|v| v.is_finite())
            .unwrap_or(0.0) as f64;
        let (mut n, mut s1, mut s2) = (0.0f64, 0.0f64, 0.0f64);
        for &v in values {
            let k = if keep(v) { 1.0 } else { 0.0 };
            let d = if keep(v) { v as f64 - c } else { 0.0 };
            n += k;
            s1 += d;
            s2 += d * d;
        }
        if n == 0.0 {
            return Moments::default();
        }
        let mean_d = s1 / n;
        Moments {
            n: n as u64,
            mean: c + mean_d,
            m2: (s2 - n * mean_d * mean_d).max(0.0),
        }
    }

    /// Combine two pieces (Chan et al.); pieces are combined in a fixed order.
    fn merge(self, o: Moments) -> Moments {
        if self.n == 0 {
            return o;
        }
        if o.n == 0 {
            return self;
        }
        let n = self.n + o.n;
        let d = o.mean - self.mean;
        Moments {
            n,
            mean: self.mean + d * o.n as f64 / n as f64,
            m2: self.m2 + o.m2 + d * d * (self.n as f64 * o.n as f64 / n as f64),
        }
    }

    fn std(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            (self.m2 / self.n as f64).sqrt()
        }
    }
}

/// Everything one piece contributes to the image statistics.
#[derive(Clone, Copy, Debug)]
struct PieceStats {
    min: f32,
    max: f32,
    nonfinite: u64,
    all: Moments,
    nonzero: Moments,
}

/// The one rule for NaN or infinite voxels in an image, wherever one is read (a cache build,
/// predict with our models or nnU-Net's): the image is refused, naming the file and how many
/// voxels, as nnU-Net's dataset check refuses images with NaN ("Images contain NaN pixel
/// values"); the case fails alone.
pub fn refuse_nonfinite(path: &std::path::Path, nonfinite: u64) -> Result<()> {
    if nonfinite == 0 {
        return Ok(());
    }
    Err(Error::nifti(
        path,
        format!("{nonfinite} voxels are NaN or infinite; fix or mask them first (nnU-Net refuses such images too)"),
    ))
}

/// Voxels of `data` that are NaN or infinite.
pub fn count_nonfinite(data: &[f32]) -> u64 {
    data.iter().filter(|v| !v.is_finite()).count() as u64
}

/// Statistics of an image in one parallel sweep; also counts NaN/infinite voxels (which make
/// the moments meaningless: callers refuse such images).
pub fn intensity_stats(data: &[f32]) -> IntensityStats {
    let mut acc = IntensityAccumulator::default();
    acc.add(data);
    acc.finish()
}

/// [`intensity_stats`] over a volume handed over in blocks, in order: every block but the last
/// must hold a whole number of pieces (2^16 voxels), and then the result is the same, bit for
/// bit, as for the whole volume at once.
#[derive(Clone, Copy, Debug)]
pub struct IntensityAccumulator {
    total: PieceStats,
}

impl Default for IntensityAccumulator {
    fn default() -> Self {
        IntensityAccumulator {
            total: PieceStats {
                min: f32::INFINITY,
                max: f32::NEG_INFINITY,
                nonfinite: 0,
                all: Moments::default(),
                nonzero: Moments::default(),
            },
        }
    }
}

impl IntensityAccumulator {
    /// Add the next block of voxels.
    pub fn add(&mut self, data: &[f32]) {
        let pieces: Vec<PieceStats> = data
            .par_chunks(PIECE)
            .map(|c| {
                let (mut min, mut max, mut nonfinite) = (f32::INFINITY, f32::NEG_INFINITY, 0u64);
                for &v in c {
                    if v.is_finite() {
                        min = min.min(v);
                        max = max.max(v);
                    } else {
                        nonfinite += 1;
                    }
                }
                PieceStats {
                    min,
                    max,
                    nonfinite,
                    all: Moments::of(c, |v| v.is_finite()),
                    nonzero: Moments::of(c, |v| v != 0.0 && v.is_finite()),
                }
            })
            .collect();
        self.total = pieces.into_iter().fold(self.total, |a, b| PieceStats {
            min: a.min.min(b.min),
            max: a.max.max(b.max),
            nonfinite: a.nonfinite + b.nonfinite,
            all: a.all.merge(b.all),
            nonzero: a.nonzero.merge(b.nonzero),
        });
    }

    /// The statistics of everything added.
    pub fn finish(&self) -> IntensityStats {
        let t = &self.total;
        IntensityStats {
            min: if t.all.n > 0 { t.min as f64 } else { 0.0 },
            max: if t.all.n > 0 { t.max as f64 } else { 0.0 },
            mean: t.all.mean,
            std: t.all.std(),
            nonzero_voxels: t.nonzero.n,
            nonzero_mean: t.nonzero.mean,
            nonzero_std: t.nonzero.std(),
            nonfinite_voxels: t.nonfinite,
        }
    }
}

const MIN_STD: f64 = 1e-8;

/// Decide the transform for one image.
pub fn plan_normalization(
    scheme: Normalization,
    stats: &IntensityStats,
    dataset_fg: Option<&ForegroundStats>,
) -> Result<AppliedNormalization> {
    let applied = |shift: f64, scale: f64, clip, only_nonzero| AppliedNormalization {
        scheme,
        shift,
        scale: scale.max(MIN_STD),
        clip,
        only_nonzero,
    };
    Ok(match scheme {
        Normalization::ZscoreNonzero => applied(stats.nonzero_mean, stats.nonzero_std, None, true),
        Normalization::Zscore => applied(stats.mean, stats.std, None, false),
        Normalization::Ct => {
            let fg = dataset_fg.ok_or_else(|| {
                Error::Config(
                    "ct normalization needs dataset foreground statistics (labels)".into(),
                )
            })?;
            applied(fg.mean, fg.std, Some([fg.lower, fg.upper]), false)
        }
        Normalization::None | Normalization::Indicator(_) => AppliedNormalization {
            scheme,
            shift: 0.0,
            scale: 1.0,
            clip: None,
            only_nonzero: false,
        },
        // nnU-Net's RescaleTo01Normalization: the image's own range to [0, 1].
        Normalization::RescaleTo01 => applied(stats.min, stats.max - stats.min, None, false),
        // nnU-Net's RGBTo01Normalization: 8-bit values to [0, 1]; others are refused, as
        // nnU-Net asserts.
        Normalization::RgbTo01 => {
            if stats.min < 0.0 || stats.max > 255.0 {
                return Err(Error::Dataset(format!(
                    "rgb-to-01 normalization takes 8-bit values (0 to 255); this image holds \
                     {} to {}",
                    stats.min, stats.max
                )));
            }
            applied(0.0, 255.0, None, false)
        }
    })
}

/// The scheme of each channel named `names`: the configured one, unless dataset.json's name
/// picks one ([`Normalization::for_channel_name`]) and `--normalization` was not given.
pub fn channel_schemes(
    settings: &crate::prep::settings::Settings,
    names: &[String],
) -> Vec<Normalization> {
    names
        .iter()
        .map(|n| match Normalization::for_channel_name(n) {
            Some(s) if !settings.normalization_forced => s,
            _ => settings.normalization,
        })
        .collect()
}

/// Apply in place.
pub fn apply(data: &mut [f32], n: &AppliedNormalization) {
    if n.scheme == Normalization::None {
        return;
    }
    data.par_chunks_mut(PIECE).for_each(|c| apply_run(c, n));
}

/// Apply in place to a short run, on this thread (rows read while resampling).
fn apply_run(data: &mut [f32], n: &AppliedNormalization) {
    match n.scheme {
        Normalization::None => return,
        Normalization::Indicator(v) => {
            let v = v as f32;
            data.iter_mut().for_each(|x| *x = (*x == v) as u8 as f32);
            return;
        }
        _ => {}
    }
    let (shift, inv) = (n.shift, 1.0 / n.scale);
    let (lo, hi) = n
        .clip
        .map_or((f64::NEG_INFINITY, f64::INFINITY), |c| (c[0], c[1]));
    let only_nonzero = n.only_nonzero;
    // f32 arithmetic with a select instead of a branch, so the loop vectorizes.
    let (lo, hi, shift, inv) = (lo as f32, hi as f32, shift as f32, inv as f32);
    for v in data.iter_mut() {
        let out = (v.clamp(lo, hi) - shift) * inv;
        *v = if only_nonzero && *v == 0.0 { 0.0 } else { out };
    }
}

/// A volume read through a normalization: what the cache writer resamples, so the input is
/// normalized row by row as it is read instead of in a whole-volume copy.
pub struct Normalized<'a, R: ?Sized> {
    /// The raw input.
    pub input: &'a R,
    /// The transform applied to every value read.
    pub applied: AppliedNormalization,
}

impl<R: VoxelRead + ?Sized> VoxelRead for Normalized<'_, R> {
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()> {
        self.input.read(start, out)?;
        apply_run(out, &self.applied);
        Ok(())
    }
}

/// Up to `max` foreground intensities of one image (label > 0), evenly strided so the result
/// does not depend on thread timing: the CT scheme pools these over the dataset.
pub fn sample_foreground(image: &[f32], is_fg: impl Fn(usize) -> bool, max: usize) -> Vec<f32> {
    let total = (0..image.len()).filter(|&i| is_fg(i)).count();
    let mut s = ForegroundSampler::new(total as u64, max);
    s.add(image, is_fg);
    s.finish()
}

/// [`sample_foreground`] over an image handed over in blocks, in order, once the number of
/// foreground voxels is known (counted from the label first): the same values are picked.
#[derive(Debug)]
pub struct ForegroundSampler {
    total: u64,
    seen: u64,
    step: f64,
    pos: f64,
    max: usize,
    out: Vec<f32>,
}

impl ForegroundSampler {
    /// A sample of at most `max` of `total` foreground voxels.
    pub fn new(total: u64, max: usize) -> Self {
        ForegroundSampler {
            total,
            seen: 0,
            step: (total as f64 / max.max(1) as f64).max(1.0),
            pos: 0.0,
            max,
            out: Vec::new(),
        }
    }

    /// The next block of the image; `is_fg(i)` says whether its i-th voxel is foreground.
    pub fn add(&mut self, image: &[f32], is_fg: impl Fn(usize) -> bool) {
        for (i, &v) in image.iter().enumerate() {
            if !is_fg(i) {
                continue;
            }
            // The step is at least 1, so each foreground voxel is picked at most once.
            if self.out.len() < self.max && (self.pos as u64) == self.seen && self.seen < self.total
            {
                self.out.push(v);
                self.pos += self.step;
            }
            self.seen += 1;
        }
    }

    /// The picked intensities.
    pub fn finish(self) -> Vec<f32> {
        self.out
    }
}

/// Dataset foreground statistics from pooled samples (percentiles by nearest rank).
pub fn foreground_stats(mut samples: Vec<f32>) -> Option<ForegroundStats> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize] as f64;
    let m = Moments::of(&samples, |_| true);
    Some(ForegroundStats {
        lower: pick(0.005),
        upper: pick(0.995),
        mean: m.mean,
        std: m.std(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnunets_rescale_and_rgb_schemes_as_nnunet_computes_them() {
        // RescaleTo01Normalization: (x - min) / (max - min).
        let raw = vec![-20.0f32, 0.0, 30.0, 80.0];
        let mut v = raw.clone();
        let n = plan_normalization(Normalization::RescaleTo01, &intensity_stats(&v), None).unwrap();
        apply(&mut v, &n);
        let want: Vec<f32> = raw.iter().map(|x| (x + 20.0) / 100.0).collect();
        assert!(
            v.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{v:?}"
        );
        // RGBTo01Normalization: x / 255, 8-bit values only.
        let mut v = vec![0.0f32, 51.0, 255.0];
        let n = plan_normalization(Normalization::RgbTo01, &intensity_stats(&v), None).unwrap();
        apply(&mut v, &n);
        // Multiplied by 1/255 (one rounding from nnU-Net's division at most).
        assert!(
            v.iter()
                .zip([0.0, 0.2, 1.0])
                .all(|(a, b)| (a - b).abs() < 1e-6),
            "{v:?}"
        );
        let err = plan_normalization(
            Normalization::RgbTo01,
            &intensity_stats(&[0.0, 300.0]),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("0 to 300"), "{err}");
        // dataset.json's channel names pick them, as nnU-Net's mapping does.
        assert_eq!(
            Normalization::for_channel_name("rescale_to_0_1"),
            Some(Normalization::RescaleTo01)
        );
        assert_eq!(
            Normalization::for_channel_name("RGB_to_0_1"),
            Some(Normalization::RgbTo01)
        );
    }

    #[test]
    fn zscore_nonzero_keeps_zeros_and_standardizes_the_rest() {
        let mut v = vec![0.0, 1.0, 3.0, 0.0, 5.0];
        let s = intensity_stats(&v);
        let n = plan_normalization(Normalization::ZscoreNonzero, &s, None).unwrap();
        apply(&mut v, &n);
        assert_eq!(v[0], 0.0);
        assert_eq!(v[3], 0.0);
        let nz: Vec<f32> = vec![v[1], v[2], v[4]];
        let mean: f32 = nz.iter().sum::<f32>() / 3.0;
        assert!(mean.abs() < 1e-6);
        let var: f32 = nz.iter().map(|x| x * x).sum::<f32>() / 3.0;
        assert!((var - 1.0).abs() < 1e-5);
    }

    #[test]
    fn piecewise_moments_match_a_direct_computation() {
        let v: Vec<f32> = (0..200_003)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.37 - 50.0)
            .collect();
        let s = intensity_stats(&v);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let std = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!((s.mean - mean).abs() < 1e-9 && (s.std - std).abs() < 1e-9);
        let nz: Vec<f64> = v.iter().filter(|&&x| x != 0.0).map(|&x| x as f64).collect();
        assert_eq!(s.nonzero_voxels as usize, nz.len());
        assert_eq!(s.nonfinite_voxels, 0);
        let mut w = v.clone();
        w[5] = f32::NAN;
        assert_eq!(intensity_stats(&w).nonfinite_voxels, 1);
    }

    #[test]
    fn statistics_in_blocks_equal_statistics_in_one_go_bit_for_bit() {
        let v: Vec<f32> = (0..(5 * PIECE + 123))
            .map(|i| ((i * 7919) % 1000) as f32 * 0.37 - 50.0 + (i % 7 == 0) as u8 as f32 * 1e4)
            .collect();
        let whole = intensity_stats(&v);
        for block in [PIECE, 2 * PIECE, 4 * PIECE] {
            let mut acc = IntensityAccumulator::default();
            v.chunks(block).for_each(|b| acc.add(b));
            assert_eq!(acc.finish(), whole, "blocks of {block}");
        }
    }

    #[test]
    fn foreground_samples_in_blocks_equal_the_direct_stride() {
        let image: Vec<f32> = (0..50_000).map(|i| i as f32).collect();
        let fg = |i: usize| i.is_multiple_of(3) || i.is_multiple_of(11);
        for max in [1, 7, 1000, 100_000] {
            // The stride written out: every step-th foreground voxel, at most `max`.
            let idx: Vec<usize> = (0..image.len()).filter(|&i| fg(i)).collect();
            let step = (idx.len() as f64 / max as f64).max(1.0);
            let mut want = Vec::new();
            let mut pos = 0.0f64;
            while (pos as usize) < idx.len() && want.len() < max {
                want.push(image[idx[pos as usize]]);
                pos += step;
            }
            assert_eq!(sample_foreground(&image, fg, max), want, "max {max}");
            let mut s = ForegroundSampler::new(idx.len() as u64, max);
            for (k, b) in image.chunks(4096).enumerate() {
                s.add(b, |i| fg(k * 4096 + i));
            }
            assert_eq!(s.finish(), want, "blocks, max {max}");
        }
    }

    #[test]
    fn constant_image_does_not_divide_by_zero() {
        let mut v = vec![7.0; 10];
        let s = intensity_stats(&v);
        let n = plan_normalization(Normalization::Zscore, &s, None).unwrap();
        apply(&mut v, &n);
        assert!(v.iter().all(|x| *x == 0.0));
    }

    #[test]
    fn ct_clips_then_standardizes() {
        let fg = ForegroundStats {
            lower: -100.0,
            upper: 100.0,
            mean: 0.0,
            std: 50.0,
        };
        let s = intensity_stats(&[0.0]);
        let n = plan_normalization(Normalization::Ct, &s, Some(&fg)).unwrap();
        let mut v = vec![-1000.0, 50.0, 1000.0];
        apply(&mut v, &n);
        assert_eq!(v, vec![-2.0, 1.0, 2.0]);
    }
}
