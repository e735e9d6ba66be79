//! The U-Net's shapes, parameters, precision and deep supervision.

use super::*;
use crate::model::config::{Encoder, Norm};

#[test]
fn norm_and_upsampling_have_one_spelling() {
    for (text, norm) in [("instance", Norm::Instance), ("group:8", Norm::Group(8))] {
        assert_eq!(text.parse::<Norm>().unwrap(), norm);
        assert_eq!(norm.to_string(), text);
        assert_eq!(serde_json::to_value(norm).unwrap(), text);
        let t: toml::Table = toml::from_str(&format!("norm = \"{text}\"")).unwrap();
        assert_eq!(t["norm"].clone().try_into::<Norm>().unwrap(), norm);
    }
    for bad in ["group:0", "group:", "group", "batch"] {
        assert!(bad.parse::<Norm>().is_err(), "{bad}");
    }
    let t: toml::Table = toml::from_str("norm = { group = 8 }").unwrap();
    let e = t["norm"]
        .clone()
        .try_into::<Norm>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"group:8\""), "{e}");
    for u in [Upsampling::Transpose, Upsampling::Nearest] {
        assert_eq!(u.name().parse::<Upsampling>().unwrap(), u);
        assert_eq!(serde_json::to_value(u).unwrap(), u.name());
    }
    assert!("bilinear".parse::<Upsampling>().is_err());
}

#[test]
fn precision_has_one_spelling_and_f16_is_refused_with_a_reason() {
    for p in [Precision::F32, Precision::Bf16] {
        assert_eq!(p.name().parse::<Precision>().unwrap(), p);
        assert_eq!(serde_json::to_value(p).unwrap(), p.name());
    }
    let e = "f16".parse::<Precision>().unwrap_err().to_string();
    assert!(e.contains("loss scaling") && e.contains("bf16"), "{e}");
    assert!("fp32".parse::<Precision>().is_err());
}

/// bf16 passes (here through the generic ops on the CPU, the same casts as on a GPU) give
/// f32 logits close to the f32 ones, and f32 gradients for the f32 master weights that
/// point the same way.
#[test]
fn bf16_passes_keep_f32_outputs_and_gradients() -> Result<()> {
    let cfg = UNetConfig {
        deep_supervision: true,
        ..UNetConfig::plain(1, 2, 4, 8, vec![[1, 2, 2], [2, 2, 2]])
    };
    let dev = Device::Cpu;
    let mut net = UNet::new(cfg, 3, &dev)?;
    let mut rng = Rng::new(9);
    let x: Vec<f32> = (0..4 * 16 * 16).map(|_| rng.normal() as f32).collect();
    let x = Tensor::from_vec(x, (1, 1, 4, 16, 16), &dev)?;
    let run = |net: &UNet| -> Result<(Vec<Tensor>, candle_core::backprop::GradStore)> {
        let outs = net.forward_all(&x)?;
        let total = outs[0].sqr()?.mean_all()?;
        let grads = total.backward()?;
        Ok((outs, grads))
    };
    let (f32_out, f32_grads) = run(&net)?;
    net.set_precision(Precision::Bf16);
    let (bf_out, bf_grads) = run(&net)?;
    for (a, b) in f32_out.iter().zip(&bf_out) {
        assert_eq!(b.dtype(), DType::F32);
        let scale = a.abs()?.max_all()?.to_scalar::<f32>()?.max(1e-6);
        let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(
            diff / scale < 0.05,
            "bf16 logits off by {diff} (scale {scale})"
        );
        // Where this CPU multiplies by bf16 dot products the products really are bf16.
        if crate::model::ops::direct::bf16_dot_products() {
            assert!(diff > 0.0, "bf16 logits equal the f32 ones");
        }
    }
    for (name, p) in net.params() {
        let (g32, g16) = (f32_grads.get(p.as_tensor()), bf_grads.get(p.as_tensor()));
        let (Some(g32), Some(g16)) = (g32, g16) else {
            // Deep-supervision heads get no gradient from this full-resolution loss.
            assert!(name.starts_with(DS_PREFIX), "{name}: no gradient");
            continue;
        };
        assert_eq!(g16.dtype(), DType::F32, "{name}");
        let dot = (g32 * g16)?.sum_all()?.to_scalar::<f32>()?;
        let n =
            (g32.sqr()?.sum_all()?.sqrt()? * g16.sqr()?.sum_all()?.sqrt()?)?.to_scalar::<f32>()?;
        // A conv bias followed by instance norm has a zero gradient in exact arithmetic:
        // both devices hand it rounding noise, whose direction means nothing.
        if n > 1e-12 && !name.ends_with("conv.bias") {
            assert!(dot / n > 0.97, "{name}: cosine {}", dot / n);
        }
    }
    Ok(())
}

