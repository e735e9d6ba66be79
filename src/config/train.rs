//! The options of `train`: built-in defaults, then the pipeline's `[train]` table, then flags,
//! merged by one function ([`resolve`]).

use super::pipeline::{Pipeline, DEFAULT_PIPELINE};
use super::values::parse_zyx;
use crate::error::Result;
use crate::train::config::{OptimizerName, TrainConfig};
use crate::train::model::{Norm, Upsampling};

/// Overrides of the training options, every one optional. Field names and value spellings are
/// the `[train]` keys and values of a pipeline file.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TrainFlags {
    /// Bundled pipeline (default, ct, compact, minivess) or a path to a .toml file whose `[train]`
    /// table gives the defaults; the flags below override it [default: default].
    #[arg(long, value_name = "NAME|FILE.toml")]
    pub pipeline: Option<String>,
    /// Dataset in the cache (needed when it holds several).
    #[arg(long)]
    pub dataset: Option<String>,
    /// Optimizer steps.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Patches a batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Patch size z,y,x in voxels.
    #[arg(long, value_name = "z,y,x", value_parser = parse_zyx)]
    pub patch: Option<[usize; 3]>,
    /// Initial learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// adamw or sgd.
    #[arg(long)]
    pub optimizer: Option<OptimizerName>,
    /// Batches per optimizer step (gradient accumulation).
    #[arg(long)]
    pub accumulate: Option<usize>,
    /// Fraction of each batch centred on foreground.
    #[arg(long)]
    pub fg_fraction: Option<f64>,
    /// Channels of the first U-Net stage.
    #[arg(long)]
    pub base_channels: Option<usize>,
    /// Resolution stages of the U-Net.
    #[arg(long)]
    pub stages: Option<usize>,
    /// instance, or group:G (G groups).
    #[arg(long, value_name = "instance|group:G")]
    pub norm: Option<Norm>,
    /// transpose or nearest.
    #[arg(long)]
    pub upsampling: Option<Upsampling>,
    /// Turn data augmentation off (the pipeline's `augment = false`).
    #[arg(long)]
    pub no_augment: bool,
    /// Share of cases held out for validation (0 = none).
    #[arg(long)]
    pub val_fraction: Option<f64>,
    /// Validate every N optimizer steps (and at the end; 0 = only at the end).
    #[arg(long)]
    pub val_every: Option<u64>,
    /// Checkpoint every N steps (and at the end and on Ctrl-C).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Log a metrics line every N steps.
    #[arg(long)]
    pub log_every: Option<u64>,
    /// Loader threads.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Seed of weights, split, patches and augmentation.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl TrainFlags {
    /// Overlay these flags on a configuration.
    pub fn apply(&self, c: &mut TrainConfig) {
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { c.$f = v; } )* };
        }
        set!(
            steps,
            batch_size,
            patch,
            lr,
            optimizer,
            accumulate,
            fg_fraction,
            base_channels,
            stages,
            norm,
            upsampling,
            val_fraction,
            val_every,
            checkpoint_every,
            log_every,
            workers,
            seed
        );
        if self.dataset.is_some() {
            c.dataset = self.dataset.clone();
        }
        if self.no_augment {
            c.augment = false;
        }
    }
}

/// The configuration of a run: the pipeline the flags name (the default one otherwise), its
/// `[train]` table, then the flags, checked together.
pub fn resolve(flags: &TrainFlags) -> Result<TrainConfig> {
    let pipeline = Pipeline::load(flags.pipeline.as_deref().unwrap_or(DEFAULT_PIPELINE))?;
    let mut c = pipeline.train;
    flags.apply(&mut c);
    c.validate()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_pipeline_table() {
        let c = resolve(&TrainFlags {
            pipeline: Some("minivess".into()),
            steps: Some(7),
            norm: Some(Norm::Group(4)),
            no_augment: true,
            ..TrainFlags::default()
        })
        .unwrap();
        assert_eq!(c.steps, 7);
        assert_eq!(c.norm, Norm::Group(4));
        assert!(!c.augment);
        // From the minivess [train] table.
        assert_eq!(c.optimizer, OptimizerName::Sgd);
        assert_eq!(c.patch, [16, 128, 128]);

        let e = resolve(&TrainFlags {
            lr: Some(-1.0),
            ..TrainFlags::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("lr"), "{e}");
    }

    #[test]
    fn a_pipeline_without_a_train_table_gives_the_defaults() {
        let c = resolve(&TrainFlags {
            pipeline: Some("ct".into()),
            ..TrainFlags::default()
        })
        .unwrap();
        assert_eq!(c, TrainConfig::default());
    }
}
