//! Most of the integration tests, one module a file, in one test binary: each test crate
//! compiles its own copy of what it uses of the library at opt-level 3, so twenty crates took
//! most of CI's build time. Tests that probe this process's memory or its environment keep
//! binaries of their own (`tests/*.rs`), as does the GPU's.

#[path = "../common/mod.rs"]
mod common;

mod cache_keys;
mod cascade;
mod cascade_probabilities;
mod crossval;
mod derived;
mod evaluate;
mod flags;
mod flags_evaluate;
mod flags_prep;
mod flags_train;
mod hostile_checkpoints;
mod hostile_inputs;
mod hostile_plans;
mod hostile_runs;
mod layers;
mod modes_walk;
mod multichannel;
mod network_crosscheck;
mod nifti_inputs;
mod nnunet_cache;
mod nnunet_import;
mod patch_source;
mod planner;
mod predict;
mod regions;
mod resample_properties;
mod s3;
mod store_conformance;
mod synth;
mod train_norm;
mod train_ops;
