//! Our reproduction of nnU-Net's inference stages on one case, written for comparison with
//! nnunetv2 (scripts/nnunet_import_check.py) or its numpy reference (scripts/nnunet_reference.py):
//!
//!     cargo run --release --example nnunet_stages -- --nnunet-model DIR --out OUT CASE_0000.nii.gz [CASE_0001.nii.gz ...]
//!
//! OUT/preprocessed.npy: the network's input (float32, channels, z, y, x), as
//! `DefaultPreprocessor.run_case` makes it; OUT/stages.json: the shapes and box on the way, the
//! padded shape and every sliding-window start (z, y, x) in nnU-Net's order and coordinates.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use voxcache::format::nnunet::{Plans, ResultsFolder};
use voxcache::infer::sliding::nnunet_starts;
use voxcache::prep::dataset::CaseSource;
use voxcache::prep::nnunet::preprocess;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut model, mut out, mut images) = (None, None, Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nnunet-model" => model = args.next().map(PathBuf::from),
            "--out" => out = args.next().map(PathBuf::from),
            _ => images.push(PathBuf::from(a)),
        }
    }
    let (Some(model), Some(out)) = (model, out) else {
        bail!("usage: nnunet_stages --nnunet-model DIR --out OUT CASE_0000.nii.gz [...]");
    };
    if images.is_empty() {
        bail!("no image given");
    }
    let folder = ResultsFolder::open(&model)?;
    let plans = Plans::read(&model.join("plans.json"), &folder.configuration)?;
    std::fs::create_dir_all(&out)?;
    let tmp = out.join(".scratch");
    std::fs::create_dir_all(&tmp)?;
    let case = CaseSource {
        id: "case".into(),
        images,
        label: None,
        packed: false,
    };
    let p = preprocess(&case, &plans, &plans.image_reader_writer, &tmp)?;
    let [c, d, h, w] = p.data.shape;
    // The array, as .npy (version 1.0, little-endian float32, C order).
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({c}, {d}, {h}, {w}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(out.join("preprocessed.npy"))?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for ch in 0..c {
        for z in 0..d {
            for v in p.data.slice(ch, z)? {
                f.write_all(&v.to_le_bytes())?;
            }
        }
    }
    f.flush()?;
    // Windows over the padded volume, as nnU-Net lists its slicers.
    let g = &p.geometry;
    let patch = &plans.configuration.patch_size;
    let planar = patch.len() == 2;
    let shape = g.new_shape;
    let patch3 = if planar {
        [1, patch[0], patch[1]]
    } else {
        [patch[0], patch[1], patch[2]]
    };
    let padded: Vec<usize> = (0..3).map(|a| shape[a].max(patch3[a])).collect();
    let starts: Vec<Vec<usize>> = (0..3)
        .map(|a| {
            if planar && a == 0 {
                (0..shape[0]).collect()
            } else {
                nnunet_starts(padded[a], patch3[a], 0.5)
            }
        })
        .collect();
    let mut windows = Vec::new();
    for &z in &starts[0] {
        for &y in &starts[1] {
            for &x in &starts[2] {
                windows.push([z, y, x]);
            }
        }
    }
    let stages = serde_json::json!({
        "shape_before_cropping": g.shape_before_cropping,
        "bbox": g.bbox,
        "shape_after_cropping": g.shape_after_cropping,
        "spacing_transposed": g.spacing_transposed,
        "target_spacing": g.target_spacing,
        "preprocessed_shape": g.new_shape,
        "padded_shape": padded,
        "window_starts": windows,
    });
    std::fs::write(out.join("stages.json"), serde_json::to_vec_pretty(&stages)?)
        .context("stages.json")?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
