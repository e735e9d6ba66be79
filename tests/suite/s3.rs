//! Caches on S3, against a real S3-compatible server (SeaweedFS, which `.ci/run` installs and
//! starts): VOXCACHE_TEST_S3_ENDPOINT (`http://127.0.0.1:8333`) and VOXCACHE_TEST_S3_BUCKET
//! name it, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY sign for it. Without the endpoint
//! variable these tests say so and pass; `.ci/run` always sets it, and there a server that
//! does not answer fails them. Each test works under a prefix of its own.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use voxcache::cache::reader::CacheReader;
use voxcache::cache::remote::{mirror, Fill, RemoteCache};
use voxcache::remote::s3::{Client, Condition, Config};
use voxcache::remote::Location;
use voxcache::train::augment::AugmentConfig;
use voxcache::train::loader::{Loader, LoaderConfig};
use voxcache::train::sampler::{Sampler, SamplerConfig};

use crate::common::fixtures::{bundled_cache, bundled_data, open_entries, s, text};
use crate::common::Lcg;

struct Server {
    endpoint: String,
    bucket: String,
}

fn server(test: &str) -> Option<Server> {
    let Ok(endpoint) = std::env::var("VOXCACHE_TEST_S3_ENDPOINT") else {
        eprintln!("{test}: skipped, VOXCACHE_TEST_S3_ENDPOINT is not set (.ci/run sets it)");
        return None;
    };
    let bucket = std::env::var("VOXCACHE_TEST_S3_BUCKET").unwrap_or_else(|_| "voxtest".into());
    Some(Server { endpoint, bucket })
}

impl Server {
    /// A prefix no other test or run uses.
    fn url(&self, test: &str) -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("s3://{}/{test}-{}-{nanos}", self.bucket, std::process::id())
    }

    fn client(&self) -> Client {
        Client::new(
            Config::from_env(Some(&self.endpoint)).unwrap(),
            &self.bucket,
        )
        .unwrap()
    }

    /// The key prefix of an `s3://bucket/prefix` URL.
    fn prefix(&self, url: &str) -> String {
        url.strip_prefix(&format!("s3://{}/", self.bucket))
            .unwrap()
            .to_string()
    }

    /// A binary with this server's endpoint in its environment.
    fn cmd(&self, bin: &str) -> Command {
        let exe = match bin {
            "prep" => env!("CARGO_BIN_EXE_prep"),
            "train" => env!("CARGO_BIN_EXE_train"),
            other => panic!("no binary {other}"),
        };
        let mut c = Command::new(exe);
        c.env("AWS_ENDPOINT_URL", &self.endpoint);
        c
    }

    fn run(&self, bin: &str, args: &[&str]) -> Output {
        self.cmd(bin).args(args).output().unwrap()
    }

    /// `prep build-cache` of the bundled data into `url`, staged in `stage`, `extra` flags
    /// after; what it printed, the run having succeeded.
    fn build(&self, url: &str, stage: &Path, extra: &[&str]) -> String {
        let data = bundled_data();
        let mut args = vec!["build-cache", s(&data), "--cache-dir", url, "-q"];
        args.extend(["--local-cache", s(stage)]);
        args.extend(extra);
        ok(&self.run("prep", &args))
    }
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", text(o));
    text(o)
}

/// The bundled data's cache built locally with the defaults (the reference: content keys are
/// the same wherever an entry is stored).
fn local() -> &'static Path {
    bundled_cache("s3-reference", &[])
}

