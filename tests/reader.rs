//! The patch reader against zarrs' own reads of the same caches: plain, sharded, compressed and
//! float16 layouts, boxes inside a chunk, across chunk and shard borders and past the volume's
//! edge; foreground coordinates; flat memory; bad input.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixtures::{
    bits, build, bundled_cache, copy_tree, entry_dirs, files_under, open_entries,
    repeat_first_fg_row, WholeBoxes,
};
use common::probe::{assert_probe_sees_an_allocation, status_kib, vm_rss_kib};
use common::Lcg;
use voxcache::cache::reader::{
    ArrayKind, CacheReader, EntryReader, ReaderOptions, Region, StoredDtype, NO_MIRROR,
};
use voxcache::geometry::mirror;
use voxcache::train::spatial::{Transform, TransformedReader};

const CHUNK: &str = "4,16,16";
const SHARD: &str = "8,32,32";

/// The cache layouts under test: name and build flags.
const LAYOUTS: &[(&str, &[&str])] = &[
    ("plain", &["--chunk", CHUNK]),
    ("sharded", &["--chunk", CHUNK, "--shard", SHARD]),
    ("zstd", &["--chunk", CHUNK, "--compression", "zstd"]),
    (
        "sharded-zstd",
        &["--chunk", CHUNK, "--shard", SHARD, "--compression", "zstd"],
    ),
    ("f16", &["--chunk", CHUNK, "--image-dtype", "float16"]),
    // The packed layout (float16, Blosc-LZ4 inner chunks with CRC-32C, in shards), small.
    (
        "packed",
        &["--layout", "packed", "--chunk", CHUNK, "--shard", SHARD],
    ),
    (
        "f16-sharded",
        &[
            "--chunk",
            CHUNK,
            "--shard",
            SHARD,
            "--image-dtype",
            "float16",
        ],
    ),
];

/// The cache of the bundled data in a layout of [`LAYOUTS`], built once per test run
/// (read-only to tests).
fn cache(name: &str) -> &'static Path {
    let (_, flags) = LAYOUTS.iter().find(|(n, _)| *n == name).unwrap();
    bundled_cache(name, flags)
}

/// Read the box with the reader and with zarrs; image and label must agree exactly.
fn check_box(e: &EntryReader, start: [i64; 3], size: [usize; 3]) {
    let n: usize = size.iter().product();
    let mut img = vec![f32::NAN; n];
    let mut lab = vec![u16::MAX; n];
    e.read_patch(start, size, &mut img, Some(&mut lab))
        .unwrap_or_else(|err| panic!("{start:?} {size:?}: {err}"));
    let want_img = common::zarrs_box(e.dir(), "image", start, size);
    let want_lab = common::zarrs_box(e.dir(), "label", start, size);
    assert!(
        bits(img.iter().map(|&v| v as f64)) == bits(want_img),
        "image differs at {start:?} {size:?} in {}",
        e.dir().display()
    );
    assert!(
        bits(lab.iter().map(|&v| v as f64)) == bits(want_lab),
        "label differs at {start:?} {size:?} in {}",
        e.dir().display()
    );
    // Part of each row (random spans, some rows empty, some whole): those parts as read
    // above; the rest untouched, or 0 where the box reaches outside the volume (zeroed
    // first).
    let mut rng = Lcg(start.iter().fold(size[2] as u64, |h, &v| {
        h.wrapping_mul(31).wrapping_add(v as u64)
    }));
    let spans: Vec<(u32, u32)> = (0..size[1])
        .map(|_| match rng.below(4) {
            0 => (0, 0),
            1 => (0, size[2] as u32),
            _ => {
                let a = rng.below(size[2] as u64) as u32;
                (a, a + 1 + rng.below(size[2] as u64 - a as u64) as u32)
            }
        })
        .collect();
    let (mut span_i, mut span_l) = (vec![-7.5f32; n], vec![777u16; n]);
    let region = Region::new(start, size).with_spans(&spans);
    e.read(ArrayKind::Image, region, NO_MIRROR, &mut span_i)
        .unwrap();
    e.read(ArrayKind::Label, region, NO_MIRROR, &mut span_l)
        .unwrap();
    for (i, (&got_i, &got_l)) in span_i.iter().zip(&span_l).enumerate() {
        let (y, x) = ((i / size[2]) % size[1], (i % size[2]) as u32);
        let (a, b) = spans[y];
        if (a..b).contains(&x) {
            assert!(
                got_i.to_bits() == img[i].to_bits() && got_l == lab[i],
                "span read at {i} of {start:?} {size:?}"
            );
        } else {
            assert!(got_i == -7.5 || got_i == 0.0, "outside the spans at {i}");
            assert!(got_l == 777 || got_l == 0, "outside the spans at {i}");
        }
    }
    // A span for each row of the box (each plane its own): the same, row by row.
    let plane_spans: Vec<(u32, u32)> = (0..size[0] * size[1])
        .map(|_| match rng.below(3) {
            0 => (0, 0),
            _ => {
                let a = rng.below(size[2] as u64) as u32;
                (a, a + 1 + rng.below(size[2] as u64 - a as u64) as u32)
            }
        })
        .collect();
    let (mut span_i, mut span_l) = (vec![-7.5f32; n], vec![777u16; n]);
    let region = Region::new(start, size).with_spans(&plane_spans);
    e.read(ArrayKind::Image, region, NO_MIRROR, &mut span_i)
        .unwrap();
    e.read(ArrayKind::Label, region, NO_MIRROR, &mut span_l)
        .unwrap();
    for (i, (&got_i, &got_l)) in span_i.iter().zip(&span_l).enumerate() {
        let (a, b) = plane_spans[i / size[2]];
        if (a..b).contains(&((i % size[2]) as u32)) {
            assert!(
                got_i.to_bits() == img[i].to_bits() && got_l == lab[i],
                "plane span read at {i} of {start:?} {size:?}"
            );
        } else {
            assert!(
                got_i == -7.5 || got_i == 0.0,
                "outside the plane spans at {i}"
            );
            assert!(got_l == 777 || got_l == 0, "outside the plane spans at {i}");
        }
    }
    // Spans of neither count are refused.
    let mut extra = plane_spans.clone();
    extra.push((0, 1));
    let region = Region::new(start, size).with_spans(&extra);
    assert!(e
        .read(ArrayKind::Image, region, NO_MIRROR, &mut vec![0f32; n])
        .is_err());
    // Mirrored on read: the same voxels as reading, then mirroring.
    for m in 1..8u8 {
        let flips = [m & 4 != 0, m & 2 != 0, m & 1 != 0];
        let (mut want_i, mut want_l) = (img.clone(), lab.clone());
        mirror(&mut want_i, size, flips);
        mirror(&mut want_l, size, flips);
        let (mut got_i, mut got_l) = (vec![f32::NAN; n], vec![u16::MAX; n]);
        e.read_patch_mirrored(start, size, flips, &mut got_i, Some(&mut got_l))
            .unwrap();
        let same = bits(got_i.iter().map(|&v| v as f64)) == bits(want_i.iter().map(|&v| v as f64));
        assert!(
            same && got_l == want_l,
            "mirrored {flips:?} at {start:?} {size:?}"
        );
    }
}

