//! The mutator: a small deterministic PRNG, the NIfTI-1 header's numeric fields by offset, the
//! values worth writing there, and the mutations (field values, bit flips, byte sets, splices,
//! truncation, gzip wrapping and gzip damage).

use std::io::{Read, Write};

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

/// splitmix64: tiny, fast, and the same stream for the same seed on every machine.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In 0..n (0 when n is 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True `percent` times in a hundred.
    pub(crate) fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// How a header field is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    U8,
    I16,
    I32,
    I64,
    F32,
    F64,
    /// Text (a magic), its length in bytes.
    Magic(usize),
}

impl Kind {
    fn size(self) -> usize {
        match self {
            Kind::U8 => 1,
            Kind::I16 => 2,
            Kind::I32 | Kind::F32 => 4,
            Kind::I64 | Kind::F64 => 8,
            Kind::Magic(n) => n,
        }
    }
}

/// A numeric field of a header: byte offset, element kind, element count.
struct Field(usize, Kind, usize);

/// The fields the parser and the plan read, at their NIfTI-1 offsets.
const FIELDS_1: &[Field] = &[
    Field(0, Kind::I32, 1),        // sizeof_hdr
    Field(40, Kind::I16, 8),       // dim
    Field(70, Kind::I16, 1),       // datatype
    Field(72, Kind::I16, 1),       // bitpix
    Field(76, Kind::F32, 8),       // pixdim
    Field(108, Kind::F32, 1),      // vox_offset
    Field(112, Kind::F32, 1),      // scl_slope
    Field(116, Kind::F32, 1),      // scl_inter
    Field(123, Kind::U8, 1),       // xyzt_units
    Field(252, Kind::I16, 1),      // qform_code
    Field(254, Kind::I16, 1),      // sform_code
    Field(256, Kind::F32, 3),      // quatern_bcd
    Field(268, Kind::F32, 3),      // qoffset_xyz
    Field(280, Kind::F32, 12),     // srow_xyz
    Field(344, Kind::Magic(4), 1), // magic
];

/// The same fields at their NIfTI-2 offsets (64-bit dimensions, offset and geometry).
const FIELDS_2: &[Field] = &[
    Field(0, Kind::I32, 1),      // sizeof_hdr
    Field(4, Kind::Magic(8), 1), // magic
    Field(12, Kind::I16, 1),     // datatype
    Field(14, Kind::I16, 1),     // bitpix
    Field(16, Kind::I64, 8),     // dim
    Field(104, Kind::F64, 8),    // pixdim
    Field(168, Kind::I64, 1),    // vox_offset
    Field(176, Kind::F64, 1),    // scl_slope
    Field(184, Kind::F64, 1),    // scl_inter
    Field(344, Kind::I32, 1),    // qform_code
    Field(348, Kind::I32, 1),    // sform_code
    Field(352, Kind::F64, 3),    // quatern_bcd
    Field(376, Kind::F64, 3),    // qoffset_xyz
    Field(400, Kind::F64, 12),   // srow_xyz
    Field(500, Kind::I32, 1),    // xyzt_units
];

/// The header's size: 348 bytes for NIfTI-1 (voxels at 352 at the earliest), 540 for NIfTI-2
/// (voxels at 544).
fn header_len(b: &[u8]) -> usize {
    if is_nifti2(b) {
        540
    } else {
        348
    }
}

const I16_VALUES: &[i16] = &[
    0,
    1,
    -1,
    2,
    3,
    4,
    7,
    8,
    9,
    -7,
    16,
    32,
    64,
    127,
    128,
    255,
    256,
    511,
    512,
    768,
    1024,
    1280,
    1536,
    1792,
    2048,
    2304,
    i16::MAX,
    i16::MAX - 1,
    i16::MIN,
    i16::MIN + 1,
];

const I32_VALUES: &[i32] = &[
    0,
    1,
    -1,
    2,
    348,
    540,
    349,
    347,
    32767,
    32768,
    i32::MAX,
    i32::MIN,
    1 << 24,
];

