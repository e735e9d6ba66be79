//! The library's error type. Every variant names the file or case it is about, so a user
//! reading one line knows what to fix.

use std::path::{Path, PathBuf};

/// Errors returned by the voxcache library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O failure on a named path (missing file, permission, full disk).
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A NIfTI file that cannot be read or whose header is invalid.
    #[error("{path}: {message}")]
    Nifti { path: PathBuf, message: String },
    /// Image and label of one case that do not fit together, or voxel values we refuse.
    #[error("case {case}: {message}")]
    Case { case: String, message: String },
    /// A dataset folder or glob that does not yield usable cases.
    #[error("{0}")]
    Dataset(String),
    /// Invalid options or pipeline configuration.
    #[error("{0}")]
    Config(String),
    /// A failure in the Zarr store or codecs.
    #[error("{path}: zarr: {message}")]
    Zarr { path: PathBuf, message: String },
    /// A cache folder whose content is not what voxcache wrote.
    #[error("{path}: {message}")]
    Cache { path: PathBuf, message: String },
    /// A failure inside the tensor library (shapes, devices, kernels) while training.
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// Invalid training options or run state (checkpoints, run folder).
    #[error("{0}")]
    Train(String),
}

impl Error {
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    pub fn nifti(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Nifti {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }

    pub fn case(case: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Case {
            case: case.into(),
            message: message.into(),
        }
    }

    pub fn zarr(path: impl AsRef<Path>, err: impl std::fmt::Display) -> Self {
        Error::Zarr {
            path: path.as_ref().to_path_buf(),
            message: err.to_string(),
        }
    }

    pub fn cache(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Cache {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
