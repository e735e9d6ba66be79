//! A BraTS-like case: a head (zeros outside it, as skull-stripped MRI is) imaged in four MRI
//! contrasts, holding a tumour of three nested parts labelled as BraTS labels them after
//! nnU-Net's conversion: 1 edema (the outer shell), 3 enhancing tumour (a ring inside it), 2
//! necrosis (the centre). Its regions are whole tumour 1+2+3, tumour core 2+3 and enhancing 3.
//!
//! Shapes are deformed spheres whose radius varies with direction through a few random
//! quadratic and linear terms, so only square roots are computed (no libm: the same seed gives
//! the same bytes everywhere, as for the vessels).

use super::SynthCaseSpec;
use crate::util::rng::xoshiro::{fnv1a, mix, Xoshiro};

/// Stream tags of the tumour cases.
const TAG_TUMOUR: u64 = 0x7475_6d6f_7572_0005;
const TAG_TUMOUR_NOISE: u64 = 0x7475_6d6f_7572_0006;

/// The contrasts, in channel order.
pub const CONTRASTS: [&str; 4] = ["T1", "T1ce", "T2", "FLAIR"];

/// Mean intensity of each tissue in each contrast: brain, edema (1), necrosis (2), enhancing (3).
const LEVELS: [[f64; 4]; 4] = [
    // T1: the tumour a little darker, necrosis darkest.
    [600.0, 520.0, 380.0, 540.0],
    // T1ce: the enhancing ring bright.
    [620.0, 560.0, 400.0, 1100.0],
    // T2: edema and necrosis bright.
    [500.0, 900.0, 1050.0, 780.0],
    // FLAIR: edema brightest, necrosis suppressed.
    [450.0, 980.0, 560.0, 820.0],
];
/// Noise standard deviation, and the amplitude of the slow multiplicative bias field.
const NOISE_SD: f64 = 35.0;
const BIAS: f64 = 0.12;

/// A sphere deformed by direction: radius `r` times `1 + sum a_i (u_i . d)^2 + b (v . d)`.
struct Blob {
    centre: [f64; 3],
    r: f64,
    quad: [([f64; 3], f64); 3],
    lin: ([f64; 3], f64),
}

impl Blob {
    fn random(rng: &mut Xoshiro, centre: [f64; 3], r: f64) -> Blob {
        let mut quad = [([0.0; 3], 0.0); 3];
        for q in &mut quad {
            *q = (rng.unit_vector(), rng.range_f64(-0.25, 0.25));
        }
        Blob {
            centre,
            r,
            quad,
            lin: (rng.unit_vector(), rng.range_f64(-0.15, 0.15)),
        }
    }

    /// Distance from the centre over the deformed radius in that direction (< 1 inside).
    fn level(&self, p: [f64; 3]) -> f64 {
        let d = [
            p[0] - self.centre[0],
            p[1] - self.centre[1],
            p[2] - self.centre[2],
        ];
        let n = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
        if n == 0.0 {
            return 0.0;
        }
        let dot = |u: &[f64; 3]| (u[0] * d[0] + u[1] * d[1] + u[2] * d[2]) / n;
        let mut f = 1.0 + self.lin.1 * dot(&self.lin.0);
        for (u, a) in &self.quad {
            f += a * dot(u) * dot(u);
        }
        n / (self.r * f.max(0.3))
    }
}