/// Boxes that matter: inside one chunk, across chunk and shard borders, past every edge,
/// larger than the volume, wholly outside; then random ones.
fn check_entry(e: &EntryReader, shard_chunks: usize, seed: u64) {
    let s = e.shape_zyx().map(|v| v as i64);
    let c = e.chunk_zyx().map(|v| v as i64);
    let sc = c.map(|v| v * shard_chunks as i64);
    let fixed: Vec<([i64; 3], [usize; 3])> = vec![
        ([0, 1, 1], [(c[0] as usize).min(2), 3, 4]),
        ([0, 0, 0], c.map(|v| v as usize)),
        ([c[0] - 1, c[1] - 2, c[2] - 3], [2, 5, 7]),
        ([sc[0] - 1, sc[1] - 3, sc[2] - 2], [3, 6, 5]),
        ([-3, -5, -7], [(s[0] / 2 + 3) as usize, 10, 12]),
        ([s[0] - 2, s[1] - 5, s[2] - 4], [6, 12, 12]),
        (
            [-2, -3, -4],
            [
                (s[0] + 5) as usize,
                (s[1] + 7) as usize,
                (s[2] + 9) as usize,
            ],
        ),
        ([s[0] + 1, 0, 0], [2, 2, 2]),
        ([-10, -10, -10], [3, 3, 3]),
        ([0, 0, s[2] - 1], [1, 1, 1]),
    ];
    for (start, size) in fixed {
        check_box(e, start, size);
    }
    let mut rng = Lcg(seed);
    for _ in 0..60 {
        let size = [0, 1, 2].map(|a| 1 + rng.below(2 * c[a] as u64 + 2) as usize);
        let start = [0, 1, 2].map(|a| rng.range(-(size[a] as i64) - 1, s[a] + 1));
        check_box(e, start, size);
    }
}

#[test]
fn patches_equal_zarrs_reads_in_every_layout() {
    for (name, _) in LAYOUTS {
        let reader = CacheReader::open(cache(name)).unwrap();
        let mapped = !name.contains("zstd") && *name != "packed";
        let shard_chunks = if name.contains("shard") || *name == "packed" {
            2
        } else {
            1
        };
        let es = open_entries(&reader);
        assert!(es.len() >= 5, "{name}: {} entries", es.len());
        for (i, e) in es.iter().enumerate() {
            assert_eq!(e.is_mapped(), mapped, "{name}");
            let want = if name.starts_with("f16") || *name == "packed" {
                StoredDtype::Float16
            } else {
                StoredDtype::Float32
            };
            assert_eq!(e.image_dtype(), want);
            assert_eq!(e.label_dtype(), Some(StoredDtype::Uint8));
            check_entry(e, shard_chunks, i as u64 + 1);
        }
    }
}

