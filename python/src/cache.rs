//! Building, inspecting and reading a cache: `build_cache`, `inspect`, `Cache`, `Case`.
//! Options are given as the command line spells them and parsed by the same clap definitions
//! (`PrepFlags`, `S3Flags`), so a Python keyword is checked exactly as its flag is.

use std::path::{Path, PathBuf};

use clap::Parser;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use voxcache::cache::reader::{CacheReader, EntryReader};
use voxcache::cache::s3::Fill;
use voxcache::config::location::{local_for_reading, LocalView, S3Flags};
use voxcache::config::modes::Given;
use voxcache::config::settings::{cache_apart, dataset_source, resolve};
use voxcache::config::PrepFlags;
use voxcache::prep::cache_build::{build_cache as build, BuildOptions};
use voxcache::remote::Location;

use crate::errors::to_py;

/// What `voxcache.build_cache` takes besides the data and the cache: the options of `prep
/// build-cache` that shape a cache, by their flag names.
#[derive(Parser)]
#[command(name = "voxcache.build_cache", no_binary_name = true)]
struct BuildArgs {
    #[command(flatten)]
    settings: PrepFlags,
    #[command(flatten)]
    s3: S3Flags,
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    previous_stage: Option<PathBuf>,
    #[arg(long, short = 'j', default_value_t = 0)]
    jobs: usize,
    #[arg(long, value_parser = voxcache::config::values::parse_part)]
    part: Option<(usize, usize)>,
    #[arg(long)]
    nnunet_plans: Option<PathBuf>,
}

/// clap's message without its `error: ` prefix and its pointer to `--help`.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    as_keywords(first.trim_start_matches("error: ").trim())
}

