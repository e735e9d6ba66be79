//! `--preview CASE --out FILE.png`: the case's three middle slices side by side (axial at the
//! middle z, coronal at the middle y, sagittal at the middle x), grey, with the label as a
//! half-transparent coloured overlay (class 1 red, 2 green, 3 blue, 4 yellow, 5 magenta, 6 cyan,
//! then again).
//!
//! Geometry: every slice is resampled (nearest neighbour) to one common physical pixel size, so
//! the panels show true proportions. That size starts at the smallest voxel spacing and is then
//! adjusted so the largest physical extent among the panels spans between 256 and 1024 pixels;
//! a panel of physical width `W` and height `H` is `round(W / p)` x `round(H / p)` pixels. Panels
//! sit side by side, top-aligned, 4 black pixels apart. Rows are flipped so that the higher voxel
//! index is at the top (superior up for RAS data). Intensities are windowed to the 1st..99th
//! percentile of the three displayed slices.
//!
//! From a dataset folder the raw NIfTI files are read; from a cache only the three slices are
//! read from the entry's arrays, never the whole volume.

use std::path::Path;

use serde::Serialize;

use super::entry_meta::find_entry;
use super::{detect, Kind};
use crate::cache::reader::EntryReader;
use crate::error::{Error, Result};
use crate::nifti_io;
use crate::prep::dataset::{discover, DatasetSource};
use crate::prep::plan::percentile;

/// What was drawn.
#[derive(Clone, Debug, Serialize)]
pub struct PreviewInfo {
    /// The case drawn.
    pub case: String,
    /// "nifti" or "cache".
    pub source: &'static str,
    /// Width of the PNG in pixels.
    pub width: u32,
    /// Height of the PNG in pixels.
    pub height: u32,
    /// Slice indices shown: axial z, coronal y, sagittal x.
    pub slices_zyx: [usize; 3],
    /// Physical size of one pixel, in the volume's units.
    pub pixel_size: f64,
    /// Intensity window (1st and 99th percentile).
    pub window: [f64; 2],
}

/// One 2-D slice in row-major order.
struct Slice {
    rows: usize,
    cols: usize,
    row_spacing: f64,
    col_spacing: f64,
    image: Vec<f32>,
    label: Option<Vec<u16>>,
}

const GAP: usize = 4;
const MIN_SIDE: f64 = 256.0;
const MAX_SIDE: f64 = 1024.0;
const ALPHA: f32 = 0.5;
const PALETTE: [[u8; 3]; 6] = [
    [255, 0, 0],
    [0, 255, 0],
    [0, 96, 255],
    [255, 255, 0],
    [255, 0, 255],
    [0, 255, 255],
];

/// Middle indices (z, y, x) of a volume of shape (z, y, x).
fn middles(shape_zyx: [usize; 3]) -> [usize; 3] {
    shape_zyx.map(|n| n / 2)
}

/// The three middle slices of a (z, y, x) C-order volume.
/// The three middle slices (axial, coronal, sagittal) of a volume file, streamed: only the
/// slices are kept, whatever the volume's size. `check` sees every block first.
fn cut_slices(
    path: &Path,
    frame: Option<usize>,
    shape_zyx: [usize; 3],
    check: &mut dyn FnMut(&[f32]) -> Result<()>,
) -> Result<[Vec<f32>; 3]> {
    let mut cut = SliceCut::new(shape_zyx);
    nifti_io::stream_f32_frame(path, frame, &mut |start, data| {
        check(data)?;
        cut.add(start, data);
        Ok(())
    })?;
    Ok(cut.out)
}

/// The middle slices of a volume that arrives in C-order blocks.
struct SliceCut {
    shape: [usize; 3],
    mid: [usize; 3],
    out: [Vec<f32>; 3],
}

impl SliceCut {
    fn new(shape: [usize; 3]) -> Self {
        let [nz, ny, nx] = shape;
        SliceCut {
            shape,
            mid: middles(shape),
            out: [vec![0.0; ny * nx], vec![0.0; nz * nx], vec![0.0; nz * ny]],
        }
    }

