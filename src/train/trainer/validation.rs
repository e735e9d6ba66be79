//! A session's validation: the sliding window over the validation cases, its metrics line and
//! the line for the person watching.

use std::time::Instant;

use super::setup::Session;
use super::{per_class, say};
use crate::error::Result;
use crate::train::metrics::{Record, ValRecord};
use crate::train::validate::{SlidingWindow, ValidationResult};

impl Session<'_> {
    /// Validate the model after `step` steps: Dice (and clDice when asked) per class and case,
    /// logged and shown; `true` beside it when its mean Dice is the best so far (then recorded
    /// as the session's best).
    pub(super) fn validate(&mut self, step: u64) -> Result<(ValidationResult, bool)> {
        let (cfg, data) = (self.cfg, &self.data);
        let t = Instant::now();
        self.bar.set_message("validating");
        let v = SlidingWindow {
            model: &self.model,
            device: &self.dev,
            patch: cfg.network.patch,
            overlap: cfg.val_overlap,
            batch: cfg.batch_size,
            classes: &data.classes,
            cldice_scratch: cfg.val_cldice.then_some(self.opts.run_dir.as_path()),
        }
        .run(&data.val)?;
        self.log.append(&Record::Val(ValRecord {
            step,
            dice_per_class: v.dice_per_class.clone(),
            mean_dice: v.mean_dice,
            dice_per_case: v.dice_per_case.clone(),
            cldice_per_class: v.cldice_per_class.clone(),
            mean_cldice: cfg.val_cldice.then_some(v.mean_cldice),
            seconds: t.elapsed().as_secs_f64(),
        }))?;
        let cldice = if cfg.val_cldice {
            format!(
                ", clDice {:.4} ({})",
                v.mean_cldice,
                per_class(&data.classes.scored_names(), &v.cldice_per_class)
            )
        } else {
            String::new()
        };
        say(
            &self.bar,
            format!(
                "step {step}: validation Dice {:.4} ({}){cldice} in {:.1} s",
                v.mean_dice,
                per_class(&data.classes.scored_names(), &v.dice_per_class),
                t.elapsed().as_secs_f64()
            ),
        );
        let improved = v.mean_dice.is_finite() && self.best.is_none_or(|(b, _)| v.mean_dice > b);
        if improved {
            self.best = Some((v.mean_dice, step));
        }
        Ok((v, improved))
    }
}
