//! What predicting with an nnU-Net model will take, checked before anything is allocated: the
//! window step (`--step-size`), and the memory of one forward batch against what this process
//! may use (the forecast `prep inspect --nnunet-model` prints).

use super::model::NnunetModel;
use crate::error::{Error, Result};
use crate::model::memory::inference_pass;
use crate::util::sysinfo::human_bytes;

/// Refuse a window step (nnU-Net's `-step_size`, a fraction of the patch) outside (0, 1], or,
/// once the model's `patch` is known, so small that a window moves less than one voxel along an
/// axis the patch spans (the windows would repeat, their number growing without bound).
pub fn check_step(step: f64, patch: Option<[usize; 3]>) -> Result<()> {
    if !(step.is_finite() && step > 0.0 && step <= 1.0) {
        return Err(Error::Config(format!(
            "--step-size {step:?}: give a fraction of the patch in (0, 1] (nnU-Net's default 0.5)"
        )));
    }
    let Some(patch) = patch else {
        return Ok(());
    };
    if patch.iter().all(|&p| p <= 1 || step * p as f64 >= 1.0) {
        return Ok(());
    }
    let least = patch
        .iter()
        .filter(|&&p| p > 1)
        .map(|&p| 1.0 / p as f64)
        .fold(0.0, f64::max);
    Err(Error::Config(format!(
        "--step-size {step:?}: a window of the model's patch {patch:?} would move less than one voxel, repeating windows; give at least {least:.4} (nnU-Net's default 0.5)"
    )))
}

/// The memory of predicting with `model`, bytes: one prediction pass of `batch` windows (its
/// weights, the activations it holds at once, its input and scores, the convolutions' scratch:
/// [`inference_pass`]) and the sliding window's slab of `window_memory` bytes.
pub fn predict_memory(model: &NnunetModel, batch: usize, window_memory: usize) -> u64 {
    let pass = inference_pass(
        &model.network,
        model.patch(),
        batch.max(1),
        rayon::current_num_threads(),
    );
    pass.total().saturating_add(window_memory as u64)
}

/// Refuse a model whose forecast memory of predicting is over what this process may use (the
/// machine's memory, its control group's limit, its address-space limit); the error names the
/// plans' patch field, the forecast and the limit. `Ok(forecast)` otherwise.
pub fn check_memory(model: &NnunetModel, batch: usize, window_memory: usize) -> Result<u64> {
    let need = predict_memory(model, batch, window_memory);
    let Some(limit) = crate::util::sysinfo::memory_limit_bytes() else {
        return Ok(need);
    };
    if need <= limit {
        return Ok(need);
    }
    let cfg = &model.plans.configuration;
    Err(Error::Model {
        path: model.plans.path.clone(),
        message: format!(
            "configurations.{}.patch_size {:?}: predicting a batch of {} window(s) needs about {} (weights, the activations a forward pass holds at once, the window slab), over the {} this process may use{}",
            cfg.name,
            cfg.patch_size,
            batch.max(1),
            human_bytes(need),
            human_bytes(limit),
            if batch > 1 { "; try --batch 1" } else { "" }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_that_repeat_windows_are_refused_naming_the_flag() {
        assert!(check_step(0.5, Some([8, 16, 16])).is_ok());
        assert!(check_step(1.0, Some([1, 16, 16])).is_ok());
        assert!(check_step(0.125, Some([8, 16, 16])).is_ok());
        assert!(check_step(1e-9, None).is_ok());
        for bad in [0.0, -0.5, 1.5, 1e-9, 1e-300, f64::NAN, 0.1] {
            let e = check_step(bad, Some([8, 16, 16])).unwrap_err().to_string();
            assert!(e.starts_with("--step-size"), "{e}");
        }
    }
}
