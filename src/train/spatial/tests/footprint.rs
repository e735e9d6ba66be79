//! The source box and the footprint spans: they cover every voxel a cell reads, and reads
//! through them (the rest of the box poisoned) equal reads of whole boxes.

use super::*;

#[test]
fn the_source_box_covers_every_coordinate_and_little_more() {
    let size = [8, 16, 16];
    let t = Transform::rotate_scale([0.5, 0.3, 0.2], 1.3);
    let (s, b) = t.source_box([10, 20, 30], size);
    for c in t.coordinates([10, 20, 30], size) {
        for a in 0..3 {
            assert!(c[a].floor() as i64 >= s[a]);
            assert!((c[a].floor() as i64 + 1) < s[a] + b[a] as i64);
        }
    }
    let plain = Transform::identity().source_box([10, 20, 30], size);
    assert_eq!(plain, ([9, 19, 29], [11, 19, 19]));
}

#[test]
fn rotations_read_only_their_footprint_in_every_build() -> Result<()> {
    // Read through spans whose outside is poisoned, rotated patches equal those read from
    // whole boxes, in every build, for each way of storing the case, across its edges.
    let mut rng = Rng::new(8);
    let size = [6, 12, 14];
    let n: usize = size.iter().product();
    for build in [Simd::Portable].into_iter().chain(vector_builds()) {
        for stored in stored_three_ways() {
            let poisoned = Poisoned(Stored {
                v: Volume::new(stored.v.shape),
                ..stored
            });
            let plain = &poisoned.0;
            let c = plain.channels();
            let (mut spans, mut whole) = (
                TransformedReader::with_build(build),
                TransformedReader::with_build(build),
            );
            for k in 0..8 {
                let angles = [0, 1, 2].map(|_| rng.range(-0.6, 0.6));
                let mut t = Transform::rotate_scale(angles, rng.range(0.7, 1.4));
                if k % 3 == 1 {
                    t = t.mirrored([false, true, true]);
                }
                let start = [0, 1, 2].map(|a| rng.range(-6.0, 20.0) as i64 - (a == 0) as i64 * 8);
                let (mut a, mut b) = (vec![0.0; c * n], vec![0.0; c * n]);
                let (mut la, mut lb) = (vec![0u16; n], vec![0u16; n]);
                spans.read(&poisoned, start, size, &t, &mut a, Some(&mut la))?;
                whole.read(plain, start, size, &t, &mut b, Some(&mut lb))?;
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{build:?}, map {k} at {start:?}");
                assert_eq!(la, lb, "{build:?}, map {k} at {start:?}");
            }
        }
    }
    Ok(())
}

#[test]
fn derived_arrays_read_only_their_footprint_in_every_build() -> Result<()> {
    // Distance maps and skeleton through spans whose outside is poisoned (NaN, 200) equal
    // those read from whole boxes: 3D rotations, in-plane rotations of many planes (the
    // columns) and of few, across the volume's edges, in every build.
    let mut rng = Rng::new(9);
    let classes = [1u16, 2];
    let in_plane = Transform::in_plane;
    for build in [Simd::Portable].into_iter().chain(vector_builds()) {
        let poisoned = Poisoned(Stored {
            v: Volume::new([30, 30, 28]),
            two_channels: false,
            byte_labels: false,
        });
        let plain = &poisoned.0;
        let (mut spans, mut whole) = (
            TransformedReader::with_build(build),
            TransformedReader::with_build(build),
        );
        for k in 0..12 {
            let (t, size) = match k % 3 {
                0 => {
                    let angles = [0, 1, 2].map(|_| rng.range(-0.6, 0.6));
                    (
                        Transform::rotate_scale(angles, rng.range(0.7, 1.4)),
                        [6, 12, 14],
                    )
                }
                1 => (
                    in_plane(rng.range(-3.0, 3.0), rng.range(0.7, 1.4)),
                    [16, 10, 21],
                ),
                _ => (in_plane(rng.range(-3.0, 3.0), 1.0), [3, 12, 19]),
            };
            let t = if k % 4 == 3 {
                t.mirrored([true, false, true])
            } else {
                t
            };
            let n: usize = size.iter().product();
            let start = [0, 1, 2].map(|a| rng.range(-6.0, 20.0) as i64 - (a == 0) as i64 * 4);
            let (mut a, mut b) = (vec![0.0; 2 * n], vec![0.0; 2 * n]);
            let (mut sa, mut sb) = (vec![0u16; n], vec![0u16; n]);
            spans.read_derived(&poisoned, start, size, &t, &classes, &mut a, Some(&mut sa))?;
            whole.read_derived(plain, start, size, &t, &classes, &mut b, Some(&mut sb))?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{build:?}, map {k} at {start:?}");
            assert_eq!(sa, sb, "{build:?}, map {k} at {start:?}");
            assert!(sa.iter().all(|&v| v < 200), "{build:?}, map {k}");
        }
    }
    Ok(())
}

