//! The `build-cache` job: scan, plan, then build each case's entry chunk by chunk.

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;

use crate::cache::layout::{dir_bytes, Commit};
use crate::cache::manifest::{self, params_key, ManifestCase, ManifestDataset};
use crate::cache::store::EntryStore;
use crate::cache::writer::{configure_zarrs, write_entry, EntryInput};
use crate::cache::{content_key, CacheDir};
use crate::dataset::{discover, CaseSource, DatasetSource};
use crate::error::{Error, Result};
use crate::format::entry::{InputGeometry, OutputGeometry, SourceFile, Sources};
use crate::geometry::{output_shape, true_output_spacing, zyx, Affine};
use crate::nifti_io::{self, HeaderInfo};
use crate::normalize::{self, ForegroundStats, Normalization};
use crate::pipeline::{ImageDtype, OutputParams, Settings, SpacingChoice};
use crate::plan::{auto_spacing, plan_cases, CasePlan, SpacingDecision};
use crate::sysinfo::{human_bytes, peak_rss_bytes};

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    pub source: DatasetSource,
    pub cache_dir: PathBuf,
    /// Dataset name in the manifest; defaults to the data folder's name.
    pub name: Option<String>,
    pub settings: Settings,
    /// Worker threads; 0 means one per core.
    pub jobs: usize,
    pub dry_run: bool,
    /// Build only cases whose index modulo `count` is `index` (one part per array job).
    pub part: Option<(usize, usize)>,
    /// Show progress bars when stderr is a terminal.
    pub progress: bool,
    /// Print only errors (no per-case lines).
    pub quiet: bool,
}

/// A case's headers, checked against each other.
#[derive(Clone, Debug, Serialize)]
pub struct ScannedCase {
    pub source: CaseSource,
    pub image: HeaderInfo,
    pub label: Option<HeaderInfo>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CaseOutcome {
    Built { bytes: u64, seconds: f64 },
    Cached,
    Failed { error: String },
    Skipped,
}

#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    pub id: String,
    pub key: Option<String>,
    pub outcome: CaseOutcome,
}

#[derive(Clone, Debug, Serialize)]
pub struct BuildReport {
    pub dataset: String,
    pub cache_dir: PathBuf,
    pub decision: Option<SpacingDecision>,
    pub plans: Vec<CasePlan>,
    pub cases: Vec<CaseReport>,
    pub dry_run: bool,
    pub built: usize,
    pub cached: usize,
    pub failed: usize,
    pub bytes_written: u64,
    pub voxels_built: u64,
    pub wall_seconds: f64,
    pub peak_rss_bytes: Option<u64>,
}

/// Check that an image and its label describe the same grid.
fn check_pair(id: &str, image: &HeaderInfo, label: &HeaderInfo) -> Result<()> {
    if image.shape_xyz != label.shape_xyz {
        return Err(Error::case(
            id,
            format!(
                "image {} is {:?} voxels but label {} is {:?}",
                image.path.display(),
                image.shape_xyz,
                label.path.display(),
                label.shape_xyz
            ),
        ));
    }
    let scale = image
        .affine
        .0
        .iter()
        .flatten()
        .fold(1.0f64, |m, v| m.max(v.abs()));
    let diff = image.affine.max_abs_diff(&label.affine);
    if diff > 1e-4 * scale {
        return Err(Error::case(
            id,
            format!(
                "image {} and label {} have different geometry (affines differ by up to {diff:.3e}; spacings {:?} vs {:?})",
                image.path.display(),
                label.path.display(),
                image.spacing_xyz,
                label.spacing_xyz
            ),
        ));
    }
    Ok(())
}

/// Read and check every case's headers (in parallel; only header bytes are read).
pub fn scan(cases: &[CaseSource]) -> Vec<(CaseSource, Result<ScannedCase>)> {
    cases
        .par_iter()
        .map(|c| {
            let r = (|| {
                let image = nifti_io::read_header(&c.image)?;
                let label = match &c.label {
                    Some(l) => {
                        let h = nifti_io::read_header(l)?;
                        check_pair(&c.id, &image, &h)?;
                        Some(h)
                    }
                    None => None,
                };
                Ok(ScannedCase {
                    source: c.clone(),
                    image,
                    label,
                })
            })();
            (c.clone(), r)
        })
        .collect()
}

