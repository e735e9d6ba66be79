//! Tests of the spatial transform: in-memory sources (a volume of known values, stored with two
//! channels or byte labels, or poisoned outside the spans a read asks for), the whole-volume
//! reference interpolation, and the vector builds this CPU runs. The tests themselves are in
//! the files below, by what they check.

mod derived;
mod footprint;
mod reader;
mod transform;

use super::footprint::footprint_spans_3d;
use super::sample::cell;
use super::transform::{centre_of, IDENTITY};
use super::*;
use crate::cache::source::SpanOut;
use crate::cache::PatchSource;
use crate::error::Result;
use crate::geometry::mirror;
use crate::util::rng::Rng;
use crate::util::simd::{self, Simd};

/// A volume in memory as a patch source (image linear in each axis, label by thresholds).
struct Volume {
    shape: [usize; 3],
    image: Vec<f32>,
    label: Vec<u16>,
}

impl Volume {
    fn new(shape: [usize; 3]) -> Self {
        let n: usize = shape.iter().product();
        let mut image = Vec::with_capacity(n);
        let mut label = Vec::with_capacity(n);
        for i in 0..n {
            let (z, y, x) = (
                i / (shape[1] * shape[2]),
                (i / shape[2]) % shape[1],
                i % shape[2],
            );
            image.push(((z * 31 + y * 7 + x * 3) % 17) as f32 - 8.0 + 0.25 * x as f32);
            label.push(((x / 3 + y / 4 + z / 2) % 3) as u16);
        }
        Volume {
            shape,
            image,
            label,
        }
    }

    fn get<T: Copy + Default>(&self, v: &[T], p: [i64; 3]) -> T {
        if (0..3).any(|a| p[a] < 0 || p[a] >= self.shape[a] as i64) {
            return T::default();
        }
        v[((p[0] as usize) * self.shape[1] + p[1] as usize) * self.shape[2] + p[2] as usize]
    }
}

impl PatchSource for Volume {
    fn name(&self) -> String {
        "volume".into()
    }
    fn shape_zyx(&self) -> [usize; 3] {
        self.shape
    }
    fn has_label(&self) -> bool {
        true
    }
    fn classes(&self) -> Vec<u16> {
        vec![1, 2]
    }
    fn fg_coords(&self, _: u16) -> Result<Vec<[u32; 3]>> {
        Ok(vec![])
    }
    fn read_image(&self, s: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
        self.fill(&self.image, s, size, out);
        Ok(())
    }
    fn read_label(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        self.fill(&self.label, s, size, out);
        Ok(())
    }
    fn has_distance(&self) -> bool {
        true
    }
    fn has_skeleton(&self) -> bool {
        true
    }
    fn read_distance(
        &self,
        class: u16,
        s: [i64; 3],
        size: [usize; 3],
        out: &mut [f32],
    ) -> Result<()> {
        self.fill(&self.distance(class), s, size, out);
        Ok(())
    }
    fn read_skeleton(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        self.fill(&self.skeleton(), s, size, out);
        Ok(())
    }
}

impl Volume {
    /// A stand-in for the signed distance of `class` (any field serves to test the
    /// interpolation): the image scaled per class.
    fn distance(&self, class: u16) -> Vec<f32> {
        self.image.iter().map(|v| v * class as f32 - 1.0).collect()
    }

    /// A stand-in skeleton: the label on a sparse lattice of voxels, 0 elsewhere.
    fn skeleton(&self) -> Vec<u16> {
        let [_, ny, nx] = self.shape;
        (0..self.label.len())
            .map(|i| {
                let (z, y, x) = (i / (ny * nx), (i / nx) % ny, i % nx);
                if (x + 2 * y + 3 * z) % 5 == 0 {
                    self.label[i]
                } else {
                    0
                }
            })
            .collect()
    }
}

/// The volume stored otherwise: with a second image channel (`3 - image / 2`), or with
/// its label one byte a voxel (as uint8 labels in a cache).
struct Stored {
    v: Volume,
    two_channels: bool,
    byte_labels: bool,
}

/// The test volume stored as it is, with a second channel, and with byte labels.
fn stored_three_ways() -> [Stored; 3] {
    [(false, false), (true, false), (false, true)].map(|(two, bytes)| Stored {
        v: Volume::new([14, 30, 28]),
        two_channels: two,
        byte_labels: bytes,
    })
}

impl PatchSource for Stored {
    fn name(&self) -> String {
        "stored otherwise".into()
    }
    fn shape_zyx(&self) -> [usize; 3] {
        self.v.shape
    }
    fn has_label(&self) -> bool {
        true
    }
    fn channels(&self) -> usize {
        1 + usize::from(self.two_channels)
    }
    fn classes(&self) -> Vec<u16> {
        vec![1, 2]
    }
    fn fg_coords(&self, _: u16) -> Result<Vec<[u32; 3]>> {
        Ok(vec![])
    }
    fn read_image(&self, s: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
        if !self.two_channels {
            return self.v.read_image(s, size, out);
        }
        let (first, second) = out.split_at_mut(out.len() / 2);
        self.v.fill(&self.v.image, s, size, first);
        let other: Vec<f32> = self.v.image.iter().map(|v| 3.0 - v / 2.0).collect();
        self.v.fill(&other, s, size, second);
        Ok(())
    }
    fn read_label(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        assert!(!self.byte_labels, "a byte label is read as bytes");
        self.v.read_label(s, size, out)
    }
    fn label_bytes(&self) -> bool {
        self.byte_labels
    }
    fn read_label_u8(&self, s: [i64; 3], size: [usize; 3], out: &mut [u8]) -> Result<()> {
        let bytes: Vec<u8> = self.v.label.iter().map(|&l| l as u8).collect();
        self.v.fill(&bytes, s, size, out);
        Ok(())
    }
    fn has_distance(&self) -> bool {
        true
    }
    fn has_skeleton(&self) -> bool {
        true
    }
    fn read_distance(
        &self,
        class: u16,
        s: [i64; 3],
        size: [usize; 3],
        out: &mut [f32],
    ) -> Result<()> {
        self.v.read_distance(class, s, size, out)
    }
    fn read_skeleton(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        self.v.read_skeleton(s, size, out)
    }
}

