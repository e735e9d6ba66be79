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

use super::gaussian::f16_round;
pub use super::gaussian::{gaussian_map, nnunet_gaussian};
use crate::cache::PatchSource;
use crate::error::{Error, Result};
use crate::geometry::mirror;
use crate::model::memory::inference_pass;
use crate::model::unet::UNet;

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

/// Whose sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Flavour {
    /// Ours, for models we train: softmax probabilities accumulated in f32, window starts
    /// rounded half away from zero, a Gaussian centred at (n - 1) / 2.
    #[default]
    Voxcache,
    /// Ours for a region model: the same, with each output's sigmoid in place of the softmax.
    VoxcacheRegions,
    /// nnU-Net v2's, for its models, as its predictor computes it: logits; window starts
    /// rounded half to even over the volume padded (centred) to at least the patch; its
    /// Gaussian (a filtered delta at n // 2, peak 10, float16); float16 accumulators; mirrors in
    /// its order. `planar`: a 2D network, every slice on its own (patch depth 1).
    Nnunet {
        /// A 2D network.
        planar: bool,
    },
}

impl Flavour {
    /// Ours for a model whose outputs are regions (sigmoids) or classes (a softmax).
    pub fn ours(regions: bool) -> Flavour {
        match regions {
            true => Flavour::VoxcacheRegions,
            false => Flavour::Voxcache,
        }
    }
}

/// nnU-Net's window starts along one axis of `dim` (already padded to at least `patch`):
/// `int(np.round(i * (dim - patch) / (n - 1)))`, half to even.
pub fn nnunet_starts(dim: usize, patch: usize, step: f64) -> Vec<usize> {
    let n = nnunet_window_count(dim, patch, step);
    if n <= 1 {
        return vec![0];
    }
    let actual = (dim - patch) as f64 / (n - 1) as f64;
    (0..n)
        .map(|i| (actual * i as f64).round_ties_even() as usize)
        .collect()
}

/// How many windows [`nnunet_starts`] places along the axis, counted without placing them:
/// nnU-Net's `ceil((dim - patch) / (patch * step)) + 1`, at most one per start position (a
/// step under one voxel, which predict refuses, would repeat windows).
pub fn nnunet_window_count(dim: usize, patch: usize, step: f64) -> usize {
    let span = dim.saturating_sub(patch);
    let n = (span as f64 / (patch as f64 * step)).ceil();
    if n.is_finite() && n >= 0.0 {
        (n.min(span as f64) as usize) + 1
    } else {
        span + 1
    }
}

/// nnU-Net's order of the flips: by size, then as itertools.combinations lists them.
fn nnunet_flip_sets(axes: &[usize]) -> Vec<Vec<usize>> {
    let mut out = flip_sets(axes);
    out.sort_by_key(|set| {
        let pos: Vec<usize> = set
            .iter()
            .map(|a| axes.iter().position(|b| b == a).unwrap_or(0))
            .collect();
        (set.len(), pos)
    });
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

/// A block of final rows: slices `z0..z0 + rows`, rows `y0..y0 + height` of each, every x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    /// First slice.
    pub z0: usize,
    /// Slices.
    pub rows: usize,
    /// First row (y).
    pub y0: usize,
    /// Rows (y).
    pub height: usize,
}

/// Receives each [`Tile`]'s probabilities, voxel-major over (rows, height, x).
pub type TileSink<'a> = dyn FnMut(Tile, &[f32]) -> Result<()> + 'a;

