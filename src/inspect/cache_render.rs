//! The human-readable rendering of a cache report: per dataset its parameters, per entry its
//! shape, layout and classes, then totals and leftovers.

use std::collections::BTreeMap;

use super::cache_report::{CacheReport, DatasetInfo, EntryInfo, TmpInfo};
use super::entry_meta::short_key;
use super::table::{count, shape3, spacing3, wrap, Align, Table};
use super::verify::VerifySummary;
use crate::format::entry::ClassStats;
use crate::format::{Dtype, MANIFEST_FILE, TMP_DIR};
use crate::util::sysinfo::human_bytes;

fn classes_cell(c: &BTreeMap<u16, ClassStats>) -> String {
    if c.is_empty() {
        return "-".into();
    }
    c.iter()
        .map(|(k, s)| (k, s.voxels))
        .map(|(k, n)| format!("{k}:{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Width of the human reports.
const W: usize = 100;

/// The human report of a cache.
pub fn render(r: &CacheReport, path: &str) -> String {
    let mut out = summary(r, path);
    if !r.datasets.is_empty() {
        out.push_str(&format!("\ndatasets\n{}", datasets_table(&r.datasets)));
        for d in &r.datasets {
            out.push_str(&dataset_notes(d));
        }
    }
    if !r.entries.is_empty() {
        out.push_str(&format!("\nentries\n{}", entries_table(&r.entries)));
        out.push_str(&format!(
            "\nentry layouts and sizes (dtypes: image/label; ratio: decoded / on disk)\n{}",
            layouts_table(&r.entries)
        ));
    }
    if !r.tmp.is_empty() {
        out.push('\n');
        out.push_str(&tmp_table(&r.tmp));
    }
    if let Some(v) = &r.verify {
        out.push('\n');
        out.push_str(&verify_line(v));
    }
    out
}

/// The head lines: what the cache holds in all, and whether its manifest could be read.
fn summary(r: &CacheReport, path: &str) -> String {
    let t = &r.totals;
    let mut out = format!(
        "cache {path}\n{}, {} ({} orphaned), {} in {TMP_DIR}/; {} on disk, {} decoded\n",
        count(r.datasets.len(), "dataset", "datasets"),
        count(t.entries, "entry", "entries"),
        t.orphans,
        count(r.tmp.len(), "leftover", "leftovers"),
        human_bytes(t.bytes_on_disk),
        human_bytes(t.decoded_bytes)
    );
    if r.manifest_format_version.is_none() {
        out.push_str(&format!(
            "no readable {MANIFEST_FILE}: no dataset is recorded\n"
        ));
    }
    out
}

/// One row per manifest dataset: the parameters its entries were built with.
fn datasets_table(datasets: &[DatasetInfo]) -> String {
    let mut tb = Table::new(&[
        ("dataset", Align::Left),
        ("pipeline", Align::Left),
        ("cases", Align::Right),
        ("target (x,y,z)", Align::Right),
        ("image", Align::Left),
        ("norm", Align::Left),
        ("chunk (z,y,x)", Align::Right),
        ("shard", Align::Right),
        ("codec", Align::Left),
    ]);
    for d in datasets {
        tb.row(vec![
            d.name.clone(),
            d.pipeline.clone(),
            if d.missing_entries.is_empty() {
                d.cases.to_string()
            } else {
                format!("{} ({} missing)", d.cases, d.missing_entries.len())
            },
            spacing3(&d.target_spacing_xyz),
            d.image_dtype.dtype().short_name().to_string(),
            if d.normalization.len() == 1 {
                d.normalization[0].clone()
            } else {
                "per channel".into()
            },
            shape3(&d.chunk_zyx),
            d.shard_zyx
                .map(|s| shape3(&s))
                .unwrap_or_else(|| "-".into()),
            d.compression.clone(),
        ]);
    }
    tb.render(W)
}

/// What does not fit a table cell: why the target spacing, the channels, the classes.
fn dataset_notes(d: &DatasetInfo) -> String {
    let head = format!("{}: target by {}:", d.name, d.spacing_rule);
    let mut out = format!("{head} {}", wrap(&d.spacing_reason, W, head.len() + 1, 2));
    if d.channels.len() > 1 {
        out.push_str(&format!(
            "{}: {} image channels: {}\n",
            d.name,
            d.channels.len(),
            channel_schemes(&d.channels, &d.normalization)
        ));
    }
    if !d.classes.is_empty() {
        out.push_str(&format!(
            "{}: classes (dataset.json) {}{}\n",
            d.name,
            d.classes.join(", "),
            d.ignore_label
                .map(|i| format!("; ignore label {i}"))
                .unwrap_or_default()
        ));
    }
    out
}

/// One row per entry: the case, the datasets that use it, its grid and classes.
fn entries_table(entries: &[EntryInfo]) -> String {
    let mut tb = Table::new(&[
        ("case", Align::Left),
        ("key", Align::Left),
        ("dataset", Align::Left),
        ("shape (z,y,x)", Align::Right),
        ("spacing (x,y,z)", Align::Right),
        ("classes (voxels)", Align::Left),
    ]);
    for e in entries {
        tb.row(vec![
            e.case_id.clone(),
            short_key(&e.key),
            if e.orphan {
                "ORPHAN".into()
            } else if e.datasets.is_empty() {
                "-".into()
            } else {
                e.datasets.join(",")
            },
            shape3(&e.shape_zyx),
            format!("{} {}", spacing3(&e.spacing_xyz), e.unit),
            classes_cell(&e.label_classes),
        ]);
    }
    tb.render(W)
}

/// One row per entry: how it is stored and what that costs on disk.
fn layouts_table(entries: &[EntryInfo]) -> String {
    let mut tb = Table::new(&[
        ("case", Align::Left),
        ("key", Align::Left),
        ("dtypes", Align::Left),
        ("chunk (z,y,x)", Align::Right),
        ("shard (z,y,x)", Align::Right),
        ("codec", Align::Left),
        ("on disk", Align::Right),
        ("decoded", Align::Right),
        ("ratio", Align::Right),
    ]);
    for e in entries {
        tb.row(vec![
            e.case_id.clone(),
            short_key(&e.key),
            format!(
                "{}/{}",
                e.image_dtype.short_name(),
                e.label_dtype.map_or("-", Dtype::short_name)
            ),
            shape3(&e.chunk_zyx),
            e.shard_zyx
                .map(|s| shape3(&s))
                .unwrap_or_else(|| "-".into()),
            e.codec.clone(),
            human_bytes(e.bytes_on_disk),
            human_bytes(e.decoded_bytes),
            format!("{:.2}", e.compression_ratio),
        ]);
    }
    tb.render(W)
}

/// What interrupted builds left in tmp/, and whether the build that left it still runs.
fn tmp_table(tmp: &[TmpInfo]) -> String {
    let mut tb = Table::new(&[
        ("tmp leftover", Align::Left),
        ("bytes", Align::Right),
        ("owner", Align::Left),
    ]);
    for t in tmp {
        tb.row(vec![
            t.path.clone(),
            human_bytes(t.bytes),
            match (&t.host, t.pid, t.owner_alive) {
                (Some(h), Some(p), Some(true)) => format!("{h} pid {p} (running)"),
                (Some(h), Some(p), Some(false)) => format!("{h} pid {p} (gone)"),
                (Some(h), Some(p), None) => format!("{h} pid {p}"),
                _ => "unknown".into(),
            },
        ]);
    }
    tb.render(W)
}

/// The `--verify` counts, wrapped.
fn verify_line(v: &VerifySummary) -> String {
    let line = format!(
        "verify: {}, {}: {} ok, {} absent (all fill value, as recorded), {} corrupt, {} missing, {} other problems",
        count(v.entries, "entry", "entries"),
        count(v.blocks_checked as usize, "block", "blocks"),
        v.blocks_ok,
        v.blocks_absent,
        v.corrupt,
        v.missing,
        v.other
    );
    wrap(&line, W, 0, 2)
}

/// "T2 (zscore-nonzero), ADC (zscore-nonzero)".
fn channel_schemes(channels: &[String], schemes: &[String]) -> String {
    channels
        .iter()
        .zip(schemes)
        .map(|(c, s)| format!("{c} ({s})"))
        .collect::<Vec<_>>()
        .join(", ")
}
