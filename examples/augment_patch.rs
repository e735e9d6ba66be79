//! Writes spatially transformed patches of a cached case, for `scripts/augment_check.py` to
//! compare with scipy's `map_coordinates` over the whole volume read by zarr-python.
//!
//!   cargo run --example augment_patch -- CACHE_DIR OUT_DIR
//!
//! For the first case of the cache's first dataset and a fixed set of rotations, scales and
//! two elastic fields (one in-plane), OUT_DIR gets `patch_K.json` (entry folder, box start and size, angles,
//! scale), `patch_K.image.f32` (channels x patch), `patch_K.label.u16` and
//! `patch_K.coords.f64` (the source coordinate of every patch voxel, z y x), little-endian.

use std::path::PathBuf;

use voxcache::cache::reader::CacheReader;
use voxcache::train::spatial::{SpatialConfig, Transform, TransformedReader};
use voxcache::util::rng::Rng;

/// Write values already turned into little-endian bytes, one after the other.
fn write_le<const N: usize>(
    path: &std::path::Path,
    values: impl Iterator<Item = [u8; N]>,
) -> std::io::Result<()> {
    std::fs::write(path, values.flatten().collect::<Vec<u8>>())
}

/// Angles about z, y, x in radians, scale, start offset from the middle box, and a whole
/// transform where the first two do not describe it.
type Case = ([f64; 3], f64, [i64; 3], Option<Transform>);

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 3, "usage: augment_patch CACHE_DIR OUT_DIR");
    let (cache, out) = (PathBuf::from(&args[1]), PathBuf::from(&args[2]));
    std::fs::create_dir_all(&out)?;
    let reader = CacheReader::open(&cache)?;
    let dataset = reader
        .datasets()
        .first()
        .map(|s| s.to_string())
        .ok_or_else(|| anyhow::anyhow!("{}: no dataset", cache.display()))?;
    let case = reader
        .cases(&dataset)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no case in {dataset}"))?;
    let entry = reader.open_entry(&dataset, &case.case_id)?;
    let shape = entry.shape_zyx();
    let size = [shape[0].min(12), 24, 28];
    let mid = [0, 1, 2].map(|a| shape[a] as i64 / 2 - size[a] as i64 / 2);
    let elastic = SpatialConfig {
        elastic_prob: 1.0,
        elastic_magnitude: 2.5,
        elastic_grid: 8,
        in_plane: Some(false),
        ..SpatialConfig::none()
    }
    .draw(size, &mut Rng::new(11));
    // In-plane: rotated, scaled and deformed in (y, x) only, z on whole voxels (the reader's
    // 4-neighbour path).
    let in_plane = SpatialConfig {
        rotation_prob: 1.0,
        scale_prob: 1.0,
        elastic_prob: 1.0,
        elastic_magnitude: 2.0,
        elastic_grid: 8,
        in_plane: Some(true),
        ..SpatialConfig::none()
    }
    .draw(size, &mut Rng::new(5));
    let cases: Vec<Case> = vec![
        ([0.4, 0.0, 0.0], 1.0, [0, 0, 0], None),
        ([0.3, -0.2, 0.25], 1.3, [1, -5, 7], None),
        ([-2.8, 0.1, -0.4], 0.7, [-1, 9, -4], None),
        ([0.0, 0.0, 0.0], 1.2, [0, 0, 0], None),
        // Near a corner: much of the patch reads outside the volume.
        (
            [0.5, 0.2, 0.1],
            1.1,
            [-mid[0] - 3, -mid[1] - 10, -mid[2]],
            None,
        ),
        ([0.0; 3], 1.0, [0, 2, -3], Some(elastic)),
        ([0.0; 3], 1.0, [1, -2, 4], Some(in_plane)),
    ];
    let mut tr = TransformedReader::default();
    let n: usize = size.iter().product();
    for (k, (angles, scale, offset, given)) in cases.into_iter().enumerate() {
        let start = [0, 1, 2].map(|a| mid[a] + offset[a]);
        let t = given
            .clone()
            .unwrap_or_else(|| Transform::rotate_scale(angles, scale));
        let mut image = vec![0f32; entry.channels() * n];
        let mut label = vec![0u16; n];
        tr.read(&entry, start, size, &t, &mut image, Some(&mut label))?;
        let meta = serde_json::json!({
            "entry": entry.dir(),
            "start": start,
            "size": size,
            "angles": angles,
            "scale": scale,
            "elastic": given.is_some(),
            "channels": entry.channels(),
        });
        std::fs::write(out.join(format!("patch_{k}.json")), meta.to_string())?;
        write_le(
            &out.join(format!("patch_{k}.image.f32")),
            image.iter().map(|v| v.to_le_bytes()),
        )?;
        write_le(
            &out.join(format!("patch_{k}.label.u16")),
            label.iter().map(|v| v.to_le_bytes()),
        )?;
        let coords = t.coordinates(start, size);
        write_le(
            &out.join(format!("patch_{k}.coords.f64")),
            coords.iter().flatten().map(|v| v.to_le_bytes()),
        )?;
    }
    println!("{}", out.display());
    Ok(())
}
