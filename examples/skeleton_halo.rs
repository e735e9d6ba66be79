//! How wide a halo makes the chunked skeleton equal the whole-volume one: for every case of a
//! cache, the label's skeleton computed whole, then block by block with fixed halos and with
//! the build's rule (base halo, widened while a block needs more thinning rounds than it has).
//!
//!   cargo run --release --example skeleton_halo -- CACHE_DIR [Z,Y,X block]
//!
//! Prints, per halo, the voxels that differ from the whole-volume skeleton over all cases and
//! how many cases match exactly.

use voxcache::cache::reader::CacheReader;
use voxcache::prep::derived::thinning::skeletonize;
use voxcache::prep::derived::{
    block_bounds, chunked_skeleton_with, LabelVolume, BASE_HALO, MAX_HALO,
};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 2, "usage: skeleton_halo CACHE_DIR [Z,Y,X]");
    let block: Vec<usize> = args
        .get(2)
        .map_or("16,32,32", |s| s.as_str())
        .split(',')
        .map(|p| p.parse())
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(block.len() == 3, "block: give z,y,x");
    let block = [block[0], block[1], block[2]];
    let cache = CacheReader::open(&args[1])?;
    let mut volumes = Vec::new();
    for ds in cache.datasets() {
        for case in cache.cases(ds)? {
            let e = cache.open_entry(ds, &case.case_id)?;
            let shape = e.shape_zyx();
            let mut lab = vec![0u16; shape.iter().product()];
            e.read_label([0, 0, 0], shape, &mut lab)?;
            let mut whole = vec![0u16; lab.len()];
            let mut classes: Vec<u16> = lab.iter().copied().filter(|&v| v != 0).collect();
            classes.sort_unstable();
            classes.dedup();
            for c in classes {
                let mask: Vec<bool> = lab.iter().map(|&v| v == c).collect();
                for (w, s) in whole.iter_mut().zip(skeletonize(&mask, shape)) {
                    if s {
                        *w = c;
                    }
                }
            }
            volumes.push((case.case_id.clone(), shape, lab, whole));
        }
    }
    println!(
        "{} cases, blocks of {block:?}; skeleton voxels (whole volume): {}",
        volumes.len(),
        volumes
            .iter()
            .map(|v| v.3.iter().filter(|&&x| x != 0).count())
            .sum::<usize>()
    );
    println!("halo            differing voxels   cases equal   widest halo");
    let mut rows: Vec<(String, usize, usize)> = (0..=8).map(|h| (format!("{h}"), h, h)).collect();
    rows.push((
        format!("build rule {BASE_HALO}..{MAX_HALO}"),
        BASE_HALO,
        MAX_HALO,
    ));
    for (name, base, max) in rows {
        let (mut diff, mut equal, mut widest) = (0usize, 0usize, 0usize);
        for (_, shape, lab, whole) in &volumes {
            let label = LabelVolume {
                voxels: lab,
                shape: *shape,
            };
            let mut got = vec![0u16; lab.len()];
            let grid = [0, 1, 2].map(|a| shape[a].div_ceil(block[a]));
            for i in 0..grid.iter().product::<usize>() {
                let (_, lo, hi) = block_bounds(*shape, block, i);
                let (sk, st) = chunked_skeleton_with(&label, *shape, lo, hi, base, max)?;
                widest = widest.max(st.widest_halo);
                let size = [0, 1, 2].map(|a| hi[a] - lo[a]);
                for z in 0..size[0] {
                    for y in 0..size[1] {
                        let dst = ((lo[0] + z) * shape[1] + lo[1] + y) * shape[2] + lo[2];
                        let src = (z * size[1] + y) * size[2];
                        got[dst..dst + size[2]].copy_from_slice(&sk[src..src + size[2]]);
                    }
                }
            }
            let d = got.iter().zip(whole).filter(|(a, b)| a != b).count();
            diff += d;
            equal += usize::from(d == 0);
        }
        println!(
            "{name:<16}{diff:>16}{:>14}{widest:>14}",
            format!("{equal}/{}", volumes.len())
        );
    }
    Ok(())
}
