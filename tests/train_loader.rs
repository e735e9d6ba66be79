//! The training data path end to end: sampler, augmentation and loader over real caches of the
//! bundled data, checked against zarrs' own reads, exact foreground statistics, determinism
//! across thread counts and resumes, bounded memory, read errors and shutdown.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::fixtures::{bits, bundled_cache, copy_tree, open_entries};
use common::probe::{assert_probe_sees_an_allocation, status_kib, vm_rss_kib};
use voxcache::cache::reader::{CacheReader, EntryReader};
use voxcache::train::augment::AugmentConfig;
use voxcache::train::loader::{Batch, Loader, LoaderConfig};
use voxcache::train::sampler::{Sampler, SamplerConfig};

const CHUNK: [usize; 3] = [4, 16, 16];

/// Caches of the bundled data (volumes of 9 to 69 slices), plain and zstd, built once.
fn cache(name: &str) -> &'static Path {
    match name {
        "plain" => bundled_cache(name, &["--chunk", "4,16,16"]),
        "zstd" => bundled_cache(name, &["--chunk", "4,16,16", "--compression", "zstd"]),
        _ => panic!("no cache layout {name:?}"),
    }
}

/// Every case of a cache, opened.
fn entries(dir: &Path) -> Vec<EntryReader> {
    open_entries(&CacheReader::open(dir).unwrap())
}

fn loader_cfg(workers: usize, augment: AugmentConfig) -> LoaderConfig {
    LoaderConfig {
        workers,
        queue_depth: 3,
        augment,
        skeleton: false,
        ..LoaderConfig::default()
    }
}

fn start(
    es: &[EntryReader],
    cfg: SamplerConfig,
    workers: usize,
    augment: AugmentConfig,
    first: u64,
) -> Loader {
    let sampler = Sampler::new(es, Vec::new(), cfg).unwrap();
    Loader::start(es.to_vec(), sampler, loader_cfg(workers, augment), first).unwrap()
}

fn patch_of<T: Copy>(data: &[T], b: &Batch, i: usize) -> Vec<T> {
    let n: usize = b.patch_zyx.iter().product();
    data[i * n..(i + 1) * n].to_vec()
}

fn centre_index(size: [usize; 3]) -> usize {
    ((size[0] / 2) * size[1] + size[1] / 2) * size[2] + size[2] / 2
}

#[test]
fn unaugmented_patches_equal_zarrs_reads() {
    // z = 16 is more than some volumes have (9, 10 slices): those patches are padded.
    let size = [16, 24, 40];
    for layout in ["plain", "zstd"] {
        let es = entries(cache(layout));
        let cfg = SamplerConfig::new(size, 6, 5);
        let mut loader = start(&es, cfg, 2, AugmentConfig::none(), 0);
        let (mut inside, mut across, mut past_edge) = (0, 0, 0);
        for step in 0..25 {
            let (b, _) = loader.next().unwrap();
            assert_eq!((b.step, b.batch_size, b.patch_zyx), (step, 6, size));
            assert_eq!(b.image.len(), 6 * size.iter().product::<usize>());
            assert_eq!(b.label.len(), b.image.len());
            for (i, c) in b.choices.iter().enumerate() {
                let e = &es[c.case];
                let img = common::zarrs_box(e.dir(), "image", c.start_zyx, size);
                let lab = common::zarrs_box(e.dir(), "label", c.start_zyx, size);
                let got_img = patch_of(&b.image, &b, i).into_iter().map(f64::from);
                let got_lab = patch_of(&b.label, &b, i).into_iter().map(f64::from);
                assert!(
                    bits(got_img) == bits(img),
                    "{layout}: image of {c:?} differs"
                );
                assert!(
                    bits(got_lab) == bits(lab),
                    "{layout}: label of {c:?} differs"
                );
                let shape = e.shape_zyx();
                let lo = c.start_zyx;
                let hi = [0, 1, 2].map(|a| lo[a] + size[a] as i64);
                if (0..3).any(|a| lo[a] < 0 || hi[a] > shape[a] as i64) {
                    past_edge += 1;
                } else {
                    inside += 1;
                }
                if (0..3).any(|a| {
                    lo[a].div_euclid(CHUNK[a] as i64) != (hi[a] - 1).div_euclid(CHUNK[a] as i64)
                }) {
                    across += 1;
                }
            }
        }
        assert!(
            inside > 10 && across > 10 && past_edge > 10,
            "{inside} {across} {past_edge}"
        );
    }
}