/// Choose the target spacing for a set of scanned cases.
pub fn decide_spacing(choice: SpacingChoice, scanned: &[&ScannedCase]) -> Result<SpacingDecision> {
    if scanned.is_empty() && choice == SpacingChoice::Auto {
        return Err(Error::Dataset(
            "no readable case to choose a spacing from".into(),
        ));
    }
    let auto = auto_spacing(
        &scanned
            .iter()
            .map(|s| s.image.spacing_xyz)
            .collect::<Vec<_>>(),
        &scanned
            .iter()
            .map(|s| s.image.shape_xyz)
            .collect::<Vec<_>>(),
    );
    Ok(match choice {
        SpacingChoice::Auto => auto,
        SpacingChoice::Explicit(t) => SpacingDecision {
            target_xyz: t,
            median_xyz: auto.median_xyz,
            rule: "explicit".into(),
            reason: "given with --spacing or by the pipeline".into(),
        },
    })
}

/// Plans for scanned cases at a target spacing.
pub fn plan_scanned(
    scanned: &[&ScannedCase],
    target: [f64; 3],
    image_dtype: ImageDtype,
) -> Vec<CasePlan> {
    let bpv = match image_dtype {
        ImageDtype::Float32 => 4,
        ImageDtype::Float16 => 2,
    };
    let rows: Vec<(String, [usize; 3], [f64; 3], usize)> = scanned
        .iter()
        .map(|s| {
            let label_bpv = s.label.as_ref().map_or(0, |_| 1);
            (
                s.source.id.clone(),
                s.image.shape_xyz,
                s.image.spacing_xyz,
                label_bpv,
            )
        })
        .collect();
    plan_cases(&rows, target, bpv)
}

/// Pool foreground intensities over the dataset for CT normalization.
fn dataset_foreground(scanned: &[&ScannedCase]) -> Result<ForegroundStats> {
    let mut samples = Vec::new();
    for s in scanned {
        let Some(label_path) = &s.source.label else {
            continue;
        };
        let image = nifti_io::read_volume(&s.source.image)?;
        let label = nifti_io::read_volume(label_path)?;
        samples.extend(normalize::sample_foreground(
            &image.data,
            |i| label.data[i] > 0.0,
            10_000,
        ));
    }
    normalize::foreground_stats(samples).ok_or_else(|| {
        Error::Dataset("ct normalization needs labelled foreground, and no case has any".into())
    })
}

fn make_progress(enabled: bool, total: u64) -> ProgressBar {
    let target = if enabled && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let mvox = |v: u64| format!("{:.1}", v as f64 / 1e6);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>11} [{bar:24}] {done}/{total} Mvoxel {rate} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key(
            "done",
            move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&mvox(s.pos()));
            },
        )
        .with_key(
            "total",
            move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&mvox(s.len().unwrap_or(0)));
            },
        )
        .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.1} Mvoxel/s", s.per_sec() / 1e6);
        })
        .progress_chars("=> "),
    );
    bar
}

/// Print a line above the progress bar (or plainly when there is none).
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default()
}

/// Everything known about one case before it is built.
struct Job<'a> {
    scanned: &'a ScannedCase,
    plan: &'a CasePlan,
    key: String,
}

/// A case read, checked and normalized, ready to be written.
struct Decoded {
    image: nifti_io::Volume,
    label: Option<nifti_io::LabelData>,
    /// The label file's blake3 and size.
    label_hash: Option<(blake3::Hash, u64)>,
    stats: normalize::IntensityStats,
    applied: normalize::AppliedNormalization,
}