/// The same cases in the raw and packed layouts read as the same patches: labels bit for bit,
/// images to the float16 value nearest the float32 one (the rounding the build does).
#[test]
fn packed_patches_are_the_raw_ones_rounded_to_float16() {
    let raw = CacheReader::open(cache("plain")).unwrap();
    let packed = CacheReader::open(cache("packed")).unwrap();
    let (a, b) = (open_entries(&raw), open_entries(&packed));
    assert_eq!(a.len(), b.len());
    let mut rng = Lcg(77);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.shape_zyx(), y.shape_zyx());
        let s = x.shape_zyx().map(|v| v as i64);
        for _ in 0..20 {
            let size = [
                1 + rng.below(9) as usize,
                1 + rng.below(40) as usize,
                1 + rng.below(40) as usize,
            ];
            let start = [0, 1, 2].map(|k| rng.range(-4, s[k]));
            let n: usize = size.iter().product();
            let (mut ia, mut la) = (vec![0f32; n], vec![0u16; n]);
            let (mut ib, mut lb) = (vec![0f32; n], vec![0u16; n]);
            let mirror = [rng.below(2) == 1, rng.below(2) == 1, rng.below(2) == 1];
            x.read_patch_mirrored(start, size, mirror, &mut ia, Some(&mut la))
                .unwrap();
            y.read_patch_mirrored(start, size, mirror, &mut ib, Some(&mut lb))
                .unwrap();
            assert_eq!(la, lb, "{:?} at {start:?}", y.dir());
            for (i, (&f, &h)) in ia.iter().zip(&ib).enumerate() {
                assert_eq!(
                    half::f16::from_f32(f).to_f32().to_bits(),
                    h.to_bits(),
                    "{:?} voxel {i} of the box at {start:?}: {f} vs {h}",
                    y.dir()
                );
            }
        }
    }
}

#[test]
fn zarrs_decoded_path_matches_on_uncompressed_caches_and_under_eviction() {
    for name in ["plain", "sharded"] {
        // Room for about two chunks only: constant eviction.
        let opts = ReaderOptions {
            mmap: false,
            decoded_cache_bytes: 2 * 4 * 13 * 14 * 4,
            ..ReaderOptions::default()
        };
        let reader = CacheReader::open_with(cache(name), opts).unwrap();
        for (i, e) in open_entries(&reader).iter().take(3).enumerate() {
            assert!(!e.is_mapped());
            check_entry(e, if name == "sharded" { 2 } else { 1 }, 100 + i as u64);
        }
        let st = reader.chunk_cache().stats();
        assert!(st.decoded_bytes <= 2 * 4 * 13 * 14 * 4, "{st:?}");
        assert_eq!(st.mapped_files, 0);
    }
    // Few maps allowed: files are unmapped and mapped again.
    let opts = ReaderOptions {
        max_maps: 2,
        ..ReaderOptions::default()
    };
    let reader = CacheReader::open_with(cache("sharded"), opts).unwrap();
    for (i, e) in open_entries(&reader).iter().take(3).enumerate() {
        check_entry(e, 2, 200 + i as u64);
    }
    assert!(reader.chunk_cache().stats().mapped_files <= 2);
}

#[test]
fn uint16_labels_and_label_buffers() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ds");
    std::fs::create_dir_all(data.join("imagesTr")).unwrap();
    std::fs::create_dir_all(data.join("labelsTr")).unwrap();
    let shape = [21usize, 19, 7];
    let n = shape.iter().product::<usize>();
    let img: Vec<i16> = (0..n).map(|i| (i % 97) as i16).collect();
    let lab: Vec<u16> = (0..n)
        .map(|i| match i % 11 {
            0 => 300,
            1 | 2 => 2,
            _ => 0,
        })
        .collect();
    common::Nii::new(shape, [1.0, 1.0, 1.0], &img, false)
        .write(&data.join("imagesTr/u_0000.nii.gz"));
    common::Nii::new(shape, [1.0, 1.0, 1.0], &lab, false).write(&data.join("labelsTr/u.nii.gz"));
    for (flags, shard_chunks) in [
        (&["--chunk", "3,8,8", "--spacing", "1,1,1"][..], 1),
        (
            &[
                "--chunk",
                "3,8,8",
                "--shard",
                "6,16,16",
                "--spacing",
                "1,1,1",
            ],
            2,
        ),
    ] {
        let dir = t.path().join(format!("c{shard_chunks}"));
        build(&data, &dir, flags);
        let reader = CacheReader::open(&dir).unwrap();
        let e = reader.open_entry("ds", "u").unwrap();
        assert_eq!(e.label_dtype(), Some(StoredDtype::Uint16));
        assert_eq!(e.classes(), vec![2, 300]);
        check_entry(&e, shard_chunks, 7);
        // u8 cannot hold uint16 labels: a clear error, not truncation.
        let mut small = vec![0u8; 8];
        let err = e.read_label([0, 0, 0], [2, 2, 2], &mut small).unwrap_err();
        assert!(err.to_string().contains("uint16"), "{err}");
        for class in e.classes() {
            let pts = e.fg_coords(class).unwrap();
            assert!(!pts.is_empty());
            for p in pts.iter().take(50) {
                let v = common::zarrs_box(e.dir(), "label", p.map(|v| v as i64), [1, 1, 1]);
                assert_eq!(v, vec![class as f64]);
            }
        }
    }
    // uint8 labels read into u8 too.
    let reader = CacheReader::open(cache("plain")).unwrap();
    let e = &open_entries(&reader)[0];
    let (mut a, mut b) = (vec![0u8; 512], vec![0u16; 512]);
    e.read_label([1, 2, 3], [8, 8, 8], &mut a).unwrap();
    e.read_label([1, 2, 3], [8, 8, 8], &mut b).unwrap();
    assert!(a.iter().zip(&b).all(|(&x, &y)| x as u16 == y));
}

