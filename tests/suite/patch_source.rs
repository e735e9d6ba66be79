//! The storage seam: the sampler and loader run on any `PatchSource`, here volumes held in
//! memory, and give the same patches as a crop of those volumes (with zero padding outside).

use voxcache::cache::PatchSource;
use voxcache::train::augment::AugmentConfig;
use voxcache::train::loader::{Loader, LoaderConfig};
use voxcache::train::sampler::{Sampler, SamplerConfig};
use voxcache::Result;

/// A case held in memory: image value = linear voxel index, label 1 inside a box.
struct InMemory {
    name: String,
    shape: [usize; 3],
    image: Vec<f32>,
    label: Vec<u16>,
}

impl InMemory {
    fn new(name: &str, shape: [usize; 3], fg_lo: [usize; 3], fg_hi: [usize; 3]) -> Self {
        let n = shape.iter().product();
        let mut label = vec![0u16; n];
        for z in fg_lo[0]..fg_hi[0] {
            for y in fg_lo[1]..fg_hi[1] {
                for x in fg_lo[2]..fg_hi[2] {
                    label[(z * shape[1] + y) * shape[2] + x] = 1;
                }
            }
        }
        InMemory {
            name: name.into(),
            shape,
            image: (0..n).map(|i| i as f32).collect(),
            label,
        }
    }

    /// The box at `start` of `size`, zero outside the volume.
    fn crop<T: Copy + Default>(&self, data: &[T], start: [i64; 3], size: [usize; 3]) -> Vec<T> {
        let mut out = Vec::with_capacity(size.iter().product());
        for z in 0..size[0] as i64 {
            for y in 0..size[1] as i64 {
                for x in 0..size[2] as i64 {
                    let p = [start[0] + z, start[1] + y, start[2] + x];
                    let inside = (0..3).all(|a| p[a] >= 0 && (p[a] as usize) < self.shape[a]);
                    out.push(if inside {
                        let [pz, py, px] = p.map(|v| v as usize);
                        data[(pz * self.shape[1] + py) * self.shape[2] + px]
                    } else {
                        T::default()
                    });
                }
            }
        }
        out
    }
}

impl PatchSource for InMemory {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn shape_zyx(&self) -> [usize; 3] {
        self.shape
    }
    fn has_label(&self) -> bool {
        true
    }
    fn classes(&self) -> Vec<u16> {
        vec![1]
    }
    fn fg_coords(&self, class: u16) -> Result<Vec<[u32; 3]>> {
        let [_, ny, nx] = self.shape;
        Ok((0..self.label.len())
            .filter(|&i| self.label[i] == class)
            .map(|i| {
                [
                    (i / (ny * nx)) as u32,
                    (i / nx % ny) as u32,
                    (i % nx) as u32,
                ]
            })
            .collect())
    }
    fn read_image(&self, start: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
        out.copy_from_slice(&self.crop(&self.image, start, size));
        Ok(())
    }
    fn read_label(&self, start: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
        out.copy_from_slice(&self.crop(&self.label, start, size));
        Ok(())
    }
}

#[test]
fn the_loader_reads_any_patch_source() {
    let cases = vec![
        InMemory::new("a", [6, 20, 24], [2, 5, 5], [4, 9, 9]),
        InMemory::new("b", [3, 17, 30], [0, 10, 20], [3, 12, 29]),
    ];
    let expected: Vec<(Vec<f32>, Vec<u16>, [usize; 3])> = cases
        .iter()
        .map(|c| (c.image.clone(), c.label.clone(), c.shape))
        .collect();
    let size = [4, 8, 8];
    let cfg = SamplerConfig::new(size, 3, 11);
    let sampler = Sampler::new(&cases, Vec::new(), cfg).unwrap();
    let loader_cfg = LoaderConfig {
        workers: 2,
        queue_depth: 2,
        augment: AugmentConfig::none(),
        skeleton: false,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::start(cases, sampler, loader_cfg, 0).unwrap();
    let n: usize = size.iter().product();
    let mut forced_on_fg = 0;
    for step in 0..20 {
        let (b, _) = loader.next().unwrap();
        assert_eq!(b.step, step);
        for (i, c) in b.choices.iter().enumerate() {
            let (image, label, shape) = &expected[c.case];
            let src = InMemory {
                name: String::new(),
                shape: *shape,
                image: image.clone(),
                label: label.clone(),
            };
            assert_eq!(
                b.image[i * n..(i + 1) * n],
                src.crop(image, c.start_zyx, size)
            );
            assert_eq!(
                b.label[i * n..(i + 1) * n],
                src.crop(label, c.start_zyx, size)
            );
            if c.forced_fg {
                // A foreground-centred patch has its centre voxel on the class.
                let centre = ((size[0] / 2) * size[1] + size[1] / 2) * size[2] + size[2] / 2;
                assert_eq!(b.label[i * n + centre], 1, "step {step} sample {i}");
                forced_on_fg += 1;
            }
        }
        loader.recycle(b);
    }
    assert!(forced_on_fg > 0);
}

#[test]
fn a_non_finite_image_value_is_an_error_naming_the_case() {
    let mut bad = InMemory::new("broken", [4, 8, 8], [1, 2, 2], [3, 6, 6]);
    bad.image.iter_mut().for_each(|v| *v = f32::NAN);
    let cases = vec![bad];
    let sampler = Sampler::new(&cases, Vec::new(), SamplerConfig::new([4, 8, 8], 2, 3)).unwrap();
    let cfg = LoaderConfig {
        workers: 1,
        queue_depth: 1,
        augment: AugmentConfig::none(),
        skeleton: false,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::start(cases, sampler, cfg, 0).unwrap();
    let Err(err) = loader.next() else {
        panic!("a NaN patch was served")
    };
    let err = err.to_string();
    assert!(
        err.contains("broken") && err.contains("non-finite"),
        "{err}"
    );
}
