//! An entry's group attributes (`entries/ab/KEY/zarr.json` -> `attributes.voxcache`): what was
//! built from which files, with which parameters, on which grid, where its parts are, and the
//! checksum of every written block.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::checksums::ChunkChecksums;
use super::dtype::Dtype;
use super::normalization::{AppliedNormalization, IntensityStats};
use super::params::{ChunkLayout, OutputParams};
use super::{check_version, ome, positive3, FORMAT_VERSION};
use crate::error::{Error, Result};

/// Name of the entry's array holding the image.
pub const IMAGE_ARRAY: &str = "image";
/// Name of the entry's array holding the label.
pub const LABEL_ARRAY: &str = "label";
/// The most image channels an entry may have (the reader gives each its own cache slot).
pub const MAX_CHANNELS: usize = 64;

/// Name of the entry's foreground index array.
pub const FG_ARRAY: &str = "fg";
/// Name of the entry's signed distance array (one channel per foreground class).
pub const DISTANCE_ARRAY: &str = "distance";
/// Name of the entry's skeleton array (the label's type; each skeleton voxel holds its class).
pub const SKELETON_ARRAY: &str = "skeleton";
/// Name of the entry's normalization-mask array (uint8: 1 where nnU-Net's preprocessed
/// segmentation is not -1, the voxels its training keeps in the channels it masks).
pub const NORM_MASK_ARRAY: &str = "norm_mask";

/// One input file of a case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceFile {
    /// File name (no folder: the dataset may move).
    pub file: String,
    /// blake3 of the file's bytes, hex.
    pub blake3: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// The files an entry was built from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sources {
    /// The image files, one per channel in channel order.
    pub images: Vec<SourceFile>,
    /// The label file; `None` for an unlabelled case.
    pub label: Option<SourceFile>,
}

/// The input image's grid as its header describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputGeometry {
    /// Shape (x, y, z) in voxels.
    #[serde(deserialize_with = "positive3")]
    pub shape_xyz: [usize; 3],
    /// Spacing (x, y, z) in the files' units.
    pub spacing_xyz: [f64; 3],
    /// Voxel (i, j, k) to world, as the header gives it.
    pub affine: [[f64; 4]; 4],
    /// "sform", "qform" or "pixdim".
    pub affine_source: String,
    /// Why the header's preferred transform was passed over for `affine_source`, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affine_warning: Option<String>,
    /// Axis codes of the affine, e.g. "RAS".
    pub orientation: String,
    /// NIfTI datatype name, e.g. "int16".
    pub datatype: String,
    /// "mm", "um", "m" or "unknown".
    pub unit: String,
}

/// The cached grid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputGeometry {
    /// Array axis names: always `["z", "y", "x"]`.
    pub axes: [String; 3],
    /// Shape (z, y, x) in voxels: the arrays' shape.
    #[serde(deserialize_with = "positive3")]
    pub shape_zyx: [usize; 3],
    /// The same shape in NIfTI axis order (x, y, z).
    #[serde(deserialize_with = "positive3")]
    pub shape_xyz: [usize; 3],
    /// True output spacing (x, y, z): the input extent over the output voxel count.
    pub spacing_xyz: [f64; 3],
    /// The spacing asked for (x, y, z).
    pub target_spacing_xyz: [f64; 3],
    /// Voxel (x, y, z) to world, like the input's.
    pub affine: [[f64; 4]; 4],
    /// Axis codes of the affine, e.g. "RAS" (the same as the input's).
    pub orientation: String,
}

impl OutputGeometry {
    /// The output grid of `shape_xyz` voxels.
    pub fn new(
        shape_xyz: [usize; 3],
        spacing_xyz: [f64; 3],
        target_spacing_xyz: [f64; 3],
        affine: [[f64; 4]; 4],
        orientation: String,
    ) -> Self {
        OutputGeometry {
            axes: ["z", "y", "x"].map(String::from),
            shape_zyx: zyx(shape_xyz),
            shape_xyz,
            spacing_xyz,
            target_spacing_xyz,
            orientation,
            affine,
        }
    }
}

/// The label array's type and what it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LabelInfo {
    /// Element type of the label array: uint8 or uint16.
    pub dtype: Dtype,
    /// Per label value present (background 0 excluded): voxel count and bounding box.
    pub classes: BTreeMap<u16, ClassStats>,
}

