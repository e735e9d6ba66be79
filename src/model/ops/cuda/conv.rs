//! The three convolution ops through cuDNN's N-d convolution: forward, backward data (the
//! input gradient, which is also the transposed convolution) and backward filter.
//!
//! cuDNN handles are neither Send nor Sync, so each thread keeps one per device (as candle's
//! own conv2d does); the algorithm for a geometry is chosen once by cuDNN's heuristic and
//! remembered. f32 and bf16 tensors; cuDNN accumulates in f32 for both. TF32 tensor-core
//! math is allowed for f32 by default, as PyTorch allows it for convolutions; [`set_tf32`]
//! turns it off (the GPU tests compare with the CPU in full f32). bf16 uses tensor cores.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::cudnn::{
    sys, ConvBackwardData, ConvBackwardFilter, ConvDescriptor, ConvForward, Cudnn, CudnnDataType,
    FilterDescriptor, TensorDescriptor,
};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr};
use candle_core::cuda_backend::{CudaDType, CudaDevice, DeviceId};
use candle_core::{bail, CudaStorage, DType, Layout, Result};

use super::view;

use crate::model::ops::geometry::ConvGeom;

static TF32: AtomicBool = AtomicBool::new(true);

/// Whether cuDNN may use TF32 tensor cores for f32 convolutions (default true, as PyTorch).
pub fn set_tf32(allow: bool) {
    TF32.store(allow, Ordering::Relaxed);
}

/// Which of the three convolution passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// y = conv3d(x, w), arguments (x, w).
    Forward,
    /// The input gradient (also the transposed convolution), arguments (dy, w).
    GradInput,
    /// The weight gradient, arguments (x, dy).
    GradWeight,
}

/// The element types the convolutions run in, with the alpha = 1, beta = 0 of cuDNN's
/// `y = alpha * op + beta * y`.
pub trait ConvElement: CudnnDataType + DeviceRepr + Copy {
    /// The candle element type.
    const DTYPE: DType;
    /// 1 (alpha).
    const ONE: Self;
    /// 0 (beta).
    const ZERO: Self;
}

impl ConvElement for f32 {
    const DTYPE: DType = DType::F32;
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
}

impl ConvElement for half::bf16 {
    const DTYPE: DType = DType::BF16;
    const ONE: Self = half::bf16::ONE;
    const ZERO: Self = half::bf16::ZERO;
}

/// cuDNN's choice for one (pass, geometry, element type, math).
type AlgoKey = (DeviceId, Pass, ConvGeom, DType, bool);

#[derive(Clone, Copy)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

thread_local! {
    static HANDLES: RefCell<HashMap<DeviceId, Arc<Cudnn>>> = RefCell::new(HashMap::new());
    static ALGOS: RefCell<HashMap<AlgoKey, Algo>> = RefCell::new(HashMap::new());
}

fn handle(dev: &CudaDevice) -> Result<Arc<Cudnn>> {
    HANDLES.with(|h| {
        if let Some(c) = h.borrow().get(&dev.id()) {
            return Ok(c.clone());
        }
        let c = Cudnn::new(dev.cuda_stream())?;
        h.borrow_mut().insert(dev.id(), c.clone());
        Ok(c)
    })
}

fn dims_i32(dims: [usize; 5], what: &str) -> Result<[c_int; 5]> {
    if dims.iter().product::<usize>() > c_int::MAX as usize {
        // cuDNN's descriptors are int32 (element counts and strides).
        bail!("{what}: tensor {dims:?} has more than 2^31 elements; use a smaller batch or patch");
    }
    Ok(dims.map(|d| d as c_int))
}

fn strides(d: [c_int; 5]) -> [c_int; 5] {
    [
        d[1] * d[2] * d[3] * d[4],
        d[2] * d[3] * d[4],
        d[3] * d[4],
        d[4],
        1,
    ]
}

/// Descriptors of one convolution geometry; the convolution itself computes in f32.
struct Descs<T> {
    conv: ConvDescriptor<f32>,
    x: TensorDescriptor<T>,
    w: FilterDescriptor<T>,
    y: TensorDescriptor<T>,
}

fn descriptors<T: ConvElement>(cudnn: &Arc<Cudnn>, g: &ConvGeom, tf32: bool) -> Result<Descs<T>> {
    let (x, w, y) = (
        dims_i32(g.x_dims(), "conv3d x")?,
        dims_i32(g.w_dims(), "conv3d w")?,
        dims_i32(g.y_dims(), "conv3d y")?,
    );
    let pads = g.padding.map(|p| p as c_int);
    let stride = g.stride.map(|s| s as c_int);
    let mut conv = cudnn.create_convnd::<f32>(
        &pads,
        &stride,
        &[1, 1, 1],
        sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
    )?;
    let math = match (T::DTYPE, tf32) {
        (DType::F32, false) => sys::cudnnMathType_t::CUDNN_FMA_MATH,
        (DType::F32, true) => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        _ => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    };
    conv.set_math_type(math)?;
    Ok(Descs {
        conv,
        x: cudnn.create_nd_tensor::<T>(&x, &strides(x))?,
        w: cudnn.create_nd_filter::<T>(sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, &w)?,
        y: cudnn.create_nd_tensor::<T>(&y, &strides(y))?,
    })
}

/// The remembered algorithm for `key`, or cuDNN's heuristic pick (then remembered).
fn algo(key: AlgoKey, pick: impl FnOnce() -> Result<Algo>) -> Result<Algo> {
    if let Some(a) = ALGOS.with(|m| m.borrow().get(&key).copied()) {
        return Ok(a);
    }
    let a = pick()?;
    ALGOS.with(|m| m.borrow_mut().insert(key, a));
    Ok(a)
}

