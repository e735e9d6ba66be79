//! Per-class voxel counts, bounding boxes and a fixed-size sample of foreground coordinates,
//! gathered chunk by chunk while the label is written.
//!
//! The sample is the `k` voxels with the smallest hash priority (seeded), so it is the same
//! whatever order the chunks are processed in: a property nnU-Net's `class_locations` lacks.

use std::collections::{BTreeMap, BinaryHeap};

pub use crate::format::entry::ClassStats;
use crate::geometry::Block;

#[derive(Clone, Debug, Default)]
struct ClassAcc {
    stats: Option<ClassStats>,
    /// Max-heap of (priority, linear index): the k smallest priorities seen so far.
    heap: BinaryHeap<(u64, u64)>,
}

/// Accumulates over blocks; merge per-block accumulators in any order.
#[derive(Clone, Debug)]
pub struct FgAccumulator {
    k: usize,
    seed: u64,
    shape_zyx: [usize; 3],
    classes: BTreeMap<u16, ClassAcc>,
    /// Per class, a priority no kept sample can reach (the k-th smallest seen elsewhere):
    /// candidates at or above it are skipped early. Pruning only drops items that could never
    /// make the final k, so the result is unchanged.
    cutoff: BTreeMap<u16, u64>,
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl FgAccumulator {
    /// An empty accumulator keeping `k` coordinates per class, sampled with `seed`, over an
    /// output of `shape_zyx` voxels.
    pub fn new(k: usize, seed: u64, shape_zyx: [usize; 3]) -> Self {
        FgAccumulator {
            k,
            seed,
            shape_zyx,
            classes: BTreeMap::new(),
            cutoff: BTreeMap::new(),
        }
    }

    /// A fresh accumulator for one block that skips candidates this one would reject anyway.
    pub fn child(&self) -> FgAccumulator {
        let mut c = FgAccumulator::new(self.k, self.seed, self.shape_zyx);
        for (class, acc) in &self.classes {
            if acc.heap.len() >= self.k {
                if let Some(top) = acc.heap.peek() {
                    c.cutoff.insert(*class, top.0);
                }
            }
        }
        c
    }

    /// Observe one block of label values (C order over `block.size`). Class 0 is background.
    pub fn observe<T: Copy + Into<u16>>(&mut self, block: Block, data: &[T]) {
        let [_, ny, nx] = self.shape_zyx;
        let [bz, by, bx] = block.size;
        let [sz, sy, sx] = block.start;
        let class_salt = |c: u16| splitmix64(self.seed ^ ((c as u64) << 48));
        let mut i = 0;
        for z in 0..bz {
            for y in 0..by {
                for x in 0..bx {
                    let c: u16 = data[i].into();
                    i += 1;
                    if c == 0 {
                        continue;
                    }
                    let (gz, gy, gx) = (sz + z, sy + y, sx + x);
                    let salt = class_salt(c);
                    let acc = self.classes.entry(c).or_default();
                    let st = acc.stats.get_or_insert(ClassStats {
                        voxels: 0,
                        bbox_min_zyx: [gz, gy, gx],
                        bbox_max_zyx: [gz, gy, gx],
                    });
                    st.voxels += 1;
                    for (a, v) in [gz, gy, gx].into_iter().enumerate() {
                        st.bbox_min_zyx[a] = st.bbox_min_zyx[a].min(v);
                        st.bbox_max_zyx[a] = st.bbox_max_zyx[a].max(v);
                    }
                    if self.k == 0 {
                        continue;
                    }
                    let lin = ((gz * ny + gy) * nx + gx) as u64;
                    let item = (splitmix64(salt ^ lin), lin);
                    if self.cutoff.get(&c).is_some_and(|&cut| item.0 > cut) {
                        continue;
                    }
                    if acc.heap.len() < self.k {
                        acc.heap.push(item);
                    } else if acc.heap.peek().is_some_and(|top| item < *top) {
                        acc.heap.pop();
                        acc.heap.push(item);
                    }
                }
            }
        }
    }

    /// Add another accumulator's counts, boxes and samples (any order gives the same result).
    pub fn merge(&mut self, other: FgAccumulator) {
        for (c, o) in other.classes {
            let acc = self.classes.entry(c).or_default();
            if let Some(os) = o.stats {
                match &mut acc.stats {
                    None => acc.stats = Some(os),
                    Some(st) => {
                        st.voxels += os.voxels;
                        for a in 0..3 {
                            st.bbox_min_zyx[a] = st.bbox_min_zyx[a].min(os.bbox_min_zyx[a]);
                            st.bbox_max_zyx[a] = st.bbox_max_zyx[a].max(os.bbox_max_zyx[a]);
                        }
                    }
                }
            }
            for item in o.heap {
                if acc.heap.len() < self.k {
                    acc.heap.push(item);
                } else if acc.heap.peek().is_some_and(|top| item < *top) {
                    acc.heap.pop();
                    acc.heap.push(item);
                }
            }
        }
    }

    /// Per-class stats and sampled coordinates (z, y, x), sorted by position.
    pub fn finish(self) -> FgIndex {
        let [_, ny, nx] = self.shape_zyx;
        let mut classes = BTreeMap::new();
        let mut coords = BTreeMap::new();
        for (c, acc) in self.classes {
            if let Some(st) = acc.stats {
                classes.insert(c, st);
            }
            let mut lins: Vec<u64> = acc.heap.into_iter().map(|(_, l)| l).collect();
            lins.sort_unstable();
            let pts: Vec<[u32; 3]> = lins
                .into_iter()
                .map(|l| {
                    let l = l as usize;
                    [
                        (l / (ny * nx)) as u32,
                        ((l / nx) % ny) as u32,
                        (l % nx) as u32,
                    ]
                })
                .collect();
            coords.insert(c, pts);
        }
        FgIndex { classes, coords }
    }
}

/// The finished index of one entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FgIndex {
    /// Per label value (background 0 excluded): voxel count and bounding box.
    pub classes: BTreeMap<u16, ClassStats>,
    /// Per label value: up to `k` sampled coordinates (z, y, x), sorted by position.
    pub coords: BTreeMap<u16, Vec<[u32; 3]>>,
}