/// Rows `start..start + count` of the `fg` array belong to one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowRange {
    /// The class's first row.
    pub start: u64,
    /// The class's rows: its sampled coordinates.
    pub count: u64,
}

/// Where the sampled foreground coordinates are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FgIndexInfo {
    /// The array's name (`fg`), `None` when no class has a voxel.
    pub array: Option<String>,
    /// What each row of the array holds: `["class", "z", "y", "x"]`.
    pub columns: [String; 4],
    /// Label value -> its rows; classes follow each other in ascending order.
    pub rows_per_class: BTreeMap<u16, RowRange>,
}

impl FgIndexInfo {
    /// Rows over all classes.
    pub fn total_rows(&self) -> u64 {
        self.rows_per_class.values().map(|r| r.count).sum()
    }
}

/// The signed distance array: `(c, z, y, x)` float32, channel `k` for label value
/// `classes[k]`; outside the class the distance to its nearest voxel, inside minus the distance
/// to the nearest voxel outside it, between voxel centres in the output spacing's unit, over the
/// whole volume. A class absent from the case has no channel (read as 0: nothing to measure).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistanceInfo {
    /// The array's name ([`DISTANCE_ARRAY`]).
    pub array: String,
    /// Label value of each channel, ascending.
    pub classes: Vec<u16>,
    /// The unit of the distances (the input's spatial unit).
    pub unit: String,
}

/// The skeleton array: the label's type and shape, each voxel of a class's skeleton holding the
/// class, 0 elsewhere. Built chunk by chunk, each chunk thinned with a halo of label around it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SkeletonInfo {
    /// The array's name ([`SKELETON_ARRAY`]).
    pub array: String,
    /// Skeleton voxels per class.
    pub voxels: BTreeMap<u16, u64>,
    /// The halo (voxels of label around each chunk) every chunk got at least.
    pub halo_voxels: usize,
    /// The widest halo a chunk needed (structures thicker than the base halo get a wider one).
    pub widest_halo_voxels: usize,
    /// Chunks whose structures were still thicker than the widest halo allowed: their skeleton
    /// may differ from a whole-volume one near the chunk's faces.
    pub chunks_over_halo: usize,
}

/// Arrays derived from the label at build time, for the losses that need them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DerivedInfo {
    /// The signed distance per foreground class, if built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distance: Option<DistanceInfo>,
    /// The skeleton, if built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skeleton: Option<SkeletonInfo>,
    /// nnU-Net's normalization mask, in a labelled entry of a cache of nnU-Net's
    /// preprocessing whose plans normalize some channel within the mask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_mask: Option<NormMaskInfo>,
}

/// The normalization mask of an entry of nnU-Net's preprocessing: where nnU-Net's own
/// preprocessed segmentation is not -1 (inside the filled nonzero mask, or labelled). Its
/// training zeroes the masked channels outside it after augmentation (MaskImageTransform).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NormMaskInfo {
    /// The array's name ([`NORM_MASK_ARRAY`]).
    pub array: String,
    /// The image channels normalized within the mask (zeroed outside it after augmentation).
    pub channels: Vec<u16>,
}

/// Everything voxcache records about one entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryAttrs {
    /// [`FORMAT_VERSION`] of the writer; other versions are refused.
    pub format_version: u32,
    /// Case id the entry was built for.
    pub case_id: String,
    /// The content key (the entry's folder name).
    pub key: String,
    /// "voxcache VERSION".
    pub created_by: String,
    /// The input files: names, hashes, sizes.
    pub source: Sources,
    /// The input image's grid.
    pub input: InputGeometry,
    /// The cached grid.
    pub output: OutputGeometry,
    /// The parameters the entry was built with.
    pub params: OutputParams,
    /// This entry's chunk and shard shape (the configured ones, fitted to its shape).
    pub layout: ChunkLayout,
    /// Statistics of each input channel before normalization.
    pub intensity: Vec<IntensityStats>,
    /// The normalization applied to each channel before resampling.
    pub normalization: Vec<AppliedNormalization>,
    /// `None` for a case built without a label.
    pub label: Option<LabelInfo>,
    /// Where the sampled foreground coordinates are.
    pub fg_index: FgIndexInfo,
    /// The label-derived arrays built for this entry.
    #[serde(default)]
    pub derived: DerivedInfo,
    /// The checksum of every written block ([`ChunkChecksums`]).
    pub chunk_checksums: ChunkChecksums,
}

