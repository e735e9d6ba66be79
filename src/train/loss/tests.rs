//! Tests of the loss terms: each against its formula by hand (MONAI's transcribed for clDice)
//! and its gradient against central differences.

use candle_core::{DType, Device, Tensor};

use super::dice_ce::SMOOTH;
use super::*;
use crate::error::Result;
use crate::train::classes::IGNORE;

#[test]
fn skeleton_recall_matches_the_formula_and_its_gradient_finite_differences() -> Result<()> {
    let dev = Device::Cpu;
    let spatial = [1, 2, 3];
    // Two patches, three classes; skeleton voxels of class 1 and 2 in places.
    let sk_labels: Vec<u16> = vec![0, 1, 1, 0, 2, 0, 1, 0, 0, 0, 2, 2];
    let target = one_hot(&sk_labels, 2, 3, spatial, &dev)?;
    let base: Vec<f32> = (0..36)
        .map(|i| ((i * 7) % 11) as f32 * 0.37 - 1.6)
        .collect();
    let loss_at = |v: &[f32]| -> Result<f64> {
        let x = Tensor::from_vec(v.to_vec(), (2, 3, 1, 2, 3), &dev)?;
        Ok(skeleton_recall(&x, &target)?
            .expect("a skeleton")
            .to_scalar::<f32>()? as f64)
    };
    // The formula by hand: softmax per voxel, recall per class over the batch.
    let mut inter = [0f64; 3];
    let mut total = [0f64; 3];
    for b in 0..2 {
        for v in 0..6 {
            let z: Vec<f64> = (0..3).map(|c| base[(b * 3 + c) * 6 + v] as f64).collect();
            let m = z.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = z.iter().map(|a| (a - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let k = sk_labels[b * 6 + v] as usize;
            if k > 0 {
                inter[k] += e[k] / sum;
                total[k] += 1.0;
            }
        }
    }
    let want = 1.0
        - ((inter[1] + SMOOTH) / (total[1] + SMOOTH) + (inter[2] + SMOOTH) / (total[2] + SMOOTH))
            / 2.0;
    let got = loss_at(&base)?;
    assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    // Gradient against central differences.
    let x = candle_core::Var::from_vec(base.clone(), (2, 3, 1, 2, 3), &dev)?;
    let l = skeleton_recall(x.as_tensor(), &target)?.expect("a skeleton");
    let g = l.backward()?;
    let g = g
        .get(x.as_tensor())
        .expect("gradient")
        .flatten_all()?
        .to_vec1::<f32>()?;
    for k in [0, 5, 7, 13, 22, 35] {
        let h = 1e-2f32;
        let (mut up, mut down) = (base.clone(), base.clone());
        up[k] += h;
        down[k] -= h;
        let fd = (loss_at(&up)? - loss_at(&down)?) / (2.0 * h as f64);
        assert!(
            (fd - g[k] as f64).abs() < 2e-3,
            "logit {k}: {fd} vs {}",
            g[k]
        );
    }
    // No skeleton voxel: no term.
    let none = one_hot(&[0; 12], 2, 3, spatial, &dev)?;
    let x = Tensor::from_vec(base, (2, 3, 1, 2, 3), &dev)?;
    assert!(skeleton_recall(&x, &none)?.is_none());
    Ok(())
}

#[test]
fn perfect_prediction_has_tiny_loss_and_wrong_has_large() -> Result<()> {
    let dev = Device::Cpu;
    let labels: Vec<u16> = (0..2 * 8).map(|i| (i % 3 == 0) as u16).collect();
    let t = one_hot(&labels, 2, 2, [1, 2, 4], &dev)?;
    let good = ((&t * 40.0)? - 20.0)?;
    let bad = ((&t * -40.0)? + 20.0)?;
    let g = dice_ce(&good, &t)?;
    let b = dice_ce(&bad, &t)?;
    assert!(
        g.ce < 1e-6 && g.dice_loss < 1e-5,
        "{} {}",
        g.ce,
        g.dice_loss
    );
    assert!(b.ce > 19.0 && b.dice_loss > 0.99);
    Ok(())
}

#[test]
fn uniform_logits_give_log_c_cross_entropy_and_gradients() -> Result<()> {
    let dev = Device::Cpu;
    let labels = vec![0u16, 1, 2, 1, 0, 2, 2, 1];
    let t = one_hot(&labels, 1, 3, [2, 2, 2], &dev)?;
    let x = candle_core::Var::zeros((1, 3, 2, 2, 2), DType::F32, &dev)?;
    let l = dice_ce(x.as_tensor(), &t)?;
    assert!((l.ce - 3f64.ln()).abs() < 1e-6);
    let grads = l.total.backward()?;
    let g = grads.get(x.as_tensor()).expect("gradient");
    // The gradient raises the logit of each voxel's own class.
    let gv = g.flatten_all()?.to_vec1::<f32>()?;
    let tv = t.flatten_all()?.to_vec1::<f32>()?;
    for (gi, ti) in gv.iter().zip(&tv) {
        assert!(if *ti > 0.5 { *gi < 0.0 } else { *gi > 0.0 });
    }
    Ok(())
}

#[test]
fn labels_beyond_the_classes_are_an_error() {
    let e = one_hot(&[0, 3], 1, 2, [1, 1, 2], &Device::Cpu).expect_err("error");
    assert!(e.to_string().contains("label value 3"), "{e}");
}

#[test]
fn ignored_voxels_change_neither_the_loss_nor_get_a_gradient() -> Result<()> {
    let dev = Device::Cpu;
    // Two patches of 2x2x4; every third voxel ignored.
    let labels: Vec<u16> = (0..32)
        .map(|i| if i % 3 == 0 { IGNORE } else { (i % 2) as u16 })
        .collect();
    let t = one_hot(&labels, 2, 2, [2, 2, 4], &dev)?;
    let m = ignore_mask(&labels, 2, [2, 2, 4], &dev)?.expect("a mask");
    let base: Vec<f32> = (0..64).map(|i| ((i * 7) % 5) as f32 * 0.3 - 0.6).collect();
    let loss_of = |v: Vec<f32>| -> Result<(f64, Vec<f32>)> {
        let x = candle_core::Var::from_vec(v, (2, 2, 2, 2, 4), &dev)?;
        let l = dice_ce_masked(x.as_tensor(), &t, Some(&m))?;
        let g = l.total.backward()?;
        let g = g
            .get(x.as_tensor())
            .expect("gradient")
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok((l.ce + l.dice_loss, g))
    };
    let (l0, g0) = loss_of(base.clone())?;
    // Scramble the logits of ignored voxels only: the loss stays where it was.
    let mut moved = base.clone();
    for (k, v) in moved.iter_mut().enumerate() {
        let (b, i) = (k / 32, k % 16);
        if labels[b * 16 + i] == IGNORE {
            *v += 5.0 * (k as f32).sin();
        }
    }
    let (l1, _) = loss_of(moved)?;
    assert!((l0 - l1).abs() < 1e-6, "{l0} vs {l1}");
    for (k, g) in g0.iter().enumerate() {
        let (b, i) = (k / 32, k % 16);
        if labels[b * 16 + i] == IGNORE {
            assert_eq!(*g, 0.0, "gradient at ignored voxel {k}");
        }
    }
    assert!(g0.iter().any(|g| *g != 0.0));
    Ok(())
}

/// A gradient checked against central differences at a few elements.
fn check_gradient(
    f: &dyn Fn(&Tensor) -> Result<Tensor>,
    base: &[f32],
    shape: (usize, usize, usize, usize, usize),
) -> Result<()> {
    let dev = Device::Cpu;
    let var = candle_core::Var::from_vec(base.to_vec(), shape, &dev)?;
    let loss = f(var.as_tensor())?;
    let grads = loss.backward()?;
    let g = grads
        .get(var.as_tensor())
        .expect("a gradient")
        .flatten_all()?
        .to_vec1::<f32>()?;
    let at = |v: &[f32]| -> Result<f64> {
        let x = Tensor::from_vec(v.to_vec(), shape, &dev)?;
        Ok(f(&x)?.to_scalar::<f32>()? as f64)
    };
    let h = 1e-2f32;
    let f0 = at(base)?;
    let mut checked = 0;
    for k in (0..base.len()).step_by(7) {
        let (mut up, mut down) = (base.to_vec(), base.to_vec());
        up[k] += h;
        down[k] -= h;
        let (fu, fdn) = (at(&up)?, at(&down)?);
        // A min/max kink within h (pooling): the one-sided slopes differ; no derivative.
        let (right, left) = ((fu - f0) / h as f64, (f0 - fdn) / h as f64);
        if (right - left).abs() > 1e-3 + 0.05 * right.abs().max(left.abs()) {
            continue;
        }
        checked += 1;
        let fd = (fu - fdn) / (2.0 * h as f64);
        assert!(
            (fd - g[k] as f64).abs() <= 2e-3 + 0.02 * fd.abs(),
            "element {k}: backward {} vs central difference {fd}",
            g[k]
        );
    }
    assert!(
        checked * 2 >= base.len().div_ceil(7),
        "{checked} smooth elements"
    );
    Ok(())
}

/// Softmax over channels of a (N, C, V) f32 buffer, in f64.
fn softmax(v: &[f32], n: usize, c: usize) -> Vec<f64> {
    let vox = v.len() / (n * c);
    let mut out = vec![0f64; v.len()];
    for b in 0..n {
        for i in 0..vox {
            let z: Vec<f64> = (0..c).map(|k| v[(b * c + k) * vox + i] as f64).collect();
            let m = z.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = z.iter().map(|a| (a - m).exp()).collect();
            let s: f64 = e.iter().sum();
            for k in 0..c {
                out[(b * c + k) * vox + i] = e[k] / s;
            }
        }
    }
    out
}

/// MONAI's soft skeleton transcribed on one (D, H, W) volume: pools over the in-bounds
/// neighbours (max_pool3d's -inf padding).
fn soft_skel_ref(x: &[f64], s: [usize; 3], iters: usize) -> Vec<f64> {
    let idx = |z: usize, y: usize, w: usize| (z * s[1] + y) * s[2] + w;
    let pool = |x: &[f64], r: [usize; 3], max: bool| -> Vec<f64> {
        let mut out = vec![0f64; x.len()];
        for z in 0..s[0] {
            for y in 0..s[1] {
                for w in 0..s[2] {
                    let mut best = if max { f64::MIN } else { f64::MAX };
                    for dz in z.saturating_sub(r[0])..=(z + r[0]).min(s[0] - 1) {
                        for dy in y.saturating_sub(r[1])..=(y + r[1]).min(s[1] - 1) {
                            for dw in w.saturating_sub(r[2])..=(w + r[2]).min(s[2] - 1) {
                                let v = x[idx(dz, dy, dw)];
                                best = if max { best.max(v) } else { best.min(v) };
                            }
                        }
                    }
                    out[idx(z, y, w)] = best;
                }
            }
        }
        out
    };
    let erode = |x: &[f64]| -> Vec<f64> {
        let (a, b, c) = (
            pool(x, [1, 0, 0], false),
            pool(x, [0, 1, 0], false),
            pool(x, [0, 0, 1], false),
        );
        (0..x.len()).map(|i| a[i].min(b[i]).min(c[i])).collect()
    };
    let open = |x: &[f64]| pool(&erode(x), [1, 1, 1], true);
    let relu = |v: f64| v.max(0.0);
    let mut img = x.to_vec();
    let o = open(&img);
    let mut skel: Vec<f64> = (0..x.len()).map(|i| relu(img[i] - o[i])).collect();
    for _ in 0..iters {
        img = erode(&img);
        let o = open(&img);
        for i in 0..x.len() {
            let delta = relu(img[i] - o[i]);
            skel[i] += relu(delta - skel[i] * delta);
        }
    }
    skel
}

fn test_logits(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 37 + 11) % 23) as f32 * 0.21 - 2.3)
        .collect()
}

