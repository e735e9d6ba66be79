//! Which case and which box each patch of a batch comes from.
//!
//! The choice for batch `s` is a pure function of `(seed, s, cases, config)`: sample `i` draws
//! from `Rng::derive(seed, &[SAMPLE_STREAM, s, i])` and nothing else, so the batch stream does
//! not depend on loader threads or timing, and a run resumed at step `k` sees exactly the
//! batches the uninterrupted run saw.
//!
//! As in nnU-Net, cases are drawn by weight (all equal by default, so one huge volume does not
//! dominate the way voxel-proportional sampling would), and the last
//! `round(batch_size * fg_fraction)` samples of every batch are centred on a foreground voxel,
//! so that rare thin structures are seen often enough.

use crate::cache::PatchSource;
use crate::error::{Error, Result};
use crate::util::rng::Rng;

/// Stream tag of the sampler's draws (`Rng::derive(seed, &[SAMPLE_STREAM, step, i])`).
pub const SAMPLE_STREAM: u64 = 0x7361_6d70_6c65_0001;

/// The patch limits are the training config's: one definition for the command line and the
/// library.
pub use crate::train::config::{MAX_PATCH_AXIS as MAX_PATCH_SIDE, MAX_PATCH_VOXELS};

/// Which patches a batch holds.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Patch size (z, y, x).
    pub patch_zyx: [usize; 3],
    /// Patches a batch.
    pub batch_size: usize,
    /// Share of each batch centred on foreground (nnU-Net: 1/3).
    pub fg_fraction: f64,
    /// Seed: batch `s` is a pure function of (seed, s).
    pub seed: u64,
    /// A label value never sampled as foreground (the ignore label).
    pub skip_class: Option<u16>,
    /// Which share of each step's samples this process draws (several processes training
    /// one model, as torch.distributed ranks): `batch_size` is per rank.
    pub shard: Shard,
}

/// One rank's share of every step: of the step's `batch_size x ranks` samples (what one
/// process with that batch would draw), those `rank x batch_size ..` on, so the ranks
/// together see exactly the one process's batches. Each sample's draws (case, box, its
/// augmentation) come from (seed, step, its index in that whole batch), and the foreground
/// share is that of the whole batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This process's rank, from 0.
    pub rank: usize,
    /// How many ranks share each step.
    pub ranks: usize,
}

impl Default for Shard {
    /// One process draws the whole batch.
    fn default() -> Self {
        Shard { rank: 0, ranks: 1 }
    }
}

impl SamplerConfig {
    /// A configuration with nnU-Net's foreground share of 1/3.
    pub fn new(patch_zyx: [usize; 3], batch_size: usize, seed: u64) -> Self {
        SamplerConfig {
            patch_zyx,
            batch_size,
            fg_fraction: 1.0 / 3.0,
            seed,
            skip_class: None,
            shard: Shard::default(),
        }
    }

    /// Samples per step over every rank (the batch of one process standing for them all).
    pub fn whole_batch(&self) -> usize {
        self.batch_size.saturating_mul(self.shard.ranks)
    }

    /// Samples per step (over every rank) that are forced onto foreground: the last ones.
    pub fn forced_per_batch(&self) -> usize {
        let b = self.whole_batch();
        ((b as f64 * self.fg_fraction).round() as usize).min(b)
    }

    /// Index in the whole step's batch of this rank's first sample.
    pub fn first_sample(&self) -> usize {
        self.shard.rank * self.batch_size
    }

    /// Check the patch size, batch size and foreground share.
    pub fn validate(&self) -> Result<()> {
        let p = self.patch_zyx;
        if p.contains(&0) || p.iter().any(|&s| s > MAX_PATCH_SIDE) {
            return Err(Error::Config(format!(
                "patch size {p:?} (z, y, x): every side must be between 1 and {MAX_PATCH_SIDE}"
            )));
        }
        if p.iter().product::<usize>() > MAX_PATCH_VOXELS {
            return Err(Error::Config(format!(
                "patch size {p:?} has more than {MAX_PATCH_VOXELS} voxels"
            )));
        }
        if self.batch_size == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        let Shard { rank, ranks } = self.shard;
        if ranks == 0 || rank >= ranks || ranks > 1 << 16 {
            return Err(Error::Config(format!(
                "rank {rank} of a world of {ranks}: the world size must be 1 to 65536 and the \
                 rank below it"
            )));
        }
        if !(0.0..=1.0).contains(&self.fg_fraction) {
            return Err(Error::Config(format!(
                "foreground fraction {} is not between 0 and 1",
                self.fg_fraction
            )));
        }
        Ok(())
    }
}

