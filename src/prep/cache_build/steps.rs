//! The steps of [`super::build_cache`], each a part of the job with one purpose: the cascade's
//! options, which cases are readable, the layout, the cache to write into, the parameters,
//! which cases to build, and what each build came to.

use std::collections::BTreeMap;

use super::case::Job;
use super::{failed, previous, BuildOptions, BuildReport, CaseOutcome, CaseReport};
use crate::cache::manifest::ManifestCase;
use crate::cache::CacheDir;
use crate::error::{Error, Result};
use crate::format::dataset_json::DatasetDescription;
use crate::format::labels::FileLabels;
use crate::format::manifest::DatasetOrigin;
use crate::format::{EntryAttrs, ImageDtype, OutputParams};
use crate::geometry::zyx;
use crate::nifti_io::SourceOptions;
use crate::prep::dataset::scan::ScannedCase;
use crate::prep::dataset::CaseSource;
use crate::prep::normalize::Normalization;
use crate::prep::plan::{plan_scanned, CasePlan, SpacingDecision};
use crate::prep::settings::{Layout, AUTO_PACKED_ABOVE_BYTES};
use crate::util::sysinfo::human_bytes;

/// A cascade's second stage needs the first stage's run folder (unless a model fixes the
/// parameters, as predict does).
pub(super) fn check_cascade(opts: &BuildOptions) -> Result<()> {
    if let (Some(first), None, None) = (
        &opts.settings.previous_stage_of,
        &opts.previous_stage,
        &opts.fixed_params,
    ) {
        return Err(Error::Config(format!(
            "the configuration is a cascade's second stage after {first}: give \
             --previous-stage, the {first} run folder whose folds' validation holds every \
             case's segmentation"
        )));
    }
    Ok(())
}

/// The cases that scanned; each that did not is reported failed. Every failure and every
/// header warning is printed. None readable: an error.
pub(super) fn readable<'a>(
    scanned: &'a [(CaseSource, Result<ScannedCase>)],
    reports: &mut Vec<CaseReport>,
) -> Result<Vec<&'a ScannedCase>> {
    let mut ok = Vec::new();
    for (c, r) in scanned {
        match r {
            Ok(s) => ok.push(s),
            Err(e) => reports.push(failed(c.id.clone(), None, e)),
        }
    }
    for r in reports.iter() {
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
    Ok(ok)
}

/// `layout = auto`: decided on the whole dataset's forecast (every --part alike), as options
/// with the layout applied (`None`: the options as given); and the layout in words.
pub(super) fn choose_layout(
    opts: &BuildOptions,
    ok: &[&ScannedCase],
    decision: &SpacingDecision,
) -> (Option<BuildOptions>, String) {
    if opts.settings.layout != Layout::Auto || opts.fixed_params.is_some() {
        return (None, super::describe_layout(&opts.settings, None));
    }
    // Cases too large to build fail on their own later: they do not decide the layout.
    let raw = plan_scanned(ok, decision.target_xyz, ImageDtype::Float32)
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
    let why = format!(
        "auto: {} uncompressed, {side} {}",
        human_bytes(raw),
        human_bytes(AUTO_PACKED_ABOVE_BYTES)
    );
    let text = super::describe_layout(&o.settings, Some(why));
    (Some(o), text)
}

/// The cache folder to build in, prepared, with what interrupted builds left swept.
pub(super) fn open_cache(opts: &BuildOptions) -> Result<CacheDir> {
    let cache = crate::cache::open_for_build(&opts.cache_dir, &opts.remote)?;
    cache.prepare()?;
    for p in cache.sweep_tmp()? {
        eprintln!(
            "removed a stale temporary entry left by an interrupted build: {}",
            p.display()
        );
    }
    // What killed builders left in the store (one LIST in a bucket; part 0 of a --part build
    // does it). Best effort: a server or a role that cannot list or delete must not stop a
    // build.
    if let None | Some((0, _)) = opts.part {
        match cache.backend().sweep_abandoned() {
            Ok(Some(line)) => eprintln!("{line}"),
            Ok(None) => {}
            Err(e) => eprintln!("warning: what interrupted uploads left was not swept: {e}"),
        }
    }
    Ok(cache)
}

