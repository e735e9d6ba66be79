//! The `build-cache` job: scan, plan, then build each case's entry chunk by chunk.
//!
//! This module is the orchestrator (which cases to build, in what order, what to report);
//! `case.rs` does one case's work, `run.rs` runs the job loop and `progress.rs` shows it. Scanning lives in
//! [`crate::prep::dataset::scan`], planning in [`crate::prep::plan`], the entry's bytes in
//! [`crate::cache::writer`] and their schema in [`crate::format`].

mod case;
mod entry;
pub mod previous;
pub mod previous_probabilities;
mod progress;
mod run;

use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use self::case::{case_key, Job};
use self::progress::make_progress;
use crate::cache::manifest::{self, params_key, ManifestCase, ManifestDataset};
use crate::cache::s3::{RemoteCache, RemoteOptions};
use crate::cache::writer::configure_zarrs;
use crate::cache::CacheDir;
use crate::error::{Error, Result};
use crate::format::manifest::DatasetOrigin;
use crate::format::{ChannelParams, Compression, ImageDtype, OutputParams};
use crate::geometry::zyx;
use crate::nifti_io::SourceOptions;
use crate::prep::dataset::scan::{scan, ScannedCase};
use crate::prep::dataset::{discover, DatasetSource};
use crate::prep::normalize::{self, Normalization, SchemeStatistics};
use crate::prep::plan::{
    dataset_foreground, decide_spacing, plan_scanned, CasePlan, SpacingDecision,
};
use crate::prep::settings::{Layout, Settings, AUTO_PACKED_ABOVE_BYTES};
use crate::remote::Location;
use crate::util::sysinfo::{human_bytes, peak_rss_bytes};

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Where the cases come from.
    pub source: DatasetSource,
    /// The cache folder to build into (created if missing), or `s3://BUCKET/PREFIX`.
    pub cache_dir: PathBuf,
    /// For a cache on S3: the endpoint flag and the local staging folder.
    pub remote: RemoteOptions,
    /// Dataset name in the manifest; defaults to the data folder's name.
    pub name: Option<String>,
    /// Cache parameters: defaults, pipeline and flags merged.
    pub settings: Settings,
    /// Worker threads; 0 means one per core.
    pub jobs: usize,
    /// Scan and plan only; write nothing.
    pub dry_run: bool,
    /// Build only cases whose index modulo `count` is `index` (one part per array job).
    pub part: Option<(usize, usize)>,
    /// Show progress bars when stderr is a terminal.
    pub progress: bool,
    /// Print only errors (no per-case lines).
    pub quiet: bool,
    /// Build with exactly these parameters instead of deriving them from `settings` and the
    /// dataset: how predict preprocesses new volumes as a model's cache was made (its target
    /// spacing, and each channel's normalization with the training set's statistics).
    pub fixed_params: Option<OutputParams>,
    /// A cascade's first stage: the folder of its segmentations of these cases (in their own
    /// geometry), added as one image channel per foreground label ([`previous`]).
    pub previous_stage: Option<PathBuf>,
}

/// How one case of a build ended.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CaseOutcome {
    /// Its entry was written and committed by this build.
    Built {
        /// Bytes the entry added to the cache (0 when another builder placed it first).
        bytes: u64,
        /// Seconds from the start of its write to its commit (it overlaps the reading of the
        /// next case and the commit of the previous one).
        seconds: f64,
    },
    /// Its entry was already in the cache (same content key): nothing written.
    Cached,
    /// It could not be scanned, hashed, read or written.
    Failed {
        /// The error, as printed.
        error: String,
    },
    /// Not attempted: the disk filled up earlier in the build.
    Skipped,
}

/// One case's line in a build report.
#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    /// Case id.
    pub id: String,
    /// Content key of its entry; `None` when the case failed before it was known.
    pub key: Option<String>,
    /// How it ended.
    pub outcome: CaseOutcome,
}

/// What a build did: the summary `prep build-cache` prints, and its `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct BuildReport {
    /// Dataset name in the manifest.
    pub dataset: String,
    /// The chunk layout built, in words ("packed: float16, blosc-lz4, ...").
    pub layout: String,
    /// The cached image's element type (the layout's: `auto` decides it).
    pub image_dtype: ImageDtype,
    /// The cache folder built into.
    pub cache_dir: PathBuf,
    /// The target spacing and why (always set by [`build_cache`]).
    pub decision: Option<SpacingDecision>,
    /// Output grid and cost of every readable case (this part's or not).
    pub plans: Vec<CasePlan>,
    /// One report per case, sorted by id.
    pub cases: Vec<CaseReport>,
    /// Whether nothing was written (`--dry-run`).
    pub dry_run: bool,
    /// Cases whose entry this build wrote.
    pub built: usize,
    /// Cases whose entry was already there.
    pub cached: usize,
    /// Cases that failed or were skipped.
    pub failed: usize,
    /// Bytes the built entries added to the cache.
    pub bytes_written: u64,
    /// Output voxels of the cases this build wrote (for the voxel rate).
    pub voxels_built: u64,
    /// Wall time of the whole build, scan included.
    pub wall_seconds: f64,
    /// Peak resident memory of this process in bytes, where the OS tells.
    pub peak_rss_bytes: Option<u64>,
}

