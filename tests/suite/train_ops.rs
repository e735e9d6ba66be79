//! 3D ops against naive loop references: forward values, and candle autograd gradients for
//! loss = sum(out * R) (so the upstream gradient is the random R) against hand-derived ones.

use candle_core::{Device, Tensor, Var};
use voxcache::model::ops::Products::Bf16;
use voxcache::model::ops::{
    avg_pool3d, conv3d, conv3d_bias_in, conv3d_generic, conv_transpose3d, conv_transpose3d_bias,
    conv_transpose3d_generic, max_pool3d, max_pool3d_generic, upsample_nearest3d,
};
use voxcache::util::rng::Rng;

type Dims = [usize; 5];

fn random(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.normal() as f32).collect()
}

fn numel(d: Dims) -> usize {
    d.iter().product()
}

fn var(rng: &mut Rng, d: Dims) -> (Var, Vec<f32>) {
    let data = random(rng, numel(d));
    (
        Var::from_vec(data.clone(), d.to_vec(), &Device::Cpu).unwrap(),
        data,
    )
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// |got - want| <= 1e-4 * max(|want|, rms(want)) everywhere: relative, but a value that
/// happens to cancel to ~0 is judged against the typical magnitude.
fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-4 * w.abs().max(rms).max(1e-12);
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// loss = sum(out * R); returns R.
fn backprop(out: &Tensor, rng: &mut Rng) -> (Vec<f32>, candle_core::backprop::GradStore) {
    let r = random(rng, out.elem_count());
    let rt = Tensor::from_vec(r.clone(), out.shape(), &Device::Cpu).unwrap();
    let grads = (out * rt).unwrap().sum_all().unwrap().backward().unwrap();
    (r, grads)
}

fn grad_of(grads: &candle_core::backprop::GradStore, v: &Var) -> Vec<f32> {
    values(grads.get(v.as_tensor()).expect("gradient present"))
}

fn idx(d: Dims, i: [usize; 5]) -> usize {
    (((i[0] * d[1] + i[1]) * d[2] + i[2]) * d[3] + i[3]) * d[4] + i[4]
}

/// Naive convolution: calls `f(x_index, w_index, y_index)` for every product x * w -> y.
fn for_each_conv_term(
    xd: Dims,
    wd: Dims,
    p: [usize; 3],
    s: [usize; 3],
    mut f: impl FnMut(usize, usize, usize),
) -> Dims {
    let o = [0, 1, 2].map(|a| (xd[a + 2] + 2 * p[a] - wd[a + 2]) / s[a] + 1);
    let yd = [xd[0], wd[0], o[0], o[1], o[2]];
    for n in 0..xd[0] {
        for co in 0..wd[0] {
            for od in 0..o[0] {
                for oh in 0..o[1] {
                    for ow in 0..o[2] {
                        let yi = idx(yd, [n, co, od, oh, ow]);
                        for ci in 0..xd[1] {
                            for a in 0..wd[2] {
                                for b in 0..wd[3] {
                                    for c in 0..wd[4] {
                                        let z = [od * s[0] + a, oh * s[1] + b, ow * s[2] + c];
                                        let z = [0, 1, 2].map(|k| z[k] as i64 - p[k] as i64);
                                        if (0..3).any(|k| z[k] < 0 || z[k] >= xd[k + 2] as i64) {
                                            continue;
                                        }
                                        let xi = idx(
                                            xd,
                                            [n, ci, z[0] as usize, z[1] as usize, z[2] as usize],
                                        );
                                        f(xi, idx(wd, [co, ci, a, b, c]), yi);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    yd
}

/// One conv3d configuration checked end to end (forward, dx, dw) on `conv`.
fn check_conv(seed: u64, xd: Dims, wd: Dims, p: [usize; 3], s: [usize; 3]) {
    let mut rng = Rng::new(seed);
    let (xv, x) = var(&mut rng, xd);
    let (wv, w) = var(&mut rng, wd);
    let mut y = vec![];
    let yd = for_each_conv_term(xd, wd, p, s, |_, _, _| {});
    y.resize(numel(yd), 0f64);
    for_each_conv_term(xd, wd, p, s, |xi, wi, yi| {
        y[yi] += x[xi] as f64 * w[wi] as f64
    });

    for (name, f) in [
        (
            "fast",
            conv3d as fn(&Tensor, &Tensor, [usize; 3], [usize; 3]) -> candle_core::Result<Tensor>,
        ),
        ("generic", conv3d_generic),
    ] {
        let what = format!("{name} x{xd:?} w{wd:?} p{p:?} s{s:?}");
        let out = f(xv.as_tensor(), wv.as_tensor(), p, s).unwrap();
        assert_eq!(out.dims(), yd, "{what}");
        assert_close(&values(&out), &y, &format!("{what} forward"));
        let (r, grads) = backprop(&out, &mut rng);
        let (mut dx, mut dw) = (vec![0f64; x.len()], vec![0f64; w.len()]);
        for_each_conv_term(xd, wd, p, s, |xi, wi, yi| {
            dx[xi] += w[wi] as f64 * r[yi] as f64;
            dw[wi] += x[xi] as f64 * r[yi] as f64;
        });
        assert_close(&grad_of(&grads, &xv), &dx, &format!("{what} dx"));
        assert_close(&grad_of(&grads, &wv), &dw, &format!("{what} dw"));
    }
}

#[test]
fn conv3d_kernel3_pad1_stride1() {
    check_conv(1, [1, 3, 5, 6, 7], [4, 3, 3, 3, 3], [1; 3], [1; 3]);
}

#[test]
fn conv3d_kernel3_stride2_odd_sizes_batch2() {
    check_conv(2, [2, 2, 7, 8, 9], [3, 2, 3, 3, 3], [1; 3], [2; 3]);
    check_conv(3, [2, 3, 7, 5, 6], [2, 3, 3, 3, 3], [0; 3], [2; 3]);
    // Stride phases that no tap reaches (kernel 1, stride 2) and uneven phases (stride 3).
    check_conv(12, [1, 2, 5, 6, 7], [3, 2, 1, 1, 1], [0; 3], [2; 3]);
    check_conv(13, [1, 2, 7, 8, 9], [2, 2, 3, 3, 3], [1, 0, 2], [3, 2, 3]);
}

#[test]
fn conv3d_anisotropic_kernel_and_stride() {
    check_conv(4, [2, 3, 4, 9, 10], [5, 3, 1, 3, 3], [0, 1, 1], [1, 2, 2]);
    check_conv(5, [1, 2, 5, 7, 6], [3, 2, 3, 1, 2], [1, 0, 1], [2, 1, 3]);
}

#[test]
fn conv3d_kernel1_channel_mixing() {
    check_conv(6, [2, 5, 3, 4, 5], [2, 5, 1, 1, 1], [0; 3], [1; 3]);
}

#[test]
fn conv3d_kernel_equals_stride() {
    // Its input gradient takes the non-overlapping scatter path; odd sizes leave voxels unread.
    check_conv(7, [2, 3, 4, 6, 8], [4, 3, 2, 2, 2], [0; 3], [2; 3]);
    check_conv(8, [1, 2, 5, 7, 4], [3, 2, 1, 2, 2], [0; 3], [1, 2, 2]);
}

#[test]
fn conv3d_tiny_and_multi_block_volumes() {
    // A single grid row (matrix products use the threads) and a volume split into many blocks.
    check_conv(9, [1, 2, 1, 1, 6], [3, 2, 1, 1, 3], [0, 0, 1], [1; 3]);
    check_conv(10, [1, 4, 12, 40, 40], [6, 4, 3, 3, 3], [1; 3], [1; 3]);
}

#[test]
fn conv3d_fast_equals_generic_on_a_unet_block() {
    let mut rng = Rng::new(11);
    let (xv, _) = var(&mut rng, [2, 8, 8, 16, 16]);
    let (wv, _) = var(&mut rng, [16, 8, 3, 3, 3]);
    let mut results = vec![];
    for f in [conv3d, conv3d_generic] {
        let out = f(xv.as_tensor(), wv.as_tensor(), [1; 3], [1, 2, 2]).unwrap();
        let mut rng = Rng::new(12);
        let (_, grads) = backprop(&out, &mut rng);
        results.push([values(&out), grad_of(&grads, &xv), grad_of(&grads, &wv)]);
    }
    for (k, name) in ["y", "dx", "dw"].iter().enumerate() {
        let want: Vec<f64> = results[1][k].iter().map(|&v| v as f64).collect();
        assert_close(&results[0][k], &want, name);
    }
}

#[test]
fn conv_transpose3d_matches_naive() {
    for (seed, xd, cout, s) in [
        (20, [2, 3, 3, 4, 5], 4, [2, 2, 2]),
        (21, [1, 4, 2, 3, 3], 2, [1, 2, 2]),
        (22, [1, 2, 3, 2, 2], 3, [3, 1, 2]),
    ] {
        let mut rng = Rng::new(seed);
        let (xv, x) = var(&mut rng, xd);
        let wd = [xd[1], cout, s[0], s[1], s[2]];
        let (wv, w) = var(&mut rng, wd);
        let yd = [xd[0], cout, xd[2] * s[0], xd[3] * s[1], xd[4] * s[2]];
        // Every term x[n, ci, d, h, w] * w[ci, co, a, b, c] -> y[n, co, d*sd + a, ...].
        let terms = |f: &mut dyn FnMut(usize, usize, usize)| {
            for n in 0..xd[0] {
                for ci in 0..xd[1] {
                    for d in 0..xd[2] {
                        for h in 0..xd[3] {
                            for ww in 0..xd[4] {
                                for co in 0..cout {
                                    for a in 0..s[0] {
                                        for b in 0..s[1] {
                                            for c in 0..s[2] {
                                                let yi = idx(
                                                    yd,
                                                    [
                                                        n,
                                                        co,
                                                        d * s[0] + a,
                                                        h * s[1] + b,
                                                        ww * s[2] + c,
                                                    ],
                                                );
                                                f(
                                                    idx(xd, [n, ci, d, h, ww]),
                                                    idx(wd, [ci, co, a, b, c]),
                                                    yi,
                                                );
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        };
        let mut y = vec![0f64; numel(yd)];
        terms(&mut |xi, wi, yi| y[yi] += x[xi] as f64 * w[wi] as f64);
        for f in [conv_transpose3d, conv_transpose3d_generic] {
            let out = f(xv.as_tensor(), wv.as_tensor(), s).unwrap();
            assert_eq!(out.dims(), yd);
            assert_close(&values(&out), &y, "conv_transpose3d forward");
            let (r, grads) = backprop(&out, &mut rng);
            let (mut dx, mut dw) = (vec![0f64; x.len()], vec![0f64; w.len()]);
            terms(&mut |xi, wi, yi| {
                dx[xi] += w[wi] as f64 * r[yi] as f64;
                dw[wi] += x[xi] as f64 * r[yi] as f64;
            });
            assert_close(&grad_of(&grads, &xv), &dx, "conv_transpose3d dx");
            assert_close(&grad_of(&grads, &wv), &dw, "conv_transpose3d dw");
        }
    }
}

/// Window of output voxel `o` (flat within its plane) as flat input indices of that plane.
fn window(size: [usize; 3], k: [usize; 3], o: usize) -> Vec<usize> {
    let p = [0, 1, 2].map(|a| size[a] / k[a]);
    let (od, oh, ow) = (o / (p[1] * p[2]), (o / p[2]) % p[1], o % p[2]);
    let mut out = vec![];
    for a in 0..k[0] {
        for b in 0..k[1] {
            for c in 0..k[2] {
                out.push(((od * k[0] + a) * size[1] + oh * k[1] + b) * size[2] + ow * k[2] + c);
            }
        }
    }
    out
}

#[test]
fn max_pool3d_forward_and_gradient_to_argmax_only() {
    let (xd, k) = ([2, 3, 4, 6, 6], [2, 3, 2]);
    let mut rng = Rng::new(30);
    let mut x = random(&mut rng, numel(xd));
    // A plane of ties (post-ReLU zeros): the gradient must go to the first maximum only.
    x[..xd[2] * xd[3] * xd[4]].fill(0.0);
    let xv = Var::from_vec(x.clone(), xd.to_vec(), &Device::Cpu).unwrap();
    let size = [xd[2], xd[3], xd[4]];
    let (vin, vout) = (numel(xd) / 6, numel(xd) / 6 / 12);
    let (mut y, mut arg) = (vec![], vec![]);
    for plane in 0..6 {
        for o in 0..vout {
            let best = window(size, k, o)
                .into_iter()
                .map(|i| plane * vin + i)
                .fold(None, |b: Option<usize>, i| match b {
                    Some(b) if x[b] >= x[i] => Some(b),
                    _ => Some(i),
                })
                .unwrap();
            y.push(x[best] as f64);
            arg.push(best);
        }
    }
    let out = max_pool3d(xv.as_tensor(), k).unwrap();
    assert_eq!(out.dims(), [2, 3, 2, 2, 3]);
    assert_close(&values(&out), &y, "max_pool3d forward");
    let generic = max_pool3d_generic(xv.as_tensor(), k).unwrap();
    assert_close(&values(&generic), &y, "max_pool3d generic forward");
    let (r, grads) = backprop(&out, &mut rng);
    let mut dx = vec![0f64; x.len()];
    for (o, &i) in arg.iter().enumerate() {
        dx[i] += r[o] as f64;
    }
    assert_close(&grad_of(&grads, &xv), &dx, "max_pool3d dx");
    assert!(max_pool3d(xv.as_tensor(), [3, 3, 2]).is_err());
}

#[test]
fn avg_pool3d_and_upsample_match_naive() {
    let (xd, k) = ([2, 2, 4, 6, 3], [2, 3, 1]);
    let mut rng = Rng::new(40);
    let (xv, x) = var(&mut rng, xd);
    let size = [xd[2], xd[3], xd[4]];
    let (vin, vout) = (numel(xd) / 4, numel(xd) / 4 / 6);
    let out = avg_pool3d(xv.as_tensor(), k).unwrap();
    let mut y = vec![];
    for plane in 0..4 {
        for o in 0..vout {
            let w = window(size, k, o);
            y.push(w.iter().map(|&i| x[plane * vin + i] as f64).sum::<f64>() / 6.0);
        }
    }
    assert_close(&values(&out), &y, "avg_pool3d forward");
    let (r, grads) = backprop(&out, &mut rng);
    let mut dx = vec![0f64; x.len()];
    for plane in 0..4 {
        for o in 0..vout {
            for i in window(size, k, o) {
                dx[plane * vin + i] += r[plane * vout + o] as f64 / 6.0;
            }
        }
    }
    assert_close(&grad_of(&grads, &xv), &dx, "avg_pool3d dx");
    assert!(avg_pool3d(xv.as_tensor(), [1, 4, 1]).is_err());

    // Upsampling is the adjoint pattern: each input voxel fills one window of the output.
    let (xd, s) = ([1, 3, 2, 3, 2], [2, 1, 3]);
    let (xv, x) = var(&mut rng, xd);
    let up = [xd[2] * s[0], xd[3] * s[1], xd[4] * s[2]];
    let out = upsample_nearest3d(xv.as_tensor(), s).unwrap();
    assert_eq!(out.dims(), [1, 3, up[0], up[1], up[2]]);
    let (vin, vup) = (numel(xd) / 3, up.iter().product::<usize>());
    let mut y = vec![0f64; 3 * vup];
    for plane in 0..3 {
        for i in 0..vin {
            for o in window(up, s, i) {
                y[plane * vup + o] = x[plane * vin + i] as f64;
            }
        }
    }
    assert_close(&values(&out), &y, "upsample forward");
    let (r, grads) = backprop(&out, &mut rng);
    let mut dx = vec![0f64; x.len()];
    for plane in 0..3 {
        for i in 0..vin {
            dx[plane * vin + i] = window(up, s, i)
                .iter()
                .map(|&o| r[plane * vup + o] as f64)
                .sum();
        }
    }
    assert_close(&grad_of(&grads, &xv), &dx, "upsample dx");
}

#[test]
fn shape_errors_are_errors_not_panics() {
    let x = Tensor::zeros((1, 2, 4, 4, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::zeros((3, 5, 3, 3, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(conv3d(&x, &w, [1; 3], [1; 3]).is_err());
    assert!(conv3d_generic(&x, &w, [1; 3], [1; 3]).is_err());
    let wt = Tensor::zeros((2, 3, 2, 2, 2), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(conv_transpose3d(&x, &wt, [1, 2, 2]).is_err());
    assert!(conv_transpose3d(&x, &wt, [2, 2, 2]).is_ok());
    assert!(upsample_nearest3d(&x, [0, 1, 1]).is_err());
}

/// bf16 tensors on the CPU: the bf16 direct kernels where the CPU has AVX512-BF16 (f32 sums of
/// bf16 products, each result rounded once), the f32 pass on widened values elsewhere; both
/// within bf16's rounding of a naive f64 convolution of the same (bf16) values. With `bias`,
/// the op of a bf16 training pass: an f32 bias added to the f32 sums before the one rounding,
/// and its f32 gradient the sum of the bf16 upstream gradient.
fn check_conv_bf16(seed: u64, xd: Dims, wd: Dims, p: [usize; 3], s: [usize; 3], bias: bool) {
    use candle_core::DType;
    let mut rng = Rng::new(seed);
    let round = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter()
            .map(|x| half::bf16::from_f32(x).to_f32())
            .collect()
    };
    let bf16_var = |data: &[f32], d: Dims| {
        let t = Tensor::from_vec(data.to_vec(), d.to_vec(), &Device::Cpu).unwrap();
        Var::from_tensor(&t.to_dtype(DType::BF16).unwrap()).unwrap()
    };
    let x = round(random(&mut rng, numel(xd)));
    let w = round(random(&mut rng, numel(wd)));
    let (xv, wv) = (bf16_var(&x, xd), bf16_var(&w, wd));
    let b: Vec<f32> = random(&mut rng, wd[0]).iter().map(|v| 3.0 * v).collect();
    let bv = Var::from_vec(b.clone(), wd[0], &Device::Cpu).unwrap();
    let out = match bias {
        true => conv3d_bias_in(xv.as_tensor(), wv.as_tensor(), bv.as_tensor(), p, s, Bf16),
        false => conv3d(xv.as_tensor(), wv.as_tensor(), p, s),
    }
    .unwrap();
    assert_eq!(out.dtype(), DType::BF16);
    let yd: Dims = out.dims().try_into().unwrap();
    let r = round(random(&mut rng, numel(yd)));
    let rt = Tensor::from_vec(r.clone(), yd.to_vec(), &Device::Cpu).unwrap();
    let rt = rt.to_dtype(DType::BF16).unwrap();
    let grads = (&out * rt).unwrap().sum_all().unwrap().backward().unwrap();
    let (mut y, mut dx, mut dw) = (
        vec![0f64; numel(yd)],
        vec![0f64; x.len()],
        vec![0f64; w.len()],
    );
    for_each_conv_term(xd, wd, p, s, |xi, wi, yi| {
        y[yi] += x[xi] as f64 * w[wi] as f64;
        dx[xi] += w[wi] as f64 * r[yi] as f64;
        dw[wi] += x[xi] as f64 * r[yi] as f64;
    });
    let per_channel = numel(yd) / (yd[0] * yd[1]);
    let mut db = vec![0f64; wd[0]];
    for (i, (yv, &rv)) in y.iter_mut().zip(&r).enumerate() {
        let c = (i / per_channel) % yd[1];
        if bias {
            *yv += b[c] as f64;
        }
        db[c] += rv as f64;
    }
    let f32s = |t: &Tensor| values(&t.to_dtype(DType::F32).unwrap());
    // Where a pass is not direct the bias may be added to the rounded sums and rounded again.
    let twice = match bias && !voxcache::model::ops::direct::bf16_dot_products() {
        true => b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)) / 128.0,
        false => 0.0,
    };
    let close = |got: Vec<f32>, want: &[f64], what: &str, extra: f64| {
        let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            // One rounding to bf16 (2^-9 relative) and f32 sums of exact products.
            let tol = 5e-3 * w.abs().max(rms) + extra;
            assert!(
                (g as f64 - w).abs() <= tol,
                "{what}[{i}]: got {g}, want {w}"
            );
        }
    };
    let what = format!("bf16 x{xd:?} w{wd:?} p{p:?} s{s:?}");
    close(f32s(&out), &y, &format!("{what} y"), twice);
    close(
        f32s(grads.get(xv.as_tensor()).unwrap()),
        &dx,
        &format!("{what} dx"),
        0.0,
    );
    close(
        f32s(grads.get(wv.as_tensor()).unwrap()),
        &dw,
        &format!("{what} dw"),
        0.0,
    );
    if bias {
        let got = grads.get(bv.as_tensor()).unwrap();
        assert_eq!(
            got.dtype(),
            DType::F32,
            "{what}: the bias and its gradient stay f32"
        );
        // f32 sums of the exact widened values: far tighter than bf16's rounding.
        assert_close(&values(got), &db, &format!("{what} db"));
    }
}

#[test]
fn conv3d_on_bf16_tensors_matches_naive_within_bf16_rounding() {
    for bias in [false, true] {
        check_conv_bf16(30, [2, 5, 4, 7, 9], [7, 5, 3, 3, 3], [1; 3], [1; 3], bias);
        check_conv_bf16(
            31,
            [1, 4, 3, 6, 40],
            [13, 4, 1, 3, 3],
            [0, 1, 1],
            [1; 3],
            bias,
        );
        check_conv_bf16(32, [1, 3, 3, 4, 5], [2, 3, 1, 1, 1], [0; 3], [1; 3], bias);
        check_conv_bf16(33, [1, 3, 6, 8, 8], [4, 3, 3, 3, 3], [1; 3], [2; 3], bias);
        // Kernel = stride: the gradients of the up path's transposed convolution.
        check_conv_bf16(34, [2, 6, 4, 6, 8], [3, 6, 2, 2, 2], [0; 3], [2; 3], bias);
    }
}

/// The up path's transposed convolution in a bf16 training pass: bf16 input and weight, its
/// f32 sums rounded, then an f32 bias added and rounded again.
#[test]
fn conv_transpose3d_with_bias_on_bf16_tensors_adds_the_bias_to_the_rounded_sums() {
    use candle_core::DType;
    let mut rng = Rng::new(35);
    let (xd, wd) = ([2, 6, 3, 4, 5], [6, 4, 2, 2, 2]);
    let t = |d: Dims, rng: &mut Rng| {
        let v = Tensor::from_vec(random(rng, numel(d)), d.to_vec(), &Device::Cpu).unwrap();
        v.to_dtype(DType::BF16).unwrap()
    };
    let (x, w) = (t(xd, &mut rng), t(wd, &mut rng));
    let b = Tensor::from_vec(random(&mut rng, 4), 4, &Device::Cpu).unwrap();
    let wide = |v: &Tensor| v.to_dtype(DType::F32).unwrap();
    let got = conv_transpose3d_bias(&x, &w, &b, [2; 3], Bf16).unwrap();
    assert_eq!(got.dtype(), DType::BF16);
    let round = |t: Tensor| wide(&t.to_dtype(DType::BF16).unwrap());
    let sums = round(conv_transpose3d(&wide(&x), &wide(&w), [2; 3]).unwrap());
    let want = round(
        sums.broadcast_add(&b.reshape((1, 4, 1, 1, 1)).unwrap())
            .unwrap(),
    );
    assert_eq!(values(&wide(&got)), values(&want));
}
