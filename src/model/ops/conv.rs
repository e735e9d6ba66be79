//! The CPU convolution family as candle custom ops. Forward, input gradient and weight
//! gradient are each computed from the input planes where the direct passes apply, else a
//! blocked "gather columns, then one matrix product"; each op's backward is expressed with the
//! other two, so gradients (even second order) flow through any of them.
//! The transposed convolution of the up path is exactly the input gradient of a convolution
//! whose kernel equals its stride.

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use half::bf16;

use super::blocks::BlockPlan;
use super::columns::{ColumnGather, Planes};
use super::direct;
use super::geometry::{ConvGeom, Products};
use super::matmul::{matmul, SharedOut, View};
use super::tape::Grads2;

/// The contiguous data of a custom-op argument (callers make arguments contiguous).
fn slice<'a, T>(data: &'a [T], layout: &Layout, expect: &[usize], what: &str) -> Result<&'a [T]> {
    if layout.dims() != expect {
        bail!("{what}: shape {:?}, expected {expect:?}", layout.dims());
    }
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("{what}: argument must be contiguous"),
    }
}

/// The contiguous f32 data of a custom-op argument.
pub(super) fn f32_data<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    expect: &[usize],
    what: &str,
) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        bail!("{what}: only f32 and bf16 tensors are supported")
    };
    slice(data, layout, expect, what)
}

/// The three passes of one convolution on its two arguments (`a`, `b`) with the shapes
/// `ea`, `eb`: f32 as they are; bf16 through the bf16 direct kernels where this CPU has them
/// and they apply, else through the f32 pass on the widened values, rounded once.
#[allow(clippy::too_many_arguments)]
fn either_precision(
    (s1, l1, ea): (&CpuStorage, &Layout, [usize; 5]),
    (s2, l2, eb): (&CpuStorage, &Layout, [usize; 5]),
    out: [usize; 5],
    what: &str,
    f32_pass: impl Fn(&[f32], &[f32]) -> Vec<f32>,
    bf16_pass: impl Fn(&[bf16], &[bf16]) -> Option<Vec<bf16>>,
) -> Result<(CpuStorage, Shape)> {
    let shape = Shape::from(out.to_vec());
    match (s1, s2) {
        (CpuStorage::BF16(a), CpuStorage::BF16(b)) => {
            let (a, b) = (slice(a, l1, &ea, what)?, slice(b, l2, &eb, what)?);
            let y = bf16_pass(a, b).unwrap_or_else(|| {
                let widen = |v: &[bf16]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
                f32_pass(&widen(a), &widen(b))
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect()
            });
            Ok((CpuStorage::BF16(y), shape))
        }
        _ => {
            let a = f32_data(s1, l1, &ea, what)?;
            let b = f32_data(s2, l2, &eb, what)?;
            Ok((CpuStorage::F32(f32_pass(a, b)), shape))
        }
    }
}

/// `y = conv3d(x, w)`: columns of `x` per block of output rows, times `w` as (Cout x Cin*k^3).
pub fn forward_cpu(g: &ConvGeom, x: &[f32], w: &[f32]) -> Vec<f32> {
    let vi = g.input_voxels();
    forward_planes(
        g,
        |n| Planes::one(&x[n * g.cin * vi..][..g.cin * vi], vi),
        w,
    )
}

/// `y = conv3d(cat([a, b], 1), w)` without the concatenation: the column blocks read the
/// channels of `a`, then those of `b` (`g.cin` channels in all), so the result is
/// [`forward_cpu`]'s of the concatenation bit for bit.
pub fn forward_pair_cpu(g: &ConvGeom, a: &[f32], b: &[f32], w: &[f32]) -> Vec<f32> {
    let vi = g.input_voxels();
    let (ca, cb) = (a.len() / (g.batch * vi), b.len() / (g.batch * vi));
    forward_planes(
        g,
        |n| {
            Planes::two(
                &a[n * ca * vi..][..ca * vi],
                &b[n * cb * vi..][..cb * vi],
                vi,
            )
        },
        w,
    )
}

