//! Every configuration of a dataset, by nnU-Net's experiment planner: the full-resolution
//! target spacing (median, or the anisotropy rule's 10th percentile), the axes ordered
//! coarsest first, the median shape at that spacing, then `3d_fullres`, `3d_lowres` when the
//! full-resolution patch covers under a quarter of the median case, and `2d`
//! (docs/nnunet-planner.md, section 2).

use super::configuration::{plan_configuration, Budget, ConfigurationPlan, Preset};
use super::numeric::{argmax_first, median, percentile, round_half_even};
use crate::error::{Error, Result};

/// The facts of a dataset the planner uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Fingerprint {
    /// Spacing (z, y, x) of each case, in mm (the one absolute constant of the rules, 1e-5,
    /// is in mm).
    pub spacings: Vec<[f64; 3]>,
    /// Shape (z, y, x) of each case (nnU-Net: after cropping to the nonzero region).
    pub shapes: Vec<[usize; 3]>,
    /// Label values, background included.
    pub num_classes: usize,
    /// Training cases (dataset.json's `numTraining` where it has one).
    pub num_training: usize,
}

/// An axis whose spacing is over this times the others' is anisotropic.
const ANISOTROPY: f64 = 3.0;
/// Below this share of the median case covered by the full-resolution patch, a low-resolution
/// configuration is tried.
const LOWRES_BELOW: f64 = 0.25;
/// The low-resolution spacing grows by this factor a step.
const LOWRES_STEP: f64 = 1.03;

/// The plans of a dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct Plans {
    /// The preset planned with.
    pub preset: Preset,
    /// The planner's axis order: `transpose[i]` is the (z, y, x) axis at place i (the
    /// coarsest spacing first).
    pub transpose: [usize; 3],
    /// The full-resolution target spacing (z, y, x), mm: `2d` keeps its coarse axis.
    pub target_spacing: [f64; 3],
    /// `3d_fullres` (absent for a dataset of single slices).
    pub fullres: Option<ConfigurationPlan>,
    /// `3d_lowres`, when nnU-Net's rule creates one.
    pub lowres: Option<ConfigurationPlan>,
    /// `2d`.
    pub two_d: ConfigurationPlan,
}

impl Plans {
    /// Each configuration with its name, in the order nnU-Net writes them.
    pub fn configurations(&self) -> Vec<(&'static str, &ConfigurationPlan)> {
        let mut v = vec![("2d", &self.two_d)];
        if let Some(l) = &self.lowres {
            v.push(("3d_lowres", l));
        }
        if let Some(f) = &self.fullres {
            v.push(("3d_fullres", f));
        }
        v
    }
}

/// The full-resolution target spacing (z, y, x).
fn target_spacing(fp: &Fingerprint) -> [f64; 3] {
    // nnU-Net takes percentile 50 here, not the median (they can differ in the last bit).
    let p50 = |vals: Vec<f64>| percentile(&vals, 50.0);
    let mut target = [0.0; 3];
    let mut size = [0.0; 3];
    for a in 0..3 {
        target[a] = p50(fp.spacings.iter().map(|s| s[a]).collect());
        size[a] = p50(fp.shapes.iter().map(|s| s[a] as f64).collect());
    }
    let worst = argmax_first(&target);
    let others: Vec<usize> = (0..3).filter(|&a| a != worst).collect();
    let other_sp = others.iter().map(|&a| target[a]).fold(f64::MIN, f64::max);
    let other_sz = others
        .iter()
        .map(|&a| size[a])
        .fold(f64::INFINITY, f64::min);
    if target[worst] > ANISOTROPY * other_sp && size[worst] * ANISOTROPY < other_sz {
        let col: Vec<f64> = fp.spacings.iter().map(|s| s[worst]).collect();
        let mut t = percentile(&col, 10.0);
        if t < other_sp {
            t = other_sp.max(t) + 1e-5;
        }
        target[worst] = t;
    }
    target
}

