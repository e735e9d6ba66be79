//! nnU-Net's postprocessing: keep only the largest connected component of a region (the
//! foreground as a whole, or one class), the rest becoming background. Applied to a written
//! segmentation file: its voxels are copied once into a scratch file (2 bytes a voxel, beside
//! the output), each filter is two passes over it slice by slice (components, then the
//! filtering), and the result is streamed into a NIfTI with the input's header. Memory is a few
//! slices and the components' union-find, whatever the volume's size.
//! [`chosen`] says which decision a predict applies: none, a file, or the one recorded beside
//! its models.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::model_dir::LoadedModel;
use crate::error::{Error, Result};
use crate::format::crossval::{Postprocessing, POSTPROCESSING_FILE};
use crate::geometry::components::{Components, Connectivity};
use crate::nifti_io::{stream_label_slices, LabelType, LabelWriter};

/// Where a predict's postprocessing comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum PostprocessingChoice {
    /// The decision `evaluate --cv` wrote beside the models (`postprocessing.json`), if any:
    /// all members must carry the same one.
    Recorded,
    /// None.
    Off,
    /// This decision file.
    File(PathBuf),
}

/// The postprocessing asked for: none, a file, or the decision recorded beside the models (the
/// same for every member, or an error naming two that differ). Checked against the models'
/// classes before any work.
pub fn chosen(
    choice: &PostprocessingChoice,
    dirs: &[PathBuf],
    models: &[LoadedModel],
) -> Result<Option<Postprocessing>> {
    let chosen = match choice {
        PostprocessingChoice::Off => None,
        PostprocessingChoice::File(p) => Some((
            p.clone(),
            Postprocessing::read(p)?
                .ok_or_else(|| Error::io(p, std::io::Error::from(std::io::ErrorKind::NotFound)))?,
        )),
        PostprocessingChoice::Recorded => {
            let mut first: Option<(PathBuf, Option<Postprocessing>)> = None;
            for dir in dirs {
                let path = dir.join(POSTPROCESSING_FILE);
                let pp = Postprocessing::read(&path)?;
                let key = |p: &Option<Postprocessing>| p.as_ref().map(Postprocessing::key);
                match &first {
                    None => first = Some((path, pp)),
                    Some((p0, pp0)) if key(pp0) != key(&pp) => {
                        return Err(Error::Config(format!(
                            "{} and {}: the ensemble's members carry different postprocessing \
                             decisions (run `evaluate --cv` over the same folds, or pass \
                             --postprocessing FILE or --no-postprocessing)",
                            p0.display(),
                            path.display()
                        )))
                    }
                    Some(_) => {}
                }
            }
            first.and_then(|(p, pp)| pp.map(|pp| (p, pp)))
        }
    };
    let Some((path, pp)) = chosen else {
        return Ok(None);
    };
    let labels = models[0].record.labels();
    let scored: Vec<Vec<u16>> = labels.foreground().into_iter().map(|c| c.values).collect();
    let regions = labels.is_regions();
    for v in &pp.classes {
        // A region model's classes are the label values it writes.
        let known = match regions {
            false => scored.contains(&vec![*v]),
            true => scored.iter().any(|r| r.contains(v)),
        };
        if !known {
            return Err(Error::Config(format!(
                "{}: label {v} is not a foreground class of the model",
                path.display()
            )));
        }
    }
    if let Some(r) = pp.regions.iter().find(|r| !scored.contains(r)) {
        return Err(Error::Config(format!(
            "{}: region {r:?} is not one of the model's regions ({scored:?})",
            path.display()
        )));
    }
    Ok(Some(pp))
}

/// One filter: keep the largest component of the voxels holding any of these values.
pub type Region = Vec<u16>;

/// The filters of a decision, in order, for a model whose foreground classes have `values`.
pub fn regions(pp: &Postprocessing, values: &[u16]) -> Vec<Region> {
    let mut out = Vec::new();
    if pp.foreground {
        out.push(values.to_vec());
    }
    out.extend(pp.classes.iter().map(|&v| vec![v]));
    out.extend(pp.regions.iter().cloned());
    out
}