/// The forward convolution of the sources `sample(n)` gives for each sample.
fn forward_planes<'a>(
    g: &ConvGeom,
    sample: impl Fn(usize) -> Planes<'a> + Sync,
    w: &[f32],
) -> Vec<f32> {
    if g.products == Products::Bf16 {
        if let Some(y) = direct::forward_bf16_products(g, &sample, w) {
            return y;
        }
    }
    if direct::reads_directly(g) {
        return direct::forward(g, sample, w);
    }
    let gather = ColumnGather::forward(g);
    let k = gather.rows();
    let (grid_rows, row_len) = gather.grid_rows();
    let vo = g.output_voxels();
    let plan = BlockPlan::new(g.batch, grid_rows, row_len, k);
    let mut y = vec![0f32; g.batch * g.cout * vo];
    let out = SharedOut(y.as_mut_ptr());
    plan.run(
        || (),
        |ws, _, b, par| {
            let cols = (b.r1 - b.r0) * row_len;
            gather.fill(sample(b.n), b.r0, b.r1, ws);
            // SAFETY: block (n, r0..r1) writes only its own columns of sample n's planes.
            unsafe {
                let dst = out.at(b.n * g.cout * vo + b.r0 * row_len);
                let lhs = View::rows(w.as_ptr(), k);
                matmul(
                    g.cout,
                    cols,
                    k,
                    dst,
                    vo,
                    false,
                    lhs,
                    View::rows(ws.as_ptr(), cols),
                    par,
                );
            }
        },
    );
    y
}

/// `dx` from `dy`. Per stride phase (input voxels `r + j * stride`) only some taps reach an
/// output, so each phase is a stride-1 gather of `dy` times `w` as (Cin x Cout*taps kept):
/// no multiplications by the zeros a plain transposed im2col would insert.
pub fn grad_input_cpu(g: &ConvGeom, dy: &[f32], w: &[f32]) -> Vec<f32> {
    if g.is_non_overlapping() {
        return scatter_grad_input_cpu(g, dy, w);
    }
    if g.products == Products::Bf16 {
        if let Some(dx) = direct::grad_input_bf16_products(g, dy, w) {
            return dx;
        }
    }
    if direct::applies(g) {
        return direct::grad_input(g, dy, w);
    }
    if direct::reads_directly(g) {
        if let Some(dx) = direct::grad_input_strided(g, dy, w) {
            return dx;
        }
    }
    let (vi, vo) = (g.input_voxels(), g.output_voxels());
    let [_, ih, iw] = g.input;
    let [sd, sh, sw] = g.stride;
    let direct = g.stride == [1; 3];
    let mut dx = vec![0f32; g.batch * g.cin * vi];
    let out = SharedOut(dx.as_mut_ptr());
    for r in (0..sd * sh * sw).map(|i| [i / (sh * sw), (i / sw) % sh, i % sw]) {
        let Some((gather, taps)) = ColumnGather::grad_input_phase(g, r) else {
            continue; // no tap reaches these voxels: their gradient stays zero
        };
        let k = gather.rows();
        let wt = phase_weights(g, w, &taps);
        let (grid_rows, row_len) = gather.grid_rows();
        let grid_h = grid_rows / gather.grid_rows_d().max(1);
        let extra = if direct { 0 } else { g.cin };
        let plan = BlockPlan::new(g.batch, grid_rows, row_len, k + extra);
        plan.run(
            || (),
            |ws, _, b, par| {
                let cols = (b.r1 - b.r0) * row_len;
                let (col, tmp) = ws.split_at_mut(k * cols);
                let src = Planes::one(&dy[b.n * g.cout * vo..][..g.cout * vo], vo);
                gather.fill(src, b.r0, b.r1, col);
                let lhs = View::rows(wt.as_ptr(), k);
                let rhs = View::rows(col.as_ptr(), cols);
                if direct {
                    // SAFETY: block (n, r0..r1) writes only its own columns of sample n.
                    unsafe {
                        let dst = out.at(b.n * g.cin * vi + b.r0 * row_len);
                        matmul(g.cin, cols, k, dst, vi, false, lhs, rhs, par);
                    }
                    return;
                }
                // SAFETY: tmp holds cin x cols floats (the plan counted them).
                unsafe { matmul(g.cin, cols, k, tmp.as_mut_ptr(), cols, false, lhs, rhs, par) };
                for (ci, plane) in tmp[..g.cin * cols].chunks_exact(cols).enumerate() {
                    for (row, src) in (b.r0..b.r1).zip(plane.chunks_exact(row_len)) {
                        let (zd, zh) = (r[0] + (row / grid_h) * sd, r[1] + (row % grid_h) * sh);
                        let base = (b.n * g.cin + ci) * vi + (zd * ih + zh) * iw + r[2];
                        for (j, &v) in src.iter().enumerate() {
                            // SAFETY: phases and blocks own disjoint input voxels.
                            unsafe { *out.at(base + j * sw) = v };
                        }
                    }
                }
            },
        );
    }
    dx
}