/// Plan every configuration of `fp` with `preset`.
pub fn plan_experiment(fp: &Fingerprint, preset: Preset) -> Result<Plans> {
    plan_experiment_scaled(fp, preset, 1.0)
}

/// [`plan_experiment`] with the preset's reference multiplied by `reference_scale` (nnU-Net's
/// `-gpu_memory_target G`: G / [`Preset::memory_gb`]).
pub fn plan_experiment_scaled(
    fp: &Fingerprint,
    preset: Preset,
    reference_scale: f64,
) -> Result<Plans> {
    if fp.spacings.is_empty() || fp.spacings.len() != fp.shapes.len() {
        return Err(Error::Dataset(format!(
            "planning needs the spacing and shape of every case ({} spacings, {} shapes)",
            fp.spacings.len(),
            fp.shapes.len()
        )));
    }
    let bad = fp
        .spacings
        .iter()
        .flatten()
        .any(|s| !s.is_finite() || *s <= 0.0)
        || fp.shapes.iter().flatten().any(|&n| n == 0);
    if bad {
        return Err(Error::Dataset(
            "planning needs positive, finite spacings and shapes of at least one voxel".into(),
        ));
    }
    let target = target_spacing(fp);
    let worst = argmax_first(&target);
    let mut transpose = [worst, 0, 0];
    let mut k = 1;
    for a in 0..3 {
        if a != worst {
            transpose[k] = a;
            k += 1;
        }
    }
    let new_shapes: Vec<[f64; 3]> = fp
        .spacings
        .iter()
        .zip(&fp.shapes)
        .map(|(sp, sh)| std::array::from_fn(|a| round_half_even(sp[a] / target[a] * sh[a] as f64)))
        .collect();
    let med: Vec<f64> = (0..3)
        .map(|a| median(&new_shapes.iter().map(|s| s[a]).collect::<Vec<_>>()))
        .collect();
    let med_t: Vec<f64> = transpose.iter().map(|&a| med[a]).collect();
    let sp_t: Vec<f64> = transpose.iter().map(|&a| target[a]).collect();
    let cases = fp.num_training.max(1) as f64;
    let dataset_voxels = med_t.iter().product::<f64>() * cases;
    let budget = |voxels: f64| Budget {
        preset,
        num_classes: fp.num_classes,
        dataset_voxels: voxels,
        reference_scale,
    };

    let (mut fullres, mut lowres) = (None, None);
    if med_t[0] != 1.0 {
        let full = plan_configuration(&sp_t, &med_t, &budget(dataset_voxels));
        let full_voxels = med_t.iter().product::<f64>();
        let mut median_voxels = full_voxels;
        let mut patch_voxels = full.patch.iter().map(|&p| p as f64).product::<f64>();
        let mut low_sp = sp_t.clone();
        let mut low = None;
        while patch_voxels / median_voxels < LOWRES_BELOW {
            let coarsest = low_sp.iter().copied().fold(f64::MIN, f64::max);
            let fine: Vec<bool> = low_sp.iter().map(|&s| coarsest / s > 2.0).collect();
            let any_fine = fine.iter().any(|&f| f);
            for (s, f) in low_sp.iter_mut().zip(&fine) {
                if *f || !any_fine {
                    *s *= LOWRES_STEP;
                }
            }
            let shape: Vec<f64> = (0..3).map(|a| sp_t[a] / low_sp[a] * med_t[a]).collect();
            median_voxels = shape.iter().product::<f64>();
            let rounded: Vec<f64> = shape.iter().map(|&s| round_half_even(s)).collect();
            let plan = plan_configuration(&low_sp, &rounded, &budget(median_voxels * cases));
            patch_voxels = plan.patch.iter().map(|&p| p as f64).product::<f64>();
            low = Some(plan);
        }
        if full_voxels / median_voxels >= 2.0 {
            lowres = low;
        }
        fullres = Some(full);
    }
    let two_d = plan_configuration(&sp_t[1..], &med_t[1..], &budget(dataset_voxels));
    Ok(Plans {
        preset,
        transpose,
        target_spacing: target,
        fullres,
        lowres,
        two_d,
    })
}
