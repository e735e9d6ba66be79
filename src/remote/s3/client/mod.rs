//! A blocking S3 client: the dozen requests a cache needs, signed, with time limits, bounded
//! answers and retries.
//!
//! Time ([`Limits`]): 10 s to connect, 30 s from a request sent to its answer's first line, 30 s
//! at most between two reads of a body, and a body (sent or received) that must keep an
//! average of 256 KiB/s once its first minute is over, so a server that drips a byte at a time
//! fails the request instead of hanging it. Size: an answer read into memory has a cap (a
//! listing page, an error, the manifest), and a download to a file stops at the size the
//! listing gave: an endless or lying body is refused, not stored.
//!
//! Retries: a request that gets no answer (connection refused or reset, a limit above) is tried
//! 3 times; one answered 5xx (but 501, not implemented) or 429 (throttling) up to 6 times, with
//! exponential backoff (0.2 s doubling, at most 5 s, with jitter). Nothing else is retried: a
//! refusal (403, 404, 412) is an answer, an answer larger than allowed is refused, and a local
//! write that fails (a full disk) names the local file. Every error names the object's URL and
//! what to check.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::credentials::Config;
use super::sign::{amz_date, authorization, canonical_query, sha256_hex, uri_encode, Signable};
use super::xml;
use crate::error::{Error, Result};

mod bulk;

/// Objects up to this size go in one PUT; larger ones in parts of [`PART_BYTES`], read one at
/// a time: a transfer holds at most this much in memory (several run at once).
const SINGLE_PUT_MAX: u64 = 16 << 20;
const PART_BYTES: u64 = 8 << 20;

/// The largest answer read into memory that is not an object asked for with its own cap: a
/// listing page (1,000 keys of at most 1 KiB each, with their XML) or an error document.
const REPLY_MAX: u64 = 8 << 20;

/// How long a request may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// To open the connection.
    pub connect: Duration,
    /// From the request sent to the first line of its answer.
    pub answer: Duration,
    /// The longest wait for one read (or write) of a body.
    pub stall: Duration,
    /// A body's grace: within it, no rate is asked of it.
    pub grace: Duration,
    /// Past the grace, the slowest average rate a body may come or go at, in bytes a second.
    pub min_rate: u64,
    /// Tries of a request that gets no answer.
    pub tries: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connect: Duration::from_secs(10),
            answer: Duration::from_secs(30),
            stall: Duration::from_secs(30),
            grace: Duration::from_secs(60),
            min_rate: 256 << 10,
            tries: 3,
        }
    }
}

impl Limits {
    /// The longest a body of `bytes` may take to come or go.
    fn body_time(&self, bytes: u64) -> Duration {
        self.grace + Duration::from_secs_f64(bytes as f64 / self.min_rate.max(1) as f64)
    }
}

/// Why an exchange brought no usable answer.
enum Failure {
    /// No answer, or it broke off: worth another try.
    Silent(String),
    /// An answer we refuse (larger than allowed, not what was listed): not retried.
    Refused(String),
    /// Our own side failed (the local file could not be written): not retried, names the file.
    Local(Error),
}

/// A client for one bucket.
pub struct Client {
    agent: ureq::Agent,
    limits: Limits,
    cfg: Config,
    bucket: String,
    /// `http(s)://host[:port]` requests go to.
    base: String,
    /// The Host header's value.
    host: String,
    /// Path-style (`/bucket/key`, any custom endpoint) or virtual-hosted (AWS).
    path_style: bool,
}

/// An object read whole.
pub struct Object {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its ETag (quotes included), for a conditional write over it.
    pub etag: Option<String>,
}

/// One object of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Its full key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, in seconds since 1970 (`None` when the server did not say).
    pub modified: Option<u64>,
    /// Its ETag (quotes included), which changes when it is written again.
    pub etag: Option<String>,
}

/// A multipart upload started and neither completed nor aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upload {
    /// The object's key.
    pub key: String,
    /// The upload's id.
    pub id: String,
    /// When it was started, in seconds since 1970.
    pub initiated: Option<u64>,
}

/// The outcome of a conditional write.
#[derive(Debug, PartialEq, Eq)]
pub enum Put {
    /// Written; the new ETag when the server sent one.
    Written(Option<String>),
    /// The condition did not hold (412), or another conditional write raced ours (409).
    Conflict,
}

/// A precondition on a write.
#[derive(Clone, Copy, Debug)]
pub enum Condition<'a> {
    /// Unconditional.
    None,
    /// Only if no object has the key (`If-None-Match: *`).
    Absent,
    /// Only if the object still has this ETag (`If-Match`).
    Matches(&'a str),
}