/// `w` (Cout, Cin, kd, kh, kw) as (Cin x Cout*taps), keeping only the listed taps per axis, in
/// the row order of the input-gradient columns.
fn phase_weights(g: &ConvGeom, w: &[f32], taps: &[Vec<usize>; 3]) -> Vec<f32> {
    let [_, kh, kw] = g.kernel;
    let kept = taps.iter().map(Vec::len).product::<usize>();
    let mut wt = Vec::with_capacity(g.cin * g.cout * kept);
    for ci in 0..g.cin {
        for co in 0..g.cout {
            let filter = &w[(co * g.cin + ci) * g.taps()..][..g.taps()];
            for &td in &taps[0] {
                for &th in &taps[1] {
                    wt.extend(taps[2].iter().map(|&tw| filter[(td * kh + th) * kw + tw]));
                }
            }
        }
    }
    wt
}

/// Kernel == stride, no padding: every input voxel gets exactly one (output voxel, tap)
/// contribution: the transposed convolution of the up path, plane by plane.
fn scatter_grad_input_cpu(g: &ConvGeom, dy: &[f32], w: &[f32]) -> Vec<f32> {
    let up = direct::Upsampling {
        low: dy,
        low_ch: g.cout,
        low_size: g.output,
        weight: w,
        up_ch: g.cin,
        stride: g.stride,
        bias: None,
    };
    direct::transpose(&up, g.batch, g.input)
}

/// `dw` from `x` and `dy`: sum over blocks of dy (Cout x cols) @ columns(x)^T (cols x Cin*k^3).
pub fn grad_weight_cpu(g: &ConvGeom, x: &[f32], dy: &[f32]) -> Vec<f32> {
    if g.products == Products::Bf16 {
        if let Some(dw) = direct::grad_weight_bf16_products(g, x, dy) {
            return dw;
        }
    }
    if direct::reads_directly(g) {
        if let Some(dw) = direct::grad_weight(g, x, dy) {
            return dw;
        }
    }
    let gather = ColumnGather::forward(g);
    let k = gather.rows();
    let (grid_rows, row_len) = gather.grid_rows();
    let (vi, vo) = (g.input_voxels(), g.output_voxels());
    let plan = BlockPlan::new(g.batch, grid_rows, row_len, k);
    let partials = plan.run(
        || vec![0f32; g.cout * k],
        |ws, acc, b, par| {
            let cols = (b.r1 - b.r0) * row_len;
            gather.fill(
                Planes::one(&x[b.n * g.cin * vi..][..g.cin * vi], vi),
                b.r0,
                b.r1,
                ws,
            );
            // SAFETY: acc is this worker's own (Cout x k) buffer; views stay inside dy / ws.
            unsafe {
                let lhs = View::rows(dy.as_ptr().add(b.n * g.cout * vo + b.r0 * row_len), vo);
                let rhs = View::transposed(ws.as_ptr(), cols);
                matmul(g.cout, k, cols, acc.as_mut_ptr(), k, true, lhs, rhs, par);
            }
        },
    );
    let mut partials = partials.into_iter();
    let mut dw = partials.next().unwrap_or_else(|| vec![0f32; g.cout * k]);
    for p in partials {
        dw.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
    }
    dw
}

/// One cuDNN convolution pass on two device arguments with the shapes `e1`, `e2`.
#[cfg(feature = "cuda")]
fn cuda_conv(
    pass: super::cuda::conv::Pass,
    g: &ConvGeom,
    (s1, l1, e1): (&candle_core::CudaStorage, &Layout, [usize; 5]),
    (s2, l2, e2): (&candle_core::CudaStorage, &Layout, [usize; 5]),
    out_dims: [usize; 5],
) -> Result<(candle_core::CudaStorage, Shape)> {
    for (l, e) in [(l1, e1), (l2, e2)] {
        if l.dims() != e {
            bail!("{pass:?}: shape {:?}, expected {e:?}", l.dims());
        }
    }
    let out = super::cuda::conv::run(pass, g, (s1, l1), (s2, l2))?;
    Ok((out, Shape::from(out_dims.to_vec())))
}

