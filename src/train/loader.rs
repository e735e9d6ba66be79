//! Worker threads filling a bounded, ordered queue of batches.
//!
//! Workers claim step numbers from a shared counter, build batch `s` from
//! `sampler.choose(s)` (draw each sample's spatial transform from `Rng::derive(seed,
//! &[AUGMENT_STREAM, s, i])` and its mirrorings from `MOVES_STREAM`, read its box through
//! both, augment the rest from the first stream), and file it in a reorder buffer; the consumer takes batches strictly in step order.
//! Because a batch depends only on its step, the stream is the same for any number of workers.
//!
//! Memory is bounded whatever the dataset size: a worker does not start step `s` until
//! `s < consumer_next + queue_depth`, so at most `queue_depth` batches are being built or
//! waiting, plus the one the consumer holds. A failed read (a corrupt chunk) becomes the error
//! of its step, naming the case; a panic in a worker likewise; neither hangs the consumer.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cache::PatchSource;
use crate::error::{Error, Result};
use crate::train::augment::{augment_mirrored, draw_moves, AugmentConfig, Moves};
use crate::train::cascade::previous_stage;
pub use crate::train::cascade::CascadeInput;
use crate::train::norm_mask::{self, MaskAsSkeleton};
use crate::train::sampler::{PatchChoice, Sampler};
use crate::train::skeleton_target::{skeleton_of, tube_around};
use crate::train::spatial::{Transform, TransformedReader};
use crate::util::rng::Rng;

/// Stream tag of augmentation draws (`Rng::derive(seed, &[AUGMENT_STREAM, step, sample])`).
pub const AUGMENT_STREAM: u64 = 0x6175_676d_656e_0002;
/// Stream tag of the mirrorings and turns, drawn before the patch is read so that the read
/// writes it mirrored (`Rng::derive(seed, &[MOVES_STREAM, step, sample])`).
pub const MOVES_STREAM: u64 = 0x6d6f_7665_7300_0003;

/// How the loader builds batches.
#[derive(Clone, Debug, PartialEq)]
pub struct LoaderConfig {
    /// Threads reading and augmenting patches (at least 1).
    pub workers: usize,
    /// Batches that may be built ahead of the consumer (at least 1).
    pub queue_depth: usize,
    /// What the augmentation does.
    pub augment: AugmentConfig,
    /// Also compute each patch's tubed skeleton (the Skeleton Recall loss's target).
    pub skeleton: bool,
    /// Also give each patch's skeleton itself (clDice's target side).
    pub centreline: bool,
    /// Label values whose signed distance maps each patch carries (boundary and surface
    /// losses; the cases must hold them); empty for none.
    pub distance: Vec<u16>,
    /// A cascade's second stage: the last image channels are the previous stage's
    /// segmentation, left out of the intensity transforms and perturbed as nnU-Net does.
    pub cascade: Option<CascadeInput>,
}

/// Stream tag of the cascade's perturbations (`Rng::derive(seed, &[CASCADE_STREAM, step,
/// sample])`): drawn apart, so the other draws are those of a run without them.
const CASCADE_STREAM: u64 = 0x6361_7363_6164_0004;

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            workers: 2,
            queue_depth: 4,
            augment: AugmentConfig::default(),
            skeleton: false,
            centreline: false,
            distance: Vec::new(),
            cascade: None,
        }
    }
}

/// One training batch. `image` is (B, C, D, H, W) and `label` (B, D, H, W), C order.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The step the batch is for.
    pub step: u64,
    /// Patches in the batch.
    pub batch_size: usize,
    /// Patch size (z, y, x).
    pub patch_zyx: [usize; 3],
    /// Image voxels (B, C, D, H, W).
    pub image: Vec<f32>,
    /// Training classes (B, D, H, W).
    pub label: Vec<u16>,
    /// Per voxel the label value whose tubed skeleton covers it (see
    /// [`skeleton_target`](crate::train::skeleton_target)), laid out as `label`; empty unless
    /// the loader was asked for skeletons.
    pub skeleton: Vec<u16>,
    /// Per voxel the label value whose skeleton passes there, laid out as `label`; empty
    /// unless asked for (from the cached skeleton when the case has one).
    pub centreline: Vec<u16>,
    /// Per patch, the signed distance map of each asked-for class, one after the other
    /// (B, K, D, H, W); empty unless asked for.
    pub distance: Vec<f32>,
    /// Per patch, its case's voxel spacing (z, y, x).
    pub spacing: Vec<[f64; 3]>,
    /// Where each patch came from (before augmentation).
    pub choices: Vec<PatchChoice>,
}

