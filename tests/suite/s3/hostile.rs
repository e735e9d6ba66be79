//! A bucket that holds what voxcache never writes, served by a small fake S3 server on
//! loopback (so these run with or without SeaweedFS): keys that would leave the local tier,
//! manifests whose keys are not content keys, a `--local-cache` folder that is another cache,
//! a model whose weights left the bucket. Each must be refused by name, with nothing written
//! outside the tier and nothing of the other cache changed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::fixtures::{copy_tree, files_under, s, text};

type Objects = Arc<Mutex<BTreeMap<String, Vec<u8>>>>;

/// A path-style S3 server over a map of keys: LIST (v2, one page), GET, HEAD, and PUT into the
/// map. It accepts for two minutes at most; each connection ends on its client's hang-up.
struct FakeS3 {
    endpoint: String,
    objects: Objects,
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn respond(stream: &mut TcpStream, status: &str, headers: &str, body: &[u8], head_only: bool) {
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{headers}\r\n",
        body.len()
    );
    if !head_only {
        let _ = stream.write_all(body);
    }
}

fn serve(stream: TcpStream, objects: Objects, bucket: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut out = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).map_or(true, |n| n == 0) {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).map_or(true, |n| n == 0) {
                return;
            }
            if h == "\r\n" {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let query: BTreeMap<String, String> = query
            .split('&')
            .filter(|q| !q.is_empty())
            .map(|q| {
                let (k, v) = q.split_once('=').unwrap_or((q, ""));
                (decode(k), decode(v))
            })
            .collect();
        let key = decode(
            path.strip_prefix(&format!("/{bucket}"))
                .unwrap_or("")
                .trim_start_matches('/'),
        );
        let map = objects.lock().unwrap();
        let etag = |b: &[u8]| format!("\"{}\"", &blake3::hash(b).to_hex()[..32]);
        match method {
            "GET" if key.is_empty() && query.contains_key("uploads") => {
                let xml = "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>";
                respond(&mut out, "200 OK", "", xml.as_bytes(), false);
            }
            "GET" if key.is_empty() => {
                let prefix = query.get("prefix").cloned().unwrap_or_default();
                let mut xml = String::from("<ListBucketResult>");
                for (k, v) in map
                    .range(prefix.clone()..)
                    .take_while(|(k, _)| k.starts_with(&prefix))
                {
                    xml += &format!(
                        "<Contents><Key>{}</Key><Size>{}</Size><ETag>{}</ETag>\
                         <LastModified>2026-01-01T00:00:00.000Z</LastModified></Contents>",
                        xml_escape(k),
                        v.len(),
                        xml_escape(&etag(v))
                    );
                }
                xml += "<IsTruncated>false</IsTruncated></ListBucketResult>";
                respond(&mut out, "200 OK", "", xml.as_bytes(), false);
            }
            "GET" | "HEAD" => match map.get(&key) {
                Some(v) => {
                    let h = format!("ETag: {}\r\n", etag(v));
                    respond(&mut out, "200 OK", &h, v, method == "HEAD");
                }
                None => respond(
                    &mut out,
                    "404 Not Found",
                    "",
                    b"<Error><Code>NoSuchKey</Code></Error>",
                    method == "HEAD",
                ),
            },
            "PUT" => {
                drop(map);
                objects.lock().unwrap().insert(key, body);
                respond(&mut out, "200 OK", "ETag: \"0\"\r\n", b"", false);
            }
            _ => respond(&mut out, "501 Not Implemented", "", b"", false),
        }
    }
}