/// `conv3d(x, w)`, arguments (x, w).
pub struct Conv3dForward(pub ConvGeom);
/// `conv3d(cat([a, b], 1), w)` without building the concatenation, arguments (a, b, w), CPU
/// only and without a backward pass: for passes that record no graph.
pub struct Conv3dForwardPair(pub ConvGeom);
/// Input gradient of a convolution, arguments (dy, w); also the transposed convolution.
pub struct Conv3dGradInput(pub ConvGeom);
/// Weight gradient of a convolution, arguments (x, dy).
pub struct Conv3dGradWeight(pub ConvGeom);

impl CustomOp2 for Conv3dForward {
    fn name(&self) -> &'static str {
        "conv3d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.0;
        either_precision(
            (s1, l1, g.x_dims()),
            (s2, l2, g.w_dims()),
            g.y_dims(),
            "conv3d",
            |x, w| forward_cpu(g, x, w),
            |x, w| direct::forward_bf16(g, x, w, None),
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let g = &self.0;
        use super::cuda::conv::Pass;
        cuda_conv(
            Pass::Forward,
            g,
            (s1, l1, g.x_dims()),
            (s2, l2, g.w_dims()),
            g.y_dims(),
        )
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // The network's input image needs no gradient: skip that whole-volume product.
        self.grads(x, w, dy, [x.track_op(), w.track_op()])
    }
}

/// `op(a, w) + b[c]` on the CPU (see [`WithBias`]).
pub(super) fn with_bias_cpu<O: CustomOp2 + BiasedBf16>(
    op: &O,
    (s1, l1): (&CpuStorage, &Layout),
    (s2, l2): (&CpuStorage, &Layout),
    b: &[f32],
) -> Result<(CpuStorage, Shape)> {
    if let Some(fused) = op.biased_bf16((s1, l1), (s2, l2), b)? {
        return Ok(fused);
    }
    let (y, shape) = op.cpu_fwd(s1, l1, s2, l2)?;
    let (_, c, v) = super::bias::rows(shape.dims());
    if b.len() != c {
        bail!("{}: a bias of {} for {c} channels", op.name(), b.len());
    }
    let y = match y {
        CpuStorage::F32(mut y) => {
            super::bias::add_rows(&mut y, b, c, v);
            CpuStorage::F32(y)
        }
        CpuStorage::BF16(mut y) => {
            super::bias::add_rows_bf16(&mut y, b, c, v);
            CpuStorage::BF16(y)
        }
        _ => bail!("{}: f32 or bf16 tensors only", op.name()),
    };
    Ok((y, shape))
}

/// An op whose bf16 pass can add an f32 bias to its sums before their one rounding.
pub trait BiasedBf16 {
    /// The result on bf16 arguments with `b` added, where the bf16 kernels compute it (None:
    /// the caller adds `b` to the rounded result).
    fn biased_bf16(
        &self,
        _a: (&CpuStorage, &Layout),
        _w: (&CpuStorage, &Layout),
        _b: &[f32],
    ) -> Result<Option<(CpuStorage, Shape)>> {
        Ok(None)
    }
}

impl BiasedBf16 for Conv3dForward {
    fn biased_bf16(
        &self,
        (s1, l1): (&CpuStorage, &Layout),
        (s2, l2): (&CpuStorage, &Layout),
        b: &[f32],
    ) -> Result<Option<(CpuStorage, Shape)>> {
        let g = &self.0;
        let (CpuStorage::BF16(x), CpuStorage::BF16(w)) = (s1, s2) else {
            return Ok(None);
        };
        let (x, w) = (
            slice(x, l1, &g.x_dims(), "conv3d")?,
            slice(w, l2, &g.w_dims(), "conv3d")?,
        );
        let shape = Shape::from(g.y_dims().to_vec());
        Ok(direct::forward_bf16(g, x, w, Some(b)).map(|y| (CpuStorage::BF16(y), shape)))
    }
}

/// The transposed convolution's bf16 result is rounded, then gets its bias.
impl BiasedBf16 for Conv3dGradInput {}

/// A two-argument op (the convolution, or the transposed one) followed by `+ b[c]`, in one
/// op, arguments (x, w, b), on the CPU: a training graph keeps one tensor instead of two (the
/// op's output, which the bias op's node held, and the sum), with the same values and
/// gradients bit for bit. On bf16 `x` and `w` (a bf16 training pass; `b` stays f32) the bf16
/// kernels add the bias to the sums before their one rounding; where they do not run, the
/// rounded result gets the bias in f32 and is rounded again. No f32 tensor of the result's
/// size either way. The inner op's backward must not read its result.
pub struct WithBias<O>(pub O);

