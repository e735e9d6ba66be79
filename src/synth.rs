//! Deterministic synthetic two-photon-microscopy-like vessel datasets.
//!
//! The generator writes the Medical Segmentation Decathlon / nnU-Net layout:
//!
//! ```text
//! OUT/imagesTr/{id}_0000.nii.gz   image, int16
//! OUT/labelsTr/{id}.nii.gz        label, uint8 (0 background, 1 vessel)
//! OUT/dataset.json                nnU-Net style description of the cases
//! ```
//!
//! Vessels are tubes along smooth random 3D curves defined in physical units (micrometers), so
//! the same anatomy scale appears whatever the voxel spacing. The number of tubes is chosen so
//! that the vessel volume fraction lands near a per-case target (a few percent), which keeps thin
//! slabs and large volumes equally plausible.
//!
//! Everything is a pure function of the seed and the case id: the PRNG is private, the Gaussian
//! uses the polar Box-Muller method with a hand-written logarithm, and no libm function is called,
//! so the same seed gives byte-identical files on every platform.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ndarray::ArrayView3;
use nifti::writer::WriterOptions;
use nifti::{NiftiError, NiftiHeader};

use crate::error::{Error, Result};

/// One synthetic case: its id (file stem), grid shape and voxel spacing in micrometers.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthCaseSpec {
    pub id: String,
    pub shape_xyz: [usize; 3],
    pub spacing_xyz: [f64; 3],
}

/// Named collections of synthetic cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthPreset {
    /// 10 small cases (in-plane 48..80, 5..24 slices) with heterogeneous spacings including one
    /// (4.97, 4.97, 5.0) outlier: the bundled default dataset.
    Small,
    /// 70 cases of 512x512 in-plane and 5..110 slices with the spacing mix of MiniVess.
    Minivess,
    /// The single real-world outlier on its own: one 512x512x61 case at (4.97, 4.97, 5.0), which
    /// grows to 2545x2545x305 when resampled to 1 um (a benchmark of out-of-core resampling).
    Outlier,
}

impl SynthPreset {
    /// Every preset, in the order they are listed to users.
    pub const ALL: [SynthPreset; 3] = [
        SynthPreset::Small,
        SynthPreset::Minivess,
        SynthPreset::Outlier,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SynthPreset::Small => "small",
            SynthPreset::Minivess => "minivess",
            SynthPreset::Outlier => "outlier",
        }
    }
}

impl fmt::Display for SynthPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SynthPreset {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim();
        SynthPreset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| {
                let choices: Vec<&str> = SynthPreset::ALL.iter().map(|p| p.name()).collect();
                Error::Config(format!(
                    "unknown synthetic preset '{s}': choose one of {}",
                    choices.join(", ")
                ))
            })
    }
}

// ---------------------------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------------------------

/// Spacing mix of the MiniVess preset (x, y, z in micrometers) and how many cases get each.
const MINIVESS_SPACINGS: [([f64; 3], usize); 10] = [
    ([0.99, 0.99, 5.0], 31),
    ([0.62, 0.62, 5.0], 20),
    ([0.99, 0.99, 2.0], 8),
    ([0.62, 0.62, 10.0], 5),
    ([4.97, 4.97, 5.0], 1),
    ([2.48, 2.48, 5.0], 1),
    ([0.31, 0.31, 1.0], 1),
    ([1.24, 1.24, 3.0], 1),
    ([0.62, 0.62, 1.0], 1),
    ([0.99, 0.99, 10.0], 1),
];

/// The in-plane outlier spacing (its cases grow ~25x in-plane when resampled to ~1 um).
const OUTLIER_SPACING: [f64; 3] = [4.97, 4.97, 5.0];

/// Spacings of the Small preset, all taken from the MiniVess mix, with exactly one outlier.
const SMALL_SPACINGS: [[f64; 3]; 10] = [
    [0.99, 0.99, 5.0],
    [0.99, 0.99, 5.0],
    [0.62, 0.62, 5.0],
    [0.62, 0.62, 5.0],
    [0.99, 0.99, 2.0],
    [0.62, 0.62, 10.0],
    OUTLIER_SPACING,
    [2.48, 2.48, 5.0],
    [1.24, 1.24, 3.0],
    [0.99, 0.99, 10.0],
];

