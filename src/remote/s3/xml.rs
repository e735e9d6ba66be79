//! The little of S3's XML that the client reads: error codes, listings, upload ids. S3's
//! replies are flat and machine-written, so tags are found by text, and the five predefined
//! entities (plus numeric ones) are decoded.

/// The text of every `<tag>...</tag>` in `xml`, in order, decoded.
pub(super) fn all(xml: &str, tag: &str) -> Vec<String> {
    blocks(xml, tag).into_iter().map(decode).collect()
}

/// The first `<tag>...</tag>`'s text.
pub(super) fn first(xml: &str, tag: &str) -> Option<String> {
    all(xml, tag).into_iter().next()
}

/// The raw (undecoded) inside of every `<tag>...</tag>` block.
pub(super) fn blocks<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

fn decode(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(end) = tail.find(';') else {
            out.push_str(tail);
            return out;
        };
        let ent = &tail[1..end];
        let ch = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) => out.push(c),
            None => out.push_str(&tail[..=end]),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    out
}

/// `s` with XML's special characters escaped (for request bodies).
pub(super) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Seconds since 1970 of an ISO 8601 UTC time as S3 writes it (`2026-11-29T10:14:54.000Z`);
/// `None` when it is not one.
pub(super) fn unix_time(t: &str) -> Option<u64> {
    let t = t.trim();
    let num = |a: usize, b: usize| -> Option<i64> { t.get(a..b)?.parse().ok() };
    if t.get(4..5) != Some("-") || t.get(10..11) != Some("T") {
        return None;
    }
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, s) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Days from the civil date (proleptic Gregorian), with March as the year's first month.
    let (y, m) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + mi * 60 + s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_blocks_entities() {
        let x = "<R><Contents><Key>a&amp;b</Key><Size>3</Size></Contents>\
                 <Contents><Key>c&#x2F;d</Key><Size>4</Size></Contents><IsTruncated>false</IsTruncated></R>";
        let b = blocks(x, "Contents");
        assert_eq!(b.len(), 2);
        assert_eq!(first(b[0], "Key").unwrap(), "a&b");
        assert_eq!(first(b[1], "Key").unwrap(), "c/d");
        assert_eq!(all(x, "Size"), vec!["3", "4"]);
        assert_eq!(first(x, "IsTruncated").unwrap(), "false");
        assert_eq!(escape("\"a<b>&"), "&quot;a&lt;b&gt;&amp;");
    }

    #[test]
    fn s3_times_become_unix_seconds() {
        assert_eq!(unix_time("1970-01-01T00:00:00.000Z"), Some(0));
        // `date -u -d 2026-11-29T10:14:54Z +%s`
        assert_eq!(unix_time("2026-11-29T10:14:54.000Z"), Some(1_795_947_294));
        assert_eq!(unix_time("2000-02-29T23:59:59Z"), Some(951_868_799));
        assert_eq!(unix_time("yesterday"), None);
        assert_eq!(unix_time("2026-13-01T00:00:00Z"), None);
    }
}