/// What the workers build batches from.
struct Job {
    entries: Vec<Arc<dyn PatchSource>>,
    sampler: Sampler,
    augment: AugmentConfig,
    skeleton: bool,
    centreline: bool,
    distance: Vec<u16>,
    cascade: Option<CascadeInput>,
    /// Zero the channels a case's normalization mask names outside it, after augmenting (as
    /// nnU-Net's training does); never for raw patches.
    mask_norm: bool,
}

struct State {
    /// The next step a worker will claim.
    next_claim: u64,
    /// The step the consumer waits for next.
    consumer_next: u64,
    /// Finished steps not yet taken (the reorder buffer).
    ready: BTreeMap<u64, Result<Batch>>,
    /// Image and label buffers handed back ([`Loader::recycle`], [`Recycler`]).
    images: Vec<Vec<f32>>,
    labels: Vec<Vec<u16>>,
    live_workers: usize,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when the consumer takes a batch (room for another step) or on stop.
    room: Condvar,
    /// Signalled when a batch is filed or a worker exits.
    filed: Condvar,
    depth: u64,
    pool_cap: usize,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A worker panic is caught before it can poison the lock; recover anyway rather than
    // turning one failure into a hang or a second panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Worker threads filling a bounded queue with the batches of consecutive steps, in order.
pub struct Loader {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    next_step: u64,
}

impl Loader {
    /// Start the workers; the first [`Loader::next`] returns batch `first_step`.
    pub fn start<S: PatchSource + 'static>(
        entries: Vec<S>,
        sampler: Sampler,
        cfg: LoaderConfig,
        first_step: u64,
    ) -> Result<Loader> {
        let entries: Vec<Arc<dyn PatchSource>> = entries
            .into_iter()
            .map(|e| Arc::new(e) as Arc<dyn PatchSource>)
            .collect();
        if cfg.workers == 0 || cfg.queue_depth == 0 {
            return Err(Error::Config(format!(
                "loader needs at least one worker and a queue depth of at least 1 (got {} workers, depth {})",
                cfg.workers, cfg.queue_depth
            )));
        }
        cfg.augment.validate()?;
        if entries.len() != sampler.num_cases() {
            return Err(Error::Config(format!(
                "{} entries for a sampler of {} cases",
                entries.len(),
                sampler.num_cases()
            )));
        }
        for (i, e) in entries.iter().enumerate() {
            if sampler.shape_zyx(i) != Some(e.shape_zyx()) {
                return Err(Error::Config(format!(
                    "case {}: entry shape {:?} differs from the sampler's {:?}",
                    case_name(e),
                    e.shape_zyx(),
                    sampler.shape_zyx(i)
                )));
            }
            if !e.has_label() {
                return Err(Error::case(
                    case_name(e),
                    "cache entry has no label: it cannot be used for training",
                ));
            }
            if !cfg.distance.is_empty() && !e.has_distance() {
                return Err(Error::case(
                    case_name(e),
                    "the boundary and surface losses need the cached signed distance maps: rebuild the cache with prep build-cache --derived distance (or put derived = [\"distance\"] in the pipeline)",
                ));
            }
            let (c, first) = (e.channels(), entries[0].channels());
            if c != first {
                return Err(Error::case(
                    case_name(e),
                    format!(
                        "{c} image channels where case {} has {first}: every case needs the same channels",
                        case_name(&entries[0])
                    ),
                ));
            }
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                next_claim: first_step,
                consumer_next: first_step,
                ready: BTreeMap::new(),
                images: Vec::new(),
                labels: Vec::new(),
                live_workers: 0,
                stop: false,
            }),
            room: Condvar::new(),
            filed: Condvar::new(),
            depth: cfg.queue_depth as u64,
            pool_cap: cfg.queue_depth + cfg.workers,
        });
        let job = Arc::new(Job {
            entries,
            sampler,
            mask_norm: cfg.augment != AugmentConfig::none(),
            augment: cfg.augment,
            skeleton: cfg.skeleton,
            centreline: cfg.centreline,
            distance: cfg.distance,
            cascade: cfg.cascade,
        });
        // Built before spawning so that a failed spawn stops and joins the others (Drop).
        let mut loader = Loader {
            shared,
            workers: Vec::with_capacity(cfg.workers),
            next_step: first_step,
        };
        for w in 0..cfg.workers {
            let (shared, job) = (loader.shared.clone(), job.clone());
            lock(&loader.shared.state).live_workers += 1;
            let spawned = std::thread::Builder::new()
                .name(format!("voxcache-loader-{w}"))
                .spawn(move || work(&shared, &job));
            match spawned {
                Ok(h) => loader.workers.push(h),
                Err(e) => {
                    lock(&loader.shared.state).live_workers -= 1;
                    return Err(Error::Train(format!("cannot start loader thread: {e}")));
                }
            }
        }
        Ok(loader)
    }

    /// The step the next call to [`Loader::next`] returns.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Blocks until batch `first_step + n` (n-th call) is ready; returns it and the time spent
    /// waiting. A step whose batch could not be built returns its error; the following call
    /// goes on with the next step.
    #[allow(clippy::should_implement_trait)] // fallible and blocking: not an Iterator
    pub fn next(&mut self) -> Result<(Batch, Duration)> {
        let t0 = Instant::now();
        let step = self.next_step;
        let mut st = lock(&self.shared.state);
        let result = loop {
            if let Some(r) = st.ready.remove(&step) {
                break r;
            }
            if st.live_workers == 0 {
                return Err(Error::Train(format!(
                    "loader workers stopped before batch {step} was built"
                )));
            }
            st = self
                .shared
                .filed
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        };
        self.next_step = step + 1;
        st.consumer_next = self.next_step;
        drop(st);
        self.shared.room.notify_all();
        result.map(|b| (b, t0.elapsed()))
    }

    /// Batches built and waiting (at most `queue_depth`), e.g. to tell whether training is
    /// starved by the loader.
    pub fn ready_ahead(&self) -> usize {
        lock(&self.shared.state).ready.len()
    }

    /// Hand a batch's buffers back for reuse by the workers (optional; saves allocations).
    pub fn recycle(&self, batch: Batch) {
        let r = self.recycler();
        r.image(batch.image);
        r.label(batch.label);
    }

    /// A handle that gives buffers back to this loader from anywhere, for as long as it lives
    /// (for batches handed on without a copy, whose buffers come back when their owner lets go).
    pub fn recycler(&self) -> Recycler {
        Recycler(Arc::downgrade(&self.shared))
    }
}

