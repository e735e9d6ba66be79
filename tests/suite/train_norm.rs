//! Fused group/instance norm + LeakyReLU against the built-in candle composition and a plain f64
//! loop reference: forward values and the gradients of loss = sum(out * R) with respect to x,
//! weight and bias. The reference's input gradient is the explicit Jacobian sum
//! dx_i = sum_j dz_j w_j rstd (delta_ij - 1/M - xhat_i xhat_j / M), a different route from the
//! op's closed form.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use voxcache::model::ops::{group_norm_leaky_relu, group_norm_leaky_relu_generic};
use voxcache::util::rng::Rng;

const EPS: f64 = 1e-5;
const DIMS: [usize; 5] = [2, 8, 3, 5, 7];

fn random(rng: &mut Rng, len: usize, scale: f64, offset: f64) -> Vec<f32> {
    (0..len)
        .map(|_| (rng.normal() * scale + offset) as f32)
        .collect()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// |got - want| <= tol * max(|want|, rms(want)) everywhere.
fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = tol * w.abs().max(rms).max(1e-12);
        assert!(
            (g as f64 - w).abs() <= bound,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&a| a as f64).collect()
}

/// Naive f64 forward and gradients for upstream gradient r: (y, dx, dweight, dbias).
struct Reference {
    y: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
}

fn reference(x: &[f32], w: &[f32], b: &[f32], r: &[f32], groups: usize, slope: f64) -> Reference {
    let [n, c, d, h, wd] = DIMS;
    let s = d * h * wd;
    let cg = c / groups;
    let m = cg * s;
    let total = n * c * s;
    let (mut y, mut dx) = (vec![0.0; total], vec![0.0; total]);
    let (mut dw, mut db) = (vec![0.0; c], vec![0.0; c]);
    for i in 0..n {
        for g in 0..groups {
            let base = (i * c + g * cg) * s;
            let slab: Vec<f64> = (base..base + m).map(|k| x[k] as f64).collect();
            let mean = slab.iter().sum::<f64>() / m as f64;
            let var = slab.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / m as f64;
            let rstd = 1.0 / (var + EPS).sqrt();
            let xhat: Vec<f64> = slab.iter().map(|v| (v - mean) * rstd).collect();
            let chan = |j: usize| g * cg + j / s;
            // dz * w for each element of the slab (dL/dxhat).
            let mut dxhat = vec![0.0; m];
            for j in 0..m {
                let ch = chan(j);
                let z = xhat[j] * w[ch] as f64 + b[ch] as f64;
                y[base + j] = if z > 0.0 { z } else { slope * z };
                let dz = r[base + j] as f64 * if z > 0.0 { 1.0 } else { slope };
                db[ch] += dz;
                dw[ch] += dz * xhat[j];
                dxhat[j] = dz * w[ch] as f64;
            }
            for k in 0..m {
                dx[base + k] = (0..m)
                    .map(|j| {
                        let delta = if j == k { 1.0 } else { 0.0 };
                        dxhat[j] * rstd * (delta - 1.0 / m as f64 - xhat[k] * xhat[j] / m as f64)
                    })
                    .sum();
            }
        }
    }
    Reference { y, dx, dw, db }
}

type NormFn = fn(&Tensor, &Tensor, &Tensor, usize, f64, f64) -> candle_core::Result<Tensor>;

/// The variables (x, weight, bias) and the upstream gradient R.
struct Inputs {
    xv: Var,
    wv: Var,
    bv: Var,
    r: Tensor,
}

type Outputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Forward + backward of `f`: (y, dx, dweight, dbias); the op sees x transposed on (H, W)
/// if `transposed` (the variable is stored that way, so the view is not contiguous).
fn run(f: NormFn, inp: &Inputs, groups: usize, slope: f64, transposed: bool) -> Outputs {
    let Inputs { xv, wv, bv, r } = inp;
    let x = if transposed {
        xv.as_tensor().transpose(3, 4).unwrap()
    } else {
        xv.as_tensor().clone()
    };
    let y = f(&x, wv.as_tensor(), bv.as_tensor(), groups, EPS, slope).unwrap();
    assert_eq!(y.dims(), DIMS);
    let grads: GradStore = (&y * r).unwrap().sum_all().unwrap().backward().unwrap();
    let mut dx = grads.get(xv.as_tensor()).expect("dx").clone();
    if transposed {
        dx = dx.transpose(3, 4).unwrap();
    }
    let get = |v: &Var| values(grads.get(v.as_tensor()).expect("gradient present"));
    (values(&y), values(&dx), get(wv), get(bv))
}

