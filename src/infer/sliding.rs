//! Sliding-window inference over a whole cached volume, in bounded memory: the one
//! implementation behind validation and predict.
//!
//! Windows of the patch size step over the volume with the given overlap; each window's softmax
//! is weighted by a Gaussian centred on the window (sigma = 1/8 of the patch, nnU-Net), so
//! window borders, where the network sees least context, count least. Windows are read from the
//! cache a batch at a time, never the whole volume. Scores are accumulated in a slab of z rows:
//! windows are visited in z order, and once every window that can touch a row has been added,
//! the row is final: it is normalized by its weight sum, handed to the caller and dropped. The
//! accumulator holds at most one patch depth of whole slices (classes + 1 floats a voxel).

use candle_core::{Device, Tensor};

use crate::cache::PatchSource;
use crate::error::{Error, Result};
use crate::train::augment::flip_axis;
use crate::train::model::UNet;

/// Window start positions along one axis: first at 0, last at `dim - patch`, evenly spaced with
/// at most `patch * (1 - overlap)` between them; a single 0 when the patch covers the axis.
pub fn window_starts(dim: usize, patch: usize, overlap: f64) -> Vec<usize> {
    if dim <= patch {
        return vec![0];
    }
    let step = ((patch as f64) * (1.0 - overlap)).max(1.0);
    let n = ((dim - patch) as f64 / step).ceil() as usize + 1;
    (0..n)
        .map(|k| ((k * (dim - patch)) as f64 / (n - 1) as f64).round() as usize)
        .collect()
}

/// Gaussian importance map of a patch (C order), peak 1, minimum clamped above zero.
pub fn gaussian_map(patch: [usize; 3]) -> Vec<f32> {
    let axis = |n: usize| -> Vec<f64> {
        let sigma = n as f64 / 8.0;
        let c = (n as f64 - 1.0) / 2.0;
        (0..n)
            .map(|i| {
                let d = i as f64 - c;
                (-d * d / (2.0 * sigma * sigma)).exp()
            })
            .collect()
    };
    let (gz, gy, gx) = (axis(patch[0]), axis(patch[1]), axis(patch[2]));
    let mut out = Vec::with_capacity(patch.iter().product());
    for z in &gz {
        for y in &gy {
            for x in &gx {
                out.push((z * y * x).max(1e-3) as f32);
            }
        }
    }
    out
}

/// Every non-empty set of `axes` (as a bit mask over z, y, x): the flips test-time mirroring
/// averages over, besides the identity.
fn flip_sets(axes: &[usize]) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for mask in 1u32..(1 << axes.len()) {
        out.push(
            axes.iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, &a)| a)
                .collect(),
        );
    }
    out
}

/// Receives final rows: `(z0, rows, probabilities)` (see [`Predictor::predict`]).
pub type RowSink<'a> = dyn FnMut(usize, usize, &[f32]) -> Result<()> + 'a;

/// A sliding-window predictor.
pub struct Predictor<'a> {
    /// The network.
    pub model: &'a UNet,
    /// Where it runs.
    pub device: &'a Device,
    /// Window size (z, y, x): the training patch.
    pub patch: [usize; 3],
    /// Fraction of a window its neighbour overlaps, in 0..1.
    pub overlap: f64,
    /// Windows per forward pass.
    pub batch: usize,
    /// Axes (0 z, 1 y, 2 x) to mirror over at test time: the softmax is averaged over every
    /// combination of flips of them (2^k passes); empty for none.
    pub mirror_axes: Vec<usize>,
    /// Told the number of windows each forward pass (a batch) has done: progress reports.
    pub on_windows: Option<&'a (dyn Fn(usize) + Sync)>,
}

