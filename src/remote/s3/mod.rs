//! S3-compatible object storage: URLs, configuration taken the way every S3 tool takes it
//! (AWS_* variables, then the shared `~/.aws` files), and a blocking client.

mod client;
#[cfg(test)]
mod client_tests;
mod credentials;
mod sign;
mod xml;

use std::fmt;

pub use client::{Client, Condition, Limits, Listed, Object, Put, Upload};
pub use credentials::{Config, Credentials};

use crate::error::{Error, Result};

/// `s3://BUCKET/PREFIX`: a bucket and a key prefix without leading or trailing slashes
/// (empty: the bucket's root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Url {
    /// The bucket name.
    pub bucket: String,
    /// Key prefix, `a/b` (no slash at either end), or empty.
    pub prefix: String,
}

impl S3Url {
    /// Parse `s3://BUCKET[/PREFIX][/]`. Bucket names follow S3's rules (3 to 63 lowercase
    /// letters, digits, dots and hyphens); the prefix may not hold empty, `.` or `..` parts,
    /// which object stores and file systems read differently.
    pub fn parse(text: &str) -> Result<S3Url> {
        let bad = |why: &str| Error::remote(text, format!("not an S3 location: {why}"));
        let rest = text
            .get(..5)
            .filter(|s| s.eq_ignore_ascii_case("s3://"))
            .map(|_| &text[5..])
            .ok_or_else(|| bad("it does not start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let ok_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
            && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok_bucket {
            return Err(bad(&format!(
                "{bucket:?} is not a bucket name (3 to 63 lowercase letters, digits, dots, hyphens)"
            )));
        }
        let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
        if !prefix.is_empty()
            && prefix
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(bad("the prefix has an empty, '.' or '..' part"));
        }
        Ok(S3Url {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The key of `rel` (a `/`-separated path) under the prefix.
    pub fn key(&self, rel: &str) -> String {
        let rel = rel.trim_start_matches('/');
        if self.prefix.is_empty() {
            rel.to_string()
        } else if rel.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// `s3://BUCKET/KEY` of a key, for messages.
    pub fn url_of(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    /// The same bucket, with `rel` appended to the prefix.
    pub fn join(&self, rel: &str) -> S3Url {
        S3Url {
            bucket: self.bucket.clone(),
            prefix: self.key(rel).trim_end_matches('/').to_string(),
        }
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}