#[test]
fn cldice_matches_monai_transcribed_and_its_gradient() -> Result<()> {
    let dev = Device::Cpu;
    let (n, c, s) = (2, 3, [3, 4, 5]);
    let vox: usize = s.iter().product();
    let labels: Vec<u16> = (0..n * vox).map(|i| ((i * 5) % 7 % 3) as u16).collect();
    let target = one_hot(&labels, n, c, s, &dev)?;
    let base = test_logits(n * c * vox);
    // The target side as MONAI computes it: the soft skeleton of the one-hot target.
    let t = target.flatten_all()?.to_vec1::<f32>()?;
    let t64: Vec<f64> = t.iter().map(|&v| v as f64).collect();
    let mut tskel = vec![0f64; t.len()];
    for bc in 0..n * c {
        let sk = soft_skel_ref(&t64[bc * vox..(bc + 1) * vox], s, CLDICE_ITERATIONS);
        tskel[bc * vox..(bc + 1) * vox].copy_from_slice(&sk);
    }
    let tskel_t = Tensor::from_vec(
        tskel.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        (n, c, s[0], s[1], s[2]),
        &dev,
    )?;
    // Ours builds the same soft skeleton of the target.
    let ours_tskel = soft_skeleton(&target, CLDICE_ITERATIONS)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    for (a, b) in ours_tskel.iter().zip(&tskel) {
        assert!((*a as f64 - b).abs() < 1e-6);
    }
    // The loss by hand.
    let p = softmax(&base, n, c);
    let mut pskel = vec![0f64; p.len()];
    for bc in 0..n * c {
        let sk = soft_skel_ref(&p[bc * vox..(bc + 1) * vox], s, CLDICE_ITERATIONS);
        pskel[bc * vox..(bc + 1) * vox].copy_from_slice(&sk);
    }
    let fg = |i: usize| !(i / vox).is_multiple_of(c);
    let sum = |f: &dyn Fn(usize) -> f64| (0..p.len()).filter(|&i| fg(i)).map(f).sum::<f64>();
    let tprec = (sum(&|i| pskel[i] * t64[i]) + 1.0) / (sum(&|i| pskel[i]) + 1.0);
    let tsens = (sum(&|i| tskel[i] * p[i]) + 1.0) / (sum(&|i| tskel[i]) + 1.0);
    let want = 1.0 - 2.0 * tprec * tsens / (tprec + tsens);
    let x = Tensor::from_vec(base.clone(), (n, c, s[0], s[1], s[2]), &dev)?;
    let got = cldice(&x, &target, &tskel_t)?.to_scalar::<f32>()? as f64;
    assert!((got - want).abs() < 1e-5, "cldice {got} vs {want}");
    check_gradient(
        &|x| cldice(x, &target, &tskel_t),
        &base,
        (n, c, s[0], s[1], s[2]),
    )
}

