//! AdamW and SGD (momentum, Nesterov) over named candle `Var`s, the poly learning-rate
//! schedule, and the optimizer state as named tensors for checkpoints.
//!
//! candle-nn's SGD has no momentum and its AdamW keeps its moments private, so neither can be
//! checkpointed and resumed bit for bit; hence this small optimizer of our own. Every update
//! is a chain of element-wise tensor ops, so it is deterministic and runs on any device.

use std::collections::HashMap;

use candle_core::{DType, Tensor, Var};

use crate::error::{Error, Result};

/// Which update rule, with its hyper-parameters (the learning rate is given per step).
#[derive(Clone, Debug, PartialEq)]
pub enum OptimizerKind {
    /// Adam with decoupled weight decay (Loshchilov & Hutter; PyTorch's `AdamW`).
    AdamW {
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the second moment's root.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
    /// SGD with PyTorch's momentum semantics (no dampening); weight decay is added to the gradient.
    Sgd {
        /// Momentum factor.
        momentum: f64,
        /// Nesterov momentum.
        nesterov: bool,
        /// L2 penalty added to the gradient.
        weight_decay: f64,
    },
}

/// Per-parameter state: the moment tensors, parallel to the parameters.
enum Moments {
    Adam {
        m: Vec<Tensor>,
        v: Vec<Tensor>,
    },
    /// Empty when momentum is zero (plain SGD keeps no state).
    Sgd {
        buf: Vec<Tensor>,
    },
}

/// An optimizer over an ordered list of named parameters.
pub struct Optimizer {
    params: Vec<(String, Var)>,
    kind: OptimizerKind,
    moments: Moments,
    steps_taken: u64,
}

impl Optimizer {
    /// An optimizer over `params` (name, variable), in the order given.
    pub fn new(params: Vec<(String, Var)>, kind: OptimizerKind) -> Result<Self> {
        check_hyper(&kind)?;
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &params {
            if !seen.insert(name.as_str()) {
                return Err(Error::Train(format!(
                    "optimizer: parameter {name} given twice"
                )));
            }
        }
        let zeros = || -> Result<Vec<Tensor>> {
            params
                .iter()
                .map(|(_, p)| Ok(p.as_tensor().zeros_like()?))
                .collect()
        };
        let moments = match &kind {
            OptimizerKind::AdamW { .. } => Moments::Adam {
                m: zeros()?,
                v: zeros()?,
            },
            OptimizerKind::Sgd { momentum, .. } if *momentum != 0.0 => {
                Moments::Sgd { buf: zeros()? }
            }
            OptimizerKind::Sgd { .. } => Moments::Sgd { buf: Vec::new() },
        };
        Ok(Optimizer {
            params,
            kind,
            moments,
            steps_taken: 0,
        })
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// Which optimizer, with its hyperparameters.
    pub fn kind(&self) -> &OptimizerKind {
        &self.kind
    }

    /// Updates applied so far.
    pub fn steps_taken(&self) -> u64 {
        self.steps_taken
    }

    /// One update with gradients parallel to `params()`. Clips the global L2 norm to `clip`
    /// when given (PyTorch's `clip_grad_norm_`: scale by `clip / (norm + 1e-6)` when that is
    /// below 1). Returns the gradient norm before clipping.
    ///
    /// A non-finite norm (a NaN or infinite gradient) skips the update entirely: weights,
    /// moments and `steps_taken` stay as they were, and the norm is returned so the caller can
    /// log it and decide whether to stop.
    pub fn step(&mut self, grads: &[Tensor], lr: f64, clip: Option<f64>) -> Result<f64> {
        if grads.len() != self.params.len() {
            return Err(Error::Train(format!(
                "optimizer: {} gradients for {} parameters",
                grads.len(),
                self.params.len()
            )));
        }
        for ((name, p), g) in self.params.iter().zip(grads) {
            if p.shape() != g.shape() {
                return Err(Error::Train(format!(
                    "optimizer: gradient of {name} has shape {:?}, the parameter {:?}",
                    g.dims(),
                    p.dims()
                )));
            }
        }
        if !lr.is_finite() || lr < 0.0 {
            return Err(Error::Train(format!(
                "optimizer: learning rate {lr} is not a finite non-negative number"
            )));
        }
        let norm = global_norm(grads)?;
        if !norm.is_finite() {
            return Ok(norm);
        }
        let scale = match clip {
            Some(max) if norm > max => max / (norm + 1e-6),
            _ => 1.0,
        };
        // Detached copies: the update must not extend the autograd graph of the weights.
        let grads: Vec<Tensor> = grads
            .iter()
            .map(|g| {
                let g = g.detach();
                if scale != 1.0 {
                    Ok(g.affine(scale, 0.0)?)
                } else {
                    Ok(g)
                }
            })
            .collect::<Result<_>>()?;
        self.steps_taken += 1;
        match (&self.kind, &mut self.moments) {
            (
                OptimizerKind::AdamW {
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                },
                Moments::Adam { m, v },
            ) => {
                let t = self.steps_taken as i32;
                let bias1 = 1.0 - beta1.powi(t);
                let bias2_sqrt = (1.0 - beta2.powi(t)).sqrt();
                for (i, ((_, p), g)) in self.params.iter().zip(&grads).enumerate() {
                    let theta = p.as_detached_tensor();
                    let theta = if *weight_decay != 0.0 {
                        theta.affine(1.0 - lr * weight_decay, 0.0)?
                    } else {
                        theta
                    };
                    let m_next = (m[i].affine(*beta1, 0.0)? + g.affine(1.0 - beta1, 0.0)?)?;
                    let v_next =
                        (v[i].affine(*beta2, 0.0)? + g.sqr()?.affine(1.0 - beta2, 0.0)?)?;
                    // PyTorch's arrangement: denom = sqrt(v) / sqrt(1 - b2^t) + eps.
                    let denom = v_next.sqrt()?.affine(1.0 / bias2_sqrt, *eps)?;
                    let update = (&m_next / denom)?.affine(lr / bias1, 0.0)?;
                    p.set(&(theta - update)?)?;
                    m[i] = m_next;
                    v[i] = v_next;
                }
            }
            (
                OptimizerKind::Sgd {
                    momentum,
                    nesterov,
                    weight_decay,
                },
                Moments::Sgd { buf },
            ) => {
                for (i, ((_, p), g)) in self.params.iter().zip(&grads).enumerate() {
                    let theta = p.as_detached_tensor();
                    let g = if *weight_decay != 0.0 {
                        (g + theta.affine(*weight_decay, 0.0)?)?
                    } else {
                        g.clone()
                    };
                    let direction = if *momentum != 0.0 {
                        let b = (buf[i].affine(*momentum, 0.0)? + &g)?;
                        let d = if *nesterov {
                            (&g + b.affine(*momentum, 0.0)?)?
                        } else {
                            b.clone()
                        };
                        buf[i] = b;
                        d
                    } else {
                        g
                    };
                    p.set(&(theta - direction.affine(lr, 0.0)?)?)?;
                }
            }
            _ => unreachable!("moments are created from the kind in new()"),
        }
        Ok(norm)
    }

    /// The moments as named tensors: `adam_m/NAME` and `adam_v/NAME`, or `sgd_buf/NAME`
    /// (nothing for SGD without momentum).
    pub fn state_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for (prefix, tensors) in self.named_moments() {
            for ((name, _), t) in self.params.iter().zip(tensors) {
                out.insert(format!("{prefix}/{name}"), t.clone());
            }
        }
        Ok(out)
    }

