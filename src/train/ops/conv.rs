//! The CPU convolution family as candle custom ops. Forward, input gradient and weight
//! gradient are each a blocked "gather columns, then one matrix product"; each op's backward is
//! expressed with the other two, so gradients (even second order) flow through any of them.
//! The transposed convolution of the up path is exactly the input gradient of a convolution
//! whose kernel equals its stride.

use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::blocks::BlockPlan;
use super::columns::ColumnGather;
use super::geometry::ConvGeom;
use super::matmul::{matmul, SharedOut, View};

/// The contiguous f32 data of a custom-op argument (callers make arguments contiguous).
fn f32_data<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    expect: &[usize],
    what: &str,
) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        bail!("{what}: only f32 tensors are supported")
    };
    if layout.dims() != expect {
        bail!("{what}: shape {:?}, expected {expect:?}", layout.dims());
    }
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("{what}: argument must be contiguous"),
    }
}

/// `y = conv3d(x, w)`: columns of `x` per block of output rows, times `w` as (Cout x Cin*k^3).
pub fn forward_cpu(g: &ConvGeom, x: &[f32], w: &[f32]) -> Vec<f32> {
    let gather = ColumnGather::forward(g);
    let k = gather.rows();
    let (grid_rows, row_len) = gather.grid_rows();
    let (vi, vo) = (g.input_voxels(), g.output_voxels());
    let plan = BlockPlan::new(g.batch, grid_rows, row_len, k);
    let mut y = vec![0f32; g.batch * g.cout * vo];
    let out = SharedOut(y.as_mut_ptr());
    plan.run(
        || (),
        |ws, _, b, par| {
            let cols = (b.r1 - b.r0) * row_len;
            gather.fill(&x[b.n * g.cin * vi..][..g.cin * vi], b.r0, b.r1, ws);
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

/// `dx` from `dy`: columns of `dy` over the input grid, times `w` as (Cin x Cout*k^3).
pub fn grad_input_cpu(g: &ConvGeom, dy: &[f32], w: &[f32]) -> Vec<f32> {
    if g.is_non_overlapping() {
        return scatter_grad_input_cpu(g, dy, w);
    }
    let gather = ColumnGather::grad_input(g);
    let k = gather.rows();
    let taps = g.taps();
    // (Cout, Cin, taps) -> (Cin, Cout, taps): the row order the columns use.
    let mut wt = vec![0f32; w.len()];
    for co in 0..g.cout {
        for ci in 0..g.cin {
            let src = &w[(co * g.cin + ci) * taps..][..taps];
            wt[(ci * g.cout + co) * taps..][..taps].copy_from_slice(src);
        }
    }
    let (grid_rows, row_len) = gather.grid_rows();
    let (vi, vo) = (g.input_voxels(), g.output_voxels());
    let plan = BlockPlan::new(g.batch, grid_rows, row_len, k);
    let mut dx = vec![0f32; g.batch * g.cin * vi];
    let out = SharedOut(dx.as_mut_ptr());
    plan.run(
        || (),
        |ws, _, b, par| {
            let cols = (b.r1 - b.r0) * row_len;
            gather.fill(&dy[b.n * g.cout * vo..][..g.cout * vo], b.r0, b.r1, ws);
            // SAFETY: block (n, r0..r1) writes only its own columns of sample n's planes.
            unsafe {
                let dst = out.at(b.n * g.cin * vi + b.r0 * row_len);
                let lhs = View::rows(wt.as_ptr(), k);
                matmul(
                    g.cin,
                    cols,
                    k,
                    dst,
                    vi,
                    false,
                    lhs,
                    View::rows(ws.as_ptr(), cols),
                    par,
                );
            }
        },
    );
    dx
}

/// Kernel == stride, no padding: every input voxel gets exactly one (output voxel, tap)
/// contribution, so compute the per-tap products densely and place them (no zero columns).
fn scatter_grad_input_cpu(g: &ConvGeom, dy: &[f32], w: &[f32]) -> Vec<f32> {
    let taps = g.taps();
    let rows = g.cin * taps;
    let [od, oh, ow] = g.output;
    let [_, ih, iw] = g.input;
    let [kd, kh, kw] = g.kernel;
    let (vi, vo) = (g.input_voxels(), g.output_voxels());
    let plan = BlockPlan::new(g.batch, od * oh, ow, rows);
    let mut dx = vec![0f32; g.batch * g.cin * vi];
    let out = SharedOut(dx.as_mut_ptr());
    plan.run(
        || (),
        |ws, _, b, par| {
            let cols = (b.r1 - b.r0) * ow;
            // ws[(ci, t), col] = sum_co w[co, ci, t] * dy[co, col]
            // SAFETY: the views stay inside w, dy and the workspace.
            unsafe {
                let lhs = View {
                    ptr: w.as_ptr(),
                    rs: 1,
                    cs: rows as isize,
                };
                let rhs = View::rows(dy.as_ptr().add(b.n * g.cout * vo + b.r0 * ow), vo);
                matmul(
                    rows,
                    cols,
                    g.cout,
                    ws.as_mut_ptr(),
                    cols,
                    false,
                    lhs,
                    rhs,
                    par,
                );
            }
            for ci in 0..g.cin {
                for (t, tap_row) in ws[ci * taps * cols..][..taps * cols]
                    .chunks_exact(cols)
                    .enumerate()
                {
                    let (td, th, tw) = (t / (kh * kw), (t / kw) % kh, t % kw);
                    for (r, src) in (b.r0..b.r1).zip(tap_row.chunks_exact(ow)) {
                        let (d, h) = ((r / oh) * kd + td, (r % oh) * kh + th);
                        let base = b.n * g.cin * vi + ci * vi + (d * ih + h) * iw + tw;
                        for (o, &v) in src.iter().enumerate() {
                            // SAFETY: distinct blocks own distinct output rows, hence distinct
                            // input voxels (kernel == stride); the index is inside dx.
                            unsafe { *out.at(base + o * kw) = v };
                        }
                    }
                }
            }
        },
    );
    dx
}

/// `dw` from `x` and `dy`: sum over blocks of dy (Cout x cols) @ columns(x)^T (cols x Cin*k^3).
pub fn grad_weight_cpu(g: &ConvGeom, x: &[f32], dy: &[f32]) -> Vec<f32> {
    let gather = ColumnGather::forward(g);
    let k = gather.rows();
    let (grid_rows, row_len) = gather.grid_rows();
    let (vi, vo) = (g.input_voxels(), g.output_voxels());
    let plan = BlockPlan::new(g.batch, grid_rows, row_len, k);
    let partials = plan.run(
        || vec![0f32; g.cout * k],
        |ws, acc, b, par| {
            let cols = (b.r1 - b.r0) * row_len;
            gather.fill(&x[b.n * g.cin * vi..][..g.cin * vi], b.r0, b.r1, ws);
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

/// `conv3d(x, w)`, arguments (x, w).
pub struct Conv3dForward(pub ConvGeom);
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
        let x = f32_data(s1, l1, &g.x_dims(), "conv3d x")?;
        let w = f32_data(s2, l2, &g.w_dims(), "conv3d w")?;
        Ok((
            CpuStorage::F32(forward_cpu(g, x, w)),
            Shape::from(g.y_dims().to_vec()),
        ))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        let dx = dy.apply_op2(w, Conv3dGradInput(self.0))?;
        let dw = x.apply_op2(&dy, Conv3dGradWeight(self.0))?;
        Ok((Some(dx), Some(dw)))
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
        let dy = f32_data(s1, l1, &g.y_dims(), "conv3d grad-input dy")?;
        let w = f32_data(s2, l2, &g.w_dims(), "conv3d grad-input w")?;
        Ok((
            CpuStorage::F32(grad_input_cpu(g, dy, w)),
            Shape::from(g.x_dims().to_vec()),
        ))
    }

    // dx = A(w) dy is linear in each argument: its adjoints are the forward conv (for dy) and
    // the weight gradient with the roles of x and dy taken by the upstream gradient and dy.
    fn bwd(
        &self,
        dy: &Tensor,
        w: &Tensor,
        _dx: &Tensor,
        up: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let up = up.contiguous()?;
        let d_dy = up.apply_op2(w, Conv3dForward(self.0))?;
        let d_w = up.apply_op2(dy, Conv3dGradWeight(self.0))?;
        Ok((Some(d_dy), Some(d_w)))
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
        let x = f32_data(s1, l1, &g.x_dims(), "conv3d grad-weight x")?;
        let dy = f32_data(s2, l2, &g.y_dims(), "conv3d grad-weight dy")?;
        Ok((
            CpuStorage::F32(grad_weight_cpu(g, x, dy)),
            Shape::from(g.w_dims().to_vec()),
        ))
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