/// Read, check and normalize one case's input (everything before resampling).
fn decode_case(job: &Job, params: &OutputParams) -> Result<Decoded> {
    let s = job.scanned;
    let id = &s.source.id;
    // Image and label inflate on two threads: gzip decoding is sequential within a file.
    let (image, label) = rayon::join(
        || nifti_io::read_volume(&s.source.image),
        || s.source.label.as_ref().map(|p| nifti_io::read_label(p)),
    );
    let mut image = image?;
    let (label, label_hash) = match label {
        Some(l) => {
            let l = l?;
            check_pair(id, &image.header, &l.header)?;
            (Some(l.data), Some((l.file_hash, l.file_bytes)))
        }
        None => (None, None),
    };
    // The files may have changed since the key was computed: refuse to file them under it.
    let key = content_key(
        params,
        id,
        &image.file_hash,
        label_hash.as_ref().map(|h| &h.0),
    );
    if key != job.key {
        return Err(Error::case(
            id,
            "an input file changed during the build; run it again",
        ));
    }
    let stats = normalize::intensity_stats(&image.data);
    if stats.nonfinite_voxels > 0 {
        return Err(Error::nifti(
            &s.source.image,
            format!(
                "{} voxels are NaN or infinite; fix or mask them before caching",
                stats.nonfinite_voxels
            ),
        ));
    }
    let applied = normalize::plan_normalization(
        params.normalization,
        &stats,
        params.dataset_foreground.as_ref(),
    )?;
    normalize::apply(&mut image.data, &applied);
    Ok(Decoded {
        image,
        label,
        label_hash,
        stats,
        applied,
    })
}

