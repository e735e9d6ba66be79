//! Additive Gaussian noise.

use crate::util::rng::Rng;

/// Noise of variance `variance` added to every value (channels share it, as in nnU-Net);
/// nothing at variance 0.
#[inline(always)]
pub(super) fn gaussian_noise(image: &mut [f32], variance: f64, rng: &mut Rng) {
    let std = variance.sqrt();
    if std > 0.0 {
        rng.add_normal(image, std);
    }
}
