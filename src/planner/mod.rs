//! Planning a training for a dataset, as nnU-Net's experiment planner does: from the cases'
//! spacings and shapes (the fingerprint), each configuration's target spacing, patch, batch
//! size and network topology (strides, kernels, features, blocks) within a preset's memory
//! reference. The algorithm and its constants are nnU-Net 2.8.1's, read from its code
//! (docs/nnunet-planner.md) and checked against the plans it wrote (tests/nnunet_plans).
//!
//! - [`numeric`]: numpy's percentile and median, Python's rounding (plans equal to the bit).
//! - [`topology`]: pooling and kernels from the spacing, the patch padded to the strides.
//! - [`configuration`]: one configuration's patch and batch; presets; the size estimate.
//! - [`experiment`]: the target spacing, axis order and every configuration of a dataset.
//! - [`fingerprint`]: a dataset's spacings and shapes from its headers.
//! - [`memory`]: a plan's training memory by our own network, and fitting a plan to a GPU.

pub mod configuration;
pub mod experiment;
pub mod fingerprint;
pub mod memory;
pub mod numeric;
pub mod topology;

pub use configuration::{ConfigurationPlan, Preset};
pub use experiment::{plan_experiment, plan_experiment_scaled, Fingerprint, Plans};
pub use fingerprint::{fingerprint_dataset, DatasetFingerprint};
