//! The NIfTI reader against bytes written from the spec: every datatype, both byte orders,
//! scaling, multi-member gzip, odd geometry, and each kind of broken file.

use crate::common;

use common::Nii;
use voxcache::nifti_io::{read_header, read_volume};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn values() -> Vec<f64> {
    (0..24).map(|i| (i as f64) * 3.0 - 10.0).collect()
}

fn check_roundtrip<T: common::Elem>(conv: impl Fn(f64) -> T, expect: impl Fn(f64) -> f32) {
    let dir = tmp();
    for big in [false, true] {
        for ext in ["nii", "nii.gz"] {
            let vals: Vec<T> = values().into_iter().map(&conv).collect();
            let path = dir.path().join(format!("v_{big}.{ext}"));
            Nii::new([4, 3, 2], [1.0, 2.0, 3.0], &vals, big).write(&path);
            let v = read_volume(&path).unwrap();
            assert_eq!(v.header.shape_xyz, [4, 3, 2]);
            assert_eq!(v.header.big_endian, big);
            let want: Vec<f32> = values().into_iter().map(&expect).collect();
            assert_eq!(v.data, want, "datatype {} big-endian {big} {ext}", T::CODE);
        }
    }
}

#[test]
fn every_scalar_datatype_in_both_byte_orders() {
    check_roundtrip(|v| (v + 10.0) as u8, |v| (v + 10.0) as f32);
    check_roundtrip(|v| v as i8, |v| v as f32);
    check_roundtrip(|v| v as i16, |v| v as f32);
    check_roundtrip(|v| (v + 10.0) as u16, |v| (v + 10.0) as f32);
    check_roundtrip(|v| v as i32, |v| v as f32);
    check_roundtrip(|v| (v + 10.0) as u32, |v| (v + 10.0) as f32);
    check_roundtrip(|v| v as i64, |v| v as f32);
    check_roundtrip(|v| (v + 10.0) as u64, |v| (v + 10.0) as f32);
    check_roundtrip(|v| v as f32 * 0.5, |v| v as f32 * 0.5);
    check_roundtrip(|v| v * 0.25, |v| (v * 0.25) as f32);
}

#[test]
fn scl_slope_and_inter_are_applied_in_f32() {
    let dir = tmp();
    let vals: Vec<i16> = (0..8).collect();
    let mut n = Nii::new([2, 2, 2], [1.0; 3], &vals, false);
    n.scl = (0.5, -3.0);
    let p = dir.path().join("s.nii");
    n.write(&p);
    let v = read_volume(&p).unwrap();
    assert_eq!(
        v.data,
        (0..8).map(|i| i as f32 * 0.5 - 3.0).collect::<Vec<_>>()
    );
    // slope 0 means "no scaling" in NIfTI-1.
    n.scl = (0.0, 5.0);
    n.write(&p);
    assert_eq!(
        read_volume(&p).unwrap().data,
        (0..8).map(|i| i as f32).collect::<Vec<_>>()
    );
}

#[test]
fn multi_member_gzip_reads_like_single_member() {
    let dir = tmp();
    let vals: Vec<i16> = (0..1000).map(|i| (i * 7 % 301) as i16).collect();
    let n = Nii::new([10, 10, 10], [1.0; 3], &vals, false);
    let a = dir.path().join("one.nii.gz");
    let b = dir.path().join("many.nii.gz");
    n.write(&a);
    n.write_multi_member_gz(&b, 5);
    assert_eq!(read_volume(&a).unwrap().data, read_volume(&b).unwrap().data);
}

#[test]
fn a_4d_volume_with_one_frame_is_3d_and_more_frames_are_refused() {
    let dir = tmp();
    let vals: Vec<u8> = (0..8).collect();
    let mut n = Nii::new([2, 2, 2], [1.0; 3], &vals, false);
    n.dims = vec![2, 2, 2, 1];
    let p = dir.path().join("one.nii");
    n.write(&p);
    assert_eq!(read_volume(&p).unwrap().header.shape_xyz, [2, 2, 2]);
    n.dims = vec![2, 2, 1, 2];
    n.write(&p);
    let e = read_volume(&p).unwrap_err().to_string();
    assert!(e.contains("one.nii") && e.contains("4D"), "{e}");
}

