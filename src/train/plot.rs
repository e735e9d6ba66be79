//! Training curves as a PNG: left, the training loss per logged step (light dots) with a
//! trailing moving average (bold line); right, the mean validation Dice on a fixed 0..1 axis.
//!
//! Drawn on a plain RGB raster with a tiny 5x7 bitmap font of our own, so no plotting or font
//! library is needed. The file is replaced atomically, so a viewer never sees half an image.

use std::path::Path;

use super::metrics::Record;
use crate::error::{Error, Result};
use crate::util::files::write_atomic;

/// Width of the curves image in pixels.
pub const WIDTH: usize = 900;
/// Height of the curves image in pixels.
pub const HEIGHT: usize = 420;

type Rgb = [u8; 3];
const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [0, 0, 0];
const GRID: Rgb = [228, 228, 228];
const RAW_LOSS: Rgb = [150, 180, 230];
const AVG_LOSS: Rgb = [20, 60, 170];
const VAL_DICE: Rgb = [220, 100, 0];

/// Plot area margins inside a panel: room for tick labels left and below, a title above.
const MARGIN_LEFT: usize = 64;
const MARGIN_RIGHT: usize = 16;
const MARGIN_TOP: usize = 30;
const MARGIN_BOTTOM: usize = 44;

/// Draw `records` into `out_png` (900 x 420). Non-finite values are left out; an empty list
/// gives empty axes.
pub fn plot_curves(records: &[Record], out_png: &Path) -> Result<()> {
    let mut canvas = Canvas::new(WIDTH, HEIGHT);
    let mut loss: Vec<(f64, f64)> = Vec::new();
    let mut dice: Vec<(f64, f64)> = Vec::new();
    for r in records {
        match r {
            Record::Train(t) if t.loss.is_finite() => loss.push((t.step as f64, t.loss)),
            Record::Val(v) if v.mean_dice.is_finite() => dice.push((v.step as f64, v.mean_dice)),
            _ => {}
        }
    }
    // Both panels share one step axis so they line up.
    let steps = records.iter().map(|r| r.step() as f64);
    let x_range = padded_range(steps.clone().fold(None, min_max), 0.0);

    let avg = moving_average(&loss);
    let y_loss = loss_range(&loss, &avg);
    let left = Panel::new(0, WIDTH / 2, x_range, y_loss);
    left.draw_frame(&mut canvas, "train loss");
    for &(x, y) in &loss {
        let (px, py) = left.to_pixel(x, y);
        left.fill_square(&mut canvas, px, py, 2, RAW_LOSS);
    }
    left.polyline(&mut canvas, &avg, 3, AVG_LOSS);

    let right = Panel::new(WIDTH / 2, WIDTH / 2, x_range, (0.0, 1.0));
    right.draw_frame(&mut canvas, "val mean dice");
    right.polyline(&mut canvas, &dice, 2, VAL_DICE);
    for &(x, y) in &dice {
        let (px, py) = right.to_pixel(x, y);
        right.fill_square(&mut canvas, px, py, 5, VAL_DICE);
    }

    let png = canvas.encode_png(out_png)?;
    write_atomic(out_png, &png)
}

fn min_max(acc: Option<(f64, f64)>, v: f64) -> Option<(f64, f64)> {
    Some(match acc {
        None => (v, v),
        Some((lo, hi)) => (lo.min(v), hi.max(v)),
    })
}

/// A range that is never empty, widened by `pad` of its span on each side.
fn padded_range(range: Option<(f64, f64)>, pad: f64) -> (f64, f64) {
    match range {
        None => (0.0, 1.0),
        Some((lo, hi)) if hi - lo <= f64::EPSILON * lo.abs().max(1.0) => {
            let half = (lo.abs() * 0.1).max(0.5);
            (lo - half, hi + half)
        }
        Some((lo, hi)) => {
            let p = (hi - lo) * pad;
            (lo - p, hi + p)
        }
    }
}