/// Run the whole job.
pub fn build_cache(opts: &BuildOptions) -> Result<BuildReport> {
    let started = Instant::now();
    opts.settings.validate()?;
    configure_zarrs();
    let name = opts
        .name
        .clone()
        .unwrap_or_else(|| crate::prep::dataset::default_name(&opts.source));
    if let (Some(first), None, None) = (
        &opts.settings.previous_stage_of,
        &opts.previous_stage,
        &opts.fixed_params,
    ) {
        return Err(Error::Config(format!(
            "the configuration is a cascade's second stage after {first}: give --previous-stage, the {first} run folder whose folds' validation holds every case's segmentation"
        )));
    }
    let mut found = discover(&opts.source)?;
    // The label values dataset.json allows, when there is one: a label holding another fails
    // its case (a mislabelled file, or a dataset.json that forgot a class).
    let description = found.description;
    let (cases, previous_values) = match &opts.previous_stage {
        None => (found.cases, Vec::new()),
        Some(dir) => {
            let values = previous::labels(description.as_ref(), dir)?;
            let (cases, problems) = previous::attach(dir, found.cases, &values)?;
            found.problems.extend(problems);
            (cases, values)
        }
    };
    let label_values = description.as_ref().map(|d| d.label_values());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.jobs)
        .build()
        .map_err(|e| Error::Config(format!("cannot start {} worker threads: {e}", opts.jobs)))?;

    let scanned_all = pool.install(|| scan(&cases));
    let mut reports: Vec<CaseReport> = found
        .problems
        .into_iter()
        .map(|p| CaseReport {
            id: p.id,
            key: None,
            outcome: CaseOutcome::Failed {
                error: p.error.to_string(),
            },
        })
        .collect();
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
    for s in &ok {
        let headers = std::iter::once(&s.image)
            .chain(&s.other_channels)
            .chain(s.label.as_ref());
        for h in headers {
            if let Some(w) = &h.affine_warning {
                eprintln!("warning: {}: {w}", h.path.display());
            }
        }
    }
    if ok.is_empty() {
        // Every case failed (each error is printed above): say so plainly, not by what cannot
        // be planned without one.
        return Err(Error::Dataset(format!(
            "none of the {} cases can be built (the errors above say why): nothing to do",
            reports.len()
        )));
    }
    let decision = match &opts.fixed_params {
        Some(p) => SpacingDecision {
            target_xyz: p.target_spacing_xyz,
            median_xyz: p.target_spacing_xyz,
            rule: "explicit".into(),
            reason: "fixed by the parameters given (a model's preprocessing)".into(),
        },
        None => decide_spacing(opts.settings.spacing, &ok)?,
    };
    // `layout = auto`: decided on the whole dataset's forecast (every --part alike).
    let decided;
    let (opts, layout) = match opts.settings.layout {
        Layout::Auto if opts.fixed_params.is_none() => {
            // Cases too large to build fail on their own later: they do not decide the layout.
            let raw = plan_scanned(&ok, decision.target_xyz, ImageDtype::Float32)
                .iter()
                .filter(|p| p.size_problem(opts.settings.max_case_gib).is_none())
                .fold(0u64, |t, p| t.saturating_add(p.out_bytes));
            let mut o = opts.clone();
            let (pick, side) = if raw > AUTO_PACKED_ABOVE_BYTES {
                (Layout::Packed, "over")
            } else {
                (Layout::Raw, "under")
            };
            pick.apply_to(&mut o.settings);
            if o.settings.normalization == Normalization::None {
                // Intensities kept as they are may pass float16's range (16-bit microscopy).
                o.settings.image_dtype = ImageDtype::Float32;
            }
            decided = o;
            let why = format!(
                "auto: {} uncompressed, {side} {}",
                human_bytes(raw),
                human_bytes(AUTO_PACKED_ABOVE_BYTES)
            );
            (&decided, describe_layout(&decided.settings, Some(why)))
        }
        _ => (opts, describe_layout(&opts.settings, None)),
    };
    let plans = plan_scanned(&ok, decision.target_xyz, opts.settings.image_dtype);

    let mut report = BuildReport {
        layout,
        image_dtype: opts.settings.image_dtype,
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
        report.finish(reports, started);
        return Ok(report);
    }

    let cache = match Location::parse(&opts.cache_dir)? {
        Location::Local(p) => CacheDir::new(p),
        Location::S3(url) => {
            let remote = RemoteCache::connect(&url, opts.remote.endpoint.as_deref())?;
            // Staging holds only this build's temporary entries (each removed once uploaded),
            // nothing from the bucket: one folder may stage for several caches.
            CacheDir::staging(opts.remote.staging_for(&url), std::sync::Arc::new(remote))
        }
    };
    cache.prepare()?;
    for p in cache.sweep_tmp()? {
        eprintln!(
            "removed a stale temporary entry left by an interrupted build: {}",
            p.display()
        );
    }
    // In a bucket, what killed uploads left (one LIST; part 0 of a --part build does it).
    // Best effort: a server or a role that cannot list uploads or delete must not stop a build.
    if let (Some(remote), None | Some((0, _))) = (&cache.remote, opts.part) {
        match remote.sweep_orphans(crate::cache::s3::ORPHAN_AGE) {
            Ok(o) if o.entries + o.uploads > 0 => eprintln!(
                "removed what interrupted uploads left in {} over a day ago: {} uncommitted \
                 entries ({} objects, {}), {} unfinished multipart uploads",
                remote.url(),
                o.entries,
                o.objects,
                crate::util::sysinfo::human_bytes(o.bytes),
                o.uploads
            ),
            Ok(_) => {}
            Err(e) => eprintln!("warning: what interrupted uploads left was not swept: {e}"),
        }
    }

    // This build's share of the cases (all of them unless --part).
    let mine: Vec<usize> = (0..ok.len())
        .filter(|i| opts.part.is_none_or(|(k, n)| i % n == k))
        .collect();
    // Large inputs are inflated into tmp/ and read from there (unlinked at once: a killed
    // build leaves nothing behind).
    let source = SourceOptions {
        ram_limit_bytes: opts.settings.input_ram_mib.saturating_mul(1 << 20),
        scratch_dir: cache.tmp_dir(),
    };
    let n_channels = crate::prep::dataset::common_channels(ok.iter().map(|s| &s.source))?;
    let mut channel_names = crate::prep::dataset::channel_names(
        description.as_ref(),
        n_channels - previous_values.len(),
    );
    channel_names.extend(previous_values.iter().map(|&v| previous::channel_name(v)));
    let params = match &opts.fixed_params {
        Some(p) if p.channels.len() != n_channels => {
            return Err(Error::Dataset(format!(
                "the cases have {n_channels} image channel{} but the parameters given are for {}",
                if n_channels == 1 { "" } else { "s" },
                p.channels.len()
            )))
        }
        Some(p) => p.clone(),
        None => {
            let mut p = derive_params(
                opts,
                &ok,
                (&channel_names, &previous_values),
                decision.target_xyz,
                &pool,
                &source,
            )?;
            if p.derived.any() {
                p.derived.ignore_label = description.as_ref().and_then(|d| d.ignore_label);
            }
            p
        }
    };

    // Keys first (hashing is cheap), so we know what is cached before any heavy work.
    let keyed: Vec<(usize, Result<String>)> = pool.install(|| {
        mine.par_iter()
            .map(|&i| (i, case_key(&params, ok[i])))
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
            Ok(key) => match plans[i].size_problem(opts.settings.max_case_gib) {
                Some(why) => {
                    // The image's header holds the spacing and the dimensions to fix: name it.
                    let e = Error::nifti(s.source.image(), why);
                    eprintln!("error: {e}");
                    reports.push(CaseReport {
                        id: s.source.id.clone(),
                        key: Some(key),
                        outcome: CaseOutcome::Failed {
                            error: e.to_string(),
                        },
                    });
                }
                None => jobs.push(Job {
                    scanned: s,
                    plan: &plans[i],
                    key,
                    label_values: label_values.as_ref(),
                }),
            },
        }
    }
    let jobs = admit_by_space(&cache, jobs, &params, &mut reports);

    let total_voxels: u64 = jobs.iter().map(|j| j.plan.out_voxels).sum();
    let bar = make_progress(opts.progress, total_voxels);
    let outcomes = run::run_jobs(&pool, &cache, &jobs, &params, &source, &bar, opts.quiet);
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
    for (i, seconds, r) in outcomes {
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
                CaseOutcome::Built { bytes, seconds }
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
                channels: channel_names,
                cases: manifest_cases,
                dataset_json: description,
                origin: crate::prep::dataset::origin::origin_of(&opts.source).map(|o| {
                    DatasetOrigin {
                        previous_stage: opts
                            .previous_stage
                            .as_ref()
                            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone())),
                        ..o
                    }
                }),
            },
        )?;
    }
    report.finish(reports, started);
    Ok(report)
}