/// Stream tags, so that different uses of one seed draw independent sequences.
const TAG_PRESET: u64 = 0x7072_6573_6574_0001;
const TAG_CASE: u64 = 0x6361_7365_0000_0002;
const TAG_NOISE: u64 = 0x6e6f_6973_6500_0003;

/// Shape of the in-plane outlier case (the real one from MiniVess).
const OUTLIER_SHAPE: [usize; 3] = [512, 512, 61];

/// The cases of a preset. Deterministic in `seed`; ids are `vessels_000`, `vessels_001`, ...
/// (the Outlier preset's single case is `vessels_outlier`).
pub fn preset_cases(preset: SynthPreset, seed: u64) -> Vec<SynthCaseSpec> {
    let mut rng = Rng::new(mix(seed, TAG_PRESET ^ preset as u64));
    let mut specs: Vec<([usize; 3], [f64; 3])> = Vec::new();
    match preset {
        SynthPreset::Minivess => {
            let mut spacings: Vec<[f64; 3]> = MINIVESS_SPACINGS
                .iter()
                .flat_map(|&(sp, n)| std::iter::repeat_n(sp, n))
                .collect();
            rng.shuffle(&mut spacings);
            for sp in spacings {
                let nz = if sp == OUTLIER_SPACING {
                    OUTLIER_SHAPE[2]
                } else {
                    rng.range_usize(5, 110)
                };
                specs.push(([512, 512, nz], sp));
            }
        }
        SynthPreset::Small => {
            let mut spacings = SMALL_SPACINGS.to_vec();
            rng.shuffle(&mut spacings);
            for sp in spacings {
                let nx = rng.range_usize(48, 80);
                let ny = rng.range_usize(48, 80);
                let nz = rng.range_usize(5, 24);
                specs.push(([nx, ny, nz], sp));
            }
            // Guarantee at least one 5-slice case.
            let thin = rng.range_usize(0, specs.len() - 1);
            specs[thin].0[2] = 5;
        }
        SynthPreset::Outlier => specs.push((OUTLIER_SHAPE, OUTLIER_SPACING)),
    }
    specs
        .into_iter()
        .enumerate()
        .map(|(i, (shape_xyz, spacing_xyz))| SynthCaseSpec {
            id: match preset {
                SynthPreset::Outlier => "vessels_outlier".to_string(),
                _ => format!("vessels_{i:03}"),
            },
            shape_xyz,
            spacing_xyz,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Case generation
// ---------------------------------------------------------------------------------------------

/// Background level of the image.
const BACKGROUND: f64 = 100.0;
/// Standard deviation of the additive Gaussian noise.
const NOISE_SD: f64 = 20.0;
/// Tube radius range in micrometers.
const RADIUS_MIN: f64 = 2.0;
const RADIUS_MAX: f64 = 8.0;
/// Step of the curve random walk in micrometers.
const WALK_STEP: f64 = 1.0;
/// Upper bounds on the work done for one case.
const MAX_TUBES: usize = 2000;
const MAX_ATTEMPTS: usize = 6000;

/// Generate one case: returns (image int16 values, label u8 values), both in C order with axes
/// (z, y, x), i.e. x varies fastest, length nx*ny*nz.
///
/// The content depends only on `seed`, `spec.id`, the shape and the spacing.
///
/// # Panics
///
/// If a spacing is not finite and positive.
pub fn generate_case(spec: &SynthCaseSpec, seed: u64) -> (Vec<i16>, Vec<u8>) {
    let [nx, ny, nz] = spec.shape_xyz;
    let sp = spec.spacing_xyz;
    assert!(
        sp.iter().all(|s| s.is_finite() && *s > 0.0),
        "synthetic case {}: spacing {:?} must be finite and positive",
        spec.id,
        sp
    );
    let nvox = nx * ny * nz;
    // `signal` holds the vessel intensity above background (0 outside vessels) until the final
    // pass turns it into the image, so a case never needs more than its two output buffers.
    let mut signal = vec![0i16; nvox];
    let mut label = vec![0u8; nvox];
    if nvox == 0 {
        return (signal, label);
    }

    let case_seed = mix(mix(seed, TAG_CASE), fnv1a(spec.id.as_bytes()));
    let mut rng = Rng::new(case_seed);
    let grid = Grid {
        n: [nx, ny, nz],
        sp,
    };

    // Vessel volume fraction to aim for and the largest share a single tube may take of it.
    let target_frac = rng.range_f64(0.02, 0.08);
    let target_voxels = (target_frac * nvox as f64).ceil() as usize;
    let target_um3 = target_frac * grid.volume_um3();

    let mut labeled = 0usize;
    let mut accepted = 0usize;
    let mut smallest: Option<(f64, Tube)> = None;
    let mut attempts = 0;
    while labeled < target_voxels && accepted < MAX_TUBES && attempts < MAX_ATTEMPTS {
        attempts += 1;
        let tube = Tube::random(&grid, &mut rng);
        let est = tube.volume_inside_um3(&grid);
        if est > 0.75 * target_um3 {
            if smallest.as_ref().is_none_or(|(v, _)| est < *v) {
                smallest = Some((est, tube));
            }
            continue;
        }
        labeled += tube.rasterize(&grid, &mut signal, &mut label);
        accepted += 1;
    }
    if accepted == 0 {
        // A field of view too small for any tube to fit the budget: draw the thinnest one seen.
        if let Some((_, tube)) = smallest {
            tube.rasterize(&grid, &mut signal, &mut label);
        }
    }

    // Image = (background + vessel signal) attenuated with depth, plus Gaussian noise.
    let atten_len_um = rng.range_f64(800.0, 1600.0);
    let mut noise = Rng::new(mix(case_seed, TAG_NOISE));
    let plane = nx * ny;
    for (z, slab) in signal.chunks_exact_mut(plane).enumerate() {
        let depth = z as f64 * sp[2];
        let att = 1.0 / (1.0 + depth / atten_len_um);
        let mut pairs = slab.chunks_exact_mut(2);
        for pair in &mut pairs {
            let (g0, g1) = noise.gaussian_pair();
            pair[0] = to_i16((BACKGROUND + pair[0] as f64) * att + NOISE_SD * g0);
            pair[1] = to_i16((BACKGROUND + pair[1] as f64) * att + NOISE_SD * g1);
        }
        if let [last] = pairs.into_remainder() {
            let (g0, _) = noise.gaussian_pair();
            *last = to_i16((BACKGROUND + *last as f64) * att + NOISE_SD * g0);
        }
    }
    (signal, label)
}

fn to_i16(v: f64) -> i16 {
    v.round().clamp(i16::MIN as f64, i16::MAX as f64) as i16
}

/// The voxel grid in physical space: voxel (i, j, k) has its center at (i*sx, j*sy, k*sz).
struct Grid {
    n: [usize; 3],
    sp: [f64; 3],
}

impl Grid {
    /// Lower and upper physical bounds of the field of view along `axis` (voxel edges).
    fn bounds(&self, axis: usize) -> (f64, f64) {
        let s = self.sp[axis];
        (-0.5 * s, (self.n[axis] as f64 - 0.5) * s)
    }

    fn volume_um3(&self) -> f64 {
        (0..3).map(|a| self.n[a] as f64 * self.sp[a]).product()
    }

    fn contains(&self, p: [f64; 3], margin: f64) -> bool {
        (0..3).all(|a| {
            let (lo, hi) = self.bounds(a);
            p[a] >= lo - margin && p[a] <= hi + margin
        })
    }
}

/// A vessel: a polyline through the field of view with a radius and brightness per vertex.
struct Tube {
    points: Vec<[f64; 3]>,
    radii: Vec<f64>,
    amplitude: f64,
}

impl Tube {
    /// A smooth random curve through a random point of the field of view, walked both ways until
    /// it leaves the field of view. All lengths are in micrometers.
    fn random(grid: &Grid, rng: &mut Rng) -> Tube {
        let u = rng.uniform();
        // Mostly capillary-sized, sometimes larger vessels.
        let r0 = RADIUS_MIN + (RADIUS_MAX - RADIUS_MIN) * u * u;
        let amplitude = rng.range_f64(220.0, 380.0);
        // Persistence length of the direction random walk: how straight the vessel runs.
        let persistence = rng.range_f64(60.0, 250.0);
        let kick = (WALK_STEP / persistence).sqrt();
        // Vertices every `emit_every` walk steps: about one radius apart, which keeps the
        // rasterization bounding boxes tight while the capsules still join smoothly.
        let emit_every = (r0.clamp(2.0, 6.0) / WALK_STEP).round().max(1.0) as usize;

        let start = [0, 1, 2].map(|a| {
            let (lo, hi) = grid.bounds(a);
            rng.range_f64(lo, hi)
        });
        let dir0 = rng.unit_vector();
        let diag = (0..3)
            .map(|a| (grid.n[a] as f64 * grid.sp[a]).powi(2))
            .sum::<f64>()
            .sqrt();
        let max_len = 3.0 * diag + 10.0 * RADIUS_MAX;
        let margin = 1.5 * RADIUS_MAX;

        let walk = |dir: [f64; 3], rng: &mut Rng| -> Vec<([f64; 3], f64)> {
            let mut out = Vec::new();
            let mut p = start;
            let mut d = dir;
            let mut r = r0;
            let mut len = 0.0;
            let mut step = 0usize;
            while grid.contains(p, margin) && len < max_len {
                step += 1;
                let g = [rng.gaussian(), rng.gaussian(), rng.gaussian()];
                d = normalize([d[0] + kick * g[0], d[1] + kick * g[1], d[2] + kick * g[2]])
                    .unwrap_or(d);
                // Radius drifts slowly around its nominal value.
                r += 0.02 * (r0 - r) + 0.01 * r0 * rng.gaussian();
                r = r.clamp((0.8 * r0).max(RADIUS_MIN), (1.2 * r0).min(RADIUS_MAX));
                p = [
                    p[0] + WALK_STEP * d[0],
                    p[1] + WALK_STEP * d[1],
                    p[2] + WALK_STEP * d[2],
                ];
                len += WALK_STEP;
                if step.is_multiple_of(emit_every) {
                    out.push((p, r));
                }
            }
            out.push((p, r));
            out
        };
        let forward = walk(dir0, rng);
        let backward = walk([-dir0[0], -dir0[1], -dir0[2]], rng);

        let n = forward.len() + backward.len() + 1;
        let mut points = Vec::with_capacity(n);
        let mut radii = Vec::with_capacity(n);
        for &(p, r) in backward.iter().rev() {
            points.push(p);
            radii.push(r);
        }
        points.push(start);
        radii.push(r0);
        for &(p, r) in &forward {
            points.push(p);
            radii.push(r);
        }
        Tube {
            points,
            radii,
            amplitude,
        }
    }

    /// Rough tube volume inside the field of view (segments whose midpoint is inside).
    fn volume_inside_um3(&self, grid: &Grid) -> f64 {
        let mut v = 0.0;
        for i in 1..self.points.len() {
            let (a, b) = (self.points[i - 1], self.points[i]);
            let mid = [0, 1, 2].map(|k| 0.5 * (a[k] + b[k]));
            if grid.contains(mid, 0.0) {
                let r = 0.5 * (self.radii[i - 1] + self.radii[i]);
                v += std::f64::consts::PI * r * r * dist(a, b);
            }
        }
        v
    }

    /// Burn the tube into `signal` (max of vessel brightness) and `label`; returns the number of
    /// voxels that became foreground.
    fn rasterize(&self, grid: &Grid, signal: &mut [i16], label: &mut [u8]) -> usize {
        let mut newly = 0;
        for i in 1..self.points.len() {
            newly += self.rasterize_segment(grid, i - 1, i, signal, label);
        }
        newly
    }

    /// One capsule (a cone frustum with rounded ends): voxels whose center lies within the
    /// interpolated radius of the segment. Only the segment's bounding box is visited.
    fn rasterize_segment(
        &self,
        grid: &Grid,
        ia: usize,
        ib: usize,
        signal: &mut [i16],
        label: &mut [u8],
    ) -> usize {
        let (a, b) = (self.points[ia], self.points[ib]);
        let (ra, rb) = (self.radii[ia], self.radii[ib]);
        let rmax = ra.max(rb);
        let [nx, ny, _] = grid.n;
        let sp = grid.sp;

        let mut lo = [0usize; 3];
        let mut hi = [0usize; 3];
        for k in 0..3 {
            let pmin = a[k].min(b[k]) - rmax;
            let pmax = a[k].max(b[k]) + rmax;
            let last = grid.n[k] as f64 - 1.0;
            let l = (pmin / sp[k]).ceil().max(0.0);
            let h = (pmax / sp[k]).floor().min(last);
            if l > h {
                return 0;
            }
            lo[k] = l as usize;
            hi[k] = h as usize;
        }

        let ab = [b[0] - a[0], b[1] - a[1], b[2] - a[2]];
        let len2 = dot(ab, ab);
        let inv_len2 = if len2 > 0.0 { 1.0 / len2 } else { 0.0 };
        let dr = rb - ra;
        let amp = self.amplitude;

        let mut newly = 0;
        for z in lo[2]..=hi[2] {
            let wz = z as f64 * sp[2] - a[2];
            for y in lo[1]..=hi[1] {
                let wy = y as f64 * sp[1] - a[1];
                let row = (z * ny + y) * nx;
                let base_t = wy * ab[1] + wz * ab[2];
                for x in lo[0]..=hi[0] {
                    let wx = x as f64 * sp[0] - a[0];
                    let t = ((wx * ab[0] + base_t) * inv_len2).clamp(0.0, 1.0);
                    let dx = wx - t * ab[0];
                    let dy = wy - t * ab[1];
                    let dz = wz - t * ab[2];
                    let d2 = dx * dx + dy * dy + dz * dz;
                    let r = ra + t * dr;
                    let r2 = r * r;
                    if d2 <= r2 {
                        let idx = row + x;
                        // Brightest on the axis, falling off smoothly toward the wall.
                        let s = 1.0 - d2 / r2;
                        let v = (amp * (0.3 + 0.7 * s)).round() as i16;
                        if v > signal[idx] {
                            signal[idx] = v;
                        }
                        if label[idx] == 0 {
                            label[idx] = 1;
                            newly += 1;
                        }
                    }
                }
            }
        }
        newly
    }
}

fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

fn dist(a: [f64; 3], b: [f64; 3]) -> f64 {
    let d = [b[0] - a[0], b[1] - a[1], b[2] - a[2]];
    dot(d, d).sqrt()
}

fn normalize(v: [f64; 3]) -> Option<[f64; 3]> {
    let n = dot(v, v).sqrt();
    (n > 1e-12).then(|| [v[0] / n, v[1] / n, v[2] / n])
}

// ---------------------------------------------------------------------------------------------
// Dataset writing
// ---------------------------------------------------------------------------------------------

/// At most this many cases are held in memory at once by [`write_dataset`].
const MAX_CASES_IN_FLIGHT: usize = 4;

/// Write the whole dataset (cases generated in parallel with rayon, at most a few in memory at
/// once), calling `on_case(index, spec)` after each case is written. Creates OUT and subfolders;
/// `dataset.json` is written last.
pub fn write_dataset(
    out: &Path,
    specs: &[SynthCaseSpec],
    seed: u64,
    on_case: impl Fn(usize, &SynthCaseSpec) + Sync,
) -> Result<()> {
    validate_specs(specs)?;
    let images = out.join("imagesTr");
    let labels = out.join("labelsTr");
    for dir in [out, images.as_path(), labels.as_path()] {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }

    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<(usize, Error)>> = Mutex::new(None);
    let workers = rayon::current_num_threads()
        .min(MAX_CASES_IN_FLIGHT)
        .min(specs.len())
        .max(1);
    let write_one = |i: usize| -> Result<()> {
        let spec = &specs[i];
        let (image, label) = generate_case(spec, seed);
        let image_path = images.join(format!("{}_0000.nii.gz", spec.id));
        write_nifti_i16(&image_path, spec.shape_xyz, spec.spacing_xyz, &image)?;
        drop(image);
        let label_path = labels.join(format!("{}.nii.gz", spec.id));
        write_nifti_u8(&label_path, spec.shape_xyz, spec.spacing_xyz, &label)
    };
    rayon::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|_| loop {
                if failure.lock().map(|f| f.is_some()).unwrap_or(true) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= specs.len() {
                    break;
                }
                match write_one(i) {
                    Ok(()) => on_case(i, &specs[i]),
                    Err(e) => {
                        if let Ok(mut f) = failure.lock() {
                            if f.as_ref().is_none_or(|(j, _)| i < *j) {
                                *f = Some((i, e));
                            }
                        }
                        break;
                    }
                }
            });
        }
    });
    let failure = failure.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some((_, e)) = failure {
        return Err(e);
    }

    let json_path = out.join("dataset.json");
    let mut text = serde_json::to_string_pretty(&dataset_json(specs, seed))
        .map_err(|e| Error::Config(format!("dataset.json: {e}")))?;
    text.push('\n');
    std::fs::write(&json_path, text).map_err(|e| Error::io(&json_path, e))
}

