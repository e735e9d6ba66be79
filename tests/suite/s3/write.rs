//! Writing a cache to S3: killed builders, concurrent parts, what interrupted uploads leave,
//! multipart uploads.

use super::*;

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn killed_builders_leave_no_visible_partial_entry_and_the_next_run_completes() {
    let srv = server("s3-kill");
    let c = srv.client();
    let reference = local();
    let ref_entries: std::collections::BTreeMap<String, Vec<(String, u64)>> =
        crate::common::fixtures::entry_dirs(reference)
            .iter()
            .map(|d| {
                let key = d.file_name().unwrap().to_string_lossy().to_string();
                let files = entry_files(d)
                    .into_iter()
                    .map(|(rel, b)| (rel, b.len() as u64))
                    .collect();
                (key, files)
            })
            .collect();
    let t = tempfile::tempdir().unwrap();
    let data = bundled_data();
    let mut rng = Lcg(0x5eed);
    let mut partial_seen = 0;
    // Rounds killed with some entries committed and others not: the kill landed mid-upload.
    let mut mid_upload = 0;
    // How long a whole build takes here: the kills are spread over it.
    let timing = srv.url("kill-timing");
    let started = Instant::now();
    srv.build(&timing, &t.path().join("stage-timing"), &["-j", "2"]);
    let whole = started.elapsed().as_millis() as f32;
    for round in 0..20 {
        let url = srv.url(&format!("kill{round}"));
        let prefix = srv.prefix(&url);
        let stage = t.path().join(format!("stage{round}"));
        let mut child = srv
            .cmd("prep")
            .args([
                "build-cache",
                s(&data),
                "--cache-dir",
                &url,
                "--local-cache",
                s(&stage),
            ])
            .args(["-q", "-j", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let wait = (whole * (0.1 + 0.9 * rng.next_f32())) as u64;
        std::thread::sleep(Duration::from_millis(wait));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // Every entry whose commit object is visible is complete: the same objects, of the
        // same sizes, as the local build of that key.
        let seen = remote_entries(&c, &prefix);
        let committed = seen
            .values()
            .filter(|o| o.iter().any(|(rel, _)| rel == "zarr.json"))
            .count();
        if committed < 10 && (committed > 0 || seen.len() > committed) {
            mid_upload += 1;
        }
        for (key, objs) in &seen {
            let mut objs = objs.clone();
            objs.sort();
            if objs.iter().any(|(rel, _)| rel == "zarr.json") {
                assert_eq!(
                    Some(&objs),
                    ref_entries.get(key),
                    "round {round}: entry {key}"
                );
            } else {
                partial_seen += 1;
            }
        }
        // The manifest, when there is one, names only visible entries.
        if let Some(m) = c.get(&format!("{prefix}/manifest.json"), u64::MAX).unwrap() {
            let m: serde_json::Value = serde_json::from_slice(&m.bytes).unwrap();
            for case in m["datasets"]["vessels"]["cases"]
                .as_object()
                .unwrap()
                .values()
            {
                let key = case["key"].as_str().unwrap();
                assert!(
                    seen[key].iter().any(|(rel, _)| rel == "zarr.json"),
                    "round {round}: manifest names {key} without its commit object"
                );
            }
        }
        // A few rounds are finished by a second run, which completes the cache.
        if round % 5 == 0 {
            let o = srv.build(&url, &stage, &[]);
            assert!(o.contains("0 failed"), "{o}");
            let v = ok(&srv.run(
                "prep",
                &[
                    "inspect",
                    &url,
                    "--verify",
                    "--local-cache",
                    s(&t.path().join("v")),
                ],
            ));
            assert!(v.contains("10 entries"), "{v}");
        }
    }
    eprintln!(
        "killed 20 builders over a {whole:.0} ms build: {mid_upload} mid-upload, \
         {partial_seen} uncommitted entries seen (never read)"
    );
    // The property above holds only if kills landed while objects were going up.
    assert!(
        mid_upload >= 3 && partial_seen >= 1,
        "only {mid_upload} of 20 kills landed mid-upload ({partial_seen} uncommitted entries \
         seen): the test did not test what it claims"
    );
}

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn four_part_builders_at_once_make_one_consistent_manifest() {
    let srv = server("s3-parts");
    let t = tempfile::tempdir().unwrap();
    let url = srv.url("parts");
    let data = bundled_data();
    let children: Vec<_> = (0..4)
        .map(|i| {
            srv.cmd("prep")
                .args([
                    "build-cache",
                    s(&data),
                    "--cache-dir",
                    &url,
                    "-q",
                    "-j",
                    "1",
                ])
                .args(["--part", &format!("{i}/4")])
                .args(["--local-cache", s(&t.path().join(format!("stage{i}")))])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for ch in children {
        let o = ch.wait_with_output().unwrap();
        ok(&o);
    }
    let c = srv.client();
    let key = format!("{}/manifest.json", srv.prefix(&url));
    let obj = c.get(&key, u64::MAX).unwrap().unwrap();
    // The server honours the conditions the merge relies on.
    use voxcache::remote::s3::Put;
    let stale = c.put(&key, b"{}", Condition::Matches("\"0000\"")).unwrap();
    assert_eq!(stale, Put::Conflict);
    assert_eq!(
        c.put(&key, b"{}", Condition::Absent).unwrap(),
        Put::Conflict
    );
    let m: serde_json::Value = serde_json::from_slice(&obj.bytes).unwrap();
    let reference = CacheReader::open(local()).unwrap();
    let want = &reference.manifest().datasets["vessels"].cases;
    let got = m["datasets"]["vessels"]["cases"].as_object().unwrap();
    assert_eq!(got.len(), 10);
    for (id, case) in want {
        assert_eq!(got[id]["key"].as_str().unwrap(), case.key, "case {id}");
    }
}

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn large_objects_go_up_in_parts_and_come_back_streamed() {
    let srv = server("s3-multipart");
    let t = tempfile::tempdir().unwrap();
    let c = srv.client();
    // Over the single-PUT limit (16 MiB): three parts, the last one short.
    let mut rng = Lcg(42);
    let bytes: Vec<u8> = (0..(21 << 20))
        .map(|_| (rng.next_f32() * 256.0) as u8)
        .collect();
    let src = t.path().join("big.bin");
    std::fs::write(&src, &bytes).unwrap();
    let key = format!("{}/big.bin", srv.prefix(&srv.url("multipart")));
    c.upload_file(&key, &src).unwrap();
    let back = t.path().join("back.bin");
    assert!(c.get_to_file(&key, &back, bytes.len() as u64).unwrap());
    assert!(
        std::fs::read(&back).unwrap() == bytes,
        "the object came back different"
    );
    assert!(!c.get_to_file(&format!("{key}.none"), &back, 0).unwrap());
}

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn interrupted_uploads_are_swept_once_old_and_never_while_young() {
    let srv = server("s3-orphans");
    let c = srv.client();
    let url = srv.url("orphans");
    let prefix = srv.prefix(&url);
    let put = |rel: &str| {
        let key = format!("{prefix}/entries/{rel}");
        c.put(&key, b"x", Condition::None).unwrap();
    };
    // A committed entry, an entry whose upload stopped before its commit, and a multipart
    // upload never finished.
    put("ab/ab00c0/image/c/0/0/0");
    put("ab/ab00c0/zarr.json");
    put("cd/cd00d0/image/zarr.json");
    put("cd/cd00d0/image/c/0/0/0");
    // Not an entry's key: not ours, never touched.
    put("ab/not-a-key/x");
    let started = c
        .start_upload(&format!("{prefix}/entries/ef/ef00e0/image/c/1/0/0"))
        .unwrap();
    let remote = RemoteCache::connect(
        &voxcache::remote::S3Url::parse(&url).unwrap(),
        Some(&srv.endpoint),
    )
    .unwrap();
    let day = voxcache::cache::s3::ORPHAN_AGE;
    // Under a day old: perhaps another builder's upload in progress, left alone.
    let young = remote.sweep_orphans(day).unwrap();
    assert_eq!((young.entries, young.uploads, young.recent), (0, 0, 1));
    assert_eq!(remote_entries(&c, &prefix).len(), 3);
    let pending = c.uploads(&format!("{prefix}/entries/")).unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].id, started.id);
    // Old enough (age zero here): the uncommitted entry and the upload go, the commit stays.
    let old = remote.sweep_orphans(Duration::ZERO).unwrap();
    assert_eq!(
        (old.entries, old.objects, old.uploads),
        (1, 2, 1),
        "{old:?}"
    );
    let left = remote_entries(&c, &prefix);
    assert_eq!(left.keys().collect::<Vec<_>>(), ["ab00c0", "not-a-key"]);
    assert_eq!(left["ab00c0"].len(), 2);
    assert!(c.uploads(&format!("{prefix}/entries/")).unwrap().is_empty());
}
