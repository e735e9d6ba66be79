//! Device-independent fallbacks built from candle's own differentiable ops: correct
//! everywhere (CUDA included), not fast. The CPU fast paths are tested against them.

use candle_core::{Result, Tensor};

use super::geometry::ConvGeom;

/// `count` slices `start, start + step, ...` of `dim`.
fn strided(t: &Tensor, dim: usize, start: usize, count: usize, step: usize) -> Result<Tensor> {
    if step == 1 {
        return t.narrow(dim, start, count);
    }
    let idx: Vec<u32> = (0..count).map(|i| (start + i * step) as u32).collect();
    t.index_select(&Tensor::new(idx, t.device())?, dim)
}

/// conv3d as a sum over kernel depth of candle conv2d on (N * D_out, Cin, H, W) planes.
/// Padding is applied explicitly and conv2d always runs with stride 1 (then subsampled),
/// because candle's conv2d takes one padding/stride for both axes and its backward assumes so.
pub fn conv3d_generic(
    x: &Tensor,
    w: &Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
) -> Result<Tensor> {
    let g = ConvGeom::new(x.dims(), w.dims(), padding, stride)?;
    let [pd, ph, pw] = padding;
    let [sd, sh, sw] = stride;
    let [od, oh, ow] = g.output;
    let xp = x
        .pad_with_zeros(2, pd, pd)?
        .pad_with_zeros(3, ph, ph)?
        .pad_with_zeros(4, pw, pw)?;
    let (hp, wp) = (g.input[1] + 2 * ph, g.input[2] + 2 * pw);
    let mut sum: Option<Tensor> = None;
    for a in 0..g.kernel[0] {
        let planes = strided(&xp, 2, a, od, sd)?
            .permute((0, 2, 1, 3, 4))?
            .reshape((g.batch * od, g.cin, hp, wp))?;
        let wa = w.narrow(2, a, 1)?.squeeze(2)?.contiguous()?;
        let y = planes.conv2d(&wa, 0, 1, 1, 1)?;
        let y = strided(&strided(&y, 2, 0, oh, sh)?, 3, 0, ow, sw)?;
        sum = Some(match sum {
            None => y,
            Some(s) => (s + y)?,
        });
    }
    let sum = sum.expect("kernel depth is positive (checked by ConvGeom)");
    sum.reshape((g.batch, od, g.cout, oh, ow))?
        .permute((0, 2, 1, 3, 4))?
        .contiguous()
}

/// Transposed convolution with kernel == stride as one matmul and a pixel shuffle.
pub fn conv_transpose3d_generic(x: &Tensor, w: &Tensor, stride: [usize; 3]) -> Result<Tensor> {
    let (n, cin, d, h, wd) = x.dims5()?;
    let (wcin, cout, kd, kh, kw) = w.dims5()?;
    check_transpose(cin, wcin, [kd, kh, kw], stride)?;
    let s: usize = stride.iter().product();
    let wt = w.reshape((cin, cout * s))?.t()?;
    let y = wt.broadcast_matmul(&x.reshape((n, cin, d * h * wd))?)?;
    y.reshape(vec![n, cout, kd, kh, kw, d, h, wd])?
        .permute(vec![0, 1, 5, 2, 6, 3, 7, 4])?
        .reshape((n, cout, d * kd, h * kh, wd * kw))
}

/// Check a transposed convolution's shapes: input and weight channels agree, kernel = stride.
pub fn check_transpose(
    cin: usize,
    wcin: usize,
    kernel: [usize; 3],
    stride: [usize; 3],
) -> Result<()> {
    if cin != wcin {
        candle_core::bail!("conv_transpose3d: x has {cin} channels but w expects {wcin}");
    }
    if kernel != stride || stride.contains(&0) {
        candle_core::bail!(
            "conv_transpose3d: kernel {kernel:?} must equal the (positive) stride {stride:?}"
        );
    }
    Ok(())
}
