//! Plans against our own network's memory: the forecast of a configuration's training step
//! ([`crate::model::memory`]), and a plan made to fit a GPU by it rather than by nnU-Net's
//! proxy alone.

use super::configuration::{shrink, with_topology, ConfigurationPlan};
use super::experiment::Plans;
use super::topology::pool_and_conv;
use crate::error::{Error, Result};
use crate::model::config::{Norm, Precision, UNetConfig, Upsampling};
use crate::model::memory::{training_step, StepMemory, StepShape};

/// What a GPU holds besides the step's tensors: the CUDA context, cuDNN's libraries and
/// workspaces, the allocator's slack. An allowance until measured on a GPU (issue 43).
pub const GPU_OVERHEAD: u64 = 1 << 30;

/// The network of a plan, axes in the planner's order (a 2D plan one voxel deep).
pub fn network_of(c: &ConfigurationPlan, in_channels: usize, num_classes: usize) -> UNetConfig {
    let three = |v: &[usize]| -> [usize; 3] {
        let mut out = [1; 3];
        out[3 - v.len()..].copy_from_slice(v);
        out
    };
    UNetConfig {
        in_channels,
        num_classes,
        base_channels: c.features[0],
        max_channels: c.features.iter().copied().max().unwrap_or(1),
        strides: c.strides.iter().skip(1).map(|s| three(s)).collect(),
        norm: Norm::Instance,
        upsampling: Upsampling::Transpose,
        deep_supervision: true,
        kernels: c.kernels.iter().map(|k| three(k)).collect(),
        features: c.features.clone(),
        blocks: c.blocks.clone(),
        decoder_blocks: c.decoder_blocks.clone(),
        encoder: c.encoder,
    }
}

/// The training step's memory of a plan in `precision`, with the trainer's defaults (AdamW,
/// a queue of 4 batches, 2 loader workers).
pub fn step_memory(
    c: &ConfigurationPlan,
    in_channels: usize,
    num_classes: usize,
    precision: Precision,
) -> StepMemory {
    let mut patch = [1; 3];
    patch[3 - c.patch.len()..].copy_from_slice(&c.patch);
    let shape = StepShape {
        patch,
        batch: c.batch_size,
        precision,
        moments: 2,
        data_batches: 7,
        workers: rayon::current_num_threads(),
        // Plans are sized for a GPU's graph, the larger count.
        tape: false,
    };
    training_step(&network_of(c, in_channels, num_classes), &shape)
}

/// Make every configuration's training step in `precision` (plus `overhead`) fit `budget`
/// bytes: first fewer patches a batch (down to 2), then nnU-Net's shrink step on the patch.
/// Returns what changed; an error naming the memory the smallest plan needs when none fits.
pub fn fit_to_memory(
    plans: &mut Plans,
    budget: u64,
    (in_channels, num_classes): (usize, usize),
    precision: Precision,
    overhead: u64,
) -> Result<Vec<String>> {
    let preset = plans.preset;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut notes = Vec::new();
    let mut configs: Vec<(&str, &mut ConfigurationPlan)> = vec![("2d", &mut plans.two_d)];
    if let Some(l) = plans.lowres.as_mut() {
        configs.push(("3d_lowres", l));
    }
    if let Some(f) = plans.fullres.as_mut() {
        configs.push(("3d_fullres", f));
    }
    for (name, c) in configs {
        let need = |c: &ConfigurationPlan| {
            step_memory(c, in_channels, num_classes, precision).total() + overhead
        };
        let before = (c.patch.clone(), c.batch_size, need(c));
        while need(c) > budget {
            if c.batch_size > 2 {
                c.batch_size -= 1;
                continue;
            }
            let topo = pool_and_conv(
                &c.spacing,
                &c.patch.iter().map(|&p| p as f64).collect::<Vec<_>>(),
            );
            match shrink(&topo, &c.spacing, &c.median_shape) {
                Some(t) => *c = with_topology(c, t, preset, num_classes),
                None => {
                    return Err(Error::Config(format!(
                        "a memory of {:.1} GiB: the smallest {name} plan (patch {:?}, batch 2) needs {:.1} GiB in {precision} (with {:.1} GiB for the device's own use)",
                        gib(budget),
                        c.patch,
                        gib(need(c)),
                        gib(overhead)
                    )))
                }
            }
        }
        if (c.patch.clone(), c.batch_size) != (before.0.clone(), before.1) {
            notes.push(format!(
                "{name}: patch {:?} batch {} ({:.1} GiB) -> patch {:?} batch {} ({:.1} GiB) to fit {:.1} GiB",
                before.0,
                before.1,
                gib(before.2),
                c.patch,
                c.batch_size,
                gib(need(c)),
                gib(budget)
            ));
        }
    }
    Ok(notes)
}
