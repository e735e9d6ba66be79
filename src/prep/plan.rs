//! Planning: the target spacing, each case's output grid, what it costs, which cases are
//! outliers, and the dataset statistics a normalization needs. Only [`dataset_foreground`]
//! reads voxel data (the CT scheme's dataset-wide percentiles).

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::ImageDtype;
use crate::geometry::{output_shape, true_output_spacing, voxels};
use crate::nifti_io;
use crate::prep::dataset::scan::ScannedCase;
use crate::prep::normalize::{self, ForegroundStats};
use crate::prep::settings::SpacingChoice;

/// How many times the dataset's median output size makes a case an outlier.
pub const OUTLIER_FACTOR: f64 = 4.0;

/// The chosen target spacing and why.
#[derive(Clone, Debug, Serialize)]
pub struct SpacingDecision {
    /// Target spacing (x, y, z) in the files' units.
    pub target_xyz: [f64; 3],
    /// The dataset's per-axis median spacing (x, y, z), whatever the rule.
    pub median_xyz: [f64; 3],
    /// "explicit", "median" or "anisotropy rule".
    pub rule: String,
    /// A sentence a person can read.
    pub reason: String,
}

pub use crate::util::stats::percentile;

/// The per-axis "median" of the spacing rules: numpy's `percentile(v, 50)`, as nnU-Net takes it
/// (not `numpy.median`, which can differ in the last bit).
pub fn median(values: &[f64]) -> f64 {
    percentile(values, 50.0)
}

/// Per-axis median spacing, with nnU-Net's anisotropy rule: when the coarsest axis's median
/// spacing is over 3x the others' and it has under a third of their voxels, a median there would
/// throw away resolution in most cases, so its 10th percentile is used instead (never finer than
/// the other axes).
pub fn auto_spacing(spacings: &[[f64; 3]], shapes: &[[usize; 3]]) -> SpacingDecision {
    let axis = |a: usize| spacings.iter().map(|s| s[a]).collect::<Vec<f64>>();
    let med = [0, 1, 2].map(|a| median(&axis(a)));
    let med_size =
        [0, 1, 2].map(|a| median(&shapes.iter().map(|s| s[a] as f64).collect::<Vec<_>>()));
    let worst = (0..3)
        .max_by(|&a, &b| med[a].total_cmp(&med[b]))
        .unwrap_or(2);
    let others: Vec<usize> = (0..3).filter(|&a| a != worst).collect();
    let max_other_spacing = others.iter().map(|&a| med[a]).fold(0.0, f64::max);
    let min_other_size = others
        .iter()
        .map(|&a| med_size[a])
        .fold(f64::INFINITY, f64::min);
    let aniso_spacing = med[worst] > 3.0 * max_other_spacing;
    let aniso_voxels = med_size[worst] * 3.0 < min_other_size;
    let mut target = med;
    let axis_name = ["x", "y", "z"][worst];
    if aniso_spacing && aniso_voxels {
        let p10 = percentile(&axis(worst), 10.0);
        target[worst] = p10.max(max_other_spacing);
        SpacingDecision {
            target_xyz: target,
            median_xyz: med,
            rule: "anisotropy rule".into(),
            reason: format!(
                "axis {axis_name}: median spacing {:.4} is over 3x the others ({max_other_spacing:.4}) and its median size {:.0} is under a third of theirs ({min_other_size:.0}), so its 10th percentile {p10:.4} is used{}",
                med[worst], med_size[worst],
                if p10 < max_other_spacing { format!(", raised to {max_other_spacing:.4} to stay no finer than the other axes") } else { String::new() }
            ),
        }
    } else {
        SpacingDecision {
            target_xyz: target,
            median_xyz: med,
            rule: "median".into(),
            reason: "per-axis median of the dataset's spacings".into(),
        }
    }
}

/// One case's output grid and memory cost.
#[derive(Clone, Debug, Serialize)]
pub struct CasePlan {
    /// Case id, from the file names.
    pub id: String,
    /// Input shape (x, y, z) in voxels.
    pub in_shape_xyz: [usize; 3],
    /// Input spacing (x, y, z) in the files' units.
    pub in_spacing_xyz: [f64; 3],
    /// Output shape (x, y, z) in voxels.
    pub out_shape_xyz: [usize; 3],
    /// True output spacing (x, y, z): `s * n / m`, close to the target.
    pub out_spacing_xyz: [f64; 3],
    /// Voxels of the output grid.
    pub out_voxels: u64,
    /// Bytes of the cached image (at the chosen dtype) plus label.
    pub out_bytes: u64,
    /// What a whole-volume resampler holds for the image alone, in float32 (bytes).
    pub whole_volume_f32_bytes: u64,
    /// The same in float64 (bytes).
    pub whole_volume_f64_bytes: u64,
    /// Output voxels over the dataset's median output voxels.
    pub size_factor: f64,
    /// Whether `size_factor` reaches [`OUTLIER_FACTOR`].
    pub outlier: bool,
}

