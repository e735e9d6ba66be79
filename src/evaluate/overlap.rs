//! One pass over a prediction and its reference, z slice by z slice: voxel counts per class
//! (true positives, false positives, false negatives) and each side's edge voxels.
//!
//! A class is a set of label values (one value, or an nnU-Net region such as BraTS's whole
//! tumour 1+2+3). An edge voxel of a class is one of its voxels with a 6-connected neighbour
//! outside the class or outside the grid: the voxels that a binary erosion with the cross
//! structuring element removes (scipy's default, with voxels beyond the grid counted as
//! background), the surface MONAI and MedPy measure. Voxels the reference marks with the
//! ignore label count for neither side. Memory: three slices of each file and the edges.
//! When clDice is measured, both files' slices (ignored voxels background) are also copied into
//! scratch volumes on disk, for the block-by-block thinning that follows the pass.

use std::path::Path;
use std::sync::mpsc;

use crate::error::{Error, Result};
use crate::evaluate::centreline::scratch::ScratchLabels;
use crate::format::dataset_json::LabelClass;
use crate::format::labels::Labels;
use crate::nifti_io::stream_label_slices;

/// The classes measured and, for every label value, the classes it belongs to.
#[derive(Clone, Debug)]
pub struct ClassTable {
    /// The classes, in report order.
    pub classes: Vec<LabelClass>,
    of_value: Vec<Vec<u16>>,
    /// Classes are every non-zero value met (no dataset.json or `--labels`).
    discover: bool,
    ignore: Option<u16>,
}

impl ClassTable {
    /// The given classes (background excluded by the caller); `ignore`: the reference's ignore
    /// label.
    pub fn fixed(classes: Vec<LabelClass>, ignore: Option<u16>) -> ClassTable {
        let mut of_value = vec![Vec::new(); 1 << 16];
        for (c, class) in classes.iter().enumerate() {
            for &v in &class.values {
                of_value[v as usize].push(c as u16);
            }
        }
        ClassTable {
            classes,
            of_value,
            discover: false,
            ignore,
        }
    }

    /// What a model's or a dataset's labels score: each foreground class or region, and the
    /// ignore label.
    pub fn of_labels(labels: &Labels) -> ClassTable {
        ClassTable::fixed(labels.foreground(), labels.ignore())
    }

    /// Every non-zero label value met in either file is a class of its own.
    pub fn discovered(ignore: Option<u16>) -> ClassTable {
        let mut t = ClassTable::fixed(Vec::new(), ignore);
        t.discover = true;
        t
    }

    fn learn(&mut self, slice: &[u16]) {
        if !self.discover {
            return;
        }
        for &v in slice {
            if v != 0 && self.of_value[v as usize].is_empty() && Some(v) != self.ignore {
                let c = self.classes.len() as u16;
                self.classes.push(LabelClass {
                    name: format!("label {v}"),
                    values: vec![v],
                });
                self.of_value[v as usize].push(c);
            }
        }
    }

    /// Whether label `value` belongs to class `class` (its index in `classes`).
    pub fn member(&self, class: u16, value: u16) -> bool {
        self.of_value[value as usize].contains(&class)
    }
}

/// What the pass counted for one class.
#[derive(Clone, Debug, Default)]
pub struct ClassCounts {
    /// Voxels in the class in both files.
    pub tp: u64,
    /// Voxels in the class in the prediction only.
    pub fp: u64,
    /// Voxels in the class in the reference only.
    pub fn_: u64,
    /// The prediction's edge voxels (x, y, z).
    pub pred_edges: Vec<[u32; 3]>,
    /// The reference's edge voxels (x, y, z).
    pub ref_edges: Vec<[u32; 3]>,
}

/// Three consecutive slices of one file around the slice being measured.
#[derive(Default)]
struct Window {
    prev: Option<Vec<u16>>,
    cur: Option<Vec<u16>>,
    next: Option<Vec<u16>>,
}

impl Window {
    fn push(&mut self, slice: Option<Vec<u16>>) {
        self.prev = self.cur.take();
        self.cur = self.next.take();
        self.next = slice;
    }
}

/// The scratch copies of a pair, (z, y, x), for clDice.
pub struct PairScratch {
    /// The prediction's values.
    pub pred: ScratchLabels,
    /// The reference's values.
    pub reference: ScratchLabels,
}

/// The pass's state: the class table (it grows when classes are discovered) and the counts.
struct Pass<'a> {
    table: ClassTable,
    counts: Vec<ClassCounts>,
    nx: usize,
    ny: usize,
    /// One slice: edges in 2-D.
    flat: bool,
    pred: Window,
    reference: Window,
    /// The z of the slice in `cur`.
    z: usize,
    /// Slices taken so far.
    taken: usize,
    scratch: Option<&'a PairScratch>,
}

