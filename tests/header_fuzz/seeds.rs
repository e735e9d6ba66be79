//! Inputs made in code: the fuzzer's seeds (valid NIfTI-1 and NIfTI-2 files of every supported
//! datatype, both byte orders, plain and gzip, with sform, qform, both or neither) and the
//! hand-made corpus of hostile inputs committed in `tests/fuzz_corpus/`.

use super::mutate::gzip;
use crate::nii::Nii;

/// A 4x3x2 volume holding 0..24 in datatype `$t`.
macro_rules! ramp {
    ($t:ty, $spacing:expr, $big:expr) => {
        Nii::new(
            [4, 3, 2],
            $spacing,
            &(0..24).map(|i| i as $t).collect::<Vec<$t>>(),
            $big,
        )
    };
}

/// One of five geometries: sform only, qform only (with qfac -1), both (a rotation each),
/// neither (pixdim), and an oblique sheared sform over an identity qform.
fn set_geometry(n: &mut Nii, which: usize) {
    let [sx, sy, sz] = [n.pixdim[1], n.pixdim[2], n.pixdim[3]];
    match which % 5 {
        0 => {}
        1 => {
            n.sform_code = 0;
            n.qform_code = 1;
            n.quatern = [0.0, 0.0, 1.0, 10.0, 20.0, 30.0];
            n.pixdim[0] = -1.0;
        }
        2 => {
            let (s, c) = (30f32.to_radians().sin(), 30f32.to_radians().cos());
            n.qform_code = 1;
            n.sform_code = 2;
            n.quatern = [15f32.to_radians().sin(), 0.0, 0.0, -5.0, 0.0, 5.0];
            n.srow = [
                [sx, 0.0, 0.0, -5.0],
                [0.0, sy * c, -sz * s, 0.0],
                [0.0, sy * s, sz * c, 5.0],
            ];
        }
        3 => {
            n.qform_code = 0;
            n.sform_code = 0;
        }
        _ => {
            n.qform_code = 1;
            n.sform_code = 1;
            n.quatern = [0.0; 6];
            n.srow = [
                [sx, 0.1, 0.0, -50.0],
                [0.2, sy, 0.0, 12.5],
                [0.0, 0.05, sz, 3.0],
            ];
        }
    }
}

/// Valid inputs of every supported datatype, both byte orders, plain and gzip (one or several
/// members), five geometries, three scalings, 2D, 3D and 4D with one frame, as stored bytes.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let iso = [1.0, 2.0, 3.0];
    let aniso = [0.31, 0.31, 4.97];
    let mut volumes = vec![
        ramp!(u8, iso, false),
        ramp!(i8, aniso, true),
        ramp!(i16, iso, true),
        ramp!(u16, aniso, false),
        ramp!(i32, iso, false),
        ramp!(u32, iso, true),
        ramp!(f32, aniso, false),
        ramp!(f32, iso, true),
        ramp!(i64, iso, false),
        ramp!(u64, aniso, true),
        ramp!(f64, iso, false),
        ramp!(f64, aniso, true),
    ];
    // 2D, and 4D with one frame.
    let mut flat = ramp!(i16, iso, false);
    flat.dims = vec![6, 4];
    volumes.push(flat);
    let mut one_frame = ramp!(u8, aniso, true);
    one_frame.dims = vec![4, 3, 2, 1];
    volumes.push(one_frame);
    let scalings = [(1.0, 0.0), (0.5, -3.0), (0.0, 0.0)];
    let mut out = Vec::new();
    for (k, mut n) in volumes.into_iter().enumerate() {
        set_geometry(&mut n, k);
        n.scl = scalings[k % scalings.len()];
        let bytes = n.bytes();
        out.push(match k % 4 {
            1 => gzip(&bytes, 1),
            3 => gzip(&bytes, 3),
            _ => bytes,
        });
        // Every third one as NIfTI-2 too (both byte orders, plain and gzip among them).
        if k % 3 == 0 {
            let v2 = n.bytes_v2();
            out.push(if k % 2 == 0 { v2 } else { gzip(&v2, 1) });
        }
    }
    out
}

/// Write a little- or big-endian value into a header in place.
fn patch(bytes: &mut [u8], at: usize, le: &[u8], big: bool) {
    let dst = &mut bytes[at..at + le.len()];
    dst.copy_from_slice(le);
    if big {
        dst.reverse();
    }
}