/// The flag a table shows for a case: "OUTLIER 51.6x median" or nothing.
pub fn outlier_flag(outlier: bool, size_factor: f64) -> String {
    if outlier {
        format!("OUTLIER {size_factor:.1}x median")
    } else {
        String::new()
    }
}

/// The longest output side accepted whatever the byte limit: a header whose spacing makes an
/// axis longer is wrong (a million voxels at 0.1 um is 10 cm of microscopy).
pub const MAX_OUTPUT_SIDE: usize = 1 << 20;

impl CasePlan {
    /// Why this case's output is refused before anything is written, if it is: a side over
    /// [`MAX_OUTPUT_SIDE`], or more than `max_case_gib` GiB of cached image and label.
    pub fn size_problem(&self, max_case_gib: f64) -> Option<String> {
        let [x, y, z] = self.out_shape_xyz;
        let [sx, sy, sz] = self.in_spacing_xyz;
        let [tx, ty, tz] = self.out_spacing_xyz;
        let what = format!(
            "at target spacing {tx}x{ty}x{tz} the output would be {x}x{y}x{z} voxels ({}) from an input of {}x{}x{} at spacing {sx}x{sy}x{sz}",
            crate::util::sysinfo::human_bytes(self.out_bytes),
            self.in_shape_xyz[0],
            self.in_shape_xyz[1],
            self.in_shape_xyz[2],
        );
        if self.out_shape_xyz.iter().any(|&s| s > MAX_OUTPUT_SIDE) {
            // Either side of the ratio may be the wrong one: the file's pixdim, or the target
            // spacing of the pipeline or of a model's run.json.
            return Some(format!(
                "{what}: a side over {MAX_OUTPUT_SIDE} voxels means one of the two spacings is wrong: the file's pixdim, or the target spacing (the pipeline's, or the model's run.json)"
            ));
        }
        if self.out_bytes as f64 > max_case_gib * (1u64 << 30) as f64 {
            return Some(format!(
                "{what}: over the limit of {max_case_gib} GiB per case; check the two spacings, the file's pixdim or the target spacing (the pipeline's, or the model's run.json), or raise the limit with --max-case-gib"
            ));
        }
        None
    }
}

/// Plan every case at `target`. `image_bytes_per_voxel` is 4 for float32 and 2 for float16 (one
/// channel); each case's last number is the rest of its bytes per voxel: its other channels and
/// its label (0 for one channel and no label).
pub fn plan_cases(
    cases: &[(String, [usize; 3], [f64; 3], usize)],
    target: [f64; 3],
    image_bytes_per_voxel: usize,
) -> Vec<CasePlan> {
    let mut plans: Vec<CasePlan> = cases
        .iter()
        .map(|(id, shape, spacing, label_bpv)| {
            let out = output_shape(*shape, *spacing, target);
            let n = voxels(out);
            CasePlan {
                id: id.clone(),
                in_shape_xyz: *shape,
                in_spacing_xyz: *spacing,
                out_shape_xyz: out,
                out_spacing_xyz: true_output_spacing(*shape, *spacing, out),
                out_voxels: n,
                out_bytes: n.saturating_mul((image_bytes_per_voxel + label_bpv) as u64),
                whole_volume_f32_bytes: n.saturating_mul(4),
                whole_volume_f64_bytes: n.saturating_mul(8),
                size_factor: 1.0,
                outlier: false,
            }
        })
        .collect();
    let med = median(
        &plans
            .iter()
            .map(|p| p.out_voxels as f64)
            .collect::<Vec<_>>(),
    );
    for p in &mut plans {
        p.size_factor = if med > 0.0 {
            p.out_voxels as f64 / med
        } else {
            1.0
        };
        p.outlier = p.size_factor >= OUTLIER_FACTOR;
    }
    plans
}

/// Choose the target spacing for a set of scanned cases.
pub fn decide_spacing(choice: SpacingChoice, scanned: &[&ScannedCase]) -> Result<SpacingDecision> {
    if scanned.is_empty() && choice == SpacingChoice::Auto {
        return Err(Error::Dataset(
            "no readable case to choose a spacing from".into(),
        ));
    }
    let auto = auto_spacing(
        &scanned
            .iter()
            .map(|s| s.image.spacing_xyz)
            .collect::<Vec<_>>(),
        &scanned
            .iter()
            .map(|s| s.image.shape_xyz)
            .collect::<Vec<_>>(),
    );
    Ok(match choice {
        SpacingChoice::Auto => auto,
        SpacingChoice::Explicit(t) => SpacingDecision {
            target_xyz: t,
            median_xyz: auto.median_xyz,
            rule: "explicit".into(),
            reason: "given with --spacing or by the pipeline".into(),
        },
    })
}