#[test]
fn deep_supervision_adds_heads_at_the_lower_levels() -> Result<()> {
    let cfg = UNetConfig {
        in_channels: 2,
        num_classes: 3,
        base_channels: 4,
        max_channels: 16,
        strides: UNetConfig::plan_strides([8, 32, 32], 4, 2),
        norm: Norm::Instance,
        upsampling: Upsampling::Transpose,
        deep_supervision: true,
        kernels: vec![],
        features: vec![],
        blocks: vec![],
        decoder_blocks: vec![],
        encoder: Encoder::Plain,
    };
    assert_eq!(cfg.supervised_levels(), vec![0, 1]);
    let w = cfg.level_weights();
    assert!((w[0] - 2.0 / 3.0).abs() < 1e-12 && (w[1] - 1.0 / 3.0).abs() < 1e-12);
    let five = UNetConfig {
        strides: UNetConfig::plan_strides([16, 64, 64], 5, 2),
        ..cfg.clone()
    };
    assert_eq!(five.supervised_levels(), vec![0, 1, 2]);
    let net = UNet::new(cfg.clone(), 3, &Device::Cpu)?;
    let x = Tensor::ones((1, 2, 8, 32, 32), DType::F32, &Device::Cpu)?;
    let outs = net.forward_all(&x)?;
    assert_eq!(outs.len(), 2);
    assert_eq!(outs[0].dims(), &[1, 3, 8, 32, 32]);
    let s = cfg.level_stride(1);
    assert_eq!(outs[1].dims(), &[1, 3, 8 / s[0], 32 / s[1], 32 / s[2]]);
    // The full-resolution output is the plain forward's.
    let plain = net.forward(&x)?;
    assert_eq!(
        plain.flatten_all()?.to_vec1::<f32>()?,
        outs[0].flatten_all()?.to_vec1::<f32>()?
    );
    // A model without the heads loads the checkpoint of one with them (prediction).
    let values: std::collections::HashMap<String, Tensor> = net
        .params()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    assert!(values.keys().any(|k| k.starts_with("ds1.")));
    let bare = UNet::new(
        UNetConfig {
            deep_supervision: false,
            kernels: vec![],
            features: vec![],
            blocks: vec![],
            decoder_blocks: vec![],
            ..cfg
        },
        9,
        &Device::Cpu,
    )?;
    bare.load(&values)?;
    assert_eq!(
        bare.forward(&x)?.flatten_all()?.to_vec1::<f32>()?,
        plain.flatten_all()?.to_vec1::<f32>()?
    );
    Ok(())
}

#[test]
fn strides_follow_the_patch() {
    assert_eq!(
        UNetConfig::plan_strides([16, 64, 64], 5, 4),
        vec![[2, 2, 2], [2, 2, 2], [1, 2, 2], [1, 2, 2]]
    );
    assert_eq!(
        UNetConfig::plan_strides([5, 32, 32], 3, 4),
        vec![[1, 2, 2], [1, 2, 2]]
    );
}

