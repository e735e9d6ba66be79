//! Caches for the tests: the `prep` binary run on a data folder (with its JSON report or
//! checked for success), caches of the bundled data built once per test binary, and walking and
//! copying cache folders.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, PoisonError};

use voxcache::cache::reader::{CacheReader, EntryReader};
use voxcache::cache::PatchSource;

/// Run `prep` in `cwd` (the test's own when `None`), never under a failpoint left in the
/// environment.
pub fn prep_in(cwd: Option<&Path>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_prep"));
    c.args(args).env_remove("VOXCACHE_FAILPOINT");
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    c.output().expect("run prep")
}

/// Run `prep` with `args`.
pub fn prep(args: &[&str]) -> Output {
    prep_in(None, args)
}

/// Run one of the crate's binaries (`train`, `predict`, `evaluate`; `prep` as [`prep`] does)
/// with `args`.
pub fn run(name: &str, args: &[&str]) -> Output {
    let exe = match name {
        "train" => env!("CARGO_BIN_EXE_train"),
        "evaluate" => env!("CARGO_BIN_EXE_evaluate"),
        "predict" => env!("CARGO_BIN_EXE_predict"),
        "prep" => return prep(args),
        other => panic!("no binary {other:?}"),
    };
    Command::new(exe)
        .args(args)
        .output()
        .expect("run the binary")
}

/// A path as an argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// What a command wrote to stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Exit status, stdout and stderr of a command, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `prep build-cache DATA --cache-dir CACHE --json EXTRA...`: the output and the JSON report
/// (`Null` when stdout holds none, as after a usage error); success is not checked.
pub fn build_report(data: &Path, cache: &Path, extra: &[&str]) -> (Output, serde_json::Value) {
    let mut args = vec![
        "build-cache",
        data.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = prep(&args);
    let report = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out, report)
}

/// `prep build-cache DATA --cache-dir CACHE -q -j 2 EXTRA...`, which must succeed.
pub fn build(data: &Path, cache: &Path, extra: &[&str]) {
    let mut args = vec![
        "build-cache",
        data.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "-q",
        "-j",
        "2",
    ];
    args.extend_from_slice(extra);
    let o = prep(&args);
    assert!(
        o.status.success(),
        "prep build-cache {extra:?}: {}",
        text(&o)
    );
}

/// The bundled dataset (data/vessels).
pub fn bundled_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vessels")
}