fn workspace(dev: &CudaDevice, bytes: usize) -> Result<Option<CudaSlice<u8>>> {
    Ok(match bytes {
        0 => None,
        // SAFETY: scratch that cuDNN writes before it reads.
        n => Some(unsafe { dev.alloc::<u8>(n)? }),
    })
}

/// y = conv3d(x, w).
pub fn forward<T: ConvElement>(
    dev: &CudaDevice,
    g: &ConvGeom,
    x: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
) -> Result<CudaSlice<T>> {
    let tf32 = TF32.load(Ordering::Relaxed);
    let cudnn = handle(dev)?;
    let d = descriptors::<T>(&cudnn, g, tf32)?;
    let op = ConvForward {
        conv: &d.conv,
        x: &d.x,
        w: &d.w,
        y: &d.y,
    };
    let Algo::Forward(a) = algo((dev.id(), Pass::Forward, *g, T::DTYPE, tf32), || {
        Ok(Algo::Forward(op.pick_algorithm()?))
    })?
    else {
        bail!("conv3d: cuDNN algorithm cache mixed up passes")
    };
    let mut ws = workspace(dev, op.get_workspace_size(a)?)?;
    // SAFETY: alloc is fully overwritten (beta = 0) by the convolution.
    let mut y = unsafe { dev.alloc::<T>(g.batch * g.cout * g.output_voxels())? };
    // SAFETY: x, w, y match the descriptors built from the same geometry.
    unsafe { op.launch(a, ws.as_mut(), (T::ONE, T::ZERO), x, w, &mut y)? };
    Ok(y)
}

/// dx = the input gradient of conv3d for upstream dy (also conv_transpose3d of dy by w).
pub fn grad_input<T: ConvElement>(
    dev: &CudaDevice,
    g: &ConvGeom,
    dy: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
) -> Result<CudaSlice<T>> {
    let tf32 = TF32.load(Ordering::Relaxed);
    let cudnn = handle(dev)?;
    let d = descriptors::<T>(&cudnn, g, tf32)?;
    let op = ConvBackwardData {
        conv: &d.conv,
        dx: &d.x,
        w: &d.w,
        dy: &d.y,
    };
    let Algo::Data(a) = algo((dev.id(), Pass::GradInput, *g, T::DTYPE, tf32), || {
        Ok(Algo::Data(op.pick_algorithm()?))
    })?
    else {
        bail!("conv3d: cuDNN algorithm cache mixed up passes")
    };
    let mut ws = workspace(dev, op.get_workspace_size(a)?)?;
    // SAFETY: fully overwritten (beta = 0).
    let mut dx = unsafe { dev.alloc::<T>(g.batch * g.cin * g.input_voxels())? };
    // SAFETY: buffers match the descriptors built from the same geometry.
    unsafe { op.launch(a, ws.as_mut(), (T::ONE, T::ZERO), &mut dx, w, dy)? };
    Ok(dx)
}

/// dw = the weight gradient of conv3d for input x and upstream dy.
pub fn grad_weight<T: ConvElement>(
    dev: &CudaDevice,
    g: &ConvGeom,
    x: &CudaView<'_, T>,
    dy: &CudaView<'_, T>,
) -> Result<CudaSlice<T>> {
    let tf32 = TF32.load(Ordering::Relaxed);
    let cudnn = handle(dev)?;
    let d = descriptors::<T>(&cudnn, g, tf32)?;
    let op = ConvBackwardFilter {
        conv: &d.conv,
        x: &d.x,
        dw: &d.w,
        dy: &d.y,
    };
    let Algo::Filter(a) = algo((dev.id(), Pass::GradWeight, *g, T::DTYPE, tf32), || {
        Ok(Algo::Filter(op.pick_algorithm()?))
    })?
    else {
        bail!("conv3d: cuDNN algorithm cache mixed up passes")
    };
    let mut ws = workspace(dev, op.get_workspace_size(a)?)?;
    // SAFETY: fully overwritten (beta = 0).
    let mut dw = unsafe { dev.alloc::<T>(g.cout * g.cin * g.taps())? };
    // SAFETY: buffers match the descriptors built from the same geometry.
    unsafe { op.launch(a, ws.as_mut(), (T::ONE, T::ZERO), x, &mut dw, dy)? };
    Ok(dw)
}

/// Runs `pass` on two contiguous device arguments of one element type (f32 or bf16).
pub fn run(
    pass: Pass,
    g: &ConvGeom,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    fn typed<T: ConvElement + CudaDType>(
        pass: Pass,
        g: &ConvGeom,
        (s1, l1): (&CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let what = "conv3d";
        let (a, b) = (view::<T>(s1, l1, what)?, view::<T>(s2, l2, what)?);
        let dev = &s1.device;
        let out = match pass {
            Pass::Forward => forward(dev, g, &a, &b)?,
            Pass::GradInput => grad_input(dev, g, &a, &b)?,
            Pass::GradWeight => grad_weight(dev, g, &a, &b)?,
        };
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    use candle_core::backend::BackendStorage;
    match (s1.dtype(), s2.dtype()) {
        (DType::F32, DType::F32) => typed::<f32>(pass, g, (s1, l1), (s2, l2)),
        (DType::BF16, DType::BF16) => typed::<half::bf16>(pass, g, (s1, l1), (s2, l2)),
        (a, b) => bail!("conv3d {pass:?}: element types {a:?} and {b:?}: need f32 or bf16, both"),
    }
}