#[test]
fn boundary_and_surface_match_their_formulas_and_gradients() -> Result<()> {
    let dev = Device::Cpu;
    let (n, c, s) = (2, 3, [2, 3, 4]);
    let vox: usize = s.iter().product();
    let labels: Vec<u16> = (0..n * vox).map(|i| ((i * 3) % 5 % 3) as u16).collect();
    let target = one_hot(&labels, n, c, s, &dev)?;
    let base = test_logits(n * c * vox);
    let shape = (n, c - 1, s[0], s[1], s[2]);
    let dist: Vec<f32> = (0..n * (c - 1) * vox)
        .map(|i| ((i * 13) % 9) as f32 * 0.5 - 2.0)
        .collect();
    let d = Tensor::from_vec(dist.clone(), shape, &dev)?;
    let pred_sq: Vec<f32> = (0..n * (c - 1) * vox)
        .map(|i| ((i * 7) % 5) as f32)
        .collect();
    let ps = Tensor::from_vec(pred_sq.clone(), shape, &dev)?;
    let p = softmax(&base, n, c);
    let t = target.flatten_all()?.to_vec1::<f32>()?;
    let (mut b_sum, mut s_sum) = (0f64, 0f64);
    for b in 0..n {
        for k in 1..c {
            for i in 0..vox {
                let pi = p[(b * c + k) * vox + i];
                let gi = t[(b * c + k) * vox + i] as f64;
                let j = (b * (c - 1) + k - 1) * vox + i;
                b_sum += pi * dist[j] as f64;
                let w = (dist[j] as f64).powi(2) + pred_sq[j] as f64;
                s_sum += (pi - gi).powi(2) * w;
            }
        }
    }
    let count = (n * (c - 1) * vox) as f64;
    let x = Tensor::from_vec(base.clone(), (n, c, s[0], s[1], s[2]), &dev)?;
    let got_b = boundary(&x, &d)?.to_scalar::<f32>()? as f64;
    let got_s = surface(&x, &target, &d, &ps)?.to_scalar::<f32>()? as f64;
    assert!((got_b - b_sum / count).abs() < 1e-5, "{got_b}");
    assert!((got_s - s_sum / count).abs() < 1e-4, "{got_s}");
    let full = (n, c, s[0], s[1], s[2]);
    check_gradient(&|x| boundary(x, &d), &base, full)?;
    check_gradient(&|x| surface(x, &target, &d, &ps), &base, full)
}

