//! Small helpers every layer may use; they import nothing of the crate but [`crate::error`].
//!
//! - [`rng`]: the random generators, one family: SplitMix64 streams for every draw of training
//!   (seeded, checkpointable), xoshiro256++ for the synthetic datasets, and numpy's legacy
//!   RandomState (MT19937) that reproduces nnU-Net's folds.
//! - [`simd`]: which vector build (AVX-512, AVX2, portable) the hot loops take.
//! - [`fastmath`]: polynomial `exp`, `log2` and `sin/cos` where the last bit does not matter.
//! - [`stats`]: numpy's percentile and median, to the last bit.
//! - [`files`]: metadata files read as regular files of bounded size.
//! - [`paths`]: an output folder kept apart from the folders and files a command reads.
//! - [`sysinfo`]: memory (anonymous and file-backed, peaks) and host facts for reports.
//! - [`progress`]: the progress bars of the long commands.

pub mod alloc;
pub mod fastmath;
pub mod files;
pub mod paths;
pub mod progress;
pub mod rng;
pub mod simd;
pub mod stats;
pub mod sysinfo;
