//! The training loss: nnU-Net's Dice + cross-entropy, and the terms for thin structures and
//! boundaries that weights add to it.
//!
//! - `dice_ce`: the one-hot targets, the ignore mask, and Dice + CE.
//! - `skeleton`: Skeleton Recall and clDice (with its soft skeleton).
//! - `distance`: the boundary and surface losses on signed distance maps.
//! - `regions`: region-based training's targets and BCE + Dice (sigmoid outputs).
//! - `objective`: [`LossObjective`], the run's loss: every term with its weight and targets,
//!   at each supervised resolution, summed for `backward` and checked for finiteness.

mod dice_ce;
mod distance;
mod objective;
mod regions;
mod skeleton;
#[cfg(test)]
mod tests;

pub use dice_ce::{dice_ce, dice_ce_masked, ignore_mask, one_hot, LossParts};
pub use distance::{
    boundary, predicted_distance_squared, surface, surface_composed, surface_weighted,
};
pub use objective::{LossObjective, LossValue};
pub use regions::{bce_dice, region_membership, region_targets};
pub use skeleton::{cldice, skeleton_recall, soft_skeleton, CLDICE_ITERATIONS};