#[test]
fn sform_wins_over_qform_and_qform_is_computed_per_spec() {
    let dir = tmp();
    let vals: Vec<u8> = vec![0; 8];
    let mut n = Nii::new([2, 2, 2], [2.0, 3.0, 4.0], &vals, false);
    // qform: 180 degrees about z (b=c=0, d=1): x -> -x, y -> -y, with qfac -1 flipping z.
    n.qform_code = 1;
    n.quatern = [0.0, 0.0, 1.0, 10.0, 20.0, 30.0];
    n.pixdim[0] = -1.0;
    n.sform_code = 0;
    let p = dir.path().join("q.nii");
    n.write(&p);
    let h = read_header(&p).unwrap();
    assert_eq!(h.affine_source, "qform");
    let a = h.affine.0;
    assert_eq!(a[0], [-2.0, 0.0, 0.0, 10.0]);
    assert_eq!(a[1], [0.0, -3.0, 0.0, 20.0]);
    assert_eq!(a[2], [0.0, 0.0, -4.0, 30.0]);
    assert_eq!(h.affine.axis_codes(), "LPI");
    n.sform_code = 2;
    n.write(&p);
    let h = read_header(&p).unwrap();
    assert_eq!(h.affine_source, "sform");
    assert_eq!(h.affine.0[0], [2.0, 0.0, 0.0, 0.0]);
}

fn expect_error(n: &Nii, name: &str, needle: &str) {
    let dir = tmp();
    let p = dir.path().join(name);
    n.write(&p);
    let e = read_volume(&p)
        .expect_err("broken file must not read")
        .to_string();
    assert!(e.contains(name), "error must name the file: {e}");
    assert!(
        e.to_lowercase().contains(needle),
        "error {e:?} should mention {needle:?}"
    );
}

#[test]
fn broken_headers_are_refused_with_the_file_named() {
    let vals: Vec<i16> = vec![1; 27];
    let good = Nii::new([3, 3, 3], [1.0; 3], &vals, false);
    for (pix, label) in [(0.0f32, "zero"), (-1.0, "negative"), (f32::NAN, "nan")] {
        let mut n = good.clone();
        n.pixdim[2] = pix;
        expect_error(&n, &format!("pixdim_{label}.nii.gz"), "spacing");
    }
    let mut n = good.clone();
    n.magic = *b"xyz\0";
    expect_error(&n, "magic.nii", "magic");
    let mut n = good.clone();
    n.datatype = 32; // complex64
    expect_error(&n, "complex.nii", "datatype");
    let mut n = good.clone();
    n.dims = vec![3, 3, 30000];
    expect_error(&n, "lying_dims.nii", "truncated");
}

#[test]
fn a_lying_header_cannot_make_us_allocate() {
    // 32767^3 int16 voxels would be 70 TB; the file holds 54 bytes of data.
    let vals: Vec<i16> = vec![1; 27];
    let mut n = Nii::new([3, 3, 3], [1.0; 3], &vals, false);
    n.dims = vec![32767, 32767, 32767];
    let dir = tmp();
    for name in ["huge.nii", "huge.nii.gz"] {
        let p = dir.path().join(name);
        n.write(&p);
        let e = read_volume(&p).err().unwrap().to_string();
        assert!(e.contains("truncated") && e.contains(name), "{e}");
    }
}

#[test]
fn truncated_gzip_is_reported_as_truncated() {
    let dir = tmp();
    let vals: Vec<i16> = (0..4096).map(|i| (i * 31 % 1000) as i16).collect();
    let p = dir.path().join("cut.nii.gz");
    Nii::new([16, 16, 16], [1.0; 3], &vals, false).write(&p);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = read_volume(&p).err().unwrap().to_string();
    assert!(e.contains("cut.nii.gz") && e.contains("truncated"), "{e}");
    std::fs::write(&p, &bytes[..20]).unwrap();
    let e = read_header(&p).err().unwrap().to_string();
    assert!(e.contains("cut.nii.gz"), "{e}");
}

#[test]
fn not_nifti_at_all() {
    let dir = tmp();
    let p = dir.path().join("notes.nii");
    std::fs::write(&p, b"hello").unwrap();
    let e = read_volume(&p).err().unwrap().to_string();
    assert!(
        e.contains("notes.nii") && e.contains("not a NIfTI file"),
        "{e}"
    );
    let p = dir.path().join("empty.nii.gz");
    std::fs::write(&p, b"").unwrap();
    assert!(read_volume(&p).is_err());
}

/// Run `f` on another thread and fail (instead of hanging the suite) if it takes over 20 s.
fn within_20s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the reader hung")
}