/// A command-line message spoken in Python's terms: each flag (`--local-cache <DIR>`) named as
/// the keyword that gives it (`local_cache=`).
fn as_keywords(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("--") {
        let after = &rest[at + 2..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(after.len());
        let starts_word = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_alphanumeric());
        if name_len == 0 || !starts_word {
            out.push_str(&rest[..at + 2]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at]);
        out.push_str(&after[..name_len].replace('-', "_"));
        out.push('=');
        rest = &after[name_len..];
        // The value's placeholder (` <DIR>`) goes with the flag.
        if let Some(tail) = rest.strip_prefix(" <") {
            if let Some(end) = tail.find('>') {
                rest = &tail[end + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Options spelled as flags (`["--spacing", "1,1,2"]`) parsed as `prep build-cache` parses them,
/// and which were given (for the modes' refusals, as the command line's).
fn parse_given<T: Parser>(flags: Vec<String>) -> PyResult<(T, Given)> {
    let bad = |e: clap::Error| crate::errors::ConfigError::new_err(clap_message(&e));
    let cmd = T::command();
    let matches = cmd.clone().try_get_matches_from(flags).map_err(bad)?;
    let args = T::from_arg_matches(&matches).map_err(bad)?;
    Ok((args, Given::of(&cmd, &matches)))
}

/// Build (or update) the cache at `cache_dir` from the dataset at `data` (a folder of
/// nnU-Net's layout, or the bundled layout); `flags`: the other options of `prep build-cache`.
/// Returns the build report as JSON text (the package's wrapper makes it a dict).
#[pyfunction]
#[pyo3(signature = (data, cache_dir, flags))]
pub(crate) fn build_cache(
    py: Python<'_>,
    data: PathBuf,
    cache_dir: PathBuf,
    flags: Vec<String>,
) -> PyResult<String> {
    let (args, given): (BuildArgs, Given) = parse_given(flags)?;
    py.detach(move || -> voxcache::Result<String> {
        // The options' own checks name them as the keywords that gave them.
        let keywords = |e: voxcache::Error| match e {
            voxcache::Error::Config(m) => voxcache::Error::Config(as_keywords(&m)),
            other => other,
        };
        // The modes' refusals, as `prep build-cache`'s (never a dry run from here).
        let on_s3 = matches!(Location::parse(&cache_dir)?, Location::S3(_));
        let nnunet = args.nnunet_plans.is_some();
        voxcache::config::modes::build::check(&given, false, nnunet, on_s3).map_err(keywords)?;
        let remote = args.s3.options_for(&cache_dir, false).map_err(keywords)?;
        let mut flags = args.settings.clone();
        let nnunet = voxcache::config::modes::build::nnunet_source(args.nnunet_plans, &mut flags);
        let settings = resolve(&flags).map_err(keywords)?;
        let source = dataset_source(Some(data), None, None)?;
        cache_apart(&cache_dir, &source, args.previous_stage.as_deref())?;
        let opts = BuildOptions {
            source,
            cache_dir,
            remote,
            name: args.name,
            settings,
            jobs: args.jobs,
            dry_run: false,
            part: args.part,
            progress: false,
            quiet: true,
            fixed_params: None,
            previous_stage: args.previous_stage,
            nnunet,
        };
        let report = build(&opts)?;
        Ok(serde_json::to_string(&report).unwrap_or_default())
    })
    .map_err(to_py)
}

/// `prep inspect PATH --json`'s report of a dataset or a cache, as JSON text.
#[pyfunction]
#[pyo3(signature = (path, verify = false))]
pub(crate) fn inspect(py: Python<'_>, path: PathBuf, verify: bool) -> PyResult<String> {
    py.detach(move || -> voxcache::Result<String> {
        let view = open_view(&path, &[], verify)?;
        let opts = voxcache::inspect::InspectOptions {
            verify,
            ..voxcache::inspect::InspectOptions::new(&view.path)
        };
        let mut report = voxcache::inspect::inspect(&opts)?;
        if let Some((url, _)) = &view.fetched {
            report.path = url.clone();
        }
        Ok(serde_json::to_string(&report).unwrap_or_default())
    })
    .map_err(to_py)
}

/// The local folder a cache is read from (for `s3://`, its local tier, filled first).
fn open_view(location: &Path, flags: &[String], fresh: bool) -> voxcache::Result<LocalView> {
    #[derive(Parser)]
    #[command(no_binary_name = true)]
    struct Remote {
        #[command(flatten)]
        s3: S3Flags,
    }
    let remote =
        Remote::try_parse_from(flags).map_err(|e| voxcache::Error::Config(clap_message(&e)))?;
    let opts = remote.s3.options_for(location, true).map_err(|e| match e {
        voxcache::Error::Config(m) => voxcache::Error::Config(as_keywords(&m)),
        other => other,
    })?;
    local_for_reading(location, &opts, fresh, Fill::Whole)
}

/// A cache opened for reading: its datasets and their cases.
#[pyclass(module = "voxcache")]
pub(crate) struct Cache {
    pub(crate) reader: CacheReader,
    /// Kept while the cache is open: an S3 cache's local tier.
    view: LocalView,
    location: String,
}

impl Cache {
    /// The cache's local folder (an S3 cache's local tier).
    pub(crate) fn local_dir(&self) -> &std::path::Path {
        &self.view.path
    }

    /// Where blocks the local folder lacks come from.
    pub(crate) fn blocks(&self) -> voxcache::cache::store::Blocks {
        self.view.blocks()
    }

    /// The dataset `name`, or the only one.
    pub(crate) fn dataset_name(&self, name: Option<&str>) -> voxcache::Result<String> {
        let names = self.reader.datasets();
        match (name, names.as_slice()) {
            (Some(n), _) => self.reader.dataset(n).map(|_| n.to_string()),
            (None, [one]) => Ok(one.to_string()),
            (None, []) => Err(voxcache::Error::Config(format!(
                "{}: the cache has no datasets (build one with voxcache.build_cache)",
                self.location
            ))),
            (None, many) => Err(voxcache::Error::Config(format!(
                "{}: the cache holds several datasets ({}): give dataset=",
                self.location,
                many.join(", ")
            ))),
        }
    }
}

#[pymethods]
impl Cache {
    /// Open the cache at `location` (a folder, or `s3://BUCKET/PREFIX` with the S3 options
    /// spelled as flags, e.g. `["--s3-endpoint", URL]`). `mapped_mib`: about how many MiB of
    /// the cache's mapped pages reads keep resident, as `train --mapped-mib` (`None`: the
    /// kernel's choice, clean page cache it reclaims under pressure).
    #[new]
    #[pyo3(signature = (location, flags = Vec::new(), mapped_mib = None))]
    fn new(
        py: Python<'_>,
        location: PathBuf,
        flags: Vec<String>,
        mapped_mib: Option<u64>,
    ) -> PyResult<Self> {
        py.detach(move || -> voxcache::Result<Cache> {
            let view = open_view(&location, &flags, false)?;
            let options = voxcache::cache::reader::ReaderOptions {
                mapped_resident_bytes: mapped_mib.map(|m| m.saturating_mul(1 << 20)),
                ..view.reader_options()
            };
            let reader = CacheReader::open_with(&view.path, options)?;
            Ok(Cache {
                reader,
                view,
                location: location.display().to_string(),
            })
        })
        .map_err(to_py)
    }

    /// The datasets the cache holds.
    #[getter]
    fn datasets(&self) -> Vec<String> {
        self.reader
            .datasets()
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// The case ids of `dataset` (default: the only one), in the manifest's order.
    #[pyo3(signature = (dataset = None))]
    fn cases(&self, dataset: Option<&str>) -> PyResult<Vec<String>> {
        let name = self.dataset_name(dataset).map_err(to_py)?;
        let cases = self.reader.cases(&name).map_err(to_py)?;
        Ok(cases.into_iter().map(|c| c.case_id).collect())
    }

    /// One case, opened through the memory-mapped reader.
    #[pyo3(signature = (case_id, dataset = None))]
    fn case(&self, py: Python<'_>, case_id: &str, dataset: Option<&str>) -> PyResult<Case> {
        let name = self.dataset_name(dataset).map_err(to_py)?;
        let entry = py
            .detach(|| self.reader.open_entry(&name, case_id))
            .map_err(to_py)?;
        Ok(Case {
            id: case_id.to_string(),
            entry,
        })
    }

    fn __repr__(&self) -> String {
        format!("voxcache.Cache({:?})", self.location)
    }
}

/// One case of a cache: its arrays, read through the memory-mapped reader (chunks checked
/// against their checksums as the command-line tools check them).
#[pyclass(module = "voxcache")]
pub(crate) struct Case {
    id: String,
    entry: EntryReader,
}

/// A box of `shape` read by `read` into a new numpy array (the Rust buffer handed over).
fn read_box<'py, T: numpy::Element + Copy + Default + Send>(
    py: Python<'py>,
    case: &str,
    shape: Vec<usize>,
    read: impl FnOnce(&mut [T]) -> voxcache::Result<()> + Send,
) -> PyResult<Bound<'py, PyAny>> {
    let n: usize = shape.iter().product();
    let data = py
        .detach(move || -> voxcache::Result<Vec<T>> {
            let mut v = vec![T::default(); n];
            read(&mut v)?;
            Ok(v)
        })
        .map_err(|e| crate::errors::in_case(case, e))?;
    Ok(PyArray1::from_vec(py, data).reshape(shape)?.into_any())
}

#[pymethods]
impl Case {
    /// The case id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// Voxels (z, y, x) of the cached grid.
    #[getter]
    fn shape(&self) -> (usize, usize, usize) {
        let [z, y, x] = self.entry.shape_zyx();
        (z, y, x)
    }

    /// Image channels.
    #[getter]
    fn channels(&self) -> usize {
        self.entry.channels()
    }

    /// Voxel spacing (z, y, x) of the cached grid, in `unit`.
    #[getter]
    fn spacing(&self) -> (f64, f64, f64) {
        let [z, y, x] = self.entry.spacing_zyx();
        (z, y, x)
    }

    /// The spatial unit of the spacing ("mm", "um", ...).
    #[getter]
    fn unit(&self) -> &str {
        self.entry.unit()
    }

    /// Whether the case has a label.
    #[getter]
    fn has_label(&self) -> bool {
        self.entry.label_dtype().is_some()
    }

    /// The entry's content key.
    #[getter]
    fn key(&self) -> &str {
        self.entry.key()
    }

    /// The image channels over the box `start` (z, y, x; may reach outside, read as zero)
    /// of `size`: float32 (C, z, y, x).
    fn read_image<'py>(
        &self,
        py: Python<'py>,
        start: [i64; 3],
        size: [usize; 3],
    ) -> PyResult<Bound<'py, PyAny>> {
        let shape = vec![self.entry.channels(), size[0], size[1], size[2]];
        let entry = self.entry.clone();
        read_box::<f32>(py, &self.id, shape, move |out| {
            entry.read_image(start, size, out)
        })
    }

    /// The label over the box: uint16 (z, y, x).
    fn read_label<'py>(
        &self,
        py: Python<'py>,
        start: [i64; 3],
        size: [usize; 3],
    ) -> PyResult<Bound<'py, PyAny>> {
        if self.entry.label_dtype().is_none() {
            return Err(crate::errors::CaseError::new_err(format!(
                "case {}: the cache holds no label for it",
                self.id
            )));
        }
        let entry = self.entry.clone();
        read_box::<u16>(py, &self.id, size.to_vec(), move |out| {
            entry.read_label(start, size, out)
        })
    }

    /// The label values whose signed distance maps the case holds (built with `derived=
    /// "distance"`), ascending; empty without them.
    #[getter]
    fn distance_labels(&self) -> Vec<u16> {
        self.entry.distance_classes().to_vec()
    }

    /// Whether the case holds its label's skeleton (built with `derived="skeleton"`).
    #[getter]
    fn has_skeleton(&self) -> bool {
        self.entry.has_skeleton()
    }

    /// The image channels nnU-Net's training zeroes outside the case's normalization mask
    /// (a cache of nnU-Net's preprocessing whose plans normalize within the nonzero mask);
    /// empty without a mask.
    #[getter]
    fn norm_mask_channels(&self) -> Vec<u16> {
        self.entry.norm_mask_channels().to_vec()
    }

    /// The signed distance map of label value `value` over the box: float32 (z, y, x),
    /// negative inside, in `unit`; 0 outside the grid.
    fn read_distance<'py>(
        &self,
        py: Python<'py>,
        value: u16,
        start: [i64; 3],
        size: [usize; 3],
    ) -> PyResult<Bound<'py, PyAny>> {
        let entry = self.entry.clone();
        read_box::<f32>(py, &self.id, size.to_vec(), move |out| {
            entry.read_distance(value, start, size, out)
        })
    }

    /// The label's skeleton over the box: uint16 (z, y, x), each skeleton voxel its label.
    fn read_skeleton<'py>(
        &self,
        py: Python<'py>,
        start: [i64; 3],
        size: [usize; 3],
    ) -> PyResult<Bound<'py, PyAny>> {
        let entry = self.entry.clone();
        read_box::<u16>(py, &self.id, size.to_vec(), move |out| {
            entry.read_skeleton(start, size, out)
        })
    }

    /// nnU-Net's normalization mask over the box: uint8 (z, y, x), 1 inside, 0 outside.
    fn read_norm_mask<'py>(
        &self,
        py: Python<'py>,
        start: [i64; 3],
        size: [usize; 3],
    ) -> PyResult<Bound<'py, PyAny>> {
        let entry = self.entry.clone();
        read_box::<u8>(py, &self.id, size.to_vec(), move |out| {
            entry.read_norm_mask(start, size, out)
        })
    }

    /// The foreground voxels (z, y, x) of label value `value` the sampler draws from: uint32
    /// (N, 3).
    fn foreground<'py>(&self, py: Python<'py>, value: u16) -> PyResult<Bound<'py, PyAny>> {
        let coords = self.entry.fg_coords(value).map_err(to_py)?;
        let n = coords.len();
        let flat: Vec<u32> = coords.into_iter().flatten().collect();
        Ok(PyArray1::from_vec(py, flat).reshape([n, 3])?.into_any())
    }

    fn __repr__(&self) -> String {
        format!(
            "voxcache.Case({:?}, shape={:?}, channels={})",
            self.id,
            self.entry.shape_zyx(),
            self.entry.channels()
        )
    }
}