fn check(groups: usize, slope: f64, transposed: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let numel: usize = DIMS.iter().product();
    let c = DIMS[1];
    let x = random(&mut rng, numel, 1.5, 0.3);
    let w = random(&mut rng, c, 0.5, 1.0);
    let b = random(&mut rng, c, 0.5, 0.0);
    let rv = random(&mut rng, numel, 1.0, 0.0);
    // Storage dims of the variable: (H, W) swapped when the op sees a transposed view.
    let mut store = DIMS;
    let storage_x = if transposed {
        store.swap(3, 4);
        let t = Tensor::from_vec(x.clone(), DIMS.to_vec(), &Device::Cpu).unwrap();
        values(&t.transpose(3, 4).unwrap().contiguous().unwrap())
    } else {
        x.clone()
    };
    let xv = Var::from_vec(storage_x, store.to_vec(), &Device::Cpu).unwrap();
    let wv = Var::from_vec(w.clone(), c, &Device::Cpu).unwrap();
    let bv = Var::from_vec(b.clone(), c, &Device::Cpu).unwrap();
    let r = Tensor::from_vec(rv.clone(), DIMS.to_vec(), &Device::Cpu).unwrap();
    if transposed {
        assert!(!xv.as_tensor().transpose(3, 4).unwrap().is_contiguous());
    }

    let want = reference(&x, &w, &b, &rv, groups, slope);
    let tag = format!("groups {groups} slope {slope} transposed {transposed}");
    let inp = Inputs { xv, wv, bv, r };
    let fused = run(group_norm_leaky_relu, &inp, groups, slope, transposed);
    let generic = run(
        group_norm_leaky_relu_generic,
        &inp,
        groups,
        slope,
        transposed,
    );
    for (name, got) in [("fused", &fused), ("generic", &generic)] {
        assert_close(&got.0, &want.y, 1e-4, &format!("{name} y ({tag})"));
        assert_close(&got.1, &want.dx, 1e-4, &format!("{name} dx ({tag})"));
        assert_close(&got.2, &want.dw, 1e-4, &format!("{name} dweight ({tag})"));
        assert_close(&got.3, &want.db, 1e-4, &format!("{name} dbias ({tag})"));
    }
    let pairs = [
        (&fused.0, &generic.0, "y"),
        (&fused.1, &generic.1, "dx"),
        (&fused.2, &generic.2, "dweight"),
        (&fused.3, &generic.3, "dbias"),
    ];
    for (f, g, what) in pairs {
        assert_close(
            f,
            &widen(g),
            1e-4,
            &format!("fused vs generic {what} ({tag})"),
        );
    }
}

#[test]
fn instance_norm_matches_generic_and_reference() {
    check(8, 0.01, false, 1);
    check(8, 1.0, false, 2);
    check(8, 0.01, true, 3);
    check(8, 1.0, true, 4);
}

#[test]
fn group_norm_matches_generic_and_reference() {
    check(2, 0.01, false, 5);
    check(2, 1.0, false, 6);
    check(2, 0.01, true, 7);
    check(2, 1.0, true, 8);
}

/// A large common offset must not cancel the variance (the op sums shifted values in f64).
#[test]
fn large_offset_keeps_precision() {
    let mut rng = Rng::new(9);
    let numel: usize = DIMS.iter().product();
    let x = random(&mut rng, numel, 1.0, 300.0);
    let w = random(&mut rng, 8, 0.5, 1.0);
    let b = random(&mut rng, 8, 0.5, 0.0);
    let xt = Tensor::from_vec(x.clone(), DIMS.to_vec(), &Device::Cpu).unwrap();
    let wt = Tensor::from_vec(w.clone(), 8, &Device::Cpu).unwrap();
    let bt = Tensor::from_vec(b.clone(), 8, &Device::Cpu).unwrap();
    let y = group_norm_leaky_relu(&xt, &wt, &bt, 2, EPS, 0.01).unwrap();
    let want = reference(&x, &w, &b, &vec![0.0; numel], 2, 0.01);
    assert_close(&values(&y), &want.y, 1e-4, "offset y");
}

