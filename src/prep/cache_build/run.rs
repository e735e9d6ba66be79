//! The job loop: cases in order, three stages overlapping. Case n+1 is read and normalized
//! while case n is resampled and written, and case n-1 is fsynced and renamed into place in the
//! background. Memory: two inputs at most, each in memory only when small (else in a scratch
//! file); the output never sits in memory. A full disk stops
//! the loop: the cases after it are left unbuilt (and reported as skipped by the caller).

use std::thread::ScopedJoinHandle;
use std::time::Instant;

use indicatif::ProgressBar;

use super::case::{commit_written, decode_case, write_case, Decoded, Job};
use super::nnunet::NnunetBuild;
use super::progress::{report_case, say};
use crate::cache::CacheDir;
use crate::error::{Error, Result};
use crate::format::OutputParams;
use crate::nifti_io::SourceOptions;

/// A finished case: its index in `jobs`, its seconds from start to commit, and the bytes it
/// added or its error.
pub(super) type Outcome = (usize, f64, Result<u64>);

/// Build every job; returns the outcomes of the cases that were attempted. With `nnunet`, each
/// case is read and preprocessed as nnU-Net does by its writer (nothing to decode ahead).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_jobs(
    pool: &rayon::ThreadPool,
    cache: &CacheDir,
    jobs: &[Job],
    params: &OutputParams,
    nnunet: Option<&NnunetBuild>,
    source: &SourceOptions,
    bar: &ProgressBar,
    quiet: bool,
) -> Vec<Outcome> {
    let n_jobs = jobs.len();
    let decode_case = |j: &Job, params: &OutputParams, source: &SourceOptions| match nnunet {
        Some(_) => Ok(Decoded::default()),
        None => decode_case(j, params, source),
    };
    let write_case = |cache: &CacheDir,
                      job: &Job,
                      params: &OutputParams,
                      d: Decoded,
                      on_voxels: &(dyn Fn(u64) + Sync)| match nnunet {
        Some(b) => super::nnunet::write_case(cache, job, params, b, source, on_voxels),
        None => write_case(cache, job, params, d, on_voxels),
    };
    let mut disk_full = false;
    let mut next: Option<Result<Decoded>> = jobs
        .first()
        .map(|j| pool.install(|| decode_case(j, params, source)));
    let mut outcomes: Vec<Outcome> = Vec::new();
    std::thread::scope(|scope| {
        let mut in_flight: Option<(usize, Instant, ScopedJoinHandle<Result<u64>>)> = None;
        let settle = |(i, t0, h): (usize, Instant, ScopedJoinHandle<Result<u64>>),
                      disk_full: &mut bool,
                      outcomes: &mut Vec<Outcome>| {
            let r = h.join().unwrap_or_else(|_| {
                Err(Error::case(
                    &jobs[i].scanned.source.id,
                    "the commit thread panicked",
                ))
            });
            if let Err(e) = &r {
                *disk_full |= e.is_disk_full();
            }
            report_case(bar, quiet, &jobs[i], t0, &r);
            outcomes.push((i, t0.elapsed().as_secs_f64(), r));
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
                            .unwrap_or_else(|| decode_case(job, params, source))
                            .and_then(|d| write_case(cache, job, params, d, &on_voxels))
                    },
                    || jobs.get(n + 1).map(|j| decode_case(j, params, source)),
                )
            });
            next = prefetched;
            if let Some(prev) = in_flight.take() {
                settle(prev, &mut disk_full, &mut outcomes);
            }
            match written {
                Ok(w) => {
                    in_flight = Some((n, t0, scope.spawn(move || commit_written(cache, w))));
                }
                Err(e) => {
                    disk_full |= e.is_disk_full();
                    let r = Err(e);
                    report_case(bar, quiet, job, t0, &r);
                    outcomes.push((n, t0.elapsed().as_secs_f64(), r));
                }
            }
        }
        if let Some(prev) = in_flight.take() {
            settle(prev, &mut disk_full, &mut outcomes);
        }
    });
    if disk_full {
        say(bar, "the disk is full: the remaining cases were skipped; free space and run again (built entries are kept)".into());
    }
    outcomes
}