#[test]
fn footprint_spans_cover_every_cell_read_and_little_more() {
    // Every voxel a cell reads (its 8 corners, for each patch coordinate inside the box,
    // lanes past the patch's last row of 8 too) lies in its row's span; the spans hold
    // well under the box and not much over the voxels read.
    let mut rng = Rng::new(21);
    let (mut read_total, mut span_total, mut box_total) = (0usize, 0usize, 0usize);
    for k in 0..60 {
        let size = [[6, 12, 14], [9, 21, 30], [4, 16, 16]][k % 3];
        let angles = [0, 1, 2].map(|_| rng.range(-0.6, 0.6));
        let mut t = Transform::rotate_scale(angles, rng.range(0.7, 1.4));
        if k % 4 == 1 {
            t = t.mirrored([true, false, true]);
        }
        if k % 5 == 2 {
            t.matrix[0] = [1.0, 0.0, 0.0];
            t.matrix[1][0] = 0.0;
            t.matrix[2][0] = 0.0;
        }
        let start = [-3, 5, -2];
        let (box_start, bs) = t.source_box(start, size);
        let centre = centre_of(start, size);
        let local = [0, 1, 2].map(|a| centre[a] - box_start[a] as f64);
        let mut spans = Vec::new();
        assert!(footprint_spans_3d(&t, local, size, bs, &mut spans));
        assert_eq!(spans.len(), bs[0] * bs[1]);
        let mut read = vec![false; bs.iter().product()];
        let mut row = vec![[0.0; 3]; size[2].div_ceil(8) * 8];
        let coords = (0..size[0] * size[1]).flat_map(|r| {
            t.row(
                local,
                size,
                (r / size[1], r % size[1]),
                0,
                &mut row,
                &mut Vec::new(),
            );
            row.clone()
        });
        for c in coords {
            let Some((base, _)) = cell(&c, bs) else {
                continue;
            };
            for corner in 0..8 {
                let at = base
                    + (corner >> 2) * bs[1] * bs[2]
                    + ((corner >> 1) & 1) * bs[2]
                    + (corner & 1);
                read[at] = true;
            }
        }
        for (i, _) in read.iter().enumerate().filter(|(_, &r)| r) {
            let (row, x) = (i / bs[2], (i % bs[2]) as u32);
            let (a, b) = spans[row];
            assert!(
                a <= x && x < b,
                "map {k}: voxel {i} (row {row}, x {x}) outside {a}..{b}"
            );
        }
        read_total += read.iter().filter(|&&r| r).count();
        span_total += spans.iter().map(|s| (s.1 - s.0) as usize).sum::<usize>();
        box_total += read.len();
    }
    let (over, of_box) = (
        span_total as f64 / read_total as f64,
        span_total as f64 / box_total as f64,
    );
    // (Measured: 1.11 and 0.32.)
    assert!(
        over < 1.3 && of_box < 0.5,
        "spans {over} x the voxels read, {of_box} of the boxes"
    );
}