#[test]
fn volumes_thinner_than_the_patch_are_zero_padded() {
    let size = [16, 32, 32];
    let es = entries(cache("plain"));
    let mut cfg = SamplerConfig::new(size, 4, 8);
    cfg.fg_fraction = 0.0;
    let mut loader = start(&es, cfg, 2, AugmentConfig::none(), 0);
    let plane = size[1] * size[2];
    let mut thin = 0;
    for _ in 0..40 {
        let (b, _) = loader.next().unwrap();
        for (i, c) in b.choices.iter().enumerate() {
            let depth = es[c.case].shape_zyx()[0] as i64;
            if depth >= size[0] as i64 {
                continue;
            }
            thin += 1;
            // The whole volume's depth lies inside the patch, the rest is padding.
            let z0 = c.start_zyx[0];
            assert!(z0 <= 0 && z0 + size[0] as i64 >= depth, "{c:?}");
            let img = patch_of(&b.image, &b, i);
            let lab = patch_of(&b.label, &b, i);
            for z in 0..size[0] {
                let inside = (0..depth).contains(&(z as i64 + z0));
                let slab = z * plane..(z + 1) * plane;
                let zero = img[slab.clone()].iter().all(|&v| v == 0.0)
                    && lab[slab].iter().all(|&v| v == 0);
                assert_eq!(zero, !inside, "plane {z} of {c:?}");
            }
        }
    }
    assert!(thin > 20, "{thin}");
}

/// The label volume of an entry, (z, y, x) C order.
fn whole_label(e: &EntryReader) -> Vec<u16> {
    let s = e.shape_zyx();
    let mut img = vec![0.0f32; s.iter().product()];
    let mut lab = vec![0u16; img.len()];
    e.read_patch([0, 0, 0], s, &mut img, Some(&mut lab))
        .unwrap();
    lab
}

#[test]
fn foreground_is_oversampled_as_nnunet_does() {
    let size = [8, 32, 32];
    let es = entries(cache("plain"));
    let cfg = SamplerConfig::new(size, 6, 21);
    assert_eq!(cfg.forced_per_batch(), 2);
    let mut loader = start(&es, cfg.clone(), 2, AugmentConfig::none(), 0);
    let (mut fg_centres, mut total) = (0, 0);
    for _ in 0..200 {
        let (b, _) = loader.next().unwrap();
        let forced: Vec<bool> = b.choices.iter().map(|c| c.forced_fg).collect();
        assert_eq!(forced, [false, false, false, false, true, true]);
        for (i, c) in b.choices.iter().enumerate() {
            let centre = b.label[i * size.iter().product::<usize>() + centre_index(size)];
            if c.forced_fg {
                assert_ne!(
                    centre, 0,
                    "forced sample {c:?} is not centred on foreground"
                );
            }
            fg_centres += (centre != 0) as usize;
            total += 1;
        }
    }
    assert!(fg_centres * 3 >= total, "{fg_centres} of {total}");

    // Random boxes: their centres are uniform over a sub-box of each volume, so the chance of
    // a foreground centre is known exactly; the sampler must match it (many draws, sampler only).
    let sampler = Sampler::new(&es, Vec::new(), cfg).unwrap();
    let labels: Vec<Vec<u16>> = es.iter().map(whole_label).collect();
    let expected: f64 = es
        .iter()
        .zip(&labels)
        .map(|(e, lab)| {
            let s = e.shape_zyx();
            let mut hits = 0u64;
            let starts: Vec<Vec<i64>> = (0..3)
                .map(|a| {
                    let slack = s[a] as i64 - size[a] as i64;
                    (slack.min(0)..=slack.max(0)).collect()
                })
                .collect();
            let count = starts.iter().map(|v| v.len() as u64).product::<u64>();
            for &z in &starts[0] {
                for &y in &starts[1] {
                    for &x in &starts[2] {
                        let c = [z, y, x]
                            .iter()
                            .zip(size)
                            .map(|(&st, sz)| st + (sz / 2) as i64)
                            .collect::<Vec<_>>();
                        if (0..3).all(|a| (0..s[a] as i64).contains(&c[a])) {
                            let at =
                                ((c[0] as usize * s[1]) + c[1] as usize) * s[2] + c[2] as usize;
                            hits += (lab[at] != 0) as u64;
                        }
                    }
                }
            }
            hits as f64 / count as f64
        })
        .sum::<f64>()
        / es.len() as f64;
    let (mut hits, mut n) = (0u64, 0u64);
    for step in 0..5000 {
        for c in sampler.choose(step).into_iter().filter(|c| !c.forced_fg) {
            let s = es[c.case].shape_zyx();
            let p = [0, 1, 2].map(|a| c.start_zyx[a] + (size[a] / 2) as i64);
            if (0..3).all(|a| (0..s[a] as i64).contains(&p[a])) {
                let at = ((p[0] as usize * s[1]) + p[1] as usize) * s[2] + p[2] as usize;
                hits += (labels[c.case][at] != 0) as u64;
            }
            n += 1;
        }
    }
    let got = hits as f64 / n as f64;
    let sigma = (expected * (1.0 - expected) / n as f64).sqrt();
    println!("random centres on foreground: {got:.4}, exact expectation {expected:.4} (sigma {sigma:.4})");
    assert!(expected > 0.005, "{expected}");
    assert!((got - expected).abs() < 4.0 * sigma, "{got} vs {expected}");
}

