//! The three convolution ops through cuDNN's N-d convolution: forward, backward data (the
//! input gradient, which is also the transposed convolution) and backward filter.
//!
//! cuDNN handles are neither Send nor Sync, so each thread keeps one per device (as candle's
//! own conv2d does); the algorithm for a geometry is chosen once by cuDNN's heuristic and
//! remembered. TF32 tensor-core math is allowed by default, as PyTorch allows it for
//! convolutions; [`set_tf32`] turns it off (the GPU tests compare with the CPU in full f32).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::cudnn::{
    sys, ConvBackwardData, ConvBackwardFilter, ConvDescriptor, ConvForward, Cudnn,
    FilterDescriptor, TensorDescriptor,
};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView};
use candle_core::cuda_backend::{CudaDevice, DeviceId};
use candle_core::{bail, Result};

use crate::train::ops::geometry::ConvGeom;

static TF32: AtomicBool = AtomicBool::new(true);

/// Whether cuDNN may use TF32 tensor cores for f32 convolutions (default true, as PyTorch).
pub fn set_tf32(allow: bool) {
    TF32.store(allow, Ordering::Relaxed);
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Pass {
    Forward,
    Data,
    Filter,
}

/// cuDNN's choice for one (pass, geometry, math).
type AlgoKey = (DeviceId, Pass, ConvGeom, bool);

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

/// Descriptors of one convolution geometry.
struct Descs {
    conv: ConvDescriptor<f32>,
    x: TensorDescriptor<f32>,
    w: FilterDescriptor<f32>,
    y: TensorDescriptor<f32>,
}

fn descriptors(cudnn: &Arc<Cudnn>, g: &ConvGeom, tf32: bool) -> Result<Descs> {
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
    let math = match tf32 {
        true => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        false => sys::cudnnMathType_t::CUDNN_FMA_MATH,
    };
    conv.set_math_type(math)?;
    Ok(Descs {
        conv,
        x: cudnn.create_nd_tensor::<f32>(&x, &strides(x))?,
        w: cudnn.create_nd_filter::<f32>(sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, &w)?,
        y: cudnn.create_nd_tensor::<f32>(&y, &strides(y))?,
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
        n => Some(dev.alloc_zeros::<u8>(n)?),
    })
}

/// y = conv3d(x, w).
pub fn forward(
    dev: &CudaDevice,
    g: &ConvGeom,
    x: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
) -> Result<CudaSlice<f32>> {
    let tf32 = TF32.load(Ordering::Relaxed);
    let cudnn = handle(dev)?;
    let d = descriptors(&cudnn, g, tf32)?;
    let op = ConvForward {
        conv: &d.conv,
        x: &d.x,
        w: &d.w,
        y: &d.y,
    };
    let Algo::Forward(a) = algo((dev.id(), Pass::Forward, *g, tf32), || {
        Ok(Algo::Forward(op.pick_algorithm()?))
    })?
    else {
        bail!("conv3d: cuDNN algorithm cache mixed up passes")
    };
    let mut ws = workspace(dev, op.get_workspace_size(a)?)?;
    // SAFETY: alloc is fully overwritten (beta = 0) by the convolution.
    let mut y = unsafe { dev.alloc::<f32>(g.batch * g.cout * g.output_voxels())? };
    // SAFETY: x, w, y match the descriptors built from the same geometry.
    unsafe { op.launch(a, ws.as_mut(), (1.0, 0.0), x, w, &mut y)? };
    Ok(y)
}

/// dx = the input gradient of conv3d for upstream dy (also conv_transpose3d of dy by w).
pub fn grad_input(
    dev: &CudaDevice,
    g: &ConvGeom,
    dy: &CudaView<'_, f32>,
    w: &CudaView<'_, f32>,
) -> Result<CudaSlice<f32>> {
    let tf32 = TF32.load(Ordering::Relaxed);
    let cudnn = handle(dev)?;
    let d = descriptors(&cudnn, g, tf32)?;
    let op = ConvBackwardData {
        conv: &d.conv,
        dx: &d.x,
        w: &d.w,
        dy: &d.y,
    };
    let Algo::Data(a) = algo((dev.id(), Pass::Data, *g, tf32), || {
        Ok(Algo::Data(op.pick_algorithm()?))
    })?
    else {
        bail!("conv3d: cuDNN algorithm cache mixed up passes")
    };
    let mut ws = workspace(dev, op.get_workspace_size(a)?)?;
    // SAFETY: fully overwritten (beta = 0).
    let mut dx = unsafe { dev.alloc::<f32>(g.batch * g.cin * g.input_voxels())? };
    // SAFETY: buffers match the descriptors built from the same geometry.
    unsafe { op.launch(a, ws.as_mut(), (1.0, 0.0), &mut dx, w, dy)? };
    Ok(dx)
}

/// dw = the weight gradient of conv3d for input x and upstream dy.
pub fn grad_weight(
    dev: &CudaDevice,
    g: &ConvGeom,
    x: &CudaView<'_, f32>,
    dy: &CudaView<'_, f32>,
) -> Result<CudaSlice<f32>> {
    let tf32 = TF32.load(Ordering::Relaxed);
    let cudnn = handle(dev)?;
    let d = descriptors(&cudnn, g, tf32)?;
    let op = ConvBackwardFilter {
        conv: &d.conv,
        x: &d.x,
        dw: &d.w,
        dy: &d.y,
    };
    let Algo::Filter(a) = algo((dev.id(), Pass::Filter, *g, tf32), || {
        Ok(Algo::Filter(op.pick_algorithm()?))
    })?
    else {
        bail!("conv3d: cuDNN algorithm cache mixed up passes")
    };
    let mut ws = workspace(dev, op.get_workspace_size(a)?)?;
    // SAFETY: fully overwritten (beta = 0).
    let mut dw = unsafe { dev.alloc::<f32>(g.cout * g.cin * g.taps())? };
    // SAFETY: buffers match the descriptors built from the same geometry.
    unsafe { op.launch(a, ws.as_mut(), (1.0, 0.0), x, &mut dw, dy)? };
    Ok(dw)
}