struct Reply {
    status: u16,
    etag: Option<String>,
    length: Option<u64>,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request: what [`Client::send`] signs and sends.
#[derive(Clone, Copy)]
struct Req<'a> {
    method: &'a str,
    key: &'a str,
    query: &'a [(&'a str, String)],
    headers: &'a [(&'a str, String)],
    body: Option<&'a [u8]>,
    /// Stream a 200 answer's body into this file instead of memory.
    to_file: Option<&'a Path>,
    /// The most bytes a 200 answer's body may hold (into memory or the file).
    max: u64,
    /// The exact size a 200 answer's body must have (a listed object streamed to a file).
    exact: Option<u64>,
}

impl<'a> Req<'a> {
    fn new(method: &'a str, key: &'a str) -> Req<'a> {
        Req {
            method,
            key,
            query: &[],
            headers: &[],
            body: None,
            to_file: None,
            max: REPLY_MAX,
            exact: None,
        }
    }
    fn max(self, max: u64) -> Req<'a> {
        Req { max, ..self }
    }
    fn query(self, query: &'a [(&'a str, String)]) -> Req<'a> {
        Req { query, ..self }
    }
    fn headers(self, headers: &'a [(&'a str, String)]) -> Req<'a> {
        Req { headers, ..self }
    }
    fn body(self, body: &'a [u8]) -> Req<'a> {
        Req {
            body: Some(body),
            ..self
        }
    }
    /// Stream the body into `path`; it must hold exactly `size` bytes.
    fn to_file(self, path: &'a Path, size: u64) -> Req<'a> {
        Req {
            to_file: Some(path),
            max: size,
            exact: Some(size),
            ..self
        }
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn backoff(attempt: u32) -> Duration {
    let base = (200u64 << attempt.min(5)).min(5_000);
    let jitter = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()) % (base / 2 + 1))
        .unwrap_or(0);
    Duration::from_millis(base / 2 + jitter)
}

impl Client {
    /// A client for `bucket` as `cfg` says.
    pub fn new(cfg: Config, bucket: &str) -> Result<Client> {
        Client::with_limits(cfg, bucket, Limits::default())
    }

    /// A client for `bucket` with other time limits than the documented ones (tests).
    pub fn with_limits(cfg: Config, bucket: &str, limits: Limits) -> Result<Client> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(limits.connect))
            .timeout_recv_response(Some(limits.answer))
            .timeout_per_read(Some(limits.stall))
            .timeout_per_write(Some(limits.stall))
            .max_redirects(0)
            .user_agent(concat!("voxcache/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let (base, path_style) = match &cfg.endpoint {
            Some(e) => (e.clone(), true),
            None if bucket.contains('.') => {
                (format!("https://s3.{}.amazonaws.com", cfg.region), true)
            }
            None => (
                format!("https://{bucket}.s3.{}.amazonaws.com", cfg.region),
                false,
            ),
        };
        let host = base
            .split_once("://")
            .map(|(_, h)| h.to_string())
            .unwrap_or_default();
        Ok(Client {
            agent,
            limits,
            cfg,
            bucket: bucket.to_string(),
            base,
            host,
            path_style,
        })
    }

    /// A client for the bucket of `url`, checked with a first request whose failure
    /// (credentials, bucket, endpoint) names `url`.
    pub fn connect(url: &super::S3Url, endpoint: Option<&str>) -> Result<Client> {
        let client = Client::new(Config::from_env(endpoint)?, &url.bucket)?;
        client.check_bucket().map_err(|e| match e {
            Error::Remote { message, .. } => Error::remote(url.to_string(), message),
            e => e,
        })?;
        Ok(client)
    }

    /// `s3://bucket/key`, for messages.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    /// The encoded path of `key` as sent and signed.
    fn path(&self, key: &str) -> String {
        let k = uri_encode(key, true);
        if self.path_style {
            format!("/{}/{k}", self.bucket)
        } else {
            format!("/{k}")
        }
    }

    /// One request, no retry. With `to_file`, a 200 answer's body is streamed into that file
    /// instead of memory; either way it is bounded by `req.max`.
    fn exchange(&self, req: &Req<'_>) -> std::result::Result<Reply, Failure> {
        let Req {
            method,
            key,
            query,
            headers,
            body,
            to_file,
            max,
            exact,
        } = *req;
        let path = self.path(key);
        let q = canonical_query(query);
        let url = if q.is_empty() {
            format!("{}{path}", self.base)
        } else {
            format!("{}{path}?{q}", self.base)
        };
        let mut b = ureq::http::Request::builder().method(method).uri(&url);
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        if let Some(creds) = &self.cfg.credentials {
            let payload = sha256_hex(body.unwrap_or(&[]));
            let date = amz_date(now_unix());
            let (auth, signed) = authorization(
                &Signable {
                    method,
                    path: &path,
                    query: &q,
                    host: &self.host,
                    payload_sha256: &payload,
                    amz_date: &date,
                },
                creds,
                &self.cfg.region,
            );
            for (k, v) in signed {
                b = b.header(k, v);
            }
            b = b.header("authorization", auth);
        }
        let send_time = Some(self.limits.body_time(body.map_or(0, |b| b.len() as u64)));
        let sent = match body {
            Some(bytes) => b.body(bytes).map(|r| {
                let r = self
                    .agent
                    .configure_request(r)
                    .timeout_send_body(send_time)
                    .build();
                self.agent.run(r)
            }),
            None => b.body(()).map(|r| self.agent.run(r)),
        };
        let mut resp = sent
            .map_err(|e| Failure::Refused(format!("bad request: {e}")))?
            .map_err(|e| Failure::Silent(e.to_string()))?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let etag = header("etag");
        let length: Option<u64> = header("content-length").and_then(|v| v.parse().ok());
        let status = resp.status().as_u16();
        if method == "HEAD" {
            return Ok(Reply {
                status,
                etag,
                length,
                body: Vec::new(),
            });
        }
        // Only a wanted answer gets the caller's bounds; errors and refusals get a page's.
        let (max, exact) = if status == 200 {
            (max, exact)
        } else {
            (REPLY_MAX, None)
        };
        if let (Some(n), Some(want)) = (length, exact) {
            if n != want {
                return Err(Failure::Refused(format!(
                    "the answer says {n} bytes, the listing {want}: the object changed or the \
                     server is not answering for it"
                )));
            }
        }
        if let Some(n) = length.filter(|&n| n > max) {
            return Err(Failure::Refused(format!(
                "the answer is {n} bytes, more than the {max} allowed here"
            )));
        }
        let mut reader = resp.body_mut().as_reader();
        let body = match (to_file, status) {
            (Some(path), 200) => {
                let mut f =
                    std::fs::File::create(path).map_err(|e| Failure::Local(Error::io(path, e)))?;
                let got = self.read_body(&mut reader, max, &mut |chunk| {
                    use std::io::Write;
                    f.write_all(chunk).map_err(|e| Error::io(path, e))
                })?;
                if exact.is_some_and(|want| got != want) {
                    return Err(Failure::Silent(format!(
                        "the answer broke off after {got} of {max} bytes"
                    )));
                }
                Vec::new()
            }
            _ => {
                let mut out = Vec::new();
                self.read_body(&mut reader, max, &mut |chunk| {
                    out.extend_from_slice(chunk);
                    Ok(())
                })?;
                out
            }
        };
        Ok(Reply {
            status,
            etag,
            length,
            body,
        })
    }

    /// Read a body to its end through `sink`: at most `max` bytes, at the limits' rate.
    /// Returns the bytes read.
    fn read_body(
        &self,
        reader: &mut impl Read,
        max: u64,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> std::result::Result<u64, Failure> {
        let start = std::time::Instant::now();
        let mut buf = vec![0u8; 64 << 10];
        let mut got = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(got),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::Silent(format!("the answer broke off: {e}"))),
            };
            got += n as u64;
            if got > max {
                return Err(Failure::Refused(format!(
                    "the answer goes on past the {max} bytes allowed here"
                )));
            }
            sink(&buf[..n]).map_err(Failure::Local)?;
            if start.elapsed() > self.limits.body_time(got) {
                return Err(Failure::Silent(format!(
                    "the answer came at {} bytes in {:.0} s, slower than the {} KiB/s a \
                     body must keep after its first {} s",
                    got,
                    start.elapsed().as_secs_f64(),
                    self.limits.min_rate >> 10,
                    self.limits.grace.as_secs()
                )));
            }
        }
    }

    /// A request with retries on silence, 5xx and throttling; any other answer is returned.
    fn send(&self, req: Req<'_>) -> Result<Reply> {
        let mut attempt = 0;
        loop {
            let r = match self.exchange(&req) {
                Ok(rep) => Ok(rep),
                Err(Failure::Silent(e)) => Err(e),
                Err(Failure::Local(e)) => return Err(e),
                Err(Failure::Refused(why)) => {
                    return Err(Error::remote(
                        self.url(req.key),
                        format!("{} refused: {why}", req.method),
                    ))
                }
            };
            let (retry, limit) = match &r {
                Err(_) => (true, self.limits.tries),
                // 501: the server does not implement the request; asking again will not help.
                Ok(rep) if (rep.status >= 500 && rep.status != 501) || rep.status == 429 => {
                    (true, 6)
                }
                Ok(_) => (false, 0),
            };
            attempt += 1;
            if !retry || attempt >= limit {
                return match r {
                    Ok(rep) if retry => Err(self.refused(req.method, req.key, &rep)),
                    Ok(rep) => Ok(rep),
                    Err(e) => Err(Error::remote(
                        self.url(req.key),
                        format!(
                            "no answer from {} after {attempt} tries: {e} (check the endpoint: {})",
                            self.base, self.cfg.described
                        ),
                    )),
                };
            }
            std::thread::sleep(backoff(attempt));
        }
    }

    /// The error for an answer we did not want, saying what to check.
    fn refused(&self, method: &str, key: &str, rep: &Reply) -> Error {
        let text = rep.text();
        let code = xml::first(&text, "Code").unwrap_or_default();
        let msg = xml::first(&text, "Message").unwrap_or_default();
        let why = match (rep.status, code.as_str()) {
            (404, "NoSuchBucket") => format!("the bucket {:?} does not exist", self.bucket),
            (403, "InvalidAccessKeyId") => {
                "the server does not know this access key (AWS_ACCESS_KEY_ID or the profile's)"
                    .to_string()
            }
            (403, "SignatureDoesNotMatch") => {
                "the secret key does not match the access key (AWS_SECRET_ACCESS_KEY or the \
                 profile's)"
                    .to_string()
            }
            (403, _) if self.cfg.credentials.is_none() => {
                "access denied, and no credentials were found: set AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
                    .to_string()
            }
            (403, _) => format!("access denied ({code}: {msg})"),
            (429, _) | (503, "SlowDown") => {
                "the server kept throttling requests (HTTP 429/503 SlowDown) through every retry"
                    .to_string()
            }
            (s, _) if s >= 500 => {
                format!("server error HTTP {s} through every retry ({code} {msg})")
            }
            (s, _) => format!("HTTP {s} {code} {msg}"),
        };
        Error::remote(self.url(key), format!("{method} refused: {why}"))
    }

    /// The whole object, or `None` when there is none; one larger than `max` bytes is refused.
    pub fn get(&self, key: &str, max: u64) -> Result<Option<Object>> {
        let rep = self.send(Req::new("GET", key).max(max))?;
        match rep.status {
            200 => Ok(Some(Object {
                etag: rep.etag,
                bytes: rep.body,
            })),
            404 if !rep.text().contains("NoSuchBucket") => Ok(None),
            _ => Err(self.refused("GET", key, &rep)),
        }
    }

    /// Stream the whole object, listed as `size` bytes, into the file `path` (created or
    /// truncated); `false` when there is no such object. Memory stays a buffer's worth whatever
    /// the object's size, and the file never grows past `size`: an answer of another size is
    /// refused (the file is then the caller's to remove).
    pub fn get_to_file(&self, key: &str, path: &Path, size: u64) -> Result<bool> {
        let rep = self.send(Req::new("GET", key).to_file(path, size))?;
        match rep.status {
            200 => Ok(true),
            404 if !rep.text().contains("NoSuchBucket") => Ok(false),
            _ => Err(self.refused("GET", key, &rep)),
        }
    }

    /// The object's size, or `None` when there is none.
    pub fn head(&self, key: &str) -> Result<Option<u64>> {
        let rep = self.send(Req::new("HEAD", key))?;
        match rep.status {
            200 => Ok(Some(rep.length.unwrap_or(0))),
            // HEAD answers carry no body: a missing bucket shows as a 404 too.
            404 => {
                self.check_bucket()?;
                Ok(None)
            }
            _ => Err(self.refused("HEAD", key, &rep)),
        }
    }

    /// Fail naming the bucket when it does not exist or cannot be listed.
    pub fn check_bucket(&self) -> Result<()> {
        let q = [
            ("list-type", "2".to_string()),
            ("max-keys", "1".to_string()),
        ];
        let rep = self.send(Req::new("GET", "").query(&q))?;
        match rep.status {
            200 => Ok(()),
            _ => Err(self.refused("LIST", "", &rep)),
        }
    }

    /// Write an object in one request under `cond`.
    pub fn put(&self, key: &str, bytes: &[u8], cond: Condition<'_>) -> Result<Put> {
        let mut headers = vec![("content-type", "application/octet-stream".to_string())];
        match cond {
            Condition::None => {}
            Condition::Absent => headers.push(("if-none-match", "*".to_string())),
            Condition::Matches(etag) => headers.push(("if-match", etag.to_string())),
        }
        let rep = self.send(Req::new("PUT", key).headers(&headers).body(bytes))?;
        match rep.status {
            200 | 201 | 204 => Ok(Put::Written(rep.etag)),
            412 | 409 if !matches!(cond, Condition::None) => Ok(Put::Conflict),
            _ => Err(self.refused("PUT", key, &rep)),
        }
    }
}
