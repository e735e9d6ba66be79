//! Inference on cached volumes: the sliding-window predictor that validation and predict share,
//! the on-disk class probabilities of a predicted volume, and their export to the input's grid;
//! a cascade's two stages in one predict (`cascade`); and nnU-Net v2's trained models run as
//! nnU-Net runs them ([`nnunet`]).

mod cascade;
pub mod crop;
pub mod export;
mod gaussian;
mod group;
pub mod model_dir;
pub mod model_fetch;
pub mod nnunet;
pub mod postprocess;
pub mod predict;
pub mod prob_zarr;
pub mod probs;
pub mod sliding;