/// Same bits with one worker thread and with several (each slab reduced by one thread).
#[test]
fn deterministic_across_thread_counts() {
    let mut rng = Rng::new(10);
    let numel: usize = DIMS.iter().product();
    let dev = &Device::Cpu;
    let inp = Inputs {
        xv: Var::from_vec(random(&mut rng, numel, 1.0, 0.0), DIMS.to_vec(), dev).unwrap(),
        wv: Var::from_vec(random(&mut rng, 8, 0.5, 1.0), 8, dev).unwrap(),
        bv: Var::from_vec(random(&mut rng, 8, 0.5, 0.0), 8, dev).unwrap(),
        r: Tensor::from_vec(random(&mut rng, numel, 1.0, 0.0), DIMS.to_vec(), dev).unwrap(),
    };
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| run(group_norm_leaky_relu, &inp, 2, 0.01, false))
    };
    assert_eq!(on(1), on(3));
}

#[test]
fn rejects_bad_shapes() {
    let x = Tensor::zeros(DIMS.to_vec(), candle_core::DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::ones(8, candle_core::DType::F32, &Device::Cpu).unwrap();
    let w7 = Tensor::ones(7, candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(group_norm_leaky_relu(&x, &w, &w, 3, EPS, 0.01).is_err());
    assert!(group_norm_leaky_relu(&x, &w, &w, 0, EPS, 0.01).is_err());
    assert!(group_norm_leaky_relu(&x, &w7, &w, 8, EPS, 0.01).is_err());
    let x4 = x.flatten_from(3).unwrap();
    assert!(group_norm_leaky_relu(&x4, &w, &w, 8, EPS, 0.01).is_err());
}

/// A bf16 training pass: bf16 x (and its bf16 gradient) with f32 weight and bias. The op
/// widens each slab, computes what the f32 op computes, and rounds once: its output and input
/// gradient are the f32 op's on the widened values, rounded, bit for bit; the parameter
/// gradients are the f32 op's exactly, and stay f32.
#[test]
fn bf16_activations_are_the_f32_op_rounded_once() {
    use candle_core::DType;
    let mut rng = Rng::new(12);
    let numel: usize = DIMS.iter().product();
    let dev = &Device::Cpu;
    let bf16 = |v: Vec<f32>| {
        Tensor::from_vec(v, DIMS.to_vec(), dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap()
    };
    let xb = bf16(random(&mut rng, numel, 1.5, 0.3));
    let rb = bf16(random(&mut rng, numel, 1.0, 0.0));
    let wide = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    for (groups, slope) in [(8, 0.01), (2, 0.01), (8, 1.0)] {
        let w = random(&mut rng, 8, 0.5, 1.0);
        let b = random(&mut rng, 8, 0.5, 0.0);
        let pass = |x: Var| {
            let (wv, bv) = (
                Var::from_vec(w.clone(), 8, dev).unwrap(),
                Var::from_vec(b.clone(), 8, dev).unwrap(),
            );
            let y = group_norm_leaky_relu(
                x.as_tensor(),
                wv.as_tensor(),
                bv.as_tensor(),
                groups,
                EPS,
                slope,
            )
            .unwrap();
            let r = rb.to_dtype(x.dtype()).unwrap();
            let grads = (&y * r).unwrap().sum_all().unwrap().backward().unwrap();
            let get = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
            (y, get(&x), get(&wv), get(&bv))
        };
        let (y, dx, dw, db) = pass(Var::from_tensor(&xb).unwrap());
        let (y32, dx32, dw32, db32) = pass(Var::from_tensor(&wide(&xb)).unwrap());
        let tag = format!("groups {groups} slope {slope}");
        assert_eq!((y.dtype(), dx.dtype()), (DType::BF16, DType::BF16), "{tag}");
        assert_eq!((dw.dtype(), db.dtype()), (DType::F32, DType::F32), "{tag}");
        let rounded = |t: &Tensor| values(&wide(&t.to_dtype(DType::BF16).unwrap()));
        assert_eq!(values(&wide(&y)), rounded(&y32), "y ({tag})");
        assert_eq!(values(&wide(&dx)), rounded(&dx32), "dx ({tag})");
        assert_eq!(values(&dw), values(&dw32), "dweight ({tag})");
        assert_eq!(values(&db), values(&db32), "dbias ({tag})");
    }
}

/// A training block's convolution and norm as one op (its convolution's output kept inside,
/// out of the graph) give the two ops' values and gradients bit for bit, in f32 and with a bf16
/// pass's bf16 activations.
#[test]
fn conv_and_norm_in_one_op_equal_the_two_ops() {
    use candle_core::DType;
    use voxcache::model::ops::{conv3d_bias_in, conv_norm_leaky_relu, NormAct, Products};
    let mut rng = Rng::new(13);
    let dev = &Device::Cpu;
    let (xd, wd) = ([2usize, 3, 5, 6, 7], [8usize, 3, 3, 3, 3]);
    let x32 = Tensor::from_vec(random(&mut rng, xd.iter().product(), 1.0, 0.2), &xd, dev).unwrap();
    let w32 = Tensor::from_vec(random(&mut rng, wd.iter().product(), 0.3, 0.0), &wd, dev).unwrap();
    let small: Vec<Vec<f32>> = (0..3)
        .map(|k| random(&mut rng, 8, 0.5, (k == 1) as u8 as f64))
        .collect();
    for (dt, products, groups, stride) in [
        (DType::F32, Products::F32, 8, [1, 1, 1]),
        (DType::F32, Products::F32, 2, [1, 2, 2]),
        (DType::BF16, Products::Bf16, 8, [1, 1, 1]),
        (DType::BF16, Products::Bf16, 4, [2, 2, 2]),
    ] {
        let run = |fused: bool| {
            let x = Var::from_tensor(&x32.to_dtype(dt).unwrap()).unwrap();
            let w = Var::from_tensor(&w32.to_dtype(dt).unwrap()).unwrap();
            let p: Vec<Var> = small
                .iter()
                .map(|v| Var::from_vec(v.clone(), 8, dev).unwrap())
                .collect();
            let (pad, t) = ([1; 3], p.iter().map(|v| v.as_tensor()).collect::<Vec<_>>());
            let z = match fused {
                true => {
                    let norm = NormAct {
                        weight: t[1],
                        bias: t[2],
                        groups,
                        eps: EPS,
                        slope: 0.01,
                    };
                    conv_norm_leaky_relu(
                        x.as_tensor(),
                        w.as_tensor(),
                        t[0],
                        pad,
                        stride,
                        products,
                        norm,
                    )
                }
                false => {
                    let y =
                        conv3d_bias_in(x.as_tensor(), w.as_tensor(), t[0], pad, stride, products)
                            .unwrap();
                    group_norm_leaky_relu(&y, t[1], t[2], groups, EPS, 0.01)
                }
            }
            .unwrap();
            let r = Tensor::from_vec(
                random(&mut Rng::new(14), z.elem_count(), 1.0, 0.0),
                z.shape(),
                dev,
            )
            .unwrap()
            .to_dtype(dt)
            .unwrap();
            let grads = (&z * r).unwrap().sum_all().unwrap().backward().unwrap();
            let f = |t: &Tensor| values(&t.to_dtype(DType::F32).unwrap());
            let mut out = vec![
                f(&z),
                f(grads.get(x.as_tensor()).unwrap()),
                f(grads.get(w.as_tensor()).unwrap()),
            ];
            out.extend(p.iter().map(|v| f(grads.get(v.as_tensor()).unwrap())));
            out
        };
        let (one, two) = (run(true), run(false));
        for (k, (a, b)) in one.iter().zip(&two).enumerate() {
            assert_eq!(
                a, b,
                "{dt:?} groups {groups} stride {stride:?}: output/gradient {k}"
            );
        }
    }
}