impl Pass<'_> {
    /// Take the next slice of both files (`None` at the end) and measure the one before it.
    fn push(&mut self, pred: Option<Vec<u16>>, reference: Option<Vec<u16>>) -> Result<()> {
        let (mut pred, reference) = (pred, reference);
        if let (Some(p), Some(r), Some(ignore)) = (&mut pred, &reference, self.table.ignore) {
            // Not annotated: neither side counts here.
            for (p, &r) in p.iter_mut().zip(r) {
                if r == ignore {
                    *p = 0;
                }
            }
        }
        let reference = reference.map(|mut r| {
            if let Some(ignore) = self.table.ignore {
                r.iter_mut().filter(|v| **v == ignore).for_each(|v| *v = 0);
            }
            r
        });
        for s in [&pred, &reference].into_iter().flatten() {
            self.table.learn(s);
        }
        if let (Some(s), Some(p), Some(r)) = (self.scratch, &pred, &reference) {
            s.pred.write_planes(self.taken, p)?;
            s.reference.write_planes(self.taken, r)?;
        }
        self.taken += 1;
        self.counts
            .resize_with(self.table.classes.len(), ClassCounts::default);
        self.pred.push(pred);
        self.reference.push(reference);
        if self.pred.cur.is_some() {
            self.measure();
            self.z += 1;
        }
        Ok(())
    }

    fn measure(&mut self) {
        let (nx, ny, z) = (self.nx, self.ny, self.z as u32);
        let (Some(p), Some(r)) = (&self.pred.cur, &self.reference.cur) else {
            return;
        };
        let table = &self.table;
        for y in 0..ny {
            for x in 0..nx {
                let i = y * nx + x;
                let (pv, rv) = (p[i], r[i]);
                let (pc, rc) = (&table.of_value[pv as usize], &table.of_value[rv as usize]);
                if pc.is_empty() && rc.is_empty() {
                    continue;
                }
                for &c in pc {
                    let counts = &mut self.counts[c as usize];
                    if rc.contains(&c) {
                        counts.tp += 1;
                    } else {
                        counts.fp += 1;
                    }
                    if edge(table, c, &self.pred, nx, ny, self.flat, x, y) {
                        counts.pred_edges.push([x as u32, y as u32, z]);
                    }
                }
                for &c in rc {
                    let counts = &mut self.counts[c as usize];
                    if !pc.contains(&c) {
                        counts.fn_ += 1;
                    }
                    if edge(table, c, &self.reference, nx, ny, self.flat, x, y) {
                        counts.ref_edges.push([x as u32, y as u32, z]);
                    }
                }
            }
        }
    }
}

/// Whether voxel (x, y) of the window's current slice, in `class`, has a 6-neighbour outside it
/// (`flat`: a one-slice image, measured in 2-D: its 4 in-plane neighbours only).
#[allow(clippy::too_many_arguments)] // the voxel, its slices and the grid: all needed here
fn edge(
    table: &ClassTable,
    class: u16,
    w: &Window,
    nx: usize,
    ny: usize,
    flat: bool,
    x: usize,
    y: usize,
) -> bool {
    let Some(cur) = &w.cur else {
        return true;
    };
    if x == 0 || y == 0 || x + 1 == nx || y + 1 == ny {
        return true;
    }
    let i = y * nx + x;
    let outside = |v: u16| !table.member(class, v);
    if [cur[i - 1], cur[i + 1], cur[i - nx], cur[i + nx]]
        .into_iter()
        .any(outside)
    {
        return true;
    }
    if flat {
        return false;
    }
    match (&w.prev, &w.next) {
        (Some(prev), Some(next)) => outside(prev[i]) || outside(next[i]),
        _ => true,
    }
}

/// Measure `pred` against `reference` (both label files on a grid of `nz` slices of `nx` x
/// `ny`, already checked to agree; a one-slice grid is measured as a 2-D image): the reference is read on a thread of its own, a slice ahead at
/// most, while the prediction is read here. Returns the table (with any discovered classes)
/// and its counts; fills `scratch` (volumes of `nz` x `ny` x `nx`) when given.
pub fn measure_pair(
    pred: &Path,
    reference: &Path,
    [nx, ny, nz]: [usize; 3],
    table: ClassTable,
    scratch: Option<&PairScratch>,
) -> Result<(ClassTable, Vec<ClassCounts>)> {
    let mut pass = Pass {
        counts: vec![ClassCounts::default(); table.classes.len()],
        table,
        nx,
        ny,
        flat: nz == 1,
        pred: Window::default(),
        reference: Window::default(),
        z: 0,
        taken: 0,
        scratch,
    };
    let (tx, rx) = mpsc::sync_channel::<Vec<u16>>(2);
    let stopped = || Error::Dataset("stopped".into());
    let (ours, theirs) = std::thread::scope(|s| {
        let reader = s.spawn(move || {
            stream_label_slices(reference, &mut |_, slice| {
                tx.send(slice.to_vec()).map_err(|_| stopped())
            })
        });
        let ours = stream_label_slices(pred, &mut |_, slice| {
            let r = rx.recv().map_err(|_| stopped())?;
            pass.push(Some(slice.to_vec()), Some(r))
        });
        drop(rx);
        let theirs = reader
            .join()
            .unwrap_or_else(|_| Err(Error::Dataset("the reference reader failed".into())));
        (ours, theirs)
    });
    // The reader's own error explains a prediction that stopped for want of its slices.
    match (ours, theirs) {
        (Err(Error::Dataset(m)), Err(e)) if m == "stopped" => return Err(e),
        (Err(e), _) => return Err(e),
        (Ok(_), Err(e)) => return Err(e),
        (Ok(_), Ok(_)) => {}
    }
    pass.push(None, None)?;
    Ok((pass.table, pass.counts))
}
