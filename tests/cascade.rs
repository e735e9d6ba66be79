//! The cascade's data: `prep build-cache --previous-stage DIR` adds each case's first-stage
//! segmentation as one 0/1 image channel per foreground label; a case without one, or with
//! one on another grid, fails alone, named; the entry's key follows the segmentation's bytes.

mod common;

use std::path::Path;

use common::fixtures::{prep, text};
use voxcache::cache::reader::CacheReader;
use voxcache::nifti_io::read_volume;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn previous_stage_segmentations_become_indicator_channels() {
    let t = tempfile::tempdir().unwrap();
    let (data, prev, cache) = (
        t.path().join("brats"),
        t.path().join("prev"),
        t.path().join("cache"),
    );
    let o = prep(&["synth", "--preset", "brats-like", "--out", s(&data)]);
    assert!(o.status.success(), "{}", text(&o));
    // The first stage's "predictions": the labels themselves (all but brats_011), and one
    // made on another grid (brats_010 gets brats_000's).
    std::fs::create_dir_all(&prev).unwrap();
    for i in 0..11 {
        let from = if i == 10 { 0 } else { i };
        std::fs::copy(
            data.join(format!("labelsTr/brats_{from:03}.nii.gz")),
            prev.join(format!("brats_{i:03}.nii.gz")),
        )
        .unwrap();
    }
    let build = || {
        prep(&[
            "build-cache",
            s(&data),
            "--cache-dir",
            s(&cache),
            "--previous-stage",
            s(&prev),
        ])
    };
    let o = build();
    assert!(!o.status.success());
    let out = text(&o);
    assert!(out.contains("10 built"), "{out}");
    assert!(
        out.contains("brats_011.nii.gz") && out.contains("3d_lowres"),
        "{out}"
    );
    assert!(out.contains("brats_010"), "{out}");

    let reader = CacheReader::open(&cache).unwrap();
    let ds = reader.datasets()[0].to_string();
    for i in [0, 4] {
        let id = format!("brats_{i:03}");
        let e = reader.open_entry(&ds, &id).unwrap();
        assert_eq!(e.channels(), 7, "four contrasts and labels 1, 2, 3");
        let shape = e.shape_zyx();
        let n: usize = shape.iter().product();
        let label = read_volume(&data.join(format!("labelsTr/{id}.nii.gz"))).unwrap();
        // At the data's own spacing (1 mm, the median) the grid is the input's.
        assert_eq!(label.data.len(), n);
        for (k, value) in [1.0f32, 2.0, 3.0].into_iter().enumerate() {
            let mut ch = vec![0f32; n];
            e.read_channel(4 + k, [0, 0, 0], shape, &mut ch).unwrap();
            let want: Vec<f32> = label
                .data
                .iter()
                .map(|&l| (l == value) as u8 as f32)
                .collect();
            assert_eq!(ch, want, "{id} label {value}");
            assert!(want.contains(&1.0), "{id} holds label {value}");
        }
    }

    // Training its second stage is refused for now, naming the dataset and why.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--cache-dir", s(&cache), "--out", s(&t.path().join("run"))])
        .args(["--steps", "1", "--no-progress"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("previous stage") && text(&o).contains("not available yet"),
        "{}",
        text(&o)
    );

    // Built again: nothing changes; a segmentation changed: its case alone is rebuilt.
    let o = build();
    assert!(text(&o).contains("0 built, 10 cached"), "{}", text(&o));
    // The same voxels compressed anew: other bytes, so another key.
    let seg = prev.join("brats_002.nii.gz");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&seg).unwrap()),
        &mut raw,
    )
    .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
    std::io::Write::write_all(&mut gz, &raw).unwrap();
    std::fs::write(&seg, gz.finish().unwrap()).unwrap();
    let o = build();
    assert!(text(&o).contains("1 built, 9 cached"), "{}", text(&o));
}