impl<O: Grads2> WithBias<O> {
    /// The gradients (dx, dw, db) where `need`ed, from the result's gradient `dy`.
    pub(super) fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        [need_x, need_w, need_b]: [bool; 3],
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = self.0.grads(x, w, dy, [need_x, need_w])?;
        let db = match need_b {
            true => Some(
                dy.contiguous()?
                    .apply_op1_no_bwd(&super::bias::ChannelSum)?,
            ),
            false => None,
        };
        Ok((dx, dw, db))
    }
}

impl<O: CustomOp2 + BiasedBf16 + Grads2 + Send + Sync> CustomOp3 for WithBias<O> {
    fn name(&self) -> &'static str {
        "conv-with-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let c = l3.dims().first().copied().unwrap_or(0);
        let b = f32_data(s3, l3, &[c], "the bias")?;
        with_bias_cpu(&self.0, (s1, l1), (s2, l2), b)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        self.grads(x, w, dy, [x.track_op(), w.track_op(), b.track_op()])
    }
}

impl CustomOp3 for Conv3dForwardPair {
    fn name(&self) -> &'static str {
        "conv3d-pair"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.0;
        let [n, cin, d, h, w] = g.x_dims();
        let ca = l1.dims().get(1).copied().unwrap_or(0);
        let a = f32_data(s1, l1, &[n, ca, d, h, w], "conv3d pair a")?;
        let b = f32_data(
            s2,
            l2,
            &[n, cin.saturating_sub(ca), d, h, w],
            "conv3d pair b",
        )?;
        let wt = f32_data(s3, l3, &g.w_dims(), "conv3d pair w")?;
        Ok((
            CpuStorage::F32(forward_pair_cpu(g, a, b, wt)),
            Shape::from(g.y_dims().to_vec()),
        ))
    }
}

impl CustomOp2 for Conv3dGradInput {
    fn name(&self) -> &'static str {
        "conv3d-grad-input"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.0;
        either_precision(
            (s1, l1, g.y_dims()),
            (s2, l2, g.w_dims()),
            g.x_dims(),
            "conv3d grad-input",
            |dy, w| grad_input_cpu(g, dy, w),
            |dy, w| match g.is_non_overlapping() {
                true => None,
                false => direct::grad_input_bf16(g, dy, w),
            },
        )
    }

    // dx = A(w) dy is linear in each argument: its adjoints are the forward conv (for dy) and
    // the weight gradient with the roles of x and dy taken by the upstream gradient and dy.
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let g = &self.0;
        use super::cuda::conv::Pass;
        cuda_conv(
            Pass::GradInput,
            g,
            (s1, l1, g.y_dims()),
            (s2, l2, g.w_dims()),
            g.x_dims(),
        )
    }

    fn bwd(
        &self,
        dy: &Tensor,
        w: &Tensor,
        _dx: &Tensor,
        up: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        self.grads(dy, w, up, [true, true])
    }
}

impl CustomOp2 for Conv3dGradWeight {
    fn name(&self) -> &'static str {
        "conv3d-grad-weight"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.0;
        either_precision(
            (s1, l1, g.x_dims()),
            (s2, l2, g.y_dims()),
            g.w_dims(),
            "conv3d grad-weight",
            |x, dy| grad_weight_cpu(g, x, dy),
            |x, dy| {
                let dw = direct::grad_weight_bf16(g, x, dy)?;
                Some(dw.into_iter().map(bf16::from_f32).collect())
            },
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let g = &self.0;
        use super::cuda::conv::Pass;
        cuda_conv(
            Pass::GradWeight,
            g,
            (s1, l1, g.x_dims()),
            (s2, l2, g.y_dims()),
            g.w_dims(),
        )
    }

    fn bwd(
        &self,
        x: &Tensor,
        dy: &Tensor,
        _dw: &Tensor,
        up: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let up = up.contiguous()?;
        let d_x = dy.apply_op2(&up, Conv3dGradInput(self.0))?;
        let d_dy = x.apply_op2(&up, Conv3dForward(self.0))?;
        Ok((Some(d_x), Some(d_dy)))
    }
}
