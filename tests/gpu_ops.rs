//! The CUDA ops against the CPU ops on the same inputs: forward values, and the gradients of
//! loss = sum(out * R) for a random R, for every custom op and for a whole small U-Net.
//!
//! Compiled only with `--features cuda` and meant for a machine with an NVIDIA GPU:
//! `scripts/gpu_check.sh` runs it (built by scripts/build_cuda.sh). Without a GPU every test
//! fails at its first line, on purpose: passing without running would say nothing.
//!
//! Tolerances (|gpu - cpu| <= tol * max(|cpu|, rms(cpu)) per element): convolutions 1e-4 in
//! full f32 (cuDNN with FMA math) and 2e-2 with TF32 tensor cores (the default, as PyTorch's);
//! norm, pooling and bias 1e-4; the whole U-Net's loss and gradients 1e-3 (a conv bias
//! before instance norm, whose exact gradient is zero, within 1e-5 of the network's largest
//! gradient rms instead); bf16 ops against
//! the CPU's widened op (f32 arithmetic on the same bf16 values, rounded to bf16) 3e-2 (max
//! pooling exactly), and the bf16 U-Net's loss within 2% of its f32 loss.
#![cfg(feature = "cuda")]

use std::sync::{Mutex, MutexGuard};

use candle_core::{DType, Device, Tensor, Var};
use voxcache::model::config::{Precision, UNetConfig};
use voxcache::model::ops::cuda::conv::set_tf32;
use voxcache::model::ops::{
    add_channel_bias, conv3d, conv_transpose3d, group_norm_leaky_relu, max_pool3d,
};
use voxcache::model::unet::UNet;
use voxcache::util::rng::Rng;

/// The TF32 switch is process-wide: tests take this lock so they do not race on it.
static GPU: Mutex<()> = Mutex::new(());

fn gpu(tf32: bool) -> (MutexGuard<'static, ()>, Device) {
    let guard = GPU.lock().unwrap_or_else(|e| e.into_inner());
    set_tf32(tf32);
    let dev = Device::new_cuda(0).expect("these tests need an NVIDIA GPU and its driver");
    (guard, dev)
}

fn random(rng: &mut Rng, dims: &[usize], scale: f64, offset: f64) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| (rng.normal() * scale + offset) as f32)
        .collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

