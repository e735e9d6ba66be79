//! Deterministic synthetic two-photon-microscopy-like vessel datasets.
//!
//! The generator writes the Medical Segmentation Decathlon / nnU-Net layout:
//!
//! ```text
//! OUT/imagesTr/{id}_0000.nii.gz   image, int16
//! OUT/labelsTr/{id}.nii.gz        label, uint8 (0 background, 1 vessel)
//! OUT/dataset.json                nnU-Net style description of the cases
//! ```
//!
//! Vessels are tubes along smooth random 3D curves defined in physical units (micrometers), so
//! the same anatomy scale appears whatever the voxel spacing. The number of tubes is chosen so
//! that the vessel volume fraction lands near a per-case target (a few percent), which keeps thin
//! slabs and large volumes equally plausible.
//!
//! Everything is a pure function of the seed and the case id: the PRNG is private, the Gaussian
//! uses the polar Box-Muller method with a hand-written logarithm, and no libm function is called,
//! so the same seed gives byte-identical files on every platform.
//!
//! This module holds the case specs and presets; the stages of a case are in `vessels` (tube
//! geometry and rasterization), `render` (one case's image and label), `write` (the dataset
//! folder and `dataset.json`) and `nifti_write` (one volume as NIfTI-1), all drawing from `rng`.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

mod organs;
mod render;
mod tumour;
mod vessels;
mod write;

pub use organs::generate_organs_case;
pub use render::{generate_case, second_channel};
pub use tumour::{generate_tumour_case, CONTRASTS};
pub use vessels::VesselStyle;
pub use write::{write_dataset, write_dataset_as};

use crate::util::rng::xoshiro::{mix, Xoshiro};

/// What a synthetic case is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthLayout {
    /// One channel (`_0000`, two-photon-like int16) and labels 0 and 1 (vessel).
    Vessels,
    /// Two channels (`_0000` two-photon-like, `_0001` CT-like, both int16) and labels 0,
    /// 1 vessel, 2 bright vessel, 3 ignore.
    MultiChannel,
    /// Four MRI contrasts (`_0000` T1, `_0001` T1ce, `_0002` T2, `_0003` FLAIR) of a head with
    /// a tumour, labels 1 edema, 2 necrosis, 3 enhancing, and dataset.json regions whole
    /// tumour 1+2+3, tumour core 2+3, enhancing 3 (BraTS as nnU-Net trains it).
    Regions,
    /// One channel (`_0000`, MRI-like int16) of a body holding two organs of one tissue,
    /// labels 1 the organ with a bright core and 2 the one with a dark core: structures wider
    /// than a small patch, classed only with context (the cascade's case).
    Organs,
}

/// One synthetic case: its id (file stem), grid shape, voxel spacing in micrometers and the
/// kind of vessels it has.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthCaseSpec {
    /// Case id (the file stem).
    pub id: String,
    /// Grid shape (x, y, z) in voxels.
    pub shape_xyz: [usize; 3],
    /// Voxel spacing (x, y, z) in micrometers.
    pub spacing_xyz: [f64; 3],
    /// What kind of vessels it has.
    pub vessels: VesselStyle,
}

/// Named collections of synthetic cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthPreset {
    /// 10 small cases (in-plane 48..80, 5..24 slices) with heterogeneous spacings including one
    /// (4.97, 4.97, 5.0) outlier: the bundled default dataset.
    Small,
    /// 70 cases of 512x512 in-plane and 5..110 slices with the spacing mix of MiniVess.
    Minivess,
    /// The single real-world outlier on its own: one 512x512x61 case at (4.97, 4.97, 5.0), which
    /// grows to 2545x2545x305 when resampled to 1 um (a benchmark of out-of-core resampling).
    Outlier,
    /// 10 small cases like `small`, with two channels (the two-photon image, and a CT-like
    /// one whose dataset.json name "CT" picks CT normalization) and labels 0 background,
    /// 1 vessel, 2 bright vessel (brighter in the CT channel) and 3 "ignore" (unannotated
    /// slices, nnU-Net's ignore label).
    Multichannel,
    /// 10 cases at 1 um isotropic (64..96 in-plane, 32..48 slices) of thin, tortuous,
    /// branching vessels one to three voxels across ([`VesselStyle::Thin`]): where Dice barely
    /// moves when a vessel breaks, and topology-aware losses and metrics matter.
    Thin,
    /// 12 cases on a CT-like grid (spacings in um like every preset, shapes and ratios of an
    /// abdominal CT set): 512x512 in-plane at 0.62..0.98, 30..90 thick slices of 2.5 or 5.0,
    /// so that planners see strong, mixed anisotropy (nnU-Net's 1x3x3 kernels and
    /// 10th-percentile z spacing).
    CtLike,
    /// 12 cases on a brain-MRI-like grid: 1.0 isotropic (two at 0.94x0.94x1.2), 160..192 x
    /// 192..224 x 140..176 voxels: the isotropic case of every planner.
    MriLike,
    /// 12 BraTS-like brain tumour cases ([`SynthLayout::Regions`]) at 1.0 isotropic, 64..80 x
    /// 72..88 x 56..72 voxels: four contrasts and three nested regions, trained as nnU-Net
    /// trains BraTS (one sigmoid output per region).
    BratsLike,
    /// 12 cases at 1.0 isotropic (136..152 x 96..108 x 36..44 voxels) of a body holding two
    /// organs of one tissue, each wider than 48 voxels, told apart only by a small core (bright
    /// in label 1, dark in label 2) ([`SynthLayout::Organs`]): a voxel's class needs more
    /// context than a small full-resolution patch holds, which a cascade's first stage sees.
    Organs,
}

