//! voxcache from Python: the cache (build, inspect, open, read) and the trainer's own patch
//! loader, as `voxcache._voxcache` (the pure-Python `voxcache` package wraps it). The work is
//! the library's, the same code as the command-line tools; this crate only converts arguments,
//! releases the GIL around the work and hands buffers to numpy without copying them.

mod cache;
mod errors;
mod loader;
mod train_run;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _voxcache(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(cache::build_cache, m)?)?;
    m.add_function(wrap_pyfunction!(cache::inspect, m)?)?;
    m.add_class::<cache::Cache>()?;
    m.add_class::<cache::Case>()?;
    m.add_class::<loader::PatchLoader>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