    /// Voxels `start..start + data.len()`; a block may start or end inside a row.
    fn add(&mut self, start: usize, data: &[f32]) {
        let [_, ny, nx] = self.shape;
        let [mz, my, mx] = self.mid;
        let end = start + data.len();
        let mut i = start;
        while i < end {
            let (r, x0) = (i / nx, i % nx);
            let stop = end.min((r + 1) * nx);
            let seg = &data[i - start..stop - start];
            let (z, y) = (r / ny, r % ny);
            if z == mz {
                self.out[0][y * nx + x0..][..seg.len()].copy_from_slice(seg);
            }
            if y == my {
                self.out[1][z * nx + x0..][..seg.len()].copy_from_slice(seg);
            }
            if (x0..x0 + seg.len()).contains(&mx) {
                self.out[2][z * ny + y] = seg[mx - x0];
            }
            i = stop;
        }
    }
}

/// Rows, columns and their spacings of the axial, coronal and sagittal slices.
fn slice_grids(shape_zyx: [usize; 3], spacing_xyz: [f64; 3]) -> [(usize, usize, f64, f64); 3] {
    let [nz, ny, nx] = shape_zyx;
    let [sx, sy, sz] = spacing_xyz;
    [(ny, nx, sy, sx), (nz, nx, sz, sx), (nz, ny, sz, sy)]
}

fn assemble(
    shape_zyx: [usize; 3],
    spacing_xyz: [f64; 3],
    images: [Vec<f32>; 3],
    labels: Option<[Vec<u16>; 3]>,
) -> [Slice; 3] {
    let grids = slice_grids(shape_zyx, spacing_xyz);
    let mut labels = labels.map(|l| l.map(Some)).unwrap_or([None, None, None]);
    let mut images = images.map(Some);
    [0, 1, 2].map(|i| {
        let (rows, cols, row_spacing, col_spacing) = grids[i];
        Slice {
            rows,
            cols,
            row_spacing,
            col_spacing,
            image: images[i].take().unwrap_or_default(),
            label: labels[i].take(),
        }
    })
}

/// Channel `channel` of the case's image files, or an error naming how many it has.
fn channel_of(case: &str, n: usize, channel: usize) -> Result<()> {
    if channel >= n {
        return Err(Error::case(
            case,
            format!("no image channel {channel}: the case has {n} (channels count from 0)"),
        ));
    }
    Ok(())
}

fn from_dataset(root: &Path, case: &str, channel: usize) -> Result<([Slice; 3], [usize; 3])> {
    let cases = discover(&DatasetSource::Folder(root.to_path_buf()))?.cases;
    let Some(c) = cases.iter().find(|c| c.id == case) else {
        let ids: Vec<&str> = cases.iter().take(5).map(|c| c.id.as_str()).collect();
        return Err(Error::Dataset(format!(
            "no case {case} in {} (cases: {}{})",
            root.display(),
            ids.join(", "),
            if cases.len() > 5 { ", ..." } else { "" }
        )));
    };
    channel_of(case, c.images.len(), channel)?;
    let (image_path, frame) = c.channel(channel);
    let image = nifti_io::read_frame_header(image_path, frame)?;
    let [x, y, z] = image.shape_xyz;
    let shape = [z, y, x];
    let labels = match &c.label {
        Some(p) => {
            let l = nifti_io::read_header(p)?;
            if l.shape_xyz != image.shape_xyz {
                return Err(Error::case(
                    case,
                    format!(
                        "image is {:?} voxels but label {} is {:?}",
                        image.shape_xyz,
                        p.display(),
                        l.shape_xyz
                    ),
                ));
            }
            let mut check = nifti_io::LabelCheck::new(p);
            let cut = cut_slices(p, None, shape, &mut |b| check.block(b))?;
            Some(cut.map(|s| s.into_iter().map(|v| v as u16).collect()))
        }
        None => None,
    };
    let images = cut_slices(image_path, frame, shape, &mut |_| Ok(()))?;
    Ok((
        assemble(shape, image.spacing_xyz, images, labels),
        middles(shape),
    ))
}

