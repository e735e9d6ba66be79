//! Launching the kernels of `kernels.cu` on a candle CUDA device. Each function takes the
//! contiguous f32 inputs and returns a new device buffer; everything runs on the device's
//! stream, so the kernels of one op, and the ops of one step, run in order.

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{bail, Result};

use crate::model::ops::launch_plan::{
    grid_stride_blocks, one_per_item_blocks, reduction_parts, THREADS,
};

const MODULE: &str = "voxcache_kernels";
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/voxcache_kernels.ptx"));

fn config(grid: (u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernel `name`, loaded once per device (candle keeps the module).
fn kernel(dev: &CudaDevice, name: &str) -> Result<CudaFunction> {
    Ok(dev
        .get_or_load_custom_func(name, MODULE, PTX)?
        .into_cuda_function())
}

/// Launches kernel `$name` on the device's stream over `$grid` blocks with the arguments in
/// the kernel's declared order.
macro_rules! launch {
    ($dev:expr, $name:expr, $grid:expr, [$($arg:expr),* $(,)?]) => {{
        let func = kernel($dev, &$name)?;
        let stream = $dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        $( args.arg($arg); )*
        run(args, $grid)
    }};
}

/// Launches a kernel whose arguments have been pushed.
fn run(mut args: LaunchArgs<'_>, grid: (u32, u32)) -> Result<()> {
    // SAFETY: every kernel's arguments are pushed in its declared order and types by the
    // callers below, and the buffers are sized from the same numbers the kernel indexes with.
    unsafe { args.launch(config(grid)) }.w()?;
    Ok(())
}

/// The element types our kernels are instantiated for (`NAME_f32`, `NAME_bf16`): storage
/// only, arithmetic is f32.
pub trait Element: DeviceRepr + ValidAsZeroBits + Copy {
    /// The kernel name's suffix for this type.
    const SUFFIX: &'static str;
}

impl Element for f32 {
    const SUFFIX: &'static str = "f32";
}

impl Element for half::bf16 {
    const SUFFIX: &'static str = "bf16";
}

/// The instance of kernel `name` for element type `T`.
fn typed<T: Element>(name: &str) -> String {
    format!("{name}_{}", T::SUFFIX)
}

/// Sizes of one group norm application.
#[derive(Clone, Copy, Debug)]
pub struct NormSizes {
    /// Samples.
    pub batch: usize,
    /// Channels of a sample.
    pub channels: usize,
    /// Groups the channels fall in (one channel each for instance norm).
    pub groups: usize,
    /// Voxels of a channel.
    pub voxels: usize,
}

impl NormSizes {
    fn cg(&self) -> i32 {
        (self.channels / self.groups) as i32
    }
    fn numel(&self) -> usize {
        self.batch * self.channels * self.voxels
    }
    fn slabs(&self) -> usize {
        self.batch * self.groups
    }
}

/// (mean, rstd) per (sample, group) slab, as `2 * slabs` floats.
fn slab_stats<T: Element>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    s: NormSizes,
    eps: f64,
) -> Result<CudaSlice<f32>> {
    let (slabs, len) = (s.slabs(), s.numel() / s.slabs());
    let parts = reduction_parts(len, slabs)?;
    let mut partials = dev.alloc_zeros::<f64>(2 * slabs * parts as usize)?;
    let (len_i, parts_i, slabs_i) = (len as i64, parts as i32, slabs as i32);
    launch!(
        dev,
        typed::<T>("slab_moments"),
        (parts, slabs as u32),
        [x, &len_i, &parts_i, &mut partials]
    )?;
    let mut stats = dev.alloc_zeros::<f32>(2 * slabs)?;
    launch!(
        dev,
        typed::<T>("slab_stats"),
        (one_per_item_blocks(slabs), 1),
        [x, &partials, &parts_i, &len_i, &slabs_i, &eps, &mut stats]
    )?;
    Ok(stats)
}

/// The second level of a two-level reduction: each row's `parts` partial pairs summed in
/// order, `2 * rows` values.
fn reduce_rows(
    dev: &CudaDevice,
    partials: &CudaSlice<f64>,
    parts: u32,
    rows: usize,
) -> Result<CudaSlice<f64>> {
    let mut row_sums = dev.alloc_zeros::<f64>(2 * rows)?;
    let (parts_i, rows_i) = (parts as i32, rows as i32);
    launch!(
        dev,
        String::from("rows_reduce"),
        (one_per_item_blocks(rows), 1),
        [partials, &parts_i, &rows_i, &mut row_sums]
    )?;
    Ok(row_sums)
}

/// `LeakyReLU(GroupNorm(x) * w + b)`, the CUDA twin of the CPU op in `norm.rs`.
pub fn norm_forward<T: Element>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
    b: &CudaView<'_, T>,
    s: NormSizes,
    eps: f64,
    slope: f32,
) -> Result<CudaSlice<T>> {
    let n = s.numel();
    let mut y = dev.alloc_zeros::<T>(n)?;
    if n == 0 {
        return Ok(y);
    }
    let stats = slab_stats(dev, x, s, eps)?;
    let (n_i, v_i, c_i, cg) = (n as i64, s.voxels as i64, s.channels as i32, s.cg());
    launch!(
        dev,
        typed::<T>("norm_act_forward"),
        (grid_stride_blocks(n), 1),
        [x, &stats, w, b, &n_i, &v_i, &c_i, &cg, &slope, &mut y]
    )?;
    Ok(y)
}

