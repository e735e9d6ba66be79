//! A scratch volume resampled into another, axis by axis, out of core: first each input slice in
//! its plane (x, then y), into an intermediate volume; then blocks of whole z-lines. Memory is a
//! few slices and one block, whatever the volume.
//!
//! skimage's `resize` clips its output to the input's range (per call): the whole channel when
//! nnU-Net resizes a volume in one go, each 2D slice when it resizes the plane slice by slice
//! before the separate axis ([`Clip`]).

use rayon::prelude::*;

use super::spline::{Axis, Kind};
use super::volume::{Elem, Scratch};
use crate::error::Result;

/// Bytes of one z-line block (pass 2).
const BLOCK_BYTES: usize = 48 << 20;

/// The range outputs are clipped to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clip {
    /// No clipping.
    None,
    /// Each channel to its input's min and max.
    Channel,
    /// Each output plane along this axis to the min and max of the input plane it was made
    /// from (the axis resampled at order 0).
    Plane(usize),
}

/// Per channel: (min, max) of the whole channel, or of each plane along `axis`.
fn ranges<T: Elem>(src: &Scratch<T>, c: usize, axis: Option<usize>) -> Result<Vec<(f64, f64)>> {
    let [d, h, w] = src.zyx();
    let n = axis.map_or(1, |a| [d, h, w][a]);
    let mut r = vec![(f64::INFINITY, f64::NEG_INFINITY); n];
    for z in 0..d {
        let s = src.slice(c, z)?;
        for (i, v) in s.iter().enumerate() {
            let v = v.to_f64();
            let k = match axis {
                None => 0,
                Some(0) => z,
                Some(1) => i / w,
                Some(_) => i % w,
            };
            let e = &mut r[k];
            e.0 = e.0.min(v);
            e.1 = e.1.max(v);
        }
    }
    Ok(r)
}

/// Resize one slice (h x w, f64) in its plane by `ay` (rows) and `ax` (columns).
fn in_plane(slice: &[f64], h: usize, w: usize, ay: &Axis, ax: &Axis) -> Vec<f64> {
    let mut buf = Vec::new();
    let cols = if ax.is_identity() {
        slice.to_vec()
    } else {
        // Columns become rows: (w x h), resized along its rows, back to (h x m).
        let mut t = vec![0.0; w * h];
        for y in 0..h {
            for x in 0..w {
                t[x * h + y] = slice[y * w + x];
            }
        }
        ax.apply(&t, h, &mut buf);
        let m = ax.m;
        let mut back = vec![0.0; h * m];
        for x in 0..m {
            for y in 0..h {
                back[y * m + x] = buf[x * h + y];
            }
        }
        back
    };
    ay.apply(&cols, ax.m, &mut buf);
    buf
}

/// Resample every channel of `src` into `dst` (same channels) with `axes` (z, y, x), clipped
/// as `clip` says; `tmp` is where the intermediate volume goes.
pub fn resample<S: Elem, D: Elem>(
    src: &Scratch<S>,
    dst: &Scratch<D>,
    axes: [Axis; 3],
    clip: Clip,
    tmp: &std::path::Path,
) -> Result<()> {
    resample_via::<S, f32, D>(src, dst, axes, clip, tmp)
}