#[test]
fn fg_coordinates_point_at_their_class() {
    for name in ["plain", "sharded-zstd"] {
        let reader = CacheReader::open(cache(name)).unwrap();
        let mut total = 0;
        for e in open_entries(&reader) {
            for class in e.classes() {
                let pts = e.fg_coords(class).unwrap();
                assert!(!pts.is_empty());
                for p in &pts {
                    let start = p.map(|v| v as i64);
                    let mut lab = [0u16; 1];
                    e.read_label(start, [1, 1, 1], &mut lab).unwrap();
                    assert_eq!(lab[0], class, "{name} {p:?}");
                    total += 1;
                }
                for p in pts.iter().step_by(97) {
                    let v = common::zarrs_box(e.dir(), "label", p.map(|v| v as i64), [1, 1, 1]);
                    assert_eq!(v, vec![class as f64]);
                }
            }
            assert!(e.fg_coords(77).unwrap().is_empty());
        }
        assert!(total > 100, "{name}: {total} foreground samples");
    }
}

#[test]
fn threads_share_one_reader() {
    let reader = CacheReader::open(cache("sharded")).unwrap();
    let es = open_entries(&reader);
    let size = [4usize, 12, 12];
    let n = size.iter().product::<usize>();
    let boxes: Vec<(usize, [i64; 3])> = {
        let mut rng = Lcg(5);
        (0..400)
            .map(|_| {
                let i = rng.below(es.len() as u64) as usize;
                let s = es[i].shape_zyx();
                (i, [0, 1, 2].map(|a| rng.range(-3, s[a] as i64)))
            })
            .collect()
    };
    let read = |i: usize, start: [i64; 3]| {
        let mut img = vec![0.0f32; n];
        es[i].read_patch(start, size, &mut img, None).unwrap();
        img
    };
    let want: Vec<Vec<f32>> = boxes.iter().map(|&(i, s)| read(i, s)).collect();
    std::thread::scope(|sc| {
        for t in 0..4 {
            let (boxes, want, read) = (&boxes, &want, &read);
            sc.spawn(move || {
                for k in (t..boxes.len()).step_by(4) {
                    let (i, s) = boxes[k];
                    assert_eq!(read(i, s), want[k]);
                }
            });
        }
    });
}

#[test]
fn mapped_pages_are_handed_back_oldest_first_within_the_limit() {
    let size = [8usize, 24, 24];
    let n = size.iter().product::<usize>();
    let (mut img, mut lab) = (vec![0.0f32; n], vec![0u16; n]);
    for name in ["plain", "sharded"] {
        let limit = 1u64 << 20;
        let opts = ReaderOptions {
            mapped_resident_bytes: Some(limit),
            ..ReaderOptions::default()
        };
        let reader = CacheReader::open_with(cache(name), opts).unwrap();
        let es = open_entries(&reader);
        let resident = || reader.chunk_cache().mapped_resident_bytes();
        // A patch read twice: the second read brings nothing new in.
        es[0]
            .read_patch([0, 0, 0], size, &mut img, Some(&mut lab))
            .unwrap();
        let once = resident();
        assert!(once > 0, "{name}");
        es[0]
            .read_patch([0, 0, 0], size, &mut img, Some(&mut lab))
            .unwrap();
        assert_eq!(resident(), once, "{name}");
        // Many patches over every entry: the count passes the limit and is held near it
        // (checked every sixteenth of it; one patch of these small chunks adds well under 1 MiB).
        let mut rng = Lcg(3);
        let mut peak = 0;
        for _ in 0..3000 {
            let e = &es[rng.below(es.len() as u64) as usize];
            let s = e.shape_zyx();
            let start = [0, 1, 2].map(|a| rng.range(-4, s[a] as i64));
            e.read_patch(start, size, &mut img, Some(&mut lab)).unwrap();
            peak = peak.max(resident());
            assert!(
                resident() <= limit + limit / 16 + (1 << 20),
                "{name}: {}",
                resident()
            );
        }
        assert!(
            peak > limit,
            "{name}: the reads never reached the limit ({peak})"
        );
    }
}

/// The caches the RSS probe reads, passed to its own process.
const RSS_CACHES_ENV: &str = "VOXCACHE_TEST_RSS_CACHES";

