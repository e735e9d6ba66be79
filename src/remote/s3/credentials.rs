//! Endpoint, region and credentials, found where the AWS command line and SDKs find them:
//! the environment first (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
//! AWS_REGION or AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL), then the
//! profile (AWS_PROFILE, else `default`) of the shared files `~/.aws/credentials` and
//! `~/.aws/config` (or AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE).

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// A key pair (and session token) that signs requests.
#[derive(Clone)]
pub struct Credentials {
    /// AWS_ACCESS_KEY_ID.
    pub access_key: String,
    /// AWS_SECRET_ACCESS_KEY.
    pub secret_key: String,
    /// AWS_SESSION_TOKEN, for temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, secret hidden)", self.access_key)
    }
}

/// How to reach the store.
#[derive(Clone, Debug)]
pub struct Config {
    /// `http(s)://host[:port]` of an S3-compatible server; `None`: AWS itself.
    pub endpoint: Option<String>,
    /// The signing region.
    pub region: String,
    /// `None`: requests go unsigned (public buckets).
    pub credentials: Option<Credentials>,
    /// Where each setting came from, for error messages ("AWS_ENDPOINT_URL", "profile x").
    pub described: String,
}

/// One section of an INI file: key -> value.
type Section = HashMap<String, String>;

/// The sections of an AWS shared file (`[name]` headers, `key = value` lines, `#`/`;` comments).
fn parse_ini(text: &str) -> HashMap<String, Section> {
    let mut out: HashMap<String, Section> = HashMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_string();
            out.entry(name.clone()).or_default();
            current = Some(name);
        } else if let (Some(sec), Some((k, v))) = (&current, line.split_once('=')) {
            if let Some(s) = out.get_mut(sec) {
                s.insert(k.trim().to_lowercase(), v.trim().to_string());
            }
        }
    }
    out
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn home_file(var: &str, rel: &str) -> Option<PathBuf> {
    env(var)
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".aws").join(rel)))
}

/// `text` as an endpoint URL: http(s)://host[:port], a trailing slash allowed.
fn check_endpoint(text: &str, from: &str) -> Result<String> {
    let t = text.trim().trim_end_matches('/');
    let rest = t
        .strip_prefix("http://")
        .or_else(|| t.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !host.contains('/') => Ok(t.to_string()),
        _ => Err(Error::remote(
            text,
            format!("{from}: an S3 endpoint must be http://HOST[:PORT] or https://HOST[:PORT]"),
        )),
    }
}

impl Config {
    /// The configuration for this process: `endpoint` (the `--s3-endpoint` flag) first, then
    /// the environment, then the shared files' profile.
    pub fn from_env(endpoint: Option<&str>) -> Result<Config> {
        let explicit_profile = env("AWS_PROFILE");
        let profile = explicit_profile.clone().unwrap_or_else(|| "default".into());
        let cred_path = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        let conf_path = home_file("AWS_CONFIG_FILE", "config");
        let read = |p: &Option<PathBuf>| {
            p.as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .map(|t| parse_ini(&t))
                .unwrap_or_default()
        };
        let (creds_file, conf_file) = (read(&cred_path), read(&conf_path));
        let in_creds = creds_file.get(&profile);
        let conf_name = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        let in_conf = conf_file.get(&conf_name);
        if explicit_profile.is_some() && in_creds.is_none() && in_conf.is_none() {
            let show = |p: &Option<PathBuf>| {
                p.as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "(no HOME)".into())
            };
            return Err(Error::remote(
                "AWS_PROFILE",
                format!(
                    "profile {profile:?} is in neither {} nor {}",
                    show(&cred_path),
                    show(&conf_path)
                ),
            ));
        }
        let from_profile = |k: &str| {
            in_creds
                .and_then(|s| s.get(k))
                .or_else(|| in_conf.and_then(|s| s.get(k)))
                .cloned()
        };
        let (endpoint, from) = match endpoint {
            Some(e) => (Some(e.to_string()), "--s3-endpoint".to_string()),
            None => match env("AWS_ENDPOINT_URL_S3")
                .map(|e| (e, "AWS_ENDPOINT_URL_S3"))
                .or_else(|| env("AWS_ENDPOINT_URL").map(|e| (e, "AWS_ENDPOINT_URL")))
            {
                Some((e, v)) => (Some(e), v.to_string()),
                None => (
                    from_profile("endpoint_url"),
                    format!("profile {profile:?}'s endpoint_url"),
                ),
            },
        };
        let endpoint = endpoint.map(|e| check_endpoint(&e, &from)).transpose()?;
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| from_profile("region"))
            .unwrap_or_else(|| "us-east-1".into());
        let (credentials, cred_from) =
            match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                (Some(a), Some(s)) => (
                    Some(Credentials {
                        access_key: a,
                        secret_key: s,
                        session_token: env("AWS_SESSION_TOKEN"),
                    }),
                    "AWS_ACCESS_KEY_ID".to_string(),
                ),
                (Some(_), None) | (None, Some(_)) => {
                    return Err(Error::remote(
                        "AWS_ACCESS_KEY_ID",
                        "only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set; set both",
                    ))
                }
                (None, None) => match (
                    from_profile("aws_access_key_id"),
                    from_profile("aws_secret_access_key"),
                ) {
                    (Some(a), Some(s)) => (
                        Some(Credentials {
                            access_key: a,
                            secret_key: s,
                            session_token: from_profile("aws_session_token"),
                        }),
                        format!("profile {profile:?}"),
                    ),
                    _ => (None, "none found".to_string()),
                },
            };
        Ok(Config {
            described: format!(
                "endpoint {} ({}), region {region}, credentials: {cred_from}",
                endpoint.as_deref().unwrap_or("AWS"),
                if endpoint.is_some() {
                    from.as_str()
                } else {
                    "default"
                },
            ),
            endpoint,
            region,
            credentials,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_sections_comments_and_case() {
        let t = "# c\n[default]\naws_access_key_id = A\n\n[profile x]\nRegion= eu-west-1\n; c\n";
        let p = parse_ini(t);
        assert_eq!(p["default"]["aws_access_key_id"], "A");
        assert_eq!(p["profile x"]["region"], "eu-west-1");
    }

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(
            check_endpoint("http://127.0.0.1:8333/", "x").unwrap(),
            "http://127.0.0.1:8333"
        );
        for bad in ["127.0.0.1:8333", "ftp://h", "http://", "http://h/path"] {
            assert!(check_endpoint(bad, "x").is_err(), "{bad}");
        }
    }
}
