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

mod failures;
mod hostile;
mod read;
mod write;
