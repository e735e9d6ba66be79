//! The row conversions from stored little-endian bytes into the caller's buffer (the element
//! types themselves are [`crate::format::Dtype`]).

use half::f16;

pub use crate::format::Dtype as StoredDtype;

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
}

/// An element type patches can be read into: `f32` (any stored type), `u16` (uint8 and uint16
/// labels) or `u8` (uint8 labels). Only exact conversions are offered.
pub trait Sample: bytemuck::Pod + Default + Send + Sync + 'static + private::Sealed {
    /// Whether every value of `dtype` converts to `Self` exactly.
    fn accepts(dtype: StoredDtype) -> bool;

    /// Convert one row of stored little-endian elements; `src` holds exactly `dst.len()` of
    /// them and `dtype` is one that [`Sample::accepts`]. Returns whether every value written
    /// is finite (always, for integers): the check rides along the copy, where a scan of the
    /// patch after it cost a plain crop 15% (it read the patch back from the cache levels the
    /// copy had pushed it to).
    #[doc(hidden)]
    fn convert_row(dtype: StoredDtype, src: &[u8], dst: &mut [Self]) -> bool;

    /// [`Sample::convert_row`] written reversed (`dst[k]` from the row's element `n - 1 - k`:
    /// x-mirrored reads): by default the row converted, then reversed in place; uint8 labels
    /// read into u16 are widened reversed in one pass.
    #[doc(hidden)]
    fn convert_row_reversed(dtype: StoredDtype, src: &[u8], dst: &mut [Self]) -> bool {
        let finite = Self::convert_row(dtype, src, dst);
        dst.reverse();
        finite
    }
}

/// The bytes of a slice of plain numbers, to be overwritten.
fn bytes_mut<T: Sample>(dst: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(dst)
}

/// Whether no value of `v` is a NaN or an infinity (a loop the compiler vectorizes: no early
/// exit; inlined, so that it is vectorized for the caller's target features).
#[inline(always)]
fn all_finite(v: &[f32]) -> bool {
    v.iter().fold(true, |ok, x| ok & x.is_finite())
}

/// Copy stored little-endian f32 `src` into `dst` (as many), telling whether all are finite:
/// one plain-Rust kernel, compiled for AVX2 where the CPU has it ([`crate::util::simd::best`]).
fn copy_finite(src: &[u8], dst: &mut [f32]) -> bool {
    assert_eq!(
        src.len(),
        4 * dst.len(),
        "a row of f32 needs 4 bytes a value"
    );
    #[cfg(target_arch = "x86_64")]
    {
        use crate::util::simd::Simd;
        // SAFETY: `simd::best` checked that the CPU has these features; the lengths match.
        match crate::util::simd::best() {
            Simd::Avx2 => return unsafe { copy_finite_avx2(src, dst) },
            Simd::Portable => {}
        }
    }
    copy_finite_portable(src, dst)
}

/// [`copy_finite`] for the target's baseline.
fn copy_finite_portable(src: &[u8], dst: &mut [f32]) -> bool {
    copy_finite_kernel(src, dst)
}

/// [`copy_finite`] compiled with AVX2 (8 lanes for the check).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_finite_avx2(src: &[u8], dst: &mut [f32]) -> bool {
    copy_finite_kernel(src, dst)
}

/// The copy, then the check over what was copied.
#[inline(always)]
fn copy_finite_kernel(src: &[u8], dst: &mut [f32]) -> bool {
    if cfg!(target_endian = "little") {
        bytes_mut(dst).copy_from_slice(src);
    } else {
        for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    all_finite(dst)
}

/// Bytes widened to u16 (labels stored as uint8): a loop the compiler vectorizes.
fn widen(src: &[u8], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "a row of bytes widens to as many u16");
    for (o, &v) in dst.iter_mut().zip(src) {
        *o = v as u16;
    }
}

/// Bytes widened to u16 and reversed (`dst[k]` from byte `n - 1 - k`: x-mirrored reads of
/// labels stored as uint8).
fn widen_reversed(src: &[u8], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "a row of bytes widens to as many u16");
    for (o, &v) in dst.iter_mut().zip(src.iter().rev()) {
        *o = v as u16;
    }
}