#[test]
fn gzip_is_checked_to_its_end_crc_and_length_included() {
    let dir = tmp();
    let vals: Vec<i16> = (0..4096).map(|i| (i * 31 % 1000) as i16).collect();
    let p = dir.path().join("v.nii.gz");
    Nii::new([16, 16, 16], [1.0; 3], &vals, false).write(&p);
    let good = std::fs::read(&p).unwrap();
    assert!(read_volume(&p).is_ok());
    let n = good.len();
    // The member's trailer: CRC-32 of the inflated bytes, then their length mod 2^32.
    for (what, at) in [("crc", n - 8), ("length", n - 2)] {
        let mut bad = good.clone();
        bad[at] ^= 0x55;
        std::fs::write(&p, &bad).unwrap();
        let e = read_volume(&p).err().map(|e| e.to_string());
        let e = e.unwrap_or_else(|| panic!("a wrong {what} in the gzip trailer was accepted"));
        assert!(e.contains("v.nii.gz") && e.contains("gzip"), "{what}: {e}");
    }
    // The trailer cut off: every voxel is there, the check is not.
    std::fs::write(&p, &good[..n - 8]).unwrap();
    let e = read_volume(&p).expect_err("a gzip stream without its trailer was accepted");
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[cfg(unix)]
#[test]
fn a_named_pipe_is_refused_by_type_not_read() {
    let dir = tmp();
    let p = dir.path().join("case_0000.nii.gz");
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path. mkfifo(3) is there on every Unix.
        assert_eq!(
            unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
            0,
            "mkfifo {}",
            p.display()
        );
    }
    for read in [
        |p: std::path::PathBuf| read_header(&p).err().map(|e| e.to_string()),
        |p: std::path::PathBuf| read_volume(&p).err().map(|e| e.to_string()),
    ] {
        let q = p.clone();
        let e = within_20s(move || read(q)).expect("a named pipe was read");
        assert!(
            e.contains("case_0000.nii.gz") && e.contains("named pipe"),
            "{e}"
        );
    }
    // A folder with a NIfTI name is refused the same way.
    let d = dir.path().join("folder.nii");
    std::fs::create_dir(&d).unwrap();
    let e = read_volume(&d).err().unwrap().to_string();
    assert!(e.contains("a folder"), "{e}");
}