impl SynthPreset {
    /// Every preset, in the order they are listed to users.
    pub const ALL: [SynthPreset; 9] = [
        SynthPreset::Small,
        SynthPreset::Minivess,
        SynthPreset::Outlier,
        SynthPreset::Multichannel,
        SynthPreset::Thin,
        SynthPreset::CtLike,
        SynthPreset::MriLike,
        SynthPreset::BratsLike,
        SynthPreset::Organs,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SynthPreset::Small => "small",
            SynthPreset::Minivess => "minivess",
            SynthPreset::Outlier => "outlier",
            SynthPreset::Multichannel => "multichannel",
            SynthPreset::Thin => "thin",
            SynthPreset::CtLike => "ct-like",
            SynthPreset::MriLike => "mri-like",
            SynthPreset::BratsLike => "brats-like",
            SynthPreset::Organs => "organs",
        }
    }

    /// The files and classes the preset's cases have.
    pub fn layout(self) -> SynthLayout {
        match self {
            SynthPreset::Multichannel => SynthLayout::MultiChannel,
            SynthPreset::BratsLike => SynthLayout::Regions,
            SynthPreset::Organs => SynthLayout::Organs,
            _ => SynthLayout::Vessels,
        }
    }
}

impl fmt::Display for SynthPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SynthPreset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim();
        SynthPreset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| {
                let choices: Vec<&str> = SynthPreset::ALL.iter().map(|p| p.name()).collect();
                Error::Config(format!(
                    "unknown synthetic preset '{s}': choose one of {}",
                    choices.join(", ")
                ))
            })
    }
}

// ---------------------------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------------------------

/// Spacing mix of the MiniVess preset (x, y, z in micrometers) and how many cases get each.
const MINIVESS_SPACINGS: [([f64; 3], usize); 10] = [
    ([0.99, 0.99, 5.0], 31),
    ([0.62, 0.62, 5.0], 20),
    ([0.99, 0.99, 2.0], 8),
    ([0.62, 0.62, 10.0], 5),
    ([4.97, 4.97, 5.0], 1),
    ([2.48, 2.48, 5.0], 1),
    ([0.31, 0.31, 1.0], 1),
    ([1.24, 1.24, 3.0], 1),
    ([0.62, 0.62, 1.0], 1),
    ([0.99, 0.99, 10.0], 1),
];

/// The in-plane outlier spacing (its cases grow ~25x in-plane when resampled to ~1 um).
const OUTLIER_SPACING: [f64; 3] = [4.97, 4.97, 5.0];

/// Spacings of the Small preset, all taken from the MiniVess mix, with exactly one outlier.
const SMALL_SPACINGS: [[f64; 3]; 10] = [
    [0.99, 0.99, 5.0],
    [0.99, 0.99, 5.0],
    [0.62, 0.62, 5.0],
    [0.62, 0.62, 5.0],
    [0.99, 0.99, 2.0],
    [0.62, 0.62, 10.0],
    OUTLIER_SPACING,
    [2.48, 2.48, 5.0],
    [1.24, 1.24, 3.0],
    [0.99, 0.99, 10.0],
];

/// Stream tags, so that different uses of one seed draw independent sequences.
const TAG_PRESET: u64 = 0x7072_6573_6574_0001;
const TAG_CASE: u64 = 0x6361_7365_0000_0002;
const TAG_NOISE: u64 = 0x6e6f_6973_6500_0003;

/// Shape of the in-plane outlier case (the real one from MiniVess).
const OUTLIER_SHAPE: [usize; 3] = [512, 512, 61];