/// The build's parameters (given, or derived from the settings and the cases) and the image
/// channels' names (the first stage's indicator channels last).
pub(super) fn output_params(
    opts: &BuildOptions,
    ok: &[&ScannedCase],
    (description, previous_values): (Option<&DatasetDescription>, &[u16]),
    decision: &SpacingDecision,
    pool: &rayon::ThreadPool,
    source: &SourceOptions,
) -> Result<(OutputParams, Vec<String>)> {
    let n_channels = crate::prep::dataset::common_channels(ok.iter().map(|s| &s.source))?;
    let mut names =
        crate::prep::dataset::channel_names(description, n_channels - previous_values.len());
    names.extend(previous_values.iter().map(|&v| previous::channel_name(v)));
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
            let mut p = super::derive_params(
                opts,
                ok,
                (&names, previous_values),
                decision.target_xyz,
                pool,
                source,
            )?;
            if p.derived.any() {
                p.derived.ignore_label = description.and_then(|d| FileLabels::of(d).ignore());
            }
            p
        }
    };
    Ok((params, names))
}

/// The manifest's record of a case's entry: its shape is the plan's, or, for nnU-Net's
/// preprocessing (`committed`: its crop is known only once the case is read), the entry's own.
fn manifest_case(
    cache: &CacheDir,
    key: &str,
    plan: &CasePlan,
    committed: bool,
) -> Result<ManifestCase> {
    let out_shape_zyx = match committed {
        false => zyx(plan.out_shape_xyz),
        true => {
            let zj = cache.entry_path(key).join(crate::format::ZARR_JSON);
            let bytes = std::fs::read(&zj).map_err(|e| Error::io(&zj, e))?;
            EntryAttrs::from_group_json(&zj, &bytes)?.output.shape_zyx
        }
    };
    Ok(ManifestCase {
        key: key.to_string(),
        entry: CacheDir::entry_rel(key),
        out_shape_zyx,
    })
}

/// Each keyed case: failed (no key, or too large to build: its image's header is named),
/// cached (its entry is committed already: into the manifest as it is), or a job to build.
#[allow(clippy::too_many_arguments)]
pub(super) fn sort_cases<'a>(
    cache: &CacheDir,
    committed_shapes: bool,
    keyed: Vec<(usize, Result<String>)>,
    (ok, plans): (&[&'a ScannedCase], &'a [CasePlan]),
    max_case_gib: f64,
    label_values: Option<&'a std::collections::BTreeSet<u16>>,
    reports: &mut Vec<CaseReport>,
) -> (Vec<Job<'a>>, BTreeMap<String, ManifestCase>) {
    let mut jobs = Vec::new();
    let mut cached = BTreeMap::new();
    for (i, k) in keyed {
        let s = ok[i];
        let id = s.source.id.clone();
        let key = match k {
            Err(e) => {
                eprintln!("error: {e}");
                reports.push(failed(id, None, &e));
                continue;
            }
            Ok(key) => key,
        };
        if cache.has_entry(&key) {
            match manifest_case(cache, &key, &plans[i], committed_shapes) {
                Ok(m) => cached.insert(id.clone(), m),
                Err(e) => {
                    eprintln!("error: {e}");
                    reports.push(failed(id, Some(key), &e));
                    continue;
                }
            };
            reports.push(CaseReport {
                id,
                key: Some(key),
                outcome: CaseOutcome::Cached,
            });
        } else if let Some(why) = plans[i].size_problem(max_case_gib) {
            // The image's header holds the spacing and the dimensions to fix: name it.
            let e = Error::nifti(s.source.image(), why);
            eprintln!("error: {e}");
            reports.push(failed(id, Some(key), &e));
        } else {
            jobs.push(Job {
                scanned: s,
                plan: &plans[i],
                key,
                label_values,
            });
        }
    }
    (jobs, cached)
}

/// What each job came to: built (into the manifest, its bytes and voxels counted), failed,
/// or skipped (never settled: the disk filled up before it).
pub(super) fn settle(
    (cache, committed_shapes): (&CacheDir, bool),
    jobs: &[Job],
    outcomes: Vec<(usize, f64, Result<u64>)>,
    report: &mut BuildReport,
    reports: &mut Vec<CaseReport>,
    manifest_cases: &mut BTreeMap<String, ManifestCase>,
) {
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
        let r = r.and_then(|bytes| {
            manifest_case(cache, &job.key, job.plan, committed_shapes).map(|m| (bytes, m))
        });
        let outcome = match r {
            Ok((bytes, m)) => {
                report.bytes_written += bytes;
                report.voxels_built += m.out_shape_zyx.iter().product::<usize>() as u64;
                manifest_cases.insert(id.clone(), m);
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
}

/// Where the dataset's files are (fold validation reads them), with the first stage's run
/// folder for a cascade.
pub(super) fn origin(opts: &BuildOptions) -> Option<DatasetOrigin> {
    crate::prep::dataset::origin::origin_of(&opts.source).map(|o| DatasetOrigin {
        previous_stage: opts
            .previous_stage
            .as_ref()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone())),
        ..o
    })
}