/// A folder of this test process for fixtures kept in statics (built once, shared by the
/// binary's tests): `<target tmp>/fixtures/<pid>/<what>`, emptied first. Statics are never
/// dropped, so a `TempDir` held in one was never deleted: every run of a test binary left its
/// caches in the system's temporary folder (hundreds of MB each). Here each process removes
/// the folders of processes that are gone (where `/proc` tells), so at most one run's worth
/// stays, inside `target/`.
pub fn process_scratch(what: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fixtures");
    std::fs::create_dir_all(&root).unwrap();
    let me = std::process::id();
    if Path::new("/proc/self").exists() {
        for e in std::fs::read_dir(&root).unwrap().flatten() {
            let pid = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
            if let Some(pid) = pid.filter(|&p| p != me) {
                if !Path::new("/proc").join(pid.to_string()).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let dir = root.join(me.to_string()).join(what);
    // A folder left by an earlier process with the same pid is stale.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A cache of the bundled data built with `flags`, once per test binary and `name` (read-only
/// to tests). Asking for a name again with other flags is a bug in the test.
pub fn bundled_cache(name: &str, flags: &[&str]) -> &'static Path {
    struct Built {
        root: PathBuf,
        caches: Vec<(String, Vec<String>, &'static Path)>,
    }
    // One lock for all: tests that need a cache wait for it, and builds do not compete for the
    // cores. A build that failed poisons nothing: the next test tries again.
    static BUILT: Mutex<Option<Built>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(PoisonError::into_inner);
    let built = built.get_or_insert_with(|| Built {
        root: process_scratch("bundled-caches"),
        caches: Vec::new(),
    });
    if let Some((_, had, dir)) = built.caches.iter().find(|(n, ..)| n == name) {
        assert!(
            had.iter().map(String::as_str).eq(flags.iter().copied()),
            "bundled cache {name:?} asked for with flags {flags:?}, built with {had:?}"
        );
        return dir;
    }
    let dir: &'static Path = Box::leak(built.root.join(name).into_boxed_path());
    build(&bundled_data(), dir, flags);
    let flags = flags.iter().map(|f| f.to_string()).collect();
    built.caches.push((name.to_string(), flags, dir));
    dir
}

/// The entry folders of a cache (`entries/<shard>/<key>`), sorted; none when it has no
/// `entries` folder.
pub fn entry_dirs(cache: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(cache.join("entries")) {
        for shard in rd.flatten() {
            for e in std::fs::read_dir(shard.path()).unwrap().flatten() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Every case of the reader's first dataset, opened.
pub fn open_entries(reader: &CacheReader) -> Vec<EntryReader> {
    let ds = reader.datasets()[0].to_string();
    reader
        .cases(&ds)
        .unwrap()
        .iter()
        .map(|c| reader.open_entry(&ds, &c.case_id).unwrap())
        .collect()
}

/// Copy a folder tree.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        let dest = to.join(e.file_name());
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// Bit patterns, so that values compare exactly (NaN and -0.0 included).
pub fn bits(v: impl IntoIterator<Item = f64>) -> Vec<u64> {
    v.into_iter().map(f64::to_bits).collect()
}

/// Every file under `dir` (recursively), sorted; none when `dir` does not exist.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// An entry whose arrays are read only in whole boxes (the default
/// [`PatchSource::read_spans`]), derived arrays included: the reference for span reads.
pub struct WholeBoxes<'a>(pub &'a EntryReader);

impl PatchSource for WholeBoxes<'_> {
    fn name(&self) -> String {
        self.0.name()
    }
    fn shape_zyx(&self) -> [usize; 3] {
        self.0.shape_zyx()
    }
    fn channels(&self) -> usize {
        PatchSource::channels(self.0)
    }
    fn has_label(&self) -> bool {
        PatchSource::has_label(self.0)
    }
    fn classes(&self) -> Vec<u16> {
        self.0.classes()
    }
    fn fg_coords(&self, class: u16) -> voxcache::error::Result<Vec<[u32; 3]>> {
        self.0.fg_coords(class)
    }
    fn read_image(
        &self,
        s: [i64; 3],
        n: [usize; 3],
        out: &mut [f32],
    ) -> voxcache::error::Result<()> {
        PatchSource::read_image(self.0, s, n, out)
    }
    fn read_label(
        &self,
        s: [i64; 3],
        n: [usize; 3],
        out: &mut [u16],
    ) -> voxcache::error::Result<()> {
        PatchSource::read_label(self.0, s, n, out)
    }
    fn has_distance(&self) -> bool {
        self.0.has_distance()
    }
    fn has_skeleton(&self) -> bool {
        self.0.has_skeleton()
    }
    fn read_distance(
        &self,
        class: u16,
        s: [i64; 3],
        n: [usize; 3],
        out: &mut [f32],
    ) -> voxcache::error::Result<()> {
        PatchSource::read_distance(self.0, class, s, n, out)
    }
    fn read_skeleton(
        &self,
        s: [i64; 3],
        n: [usize; 3],
        out: &mut [u16],
    ) -> voxcache::error::Result<()> {
        PatchSource::read_skeleton(self.0, s, n, out)
    }
}

/// In the entry folder `entry`, the foreground index's first row written again over its
/// second (an unsorted, repeated row). Returns the chunk file and its bytes before.
pub fn repeat_first_fg_row(entry: &Path) -> (PathBuf, Vec<u8>) {
    let chunk = files_under(&entry.join("fg"))
        .into_iter()
        .find(|p| p.is_file() && !p.ends_with("zarr.json"))
        .expect("an fg chunk");
    let rows = std::fs::read(&chunk).unwrap();
    assert!(rows.len() >= 32, "the test needs two rows");
    let mut dup = rows.clone();
    dup.copy_within(0..16, 16);
    std::fs::write(&chunk, &dup).unwrap();
    (chunk, rows)
}