impl FakeS3 {
    fn start() -> FakeS3 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let objects: Objects = Arc::default();
        let shared = objects.clone();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(120) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = stream.set_nonblocking(false);
                        let o = shared.clone();
                        std::thread::spawn(move || serve(stream, o, "bucket"));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeS3 { endpoint, objects }
    }

    /// Every file under `dir` as an object under `prefix/`.
    fn put_tree(&self, prefix: &str, dir: &Path) {
        let mut map = self.objects.lock().unwrap();
        for f in files_under(dir) {
            let rel = f
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            map.insert(format!("{prefix}/{rel}"), std::fs::read(&f).unwrap());
        }
    }

    fn put(&self, key: &str, bytes: &[u8]) {
        self.objects
            .lock()
            .unwrap()
            .insert(key.into(), bytes.to_vec());
    }

    fn run(&self, bin: &str, args: &[&str]) -> Output {
        let exe = match bin {
            "prep" => env!("CARGO_BIN_EXE_prep"),
            "train" => env!("CARGO_BIN_EXE_train"),
            "predict" => env!("CARGO_BIN_EXE_predict"),
            other => panic!("no binary {other}"),
        };
        std::process::Command::new(exe)
            .args(args)
            .args(["--s3-endpoint", &self.endpoint])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .output()
            .unwrap()
    }
}

/// Exit status 2 (the command could not run), not a panic, and the message says `what`.
fn refused(o: &Output, what: &str) -> String {
    let t = text(o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(!t.contains("panicked"), "{t}");
    assert!(t.contains(what), "wanted {what:?} in: {t}");
    t
}

/// The first entry key of the bundled reference cache.
fn first_key(cache: &Path) -> String {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
    let ds = m["datasets"].as_object().unwrap().values().next().unwrap();
    let case = ds["cases"].as_object().unwrap().values().next().unwrap();
    case["key"].as_str().unwrap().to_string()
}

fn train_args<'a>(url: &'a str, tier: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec![
        "--cache-dir",
        url,
        "--local-cache",
        s(tier),
        "--steps",
        "1",
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
        s(out),
    ]
}

#[test]
fn listed_keys_that_leave_the_tier_are_refused_before_anything_is_written() {
    let cache = super::local();
    let key = first_key(cache);
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    let attacks = [
        // `PREFIX/entries/ab/KEY//abs/path`: joined, an absolute path replaces the tier's.
        format!("c/entries/{}/{key}/{}", &key[..2], outside.display()),
        // Enough `..` to climb from tier/entries/ab/KEY/image/c to the test's folder.
        format!(
            "c/entries/{}/{key}/image/c/../../../../../../../outside",
            &key[..2]
        ),
        format!("c/entries/{}/{key}/./zarr.json", &key[..2]),
        format!("c/entries/../{key}/x"),
    ];
    for (i, attack) in attacks.iter().enumerate() {
        let srv = FakeS3::start();
        srv.put_tree("c", cache);
        srv.put(attack, b"written by the attacker");
        let tier = t.path().join(format!("tier{i}"));
        let o = srv.run(
            "prep",
            &["inspect", "s3://bucket/c", "--local-cache", s(&tier)],
        );
        refused(&o, "its key is not");
        assert!(
            text(&o).contains(attack.as_str()),
            "names the key: {}",
            text(&o)
        );
        let run = t.path().join(format!("run{i}"));
        let o = srv.run("train", &train_args("s3://bucket/c", &tier, &run));
        refused(&o, attack);
        assert!(
            !outside.exists(),
            "{attack}: a file was written outside the tier"
        );
        let tree: Vec<_> = files_under(&tier)
            .into_iter()
            .filter(|f| std::fs::read(f).is_ok_and(|b| b == b"written by the attacker"))
            .collect();
        assert!(tree.is_empty(), "{attack}: {tree:?}");
    }
}