/// One case: the four contrasts (int16, C order with x fastest) and the label (uint8).
pub fn generate_tumour_case(spec: &SynthCaseSpec, seed: u64) -> (Vec<Vec<i16>>, Vec<u8>) {
    let [nx, ny, nz] = spec.shape_xyz;
    let sp = spec.spacing_xyz;
    let case_seed = mix(mix(seed, TAG_TUMOUR), fnv1a(spec.id.as_bytes()));
    let mut rng = Xoshiro::new(case_seed);
    let extent = [nx as f64 * sp[0], ny as f64 * sp[1], nz as f64 * sp[2]];
    let mid = extent.map(|e| e / 2.0);
    // The head fills most of the field of view; the tumour sits inside it, off centre.
    let head_r = 0.42 * extent.iter().copied().fold(f64::MAX, f64::min);
    let head = Blob {
        centre: mid,
        r: head_r,
        quad: [
            ([1.0, 0.0, 0.0], rng.range_f64(0.0, 0.1)),
            ([0.0, 1.0, 0.0], rng.range_f64(0.05, 0.2)),
            ([0.0, 0.0, 1.0], rng.range_f64(-0.1, 0.0)),
        ],
        lin: ([0.0, 1.0, 0.0], 0.0),
    };
    let whole_r = head_r * rng.range_f64(0.38, 0.52);
    let room = head_r - 1.3 * whole_r;
    let offset = rng
        .unit_vector()
        .map(|u| u * room * rng.range_f64(0.0, 0.8));
    let centre = [mid[0] + offset[0], mid[1] + offset[1], mid[2] + offset[2]];
    let whole = Blob::random(&mut rng, centre, whole_r);
    let core_r = whole_r * rng.range_f64(0.6, 0.75);
    let core = Blob::random(&mut rng, centre, core_r);
    let necrosis_r = core_r * rng.range_f64(0.5, 0.65);
    let necrosis = Blob::random(&mut rng, centre, necrosis_r);
    let bias_dir = rng.unit_vector();

    let n = nx * ny * nz;
    let mut label = vec![0u8; n];
    let mut images: Vec<Vec<i16>> = (0..CONTRASTS.len()).map(|_| vec![0i16; n]).collect();
    let mut noise = Xoshiro::new(mix(case_seed, TAG_TUMOUR_NOISE));
    for z in 0..nz {
        for y in 0..ny {
            for x in 0..nx {
                let p = [
                    (x as f64 + 0.5) * sp[0],
                    (y as f64 + 0.5) * sp[1],
                    (z as f64 + 0.5) * sp[2],
                ];
                if head.level(p) >= 1.0 {
                    continue;
                }
                let i = (z * ny + y) * nx + x;
                let tissue = if necrosis.level(p) < 1.0 {
                    2
                } else if core.level(p) < 1.0 {
                    3
                } else if whole.level(p) < 1.0 {
                    1
                } else {
                    0
                };
                label[i] = tissue as u8;
                // Tissue column: brain 0, edema 1, necrosis 2, enhancing 3.
                let along = (0..3).map(|a| (p[a] - mid[a]) * bias_dir[a]).sum::<f64>() / head_r;
                let bias = 1.0 + BIAS * along;
                for (c, img) in images.iter_mut().enumerate() {
                    let v = LEVELS[c][tissue] * bias + NOISE_SD * noise.gaussian();
                    // Zero is kept for outside the head.
                    img[i] = v.round().clamp(1.0, i16::MAX as f64) as i16;
                }
            }
        }
    }
    (images, label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::VesselStyle;

    #[test]
    fn nested_labels_inside_a_head_of_nonzero_voxels() {
        let spec = SynthCaseSpec {
            id: "brats_000".into(),
            shape_xyz: [64, 72, 56],
            spacing_xyz: [1.0, 1.0, 1.0],
            vessels: VesselStyle::Mixed,
        };
        let (images, label) = generate_tumour_case(&spec, 5);
        assert_eq!(images.len(), 4);
        let count = |v: u8| label.iter().filter(|&&l| l == v).count();
        for v in 1..=3 {
            assert!(count(v) > 20, "label {v}: {} voxels", count(v));
        }
        // Outside the head every contrast is 0, inside none is.
        for (i, &l) in label.iter().enumerate() {
            let zero = images.iter().filter(|im| im[i] == 0).count();
            assert!(zero == 0 || zero == 4, "voxel {i}");
            assert!(l == 0 || zero == 0, "tumour outside the head at {i}");
        }
        assert!(images[0].contains(&0), "the head fills the view");
        // Enhancing is brightest in T1ce.
        let mean = |c: usize, v: u8| {
            let (s, k) = label
                .iter()
                .zip(&images[c])
                .filter(|(l, _)| **l == v)
                .fold((0f64, 0usize), |(s, k), (_, &x)| (s + x as f64, k + 1));
            s / k as f64
        };
        assert!(mean(1, 3) > mean(1, 1) + 300.0);
        assert_eq!(generate_tumour_case(&spec, 5), (images, label));
    }
}
