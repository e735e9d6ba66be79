//! Small helpers every layer may use; they import nothing of the crate but [`crate::error`].
//!
//! - [`rng`]: the seeded, checkpointable random generator every draw comes from.
//! - [`simd`]: which vector build (AVX-512, AVX2, portable) the hot loops take.
//! - [`fastmath`]: polynomial `exp`, `log2` and `sin/cos` where the last bit does not matter.
//! - [`stats`]: numpy's percentile and median, to the last bit.
//! - [`numpy_random`]: numpy's legacy RandomState (MT19937, shuffle) for nnU-Net's folds.
//! - [`files`]: metadata files read as regular files of bounded size.
//! - [`paths`]: an output folder kept apart from the folders and files a command reads.
//! - [`sysinfo`]: memory (anonymous and file-backed, peaks) and host facts for reports.
//! - [`progress`]: the progress bars of the long commands.

pub mod fastmath;
pub mod files;
pub mod numpy_random;
pub mod paths;
pub mod progress;
pub mod rng;
pub mod simd;
pub mod stats;
pub mod sysinfo;
