//! Connected components of a 3D mask, slice by slice: only the current and the previous
//! z-slice are held, so a volume larger than memory works (nnU-Net's postprocessing, "keep the
//! largest component", on predictions of any size).
//!
//! Each foreground voxel, in raster order, joins the components of its neighbours already
//! visited (in its slice and the previous one) or starts a provisional label; a union-find over
//! the provisional labels merges those that touch. A component's smallest provisional label is
//! the one its first voxel in raster order started, so numbering the roots by it gives
//! scipy.ndimage.label's numbering. A second pass recomputes the same provisional labels slice
//! by slice and writes each voxel's final label or mask.

use crate::error::{Error, Result};

/// Which neighbours touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connectivity {
    /// Faces only (6 neighbours; scipy's default structure).
    Faces,
    /// Faces, edges and corners (26 neighbours; scipy's `np.ones((3, 3, 3))`).
    Full,
}

/// The components of a mask after the first pass.
#[derive(Clone, Debug)]
pub struct Components {
    shape_zyx: [usize; 3],
    connectivity: Connectivity,
    /// Union-find parent of each provisional label (0 unused).
    parent: Vec<u32>,
    /// Final label (1..) of each root provisional label, 0 for non-roots.
    number: Vec<u32>,
    /// Voxels of each component, by final label - 1.
    sizes: Vec<u64>,
}

fn find(parent: &mut [u32], mut a: u32) -> u32 {
    while parent[a as usize] != a {
        let up = parent[parent[a as usize] as usize];
        parent[a as usize] = up;
        a = up;
    }
    a
}

fn union(parent: &mut [u32], a: u32, b: u32) -> u32 {
    let (ra, rb) = (find(parent, a), find(parent, b));
    let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
    parent[hi as usize] = lo;
    lo
}

/// One slice's provisional labels from its mask and the previous slice's labels: new labels
/// are taken from `parent` (which grows), touching ones are merged in it.
fn label_slice(
    mask: &[bool],
    prev: Option<&[u32]>,
    (h, w): (usize, usize),
    connectivity: Connectivity,
    parent: &mut Vec<u32>,
) -> Result<Vec<u32>> {
    let mut out = vec![0u32; h * w];
    let full = connectivity == Connectivity::Full;
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            if !mask[i] {
                continue;
            }
            let mut label = 0u32;
            let mut join = |l: u32, parent: &mut Vec<u32>| {
                if l != 0 {
                    label = if label == 0 {
                        l
                    } else {
                        union(parent, label, l)
                    };
                }
            };
            // Neighbours already visited in this slice.
            if x > 0 {
                join(out[i - 1], parent);
            }
            if y > 0 {
                join(out[i - w], parent);
                if full {
                    if x > 0 {
                        join(out[i - w - 1], parent);
                    }
                    if x + 1 < w {
                        join(out[i - w + 1], parent);
                    }
                }
            }
            // The previous slice.
            if let Some(p) = prev {
                if full {
                    for dy in -1i64..=1 {
                        for dx in -1i64..=1 {
                            let (yy, xx) = (y as i64 + dy, x as i64 + dx);
                            if yy >= 0 && xx >= 0 && (yy as usize) < h && (xx as usize) < w {
                                join(p[yy as usize * w + xx as usize], parent);
                            }
                        }
                    }
                } else {
                    join(p[i], parent);
                }
            }
            if label == 0 {
                let next = u32::try_from(parent.len()).map_err(|_| {
                    Error::Config("connected components: more than 4 billion labels".into())
                })?;
                parent.push(next);
                label = next;
            }
            out[i] = label;
        }
    }
    Ok(out)
}

impl Components {
    /// First pass over a mask of `shape_zyx` whose z-slices `slice(z)` gives (y-major, true =
    /// foreground).
    pub fn find(
        shape_zyx: [usize; 3],
        connectivity: Connectivity,
        mut slice: impl FnMut(usize) -> Result<Vec<bool>>,
    ) -> Result<Components> {
        let [d, h, w] = shape_zyx;
        let mut parent: Vec<u32> = vec![0];
        let mut counts: Vec<u64> = vec![0];
        let mut prev: Option<Vec<u32>> = None;
        for z in 0..d {
            let mask = slice(z)?;
            check_len(&mask, h * w, z)?;
            let labels = label_slice(&mask, prev.as_deref(), (h, w), connectivity, &mut parent)?;
            counts.resize(parent.len(), 0);
            for &l in labels.iter().filter(|&&l| l != 0) {
                counts[l as usize] += 1;
            }
            prev = Some(labels);
        }
        let mut number = vec![0u32; parent.len()];
        let mut sizes = Vec::new();
        // Roots in order of their smallest (first-created) label: raster order of first voxels.
        for l in 1..parent.len() as u32 {
            if find(&mut parent, l) == l {
                sizes.push(0);
                number[l as usize] = sizes.len() as u32;
            }
        }
        for l in 1..parent.len() as u32 {
            let r = find(&mut parent, l);
            sizes[number[r as usize] as usize - 1] += counts[l as usize];
        }
        Ok(Components {
            shape_zyx,
            connectivity,
            parent,
            number,
            sizes,
        })
    }

