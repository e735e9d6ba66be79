//! Facts about this process and host for reports.

/// Peak resident set size of this process in bytes (VmHWM), if the OS tells.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Blocks below this size are kept for reuse by [`reuse_freed_memory`].
pub const REUSED_BELOW: usize = 32 << 20;

/// Keeps freed memory in the process for the next allocation instead of handing it back to
/// the kernel, for blocks under [`REUSED_BELOW`]. glibc maps every block over its (adaptive)
/// threshold afresh and the kernel zeroes each of its pages on first touch: a training step,
/// which frees and allocates the same tensors every step, spent about 15% of its time in page
/// faults. Larger blocks are still mapped afresh: kept on the heap, tensors of nnU-Net's scale
/// (256 MiB a first-level activation at 128^3) left it fragmented, 1 GiB more peak memory for a
/// step 16% shorter ([`super::alloc::KeepLarge`] keeps them whole instead). Returns whether the allocator took the setting (glibc on Linux only;
/// elsewhere nothing changes).
pub fn reuse_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets the allocator's parameters; called before other threads
        // allocate much, and glibc takes its own lock anyway.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, REUSED_BELOW as i32) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// This host's name, for naming temporary folders that other machines may see.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Whether a process with this id is alive on this host.
pub fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Human-readable byte count (binary units).
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Bytes free for an unprivileged writer on the filesystem holding `path` (`None` when the
/// system does not say).
pub fn free_bytes(path: &std::path::Path) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
        // SAFETY: `c` is a valid NUL-terminated path; `st` is plain data that statvfs fills.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
        (rc == 0).then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// What this process holds in memory right now (`/proc/self/status`, Linux), in bytes.
///
/// Anonymous memory (heap, stacks, decoded arrays) is what the OOM killer weighs and what no
/// one else can take back; file-backed pages (memory-mapped cache files, the binary) are page
/// cache the kernel reclaims under pressure and reads again. Our memory promises are on
/// anonymous memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// `RssAnon`: anonymous resident memory.
    pub anon: u64,
    /// `RssFile`: resident file-backed pages (mapped files, shared libraries).
    pub file: u64,
    /// `RssShmem`: resident shared memory (tmpfs, shared anonymous maps).
    pub shmem: u64,
}

impl MemoryUse {
    /// Now, or `None` where `/proc/self/status` does not say.
    pub fn now() -> Option<MemoryUse> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            let kb: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
            Some(kb * 1024)
        };
        Some(MemoryUse {
            anon: field("RssAnon:")?,
            file: field("RssFile:")?,
            shmem: field("RssShmem:").unwrap_or(0),
        })
    }

    /// "312.0 MiB anonymous, 1.2 GiB file-backed": how reports name a peak.
    pub fn describe(&self) -> String {
        format!(
            "{} anonymous, {} file-backed",
            human_bytes(self.anon),
            human_bytes(self.file)
        )
    }

    /// The larger of each field.
    pub fn max(self, o: MemoryUse) -> MemoryUse {
        MemoryUse {
            anon: self.anon.max(o.anon),
            file: self.file.max(o.file),
            shmem: self.shmem.max(o.shmem),
        }
    }
}

/// Peak [`MemoryUse`] of this process, sampled by a thread every few milliseconds from its
/// start until it is dropped (the kernel keeps a peak of the whole resident set, VmHWM, but
/// none of anonymous memory alone). A spike shorter than the interval can be missed: VmHWM
/// ([`peak_rss_bytes`]) stays the upper bound.
pub struct PeakMemory {
    state: std::sync::Arc<PeakState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct PeakState {
    stop: std::sync::atomic::AtomicBool,
    anon: std::sync::atomic::AtomicU64,
    file: std::sync::atomic::AtomicU64,
    shmem: std::sync::atomic::AtomicU64,
}

impl PeakState {
    fn note(&self, m: MemoryUse) {
        use std::sync::atomic::Ordering::Relaxed;
        self.anon.fetch_max(m.anon, Relaxed);
        self.file.fetch_max(m.file, Relaxed);
        self.shmem.fetch_max(m.shmem, Relaxed);
    }
}

/// How often [`PeakMemory`] samples: reading `/proc/self/status` costs tens of microseconds,
/// well under 0.1% of a core at this rate.
const PEAK_SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

impl PeakMemory {
    /// Start sampling (nothing is sampled where `/proc/self/status` cannot be read).
    pub fn start() -> PeakMemory {
        let state = std::sync::Arc::new(PeakState::default());
        let Some(first) = MemoryUse::now() else {
            return PeakMemory {
                state,
                thread: None,
            };
        };
        state.note(first);
        let s = state.clone();
        let thread = std::thread::Builder::new()
            .name("peak-memory".into())
            .spawn(move || {
                while !s.stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(m) = MemoryUse::now() {
                        s.note(m);
                    }
                    std::thread::sleep(PEAK_SAMPLE_EVERY);
                }
            })
            .ok();
        PeakMemory { state, thread }
    }

    /// The peaks so far (sampled once more now); `None` where nothing could be read.
    pub fn peak(&self) -> Option<MemoryUse> {
        use std::sync::atomic::Ordering::Relaxed;
        self.state.note(MemoryUse::now()?);
        Some(MemoryUse {
            anon: self.state.anon.load(Relaxed),
            file: self.state.file.load(Relaxed),
            shmem: self.state.shmem.load(Relaxed),
        })
    }
}

impl Drop for PeakMemory {
    fn drop(&mut self) {
        self.state
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The machine's memory (MemTotal), bytes.
pub fn total_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The memory this process may use: the smallest of the machine's memory, its control group's
/// limit and its address-space limit (`ulimit -v`); `None` when none is known.
pub fn memory_limit_bytes() -> Option<u64> {
    #[cfg(unix)]
    let address_space = {
        // SAFETY: getrlimit fills a plain struct.
        let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) };
        (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur as u64)
    };
    #[cfg(not(unix))]
    let address_space: Option<u64> = None;
    [total_memory_bytes(), cgroup_memory_limit(), address_space]
        .into_iter()
        .flatten()
        .min()
}

/// The memory limit of this process's control group, in bytes (cgroup v2 `memory.max`, or v1
/// `memory.limit_in_bytes`); `None` when there is none or it cannot be read. Such a limit
/// counts page cache: the kernel reclaims clean pages before it kills, but some schedulers
/// (Kubernetes evicts on the working set, which includes recently used file pages) act on it
/// first.
pub fn cgroup_memory_limit() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else {
            continue;
        };
        let v = std::fs::read_to_string(file).ok()?;
        // "max" (v2) or a huge page-aligned number (v1): no limit.
        return v.trim().parse::<u64>().ok().filter(|&b| b < 1 << 60);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_memory_sees_an_anonymous_allocation() {
        let Some(before) = MemoryUse::now() else {
            return; // not Linux
        };
        let peak = PeakMemory::start();
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let p = peak.peak().unwrap();
        drop(block);
        assert!(p.anon >= before.anon + (32 << 20), "{before:?} -> {p:?}");
        assert!(p.file > 0, "{p:?}");
    }
}
