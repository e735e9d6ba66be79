//! The values the direct passes read and store: f32 or bf16 tensors, rounded to bf16 where the
//! kernels multiply in bf16, whole rows converted a vector at a time where the CPU can.

use half::bf16;

/// A source value as a ring slot or a row of the passes holds it (`T`): as it is, rounded to
/// bf16 (round to nearest even) or widened.
pub trait Cast<T>: Copy {
    /// One value.
    fn cast(self) -> T;

    /// `dst[j] = src[j].cast()` for rows of the same length.
    fn cast_row(src: &[Self], dst: &mut [T]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.cast();
        }
    }
}

impl Cast<f32> for f32 {
    fn cast(self) -> f32 {
        self
    }

    fn cast_row(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
}

impl Cast<bf16> for bf16 {
    fn cast(self) -> bf16 {
        self
    }

    fn cast_row(src: &[Self], dst: &mut [bf16]) {
        dst.copy_from_slice(src)
    }
}

impl Cast<f32> for bf16 {
    fn cast(self) -> f32 {
        self.to_f32()
    }

    #[cfg(target_arch = "x86_64")]
    fn cast_row(src: &[Self], dst: &mut [f32]) {
        super::bf16::widen_row(src, dst)
    }
}

impl Cast<bf16> for f32 {
    fn cast(self) -> bf16 {
        bf16::from_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    fn cast_row(src: &[Self], dst: &mut [bf16]) {
        super::bf16::round_row(src, dst)
    }
}

/// A value the bf16 kernels multiply: bf16 as it is, f32 rounded to bf16 as it is read.
pub trait Operand: Copy + Sync + Cast<bf16> + Cast<f32> {
    /// The value as the kernels multiply it.
    fn bf16(self) -> bf16 {
        self.cast()
    }

    /// `out[2j] = a[j]` and `out[2j + 1] = b[j]` (zero without `b`) as bf16: two source
    /// channels side by side, as the forward kernels read them.
    fn interleave(a: &[Self], b: Option<&[Self]>, out: &mut [bf16]) {
        interleave_scalar(a, b, out)
    }
}

/// [`Operand::interleave`] one value at a time.
pub(super) fn interleave_scalar<S: Operand>(a: &[S], b: Option<&[S]>, out: &mut [bf16]) {
    for (j, &v) in a.iter().enumerate() {
        out[2 * j] = v.bf16();
        out[2 * j + 1] = b.map_or(bf16::ZERO, |b| b[j].bf16());
    }
}

impl Operand for bf16 {}

impl Operand for f32 {
    #[cfg(target_arch = "x86_64")]
    fn interleave(a: &[Self], b: Option<&[Self]>, out: &mut [bf16]) {
        super::bf16::interleave_f32(a, b, out)
    }
}

/// What a pass stores: its f32 sums as they are, or rounded to bf16.
pub trait Output: Copy + Default + Send + Sync {
    /// A row of stored values from their sums (`dst` as long as `row`).
    fn of_sums(row: &[f32], dst: &mut [Self]);
}

impl Output for bf16 {
    fn of_sums(row: &[f32], dst: &mut [Self]) {
        f32::cast_row(row, dst)
    }
}

impl Output for f32 {
    fn of_sums(row: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(row)
    }
}

/// `row`'s sums stored from `dst` on.
///
/// # Safety
/// `dst` points at `row.len()` values that nothing else touches during the call.
pub(super) unsafe fn store_row<O: Output>(dst: *mut O, row: &[f32]) {
    O::of_sums(row, std::slice::from_raw_parts_mut(dst, row.len()))
}

#[cfg(test)]
mod tests {
    use super::Cast;
    use crate::util::rng::Rng;

    /// Rows rounded to bf16 a vector at a time equal `bf16::from_f32` of each value (ties to even,
    /// the largest finite values, rows with a tail shorter than a vector).
    #[test]
    fn rows_rounded_to_bf16_equal_rounding_each_value() {
        let mut rng = Rng::new(40);
        let mut src: Vec<f32> = (0..53).map(|_| rng.normal() as f32).collect();
        src.extend([
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            -0.0,
            f32::MAX,
            3.0e38,
            -2.5e-30,
        ]);
        for len in [0, 5, 16, 17, src.len()] {
            let mut got = vec![half::bf16::ZERO; len];
            f32::cast_row(&src[..len], &mut got);
            let want: Vec<_> = src[..len]
                .iter()
                .map(|&v| half::bf16::from_f32(v))
                .collect();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{len} values"
            );
        }
    }

    /// Rows of bf16 widened a vector at a time equal `bf16::to_f32` of each value (signed zeros,
    /// infinities, subnormals, rows with a tail shorter than a vector).
    #[test]
    fn rows_widened_from_bf16_equal_widening_each_value() {
        let mut rng = Rng::new(41);
        let mut src: Vec<half::bf16> = (0..53)
            .map(|_| half::bf16::from_f32(rng.normal() as f32))
            .collect();
        src.extend(
            [0x8000u16, 0x7f80, 0xff80, 0x0001, 0x807f, 0x7f7f]
                .into_iter()
                .map(half::bf16::from_bits),
        );
        for len in [0, 5, 16, 17, src.len()] {
            let mut got = vec![1f32; len];
            half::bf16::cast_row(&src[..len], &mut got);
            assert!(
                got.iter()
                    .zip(&src[..len])
                    .all(|(a, b)| a.to_bits() == b.to_f32().to_bits()),
                "{len} values"
            );
        }
    }
}