#[test]
fn case_weights_steer_the_case_choice() {
    let es = entries(cache("plain"));
    let cfg = SamplerConfig::new([8, 16, 16], 6, 3);
    let mut weights = vec![0.0; es.len()];
    weights[2] = 1.0;
    weights[5] = 3.0;
    let sampler = Sampler::new(&es, weights, cfg.clone()).unwrap();
    let mut counts = vec![0usize; es.len()];
    for step in 0..4000 {
        for c in sampler.choose(step) {
            counts[c.case] += 1;
        }
    }
    let others: usize = counts
        .iter()
        .enumerate()
        .filter(|(i, _)| ![2, 5].contains(i))
        .map(|(_, c)| c)
        .sum();
    assert_eq!(others, 0, "{counts:?}");
    let ratio = counts[5] as f64 / counts[2] as f64;
    assert!((ratio - 3.0).abs() < 0.15, "{counts:?}");
    // Default weights: every case about equally often (24,000 draws, ~2,400 each).
    let uniform = Sampler::new(&es, Vec::new(), cfg.clone()).unwrap();
    let mut counts = vec![0usize; es.len()];
    for step in 0..4000 {
        for c in uniform.choose(step) {
            counts[c.case] += 1;
        }
    }
    assert!(
        counts.iter().all(|&c| (2200..2600).contains(&c)),
        "{counts:?}"
    );
    for bad in [vec![0.0; es.len()], vec![1.0; 3], vec![f64::NAN; es.len()]] {
        let err = Sampler::new(&es, bad.clone(), cfg.clone()).unwrap_err();
        assert!(matches!(err, voxcache::Error::Config(_)), "{bad:?}: {err}");
    }
}

fn assert_same_batches(a: &mut Loader, b: &mut Loader, steps: std::ops::Range<u64>) {
    for step in steps {
        let (x, _) = a.next().unwrap();
        let (y, _) = b.next().unwrap();
        assert_eq!(x.step, step);
        assert_eq!(y.step, step);
        assert_eq!(x.choices, y.choices, "step {step}");
        assert_eq!(x.label, y.label, "step {step}");
        let bx: Vec<u32> = x.image.iter().map(|v| v.to_bits()).collect();
        let by: Vec<u32> = y.image.iter().map(|v| v.to_bits()).collect();
        assert!(bx == by, "image of step {step} differs");
    }
}