/// Gives batch buffers back to the [`Loader`] that made them (freed once it is dropped). Fresh
/// buffers of a few MiB a batch grew a long run's heap by about 20 MiB (the allocator's
/// adaptive thresholds and per-thread arenas), and each cost the kernel's zeroed pages.
#[derive(Clone)]
pub struct Recycler(std::sync::Weak<Shared>);

impl Recycler {
    /// Give back an image buffer (any length: the next batch sets it).
    pub fn image(&self, v: Vec<f32>) {
        self.give(|st| &mut st.images, v);
    }

    /// Give back a label buffer.
    pub fn label(&self, v: Vec<u16>) {
        self.give(|st| &mut st.labels, v);
    }

    fn give<T>(&self, pool: impl FnOnce(&mut State) -> &mut Vec<Vec<T>>, v: Vec<T>) {
        if v.capacity() == 0 {
            return;
        }
        if let Some(shared) = self.0.upgrade() {
            let mut st = lock(&shared.state);
            let pool = pool(&mut st);
            if pool.len() < shared.pool_cap {
                pool.push(v);
            }
        }
    }
}

impl std::fmt::Debug for Recycler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recycler")
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.room.notify_all();
        self.shared.filed.notify_all();
        for h in self.workers.drain(..) {
            // Worker panics are caught per step; a join error has nothing left to report.
            let _ = h.join();
        }
    }
}

/// Counts a worker out when it exits, however it exits, so the consumer never waits on
/// workers that are gone.
struct LiveGuard<'a>(&'a Shared);

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).live_workers -= 1;
        self.0.filed.notify_all();
    }
}

fn work(shared: &Shared, job: &Job) {
    let _live = LiveGuard(shared);
    // Kept for the worker's life: its box buffers are reused by every transformed read.
    let mut reader = TransformedReader::default();
    loop {
        let (step, buffers) = {
            let mut st = lock(&shared.state);
            while !st.stop && st.next_claim >= st.consumer_next + shared.depth {
                st = shared.room.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.stop {
                return;
            }
            let step = st.next_claim;
            st.next_claim += 1;
            let buffers = (
                st.images.pop().unwrap_or_default(),
                st.labels.pop().unwrap_or_default(),
            );
            (step, buffers)
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            build_batch(job, step, buffers, &mut reader)
        }))
        .unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::Train(format!(
                "loader worker failed building batch {step}: {why}"
            )))
        });
        let mut st = lock(&shared.state);
        if st.stop {
            return;
        }
        st.ready.insert(step, result);
        drop(st);
        shared.filed.notify_all();
    }
}

