//! The `build-cache` job: scan, plan, then build each case's entry chunk by chunk.
//!
//! This module is the orchestrator (which cases to build, in what order, what to report);
//! `case.rs` does one case's work, `run.rs` runs the job loop and `progress.rs` shows it. Scanning lives in
//! [`crate::prep::dataset::scan`], planning in [`crate::prep::plan`], the entry's bytes in
//! [`crate::cache::writer`] and their schema in [`crate::format`].

mod case;
mod entry;
pub mod nnunet;
pub mod previous;
pub mod previous_probabilities;
mod progress;
mod run;
mod steps;

use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use self::case::{case_key, Job};
use self::progress::make_progress;
use crate::cache::manifest::{params_key, ManifestDataset};
use crate::cache::s3::RemoteOptions;
use crate::cache::writer::configure_zarrs;
use crate::cache::CacheDir;
use crate::error::{Error, Result};
use crate::format::labels::FileLabels;
use crate::format::{ChannelParams, Compression, ImageDtype, OutputParams};
use crate::nifti_io::SourceOptions;
use crate::prep::dataset::scan::{scan, ScannedCase};
use crate::prep::dataset::{discover, DatasetSource};
use crate::prep::normalize::{self, SchemeStatistics};
use crate::prep::plan::{
    dataset_foreground, decide_spacing, plan_scanned, CasePlan, SpacingDecision,
};
use crate::prep::settings::{Layout, Settings};
use crate::util::sysinfo::peak_rss_bytes;

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
    /// Preprocess as nnU-Net does for this plans file's configuration ([`nnunet`]) instead
    /// of with `settings`' spacing and normalization (its layout options still apply).
    pub nnunet: Option<nnunet::NnunetSource>,
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

/// Run the whole job: scan the cases, decide the spacing, the layout and the parameters,
/// key each case, build the entries not in the cache yet, record them in the manifest.
pub fn build_cache(opts: &BuildOptions) -> Result<BuildReport> {
    let started = Instant::now();
    opts.settings.validate()?;
    configure_zarrs();
    steps::check_cascade(opts)?;
    let name = opts
        .name
        .clone()
        .unwrap_or_else(|| crate::prep::dataset::default_name(&opts.source));
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
    let label_values = description.as_ref().map(|d| FileLabels::of(d).values());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.jobs)
        .build()
        .map_err(|e| Error::Config(format!("cannot start {} worker threads: {e}", opts.jobs)))?;

    let scanned_all = pool.install(|| scan(&cases));
    let mut reports: Vec<CaseReport> = found
        .problems
        .into_iter()
        .map(|p| failed(p.id, None, &p.error))
        .collect();
    let ok = steps::readable(&scanned_all, &mut reports)?;
    let nnunet = match &opts.nnunet {
        Some(src) => {
            if let crate::remote::Location::S3(_) = crate::remote::Location::parse(&opts.cache_dir)?
            {
                return Err(Error::Config(format!(
                    "{}: --nnunet-plans builds into a local cache folder (an s3:// cache is not supported with it yet)",
                    opts.cache_dir.display()
                )));
            }
            Some(nnunet::NnunetBuild::read(src, &opts.source)?)
        }
        None => None,
    };
    let with_plans;
    let opts = match &nnunet {
        None => opts,
        Some(b) => {
            let ignore = description
                .as_ref()
                .and_then(|d| FileLabels::of(d).ignore());
            with_plans = BuildOptions {
                fixed_params: Some(b.params(&opts.settings, ignore)),
                ..opts.clone()
            };
            &with_plans
        }
    };
    let decision = match (&nnunet, &opts.fixed_params) {
        (Some(b), _) => SpacingDecision {
            // The forecast's grid: each case's own, before nnU-Net's crop.
            target_xyz: ok.first().map_or([1.0; 3], |s| b.file_target_xyz(&s.image)),
            median_xyz: ok.first().map_or([1.0; 3], |s| b.file_target_xyz(&s.image)),
            rule: "nnU-Net plans".into(),
            reason: format!(
                "{} configuration {}: spacing {:?} in its transposed axes",
                b.record.plans, b.record.configuration, b.plans.configuration.spacing
            ),
        },
        (None, Some(p)) => SpacingDecision {
            target_xyz: p.target_spacing_xyz,
            median_xyz: p.target_spacing_xyz,
            rule: "explicit".into(),
            reason: "fixed by the parameters given (a model's preprocessing)".into(),
        },
        (None, None) => decide_spacing(opts.settings.spacing, &ok)?,
    };
    let (decided, layout) = steps::choose_layout(opts, &ok, &decision);
    let opts = decided.as_ref().unwrap_or(opts);
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

    let cache = steps::open_cache(opts)?;
    // Large inputs are inflated into tmp/ and read from there (unlinked at once: a killed
    // build leaves nothing behind).
    let source = SourceOptions {
        ram_limit_bytes: opts.settings.input_ram_mib.saturating_mul(1 << 20),
        scratch_dir: cache.tmp_dir(),
    };
    let (params, channel_names) = steps::output_params(
        opts,
        &ok,
        (description.as_ref(), &previous_values),
        &decision,
        &pool,
        &source,
    )?;

    // This build's share of the cases (all of them unless --part); keys first (hashing is
    // cheap), so we know what is cached before any heavy work.
    let mine: Vec<usize> = (0..ok.len())
        .filter(|i| opts.part.is_none_or(|(k, n)| i % n == k))
        .collect();
    let keyed: Vec<(usize, Result<String>)> = pool.install(|| {
        mine.par_iter()
            .map(|&i| (i, case_key(&params, ok[i])))
            .collect()
    });
    let (jobs, mut manifest_cases) = steps::sort_cases(
        &cache,
        nnunet.is_some(),
        keyed,
        (&ok, &plans),
        opts.settings.max_case_gib,
        label_values.as_ref(),
        &mut reports,
    );
    let jobs = admit_by_space(&cache, jobs, &params, &mut reports);

    let total_voxels: u64 = jobs.iter().map(|j| j.plan.out_voxels).sum();
    let bar = make_progress(opts.progress, total_voxels);
    let outcomes = run::run_jobs(
        &pool,
        &cache,
        &jobs,
        &params,
        nnunet.as_ref(),
        &source,
        &bar,
        opts.quiet,
    );
    steps::settle(
        (&cache, nnunet.is_some()),
        &jobs,
        outcomes,
        &mut report,
        &mut reports,
        &mut manifest_cases,
    );
    bar.finish_and_clear();

    if !manifest_cases.is_empty() {
        cache.record(
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
                origin: steps::origin(opts),
            },
        )?;
    }
    report.finish(reports, started);
    Ok(report)
}

/// The report of a case that failed with `error`.
fn failed(id: String, key: Option<String>, error: &dyn std::fmt::Display) -> CaseReport {
    CaseReport {
        id,
        key,
        outcome: CaseOutcome::Failed {
            error: error.to_string(),
        },
    }
}

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
    if params.compression != crate::format::Compression::None || !cache.backend().holds_entries() {
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
        reports.push(failed(
            job.scanned.source.id.clone(),
            Some(job.key.clone()),
            &e,
        ));
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
