//! Entries built before a change are still found after it: the bundled data, built with the
//! flags of three shared fixtures, gives the content keys and voxel bytes recorded in
//! tests/golden/cache_keys.txt (made by the code before the training options and the
//! normalization schemes were retyped). A key that moves makes every user's cache miss; bytes
//! that move change what trains.

use std::path::Path;

use crate::common::fixtures::bundled_cache;

/// blake3 over an entry's chunk files (`ARRAY/c/...`), sorted by path: path, length, bytes.
fn digest(entry: &Path) -> String {
    let mut files = Vec::new();
    let mut stack = vec![entry.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p
                    .strip_prefix(entry)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                if rel.contains("/c/") || rel.starts_with("c/") {
                    files.push(rel);
                }
            }
        }
    }
    files.sort();
    let mut h = blake3::Hasher::new();
    for rel in files {
        let b = std::fs::read(entry.join(&rel)).unwrap();
        h.update(rel.as_bytes());
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(&b);
    }
    h.finalize().to_hex().to_string()
}

#[test]
fn entries_built_before_are_found_with_the_same_bytes() {
    let golden = include_str!("../golden/cache_keys.txt");
    let mut checked = 0;
    for (fixture, flags) in [
        ("default", &[][..]),
        ("derived", &["--derived", "distance,skeleton"][..]),
        ("coarse", &["--spacing", "2,2,3"][..]),
    ] {
        let cache = bundled_cache(fixture, flags);
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
        for line in golden
            .lines()
            .filter(|l| l.starts_with(&format!("{fixture} ")))
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (dataset, case, key, bytes) = (f[1], f[2], f[3], f[4]);
            let c = &manifest["datasets"][dataset]["cases"][case];
            assert_eq!(
                c["key"], key,
                "{fixture}: {dataset}/{case}'s content key moved: caches built before miss it"
            );
            let entry = cache.join(c["entry"].as_str().unwrap());
            assert_eq!(
                digest(&entry),
                bytes,
                "{fixture}: {dataset}/{case}'s arrays hold other bytes than before"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 30, "the golden file lists 30 entries");
}