#[test]
fn batches_do_not_depend_on_threads_or_on_where_the_run_starts() {
    let es = entries(cache("zstd"));
    let cfg = SamplerConfig::new([8, 24, 24], 4, 77);
    // Rotations, scaling and elastic deformation often, so transformed reads are compared too.
    let mut aug = AugmentConfig::default();
    aug.intensity.noise_prob = 0.5;
    aug.spatial.rotation_prob = 0.5;
    aug.spatial.scale_prob = 0.5;
    aug.spatial.elastic_prob = 0.3;
    let mut one = start(&es, cfg.clone(), 1, aug.clone(), 0);
    let mut three = start(&es, cfg.clone(), 3, aug.clone(), 0);
    assert_same_batches(&mut one, &mut three, 0..10);
    let mut resumed = start(&es, cfg.clone(), 2, aug.clone(), 10);
    assert_same_batches(&mut one, &mut resumed, 10..20);
    // Augmentation is on: the same boxes read plainly give different patches.
    let mut plain = start(&es, cfg.clone(), 1, AugmentConfig::none(), 0);
    let mut augmented = start(&es, cfg, 2, aug, 0);
    let mut changed = 0;
    for _ in 0..10 {
        let (a, _) = plain.next().unwrap();
        let (b, _) = augmented.next().unwrap();
        assert_eq!(a.choices, b.choices);
        changed += (a.image != b.image) as usize;
    }
    assert!(changed > 0);
}

#[test]
fn the_queue_is_bounded_and_dropping_joins_the_workers() {
    let es = entries(cache("plain"));
    let cfg = SamplerConfig::new([8, 32, 32], 2, 1);
    let mut loader = start(&es, cfg.clone(), 3, AugmentConfig::default(), 0);
    // Nobody consumes: workers fill the queue to its depth (3) and wait.
    let t0 = Instant::now();
    while loader.ready_ahead() < 3 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(loader.ready_ahead(), 3);
    let (b, _) = loader.next().unwrap();
    assert_eq!(b.step, 0);
    loader.recycle(b);
    let (b, waited) = loader.next().unwrap();
    assert_eq!(b.step, 1);
    assert!(waited < Duration::from_millis(100), "{waited:?}");
    // Dropped while workers are blocked waiting for room, and one never started.
    let t0 = Instant::now();
    drop(loader);
    drop(start(&es, cfg, 4, AugmentConfig::default(), 0));
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn bad_loader_settings_are_errors() {
    let es = entries(cache("plain"));
    let cfg = SamplerConfig::new([8, 8, 8], 2, 1);
    let sampler = || Sampler::new(&es, Vec::new(), cfg.clone()).unwrap();
    for (w, d) in [(0, 2), (2, 0)] {
        let c = LoaderConfig {
            workers: w,
            queue_depth: d,
            augment: AugmentConfig::none(),
            skeleton: false,
            ..LoaderConfig::default()
        };
        assert!(Loader::start(es.clone(), sampler(), c, 0).is_err());
    }
    let bad_aug = LoaderConfig {
        augment: AugmentConfig {
            mirror_prob: 2.0,
            ..AugmentConfig::none()
        },
        ..LoaderConfig::default()
    };
    assert!(Loader::start(es.clone(), sampler(), bad_aug, 0).is_err());
    let fewer = es[..3].to_vec();
    assert!(Loader::start(fewer, sampler(), LoaderConfig::default(), 0).is_err());
}

#[test]
fn a_corrupt_chunk_is_the_error_of_its_step_only() {
    for layout in ["plain", "zstd"] {
        let t = tempfile::tempdir().unwrap();
        copy_tree(cache(layout), t.path());
        let reader = CacheReader::open(t.path()).unwrap();
        let ds = reader.datasets()[0].to_string();
        let bad = reader.open_entry(&ds, "vessels_002").unwrap(); // 9 x 44 x 32
        let good = reader.open_entry(&ds, "vessels_005").unwrap();
        let chunk = bad.dir().join("image/c/0/0/0/0");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&chunk)
            .unwrap();
        f.set_len(f.metadata().unwrap().len() / 2).unwrap();
        // Boxes as large as the damaged volume: every read of it touches the bad chunk.
        let mut cfg = SamplerConfig::new([16, 48, 32], 1, 4);
        cfg.fg_fraction = 0.0;
        let es = vec![bad, good];
        let sampler = Sampler::new(&es, Vec::new(), cfg.clone()).unwrap();
        let expect: Vec<usize> = (0..12).map(|s| sampler.choose(s)[0].case).collect();
        assert!(expect.contains(&0) && expect.contains(&1), "{expect:?}");
        let mut loader =
            Loader::start(es, sampler, loader_cfg(2, AugmentConfig::default()), 0).unwrap();
        for (step, case) in expect.into_iter().enumerate() {
            match (case, loader.next()) {
                (1, Ok((b, _))) => assert_eq!(b.step, step as u64),
                (0, Err(e)) => {
                    let msg = e.to_string();
                    assert!(msg.contains("vessels_002"), "{layout}: {msg}");
                    assert!(msg.contains(&format!("batch {step}")), "{layout}: {msg}");
                }
                (c, r) => panic!("{layout}: step {step} of case {c}: {:?}", r.map(|_| ())),
            }
        }
    }
}