/// The cases of a preset. Deterministic in `seed`; ids are `vessels_000`, `vessels_001`, ...
/// (the Outlier preset's single case is `vessels_outlier`).
pub fn preset_cases(preset: SynthPreset, seed: u64) -> Vec<SynthCaseSpec> {
    let mut rng = Xoshiro::new(mix(seed, TAG_PRESET ^ preset as u64));
    let mut specs: Vec<([usize; 3], [f64; 3])> = Vec::new();
    match preset {
        SynthPreset::Minivess => {
            let mut spacings: Vec<[f64; 3]> = MINIVESS_SPACINGS
                .iter()
                .flat_map(|&(sp, n)| std::iter::repeat_n(sp, n))
                .collect();
            rng.shuffle(&mut spacings);
            for sp in spacings {
                let nz = if sp == OUTLIER_SPACING {
                    OUTLIER_SHAPE[2]
                } else {
                    rng.range_usize(5, 110)
                };
                specs.push(([512, 512, nz], sp));
            }
        }
        SynthPreset::Small | SynthPreset::Multichannel => {
            let mut spacings = SMALL_SPACINGS.to_vec();
            rng.shuffle(&mut spacings);
            for sp in spacings {
                let nx = rng.range_usize(48, 80);
                let ny = rng.range_usize(48, 80);
                let nz = rng.range_usize(5, 24);
                specs.push(([nx, ny, nz], sp));
            }
            // Guarantee at least one 5-slice case.
            let thin = rng.range_usize(0, specs.len() - 1);
            specs[thin].0[2] = 5;
        }
        SynthPreset::Outlier => specs.push((OUTLIER_SHAPE, OUTLIER_SPACING)),
        SynthPreset::Thin => {
            for _ in 0..10 {
                let nx = rng.range_usize(64, 96);
                let ny = rng.range_usize(64, 96);
                let nz = rng.range_usize(32, 48);
                specs.push(([nx, ny, nz], [1.0, 1.0, 1.0]));
            }
        }
        SynthPreset::CtLike => {
            for i in 0..12 {
                let inplane = (62 + 4 * rng.range_usize(0, 9)) as f64 / 100.0;
                let z = if i % 3 == 0 { 2.5 } else { 5.0 };
                let nz = rng.range_usize(30, 90);
                specs.push(([512, 512, nz], [inplane, inplane, z]));
            }
        }
        SynthPreset::BratsLike => {
            for _ in 0..12 {
                let nx = rng.range_usize(64, 80);
                let ny = rng.range_usize(72, 88);
                let nz = rng.range_usize(56, 72);
                specs.push(([nx, ny, nz], [1.0, 1.0, 1.0]));
            }
        }
        SynthPreset::Organs => {
            for _ in 0..12 {
                let nx = rng.range_usize(136, 152);
                let ny = rng.range_usize(96, 108);
                let nz = rng.range_usize(36, 44);
                specs.push(([nx, ny, nz], [1.0, 1.0, 1.0]));
            }
        }
        SynthPreset::MriLike => {
            for i in 0..12 {
                let sp = if i % 6 == 5 {
                    [0.94, 0.94, 1.2]
                } else {
                    [1.0, 1.0, 1.0]
                };
                let nx = rng.range_usize(160, 192);
                let ny = rng.range_usize(192, 224);
                let nz = rng.range_usize(140, 176);
                specs.push(([nx, ny, nz], sp));
            }
        }
    }
    let vessels = match preset {
        SynthPreset::Thin => VesselStyle::Thin,
        _ => VesselStyle::Mixed,
    };
    specs
        .into_iter()
        .enumerate()
        .map(|(i, (shape_xyz, spacing_xyz))| SynthCaseSpec {
            id: match preset {
                SynthPreset::Outlier => "vessels_outlier".to_string(),
                SynthPreset::BratsLike => format!("brats_{i:03}"),
                SynthPreset::Organs => format!("organs_{i:03}"),
                _ => format!("vessels_{i:03}"),
            },
            shape_xyz,
            spacing_xyz,
            vessels,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outlier_preset_is_the_single_real_outlier() {
        for seed in [0, 7, 123] {
            let cases = preset_cases(SynthPreset::Outlier, seed);
            assert_eq!(
                cases,
                vec![SynthCaseSpec {
                    id: "vessels_outlier".to_string(),
                    shape_xyz: [512, 512, 61],
                    spacing_xyz: [4.97, 4.97, 5.0],
                    vessels: VesselStyle::Mixed,
                }]
            );
        }
        assert_eq!(
            "outlier".parse::<SynthPreset>().unwrap(),
            SynthPreset::Outlier
        );
        assert_eq!(SynthPreset::Outlier.to_string(), "outlier");
        assert!(SynthPreset::ALL.contains(&SynthPreset::Outlier));
        // The Minivess preset's outlier has the same shape and spacing.
        let minivess = preset_cases(SynthPreset::Minivess, 7);
        assert!(minivess
            .iter()
            .any(|c| c.shape_xyz == [512, 512, 61] && c.spacing_xyz == [4.97, 4.97, 5.0]));
    }

    #[test]
    fn ct_like_is_anisotropic_and_mri_like_isotropic() {
        let ct = preset_cases("ct-like".parse().unwrap(), 3);
        assert_eq!(ct.len(), 12);
        for c in &ct {
            let [x, y, z] = c.spacing_xyz;
            assert!(
                x == y && (0.62..=0.98).contains(&x) && z / x >= 2.5,
                "{c:?}"
            );
            assert!(c.shape_xyz[0] == 512 && (30..=90).contains(&c.shape_xyz[2]));
        }
        let mri = preset_cases(SynthPreset::MriLike, 3);
        assert_eq!(mri.len(), 12);
        assert!(mri
            .iter()
            .all(|c| c.spacing_xyz[2] / c.spacing_xyz[0] < 1.3));
        assert_eq!(SynthPreset::MriLike.to_string(), "mri-like");
    }
}
