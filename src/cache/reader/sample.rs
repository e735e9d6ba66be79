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
pub trait Sample: Copy + Default + Send + Sync + 'static + private::Sealed {
    /// Whether every value of `dtype` converts to `Self` exactly.
    fn accepts(dtype: StoredDtype) -> bool;

    /// Convert one row of stored little-endian elements; `src` holds exactly `dst.len()` of
    /// them and `dtype` is one that [`Sample::accepts`].
    #[doc(hidden)]
    fn convert_row(dtype: StoredDtype, src: &[u8], dst: &mut [Self]);
}

/// The bytes of a slice of plain numbers, to be overwritten.
fn bytes_mut<T: Sample>(dst: &mut [T]) -> &mut [u8] {
    // SAFETY: T is f32, u16 or u8 (the trait is sealed): no padding, and every byte pattern is
    // a valid value; the view covers exactly the slice's memory and borrows it mutably.
    unsafe {
        std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(dst))
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

    fn convert_row(dtype: StoredDtype, src: &[u8], dst: &mut [f32]) {
        match dtype {
            StoredDtype::Float32 => {
                if cfg!(target_endian = "little") {
                    bytes_mut(dst).copy_from_slice(src);
                } else {
                    for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
            }
            StoredDtype::Float16 => f16_row(src, dst),
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
    }
}

impl Sample for u16 {
    fn accepts(dtype: StoredDtype) -> bool {
        matches!(dtype, StoredDtype::Uint8 | StoredDtype::Uint16)
    }

    fn convert_row(dtype: StoredDtype, src: &[u8], dst: &mut [u16]) {
        match dtype {
            StoredDtype::Uint16 if cfg!(target_endian = "little") => {
                bytes_mut(dst).copy_from_slice(src)
            }
            StoredDtype::Uint16 => {
                for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *o = u16::from_le_bytes([c[0], c[1]]);
                }
            }
            _ => {
                for (o, &v) in dst.iter_mut().zip(src) {
                    *o = v as u16;
                }
            }
        }
    }
}

impl Sample for u8 {
    fn accepts(dtype: StoredDtype) -> bool {
        dtype == StoredDtype::Uint8
    }

    fn convert_row(_: StoredDtype, src: &[u8], dst: &mut [u8]) {
        dst.copy_from_slice(src);
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
}