/// The boxes (start, size) of the three middle slices: axial, coronal, sagittal.
fn slice_boxes(shape_zyx: [usize; 3]) -> [([i64; 3], [usize; 3]); 3] {
    let [nz, ny, nx] = shape_zyx;
    let [mz, my, mx] = middles(shape_zyx).map(|v| v as i64);
    [
        ([mz, 0, 0], [1, ny, nx]),
        ([0, my, 0], [nz, 1, nx]),
        ([0, 0, mx], [nz, ny, 1]),
    ]
}

fn from_cache(root: &Path, case: &str, channel: usize) -> Result<([Slice; 3], [usize; 3])> {
    let m = find_entry(root, case)?;
    // The trainer's reader: only the chunks under each slice are read.
    let entry = EntryReader::open(&m.dir)?;
    channel_of(case, entry.channels(), channel)?;
    let shape = entry.shape_zyx();
    let boxes = slice_boxes(shape);
    let mut images: [Vec<f32>; 3] = Default::default();
    for (i, (start, size)) in boxes.iter().enumerate() {
        images[i] = vec![0.0; size.iter().product()];
        entry.read_channel(channel, *start, *size, &mut images[i])?;
    }
    let labels = match entry.label_dtype() {
        None => None,
        Some(_) => {
            let mut out: [Vec<u16>; 3] = Default::default();
            for (i, (start, size)) in boxes.iter().enumerate() {
                out[i] = vec![0; size.iter().product()];
                entry.read_label(*start, *size, &mut out[i])?;
            }
            Some(out)
        }
    };
    Ok((
        assemble(shape, m.spacing_xyz, images, labels),
        middles(shape),
    ))
}

/// The common physical pixel size for a set of slices.
fn pixel_size(slices: &[Slice; 3]) -> f64 {
    let extent = slices
        .iter()
        .flat_map(|s| [s.rows as f64 * s.row_spacing, s.cols as f64 * s.col_spacing])
        .fold(0.0, f64::max);
    let finest = slices
        .iter()
        .flat_map(|s| [s.row_spacing, s.col_spacing])
        .fold(f64::INFINITY, f64::min);
    let sides = extent / finest;
    if sides > MAX_SIDE {
        extent / MAX_SIDE
    } else if sides < MIN_SIDE {
        extent / MIN_SIDE
    } else {
        finest
    }
}

/// Render the slices into an RGB image: (width, height, pixels, window).
fn render(slices: &[Slice; 3], p: f64) -> (usize, usize, Vec<u8>, [f64; 2]) {
    let values: Vec<f64> = slices
        .iter()
        .flat_map(|s| s.image.iter())
        .filter(|v| v.is_finite())
        .map(|&v| v as f64)
        .collect();
    let lo = percentile(&values, 1.0);
    let hi = percentile(&values, 99.0);
    let (lo, hi) = match (lo.is_finite(), hi.is_finite()) {
        (true, true) if hi > lo => (lo, hi),
        (true, _) => (lo, lo + 1.0),
        _ => (0.0, 1.0),
    };
    let dims: Vec<(usize, usize)> = slices
        .iter()
        .map(|s| {
            let w = (s.cols as f64 * s.col_spacing / p).round().max(1.0) as usize;
            let h = (s.rows as f64 * s.row_spacing / p).round().max(1.0) as usize;
            (w, h)
        })
        .collect();
    let width = dims.iter().map(|d| d.0).sum::<usize>() + GAP * (dims.len() - 1);
    let height = dims.iter().map(|d| d.1).max().unwrap_or(1);
    let mut rgb = vec![0u8; width * height * 3];
    let mut x0 = 0;
    for (s, &(w, h)) in slices.iter().zip(&dims) {
        for r in 0..h {
            let src_r = ((r as f64 + 0.5) * s.rows as f64 / h as f64) as usize;
            let src_r = s.rows - 1 - src_r.min(s.rows - 1);
            for c in 0..w {
                let src_c =
                    (((c as f64 + 0.5) * s.cols as f64 / w as f64) as usize).min(s.cols - 1);
                let i = src_r * s.cols + src_c;
                let v = s.image.get(i).copied().unwrap_or(f32::NAN) as f64;
                let g = if v.is_finite() {
                    ((v - lo) / (hi - lo)).clamp(0.0, 1.0) as f32 * 255.0
                } else {
                    0.0
                };
                let mut px = [g; 3];
                let class = s
                    .label
                    .as_ref()
                    .and_then(|l| l.get(i))
                    .copied()
                    .unwrap_or(0);
                if class > 0 {
                    let col = PALETTE[(class as usize - 1) % PALETTE.len()];
                    for k in 0..3 {
                        px[k] = (1.0 - ALPHA) * g + ALPHA * col[k] as f32;
                    }
                }
                let o = (r * width + x0 + c) * 3;
                for k in 0..3 {
                    rgb[o + k] = px[k].round().clamp(0.0, 255.0) as u8;
                }
            }
        }
        x0 += w + GAP;
    }
    (width, height, rgb, [lo, hi])
}