/// Bands along y for [`Predictor::predict_tiled`]: (output rows y0..y1, the y starts of the
/// windows that touch them). As many window rows a band as keep its slab (a patch depth of
/// slices, the band's window span, every x, classes + 1 floats; one slice more) under `budget`; one
/// band of the whole plane when it fits, one window row a band at least.
pub fn y_bands(
    ys: &[usize],
    shape: [usize; 3],
    patch: [usize; 3],
    classes: usize,
    budget: usize,
) -> Vec<((usize, usize), Vec<usize>)> {
    let bands_of = |k: usize| -> Vec<((usize, usize), Vec<usize>)> {
        let bounds: Vec<usize> = (0..ys.len())
            .step_by(k)
            .map(|i| if i == 0 { 0 } else { ys[i] })
            .chain([shape[1]])
            .collect();
        bounds
            .windows(2)
            .map(|b| {
                let touching = ys
                    .iter()
                    .copied()
                    .filter(|&y| y < b[1] && y + patch[1] > b[0])
                    .collect();
                ((b[0], b[1]), touching)
            })
            .collect()
    };
    let bytes = |bands: &[((usize, usize), Vec<usize>)]| {
        bands
            .iter()
            .map(|(_, w)| {
                let span = w.last().map_or(0, |&y| (y + patch[1]).min(shape[1])) - w[0];
                // The slab (one patch depth of rows, scores and weight a voxel) and one final
                // slice being handed over.
                let slab = patch[0].min(shape[0]) * span * shape[2] * (classes + 1);
                (slab + span * shape[2] * classes) * 4
            })
            .max()
            .unwrap_or(0)
    };
    let mut k = ys.len().max(1);
    loop {
        let bands = bands_of(k);
        if k == 1 || bytes(&bands) <= budget {
            return bands;
        }
        k = k.div_ceil(2).min(k - 1);
    }
}

/// Window rows run over the y starts `ys` once [`y_bands`] has cut the plane into bands
/// under `budget` (a window touching two bands runs for each).
pub fn banded_rows(
    ys: &[usize],
    shape: [usize; 3],
    patch: [usize; 3],
    classes: usize,
    budget: usize,
) -> usize {
    y_bands(ys, shape, patch, classes, budget)
        .iter()
        .map(|(_, w)| w.len())
        .sum()
}

/// The largest forecast pass ([`inference_pass`]) that mirrored copies are stacked into.
const STACKED_PASS: u64 = 256 << 20;

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
    /// Ours, or nnU-Net's for its models.
    pub flavour: Flavour,
}

