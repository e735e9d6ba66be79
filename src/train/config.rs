//! Training options: the types live in [`crate::format::training`] (pipeline files and run
//! records spell them); what training derives from them is here.

pub use crate::format::training::{
    LossWeights, OptimizerName, TrainConfig, UnknownKeys, MAX_PATCH_AXIS, MAX_PATCH_VOXELS,
};
use crate::model::memory::StepShape;

impl TrainConfig {
    /// What shapes a training step's memory besides the network (see [`crate::model::memory`]),
    /// training on the CPU (its tape) or elsewhere (candle's graph).
    pub fn step_shape(&self, on_cpu: bool) -> StepShape {
        StepShape {
            patch: self.network.patch,
            batch: self.batch_size,
            precision: self.network.precision,
            moments: match self.optimizer {
                OptimizerName::Adamw => 2,
                OptimizerName::Sgd if self.momentum > 0.0 => 1,
                OptimizerName::Sgd => 0,
            },
            // The queue, one batch in the making per worker, and the one being trained on.
            data_batches: self.queue_depth + self.workers + 1,
            workers: rayon::current_num_threads(),
            tape: on_cpu,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{NetworkOptions, Norm};

    #[test]
    fn table_overrides_defaults_and_unknown_keys_are_errors() {
        let c: TrainConfig =
            toml::from_str("patch = [8, 32, 32]\noptimizer = \"sgd\"\nnorm = \"group:4\"").unwrap();
        assert_eq!(c.network.patch, [8, 32, 32]);
        assert_eq!(c.optimizer, OptimizerName::Sgd);
        assert_eq!(c.network.norm, Norm::Group(4));
        assert_eq!(c.batch_size, TrainConfig::default().batch_size);
        let e = toml::from_str::<TrainConfig>("pach = [8, 32, 32]")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("pach"), "{e}");
        let e = toml::from_str::<TrainConfig>("optimizer = \"adam\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("adamw or sgd"), "{e}");
    }

    #[test]
    fn oversized_patches_are_refused() {
        let at = |patch| TrainConfig {
            network: NetworkOptions {
                patch,
                ..NetworkOptions::default()
            },
            ..TrainConfig::default()
        };
        let c = at([256, 512, 512]);
        assert!(c.validate().unwrap_err().to_string().contains("voxels"));
        let c = at([0, 32, 32]);
        assert!(c.validate().is_err());
        TrainConfig::default().validate().unwrap();
    }
}
