//! Patches read through maps: against the whole-volume reference, across the volume's edges,
//! and every path and vector build against the portable general loop, bit for bit.

use super::*;

#[test]
fn identity_reads_the_plain_box() -> Result<()> {
    let v = Volume::new([9, 20, 22]);
    let size = [4, 8, 10];
    let mut a = vec![0.0; 320];
    let mut la = vec![0u16; 320];
    let mut b = a.clone();
    let mut lb = la.clone();
    let start = [-1, 3, 15];
    v.read_patch(start, size, &mut a, Some(&mut la))?;
    // A transform that is the identity but goes through interpolation.
    let t = Transform {
        matrix: IDENTITY,
        scale: 1.0,
        elastic: Some(ElasticField {
            nodes: [2, 2, 2],
            grid: 16.0,
            disp: vec![[0.0; 3]; 8],
        }),
    };
    TransformedReader::default().read(&v, start, size, &t, &mut b, Some(&mut lb))?;
    assert_eq!(a, b);
    assert_eq!(la, lb);
    Ok(())
}

#[test]
fn rotated_scaled_patches_equal_a_whole_volume_reference() -> Result<()> {
    let v = Volume::new([12, 30, 28]);
    let size = [6, 10, 12];
    let n: usize = size.iter().product();
    let mut reader = TransformedReader::default();
    for (k, (angles, scale)) in [
        ([0.3, -0.2, 0.5], 1.0),
        ([0.0, 0.0, 1.2], 0.7),
        ([-2.5, 0.4, 0.1], 1.4),
        ([0.0, 0.0, 0.0], 1.25),
    ]
    .into_iter()
    .enumerate()
    {
        let t = Transform::rotate_scale(angles, scale);
        let start = [k as i64 * 2 - 2, 5 + k as i64, 14 - 3 * k as i64];
        let mut img = vec![0.0; n];
        let mut lab = vec![0u16; n];
        reader.read(&v, start, size, &t, &mut img, Some(&mut lab))?;
        for (i, c) in t.coordinates(start, size).iter().enumerate() {
            let want = reference_linear(&v, *c);
            assert!(
                (img[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                "{k} {i}: {} vs {want}",
                img[i]
            );
            // The label is one of the 8 neighbours' values, and the nearest one's when the
            // coordinate lies on a voxel.
            let near = c.map(|x| x.round() as i64);
            if c.iter().all(|x| (x - x.round()).abs() < 1e-9) {
                assert_eq!(lab[i], v.get(&v.label, near));
            }
            let i0 = c.map(|x| x.floor() as i64);
            let neighbours: Vec<u16> = (0..8)
                .map(|q| {
                    let up = [(q >> 2) & 1, (q >> 1) & 1, q & 1];
                    v.get(&v.label, [0, 1, 2].map(|a| i0[a] + up[a] as i64))
                })
                .collect();
            assert!(neighbours.contains(&lab[i]), "{k} {i}");
        }
    }
    Ok(())
}

#[test]
fn patches_reaching_far_outside_read_zeros_there_and_the_volume_elsewhere() -> Result<()> {
    // The box is cut one voxel beyond the volume; coordinates past the cut read 0 and
    // background without a box, the rest as before.
    let v = Volume::new([12, 30, 28]);
    let size = [6, 10, 12];
    let n: usize = size.iter().product();
    let mut reader = TransformedReader::default();
    for (angles, scale, start) in [
        ([0.3, -0.4, 0.6], 1.4, [-7, -9, 20]),
        ([1.1, 0.2, -0.3], 1.3, [9, 24, -10]),
        ([0.0, 0.0, 0.5], 1.0, [-30, 5, 5]),
        ([0.2, 0.1, 0.0], 0.8, [3, 40, 3]),
    ] {
        let t = Transform::rotate_scale(angles, scale);
        let (mut img, mut lab) = (vec![1.0; n], vec![7u16; n]);
        reader.read(&v, start, size, &t, &mut img, Some(&mut lab))?;
        for (i, c) in t.coordinates(start, size).iter().enumerate() {
            let want = reference_linear(&v, *c);
            assert!((img[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()));
            let outside = (0..3).any(|a| c[a] < -1.0 || c[a] >= v.shape[a] as f64);
            if outside {
                assert_eq!((img[i], lab[i]), (0.0, 0), "{start:?} {i}");
            }
            assert_ne!(lab[i], 7);
        }
    }
    Ok(())
}

/// Box buffers are kept between reads and only grow: a reader that served boxes larger
/// and smaller before gives each patch what a fresh reader gives (in-plane maps through
/// the columns, 3D rotations through the spans, scalings through the separable passes).
#[test]
fn a_reused_reader_gives_what_a_fresh_one_gives() -> Result<()> {
    let v = Volume::new([20, 40, 36]);
    let size = [8, 12, 14];
    let n: usize = size.iter().product();
    for build in vector_builds().into_iter().chain([Simd::Portable]) {
        let mut reused = TransformedReader::with_build(build);
        for (k, scale) in [1.4, 0.7, 1.3, 0.8, 1.0, 1.4].into_iter().enumerate() {
            let in_plane = Transform::in_plane(0.4 * k as f64, scale);
            let turned = Transform::rotate_scale([0.3, -0.2 * k as f64, 0.5], scale);
            let scaled = Transform::rotate_scale([0.0; 3], scale);
            for t in [in_plane, turned, scaled] {
                let start = [k as i64 - 2, 3 * k as i64, 20 - 3 * k as i64];
                let (mut a, mut b) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
                reused.read(&v, start, size, &t, &mut a, Some(&mut la))?;
                TransformedReader::with_build(build).read(
                    &v,
                    start,
                    size,
                    &t,
                    &mut b,
                    Some(&mut lb),
                )?;
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{build:?} {k}");
                assert_eq!(la, lb, "{build:?} {k}");
            }
        }
    }
    Ok(())
}

#[test]
fn the_vector_builds_give_the_same_bits() -> Result<()> {
    for build in vector_builds() {
        the_build_gives_the_portable_bits(build)?;
    }
    Ok(())
}

fn the_build_gives_the_portable_bits(build: Simd) -> Result<()> {
    let v = Volume::new([14, 30, 28]);
    let size = [6, 12, 14];
    let n: usize = size.iter().product();
    let mut fast = TransformedReader::with_build(build);
    let mut portable = TransformedReader::with_build(Simd::Portable);
    let in_plane = Transform::in_plane(0.9, 1.3);
    assert!(in_plane.keeps_z_planes());
    // In-plane maps share one plane's cells across planes: planes outside the volume
    // (above, below) and rows reaching outside in y and x too.
    for start in [[-4, 7, 6], [11, -9, 20], [-1, 20, -10]] {
        let (mut a, mut b) = (vec![f32::NAN; n], vec![f32::NAN; n]);
        let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
        fast.read(&v, start, size, &in_plane, &mut a, Some(&mut la))?;
        portable.read(&v, start, size, &in_plane, &mut b, Some(&mut lb))?;
        assert_eq!(a, b, "in-plane at {start:?}");
        assert_eq!(la, lb, "in-plane at {start:?}");
    }
    // A deformed map: its coordinates come per voxel, not from the affine lanes.
    let mut elastic = Transform::rotate_scale([0.3, 0.2, -0.4], 1.1);
    elastic.elastic = Some(ElasticField::random(size, 4, 1.5, false, &mut Rng::new(3)));
    for (k, t) in [
        Transform::rotate_scale([0.4, -0.3, 0.2], 1.2),
        Transform::rotate_scale([1.1, 0.0, 0.0], 0.8),
        in_plane,
        Transform::rotate_scale([-0.5, 0.6, 0.1], 1.4),
        elastic,
    ]
    .iter()
    .enumerate()
    {
        let start = [k as i64 * 4 - 2, 7, 6 + 5 * k as i64];
        let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
        let (mut la, mut lb) = (vec![0u16; n], vec![0u16; n]);
        fast.read(&v, start, size, t, &mut a, Some(&mut la))?;
        portable.read(&v, start, size, t, &mut b, Some(&mut lb))?;
        assert_eq!(a, b, "{k}");
        assert_eq!(la, lb, "{k}");
        // Two channels: each the same through both builds, the first the one above.
        let two = Stored {
            v: Volume::new([14, 30, 28]),
            two_channels: true,
            byte_labels: false,
        };
        let (mut a2, mut b2) = (vec![0.0; 2 * n], vec![0.0; 2 * n]);
        fast.read(&two, start, size, t, &mut a2, None)?;
        portable.read(&two, start, size, t, &mut b2, None)?;
        assert_eq!(a2, b2, "{k}, two channels");
        assert_eq!(a2[..n], a[..], "{k}, first channel");
        assert!(a2[n..].iter().zip(&a).any(|(x, y)| x != y));
        // Labels read as bytes: the same values through both builds.
        let bytes = Stored {
            v: Volume::new([14, 30, 28]),
            two_channels: false,
            byte_labels: true,
        };
        let (mut a8, mut b8) = (vec![0.0; n], vec![0.0; n]);
        let (mut la8, mut lb8) = (vec![0u16; n], vec![0u16; n]);
        fast.read(&bytes, start, size, t, &mut a8, Some(&mut la8))?;
        portable.read(&bytes, start, size, t, &mut b8, Some(&mut lb8))?;
        assert_eq!((&a8, &la8), (&a, &la), "{k}, byte labels");
        assert_eq!((&b8, &lb8), (&a, &la), "{k}, byte labels, portable");
    }
    Ok(())
}

#[test]
fn in_plane_columns_give_the_portable_bits() -> Result<()> {
    // Patches of many planes through the box's columns: 19 planes (two blocks of 8 and a
    // part) and 16, rows of 37 (a short last row of 8), rotated and scaled, mirrored (z too:
    // the planes run backwards), reaching outside the volume above and below (fewer
    // planes inside, some patches with fewer than the columns' minimum) and beside; one
    // and two channels, byte and wide labels of three classes (cells of three values).
    // Bit for bit the portable loop's.
    let in_plane = Transform::in_plane;
    let maps = [
        in_plane(0.9, 1.3),
        in_plane(-2.4, 0.75),
        in_plane(0.5, 1.0).mirrored([true, false, true]),
        in_plane(0.0, 1.2),
        in_plane(0.0, 0.8).mirrored([true, true, false]),
    ];
    let sources = [(false, false), (true, false), (false, true)].map(|(two, bytes)| Stored {
        v: Volume::new([30, 30, 28]),
        two_channels: two,
        byte_labels: bytes,
    });
    let mut portable = TransformedReader::with_build(Simd::Portable);
    // (16 planes: two whole blocks of 8.)
    for (build, size) in vector_builds()
        .into_iter()
        .flat_map(|b| [(b, [19, 12, 37]), (b, [16, 10, 21])])
    {
        let n: usize = size.iter().product();
        let mut fast = TransformedReader::with_build(build);
        for (k, t) in maps.iter().enumerate() {
            assert!(t.keeps_z_planes());
            for start in [
                [5, 8, -4],
                [-12, 3, 2],
                [20, 10, -20],
                [-17, -8, 10],
                [27, 20, 5],
            ] {
                for src in &sources {
                    let c = src.channels();
                    let (mut a, mut b) = (vec![f32::NAN; c * n], vec![1.5; c * n]);
                    let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
                    fast.read(src, start, size, t, &mut a, Some(&mut la))?;
                    portable.read(src, start, size, t, &mut b, Some(&mut lb))?;
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{build:?} map {k} at {start:?}");
                    assert_eq!(la, lb, "{build:?} map {k} at {start:?}");
                    let mut a2 = vec![f32::NAN; c * n];
                    fast.read(src, start, size, t, &mut a2, None)?;
                    assert_eq!(bits(&a2), bits(&a), "{build:?} map {k}, no label");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn labels_at_the_types_extremes_agree_across_builds() -> Result<()> {
    // The vector builds look the uniform table up 4 bytes a lane and keep the entry's
    // own bytes: labels equal to the table's mixed mark (255, 65535) and above a byte
    // (300) must come out as the portable path gives them, through the general, in-plane
    // and separable loops.
    let in_plane = Transform::in_plane(0.7, 1.2);
    let maps = [
        Transform::rotate_scale([0.4, -0.3, 0.2], 1.2),
        in_plane,
        Transform::rotate_scale([0.0; 3], 1.3),
        Transform::rotate_scale([0.0; 3], 0.7),
    ];
    let size = [6, 12, 21];
    let n: usize = size.iter().product();
    let source = |values: [u16; 3], bytes: bool| {
        let mut v = Volume::new([14, 30, 28]);
        v.label.iter_mut().for_each(|l| *l = values[*l as usize]);
        Stored {
            v,
            two_channels: false,
            byte_labels: bytes,
        }
    };
    let sources = [
        (source([0, 65535, 300], false), [65535, 300]),
        (source([0, 255, 7], true), [255, 7]),
        (source([0, 255, 7], false), [255, 7]),
    ];
    let mut portable = TransformedReader::with_build(Simd::Portable);
    for build in vector_builds() {
        let mut fast = TransformedReader::with_build(build);
        for (k, t) in maps.iter().enumerate() {
            for (src, values) in &sources {
                let start = [2, 5, 3];
                let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
                let (mut la, mut lb) = (vec![1u16; n], vec![2u16; n]);
                fast.read(src, start, size, t, &mut a, Some(&mut la))?;
                portable.read(src, start, size, t, &mut b, Some(&mut lb))?;
                assert_eq!(la, lb, "{build:?} map {k}, values {values:?}");
                for v in values {
                    assert!(la.contains(v), "{build:?} map {k}: no {v}");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn mirrored_reads_equal_reads_mirrored_after() -> Result<()> {
    // Mirroring folded into the map (rotations 3D and in-plane, scalings through the
    // separable passes) or done by the source (plain crops) or after (elastic fields):
    // bit for bit what mirroring the read patch gives, in every build, for every set of
    // axes, one and two channels, byte labels.
    let in_plane = Transform::in_plane(0.9, 1.3);
    let in_plane_scale = Transform::in_plane(0.0, 0.8);
    let mut elastic = Transform::rotate_scale([0.3, 0.2, -0.4], 1.1);
    let size = [6, 12, 14];
    elastic.elastic = Some(ElasticField::random(size, 4, 1.5, false, &mut Rng::new(3)));
    let maps = [
        Transform::identity(),
        Transform::rotate_scale([0.4, -0.3, 0.2], 1.2),
        in_plane,
        Transform::rotate_scale([0.0; 3], 1.3),
        in_plane_scale,
        elastic,
    ];
    let n: usize = size.iter().product();
    let sources = stored_three_ways();
    for build in vector_builds().into_iter().chain([Simd::Portable]) {
        let mut reader = TransformedReader::with_build(build);
        for (k, t) in maps.iter().enumerate() {
            for f in 1..8u8 {
                let flips = [f & 4 != 0, f & 2 != 0, f & 1 != 0];
                for src in &sources {
                    if k == 0 && src.byte_labels {
                        // (This test source reads bytes only through the transform.)
                        continue;
                    }
                    let c = src.channels();
                    let start = [k as i64 - 3, 7, 4];
                    let (mut a, mut la) = (vec![0.0; c * n], vec![0u16; n]);
                    reader.read(src, start, size, t, &mut a, Some(&mut la))?;
                    a.chunks_exact_mut(n).for_each(|p| mirror(p, size, flips));
                    mirror(&mut la, size, flips);
                    let (mut b, mut lb) = (vec![f32::NAN; c * n], vec![7u16; n]);
                    reader.read_mirrored(src, start, size, t, flips, &mut b, Some(&mut lb))?;
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{build:?} map {k} {flips:?}");
                    assert_eq!(la, lb, "{build:?} map {k} {flips:?}");
                }
            }
        }
    }
    // The in-plane map mirrored in z is still in-plane (its 4-neighbour path).
    assert!(maps[2].mirrored([true, false, true]).keeps_z_planes());
    Ok(())
}

#[test]
fn maps_without_rotation_separate_into_the_same_bits() -> Result<()> {
    // Scalings (3D and in-plane, shrinking and growing, patches reaching outside the
    // volume on every side) through the separable passes and through the general loop,
    // in every build: the same image and label bits, for one and two channels and for
    // byte labels.
    let in_plane = Transform::in_plane(0.0, 1.3);
    let maps = [
        Transform::rotate_scale([0.0; 3], 1.4),
        Transform::rotate_scale([0.0; 3], 0.7),
        Transform::rotate_scale([0.0; 3], 1.0 + 1e-9),
        in_plane.clone(),
        // Mirrored (decreasing coordinates).
        Transform::rotate_scale([0.0; 3], 1.2).mirrored([true, false, true]),
        in_plane.mirrored([false, true, true]),
    ];
    for t in &maps {
        assert!(t.axis_aligned() && !t.is_identity());
    }
    assert!(!Transform::rotate_scale([0.1, 0.0, 0.0], 1.2).axis_aligned());
    // Rows of 37: blocks of 8 and a short tail.
    let size = [6, 12, 37];
    let n: usize = size.iter().product();
    let sources = stored_three_ways();
    for build in vector_builds().into_iter().chain([Simd::Portable]) {
        let mut fast = TransformedReader::with_build(build);
        let mut general = TransformedReader {
            general_only: true,
            ..TransformedReader::with_build(build)
        };
        for (k, t) in maps.iter().enumerate() {
            for start in [
                [-4, -6, -9],
                [k as i64 * 2, 7, 6],
                [10, 24, 20],
                [13, -20, 40],
            ] {
                for src in &sources {
                    let c = src.channels();
                    let (mut a, mut b) = (vec![f32::NAN; c * n], vec![f32::NAN; c * n]);
                    let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
                    fast.read(src, start, size, t, &mut a, Some(&mut la))?;
                    general.read(src, start, size, t, &mut b, Some(&mut lb))?;
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{build:?} map {k} at {start:?}");
                    assert_eq!(la, lb, "{build:?} map {k} at {start:?}");
                    // Without a label too.
                    let mut a2 = vec![f32::NAN; c * n];
                    fast.read(src, start, size, t, &mut a2, None)?;
                    assert_eq!(bits(&a2), bits(&a));
                }
            }
        }
    }
    Ok(())
}

#[test]
fn the_in_plane_path_equals_the_general_one() -> Result<()> {
    // An in-plane rotation and scale takes the 4-neighbour path; the same map with a
    // z coefficient too small to move any coordinate takes the 8-neighbour one. Both must
    // give the same bits (the upper plane's weight is exactly 0).
    let v = Volume::new([12, 30, 28]);
    let size = [5, 12, 14];
    let n: usize = size.iter().product();
    let mut reader = TransformedReader::default();
    for (k, (angle, scale)) in [(0.7, 1.0), (-2.1, 1.3), (0.2, 0.8)]
        .into_iter()
        .enumerate()
    {
        let flat = Transform::in_plane(angle, scale);
        let mut general = flat.clone();
        general.matrix[0][1] = 1e-300;
        assert!(flat.keeps_z_planes() && !general.keeps_z_planes());
        assert_eq!(
            flat.coordinates([2, 4, 3], size),
            general.coordinates([2, 4, 3], size)
        );
        let start = [k as i64 * 3 - 1, 6, 5 - k as i64];
        let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
        let (mut la, mut lb) = (vec![0u16; n], vec![0u16; n]);
        reader.read(&v, start, size, &flat, &mut a, Some(&mut la))?;
        reader.read(&v, start, size, &general, &mut b, Some(&mut lb))?;
        assert_eq!(a, b, "{k}");
        assert_eq!(la, lb, "{k}");
        assert!(
            la.iter().any(|&l| l != la[0]),
            "{k}: the patch crosses labels"
        );
    }
    Ok(())
}

#[test]
fn labels_keep_thin_structures_and_never_mix_values() -> Result<()> {
    // A one-voxel line of value 2 through a background of 0, shifted by half a voxel: per-
    // class weights never produce 1 (the mean of 0 and 2).
    let shape = [5, 16, 16];
    let mut v = Volume::new(shape);
    v.label.iter_mut().for_each(|l| *l = 0);
    for x in 0..16 {
        v.label[(2 * 16 + 8) * 16 + x] = 2;
    }
    let t = Transform::rotate_scale([0.2, 0.0, 0.0], 1.0);
    let size = [5, 16, 16];
    let mut img = vec![0.0; 5 * 256];
    let mut lab = vec![0u16; 5 * 256];
    TransformedReader::default().read(&v, [0, 0, 0], size, &t, &mut img, Some(&mut lab))?;
    assert!(lab.iter().all(|&l| l == 0 || l == 2));
    assert!(lab.iter().filter(|&&l| l == 2).count() >= 10);
    Ok(())
}
