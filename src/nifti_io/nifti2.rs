//! NIfTI-2 headers (540 bytes: 64-bit dimensions and offset, double-precision geometry), read
//! into the NIfTI-1 header fields the rest of the reader validates, so both versions go through
//! one set of checks. What does not fit is refused by name rather than cut: an axis of more than
//! 32767 voxels, an offset past 2^24 bytes, a transform code out of range.

use nifti::{Endianness, NiftiHeader};

/// Bytes of a NIfTI-2 header.
pub(super) const NIFTI2_HEADER_BYTES: usize = 540;

/// Whether the first four bytes (sizeof_hdr) announce a NIfTI-2 header, in either byte order.
pub(super) fn is_nifti2(head: &[u8]) -> bool {
    head.len() >= 4 && {
        let b = [head[0], head[1], head[2], head[3]];
        i32::from_le_bytes(b) == 540 || i32::from_be_bytes(b) == 540
    }
}

/// Field readers over a header in its own byte order.
struct Fields<'a> {
    b: &'a [u8],
    big: bool,
}

impl Fields<'_> {
    fn arr<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&self.b[at..at + N]);
        if self.big {
            a.reverse();
        }
        a
    }
    fn i16(&self, at: usize) -> i16 {
        i16::from_le_bytes(self.arr(at))
    }
    fn i32(&self, at: usize) -> i32 {
        i32::from_le_bytes(self.arr(at))
    }
    fn i64(&self, at: usize) -> i64 {
        i64::from_le_bytes(self.arr(at))
    }
    fn f64(&self, at: usize) -> f64 {
        f64::from_le_bytes(self.arr(at))
    }
    /// An f64 field as f32: values beyond f32's range become infinite, which the common checks
    /// refuse as they would a NIfTI-1 field.
    fn f32(&self, at: usize) -> f32 {
        self.f64(at) as f32
    }
}

/// Read a NIfTI-2 header (`head` holds at least 540 bytes) into NIfTI-1 fields; the error says
/// what does not fit.
pub(super) fn to_nifti1(head: &[u8]) -> std::result::Result<NiftiHeader, String> {
    if head.len() < NIFTI2_HEADER_BYTES {
        return Err(format!(
            "truncated NIfTI-2 header: {} bytes of {NIFTI2_HEADER_BYTES}",
            head.len()
        ));
    }
    let big = i32::from_le_bytes([head[0], head[1], head[2], head[3]]) != 540;
    let f = Fields { b: head, big };
    let magic = &head[4..12];
    if magic == b"ni2\0\r\n\x1a\n" {
        return Err(
            "NIfTI-2 .hdr/.img pairs are not supported; use single-file .nii or .nii.gz".into(),
        );
    }
    if magic != b"n+2\0\r\n\x1a\n" {
        return Err(format!(
            "bad NIfTI-2 magic {:?} (expected \"n+2\" and its line-ending check bytes)",
            String::from_utf8_lossy(magic)
        ));
    }
    let mut h = NiftiHeader {
        sizeof_hdr: 540,
        endianness: if big {
            Endianness::Big
        } else {
            Endianness::Little
        },
        magic: *b"n+2\0",
        datatype: f.i16(12),
        bitpix: f.i16(14),
        ..NiftiHeader::default()
    };
    let ndim = f.i64(16);
    if !(1..=7).contains(&ndim) {
        return Err(format!("invalid dim[0] = {ndim} (must be 1..7)"));
    }
    for a in 0..8 {
        let d = f.i64(16 + 8 * a);
        if a as i64 > ndim {
            continue;
        }
        if a > 0 && !(1..=i16::MAX as i64).contains(&d) {
            return Err(if d > i16::MAX as i64 {
                format!("dim[{a}] = {d}: axes of more than 32767 voxels are not supported")
            } else {
                format!("invalid dim[{a}] = {d}")
            });
        }
        h.dim[a] = d as u16;
    }
    for a in 0..8 {
        h.pixdim[a] = f.f32(104 + 8 * a);
    }
    let vox_offset = f.i64(168);
    if !(NIFTI2_HEADER_BYTES as i64..=1 << 24).contains(&vox_offset) {
        return Err(format!(
            "invalid NIfTI-2 vox_offset {vox_offset} (must be {NIFTI2_HEADER_BYTES}..16777216)"
        ));
    }
    h.vox_offset = vox_offset as f32;
    h.scl_slope = f.f32(176);
    h.scl_inter = f.f32(184);
    let code = |at: usize, what: &str| -> std::result::Result<i16, String> {
        let c = f.i32(at);
        i16::try_from(c).map_err(|_| format!("invalid {what} {c}"))
    };
    h.qform_code = code(344, "qform_code")?;
    h.sform_code = code(348, "sform_code")?;
    h.quatern_b = f.f32(352);
    h.quatern_c = f.f32(360);
    h.quatern_d = f.f32(368);
    h.quatern_x = f.f32(376);
    h.quatern_y = f.f32(384);
    h.quatern_z = f.f32(392);
    for k in 0..4 {
        h.srow_x[k] = f.f32(400 + 8 * k);
        h.srow_y[k] = f.f32(432 + 8 * k);
        h.srow_z[k] = f.f32(464 + 8 * k);
    }
    h.xyzt_units = (f.i32(500) & 0xff) as u8;
    Ok(h)
}
