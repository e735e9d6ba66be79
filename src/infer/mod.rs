//! Inference on cached volumes: the sliding-window predictor that validation and predict share.

pub mod sliding;
