//! The options of `train`: built-in defaults, then the pipeline's `[train]` table, then flags,
//! merged by one function ([`resolve`]).

use super::pipeline::{Pipeline, DEFAULT_PIPELINE};
use super::values::parse_zyx;
use crate::error::{Error, Result};
use crate::model::config::{Norm, Precision, Upsampling};
use crate::train::config::{OptimizerName, TrainConfig};
use crate::train::folds::{FoldChoice, FoldList};
use std::path::PathBuf;

/// Overrides of the training options, every one optional. Field names and value spellings are
/// the `[train]` keys and values of a pipeline file.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TrainFlags {
    /// Bundled pipeline (default, ct, compact, minivess) or a path to a .toml file whose `[train]`
    /// table gives the defaults; the flags below override it [default: default].
    #[arg(long, value_name = "NAME|FILE.toml")]
    pub pipeline: Option<String>,
    /// The pipeline's planned configuration to train (`prep plan` writes them; default: the
    /// file's `configuration`): its patch, batch size and network. `auto`: plan them from the
    /// cache for this device (also what a pipeline file without a patch gets).
    #[arg(long, value_name = "NAME")]
    pub configuration: Option<String>,
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
    /// f32, or bf16 on a GPU: activations and convolutions in bfloat16, weights, optimizer,
    /// norm statistics and loss in f32.
    #[arg(long, value_name = "f32|bf16")]
    pub precision: Option<Precision>,
    /// Turn data augmentation off (the pipeline's `augment = false`).
    #[arg(long)]
    pub no_augment: bool,
    /// Set one augmentation option, spelled as in the `[train.augmentation]` table:
    /// `mirror_prob=0.5`, `spatial.elastic_prob=0.2`, `intensity.gamma_range=[0.8,1.2]`
    /// (repeat the flag for several).
    #[arg(long = "augment", value_name = "KEY=VALUE")]
    pub augment_options: Vec<String>,
    /// Set one loss weight, spelled as in the `[train.loss]` table: `skeleton_recall=1`.
    #[arg(long = "loss", value_name = "KEY=VALUE")]
    pub loss_options: Vec<String>,
    /// Deep supervision: on or off.
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub deep_supervision: Option<bool>,
    /// Share of cases held out for validation (0 = none). Not with --fold (the fold holds out
    /// its own cases).
    #[arg(long)]
    pub val_fraction: Option<f64>,
    /// Cross-validation fold: 0..4 (nnU-Net's five folds, the same cases as nnU-Net's), or
    /// all (every case trains, none validates); several (0,1,2,3,4) train one after the other.
    #[arg(long, value_name = "K|all[,K...]", allow_hyphen_values = true)]
    pub fold: Option<FoldList>,
    /// With --fold: nnU-Net's splits_final.json to take the fold from (default: the cache
    /// folder's splits_final.json if there is one, else nnU-Net's folds of the cache's cases).
    #[arg(long, value_name = "FILE")]
    pub splits: Option<PathBuf>,
    /// Validate every N optimizer steps (and at the end; 0 = only at the end). Not with
    /// --benchmark.
    #[arg(long)]
    pub val_every: Option<u64>,
    /// Checkpoint every N steps (and at the end and on Ctrl-C). Not with --benchmark.
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Log a metrics line every N steps. Not with --benchmark (it logs every step).
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
    pub fn apply(&self, c: &mut TrainConfig) -> Result<()> {
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { c.$f = v; } )* };
        }
        set!(
            steps,
            batch_size,
            lr,
            optimizer,
            accumulate,
            fg_fraction,
            val_fraction,
            val_every,
            checkpoint_every,
            log_every,
            workers
        );
        // The network's options, in the table they are recorded in.
        macro_rules! set_network {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { c.network.$f = v; } )* };
        }
        set_network!(
            patch,
            base_channels,
            stages,
            norm,
            upsampling,
            precision,
            seed,
            deep_supervision
        );
        if self.dataset.is_some() {
            c.dataset = self.dataset.clone();
        }
        if let Some(FoldList(folds)) = &self.fold {
            c.fold = folds.first().copied();
        }
        if self.splits.is_some() {
            c.splits = self.splits.clone();
        }
        if self.no_augment {
            c.augment = false;
        }
        if !self.augment_options.is_empty() {
            c.augmentation = set_options("--augment", &c.augmentation, &self.augment_options)?;
        }
        if !self.loss_options.is_empty() {
            c.loss = set_options("--loss", &c.loss, &self.loss_options)?;
        }
        // Validations where the fraction split holds out no case would do nothing (`--fold
        // all` is refused with its mode, config::modes::train).
        if let Some(n) = self.val_every.filter(|&n| n > 0) {
            if c.fold.is_none() && c.val_fraction == 0.0 {
                return Err(Error::Config(format!(
                    "--val-every {n}: no case is held out for validation (the validation \
                     fraction is 0); leave it out, or hold cases out with --val-fraction or \
                     --fold K"
                )));
            }
        }
        Ok(())
    }
}

