//! The trainer's own patch loader from Python: `PatchLoader` starts the library's `Loader`
//! (worker threads, a bounded queue, batches in step order), so the batches are the trainer's
//! for the same seed and settings, whatever the number of threads. Each batch's buffers are
//! handed to numpy without a copy; the GIL is released while waiting for one.

use std::sync::Mutex;

use numpy::ndarray::{ArrayView, Dimension, IntoDimension};
use numpy::{Element, PyArray, PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use voxcache::cache::reader::CacheReader;
use voxcache::cache::reader::EntryReader;
use voxcache::train::augment::AugmentConfig;
use voxcache::train::classes::{ClassMap, IGNORE};
use voxcache::train::deep_supervision::downsample_labels;
use voxcache::train::loader::{Loader, LoaderConfig, Recycler};
use voxcache::train::loss::region_membership;
use voxcache::train::sampler::{Sampler, SamplerConfig, Shard};

use crate::cache::Cache;
use crate::errors::to_py;

/// Batches of patches drawn from a cache's cases.
#[pyclass(module = "voxcache")]
pub(crate) struct PatchLoader {
    loader: Mutex<Loader>,
    ids: Vec<String>,
    patch: [usize; 3],
    batch: usize,
    channels: usize,
    /// Batches an iteration yields (`None`: without end).
    steps: Option<u64>,
    first_step: u64,
    /// With `targets`: the trainer's label-value-to-class mapping.
    classes: Option<ClassMap>,
    /// Deep-supervision targets: each one's downsampling factor (z, y, x) from the patch.
    deep_supervision: Vec<[usize; 3]>,
    /// The label values whose signed distance maps `distance` holds, in order.
    distance: Vec<u16>,
}

/// Where a voxel of the ignore label lands in `target`: PyTorch's default `ignore_index`.
const IGNORE_INDEX: i64 = -100;

/// The trainer's classes of dataset `name`: the values every labelled case holds, named and
/// completed by its dataset.json, in value order (as `train` maps them); or its regions.
fn dataset_classes(reader: &CacheReader, name: &str) -> voxcache::Result<ClassMap> {
    let mut present = std::collections::BTreeSet::from([0u16]);
    for c in reader.cases(name)? {
        let e = reader.open_entry(name, &c.case_id)?;
        if e.label_dtype().is_some() {
            present.extend(e.classes());
        }
    }
    let described = reader.dataset(name)?.dataset_json.as_ref();
    ClassMap::new(&present, described, &format!("dataset {name:?}"))
}

#[pymethods]
impl PatchLoader {
    /// `augment`: `None` for raw patches, else the `[train.augmentation]` table as JSON
    /// (`"{}"` for nnU-Net's defaults). `cases`: the case ids to draw from (default: every
    /// labelled case of the dataset).
    #[new]
    #[pyo3(signature = (cache, patch_size, batch_size, augment = None, threads = 2,
        seed = 1234, dataset = None, cases = None, fg_fraction = 1.0 / 3.0, queue_depth = 4,
        steps = None, first_step = 0, rank = 0, world_size = 1, targets = false,
        deep_supervision = Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        cache: &Cache,
        patch_size: [usize; 3],
        batch_size: usize,
        augment: Option<&str>,
        threads: usize,
        seed: u64,
        dataset: Option<&str>,
        cases: Option<Vec<String>>,
        fg_fraction: f64,
        queue_depth: usize,
        steps: Option<u64>,
        first_step: u64,
        rank: usize,
        world_size: usize,
        targets: bool,
        deep_supervision: Vec<[usize; 3]>,
    ) -> PyResult<Self> {
        check_deep_supervision(&deep_supervision, patch_size, targets)?;
        let augment = match augment {
            None => AugmentConfig::none(),
            Some(json) => serde_json::from_str::<AugmentConfig>(json)
                .map_err(|e| crate::errors::ConfigError::new_err(format!("augment: {e}")))?,
        };
        let name = cache.dataset_name(dataset).map_err(to_py)?;
        let reader = cache.reader.clone();
        let (loader, ids, channels, classes) = py
            .detach(
                move || -> voxcache::Result<(Loader, Vec<String>, usize, Option<ClassMap>)> {
                    let classes = match targets {
                        true => Some(dataset_classes(&reader, &name)?),
                        false => None,
                    };
                    let all = reader.cases(&name)?;
                    let explicit = cases.is_some();
                    let chosen: Vec<String> = match cases {
                        Some(ids) => {
                            for id in &ids {
                                if !all.iter().any(|c| &c.case_id == id) {
                                    return Err(voxcache::Error::Config(format!(
                                        "case {id:?} is not in dataset {name}"
                                    )));
                                }
                            }
                            ids
                        }
                        None => all.into_iter().map(|c| c.case_id).collect(),
                    };
                    let mut entries: Vec<EntryReader> = Vec::with_capacity(chosen.len());
                    let mut ids = Vec::with_capacity(chosen.len());
                    for id in chosen {
                        let e = reader.open_entry(&name, &id)?;
                        // Unlabelled cases are left out unless asked for by name (then the
                        // loader refuses them, naming the case).
                        if e.label_dtype().is_some() || explicit {
                            entries.push(e);
                            ids.push(id);
                        }
                    }
                    if entries.is_empty() {
                        return Err(voxcache::Error::Config(format!(
                            "dataset {name}: no labelled case to draw patches from"
                        )));
                    }
                    let channels = entries[0].channels();
                    // The ignore label is no structure to centre patches on (as the trainer's
                    // sampler and nnU-Net's).
                    let ignore = reader
                        .dataset(&name)?
                        .dataset_json
                        .as_ref()
                        .and_then(|d| voxcache::format::labels::FileLabels::of(d).ignore());
                    let sampler = Sampler::new(
                        &entries,
                        Vec::new(),
                        SamplerConfig {
                            fg_fraction,
                            skip_class: ignore,
                            shard: Shard {
                                rank,
                                ranks: world_size,
                            },
                            ..SamplerConfig::new(patch_size, batch_size, seed)
                        },
                    )?;
                    let cfg = LoaderConfig {
                        workers: threads,
                        queue_depth,
                        augment,
                        ..LoaderConfig::default()
                    };
                    let loader = Loader::start(entries, sampler, cfg, first_step)?;
                    Ok((loader, ids, channels, classes))
                },
            )
            .map_err(to_py)?;
        Ok(PatchLoader {
            loader: Mutex::new(loader),
            ids,
            patch: patch_size,
            batch: batch_size,
            channels,
            steps,
            first_step,
            classes,
            deep_supervision,
            distance: Vec::new(),
        })
    }

    /// The batches the `train` run of `args` (train's options, e.g. `["--pipeline", "p.toml",
    /// "--configuration", "3d_fullres", "--fold", "0", "--seed", "0"]`) draws from this cache:
    /// its fold's cases, its sampler, augmentation, derived arrays and a cascade's channels,
    /// batch for batch (`train --batch-hashes` records them to compare). `threads`: default the
    /// run's `workers`; `steps`: default the run's batches (steps times accumulate);
    /// `first_step`: the batch to start at; `device`: what a planned patch is planned for.
    #[staticmethod]
    #[pyo3(signature = (cache, args, threads = None, steps = None, first_step = 0,
        targets = false, deep_supervision = Vec::new(), device = "cpu"))]
    #[allow(clippy::too_many_arguments)]
    fn for_train(
        py: Python<'_>,
        cache: &Cache,
        args: Vec<String>,
        threads: Option<usize>,
        steps: Option<u64>,
        first_step: u64,
        targets: bool,
        deep_supervision: Vec<[usize; 3]>,
        device: &str,
    ) -> PyResult<Self> {
        let run = py
            .detach(|| crate::train_run::open(cache, &args, threads, first_step, device))
            .map_err(to_py)?;
        check_deep_supervision(&deep_supervision, run.patch, targets)?;
        let b = run.batches;
        Ok(PatchLoader {
            loader: Mutex::new(b.loader),
            ids: b.train_ids,
            patch: run.patch,
            batch: run.batch_size,
            channels: b.channels.len(),
            steps: Some(steps.unwrap_or(run.total.saturating_sub(first_step))),
            first_step,
            classes: targets.then_some(b.classes),
            deep_supervision,
            distance: b.distance,
        })
    }

    /// The patch size (z, y, x).
    #[getter]
    fn patch_size(&self) -> [usize; 3] {
        self.patch
    }

    /// Patches a batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.batch
    }

    /// The label values whose signed distance maps `distance` holds, in order (a run whose
    /// loss needs them).
    #[getter]
    fn distance_labels(&self) -> Vec<u16> {
        self.distance.clone()
    }

    /// With `targets=True`: the classes `target` indexes, in order: `(label value, name)`.
    #[getter]
    fn classes(&self) -> Option<Vec<(u16, String)>> {
        self.classes.as_ref().map(|m| {
            m.classes()
                .iter()
                .map(|c| (c.value, c.name.clone()))
                .collect()
        })
    }

    /// With `targets=True` on a dataset labelled in regions: the regions `target`'s channels
    /// are, in order: `(name, label values)`.
    #[getter]
    fn regions(&self) -> Option<Vec<(String, Vec<u16>)>> {
        let labels = self.classes.as_ref()?.labels();
        labels.is_regions().then(|| {
            labels
                .regions()
                .iter()
                .map(|r| (r.name.clone(), r.values.clone()))
                .collect()
        })
    }

    /// The case ids patches are drawn from, in the order `case` indexes.
    #[getter]
    fn case_ids(&self) -> Vec<String> {
        self.ids.clone()
    }

    /// The step of the next batch.
    #[getter]
    fn step(&self) -> u64 {
        self.lock().next_step()
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch: a dict of `image` float32 (B, C, z, y, x), `label` uint16 (B, z, y,
    /// x) with the label values as cached, `case` (the case ids), `origin` int64 (B, 3):
    /// each patch's first voxel (z, y, x) in its case's cached grid (before augmentation;
    /// negative where the patch reaches outside), and `step`.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        if let Some(n) = self.steps {
            if self.lock().next_step() >= self.first_step + n {
                return Ok(None);
            }
        }
        // Waiting for the workers, and Ctrl-C: checked between short waits.
        let batch = loop {
            let ready = py.detach(|| {
                let l = self.lock();
                l.ready_ahead() > 0
            });
            if ready {
                break py
                    .detach(|| -> voxcache::Result<_> {
                        let batch = self.lock().next()?.0;
                        let target = match &self.classes {
                            Some(map) => Some(self.targets(map, &batch.label)?),
                            None => None,
                        };
                        Ok((batch, target))
                    })
                    .map_err(to_py)?;
            }
            py.check_signals()?;
            py.detach(|| std::thread::sleep(std::time::Duration::from_millis(2)));
        };
        let (batch, target) = batch;
        let back = self.lock().recycler();
        let [z, y, x] = self.patch;
        let b = self.batch;
        let d = PyDict::new(py);
        if let Some(t) = target {
            let mut levels = Vec::with_capacity(t.len());
            let factors = std::iter::once(&[1, 1, 1]).chain(&self.deep_supervision);
            for (level, f) in t.into_iter().zip(factors) {
                let spatial = [z / f[0], y / f[1], x / f[2]];
                levels.push(match level {
                    Target::Classes(v) => PyArray1::from_vec(py, v)
                        .reshape([b, spatial[0], spatial[1], spatial[2]])?
                        .into_any(),
                    Target::Regions(v, c) => PyArray1::from_vec(py, v)
                        .reshape([b, c, spatial[0], spatial[1], spatial[2]])?
                        .into_any(),
                });
            }
            let rest = levels.split_off(1);
            d.set_item("target", levels.remove(0))?;
            if !rest.is_empty() {
                d.set_item("target_ds", rest)?;
            }
        }
        let image = OwnedBuf::Image(batch.image, back.clone());
        d.set_item("image", image.into_array(py, [b, self.channels, z, y, x])?)?;
        let label = OwnedBuf::Label(batch.label, back);
        d.set_item("label", label.into_array(py, [b, z, y, x])?)?;
        let cases: Vec<&str> = batch
            .choices
            .iter()
            .map(|c| self.ids[c.case].as_str())
            .collect();
        d.set_item("case", cases)?;
        let origin: Vec<i64> = batch.choices.iter().flat_map(|c| c.start_zyx).collect();
        d.set_item("origin", PyArray1::from_vec(py, origin).reshape([b, 3])?)?;
        let n = z * y * x;
        if !batch.distance.is_empty() {
            let k = batch.distance.len() / (b * n);
            let v = PyArray1::from_vec(py, batch.distance).reshape([b, k, z, y, x])?;
            d.set_item("distance", v)?;
        }
        for (key, v) in [
            ("skeleton", batch.skeleton),
            ("centreline", batch.centreline),
        ] {
            if !v.is_empty() {
                d.set_item(key, PyArray1::from_vec(py, v).reshape([b, z, y, x])?)?;
            }
        }
        d.set_item("step", batch.step)?;
        Ok(Some(d))
    }

    fn __len__(&self) -> PyResult<usize> {
        self.steps.map(|n| n as usize).ok_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err("the loader has no length: give steps= for one")
        })
    }
}

