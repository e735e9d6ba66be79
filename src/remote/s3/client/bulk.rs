//! The requests over many objects: multipart uploads (start, parts, complete, abort, and
//! listing the unfinished ones), deletes and listings.

use std::io::Read;
use std::path::Path;

use super::{xml, Client, Condition, Listed, Req, Upload, PART_BYTES, SINGLE_PUT_MAX};
use crate::error::{Error, Result};

impl Client {
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