fn write_png(out: &Path, width: usize, height: usize, rgb: &[u8]) -> Result<()> {
    let file = std::fs::File::create(out).map_err(|e| Error::io(out, e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), width as u32, height as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let fail = |e: png::EncodingError| Error::io(out, std::io::Error::other(e.to_string()));
    let mut w = enc.write_header().map_err(fail)?;
    w.write_image_data(rgb).map_err(fail)?;
    w.finish().map_err(fail)
}

/// Refuse an output file inside the cache being read.
fn check_out_outside(root: &Path, out: &Path) -> Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if let (Ok(r), Ok(p)) = (std::fs::canonicalize(root), std::fs::canonicalize(&parent)) {
        if p.starts_with(&r) {
            return Err(Error::Config(format!(
                "--out {}: inside the cache {}; inspect never writes into the cache it reads",
                out.display(),
                root.display()
            )));
        }
    }
    Ok(())
}

/// Draw the preview of image channel `channel` (0 for a one-channel image) of `case` from a
/// dataset or cache folder into `out` (a PNG file).
pub fn write_preview(path: &Path, case: &str, channel: usize, out: &Path) -> Result<PreviewInfo> {
    let kind = detect(path)?;
    let (slices, mid) = match kind {
        Kind::Dataset => from_dataset(path, case, channel)?,
        Kind::Cache => {
            check_out_outside(path, out)?;
            from_cache(path, case, channel)?
        }
    };
    if slices.iter().any(|s| s.rows == 0 || s.cols == 0) {
        return Err(Error::case(case, "empty volume: nothing to draw"));
    }
    let p = pixel_size(&slices);
    let (width, height, rgb, window) = render(&slices, p);
    write_png(out, width, height, &rgb)?;
    Ok(PreviewInfo {
        case: case.to_string(),
        source: match kind {
            Kind::Dataset => "nifti",
            Kind::Cache => "cache",
        },
        width: width as u32,
        height: height as u32,
        slices_zyx: mid,
        pixel_size: p,
        window,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cut_the_middle_planes() {
        // shape (z, y, x) = (2, 3, 4); value = 100 z + 10 y + x.
        let data: Vec<f32> = (0..2)
            .flat_map(|z| (0..3).flat_map(move |y| (0..4).map(move |x| 100 * z + 10 * y + x)))
            .map(|v| v as f32)
            .collect();
        // Blocks of 5 voxels: they start and end inside rows.
        let mut cut = SliceCut::new([2, 3, 4]);
        for (k, block) in data.chunks(5).enumerate() {
            cut.add(k * 5, block);
        }
        let [a, c, s] = cut.out;
        assert_eq!(
            a,
            [100, 101, 102, 103, 110, 111, 112, 113, 120, 121, 122, 123].map(|v| v as f32)
        );
        assert_eq!(c, [10, 11, 12, 13, 110, 111, 112, 113].map(|v| v as f32));
        assert_eq!(s, [2, 12, 22, 102, 112, 122].map(|v| v as f32));
    }

    #[test]
    fn panels_keep_physical_proportions() {
        let slices = assemble(
            [4, 12, 16],
            [1.0, 1.0, 3.0],
            [vec![0.0; 192], vec![0.0; 64], vec![0.0; 48]],
            None,
        );
        let p = pixel_size(&slices);
        assert_eq!(p, 16.0 / 256.0);
        let (w, h, rgb, _) = render(&slices, p);
        assert_eq!((w, h), (256 + 256 + 192 + 2 * GAP, 192));
        assert_eq!(rgb.len(), w * h * 3);
    }
}
