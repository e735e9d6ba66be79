//! A NIfTI-1 (and NIfTI-2) writer written from the spec, independent of the nifti crate, so the
//! reader is checked against bytes we control (datatypes, endianness, odd headers). Its own file
//! so that the header fuzzer (`examples/fuzz_headers.rs`, which cannot use the test-only
//! fixtures) makes its seeds with it too.

use std::io::Write;
use std::path::Path;

use flate2::write::GzEncoder;
use flate2::Compression;

#[derive(Clone, Debug)]
pub struct Nii {
    pub dims: Vec<u16>,
    pub datatype: i16,
    pub bitpix: i16,
    pub pixdim: [f32; 8],
    pub scl: (f32, f32),
    pub big_endian: bool,
    pub qform_code: i16,
    pub sform_code: i16,
    pub quatern: [f32; 6],
    pub srow: [[f32; 4]; 3],
    pub magic: [u8; 4],
    pub xyzt_units: u8,
    /// Voxel bytes, already encoded in the file's byte order.
    pub data: Vec<u8>,
}

/// Encode numbers in a given NIfTI datatype.
pub trait Elem: Copy {
    const CODE: i16;
    const BITS: i16;
    fn put(self, big: bool, out: &mut Vec<u8>);
}

macro_rules! elem {
    ($t:ty, $code:expr) => {
        impl Elem for $t {
            const CODE: i16 = $code;
            const BITS: i16 = (std::mem::size_of::<$t>() * 8) as i16;
            fn put(self, big: bool, out: &mut Vec<u8>) {
                if big {
                    out.extend_from_slice(&self.to_be_bytes())
                } else {
                    out.extend_from_slice(&self.to_le_bytes())
                }
            }
        }
    };
}
elem!(u8, 2);
elem!(i16, 4);
elem!(i32, 8);
elem!(f32, 16);
elem!(f64, 64);
elem!(i8, 256);
elem!(u16, 512);
elem!(u32, 768);
elem!(i64, 1024);
elem!(u64, 1280);