const RSS_CACHE_ENV: &str = "VOXCACHE_TEST_LOADER_RSS_CACHE";

#[test]
fn memory_stays_flat_over_many_batches() {
    // Other tests of this binary allocate in parallel: measure in a process of its own.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["loader_rss_probe", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(RSS_CACHE_ENV, cache("plain"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the probe did not run: {text}");
}

#[test]
#[ignore = "run in its own process by memory_stays_flat_over_many_batches"]
fn loader_rss_probe() {
    assert_probe_sees_an_allocation();
    let dir = std::env::var(RSS_CACHE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|_| cache("plain").to_path_buf());
    let es = entries(&dir);
    // Touch every mapped page first, so that file pages do not count as growth.
    for e in &es {
        whole_label(e);
    }
    let mut loader = start(
        &es,
        SamplerConfig::new([16, 32, 32], 4, 2),
        2,
        AugmentConfig::default(),
        0,
    );
    let mut run = |count: usize| {
        for _ in 0..count {
            let (b, _) = loader.next().unwrap();
            std::hint::black_box(&b);
        }
    };
    run(200);
    let (rss0, anon0) = (vm_rss_kib(), status_kib("RssAnon"));
    let t0 = Instant::now();
    run(2000);
    let secs = t0.elapsed().as_secs_f64();
    let (rss1, anon1) = (vm_rss_kib(), status_kib("RssAnon"));
    println!(
        "2000 batches of 4 x 16x32x32 in {secs:.2} s ({:.0} batches/s); VmRSS {rss0} -> {rss1} KiB, RssAnon {anon0} -> {anon1} KiB",
        2000.0 / secs
    );
    // VmRSS too: every mapped page was touched before, so file pages cannot grow either.
    assert!(
        rss1 <= rss0 + 4096,
        "VmRSS grew from {rss0} KiB to {rss1} KiB"
    );
    assert!(
        anon1 <= anon0 + 4096,
        "RssAnon grew from {anon0} KiB to {anon1} KiB"
    );
}

/// Rough figures for the report (`cargo test --release --test train_loader -- --ignored
/// --nocapture throughput`): augmentation alone, then the loader on the bundled data.
#[test]
#[ignore = "timing, run by hand"]
fn throughput() {
    use voxcache::train::augment::augment;
    use voxcache::util::rng::Rng;
    let size = [32, 128, 128];
    let n: usize = size.iter().product();
    let mut img: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
    let mut lab: Vec<u16> = (0..n).map(|i| (i % 3) as u16).collect();
    let all = AugmentConfig::every();
    for (name, cfg) in [
        ("every transform", all),
        ("default", AugmentConfig::default()),
    ] {
        let t0 = Instant::now();
        for s in 0..20 {
            augment(&mut img, &mut lab, size, &cfg, &mut Rng::new(s));
        }
        let ms = t0.elapsed().as_secs_f64() * 1000.0 / 20.0;
        println!("augment {size:?} ({name}): {ms:.1} ms per patch");
    }
    let es = entries(cache("plain"));
    for workers in [1, 2] {
        let mut loader = start(
            &es,
            SamplerConfig::new(size, 2, 1),
            workers,
            AugmentConfig::default(),
            0,
        );
        loader.next().unwrap();
        let t0 = Instant::now();
        for _ in 0..40 {
            let (b, _) = loader.next().unwrap();
            loader.recycle(b);
        }
        let s = t0.elapsed().as_secs_f64();
        println!(
            "loader, {workers} workers, batches of 2 x {size:?}: {:.1} batches/s",
            40.0 / s
        );
    }
}
