//! The files `nnUNetv2_predict --save_probabilities` writes beside a segmentation, written the
//! same way so that nnU-Net's own tools (`nnUNetv2_ensemble`) and users' scripts read ours:
//!
//! - `CASE.npz`: one float32 array `probabilities` of shape (heads, z, y, x) on the input's grid
//!   (NumPy's `.npy` format inside a deflate zip, as `numpy.savez_compressed` writes it),
//!   streamed a slice at a time;
//! - `CASE.pkl`: the case's properties (spacing, crop box, shapes, the reader's geometry) as a
//!   pickled dict of plain Python values.

use std::io::Write;
use std::path::Path;

use super::bad;
use crate::error::{Error, Result};

/// Name of the array inside the `.npz`.
pub const PROBABILITIES_KEY: &str = "probabilities";

/// The `.npy` header of a little-endian float32 C-order array of `shape`: NumPy's format 1.0,
/// padded so the data starts on a 64-byte boundary.
pub fn npy_header_f32(shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    // Magic (6), version (2), header length (2), then the dict padded with spaces and a newline.
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Write `path` as a `.npz` holding one float32 array [`PROBABILITIES_KEY`] of `shape`
/// (c, z, y, x); `slice(c, z, out)` fills one (y, x) slice at a time, in C order.
pub fn write_npz(
    path: &Path,
    shape: [usize; 4],
    mut slice: impl FnMut(usize, usize, &mut [f32]) -> Result<()>,
) -> Result<()> {
    use zip::write::SimpleFileOptions;
    let io = |e: std::io::Error| Error::io(path, e);
    let zerr = |e: zip::result::ZipError| bad(path, format!("writing the zip archive: {e}"));
    let file = std::fs::File::create(path).map_err(io)?;
    let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(file));
    let header = npy_header_f32(&shape);
    let bytes = header.len() as u64 + shape.iter().product::<usize>() as u64 * 4;
    // Level 1: probabilities compress little, and the higher levels cost several times the time.
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(1))
        .large_file(bytes >= u32::MAX as u64);
    zip.start_file(format!("{PROBABILITIES_KEY}.npy"), options)
        .map_err(zerr)?;
    zip.write_all(&header).map_err(io)?;
    let mut buf = vec![0f32; shape[2] * shape[3]];
    for c in 0..shape[0] {
        for z in 0..shape[1] {
            slice(c, z, &mut buf)?;
            let le: Vec<u8> = buf.iter().flat_map(|v| v.to_le_bytes()).collect();
            zip.write_all(&le).map_err(io)?;
        }
    }
    let mut inner = zip.finish().map_err(zerr)?;
    inner.flush().map_err(io)
}

/// A plain Python value, as `pickle` writes it.
#[derive(Clone, Debug, PartialEq)]
pub enum PyValue {
    /// `int`.
    Int(i64),
    /// `float`.
    Float(f64),
    /// `str`.
    Str(String),
    /// `list`.
    List(Vec<PyValue>),
    /// `tuple`.
    Tuple(Vec<PyValue>),
    /// `dict` with string keys, in order.
    Dict(Vec<(String, PyValue)>),
}

impl PyValue {
    /// A list of ints.
    pub fn ints(v: &[usize]) -> PyValue {
        PyValue::List(v.iter().map(|&x| PyValue::Int(x as i64)).collect())
    }
    /// A list of floats.
    pub fn floats(v: &[f64]) -> PyValue {
        PyValue::List(v.iter().map(|&x| PyValue::Float(x)).collect())
    }
    /// A tuple of floats.
    pub fn float_tuple(v: &[f64]) -> PyValue {
        PyValue::Tuple(v.iter().map(|&x| PyValue::Float(x)).collect())
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            PyValue::Int(v) => match i32::try_from(*v) {
                Ok(i) => {
                    out.push(b'J'); // BININT
                    out.extend_from_slice(&i.to_le_bytes());
                }
                Err(_) => {
                    out.extend_from_slice(&[0x8a, 8]); // LONG1, 8 bytes two's complement
                    out.extend_from_slice(&v.to_le_bytes());
                }
            },
            PyValue::Float(v) => {
                out.push(b'G'); // BINFLOAT, big-endian
                out.extend_from_slice(&v.to_be_bytes());
            }
            PyValue::Str(s) => {
                out.push(b'X'); // BINUNICODE
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            PyValue::List(items) => {
                out.extend_from_slice(b"](");
                items.iter().for_each(|i| i.encode(out));
                out.push(b'e'); // APPENDS
            }
            PyValue::Tuple(items) => {
                out.push(b'(');
                items.iter().for_each(|i| i.encode(out));
                out.push(b't');
            }
            PyValue::Dict(items) => {
                out.extend_from_slice(b"}(");
                for (k, v) in items {
                    PyValue::Str(k.clone()).encode(out);
                    v.encode(out);
                }
                out.push(b'u'); // SETITEMS
            }
        }
    }

    /// The value pickled (protocol 2).
    pub fn pickle(&self) -> Vec<u8> {
        let mut out = vec![0x80, 2];
        self.encode(&mut out);
        out.push(b'.');
        out
    }
}

/// Write `value` pickled to `path`.
pub fn write_pickle(path: &Path, value: &PyValue) -> Result<()> {
    std::fs::write(path, value.pickle()).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_spelled_as_numpy_does() {
        for shape in [vec![3, 4, 5, 6], vec![7], vec![2, 100000, 1, 1]] {
            let h = npy_header_f32(&shape);
            assert_eq!(h.len() % 64, 0);
            assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
            let n = u16::from_le_bytes([h[8], h[9]]) as usize;
            assert_eq!(n + 10, h.len());
            assert_eq!(*h.last().unwrap(), b'\n');
        }
        let h = npy_header_f32(&[3, 4, 5, 6]);
        assert!(String::from_utf8_lossy(&h).contains("'shape': (3, 4, 5, 6), }"));
    }

    #[test]
    fn pickle_bytes_of_a_small_dict() {
        let v = PyValue::Dict(vec![
            ("a".into(), PyValue::Int(1)),
            ("b".into(), PyValue::Tuple(vec![PyValue::Float(0.5)])),
        ]);
        let mut want = vec![
            0x80, 2, b'}', b'(', b'X', 1, 0, 0, 0, b'a', b'J', 1, 0, 0, 0,
        ];
        want.extend_from_slice(&[b'X', 1, 0, 0, 0, b'b', b'(', b'G']);
        want.extend_from_slice(&0.5f64.to_be_bytes());
        want.extend_from_slice(b"tu.");
        assert_eq!(v.pickle(), want);
        let big = PyValue::Int(1 << 40).pickle();
        assert_eq!(&big[2..4], &[0x8a, 8]);
    }
}