/// [`resample`] with the in-plane result kept as `I` between the passes (f64 where ties
/// between interpolated values decide something, as for segmentations).
pub fn resample_via<S: Elem, I: Elem, D: Elem>(
    src: &Scratch<S>,
    dst: &Scratch<D>,
    axes: [Axis; 3],
    clip: Clip,
    tmp: &std::path::Path,
) -> Result<()> {
    let [d, h, w] = src.zyx();
    let [dn, hn, wn] = dst.zyx();
    debug_assert_eq!([axes[0].n, axes[1].n, axes[2].n], [d, h, w]);
    debug_assert_eq!([axes[0].m, axes[1].m, axes[2].m], [dn, hn, wn]);
    let inter: Scratch<I> = Scratch::new(tmp, [1, d, hn, wn])?;
    for c in 0..src.shape[0] {
        let range = match clip {
            Clip::None => Vec::new(),
            Clip::Channel => ranges(src, c, None)?,
            Clip::Plane(a) => ranges(src, c, Some(a))?,
        };
        let clamp = |v: f64, z: usize, y: usize, x: usize| -> f64 {
            let k = match clip {
                Clip::None => return v,
                Clip::Channel => 0,
                Clip::Plane(a) => axes[a].nearest([z, y, x][a]),
            };
            let (lo, hi) = range[k];
            v.clamp(lo, hi)
        };
        // Pass 1: each slice in its plane.
        let threads = rayon::current_num_threads().max(1);
        let zs: Vec<usize> = (0..d).collect();
        for group in zs.chunks(threads) {
            group.par_iter().try_for_each(|&z| -> Result<()> {
                let s: Vec<f64> = src.slice(c, z)?.into_iter().map(Elem::to_f64).collect();
                let out = in_plane(&s, h, w, &axes[1], &axes[2]);
                let out: Vec<I> = out.into_iter().map(I::from_f64).collect();
                inter.write_rows(0, z, 0, &out)
            })?;
        }
        // Pass 2: blocks of rows, every z of them, resampled along z.
        let row = wn;
        let per_row = (d + dn + 30) * row * 8 * 3;
        let rows = (BLOCK_BYTES / per_row.max(1)).clamp(1, hn.max(1));
        let blocks: Vec<usize> = (0..hn).step_by(rows).collect();
        for group in blocks.chunks(threads) {
            group.par_iter().try_for_each(|&y0| -> Result<()> {
                let nr = rows.min(hn - y0);
                let bw = nr * row;
                let mut lines = vec![0.0f64; d * bw];
                let mut buf = vec![I::default(); bw];
                for z in 0..d {
                    inter.read_rows(0, z, y0, &mut buf)?;
                    for (o, &v) in lines[z * bw..(z + 1) * bw].iter_mut().zip(&buf) {
                        *o = v.to_f64();
                    }
                }
                let mut out = Vec::new();
                axes[0].apply(&lines, bw, &mut out);
                let mut vals = vec![D::default(); bw];
                for z in 0..dn {
                    for (i, v) in vals.iter_mut().enumerate() {
                        let (y, x) = (y0 + i / row, i % row);
                        *v = D::from_f64(clamp(out[z * bw + i], z, y, x));
                    }
                    dst.write_rows(c, z, y0, &vals)?;
                }
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// Whether resampling with `axes` changes anything (nnU-Net returns its input untouched when
/// the shapes are equal).
pub fn is_identity(axes: &[Axis; 3]) -> bool {
    axes.iter().all(Axis::is_identity)
}

/// Whether any axis is cubic (the only case where skimage's clipping can change a value).
pub fn needs_clip(axes: &[Axis; 3]) -> bool {
    axes.iter()
        .any(|a| a.kind == Kind::Cubic && !a.is_identity())
}

#[cfg(test)]
mod tests {
    use super::super::spline::Kind;
    use super::*;

    /// Resampling the volume axis by axis equals resampling each line of a separable input.
    #[test]
    fn separable_volume_equals_product_of_lines() {
        let dir = tempfile::tempdir().unwrap();
        let (d, h, w) = (5, 6, 7);
        let fz: Vec<f64> = (0..d).map(|i| 1.0 + (i as f64 * 0.7).sin()).collect();
        let fy: Vec<f64> = (0..h).map(|i| 2.0 + (i as f64 * 1.3).cos()).collect();
        let fx: Vec<f64> = (0..w).map(|i| 1.5 + (i as f64 * 0.4).sin()).collect();
        let src: Scratch<f32> = Scratch::new(dir.path(), [1, d, h, w]).unwrap();
        for (z, a) in fz.iter().enumerate() {
            let s: Vec<f32> = (0..h * w)
                .map(|i| (a * fy[i / w] * fx[i % w]) as f32)
                .collect();
            src.write_rows(0, z, 0, &s).unwrap();
        }
        let axes = [
            Axis {
                n: d,
                m: 9,
                kind: Kind::Nearest,
            },
            Axis {
                n: h,
                m: 4,
                kind: Kind::Cubic,
            },
            Axis {
                n: w,
                m: 11,
                kind: Kind::Linear,
            },
        ];
        let dst: Scratch<f32> = Scratch::new(dir.path(), [1, 9, 4, 11]).unwrap();
        resample(&src, &dst, axes, Clip::None, dir.path()).unwrap();
        let line = |a: &Axis, v: &[f64]| {
            let mut o = Vec::new();
            a.apply(v, 1, &mut o);
            o
        };
        let (gz, gy, gx) = (
            line(&axes[0], &fz),
            line(&axes[1], &fy),
            line(&axes[2], &fx),
        );
        for (z, a) in gz.iter().enumerate() {
            let s = dst.slice(0, z).unwrap();
            for y in 0..4 {
                for x in 0..11 {
                    let want = a * gy[y] * gx[x];
                    let got = f64::from(s[y * 11 + x]);
                    assert!(
                        (got - want).abs() < 1e-5 * want.abs().max(1.0),
                        "{z} {y} {x}: {got} {want}"
                    );
                }
            }
        }
    }
}