#[test]
fn forward_keeps_the_spatial_shape() -> Result<()> {
    for up in [Upsampling::Transpose, Upsampling::Nearest] {
        let strides = UNetConfig::plan_strides([8, 16, 16], 3, 4);
        let cfg = UNetConfig {
            norm: Norm::Group(2),
            upsampling: up,
            ..UNetConfig::plain(1, 3, 4, 8, strides)
        };
        let net = UNet::new(cfg, 1, &Device::Cpu)?;
        let x = Tensor::ones((2, 1, 8, 16, 16), DType::F32, &Device::Cpu)?;
        assert_eq!(net.forward(&x)?.dims(), &[2, 3, 8, 16, 16]);
        // Same seed, same weights.
        let again = UNet::new(net.config().clone(), 1, &Device::Cpu)?;
        let (a, b) = (&net.params()[0].1, &again.params()[0].1);
        assert_eq!(
            a.flatten_all()?.to_vec1::<f32>()?,
            b.flatten_all()?.to_vec1::<f32>()?
        );
    }
    Ok(())
}

#[test]
fn per_stage_kernels_features_and_blocks_shape_the_network() -> Result<()> {
    let base = UNetConfig::plain(1, 2, 4, 8, vec![[1, 2, 2], [2, 2, 2]]);
    // The defaults spelled out are the same network, parameter for parameter.
    let spelled = UNetConfig {
        kernels: vec![[3, 3, 3]; 3],
        features: vec![4, 8, 8],
        blocks: vec![2; 3],
        decoder_blocks: vec![2; 2],
        ..base.clone()
    };
    let (a, b) = (
        UNet::new(base.clone(), 5, &Device::Cpu)?,
        UNet::new(spelled, 5, &Device::Cpu)?,
    );
    let names = |n: &UNet| {
        n.params()
            .into_iter()
            .map(|(k, v)| (k, v.dims().to_vec()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&a), names(&b));
    // nnU-Net's anisotropic plan: 1x3x3 kernels at full resolution, 3 / 1 / 2 blocks.
    let cfg = UNetConfig {
        kernels: vec![[1, 3, 3], [3, 3, 3], [3, 3, 3]],
        features: vec![3, 5, 7],
        blocks: vec![3, 1, 2],
        decoder_blocks: vec![1, 2],
        ..base.clone()
    };
    let net = UNet::new(cfg.clone(), 5, &Device::Cpu)?;
    // Counted by hand: conv weights + biases, norm weights + biases, ups, head.
    let conv =
        |ci: usize, co: usize, k: [usize; 3]| co * ci * k.iter().product::<usize>() + co + 2 * co;
    let want = conv(1, 3, [1, 3, 3])
        + 2 * conv(3, 3, [1, 3, 3])
        + conv(3, 5, [3; 3])
        + conv(5, 7, [3; 3])
        + conv(7, 7, [3; 3])
        + (7 * 5 * 8 + 5)
        + conv(10, 5, [3; 3])
        + conv(5, 5, [3; 3])
        + (5 * 3 * 4 + 3)
        + conv(6, 3, [1, 3, 3])
        + (3 * 2 + 2);
    assert_eq!(net.num_parameters(), want);
    assert!(net.params().iter().any(|(n, _)| n == "enc0.2.conv.weight"));
    assert!(!net.params().iter().any(|(n, _)| n == "dec0.1.conv.weight"));
    let x = Tensor::ones((1, 1, 4, 8, 8), DType::F32, &Device::Cpu)?;
    assert_eq!(net.forward(&x)?.dims(), &[1, 2, 4, 8, 8]);
    // Lists that do not fit the depth, even kernels: refused naming the key.
    for (bad, key) in [
        (
            UNetConfig {
                kernels: vec![[3; 3]; 2],
                ..base.clone()
            },
            "kernels",
        ),
        (
            UNetConfig {
                features: vec![4; 4],
                ..base.clone()
            },
            "features",
        ),
        (
            UNetConfig {
                decoder_blocks: vec![1; 3],
                ..base.clone()
            },
            "decoder_blocks",
        ),
        (
            UNetConfig {
                kernels: vec![[2, 3, 3]; 3],
                ..base.clone()
            },
            "odd",
        ),
    ] {
        let e = UNet::new(bad, 1, &Device::Cpu)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains(key), "{e}");
    }
    Ok(())
}

