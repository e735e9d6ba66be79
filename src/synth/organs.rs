//! An organs case, made for the cascade: a body holding two organs of one tissue, wider than a
//! small full-resolution patch, told apart only by a small core near each one's centre (bright
//! in the organ labelled 1, dark in the one labelled 2). A voxel of an organ farther from its
//! core than a patch reaches cannot be classed from that patch: the class needs the context a
//! coarser first stage sees, which is what a cascade (3d_lowres, then 3d_cascade_fullres) is
//! for. Which side holds which organ is drawn per case, so mirroring leaves nothing to learn
//! from the side.
//!
//! Like the other presets, everything is a pure function of the seed and the case id, with no
//! libm calls, so the same seed gives the same bytes everywhere.

use super::SynthCaseSpec;
use crate::util::rng::xoshiro::{fnv1a, mix, Xoshiro};

/// Stream tags of the organs cases.
const TAG_ORGANS: u64 = 0x6f72_6761_6e73_0007;
const TAG_ORGANS_NOISE: u64 = 0x6f72_6761_6e73_0008;

/// Mean intensities: outside the body, body, organ tissue, the bright core, the dark core.
const AIR: f64 = 40.0;
const BODY: f64 = 300.0;
const ORGAN: f64 = 520.0;
const CORE_BRIGHT: f64 = 900.0;
const CORE_DARK: f64 = 160.0;
/// Voxel noise, and the amplitude of the organs' slow texture (equal in both organs).
const NOISE_SD: f64 = 45.0;
const TEXTURE: f64 = 40.0;
/// The cores' radius, in physical units.
const CORE_R: f64 = 5.0;

/// An ellipsoid with axis-aligned semi-axes, its surface bent by a slow wave.
struct Ellipsoid {
    centre: [f64; 3],
    semi: [f64; 3],
    wave: ([f64; 3], f64),
}

impl Ellipsoid {
    /// Below 1 inside.
    fn level(&self, p: [f64; 3]) -> f64 {
        let s: f64 = (0..3)
            .map(|a| (p[a] - self.centre[a]) / self.semi[a])
            .map(|d| d * d)
            .sum();
        let bend = self.wave.1 * tri(dot(self.wave.0, p));
        s * (1.0 + bend)
    }
}

fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

/// A triangle wave of period 1 in [-1, 1]: a smooth-enough, libm-free oscillation.
fn tri(t: f64) -> f64 {
    let f = t - t.floor();
    if f < 0.5 {
        4.0 * f - 1.0
    } else {
        3.0 - 4.0 * f
    }
}

/// The organs' texture at `p`: three slow triangle waves of fixed directions and phases drawn
/// once per case, so both organs' tissue follows the same law.
struct Texture([([f64; 3], f64); 3]);

impl Texture {
    fn at(&self, p: [f64; 3]) -> f64 {
        self.0
            .iter()
            .map(|(k, ph)| tri(dot(*k, p) + ph))
            .sum::<f64>()
            / 3.0
    }
}

