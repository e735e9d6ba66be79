//! `train` with no patch or network given: nnU-Net's planner run on the cache itself (its
//! cases' shapes at the cache's spacing, its classes and channels), the plan fitted to this
//! device's memory by our forecast, and applied to the run's configuration.

use std::path::Path;

use super::configurations::ConfigurationTable;
use crate::error::Result;
use crate::model::config::Precision;
use crate::model::device;
use crate::nifti_io::unit_in_mm;
use crate::planner::memory::{fit_to_memory, step_memory, GPU_OVERHEAD};
use crate::planner::{plan_experiment, Fingerprint, Preset};
use crate::prep::settings::Settings;
use crate::train::config::TrainConfig;
use crate::train::data::open_data;
use crate::util::sysinfo;

/// Share of the machine's memory (or its cgroup's limit) a CPU plan may use: the rest is the
/// loader's, the page cache's and everyone else's.
const CPU_SHARE: f64 = 0.5;

/// Plan `cfg`'s patch, batch and network from the cache at `cache_dir` for `device`; returns
/// the plan in a few lines (also recorded in `cfg.planned`).
pub fn plan_from_cache(
    cfg: &mut TrainConfig,
    cache_dir: &Path,
    device_name: &str,
    mapped_mib: Option<u64>,
    blocks: crate::cache::store::Blocks,
) -> Result<String> {
    let data = open_data(cache_dir, cfg, mapped_mib, blocks)?;
    let unit = data.preprocessing.unit.clone();
    let mm = unit_in_mm(&unit).unwrap_or(1.0);
    let [x, y, z] = data.preprocessing.params.target_spacing_xyz;
    let shapes: Vec<[usize; 3]> = data
        .train
        .iter()
        .chain(&data.val)
        .map(|(_, e)| e.shape_zyx())
        .collect();
    let fp = Fingerprint {
        spacings: vec![[z * mm, y * mm, x * mm]; shapes.len()],
        num_training: shapes.len(),
        shapes,
        num_classes: data.num_classes,
    };
    let mut plans = plan_experiment(&fp, Preset::Default)?;
    let dev = device::select(device_name)?;
    let (budget, precision, overhead, on) = match device::gpu_memory(&dev) {
        Some(g) => (
            g.device_total,
            cfg.network.precision,
            GPU_OVERHEAD,
            "the GPU's",
        ),
        None => {
            let total = sysinfo::total_memory_bytes().unwrap_or(8 << 30);
            let limit = sysinfo::cgroup_memory_limit().map_or(total, |l| l.min(total));
            let share = (limit as f64 * CPU_SHARE) as u64;
            (share, Precision::F32, 0, "half the machine's")
        }
    };
    let channels = data.channels.len();
    let notes = fit_to_memory(
        &mut plans,
        budget,
        (channels, data.num_classes),
        precision,
        overhead,
    )?;
    let (name, plan) = match &plans.fullres {
        Some(f) => ("3d_fullres", f),
        None => ("2d", &plans.two_d),
    };
    let table = ConfigurationTable::from_plan(plan, plans.transpose, plans.target_spacing, mm);
    table.apply(name, &mut Settings::default(), cfg)?;
    let step = step_memory(plan, channels, data.num_classes, precision).total();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let zyx = |v: [usize; 3]| format!("{}x{}x{}", v[0], v[1], v[2]);
    let summary = format!(
        "{name} of nnU-Net's default planner on {} cases of {}, {:.1} GiB a step in {precision} ({} memory: {:.1} GiB)",
        fp.num_training,
        data.dataset,
        gib(step),
        on,
        gib(budget)
    );
    cfg.planned = Some(summary.clone());
    let mut out = format!("planned (no patch given): {summary}\n");
    out.push_str(&format!(
        "  patch {} (z,y,x), batch {}, {} stages, strides {}, kernels {}, features {:?}\n",
        zyx(table.patch),
        table.batch_size,
        table.strides.len(),
        table
            .strides
            .iter()
            .map(|s| zyx(*s))
            .collect::<Vec<_>>()
            .join(" "),
        table
            .kernels
            .iter()
            .map(|k| zyx(*k))
            .collect::<Vec<_>>()
            .join(" "),
        table.features
    ));
    for n in notes {
        out.push_str(&format!("  fitted: {n}\n"));
    }
    Ok(out)
}
