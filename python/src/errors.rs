//! The library's errors as Python exceptions: `VoxcacheError` and one subclass per kind, each
//! carrying the message the command-line tools print.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use voxcache::Error;

create_exception!(
    voxcache,
    VoxcacheError,
    PyException,
    "Any error of voxcache."
);
create_exception!(
    voxcache,
    ConfigError,
    VoxcacheError,
    "An option, pipeline or argument that is not valid."
);
create_exception!(
    voxcache,
    CacheError,
    VoxcacheError,
    "A cache that is missing, damaged or not what was asked (a chunk failing its checksum)."
);
create_exception!(
    voxcache,
    CaseError,
    VoxcacheError,
    "One case of a dataset could not be read or used (its id in the message)."
);
create_exception!(
    voxcache,
    InputError,
    VoxcacheError,
    "An input file (NIfTI, JSON) that cannot be read as what it claims to be."
);
create_exception!(
    voxcache,
    StorageError,
    VoxcacheError,
    "Reading or writing files or an S3 bucket failed."
);

/// The exception for a library error.
pub(crate) fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::Config(_) | Error::Dataset(_) | Error::Train(_) => ConfigError::new_err(message),
        Error::Cache { .. } | Error::Zarr { .. } => CacheError::new_err(message),
        Error::Case { .. } => CaseError::new_err(message),
        Error::Nifti { .. } | Error::Model { .. } => InputError::new_err(message),
        Error::Io { .. } | Error::DiskFull { .. } | Error::Remote { .. } => {
            StorageError::new_err(message)
        }
        _ => VoxcacheError::new_err(message),
    }
}

/// [`to_py`] with the case named first, where the library's message names only a file.
pub(crate) fn in_case(case: &str, e: Error) -> PyErr {
    let err = to_py(e);
    pyo3::Python::attach(|py| {
        let message = err.value(py).to_string();
        if message.contains(case) {
            return err;
        }
        let named = format!("case {case}: {message}");
        let kind = err.get_type(py);
        match kind.call1((named,)) {
            Ok(v) => PyErr::from_value(v),
            Err(_) => err,
        }
    })
}

/// Add the exceptions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("VoxcacheError", py.get_type::<VoxcacheError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("CacheError", py.get_type::<CacheError>())?;
    m.add("CaseError", py.get_type::<CaseError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    Ok(())
}