/// "raw: float32, uncompressed 32x128x128 chunks (why)".
fn describe_layout(s: &Settings, why: Option<String>) -> String {
    let [z, y, x] = s.chunk_zyx;
    let codec = match s.compression {
        Compression::None => "uncompressed".to_string(),
        c => c.name().to_string(),
    };
    let shard = s
        .shard_zyx
        .map_or(String::new(), |[a, b, c]| format!(" in {a}x{b}x{c} shards"));
    let name = match s.layout {
        Layout::Auto => "raw",
        l => l.name(),
    };
    let why = why.map_or(String::new(), |w| format!(" ({w})"));
    format!(
        "{name}: {}, {codec} {z}x{y}x{x} chunks{shard}{why}",
        s.image_dtype.dtype().name()
    )
}

/// The parameters of a build from its settings: each channel's scheme (dataset.json's names
/// pick some), with the dataset statistics the CT scheme needs, taken over that channel's
/// foreground.
fn derive_params(
    opts: &BuildOptions,
    ok: &[&ScannedCase],
    (channel_names, previous_values): (&[String], &[u16]),
    target_xyz: [f64; 3],
    pool: &rayon::ThreadPool,
    source: &SourceOptions,
) -> Result<OutputParams> {
    let mut channels = Vec::new();
    let schemes = previous::with_indicators(
        normalize::channel_schemes(&opts.settings, channel_names),
        previous_values,
    );
    for (c, scheme) in schemes.into_iter().enumerate() {
        let dataset_foreground = if scheme.statistics() == SchemeStatistics::DatasetForeground {
            Some(pool.install(|| dataset_foreground(ok, c, source))?)
        } else {
            None
        };
        channels.push(ChannelParams {
            normalization: scheme,
            dataset_foreground,
        });
    }
    Ok(opts.settings.output_params_for(target_xyz, channels))
}

