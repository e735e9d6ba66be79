//! Reading a cache (and a model) on S3: build, verify and train round trips; the local tier.

use super::*;
use crate::store_conformance::whole_case;

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn build_verify_and_train_from_s3_read_what_a_local_cache_holds() {
    let srv = server("s3-roundtrip");
    let t = tempfile::tempdir().unwrap();
    let url = srv.url("roundtrip");
    let stage = t.path().join("stage");
    let built = srv.build(&url, &stage, &[]);
    assert!(built.contains("10 built, 0 cached, 0 failed"), "{built}");
    // Staged entries are removed once uploaded.
    assert!(crate::common::fixtures::entry_dirs(&stage).is_empty());
    let again = srv.build(&url, &stage, &[]);
    assert!(again.contains("0 built, 10 cached"), "{again}");

    // verify downloads afresh into a folder it removes.
    let tier = t.path().join("tier");
    let v = ok(&srv.run(
        "prep",
        &["inspect", &url, "--verify", "--local-cache", s(&tier)],
    ));
    assert!(v.contains("0 corrupt, 0 missing"), "{v}");
    assert!(std::fs::read_dir(t.path()).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains("verify")));

    // The local tier holds, byte for byte, the entries a local build makes.
    ok(&srv.run("prep", &["inspect", &url, "--local-cache", s(&tier)]));
    let reference = local();
    let ref_reader = CacheReader::open(reference).unwrap();
    let tier_reader = CacheReader::open(&tier).unwrap();
    let ref_cases = ref_reader.manifest().datasets["vessels"].cases.clone();
    assert_eq!(tier_reader.manifest().datasets["vessels"].cases, ref_cases);
    for c in ref_cases.values() {
        assert_eq!(
            entry_files(&tier.join(&c.entry)),
            entry_files(&reference.join(&c.entry)),
            "entry {}",
            c.key
        );
    }
    // And so the trainer's augmented batches are the same.
    let (a, b) = (open_entries(&ref_reader), open_entries(&tier_reader));
    let mut aug = AugmentConfig::default();
    aug.spatial.rotation_prob = 0.5;
    let cfg = SamplerConfig::new([8, 24, 24], 2, 5);
    let start = |es: &[voxcache::cache::reader::EntryReader]| {
        let sampler = Sampler::new(es, Vec::new(), cfg.clone()).unwrap();
        let lc = LoaderConfig {
            workers: 1,
            augment: aug.clone(),
            ..LoaderConfig::default()
        };
        Loader::start(es.to_vec(), sampler, lc, 0).unwrap()
    };
    let (mut la, mut lb) = (start(&a), start(&b));
    for step in 0..6 {
        let (x, _) = la.next().unwrap();
        let (y, _) = lb.next().unwrap();
        assert_eq!(x.label, y.label, "step {step}");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert!(bits(&x.image) == bits(&y.image), "step {step}");
    }

    // train reads it through the tier.
    let tier2 = t.path().join("tier2");
    let run = t.path().join("run");
    let o = ok(&srv.run(
        "train",
        &[
            "--cache-dir",
            &url,
            "--local-cache",
            s(&tier2),
            "--steps",
            "2",
            "--patch",
            "8,32,32",
            "--batch-size",
            "1",
            "--base-channels",
            "4",
            "--val-every",
            "0",
            "--no-progress",
            "--out",
            s(&run),
        ],
    ));
    assert!(o.contains("10 entries fetched"), "{o}");
    assert!(run.join("checkpoints").is_dir());
}

/// Chunk and shard files under a tier's `entries/` (the arrays the reader fetches on read).
fn block_files(tier: &Path) -> Vec<std::path::PathBuf> {
    crate::common::fixtures::files_under(&tier.join("entries"))
        .into_iter()
        .filter(|p| {
            let rel = p.to_string_lossy();
            ["/image/c/", "/label/c/"].iter().any(|a| rel.contains(a))
        })
        .collect()
}

/// Reader options whose block source is `tier`.
fn through(tier: &Arc<Tier>) -> ReaderOptions {
    ReaderOptions {
        blocks: Blocks::new(tier.clone()),
        ..ReaderOptions::default()
    }
}

