//! The network, shared by training and inference: the U-Net, its 3D ops (CPU and CUDA), the
//! device choice, and checkpoints (weights on disk, a network rebuilt from a run's record).
//!
//! - [`ops`]: 3D convolution, transposed convolution, pooling and upsampling with gradients.
//! - [`config`]: the network's shape and options, and building it from them.
//! - [`unet`]: the U-Net (depth, width, norm, up-sampling mode, deep-supervision heads).
//! - [`device`]: CPU or CUDA, the one place that knows.
//! - [`checkpoint`]: atomic checkpoints (safetensors + JSON state), keep last K and best.
//! - [`memory`]: the bytes of a training step, counted from the network's layers.
//! - [`nnunet`]: nnU-Net v2's checkpoints and networks, read as they are.

pub mod checkpoint;
pub mod config;
pub mod device;
pub mod memory;
pub mod nnunet;
pub mod ops;
pub mod unet;