impl Predictor<'_> {
    /// Window starts along axis `a` of a volume of `dim`, in volume coordinates (negative where
    /// nnU-Net pads a volume smaller than the patch).
    fn starts(&self, a: usize, dim: usize) -> Vec<i64> {
        let p = self.patch[a];
        match self.flavour {
            Flavour::Voxcache | Flavour::VoxcacheRegions => window_starts(dim, p, self.overlap)
                .into_iter()
                .map(|s| s as i64)
                .collect(),
            Flavour::Nnunet { planar: true } if a == 0 => (0..dim as i64).collect(),
            Flavour::Nnunet { .. } => {
                let padded = dim.max(p);
                let below = ((padded - dim) / 2) as i64;
                nnunet_starts(padded, p, 1.0 - self.overlap)
                    .into_iter()
                    .map(|s| s as i64 - below)
                    .collect()
            }
        }
    }

    /// How many windows [`Self::predict_tiled`] runs over a volume of `shape_zyx` with a slab
    /// of `budget` bytes (windows on band borders count once a band).
    pub fn window_count(&self, shape_zyx: [usize; 3], budget: usize) -> usize {
        let starts = |a: usize| self.starts(a, shape_zyx[a]);
        let classes = self.model.config().num_classes;
        let rows = banded_rows(
            &band_starts(&starts(1)),
            shape_zyx,
            self.patch,
            classes,
            budget,
        );
        starts(0).len() * rows * starts(2).len()
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
    /// Memory: a slab of whole slices (see [`Self::predict_tiled`] to bound it).
    pub fn predict<S: PatchSource + ?Sized>(
        &self,
        entry: &S,
        on_rows: &mut RowSink<'_>,
    ) -> Result<()> {
        let shape = entry.shape_zyx();
        let ys = self.starts(1, shape[1]);
        self.sweep(entry, (0, shape[1]), &ys, &mut |t, probs| {
            on_rows(t.z0, t.rows, probs)
        })
    }

    /// [`Self::predict`] with the slab held under about `budget` bytes: when whole slices do
    /// not fit, the plane is cut into bands along y, each swept through z on its own with the
    /// windows that touch it (those straddling two bands run once for each: the price of the
    /// bound). Every voxel gets the same windows in the same order as untiled, so the
    /// probabilities are the same bit for bit. `on_tile(tile, probs)` receives each band's
    /// final rows, voxel-major over (rows, height, x); every voxel exactly once.
    pub fn predict_tiled<S: PatchSource + ?Sized>(
        &self,
        entry: &S,
        budget: usize,
        on_tile: &mut TileSink<'_>,
    ) -> Result<()> {
        let shape = entry.shape_zyx();
        let ys = self.starts(1, shape[1]);
        let classes = self.model.config().num_classes;
        for (out, windows) in y_bands(&band_starts(&ys), shape, self.patch, classes, budget) {
            // The band's windows, by position among the starts (a padded start is negative).
            let chosen: Vec<i64> = ys
                .iter()
                .copied()
                .filter(|&y| windows.contains(&(y.max(0) as usize)))
                .collect();
            self.sweep(entry, out, &chosen, on_tile)?;
        }
        Ok(())
    }

    /// The windows whose y start is in `ys`, every z and x start, swept in z order; the final
    /// rows of y range `out` handed to `on_tile`.
    fn sweep<S: PatchSource + ?Sized>(
        &self,
        entry: &S,
        out: (usize, usize),
        ys: &[i64],
        on_tile: &mut TileSink<'_>,
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
        let zs_all = self.starts(0, shape[0]);
        let xs = self.starts(2, shape[2]);
        let nnunet = matches!(self.flavour, Flavour::Nnunet { .. });
        let (gauss, flips) = match self.flavour {
            Flavour::Voxcache | Flavour::VoxcacheRegions => {
                (gaussian_map(p), flip_sets(&self.mirror_axes))
            }
            Flavour::Nnunet { planar } => {
                let g = if planar {
                    nnunet_gaussian(&p[1..])
                } else {
                    nnunet_gaussian(&p)
                };
                (g, nnunet_flip_sets(&self.mirror_axes))
            }
        };
        let passes = (flips.len() + 1) as f32;
        let stacked = !flips.is_empty() && self.stacks(flips.len() + 1);
        // The slab spans the windows' rows in y: y0..y1.
        let y0 = ys.first().map_or(0, |&y| y.max(0) as usize);
        let y1 = ys
            .last()
            .map_or(0, |&y| ((y + p[1] as i64).max(0) as usize).min(shape[1]));
        let nx = shape[2];
        let plane = (y1 - y0) * nx;
        let stride = classes + 1; // class scores then the weight sum, per voxel
        let (oy0, oy1) = out;
        // The slab holds rows slab_z0.. of the volume.
        let mut slab_z0 = 0usize;
        let mut slab: Vec<f32> = Vec::new();
        let mut image = vec![0f32; ch * pv];
        let mut done: Vec<f32> = Vec::new();
        for (k, &zs) in zs_all.iter().enumerate() {
            let z_end = ((zs + p[0] as i64).max(0) as usize).min(shape[0]);
            let need = z_end.saturating_sub(slab_z0) * plane * stride;
            if slab.len() < need {
                slab.resize(need, 0.0);
            }
            let windows: Vec<[i64; 3]> = ys
                .iter()
                .flat_map(|&y| xs.iter().map(move |&x| [zs, y, x]))
                .collect();
            for group in windows.chunks(self.batch.max(1)) {
                let mut input = Vec::with_capacity(group.len() * ch * pv);
                for w in group {
                    entry.read_image(*w, p, &mut image)?;
                    input.extend_from_slice(&image);
                }
                let mut probs = self.forward_flips(&input, group.len(), ch, &flips, stacked)?;
                if !flips.is_empty() {
                    probs.iter_mut().for_each(|v| *v /= passes);
                }
                if let Some(f) = self.on_windows {
                    f(group.len());
                }
                // The part of each window inside the volume (a padded window reaches outside).
                let inside = |w: i64, a: usize| {
                    let lo = (-w).max(0) as usize;
                    let hi = (shape[a] as i64 - w).clamp(0, p[a] as i64) as usize;
                    lo..hi
                };
                for (wi, w) in group.iter().enumerate() {
                    let base = wi * classes * pv;
                    for dz in inside(w[0], 0) {
                        let z = (w[0] + dz as i64) as usize;
                        for dy in inside(w[1], 1) {
                            let y = (w[1] + dy as i64) as usize;
                            let row = ((z - slab_z0) * plane + (y - y0) * nx) * stride;
                            for dx in inside(w[2], 2) {
                                let x = (w[2] + dx as i64) as usize;
                                let i = (dz * p[1] + dy) * p[2] + dx;
                                let g = gauss[i];
                                let o = row + x * stride;
                                if nnunet {
                                    for c in 0..classes {
                                        slab[o + c] =
                                            f16_round(slab[o + c] + probs[base + c * pv + i] * g);
                                    }
                                    slab[o + classes] = f16_round(slab[o + classes] + g);
                                } else {
                                    for c in 0..classes {
                                        slab[o + c] += g * probs[base + c * pv + i];
                                    }
                                    slab[o + classes] += g;
                                }
                            }
                        }
                    }
                }
            }
            // Rows before the next window's start are final.
            let done_to = zs_all
                .get(k + 1)
                .map_or(shape[0], |&z| z.max(0) as usize)
                .min(shape[0]);
            if done_to > slab_z0 {
                let rows = done_to - slab_z0;
                // One slice a tile: the handed-over copy stays one slice, not a patch depth.
                for z in 0..rows {
                    done.clear();
                    let from = (z * plane + (oy0 - y0) * nx) * stride;
                    let to = (z * plane + (oy1 - y0) * nx) * stride;
                    for v in slab[from..to].chunks_exact(stride) {
                        let w = v[classes].max(f32::MIN_POSITIVE);
                        if nnunet {
                            done.extend(v[..classes].iter().map(|s| f16_round(s / w)));
                        } else {
                            done.extend(v[..classes].iter().map(|s| s / w));
                        }
                    }
                    let tile = Tile {
                        z0: slab_z0 + z,
                        rows: 1,
                        y0: oy0,
                        height: oy1 - oy0,
                    };
                    on_tile(tile, &done)?;
                }
                slab.drain(..rows * plane * stride);
                slab_z0 = done_to;
            }
        }
        Ok(())
    }

    /// Softmax or sigmoids (ours) or logits (nnU-Net's) of a batch of `n` windows of `ch` channels:
    /// (n, classes, patch) flat.
    /// Whether the mirrored copies of a batch go through one pass with it: where that pass is
    /// forecast under [`STACKED_PASS`] bytes. Small patches leave the workers idle part of a
    /// pass of one window (a 16x48x48 patch predicted 8% faster 8 windows a pass).
    fn stacks(&self, passes: usize) -> bool {
        let n = self.batch.max(1) * passes;
        let workers = rayon::current_num_threads();
        inference_pass(self.model.config(), self.patch, n, workers).total() <= STACKED_PASS
    }

    /// The summed scores of `n` windows and of their copies flipped over each set of `flips`
    /// (flipped back), in that order, the copies in one pass with the windows if `stacked`. A
    /// window's scores do not depend on the others in its pass, so both give the same sums.
    fn forward_flips(
        &self,
        input: &[f32],
        n: usize,
        ch: usize,
        flips: &[Vec<usize>],
        stacked: bool,
    ) -> Result<Vec<f32>> {
        let (p, pv) = (self.patch, self.patch.iter().product::<usize>());
        // Every axis of the set in one pass over each channel.
        let flip = |v: &mut [f32], axes: &[usize]| {
            let set = [0, 1, 2].map(|a| axes.contains(&a));
            v.chunks_exact_mut(pv).for_each(|c| mirror(c, p, set));
        };
        if !stacked {
            let mut probs = self.forward(input, n, ch)?;
            for axes in flips {
                let mut x = input.to_vec();
                flip(&mut x, axes);
                let mut y = self.forward(&x, n, ch)?;
                flip(&mut y, axes);
                probs.iter_mut().zip(&y).for_each(|(s, v)| *s += v);
            }
            return Ok(probs);
        }
        let mut x = Vec::with_capacity(input.len() * (flips.len() + 1));
        x.extend_from_slice(input);
        for axes in flips {
            let at = x.len();
            x.extend_from_slice(input);
            flip(&mut x[at..], axes);
        }
        let mut y = self.forward(&x, n * (flips.len() + 1), ch)?;
        let len = y.len() / (flips.len() + 1);
        let (probs, copies) = y.split_at_mut(len);
        for (axes, copy) in flips.iter().zip(copies.chunks_exact_mut(len)) {
            flip(copy, axes);
            probs.iter_mut().zip(&*copy).for_each(|(s, v)| *s += v);
        }
        y.truncate(len);
        Ok(y)
    }

    fn forward(&self, input: &[f32], n: usize, ch: usize) -> Result<Vec<f32>> {
        let p = self.patch;
        let x = Tensor::from_slice(input, (n, ch, p[0], p[1], p[2]), self.device)?;
        let logits = self.model.infer(&x)?;
        let out = match self.flavour {
            Flavour::Voxcache => candle_nn::ops::softmax(&logits, 1)?,
            Flavour::VoxcacheRegions => candle_nn::ops::sigmoid(&logits)?,
            Flavour::Nnunet { .. } => logits,
        };
        Ok(out.flatten_all()?.to_device(&Device::Cpu)?.to_vec1()?)
    }
}