/// The attributes key voxcache's record lives under in the group's `zarr.json`.
const ATTRS_KEY: &str = "voxcache";

impl EntryAttrs {
    /// Image channels.
    pub fn channels(&self) -> usize {
        self.params.channels.len()
    }

    /// The group attributes to write: ours, and OME-Zarr's so viewers place the image.
    pub fn to_group_attributes(&self) -> Result<Map<String, Value>> {
        let mut attrs = Map::new();
        let ours = serde_json::to_value(self)
            .map_err(|e| Error::Config(format!("entry attributes do not serialize: {e}")))?;
        attrs.insert(ATTRS_KEY.into(), ours);
        let o = &self.output;
        attrs.insert(
            "ome".into(),
            ome::multiscales(&self.case_id, o.spacing_xyz, &self.input.unit),
        );
        Ok(attrs)
    }

    /// Parse a group `zarr.json` (its bytes; `path` names it in errors).
    pub fn from_group_json(path: &std::path::Path, bytes: &[u8]) -> Result<EntryAttrs> {
        #[derive(Deserialize)]
        struct Group {
            #[serde(default)]
            attributes: Map<String, Value>,
        }
        let group: Group = serde_json::from_slice(bytes).map_err(|e| {
            let what = if e.is_eof() { "truncated" } else { "not valid" };
            Error::cache(path, format!("{what} JSON ({e})"))
        })?;
        let ours = group
            .attributes
            .get(ATTRS_KEY)
            .filter(|v| v.is_object())
            .ok_or_else(|| Error::cache(path, "no attributes.voxcache: not a voxcache entry"))?;
        check_version(path, "entry", ours.get("format_version"))?;
        let attrs = EntryAttrs::deserialize(ours)
            .map_err(|e| Error::cache(path, format!("malformed voxcache attributes: {e}")))?;
        attrs.check(path)?;
        Ok(attrs)
    }