/// Relative path -> bytes of every file under an entry folder.
fn entry_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = crate::common::fixtures::files_under(dir)
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().to_string();
            (rel, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

/// Entry key -> (relative object path, size) of what the bucket holds under `prefix/entries`.
fn remote_entries(
    c: &Client,
    prefix: &str,
) -> std::collections::BTreeMap<String, Vec<(String, u64)>> {
    let base = format!("{prefix}/entries/");
    let mut out: std::collections::BTreeMap<String, Vec<(String, u64)>> = Default::default();
    for o in c.list(&base).unwrap() {
        let rest = o.key.strip_prefix(&base).unwrap();
        let mut parts = rest.splitn(3, '/');
        let (_, key, rel) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        out.entry(key.to_string())
            .or_default()
            .push((rel.to_string(), o.size));
    }
    out
}

#[test]
fn build_verify_and_train_from_s3_read_what_a_local_cache_holds() {
    let Some(srv) = server("s3-roundtrip") else {
        return;
    };
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

/// A case's whole image (as bits) and label.
fn whole_case(e: &voxcache::cache::reader::EntryReader) -> voxcache::Result<(Vec<u32>, Vec<u8>)> {
    let sh = e.shape_zyx();
    let mut img = vec![0f32; sh.iter().product::<usize>() * e.channels()];
    let mut lab = vec![0u8; sh.iter().product::<usize>()];
    e.read_image([0, 0, 0], sh, &mut img)?;
    e.read_label([0, 0, 0], sh, &mut lab)?;
    Ok((img.iter().map(|v| v.to_bits()).collect(), lab))
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
fn a_tier_fetches_chunk_files_on_first_read_and_checks_them() {
    let Some(srv) = server("on-read") else { return };
    let t = tempfile::tempdir().unwrap();
    let (url, remote) = built_remote(&srv, "on-read", t.path());
    let dir = t.path().join("tier");
    let (rep, tier) = mirror(&remote, &dir, None, Fill::OnRead { prefetch: false }).unwrap();
    assert_eq!((rep.fetched, rep.reused), (10, 0));
    let total = rep.pending;
    assert!(total >= 10, "{rep:?}");
    // Metadata only: no chunk file yet, and the cache opens.
    assert!(block_files(&dir).is_empty());
    let got = CacheReader::open(&dir).unwrap();
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
        .get(&key)
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
fn a_tier_smaller_than_the_cache_evicts_the_least_recently_used_files() {
    let Some(srv) = server("budget") else { return };
    let t = tempfile::tempdir().unwrap();
    let (_, remote) = built_remote(&srv, "budget", t.path());
    let fill = Fill::OnRead { prefetch: false };
    let (sizes, probe) = mirror(&remote, &t.path().join("probe"), None, fill).unwrap();
    probe.close();
    // Room for the metadata and two fifths of the chunk files.
    let budget = sizes.bytes + sizes.pending_bytes * 2 / 5;
    let dir = t.path().join("tier");
    let (_, tier) = mirror(&remote, &dir, Some(budget), fill).unwrap();
    let got = CacheReader::open(&dir).unwrap();
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
fn killed_builders_leave_no_visible_partial_entry_and_the_next_run_completes() {
    let Some(srv) = server("s3-kill") else {
        return;
    };
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
        let wait = 100 + (rng.next_f32() * 1200.0) as u64;
        std::thread::sleep(Duration::from_millis(wait));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // Every entry whose commit object is visible is complete: the same objects, of the
        // same sizes, as the local build of that key.
        let seen = remote_entries(&c, &prefix);
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
        if let Some(m) = c.get(&format!("{prefix}/manifest.json")).unwrap() {
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
    eprintln!("killed 20 builders; {partial_seen} uncommitted entries seen (never read)");
}

#[test]
fn four_part_builders_at_once_make_one_consistent_manifest() {
    let Some(srv) = server("s3-parts") else {
        return;
    };
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
    let obj = c.get(&key).unwrap().unwrap();
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
fn tampered_or_truncated_objects_are_caught_by_verify_and_refused_by_train() {
    let Some(srv) = server("s3-tamper") else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let c = srv.client();
    for (i, how) in ["tamper", "truncate"].iter().enumerate() {
        let url = srv.url(how);
        let prefix = srv.prefix(&url);
        srv.build(&url, &t.path().join("stage"), &[]);
        // The largest image chunk of one entry.
        let objs = c.list(&format!("{prefix}/entries/")).unwrap();
        let victim = objs
            .iter()
            .filter(|o| o.key.contains("/image/c/"))
            .max_by_key(|o| o.size)
            .unwrap();
        let mut bytes = c.get(&victim.key).unwrap().unwrap().bytes;
        if i == 0 {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x55;
        } else {
            bytes.truncate(bytes.len() / 3);
        }
        c.put(&victim.key, &bytes, Condition::None).unwrap();
        let v = srv.run(
            "prep",
            &[
                "inspect",
                &url,
                "--verify",
                "--local-cache",
                s(&t.path().join("v")),
            ],
        );
        assert!(!v.status.success(), "{how}: verify passed: {}", text(&v));
        let msg = text(&v);
        assert!(msg.contains("corrupt") || msg.contains("missing"), "{msg}");
        let o = srv.run(
            "train",
            &[
                "--cache-dir",
                &url,
                "--local-cache",
                s(&t.path().join(format!("tier{i}"))),
                "--steps",
                "40",
                "--patch",
                "16,64,64",
                "--batch-size",
                "2",
                "--base-channels",
                "4",
                "--val-every",
                "0",
                "--no-progress",
                "--out",
                s(&t.path().join(format!("run{i}"))),
            ],
        );
        assert!(
            !o.status.success(),
            "{how}: train read a bad object: {}",
            text(&o)
        );
    }
}

/// A server that answers every request with 503 SlowDown, as S3 does when throttling.
fn throttling_server() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let mut conn = conn;
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 8192];
            let _ = conn.read(&mut buf);
            let body = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
            let _ = write!(
                conn,
                "HTTP/1.1 503 Slow Down\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}")
}

#[test]
fn bad_credentials_buckets_and_endpoints_are_named_and_never_hang() {
    let Some(srv) = server("s3-errors") else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let data = bundled_data();
    let url = srv.url("errors");
    let build = |extra_env: &[(&str, &str)], url: &str, extra: &[&str]| {
        let mut c = srv.cmd("prep");
        c.current_dir(t.path())
            .args(["build-cache", s(&data), "--cache-dir", url, "-q"])
            .args(extra);
        for (k, v) in extra_env {
            c.env(k, v);
        }
        let started = Instant::now();
        let o = c.output().unwrap();
        assert!(!o.status.success(), "{url}: {}", text(&o));
        (text(&o), started.elapsed())
    };
    let (msg, _) = build(&[("AWS_SECRET_ACCESS_KEY", "wrong")], &url, &[]);
    assert!(
        msg.contains(&url[..20]) && msg.contains("secret key"),
        "{msg}"
    );
    let (msg, _) = build(&[("AWS_ACCESS_KEY_ID", "nobody")], &url, &[]);
    assert!(msg.contains("access key"), "{msg}");
    let (msg, _) = build(&[], "s3://no-such-bucket-vox/p", &[]);
    assert!(
        msg.contains("no-such-bucket-vox") && msg.contains("does not exist"),
        "{msg}"
    );
    let (msg, took) = build(&[], &url, &["--s3-endpoint", "http://127.0.0.1:9"]);
    assert!(
        msg.contains("no answer") && msg.contains("127.0.0.1:9"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    let slow = throttling_server();
    let (msg, took) = build(&[], &url, &["--s3-endpoint", &slow]);
    assert!(msg.contains("throttling"), "{msg}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    // Nothing was written by any of them.
    assert!(srv.client().list(&srv.prefix(&url)).unwrap().is_empty());
    // Unsupported schemes are refused, not taken as a folder named "gs:".
    let (msg, _) = build(&[], "gs://bucket/p", &[]);
    assert!(msg.contains("not supported"), "{msg}");
    assert!(!t.path().join("gs:").exists());
    // A prefix with no cache, and a tier budget too small for the cache.
    let o = srv.run(
        "prep",
        &["inspect", &url, "--local-cache", s(&t.path().join("x"))],
    );
    assert!(
        !o.status.success() && text(&o).contains("no cache here"),
        "{}",
        text(&o)
    );
    srv.build(&url, &t.path().join("stage"), &[]);
    let o = srv.run(
        "prep",
        &[
            "inspect",
            &url,
            "--local-cache",
            s(&t.path().join("y")),
            "--local-cache-gb",
            "0.001",
        ],
    );
    assert!(
        !o.status.success() && text(&o).contains("--local-cache-gb"),
        "{}",
        text(&o)
    );
    // A budget that holds one cache: reading another removes the first's entries.
    let url2 = srv.url("errors-coarse");
    srv.build(&url2, &t.path().join("stage"), &["--spacing", "2,2,3"]);
    let z = t.path().join("z");
    let tier = |u: &str| {
        let args = [
            "inspect",
            u,
            "--local-cache",
            s(&z),
            "--local-cache-gb",
            "0.03",
        ];
        ok(&srv.run("prep", &args))
    };
    assert!(!tier(&url).contains("removed"));
    let second = tier(&url2);
    assert!(second.contains("older entries removed"), "{second}");
    let held: u64 = crate::common::fixtures::files_under(&z.join("entries"))
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        held <= (0.03 * (1u64 << 30) as f64) as u64,
        "{held} bytes held"
    );
    assert!(crate::common::fixtures::entry_dirs(&z).len() < 20);
}

#[test]
fn large_objects_go_up_in_parts_and_come_back_streamed() {
    let Some(srv) = server("s3-multipart") else {
        return;
    };
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
    assert!(c.get_to_file(&key, &back).unwrap());
    assert!(
        std::fs::read(&back).unwrap() == bytes,
        "the object came back different"
    );
    assert!(!c.get_to_file(&format!("{key}.none"), &back).unwrap());
}

#[test]
fn interrupted_uploads_are_swept_once_old_and_never_while_young() {
    let Some(srv) = server("s3-orphans") else {
        return;
    };
    let c = srv.client();
    let url = srv.url("orphans");
    let prefix = srv.prefix(&url);
    let put = |rel: &str| {
        let key = format!("{prefix}/entries/{rel}");
        c.put(&key, b"x", Condition::None).unwrap();
    };
    // A committed entry, an entry whose upload stopped before its commit, and a multipart
    // upload never finished.
    put("ab/abcommitted/image/c/0/0/0");
    put("ab/abcommitted/zarr.json");
    put("cd/cdkilled/image/zarr.json");
    put("cd/cdkilled/image/c/0/0/0");
    let started = c
        .start_upload(&format!("{prefix}/entries/ef/efkilled/image/c/1/0/0"))
        .unwrap();
    let remote = RemoteCache::connect(
        &voxcache::remote::S3Url::parse(&url).unwrap(),
        Some(&srv.endpoint),
    )
    .unwrap();
    let day = voxcache::cache::remote::ORPHAN_AGE;
    // Under a day old: perhaps another builder's upload in progress, left alone.
    let young = remote.sweep_orphans(day).unwrap();
    assert_eq!((young.entries, young.uploads, young.recent), (0, 0, 1));
    assert_eq!(remote_entries(&c, &prefix).len(), 2);
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
    assert_eq!(left.keys().collect::<Vec<_>>(), ["abcommitted"]);
    assert_eq!(left["abcommitted"].len(), 2);
    assert!(c.uploads(&format!("{prefix}/entries/")).unwrap().is_empty());
}
