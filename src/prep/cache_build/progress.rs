//! What a build shows while it runs: a voxel progress bar on a terminal, one line per case.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressState, ProgressStyle};

use super::case::Job;
use crate::error::Result;
use crate::util::sysinfo::human_bytes;

pub(super) fn make_progress(enabled: bool, total: u64) -> ProgressBar {
    let bar =
        ProgressBar::with_draw_target(Some(total), crate::util::progress::draw_target(enabled));
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
pub(super) fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// One line per finished case (errors always, successes unless quiet).
pub(super) fn report_case(bar: &ProgressBar, quiet: bool, job: &Job, t0: Instant, r: &Result<u64>) {
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
