//! Median time of each intensity transform alone on one patch, through the loader's entry
//! point (`intensity::apply`, so the same CPU-specific build), for profiling the augmentation:
//!
//!   cargo run --release --example bench_intensity -- [Z,Y,X] [RUNS] [ONLY]
//!
//! Prints one line per transform (or the one named ONLY): median milliseconds, nanoseconds a
//! voxel and the mean (ranges and
//! per-channel probabilities are nnU-Net's; each transform's own probability set to 1).

use std::time::Instant;

use voxcache::train::intensity::{apply, IntensityConfig};
use voxcache::train::spatial::SpatialConfig;
use voxcache::util::rng::Rng;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let size: Vec<usize> = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("32,96,96")
        .split(',')
        .map(|v| v.parse())
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(size.len() == 3, "size: give z,y,x");
    let size = [size[0], size[1], size[2]];
    let runs: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(50);
    let n: usize = size.iter().product();
    let mut rng = Rng::new(3);
    let base: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    let none = IntensityConfig::none();
    let every = none.every();
    let one = |set: fn(&mut IntensityConfig)| {
        let mut c = none.clone();
        set(&mut c);
        c
    };
    let cases: Vec<(&str, IntensityConfig)> = vec![
        ("nothing", none.clone()),
        ("noise", one(|c| c.noise_prob = 1.0)),
        (
            "blur",
            one(|c| {
                c.blur_prob = 1.0;
                c.blur_channel_prob = 1.0;
            }),
        ),
        ("brightness", one(|c| c.brightness_prob = 1.0)),
        ("contrast", one(|c| c.contrast_prob = 1.0)),
        (
            "low resolution",
            one(|c| {
                c.lowres_prob = 1.0;
                c.lowres_channel_prob = 1.0;
            }),
        ),
        ("inverted gamma", one(|c| c.inverted_gamma_prob = 1.0)),
        ("gamma", one(|c| c.gamma_prob = 1.0)),
        ("every", every),
        ("nnU-Net's mix", IntensityConfig::default()),
    ];
    let only = args.get(3);
    // As the loader decides it: the low-resolution simulation keeps z for patches nnU-Net
    // augments in-plane.
    let in_plane = SpatialConfig::default().in_plane_for(size);
    let mut work = base.clone();
    for (name, cfg) in cases.iter().filter(|c| only.is_none_or(|o| o == c.0)) {
        let mut ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            work.copy_from_slice(&base);
            let t = Instant::now();
            apply(&mut work, size, in_plane, cfg, &mut rng);
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mean = ms.iter().sum::<f64>() / runs as f64;
        ms.sort_by(f64::total_cmp);
        let m = ms[runs / 2];
        println!(
            "{name:>16} {m:8.3} ms {:6.2} ns/voxel (mean {mean:.3} ms)",
            m * 1e6 / n as f64
        );
    }
    Ok(())
}
