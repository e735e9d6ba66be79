//! Which vector build the hot loops (the cache reader's image rows, the augmentation) take on
//! this CPU: AVX-512 (F, VL, BW, DQ), AVX2, or the portable code. Each build runs the same
//! operations in the same order (nothing fuses a multiply and an add: Rust never contracts
//! them, even where AVX-512 implies FMA, and no FMA intrinsic is used), so all three give the
//! same values bit for bit (tested in each module); only the number of lanes per instruction
//! differs, and with it the speed.
//!
//! `VOXCACHE_SIMD=avx2` or `=portable` caps the choice (to compare builds side by side in a
//! benchmark on one machine); it can only lower it.

use std::sync::OnceLock;

/// A vector build, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    /// Plain Rust (what the compiler makes of it for the target's baseline).
    Portable,
    /// 8 lanes of f32.
    Avx2,
    /// 16 lanes of f32, with masked loads and stores.
    Avx512,
}

/// The widest build this CPU runs, capped by `VOXCACHE_SIMD` (read once per process).
pub fn best() -> Simd {
    static BEST: OnceLock<Simd> = OnceLock::new();
    *BEST.get_or_init(|| {
        let cap = match std::env::var("VOXCACHE_SIMD").as_deref() {
            Ok("portable") => Simd::Portable,
            Ok("avx2") => Simd::Avx2,
            _ => Simd::Avx512,
        };
        detected().min(cap)
    })
}

/// The widest build this CPU runs.
pub fn detected() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512vl") && has!("avx512bw") && has!("avx512dq") {
            return Simd::Avx512;
        }
        if has!("avx2") {
            return Simd::Avx2;
        }
    }
    Simd::Portable
}