    /// Consistency a reader relies on: names are plain, the layout fits, the index fits.
    fn check(&self, path: &std::path::Path) -> Result<()> {
        let bad = |m: String| Err(Error::cache(path, m));
        if self.format_version != FORMAT_VERSION {
            return bad(format!("format_version {}", self.format_version));
        }
        if self.output.shape_xyz != zyx(self.output.shape_zyx) {
            return bad(format!(
                "output.shape_xyz {:?} is not output.shape_zyx {:?} reversed",
                self.output.shape_xyz, self.output.shape_zyx
            ));
        }
        let c = self.params.channels.len();
        if c == 0 || c > MAX_CHANNELS {
            return bad(format!(
                "params.channels: {c} channels (1 to {MAX_CHANNELS} can be read)"
            ));
        }
        if self.source.images.len() != c
            || self.intensity.len() != c
            || self.normalization.len() != c
        {
            return bad(format!(
                "{c} channels in params, but {} source images, {} intensity records and {} normalizations",
                self.source.images.len(),
                self.intensity.len(),
                self.normalization.len()
            ));
        }
        if let Some(a) = &self.fg_index.array {
            if a != FG_ARRAY {
                return bad(format!("fg_index.array {a:?} is not {FG_ARRAY:?}"));
            }
        }
        let l = &self.layout;
        if l.chunk_zyx.contains(&0) {
            return bad(format!(
                "layout.chunk_zyx {:?} has a zero side",
                l.chunk_zyx
            ));
        }
        if let Some(s) = l.shard_zyx {
            if (0..3).any(|a| s[a] == 0 || s[a] % l.chunk_zyx[a] != 0) {
                return bad(format!(
                    "layout.shard_zyx {s:?} is not a whole multiple of the chunk {:?}",
                    l.chunk_zyx
                ));
            }
        }
        if let Some(d) = &self.derived.distance {
            if d.array != DISTANCE_ARRAY || self.label.is_none() {
                return bad(format!(
                    "derived.distance: array {:?} (expected {DISTANCE_ARRAY:?}, in a labelled entry)",
                    d.array
                ));
            }
            if d.classes.windows(2).any(|w| w[0] >= w[1]) || d.classes.contains(&0) {
                return bad(format!(
                    "derived.distance.classes {:?} are not ascending foreground values",
                    d.classes
                ));
            }
        }
        if let Some(label) = &self.label {
            // What was built is what the parameters asked for, for the classes the label has.
            let asked = &self.params.derived;
            let said = |b: bool| if b { "present" } else { "absent" };
            for (name, want, built) in [
                ("distance", asked.distance, self.derived.distance.is_some()),
                ("skeleton", asked.skeleton, self.derived.skeleton.is_some()),
            ] {
                if want != built {
                    return bad(format!(
                        "params.derived.{name} is {want} but derived.{name} is {}",
                        said(built)
                    ));
                }
            }
            if let Some(d) = &self.derived.distance {
                let classes: Vec<u16> = label
                    .classes
                    .keys()
                    .copied()
                    .filter(|&c| Some(c) != asked.ignore_label)
                    .collect();
                if d.classes != classes {
                    return bad(format!(
                        "derived.distance.classes {:?} are not the label's classes {classes:?}",
                        d.classes
                    ));
                }
                if d.unit != self.input.unit {
                    return bad(format!(
                        "derived.distance.unit {:?} is not the input's unit {:?}",
                        d.unit, self.input.unit
                    ));
                }
            }
        }
        if let Some(s) = &self.derived.skeleton {
            if s.array != SKELETON_ARRAY || self.label.is_none() {
                return bad(format!(
                    "derived.skeleton: array {:?} (expected {SKELETON_ARRAY:?}, in a labelled entry)",
                    s.array
                ));
            }
        }
        // The mask is what the parameters asked for: the plans' masked channels, in a labelled
        // entry (an unlabelled one has no segmentation to take it from).
        let asked: &[u16] = match &self.params.nnunet {
            Some(n) => &n.norm_mask_channels,
            None => &[],
        };
        let channels = self.params.channels.len();
        let ascending = asked.windows(2).all(|w| w[0] < w[1]);
        if !ascending || asked.iter().any(|&c| c as usize >= channels) {
            return bad(format!(
                "params.nnunet.norm_mask_channels {asked:?} are not ascending channels of the {channels}"
            ));
        }
        let want = (!asked.is_empty() && self.label.is_some()).then_some(asked);
        let built = self.derived.norm_mask.as_ref();
        if want != built.map(|m| m.channels.as_slice())
            || built.is_some_and(|m| m.array != NORM_MASK_ARRAY)
        {
            return bad(format!(
                "derived.norm_mask is {:?} where the parameters ask for {want:?} (array {NORM_MASK_ARRAY:?}, in a labelled entry)",
                built.map(|m| (&m.array, &m.channels))
            ));
        }
        let mut end = 0u64;
        for (c, r) in &self.fg_index.rows_per_class {
            if r.start != end {
                return bad(format!(
                    "fg_index: class {c} starts at row {} where row {end} was expected",
                    r.start
                ));
            }
            end = r.start.saturating_add(r.count);
        }
        if end > 0 && self.fg_index.array.is_none() {
            return bad("fg_index has rows but no array".into());
        }
        Ok(())
    }
}

/// Counts and bounding box of one class, in output voxel coordinates (z, y, x), inclusive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassStats {
    /// Voxels of this class in the output.
    pub voxels: u64,
    /// Smallest (z, y, x) of its voxels.
    pub bbox_min_zyx: [usize; 3],
    /// Largest (z, y, x) of its voxels.
    pub bbox_max_zyx: [usize; 3],
}

/// A shape in the other axis order: (x, y, z) <-> (z, y, x).
fn zyx(s: [usize; 3]) -> [usize; 3] {
    [s[2], s[1], s[0]]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A format-4 entry (its checksums in a `voxcache_chunks.json` file, the field naming it) is
    /// refused with the one sentence that says to rebuild, before its fields are looked at.
    #[test]
    fn an_entry_of_the_checksums_file_era_is_refused_with_rebuild() {
        let group = serde_json::json!({
            "zarr_format": 3,
            "node_type": "group",
            "attributes": {ATTRS_KEY: {"format_version": 4, "chunk_checksums": "voxcache_chunks.json"}},
        });
        let path = std::path::Path::new("entries/ab/abcd/zarr.json");
        let err = EntryAttrs::from_group_json(path, group.to_string().as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("format version 4") && err.contains("rebuild the cache"),
            "{err}"
        );
    }
}