/// One patch of a batch: case index (into the sampler's cases) and box start (z, y, x).
/// The box may stick out of the volume; that part reads as zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchChoice {
    /// Index of the case.
    pub case: usize,
    /// First voxel (z, y, x) of the box; may be negative.
    pub start_zyx: [i64; 3],
    /// This sample was meant to be centred on foreground. Also true when its case has no
    /// foreground at all, in which case the box is a random one like the others.
    pub forced_fg: bool,
}

/// Per-case facts the sampler needs, loaded once.
#[derive(Clone, Debug)]
struct CaseFacts {
    shape: [usize; 3],
    /// Foreground coordinates of each class that has any (classes without coordinates are
    /// dropped so that a class is picked only if it can be centred on).
    fg_by_class: Vec<Vec<[u32; 3]>>,
}

/// Draws each batch's cases and boxes.
#[derive(Clone, Debug)]
pub struct Sampler {
    cases: Vec<CaseFacts>,
    weights: Vec<f64>,
    cfg: SamplerConfig,
}

impl Sampler {
    /// `weights` has one entry per case (empty: all 1.0). Reads every case's foreground index.
    pub fn new<S: PatchSource>(cases: &[S], weights: Vec<f64>, cfg: SamplerConfig) -> Result<Self> {
        cfg.validate()?;
        if cases.is_empty() {
            return Err(Error::Config("no cases to sample patches from".into()));
        }
        let weights = if weights.is_empty() {
            vec![1.0; cases.len()]
        } else {
            weights
        };
        validate_weights(&weights, cases.len())?;
        let cases = cases
            .iter()
            .map(|e| {
                let mut fg_by_class = Vec::new();
                for class in e.classes() {
                    if Some(class) == cfg.skip_class {
                        continue;
                    }
                    let coords = e.fg_coords(class)?;
                    if !coords.is_empty() {
                        fg_by_class.push(coords);
                    }
                }
                Ok(CaseFacts {
                    shape: e.shape_zyx(),
                    fg_by_class,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sampler {
            cases,
            weights,
            cfg,
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Training cases it draws from.
    pub fn num_cases(&self) -> usize {
        self.cases.len()
    }

    /// Volume shape (z, y, x) of case `case`.
    pub fn shape_zyx(&self, case: usize) -> Option<[usize; 3]> {
        self.cases.get(case).map(|c| c.shape)
    }

    /// Whether case `case` has foreground coordinates to centre patches on.
    pub fn has_foreground(&self, case: usize) -> bool {
        self.cases
            .get(case)
            .is_some_and(|c| !c.fg_by_class.is_empty())
    }

    /// The patches of batch `step` (this rank's share). Pure: same inputs, same answer.
    pub fn choose(&self, step: u64) -> Vec<PatchChoice> {
        let first_forced = self.cfg.whole_batch() - self.cfg.forced_per_batch();
        let first = self.cfg.first_sample();
        (first..first + self.cfg.batch_size)
            .map(|i| {
                let mut rng = Rng::derive(self.cfg.seed, &[SAMPLE_STREAM, step, i as u64]);
                let case = rng.weighted(&self.weights);
                let forced_fg = i >= first_forced;
                let facts = &self.cases[case];
                let start_zyx =
                    match forced_fg.then(|| fg_start(facts, self.cfg.patch_zyx, &mut rng)) {
                        Some(Some(s)) => s,
                        _ => random_start(facts.shape, self.cfg.patch_zyx, &mut rng),
                    };
                PatchChoice {
                    case,
                    start_zyx,
                    forced_fg,
                }
            })
            .collect()
    }
}

fn validate_weights(weights: &[f64], cases: usize) -> Result<()> {
    if weights.len() != cases {
        return Err(Error::Config(format!(
            "{} case weights for {cases} cases",
            weights.len()
        )));
    }
    if let Some((i, w)) = weights
        .iter()
        .enumerate()
        .find(|(_, w)| !w.is_finite() || **w < 0.0)
    {
        return Err(Error::Config(format!(
            "case weight {w} (case {i}) must be finite and not negative"
        )));
    }
    if weights.iter().all(|&w| w == 0.0) {
        return Err(Error::Config(
            "every case weight is 0: no case can be sampled".into(),
        ));
    }
    Ok(())
}

/// A box centred on a foreground voxel: a class uniformly among those present, then a
/// coordinate uniformly. The centre voxel is `start + size / 2`; the box may stick out.
fn fg_start(facts: &CaseFacts, size: [usize; 3], rng: &mut Rng) -> Option<[i64; 3]> {
    if facts.fg_by_class.is_empty() {
        return None;
    }
    let class = &facts.fg_by_class[rng.below(facts.fg_by_class.len() as u64) as usize];
    let c = class[rng.below(class.len() as u64) as usize];
    Some([0, 1, 2].map(|a| c[a] as i64 - (size[a] / 2) as i64))
}

/// A uniformly placed box: inside the volume along axes where it fits, otherwise placed so the
/// volume lies inside the box (the rest is zero padding).
fn random_start(shape: [usize; 3], size: [usize; 3], rng: &mut Rng) -> [i64; 3] {
    [0, 1, 2].map(|a| {
        let slack = shape[a] as i64 - size[a] as i64;
        if slack >= 0 {
            rng.int_in(0, slack)
        } else {
            rng.int_in(slack, 0)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(shapes: &[[usize; 3]], fg: Vec<Vec<Vec<[u32; 3]>>>, cfg: SamplerConfig) -> Sampler {
        let n = shapes.len();
        Sampler {
            cases: shapes
                .iter()
                .zip(fg)
                .map(|(&shape, fg_by_class)| CaseFacts { shape, fg_by_class })
                .collect(),
            weights: vec![1.0; n],
            cfg,
        }
    }

    #[test]
    fn random_boxes_cover_every_valid_start_and_pad_small_volumes() {
        let s = sampler(
            &[[5, 40, 20]],
            vec![vec![]],
            SamplerConfig {
                fg_fraction: 0.0,
                ..SamplerConfig::new([16, 32, 20], 4, 9)
            },
        );
        let mut seen_z = std::collections::BTreeSet::new();
        let mut seen_y = std::collections::BTreeSet::new();
        for step in 0..400 {
            for c in s.choose(step) {
                assert!(!c.forced_fg);
                // z: the 5 slices lie inside the 16-slice box.
                assert!((-11..=0).contains(&c.start_zyx[0]), "{c:?}");
                assert!((0..=8).contains(&c.start_zyx[1]), "{c:?}");
                assert_eq!(c.start_zyx[2], 0);
                seen_z.insert(c.start_zyx[0]);
                seen_y.insert(c.start_zyx[1]);
            }
        }
        assert_eq!(seen_z.len(), 12);
        assert_eq!(seen_y.len(), 9);
    }

    #[test]
    fn forced_samples_are_the_last_ones_and_centred_on_foreground() {
        let fg = vec![vec![vec![[1, 2, 3]], vec![[4, 5, 6], [7, 8, 9]]], vec![]];
        let s = sampler(
            &[[10, 10, 10], [10, 10, 10]],
            fg,
            SamplerConfig::new([4, 6, 8], 6, 1),
        );
        let mut centres = std::collections::BTreeSet::new();
        for step in 0..200 {
            let b = s.choose(step);
            assert_eq!(b, s.choose(step));
            for (i, c) in b.iter().enumerate() {
                assert_eq!(c.forced_fg, i >= 4);
                if c.forced_fg && c.case == 0 {
                    let centre = [0, 1, 2].map(|a| c.start_zyx[a] + [2, 3, 4][a]);
                    centres.insert(centre);
                }
            }
        }
        let want: std::collections::BTreeSet<[i64; 3]> =
            [[1, 2, 3], [4, 5, 6], [7, 8, 9]].into_iter().collect();
        assert_eq!(centres, want);
    }

    #[test]
    fn bad_configurations_are_errors() {
        for p in [[0, 8, 8], [8, 2048, 8], [512, 512, 512]] {
            assert!(SamplerConfig::new(p, 2, 0).validate().is_err(), "{p:?}");
        }
        assert!(SamplerConfig::new([8, 8, 8], 0, 0).validate().is_err());
        let mut c = SamplerConfig::new([8, 8, 8], 2, 0);
        c.fg_fraction = f64::NAN;
        assert!(c.validate().is_err());
        assert!(validate_weights(&[1.0, f64::INFINITY], 2).is_err());
        assert!(validate_weights(&[1.0, -1.0], 2).is_err());
        assert!(validate_weights(&[0.0, 0.0], 2).is_err());
        assert!(validate_weights(&[1.0], 2).is_err());
        assert!(validate_weights(&[0.0, 2.0], 2).is_ok());
    }
}