impl FgIndex {
    /// Rows (class, z, y, x) for the `fg` array, grouped by class, and each class's row range.
    pub fn rows(&self) -> (Vec<u32>, BTreeMap<u16, [usize; 2]>) {
        let mut flat = Vec::new();
        let mut ranges = BTreeMap::new();
        for (c, pts) in &self.coords {
            let start = flat.len() / 4;
            for p in pts {
                flat.extend_from_slice(&[*c as u32, p[0], p[1], p[2]]);
            }
            ranges.insert(*c, [start, pts.len()]);
        }
        (flat, ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::blocks;

    #[test]
    fn sample_does_not_depend_on_block_order() {
        let shape = [6, 7, 8];
        let label: Vec<u8> = (0..6 * 7 * 8).map(|i| ((i * 7919) % 5 % 3) as u8).collect();
        let whole = {
            let mut a = FgAccumulator::new(10, 42, shape);
            a.observe(
                Block {
                    start: [0; 3],
                    size: shape,
                },
                &label,
            );
            a.finish()
        };
        let mut parts: Vec<FgAccumulator> = blocks(shape, [2, 3, 3])
            .into_iter()
            .map(|b| {
                let mut data = Vec::new();
                for z in 0..b.size[0] {
                    for y in 0..b.size[1] {
                        for x in 0..b.size[2] {
                            let (gz, gy, gx) = (b.start[0] + z, b.start[1] + y, b.start[2] + x);
                            data.push(label[(gz * 7 + gy) * 8 + gx]);
                        }
                    }
                }
                let mut a = FgAccumulator::new(10, 42, shape);
                a.observe(b, &data);
                a
            })
            .collect();
        parts.reverse();
        let mut acc = FgAccumulator::new(10, 42, shape);
        for p in parts {
            acc.merge(p);
        }
        let merged = acc.finish();
        assert_eq!(merged, whole);
        let ones = label.iter().filter(|&&v| v == 1).count() as u64;
        assert_eq!(whole.classes[&1].voxels, ones);
        assert_eq!(whole.coords[&1].len(), 10);
        for p in &whole.coords[&2] {
            assert_eq!(
                label[(p[0] as usize * 7 + p[1] as usize) * 8 + p[2] as usize],
                2
            );
        }
    }
}
