//! Cargo build script (see `build` in Cargo.toml): with the `cuda` feature, compiles
//! `kernels.cu` beside this file to PTX with nvcc, so a kernel that does not compile fails the
//! build here rather than at first use on a GPU. Without the feature it does nothing.
//!
//! nvcc: `$NVCC`, else `$CUDA_HOME/bin/nvcc`, else `nvcc` on the PATH (scripts/build_cuda.sh
//! sets these up from PyPI wheels). Target: `compute_$CUDA_COMPUTE_CAP` PTX (default 80, which
//! the driver compiles for any newer GPU at load time).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/model/ops/cuda/kernels.cu");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = env::var_os("NVCC").map(PathBuf::from).unwrap_or_else(|| {
        env::var_os("CUDA_HOME")
            .map(|h| PathBuf::from(h).join("bin/nvcc"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("nvcc"))
    });
    let cap = env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let cap: String = cap.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let ptx = out.join("voxcache_kernels.ptx");
    let status = Command::new(&nvcc)
        // No fused multiply-add: `x * scale + shift` rounds as the CPU op does, so the
        // LeakyReLU branch of a value next to 0 is the same on both (the GPU tests compare).
        .args(["--ptx", "-O3", "-std=c++17", "-lineinfo", "-fmad=false"])
        .arg(format!("-arch=compute_{cap}"))
        .arg("src/model/ops/cuda/kernels.cu")
        .arg("-o")
        .arg(&ptx)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "nvcc {} failed ({s}) on src/model/ops/cuda/kernels.cu",
            nvcc.display()
        ),
        Err(e) => panic!(
            "cannot run nvcc ({}): {e}; build with scripts/build_cuda.sh or set NVCC / CUDA_HOME",
            nvcc.display()
        ),
    }
}