impl PatchLoader {
    /// The batch's labels as the trainer's targets, at the patch's resolution, then at each
    /// deep-supervision factor (pooled as the trainer pools them): class indices, or with
    /// regions each region's membership.
    fn targets(&self, map: &ClassMap, label: &[u16]) -> voxcache::Result<Vec<Target>> {
        let mut mapped = label.to_vec();
        map.map(&mut mapped)?;
        let mut out = Vec::with_capacity(1 + self.deep_supervision.len());
        out.push(self.target(map, mapped.clone()));
        for &f in &self.deep_supervision {
            let (coarse, _) = downsample_labels(&mapped, self.batch, self.patch, f);
            out.push(self.target(map, coarse));
        }
        Ok(out)
    }

    /// One level's target from its class indices.
    fn target(&self, map: &ClassMap, classes: Vec<u16>) -> Target {
        if !map.labels().is_regions() {
            return Target::Classes(as_index(classes));
        }
        // As nnU-Net's region targets: one channel per region, and with an ignore label a
        // last channel marking it (its DC_and_BCE_loss takes the mask from there).
        let regions = map.region_classes();
        let (mut planes, _) = region_membership(&classes, self.batch, regions, Some(IGNORE));
        let channels = regions.len() + usize::from(map.labels().ignore().is_some());
        if channels > regions.len() {
            let v = classes.len() / self.batch;
            let r = regions.len();
            let mut with_mask = Vec::with_capacity(self.batch * channels * v);
            for (b, labels) in classes.chunks_exact(v).enumerate() {
                with_mask.extend_from_slice(&planes[b * r * v..(b + 1) * r * v]);
                with_mask.extend(labels.iter().map(|&c| u8::from(c == IGNORE)));
            }
            planes = with_mask;
        }
        Target::Regions(planes, channels)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loader> {
        self.loader.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Deep-supervision factors must divide the patch, and come with targets.
fn check_deep_supervision(
    factors: &[[usize; 3]],
    patch: [usize; 3],
    targets: bool,
) -> PyResult<()> {
    for f in factors {
        if (0..3).any(|a| f[a] == 0 || !patch[a].is_multiple_of(f[a])) || !targets {
            return Err(crate::errors::ConfigError::new_err(format!(
                "deep_supervision factor {f:?}: each must divide the patch {patch:?} (z, y, x), \
                 and the targets are class indices: give targets=True"
            )));
        }
    }
    Ok(())
}

/// One level's target.
/// A batch buffer lent to numpy without a copy: the base object of its array, which gives the
/// buffer back to the loader's workers when numpy and torch let go of it.
#[pyclass(module = "voxcache", frozen)]
struct Owned(OwnedBuf);

enum OwnedBuf {
    Image(Vec<f32>, Recycler),
    Label(Vec<u16>, Recycler),
}

impl OwnedBuf {
    /// The buffer as an array of `shape`, owned by an [`Owned`].
    fn into_array<'py, D: IntoDimension>(
        self,
        py: Python<'py>,
        shape: D,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        D::Dim: Dimension,
    {
        fn view<'py, T: Element, D: Dimension>(
            v: &[T],
            shape: D,
            owner: Bound<'py, PyAny>,
        ) -> PyResult<Bound<'py, PyAny>> {
            let view = ArrayView::from_shape(shape, v)
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
            // SAFETY: the owner holds the buffer and never touches it until it is dropped,
            // which numpy does only once the array (and every view of it) is gone.
            Ok(unsafe { PyArray::borrow_from_array(&view, owner) }.into_any())
        }
        let owner = Bound::new(py, Owned(self))?;
        let shape = shape.into_dimension();
        // The array holds a reference to the owner, whose Vec's heap block stays in place.
        match &owner.get().0 {
            OwnedBuf::Image(v, _) => view(v, shape, owner.clone().into_any()),
            OwnedBuf::Label(v, _) => view(v, shape, owner.clone().into_any()),
        }
    }
}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        match self {
            OwnedBuf::Image(v, back) => back.image(std::mem::take(v)),
            OwnedBuf::Label(v, back) => back.label(std::mem::take(v)),
        }
    }
}

enum Target {
    /// Class indices, int64, the ignore label [`IGNORE_INDEX`].
    Classes(Vec<i64>),
    /// Region membership, uint8, and its channels (the regions, then the ignore label's).
    Regions(Vec<u8>, usize),
}

/// Class indices (the ignore label [`IGNORE`]) as int64, the ignore label [`IGNORE_INDEX`].
fn as_index(classes: Vec<u16>) -> Vec<i64> {
    classes
        .into_iter()
        .map(|c| match c {
            IGNORE => IGNORE_INDEX,
            c => i64::from(c),
        })
        .collect()
}
