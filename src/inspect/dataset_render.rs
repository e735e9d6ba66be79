//! The dataset report as text: the case, file, intensity and spacing tables, the target spacing
//! decision, and the forecast table that `prep build-cache --dry-run` prints too.

use std::collections::BTreeMap;

use super::dataset_report::{
    CaseInfo, DatasetReport, ForecastTotals, IntensityFacts, SpacingReport,
};
use super::table::{count, num, shape3, spacing3, value, wrap, Align, Table};
use crate::format::dataset_json::DatasetDescription;
use crate::format::ImageDtype;
use crate::prep::plan::{CasePlan, SpacingDecision, OUTLIER_FACTOR};
use crate::prep::settings::AUTO_PACKED_ABOVE_BYTES;
use crate::util::sysinfo::human_bytes;

fn dtype_name(d: ImageDtype) -> &'static str {
    match d {
        ImageDtype::Float32 => "float32",
        ImageDtype::Float16 => "float16",
    }
}

/// Width of the human reports.
const W: usize = 100;

/// One row of the forecast table.
pub enum ForecastRow<'a> {
    /// A case planned at the target spacing.
    Planned(&'a CasePlan),
    /// A case that could not be planned (unreadable, or image and label disagree).
    NotPlanned(&'a str),
}

/// `LABEL: 1x1x3 by RULE: REASON`, the reason wrapped under it.
pub fn render_decision(label: &str, d: &SpacingDecision) -> String {
    let head = format!("{label}: {} by {}:", spacing3(&d.target_xyz), d.rule);
    format!("{head} {}", wrap(&d.reason, W, head.len() + 1, 2))
}

/// The forecast table (per case: input and output shape, cached bytes, what a whole-volume
/// resampler would hold), its total and the outliers line. `prep inspect DATA` and
/// `prep build-cache --dry-run` both print it, so a plan reads the same wherever it is shown.
pub fn render_forecast(
    target_xyz: &[f64; 3],
    image_dtype: ImageDtype,
    labelled: bool,
    rows: &[ForecastRow],
) -> String {
    let mut t = Table::new(&[
        ("case", Align::Left),
        ("input (x,y,z)", Align::Right),
        ("output (x,y,z)", Align::Right),
        ("cached", Align::Right),
        ("whole f32", Align::Right),
        ("whole f64", Align::Right),
        ("flag", Align::Left),
    ]);
    let (mut cases, mut cached, mut f32_bytes, mut f64_bytes) = (0usize, 0u64, 0u64, 0u64);
    let mut voxels = 0u64;
    let mut outliers = Vec::new();
    for row in rows {
        let p = match row {
            ForecastRow::Planned(p) => p,
            ForecastRow::NotPlanned(id) => {
                t.row(vec![id.to_string(), "-".into(), "not planned".into()]);
                continue;
            }
        };
        cases += 1;
        cached = cached.saturating_add(p.out_bytes);
        voxels = voxels.saturating_add(p.out_voxels);
        f32_bytes = f32_bytes.saturating_add(p.whole_volume_f32_bytes);
        f64_bytes = f64_bytes.saturating_add(p.whole_volume_f64_bytes);
        if p.outlier {
            outliers.push(p.id.as_str());
        }
        t.row(vec![
            p.id.clone(),
            shape3(&p.in_shape_xyz),
            shape3(&p.out_shape_xyz),
            human_bytes(p.out_bytes),
            human_bytes(p.whole_volume_f32_bytes),
            human_bytes(p.whole_volume_f64_bytes),
            crate::prep::plan::outlier_flag(p.outlier, p.size_factor),
        ]);
    }
    t.row(vec![
        format!("total ({cases})"),
        String::new(),
        String::new(),
        human_bytes(cached),
        human_bytes(f32_bytes),
        human_bytes(f64_bytes),
    ]);
    let mut out = format!(
        "forecast at {} ({} image{})\n{}",
        spacing3(target_xyz),
        dtype_name(image_dtype),
        if labelled { " + label" } else { "" },
        t.render(W)
    );
    out.push_str(&layouts_line(cached, voxels, image_dtype));
    out.push_str(&format!(
        "outliers (>= {}x the median output size): {}\n",
        num(OUTLIER_FACTOR),
        if outliers.is_empty() {
            "none".to_string()
        } else {
            outliers.join(", ")
        }
    ));
    out
}

/// The cache's bytes in each layout, and which one `layout = auto` builds: raw exactly,
/// packed as its float16 bytes before compression (what Blosc-LZ4 takes off depends on the
/// data: a third on the synthetic MiniVess-like set).
fn layouts_line(cached: u64, voxels: u64, image_dtype: ImageDtype) -> String {
    let label = cached.saturating_sub(voxels.saturating_mul(image_dtype.dtype().size() as u64));
    let raw = voxels.saturating_mul(4).saturating_add(label);
    let packed = voxels.saturating_mul(2).saturating_add(label);
    let auto = if raw > AUTO_PACKED_ABOVE_BYTES {
        "packed"
    } else {
        "raw"
    };
    format!(
        "layouts: raw {} (float32, uncompressed), packed at most {} (float16, before\n  compression); auto builds {auto} (packed above {} raw)\n",
        human_bytes(raw),
        human_bytes(packed),
        human_bytes(AUTO_PACKED_ABOVE_BYTES)
    )
}

/// What `prep build-cache --dry-run` prints: the target spacing with the rule that chose it,
/// then the forecast table of the build's own plans.
pub fn render_plan(
    decision: &SpacingDecision,
    plans: &[CasePlan],
    image_dtype: ImageDtype,
) -> String {
    // A plan's cached bytes are image plus label, so they exceed the image's alone exactly when
    // the case has a label. Saturating, as the plan's own counts are: a header with an absurd
    // spacing makes an output of u64::MAX voxels, which must print (and be refused), not wrap.
    let image_bytes = image_dtype.dtype().size() as u64;
    let labelled = plans
        .iter()
        .any(|p| p.out_bytes > p.out_voxels.saturating_mul(image_bytes));
    let rows: Vec<ForecastRow> = plans.iter().map(ForecastRow::Planned).collect();
    format!(
        "{}\n{}",
        render_decision("target spacing (x,y,z)", decision),
        render_forecast(&decision.target_xyz, image_dtype, labelled, &rows)
    )
}

/// The human report of a dataset.
pub fn render(r: &DatasetReport, path: &str) -> String {
    let mut out = format!(
        "dataset {path}\n{}, {} with labels; pipeline {}, image dtype {}\n",
        count(r.n_cases, "case", "cases"),
        r.n_labelled,
        r.pipeline,
        dtype_name(r.image_dtype)
    );
    if let Some(d) = &r.dataset_json {
        out.push_str(&dataset_json_line(d));
    }
    out.push_str(&format!("\ncases\n{}", cases_table(&r.cases)));
    out.push_str(&format!("\nfiles\n{}", files_table(&r.cases)));
    if r.voxels_read {
        out.push_str(&format!(
            "\nintensities and labels\n{}",
            intensities_table(&r.cases)
        ));
    } else {
        out.push_str("\nintensities and labels: not read (--headers-only)\n");
    }

    let Some(sp) = &r.spacing else {
        out.push_str("\nspacing: no readable case\n");
        return out;
    };
    out.push_str(&spacing_tables(sp));
    out.push_str(&target_lines(sp));
    if let Some(f) = &r.forecast {
        out.push('\n');
        out.push_str(&case_forecast(r, f));
    }
    out
}

/// What the folder's dataset.json declares: its layout, name, channels and labels.
fn dataset_json_line(d: &DatasetDescription) -> String {
    let classes: Vec<String> = d.labels.iter().map(|c| c.to_string()).collect();
    format!(
        "dataset.json ({}){}: channels {}; labels {}{}\n",
        d.layout,
        d.name
            .as_ref()
            .map(|n| format!(" {n:?}"))
            .unwrap_or_default(),
        if d.channels.is_empty() {
            "not named".to_string()
        } else {
            d.channels.join(", ")
        },
        classes.join(", "),
        d.ignore_label
            .map(|i| format!(", ignore {i}"))
            .unwrap_or_default()
    )
}

/// One row per case: what its image header says (and the label's datatype).
fn cases_table(cases: &[CaseInfo]) -> String {
    let mut t = Table::new(&[
        ("case", Align::Left),
        ("shape (x,y,z)", Align::Right),
        ("dtype", Align::Left),
        ("label", Align::Left),
        ("spacing (x,y,z)", Align::Right),
        ("unit", Align::Left),
        ("orient", Align::Left),
        ("qform/sform", Align::Right),
    ]);
    for c in cases {
        match &c.header {
            Some(h) => t.row(vec![
                c.id.clone(),
                shape3(&h.shape_xyz),
                h.datatype.into(),
                c.label_datatype.unwrap_or("-").into(),
                spacing3(&h.spacing_xyz),
                h.unit.into(),
                h.orientation.clone(),
                format!("{}/{}", h.qform_code, h.sform_code),
            ]),
            None => t.row(vec![c.id.clone(), "unreadable".into()]),
        }
    }
    t.render(W)
}

/// One row per case and further channel: the files it was found in.
fn files_table(cases: &[CaseInfo]) -> String {
    let mut t = Table::new(&[
        ("case", Align::Left),
        ("image", Align::Left),
        ("label", Align::Left),
    ]);
    for c in cases {
        t.row(vec![
            c.id.clone(),
            c.image.clone(),
            c.label.clone().unwrap_or_else(|| "-".into()),
        ]);
        for (k, ch) in c.other_channels.iter().enumerate() {
            t.row(vec![
                format!("{} ch{}", c.id, k + 1),
                ch.image.clone(),
                String::new(),
            ]);
        }
    }
    t.render(W)
}

/// One row per case and further channel: its intensities, and the case's label values.
fn intensities_table(cases: &[CaseInfo]) -> String {
    let mut t = Table::new(&[
        ("case", Align::Left),
        ("min", Align::Right),
        ("max", Align::Right),
        ("mean", Align::Right),
        ("non-finite", Align::Right),
        ("label values (voxels)", Align::Left),
    ]);
    for c in cases {
        let (lo, hi, mean, bad) = intensity_cells(&c.intensity);
        let labels = label_values_cell(&c.label_values);
        t.row(vec![c.id.clone(), lo, hi, mean, bad, labels]);
        // Each further channel on its own row (channel 0 is the case's row).
        for (k, ch) in c.other_channels.iter().enumerate() {
            let (lo, hi, mean, bad) = intensity_cells(&ch.intensity);
            t.row(vec![
                format!("{} ch{}", c.id, k + 1),
                lo,
                hi,
                mean,
                bad,
                String::new(),
            ]);
        }
    }
    t.render(W)
}

/// The min, max, mean and non-finite cells of one image; `-` where it was not read.
fn intensity_cells(i: &Option<IntensityFacts>) -> (String, String, String, String) {
    let opt = |v: Option<f64>| v.map(value).unwrap_or_else(|| "-".into());
    match i {
        Some(i) => (
            opt(i.min),
            opt(i.max),
            opt(i.mean),
            i.non_finite.to_string(),
        ),
        None => ("-".into(), "-".into(), "-".into(), "-".into()),
    }
}

/// `0:1200 1:34`, by value (the report's keys are strings, so they sort as numbers here).
fn label_values_cell(m: &Option<BTreeMap<String, u64>>) -> String {
    match m {
        Some(m) => {
            let mut v: Vec<(u32, u64)> = m
                .iter()
                .map(|(k, n)| (k.parse().unwrap_or(u32::MAX), *n))
                .collect();
            v.sort_unstable();
            v.iter()
                .map(|(k, n)| format!("{k}:{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        }
        None => "-".into(),
    }
}

/// The spacing distribution, then the per-axis percentiles the target is chosen from.
fn spacing_tables(sp: &SpacingReport) -> String {
    let mut t = Table::new(&[
        ("spacing (x,y,z)", Align::Right),
        ("cases", Align::Right),
        ("share", Align::Right),
    ]);
    let n: usize = sp.distinct.iter().map(|d| d.count).sum();
    for d in &sp.distinct {
        t.row(vec![
            spacing3(&d.spacing_xyz),
            d.count.to_string(),
            format!("{:.0}%", 100.0 * d.count as f64 / n.max(1) as f64),
        ]);
    }
    let mut out = format!(
        "\nspacing distribution ({} distinct, most common first; unit {})\n{}",
        sp.distinct.len(),
        sp.units.join(", "),
        t.render(W)
    );
    let mut t = Table::new(&[
        ("axis", Align::Left),
        ("min", Align::Right),
        ("p10", Align::Right),
        ("p50", Align::Right),
        ("p90", Align::Right),
        ("max", Align::Right),
    ]);
    for (name, a) in [
        ("x", &sp.per_axis.x),
        ("y", &sp.per_axis.y),
        ("z", &sp.per_axis.z),
    ] {
        t.row(vec![
            name.into(),
            num(a.min),
            num(a.p10),
            num(a.p50),
            num(a.p90),
            num(a.max),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render(W));
    out
}

/// The target spacing and why; an explicit one also shows what `auto` would have chosen.
fn target_lines(sp: &SpacingReport) -> String {
    match &sp.auto {
        Some(a) if sp.target.rule == "explicit" => format!(
            "\ntarget spacing (x,y,z): {} (explicit: what if)\n{}",
            spacing3(&sp.target.target_xyz),
            render_decision("auto would choose", a)
        ),
        _ => format!(
            "\n{}",
            render_decision("target spacing (x,y,z)", &sp.target)
        ),
    }
}

/// The forecast table of the report's cases: a row for each, planned or not.
fn case_forecast(r: &DatasetReport, f: &ForecastTotals) -> String {
    let plans: Vec<(&str, Option<CasePlan>)> = r
        .cases
        .iter()
        .map(|c| (c.id.as_str(), case_plan(c)))
        .collect();
    let rows: Vec<ForecastRow> = plans
        .iter()
        .map(|(id, p)| match p {
            Some(p) => ForecastRow::Planned(p),
            None => ForecastRow::NotPlanned(id),
        })
        .collect();
    render_forecast(&f.target_xyz, f.image_dtype, r.n_labelled > 0, &rows)
}

/// The facts of a case's plan, as `build-cache` has them; `None` when it was not planned.
fn case_plan(c: &CaseInfo) -> Option<CasePlan> {
    match (&c.header, &c.forecast) {
        (Some(h), Some(p)) => Some(CasePlan {
            id: c.id.clone(),
            in_shape_xyz: h.shape_xyz,
            in_spacing_xyz: h.spacing_xyz,
            out_shape_xyz: p.out_shape_xyz,
            out_spacing_xyz: p.out_spacing_xyz,
            out_voxels: p.out_voxels,
            out_bytes: p.out_bytes,
            whole_volume_f32_bytes: p.whole_volume_f32_bytes,
            whole_volume_f64_bytes: p.whole_volume_f64_bytes,
            size_factor: p.size_factor,
            outlier: p.outlier,
        }),
        _ => None,
    }
}