/// One case: the image (int16, C order with x fastest) and the label (uint8: 0 background,
/// 1 the organ with a bright core, 2 the organ with a dark core).
pub fn generate_organs_case(spec: &SynthCaseSpec, seed: u64) -> (Vec<i16>, Vec<u8>) {
    let [nx, ny, nz] = spec.shape_xyz;
    let sp = spec.spacing_xyz;
    let case_seed = mix(mix(seed, TAG_ORGANS), fnv1a(spec.id.as_bytes()));
    let mut rng = Xoshiro::new(case_seed);
    let extent = [nx as f64 * sp[0], ny as f64 * sp[1], nz as f64 * sp[2]];
    let mid = extent.map(|e| e / 2.0);
    let body = Ellipsoid {
        centre: mid,
        semi: extent.map(|e| 0.48 * e),
        wave: ([0.0; 3], 0.0),
    };
    // Two organs side by side along x, each up to a quarter of the width across.
    let half = extent[0] / 4.0;
    let mut organs = Vec::with_capacity(2);
    for side in [-1.0, 1.0] {
        let semi = [
            half * rng.range_f64(0.7, 0.82),
            extent[1] * rng.range_f64(0.26, 0.32),
            extent[2] * rng.range_f64(0.28, 0.34),
        ];
        let centre = [
            mid[0] + side * half * rng.range_f64(0.95, 1.05),
            mid[1] + extent[1] * rng.range_f64(-0.06, 0.06),
            mid[2] + extent[2] * rng.range_f64(-0.05, 0.05),
        ];
        let k = rng.unit_vector().map(|u| u / (2.0 * semi[0]));
        let organ = Ellipsoid {
            centre,
            semi,
            wave: (k, rng.range_f64(0.0, 0.15)),
        };
        // The core sits within a fifth of the semi-axes of the centre.
        let core: [f64; 3] =
            std::array::from_fn(|a| centre[a] + semi[a] * rng.range_f64(-0.2, 0.2));
        organs.push((organ, core));
    }
    // Which organ is bright-cored: drawn, so the side tells nothing.
    let bright_first = rng.range_f64(0.0, 1.0) < 0.5;
    let texture = Texture(std::array::from_fn(|_| {
        let period = rng.range_f64(6.0, 12.0);
        (
            rng.unit_vector().map(|u| u / period),
            rng.range_f64(0.0, 1.0),
        )
    }));

    let n = nx * ny * nz;
    let mut label = vec![0u8; n];
    let mut image = vec![0i16; n];
    let mut noise = Xoshiro::new(mix(case_seed, TAG_ORGANS_NOISE));
    for z in 0..nz {
        for y in 0..ny {
            for x in 0..nx {
                let p = [
                    (x as f64 + 0.5) * sp[0],
                    (y as f64 + 0.5) * sp[1],
                    (z as f64 + 0.5) * sp[2],
                ];
                let i = (z * ny + y) * nx + x;
                let mut mean = if body.level(p) < 1.0 { BODY } else { AIR };
                for (o, (organ, core)) in organs.iter().enumerate() {
                    if organ.level(p) >= 1.0 {
                        continue;
                    }
                    let bright = (o == 0) == bright_first;
                    label[i] = if bright { 1 } else { 2 };
                    let d2: f64 = (0..3).map(|a| (p[a] - core[a]) * (p[a] - core[a])).sum();
                    mean = if d2 < CORE_R * CORE_R {
                        if bright {
                            CORE_BRIGHT
                        } else {
                            CORE_DARK
                        }
                    } else {
                        ORGAN + TEXTURE * texture.at(p)
                    };
                }
                let v = mean + NOISE_SD * noise.gaussian();
                image[i] = v.round().clamp(i16::MIN as f64, i16::MAX as f64) as i16;
            }
        }
    }
    (image, label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::VesselStyle;

    fn spec() -> SynthCaseSpec {
        SynthCaseSpec {
            id: "organs_000".into(),
            shape_xyz: [144, 100, 40],
            spacing_xyz: [1.0, 1.0, 1.0],
            vessels: VesselStyle::Mixed,
        }
    }

    #[test]
    fn two_organs_wider_than_a_patch_with_one_core_each() {
        let s = spec();
        let (image, label) = generate_organs_case(&s, 3);
        assert_eq!(generate_organs_case(&s, 3), (image.clone(), label.clone()));
        let nx = s.shape_xyz[0];
        for value in [1u8, 2] {
            let xs: Vec<usize> = (0..label.len())
                .filter(|&i| label[i] == value)
                .map(|i| i % nx)
                .collect();
            let (lo, hi) = (*xs.iter().min().unwrap(), *xs.iter().max().unwrap());
            // Wider than a 48-voxel patch, and on one side of the middle only.
            assert!(hi - lo > 48, "organ {value} spans x {lo}..{hi}");
            assert!(
                hi < nx / 2 + 4 || lo > nx / 2 - 4,
                "organ {value}: {lo}..{hi}"
            );
            // Its core: a few voxels far brighter (1) or darker (2) than the tissue.
            let core = (0..label.len())
                .filter(|&i| label[i] == value)
                .filter(|&i| {
                    if value == 1 {
                        image[i] > 750
                    } else {
                        image[i] < 250
                    }
                })
                .count();
            assert!(
                (200..900).contains(&core),
                "organ {value}: {core} core voxels"
            );
        }
    }

    #[test]
    fn the_bright_organ_is_on_either_side() {
        let s = spec();
        let mut left = [false; 2];
        for seed in 0..16 {
            let (_, label) = generate_organs_case(&s, seed);
            let i = label.iter().position(|&v| v == 1).unwrap();
            left[usize::from(i % s.shape_xyz[0] < s.shape_xyz[0] / 2)] = true;
        }
        assert_eq!(left, [true, true]);
    }
}
