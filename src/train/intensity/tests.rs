//! Tests of the intensity transforms: each against a direct formula, and every vector build
//! against the portable one bit for bit.

use super::blur::{gaussian_kernel, reflect};
use super::gamma::{pow_unit, PowFit};
use super::moments::{LaneSums, Moments};
use super::*;

fn min_max(c: &[f32]) -> (f32, f32) {
    c.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        })
}

/// Two passes in f64, the textbook way (the transforms sum in one).
fn mean_std(c: &[f32]) -> (f64, f64) {
    let n = c.len() as f64;
    let mean = c.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = c.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn one_pass_moments_equal_two_pass_ones() {
    // Within 1e-6 of the deviation (f32 partial sums of eight terms, see FLUSH): lengths
    // with and without a partial group of blocks and values past them, data far from 0,
    // a first value (the sums' centre) far from the rest, and a patch's worth.
    let mut rng = Rng::new(9);
    let cases = [
        (1usize, 0.0f32, 0.0f32),
        (31, 3.0, 0.0),
        (1000, 1e4, 0.0),
        (4099, -250.0, 0.0),
        (4099, 0.0, 40.0),
        (16 * 128 * 128 + 77, 2.0, 0.0),
        (16 * 128 * 128, 0.0, -1e4),
    ];
    for (n, offset, first) in cases {
        let mut c: Vec<f32> = (0..n).map(|_| offset + rng.normal() as f32).collect();
        c[0] += first;
        let m = Moments::of(&c);
        let ((mean, std), (want_m, want_s)) = (m.sums.mean_std(n), mean_std(&c));
        assert!(
            (mean - want_m).abs() <= 1e-6 * want_s.max(1e-3),
            "{n}: {mean} {want_m}"
        );
        assert!(
            (std - want_s).abs() <= 1e-6 * want_s.max(1e-3),
            "{n}: {std} {want_s}"
        );
        assert_eq!((m.lo, m.hi), min_max(&c));
        assert_eq!(LaneSums::of(&c).mean_std(n), m.sums.mean_std(n));
    }
}

#[test]
fn the_fitted_power_matches_powf() {
    for g in [0.01f64, 0.1, 0.7, 0.9, 1.0, 1.2, 1.5, 2.5, 3.0, 3.7, 4.0] {
        let fit = PowFit::new(g).expect("within the fit's range");
        let mut worst = 0f32;
        for k in 0..=20_000 {
            // Values across the unit interval and down to f32's smallest normal one (a
            // patch's values rescaled to 0..1 are 0 or far above it), and 1 itself.
            for x in [k as f32 / 20_000.0, (k as f32 / 20_000.0 * -126.0).exp2()] {
                let (a, b) = (fit.at(x), (x as f64).powf(g) as f32);
                let err = (a - b).abs() / b.max(f32::MIN_POSITIVE);
                // Where the table's power of two would be subnormal it is 0: results
                // below 2^g times f32's smallest normal value may be 0.
                let tiny = (g + 1.0).exp2() as f32 * f32::MIN_POSITIVE;
                if b >= tiny {
                    worst = worst.max(err);
                } else {
                    assert!(a < tiny, "{x}^{g}: {a} vs {b}");
                }
            }
        }
        assert!(worst < 1e-6, "g {g}: relative error {worst}");
    }
    assert_eq!(PowFit::new(0.7).map(|f| f.at(0.0)), Some(0.0));
    assert!(PowFit::new(4.5).is_none() && PowFit::new(0.0).is_none());
}

fn ramp(size: [usize; 3]) -> Vec<f32> {
    let n: usize = size.iter().product();
    (0..n)
        .map(|i| ((i * 37) % 101) as f32 * 0.1 - 3.0)
        .collect()
}

#[test]
fn none_changes_nothing_and_defaults_are_valid() {
    let size = [4, 6, 6];
    let img = ramp(size);
    for seed in 0..50 {
        let mut a = img.clone();
        apply(
            &mut a,
            size,
            false,
            &IntensityConfig::none(),
            &mut Rng::new(seed),
        );
        assert_eq!(a, img);
    }
    IntensityConfig::default().validate().unwrap();
    let bad = IntensityConfig {
        gamma_range: [1.5, 0.7],
        ..IntensityConfig::default()
    };
    assert!(bad.validate().is_err());
}

#[test]
fn blur_keeps_constants_and_the_sum_and_matches_a_direct_sum() {
    let size = [5, 7, 9];
    let mut flat = vec![2.5f32; 5 * 63];
    gaussian_blur(&mut flat, size, [0.7, 1.0, 0.5]);
    assert!(flat.iter().all(|v| (v - 2.5).abs() < 1e-5));
    // One axis against a direct reflected sum.
    let mut img = ramp([1, 1, 9]);
    let orig = img.clone();
    gaussian_blur(&mut img, [1, 1, 9], [0.0, 0.0, 0.8]);
    let k = gaussian_kernel(0.8);
    let r = (k.len() / 2) as i64;
    for i in 0..9i64 {
        let want: f32 = (0..k.len() as i64)
            .map(|q| {
                let mut j = i + q - r;
                if j < 0 {
                    j = -j - 1;
                }
                if j >= 9 {
                    j = 17 - j;
                }
                k[q as usize] * orig[j as usize]
            })
            .sum();
        assert!((img[i as usize] - want).abs() < 1e-5);
    }
}

#[test]
fn blur_equals_the_separable_sum_bit_for_bit() {
    for sigma in [[0.9, 0.6, 1.0], [0.4, 2.0, 8.5]] {
        blur_equals_the_separable_sum(sigma);
    }
}

/// Rows of a block of 64 outputs, one of 32 and a remainder (x), of one block of 32 and a
/// remainder (y); the second sigma set has more taps along x than the rows held at once.
fn blur_equals_the_separable_sum(sigma: [f64; 3]) {
    let size = [5, 38, 101];
    let mut img = ramp(size);
    for (i, v) in img.iter_mut().enumerate() {
        *v += ((i * 7919) % 17) as f32 * 0.21;
    }
    let mut want = img.clone();
    for axis in 0..3 {
        let k = gaussian_kernel(sigma[axis]);
        let r = (k.len() / 2) as i64;
        let stride: usize = size[axis + 1..].iter().product();
        let before = want.clone();
        for (p, out) in want.iter_mut().enumerate() {
            let i = (p / stride % size[axis]) as i64;
            let line_start = p - i as usize * stride;
            // The centre tap, then each pair of taps the kernel weighs alike.
            let v = |q: i64| before[line_start + reflect(i + q, size[axis]) * stride];
            let mut s = k[r as usize] * v(0);
            for j in 1..=r {
                s += k[(r + j) as usize] * (v(-j) + v(j));
            }
            *out = s;
        }
    }
    gaussian_blur(&mut img, size, sigma);
    assert_eq!(img, want);
}

#[test]
fn contrast_and_gamma_keep_what_they_promise() {
    let size = [3, 8, 8];
    let img = ramp(size);
    let (lo, hi) = min_max(&img);
    let mut c = img.clone();
    contrast(&mut c, 1.4);
    let (lo2, hi2) = min_max(&c);
    assert!(lo2 >= lo && hi2 <= hi);
    let (m0, s0) = mean_std(&img);
    for invert in [false, true] {
        let mut g = img.clone();
        gamma(&mut g, 0.7, invert);
        let (m, s) = mean_std(&g);
        assert!((m - m0).abs() < 1e-4 && (s - s0).abs() < 1e-4, "{m} {s}");
        assert_ne!(g, img);
        // Monotone: the order of values is kept.
        let mut idx: Vec<usize> = (0..img.len()).collect();
        idx.sort_by(|&a, &b| img[a].total_cmp(&img[b]));
        assert!(idx.windows(2).all(|w| g[w[0]] <= g[w[1]] + 1e-5));
    }
}

#[test]
fn low_resolution_keeps_constants_and_the_z_axis_of_in_plane_patches() {
    let size = [4, 10, 10];
    let mut flat = vec![-1.25f32; 400];
    low_resolution(&mut flat, size, 0.5, false);
    assert!(flat.iter().all(|&v| v == -1.25));
    // Values constant in-plane, varying in z: in-plane low resolution keeps them.
    let mut layers: Vec<f32> = (0..400).map(|i| (i / 100) as f32).collect();
    let orig = layers.clone();
    low_resolution(&mut layers, size, 0.5, true);
    assert_eq!(layers, orig);
    let mut img = ramp(size);
    let before = img.clone();
    low_resolution(&mut img, size, 0.5, false);
    assert_ne!(img, before);
}

/// Low resolution voxel by voxel: nearest down, then the trilinear formula at each
/// output voxel (half-voxel-centred, clamped).
fn low_resolution_direct(c: &[f32], size: [usize; 3], small: [usize; 3]) -> Vec<f32> {
    let near = |a: usize, j: usize| {
        (((j as f64 + 0.5) * size[a] as f64 / small[a] as f64) as usize).min(size[a] - 1)
    };
    let low = |z: usize, y: usize, x: usize| {
        c[(near(0, z) * size[1] + near(1, y)) * size[2] + near(2, x)]
    };
    let tap = |a: usize, j: usize| {
        let s = ((j as f64 + 0.5) * small[a] as f64 / size[a] as f64 - 0.5)
            .clamp(0.0, (small[a] - 1) as f64);
        let i0 = s.floor() as usize;
        (i0, (i0 + 1).min(small[a] - 1), (s - i0 as f64) as f32)
    };
    let lerp = |a: f32, b: f32, f: f32| a + (b - a) * f;
    let mut out = Vec::with_capacity(c.len());
    for z in 0..size[0] {
        let (z0, z1, fz) = tap(0, z);
        for y in 0..size[1] {
            let (y0, y1, fy) = tap(1, y);
            for x in 0..size[2] {
                let (x0, x1, fx) = tap(2, x);
                let plane = |zz| {
                    lerp(
                        lerp(low(zz, y0, x0), low(zz, y0, x1), fx),
                        lerp(low(zz, y1, x0), low(zz, y1, x1), fx),
                        fy,
                    )
                };
                out.push(lerp(plane(z0), plane(z1), fz));
            }
        }
    }
    out
}

#[test]
fn low_resolution_by_axes_equals_the_voxel_by_voxel_formula() {
    for (size, zoom, in_plane) in [
        ([7, 12, 9], 0.5, false),
        ([7, 12, 9], 0.73, false),
        ([5, 16, 16], 0.6, true),
        ([1, 3, 2], 0.5, false),
    ] {
        let mut img = ramp(size);
        for (i, v) in img.iter_mut().enumerate() {
            *v += ((i * 7919) % 13) as f32 * 0.37;
        }
        let small: [usize; 3] = std::array::from_fn(|a| {
            if in_plane && a == 0 {
                size[0]
            } else {
                ((size[a] as f64 * zoom).round() as usize).max(1)
            }
        });
        let want = low_resolution_direct(&img, size, small);
        low_resolution(&mut img, size, zoom, in_plane);
        assert_eq!(img, want, "{size:?} at {zoom}");
    }
}

#[test]
fn the_polynomial_power_matches_powf() {
    for g in [0.7f32, 0.9, 1.0, 1.2, 1.5, 3.0] {
        for k in 0..=10_000 {
            let x = k as f32 / 10_000.0;
            let (a, b) = (pow_unit(x, g), x.powf(g));
            assert!(
                (a - b).abs() <= 4e-6 * b.max(1e-30) + 1e-30,
                "{x}^{g}: {a} vs {b}"
            );
        }
    }
    assert_eq!(pow_unit(0.0, 0.7), 0.0);
}

#[test]
fn the_vector_builds_give_the_same_bits() {
    #[cfg(target_arch = "x86_64")]
    {
        let simd = crate::util::simd::detected();
        let cfg = IntensityConfig::default().every();
        for seed in 0..12 {
            // (An odd size too: the 8-lane loops' tails; long rows: the blur's blocks.)
            let size = match seed {
                0..4 => [6, 20, 24],
                4..8 => [5, 13, 17],
                8..10 => [4, 10, 100],
                _ => [3, 7, 133],
            };
            let in_plane = seed % 2 == 0;
            let mut a = ramp(size);
            apply_body(&mut a, size, in_plane, &cfg, &mut Rng::new(seed));
            if simd >= Simd::Avx2 {
                let mut b = ramp(size);
                // SAFETY: AVX2 is present (checked above).
                unsafe { apply_avx2(&mut b, size, in_plane, &cfg, &mut Rng::new(seed)) };
                assert_eq!(a, b, "AVX2, seed {seed}");
            }
        }
    }
}

#[test]
fn either_side_of_one_is_balanced() {
    let mut rng = Rng::new(4);
    let draws: Vec<f64> = (0..4000)
        .map(|_| either_side_of_one([0.75, 1.25], &mut rng))
        .collect();
    let below = draws.iter().filter(|&&v| v < 1.0).count();
    assert!((1800..2200).contains(&below), "{below}");
    assert!(draws.iter().all(|v| (0.75..=1.25).contains(v)));
}