fn case_name(e: &Arc<dyn PatchSource>) -> String {
    e.name()
}

/// Index of the first NaN or infinity in `v`, in the widest vector build the CPU runs (a scan
/// of every patch: with SSE alone it was 8% of a plain crop's time).
fn first_non_finite(v: &[f32]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::util::simd::Simd;
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(v: &[f32]) -> Option<usize> {
            first_non_finite_body(v)
        }
        // SAFETY: `simd::best` checked that the CPU has these features.
        match crate::util::simd::best() {
            Simd::Avx2 => return unsafe { avx2(v) },
            Simd::Portable => {}
        }
    }
    first_non_finite_body(v)
}

/// [`first_non_finite`]: blocks tested without an early exit first (a loop the compiler
/// vectorizes; `position` goes a value at a time), then the block holding one searched.
#[inline(always)]
fn first_non_finite_body(v: &[f32]) -> Option<usize> {
    let bad_block = v
        .chunks(4096)
        .position(|b| b.iter().fold(false, |bad, x| bad | !x.is_finite()))?;
    let at = bad_block * 4096;
    v[at..].iter().position(|x| !x.is_finite()).map(|k| at + k)
}

/// Batch `step`: a pure function of the job and the step.
fn build_batch(
    job: &Job,
    step: u64,
    buffers: (Vec<f32>, Vec<u16>),
    reader: &mut TransformedReader,
) -> Result<Batch> {
    let cfg = job.sampler.config();
    let patch = cfg.patch_zyx;
    let n: usize = patch.iter().product();
    let choices = job.sampler.choose(step);
    let channels = job.entries.first().map_or(1, |e| e.channels());
    let (mut image, mut label) = buffers;
    // Every voxel is overwritten by the read; resizing only sets the length.
    image.resize(choices.len() * channels * n, 0.0);
    label.resize(choices.len() * n, 0);
    let b = choices.len();
    let sk_len = if job.skeleton { b * n } else { 0 };
    let cl_len = if job.skeleton || job.centreline {
        b * n
    } else {
        0
    };
    let mut skeleton = vec![0u16; sk_len];
    let mut centreline = vec![0u16; cl_len];
    let mut distance = vec![0f32; b * job.distance.len() * n];
    let pieces = image
        .chunks_exact_mut(channels * n)
        .zip(label.chunks_exact_mut(n));
    // Draws are keyed by the sample's index in the whole step (every rank's share).
    let first = cfg.first_sample() as u64;
    for (i, (c, (img, lab))) in choices.iter().zip(pieces).enumerate() {
        let entry = &job.entries[c.case];
        let sample = first + i as u64;
        // The spatial transform is drawn first, then (in `augment`) the rest, all from the
        // sample's own stream.
        let mut rng = Rng::derive(cfg.seed, &[AUGMENT_STREAM, step, sample]);
        let transform = job.augment.spatial.draw(patch, &mut rng);
        let mut moves_rng = Rng::derive(cfg.seed, &[MOVES_STREAM, step, sample]);
        let moves = draw_moves(patch, &job.augment, &mut moves_rng);
        reader
            .read_mirrored(
                entry.as_ref(),
                c.start_zyx,
                patch,
                &transform,
                moves.flips,
                img,
                Some(lab),
            )
            .map_err(|err| {
                Error::case(
                    case_name(entry),
                    format!(
                        "batch {step}, sample {i}: reading the box at {:?} of size {patch:?}: {err}",
                        c.start_zyx
                    ),
                )
            })?;
        // The build refuses non-finite voxels and the reader hashes each block when it first
        // reads it, so one here is damage since (a file changed in place under a running
        // job, or a source other than the cache): name it here rather than as a non-finite
        // loss later. The cache's reader checks the values it copies (the rest of a patch is
        // zeros or interpolated from them); other sources are scanned here.
        let checked = entry.image_reads_checked();
        if let Some(k) = (!checked).then(|| first_non_finite(img)).flatten() {
            return Err(Error::case(
                case_name(entry),
                format!(
                    "batch {step}, sample {i}: the box at {:?} of size {patch:?} holds a non-finite image value (element {k}): the cache is damaged (prep inspect --verify)",
                    c.start_zyx
                ),
            ));
        }
        let fixed = job.cascade.as_ref().map_or(0, |c| c.channels);
        augment_mirrored(img, lab, patch, &job.augment, &mut rng, &moves, fixed);
        if let Some(c) = &job.cascade {
            let mut crng = Rng::derive(cfg.seed, &[CASCADE_STREAM, step, sample]);
            let from = img.len() - c.channels * n;
            previous_stage(&mut img[from..], patch, c.augment.as_ref(), &mut crng)?;
        }
        let along = Along {
            start_zyx: c.start_zyx,
            patch,
            transform: &transform,
            moves,
        };
        let named = |err: Error, what: &str| {
            Error::case(
                case_name(entry),
                format!("batch {step}, sample {i}: reading {what}: {err}"),
            )
        };
        // nnU-Net's MaskImageTransform, after every other transform of the image.
        let masked = entry.norm_mask_channels();
        if job.mask_norm && !masked.is_empty() {
            let mut mask = vec![0u16; n];
            let src = MaskAsSkeleton(entry.as_ref());
            along
                .read(reader, &src, &[], &mut [], Some(&mut mask))
                .map_err(|e| named(e, "the normalization mask"))?;
            norm_mask::apply(img, n, &masked, &mask);
        }
        // The derived arrays follow the same map and the same mirrorings.
        let cached_skeleton = (job.skeleton || job.centreline) && entry.has_skeleton();
        if !job.distance.is_empty() || cached_skeleton {
            let k = job.distance.len();
            let d = &mut distance[i * k * n..(i + 1) * k * n];
            let sk = cached_skeleton.then(|| &mut centreline[i * n..(i + 1) * n]);
            along
                .read(reader, entry.as_ref(), &job.distance, d, sk)
                .map_err(|e| named(e, "derived arrays"))?;
        }
        let lab = &*lab;
        if (job.skeleton || job.centreline) && !cached_skeleton {
            centreline[i * n..(i + 1) * n].copy_from_slice(&skeleton_of(lab, patch));
        }
        if job.skeleton {
            let tube = tube_around(&centreline[i * n..(i + 1) * n], lab, patch);
            skeleton[i * n..(i + 1) * n].copy_from_slice(&tube);
        }
    }
    if !job.centreline {
        centreline = Vec::new();
    }
    Ok(Batch {
        step,
        batch_size: choices.len(),
        patch_zyx: patch,
        image,
        label,
        skeleton,
        centreline,
        distance,
        spacing: choices
            .iter()
            .map(|c| job.entries[c.case].spacing_zyx())
            .collect(),
        choices,
    })
}

