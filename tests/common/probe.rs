//! This process's memory use, from `/proc/self/status` (Linux; the memory tests run only
//! there). A probe that cannot read its value panics: a memory check must never pass because
//! it measured nothing.

/// A `/proc/self/status` field in KiB, e.g. `status_kib("VmRSS")`. Panics, naming the field,
/// when the file cannot be read or the field is missing, not in kB or not a number.
pub fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_else(|e| {
        panic!("memory probe: cannot read /proc/self/status for {field} (Linux procfs needed): {e}")
    });
    let prefix = format!("{field}:");
    let line = status
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("memory probe: no {field} line in /proc/self/status:\n{status}"));
    match line[prefix.len()..].split_whitespace().collect::<Vec<_>>()[..] {
        [v, "kB"] => v
            .parse()
            .unwrap_or_else(|e| panic!("memory probe: {field} is not a number in {line:?}: {e}")),
        _ => panic!("memory probe: {field} is not `<number> kB` in {line:?}"),
    }
}

/// Resident set size in KiB.
pub fn vm_rss_kib() -> u64 {
    status_kib("VmRSS")
}

/// Checks that the probe sees this process grow: 64 MiB touched (and freed again, straight back
/// to the system: an allocation this large is its own mapping) must show in VmRSS and RssAnon.
pub fn assert_probe_sees_an_allocation() {
    const MIB: usize = 64;
    let before = [vm_rss_kib(), status_kib("RssAnon")];
    let block = vec![1u8; MIB << 20]; // non-zero: every page is written
    std::hint::black_box(&block);
    let during = [vm_rss_kib(), status_kib("RssAnon")];
    drop(block);
    for (i, field) in ["VmRSS", "RssAnon"].iter().enumerate() {
        assert!(
            during[i] >= before[i] + (MIB as u64 * 1024) / 2,
            "memory probe: {field} went from {} KiB to {} KiB over a {MIB} MiB allocation",
            before[i],
            during[i]
        );
    }
}