/// The loss axis: the 1st..99th percentile of the raw values joined with the whole moving
/// average, so one wild early step does not flatten the rest of the curve.
fn loss_range(raw: &[(f64, f64)], avg: &[(f64, f64)]) -> (f64, f64) {
    let mut ys: Vec<f64> = raw.iter().map(|p| p.1).collect();
    ys.sort_by(f64::total_cmp);
    let mut range = None;
    if !ys.is_empty() {
        let at = |q: f64| ys[((ys.len() - 1) as f64 * q).round() as usize];
        range = min_max(range, at(0.01));
        range = min_max(range, at(0.99));
    }
    for &(_, y) in avg {
        range = min_max(range, y);
    }
    padded_range(range, 0.05)
}

/// Trailing mean over a window of about 1/25 of the points (1..=100).
fn moving_average(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let w = (points.len() / 25).clamp(1, 100);
    let mut sum = 0.0;
    let mut out = Vec::with_capacity(points.len());
    for (i, &(x, y)) in points.iter().enumerate() {
        sum += y;
        if i >= w {
            sum -= points[i - w].1;
        }
        out.push((x, sum / (i + 1).min(w) as f64));
    }
    out
}

/// About `target` round tick values (1, 2 or 5 times a power of ten apart) within [lo, hi],
/// and their spacing.
fn nice_ticks(lo: f64, hi: f64, target: usize) -> (Vec<f64>, f64) {
    let raw = (hi - lo) / target.max(1) as f64;
    if !(raw.is_finite() && raw > 0.0) {
        return (vec![lo], 1.0);
    }
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    let ticks = (first..=last).map(|k| k as f64 * step).collect();
    (ticks, step)
}

/// A tick label: plain decimals with as many places as the spacing needs, exponent form for
/// very small or very large values. Uses only characters the font has.
fn format_tick(v: f64, step: f64) -> String {
    let v = if v.abs() < step * 1e-6 { 0.0 } else { v };
    let big = v.abs() >= 1e6;
    if step < 1e-4 || big {
        let s = format!("{v:.1e}");
        return s.replace(".0e", "e");
    }
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10()).ceil() as usize
    };
    format!("{v:.decimals$}")
}

/// A rectangle of the canvas with data coordinates.
struct Panel {
    /// Plot area in pixels: x0..x1, y0..y1 (y down), inclusive.
    x0: i64,
    x1: i64,
    y0: i64,
    y1: i64,
    xr: (f64, f64),
    yr: (f64, f64),
}

impl Panel {
    fn new(left: usize, width: usize, xr: (f64, f64), yr: (f64, f64)) -> Self {
        Panel {
            x0: (left + MARGIN_LEFT) as i64,
            x1: (left + width - MARGIN_RIGHT) as i64,
            y0: MARGIN_TOP as i64,
            y1: (HEIGHT - MARGIN_BOTTOM) as i64,
            xr,
            yr,
        }
    }

    fn to_pixel(&self, x: f64, y: f64) -> (i64, i64) {
        let fx = (x - self.xr.0) / (self.xr.1 - self.xr.0);
        let fy = (y - self.yr.0) / (self.yr.1 - self.yr.0);
        let px = self.x0 as f64 + fx * (self.x1 - self.x0) as f64;
        let py = self.y1 as f64 - fy * (self.y1 - self.y0) as f64;
        // Clamp far outside values so the integer line drawing stays bounded.
        let clamp = |v: f64| v.round().clamp(-10_000.0, 10_000.0) as i64;
        (clamp(px), clamp(py))
    }

    fn inside(&self, x: i64, y: i64) -> bool {
        (self.x0..=self.x1).contains(&x) && (self.y0..=self.y1).contains(&y)
    }