/// Keep, in order, the cases whose entries fit in the disk's free space left by the cases
/// before them; each one that does not is failed alone, naming its file and the figures
/// (one huge case does not stop the others). Only uncompressed caches have a
/// forecast (with a margin); compressed ones are left to the disk-full path.
fn admit_by_space<'a>(
    cache: &CacheDir,
    jobs: Vec<Job<'a>>,
    params: &OutputParams,
    reports: &mut Vec<CaseReport>,
) -> Vec<Job<'a>> {
    // On S3, entries pass through the staging folder one at a time: no forecast to make.
    if params.compression != crate::format::Compression::None || cache.remote.is_some() {
        return jobs;
    }
    let Some(mut left) = crate::util::sysinfo::free_bytes(&cache.root) else {
        return jobs;
    };
    let h = crate::util::sysinfo::human_bytes;
    let mut kept = Vec::with_capacity(jobs.len());
    for job in jobs {
        // The forecast counts the arrays' voxels; padded edge chunks, the fg index and the
        // metadata add up to about a sixth more on small cases: a margin keeps a case admitted
        // from filling the disk halfway.
        let need = job
            .plan
            .out_bytes
            .saturating_add(job.plan.out_bytes / 4)
            .saturating_add(256 << 10);
        if need <= left {
            left -= need;
            kept.push(job);
            continue;
        }
        let e = Error::nifti(
            job.scanned.source.image(),
            format!(
                "its cache entry needs about {} and the disk of {} has {} free{}: free space, \
                 choose another --cache-dir, or use --compression zstd",
                h(need),
                cache.root.display(),
                h(left),
                if kept.is_empty() {
                    ""
                } else {
                    " after the cases before it"
                }
            ),
        );
        reports.push(CaseReport {
            id: job.scanned.source.id.clone(),
            key: Some(job.key.clone()),
            outcome: CaseOutcome::Failed {
                error: e.to_string(),
            },
        });
    }
    kept
}

impl BuildReport {
    /// Sort the case reports, count the outcomes, take the time and the peak memory.
    fn finish(&mut self, mut reports: Vec<CaseReport>, started: Instant) {
        reports.sort_by(|a, b| a.id.cmp(&b.id));
        let count = |f: fn(&CaseOutcome) -> bool| reports.iter().filter(|r| f(&r.outcome)).count();
        self.built = count(|o| matches!(o, CaseOutcome::Built { .. }));
        self.cached = count(|o| *o == CaseOutcome::Cached);
        self.failed = count(|o| matches!(o, CaseOutcome::Failed { .. } | CaseOutcome::Skipped));
        self.cases = reports;
        self.wall_seconds = started.elapsed().as_secs_f64();
        self.peak_rss_bytes = peak_rss_bytes();
    }
}
