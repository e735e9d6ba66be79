//! The label's fast answers (uniform table, vector weighing, two-value tables) against the
//! weighed majority by the list.

use super::*;
use crate::util::rng::Rng;

#[cfg(target_arch = "x86_64")]
#[test]
fn the_outcome_table_gives_the_weighed_value() {
    // Every pattern of two values over an in-plane cell's 4 neighbours, at random and
    // dyadic fractions: the table's pick is `weighed4`'s.
    let mut rng = Rng::new(5);
    for case in 0..20_000 {
        let f = [0, 1].map(|_| match rng.below(5) {
            0 => 0.5,
            1 => 0.0,
            2 => 0.25,
            _ => rng.uniform(),
        });
        let table = two_value_outcomes(f[0], f[1]);
        let (a, b) = if case % 2 == 0 { (3u16, 8u16) } else { (8, 3) };
        for p in 1..8 {
            let v = [a, [a, b][p & 1], [a, b][(p >> 1) & 1], [a, b][(p >> 2) & 1]];
            let want = weighed4(v, [0.0, f[0], f[1]]);
            let got = [a, b, a.min(b)][table[p] as usize];
            assert_eq!(got, want, "{v:?} at {f:?}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_vector_weighing_gives_the_scalar_value() {
    // 3D cells of two, three or more values (bytes and u16, values at the types' ends),
    // at random and dyadic fractions (exact ties): `weighed8` picks `weighed`'s value.
    if !std::arch::is_x86_feature_detected!("avx2") {
        return;
    }
    let mut rng = Rng::new(4);
    let (sy, sz) = (5, 35);
    for case in 0..30_000 {
        let pick: [u16; 4] = [0, 255, 7, 1 + rng.below(254) as u16];
        let kinds = 1 + case % 4;
        let wide: Vec<u16> = (0..sz * 3)
            .map(|_| pick[rng.below(kinds as u64) as usize])
            .collect();
        let f = [0, 1, 2].map(|_| match rng.below(5) {
            0 => 0.5,
            1 => 0.0,
            2 => 0.25,
            _ => rng.uniform(),
        });
        let base = rng.below((sz * 2 - sy - 1) as u64) as usize;
        let bytes: Vec<u8> = wide.iter().map(|&v| v as u8).collect();
        let big: Vec<u16> = wide.iter().map(|&v| v * 257).collect();
        // SAFETY: AVX2 checked above.
        unsafe {
            assert_eq!(
                weighed8(&bytes, base, sy, sz, f),
                weighed::<false, u8>(&bytes, base, sy, sz, f),
                "bytes, case {case}"
            );
            assert_eq!(
                weighed8(&big, base, sy, sz, f),
                weighed::<false, u16>(&big, base, sy, sz, f),
                "u16, case {case}"
            );
        }
    }
}

#[test]
fn the_two_value_majority_agrees_with_the_list() {
    // The two-value sum as a tree against each value's running sum: the same winner but
    // where the two weights agree to rounding; always the same where every fraction is a
    // multiple of 1/4 (exact sums, ties included, which go to the lower value).
    let mut rng = Rng::new(11);
    let mut near_ties = 0;
    for case in 0..40_000 {
        let four = case % 3 == 0;
        let pick = [3u16, 9, 0];
        // Mostly two values, some three; fractions often exactly 0, 1/4, 1/2 or 3/4.
        let values: Vec<u16> = (0..if four { 4 } else { 8 })
            .map(|_| pick[rng.below(if case % 5 == 0 { 3 } else { 2 }) as usize])
            .collect();
        let f = [0, 1, 2].map(|_| match rng.below(6) {
            0 => 0.5,
            1 => 0.0,
            2 => 0.25,
            3 => 0.75,
            _ => rng.uniform(),
        });
        let wz = if four { [1.0, 0.0] } else { [1.0 - f[0], f[0]] };
        let (wy, wx) = ([1.0 - f[1], f[1]], [1.0 - f[2], f[2]]);
        let want = majority_by_list(&values, wz, wy, wx);
        let v8: [u16; 8] = std::array::from_fn(|k| values[k % values.len()]);
        let got = mixed_majority(v8, four, f);
        if got == want {
            continue;
        }
        let weight = |c: u16| -> f64 {
            (0..values.len())
                .filter(|&k| values[k] == c)
                .map(|k| wz[k >> 2] * wy[(k >> 1) & 1] * wx[k & 1])
                .sum()
        };
        let dyadic = f.iter().all(|&x| (x * 4.0).fract() == 0.0);
        assert!(
            !dyadic && (weight(got) - weight(want)).abs() < 1e-12,
            "{values:?} at {f:?}: {got} against {want}"
        );
        near_ties += 1;
    }
    assert!(near_ties < 10, "{near_ties} near-ties differ");
}

#[test]
fn the_uniform_table_matches_the_cells() {
    uniform_table_matches::<u8>();
    uniform_table_matches::<u16>();
}

fn uniform_table_matches<L: LabelValue + From<u8> + std::fmt::Debug>() {
    let mut rng = Rng::new(5);
    let bs = [5, 6, 7];
    let n: usize = bs.iter().product();
    let (sy, sz) = (bs[2], bs[1] * bs[2]);
    let mut out = Vec::new();
    for case in 0..200 {
        // Blocks of a few values, so that uniform and mixed cells both occur; MIXED itself
        // as a value in some cases (it must read as mixed, and weigh to itself).
        let top = if case % 4 == 0 { L::MIXED } else { L::from(3) };
        let cut = [0, 1, 2].map(|a| rng.below(bs[a] as u64) as usize);
        let label: Vec<L> = (0..n)
            .map(|i| {
                let p = [i / sz, (i / sy) % bs[1], i % sy];
                if p[0] >= cut[0] && p[1] >= cut[1] && p[2] >= cut[2] {
                    top
                } else if rng.below(20) == 0 {
                    L::from(1)
                } else {
                    L::from(0)
                }
            })
            .collect();
        for flat in [false, true] {
            if flat {
                uniform_cells::<true, L>(&label, bs, &mut out);
            } else {
                uniform_cells::<false, L>(&label, bs, &mut out);
            }
            let planes = if flat { 1 } else { 2 };
            for z in 0..bs[0] + 1 - planes {
                for y in 0..bs[1] - 1 {
                    for x in 0..bs[2] - 1 {
                        let v = (z * bs[1] + y) * bs[2] + x;
                        let corners: Vec<L> = (0..4 * planes)
                            .map(|k| label[v + (k >> 2) * sz + ((k >> 1) & 1) * sy + (k & 1)])
                            .collect();
                        let same = corners.iter().all(|&c| c == corners[0]);
                        let want = if same { corners[0] } else { L::MIXED };
                        assert_eq!(out[v], want, "cell {v}, {flat}");
                        let f = [0.3, 0.6, 0.5];
                        let got = if flat {
                            label_at::<true, L>(&out, &label, v, sy, sz, f)
                        } else {
                            label_at::<false, L>(&out, &label, v, sy, sz, f)
                        };
                        let slow = if flat {
                            majority::<true, L>(&label, v, sy, sz, f)
                        } else {
                            majority::<false, L>(&label, v, sy, sz, f)
                        };
                        assert_eq!(got, slow, "cell {v}, {flat}");
                    }
                }
            }
        }
    }
}
