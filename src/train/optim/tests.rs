//! Tests of the optimizer: AdamW and SGD against naive f64 references, state round trips and
//! the poly schedule.

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