    /// A `size` x `size` square centred on (x, y), clipped to the plot area.
    fn fill_square(&self, c: &mut Canvas, x: i64, y: i64, size: i64, color: Rgb) {
        let lo = -(size - 1) / 2;
        for dy in lo..lo + size {
            for dx in lo..lo + size {
                if self.inside(x + dx, y + dy) {
                    c.set(x + dx, y + dy, color);
                }
            }
        }
    }

    /// Straight segments between consecutive points (Bresenham), `thickness` pixels wide.
    fn polyline(&self, c: &mut Canvas, points: &[(f64, f64)], thickness: i64, color: Rgb) {
        let pixels: Vec<(i64, i64)> = points.iter().map(|&(x, y)| self.to_pixel(x, y)).collect();
        if pixels.len() == 1 {
            self.fill_square(c, pixels[0].0, pixels[0].1, thickness, color);
        }
        for pair in pixels.windows(2) {
            let ((mut x, mut y), (x1, y1)) = (pair[0], pair[1]);
            let (dx, dy) = ((x1 - x).abs(), -(y1 - y).abs());
            let (sx, sy) = ((x1 - x).signum(), (y1 - y).signum());
            let mut err = dx + dy;
            loop {
                self.fill_square(c, x, y, thickness, color);
                if x == x1 && y == y1 {
                    break;
                }
                let e2 = 2 * err;
                if e2 >= dy {
                    err += dy;
                    x += sx;
                }
                if e2 <= dx {
                    err += dx;
                    y += sy;
                }
            }
        }
    }

    /// Grid, frame, tick labels, the x-axis name and the title.
    fn draw_frame(&self, c: &mut Canvas, title: &str) {
        let (xt, xstep) = nice_ticks(self.xr.0, self.xr.1, 5);
        let (yt, ystep) = nice_ticks(self.yr.0, self.yr.1, 5);
        for &x in &xt {
            let (px, _) = self.to_pixel(x, self.yr.0);
            for y in self.y0..=self.y1 {
                c.set(px, y, GRID);
            }
            let label = format_tick(x, xstep);
            let w = text_width(&label, 1);
            c.text(px - w / 2, self.y1 + 6, &label, 1, BLACK);
        }
        for &y in &yt {
            let (_, py) = self.to_pixel(self.xr.0, y);
            for x in self.x0..=self.x1 {
                c.set(x, py, GRID);
            }
            let label = format_tick(y, ystep);
            let w = text_width(&label, 1);
            c.text(self.x0 - 6 - w, py - 3, &label, 1, BLACK);
        }
        for x in self.x0..=self.x1 {
            c.set(x, self.y0, BLACK);
            c.set(x, self.y1, BLACK);
        }
        for y in self.y0..=self.y1 {
            c.set(self.x0, y, BLACK);
            c.set(self.x1, y, BLACK);
        }
        let mid = (self.x0 + self.x1) / 2;
        c.text(
            mid - text_width("step", 1) / 2,
            self.y1 + 22,
            "step",
            1,
            BLACK,
        );
        c.text(mid - text_width(title, 2) / 2, 8, title, 2, BLACK);
    }
}

/// An RGB raster.
struct Canvas {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Canvas {
    fn new(width: usize, height: usize) -> Self {
        let mut rgb = Vec::with_capacity(width * height * 3);
        for _ in 0..width * height {
            rgb.extend_from_slice(&WHITE);
        }
        Canvas { width, height, rgb }
    }

    fn set(&mut self, x: i64, y: i64, color: Rgb) {
        if x < 0 || y < 0 || x as usize >= self.width || y as usize >= self.height {
            return;
        }
        let o = (y as usize * self.width + x as usize) * 3;
        self.rgb[o..o + 3].copy_from_slice(&color);
    }