const I64_VALUES: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    4,
    7,
    8,
    32767,
    32768,
    540,
    543,
    544,
    1 << 24,
    (1 << 24) + 1,
    1 << 40,
    i64::MAX,
    i64::MIN,
];

/// f32 values worth trying anywhere: signed zeros, NaN, infinities, huge, tiny, subnormals,
/// values around the parser's limits (vox_offset 352 and 1e9), and around integer edges.
fn f32_values() -> [f32; 30] {
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
        1e-30,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        f32::EPSILON,
        1e-7,
        351.9,
        352.0,
        352.5,
        348.0,
        1e9,
        1.0e9 + 64.0,
        16_777_217.0,
        2_147_483_648.0,
        0.999_999_9,
        1.000_000_1,
    ]
}

/// f64 values: the f32 ones, and those past f32's range or precision.
fn f64_values() -> Vec<f64> {
    let mut v: Vec<f64> = f32_values().iter().map(|&x| x as f64).collect();
    v.extend([
        1e300,
        -1e300,
        f64::MAX,
        f64::MIN_POSITIVE,
        f64::from_bits(1),
        3.5e38,
        1e-50,
        0.1,
        1.0 + f64::EPSILON,
    ]);
    v
}

const MAGICS: &[&[u8]] = &[
    b"n+1\0",
    b"ni1\0",
    b"n+2\0",
    b"n+1 ",
    b"\0\0\0\0",
    b"N+1\0",
    b"n+2\0\r\n\x1a\n",
    b"ni2\0\r\n\x1a\n",
    b"n+2\0\n\n\x1a\n",
    b"n+1\0\r\n\x1a\n",
];

/// Whether sizeof_hdr says NIfTI-2 (540, in either byte order).
fn is_nifti2(b: &[u8]) -> bool {
    b.len() >= 4 && {
        let a = [b[0], b[1], b[2], b[3]];
        i32::from_le_bytes(a) == 540 || i32::from_be_bytes(a) == 540
    }
}

/// The field table of the header version the bytes announce.
fn fields(b: &[u8]) -> &'static [Field] {
    if is_nifti2(b) {
        FIELDS_2
    } else {
        FIELDS_1
    }
}

/// The byte order a header says it is in: NIfTI-2 by its sizeof_hdr, NIfTI-1 by dim[0] (1..=7
/// read little-endian means little).
fn header_is_big_endian(b: &[u8]) -> bool {
    if is_nifti2(b) {
        return i32::from_le_bytes([b[0], b[1], b[2], b[3]]) != 540;
    }
    if b.len() < 42 {
        return false;
    }
    let d0 = u16::from_le_bytes([b[40], b[41]]);
    !(1..=7).contains(&d0)
}

/// Write `le_bytes` (a little-endian value) at `at`, reversed when `big`.
fn put(buf: &mut [u8], at: usize, le_bytes: &[u8], big: bool) {
    if at + le_bytes.len() > buf.len() {
        return;
    }
    let dst = &mut buf[at..at + le_bytes.len()];
    if big {
        for (d, s) in dst.iter_mut().zip(le_bytes.iter().rev()) {
            *d = *s;
        }
    } else {
        dst.copy_from_slice(le_bytes);
    }
}

