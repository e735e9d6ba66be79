//! Objects altered in the bucket, bad credentials, missing buckets, silent and throttling
//! endpoints.

use super::*;

#[test]
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn tampered_or_truncated_objects_are_caught_by_verify_and_refused_by_train() {
    let srv = server("s3-tamper");
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
        let mut bytes = c.get(&victim.key, u64::MAX).unwrap().unwrap().bytes;
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
#[ignore = "needs an S3 server: SeaweedFS (bash scripts/python_env.sh; the test starts it) or VOXCACHE_TEST_S3_ENDPOINT; cargo test --test suite s3:: -- --ignored"]
fn bad_credentials_buckets_and_endpoints_are_named_and_never_hang() {
    let srv = server("s3-errors");
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
    // A budget that holds one build: after the cache is rebuilt with other parameters (its
    // manifest then names new entries), reading it removes the old build's entries.
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
    srv.build(&url, &t.path().join("stage"), &["--spacing", "2,2,3"]);
    let second = tier(&url);
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
