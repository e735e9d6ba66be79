//! The direct passes against a naive f64 convolution, on every instruction set this CPU runs,
//! and bit for bit across thread counts.

use super::kernels::Kernel;
use super::weights::grad_weight_with;
use super::{forward_with, grad_input_with, grad_weight, Pass};
use crate::model::ops::columns::Planes;
use crate::model::ops::geometry::ConvGeom;
use crate::util::rng::Rng;

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// A pool of `threads` workers, for results that must not depend on how many there are.
fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// Calls `f(x index, w index, y index)` for every product of the convolution.
fn each_term(g: &ConvGeom, mut f: impl FnMut(usize, usize, usize)) {
    let [d, h, w] = g.input;
    let [od, oh, ow] = g.output;
    let [kd, kh, kw] = g.kernel;
    let [sd, sh, sw] = g.stride;
    let p = g.padding.map(|v| v as isize);
    for n in 0..g.batch {
        for co in 0..g.cout {
            for z in 0..od {
                for y in 0..oh {
                    for x in 0..ow {
                        let yi = (((n * g.cout + co) * od + z) * oh + y) * ow + x;
                        for ci in 0..g.cin {
                            for (a, b, c) in
                                (0..kd * kh * kw).map(|t| (t / (kh * kw), t / kw % kh, t % kw))
                            {
                                let s = [z * sd + a, y * sh + b, x * sw + c].map(|v| v as isize);
                                let s = [s[0] - p[0], s[1] - p[1], s[2] - p[2]];
                                if (0..3).any(|k| s[k] < 0 || s[k] >= [d, h, w][k] as isize) {
                                    continue;
                                }
                                let [sz, sy, sx] = s.map(|v| v as usize);
                                let xi = (((n * g.cin + ci) * d + sz) * h + sy) * w + sx;
                                let wi = ((co * g.cin + ci) * kd + a) * kh * kw + b * kw + c;
                                f(xi, wi, yi);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The output, input gradient and weight gradient of the convolution, summed in f64.
fn naive(g: &ConvGeom, x: &[f32], w: &[f32], dy: &[f32]) -> [Vec<f64>; 3] {
    let (mut y, mut dx, mut dw) = (
        vec![0f64; dy.len()],
        vec![0f64; x.len()],
        vec![0f64; w.len()],
    );
    each_term(g, |xi, wi, yi| {
        y[yi] += x[xi] as f64 * w[wi] as f64;
        dx[xi] += w[wi] as f64 * dy[yi] as f64;
        dw[wi] += x[xi] as f64 * dy[yi] as f64;
    });
    [y, dx, dw]
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_within(got, want, 1e-4, what)
}

/// Each value within `rel` of its reference (or of their root mean square, if larger).
fn assert_within(got: &[f32], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(rms).max(1e-12);
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn kernels() -> Vec<Kernel> {
    let mut all = vec![Kernel::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            all.push(Kernel::Avx2);
        }
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            all.push(Kernel::Avx512);
        }
    }
    all
}

/// Forward, input gradient and (where it applies) weight gradient of one shape.
fn check(seed: u64, x: [usize; 5], w: [usize; 5], padding: [usize; 3]) {
    check_strided(seed, x, w, padding, [1; 3])
}

/// As [`check`] at a stride: at a stride the input gradient one pass per stride phase.
fn check_strided(seed: u64, x: [usize; 5], w: [usize; 5], padding: [usize; 3], stride: [usize; 3]) {
    let g = ConvGeom::new(&x, &w, padding, stride).unwrap();
    assert!(super::reads_directly(&g), "{g:?}");
    let mut rng = Rng::new(seed);
    let xs = random(&mut rng, x.iter().product());
    let ws = random(&mut rng, w.iter().product());
    let dy = random(&mut rng, g.batch * g.cout * g.output_voxels());
    let [y, dx, dw] = naive(&g, &xs, &ws, &dy);
    let vi = g.input_voxels();
    for k in kernels() {
        let what = format!("{k:?} x{x:?} w{w:?} p{padding:?} s{stride:?}");
        let sample = |n: usize| Planes::one(&xs[n * g.cin * vi..][..g.cin * vi], vi);
        assert_close(&forward_with(k, &g, sample, &ws), &y, &format!("{what} y"));
        if super::applies(&g) {
            let got = grad_input_with(k, &g, &dy, &ws);
            assert_close(&got, &dx, &format!("{what} dx"));
        }
    }
    if !super::applies(&g) {
        match super::grad_input_strided(&g, &dy, &ws) {
            Some(got) => assert_close(&got, &dx, &format!("x{x:?} w{w:?} s{stride:?} dx")),
            // Padding 1 at stride 3: the last phase's first tap reads before the padding.
            None => assert!(stride.contains(&3), "{g:?}"),
        }
    }
    for k in kernels() {
        let got = grad_weight_with(k, &g, &xs, &dy);
        let direct = !matches!(k, Kernel::Portable) && (1..=3).contains(&g.kernel[2]);
        assert_eq!(got.is_some(), direct, "{k:?} {g:?}");
        if let Some(got) = got {
            let what = format!("{k:?} x{x:?} w{w:?} p{padding:?} s{stride:?} dw");
            assert_close(&got, &dw, &what);
        }
    }
}

#[test]
fn same_padding_odd_sizes_and_channel_counts_off_the_block() {
    check(1, [1, 3, 5, 6, 7], [4, 3, 3, 3, 3], [1; 3]);
    check(2, [2, 5, 4, 9, 17], [13, 5, 3, 3, 3], [1; 3]);
    check(3, [1, 7, 3, 5, 70], [7, 7, 3, 3, 3], [1; 3]);
    // Planes of 52 x 50 padded positions (over 8 KiB of f32 rows): the weight gradient sweeps
    // one plane at a time from the ring (the shapes above are stacked several planes a sweep).
    check(34, [2, 3, 3, 50, 48], [5, 3, 3, 3, 3], [1; 3]);
}

#[test]
fn valid_padding_anisotropic_and_pointwise_kernels() {
    check(4, [1, 2, 5, 6, 7], [3, 2, 3, 3, 3], [0; 3]);
    check(5, [2, 3, 4, 8, 9], [5, 3, 1, 3, 3], [0, 1, 1]);
    check(6, [1, 6, 3, 4, 5], [2, 6, 1, 1, 1], [0; 3]);
    check(7, [1, 2, 5, 5, 6], [3, 2, 3, 1, 3], [1, 0, 2]);
    check(8, [1, 2, 4, 5, 6], [3, 2, 2, 2, 2], [1; 3]);
}

#[test]
fn strided_forward_passes() {
    // nnU-Net's down-sampling convolutions: 3x3x3 (or 1x3x3) at stride 2 (or 1x2x2), odd
    // and even sizes, so the last phase row or column is short.
    check_strided(13, [1, 3, 5, 7, 9], [7, 3, 3, 3, 3], [1; 3], [2; 3]);
    check_strided(14, [2, 4, 4, 8, 10], [5, 4, 1, 3, 3], [0, 1, 1], [1, 2, 2]);
    check_strided(15, [1, 2, 6, 6, 11], [4, 2, 3, 3, 3], [1; 3], [2, 2, 3]);
    // No padding, and taps two wide that meet the stride in plane only.
    check_strided(16, [2, 5, 5, 7, 9], [3, 5, 3, 3, 3], [0; 3], [2; 3]);
    check_strided(17, [1, 3, 3, 4, 6], [6, 3, 3, 2, 2], [1, 0, 0], [1, 2, 2]);
    // A pointwise projection at stride 2 (the residual encoder's), and a 1-voxel plane.
    check_strided(18, [1, 8, 5, 5, 7], [9, 8, 1, 1, 1], [0; 3], [2; 3]);
    check_strided(19, [1, 3, 3, 1, 1], [2, 3, 3, 3, 3], [1; 3], [2; 3]);
    // Phase planes of 2 x 2 x 24 x 24 positions: the weight gradient's ring.
    check_strided(35, [1, 2, 5, 46, 46], [3, 2, 3, 3, 3], [1; 3], [2; 3]);
    // Nine channels in L1 chunks of three: four phase windows of 300 positions a slot.
    let p = Pass::new(1, [9, 4], [3, 6, 40], [3; 3], [1; 3], [2; 3]);
    assert_eq!((p.tile_window(), p.chunk(9)), (300, 3));
    check_strided(36, [1, 9, 3, 6, 40], [4, 9, 3, 3, 3], [1; 3], [2; 3]);
}

#[test]
fn one_voxel_axes_and_many_weight_chunks() {
    check(9, [2, 3, 1, 1, 1], [2, 3, 3, 3, 3], [1; 3]);
    check(10, [1, 2, 1, 1, 9], [4, 2, 1, 1, 3], [0, 0, 1]);
    // 70 channels x 27 taps x 6 outputs is several L1 chunks of packed weights.
    check(11, [1, 70, 2, 3, 4], [8, 70, 3, 3, 3], [1; 3]);
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let g = ConvGeom::new(&[2, 9, 6, 10, 12], &[11, 9, 3, 3, 3], [1; 3], [1; 3]).unwrap();
    let mut rng = Rng::new(12);
    let xs = random(&mut rng, g.batch * g.cin * g.input_voxels());
    let ws = random(&mut rng, g.cout * g.cin * g.taps());
    let dy = random(&mut rng, g.batch * g.cout * g.output_voxels());
    let vi = g.input_voxels();
    let run = |threads: usize| {
        pool(threads).install(|| {
            let sample = |n: usize| Planes::one(&xs[n * g.cin * vi..][..g.cin * vi], vi);
            (
                super::forward(&g, sample, &ws),
                super::grad_input(&g, &dy, &ws),
                grad_weight(&g, &xs, &dy),
            )
        })
    };
    let one = run(1);
    for threads in [2, 3, 5] {
        assert!(run(threads) == one, "{threads} threads differ from one");
    }
}

/// f32 tensors with bf16 products: against the naive convolution of the bf16-rounded values
/// (the products are exact in f32 and nothing is rounded after the sums) where the CPU has
/// AVX512-BF16; None elsewhere, so the callers take the f32 passes.
#[test]
fn bf16_products_on_f32_data_equal_f32_sums_of_rounded_values() {
    for (seed, x, w, padding) in [
        (20, [2, 5, 4, 7, 40], [7, 5, 3, 3, 3], [1; 3]),
        (21, [1, 4, 3, 6, 9], [13, 4, 1, 3, 3], [0, 1, 1]),
        // Planes of 4,488 bf16 positions: the weight gradient's ring (smaller ones stacked).
        (36, [1, 2, 2, 64, 66], [4, 2, 3, 3, 3], [1; 3]),
        (22, [1, 3, 2, 3, 17], [2, 3, 1, 1, 1], [0; 3]),
    ] {
        check_bf16_products(seed, x, w, padding, [1; 3], true);
        check_bf16_tensors(seed, x, w, padding, [1; 3]);
    }
}

/// The strided passes with bf16 products as [`bf16_products_on_f32_data_equal_f32_sums_of_rounded_values`]
/// (the input gradient one pass per stride phase), and the same bits at any thread count.
#[test]
fn strided_bf16_passes_equal_f32_sums_of_rounded_values() {
    // nnU-Net's down-sampling convolutions (odd and even sizes, in-plane strides only),
    // valid padding, the residual encoder's pointwise projection, 1-voxel planes, taps two wide.
    for (seed, x, w, padding, stride) in [
        (23, [1, 3, 5, 7, 9], [7, 3, 3, 3, 3], [1; 3], [2; 3]),
        (24, [2, 4, 4, 8, 10], [5, 4, 1, 3, 3], [0, 1, 1], [1, 2, 2]),
        (26, [2, 5, 5, 7, 9], [3, 5, 3, 3, 3], [0; 3], [2; 3]),
        (27, [1, 8, 5, 5, 7], [9, 8, 1, 1, 1], [0; 3], [2; 3]),
        (28, [1, 3, 3, 1, 1], [2, 3, 3, 3, 3], [1; 3], [2; 3]),
        (29, [1, 4, 8, 8, 16], [6, 4, 3, 3, 3], [1; 3], [2; 3]),
        (30, [1, 3, 4, 6, 7], [5, 3, 3, 2, 2], [1, 0, 0], [1, 2, 2]),
        (37, [1, 2, 3, 64, 64], [3, 2, 3, 3, 3], [1; 3], [2; 3]),
        // Kernel = stride: the gradients of the up path's transposed convolution.
        (32, [2, 7, 4, 6, 10], [5, 7, 2, 2, 2], [0; 3], [2; 3]),
        (33, [1, 4, 3, 6, 8], [6, 4, 1, 2, 2], [0; 3], [1, 2, 2]),
    ] {
        check_bf16_products(seed, x, w, padding, stride, true);
        check_bf16_tensors(seed, x, w, padding, stride);
    }
    // A phase whose first tap reads past the padding (stride 3, padding 1; or padding 2 at
    // stride 2) has no stride-1 pass: the input gradient is None, the caller takes the columns.
    check_bf16_products(
        25,
        [1, 2, 6, 6, 11],
        [4, 2, 3, 3, 3],
        [1; 3],
        [2, 2, 3],
        false,
    );
    check_bf16_products(31, [1, 2, 5, 6, 7], [3, 2, 3, 3, 3], [2; 3], [2; 3], false);
    check_bf16_tensors(31, [1, 2, 5, 6, 7], [3, 2, 3, 3, 3], [2; 3], [2; 3]);
}

/// bf16 tensors at channel counts the tile kernels split (AMX-BF16 CPUs; every engine this CPU
/// runs takes them): more than 16 pairs of source channels in multiplies of 9 and 8 (the last
/// pair half empty), destination blocks of 17 to 32 channels (two tiles of rows) and of 16 or
/// fewer, several blocks, and a plane wider than 256 x 256 (blocks of six channels there).
#[test]
fn bf16_passes_at_channel_counts_the_tiles_split() {
    for (seed, x, w, padding, stride) in [
        (60, [1, 33, 3, 5, 7], [40, 33, 3, 3, 3], [1; 3], [1; 3]),
        (61, [2, 34, 2, 4, 6], [17, 34, 3, 3, 3], [1; 3], [1; 3]),
        (62, [1, 20, 4, 9, 9], [70, 20, 1, 3, 3], [0, 1, 1], [1; 3]),
        (63, [1, 36, 5, 8, 10], [24, 36, 3, 3, 3], [1; 3], [2; 3]),
        (64, [1, 3, 1, 260, 258], [5, 3, 1, 3, 3], [0, 1, 1], [1; 3]),
    ] {
        check_bf16_tensors(seed, x, w, padding, stride);
    }
}

/// bf16 tensors by each engine this CPU runs (the dot products where it has AVX512-BF16, the
/// f32 kernels on widened values everywhere): the float64 sums of the same bf16 values, the
/// bias added before the one rounding of `y` and `dx` (f32 sums for `dw`), and the same bits at
/// 1, 2 and 3 threads.
fn check_bf16_tensors(
    seed: u64,
    x: [usize; 5],
    w: [usize; 5],
    padding: [usize; 3],
    stride: [usize; 3],
) {
    use super::products::{
        dot_available, forward_bf16_by, grad_input_bf16_by, grad_weight_bf16_by, tiles_available,
        How,
    };
    use half::bf16;
    let g = ConvGeom::new(&x, &w, padding, stride).unwrap();
    let mut rng = Rng::new(seed + 1000);
    let to_bf16 = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let wide = |v: &[bf16]| v.iter().map(|b| b.to_f32()).collect::<Vec<f32>>();
    let xs = to_bf16(random(&mut rng, x.iter().product()));
    let ws = to_bf16(random(&mut rng, w.iter().product()));
    let vo = g.output_voxels();
    let dy = to_bf16(random(&mut rng, g.batch * g.cout * vo));
    let bias = random(&mut rng, g.cout);
    let [mut y, dx, dw] = naive(&g, &wide(&xs), &wide(&ws), &wide(&dy));
    for (k, v) in y.iter_mut().enumerate() {
        *v += bias[(k / vo) % g.cout] as f64;
    }
    let mut engines = vec![How::Widened];
    if dot_available() {
        engines.push(How::Dot);
    }
    if dot_available() && tiles_available() {
        engines.push(How::Tiles);
    }
    for how in engines {
        let run = |threads: usize| {
            pool(threads).install(|| {
                (
                    forward_bf16_by(how, &g, &xs, &ws, Some(&bias)),
                    grad_input_bf16_by(how, &g, &dy, &ws),
                    grad_weight_bf16_by(how, &g, &xs, &dy),
                )
            })
        };
        let got = run(2);
        let what = format!("{how:?} x{x:?} w{w:?} p{padding:?} s{stride:?}");
        assert!(
            run(1) == got && run(3) == got,
            "{what}: thread counts differ"
        );
        // Widened, the passes the f32 direct kernels read (the rest take the columns).
        if how == How::Widened && super::reads_directly(&g) {
            let swept = (1..=3).contains(&w[4]);
            assert!(got.0.is_some() && got.2.is_some() == swept, "{what}");
        }
        // One rounding to bf16: 2^-9 relative.
        if let Some(y_got) = got.0 {
            assert_within(&wide(&y_got), &y, 4e-3, &format!("{what} y"));
        }
        if let Some(dx_got) = got.1 {
            assert_within(&wide(&dx_got), &dx, 4e-3, &format!("{what} dx"));
        }
        if let Some(dw_got) = got.2 {
            assert_close(&dw_got, &dw, &format!("{what} dw"));
        }
    }
}

fn check_bf16_products(
    seed: u64,
    x: [usize; 5],
    w: [usize; 5],
    padding: [usize; 3],
    stride: [usize; 3],
    phases: bool,
) {
    use super::{forward_bf16_products, grad_input_bf16_products, grad_weight_bf16_products};
    {
        let g = ConvGeom::new(&x, &w, padding, stride).unwrap();
        let mut rng = Rng::new(seed);
        let round = |v: Vec<f32>| -> Vec<f32> {
            v.into_iter()
                .map(|f| half::bf16::from_f32(f).to_f32())
                .collect()
        };
        let xs = random(&mut rng, x.iter().product());
        let ws = random(&mut rng, w.iter().product());
        let dy = random(&mut rng, g.batch * g.cout * g.output_voxels());
        let (xr, wr, dyr) = (round(xs.clone()), round(ws.clone()), round(dy.clone()));
        let [y, dx, dw] = naive(&g, &xr, &wr, &dyr);
        let vi = g.input_voxels();
        let run = |threads: usize| {
            pool(threads).install(|| {
                let sample = |n: usize| Planes::one(&xs[n * g.cin * vi..][..g.cin * vi], vi);
                (
                    forward_bf16_products(&g, sample, &ws),
                    grad_input_bf16_products(&g, &dy, &ws),
                    grad_weight_bf16_products(&g, &xs, &dy),
                )
            })
        };
        let got = run(2);
        if !super::bf16_dot_products() {
            assert!(got.0.is_none() && got.1.is_none() && got.2.is_none());
            return;
        }
        assert!(run(1) == got && run(3) == got, "thread counts differ");
        let what = format!("x{x:?} w{w:?} p{padding:?} s{stride:?}");
        assert_close(&got.0.unwrap(), &y, &format!("{what} y"));
        assert_eq!(got.1.is_some(), phases, "{what}");
        if let Some(dx_got) = got.1 {
            assert_close(&dx_got, &dx, &format!("{what} dx"));
        }
        // The bf16 weight gradient sweeps kernels 1 to 3 wide.
        assert_eq!(got.2.is_some(), (1..=3).contains(&w[4]), "{what}");
        if let Some(dw_got) = got.2 {
            assert_close(&dw_got, &dw, &format!("{what} dw"));
        }
    }
}

/// The up path's transposed convolution against its definition, and the decoder's fused
/// first convolution bit for bit against the upsampled tensor built, biased, concatenated and
/// convolved.
#[test]
fn upsampling_planes_equal_the_transposed_convolution_and_its_concatenation() {
    use super::kernels::PORTABLE_FUSED;
    use super::up::transpose_with;
    use super::{forward_up_pair, forward_with, transpose, Upsampling};
    for (seed, low, up_ch, stride, skip_ch) in [
        (30, [2, 5, 3, 4, 5], 3, [2, 2, 2], 3),
        (31, [1, 7, 2, 9, 13], 4, [1, 2, 2], 4),
        (32, [1, 3, 2, 3, 70], 2, [2, 1, 3], 5),
        (33, [1, 6, 2, 12, 12], 5, [1, 2, 2], 2),
    ] {
        let [n, cl, ld, lh, lw] = low;
        let mut rng = Rng::new(seed);
        let xs = random(&mut rng, low.iter().product());
        let taps: usize = stride.iter().product();
        let wu = random(&mut rng, cl * up_ch * taps);
        let bias = random(&mut rng, up_ch);
        let u = Upsampling {
            low: &xs,
            low_ch: cl,
            low_size: [ld, lh, lw],
            weight: &wu,
            up_ch,
            stride,
            bias: None,
        };
        let size = u.up_size();
        let vu: usize = size.iter().product();
        let got = transpose(&u, n, size);
        // The kernels that fuse their multiply-adds give the same bits, with a bias and
        // without; the portable one, rounding twice where the target has no FMA, is close.
        let biased = Upsampling {
            bias: Some(&bias),
            ..u
        };
        for u in [u, biased] {
            let fused = transpose_with(Kernel::detect(), &u, n, size);
            let wide: Vec<f64> = fused.iter().map(|&v| v as f64).collect();
            for k in kernels() {
                let v = transpose_with(k, &u, n, size);
                let what = format!("seed {seed} {k:?} bias {}", u.bias.is_some());
                match PORTABLE_FUSED || !matches!(k, Kernel::Portable) {
                    true => assert!(v == fused, "{what}"),
                    false => assert_close(&v, &wide, &what),
                }
            }
        }
        for (i, &g) in got.iter().enumerate() {
            let (nn, o, v) = (i / (up_ch * vu), (i / vu) % up_ch, i % vu);
            let p = [v / (size[1] * size[2]), v / size[2] % size[1], v % size[2]];
            let [q, r] = [
                [0, 1, 2].map(|a| p[a] / stride[a]),
                [0, 1, 2].map(|a| p[a] % stride[a]),
            ];
            let t = (r[0] * stride[1] + r[1]) * stride[2] + r[2];
            let want: f64 = (0..cl)
                .map(|j| {
                    let x = xs[(((nn * cl + j) * ld + q[0]) * lh + q[1]) * lw + q[2]];
                    x as f64 * wu[(j * up_ch + o) * taps + t] as f64
                })
                .sum();
            assert!(
                (g as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{i}: {g} {want}"
            );
        }
        // Built: upsampled + bias, then the skip's channels, then the convolution.
        let skip = random(&mut rng, n * skip_ch * vu);
        let cin = up_ch + skip_ch;
        let w = random(&mut rng, 4 * cin * 27);
        let mut cat = Vec::with_capacity(n * cin * vu);
        for nn in 0..n {
            for o in 0..up_ch {
                let plane = &got[(nn * up_ch + o) * vu..][..vu];
                cat.extend(plane.iter().map(|v| v + bias[o]));
            }
            cat.extend_from_slice(&skip[nn * skip_ch * vu..][..skip_ch * vu]);
        }
        let g = ConvGeom::new(
            &[n, cin, size[0], size[1], size[2]],
            &[4, cin, 3, 3, 3],
            [1; 3],
            [1; 3],
        )
        .unwrap();
        let sample = |nn: usize| Planes::one(&cat[nn * cin * vu..][..cin * vu], vu);
        let built = forward_with(Kernel::detect(), &g, sample, &w);
        let biased = Upsampling {
            bias: Some(&bias),
            ..u
        };
        let fused = forward_up_pair(&g, &biased, &skip, &w);
        assert!(fused == built, "seed {seed}: fused and built differ");
    }
}

/// Written over its input, a pass gives the same values bit for bit as into a new buffer, at
/// every thread count (items meet at different planes) and depth reach of the kernel.
#[test]
fn in_place_passes_equal_the_passes_into_new_buffers() {
    use super::{forward_up_pair, Upsampling};
    for (seed, x, k, pad) in [
        (40, [2, 5, 7, 6, 9], [3, 3, 3], [1, 1, 1]),
        (41, [1, 4, 5, 8, 5], [1, 3, 3], [0, 1, 1]),
        (42, [1, 3, 9, 4, 6], [5, 3, 1], [2, 1, 0]),
        (43, [1, 6, 2, 3, 3], [3, 3, 3], [1, 1, 1]),
    ] {
        let c = x[1];
        let g = ConvGeom::new(&x, &[c, c, k[0], k[1], k[2]], pad, [1; 3]).unwrap();
        let mut rng = Rng::new(seed);
        let xs = random(&mut rng, x.iter().product());
        let ws = random(&mut rng, c * c * k.iter().product::<usize>());
        let vi = g.input_voxels();
        let sample = |n: usize| Planes::one(&xs[n * c * vi..][..c * vi], vi);
        let want = super::forward(&g, sample, &ws);
        // The decoder's form: a low-resolution tensor upsampled by 1x1x1 (so any size fits)
        // beside a skip of c channels, written over the skip.
        let low = random(&mut rng, x[0] * 2 * vi);
        let wu = random(&mut rng, 2 * 2);
        let up = Upsampling {
            low: &low,
            low_ch: 2,
            low_size: g.input,
            weight: &wu,
            up_ch: 2,
            stride: [1; 3],
            bias: None,
        };
        let gp = ConvGeom::new(
            &[x[0], c + 2, x[2], x[3], x[4]],
            &[c, c + 2, k[0], k[1], k[2]],
            pad,
            [1; 3],
        )
        .unwrap();
        let wp = random(&mut rng, c * (c + 2) * k.iter().product::<usize>());
        let want_pair = forward_up_pair(&gp, &up, &xs, &wp);
        let over = Over { xs: &xs, seed };
        over.check(&[1, 2, 3, 5], (&g, &ws, &want), (&gp, &up, &wp, &want_pair));
    }
}

/// The passes written over their input, checked against `want` at each thread count.
struct Over<'a> {
    /// Their input (the skip of the decoder's form).
    xs: &'a [f32],
    seed: u64,
}

impl Over<'_> {
    fn check(
        &self,
        threads: &[usize],
        (g, ws, want): (&ConvGeom, &[f32], &[f32]),
        (gp, up, wp, want_pair): (&ConvGeom, &super::Upsampling, &[f32], &[f32]),
    ) {
        use super::{forward_in_place, forward_up_pair_in_place};
        for &threads in threads {
            let pool = pool(threads);
            let mut got = self.xs.to_vec();
            // SAFETY: `got` is ours alone.
            pool.install(|| unsafe { forward_in_place(g, got.as_mut_ptr(), ws) });
            assert!(got == want, "seed {}, {threads} threads", self.seed);
            let mut got = self.xs.to_vec();
            // SAFETY: as above.
            pool.install(|| unsafe { forward_up_pair_in_place(gp, up, got.as_mut_ptr(), wp) });
            assert!(
                got == want_pair,
                "seed {}, {threads} threads, pair",
                self.seed
            );
        }
    }
}

/// With bf16 products, the passes that only inference runs (written over their input; the
/// decoder's first convolution computing its upsampled planes, into a new buffer and over the
/// skip) give the bf16 pass over the tensor they stand for bit for bit, at every thread
/// count: odd channel counts (a pair's second channel absent) and upsampled channels that
/// share a pair with the skip's included.
#[test]
fn bf16_passes_that_only_inference_runs_equal_the_bf16_pass_over_the_built_tensor() {
    use super::{forward_bf16_products, forward_up_pair, transpose, Upsampling};
    use crate::model::ops::Products;
    if !super::bf16_dot_products() {
        return; // the callers take the f32 passes, held by the tests above
    }
    for (seed, x, k, pad, up_ch, stride) in [
        (50, [2, 5, 6, 6, 9], [3, 3, 3], [1, 1, 1], 3, [2, 2, 1]),
        (51, [1, 6, 4, 8, 10], [1, 3, 3], [0, 1, 1], 2, [1, 2, 2]),
        (52, [1, 3, 4, 4, 18], [3, 3, 3], [1, 1, 1], 1, [2, 2, 2]),
    ] {
        let c = x[1];
        let taps: usize = k.iter().product();
        let mut g = ConvGeom::new(&x, &[c, c, k[0], k[1], k[2]], pad, [1; 3]).unwrap();
        g.products = Products::Bf16;
        let mut rng = Rng::new(seed);
        let xs = random(&mut rng, x.iter().product());
        let ws = random(&mut rng, c * c * taps);
        let vi = g.input_voxels();
        let sample = |n: usize| Planes::one(&xs[n * c * vi..][..c * vi], vi);
        let want = forward_bf16_products(&g, sample, &ws).unwrap();
        // The decoder's form: `up_ch` upsampled channels, then the skip's `c`.
        let low_size = [0, 1, 2].map(|a| x[2 + a] / stride[a]);
        let low = random(&mut rng, x[0] * 2 * low_size.iter().product::<usize>());
        let wu = random(&mut rng, 2 * up_ch * stride.iter().product::<usize>());
        let bias = random(&mut rng, up_ch);
        let up = Upsampling {
            low: &low,
            low_ch: 2,
            low_size,
            weight: &wu,
            up_ch,
            stride,
            bias: Some(&bias),
        };
        let cin = c + up_ch;
        let mut gp = ConvGeom::new(
            &[x[0], cin, x[2], x[3], x[4]],
            &[c, cin, k[0], k[1], k[2]],
            pad,
            [1; 3],
        )
        .unwrap();
        gp.products = Products::Bf16;
        let wp = random(&mut rng, c * cin * taps);
        let upsampled = transpose(&Upsampling { bias: None, ..up }, x[0], g.input);
        let mut cat = Vec::with_capacity(x[0] * cin * vi);
        for n in 0..x[0] {
            for o in 0..up_ch {
                let plane = &upsampled[(n * up_ch + o) * vi..][..vi];
                cat.extend(plane.iter().map(|v| v + bias[o]));
            }
            cat.extend_from_slice(&xs[n * c * vi..][..c * vi]);
        }
        let built = |n: usize| Planes::one(&cat[n * cin * vi..][..cin * vi], vi);
        let want_pair = forward_bf16_products(&gp, built, &wp).unwrap();
        assert!(
            forward_up_pair(&gp, &up, &xs, &wp) == want_pair,
            "seed {seed}"
        );
        let over = Over { xs: &xs, seed };
        over.check(&[1, 2, 3], (&g, &ws, &want), (&gp, &up, &wp, &want_pair));
    }
}
