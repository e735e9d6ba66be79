//! zarrs' own read of a box of a cached array: the reference the patch readers are checked against.

use std::path::Path;
use std::sync::Arc;

use zarrs::array::{Array, ArraySubset};
use zarrs::filesystem::FilesystemStore;

/// What zarrs itself returns for the box, zeros outside the volume, as f64 (exact for every
/// stored type). A (c, z, y, x) array gives every channel's box, one after the other.
pub fn zarrs_box(entry: &Path, name: &str, start: [i64; 3], size: [usize; 3]) -> Vec<f64> {
    let store = Arc::new(FilesystemStore::new(entry).unwrap());
    let array = Array::open(store, &format!("/{name}")).unwrap();
    if array.shape().len() == 4 {
        return (0..array.shape()[0])
            .flat_map(|c| channel_box(&array, Some(c), start, size))
            .collect();
    }
    channel_box(&array, None, start, size)
}

fn channel_box(
    array: &Array<FilesystemStore>,
    channel: Option<u64>,
    start: [i64; 3],
    size: [usize; 3],
) -> Vec<f64> {
    let shape = array.shape()[channel.is_some() as usize..].to_vec();
    let mut out = vec![0.0f64; size.iter().product()];
    let mut ranges = Vec::new();
    for a in 0..3 {
        let lo = start[a].clamp(0, shape[a] as i64) as u64;
        let hi = (start[a] + size[a] as i64).clamp(0, shape[a] as i64) as u64;
        if lo >= hi {
            return out;
        }
        ranges.push(lo..hi);
    }
    if let Some(c) = channel {
        ranges.insert(0, c..c + 1);
    }
    let subset = ArraySubset::new_with_ranges(&ranges);
    if channel.is_some() {
        ranges.remove(0);
    }
    let values: Vec<f64> = match array.data_type().to_string().split(' ').next().unwrap() {
        "float32" => array
            .retrieve_array_subset::<Vec<f32>>(&subset)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        "float16" => array
            .retrieve_array_subset::<Vec<half::f16>>(&subset)
            .unwrap()
            .into_iter()
            .map(|v| v.to_f64())
            .collect(),
        "uint8" => array
            .retrieve_array_subset::<Vec<u8>>(&subset)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        "uint16" => array
            .retrieve_array_subset::<Vec<u16>>(&subset)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        other => panic!("data type {other}"),
    };
    let n = [0, 1, 2].map(|a| (ranges[a].end - ranges[a].start) as usize);
    let mut i = 0;
    for z in 0..n[0] {
        for y in 0..n[1] {
            let oz = (ranges[0].start as i64 + z as i64 - start[0]) as usize;
            let oy = (ranges[1].start as i64 + y as i64 - start[1]) as usize;
            let ox = (ranges[2].start as i64 - start[2]) as usize;
            let d = (oz * size[1] + oy) * size[2] + ox;
            out[d..d + n[2]].copy_from_slice(&values[i..i + n[2]]);
            i += n[2];
        }
    }
    out
}