impl Nii {
    /// A 3D volume with voxels given in NIfTI order (x fastest).
    pub fn new<T: Elem>(
        shape_xyz: [usize; 3],
        spacing: [f32; 3],
        values: &[T],
        big_endian: bool,
    ) -> Nii {
        assert_eq!(values.len(), shape_xyz.iter().product::<usize>());
        let mut data = Vec::new();
        for v in values {
            v.put(big_endian, &mut data);
        }
        Nii {
            dims: shape_xyz.iter().map(|&d| d as u16).collect(),
            datatype: T::CODE,
            bitpix: T::BITS,
            pixdim: [1.0, spacing[0], spacing[1], spacing[2], 1.0, 1.0, 1.0, 1.0],
            scl: (1.0, 0.0),
            big_endian,
            qform_code: 0,
            sform_code: 1,
            quatern: [0.0; 6],
            srow: [
                [spacing[0], 0.0, 0.0, 0.0],
                [0.0, spacing[1], 0.0, 0.0],
                [0.0, 0.0, spacing[2], 0.0],
            ],
            magic: *b"n+1\0",
            xyzt_units: 2,
            data,
        }
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut h = vec![0u8; 352];
        let be = self.big_endian;
        let i32b = |v: i32| if be { v.to_be_bytes() } else { v.to_le_bytes() };
        let i16b = |v: i16| if be { v.to_be_bytes() } else { v.to_le_bytes() };
        let f32b = |v: f32| if be { v.to_be_bytes() } else { v.to_le_bytes() };
        h[0..4].copy_from_slice(&i32b(348));
        let mut dim = [1i16; 8];
        dim[0] = self.dims.len() as i16;
        for (i, d) in self.dims.iter().enumerate() {
            dim[i + 1] = *d as i16;
        }
        for (i, d) in dim.iter().enumerate() {
            h[40 + 2 * i..42 + 2 * i].copy_from_slice(&i16b(*d));
        }
        h[70..72].copy_from_slice(&i16b(self.datatype));
        h[72..74].copy_from_slice(&i16b(self.bitpix));
        for (i, p) in self.pixdim.iter().enumerate() {
            h[76 + 4 * i..80 + 4 * i].copy_from_slice(&f32b(*p));
        }
        h[108..112].copy_from_slice(&f32b(352.0));
        h[112..116].copy_from_slice(&f32b(self.scl.0));
        h[116..120].copy_from_slice(&f32b(self.scl.1));
        h[123] = self.xyzt_units;
        h[252..254].copy_from_slice(&i16b(self.qform_code));
        h[254..256].copy_from_slice(&i16b(self.sform_code));
        for (i, q) in self.quatern.iter().enumerate() {
            h[256 + 4 * i..260 + 4 * i].copy_from_slice(&f32b(*q));
        }
        for (r, row) in self.srow.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                let o = 280 + 16 * r + 4 * c;
                h[o..o + 4].copy_from_slice(&f32b(*v));
            }
        }
        h[344..348].copy_from_slice(&self.magic);
        h.extend_from_slice(&self.data);
        h
    }

    /// The same image as a NIfTI-2 file (540-byte header, 64-bit fields, vox_offset 544), written
    /// from the NIfTI-2 layout independently of the reader.
    pub fn bytes_v2(&self) -> Vec<u8> {
        let mut h = vec![0u8; 544];
        let be = self.big_endian;
        let put = |h: &mut Vec<u8>, at: usize, le: &[u8]| {
            let mut b = le.to_vec();
            if be {
                b.reverse();
            }
            h[at..at + b.len()].copy_from_slice(&b);
        };
        put(&mut h, 0, &540i32.to_le_bytes());
        h[4..12].copy_from_slice(b"n+2\0\r\n\x1a\n");
        put(&mut h, 12, &self.datatype.to_le_bytes());
        put(&mut h, 14, &self.bitpix.to_le_bytes());
        let mut dim = [1i64; 8];
        dim[0] = self.dims.len() as i64;
        for (i, d) in self.dims.iter().enumerate() {
            dim[i + 1] = *d as i64;
        }
        for (i, d) in dim.iter().enumerate() {
            put(&mut h, 16 + 8 * i, &d.to_le_bytes());
        }
        for (i, p) in self.pixdim.iter().enumerate() {
            put(&mut h, 104 + 8 * i, &(*p as f64).to_le_bytes());
        }
        put(&mut h, 168, &544i64.to_le_bytes());
        put(&mut h, 176, &(self.scl.0 as f64).to_le_bytes());
        put(&mut h, 184, &(self.scl.1 as f64).to_le_bytes());
        put(&mut h, 344, &(self.qform_code as i32).to_le_bytes());
        put(&mut h, 348, &(self.sform_code as i32).to_le_bytes());
        for (i, q) in self.quatern.iter().enumerate() {
            put(&mut h, 352 + 8 * i, &(*q as f64).to_le_bytes());
        }
        for (r, row) in self.srow.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                put(&mut h, 400 + 32 * r + 8 * c, &(*v as f64).to_le_bytes());
            }
        }
        put(&mut h, 500, &(self.xyzt_units as i32).to_le_bytes());
        h.extend_from_slice(&self.data);
        h
    }

    /// Write [`Self::bytes_v2`] (gzipped for a `.gz` path).
    pub fn write_v2(&self, path: &Path) {
        write_maybe_gz(path, &self.bytes_v2());
    }

    pub fn write(&self, path: &Path) {
        write_maybe_gz(path, &self.bytes());
    }

    /// Gzip in several members (as some writers do): each member holds a slice of the bytes.
    pub fn write_multi_member_gz(&self, path: &Path, members: usize) {
        let bytes = self.bytes();
        let mut out = Vec::new();
        for part in bytes.chunks(bytes.len().div_ceil(members)) {
            let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
            gz.write_all(part).unwrap();
            out.extend(gz.finish().unwrap());
        }
        std::fs::write(path, out).unwrap();
    }
}

/// Write `bytes` to `path`, gzipped when the name ends in `.gz`.
fn write_maybe_gz(path: &Path, bytes: &[u8]) {
    if path.to_string_lossy().ends_with(".gz") {
        let f = std::fs::File::create(path).unwrap();
        let mut gz = GzEncoder::new(f, Compression::fast());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap();
    } else {
        std::fs::write(path, bytes).unwrap();
    }
}