fn f16_row(src: &[u8], dst: &mut [f32]) {
    // SAFETY: u16 accepts any bit pattern; align_to only puts properly aligned elements in the
    // middle part.
    let (pre, mid, post) = unsafe { src.align_to::<u16>() };
    if cfg!(target_endian = "little") && pre.is_empty() && post.is_empty() && mid.len() == dst.len()
    {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        // Vectorized (F16C and the like) where the CPU has it.
        mid.reinterpret_cast::<f16>().convert_to_f32_slice(dst);
    } else {
        for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
        }
    }
}

impl Sample for f32 {
    fn accepts(dtype: StoredDtype) -> bool {
        // uint32 holds values f32 cannot (above 2^24).
        dtype != StoredDtype::Uint32
    }

    fn convert_row(dtype: StoredDtype, src: &[u8], dst: &mut [f32]) -> bool {
        match dtype {
            StoredDtype::Float32 => return copy_finite(src, dst),
            StoredDtype::Float16 => {
                f16_row(src, dst);
                return all_finite(dst);
            }
            StoredDtype::Uint8 => {
                for (o, &v) in dst.iter_mut().zip(src) {
                    *o = v as f32;
                }
            }
            StoredDtype::Uint16 => {
                for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *o = u16::from_le_bytes([c[0], c[1]]) as f32;
                }
            }
            // Not accepted (see `accepts`); converted anyway rather than left unwritten.
            StoredDtype::Uint32 => {
                for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *o = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
                }
            }
        }
        true
    }
}

impl Sample for u16 {
    fn accepts(dtype: StoredDtype) -> bool {
        matches!(dtype, StoredDtype::Uint8 | StoredDtype::Uint16)
    }

    fn convert_row(dtype: StoredDtype, src: &[u8], dst: &mut [u16]) -> bool {
        match dtype {
            StoredDtype::Uint16 if cfg!(target_endian = "little") => {
                bytes_mut(dst).copy_from_slice(src)
            }
            StoredDtype::Uint16 => {
                for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *o = u16::from_le_bytes([c[0], c[1]]);
                }
            }
            _ => widen(src, dst),
        }
        true
    }

    fn convert_row_reversed(dtype: StoredDtype, src: &[u8], dst: &mut [u16]) -> bool {
        if dtype == StoredDtype::Uint8 {
            widen_reversed(src, dst);
        } else {
            Self::convert_row(dtype, src, dst);
            dst.reverse();
        }
        true
    }
}

impl Sample for u8 {
    fn accepts(dtype: StoredDtype) -> bool {
        dtype == StoredDtype::Uint8
    }

