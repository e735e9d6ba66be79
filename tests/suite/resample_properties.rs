//! Properties of the resampling kernels and grid convention.

use crate::common;

use voxcache::geometry::{blocks, Block};
use voxcache::geometry::{output_shape, source_coordinate};
use voxcache::prep::resample::{LinearResampler, NearestResampler};

/// Independent per-voxel trilinear reference: same convention, same operation order
/// (x, then y, then z), written the slow and obvious way.
fn naive_linear(input: &[f32], n: [usize; 3], m: [usize; 3]) -> Vec<f32> {
    let coord = |j: usize, a: usize| {
        let x = source_coordinate(j, n[a], m[a]).clamp(0.0, (n[a] - 1) as f64);
        let i0 = x.floor() as usize;
        let i1 = (i0 + 1).min(n[a] - 1);
        (i0, i1, (x - i0 as f64) as f32)
    };
    let at = |z: usize, y: usize, x: usize| input[(z * n[1] + y) * n[2] + x];
    let lerp = |a: f32, b: f32, w: f32| a + (b - a) * w;
    let mut out = Vec::with_capacity(m.iter().product());
    for jz in 0..m[0] {
        let (z0, z1, wz) = coord(jz, 0);
        for jy in 0..m[1] {
            let (y0, y1, wy) = coord(jy, 1);
            for jx in 0..m[2] {
                let (x0, x1, wx) = coord(jx, 2);
                let row = |z, y| lerp(at(z, y, x0), at(z, y, x1), wx);
                let plane = |z| lerp(row(z, y0), row(z, y1), wy);
                out.push(lerp(plane(z0), plane(z1), wz));
            }
        }
    }
    out
}

fn random_volume(n: [usize; 3], seed: u64) -> Vec<f32> {
    let mut r = common::Lcg(seed);
    (0..n.iter().product::<usize>())
        .map(|_| r.next_f32() * 1000.0 - 300.0)
        .collect()
}

/// Resample block by block with a given block shape into one output array.
fn chunked(input: &[f32], n: [usize; 3], m: [usize; 3], block: [usize; 3]) -> Vec<f32> {
    let r = LinearResampler::new(n, m);
    let mut out = vec![0.0f32; m.iter().product()];
    for b in blocks(m, block) {
        let mut buf = vec![0.0f32; b.len()];
        r.fill(input, b, &mut buf);
        let mut i = 0;
        for z in 0..b.size[0] {
            for y in 0..b.size[1] {
                for x in 0..b.size[2] {
                    out[((b.start[0] + z) * m[1] + b.start[1] + y) * m[2] + b.start[2] + x] =
                        buf[i];
                    i += 1;
                }
            }
        }
    }
    out
}

#[test]
fn chunk_by_chunk_equals_whole_volume_bit_for_bit() {
    let n = [7, 13, 11];
    let input = random_volume(n, 1);
    for m in [[17, 5, 29], [7, 13, 11], [3, 40, 4], [20, 26, 22]] {
        let reference = naive_linear(&input, n, m);
        let whole = chunked(&input, n, m, m);
        assert_eq!(whole, reference, "whole volume vs naive, m={m:?}");
        for block in [[1, 1, 1], [4, 3, 5], [8, 8, 8], [16, 2, 7]] {
            let c = chunked(&input, n, m, block);
            // Bit-identical, not merely close.
            assert!(
                c.iter()
                    .zip(&reference)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "m={m:?} block={block:?}"
            );
        }
    }
}

#[test]
fn a_linear_ramp_survives_at_arbitrary_ratios() {
    let n = [9, 12, 10];
    let ramp = |z: f64, y: f64, x: f64| 3.0 * x - 2.0 * y + 0.5 * z + 7.0;
    let mut input = Vec::new();
    for z in 0..n[0] {
        for y in 0..n[1] {
            for x in 0..n[2] {
                input.push(ramp(z as f64, y as f64, x as f64) as f32);
            }
        }
    }
    for m in [[23, 5, 31], [9, 12, 10], [4, 37, 13], [17, 17, 3]] {
        let out = chunked(&input, n, m, [5, 6, 7]);
        let mut checked = 0;
        for jz in 0..m[0] {
            for jy in 0..m[1] {
                for jx in 0..m[2] {
                    let c = [
                        source_coordinate(jz, n[0], m[0]),
                        source_coordinate(jy, n[1], m[1]),
                        source_coordinate(jx, n[2], m[2]),
                    ];
                    // Outside [0, n-1] the edge clamps, by design; the ramp holds inside.
                    if (0..3).any(|a| c[a] < 0.0 || c[a] > (n[a] - 1) as f64) {
                        continue;
                    }
                    let want = ramp(c[0], c[1], c[2]);
                    let got = out[(jz * m[1] + jy) * m[2] + jx] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "m={m:?} at {jz},{jy},{jx}: {got} vs {want}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 0);
    }
}

#[test]
fn constant_volume_stays_exactly_constant() {
    let n = [5, 6, 7];
    let input = vec![42.125f32; 210];
    let out = chunked(&input, n, [13, 3, 29], [4, 4, 4]);
    assert!(out.iter().all(|&v| v == 42.125));
}

#[test]
fn labels_keep_only_their_own_values() {
    let n = [6, 9, 8];
    let palette = [0u16, 3, 7, 300];
    let mut r = common::Lcg(9);
    let input: Vec<u16> = (0..6 * 9 * 8)
        .map(|_| palette[(r.next_f32() * 4.0) as usize % 4])
        .collect();
    for m in [[13, 4, 20], [3, 30, 5]] {
        let res = NearestResampler::new(n, m);
        let mut out = vec![0u16; m.iter().product()];
        res.fill(
            &input,
            Block {
                start: [0; 3],
                size: m,
            },
            &mut out,
        );
        assert!(out.iter().all(|v| palette.contains(v)));
        // Every output voxel holds the value of the nearest input voxel (ties to the lower).
        for (i, v) in out.iter().enumerate() {
            let (jz, jy, jx) = (i / (m[1] * m[2]), i / m[2] % m[1], i % m[2]);
            let near = |j: usize, a: usize| {
                let x = source_coordinate(j, n[a], m[a]).clamp(0.0, (n[a] - 1) as f64);
                (x - 0.5).ceil().max(0.0) as usize
            };
            let src = input[(near(jz, 0) * n[1] + near(jy, 1)) * n[2] + near(jx, 2)];
            assert_eq!(*v, src);
        }
    }
}

#[test]
fn the_outlier_grid_from_the_user_story() {
    assert_eq!(
        output_shape([512, 512, 61], [4.97, 4.97, 5.0], [1.0, 1.0, 1.0]),
        [2545, 2545, 305]
    );
}
