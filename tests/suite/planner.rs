//! The planner against nnU-Net's own: the fingerprints nnU-Net 2.8.1 extracted from the bundled
//! vessels and the 70-case MiniVess-like set, planned with its default planner and the ResEnc
//! M / L / XL presets (tests/nnunet_plans/, made as docs/nnunet-planner.md says), must give the
//! same configurations: spacing to the bit, median shape, patch, batch size, strides, kernels,
//! features and blocks, and the same configurations present.

use crate::common;

use std::path::Path;

use serde_json::Value;
use voxcache::planner::{plan_experiment, ConfigurationPlan, Fingerprint, Preset};

/// `prep plan DATA --out OUT`, which must succeed.
fn prep_plan(data: &Path, out: &Path) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_prep"))
        .args([
            "plan",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn read(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nnunet_plans")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn fingerprint(dataset: &str) -> Fingerprint {
    let fp = read(&format!("{dataset}__dataset_fingerprint.json"));
    let dj = read(&format!("{dataset}__dataset.json"));
    let three = |v: &Value| -> [f64; 3] { std::array::from_fn(|a| v[a].as_f64().unwrap()) };
    Fingerprint {
        spacings: fp["spacings"]
            .as_array()
            .unwrap()
            .iter()
            .map(three)
            .collect(),
        shapes: fp["shapes_after_crop"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| three(v).map(|x| x as usize))
            .collect(),
        num_classes: dj["labels"].as_object().unwrap().len(),
        num_training: dj["numTraining"].as_u64().unwrap() as usize,
    }
}

fn ints(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn lists(v: &Value) -> Vec<Vec<usize>> {
    v.as_array().unwrap().iter().map(ints).collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn same(what: &str, ours: &ConfigurationPlan, theirs: &Value) {
    let arch = &theirs["architecture"]["arch_kwargs"];
    let blocks = arch
        .get("n_conv_per_stage")
        .or_else(|| arch.get("n_blocks_per_stage"))
        .unwrap();
    assert_eq!(ours.spacing, floats(&theirs["spacing"]), "{what}: spacing");
    assert_eq!(
        ours.median_shape,
        floats(&theirs["median_image_size_in_voxels"]),
        "{what}: median shape"
    );
    assert_eq!(ours.patch, ints(&theirs["patch_size"]), "{what}: patch");
    assert_eq!(
        ours.batch_size,
        theirs["batch_size"].as_u64().unwrap() as usize,
        "{what}: batch"
    );
    assert_eq!(ours.strides, lists(&arch["strides"]), "{what}: strides");
    assert_eq!(
        ours.kernels,
        lists(&arch["kernel_sizes"]),
        "{what}: kernels"
    );
    assert_eq!(
        ours.features,
        ints(&arch["features_per_stage"]),
        "{what}: features"
    );
    assert_eq!(ours.blocks, ints(blocks), "{what}: blocks");
    assert_eq!(
        ours.decoder_blocks,
        ints(&arch["n_conv_per_stage_decoder"]),
        "{what}: decoder blocks"
    );
}

#[test]
fn plans_equal_nnunets_for_every_preset_on_both_datasets() {
    let presets = [
        (Preset::Default, "nnUNetPlans"),
        (Preset::ResEncM, "nnUNetResEncUNetMPlans"),
        (Preset::ResEncL, "nnUNetResEncUNetLPlans"),
        (Preset::ResEncXL, "nnUNetResEncUNetXLPlans"),
    ];
    for dataset in ["Dataset501_Vessels", "Dataset502_MiniVess"] {
        let fp = fingerprint(dataset);
        for (preset, file) in presets {
            let theirs = read(&format!("{dataset}__{file}.json"));
            let ours = plan_experiment(&fp, preset).unwrap();
            let what = format!("{dataset} {}", preset.name());
            assert_eq!(
                ours.transpose.to_vec(),
                ints(&theirs["transpose_forward"]),
                "{what}: axis order"
            );
            let configs = theirs["configurations"].as_object().unwrap();
            let mut names: Vec<&str> = configs
                .keys()
                .map(String::as_str)
                .filter(|k| *k != "3d_cascade_fullres")
                .collect();
            names.sort();
            let mut have: Vec<&str> = ours.configurations().iter().map(|(n, _)| *n).collect();
            have.sort();
            assert_eq!(have, names, "{what}: configurations");
            for (name, plan) in ours.configurations() {
                same(&format!("{what} {name}"), plan, &configs[name]);
            }
        }
    }
}

#[test]
fn single_slices_get_a_2d_plan_only_and_bad_fingerprints_are_refused() {
    // Ten 1 x 256 x 256 cases: no 3D configuration.
    let fp = Fingerprint {
        spacings: vec![[5.0, 0.5, 0.5]; 10],
        shapes: vec![[1, 256, 256]; 10],
        num_classes: 3,
        num_training: 10,
    };
    let plans = plan_experiment(&fp, Preset::Default).unwrap();
    assert!(plans.fullres.is_none() && plans.lowres.is_none());
    assert_eq!(plans.two_d.patch, vec![256, 256]);
    assert!(plans.two_d.batch_size >= 2);
    for bad in [
        Fingerprint {
            spacings: vec![],
            shapes: vec![],
            ..fp.clone()
        },
        Fingerprint {
            spacings: vec![[0.0, 1.0, 1.0]; 10],
            ..fp.clone()
        },
        Fingerprint {
            shapes: vec![[1, 256, 0]; 10],
            ..fp.clone()
        },
    ] {
        assert!(plan_experiment(&bad, Preset::Default).is_err());
    }
}

/// `prep plan` on the bundled data writes a pipeline whose configurations build the network
/// nnU-Net plans (Dataset501's 3d_fullres: 20x64x64, batch 2), picked by `configuration` or by
/// name; a hand-edited plan that no longer holds together is refused naming the key.
#[test]
fn prep_plan_writes_a_pipeline_that_build_cache_and_train_take() {
    use voxcache::config::{Pipeline, SpacingChoice};
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("plan.toml");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vessels");
    prep_plan(&data, &out);
    let spec = out.to_str().unwrap();
    let p = Pipeline::load(spec).unwrap();
    assert_eq!(p.train.network.patch, [20, 64, 64]);
    assert_eq!(p.train.batch_size, 2);
    assert_eq!(p.train.network.stages, 5);
    assert_eq!(p.train.network.kernels[0], [1, 3, 3]);
    assert_eq!(p.train.network.features, vec![32, 64, 128, 256, 320]);
    assert_eq!(
        p.settings.spacing,
        SpacingChoice::Explicit([0.99, 0.99, 2.9])
    );
    let net = p
        .train
        .network()
        .build(1, 2, &candle_core::Device::Cpu)
        .unwrap();
    assert_eq!(
        net.config().strides,
        vec![[1, 2, 2], [2, 2, 2], [2, 2, 2], [1, 2, 2]]
    );
    let two_d = Pipeline::load_configured(spec, Some("2d")).unwrap();
    assert_eq!(two_d.train.network.patch, [1, 64, 64]);
    assert!(two_d.train.network.kernels.iter().all(|k| k[0] == 1));
    two_d
        .train
        .network()
        .build(1, 2, &candle_core::Device::Cpu)
        .unwrap();

    let text = std::fs::read_to_string(&out).unwrap();
    let edited = |from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        let f = t.path().join("edited.toml");
        std::fs::write(&f, text.replacen(from, to, 1)).unwrap();
        Pipeline::load(f.to_str().unwrap())
            .expect_err("refused")
            .to_string()
    };
    let e = edited("patch = [20, 64, 64]", "patch = [20, 64, 60]");
    assert!(e.contains("3d_fullres") && e.contains("patch"), "{e}");
    let e = edited(
        "configuration = \"3d_fullres\"",
        "configuration = \"3d_lowres\"",
    );
    assert!(
        e.contains("3d_lowres") && e.contains("2d, 3d_fullres"),
        "{e}"
    );
    let e = edited(
        "kernels = [[1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]]",
        "kernels = [[1, 3, 3], [3, 3, 3]]",
    );
    assert!(e.contains("kernels") && e.contains("5 stages"), "{e}");
    let e = edited(
        "encoder = \"plain\"\nsize_estimate = 2",
        "encoder = \"dense\"\nsize_estimate = 2",
    );
    assert!(
        e.contains("dense") && e.contains("plain or residual"),
        "{e}"
    );
    // The residual encoder of the ResEnc presets is built from the same table.
    let f = t.path().join("residual.toml");
    let residual = text.replacen(
        "encoder = \"plain\"\nsize_estimate = 2",
        "encoder = \"residual\"\nsize_estimate = 2",
        1,
    );
    std::fs::write(&f, residual).unwrap();
    let p = Pipeline::load(f.to_str().unwrap()).unwrap();
    let net = p
        .train
        .network()
        .build(1, 2, &candle_core::Device::Cpu)
        .unwrap();
    assert_eq!(net.config().encoder.name(), "residual");
    assert!(net.params().iter().any(|(n, _)| n == "stem.conv.weight"));
}

/// Spacings 0.8 x 0.8 x 2.4 have a ratio of exactly 3 in decimal but 2.99999996 in the
/// headers' single precision, which is what nnU-Net compares: it calls the set anisotropic
/// and takes the 10th-percentile z spacing 1.2 (its plans for this probe, made with nnunetv2
/// 2.8.1: 3d_fullres spacing z 1.2, patch 32x96x96, every kernel 3x3x3).
#[test]
fn an_exact_ratio_of_three_is_anisotropic_as_in_nnunet() {
    use voxcache::config::{Pipeline, SpacingChoice};
    use voxcache::nifti_io::{write_nifti_i16, write_nifti_u8};
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("edge");
    for d in ["imagesTr", "labelsTr"] {
        std::fs::create_dir_all(data.join(d)).unwrap();
    }
    for i in 0..10 {
        let (z, nz) = if i < 6 { (2.4, 16) } else { (1.2, 32) };
        let shape = [96, 96, nz];
        let n = 96 * 96 * nz;
        let image: Vec<i16> = (0..n).map(|k| (k % 200) as i16 + 1).collect();
        let label: Vec<u8> = (0..n)
            .map(|k| u8::from((40..50).contains(&(k % 96))))
            .collect();
        let sp = [0.8, 0.8, z];
        let img = data.join(format!("imagesTr/edge_{i:03}_0000.nii.gz"));
        write_nifti_i16(&img, shape, sp, &image).unwrap();
        let lab = data.join(format!("labelsTr/edge_{i:03}.nii.gz"));
        write_nifti_u8(&lab, shape, sp, &label).unwrap();
    }
    let out = t.path().join("plan.toml");
    prep_plan(&data, &out);
    let p = Pipeline::load(out.to_str().unwrap()).unwrap();
    assert_eq!(p.settings.spacing, SpacingChoice::Explicit([0.8, 0.8, 1.2]));
    assert_eq!(p.train.network.patch, [32, 96, 96]);
    assert!(p.train.network.kernels.iter().all(|k| *k == [3, 3, 3]));
}

/// `--gpu-memory-gb`: nnU-Net's reference scaled to the memory, then every configuration
/// shrunk until our forecast of its bf16 step (+ 1 GiB for the CUDA context) fits; a memory
/// no plan fits is refused with the figure the smallest needs.
#[test]
fn a_gpu_memory_target_shrinks_the_plan_to_our_forecast() {
    use voxcache::config::configurations::plan_dataset;
    use voxcache::planner::{fingerprint_dataset, Preset};
    use voxcache::prep::dataset::DatasetSource;
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vessels");
    let fp = fingerprint_dataset(&DatasetSource::Folder(data)).unwrap();
    let free = plan_dataset(&fp, Preset::Default, None).unwrap();
    assert!(free.notes.is_empty());
    let full = &free.tables["3d_fullres"];
    assert_eq!(full.patch, [20, 64, 64]);
    assert!(full.memory_bf16_mib > 0 && full.memory_f32_mib > full.memory_bf16_mib);
    let tight = plan_dataset(&fp, Preset::Default, Some(1.1)).unwrap();
    for (name, t) in &tight.tables {
        assert!(
            t.memory_bf16_mib + 1024 <= 1127,
            "{name}: {} MiB",
            t.memory_bf16_mib
        );
    }
    let small = &tight.tables["3d_fullres"];
    assert!(small.patch.iter().product::<usize>() < full.patch.iter().product::<usize>());
    assert!(
        tight.notes.iter().any(|n| n.starts_with("3d_fullres")),
        "{:?}",
        tight.notes
    );
    // The bundled data plans no 3d_lowres, so no cascade.
    assert!(!free.tables.contains_key("3d_cascade_fullres"));
    let e = plan_dataset(&fp, Preset::Default, Some(0.5))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("needs") && e.contains("GiB"), "{e}");
    let e = plan_dataset(&fp, Preset::Default, Some(-3.0))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("--gpu-memory-gb"), "{e}");
}

/// `train` with no patch anywhere plans one from the cache: on the bundled data the cache's
/// cases give nnU-Net's Dataset501 plan (3d_fullres 20x64x64, batch 2, 5 stages, 32..320),
/// recorded in the configuration; the bundled pipelines keep their own small patch.
#[test]
fn train_without_a_patch_plans_from_the_cache() {
    use voxcache::config::autoplan::plan_from_cache;
    use voxcache::config::train::{resolve_planned, TrainFlags};
    let t = tempfile::tempdir().unwrap();
    let bare = t.path().join("bare.toml");
    std::fs::write(&bare, "[train]\nsteps = 10\n").unwrap();
    let flags = |pipeline: Option<&str>, configuration: Option<&str>, patch| TrainFlags {
        pipeline: pipeline.map(str::to_string),
        configuration: configuration.map(str::to_string),
        patch,
        ..TrainFlags::default()
    };
    let bare = bare.to_str().unwrap();
    assert!(!resolve_planned(&flags(None, None, None)).unwrap().1);
    assert!(!resolve_planned(&flags(Some("ct"), None, None)).unwrap().1);
    assert!(resolve_planned(&flags(Some(bare), None, None)).unwrap().1);
    assert!(
        !resolve_planned(&flags(Some(bare), None, Some([8, 32, 32])))
            .unwrap()
            .1
    );
    assert!(resolve_planned(&flags(None, Some("auto"), None)).unwrap().1);

    let (mut cfg, _) = resolve_planned(&flags(Some(bare), None, None)).unwrap();
    let cache = common::fixtures::bundled_cache("default", &[]);
    let text = plan_from_cache(&mut cfg, cache, "cpu", None, Default::default()).unwrap();
    assert!(text.contains("3d_fullres"), "{text}");
    assert_eq!(
        (cfg.network.patch, cfg.batch_size, cfg.network.stages),
        ([20, 64, 64], 2, 5)
    );
    assert_eq!(cfg.network.features, vec![32, 64, 128, 256, 320]);
    assert_eq!(cfg.steps, 10, "the pipeline's other keys stay");
    assert!(cfg.planned.as_deref().unwrap().contains("10 cases"));
    let net = cfg
        .network()
        .build(1, 2, &candle_core::Device::Cpu)
        .unwrap();
    assert_eq!(
        net.num_parameters(),
        16_137_416 - 514,
        "dna's count less its unused head"
    );
}