fn dataset_json(specs: &[SynthCaseSpec], seed: u64) -> serde_json::Value {
    let cases: Vec<serde_json::Value> = specs
        .iter()
        .map(|s| {
            serde_json::json!({
                "id": s.id,
                "shape_xyz": s.shape_xyz,
                "spacing_xyz": s.spacing_xyz,
            })
        })
        .collect();
    serde_json::json!({
        "name": "voxcache-synthetic-vessels",
        "description": format!(
            "Synthetic two-photon microscopy vessels generated by voxcache (seed {seed}); \
             tubes along smooth random curves in micrometers, int16 images, uint8 labels."
        ),
        "channel_names": { "0": "two-photon" },
        "labels": { "background": 0, "vessel": 1 },
        "numTraining": specs.len(),
        "file_ending": ".nii.gz",
        "cases": cases,
    })
}

fn validate_specs(specs: &[SynthCaseSpec]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for s in specs {
        let bad = |msg: String| Error::Config(format!("synthetic case '{}': {msg}", s.id));
        if s.id.is_empty()
            || s.id.starts_with('.')
            || s.id.contains(['/', '\\'])
            || s.id.chars().any(char::is_control)
        {
            return Err(bad("id must be a plain, non-empty file name".into()));
        }
        if !seen.insert(s.id.as_str()) {
            return Err(bad("duplicate id".into()));
        }
        if s.shape_xyz.iter().any(|&n| n == 0 || n > i16::MAX as usize) {
            return Err(bad(format!(
                "shape {:?} must be between 1 and {} along each axis",
                s.shape_xyz,
                i16::MAX
            )));
        }
        if s.spacing_xyz.iter().any(|v| !v.is_finite() || *v <= 0.0) {
            return Err(bad(format!(
                "spacing {:?} must be finite and positive",
                s.spacing_xyz
            )));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// NIfTI writing
// ---------------------------------------------------------------------------------------------

/// Write one volume as NIfTI-1 (.nii or .nii.gz decided by the file name) with the given spacing;
/// data in (z, y, x) C order (x fastest).
pub fn write_nifti_i16(
    path: &Path,
    shape_xyz: [usize; 3],
    spacing_xyz: [f64; 3],
    data: &[i16],
) -> Result<()> {
    write_volume(path, shape_xyz, spacing_xyz, data)
}

/// Write one label volume as NIfTI-1 (.nii or .nii.gz decided by the file name) with the given
/// spacing; data in (z, y, x) C order (x fastest).
pub fn write_nifti_u8(
    path: &Path,
    shape_xyz: [usize; 3],
    spacing_xyz: [f64; 3],
    data: &[u8],
) -> Result<()> {
    write_volume(path, shape_xyz, spacing_xyz, data)
}

/// Voxel types the writer accepts (the nifti writer's bounds, without naming `bytemuck`).
trait Voxel: Sized {
    const DESCRIPTION: &'static str;
    fn write(options: &WriterOptions<'_>, array: &ArrayView3<'_, Self>) -> nifti::Result<()>;
}

impl Voxel for i16 {
    const DESCRIPTION: &'static str = "voxcache synthetic two-photon vessels: image";
    fn write(options: &WriterOptions<'_>, array: &ArrayView3<'_, Self>) -> nifti::Result<()> {
        options.write_nifti(array)
    }
}

impl Voxel for u8 {
    const DESCRIPTION: &'static str = "voxcache synthetic two-photon vessels: label";
    fn write(options: &WriterOptions<'_>, array: &ArrayView3<'_, Self>) -> nifti::Result<()> {
        options.write_nifti(array)
    }
}

fn write_volume<T: Voxel>(
    path: &Path,
    shape_xyz: [usize; 3],
    spacing_xyz: [f64; 3],
    data: &[T],
) -> Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if !(name.ends_with(".nii") || name.ends_with(".nii.gz")) || name.starts_with(".nii") {
        return Err(Error::nifti(
            path,
            "output file name must end with .nii or .nii.gz",
        ));
    }
    if shape_xyz.iter().any(|&n| n == 0 || n > i16::MAX as usize) {
        return Err(Error::nifti(
            path,
            format!(
                "shape {shape_xyz:?} must be between 1 and {} along each axis",
                i16::MAX
            ),
        ));
    }
    if spacing_xyz.iter().any(|v| !v.is_finite() || *v <= 0.0) {
        return Err(Error::nifti(
            path,
            format!("spacing {spacing_xyz:?} must be finite and positive"),
        ));
    }
    let [nx, ny, nz] = shape_xyz;
    if data.len() != nx * ny * nz {
        return Err(Error::nifti(
            path,
            format!(
                "{} voxels given for shape {shape_xyz:?} ({} expected)",
                data.len(),
                nx * ny * nz
            ),
        ));
    }

    let header = nifti_header(spacing_xyz, T::DESCRIPTION);
    // (z, y, x) C order reversed is an [nx, ny, nz] Fortran-order view: x fastest on disk.
    let array = ArrayView3::from_shape((nz, ny, nx), data)
        .map_err(|e| Error::nifti(path, e.to_string()))?
        .reversed_axes();
    let options = WriterOptions::new(path).reference_header(&header);
    T::write(&options, &array).map_err(|e| match e {
        NiftiError::Io(io) => Error::io(path, io),
        other => Error::nifti(path, other.to_string()),
    })
}

/// Header fields the writer copies: geometry, units and description (dim, datatype, bitpix,
/// vox_offset, scaling and magic are filled in by the writer).
fn nifti_header(spacing_xyz: [f64; 3], description: &str) -> NiftiHeader {
    let [sx, sy, sz] = spacing_xyz.map(|v| v as f32);
    let mut descrip = description.as_bytes().to_vec();
    descrip.resize(80, 0);
    NiftiHeader {
        pixdim: [1.0, sx, sy, sz, 1.0, 1.0, 1.0, 1.0],
        // NIFTI_UNITS_MICRON, no time unit.
        xyzt_units: 3,
        qform_code: 1,
        sform_code: 1,
        quatern_b: 0.0,
        quatern_c: 0.0,
        quatern_d: 0.0,
        quatern_x: 0.0,
        quatern_y: 0.0,
        quatern_z: 0.0,
        srow_x: [sx, 0.0, 0.0, 0.0],
        srow_y: [0.0, sy, 0.0, 0.0],
        srow_z: [0.0, 0.0, sz, 0.0],
        descrip,
        ..NiftiHeader::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness (no libm: bit-identical on every platform)
// ---------------------------------------------------------------------------------------------

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Combine two 64-bit values into a well-mixed seed.
fn mix(a: u64, b: u64) -> u64 {
    let mut s = a ^ b.rotate_left(32);
    splitmix64(&mut s) ^ b
}

/// FNV-1a hash, to derive a case seed from its id.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// xoshiro256++ seeded through splitmix64.
struct Rng {
    s: [u64; 4],
    spare: Option<f64>,
}

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Rng { s, spare: None }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn range_f64(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in lo..=hi.
    fn range_usize(&mut self, lo: usize, hi: usize) -> usize {
        let span = (hi - lo) as u64 + 1;
        lo + ((self.next_u64() as u128 * span as u128) >> 64) as usize
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.range_usize(0, i);
            items.swap(i, j);
        }
    }

    /// Two independent standard normal values (polar Box-Muller).
    fn gaussian_pair(&mut self) -> (f64, f64) {
        loop {
            let u = 2.0 * self.uniform() - 1.0;
            let v = 2.0 * self.uniform() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let f = (-2.0 * ln(s) / s).sqrt();
                return (u * f, v * f);
            }
        }
    }

    fn gaussian(&mut self) -> f64 {
        if let Some(g) = self.spare.take() {
            return g;
        }
        let (a, b) = self.gaussian_pair();
        self.spare = Some(b);
        a
    }

    fn unit_vector(&mut self) -> [f64; 3] {
        loop {
            let v = [self.gaussian(), self.gaussian(), self.gaussian()];
            if let Some(u) = normalize(v) {
                return u;
            }
        }
    }
}

/// Natural logarithm of a positive normal number, from IEEE basic operations only (so results
/// do not depend on the platform's libm). Relative error below 1e-14.
fn ln(x: f64) -> f64 {
    debug_assert!(x.is_normal() && x > 0.0);
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln(m) = 2 atanh(t), t = (m - 1) / (m + 1), |t| <= 0.172.
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let series = 1.0
        + t2 * (1.0 / 3.0
            + t2 * (1.0 / 5.0
                + t2 * (1.0 / 7.0
                    + t2 * (1.0 / 9.0
                        + t2 * (1.0 / 11.0 + t2 * (1.0 / 13.0 + t2 * (1.0 / 15.0 + t2 / 17.0)))))));
    2.0 * t * series + e as f64 * std::f64::consts::LN_2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_matches_std() {
        for &x in &[
            1e-300, 1e-16, 0.001, 0.3, 0.7, 1.0, 1.5, 2.0, 10.0, 123456.789,
        ] {
            let (a, b) = (ln(x), x.ln());
            assert!((a - b).abs() <= 1e-13 * b.abs().max(1.0), "{x}: {a} vs {b}");
        }
    }

    #[test]
    fn gaussian_moments() {
        let mut rng = Rng::new(7);
        let n = 200_000;
        let (mut s1, mut s2) = (0.0, 0.0);
        for _ in 0..n {
            let g = rng.gaussian();
            s1 += g;
            s2 += g * g;
        }
        let mean = s1 / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn outlier_preset_is_the_single_real_outlier() {
        for seed in [0, 7, 123] {
            let cases = preset_cases(SynthPreset::Outlier, seed);
            assert_eq!(
                cases,
                vec![SynthCaseSpec {
                    id: "vessels_outlier".to_string(),
                    shape_xyz: [512, 512, 61],
                    spacing_xyz: [4.97, 4.97, 5.0],
                }]
            );
        }
        assert_eq!(
            "outlier".parse::<SynthPreset>().unwrap(),
            SynthPreset::Outlier
        );
        assert_eq!(SynthPreset::Outlier.to_string(), "outlier");
        assert!(SynthPreset::ALL.contains(&SynthPreset::Outlier));
        // The Minivess preset's outlier has the same shape and spacing.
        let minivess = preset_cases(SynthPreset::Minivess, 7);
        assert!(minivess
            .iter()
            .any(|c| c.shape_xyz == [512, 512, 61] && c.spacing_xyz == [4.97, 4.97, 5.0]));
    }

    #[test]
    fn range_usize_is_inclusive() {
        let mut rng = Rng::new(1);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            seen[rng.range_usize(5, 8) - 5] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