#[test]
fn the_byte_order_is_the_headers_not_sizeof_hdrs() {
    // An int16 label whose sizeof_hdr alone is big-endian: the rest of the header (dim[0]
    // first) says little-endian, and so do the voxels (nibabel reads {0, 1}).
    let dir = tmp();
    let p = dir.path().join("lab.nii");
    let vals: Vec<i16> = (0..24).map(|i| (i % 2) as i16).collect();
    Nii::new([4, 3, 2], [1.0; 3], &vals, false).write(&p);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[..4].copy_from_slice(&348i32.to_be_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let l = voxcache::nifti_io::label_from_f32(&p, read_volume(&p).unwrap().data).unwrap();
    match l {
        voxcache::nifti_io::LabelData::U8(v) => {
            assert_eq!(v, vals.iter().map(|&x| x as u8).collect::<Vec<_>>())
        }
        other => panic!("expected uint8 labels 0 and 1, got {other:?}"),
    }
    let v = read_volume(&p).unwrap();
    assert!(!v.header.big_endian);
    assert_eq!(v.data, vals.iter().map(|&x| x as f32).collect::<Vec<_>>());
}

#[test]
fn broken_geometry_is_refused_or_falls_back_with_a_warning() {
    let dir = tmp();
    let p = dir.path().join("g.nii");
    let vals = vec![1i16; 24];
    let base = || Nii::new([4, 3, 2], [1.0, 2.0, 3.0], &vals, false);
    // A quaternion that is not a rotation: refused, as nibabel does.
    let mut n = base();
    n.qform_code = 1;
    n.sform_code = 0;
    n.quatern = [0.8, 0.8, 0.0, 0.0, 0.0, 0.0];
    n.write(&p);
    let e = read_header(&p).unwrap_err().to_string();
    assert!(e.contains("g.nii") && e.contains("not a rotation"), "{e}");
    // A singular sform with a valid qform: the qform, with a warning saying so.
    let mut n = base();
    n.qform_code = 1;
    n.sform_code = 1;
    n.quatern = [0.0; 6];
    n.srow = [
        [1.0, 0.0, 0.0, 0.0],
        [2.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 3.0, 0.0],
    ];
    n.write(&p);
    let h = read_header(&p).unwrap();
    assert_eq!(h.affine_source, "qform");
    let w = h.affine_warning.expect("a fallback without a warning");
    assert!(w.contains("singular"), "{w}");
    // A NaN sform with a valid qform: the same.
    n.srow[0][0] = f32::NAN;
    n.write(&p);
    let h = read_header(&p).unwrap();
    assert_eq!(h.affine_source, "qform");
    assert!(h.affine_warning.unwrap().contains("NaN"));
    // A singular sform and no qform: nothing to fall back on.
    n.srow[0][0] = 1.0;
    n.qform_code = 0;
    n.write(&p);
    let e = read_header(&p).unwrap_err().to_string();
    assert!(e.contains("singular") && e.contains("no qform"), "{e}");
}

#[test]
fn a_source_in_a_scratch_file_reads_what_a_source_in_memory_reads() {
    use voxcache::nifti_io::{SourceOptions, VoxelSource};
    let dir = tmp();
    let scratch = dir.path().join("scratch");
    let shape = [70usize, 50, 40];
    let n: usize = shape.iter().product();
    for big in [false, true] {
        for ext in ["nii", "nii.gz"] {
            let vals: Vec<f64> = (0..n).map(|i| (i % 977) as f64 * 0.5 - 40.0).collect();
            let p = dir.path().join(format!("s_{big}.{ext}"));
            let mut nii = Nii::new(shape, [1.0; 3], &vals, big);
            nii.scl = (2.0, 1.0);
            nii.write(&p);
            let whole = read_volume(&p).unwrap();
            for limit in [0u64, u64::MAX] {
                let opts = SourceOptions {
                    ram_limit_bytes: limit,
                    scratch_dir: scratch.clone(),
                };
                let mut streamed = Vec::new();
                let (src, st) = VoxelSource::open(&p, &opts, &mut |b| {
                    streamed.extend_from_slice(b);
                    Ok(())
                })
                .unwrap();
                assert_eq!(src.on_disk(), limit == 0);
                assert_eq!(streamed, whole.data, "blocks, limit {limit}");
                assert_eq!(st.file_hash, blake3::hash(&std::fs::read(&p).unwrap()));
                assert_eq!(st.file_bytes, std::fs::metadata(&p).unwrap().len());
                let mut all = vec![0.0; n];
                src.read_f32(0, &mut all).unwrap();
                assert_eq!(all, whole.data);
                let mut run = vec![0.0; 333];
                src.read_f32(n - 333, &mut run).unwrap();
                assert_eq!(run, whole.data[n - 333..]);
                // Past the end is an error naming the file, not a panic.
                let e = src.read_f32(n - 10, &mut run).unwrap_err().to_string();
                assert!(e.contains(&*p.to_string_lossy()), "{e}");
            }
            // Scratch files are unlinked at once: the folder stays empty.
            assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
        }
    }
}

#[test]
fn a_corrupt_gzip_fails_while_inflating_to_a_scratch_file() {
    use voxcache::nifti_io::{SourceOptions, VoxelSource};
    let dir = tmp();
    let vals: Vec<i16> = (0..20_000).map(|i| (i * 31 % 1000) as i16).collect();
    let p = dir.path().join("c.nii.gz");
    Nii::new([40, 50, 10], [1.0; 3], &vals, false).write(&p);
    let mut bytes = std::fs::read(&p).unwrap();
    let at = bytes.len() - 6; // inside the CRC-32 of the trailer
    bytes[at] ^= 0xff;
    std::fs::write(&p, &bytes).unwrap();
    let opts = SourceOptions {
        ram_limit_bytes: 0,
        scratch_dir: dir.path().join("scratch"),
    };
    let e = VoxelSource::open(&p, &opts, &mut |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("c.nii.gz") && e.contains("gzip"), "{e}");
}

#[test]
fn nifti2_reads_as_its_nifti1_twin_and_refuses_what_does_not_fit() {
    let dir = tmp();
    let vals: Vec<i16> = (0..60).map(|i| (i * 37 % 101) as i16 - 50).collect();
    for big in [false, true] {
        for (qcode, scode) in [(1, 0), (0, 2), (1, 1)] {
            let mut n = Nii::new([5, 4, 3], [0.7, 1.1, 2.5], &vals, big);
            n.scl = (0.5, -3.0);
            n.qform_code = qcode;
            n.quatern = [0.0, 0.0, 1.0, 10.0, 20.0, 30.0];
            n.sform_code = scode;
            n.srow = [
                [0.0, -1.1, 0.0, 5.0],
                [0.7, 0.0, 0.0, -3.0],
                [0.0, 0.0, 2.5, 1.0],
            ];
            n.xyzt_units = 3; // micrometres
            for ext in ["nii", "nii.gz"] {
                let (one, two) = (
                    dir.path().join(format!("one.{ext}")),
                    dir.path().join(format!("two.{ext}")),
                );
                n.write(&one);
                n.write_v2(&two);
                let (a, b) = (read_volume(&one).unwrap(), read_volume(&two).unwrap());
                let what = format!("big-endian {big}, codes {qcode}/{scode}, {ext}");
                assert_eq!(a.data, b.data, "{what}");
                assert_eq!(a.header.shape_xyz, b.header.shape_xyz, "{what}");
                assert_eq!(a.header.spacing_xyz, b.header.spacing_xyz, "{what}");
                assert_eq!(a.header.affine, b.header.affine, "{what}");
                assert_eq!(a.header.affine_source, b.header.affine_source, "{what}");
                assert_eq!(a.header.unit, b.header.unit, "{what}");
                assert_eq!(b.header.big_endian, big, "{what}");
                assert_eq!(read_header(&two).unwrap().affine, a.header.affine, "{what}");
            }
        }
    }
    // What a NIfTI-2 header may say but this reader cannot hold: refused, file named.
    let p = dir.path().join("bad2.nii");
    let err = |bytes: &[u8]| {
        std::fs::write(&p, bytes).unwrap();
        read_volume(&p).unwrap_err().to_string()
    };
    let good = Nii::new([5, 4, 3], [1.0; 3], &vals, false).bytes_v2();
    let mut b = good.clone();
    b[24..32].copy_from_slice(&40_000i64.to_le_bytes()); // dim[1]
    let e = err(&b);
    assert!(e.contains("bad2.nii") && e.contains("32767"), "{e}");
    let mut b = good.clone();
    b[4..8].copy_from_slice(b"n+1\0");
    assert!(err(&b).contains("magic"));
    let mut b = good.clone();
    b[168..176].copy_from_slice(&100i64.to_le_bytes()); // vox_offset inside the header
    assert!(err(&b).contains("vox_offset"));
    let e = err(&good[..500]);
    assert!(e.contains("bad2.nii"), "{e}");
    let mut b = good.clone();
    b[104 + 8..104 + 16].copy_from_slice(&1e300f64.to_le_bytes()); // pixdim[1] beyond f32
    assert!(err(&b).contains("pixdim[1]"));
    // Voxels past what the file holds, as for NIfTI-1.
    let e = err(&good[..good.len() - 10]);
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn a_bitpix_that_disagrees_with_the_datatype_is_read_by_the_datatype() {
    // nibabel reads by the datatype and rewrites bitpix; so does the reader (bitpix unused).
    let dir = tmp();
    let vals: Vec<i16> = (0..24).map(|i| i * 100 - 1000).collect();
    for (bitpix, name) in [(8, "b8.nii"), (-16, "neg.nii.gz"), (0, "zero.nii")] {
        let mut n = Nii::new([4, 3, 2], [1.0; 3], &vals, false);
        n.bitpix = bitpix;
        let p = dir.path().join(name);
        n.write(&p);
        let v = read_volume(&p).unwrap_or_else(|e| panic!("bitpix {bitpix}: {e}"));
        assert_eq!(v.header.datatype, "int16");
        assert_eq!(
            v.data,
            vals.iter().map(|&x| x as f32).collect::<Vec<_>>(),
            "bitpix {bitpix}"
        );
    }
}

#[test]
fn a_header_declaring_more_voxels_than_its_file_can_hold_is_refused_with_the_header() {
    // Before any plan counts its forecast against the disk: a lying header fails its case
    // when scanned, not when its voxels are read.
    let dir = tmp();
    let vals = vec![7i16; 60];
    let n = Nii::new([5, 4, 3], [1.0; 3], &vals, false);
    let p = dir.path().join("plain.nii");
    let bytes = n.bytes();
    std::fs::write(&p, &bytes).unwrap();
    assert!(read_header(&p).is_ok(), "exactly the declared bytes");
    std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
    let e = read_header(&p).unwrap_err().to_string();
    assert!(
        e.contains("plain.nii") && e.contains("truncated") && e.contains("119 bytes"),
        "{e}"
    );
    // gzip: a stream cannot inflate past 1032 bytes for each of its bytes.
    let mut lying = n.clone();
    lying.dims = vec![20000, 20000, 500];
    let p = dir.path().join("lying.nii.gz");
    lying.write(&p);
    let e = read_header(&p).unwrap_err().to_string();
    assert!(
        e.contains("lying.nii.gz") && e.contains("truncated") && e.contains("cannot hold"),
        "{e}"
    );
    // A smaller lie is possible for a stream of that size: the header passes, the read fails.
    lying.dims = vec![5, 4, 30];
    lying.write(&p);
    assert!(read_header(&p).is_ok());
    let e = read_volume(&p).unwrap_err().to_string();
    assert!(e.contains("lying.nii.gz") && e.contains("truncated"), "{e}");
}
