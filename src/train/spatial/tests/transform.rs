//! Drawing maps (nnU-Net's rules and probabilities) and elastic fields; option validation.

use super::*;

#[test]
fn draws_follow_nnunet_rules() {
    let cfg = SpatialConfig::default();
    assert!(cfg.in_plane_for([16, 64, 64]));
    assert!(!cfg.in_plane_for([32, 64, 64]));
    assert_eq!(cfg.degrees_for([16, 64, 64]), [180.0, 0.0, 0.0]);
    assert_eq!(cfg.degrees_for([64, 64, 64]), [30.0; 3]);
    // About 20% rotated, 20% scaled, independently; in-plane patches keep z.
    let mut rotated = 0;
    let mut scaled = 0;
    for seed in 0..2000 {
        let t = cfg.draw([8, 48, 48], &mut Rng::new(seed));
        assert_eq!(t.matrix[0], [1.0, 0.0, 0.0]);
        assert_eq!((t.matrix[1][0], t.matrix[2][0]), (0.0, 0.0));
        scaled += (t.scale != 1.0) as usize;
        let det = t.matrix[1][1] * t.matrix[2][2] - t.matrix[1][2] * t.matrix[2][1];
        assert!((det - t.scale * t.scale).abs() < 1e-9);
        rotated += (t.matrix[1][2].abs() > 1e-12) as usize;
        assert!((0.7..=1.4).contains(&t.scale));
    }
    assert!((330..470).contains(&rotated), "{rotated}");
    assert!((330..470).contains(&scaled), "{scaled}");
    let none = SpatialConfig::none();
    assert!((0..100).all(|s| none.draw([8, 8, 8], &mut Rng::new(s)).is_identity()));
}

#[test]
fn elastic_fields_are_smooth_and_bounded() {
    let cfg = SpatialConfig {
        elastic_prob: 1.0,
        ..SpatialConfig::none()
    };
    let t = cfg.draw([16, 32, 32], &mut Rng::new(5));
    let e = t.elastic.as_ref().expect("a field");
    let max = e
        .disp
        .iter()
        .flat_map(|d| d.iter().map(|v| v.abs()))
        .fold(0.0, f64::max);
    assert!(max > 0.5);
    // Neighbouring voxels move by little more than magnitude / grid each.
    for z in 0..15 {
        let (a, b) = (e.at([z, 7, 9]), e.at([z + 1, 7, 9]));
        let step = (0..3).map(|k| (a[k] - b[k]).abs()).fold(0.0, f64::max);
        assert!(step <= 2.0 * max / 16.0 + 1e-12, "{step}");
    }
    // At a control point the field is that point's displacement.
    assert_eq!(e.at([16, 16, 0]), e.disp[(e.nodes[1] + 1) * e.nodes[2]]);
    let bad = SpatialConfig {
        scale_range: [1.4, 0.7],
        ..SpatialConfig::default()
    };
    assert!(bad.validate().is_err());
    assert!(SpatialConfig::default().validate().is_ok());
}
