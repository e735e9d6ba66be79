//! Intensity normalization, applied to the input volume before resampling (as nnU-Net does),
//! with the statistics recorded in the cache entry.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How image intensities are normalized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Normalization {
    /// z-score with mean and standard deviation of the nonzero voxels; zero voxels stay zero
    /// (nnU-Net's behaviour when the nonzero region is the mask). The default.
    ZscoreNonzero,
    /// z-score over all voxels.
    Zscore,
    /// Clip to the dataset's foreground 0.5 and 99.5 percentiles, then z-score with the dataset
    /// foreground mean and standard deviation (nnU-Net's CT scheme).
    Ct,
    /// Keep the intensities as they are.
    None,
}

impl std::str::FromStr for Normalization {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "zscore-nonzero" => Normalization::ZscoreNonzero,
            "zscore" => Normalization::Zscore,
            "ct" => Normalization::Ct,
            "none" => Normalization::None,
            _ => {
                return Err(Error::Config(format!(
                    "unknown normalization {s:?} (choose zscore-nonzero, zscore, ct or none)"
                )))
            }
        })
    }
}

impl Normalization {
    pub fn name(&self) -> &'static str {
        match self {
            Normalization::ZscoreNonzero => "zscore-nonzero",
            Normalization::Zscore => "zscore",
            Normalization::Ct => "ct",
            Normalization::None => "none",
        }
    }
}

/// Dataset-wide foreground statistics for CT normalization.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForegroundStats {
    pub lower: f64,
    pub upper: f64,
    pub mean: f64,
    pub std: f64,
}

/// Intensity statistics of one input image, recorded in the entry.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntensityStats {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub std: f64,
    pub nonzero_voxels: u64,
    pub nonzero_mean: f64,
    pub nonzero_std: f64,
}

/// What was applied: out = (clamp(v, clip) - shift) / scale, on `only_nonzero` voxels or all.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppliedNormalization {
    pub scheme: Normalization,
    pub shift: f64,
    pub scale: f64,
    pub clip: Option<[f64; 2]>,
    pub only_nonzero: bool,
}

/// Fixed-size pieces for parallel reductions: partial sums are added in piece order, so the
/// result is the same whatever the number of threads (entries must be byte-reproducible).
const PIECE: usize = 1 << 16;

/// Mean and standard deviation (population) of the values passing `keep`, in f64.
fn mean_std(data: &[f32], keep: impl Fn(f32) -> bool + Sync) -> (u64, f64, f64) {
    let sums: Vec<(u64, f64)> = data
        .par_chunks(PIECE)
        .map(|c| {
            c.iter()
                .filter(|&&v| keep(v))
                .fold((0u64, 0.0f64), |(n, s), &v| (n + 1, s + v as f64))
        })
        .collect();
    let (n, sum) = sums
        .iter()
        .fold((0u64, 0.0), |(n, s), p| (n + p.0, s + p.1));
    if n == 0 {
        return (0, 0.0, 0.0);
    }
    let mean = sum / n as f64;
    let ss: Vec<f64> = data
        .par_chunks(PIECE)
        .map(|c| {
            c.iter()
                .filter(|&&v| keep(v))
                .map(|&v| (v as f64 - mean).powi(2))
                .sum::<f64>()
        })
        .collect();
    (n, mean, (ss.iter().sum::<f64>() / n as f64).sqrt())
}

pub fn intensity_stats(data: &[f32]) -> IntensityStats {
    let (min, max) = data
        .par_chunks(PIECE)
        .map(|c| {
            c.iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                })
        })
        .reduce(
            || (f32::INFINITY, f32::NEG_INFINITY),
            |a, b| (a.0.min(b.0), a.1.max(b.1)),
        );
    let (_, mean, std) = mean_std(data, |_| true);
    let (nz, nz_mean, nz_std) = mean_std(data, |v| v != 0.0);
    IntensityStats {
        min: min as f64,
        max: max as f64,
        mean,
        std,
        nonzero_voxels: nz,
        nonzero_mean: nz_mean,
        nonzero_std: nz_std,
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
        Normalization::None => AppliedNormalization {
            scheme,
            shift: 0.0,
            scale: 1.0,
            clip: None,
            only_nonzero: false,
        },
    })
}

/// Apply in place.
pub fn apply(data: &mut [f32], n: &AppliedNormalization) {
    if n.scheme == Normalization::None {
        return;
    }
    let (shift, inv) = (n.shift, 1.0 / n.scale);
    let (lo, hi) = n
        .clip
        .map_or((f64::NEG_INFINITY, f64::INFINITY), |c| (c[0], c[1]));
    let only_nonzero = n.only_nonzero;
    data.par_chunks_mut(PIECE).for_each(|c| {
        for v in c.iter_mut() {
            if only_nonzero && *v == 0.0 {
                continue;
            }
            *v = (((*v as f64).clamp(lo, hi) - shift) * inv) as f32;
        }
    });
}

/// Up to `max` foreground intensities of one image (label > 0), evenly strided so the result
/// does not depend on thread timing: the CT scheme pools these over the dataset.
pub fn sample_foreground(image: &[f32], is_fg: impl Fn(usize) -> bool, max: usize) -> Vec<f32> {
    let fg: Vec<usize> = (0..image.len()).filter(|&i| is_fg(i)).collect();
    if fg.is_empty() {
        return Vec::new();
    }
    let step = (fg.len() as f64 / max as f64).max(1.0);
    let mut out = Vec::with_capacity(max.min(fg.len()));
    let mut pos = 0.0f64;
    while (pos as usize) < fg.len() && out.len() < max {
        out.push(image[fg[pos as usize]]);
        pos += step;
    }
    out
}

/// Dataset foreground statistics from pooled samples (percentiles by nearest rank).
pub fn foreground_stats(mut samples: Vec<f32>) -> Option<ForegroundStats> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize] as f64;
    let (_, mean, std) = mean_std(&samples, |_| true);
    Some(ForegroundStats {
        lower: pick(0.005),
        upper: pick(0.995),
        mean,
        std,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