/// Where a patch was read and how it moved: what the arrays read beside its image follow.
struct Along<'a> {
    start_zyx: [i64; 3],
    patch: [usize; 3],
    transform: &'a Transform,
    moves: Moves,
}

impl Along<'_> {
    /// Read `src`'s distance maps of `classes` into `distance` and its skeleton into
    /// `skeleton` through the patch's spatial map, then move them as the image was moved.
    fn read(
        &self,
        reader: &mut TransformedReader,
        src: &dyn PatchSource,
        classes: &[u16],
        distance: &mut [f32],
        mut skeleton: Option<&mut [u16]>,
    ) -> Result<()> {
        let t = self.transform;
        // Maps other than plain crops and deformations take the mirrorings in their matrix,
        // as the image did (the same coordinates bit for bit, and no pass after).
        let in_matrix = !t.is_identity() && t.elastic.is_none();
        let mirrored = in_matrix.then(|| t.mirrored(self.moves.flips));
        reader.read_derived(
            src,
            self.start_zyx,
            self.patch,
            mirrored.as_ref().unwrap_or(t),
            classes,
            distance,
            skeleton.as_deref_mut(),
        )?;
        let after = match in_matrix {
            true => Moves {
                flips: [false; 3],
                ..self.moves
            },
            false => self.moves,
        };
        after.apply(distance, self.patch);
        if let Some(s) = skeleton {
            after.apply(s, self.patch);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_non_finite_value_is_found_in_every_block() {
        let mut v = vec![1.5f32; 3 * 4096 + 77];
        assert_eq!(first_non_finite(&v), None);
        assert_eq!(first_non_finite_body(&v), None);
        for at in [0, 1, 4095, 4096, 8191, 9000, v.len() - 1] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                v[at] = bad;
                // A later bad value too: the first one is named.
                let last = v.len() - 1;
                let keep = v[last];
                v[last] = f32::NAN;
                assert_eq!(first_non_finite(&v), Some(at));
                assert_eq!(first_non_finite_body(&v), Some(at));
                v[last] = keep;
                v[at] = 1.5;
            }
        }
        assert_eq!(first_non_finite(&[]), None);
    }
}