fn parse_on_off(s: &str) -> std::result::Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("{s:?}: give on or off")),
    }
}

/// A table's options with `KEY=VALUE` settings laid over them: each is read as a line of the
/// table (`[train.augmentation]`, `[train.loss]`; dotted keys reach sub-tables), so the flag and
/// the file spell every option the same way and are checked by the same code.
fn set_options<T: serde::Serialize + serde::de::DeserializeOwned>(
    flag: &str,
    base: &T,
    settings: &[String],
) -> Result<T> {
    let bad = |m: String| Error::Config(format!("{flag}: {m}"));
    let mut table = toml::Table::try_from(base).map_err(|e| bad(e.to_string()))?;
    for s in settings {
        let (key, value) = s.split_once('=').ok_or_else(|| {
            bad(format!(
                "{s:?}: write KEY=VALUE, e.g. spatial.rotation_prob=0.3"
            ))
        })?;
        let line: toml::Table = toml::from_str(&format!("{} = {}", key.trim(), value.trim()))
            .map_err(|e| bad(format!("{s:?}: {}", e.message())))?;
        merge(&mut table, line);
    }
    toml::Value::Table(table)
        .try_into::<T>()
        .map_err(|e| bad(e.message().to_string()))
}

/// Lay `over` onto `base`, descending into tables both have.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// The configuration of a run: the pipeline the flags name (the default one otherwise), its
/// `[train]` table, then the flags, checked together.
pub fn resolve(flags: &TrainFlags) -> Result<TrainConfig> {
    Ok(resolve_planned(flags)?.0)
}

/// [`resolve`], and whether the patch and network are to be planned from the cache
/// ([`super::autoplan`]): `--configuration auto`, or a pipeline file and flags that give no
/// patch.
pub fn resolve_planned(flags: &TrainFlags) -> Result<(TrainConfig, bool)> {
    let auto = flags.configuration.as_deref() == Some(AUTO);
    let pipeline = Pipeline::load_configured(
        flags.pipeline.as_deref().unwrap_or(DEFAULT_PIPELINE),
        flags.configuration.as_deref().filter(|_| !auto),
    )?;
    let plan = auto || (!pipeline.patch_given && flags.patch.is_none());
    let mut c = pipeline.train;
    flags.apply(&mut c)?;
    c.validate()?;
    Ok((c, plan))
}

/// The folds to train, one run each: `--fold`'s list, else the configuration's one fold, else
/// none (one run on the fraction split).
pub fn folds(flags: &TrainFlags, config: &TrainConfig) -> Vec<Option<FoldChoice>> {
    match &flags.fold {
        Some(FoldList(list)) => list.iter().map(|f| Some(*f)).collect(),
        None => vec![config.fold],
    }
}

/// `--configuration auto`: plan from the cache whatever the pipeline says.
pub const AUTO: &str = "auto";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::augment::AugmentConfig;

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
        assert_eq!(c.network.norm, Norm::Group(4));
        assert!(!c.augment);
        // From the minivess [train] table.
        assert_eq!(c.optimizer, OptimizerName::Sgd);
        assert_eq!(c.network.patch, [16, 128, 128]);

        let e = resolve(&TrainFlags {
            lr: Some(-1.0),
            ..TrainFlags::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("lr"), "{e}");
    }

    #[test]
    fn augmentation_flags_use_the_table_spelling() {
        let c = resolve(&TrainFlags {
            augment_options: vec![
                "spatial.elastic_prob=0.25".into(),
                "intensity.gamma_range = [0.8, 1.2]".into(),
                "mirror_prob=0".into(),
            ],
            deep_supervision: Some(false),
            loss_options: vec!["skeleton_recall=1".into()],
            ..TrainFlags::default()
        })
        .unwrap();
        assert_eq!(c.loss.skeleton_recall, 1.0);
        assert_eq!(c.augmentation.spatial.elastic_prob, 0.25);
        assert_eq!(c.augmentation.intensity.gamma_range, [0.8, 1.2]);
        assert_eq!(c.augmentation.mirror_prob, 0.0);
        assert_eq!(c.augmentation.spatial.rotation_prob, 0.2);
        assert!(!c.network.deep_supervision);
        for (bad, says) in [
            ("spatial.rotaton_prob=0.1", "rotaton_prob"),
            ("spatial.rotation_prob=2", "rotation_prob"),
            ("mirror_prob", "KEY=VALUE"),
            ("mirror_prob=half", "mirror_prob"),
        ] {
            let e = resolve(&TrainFlags {
                augment_options: vec![bad.into()],
                ..TrainFlags::default()
            })
            .unwrap_err()
            .to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_default_pipeline_spells_out_the_augmentation_defaults() {
        let c = resolve(&TrainFlags::default()).unwrap();
        assert_eq!(c.augmentation, AugmentConfig::default());
        assert!(c.network.deep_supervision && c.augment);
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