    /// Text with its top-left corner at (x, y), each font pixel drawn `scale` x `scale`.
    fn text(&mut self, x: i64, y: i64, text: &str, scale: i64, color: Rgb) {
        for (i, ch) in text.chars().enumerate() {
            let rows = glyph(ch);
            let cx = x + i as i64 * ADVANCE * scale;
            for (r, bits) in rows.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        for sy in 0..scale {
                            for sx in 0..scale {
                                self.set(cx + col * scale + sx, y + r as i64 * scale + sy, color);
                            }
                        }
                    }
                }
            }
        }
    }

    fn encode_png(&self, out: &Path) -> Result<Vec<u8>> {
        let fail = |e: png::EncodingError| Error::io(out, std::io::Error::other(e.to_string()));
        let mut bytes = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut bytes, self.width as u32, self.height as u32);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc.write_header().map_err(fail)?;
            w.write_image_data(&self.rgb).map_err(fail)?;
            w.finish().map_err(fail)?;
        }
        Ok(bytes)
    }
}

/// Horizontal distance from one character to the next, in font pixels.
const ADVANCE: i64 = 6;

fn text_width(text: &str, scale: i64) -> i64 {
    let n = text.chars().count() as i64;
    if n == 0 {
        0
    } else {
        (n * ADVANCE - 1) * scale
    }
}

