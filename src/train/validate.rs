//! Validation: sliding-window inference over whole cached volumes, Dice per class.
//!
//! Windows of the patch size step over the volume with the given overlap; each window's softmax
//! is weighted by a Gaussian centred on the window (sigma = 1/8 of the patch, nnU-Net), so
//! window borders, where the network sees least context, count least. Windows are read from the
//! cache one at a time, never the whole volume. Predictions are accumulated in a slab of z rows:
//! windows are visited in z order, and once every window that can touch a row has been added,
//! the row is final, compared with the label rows read from the cache, and dropped. The
//! accumulator holds at most one patch depth of whole slices (C+1 floats a voxel).

use super::classes::{ClassMap, IGNORE};
use candle_core::{Device, Tensor};

use super::model::UNet;
use crate::cache::PatchSource;
use crate::error::{Error, Result};

/// Dice of one validation pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ValidationResult {
    /// Mean over cases of each foreground class's Dice (classes 1..C); NaN when a class is in no
    /// case's label nor prediction.
    pub dice_per_class: Vec<f64>,
    /// Mean of the defined per-class values.
    pub mean_dice: f64,
    /// Each case's mean foreground Dice.
    pub dice_per_case: Vec<(String, f64)>,
}

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

/// Per-class confusion counts of one case.
#[derive(Clone, Debug, Default)]
struct Counts {
    tp: Vec<u64>,
    fp: Vec<u64>,
    fn_: Vec<u64>,
}

impl Counts {
    fn new(classes: usize) -> Self {
        Counts {
            tp: vec![0; classes],
            fp: vec![0; classes],
            fn_: vec![0; classes],
        }
    }

    fn add(&mut self, pred: u16, truth: u16) {
        let (p, t) = (pred as usize, truth as usize);
        if p == t {
            self.tp[p] += 1;
        } else {
            self.fp[p] += 1;
            if t < self.fn_.len() {
                self.fn_[t] += 1;
            }
        }
    }

    /// Dice of class c; None when the class is in neither label nor prediction.
    fn dice(&self, c: usize) -> Option<f64> {
        let d = 2 * self.tp[c] + self.fp[c] + self.fn_[c];
        (d > 0).then(|| 2.0 * self.tp[c] as f64 / d as f64)
    }
}

/// Sliding-window predictor settings.
pub struct SlidingWindow<'a> {
    pub model: &'a UNet,
    pub device: &'a Device,
    pub patch: [usize; 3],
    pub overlap: f64,
    /// Windows per forward pass.
    pub batch: usize,
    /// Label-file values to classes; ignore-label voxels are left out of Dice.
    pub classes: &'a ClassMap,
}

impl SlidingWindow<'_> {
    /// Predict one cached case and count agreement with its label, slab by slab.
    fn case_counts<S: PatchSource>(&self, entry: &S) -> Result<Counts> {
        let classes = self.model.config().num_classes;
        let shape = entry.shape_zyx();
        let p = self.patch;
        let pv: usize = p.iter().product();
        let starts: Vec<Vec<usize>> = (0..3)
            .map(|a| window_starts(shape[a], p[a], self.overlap))
            .collect();
        let gauss = gaussian_map(p);
        let plane = shape[1] * shape[2];
        let stride = classes + 1; // class scores then the weight sum, per voxel
        let mut counts = Counts::new(classes);
        // The slab holds rows slab_z0.. of the volume.
        let mut slab_z0 = 0usize;
        let mut slab: Vec<f32> = Vec::new();
        let ch = entry.channels();
        let mut image = vec![0f32; ch * pv];
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
                let x = Tensor::from_vec(input, (group.len(), ch, p[0], p[1], p[2]), self.device)?;
                let probs = candle_nn::ops::softmax(&self.model.forward(&x)?, 1)?;
                let probs: Vec<f32> = probs.flatten_all()?.to_device(&Device::Cpu)?.to_vec1()?;
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
                let mut truth = vec![0u16; rows * plane];
                entry.read_label(
                    [slab_z0 as i64, 0, 0],
                    [rows, shape[1], shape[2]],
                    &mut truth,
                )?;
                self.classes.map(&mut truth)?;
                for (v, &t) in truth.iter().enumerate() {
                    if t == IGNORE {
                        continue;
                    }
                    let o = v * stride;
                    let scores = &slab[o..o + classes];
                    let pred = argmax(scores);
                    counts.add(pred as u16, t);
                }
                slab.drain(..rows * plane * stride);
                slab_z0 = done_to;
            }
        }
        Ok(counts)
    }

    /// Validate on cases (id, entry): mean Dice per foreground class and per case.
    pub fn run<S: PatchSource>(&self, cases: &[(String, S)]) -> Result<ValidationResult> {
        if !(0.0..1.0).contains(&self.overlap) {
            return Err(Error::Config(format!(
                "sliding-window overlap must be in 0..1, got {}",
                self.overlap
            )));
        }
        let classes = self.model.config().num_classes;
        let mut per_class: Vec<Vec<f64>> = vec![Vec::new(); classes];
        let mut per_case = Vec::with_capacity(cases.len());
        for (id, entry) in cases {
            if !entry.has_label() {
                return Err(Error::case(id, "validation case has no label"));
            }
            let counts = self.case_counts(entry)?;
            let mut case_dice = Vec::new();
            for (c, list) in per_class.iter_mut().enumerate().skip(1) {
                if let Some(d) = counts.dice(c) {
                    list.push(d);
                    case_dice.push(d);
                }
            }
            per_case.push((id.clone(), mean(&case_dice)));
        }
        let dice_per_class: Vec<f64> = per_class[1..].iter().map(|l| mean(l)).collect();
        let defined: Vec<f64> = dice_per_class
            .iter()
            .copied()
            .filter(|d| !d.is_nan())
            .collect();
        Ok(ValidationResult {
            mean_dice: mean(&defined),
            dice_per_class,
            dice_per_case: per_case,
        })
    }
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
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
    fn dice_counts() {
        let mut c = Counts::new(2);
        for (p, t) in [(1, 1), (1, 0), (0, 1), (0, 0), (1, 1)] {
            c.add(p, t);
        }
        // tp 2, fp 1, fn 1 -> 4/6
        assert!((c.dice(1).unwrap() - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(Counts::new(2).dice(1), None);
    }
}
