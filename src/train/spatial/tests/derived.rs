//! Distance maps and skeleton through the map: against the reference, and every build and
//! path (the columns included) against the portable loop, bit for bit.

use super::*;

#[test]
fn derived_arrays_follow_the_map_linear_over_the_scale_and_nearest() -> Result<()> {
    // Distance maps: linear at the same coordinates as the image, divided by the scale (the
    // patch shows the source shrunk by it); the skeleton: the nearest voxel's value, never a
    // blend; both 0 more than a voxel outside the volume.
    let v = Volume::new([12, 30, 28]);
    let size = [6, 10, 12];
    let n: usize = size.iter().product();
    let classes = [1u16, 2];
    let fields = classes.map(|c| v.distance(c));
    let skeleton = v.skeleton();
    let mut reader = TransformedReader::default();
    let in_plane = Transform::in_plane(0.9, 1.3);
    for (k, t) in [
        Transform::rotate_scale([0.3, -0.2, 0.5], 1.0),
        Transform::rotate_scale([0.0, 0.0, 1.2], 0.7),
        Transform::rotate_scale([-2.5, 0.4, 0.1], 1.4),
        in_plane,
    ]
    .into_iter()
    .enumerate()
    {
        let scale = t.scale;
        let start = [k as i64 * 3 - 3, 6 + k as i64, 15 - 4 * k as i64];
        let mut d = vec![f32::NAN; 2 * n];
        let mut sk = vec![u16::MAX; n];
        reader.read_derived(&v, start, size, &t, &classes, &mut d, Some(&mut sk))?;
        // Every vector build and the portable loop: the same bits.
        for build in vector_builds().into_iter().chain([Simd::Portable]) {
            let mut other = TransformedReader::with_build(build);
            let (mut d2, mut sk2) = (vec![f32::NAN; 2 * n], vec![u16::MAX; n]);
            other.read_derived(&v, start, size, &t, &classes, &mut d2, Some(&mut sk2))?;
            assert_eq!(
                d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                d2.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{k} {:?}",
                other.build
            );
            assert_eq!(sk, sk2, "{k} {:?}", other.build);
        }
        // The skeleton alone (no distance classes), and the distances alone.
        let mut sk3 = vec![u16::MAX; n];
        reader.read_derived(&v, start, size, &t, &[], &mut [], Some(&mut sk3))?;
        assert_eq!(sk3, sk, "{k}, skeleton alone");
        let mut d3 = vec![f32::NAN; 2 * n];
        reader.read_derived(&v, start, size, &t, &classes, &mut d3, None)?;
        assert_eq!(d3, d, "{k}, distances alone");
        let mut on_skeleton = 0;
        for (i, c) in t.coordinates(start, size).iter().enumerate() {
            for (j, field) in fields.iter().enumerate() {
                let want = reference_linear_in(&v, field, *c) / scale;
                let got = d[j * n + i] as f64;
                assert!(
                    (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                    "{k} {i}: {got} {want}"
                );
            }
            let i0 = c.map(|x| x.floor());
            let near = [0, 1, 2].map(|a| i0[a] as i64 + i64::from(c[a] - i0[a] >= 0.5));
            let far_out = (0..3).any(|a| c[a] < -1.0 || c[a] >= v.shape[a] as f64);
            let want = if far_out { 0 } else { v.get(&skeleton, near) };
            assert_eq!(sk[i], want, "{k} {i} at {c:?}");
            on_skeleton += usize::from(want != 0);
        }
        assert!(on_skeleton > 0, "{k}: the patch meets the skeleton");
    }
    Ok(())
}

#[test]
fn in_plane_derived_arrays_through_the_columns_give_the_portable_bits() -> Result<()> {
    // Distance maps and skeleton of patches of many planes through the box's columns:
    // rotated and scaled, scaled alone, mirrored (z too), reaching outside the volume
    // above, below and beside; rows of 21 and 37 (short last rows of 8). Bit for bit the
    // portable loop's.
    let v = Volume::new([30, 30, 28]);
    let classes = [1u16, 2];
    let in_plane = Transform::in_plane;
    let maps = [
        in_plane(0.9, 1.3),
        in_plane(-2.4, 0.75),
        in_plane(0.0, 1.2),
        in_plane(0.5, 1.0).mirrored([true, false, true]),
        in_plane(0.0, 0.8).mirrored([true, true, false]),
    ];
    let mut portable = TransformedReader::with_build(Simd::Portable);
    for (build, size) in vector_builds()
        .into_iter()
        .flat_map(|b| [(b, [16, 10, 21]), (b, [19, 12, 37])])
    {
        let n: usize = size.iter().product();
        let mut fast = TransformedReader::with_build(build);
        for (k, t) in maps.iter().enumerate() {
            for start in [[5, 8, -4], [-12, 3, 2], [20, 10, -20], [27, 20, 5]] {
                let (mut d, mut sk) = (vec![f32::NAN; 2 * n], vec![u16::MAX; n]);
                let (mut d2, mut sk2) = (vec![1.5f32; 2 * n], vec![7u16; n]);
                fast.read_derived(&v, start, size, t, &classes, &mut d, Some(&mut sk))?;
                portable.read_derived(&v, start, size, t, &classes, &mut d2, Some(&mut sk2))?;
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&d), bits(&d2), "{build:?} map {k} at {start:?}");
                assert_eq!(sk, sk2, "{build:?} map {k} at {start:?}");
                let mut sk3 = vec![u16::MAX; n];
                fast.read_derived(&v, start, size, t, &[], &mut [], Some(&mut sk3))?;
                assert_eq!(sk3, sk, "{build:?} map {k}, skeleton alone");
                // Mirrored in the matrix (as the loader reads them): what mirroring after
                // gives, bit for bit.
                for f in 1..8u8 {
                    let flips = [f & 4 != 0, f & 2 != 0, f & 1 != 0];
                    let (mut dm, mut skm) = (vec![f32::NAN; 2 * n], vec![u16::MAX; n]);
                    let tm = t.mirrored(flips);
                    fast.read_derived(&v, start, size, &tm, &classes, &mut dm, Some(&mut skm))?;
                    let mut want = d.clone();
                    want.chunks_exact_mut(n)
                        .for_each(|p| mirror(p, size, flips));
                    let mut want_sk = sk.clone();
                    mirror(&mut want_sk, size, flips);
                    assert_eq!(bits(&dm), bits(&want), "{build:?} map {k} {flips:?}");
                    assert_eq!(skm, want_sk, "{build:?} map {k} {flips:?}");
                }
            }
        }
    }
    Ok(())
}