/// A 5x7 glyph, one byte per row, the high of the five low bits on the left. Unknown
/// characters are blank.
fn glyph(c: char) -> [u8; 7] {
    match c {
        '0' => [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        '1' => [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '3' => [0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        '5' => [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        '6' => [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        '7' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        '9' => [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x0c],
        '-' => [0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x00],
        '+' => [0x00, 0x04, 0x04, 0x1f, 0x04, 0x04, 0x00],
        'a' => [0x00, 0x00, 0x0e, 0x01, 0x0f, 0x11, 0x0f],
        'c' => [0x00, 0x00, 0x0e, 0x10, 0x10, 0x11, 0x0e],
        'd' => [0x01, 0x01, 0x0d, 0x13, 0x11, 0x11, 0x0f],
        'e' => [0x00, 0x00, 0x0e, 0x11, 0x1f, 0x10, 0x0e],
        'i' => [0x04, 0x00, 0x0c, 0x04, 0x04, 0x04, 0x0e],
        'l' => [0x0c, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e],
        'm' => [0x00, 0x00, 0x1a, 0x15, 0x15, 0x11, 0x11],
        'n' => [0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11],
        'o' => [0x00, 0x00, 0x0e, 0x11, 0x11, 0x11, 0x0e],
        'p' => [0x00, 0x00, 0x1e, 0x11, 0x1e, 0x10, 0x10],
        'r' => [0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10],
        's' => [0x00, 0x00, 0x0f, 0x10, 0x0e, 0x01, 0x1e],
        't' => [0x08, 0x08, 0x1c, 0x08, 0x08, 0x09, 0x06],
        'v' => [0x00, 0x00, 0x11, 0x11, 0x11, 0x0a, 0x04],
        _ => [0; 7],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::metrics::{TrainRecord, ValRecord};

    fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
        let decoder =
            png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    /// Count pixels of `color` in columns [x0, x1).
    fn count(rgb: &[u8], color: Rgb, x0: usize, x1: usize) -> usize {
        rgb.chunks(3)
            .enumerate()
            .filter(|(i, px)| (x0..x1).contains(&(i % WIDTH)) && *px == color)
            .count()
    }

    #[test]
    fn empty_records_give_empty_axes() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("curves.png");
        plot_curves(&[], &out).unwrap();
        let (w, h, rgb) = decode(&out);
        assert_eq!((w, h), (WIDTH as u32, HEIGHT as u32));
        for c in [RAW_LOSS, AVG_LOSS, VAL_DICE] {
            assert_eq!(count(&rgb, c, 0, WIDTH), 0);
        }
        // Axes and labels are there.
        assert!(count(&rgb, BLACK, 0, WIDTH / 2) > 500);
        assert!(count(&rgb, BLACK, WIDTH / 2, WIDTH) > 500);
        // Only the PNG is left in the folder (no temp file).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn curves_land_in_their_panels_and_places() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("curves.png");
        let mut records = Vec::new();
        for s in 0..400u64 {
            let loss = 1.0 / (1.0 + s as f64 / 50.0) + 0.05 * ((s * 7919) % 13) as f64 / 13.0;
            records.push(Record::Train(TrainRecord {
                step: s * 10,
                loss,
                ..Default::default()
            }));
            if s % 50 == 49 {
                records.push(Record::Val(ValRecord {
                    step: s * 10,
                    mean_dice: 1.0,
                    ..Default::default()
                }));
            }
        }
        records.push(Record::Train(TrainRecord {
            step: 4000,
            loss: f64::NAN,
            ..Default::default()
        }));
        plot_curves(&records, &out).unwrap();
        let (_, _, rgb) = decode(&out);
        assert!(count(&rgb, RAW_LOSS, 0, WIDTH / 2) > 100);
        assert!(count(&rgb, AVG_LOSS, 0, WIDTH / 2) > 300);
        assert_eq!(count(&rgb, VAL_DICE, 0, WIDTH / 2), 0);
        assert_eq!(count(&rgb, AVG_LOSS, WIDTH / 2, WIDTH), 0);
        // Dice 1.0 everywhere: the orange pixels hug the top edge of the right plot area.
        let orange_rows: Vec<usize> = rgb
            .chunks(3)
            .enumerate()
            .filter(|(_, px)| *px == VAL_DICE)
            .map(|(i, _)| i / WIDTH)
            .collect();
        assert!(!orange_rows.is_empty());
        assert!(
            orange_rows.iter().all(|&r| r <= MARGIN_TOP + 2),
            "{orange_rows:?}"
        );
    }

    #[test]
    fn ticks_are_round_and_inside() {
        for (lo, hi) in [
            (0.0, 1.0),
            (-0.83, 1.7),
            (0.0, 250_000.0),
            (3e-6, 9e-6),
            (5.0, 5.5),
        ] {
            let (ticks, step) = nice_ticks(lo, hi, 5);
            assert!((2..=11).contains(&ticks.len()), "{lo} {hi} {ticks:?}");
            let m = step / 10f64.powf(step.log10().floor());
            assert!(
                [1.0, 2.0, 5.0].iter().any(|k| (m - k).abs() < 1e-9),
                "{step}"
            );
            for t in &ticks {
                assert!(*t >= lo - 1e-12 && *t <= hi + 1e-12);
            }
        }
        assert_eq!(format_tick(0.4, 0.2), "0.4");
        assert_eq!(format_tick(-0.25, 0.05), "-0.25");
        assert_eq!(format_tick(2000.0, 500.0), "2000");
        assert_eq!(format_tick(5e-6, 1e-6), "5e-6");
        assert_eq!(format_tick(2.5e6, 5e5), "2.5e6");
        assert_eq!(format_tick(1e-17, 0.1), "0.0");
    }

    #[test]
    fn every_label_character_has_a_glyph() {
        let mut labels = vec![
            "train loss".to_string(),
            "val mean dice".into(),
            "step".into(),
        ];
        for (lo, hi) in [(-2.0, 3.0), (0.0, 1e7), (1e-7, 5e-7), (0.001, 0.0042)] {
            let (ticks, step) = nice_ticks(lo, hi, 5);
            labels.extend(ticks.iter().map(|t| format_tick(*t, step)));
        }
        for label in labels {
            for ch in label.chars().filter(|c| *c != ' ') {
                assert_ne!(glyph(ch), [0; 7], "no glyph for {ch:?} in {label:?}");
            }
        }
    }

    #[test]
    fn moving_average_is_a_trailing_mean() {
        let pts: Vec<(f64, f64)> = (0..50).map(|i| (i as f64, i as f64)).collect();
        let avg = moving_average(&pts);
        // Window 2 for 50 points.
        assert_eq!(avg[0].1, 0.0);
        assert_eq!(avg[1].1, 0.5);
        assert_eq!(avg[49].1, 48.5);
    }
}
