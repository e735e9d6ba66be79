//! A blocking S3 client: the dozen requests a cache needs, signed, with timeouts and retries.
//!
//! Retries: a request that gets no answer (connection refused or reset, timeout) is tried
//! 3 times; one answered 5xx (but 501, not implemented) or 429 (throttling) up to 6 times, with
//! exponential backoff (0.2 s doubling, at most 5 s, with jitter). Nothing else is retried: a
//! refusal (403, 404, 412) is an answer. Every error names the object's URL and what to check.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::config::Config;
use super::sign::{amz_date, authorization, canonical_query, sha256_hex, uri_encode, Signable};
use super::xml;
use crate::error::{Error, Result};

/// Objects up to this size go in one PUT; larger ones in parts of [`PART_BYTES`], read one at
/// a time: a transfer holds at most this much in memory (several run at once).
const SINGLE_PUT_MAX: u64 = 16 << 20;
const PART_BYTES: u64 = 8 << 20;

/// A client for one bucket.
pub struct Client {
    agent: ureq::Agent,
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
        }
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
    fn to_file(self, path: &'a Path) -> Req<'a> {
        Req {
            to_file: Some(path),
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
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_send_body(Some(Duration::from_secs(600)))
            .timeout_recv_body(Some(Duration::from_secs(600)))
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

    /// One request, no retry; `Err` when no answer came (the transport's message). With
    /// `to_file`, a 200 answer's body is streamed into that file instead of memory.
    fn exchange(&self, req: &Req<'_>) -> std::result::Result<Reply, String> {
        let Req {
            method,
            key,
            query,
            headers,
            body,
            to_file,
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
        let sent = match body {
            Some(bytes) => b.body(bytes).map(|r| self.agent.run(r)),
            None => b.body(()).map(|r| self.agent.run(r)),
        };
        let mut resp = sent
            .map_err(|e| format!("bad request: {e}"))?
            .map_err(|e| e.to_string())?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let etag = header("etag");
        let length = header("content-length").and_then(|v| v.parse().ok());
        let status = resp.status().as_u16();
        let body = if method == "HEAD" {
            Vec::new()
        } else if let (Some(path), 200) = (to_file, status) {
            let mut f =
                std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            std::io::copy(&mut resp.body_mut().as_reader(), &mut f)
                .map_err(|e| format!("the answer broke off: {e}"))?;
            Vec::new()
        } else {
            resp.body_mut()
                .with_config()
                .limit(u64::MAX)
                .read_to_vec()
                .map_err(|e| format!("the answer broke off: {e}"))?
        };
        Ok(Reply {
            status,
            etag,
            length,
            body,
        })
    }

    /// A request with retries on silence, 5xx and throttling; any other answer is returned.
    fn send(&self, req: Req<'_>) -> Result<Reply> {
        let mut attempt = 0;
        loop {
            let r = self.exchange(&req);
            let (retry, limit) = match &r {
                Err(_) => (true, 3),
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

    /// The whole object, or `None` when there is none.
    pub fn get(&self, key: &str) -> Result<Option<Object>> {
        let rep = self.send(Req::new("GET", key))?;
        match rep.status {
            200 => Ok(Some(Object {
                etag: rep.etag,
                bytes: rep.body,
            })),
            404 if !rep.text().contains("NoSuchBucket") => Ok(None),
            _ => Err(self.refused("GET", key, &rep)),
        }
    }

    /// Stream the whole object into the file `path` (created or truncated); `false` when there
    /// is no such object. Memory stays a buffer's worth whatever the object's size.
    pub fn get_to_file(&self, key: &str, path: &Path) -> Result<bool> {
        let rep = self.send(Req::new("GET", key).to_file(path))?;
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

    /// Start a multipart upload of `key`.
    pub fn start_upload(&self, key: &str) -> Result<Upload> {
        let q = [("uploads", String::new())];
        let rep = self.send(Req::new("POST", key).query(&q).body(&[]))?;
        match (rep.status, xml::first(&rep.text(), "UploadId")) {
            (200, Some(id)) => Ok(Upload {
                key: key.to_string(),
                id,
                initiated: None,
            }),
            _ => Err(self.refused("POST (start a multipart upload)", key, &rep)),
        }
    }

    /// Upload a local file: one PUT when small, a multipart upload (parts read one at a time)
    /// when large.
    pub fn upload_file(&self, key: &str, path: &Path) -> Result<()> {
        let len = std::fs::metadata(path)
            .map_err(|e| Error::io(path, e))?
            .len();
        if len <= SINGLE_PUT_MAX {
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            self.put(key, &bytes, Condition::None)?;
            return Ok(());
        }
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let id = self.start_upload(key)?.id;
        let parts = (|| -> Result<Vec<String>> {
            let mut etags = Vec::new();
            let mut buf = vec![0u8; PART_BYTES as usize];
            for n in 1.. {
                let mut got = 0;
                while got < buf.len() {
                    let k = f.read(&mut buf[got..]).map_err(|e| Error::io(path, e))?;
                    if k == 0 {
                        break;
                    }
                    got += k;
                }
                if got == 0 {
                    break;
                }
                let q = [("partNumber", format!("{n}")), ("uploadId", id.clone())];
                let rep = self.send(Req::new("PUT", key).query(&q).body(&buf[..got]))?;
                match (rep.status, rep.etag) {
                    (200, Some(e)) => etags.push(e),
                    (s, _) => {
                        return Err(Error::remote(
                            self.url(key),
                            format!("part {n} of a multipart upload: HTTP {s}"),
                        ))
                    }
                }
            }
            Ok(etags)
        })();
        let finish = parts.and_then(|etags| {
            let body: String = etags
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    format!(
                        "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>",
                        i + 1,
                        xml::escape(e)
                    )
                })
                .collect();
            let body = format!("<CompleteMultipartUpload>{body}</CompleteMultipartUpload>");
            let complete = [("uploadId", id.clone())];
            let xml_type = [("content-type", "application/xml".to_string())];
            let rep = self.send(
                Req::new("POST", key)
                    .query(&complete)
                    .headers(&xml_type)
                    .body(body.as_bytes()),
            )?;
            // S3 may answer 200 and put the error in the body.
            if rep.status == 200 && !rep.text().contains("<Error>") {
                Ok(())
            } else {
                Err(self.refused("POST (complete a multipart upload)", key, &rep))
            }
        });
        if finish.is_err() {
            let _ = self.send(Req::new("DELETE", key).query(&[("uploadId", id)]));
        }
        finish
    }

    /// Remove an object (no error when there is none).
    pub fn delete(&self, key: &str) -> Result<()> {
        let rep = self.send(Req::new("DELETE", key))?;
        match rep.status {
            200 | 204 | 404 => Ok(()),
            _ => Err(self.refused("DELETE", key, &rep)),
        }
    }

    /// Every object whose key starts with `prefix`, with sizes, in key order.
    pub fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut q = vec![
                ("list-type", "2".to_string()),
                ("prefix", prefix.to_string()),
            ];
            if let Some(t) = &token {
                q.push(("continuation-token", t.clone()));
            }
            let rep = self.send(Req::new("GET", "").query(&q))?;
            if rep.status != 200 {
                return Err(self.refused("LIST", prefix, &rep));
            }
            let text = rep.text();
            for block in xml::blocks(&text, "Contents") {
                let key = xml::first(block, "Key");
                let size = xml::first(block, "Size").and_then(|s| s.parse().ok());
                let modified = xml::first(block, "LastModified").and_then(|t| xml::unix_time(&t));
                let etag = xml::first(block, "ETag");
                if let (Some(key), Some(size)) = (key, size) {
                    out.push(Listed {
                        key,
                        size,
                        modified,
                        etag,
                    });
                }
            }
            token = xml::first(&text, "NextContinuationToken");
            if xml::first(&text, "IsTruncated").as_deref() != Some("true") || token.is_none() {
                break;
            }
        }
        Ok(out)
    }

    /// The multipart uploads under `prefix` that were started and never completed or aborted
    /// (a builder killed mid-upload leaves them; their parts are stored, and billed, until
    /// aborted).
    pub fn uploads(&self, prefix: &str) -> Result<Vec<Upload>> {
        let mut out = Vec::new();
        let mut marker: Option<(String, String)> = None;
        loop {
            let mut q = vec![("uploads", String::new()), ("prefix", prefix.to_string())];
            if let Some((k, u)) = &marker {
                q.push(("key-marker", k.clone()));
                q.push(("upload-id-marker", u.clone()));
            }
            let rep = self.send(Req::new("GET", "").query(&q))?;
            if rep.status != 200 {
                return Err(self.refused("LIST (multipart uploads)", prefix, &rep));
            }
            let text = rep.text();
            for block in xml::blocks(&text, "Upload") {
                if let (Some(key), Some(id)) =
                    (xml::first(block, "Key"), xml::first(block, "UploadId"))
                {
                    let initiated = xml::first(block, "Initiated").and_then(|t| xml::unix_time(&t));
                    out.push(Upload { key, id, initiated });
                }
            }
            let next = (
                xml::first(&text, "NextKeyMarker"),
                xml::first(&text, "NextUploadIdMarker"),
            );
            match (xml::first(&text, "IsTruncated").as_deref(), next) {
                (Some("true"), (Some(k), Some(u)))
                    if marker.as_ref() != Some(&(k.clone(), u.clone())) =>
                {
                    marker = Some((k, u))
                }
                _ => break,
            }
        }
        Ok(out)
    }

    /// Abort a multipart upload: its stored parts are dropped (no error when it is gone).
    pub fn abort_upload(&self, upload: &Upload) -> Result<()> {
        let q = [("uploadId", upload.id.clone())];
        let rep = self.send(Req::new("DELETE", &upload.key).query(&q))?;
        match rep.status {
            200 | 204 | 404 => Ok(()),
            _ => Err(self.refused("DELETE (abort a multipart upload)", &upload.key, &rep)),
        }
    }
}