    fn convert_row(_: StoredDtype, src: &[u8], dst: &mut [u8]) -> bool {
        dst.copy_from_slice(src);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_convert_exactly() {
        let vals = [0.0f32, -1.5, 3.25, 65504.0, 1e-3];
        let halves: Vec<u8> = vals
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        // Both the aligned (vectorized) and the unaligned route.
        let mut padded = vec![0u8];
        padded.extend_from_slice(&halves);
        for src in [&halves[..], &padded[1..]] {
            let mut out = [9.0f32; 5];
            f32::convert_row(StoredDtype::Float16, src, &mut out);
            let want: Vec<f32> = vals.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
            assert_eq!(out.to_vec(), want);
        }
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = [0.0f32; 5];
        f32::convert_row(StoredDtype::Float32, &bytes, &mut out);
        assert_eq!(out, vals);
        let mut lab = [0u16; 3];
        u16::convert_row(StoredDtype::Uint8, &[1, 2, 255], &mut lab);
        assert_eq!(lab, [1, 2, 255]);
        u16::convert_row(StoredDtype::Uint16, &[1, 1, 0, 0, 255, 255], &mut lab);
        assert_eq!(lab, [257, 0, 65535]);
        assert!(!u8::accepts(StoredDtype::Uint16));
        assert!(!u16::accepts(StoredDtype::Float32));
    }

    /// Every build the CPU runs: each row length up to 40 (whole vectors and every tail), from
    /// an unaligned source, copied exactly (NaN payloads, -0.0, subnormals and the largest
    /// values too); a NaN or infinity in any one place, and only then, is reported.
    #[test]
    fn rows_copy_exactly_and_tell_non_finite_values_in_every_build() {
        type Copy = fn(&[u8], &mut [f32]) -> bool;
        #[allow(unused_mut)]
        let mut builds: Vec<(&str, Copy)> = vec![("portable", copy_finite_portable)];
        #[cfg(target_arch = "x86_64")]
        {
            use crate::util::simd::{detected, Simd};
            // SAFETY: the CPU has the build's features, checked here.
            if detected() >= Simd::Avx2 {
                builds.push(("avx2", |s, d| unsafe { copy_finite_avx2(s, d) }));
            }
        }
        let finite = [
            1.5f32,
            -0.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE / 8.0,
            -3.25e-5,
        ];
        let odd = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(0xffc0_1234),
        ];
        for (name, copy) in builds {
            for n in 0..=40 {
                let vals: Vec<f32> = (0..n).map(|k| finite[k % finite.len()]).collect();
                let mut bytes = vec![7u8];
                bytes.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
                let mut out = vec![9.0f32; n + 1];
                assert!(copy(&bytes[1..], &mut out[..n]), "{name}, {n}");
                let same = out[..n]
                    .iter()
                    .zip(&vals)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same && out[n] == 9.0, "{name}, {n}: copied wrong");
                for at in 0..n {
                    let bad = odd[at % odd.len()];
                    let mut with = vals.clone();
                    with[at] = bad;
                    let mut bytes = vec![7u8];
                    bytes.extend(with.iter().flat_map(|v| v.to_le_bytes()));
                    assert!(!copy(&bytes[1..], &mut out[..n]), "{name}, {n}, at {at}");
                    assert_eq!(out[at].to_bits(), bad.to_bits(), "{name}, {n}, at {at}");
                    assert_eq!(out[n], 9.0);
                }
            }
        }
    }

    #[test]
    fn label_rows_widen_and_reversed_rows_equal_rows_reversed() {
        for n in 0..=70usize {
            let vals: Vec<f32> = (0..n).map(|k| k as f32 * 1.25 - 9.0).collect();
            let mut bytes = vec![7u8];
            bytes.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
            let mut want = vec![0f32; n];
            assert!(f32::convert_row(
                StoredDtype::Float32,
                &bytes[1..],
                &mut want
            ));
            want.reverse();
            let mut got = vec![5f32; n + 1];
            assert!(f32::convert_row_reversed(
                StoredDtype::Float32,
                &bytes[1..],
                &mut got[..n]
            ));
            assert_eq!(&got[..n], &want[..], "f32, {n}");
            assert_eq!(got[n], 5.0, "f32, {n}: written past the row");
            for at in 0..n {
                let mut with = vals.clone();
                with[at] = if at % 2 == 0 { f32::NAN } else { f32::INFINITY };
                let mut bytes = vec![7u8];
                bytes.extend(with.iter().flat_map(|v| v.to_le_bytes()));
                assert!(
                    !f32::convert_row_reversed(StoredDtype::Float32, &bytes[1..], &mut got[..n]),
                    "f32, {n}, at {at}"
                );
                assert_eq!(got[n - 1 - at].to_bits(), with[at].to_bits());
            }
            let labels: Vec<u8> = (0..n).map(|k| (k * 37 % 251) as u8).collect();
            let mut want = vec![0u16; n];
            u16::convert_row(StoredDtype::Uint8, &labels, &mut want);
            assert!(
                want.iter().zip(&labels).all(|(&w, &l)| w == l as u16),
                "u16, {n}"
            );
            want.reverse();
            let mut got = vec![9u16; n + 1];
            u16::convert_row_reversed(StoredDtype::Uint8, &labels, &mut got[..n]);
            assert_eq!(&got[..n], &want[..], "u16 from u8, {n}");
            assert_eq!(got[n], 9, "u16, {n}: written past the row");
        }
    }
}