/// Prediction's pass (no graph; biases, norms and same-size convolutions written in place;
/// the decoder's upsampled tensor and concatenation never built) gives the training pass's
/// logits bit for bit in f32, for every layer kind, and records nothing: its result holds no
/// activation alive.
#[test]
fn infer_equals_forward_bit_for_bit_without_a_graph() -> Result<()> {
    let cases = [
        (Upsampling::Transpose, Encoder::Plain, Norm::Instance),
        (Upsampling::Nearest, Encoder::Plain, Norm::Group(2)),
        (Upsampling::Transpose, Encoder::Residual, Norm::Instance),
    ];
    for (up, encoder, norm) in cases {
        let residual = encoder == Encoder::Residual;
        let cfg = UNetConfig {
            in_channels: 2,
            num_classes: 3,
            base_channels: 4,
            max_channels: 8,
            strides: vec![[1, 2, 2], [2, 2, 2]],
            norm,
            upsampling: up,
            deep_supervision: false,
            kernels: vec![[1, 3, 3], [3, 3, 3], [3, 3, 3]],
            features: vec![],
            blocks: if residual { vec![1, 2, 2] } else { vec![] },
            decoder_blocks: vec![],
            encoder,
        };
        let net = UNet::new(cfg, 5, &Device::Cpu)?;
        // Biases and norm parameters away from their initial 0 and 1, so each is exercised.
        let mut rng = Rng::new(11);
        let values = net
            .params()
            .into_iter()
            .map(|(n, v)| {
                let t = v.as_tensor();
                let noise: Vec<f32> = (0..t.elem_count())
                    .map(|_| 0.1 * rng.normal() as f32)
                    .collect();
                let t = (t + Tensor::from_vec(noise, t.shape(), &Device::Cpu)?)?;
                Ok((n, t))
            })
            .collect::<Result<std::collections::HashMap<_, _>>>()?;
        net.load(&values)?;
        let x = Tensor::randn(0f32, 1.0, (2, 2, 6, 16, 20), &Device::Cpu)?;
        let trained = net.forward(&x)?;
        let inferred = net.infer(&x)?;
        assert!(trained.track_op(), "{up:?} {encoder:?}");
        assert!(!inferred.track_op(), "{up:?} {encoder:?}");
        assert_eq!(
            trained.flatten_all()?.to_vec1::<f32>()?,
            inferred.flatten_all()?.to_vec1::<f32>()?,
            "{up:?} {encoder:?} {norm:?}"
        );
        // With bf16 products, training keeps bf16 activations and prediction f32 ones (both
        // multiply bf16 operands): their logits differ by the activations' rounding alone.
        let mut net = net;
        net.set_precision(Precision::Bf16);
        let (trained, inferred) = (net.forward(&x)?, net.infer(&x)?);
        assert!(!inferred.track_op(), "bf16 {up:?} {encoder:?}");
        let scale = inferred.abs()?.max_all()?.to_scalar::<f32>()?;
        let diff = (&trained - &inferred)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(
            diff <= 0.03 * scale,
            "bf16 {up:?} {encoder:?} {norm:?}: {diff} of {scale}"
        );
    }
    Ok(())
}