#[test]
fn memory_stays_flat_over_many_patches() {
    // Other tests of this binary allocate in parallel threads, which would show in this
    // process's RSS: measure in a process of its own.
    let dirs: Vec<String> = ["plain", "sharded-zstd"]
        .iter()
        .map(|n| cache(n).display().to_string())
        .collect();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["rss_probe", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(RSS_CACHES_ENV, dirs.join("\n"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the probe did not run: {text}");
}

#[test]
#[ignore = "run in its own process by memory_stays_flat_over_many_patches"]
fn rss_probe() {
    assert_probe_sees_an_allocation();
    let dirs: Vec<PathBuf> = match std::env::var(RSS_CACHES_ENV) {
        Ok(v) => v.lines().map(PathBuf::from).collect(),
        Err(_) => vec![cache("plain").into(), cache("sharded-zstd").into()],
    };
    let size = [8usize, 24, 24];
    let n = size.iter().product::<usize>();
    let mut img = vec![0.0f32; n];
    let mut lab = vec![0u16; n];
    for dir in dirs {
        let opts = ReaderOptions {
            decoded_cache_bytes: 1 << 20,
            ..ReaderOptions::default()
        };
        let reader = CacheReader::open_with(&dir, opts).unwrap();
        let es = open_entries(&reader);
        let mut rng = Lcg(11);
        let mut run = |count: usize| {
            for _ in 0..count {
                let e = &es[rng.below(es.len() as u64) as usize];
                let s = e.shape_zyx();
                let start = [0, 1, 2].map(|a| rng.range(-4, s[a] as i64));
                e.read_patch(start, size, &mut img, Some(&mut lab)).unwrap();
            }
        };
        run(500);
        // Anonymous memory is the promise; mapped pages are page cache, left to the kernel.
        let (before, rss0) = (status_kib("RssAnon"), vm_rss_kib());
        run(10_000);
        let (after, rss1) = (status_kib("RssAnon"), vm_rss_kib());
        println!(
            "{}: RssAnon {before} KiB -> {after} KiB (VmRSS {rss0} -> {rss1}) over 10,000 patches",
            dir.display()
        );
        assert!(
            after <= before + 16 * 1024,
            "{}: RssAnon grew from {before} KiB to {after} KiB over 10,000 patches",
            dir.display()
        );
        assert!(reader.chunk_cache().stats().decoded_bytes <= 1 << 20);
    }
}

/// A private copy of the first entry of a layout, to damage.
fn entry_copy(layout: &str, into: &Path) -> PathBuf {
    let reader = CacheReader::open(cache(layout)).unwrap();
    let ds = reader.datasets()[0].to_string();
    let case = reader.cases(&ds).unwrap().remove(0);
    let dest = into.join(layout);
    copy_tree(&case.entry_dir, &dest);
    dest
}

fn truncate(path: &Path, keep: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(keep).unwrap();
}

#[test]
fn truncated_chunks_are_errors_naming_the_file() {
    let t = tempfile::tempdir().unwrap();
    for layout in ["plain", "sharded", "zstd", "sharded-zstd", "packed"] {
        let entry = entry_copy(layout, t.path());
        let file = entry.join("image/c/0/0/0/0");
        let len = std::fs::metadata(&file).unwrap().len();
        truncate(&file, len / 2);
        let e = EntryReader::open(&entry).unwrap();
        let mut img = vec![0.0f32; 2 * 3 * 3];
        let err = e
            .read_patch([0, 0, 0], [2, 3, 3], &mut img, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&file.display().to_string()),
            "{layout}: error does not name {}: {err}",
            file.display()
        );
        // The rest of the entry still reads (the label is intact).
        let mut lab = vec![0u16; 8];
        e.read_label([0, 0, 0], [2, 2, 2], &mut lab).unwrap();
    }
    // An empty chunk file.
    let entry = entry_copy("plain", &t.path().join("empty"));
    let file = entry.join("image/c/0/0/0/0");
    truncate(&file, 0);
    let e = EntryReader::open(&entry).unwrap();
    let mut img = vec![0.0f32; 8];
    let err = e.read_image([0, 0, 0], [2, 2, 2], &mut img).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn a_corrupt_shard_index_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let entry = entry_copy("sharded", t.path());
    let file = entry.join("image/c/0/0/0/0");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n - 20] ^= 0x40; // inside the last index entry
    std::fs::write(&file, &bytes).unwrap();
    let e = EntryReader::open(&entry).unwrap();
    let mut img = vec![0.0f32; 8];
    let err = e
        .read_patch([0, 0, 0], [2, 2, 2], &mut img, None)
        .unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    assert!(err.to_string().contains(&file.display().to_string()));
}

#[test]
fn missing_and_foreign_caches_and_entries() {
    let t = tempfile::tempdir().unwrap();
    let err = |r: voxcache::Result<CacheReader>| r.unwrap_err().to_string();

    let nowhere = t.path().join("nowhere");
    assert!(err(CacheReader::open(&nowhere)).contains("not found"));
    std::fs::create_dir_all(t.path().join("empty")).unwrap();
    assert!(err(CacheReader::open(t.path().join("empty"))).contains("not a voxcache cache"));

    let foreign = t.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("manifest.json"), r#"{"hello": "world"}"#).unwrap();
    assert!(err(CacheReader::open(&foreign)).contains("not a voxcache manifest"));
    std::fs::write(foreign.join("manifest.json"), "[1, 2").unwrap();
    assert!(err(CacheReader::open(&foreign)).contains("not a voxcache manifest"));

    let old = t.path().join("old");
    std::fs::create_dir_all(&old).unwrap();
    let text = std::fs::read_to_string(cache("plain").join("manifest.json")).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
    m["format_version"] = 99.into();
    std::fs::write(old.join("manifest.json"), m.to_string()).unwrap();
    let msg = err(CacheReader::open(&old));
    assert!(msg.contains("version 99"), "{msg}");
    // A cache of the previous format gets one sentence that says what to do.
    m["format_version"] = 1.into();
    std::fs::write(old.join("manifest.json"), m.to_string()).unwrap();
    let msg = err(CacheReader::open(&old));
    assert!(
        msg.contains("format version 1") && msg.contains("rebuild the cache"),
        "{msg}"
    );

    // A manifest whose entry folder is gone.
    let ds = m["datasets"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    m["format_version"] = voxcache::format::FORMAT_VERSION.into();
    std::fs::write(old.join("manifest.json"), m.to_string()).unwrap();
    let reader = CacheReader::open(&old).unwrap();
    let case = reader.cases(&ds).unwrap().remove(0);
    let e = reader
        .open_entry(&ds, &case.case_id)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&case.entry_dir.display().to_string()) && e.contains("not found"),
        "{e}"
    );
    assert!(reader.open_entry(&ds, "no-such-case").is_err());
    assert!(reader.open_entry("no-such-dataset", &case.case_id).is_err());

    // An entry folder without its group metadata (an unfinished build).
    let half = t.path().join("half");
    std::fs::create_dir_all(half.join("image")).unwrap();
    let e = EntryReader::open(&half).unwrap_err().to_string();
    assert!(e.contains("no zarr.json"), "{e}");

    // A wrong buffer size or a label read on a buffer of the wrong length.
    let reader = CacheReader::open(cache("plain")).unwrap();
    let e = &open_entries(&reader)[0];
    let mut img = vec![0.0f32; 7];
    assert!(e.read_patch([0, 0, 0], [2, 2, 2], &mut img, None).is_err());
    let mut img = vec![0.0f32; 8];
    let mut lab = vec![0u16; 9];
    assert!(e
        .read_patch([0, 0, 0], [2, 2, 2], &mut img, Some(&mut lab))
        .is_err());
    // Extreme coordinates are handled, not overflowed.
    e.read_patch([i64::MIN, i64::MAX, 0], [2, 2, 2], &mut img, None)
        .unwrap();
    assert!(img.iter().all(|&v| v == 0.0));
}

