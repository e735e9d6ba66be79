//! The library's error type. Every variant names the file or case it is about, so a user
//! reading one line knows what to fix.

use std::path::{Path, PathBuf};

/// Errors returned by the voxcache library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O failure on a named path (missing file, permission, full disk).
    #[error("{path}: {source}")]
    Io {
        /// The file or folder the operation was on.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A NIfTI file that cannot be read or whose header is invalid.
    #[error("{path}: {message}")]
    Nifti {
        /// The NIfTI file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Image and label of one case that do not fit together, or voxel values we refuse.
    #[error("case {case}: {message}")]
    Case {
        /// The case id.
        case: String,
        /// What is wrong, naming the files involved.
        message: String,
    },
    /// A dataset folder or glob that does not yield usable cases.
    #[error("{0}")]
    Dataset(String),
    /// Invalid options or pipeline configuration.
    #[error("{0}")]
    Config(String),
    /// A failure in the Zarr store or codecs.
    #[error("{path}: zarr: {source}")]
    Zarr {
        /// The entry, array or chunk being read or written.
        path: PathBuf,
        /// zarrs' error (or a message).
        #[source]
        source: BoxError,
    },
    /// The disk (or the user's quota) is full: found from the operating system's error, never
    /// from message text. The build stops writing new cases when it sees one.
    #[error("{path}: the disk is full ({source})")]
    DiskFull {
        /// What was being written when the disk filled.
        path: PathBuf,
        /// The error that reported it.
        #[source]
        source: BoxError,
    },
    /// A cache folder whose content is not what voxcache wrote.
    #[error("{path}: {message}")]
    Cache {
        /// The file or folder in the cache.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A failure inside the tensor library (shapes, devices, kernels) while training.
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// Invalid training options or run state (checkpoints, run folder).
    #[error("{0}")]
    Train(String),
    /// A model made by another tool (nnU-Net's results folders and checkpoints) that cannot
    /// be used as it is.
    #[error("{path}: {message}")]
    Model {
        /// The folder or file.
        path: PathBuf,
        /// What is wrong with it, or what is not supported.
        message: String,
    },
    /// An object store (S3) that refused a request, cannot be reached, or holds something
    /// other than what voxcache wrote; or a location URL that is not supported.
    #[error("{url}: {message}")]
    Remote {
        /// The object's or bucket's URL (`s3://bucket/key`).
        url: String,
        /// What went wrong, and what to check.
        message: String,
    },
}

/// Any error kept as the source of ours.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Whether an operating-system error kind means no space is left.
fn is_full(kind: std::io::ErrorKind) -> bool {
    matches!(
        kind,
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// The I/O error kind inside a zarrs storage error.
fn storage_kind(e: &zarrs::storage::StorageError) -> Option<std::io::ErrorKind> {
    match e {
        zarrs::storage::StorageError::IOError(io) => Some(io.kind()),
        _ => None,
    }
}

/// The I/O error kind inside a zarrs codec error (codecs wrap storage and I/O errors).
fn codec_kind(e: &zarrs::array::CodecError) -> Option<std::io::ErrorKind> {
    match e {
        zarrs::array::CodecError::IOError(io) => Some(io.kind()),
        zarrs::array::CodecError::StorageError(s) => storage_kind(s),
        _ => None,
    }
}

/// The I/O error kind somewhere in `err`: zarrs wraps the `io::Error` of a failed write with
/// `#[error(transparent)]`, which hides it from `source()`, so its wrappers are opened by type.
fn io_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    use zarrs::array::{ArrayCreateError, ArrayError, CodecError};
    use zarrs::group::GroupCreateError;
    use zarrs::storage::StorageError;
    let mut cur = Some(err);
    while let Some(e) = cur {
        let kind = if let Some(io) = e.downcast_ref::<std::io::Error>() {
            Some(io.kind())
        } else if let Some(s) = e.downcast_ref::<StorageError>() {
            storage_kind(s)
        } else if let Some(c) = e.downcast_ref::<CodecError>() {
            codec_kind(c)
        } else if let Some(a) = e.downcast_ref::<ArrayError>() {
            match a {
                ArrayError::StorageError(s) => storage_kind(s),
                ArrayError::CodecError(c) => codec_kind(c),
                _ => None,
            }
        } else if let Some(ArrayCreateError::StorageError(s)) = e.downcast_ref::<ArrayCreateError>()
        {
            storage_kind(s)
        } else if let Some(GroupCreateError::StorageError(s)) = e.downcast_ref::<GroupCreateError>()
        {
            storage_kind(s)
        } else {
            None
        };
        if kind.is_some() {
            return kind;
        }
        cur = e.source();
    }
    None
}

impl Error {
    /// An I/O error on `path`; a full disk (or quota) becomes [`Error::DiskFull`].
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        let path = path.as_ref().to_path_buf();
        if is_full(source.kind()) {
            return Error::DiskFull {
                path,
                source: Box::new(source),
            };
        }
        Error::Io { path, source }
    }

    /// Whether this is the disk running out of space.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Error::DiskFull { .. })
    }

    /// A NIfTI file at `path` that cannot be read or is invalid; `message` says why.
    pub fn nifti(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Nifti {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }

    /// A problem with one case (its pair of files, or its voxel values).
    pub fn case(case: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Case {
            case: case.into(),
            message: message.into(),
        }
    }

    /// A zarrs error (or a message) about `path`; a full disk underneath becomes [`Error::DiskFull`].
    pub fn zarr(path: impl AsRef<Path>, err: impl Into<BoxError>) -> Self {
        let path = path.as_ref().to_path_buf();
        let source = err.into();
        if io_kind(source.as_ref()).is_some_and(is_full) {
            return Error::DiskFull { path, source };
        }
        Error::Zarr { path, source }
    }

    /// A failure of the object store at `url` (or a location that is not supported).
    pub fn remote(url: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Remote {
            url: url.into(),
            message: message.into(),
        }
    }

    /// A file or folder at `path` in a cache that is not what voxcache wrote.
    pub fn cache(path: impl AsRef<Path>, message: impl Into<String>) -> Self {
        Error::Cache {
            path: path.as_ref().to_path_buf(),
            message: message.into(),
        }
    }
}

/// The library's result type: [`Error`] unless another is named.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_found_through_zarrs_errors() {
        let enospc = || std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert!(Error::io("a", enospc()).is_disk_full());
        let storage = zarrs::storage::StorageError::from(enospc());
        let array = zarrs::array::ArrayError::StorageError(storage);
        let e = Error::zarr("chunk", array);
        assert!(e.is_disk_full(), "{e:?}");
        // The source stays reachable for whoever wants the details.
        assert!(std::error::Error::source(&e).is_some());
        let other = zarrs::storage::StorageError::from(std::io::Error::from(
            std::io::ErrorKind::PermissionDenied,
        ));
        assert!(!Error::zarr("chunk", other).is_disk_full());
        assert!(!Error::zarr("x", "a plain message").is_disk_full());
    }
}
