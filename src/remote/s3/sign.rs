//! AWS Signature Version 4 for S3 requests (header form), and the URI encoding it needs.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::credentials::Credentials;

type HmacSha256 = Hmac<Sha256>;

/// Lowercase hex of bytes.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex SHA-256 of a body (the `x-amz-content-sha256` header).
pub(super) fn sha256_hex(body: &[u8]) -> String {
    hex(&Sha256::digest(body))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // Any key length is accepted by HMAC; this cannot fail.
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// S3's URI encoding: unreserved characters kept, everything else %XX (uppercase); `/` kept
/// only in paths.
pub(super) fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The canonical (and sent) query string: pairs encoded, sorted by name then value.
pub(super) fn canonical_query(query: &[(&str, String)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// `YYYYMMDDTHHMMSSZ` of seconds since the epoch (UTC), from the civil-date algorithm.
pub(super) fn amz_date(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// What is signed: the request as S3 will see it.
pub(super) struct Signable<'a> {
    pub(super) method: &'a str,
    /// The encoded path (`/bucket/key` or `/key`).
    pub(super) path: &'a str,
    /// The encoded, sorted query string.
    pub(super) query: &'a str,
    /// The Host header's value.
    pub(super) host: &'a str,
    pub(super) payload_sha256: &'a str,
    pub(super) amz_date: &'a str,
}

/// The `Authorization` header for `req`, and the headers that must be sent with it
/// (lowercase names; host is sent by the HTTP client itself).
pub(super) fn authorization(
    req: &Signable<'_>,
    creds: &Credentials,
    region: &str,
) -> (String, Vec<(&'static str, String)>) {
    let mut headers: Vec<(&'static str, String)> = vec![
        ("x-amz-content-sha256", req.payload_sha256.to_string()),
        ("x-amz-date", req.amz_date.to_string()),
    ];
    if let Some(t) = &creds.session_token {
        headers.push(("x-amz-security-token", t.clone()));
    }
    let mut canon: Vec<(&str, &str)> = vec![("host", req.host)];
    canon.extend(headers.iter().map(|(k, v)| (*k, v.as_str())));
    canon.sort();
    let canonical_headers: String = canon
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim()))
        .collect();
    let signed: Vec<&str> = canon.iter().map(|(k, _)| *k).collect();
    let signed = signed.join(";");
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method, req.path, req.query, canonical_headers, signed, req.payload_sha256
    );
    let date = &req.amz_date[..8];
    let scope = format!("{date}/{region}/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
        req.amz_date,
        sha256_hex(canonical.as_bytes())
    );
    let k_date = hmac(
        format!("AWS4{}", creds.secret_key).as_bytes(),
        date.as_bytes(),
    );
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, b"s3");
    let k_signing = hmac(&k_service, b"aws4_request");
    let signature = hex(&hmac(&k_signing, to_sign.as_bytes()));
    (
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            creds.access_key
        ),
        headers,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_encoding() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(1_369_353_600), "20130524T000000Z");
        assert_eq!(amz_date(951_782_400 + 3_723), "20000229T010203Z");
        assert_eq!(uri_encode("a b/c~d+é", true), "a%20b/c~d%2B%C3%A9");
        assert_eq!(uri_encode("a/b", false), "a%2Fb");
        assert_eq!(
            canonical_query(&[("prefix", "x/y".into()), ("list-type", "2".into())]),
            "list-type=2&prefix=x%2Fy"
        );
    }

    /// AWS's documented example: GET /test.txt with a range header, from the S3 signature
    /// examples (access key AKIAIOSFODNN7EXAMPLE, 2013-05-24, us-east-1). The example also
    /// signs `range`; ours signs host and x-amz-* only, so the signature differs, but the
    /// signing key chain is checked through the documented seed-signature example below.
    #[test]
    fn signing_key_chain_matches_aws_example() {
        // The published signing key for secret wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY,
        // date 20120215, region us-east-1, service iam (AWS's "deriving the signing key").
        let k_date = hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20120215");
        let k_region = hmac(&k_date, b"us-east-1");
        let k_service = hmac(&k_region, b"iam");
        let k_signing = hmac(&k_service, b"aws4_request");
        assert_eq!(
            hex(&k_signing),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }
}