/// The chunk files of an entry's array, sorted.
fn chunk_files(entry: &Path, array: &str) -> Vec<PathBuf> {
    files_under(&entry.join(array).join("c"))
}

/// Read every box of a whole entry; the first error, if any.
fn read_all(e: &EntryReader) -> Result<(), String> {
    let s = e.shape_zyx();
    let n: usize = s.iter().product();
    let (mut img, mut lab) = (vec![0f32; n], vec![0u16; n]);
    e.read_patch([0, 0, 0], s, &mut img, Some(&mut lab))
        .map_err(|err| err.to_string())
}

/// A copy of the layout's cache that a test may damage, opened; the folder lasts as long as
/// the guard returned with it.
fn cache_copy(layout: &str) -> (tempfile::TempDir, CacheReader) {
    let t = tempfile::tempdir().unwrap();
    let copy = t.path().join("cache");
    copy_tree(cache(layout), &copy);
    let reader = CacheReader::open(&copy).unwrap();
    (t, reader)
}

/// The entry with the most voxels.
fn largest(entries: &[EntryReader]) -> &EntryReader {
    entries
        .iter()
        .max_by_key(|e| e.shape_zyx().iter().product::<usize>())
        .unwrap()
}

#[test]
fn a_chunk_that_differs_from_the_build_or_is_gone_is_refused_not_read() {
    // Plain chunk files and shards (both memory-mapped), compressed chunks and compressed
    // shards (decoded).
    for layout in ["plain", "sharded", "zstd", "sharded-zstd", "packed"] {
        let (t, reader) = cache_copy(layout);
        let entries = open_entries(&reader);
        let e = largest(&entries);
        let dir = e.dir().to_path_buf();
        assert!(read_all(e).is_ok());
        // A flipped byte in an image chunk.
        let chunk = chunk_files(&dir, "image")[0].clone();
        let good = std::fs::read(&chunk).unwrap();
        let mut bad = good.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0x40;
        std::fs::write(&chunk, &bad).unwrap();
        let fresh = || EntryReader::open(&dir).unwrap();
        let err = read_all(&fresh()).unwrap_err();
        assert!(
            err.contains(&chunk.display().to_string())
                && (err.contains("hash") || err.contains("decode") || err.contains("zarr")),
            "{layout}: {err}"
        );
        std::fs::write(&chunk, &good).unwrap();
        assert!(read_all(&fresh()).is_ok(), "{layout}: restored");
        // A label chunk that held foreground, deleted: not read as background.
        let labels = chunk_files(&dir, "label");
        let gone = labels
            .iter()
            .find(|p| std::fs::read(p).unwrap().iter().any(|&b| b != 0) || layout == "zstd")
            .unwrap()
            .clone();
        let kept = std::fs::read(&gone).unwrap();
        std::fs::remove_file(&gone).unwrap();
        let err = read_all(&fresh()).unwrap_err();
        assert!(err.contains("missing"), "{layout}: {err}");
        std::fs::write(&gone, &kept).unwrap();
        // A chunk replaced by a link to a copy outside the cache.
        let outside = t.path().join("outside");
        std::fs::copy(&chunk, &outside).unwrap();
        std::fs::remove_file(&chunk).unwrap();
        std::os::unix::fs::symlink(&outside, &chunk).unwrap();
        let err = read_all(&fresh()).unwrap_err();
        assert!(err.contains("symbolic link"), "{layout}: {err}");
    }
}