    /// Restore moments saved by `state_tensors` (converted to each parameter's device and
    /// dtype). The names must be exactly the expected ones and the shapes must match.
    pub fn load_state(
        &mut self,
        tensors: &HashMap<String, Tensor>,
        steps_taken: u64,
    ) -> Result<()> {
        let mut expected = 0usize;
        let mut loaded: Vec<Vec<Tensor>> = Vec::new();
        for (prefix, _) in self.named_moments() {
            let mut group = Vec::with_capacity(self.params.len());
            for (name, p) in &self.params {
                let key = format!("{prefix}/{name}");
                let t = tensors.get(&key).ok_or_else(|| {
                    Error::Train(format!(
                        "optimizer state: tensor {key} is missing (was the checkpoint written \
                         for another model or optimizer?)"
                    ))
                })?;
                if t.shape() != p.shape() {
                    return Err(Error::Train(format!(
                        "optimizer state: {key} has shape {:?}, the parameter {:?}",
                        t.dims(),
                        p.dims()
                    )));
                }
                group.push(t.to_device(p.device())?.to_dtype(p.dtype())?);
                expected += 1;
            }
            loaded.push(group);
        }
        if tensors.len() != expected {
            let mut unknown: Vec<&String> = tensors
                .keys()
                .filter(|k| !self.is_expected_key(k))
                .collect();
            unknown.sort();
            unknown.truncate(5);
            return Err(Error::Train(format!(
                "optimizer state: {} tensors where {expected} were expected; unexpected: {unknown:?}",
                tensors.len()
            )));
        }
        let mut groups = loaded.into_iter();
        match &mut self.moments {
            Moments::Adam { m, v } => {
                *m = groups.next().unwrap_or_default();
                *v = groups.next().unwrap_or_default();
            }
            Moments::Sgd { buf } => {
                if !buf.is_empty() {
                    *buf = groups.next().unwrap_or_default();
                }
            }
        }
        self.steps_taken = steps_taken;
        Ok(())
    }

