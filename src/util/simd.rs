//! Which vector build the hot loops (the cache reader's image rows, the augmentation) take on
//! this CPU: AVX2, or the portable code. Both run the same operations in the same order
//! (nothing fuses a multiply and an add: Rust never contracts them, and no FMA intrinsic is
//! used), so they give the same values bit for bit (`scripts/batch_hashes.sh` hashes the
//! training batches of each); only the number of lanes per instruction differs, and with it
//! the speed. AVX-512 CPUs take the AVX2 build: the AVX-512 copies of these loops gained 2-7%
//! on micro-benchmarks, under the 10% end to end that a hand-written path must earn.
//!
//! `VOXCACHE_SIMD=portable` forces the portable build (to compare builds side by side in a
//! benchmark on one machine).

use std::sync::OnceLock;

/// A vector build, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    /// Plain Rust (what the compiler makes of it for the target's baseline).
    Portable,
    /// 8 lanes of f32.
    Avx2,
}

/// The widest build this CPU runs, capped by `VOXCACHE_SIMD` (read once per process).
pub fn best() -> Simd {
    static BEST: OnceLock<Simd> = OnceLock::new();
    *BEST.get_or_init(|| {
        let cap = match std::env::var("VOXCACHE_SIMD").as_deref() {
            Ok("portable") => Simd::Portable,
            _ => Simd::Avx2,
        };
        detected().min(cap)
    })
}

/// The widest build this CPU runs.
pub fn detected() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            return Simd::Avx2;
        }
    }
    Simd::Portable
}