/// A mapped image chunk overwritten in place after its hash was checked (a file changed under a
/// running job): the next read that copies its values fails, naming the entry and the
/// non-finite value, straight and rotated (the box's spans), rather than serving NaN.
#[test]
fn an_image_chunk_changed_in_place_to_nan_fails_the_next_read() {
    for layout in ["plain", "sharded", "f16"] {
        let (_t, reader) = cache_copy(layout);
        let entries = open_entries(&reader);
        let e = largest(&entries);
        // The first chunk's box, mapped and its hash checked (a whole entry's chunks could
        // outnumber the maps kept, and a map made again is checked again).
        let first = |e: &EntryReader| {
            let (mut img, mut lab) = (vec![0f32; 4 * 16 * 16], vec![0u16; 4 * 16 * 16]);
            e.read_patch([0, 0, 0], [4, 16, 16], &mut img, Some(&mut lab))
                .map_err(|err| err.to_string())
        };
        assert!(first(e).is_ok());
        // All bits set: a NaN in float32 and in float16 alike.
        let chunk = chunk_files(e.dir(), "image")[0].clone();
        let len = std::fs::metadata(&chunk).unwrap().len() as usize;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&chunk)
            .unwrap();
        std::io::Write::write_all(&mut f, &vec![0xff; len]).unwrap();
        drop(f);
        let named =
            |err: &str| err.contains("non-finite") && err.contains(&e.dir().display().to_string());
        let err = first(e).unwrap_err();
        assert!(named(&err), "{layout}: {err}");
        let size = [4, 12, 12];
        let n: usize = size.iter().product();
        let (mut img, mut lab) = (vec![0f32; n], vec![0u16; n]);
        let turn = Transform::rotate_scale([0.0, 0.0, 0.6], 1.0);
        let err = TransformedReader::default()
            .read(e, [0, 0, 0], size, &turn, &mut img, Some(&mut lab))
            .unwrap_err()
            .to_string();
        assert!(named(&err), "{layout}, rotated: {err}");
    }
}

#[test]
fn an_entry_reached_by_a_link_or_filed_under_another_case_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let copy = t.path().join("cache");
    copy_tree(cache("plain"), &copy);
    let reader = CacheReader::open(&copy).unwrap();
    let ds = reader.datasets()[0].to_string();
    let cases = reader.cases(&ds).unwrap();
    let (a, b) = (&cases[0], &cases[1]);
    assert!(reader.open_entry(&ds, &a.case_id).is_ok());
    // The entry folder moved outside the cache and linked back in.
    let outside = t.path().join("outside");
    std::fs::rename(&a.entry_dir, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &a.entry_dir).unwrap();
    let err = reader.open_entry(&ds, &a.case_id).unwrap_err().to_string();
    assert!(err.contains("symbolic link"), "{err}");
    std::fs::remove_file(&a.entry_dir).unwrap();
    std::fs::rename(&outside, &a.entry_dir).unwrap();
    // Two cases' entries swapped in the manifest.
    let path = copy.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let cs = &mut m["datasets"][&ds]["cases"];
    let (ea, eb) = (cs[&a.case_id].clone(), cs[&b.case_id].clone());
    cs[&a.case_id] = eb;
    cs[&b.case_id] = ea;
    std::fs::write(&path, m.to_string()).unwrap();
    let reader = CacheReader::open(&copy).unwrap();
    let err = reader.open_entry(&ds, &a.case_id).unwrap_err().to_string();
    assert!(err.contains("swapped"), "{err}");
}