/// Plans for scanned cases at a target spacing.
pub fn plan_scanned(
    scanned: &[&ScannedCase],
    target: [f64; 3],
    image_dtype: ImageDtype,
) -> Vec<CasePlan> {
    let bpv = match image_dtype {
        ImageDtype::Float32 => 4,
        ImageDtype::Float16 => 2,
    };
    let rows: Vec<(String, [usize; 3], [f64; 3], usize)> = scanned
        .iter()
        .map(|s| {
            let label_bpv = s.label.as_ref().map_or(0, |_| 1);
            (
                s.source.id.clone(),
                s.image.shape_xyz,
                s.image.spacing_xyz,
                label_bpv + s.other_channels.len() * bpv,
            )
        })
        .collect();
    plan_cases(&rows, target, bpv)
}

/// Pool foreground intensities of image channel `channel` over the dataset for CT
/// normalization. Each label is read once (kept as `source` says) to count its foreground, then
/// that channel's file streams past it.
pub fn dataset_foreground(
    scanned: &[&ScannedCase],
    channel: usize,
    source: &nifti_io::SourceOptions,
) -> Result<ForegroundStats> {
    let mut samples = Vec::new();
    for s in scanned {
        let Some(label_path) = &s.source.label else {
            continue;
        };
        if channel >= s.source.images.len() {
            continue;
        }
        let (image_path, frame) = s.source.channel(channel);
        let mut fg = 0u64;
        let (label, _) = nifti_io::VoxelSource::open(label_path, source, &mut |b| {
            fg += b.iter().filter(|&&v| v > 0.0).count() as u64;
            Ok(())
        })?;
        if label.len() as u64 != s.image.voxel_count() {
            return Err(Error::case(
                &s.source.id,
                "image and label hold different numbers of voxels",
            ));
        }
        let mut sampler = normalize::ForegroundSampler::new(fg, 10_000);
        let mut lab = Vec::new();
        nifti_io::stream_f32_frame(image_path, frame, &mut |start, image| {
            lab.resize(image.len(), 0.0);
            label.read_f32(start, &mut lab)?;
            sampler.add(image, |i| lab[i] > 0.0);
            Ok(())
        })?;
        samples.extend(sampler.finish());
    }
    normalize::foreground_stats(samples).ok_or_else(|| {
        Error::Dataset("ct normalization needs labelled foreground, and no case has any".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(median(&v), 2.5);
        assert!((percentile(&v, 10.0) - 1.3).abs() < 1e-12);
    }

    #[test]
    fn isotropic_dataset_takes_the_median() {
        let s = vec![[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [1.0, 1.0, 1.5]];
        let d = auto_spacing(&s, &[[100, 100, 100]; 3]);
        assert_eq!(d.rule, "median");
        assert_eq!(d.target_xyz, [1.0, 1.0, 1.5]);
    }

    #[test]
    fn anisotropy_rule_fires_for_thick_slices() {
        // z spacing 5 (x7) and 1.5 (x3): median 5 > 3 * 0.7 and 20 slices < 512 / 3.
        let mut s = vec![[0.7, 0.7, 5.0]; 7];
        s.extend(vec![[0.7, 0.7, 1.5]; 3]);
        let d = auto_spacing(&s, &vec![[512, 512, 20]; 10]);
        assert_eq!(d.rule, "anisotropy rule");
        assert!(
            (d.target_xyz[2] - percentile(&s.iter().map(|v| v[2]).collect::<Vec<_>>(), 10.0)).abs()
                < 1e-12
        );
        assert_eq!(d.target_xyz[0], 0.7);
    }

    #[test]
    fn the_outlier_is_flagged() {
        let mut cases: Vec<(String, [usize; 3], [f64; 3], usize)> = (0..5)
            .map(|i| (format!("c{i}"), [512, 512, 40], [1.0, 1.0, 5.0], 1))
            .collect();
        cases.push(("big".into(), [512, 512, 61], [4.97, 4.97, 5.0], 1));
        let plans = plan_cases(&cases, [1.0, 1.0, 5.0], 4);
        assert!(plans[5].outlier);
        assert!(plans[..5].iter().all(|p| !p.outlier));
        assert_eq!(plans[5].out_shape_xyz, [2545, 2545, 61]);
    }
}