/// An interesting value written into one element of one header field.
fn set_field(rng: &mut Rng, buf: &mut [u8]) {
    let f = rng.pick(fields(buf));
    let at = f.0 + rng.below(f.2) * f.1.size();
    // Mostly in the header's own byte order; sometimes the other way round.
    let big = header_is_big_endian(buf) ^ rng.chance(10);
    let typical = rng.chance(85);
    let noise = rng.next_u64();
    match f.1 {
        Kind::U8 => {
            let v = *rng.pick(&[0u8, 1, 2, 3, 4, 7, 8, 0x10, 0x18, 0x38, 0xff]);
            put(buf, at, &[v], big);
        }
        Kind::I16 => {
            let v = if typical {
                *rng.pick(I16_VALUES)
            } else {
                noise as i16
            };
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::I32 => {
            let v = if typical {
                *rng.pick(I32_VALUES)
            } else {
                noise as i32
            };
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::I64 => {
            let v = if typical {
                *rng.pick(I64_VALUES)
            } else {
                noise as i64
            };
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::F32 => {
            let v = if typical {
                *rng.pick(&f32_values())
            } else {
                f32::from_bits(noise as u32)
            };
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::F64 => {
            let v = if typical {
                *rng.pick(&f64_values())
            } else {
                f64::from_bits(noise)
            };
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::Magic(n) => {
            let m = rng.pick(MAGICS);
            let n = n.min(m.len());
            put(buf, at, &m[..n], false);
        }
    }
}

/// A small change to a numeric field: an integer nudged by a few, a float scaled or negated.
fn nudge_field(rng: &mut Rng, buf: &mut [u8]) {
    let f = rng.pick(fields(buf));
    let size = f.1.size();
    let at = f.0 + rng.below(f.2) * size;
    let big = header_is_big_endian(buf);
    if at + size > buf.len() {
        return;
    }
    let mut le = buf[at..at + size].to_vec();
    if big {
        le.reverse();
    }
    let step = *rng.pick(&[-2i64, -1, 1, 2, 100, -100]);
    let scale = |rng: &mut Rng, v: f64| match rng.below(5) {
        0 => -v,
        1 => v * 1e10,
        2 => v * 1e-10,
        3 => v * 3.0,
        _ => v * 0.5,
    };
    match f.1 {
        Kind::I16 => {
            let v = i16::from_le_bytes([le[0], le[1]]).wrapping_add(step as i16);
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::I32 => {
            let v = i32::from_le_bytes([le[0], le[1], le[2], le[3]]).wrapping_add(step as i32);
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::I64 => {
            let a: [u8; 8] = le[..8].try_into().unwrap_or([0; 8]);
            let v = i64::from_le_bytes(a).wrapping_add(step);
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::F32 => {
            let v = f32::from_le_bytes([le[0], le[1], le[2], le[3]]);
            let v = if rng.chance(20) {
                f32::from_bits(v.to_bits().wrapping_add(1)) // the next float up
            } else {
                scale(rng, v as f64) as f32
            };
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::F64 => {
            let a: [u8; 8] = le[..8].try_into().unwrap_or([0; 8]);
            let v = scale(rng, f64::from_le_bytes(a));
            put(buf, at, &v.to_le_bytes(), big);
        }
        Kind::U8 | Kind::Magic(_) => set_field(rng, buf),
    }
}

/// A length to cut an input to: into the header, around its edges, around the voxels' end.
fn cut_length(rng: &mut Rng, head: usize, len: usize) -> usize {
    let choices = [
        rng.below(head),
        head - 1,
        head,
        head + 3,
        head + 4,
        len.saturating_sub(1),
        len.saturating_sub(1 + rng.below(16)),
        rng.below(len + 1),
        0,
        2,
    ];
    choices[rng.below(choices.len())].min(len)
}

/// One mutation of the uncompressed bytes; `other` is another seed to splice from.
fn mutate_plain(rng: &mut Rng, buf: &mut Vec<u8>, other: &[u8]) {
    match rng.below(100) {
        0..=39 => set_field(rng, buf),
        40..=49 => nudge_field(rng, buf),
        50..=61 => {
            // Bit flips, mostly in the header.
            let span = if rng.chance(85) {
                buf.len().min(header_len(buf))
            } else {
                buf.len()
            };
            for _ in 0..1 + rng.below(4) {
                if span > 0 {
                    let i = rng.below(span);
                    buf[i] ^= 1 << rng.below(8);
                }
            }
        }
        62..=69 => {
            if !buf.is_empty() {
                let i = rng.below(buf.len());
                let noise = rng.next_u64() as u8;
                buf[i] = *rng.pick(&[0u8, 0xff, 0x7f, 0x80, 1, noise]);
            }
        }
        70..=79 => {
            let n = cut_length(rng, header_len(buf), buf.len());
            buf.truncate(n);
        }
        80..=86 => {
            // More bytes at the end: zeros, or noise.
            let n = *rng.pick(&[1usize, 4, 7, 64, 1000]);
            let noise = rng.chance(50);
            for _ in 0..n {
                buf.push(if noise { rng.next_u64() as u8 } else { 0 });
            }
        }
        _ => {
            // Splice: one field-sized run copied from another seed (a datatype with another's
            // bitpix, a dim with another's data, a quaternion with another's codes...).
            let f = rng.pick(fields(buf));
            let (at, len) = (f.0, f.1.size() * f.2);
            if at + len <= buf.len() && at + len <= other.len() {
                buf[at..at + len].copy_from_slice(&other[at..at + len]);
            }
        }
    }
}

/// Gzip `bytes` in `members` members (one in most files, several as some writers do).
pub(crate) fn gzip(bytes: &[u8], members: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let part = bytes.len().div_ceil(members.max(1)).max(1);
    for piece in bytes.chunks(part) {
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        gz.write_all(piece).expect("gzip into memory");
        out.extend(gz.finish().expect("gzip into memory"));
    }
    if bytes.is_empty() {
        out = GzEncoder::new(Vec::new(), Compression::fast())
            .finish()
            .expect("gzip into memory");
    }
    out
}

/// The inflated bytes of a gzip input that inflates cleanly (at most `limit` bytes).
pub(crate) fn gunzip(bytes: &[u8], limit: u64) -> Option<Vec<u8>> {
    if bytes.len() < 2 || bytes[..2] != [0x1f, 0x8b] {
        return None;
    }
    let mut out = Vec::new();
    MultiGzDecoder::new(bytes)
        .take(limit)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// Damage to a gzip stream: a byte flipped mid-stream, the trailer (CRC, length) cut or
/// wrong, the stream cut short, garbage after it, header flags that promise extra fields.
fn damage_gzip(rng: &mut Rng, gz: &mut Vec<u8>) {
    let n = gz.len();
    if n < 18 {
        return;
    }
    match rng.below(7) {
        0 => {
            let i = 10 + rng.below(n - 18);
            gz[i] ^= 1 << rng.below(8);
        }
        1 => gz.truncate(n - 1 - rng.below(8)),
        2 => gz[n - 8 + rng.below(4)] ^= 0x55,
        3 => gz[n - 4 + rng.below(4)] ^= 0x55,
        4 => gz.truncate(rng.below(n)),
        5 => gz.extend_from_slice(&[0x1f, 0x8b, 0x08, 0x00, 0x42]),
        _ => gz[3] = *rng.pick(&[0x04u8, 0x08, 0x10, 0x02, 0xff]),
    }
}

/// A new input from `seed` (plain or gzip bytes): its uncompressed bytes mutated one to four
/// times, then stored plain or gzip-wrapped (and sometimes damaged as a gzip stream).
pub(crate) fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let inflated = gunzip(seed, 1 << 20);
    let was_gzip = inflated.is_some();
    let mut buf = inflated.unwrap_or_else(|| seed.to_vec());
    let other = gunzip(other, 1 << 20).unwrap_or_else(|| other.to_vec());
    for _ in 0..1 + rng.below(4) {
        mutate_plain(rng, &mut buf, &other);
    }
    let wrap = if was_gzip {
        rng.chance(80)
    } else {
        rng.chance(25)
    };
    if !wrap {
        return buf;
    }
    let members = if rng.chance(85) { 1 } else { 2 + rng.below(3) };
    let mut gz = gzip(&buf, members);
    if rng.chance(30) {
        damage_gzip(rng, &mut gz);
    }
    gz
}