/// The flat `[dx | dweight | dbias]` of the norm's backward, as the CPU op returns it.
#[allow(clippy::too_many_arguments)]
pub fn norm_backward<T: Element>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    dy: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
    b: &CudaView<'_, T>,
    s: NormSizes,
    eps: f64,
    slope: f32,
) -> Result<CudaSlice<T>> {
    let (n, c) = (s.numel(), s.channels);
    let mut out = dev.alloc_zeros::<T>(n + 2 * c)?;
    if n == 0 {
        return Ok(out);
    }
    let stats = slab_stats(dev, x, s, eps)?;
    let rows = s.batch * c;
    let parts = reduction_parts(s.voxels, rows)?;
    let mut partials = dev.alloc_zeros::<f64>(2 * rows * parts as usize)?;
    let (n_i, v_i, c_i, cg, parts_i) = (n as i64, s.voxels as i64, c as i32, s.cg(), parts as i32);
    launch!(
        dev,
        typed::<T>("norm_act_grad_partials"),
        (parts, rows as u32),
        [
            x,
            dy,
            &stats,
            w,
            b,
            &v_i,
            &c_i,
            &cg,
            &slope,
            &parts_i,
            &mut partials
        ]
    )?;
    let row_sums = reduce_rows(dev, &partials, parts, rows)?;
    let mut coef = dev.alloc_zeros::<f32>(2 * s.slabs())?;
    let mut dparams = out.slice_mut(n..n + 2 * c);
    let batch_i = s.batch as i32;
    let tasks = s.slabs() + c;
    launch!(
        dev,
        typed::<T>("norm_act_grad_coefs"),
        (one_per_item_blocks(tasks), 1),
        [
            &row_sums,
            w,
            &batch_i,
            &c_i,
            &cg,
            &v_i,
            &mut coef,
            &mut dparams
        ]
    )?;
    let mut dx = out.slice_mut(0..n);
    launch!(
        dev,
        typed::<T>("norm_act_grad_input"),
        (grid_stride_blocks(n), 1),
        [x, dy, &stats, &coef, w, b, &n_i, &v_i, &c_i, &cg, &slope, &mut dx]
    )?;
    Ok(out)
}