/// The decision's neighbourhood.
pub fn connectivity(pp: &Postprocessing) -> Connectivity {
    match pp.connectivity.as_str() {
        "faces" => Connectivity::Faces,
        _ => Connectivity::Full,
    }
}

/// A scratch copy of a label volume, removed when dropped.
struct Scratch {
    path: PathBuf,
    file: File,
    plane: usize,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Scratch {
    fn read(&self, z: usize) -> Result<Vec<u16>> {
        let mut bytes = vec![0u8; self.plane * 2];
        self.file
            .read_exact_at(&mut bytes, (z * self.plane * 2) as u64)
            .map_err(|e| Error::io(&self.path, e))?;
        Ok(bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect())
    }

    fn write(&self, z: usize, values: &[u16]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.file
            .write_all_at(&bytes, (z * self.plane * 2) as u64)
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// Keep, for each region in turn, only its largest component(s) (components of equal largest
/// size are all kept, as nnU-Net does) in the segmentation `input`, writing `output` (.nii.gz,
/// the input's header). `input` and `output` may be the same file.
pub fn apply_file(
    input: &Path,
    output: &Path,
    regions: &[Region],
    connectivity: Connectivity,
) -> Result<()> {
    let dir = output.parent().unwrap_or(Path::new("."));
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let owner = format!(
        "{}.{}",
        crate::util::sysinfo::hostname(),
        std::process::id()
    );
    let scratch_path = dir.join(format!(".{name}.labels.{owner}"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&scratch_path)
        .map_err(|e| Error::io(&scratch_path, e))?;
    let mut scratch = Scratch {
        path: scratch_path,
        file,
        plane: 0,
    };
    let mut max = 0u16;
    let header = {
        let mut w = BufWriter::new(&scratch.file);
        let path = scratch.path.clone();
        let h = stream_label_slices(input, &mut |_, values| {
            max = max.max(values.iter().copied().max().unwrap_or(0));
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            w.write_all(&bytes).map_err(|e| Error::io(&path, e))
        })?;
        w.flush().map_err(|e| Error::io(&scratch.path, e))?;
        h
    };
    let [nx, ny, nz] = header.shape_xyz;
    scratch.plane = nx * ny;
    let shape_zyx = [nz, ny, nx];
    for region in regions {
        let member = |v: u16| v != 0 && region.contains(&v);
        let mask = |z: usize| -> Result<Vec<bool>> {
            Ok(scratch.read(z)?.into_iter().map(member).collect())
        };
        let mut comps = Components::find(shape_zyx, connectivity, mask)?;
        let largest = comps.sizes().iter().copied().max().unwrap_or(0);
        if comps.sizes().iter().filter(|&&s| s > 0).count() <= 1 {
            continue;
        }
        let keep: Vec<bool> = std::iter::once(false)
            .chain(comps.sizes().iter().map(|&s| s == largest))
            .collect();
        comps.relabel(mask, |z, labels| {
            let mut values = scratch.read(z)?;
            let mut changed = false;
            for (v, &l) in values.iter_mut().zip(labels) {
                if l != 0 && !keep[l as usize] {
                    *v = 0;
                    changed = true;
                }
            }
            if changed {
                scratch.write(z, &values)?;
            }
            Ok(())
        })?;
    }
    // Written under a temporary name, then renamed: `output` may be `input`.
    let tmp = dir.join(format!(".{name}.tmp.{owner}"));
    let written = (|| -> Result<()> {
        let mut w =
            LabelWriter::create(&tmp, input, (nx * ny * nz) as u64, LabelType::for_max(max))?;
        for z in 0..nz {
            w.write(&scratch.read(z)?)?;
        }
        w.finish()?;
        std::fs::rename(&tmp, output).map_err(|e| Error::io(output, e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
