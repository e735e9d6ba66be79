//! nnU-Net's MaskImageTransform for caches of nnU-Net's preprocessing: its training zeroes
//! each channel it normalized within the nonzero mask wherever its augmented segmentation is
//! -1 (outside that mask, or outside the case: its loader pads the segmentation with -1), after
//! every other transform. The cache holds that mask as an array of its own
//! ([`crate::format::NORM_MASK_ARRAY`]); the loader reads it through the patch's spatial map
//! and mirrorings, as it reads the skeleton, and zeroes the channels where it is 0.

use crate::cache::source::{PatchSource, SpanOut};
use crate::error::Result;

/// A case whose "skeleton" is its normalization mask, so that the spatial reader's nearest-voxel
/// path for the skeleton reads the mask (0 outside the volume, as nnU-Net's -1 padding).
pub(super) struct MaskAsSkeleton<'a>(pub &'a dyn PatchSource);

impl PatchSource for MaskAsSkeleton<'_> {
    fn name(&self) -> String {
        self.0.name()
    }

    fn shape_zyx(&self) -> [usize; 3] {
        self.0.shape_zyx()
    }

    fn has_label(&self) -> bool {
        self.0.has_label()
    }

    fn channels(&self) -> usize {
        self.0.channels()
    }

    fn classes(&self) -> Vec<u16> {
        Vec::new()
    }

    fn fg_coords(&self, _class: u16) -> Result<Vec<[u32; 3]>> {
        Ok(Vec::new())
    }

    fn read_image(&self, start: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
        self.0.read_image(start, size, out)
    }

    fn read_label(&self, start: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        self.0.read_label(start, size, out)
    }

    fn read_spans(
        &self,
        start: [i64; 3],
        size: [usize; 3],
        spans: &[(u32, u32)],
        out: SpanOut,
    ) -> Result<()> {
        match out {
            SpanOut::Skeleton(o) => self.0.read_spans(start, size, spans, SpanOut::NormMask(o)),
            other => self.0.read_spans(start, size, spans, other),
        }
    }

    fn spacing_zyx(&self) -> [f64; 3] {
        self.0.spacing_zyx()
    }

    fn has_skeleton(&self) -> bool {
        true
    }

    fn read_skeleton(&self, start: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        self.0.read_norm_mask(start, size, out)
    }
}

/// Zero `channels` of one patch's `image` ((c, z, y, x), `n` voxels a channel) where `mask` is
/// 0.
pub(super) fn apply(image: &mut [f32], n: usize, channels: &[u16], mask: &[u16]) {
    for &c in channels {
        let Some(ch) = image.get_mut(c as usize * n..(c as usize + 1) * n) else {
            continue;
        };
        for (v, &m) in ch.iter_mut().zip(mask) {
            if m == 0 {
                *v = 0.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_channels_are_zeroed_and_only_outside() {
        let n = 4;
        let mut image: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        apply(&mut image, n, &[0, 2], &[1, 0, 1, 0]);
        assert_eq!(
            image,
            [1.0, 0.0, 3.0, 0.0, 5.0, 6.0, 7.0, 8.0, 9.0, 0.0, 11.0, 0.0]
        );
        // A channel past the image's is ignored, not a panic.
        apply(&mut image, n, &[7], &[0; 4]);
        assert_eq!(image[4..8], [5.0, 6.0, 7.0, 8.0]);
    }
}