#[test]
fn manifest_keys_that_are_not_content_keys_are_refused_without_a_panic() {
    let cache = super::local();
    let t = tempfile::tempdir().unwrap();
    for bad in ["a", "é", "../../../etc", "zz"] {
        let mut m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
        for ds in m["datasets"].as_object_mut().unwrap().values_mut() {
            let c = ds["cases"]
                .as_object_mut()
                .unwrap()
                .values_mut()
                .next()
                .unwrap();
            c["key"] = serde_json::json!(bad);
        }
        let bytes = serde_json::to_vec(&m).unwrap();
        // On S3.
        let srv = FakeS3::start();
        srv.put_tree("c", cache);
        srv.put("c/manifest.json", &bytes);
        let tier = t.path().join(format!("tier-{}", bad.len()));
        let o = srv.run(
            "prep",
            &[
                "inspect",
                "s3://bucket/c",
                "--verify",
                "--local-cache",
                s(&tier),
            ],
        );
        refused(&o, "is not a content key");
        // And in a local cache folder, for inspect and train.
        let local = t.path().join(format!("local-{}", bad.len()));
        copy_tree(cache, &local);
        std::fs::write(local.join("manifest.json"), &bytes).unwrap();
        let o = crate::common::fixtures::prep(&["inspect", s(&local), "--verify"]);
        let t2 = text(&o);
        assert_ne!(o.status.code(), Some(0), "{t2}");
        assert!(
            !t2.contains("panicked") && t2.contains("is not a content key"),
            "{t2}"
        );
        let run = t.path().join(format!("run-{}", bad.len()));
        let o = crate::common::fixtures::run(
            "train",
            &[
                "--cache-dir",
                s(&local),
                "--steps",
                "1",
                "--no-progress",
                "--out",
                s(&run),
            ],
        );
        refused(&o, "is not a content key");
    }
}

#[test]
fn a_local_cache_folder_that_is_not_this_urls_tier_is_never_adopted() {
    let cache = super::local();
    let t = tempfile::tempdir().unwrap();
    let srv = FakeS3::start();
    srv.put_tree("c", cache);
    srv.put_tree("d", cache);
    // Another local cache given as the tier: refused, nothing of it changed or removed.
    let other = t.path().join("other");
    copy_tree(cache, &other);
    let before = crate::common::tree_hashes(&other);
    for extra in [&[][..], &["--local-cache-gb", "0.05"][..]] {
        let mut args = vec!["inspect", "s3://bucket/c", "--local-cache", s(&other)];
        args.extend(extra);
        refused(&srv.run("prep", &args), "is not marked as a local copy");
        let run = t.path().join("run");
        let mut args = train_args("s3://bucket/c", &other, &run);
        args.extend(extra);
        refused(&srv.run("train", &args), "is not marked as a local copy");
    }
    assert_eq!(crate::common::tree_hashes(&other), before);
    // A tier is its URL's: used again for it, refused for another.
    let tier = t.path().join("tier");
    for _ in 0..2 {
        let o = srv.run(
            "prep",
            &["inspect", "s3://bucket/c", "--local-cache", s(&tier)],
        );
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = srv.run(
        "prep",
        &["inspect", "s3://bucket/d", "--local-cache", s(&tier)],
    );
    refused(&o, "is the local copy of the cache at s3://bucket/c");
    // A file given as the folder.
    let file = t.path().join("file");
    std::fs::write(&file, b"mine").unwrap();
    let o = srv.run(
        "prep",
        &["inspect", "s3://bucket/c", "--local-cache", s(&file)],
    );
    refused(&o, "not a folder");
    assert_eq!(std::fs::read(&file).unwrap(), b"mine");
}

#[test]
fn a_model_whose_weights_left_the_bucket_is_refused_not_served_stale() {
    let run = crate::predict::model();
    let srv = FakeS3::start();
    srv.put_tree("m", run);
    let t = tempfile::tempdir().unwrap();
    let input = crate::common::fixtures::bundled_data().join("imagesTr/vessels_003_0000.nii.gz");
    let models = t.path().join("models");
    let predict = |out: &str| {
        srv.run(
            "predict",
            &[
                "--model",
                "s3://bucket/m",
                s(&input),
                "--out",
                s(&t.path().join(out)),
                "--local-cache",
                s(&models),
            ],
        )
    };
    let o = predict("first");
    assert!(o.status.success(), "{}", text(&o));
    let weights: Vec<String> = srv
        .objects
        .lock()
        .unwrap()
        .keys()
        .filter(|k| k.ends_with("/model.safetensors"))
        .cloned()
        .collect();
    assert!(!weights.is_empty());
    for k in &weights {
        srv.objects.lock().unwrap().remove(k);
    }
    let o = predict("second");
    refused(&o, "model.safetensors");
    assert!(!t.path().join("second/vessels_003.nii.gz").exists());
}