/// The same values as a CPU variable and a GPU variable.
fn pair(t: &Tensor, dev: &Device) -> (Var, Var) {
    (
        Var::from_tensor(t).unwrap(),
        Var::from_tensor(&t.to_device(dev).unwrap()).unwrap(),
    )
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Largest |gpu - cpu| / max(|cpu|, rms(cpu)); panics above `tol`.
fn assert_close(gpu: &Tensor, cpu: &Tensor, tol: f64, what: &str) -> f64 {
    assert_eq!(gpu.dims(), cpu.dims(), "{what}: shape");
    let (g, c) = (values(gpu), values(cpu));
    let rms = (c.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / c.len().max(1) as f64)
        .sqrt()
        .max(1e-12);
    let mut worst = (0.0f64, 0usize);
    for (i, (&a, &b)) in g.iter().zip(&c).enumerate() {
        assert!(a.is_finite(), "{what}: element {i} is {a}");
        let err = (a as f64 - b as f64).abs() / (b as f64).abs().max(rms);
        if err > worst.0 {
            worst = (err, i);
        }
    }
    println!("{what}: max relative difference {:.2e}", worst.0);
    assert!(
        worst.0 <= tol,
        "{what}: element {} gpu {} cpu {} (relative {:.2e} > {tol:.0e})",
        worst.1,
        g[worst.1],
        c[worst.1],
        worst.0
    );
    worst.0
}

/// Runs `op` on CPU and GPU copies of `inputs`, compares the outputs and the gradients of
/// sum(out * R) with respect to every input.
fn check(
    what: &str,
    inputs: &[Tensor],
    dev: &Device,
    tol: f64,
    op: impl Fn(&[&Tensor]) -> candle_core::Result<Tensor>,
) {
    let pairs: Vec<(Var, Var)> = inputs.iter().map(|t| pair(t, dev)).collect();
    let cpu_in: Vec<&Tensor> = pairs.iter().map(|p| p.0.as_tensor()).collect();
    let gpu_in: Vec<&Tensor> = pairs.iter().map(|p| p.1.as_tensor()).collect();
    let (yc, yg) = (op(&cpu_in).unwrap(), op(&gpu_in).unwrap());
    assert!(yg.device().is_cuda(), "{what}: output left the GPU");
    assert_close(&yg, &yc, tol, &format!("{what} forward"));
    let mut rng = Rng::new(0x6770_7500 ^ inputs.len() as u64);
    let r = random(&mut rng, yc.dims(), 1.0, 0.0)
        .to_dtype(yc.dtype())
        .unwrap();
    let gc = (yc * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let gg = (yg * r.to_device(dev).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for (i, (c, g)) in pairs.iter().enumerate() {
        let (dc, dg) = (
            gc.get(c.as_tensor()).expect("cpu gradient"),
            gg.get(g.as_tensor()).expect("gpu gradient"),
        );
        assert_close(dg, dc, tol, &format!("{what} gradient of input {i}"));
    }
}

#[test]
fn conv3d_matches_cpu() {
    let (_g, dev) = gpu(false);
    let mut rng = Rng::new(1);
    // (x dims, w dims, padding, stride): the U-Net's 3x3x3 and anisotropic 1x3x3 blocks,
    // strided downsampling and the 1x1x1 head, on odd sizes.
    type Case = ([usize; 5], [usize; 5], [usize; 3], [usize; 3]);
    let cases: [Case; 4] = [
        ([2, 4, 9, 10, 11], [6, 4, 3, 3, 3], [1, 1, 1], [1, 1, 1]),
        ([2, 3, 5, 12, 13], [5, 3, 1, 3, 3], [0, 1, 1], [1, 2, 2]),
        ([1, 4, 10, 10, 10], [8, 4, 3, 3, 3], [1, 1, 1], [2, 2, 2]),
        ([2, 6, 7, 8, 9], [2, 6, 1, 1, 1], [0, 0, 0], [1, 1, 1]),
    ];
    for (x, w, pad, stride) in cases {
        let inputs = [
            random(&mut rng, &x, 1.0, 0.0),
            random(&mut rng, &w, 0.3, 0.0),
        ];
        check(&format!("conv3d x{x:?} w{w:?}"), &inputs, &dev, 1e-4, |t| {
            conv3d(t[0], t[1], pad, stride)
        });
    }
}

#[test]
fn conv3d_with_tf32_stays_close() {
    let (_g, dev) = gpu(true);
    let mut rng = Rng::new(2);
    let inputs = [
        random(&mut rng, &[2, 16, 12, 12, 12], 1.0, 0.0),
        random(&mut rng, &[16, 16, 3, 3, 3], 0.1, 0.0),
    ];
    check("conv3d tf32", &inputs, &dev, 2e-2, |t| {
        conv3d(t[0], t[1], [1; 3], [1; 3])
    });
}

/// bf16 convolutions (cuDNN, tensor cores, f32 accumulation) against the CPU oracle: the f32
/// op on the same bf16 values, rounded to bf16. Gradients are bf16 too, so the bound is
/// bf16's: a few units of its 2^-8 relative step after summing.
#[test]
fn bf16_convolutions_match_the_widened_cpu_op() {
    let (_g, dev) = gpu(false);
    let mut rng = Rng::new(11);
    let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
    let inputs = [
        bf(random(&mut rng, &[2, 8, 9, 10, 11], 1.0, 0.0)),
        bf(random(&mut rng, &[16, 8, 3, 3, 3], 0.2, 0.0)),
    ];
    check("conv3d bf16", &inputs, &dev, 3e-2, |t| {
        conv3d(t[0], t[1], [1; 3], [1; 3])
    });
    let inputs = [
        bf(random(&mut rng, &[2, 8, 5, 4, 3], 1.0, 0.0)),
        bf(random(&mut rng, &[8, 4, 2, 2, 2], 0.3, 0.0)),
    ];
    check("conv_transpose3d bf16", &inputs, &dev, 3e-2, |t| {
        conv_transpose3d(t[0], t[1], [2, 2, 2])
    });
}

/// Our bf16 kernels (norm, pooling, bias: bf16 storage, f32 arithmetic) against the CPU's
/// widened op on the same bf16 values.
#[test]
fn bf16_kernels_match_the_widened_cpu_op() {
    let (_g, dev) = gpu(false);
    let mut rng = Rng::new(14);
    let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
    for groups in [8, 2] {
        let inputs = [
            bf(random(&mut rng, &[2, 8, 6, 17, 16], 2.0, 0.5)),
            bf(random(&mut rng, &[8], 0.5, 1.0)),
            bf(random(&mut rng, &[8], 0.5, 0.0)),
        ];
        check(
            &format!("group_norm bf16 groups {groups}"),
            &inputs,
            &dev,
            3e-2,
            |t| group_norm_leaky_relu(t[0], t[1], t[2], groups, 1e-5, 0.01),
        );
    }
    let x = bf(random(&mut rng, &[2, 3, 8, 10, 12], 1.0, 0.0));
    check(
        "max_pool3d bf16",
        std::slice::from_ref(&x),
        &dev,
        0.0,
        |t| max_pool3d(t[0], [2, 2, 2]),
    );
    let relu = x.relu().unwrap();
    check("max_pool3d bf16 ties", &[relu], &dev, 0.0, |t| {
        max_pool3d(t[0], [1, 2, 2])
    });
    let inputs = [
        bf(random(&mut rng, &[2, 5, 16, 32, 33], 1.0, 0.0)),
        bf(random(&mut rng, &[5], 1.0, 0.0)),
    ];
    check("add_channel_bias bf16", &inputs, &dev, 3e-2, |t| {
        add_channel_bias(t[0], t[1])
    });
}

#[test]
fn conv_transpose3d_matches_cpu() {
    let (_g, dev) = gpu(false);
    let mut rng = Rng::new(3);
    for (x, w, stride) in [
        ([2, 6, 5, 4, 3], [6, 4, 2, 2, 2], [2, 2, 2]),
        ([1, 8, 3, 5, 6], [8, 3, 1, 2, 2], [1, 2, 2]),
    ] {
        let inputs = [
            random(&mut rng, &x, 1.0, 0.0),
            random(&mut rng, &w, 0.3, 0.0),
        ];
        check(
            &format!("conv_transpose3d x{x:?}"),
            &inputs,
            &dev,
            1e-4,
            |t| conv_transpose3d(t[0], t[1], stride),
        );
    }
}

#[test]
fn group_norm_leaky_relu_matches_cpu() {
    let (_g, dev) = gpu(false);
    let mut rng = Rng::new(4);
    // (x dims, groups, slope, offset): instance norm, groups of channels, no activation,
    // a large common offset (the shifted sums), and slabs long enough to split into parts.
    let cases: [([usize; 5], usize, f64, f64); 5] = [
        ([2, 8, 6, 7, 5], 8, 0.01, 0.0),
        ([2, 8, 6, 7, 5], 2, 0.01, 0.0),
        ([1, 4, 5, 6, 7], 4, 1.0, 0.0),
        ([2, 4, 4, 5, 6], 4, 0.01, 100.0),
        ([1, 4, 32, 64, 64], 4, 0.01, 0.5),
    ];
    for (x, groups, slope, offset) in cases {
        let c = x[1];
        let inputs = [
            random(&mut rng, &x, 2.0, offset),
            random(&mut rng, &[c], 0.5, 1.0),
            random(&mut rng, &[c], 0.5, 0.0),
        ];
        let what = format!("group_norm_leaky_relu x{x:?} groups {groups} slope {slope}");
        check(&what, &inputs, &dev, 1e-4, |t| {
            group_norm_leaky_relu(t[0], t[1], t[2], groups, 1e-5, slope)
        });
    }
}

#[test]
fn max_pool3d_matches_cpu_including_ties() {
    let (_g, dev) = gpu(false);
    let mut rng = Rng::new(5);
    for k in [[2, 2, 2], [1, 2, 2]] {
        let x = random(&mut rng, &[2, 3, 8, 10, 12], 1.0, 0.0);
        check(
            &format!("max_pool3d k{k:?}"),
            std::slice::from_ref(&x),
            &dev,
            0.0,
            |t| max_pool3d(t[0], k),
        );
        // Post-ReLU data: windows full of equal zeros; the gradient must go to the first
        // one in scan order on both devices, so the comparison is exact.
        let relu = x.relu().unwrap();
        check(
            &format!("max_pool3d ties k{k:?}"),
            &[relu],
            &dev,
            0.0,
            |t| max_pool3d(t[0], k),
        );
    }
}

#[test]
fn channel_bias_matches_cpu() {
    let (_g, dev) = gpu(false);
    let mut rng = Rng::new(6);
    let inputs = [
        random(&mut rng, &[2, 5, 16, 32, 33], 1.0, 0.0),
        random(&mut rng, &[5], 1.0, 0.0),
    ];
    check("add_channel_bias", &inputs, &dev, 1e-4, |t| {
        add_channel_bias(t[0], t[1])
    });
}

#[test]
fn unet_loss_and_gradients_match_cpu() {
    let (_g, dev) = gpu(false);
    let config = UNetConfig {
        deep_supervision: true,
        ..UNetConfig::plain(2, 3, 8, 32, vec![[1, 2, 2], [2, 2, 2], [2, 2, 2]])
    };
    let cpu = UNet::new(config.clone(), 7, &Device::Cpu).unwrap();
    let gpu_net = UNet::new(config, 7, &dev).unwrap();
    let mut rng = Rng::new(8);
    let x = random(&mut rng, &[2, 2, 8, 32, 32], 1.0, 0.0);
    let loss = |net: &UNet, x: &Tensor| -> Tensor {
        let outs = net.forward_all(x).unwrap();
        let mut total = Tensor::zeros((), DType::F32, x.device()).unwrap();
        for (level, y) in outs.iter().enumerate() {
            let r = random(&mut Rng::new(100 + level as u64), y.dims(), 1.0, 0.0);
            let term = (y * r.to_device(x.device()).unwrap()).unwrap();
            total = (total + term.sqr().unwrap().mean_all().unwrap()).unwrap();
        }
        total
    };
    let (lc, lg) = (loss(&cpu, &x), loss(&gpu_net, &x.to_device(&dev).unwrap()));
    assert_close(&lg, &lc, 1e-3, "U-Net loss");
    let (gc, gg) = (lc.backward().unwrap(), lg.backward().unwrap());
    let gpu_params = gpu_net.params();
    let rms = |t: &Tensor| {
        let v = values(t);
        (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt()
    };
    // The network's gradient scale: the largest rms of a parameter's gradient on the CPU.
    let scale = cpu
        .params()
        .iter()
        .filter_map(|(_, v)| gc.get(v.as_tensor()).map(rms))
        .fold(0.0f64, f64::max);
    for ((name, vc), (name_g, vg)) in cpu.params().iter().zip(&gpu_params) {
        assert_eq!(name, name_g);
        let (dc, dg) = (gc.get(vc.as_tensor()), gg.get(vg.as_tensor()));
        let (Some(dc), Some(dg)) = (dc, dg) else {
            panic!("{name}: gradient missing on one device");
        };
        if name.ends_with("conv.bias") {
            // A conv bias followed by instance norm has a zero gradient in exact arithmetic:
            // both devices hold rounding noise there, which a relative comparison would
            // magnify. Checked instead to be noise against the network's gradient scale.
            for (dev, d) in [("gpu", dg), ("cpu", dc)] {
                let worst = values(d)
                    .iter()
                    .fold(0.0f64, |m, &x| m.max((x as f64).abs()));
                assert!(
                    worst <= 1e-5 * scale,
                    "{name}: {dev} gradient {worst:.2e}, the network's scale {scale:.2e}"
                );
            }
            continue;
        }
        assert_close(dg, dc, 1e-3, &format!("U-Net gradient {name}"));
    }
}

#[test]
fn unet_bf16_step_stays_close_to_f32() {
    let (_g, dev) = gpu(true);
    let config = UNetConfig::plain(1, 2, 16, 64, vec![[1, 2, 2], [2, 2, 2], [2, 2, 2]]);
    let mut net = UNet::new(config, 12, &dev).unwrap();
    let x = random(&mut Rng::new(13), &[2, 1, 16, 64, 64], 1.0, 0.0)
        .to_device(&dev)
        .unwrap();
    let loss = |net: &UNet| -> (f32, Tensor) {
        let y = net.forward(&x).unwrap();
        assert_eq!(y.dtype(), DType::F32);
        let l = y.sqr().unwrap().mean_all().unwrap();
        (l.to_scalar::<f32>().unwrap(), l)
    };
    let (l32, t32) = loss(&net);
    net.set_precision(Precision::Bf16);
    let (l16, t16) = loss(&net);
    println!("U-Net loss f32 {l32} bf16 {l16}");
    assert!(
        (l16 - l32).abs() <= 0.02 * l32.abs(),
        "f32 {l32} bf16 {l16}"
    );
    let (g32, g16) = (t32.backward().unwrap(), t16.backward().unwrap());
    for (name, p) in net.params() {
        if let (Some(a), Some(b)) = (g32.get(p.as_tensor()), g16.get(p.as_tensor())) {
            assert_eq!(b.dtype(), DType::F32, "{name}: master gradient must be f32");
            assert!(a.dims() == b.dims(), "{name}");
        }
    }
}