/// Write one decoded case's entry into a temporary folder and move it into place.
fn write_case(
    cache: &CacheDir,
    job: &Job,
    params: &OutputParams,
    decoded: Decoded,
    on_voxels: &(dyn Fn(u64) + Sync),
) -> Result<Written> {
    let s = job.scanned;
    let id = &s.source.id;
    let key = &job.key;
    let Decoded {
        image,
        label,
        label_hash,
        stats,
        applied,
    } = decoded;
    let image_hash = image.file_hash;
    let out_xyz = job.plan.out_shape_xyz;
    let out_affine: Affine = image
        .header
        .affine
        .for_output_grid(image.header.shape_xyz, out_xyz);
    let h = &image.header;
    let source = Sources {
        image: SourceFile {
            file: file_name(&s.source.image),
            blake3: image_hash.to_hex().to_string(),
            bytes: image.file_bytes,
        },
        label: match (&s.source.label, &label_hash) {
            (Some(p), Some((hash, bytes))) => Some(SourceFile {
                file: file_name(p),
                blake3: hash.to_hex().to_string(),
                bytes: *bytes,
            }),
            _ => None,
        },
    };
    let input = InputGeometry {
        shape_xyz: h.shape_xyz,
        spacing_xyz: h.spacing_xyz,
        affine: h.affine,
        affine_source: h.affine_source.to_string(),
        orientation: h.affine.axis_codes(),
        datatype: h.datatype.to_string(),
        unit: h.unit.to_string(),
    };
    let output = OutputGeometry::new(
        out_xyz,
        job.plan.out_spacing_xyz,
        params.target_spacing_xyz,
        out_affine,
    );

    let tmp = cache.new_tmp_entry(key)?;
    let store = std::sync::Arc::new(EntryStore::new(&tmp));
    let result = (|| {
        write_entry(
            &store,
            &tmp,
            EntryInput {
                case_id: id,
                key,
                image: &image.data,
                label: label.as_ref(),
                in_shape_zyx: zyx(image.header.shape_xyz),
                out_shape_zyx: zyx(out_xyz),
                params,
                source,
                input,
                output,
                intensity: stats,
                normalization: applied,
            },
            on_voxels,
        )?;
        Ok(())
    })();
    match result {
        Ok(()) => Ok(Written {
            tmp,
            key: key.clone(),
            store,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// An entry fully written into its temporary folder, not yet durable nor in place.
struct Written {
    tmp: PathBuf,
    key: String,
    store: std::sync::Arc<EntryStore>,
}

/// Make a written entry durable and rename it into place; returns the bytes it added.
fn commit_written(cache: &CacheDir, w: Written) -> Result<u64> {
    let result = (|| {
        w.store.sync_all().map_err(|e| Error::io(&w.tmp, e))?;
        let bytes = dir_bytes(&w.tmp);
        failpoint("after-write")?;
        cache
            .commit(&w.tmp, &w.key)
            .map(|c| if c == Commit::Placed { bytes } else { 0 })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&w.tmp);
    }
    result
}

/// One line per finished case (errors always, successes unless quiet).
fn report_case(bar: &ProgressBar, quiet: bool, job: &Job, t0: Instant, r: &Result<u64>) {
    let id = &job.scanned.source.id;
    match r {
        Ok(bytes) if !quiet => {
            let (i, o) = (job.plan.in_shape_xyz, job.plan.out_shape_xyz);
            say(
                bar,
                format!(
                    "built  {id}: {}x{}x{} -> {}x{}x{} ({}) in {:.1} s{}",
                    i[0],
                    i[1],
                    i[2],
                    o[0],
                    o[1],
                    o[2],
                    human_bytes(*bytes),
                    t0.elapsed().as_secs_f64(),
                    if job.plan.outlier {
                        format!("  [outlier: {:.1}x the median size]", job.plan.size_factor)
                    } else {
                        String::new()
                    }
                ),
            );
        }
        Ok(_) => {}
        Err(e) => say(bar, format!("error: {e}")),
    }
}

/// Test hook: `VOXCACHE_FAILPOINT=after-write` makes a build die right before the commit, as a
/// killed process would, so tests can check that nothing half-written is left looking complete.
fn failpoint(name: &str) -> Result<()> {
    if std::env::var("VOXCACHE_FAILPOINT").is_ok_and(|v| v == name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
    Ok(())
}

fn is_disk_full(msg: &str) -> bool {
    msg.contains("No space left on device")
        || msg.contains("StorageFull")
        || msg.contains("Disk quota exceeded")
}

/// Run the whole job.
pub fn build_cache(opts: &BuildOptions) -> Result<BuildReport> {
    let started = Instant::now();
    opts.settings.validate()?;
    configure_zarrs();
    let name = opts
        .name
        .clone()
        .unwrap_or_else(|| crate::dataset::default_name(&opts.source));
    let cases = discover(&opts.source)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.jobs)
        .build()
        .map_err(|e| Error::Config(format!("cannot start {} worker threads: {e}", opts.jobs)))?;

    let scanned_all = pool.install(|| scan(&cases));
    let mut reports: Vec<CaseReport> = Vec::new();
    let mut ok: Vec<&ScannedCase> = Vec::new();
    for (c, r) in &scanned_all {
        match r {
            Ok(s) => ok.push(s),
            Err(e) => reports.push(CaseReport {
                id: c.id.clone(),
                key: None,
                outcome: CaseOutcome::Failed {
                    error: e.to_string(),
                },
            }),
        }
    }
    for r in &reports {
        if let CaseOutcome::Failed { error } = &r.outcome {
            eprintln!("error: {error}");
        }
    }
    let decision = decide_spacing(opts.settings.spacing, &ok)?;
    let plans = plan_scanned(&ok, decision.target_xyz, opts.settings.image_dtype);

    let mut report = BuildReport {
        dataset: name.clone(),
        cache_dir: opts.cache_dir.clone(),
        decision: Some(decision.clone()),
        plans: plans.clone(),
        cases: Vec::new(),
        dry_run: opts.dry_run,
        built: 0,
        cached: 0,
        failed: reports.len(),
        bytes_written: 0,
        voxels_built: 0,
        wall_seconds: 0.0,
        peak_rss_bytes: None,
    };
    if opts.dry_run {
        report.cases = reports;
        report.wall_seconds = started.elapsed().as_secs_f64();
        report.peak_rss_bytes = peak_rss_bytes();
        return Ok(report);
    }

    let cache = CacheDir::new(&opts.cache_dir);
    cache.prepare()?;
    for p in cache.sweep_tmp()? {
        eprintln!(
            "removed a stale temporary entry left by an interrupted build: {}",
            p.display()
        );
    }

    // This build's share of the cases (all of them unless --part).
    let mine: Vec<usize> = (0..ok.len())
        .filter(|i| opts.part.is_none_or(|(k, n)| i % n == k))
        .collect();
    let fg_stats = if opts.settings.normalization == Normalization::Ct {
        Some(dataset_foreground(&ok)?)
    } else {
        None
    };
    let params = OutputParams::new(&opts.settings, decision.target_xyz, fg_stats);

    // Keys first (hashing is cheap), so we know what is cached before any heavy work.
    let keyed: Vec<(usize, Result<String>)> = pool.install(|| {
        mine.par_iter()
            .map(|&i| {
                let s = ok[i];
                let k = (|| {
                    let ih = hash_file(&s.source.image)?;
                    let lh = match &s.source.label {
                        Some(l) => Some(hash_file(l)?),
                        None => None,
                    };
                    Ok(content_key(&params, &s.source.id, &ih, lh.as_ref()))
                })();
                (i, k)
            })
            .collect()
    });

    let mut jobs: Vec<Job> = Vec::new();
    let mut manifest_cases = std::collections::BTreeMap::new();
    for (i, k) in keyed {
        let s = ok[i];
        match k {
            Err(e) => {
                eprintln!("error: {e}");
                reports.push(CaseReport {
                    id: s.source.id.clone(),
                    key: None,
                    outcome: CaseOutcome::Failed {
                        error: e.to_string(),
                    },
                });
            }
            Ok(key) if cache.has_entry(&key) => {
                manifest_cases.insert(
                    s.source.id.clone(),
                    ManifestCase {
                        key: key.clone(),
                        entry: CacheDir::entry_rel(&key),
                        out_shape_zyx: zyx(plans[i].out_shape_xyz),
                    },
                );
                reports.push(CaseReport {
                    id: s.source.id.clone(),
                    key: Some(key),
                    outcome: CaseOutcome::Cached,
                });
            }
            Ok(key) => jobs.push(Job {
                scanned: s,
                plan: &plans[i],
                key,
            }),
        }
    }

    let total_voxels: u64 = jobs.iter().map(|j| j.plan.out_voxels).sum();
    let bar = make_progress(opts.progress, total_voxels);
    let n_jobs = jobs.len();
    let mut disk_full = false;
    // Three stages overlap: case n+1 is read and normalized while case n is resampled and
    // written, and case n-1 is fsynced and renamed into place in the background. Memory: two
    // inputs at most; the output never sits in memory.
    let mut next: Option<Result<Decoded>> = jobs
        .first()
        .map(|j| pool.install(|| decode_case(j, &params)));
    let mut outcomes: Vec<(usize, Instant, Result<u64>)> = Vec::new();
    std::thread::scope(|scope| {
        let mut in_flight: Option<(usize, Instant, std::thread::ScopedJoinHandle<Result<u64>>)> =
            None;
        let settle = |done: (usize, Instant, std::thread::ScopedJoinHandle<Result<u64>>),
                      disk_full: &mut bool,
                      outcomes: &mut Vec<(usize, Instant, Result<u64>)>| {
            let (i, t0, h) = done;
            let r = h.join().unwrap_or_else(|_| {
                Err(Error::case(
                    &jobs[i].scanned.source.id,
                    "the commit thread panicked",
                ))
            });
            if let Err(e) = &r {
                *disk_full |= is_disk_full(&e.to_string());
            }
            report_case(&bar, opts.quiet, &jobs[i], t0, &r);
            outcomes.push((i, t0, r));
        };
        for (n, job) in jobs.iter().enumerate() {
            let decoded = next.take();
            if disk_full {
                continue;
            }
            bar.set_prefix(format!("case {}/{}", n + 1, n_jobs));
            bar.set_message(job.scanned.source.id.clone());
            let t0 = Instant::now();
            let on_voxels = |v: u64| bar.inc(v);
            let (written, prefetched) = pool.install(|| {
                rayon::join(
                    || {
                        decoded
                            .unwrap_or_else(|| decode_case(job, &params))
                            .and_then(|d| write_case(&cache, job, &params, d, &on_voxels))
                    },
                    || jobs.get(n + 1).map(|j| decode_case(j, &params)),
                )
            });
            next = prefetched;
            if let Some(prev) = in_flight.take() {
                settle(prev, &mut disk_full, &mut outcomes);
            }
            match written {
                Ok(w) => {
                    let cache = &cache;
                    in_flight = Some((n, t0, scope.spawn(move || commit_written(cache, w))));
                }
                Err(e) => {
                    disk_full |= is_disk_full(&e.to_string());
                    let r = Err(e);
                    report_case(&bar, opts.quiet, job, t0, &r);
                    outcomes.push((n, t0, r));
                }
            }
        }
        if let Some(prev) = in_flight.take() {
            settle(prev, &mut disk_full, &mut outcomes);
        }
    });
    if disk_full {
        say(&bar, "the disk is full: the remaining cases were skipped; free space and run again (built entries are kept)".into());
    }
    let settled: std::collections::BTreeSet<usize> = outcomes.iter().map(|o| o.0).collect();
    for (i, job) in jobs.iter().enumerate() {
        if !settled.contains(&i) {
            reports.push(CaseReport {
                id: job.scanned.source.id.clone(),
                key: Some(job.key.clone()),
                outcome: CaseOutcome::Skipped,
            });
        }
    }
    for (i, t0, r) in outcomes {
        let job = &jobs[i];
        let id = job.scanned.source.id.clone();
        let outcome = match r {
            Ok(bytes) => {
                report.bytes_written += bytes;
                report.voxels_built += job.plan.out_voxels;
                manifest_cases.insert(
                    id.clone(),
                    ManifestCase {
                        key: job.key.clone(),
                        entry: CacheDir::entry_rel(&job.key),
                        out_shape_zyx: zyx(job.plan.out_shape_xyz),
                    },
                );
                CaseOutcome::Built {
                    bytes,
                    seconds: t0.elapsed().as_secs_f64(),
                }
            }
            Err(e) => CaseOutcome::Failed {
                error: e.to_string(),
            },
        };
        reports.push(CaseReport {
            id,
            key: Some(job.key.clone()),
            outcome,
        });
    }
    bar.finish_and_clear();

    if !manifest_cases.is_empty() {
        manifest::record(
            &cache,
            &name,
            ManifestDataset {
                pipeline: opts.settings.pipeline.clone(),
                params_key: params_key(&params),
                params: params.clone(),
                spacing_rule: decision.rule.clone(),
                spacing_reason: decision.reason.clone(),
                cases: manifest_cases,
            },
        )?;
    }
    reports.sort_by(|a, b| a.id.cmp(&b.id));
    report.built = reports
        .iter()
        .filter(|r| matches!(r.outcome, CaseOutcome::Built { .. }))
        .count();
    report.cached = reports
        .iter()
        .filter(|r| r.outcome == CaseOutcome::Cached)
        .count();
    report.failed = reports
        .iter()
        .filter(|r| matches!(r.outcome, CaseOutcome::Failed { .. } | CaseOutcome::Skipped))
        .count();
    report.cases = reports;
    report.wall_seconds = started.elapsed().as_secs_f64();
    report.peak_rss_bytes = peak_rss_bytes();
    Ok(report)
}

fn hash_file(path: &Path) -> Result<blake3::Hash> {
    let mut h = blake3::Hasher::new();
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    h.update_reader(f).map_err(|e| Error::io(path, e))?;
    Ok(h.finalize())
}

/// Output shape of one header at a target spacing (for tests and inspect).
pub fn out_shape_for(h: &HeaderInfo, target: [f64; 3]) -> [usize; 3] {
    output_shape(h.shape_xyz, h.spacing_xyz, target)
}

/// True output spacing of one header at a target spacing.
pub fn out_spacing_for(h: &HeaderInfo, target: [f64; 3]) -> [f64; 3] {
    true_output_spacing(h.shape_xyz, h.spacing_xyz, out_shape_for(h, target))
}
