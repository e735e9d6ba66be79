//! The columns' building blocks against their plain definitions: the transposes, and the
//! vector outcome tables against the scalar ones.

use std::arch::x86_64::*;

use super::label::outcome_tables;
use super::turn::{transpose_f32, transpose_u16, transpose_u8};
use crate::train::spatial::label::two_value_outcomes;

#[test]
fn transposes_turn_rows_into_columns() {
    if !std::is_x86_feature_detected!("avx2") {
        return;
    }
    #[target_feature(enable = "avx2")]
    unsafe fn check() {
        let f: [[f32; 8]; 8] = std::array::from_fn(|i| std::array::from_fn(|j| (i * 8 + j) as f32));
        let t = transpose_f32(f.map(|r| _mm256_loadu_ps(r.as_ptr())));
        for (j, v) in t.iter().enumerate() {
            let mut o = [0f32; 8];
            _mm256_storeu_ps(o.as_mut_ptr(), *v);
            assert_eq!(o, std::array::from_fn(|i| f[i][j]));
        }
        let b: [[u8; 16]; 16] =
            std::array::from_fn(|i| std::array::from_fn(|j| (i * 16 + j) as u8));
        let t = transpose_u8(b.map(|r| _mm_loadu_si128(r.as_ptr().cast())));
        for (j, v) in t.iter().enumerate() {
            let mut o = [0u8; 16];
            _mm_storeu_si128(o.as_mut_ptr().cast(), *v);
            assert_eq!(o, std::array::from_fn(|i| b[i][j]));
        }
        let u: [[u16; 8]; 8] = std::array::from_fn(|i| std::array::from_fn(|j| (i * 8 + j) as u16));
        let t = transpose_u16(u.map(|r| _mm_loadu_si128(r.as_ptr().cast())));
        for (j, v) in t.iter().enumerate() {
            let mut o = [0u16; 8];
            _mm_storeu_si128(o.as_mut_ptr().cast(), *v);
            assert_eq!(o, std::array::from_fn(|i| u[i][j]));
        }
    }
    // SAFETY: AVX2 checked above.
    unsafe { check() }
}

#[test]
fn outcome_tables_are_the_scalar_ones() {
    if !std::is_x86_feature_detected!("avx2") {
        return;
    }
    let mut rng = crate::util::rng::Rng::new(9);
    for _ in 0..5_000 {
        let frac: [[f64; 8]; 2] = std::array::from_fn(|_| {
            std::array::from_fn(|_| match rng.below(4) {
                0 => 0.5,
                1 => 0.0,
                _ => rng.uniform(),
            })
        });
        // SAFETY: AVX2 checked above.
        let got = unsafe { avx2_tables(&frac) };
        for j in 0..8 {
            let want = two_value_outcomes(frac[0][j], frac[1][j]);
            assert_eq!(got[j].to_le_bytes(), want, "{frac:?} lane {j}");
        }
    }
    #[target_feature(enable = "avx2")]
    unsafe fn avx2_tables(frac: &[[f64; 8]; 2]) -> [u64; 8] {
        outcome_tables(frac)
    }
}