#[test]
fn a_traced_pass_keeps_each_leaky_relu_output_in_forward_order() -> Result<()> {
    for encoder in [Encoder::Plain, Encoder::Residual] {
        let strides = UNetConfig::plan_strides([8, 16, 16], 3, 4);
        let cfg = UNetConfig {
            encoder,
            ..UNetConfig::plain(1, 2, 4, 8, strides)
        };
        let net = UNet::new(cfg, 3, &Device::Cpu)?;
        let x = Tensor::randn(0f32, 1.0, (1, 1, 8, 16, 16), &Device::Cpu)?;
        let (logits, acts) = net.forward_traced(&x)?;
        let same = (logits - net.forward(&x)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(same, 0.0, "{encoder:?}: tracing changes nothing");
        // Three stages of two blocks, then two decoder stages of two plain blocks. A residual
        // encoder starts with its stem's block, and each residual block has two activations
        // (after its first conv, and after its sum).
        let channels: Vec<usize> = acts.iter().map(|a| a.dims()[1]).collect();
        let want: &[usize] = match encoder {
            Encoder::Plain => &[4, 4, 8, 8, 8, 8, 8, 8, 4, 4],
            Encoder::Residual => &[4, 4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4],
        };
        assert_eq!(
            channels, want,
            "{encoder:?}: one output per LeakyReLU, in forward order"
        );
        for a in &acts {
            // LeakyReLU(0.01): below 0 only by a hundredth of the norm's output.
            let min = a.min_all()?.to_scalar::<f32>()?;
            assert!(min < 0.0 && min > -0.2, "{encoder:?}: {min}");
        }
    }
    Ok(())
}

/// The tape's training pass gives candle's graph's outputs and parameter gradients: bit for
/// bit in plain U-Nets (at most two paths meet at a tensor), f32 and bf16, with deep
/// supervision; within summation order in a residual one (three paths meet at a stage's output).
#[test]
fn the_tape_gives_the_graphs_gradients() -> Result<()> {
    let cases = [
        (Upsampling::Transpose, Encoder::Plain, Norm::Instance),
        (Upsampling::Nearest, Encoder::Plain, Norm::Group(2)),
        (Upsampling::Transpose, Encoder::Residual, Norm::Instance),
    ];
    for (precision, (up, encoder, norm)) in [Precision::F32, Precision::Bf16]
        .into_iter()
        .flat_map(|p| cases.map(|c| (p, c)))
    {
        let residual = encoder == Encoder::Residual;
        let cfg = UNetConfig {
            in_channels: 2,
            num_classes: 3,
            base_channels: 4,
            max_channels: 8,
            strides: vec![[1, 2, 2], [2, 2, 2]],
            norm,
            upsampling: up,
            deep_supervision: true,
            kernels: vec![[1, 3, 3], [3, 3, 3], [3, 3, 3]],
            features: vec![],
            blocks: if residual { vec![1, 2, 2] } else { vec![] },
            decoder_blocks: vec![],
            encoder,
        };
        let mut net = UNet::new(cfg, 5, &Device::Cpu)?;
        net.set_precision(precision);
        let x = Tensor::randn(0f32, 1.0, (2, 2, 6, 16, 20), &Device::Cpu)?;
        // A loss that reads every output, with weights away from any symmetry.
        let loss = |outs: &[Tensor]| -> Result<Tensor> {
            let mut total = Tensor::zeros((), DType::F32, &Device::Cpu)?;
            for (i, o) in outs.iter().enumerate() {
                let r = (o.ones_like()? * (0.3 + i as f64))?;
                total = (total + (o.sqr()? * r)?.mean_all()?)?;
            }
            Ok(total)
        };
        let outs = net.forward_all(&x)?;
        let graph = loss(&outs)?.backward()?;
        let pass = net.train_pass(&x)?;
        for (a, b) in outs.iter().zip(pass.outputs()) {
            let (a, b) = (a.flatten_all()?, b.flatten_all()?);
            assert_eq!(a.to_vec1::<f32>()?, b.to_vec1::<f32>()?);
        }
        let l = loss(pass.outputs())?;
        let taped = pass.backward(&l)?;
        let what = format!("{precision:?} {up:?} {encoder:?} {norm:?}");
        for (name, p) in net.params() {
            let (g, t) = (graph.get(p.as_tensor()), taped.get(p.as_tensor()));
            let (Some(g), Some(t)) = (g, t) else {
                panic!("{what} {name}: a gradient on one side only");
            };
            assert_eq!(t.dtype(), DType::F32, "{what} {name}");
            let (g, t) = (
                g.flatten_all()?.to_vec1::<f32>()?,
                t.flatten_all()?.to_vec1::<f32>()?,
            );
            if !residual {
                assert_eq!(g, t, "{what} {name}");
                continue;
            }
            let scale = g.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
            let diff = g
                .iter()
                .zip(&t)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let tol = if precision == Precision::Bf16 {
                2e-2
            } else {
                1e-5
            };
            assert!(diff <= tol * scale, "{what} {name}: {diff} of {scale}");
        }
    }
    Ok(())
}
