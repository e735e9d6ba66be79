//! The compute device seam: everything else takes a `candle_core::Device` from here.

use candle_core::Device;

use crate::error::{Error, Result};

/// "cpu" (default), "cuda" or "cuda:N". CUDA needs the crate built with `--features cuda`.
pub fn select(name: &str) -> Result<Device> {
    let name = name.trim().to_ascii_lowercase();
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match name.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| {
                Error::Config(format!("device {name:?}: expected cpu, cuda or cuda:N"))
            })?,
        None => {
            return Err(Error::Config(format!(
                "device {name:?}: expected cpu, cuda or cuda:N"
            )))
        }
    };
    cuda(ordinal)
}

#[cfg(feature = "cuda")]
fn cuda(ordinal: usize) -> Result<Device> {
    Device::new_cuda(ordinal).map_err(|e| {
        // candle appends a backtrace to driver errors: keep the message line.
        let e = e.to_string();
        let e = e.lines().next().unwrap_or_default();
        Error::Config(format!(
            "cannot open CUDA device {ordinal}: {e} (is an NVIDIA GPU visible, with its driver, \
             and are CUDA 13's libraries on LD_LIBRARY_PATH? see scripts/gpu_check.sh)"
        ))
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda(_ordinal: usize) -> Result<Device> {
    Err(Error::Config(
        "this build has no CUDA support: rebuild with `cargo build --release --features cuda` (needs the CUDA toolkit)".into(),
    ))
}

/// The environment variable of candle's pool for element-wise CPU ops.
pub const CANDLE_THREADS_VAR: &str = "CANDLE_NUM_THREADS";

/// Default candle's element-wise CPU pool to one thread unless the user chose otherwise.
///
/// Why: its workers spin-wait between ops; with a 2-core machine shared with our loader
/// threads and the rayon pool of the convolutions, the spinning took about half the CPU time
/// and a training step ran 2.2x slower (scripts/bench_train.sh, `perf`). Convolutions and
/// matrix products still use every core through rayon. Call this first thing in `main`,
/// before any thread exists (setting the environment is not thread-safe).
pub fn default_cpu_threads() {
    if std::env::var_os(CANDLE_THREADS_VAR).is_none() {
        std::env::set_var(CANDLE_THREADS_VAR, "1");
    }
}

/// A short description for logs.
pub fn describe(dev: &Device) -> String {
    match dev {
        Device::Cpu => format!("cpu ({} threads)", rayon::current_num_threads()),
        Device::Cuda(_) => match gpu_memory(dev) {
            Some(m) => format!(
                "cuda ({:.1} GiB)",
                m.device_total as f64 / (1u64 << 30) as f64
            ),
            None => "cuda".into(),
        },
        Device::Metal(_) => "metal".into(),
    }
}

/// GPU memory of one device, in bytes: what our tensors hold now and at most since the last
/// [`reset_gpu_peak`] (the allocator pool's counters, the analogue of PyTorch's
/// `memory_allocated` / `max_memory_allocated`), and what the whole device has in use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuMemory {
    /// Bytes our tensors hold now.
    pub allocated: u64,
    /// The most they held since the last reset.
    pub peak_allocated: u64,
    /// Bytes in use on the whole device (every process).
    pub device_used: u64,
    /// The device's memory.
    pub device_total: u64,
}

/// The memory counters of a CUDA device; `None` on the CPU or a build without CUDA.
pub fn gpu_memory(dev: &Device) -> Option<GpuMemory> {
    gpu::memory(dev)
}

/// Restarts the peak counter of [`gpu_memory`] (no-op on the CPU).
pub fn reset_gpu_peak(dev: &Device) {
    gpu::reset_peak(dev)
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::GpuMemory;
    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::Device;

    /// The device's default memory pool, which cudarc's stream-ordered allocations draw from.
    fn pool(dev: &candle_core::CudaDevice) -> Option<sys::CUmemoryPool> {
        let ctx = dev.cuda_stream().context().clone();
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: plain driver query on a valid device handle into a local.
        let r = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(pool)
    }

    fn attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: these attributes are 64-bit values; `v` outlives the call.
        let r = unsafe { sys::cuMemPoolGetAttribute(pool, attr, &mut v as *mut u64 as *mut _) };
        if r == sys::CUresult::CUDA_SUCCESS {
            v
        } else {
            0
        }
    }

    pub(super) fn memory(dev: &Device) -> Option<GpuMemory> {
        let Device::Cuda(d) = dev else { return None };
        let (free, total) = d.cuda_stream().context().mem_get_info().ok()?;
        let mut m = GpuMemory {
            device_used: (total - free) as u64,
            device_total: total as u64,
            ..GpuMemory::default()
        };
        if let Some(p) = pool(d) {
            use sys::CUmemPool_attribute::*;
            m.allocated = attribute(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
            m.peak_allocated = attribute(p, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
        }
        Some(m)
    }

    pub(super) fn reset_peak(dev: &Device) {
        let Device::Cuda(d) = dev else { return };
        if let Some(p) = pool(d) {
            let mut zero: u64 = 0;
            // SAFETY: resetting the high-water mark takes a 64-bit zero.
            unsafe {
                sys::cuMemPoolSetAttribute(
                    p,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    &mut zero as *mut u64 as *mut _,
                )
            };
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod gpu {
    use super::GpuMemory;
    use candle_core::Device;

    pub(super) fn memory(_dev: &Device) -> Option<GpuMemory> {
        None
    }

    pub(super) fn reset_peak(_dev: &Device) {}
}