    /// Voxels of each component, by label - 1.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// The label (1..) of the largest component (the first of equal ones), if any.
    pub fn largest(&self) -> Option<u32> {
        let mut best: Option<(u64, u32)> = None;
        for (i, &s) in self.sizes.iter().enumerate() {
            if best.is_none_or(|(b, _)| s > b) {
                best = Some((s, i as u32 + 1));
            }
        }
        best.map(|(_, l)| l)
    }

    /// Second pass: the same slices again; `out(z, labels)` receives each slice's final labels
    /// (0 background, 1.. as scipy.ndimage.label numbers them).
    pub fn relabel(
        &mut self,
        mut slice: impl FnMut(usize) -> Result<Vec<bool>>,
        mut out: impl FnMut(usize, &[u32]) -> Result<()>,
    ) -> Result<()> {
        let [d, h, w] = self.shape_zyx;
        // The same provisional labels come out in the same order; the unions are known.
        let mut again: Vec<u32> = vec![0];
        let mut prev: Option<Vec<u32>> = None;
        for z in 0..d {
            let mask = slice(z)?;
            check_len(&mask, h * w, z)?;
            let labels = label_slice(
                &mask,
                prev.as_deref(),
                (h, w),
                self.connectivity,
                &mut again,
            )?;
            if again.len() > self.parent.len() {
                return Err(Error::Config(format!(
                    "connected components: slice {z} differs from the first pass"
                )));
            }
            let fin: Vec<u32> = labels
                .iter()
                .map(|&l| match l {
                    0 => 0,
                    l => self.number[find(&mut self.parent, l) as usize],
                })
                .collect();
            out(z, &fin)?;
            prev = Some(labels);
        }
        Ok(())
    }
}

fn check_len(mask: &[bool], want: usize, z: usize) -> Result<()> {
    if mask.len() != want {
        return Err(Error::Config(format!(
            "connected components: slice {z} has {} voxels, the shape says {want}",
            mask.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    /// Whole-volume flood fill, the definition, for comparison.
    fn flood(mask: &[bool], [d, h, w]: [usize; 3], c: Connectivity) -> Vec<u32> {
        let mut out = vec![0u32; mask.len()];
        let mut next = 0;
        for start in 0..mask.len() {
            if !mask[start] || out[start] != 0 {
                continue;
            }
            next += 1;
            out[start] = next;
            let mut stack = vec![start];
            while let Some(i) = stack.pop() {
                let (z, y, x) = (i / (h * w), i / w % h, i % w);
                for dz in -1i64..=1 {
                    for dy in -1i64..=1 {
                        for dx in -1i64..=1 {
                            let n = dz.abs() + dy.abs() + dx.abs();
                            if n == 0 || (c == Connectivity::Faces && n > 1) {
                                continue;
                            }
                            let (zz, yy, xx) = (z as i64 + dz, y as i64 + dy, x as i64 + dx);
                            if zz < 0 || yy < 0 || xx < 0 {
                                continue;
                            }
                            let (zz, yy, xx) = (zz as usize, yy as usize, xx as usize);
                            if zz >= d || yy >= h || xx >= w {
                                continue;
                            }
                            let j = (zz * h + yy) * w + xx;
                            if mask[j] && out[j] == 0 {
                                out[j] = next;
                                stack.push(j);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    fn label(mask: &[bool], shape: [usize; 3], c: Connectivity) -> (Vec<u32>, Components) {
        let plane = shape[1] * shape[2];
        let slice = |z: usize| Ok(mask[z * plane..(z + 1) * plane].to_vec());
        let mut comps = Components::find(shape, c, slice).unwrap();
        let mut out = vec![0u32; mask.len()];
        comps
            .relabel(slice, |z, l| {
                out[z * plane..(z + 1) * plane].copy_from_slice(l);
                Ok(())
            })
            .unwrap();
        (out, comps)
    }

    /// Random masks of several densities: the same labels, numbered the same, as a flood fill.
    #[test]
    fn equals_a_flood_fill_in_both_connectivities() {
        let mut rng = Rng::new(3);
        for (shape, p) in [
            ([7, 9, 11], 0.3),
            ([12, 5, 6], 0.5),
            ([3, 20, 20], 0.6),
            ([1, 8, 8], 0.4),
        ] {
            let n: usize = shape.iter().product();
            let mask: Vec<bool> = (0..n).map(|_| rng.uniform() < p).collect();
            for c in [Connectivity::Faces, Connectivity::Full] {
                let (ours, comps) = label(&mask, shape, c);
                assert_eq!(ours, flood(&mask, shape, c), "{shape:?} {c:?}");
                let total: u64 = comps.sizes().iter().sum();
                assert_eq!(total, mask.iter().filter(|&&m| m).count() as u64);
            }
        }
    }

    /// A U whose arms meet only in the last slice: one component, found across slices.
    #[test]
    fn components_joined_late_are_one() {
        let shape = [4, 1, 3];
        let mut mask = vec![false; 12];
        for z in 0..4 {
            mask[z * 3] = true;
            mask[z * 3 + 2] = true;
        }
        mask[3 * 3 + 1] = true;
        let (labels, comps) = label(&mask, shape, Connectivity::Faces);
        assert_eq!(comps.sizes(), &[9]);
        assert!(labels.iter().all(|&l| l <= 1));
        assert_eq!(comps.largest(), Some(1));
    }
}
