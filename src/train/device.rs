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
    Ok(Device::new_cuda(ordinal)?)
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
        Device::Cuda(_) => "cuda".into(),
        Device::Metal(_) => "metal".into(),
    }
}