#[test]
fn in_plane_patches_read_only_their_footprint_and_equal_whole_box_reads() {
    // In-plane rotations and scalings of many planes read only the parts of the box rows
    // their cells need (`read_spans`); the patches must be those of whole-box reads, bit for
    // bit, across chunks and past the volume's edges.
    let reader = CacheReader::open(cache("plain")).unwrap();
    let es = open_entries(&reader);
    let in_plane = Transform::in_plane;
    let maps = [
        in_plane(0.7, 1.0),
        in_plane(-2.2, 1.35),
        in_plane(3.0, 0.7),
        in_plane(0.0, 1.25),
        in_plane(1.2, 1.1).mirrored([true, true, false]),
        // 3D rotations read their footprint too (a span for every row of the box).
        Transform::rotate_scale([0.4, -0.5, 0.3], 1.0),
        Transform::rotate_scale([-0.52, 0.2, 0.45], 1.4),
        Transform::rotate_scale([0.1, 0.5, -0.3], 0.7).mirrored([false, true, true]),
        Transform::rotate_scale([0.0, 0.0, 0.6], 1.2),
    ];
    let size = [9, 21, 30];
    let n: usize = size.iter().product();
    let (mut spans, mut whole) = (TransformedReader::default(), TransformedReader::default());
    let mut rng = Lcg(5);
    for e in es.iter().take(3) {
        let s = e.shape_zyx().map(|v| v as i64);
        for (k, t) in maps.iter().enumerate() {
            for _ in 0..4 {
                let start =
                    [0, 1, 2].map(|a| rng.range(-(size[a] as i64) / 2, s[a] - size[a] as i64 / 2));
                let (mut a, mut b) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
                spans
                    .read(e, start, size, t, &mut a, Some(&mut la))
                    .unwrap();
                whole
                    .read(&WholeBoxes(e), start, size, t, &mut b, Some(&mut lb))
                    .unwrap();
                assert_eq!(
                    bits(a.iter().map(|&v| v as f64)),
                    bits(b.iter().map(|&v| v as f64)),
                    "map {k} at {start:?}"
                );
                assert_eq!(la, lb, "map {k} at {start:?}");
            }
        }
    }
}

/// An entry's array metadata replaced by a symbolic link (to a file outside the cache), or its
/// chunk shape rewritten: the entry is refused on opening, naming the file, and --verify says so.
#[test]
fn a_linked_or_rechunked_array_metadata_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    copy_tree(bundled_cache("default", &[]), &cache);
    let entries = entry_dirs(&cache);
    let (linked, rechunked) = (&entries[0], &entries[1]);
    let meta = linked.join("image/zarr.json");
    std::fs::remove_file(&meta).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", &meta).unwrap();
    let err = EntryReader::open(linked).unwrap_err().to_string();
    assert!(
        err.contains("symbolic link") && err.contains("image/zarr.json"),
        "{err}"
    );
    edit_json(&rechunked.join("label/zarr.json"), |v| {
        v["chunk_grid"]["configuration"]["chunk_shape"] = serde_json::json!([1, 1, 1])
    });
    let err = EntryReader::open(rechunked).unwrap_err().to_string();
    assert!(
        err.contains("\"label\"") && err.contains("layout records"),
        "{err}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_prep"))
        .args(["inspect", cache.to_str().unwrap(), "--verify"])
        .output()
        .unwrap();
    assert!(!o.status.success());
}

/// Three tamperings the reader itself refuses (verify too), each naming the entry's file:
/// a foreground row repeated (it would bias the sampler toward one voxel), a chunk-key
/// separator that does not read (it was taken as "/"), and a block dropped from both the
/// files and the recorded checksums (it was read as zeros).
#[test]
fn repeated_fg_rows_a_bad_separator_and_an_unrecorded_missing_block_are_refused() {
    let (_t, reader) = cache_copy("plain");
    let entries = open_entries(&reader);
    let dirs: Vec<PathBuf> = entries.iter().map(|e| e.dir().to_path_buf()).collect();
    drop(entries);

    // The first foreground row written again over the second.
    repeat_first_fg_row(&dirs[0]);
    let e = EntryReader::open(&dirs[0]).unwrap();
    let class = e.classes()[0];
    let err = e.fg_coords(class).unwrap_err().to_string();
    assert!(
        err.contains("repeats or precedes") && err.contains("fg"),
        "{err}"
    );

    // A separator that is neither "/" nor ".".
    edit_json(&dirs[1].join("image/zarr.json"), |v| {
        v["chunk_key_encoding"] =
            serde_json::json!({"name": "default", "configuration": {"separator": "|"}})
    });
    let err = match EntryReader::open(&dirs[1]) {
        Ok(_) => panic!("a '|' separator was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("chunk_key_encoding") && err.contains("image"),
        "{err}"
    );

    // Label block 0.0.0: its file and its recorded checksum both removed.
    edit_json(&dirs[2].join("zarr.json"), |v| {
        let sums = &mut v["attributes"]["voxcache"]["chunk_checksums"]["label"];
        assert!(
            sums.as_object_mut().unwrap().remove("0.0.0").is_some(),
            "{sums}"
        );
    });
    let _ = std::fs::remove_file(dirs[2].join("label/c/0/0/0"));
    let e = EntryReader::open(&dirs[2]).unwrap();
    let err = read_all(&e).unwrap_err();
    assert!(
        err.contains("recorded no block") && err.contains("label"),
        "{err}"
    );
}

/// The JSON file at `path` read, changed by `edit`, written back.
fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}
