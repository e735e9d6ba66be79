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
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
    /// SGD with PyTorch's momentum semantics (no dampening); weight decay is added to the gradient.
    Sgd {
        momentum: f64,
        nesterov: bool,
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

    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    pub fn kind(&self) -> &OptimizerKind {
        &self.kind
    }

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
mod tests {
    use super::*;
    use candle_core::Device;

    fn var(values: &[f32]) -> Var {
        Var::from_tensor(&Tensor::new(values, &Device::Cpu).unwrap()).unwrap()
    }

    fn values(v: &Var) -> Vec<f32> {
        v.as_tensor().to_vec1::<f32>().unwrap()
    }

    fn close(a: &[f32], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!(
                (*x as f64 - y).abs() <= tol * (1.0 + y.abs()),
                "{a:?} vs {b:?}"
            );
        }
    }

    /// Naive f64 AdamW on one scalar, straight from the PyTorch docs.
    struct RefAdam {
        theta: f64,
        m: f64,
        v: f64,
        t: i32,
    }
    impl RefAdam {
        fn step(&mut self, g: f64, lr: f64, b1: f64, b2: f64, eps: f64, wd: f64) {
            self.t += 1;
            self.theta -= lr * wd * self.theta;
            self.m = b1 * self.m + (1.0 - b1) * g;
            self.v = b2 * self.v + (1.0 - b2) * g * g;
            let m_hat = self.m / (1.0 - b1.powi(self.t));
            let v_hat = self.v / (1.0 - b2.powi(self.t));
            self.theta -= lr * m_hat / (v_hat.sqrt() + eps);
        }
    }

    #[test]
    fn adamw_first_step_moves_by_lr_times_sign() {
        // After bias correction the first Adam step is lr * g / (|g| + eps) = ±lr.
        let p = var(&[1.0, -2.0, 0.5]);
        let kind = OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        let mut opt = Optimizer::new(vec![("w".into(), p.clone())], kind).unwrap();
        let g = Tensor::new(&[0.3f32, -4.0, 1e-3], &Device::Cpu).unwrap();
        opt.step(&[g], 0.1, None).unwrap();
        close(&values(&p), &[0.9, -1.9, 0.4], 1e-5);
        assert_eq!(opt.steps_taken(), 1);
    }

    #[test]
    fn adamw_matches_reference_with_weight_decay() {
        let (b1, b2, eps, wd) = (0.9, 0.99, 1e-8, 0.05);
        let init = [0.7f32, -1.3, 2.0];
        let p = var(&init);
        let kind = OptimizerKind::AdamW {
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: wd,
        };
        let mut opt = Optimizer::new(vec![("w".into(), p.clone())], kind).unwrap();
        let mut refs: Vec<RefAdam> = init
            .iter()
            .map(|&x| RefAdam {
                theta: x as f64,
                m: 0.0,
                v: 0.0,
                t: 0,
            })
            .collect();
        let grads = [[0.5, -0.25, 1.5], [0.1, 0.3, -2.0], [-0.7, 0.05, 0.4]];
        for (k, g) in grads.iter().enumerate() {
            let lr = 0.01 * (k + 1) as f64;
            let gt = Tensor::new(&g.map(|x| x as f32), &Device::Cpu).unwrap();
            opt.step(&[gt], lr, None).unwrap();
            for (r, &gi) in refs.iter_mut().zip(g) {
                r.step(gi, lr, b1, b2, eps, wd);
            }
        }
        let expect: Vec<f64> = refs.iter().map(|r| r.theta).collect();
        close(&values(&p), &expect, 1e-6);
    }

    #[test]
    fn sgd_nesterov_and_weight_decay_match_hand_values() {
        // One scalar, mu = 0.9, wd = 0.1, lr = 0.5, theta0 = 1, g = 2 then 1.
        // step 1: g' = 2 + 0.1*1 = 2.1; buf = 2.1; d = 2.1 + 0.9*2.1 = 3.99; theta = 1 - 1.995 = -0.995
        // step 2: g' = 1 + 0.1*(-0.995) = 0.9005; buf = 0.9*2.1 + 0.9005 = 2.7905;
        //         d = 0.9005 + 0.9*2.7905 = 3.41195; theta = -0.995 - 1.705975 = -2.700975
        let p = var(&[1.0]);
        let kind = OptimizerKind::Sgd {
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.1,
        };
        let mut opt = Optimizer::new(vec![("w".into(), p.clone())], kind).unwrap();
        opt.step(&[Tensor::new(&[2f32], &Device::Cpu).unwrap()], 0.5, None)
            .unwrap();
        close(&values(&p), &[-0.995], 1e-6);
        opt.step(&[Tensor::new(&[1f32], &Device::Cpu).unwrap()], 0.5, None)
            .unwrap();
        close(&values(&p), &[-2.700975], 1e-6);
        let state = opt.state_tensors().unwrap();
        close(
            &state["sgd_buf/w"].to_vec1::<f32>().unwrap(),
            &[2.7905],
            1e-6,
        );
    }

    #[test]
    fn sgd_plain_momentum_and_no_momentum() {
        // Heavy ball: buf = 0.5*buf + g, theta -= lr*buf.  g = 1, 1: theta 0 -> -0.1 -> -0.25.
        let p = var(&[0.0]);
        let kind = OptimizerKind::Sgd {
            momentum: 0.5,
            nesterov: false,
            weight_decay: 0.0,
        };
        let mut opt = Optimizer::new(vec![("w".into(), p.clone())], kind).unwrap();
        for _ in 0..2 {
            opt.step(&[Tensor::new(&[1f32], &Device::Cpu).unwrap()], 0.1, None)
                .unwrap();
        }
        close(&values(&p), &[-0.25], 1e-7);

        let q = var(&[3.0]);
        let kind = OptimizerKind::Sgd {
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        let mut opt = Optimizer::new(vec![("q".into(), q.clone())], kind).unwrap();
        opt.step(&[Tensor::new(&[2f32], &Device::Cpu).unwrap()], 0.25, None)
            .unwrap();
        close(&values(&q), &[2.5], 1e-7);
        assert!(opt.state_tensors().unwrap().is_empty());
    }

    #[test]
    fn clipping_scales_to_the_global_norm() {
        // Two tensors, gradients (3) and (4, 0): global norm 5. Clip to 1 -> scale 1/(5+1e-6).
        let a = var(&[0.0]);
        let b = var(&[0.0, 0.0]);
        let kind = OptimizerKind::Sgd {
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        let mut opt =
            Optimizer::new(vec![("a".into(), a.clone()), ("b".into(), b.clone())], kind).unwrap();
        let ga = Tensor::new(&[3f32], &Device::Cpu).unwrap();
        let gb = Tensor::new(&[4f32, 0.0], &Device::Cpu).unwrap();
        let norm = opt.step(&[ga.clone(), gb.clone()], 1.0, Some(1.0)).unwrap();
        assert!((norm - 5.0).abs() < 1e-6);
        let s = 1.0 / (5.0 + 1e-6);
        close(&values(&a), &[-3.0 * s], 1e-6);
        close(&values(&b), &[-4.0 * s, 0.0], 1e-6);
        // Below the threshold nothing is scaled.
        let norm = opt.step(&[ga, gb], 1.0, Some(12.0)).unwrap();
        assert!((norm - 5.0).abs() < 1e-6);
        close(&values(&a), &[-3.0 * s - 3.0], 1e-6);
    }

    #[test]
    fn non_finite_gradient_skips_the_update() {
        let p = var(&[1.0, 2.0]);
        let kind = OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        };
        let mut opt = Optimizer::new(vec![("w".into(), p.clone())], kind).unwrap();
        let g = Tensor::new(&[f32::NAN, 1.0], &Device::Cpu).unwrap();
        let norm = opt.step(&[g], 0.1, Some(12.0)).unwrap();
        assert!(norm.is_nan());
        assert_eq!(values(&p), vec![1.0, 2.0]);
        assert_eq!(opt.steps_taken(), 0);
    }

    #[test]
    fn bad_gradients_and_state_are_refused() {
        let p = var(&[1.0, 2.0]);
        let kind = OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        let mut opt = Optimizer::new(vec![("w".into(), p)], kind).unwrap();
        let g = Tensor::new(&[1f32], &Device::Cpu).unwrap();
        assert!(opt.step(&[g], 0.1, None).is_err());
        let mut st = opt.state_tensors().unwrap();
        st.insert(
            "adam_m/w".into(),
            Tensor::new(&[1f32, 2.0, 3.0], &Device::Cpu).unwrap(),
        );
        let msg = opt.load_state(&st, 3).unwrap_err().to_string();
        assert!(msg.contains("adam_m/w") && msg.contains("shape"), "{msg}");
        let mut st = opt.state_tensors().unwrap();
        st.remove("adam_v/w");
        let msg = opt.load_state(&st, 3).unwrap_err().to_string();
        assert!(msg.contains("adam_v/w") && msg.contains("missing"), "{msg}");
        let mut st = opt.state_tensors().unwrap();
        st.insert(
            "adam_m/other".into(),
            Tensor::new(&[1f32], &Device::Cpu).unwrap(),
        );
        let msg = opt.load_state(&st, 3).unwrap_err().to_string();
        assert!(msg.contains("adam_m/other"), "{msg}");
    }

    fn round_trip(kind: OptimizerKind) {
        let dir = tempfile::tempdir().unwrap();
        let init: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
        let grad = |k: usize| -> Tensor {
            let g: Vec<f32> = (0..24).map(|i| ((i * 7 + k) as f32 * 0.11).cos()).collect();
            Tensor::new(g.as_slice(), &Device::Cpu)
                .unwrap()
                .reshape((2, 3, 4))
                .unwrap()
        };
        let make = |values: &Tensor| {
            let w = Var::from_tensor(&values.copy().unwrap()).unwrap();
            let b = Var::from_tensor(&Tensor::new(&[0.5f32, -0.5], &Device::Cpu).unwrap()).unwrap();
            Optimizer::new(vec![("b".into(), b), ("w".into(), w)], kind.clone()).unwrap()
        };
        let w0 = Tensor::new(init.as_slice(), &Device::Cpu)
            .unwrap()
            .reshape((2, 3, 4))
            .unwrap();
        let gb = Tensor::new(&[0.2f32, -0.1], &Device::Cpu).unwrap();
        let mut a = make(&w0);
        for k in 0..3 {
            a.step(&[gb.clone(), grad(k)], 0.01, Some(12.0)).unwrap();
        }
        // Save moments and weights through safetensors files, as a checkpoint does.
        let opt_file = dir.path().join("opt.safetensors");
        candle_core::safetensors::save(&a.state_tensors().unwrap(), &opt_file).unwrap();
        let w_saved = a.params()[1].1.as_tensor().copy().unwrap();
        let b_saved = a.params()[0].1.as_tensor().copy().unwrap();
        let mut b = make(&w_saved);
        b.params()[0].1.set(&b_saved).unwrap();
        let loaded = candle_core::safetensors::load(&opt_file, &Device::Cpu).unwrap();
        b.load_state(&loaded, a.steps_taken()).unwrap();
        assert_eq!(b.steps_taken(), 3);
        for k in 3..5 {
            a.step(&[gb.clone(), grad(k)], 0.01, Some(12.0)).unwrap();
            b.step(&[gb.clone(), grad(k)], 0.01, Some(12.0)).unwrap();
        }
        for i in 0..2 {
            let x = a.params()[i]
                .1
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let y = b.params()[i]
                .1
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let xb: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
            let yb: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(xb, yb);
        }
    }

    #[test]
    fn state_round_trip_is_bit_exact() {
        round_trip(OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 3e-5,
        });
        round_trip(OptimizerKind::Sgd {
            momentum: 0.99,
            nesterov: true,
            weight_decay: 3e-5,
        });
    }

    #[test]
    fn poly_lr_endpoints() {
        assert_eq!(poly_lr(0.01, 0, 1000, 0.9), 0.01);
        assert_eq!(poly_lr(0.01, 1000, 1000, 0.9), 0.0);
        assert_eq!(poly_lr(0.01, 5000, 1000, 0.9), 0.0);
        let mid = poly_lr(0.01, 500, 1000, 0.9);
        assert!((mid - 0.01 * 0.5f64.powf(0.9)).abs() < 1e-15);
        assert!(poly_lr(0.01, 999, 1000, 0.9) > 0.0);
    }
}
