//! Inference on cached volumes: the sliding-window predictor that validation and predict share,
//! the on-disk class probabilities of a predicted volume, and their export to the input's grid.

pub mod export;
pub mod model_dir;
pub mod postprocess;
pub mod predict;
pub mod prob_zarr;
pub mod probs;
pub mod sliding;