/// The y starts of [`y_bands`] for starts that may be negative (a padded window starts at 0
/// for banding: it covers the whole axis).
fn band_starts(ys: &[i64]) -> Vec<usize> {
    ys.iter().map(|&y| y.max(0) as usize).collect()
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
    fn bands_cover_the_plane_once_with_every_window_that_touches_them() {
        let shape = [20, 200, 50];
        let patch = [8, 32, 32];
        let ys = window_starts(shape[1], patch[1], 0.5);
        // Whole slices fit: one band of everything.
        let one = y_bands(&ys, shape, patch, 2, usize::MAX);
        assert_eq!(one, vec![((0, 200), ys.clone())]);
        // The whole plane takes 8 x 200 x 50 x 3 + 200 x 50 x 2 floats (1.04 MB).
        for budget in [0, 500_000, 1_000_000] {
            let bands = y_bands(&ys, shape, patch, 2, budget);
            assert!(bands.len() > 1, "budget {budget}");
            // Output ranges tile 0..200 in order.
            assert_eq!(bands[0].0 .0, 0);
            assert_eq!(bands.last().unwrap().0 .1, 200);
            assert!(bands.windows(2).all(|b| b[0].0 .1 == b[1].0 .0));
            for ((y0, y1), w) in &bands {
                let touching: Vec<usize> = ys
                    .iter()
                    .copied()
                    .filter(|&y| y < *y1 && y + patch[1] > *y0)
                    .collect();
                assert_eq!(*w, touching);
            }
        }
        assert_eq!(y_bands(&ys, shape, patch, 2, 0).len(), ys.len());
    }

    /// Mirrored copies stacked into the windows' pass give the sums of one pass per flip, bit
    /// for bit (two windows, every flip of three axes).
    #[test]
    fn stacked_flips_give_the_sums_of_one_pass_each() {
        use crate::model::config::UNetConfig;
        let cfg = UNetConfig::plain(2, 3, 4, 8, vec![[1, 2, 2], [2, 2, 2]]);
        let model = UNet::new(cfg, 5, &Device::Cpu).unwrap();
        let predictor = Predictor {
            model: &model,
            device: &Device::Cpu,
            patch: [4, 8, 12],
            overlap: 0.5,
            batch: 2,
            mirror_axes: vec![0, 1, 2],
            on_windows: None,
            flavour: Flavour::Voxcache,
        };
        let mut rng = crate::util::rng::Rng::new(4);
        let input: Vec<f32> = (0..2 * 2 * 4 * 8 * 12)
            .map(|_| rng.normal() as f32)
            .collect();
        let flips = flip_sets(&[0, 1, 2]);
        let one = predictor
            .forward_flips(&input, 2, 2, &flips, false)
            .unwrap();
        let stacked = predictor.forward_flips(&input, 2, 2, &flips, true).unwrap();
        assert_eq!(one.len(), 2 * 3 * 4 * 8 * 12);
        assert!(one == stacked, "stacked flips differ");
        assert!(predictor.stacks(flips.len() + 1), "a small pass stacks");
        let plain = predictor.forward_flips(&input, 2, 2, &[], true).unwrap();
        assert!(plain != one, "the flips add something");
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