    /// (prefix, tensors parallel to params) for every kind of moment this optimizer keeps.
    fn named_moments(&self) -> Vec<(&'static str, &[Tensor])> {
        match &self.moments {
            Moments::Adam { m, v } => vec![("adam_m", m), ("adam_v", v)],
            Moments::Sgd { buf } if buf.is_empty() => Vec::new(),
            Moments::Sgd { buf } => vec![("sgd_buf", buf)],
        }
    }

    fn is_expected_key(&self, key: &str) -> bool {
        self.named_moments().iter().any(|(prefix, _)| {
            key.strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|name| self.params.iter().any(|(n, _)| n == name))
        })
    }
}

fn check_hyper(kind: &OptimizerKind) -> Result<()> {
    let bad = |what: &str, v: f64| {
        Err(Error::Config(format!(
            "optimizer: {what} = {v} is out of range"
        )))
    };
    match *kind {
        OptimizerKind::AdamW {
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            if !(0.0..1.0).contains(&beta1) {
                return bad("beta1", beta1);
            }
            if !(0.0..1.0).contains(&beta2) {
                return bad("beta2", beta2);
            }
            if !(eps > 0.0 && eps.is_finite()) {
                return bad("eps", eps);
            }
            if !(weight_decay >= 0.0 && weight_decay.is_finite()) {
                return bad("weight_decay", weight_decay);
            }
        }
        OptimizerKind::Sgd {
            momentum,
            weight_decay,
            nesterov,
        } => {
            if !(0.0..1.0).contains(&momentum) {
                return bad("momentum", momentum);
            }
            if nesterov && momentum == 0.0 {
                return Err(Error::Config(
                    "optimizer: Nesterov momentum needs momentum > 0".into(),
                ));
            }
            if !(weight_decay >= 0.0 && weight_decay.is_finite()) {
                return bad("weight_decay", weight_decay);
            }
        }
    }
    Ok(())
}

/// The L2 norm of all gradients together. Per-tensor sums of squares are reduced on the
/// device and fetched in one transfer, then added in f64.
fn global_norm(grads: &[Tensor]) -> Result<f64> {
    if grads.is_empty() {
        return Ok(0.0);
    }
    let sums: Vec<Tensor> = grads
        .iter()
        .map(|g| Ok(g.detach().sqr()?.sum_all()?.to_dtype(DType::F32)?))
        .collect::<Result<_>>()?;
    let sums = Tensor::stack(&sums, 0)?.to_vec1::<f32>()?;
    Ok(sums.iter().map(|&s| s as f64).sum::<f64>().sqrt())
}

/// nnU-Net's poly schedule: `base * (1 - step/total)^exponent`, never negative (0 from
/// `step >= total` on).
pub fn poly_lr(base: f64, step: u64, total: u64, exponent: f64) -> f64 {
    if step >= total {
        return 0.0;
    }
    base * (1.0 - step as f64 / total as f64).powf(exponent)
}

#[cfg(test)]
mod tests;