/// Spatial size and kernel of one max pooling, as the kernels' int arguments.
fn pool_args(size: [usize; 3], k: [usize; 3]) -> Result<[i32; 6]> {
    let all = [size[0], size[1], size[2], k[0], k[1], k[2]];
    if all.iter().any(|&v| v > i32::MAX as usize) {
        bail!("max_pool3d on CUDA: size {size:?} too large");
    }
    Ok(all.map(|v| v as i32))
}

/// Max pooling with kernel == stride over (N, C) planes of `size`; `out_numel` outputs.
pub fn max_pool_forward<T: Element>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    size: [usize; 3],
    k: [usize; 3],
    out_numel: usize,
) -> Result<CudaSlice<T>> {
    let mut y = dev.alloc_zeros::<T>(out_numel)?;
    if out_numel == 0 {
        return Ok(y);
    }
    let [d, h, w, kd, kh, kw] = pool_args(size, k)?;
    let on = out_numel as i64;
    launch!(
        dev,
        typed::<T>("max_pool_forward"),
        (grid_stride_blocks(out_numel), 1),
        [x, &on, &d, &h, &w, &kd, &kh, &kw, &mut y]
    )?;
    Ok(y)
}

/// Gradient of [`max_pool_forward`]: dy goes to each window's first maximum, zero elsewhere.
pub fn max_pool_backward<T: Element>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    dy: &CudaView<'_, T>,
    size: [usize; 3],
    k: [usize; 3],
    in_numel: usize,
) -> Result<CudaSlice<T>> {
    let mut dx = dev.alloc_zeros::<T>(in_numel)?;
    let out_numel = dy.len();
    if out_numel == 0 {
        return Ok(dx);
    }
    let [d, h, w, kd, kh, kw] = pool_args(size, k)?;
    let on = out_numel as i64;
    launch!(
        dev,
        typed::<T>("max_pool_backward"),
        (grid_stride_blocks(out_numel), 1),
        [x, dy, &on, &d, &h, &w, &kd, &kh, &kw, &mut dx]
    )?;
    Ok(dx)
}

/// `x + bias[c]` for x (N, C, voxels...).
pub fn add_channel_bias<T: Element>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    bias: &CudaView<'_, T>,
    channels: usize,
    voxels: usize,
) -> Result<CudaSlice<T>> {
    let n = x.len();
    let mut y = dev.alloc_zeros::<T>(n)?;
    if n == 0 || voxels == 0 {
        return Ok(y);
    }
    let (n_i, v_i, c_i) = (n as i64, voxels as i64, channels as i32);
    launch!(
        dev,
        typed::<T>("add_channel_bias"),
        (grid_stride_blocks(n), 1),
        [x, bias, &n_i, &v_i, &c_i, &mut y]
    )?;
    Ok(y)
}

/// (N, C, voxels...) -> (C,): each channel summed over samples and voxels.
pub fn channel_sum<T: Element>(
    dev: &CudaDevice,
    x: &CudaView<'_, T>,
    batch: usize,
    channels: usize,
    voxels: usize,
) -> Result<CudaSlice<T>> {
    let mut out = dev.alloc_zeros::<T>(channels)?;
    let rows = batch * channels;
    if rows == 0 || voxels == 0 {
        return Ok(out);
    }
    let parts = reduction_parts(voxels, rows)?;
    let mut partials = dev.alloc_zeros::<f64>(2 * rows * parts as usize)?;
    let (v_i, parts_i) = (voxels as i64, parts as i32);
    launch!(
        dev,
        typed::<T>("row_partial_sums"),
        (parts, rows as u32),
        [x, &v_i, &parts_i, &mut partials]
    )?;
    let row_sums = reduce_rows(dev, &partials, parts, rows)?;
    let (batch_i, c_i) = (batch as i32, channels as i32);
    launch!(
        dev,
        typed::<T>("channel_totals"),
        (one_per_item_blocks(channels), 1),
        [&row_sums, &batch_i, &c_i, &mut out]
    )?;
    Ok(out)
}
