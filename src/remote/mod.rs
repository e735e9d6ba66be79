//! Where a cache lives: a local folder or an S3-compatible bucket, and a small blocking S3
//! client (SigV4, retries, conditional writes) for the latter.
//!
//! Only the commands that touch a cache on object storage use this module; it runs on plain
//! threads (no async runtime), so nothing else pays for it.

pub mod s3;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
pub use s3::S3Url;

/// A cache location given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A folder on a local or network file system.
    Local(PathBuf),
    /// A prefix in an S3 bucket (`s3://BUCKET/PREFIX`).
    S3(S3Url),
}

impl Location {
    /// Read `path` as a location: `s3://BUCKET[/PREFIX]`, or a path. Any other `SCHEME://`
    /// (gs://, https://, file://...) is refused rather than taken as a folder named after it.
    pub fn parse(path: &Path) -> Result<Location> {
        let Some(text) = path.to_str() else {
            return Ok(Location::Local(path.to_path_buf()));
        };
        match scheme_of(text) {
            None => Ok(Location::Local(path.to_path_buf())),
            Some("s3") => Ok(Location::S3(S3Url::parse(text)?)),
            Some(other) => Err(Error::remote(
                text,
                format!(
                    "{other}:// locations are not supported: give a local path (a cache may \
                     also live in an S3-compatible bucket: s3://BUCKET/PREFIX, with \
                     AWS_ENDPOINT_URL for servers other than AWS)"
                ),
            )),
        }
    }

    /// Like [`Location::parse`], for a command that reads or writes only local folders: an
    /// `s3://` URL is refused, naming what `what` is and which commands take one.
    pub fn local_only(path: &Path, what: &str) -> Result<PathBuf> {
        match Location::parse(path)? {
            Location::Local(p) => Ok(p),
            Location::S3(u) => Err(Error::remote(
                u.to_string(),
                format!(
                    "{what} must be a local folder; caches on S3 are read by `prep inspect` and \
                     `train`, and written by `prep build-cache`; `predict --model` reads a run \
                     folder on S3"
                ),
            )),
        }
    }
}

/// The scheme of `text` when it starts with `SCHEME://` (letters, digits, `+-.`, a letter
/// first), lowercased.
fn scheme_of(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
    .map(|s| {
        if s.eq_ignore_ascii_case("s3") {
            "s3"
        } else {
            s
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_urls_and_refusals() {
        let loc = |s: &str| Location::parse(Path::new(s));
        assert_eq!(
            loc("cache").unwrap(),
            Location::Local(PathBuf::from("cache"))
        );
        assert_eq!(
            loc("./a:b/c").unwrap(),
            Location::Local(PathBuf::from("./a:b/c"))
        );
        let Location::S3(u) = loc("s3://bucket/some/prefix/").unwrap() else {
            panic!("not s3")
        };
        assert_eq!(
            (u.bucket.as_str(), u.prefix.as_str()),
            ("bucket", "some/prefix")
        );
        assert_eq!(u.to_string(), "s3://bucket/some/prefix");
        for bad in ["gs://bkt/p", "https://host/b", "file:///tmp/x", "az://c/p"] {
            let e = loc(bad).unwrap_err().to_string();
            assert!(e.contains("not supported") && e.starts_with(bad), "{e}");
        }
        for bad in [
            "s3://",
            "s3:///p",
            "s3://B_ad/p",
            "s3://b//p",
            "s3://b/../p",
        ] {
            assert!(loc(bad).is_err(), "{bad} accepted");
        }
        let e = Location::local_only(Path::new("s3://bkt/p"), "--out").unwrap_err();
        assert!(
            e.to_string().contains("--out must be a local folder"),
            "{e}"
        );
    }
}