impl Volume {
    /// The box `s .. s + size` of `v`, zero outside the volume.
    fn fill<T: Copy + Default>(&self, v: &[T], s: [i64; 3], size: [usize; 3], out: &mut [T]) {
        for (i, o) in out.iter_mut().enumerate() {
            let p = [
                i / (size[1] * size[2]),
                (i / size[2]) % size[1],
                i % size[2],
            ];
            *o = self.get(v, [0, 1, 2].map(|a| s[a] + p[a] as i64));
        }
    }
}

/// Whole-volume reference: trilinear over the zero-padded volume at a coordinate.
fn reference_linear(v: &Volume, c: [f64; 3]) -> f64 {
    reference_linear_in(v, &v.image, c)
}

/// [`reference_linear`] over another array of the volume's shape.
fn reference_linear_in(v: &Volume, a: &[f32], c: [f64; 3]) -> f64 {
    let i0 = c.map(|x| x.floor() as i64);
    let f = [0, 1, 2].map(|a| c[a] - i0[a] as f64);
    let mut s = 0.0;
    for k in 0..8 {
        let up = [(k >> 2) & 1, (k >> 1) & 1, k & 1];
        let w: f64 = (0..3)
            .map(|a| if up[a] == 1 { f[a] } else { 1.0 - f[a] })
            .product();
        let p = [0, 1, 2].map(|a| i0[a] + up[a] as i64);
        s += w * v.get(a, p) as f64;
    }
    s
}

/// The vector builds this CPU runs, each as a forced build.
fn vector_builds() -> Vec<Simd> {
    [Simd::Avx2]
        .into_iter()
        .filter(|&b| b <= simd::detected())
        .collect()
}

/// A source whose span reads leave poison outside the spans (NaN in the image, 200 in the
/// label): a patch that used a voxel outside them shows it.
struct Poisoned(Stored);

impl PatchSource for Poisoned {
    fn name(&self) -> String {
        "poisoned".into()
    }
    fn shape_zyx(&self) -> [usize; 3] {
        self.0.shape_zyx()
    }
    fn has_label(&self) -> bool {
        true
    }
    fn channels(&self) -> usize {
        self.0.channels()
    }
    fn classes(&self) -> Vec<u16> {
        self.0.classes()
    }
    fn fg_coords(&self, c: u16) -> Result<Vec<[u32; 3]>> {
        self.0.fg_coords(c)
    }
    fn read_image(&self, s: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
        self.0.read_image(s, size, out)
    }
    fn read_label(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        self.0.read_label(s, size, out)
    }
    fn label_bytes(&self) -> bool {
        self.0.label_bytes()
    }
    fn read_label_u8(&self, s: [i64; 3], size: [usize; 3], out: &mut [u8]) -> Result<()> {
        self.0.read_label_u8(s, size, out)
    }
    fn has_distance(&self) -> bool {
        true
    }
    fn has_skeleton(&self) -> bool {
        true
    }
    fn read_distance(
        &self,
        class: u16,
        s: [i64; 3],
        size: [usize; 3],
        out: &mut [f32],
    ) -> Result<()> {
        self.0.read_distance(class, s, size, out)
    }
    fn read_skeleton(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        self.0.read_skeleton(s, size, out)
    }
    fn read_spans(
        &self,
        s: [i64; 3],
        size: [usize; 3],
        spans: &[(u32, u32)],
        out: SpanOut,
    ) -> Result<()> {
        let n: usize = size.iter().product();
        let outside = |i: usize| {
            let (r, x) = ((i % n) / size[2], (i % size[2]) as u32);
            let (a, b) = if spans.len() == size[1] {
                spans[r % size[1]]
            } else {
                spans[r]
            };
            !(a..b).contains(&x)
        };
        fn poison<T: Copy>(out: &mut [T], bad: T, outside: impl Fn(usize) -> bool) {
            for (i, v) in out.iter_mut().enumerate() {
                if outside(i) {
                    *v = bad;
                }
            }
        }
        match out {
            SpanOut::Image(o) => {
                self.read_image(s, size, o)?;
                poison(o, f32::NAN, outside);
            }
            SpanOut::Label(o) => {
                self.read_label(s, size, o)?;
                poison(o, 200, outside);
            }
            SpanOut::LabelBytes(o) => {
                self.read_label_u8(s, size, o)?;
                poison(o, 200, outside);
            }
            SpanOut::Distance(c, o) => {
                self.read_distance(c, s, size, o)?;
                poison(o, f32::NAN, outside);
            }
            SpanOut::Skeleton(o) => {
                self.read_skeleton(s, size, o)?;
                poison(o, 200, outside);
            }
            SpanOut::NormMask(o) => {
                self.read_norm_mask(s, size, o)?;
                poison(o, 200, outside);
            }
        }
        Ok(())
    }
}