impl Predictor<'_> {
    /// How many windows a volume of `shape_zyx` takes.
    pub fn window_count(&self, shape_zyx: [usize; 3]) -> usize {
        (0..3)
            .map(|a| window_starts(shape_zyx[a], self.patch[a], self.overlap).len())
            .product()
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.overlap) {
            return Err(Error::Config(format!(
                "sliding-window overlap must be in 0..1, got {}",
                self.overlap
            )));
        }
        if let Some(a) = self.mirror_axes.iter().find(|&&a| a > 2) {
            return Err(Error::Config(format!(
                "mirror axis {a}: axes are 0 (z), 1 (y), 2 (x)"
            )));
        }
        Ok(())
    }

    /// Predict one cached case. `on_rows(z0, rows, probs)` receives the final class
    /// probabilities of rows `z0..z0 + rows` in z order, voxel-major (`classes` values per
    /// voxel, voxels in C order over (rows, y, x)); every row is handed over exactly once.
    pub fn predict<S: PatchSource + ?Sized>(
        &self,
        entry: &S,
        on_rows: &mut RowSink<'_>,
    ) -> Result<()> {
        self.validate()?;
        let classes = self.model.config().num_classes;
        let in_ch = self.model.config().in_channels;
        let ch = entry.channels();
        if ch != in_ch {
            return Err(Error::case(
                entry.name(),
                format!("the image has {ch} channels but the model takes {in_ch}"),
            ));
        }
        let shape = entry.shape_zyx();
        let p = self.patch;
        let pv: usize = p.iter().product();
        let starts: Vec<Vec<usize>> = (0..3)
            .map(|a| window_starts(shape[a], p[a], self.overlap))
            .collect();
        let gauss = gaussian_map(p);
        let flips = flip_sets(&self.mirror_axes);
        let passes = (flips.len() + 1) as f32;
        let plane = shape[1] * shape[2];
        let stride = classes + 1; // class scores then the weight sum, per voxel
                                  // The slab holds rows slab_z0.. of the volume.
        let mut slab_z0 = 0usize;
        let mut slab: Vec<f32> = Vec::new();
        let mut image = vec![0f32; ch * pv];
        let mut done: Vec<f32> = Vec::new();
        for (k, &zs) in starts[0].iter().enumerate() {
            let z_end = (zs + p[0]).min(shape[0]);
            let need = (z_end - slab_z0) * plane * stride;
            if slab.len() < need {
                slab.resize(need, 0.0);
            }
            let windows: Vec<[usize; 3]> = starts[1]
                .iter()
                .flat_map(|&y| starts[2].iter().map(move |&x| [zs, y, x]))
                .collect();
            for group in windows.chunks(self.batch.max(1)) {
                let mut input = Vec::with_capacity(group.len() * ch * pv);
                for w in group {
                    entry.read_image([w[0] as i64, w[1] as i64, w[2] as i64], p, &mut image)?;
                    input.extend_from_slice(&image);
                }
                let mut probs = self.forward(&input, group.len(), ch)?;
                // Mirroring: the same windows flipped, predicted, flipped back and averaged.
                for axes in &flips {
                    let mut x = input.clone();
                    for a in axes {
                        x.chunks_exact_mut(pv).for_each(|c| flip_axis(c, p, *a));
                    }
                    let mut y = self.forward(&x, group.len(), ch)?;
                    for a in axes {
                        y.chunks_exact_mut(pv).for_each(|c| flip_axis(c, p, *a));
                    }
                    probs.iter_mut().zip(&y).for_each(|(s, v)| *s += v);
                }
                if !flips.is_empty() {
                    probs.iter_mut().for_each(|v| *v /= passes);
                }
                if let Some(f) = self.on_windows {
                    f(group.len());
                }
                for (wi, w) in group.iter().enumerate() {
                    let base = wi * classes * pv;
                    for dz in 0..p[0].min(shape[0] - w[0]) {
                        let z = w[0] + dz;
                        for dy in 0..p[1].min(shape[1] - w[1]) {
                            let y = w[1] + dy;
                            let row = ((z - slab_z0) * plane + y * shape[2] + w[2]) * stride;
                            for dx in 0..p[2].min(shape[2] - w[2]) {
                                let i = (dz * p[1] + dy) * p[2] + dx;
                                let g = gauss[i];
                                let o = row + dx * stride;
                                for c in 0..classes {
                                    slab[o + c] += g * probs[base + c * pv + i];
                                }
                                slab[o + classes] += g;
                            }
                        }
                    }
                }
            }
            // Rows before the next window's start are final.
            let done_to = starts[0]
                .get(k + 1)
                .copied()
                .unwrap_or(shape[0])
                .min(shape[0]);
            if done_to > slab_z0 {
                let rows = done_to - slab_z0;
                done.clear();
                done.reserve(rows * plane * classes);
                for v in slab[..rows * plane * stride].chunks_exact(stride) {
                    let w = v[classes].max(f32::MIN_POSITIVE);
                    done.extend(v[..classes].iter().map(|s| s / w));
                }
                on_rows(slab_z0, rows, &done)?;
                slab.drain(..rows * plane * stride);
                slab_z0 = done_to;
            }
        }
        Ok(())
    }

    /// Softmax of a batch of `n` windows of `ch` channels: (n, classes, patch) flat.
    fn forward(&self, input: &[f32], n: usize, ch: usize) -> Result<Vec<f32>> {
        let p = self.patch;
        let x = Tensor::from_slice(input, (n, ch, p[0], p[1], p[2]), self.device)?;
        let probs = candle_nn::ops::softmax(&self.model.forward(&x)?, 1)?;
        Ok(probs.flatten_all()?.to_device(&Device::Cpu)?.to_vec1()?)
    }
}

/// Index of the largest value (the first on a tie).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_axis_with_the_overlap() {
        assert_eq!(window_starts(10, 16, 0.5), vec![0]);
        assert_eq!(window_starts(16, 16, 0.5), vec![0]);
        assert_eq!(window_starts(32, 16, 0.5), vec![0, 8, 16]);
        let s = window_starts(100, 16, 0.5);
        assert_eq!((s[0], *s.last().unwrap()), (0, 84));
        assert!(s.windows(2).all(|w| w[1] > w[0] && w[1] - w[0] <= 8));
    }

    #[test]
    fn gaussian_peaks_in_the_middle() {
        let g = gaussian_map([4, 8, 8]);
        let at = |z: usize, y: usize, x: usize| g[(z * 8 + y) * 8 + x];
        assert!(at(1, 3, 3) > at(0, 0, 0));
        assert!(g.iter().all(|&v| v > 0.0 && v <= 1.0));
        assert_eq!(at(1, 3, 4), at(2, 4, 3));
    }

    #[test]
    fn mirroring_visits_every_combination_of_flips() {
        assert_eq!(flip_sets(&[]), Vec::<Vec<usize>>::new());
        assert_eq!(
            flip_sets(&[0, 1, 2]),
            vec![
                vec![0],
                vec![1],
                vec![0, 1],
                vec![2],
                vec![0, 2],
                vec![1, 2],
                vec![0, 1, 2]
            ]
        );
    }
}