/// The bundled data built into a prefix of its own under `t`, and a client of that cache.
fn built_remote(srv: &Server, test: &str, t: &Path) -> (String, Arc<RemoteCache>) {
    let url = srv.url(test);
    srv.build(&url, &t.join("stage"), &[]);
    let Location::S3(u) = Location::parse(Path::new(&url)).unwrap() else {
        panic!("{url}")
    };
    let remote = Arc::new(RemoteCache::connect(&u, Some(&srv.endpoint)).unwrap());
    (url, remote)
}

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn a_tier_fetches_chunk_files_on_first_read_and_checks_them() {
    let srv = server("on-read");
    let t = tempfile::tempdir().unwrap();
    let (url, remote) = built_remote(&srv, "on-read", t.path());
    let dir = t.path().join("tier");
    let (rep, tier) =
        fill_tier(&remote, &dir, true, None, Fill::OnRead { prefetch: false }).unwrap();
    assert_eq!((rep.fetched, rep.reused), (10, 0));
    let total = rep.pending;
    assert!(total >= 10, "{rep:?}");
    // Metadata only: no chunk file yet, and the cache opens.
    assert!(block_files(&dir).is_empty());
    // A reader not given the tier fetches nothing (no process-wide registry): a chunk that is
    // not there is damage.
    let plain = CacheReader::open(&dir).unwrap();
    let msg = whole_case(&open_entries(&plain)[0])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("missing"), "{msg}");
    assert!(block_files(&dir).is_empty());
    let got = CacheReader::open_with(&dir, through(&tier)).unwrap();
    let want = CacheReader::open(local()).unwrap();
    let (a, b) = (open_entries(&got), open_entries(&want));
    // Reading one case brings its files, and only its; the voxels are the local build's.
    let read = whole_case;
    assert_eq!(read(&a[0]).unwrap(), read(&b[0]).unwrap());
    let fetched = block_files(&dir);
    assert!(
        !fetched.is_empty() && fetched.len() < total,
        "{} of {total}",
        fetched.len()
    );
    assert!(fetched.iter().all(|p| p.starts_with(a[0].dir())));
    assert_eq!(tier.stats().files as usize, fetched.len());
    // Read again: nothing more is fetched.
    read(&a[0]).unwrap();
    assert_eq!(tier.stats().files as usize, fetched.len());
    // An object altered in the bucket is refused when it arrives.
    let c = srv.client();
    let victim = a[1]
        .dir()
        .strip_prefix(&dir)
        .unwrap()
        .to_string_lossy()
        .to_string();
    let key = format!("{}/{victim}/image/c/0/0/0/0", srv.prefix(&url));
    let mut bytes = c
        .get(&key, u64::MAX)
        .unwrap()
        .expect("the first image chunk is stored")
        .bytes;
    bytes[0] ^= 0xff;
    c.put(&key, &bytes, Condition::None).unwrap();
    let err = read(&a[1]).unwrap_err().to_string();
    assert!(
        ["corrupt", "differs", "damaged"]
            .iter()
            .any(|w| err.contains(w)),
        "{err}"
    );
    // Closed, the tier fetches nothing: a missing chunk is damage again.
    tier.close();
    let msg = read(&a[2]).unwrap_err().to_string();
    assert!(msg.contains("missing"), "{msg}");
}

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn a_tier_smaller_than_the_cache_evicts_the_least_recently_used_files() {
    let srv = server("budget");
    let t = tempfile::tempdir().unwrap();
    let (_, remote) = built_remote(&srv, "budget", t.path());
    let fill = Fill::OnRead { prefetch: false };
    let (sizes, probe) = fill_tier(&remote, &t.path().join("probe"), true, None, fill).unwrap();
    probe.close();
    // Room for the metadata and two fifths of the chunk files.
    let budget = sizes.bytes + sizes.pending_bytes * 2 / 5;
    let dir = t.path().join("tier");
    let (_, tier) = fill_tier(&remote, &dir, true, Some(budget), fill).unwrap();
    let got = CacheReader::open_with(&dir, through(&tier)).unwrap();
    let want = CacheReader::open(local()).unwrap();
    let (a, b) = (open_entries(&got), open_entries(&want));
    let read = |e| whole_case(e).unwrap();
    // Every case twice, the second time in reverse: the voxels are the local build's although
    // the tier never holds them all.
    let order: Vec<usize> = (0..a.len()).chain((0..a.len()).rev()).collect();
    for &i in &order {
        assert!(read(&a[i]) == read(&b[i]), "case {i}");
    }
    let st = tier.stats();
    assert!(
        st.evicted > 0 && st.files > block_files(&dir).len() as u64,
        "{st:?}"
    );
    let largest = block_files(&dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .max()
        .unwrap_or(0);
    let held: u64 = crate::common::fixtures::files_under(&dir.join("entries"))
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        held <= budget + largest,
        "{held} bytes held, budget {budget}"
    );
    tier.close();
}

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn predict_takes_a_run_folder_from_s3_and_fetches_only_its_checkpoint_once() {
    let srv = server("s3-model");
    let c = srv.client();
    let run = crate::predict::model();
    let url = format!("{}/run", srv.url("model"));
    let prefix = srv.prefix(&url);
    // Uploaded as `aws s3 sync` would: every file at its path.
    for f in crate::common::fixtures::files_under(run) {
        let rel = f
            .strip_prefix(run)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        c.upload_file(&format!("{prefix}/{rel}"), &f).unwrap();
    }
    let t = tempfile::tempdir().unwrap();
    let input = bundled_data().join("imagesTr/vessels_003_0000.nii.gz");
    let models = t.path().join("models");
    let predict = |model: &str, out: &Path| {
        let mut args = vec!["--model", model, s(&input), "--out", s(out)];
        // Where models on S3 come to (refused with a local model, where it does not apply).
        if model.starts_with("s3://") {
            args.extend(["--local-cache", s(&models)]);
        }
        srv.run("predict", &args)
    };
    let first = ok(&predict(&url, &t.path().join("s3")));
    assert!(first.contains("files fetched"), "{first}");
    ok(&predict(s(run), &t.path().join("local")));
    let read = |dir: &str| {
        voxcache::nifti_io::read_volume(&t.path().join(dir).join("vessels_003.nii.gz"))
            .unwrap()
            .data
    };
    assert!(
        read("s3") == read("local"),
        "the model from S3 predicts differently"
    );
    // Only the run record and one checkpoint folder came (no optimizer of older steps).
    let local = t.path().join("models").join(&srv.bucket).join(&prefix);
    let got: Vec<String> = crate::common::fixtures::files_under(&local)
        .iter()
        .map(|p| {
            p.strip_prefix(&local)
                .unwrap()
                .to_string_lossy()
                .to_string()
        })
        .filter(|r| !r.starts_with('.'))
        .collect();
    let folders: std::collections::BTreeSet<&str> = got
        .iter()
        .filter_map(|r| r.strip_prefix("checkpoints/")?.split('/').next())
        .collect();
    assert_eq!(folders.len(), 1, "{got:?}");
    assert!(got.iter().any(|r| r == "run.json"), "{got:?}");
    // Again: nothing fetched; after the weights change in the bucket, they come again.
    let again = ok(&predict(&url, &t.path().join("s3b")));
    assert!(again.contains(": 0 files fetched"), "{again}");
    let weights = got
        .iter()
        .find(|r| r.ends_with("model.safetensors"))
        .unwrap();
    let mut bytes = std::fs::read(local.join(weights)).unwrap();
    bytes.push(0);
    c.put(&format!("{prefix}/{weights}"), &bytes, Condition::None)
        .unwrap();
    let changed = text(&predict(&url, &t.path().join("s3c")));
    assert!(changed.contains(": 1 files fetched"), "{changed}");
    // Not a run folder, and an nnU-Net model on S3: refused, naming the URL.
    let none = format!("{}/nothing", srv.url("model"));
    let o = predict(&none, &t.path().join("none"));
    assert!(
        !o.status.success() && text(&o).contains(&none) && text(&o).contains("run.json"),
        "{}",
        text(&o)
    );
    let o = srv.run(
        "predict",
        &["--nnunet-model", &none, s(&input), "--out", s(t.path())],
    );
    assert!(
        !o.status.success() && text(&o).contains("s3://"),
        "{}",
        text(&o)
    );
}
