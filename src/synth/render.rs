//! Render one case: tubes drawn until the vessel fraction reaches its target, then the image as
//! background plus vessel signal, attenuated with depth, plus Gaussian noise.

use super::rng::{fnv1a, mix, Rng};
use super::vessels::{Grid, Tube};
use super::{SynthCaseSpec, TAG_CASE, TAG_NOISE};

/// Background level of the image.
const BACKGROUND: f64 = 100.0;
/// Standard deviation of the additive Gaussian noise.
const NOISE_SD: f64 = 20.0;
/// Upper bounds on the work done for one case.
const MAX_TUBES: usize = 2000;
const MAX_ATTEMPTS: usize = 6000;

/// Generate one case: returns (image int16 values, label u8 values), both in C order with axes
/// (z, y, x), i.e. x varies fastest, length nx*ny*nz.
///
/// The content depends only on `seed`, `spec.id`, the shape and the spacing.
///
/// # Panics
///
/// If a spacing is not finite and positive.
pub fn generate_case(spec: &SynthCaseSpec, seed: u64) -> (Vec<i16>, Vec<u8>) {
    let [nx, ny, nz] = spec.shape_xyz;
    let sp = spec.spacing_xyz;
    assert!(
        sp.iter().all(|s| s.is_finite() && *s > 0.0),
        "synthetic case {}: spacing {:?} must be finite and positive",
        spec.id,
        sp
    );
    let nvox = nx * ny * nz;
    // `signal` holds the vessel intensity above background (0 outside vessels) until the final
    // pass turns it into the image, so a case never needs more than its two output buffers.
    let mut signal = vec![0i16; nvox];
    let mut label = vec![0u8; nvox];
    if nvox == 0 {
        return (signal, label);
    }

    let case_seed = mix(mix(seed, TAG_CASE), fnv1a(spec.id.as_bytes()));
    let mut rng = Rng::new(case_seed);
    let grid = Grid {
        n: [nx, ny, nz],
        sp,
    };

    // Vessel volume fraction to aim for and the largest share a single tube may take of it.
    let target_frac = rng.range_f64(0.02, 0.08);
    let target_voxels = (target_frac * nvox as f64).ceil() as usize;
    let target_um3 = target_frac * grid.volume_um3();

    let mut labeled = 0usize;
    let mut accepted = 0usize;
    let mut smallest: Option<(f64, Tube)> = None;
    let mut attempts = 0;
    while labeled < target_voxels && accepted < MAX_TUBES && attempts < MAX_ATTEMPTS {
        attempts += 1;
        let tube = Tube::random(&grid, &mut rng);
        let est = tube.volume_inside_um3(&grid);
        if est > 0.75 * target_um3 {
            if smallest.as_ref().is_none_or(|(v, _)| est < *v) {
                smallest = Some((est, tube));
            }
            continue;
        }
        labeled += tube.rasterize(&grid, &mut signal, &mut label);
        accepted += 1;
    }
    if accepted == 0 {
        // A field of view too small for any tube to fit the budget: draw the thinnest one seen.
        if let Some((_, tube)) = smallest {
            tube.rasterize(&grid, &mut signal, &mut label);
        }
    }

    // Image = (background + vessel signal) attenuated with depth, plus Gaussian noise.
    let atten_len_um = rng.range_f64(800.0, 1600.0);
    let mut noise = Rng::new(mix(case_seed, TAG_NOISE));
    let plane = nx * ny;
    for (z, slab) in signal.chunks_exact_mut(plane).enumerate() {
        let depth = z as f64 * sp[2];
        let att = 1.0 / (1.0 + depth / atten_len_um);
        let mut pairs = slab.chunks_exact_mut(2);
        for pair in &mut pairs {
            let (g0, g1) = noise.gaussian_pair();
            pair[0] = to_i16((BACKGROUND + pair[0] as f64) * att + NOISE_SD * g0);
            pair[1] = to_i16((BACKGROUND + pair[1] as f64) * att + NOISE_SD * g1);
        }
        if let [last] = pairs.into_remainder() {
            let (g0, _) = noise.gaussian_pair();
            *last = to_i16((BACKGROUND + *last as f64) * att + NOISE_SD * g0);
        }
    }
    (signal, label)
}

fn to_i16(v: f64) -> i16 {
    v.round().clamp(i16::MIN as f64, i16::MAX as f64) as i16
}