/// The fused op against the composed form on larger random data: loss and gradients.
#[test]
fn fused_surface_equals_the_composed_form() -> Result<()> {
    let dev = Device::Cpu;
    let (n, c, s) = (2, 3, [5, 40, 41]);
    let vox: usize = s.iter().product();
    let mut rng = crate::util::rng::Rng::new(21);
    let labels: Vec<u16> = (0..n * vox)
        .map(|_| (rng.uniform() * 3.0) as u16 % 3)
        .collect();
    let target = one_hot(&labels, n, c, s, &dev)?;
    let z: Vec<f32> = (0..n * c * vox)
        .map(|_| 2.0 * rng.normal() as f32)
        .collect();
    let w: Vec<f32> = (0..n * (c - 1) * vox)
        .map(|_| (rng.uniform() * 30.0) as f32)
        .collect();
    let w = Tensor::from_vec(w, (n, c - 1, s[0], s[1], s[2]), &dev)?;
    let x = candle_core::Var::from_vec(z, (n, c, s[0], s[1], s[2]), &dev)?;
    let fused =
        crate::train::surface_fused::surface_fused(x.as_tensor(), &target, &w)?.expect("cpu f32");
    let composed = surface_composed(x.as_tensor(), &target, &w)?;
    let (a, b) = (fused.to_scalar::<f32>()?, composed.to_scalar::<f32>()?);
    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    let ga = fused.backward()?.get(x.as_tensor()).unwrap().clone();
    let gb = composed.backward()?.get(x.as_tensor()).unwrap().clone();
    let scale = gb.abs()?.max_all()?.to_scalar::<f32>()?;
    let diff = (&ga - &gb)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(
        diff <= 1e-4 * scale,
        "gradient differs by {diff} (scale {scale})"
    );
    // A weighted term: the upstream gradient scales the fused op's gradient.
    let weighted = (crate::train::surface_fused::surface_fused(x.as_tensor(), &target, &w)?
        .expect("cpu f32")
        * 0.25)?;
    let gw = weighted.backward()?.get(x.as_tensor()).unwrap().clone();
    let diff = (gw - (&ga * 0.25)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(diff <= 1e-6 * scale, "weighted gradient differs by {diff}");
    Ok(())
}

#[test]
fn predicted_distance_is_the_thresholded_predictions_distance() -> Result<()> {
    let dev = Device::Cpu;
    // One patch, two classes, a 1x1x5 row: class 1 wins at x = 1 and 2.
    let logits = vec![1.0f32, -1.0, -1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0];
    let x = Tensor::from_vec(logits, (1, 2, 1, 1, 5), &dev)?;
    let d = predicted_distance_squared(&x, &[[1.0, 1.0, 2.0]])?;
    // Signed distance (spacing 2 along x): 2, -2, -2, 2, 4; squared.
    assert_eq!(d, vec![4.0, 4.0, 4.0, 4.0, 16.0]);
    Ok(())
}