/// The hand-made hostile inputs, by file name. The prefix says what the reader must do:
/// `refuse-`: the header is refused (a file too short for the voxels it declares included);
/// `header-`: the header is accepted and the whole file is not (its gzip stream is broken, or
/// inflates to fewer voxels than declared); `ok-`: the file reads. What the plan makes
/// of them does not change the name (a 1e30 spacing reads, and its plan refuses the case).
pub(crate) fn handmade() -> Vec<(&'static str, Vec<u8>)> {
    let good = || ramp!(i16, [1.0, 2.0, 3.0], false);
    let with = |f: &dyn Fn(&mut Nii)| {
        let mut n = good();
        f(&mut n);
        n.bytes()
    };
    let patched = |at: usize, le: &[u8]| {
        let mut b = good().bytes();
        patch(&mut b, at, le, false);
        b
    };
    let v2_patched = |at: usize, le: &[u8]| {
        let mut b = good().bytes_v2();
        patch(&mut b, at, le, false);
        b
    };
    let mut gz_crc = gzip(&good().bytes(), 1);
    let n = gz_crc.len();
    gz_crc[n - 8] ^= 0x55;
    let gz_cut = {
        let g = gzip(&good().bytes(), 1);
        g[..g.len() - 8].to_vec()
    };
    let mut big_f64 = ramp!(f64, [0.31, 0.31, 4.97], true);
    set_geometry(&mut big_f64, 2);
    vec![
        ("ok-huge-pixdim-1e30.nii", with(&|n| n.pixdim[1] = 1e30)),
        ("refuse-nan-pixdim.nii", with(&|n| n.pixdim[2] = f32::NAN)),
        ("refuse-negative-pixdim.nii", with(&|n| n.pixdim[3] = -2.0)),
        ("refuse-zero-dim.nii", with(&|n| n.dims[1] = 0)),
        ("refuse-negative-dim.nii", with(&|n| n.dims[2] = 0xffff)),
        ("refuse-dim0-8.nii", patched(40, &8i16.to_le_bytes())),
        (
            "refuse-vox-offset-past-end.nii",
            patched(108, &1.0e6f32.to_le_bytes()),
        ),
        (
            "refuse-vox-offset-3e9.nii",
            patched(108, &3.0e9f32.to_le_bytes()),
        ),
        (
            "refuse-vox-offset-nan.nii",
            patched(108, &f32::NAN.to_le_bytes()),
        ),
        (
            "refuse-quaternion-not-rotation.nii",
            with(&|n| {
                n.sform_code = 0;
                n.qform_code = 1;
                n.quatern = [0.8, 0.8, 0.0, 0.0, 0.0, 0.0];
            }),
        ),
        (
            "refuse-singular-sform-no-qform.nii",
            with(&|n| n.srow[1] = [1.0, 0.0, 0.0, 0.0]),
        ),
        (
            "ok-singular-sform-qform-fallback.nii",
            with(&|n| {
                n.srow[1] = [1.0, 0.0, 0.0, 0.0];
                n.qform_code = 1;
            }),
        ),
        (
            "refuse-complex64.nii",
            with(&|n| {
                n.datatype = 32;
                n.bitpix = 64;
            }),
        ),
        (
            "refuse-rgb24.nii",
            with(&|n| {
                n.datatype = 128;
                n.bitpix = 24;
            }),
        ),
        (
            "refuse-truncated-header.nii",
            good().bytes()[..200].to_vec(),
        ),
        (
            "refuse-truncated-header.nii.gz",
            gzip(&good().bytes()[..200], 1),
        ),
        ("refuse-empty.nii", Vec::new()),
        (
            "refuse-sizeof-540-on-a-nifti1-header.nii",
            patched(0, &540i32.to_le_bytes()),
        ),
        (
            "ok-nifti2-big-endian-rotated.nii.gz",
            gzip(&big_f64.bytes_v2(), 1),
        ),
        (
            "refuse-nifti2-dim-40000.nii",
            v2_patched(24, &40_000i64.to_le_bytes()),
        ),
        (
            "refuse-nifti2-vox-offset-2e24.nii",
            v2_patched(168, &((1i64 << 24) + 8).to_le_bytes()),
        ),
        (
            "refuse-nifti2-pixdim-1e300.nii",
            v2_patched(112, &1e300f64.to_le_bytes()),
        ),
        (
            "refuse-nifti2-truncated-header.nii",
            good().bytes_v2()[..400].to_vec(),
        ),
        (
            "refuse-hdr-img-pair-magic.nii",
            with(&|n| n.magic = *b"ni1\0"),
        ),
        ("header-gzip-bad-crc.nii.gz", gz_crc),
        (
            "header-gzip-short-voxels.nii.gz",
            gzip(&with(&|n| n.dims = vec![4, 3, 20]), 1),
        ),
        ("header-gzip-cut-trailer.nii.gz", gz_cut),
        (
            "refuse-dims-32767-no-data.nii",
            with(&|n| n.dims = vec![32767, 32767, 32767]),
        ),
        (
            "refuse-truncated-voxels.nii",
            good().bytes()[..352 + 30].to_vec(),
        ),
        (
            "ok-big-endian-f64-rotated.nii.gz",
            gzip(&big_f64.bytes(), 2),
        ),
        ("ok-4d-one-frame.nii", with(&|n| n.dims = vec![4, 3, 2, 1])),
        ("ok-bitpix-8-for-int16.nii", with(&|n| n.bitpix = 8)),
        (
            "ok-bitpix-negative.nii.gz",
            gzip(&with(&|n| n.bitpix = -16), 1),
        ),
        (
            "refuse-4d-two-frames.nii",
            with(&|n| n.dims = vec![4, 3, 1, 2]),
        ),
    ]
}
