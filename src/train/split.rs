//! The train/validation split: a deterministic, seeded partition of a dataset's labelled cases
//! by id that moves at most one existing case when a case is added.

pub use crate::format::run::Split;

/// Deterministic split by case: cases are ordered by a seeded hash of their id (so the order of
/// `ids` does not matter) and the first `n_val` of that order validate, where `n_val` is
/// `round(n * fraction)`, raised to 1 when `fraction > 0` and `n >= 2`, and capped at `n - 1`
/// (one case always trains). Both lists come back sorted by id.
///
/// Adding one case changes `n_val` by 0 or 1 and the side of at most one existing case:
/// - `n_val` unchanged and the new case validates: the last existing validation case (in hash
///   order) moves to training;
/// - `n_val` grown by one and the new case trains: the first existing training case (in hash
///   order) moves to validation;
/// - otherwise no existing case moves.
pub fn split_cases(ids: &[String], fraction: f64, seed: u64) -> Split {
    let mut keyed: Vec<(blake3::Hash, &String)> = ids
        .iter()
        .map(|id| {
            let mut h = blake3::Hasher::new();
            h.update(&seed.to_le_bytes());
            h.update(id.as_bytes());
            (h.finalize(), id)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let n = ids.len();
    let mut n_val = (n as f64 * fraction).round() as usize;
    if fraction > 0.0 && n >= 2 {
        n_val = n_val.max(1);
    }
    n_val = n_val.min(n.saturating_sub(1));
    let mut val: Vec<String> = keyed[..n_val].iter().map(|(_, id)| (*id).clone()).collect();
    let mut train: Vec<String> = keyed[n_val..].iter().map(|(_, id)| (*id).clone()).collect();
    val.sort();
    train.sort();
    Split { train, val }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case_ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("case_{i:03}")).collect()
    }

    /// The documented validation count, written per case rather than as the function does it.
    fn expected_val(n: usize, fraction: f64) -> usize {
        if n < 2 || fraction <= 0.0 {
            0
        } else {
            ((n as f64 * fraction).round() as usize).clamp(1, n - 1)
        }
    }

    /// The hash order of the documentation, to name which case moves.
    fn hash_key(seed: u64, id: &str) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(&seed.to_le_bytes());
        h.update(id.as_bytes());
        *h.finalize().as_bytes()
    }

    #[test]
    fn split_validation_count_is_as_documented() {
        // (n, fraction, validation cases): rounding half away from zero, at least one case
        // validates when any should, at least one trains.
        let table = [
            (0, 0.2, 0),
            (1, 0.2, 0),
            (1, 0.9, 0),
            (2, 0.2, 1),
            (3, 0.2, 1),
            (10, 0.2, 2),
            (11, 0.2, 2),
            (13, 0.2, 3),
            (5, 0.5, 3),
            (20, 0.25, 5),
            (4, 0.9, 3),
            (4, 1.0, 3),
            (10, 0.0, 0),
        ];
        for (n, fraction, want) in table {
            let s = split_cases(&case_ids(n), fraction, 7);
            assert_eq!(s.val.len(), want, "n {n}, fraction {fraction}");
            assert_eq!(s.train.len(), n - want, "n {n}, fraction {fraction}");
            assert_eq!(
                expected_val(n, fraction),
                want,
                "n {n}, fraction {fraction}"
            );
        }
    }

    #[test]
    fn split_is_a_deterministic_partition_whatever_the_input_order() {
        for seed in [0, 7, 12345] {
            for n in 1..40 {
                let ids = case_ids(n);
                let s = split_cases(&ids, 0.2, seed);
                assert_eq!(s, split_cases(&ids, 0.2, seed));
                let mut all: Vec<String> = s.train.iter().chain(&s.val).cloned().collect();
                all.sort();
                assert_eq!(all, ids, "seed {seed}, n {n}: not a partition");
                assert!(s.train.is_sorted() && s.val.is_sorted());
                let mut reversed = ids.clone();
                reversed.reverse();
                assert_eq!(split_cases(&reversed, 0.2, seed), s, "seed {seed}, n {n}");
                let mut rotated = ids.clone();
                rotated.rotate_left((seed as usize + 3) % n);
                assert_eq!(split_cases(&rotated, 0.2, seed), s, "seed {seed}, n {n}");
            }
        }
        // The seed matters: some seed puts other cases in validation.
        let ids = case_ids(20);
        let s0 = split_cases(&ids, 0.2, 0);
        assert!((1..10).any(|seed| split_cases(&ids, 0.2, seed).val != s0.val));
    }

    #[test]
    fn split_moves_at_most_one_existing_case_when_one_is_added() {
        // How often each documented outcome was seen: none moved, last validation case to
        // training, first training case to validation.
        let mut seen = [0usize; 3];
        for seed in [0, 1, 7, 42, 2024] {
            for fraction in [0.0, 0.1, 0.2, 0.25, 1.0 / 3.0, 0.5, 0.9] {
                for n in 1..40 {
                    let old = case_ids(n);
                    let mut new = old.clone();
                    new.push(format!("case_{n:03}"));
                    let added = &new[n];
                    let a = split_cases(&old, fraction, seed);
                    let b = split_cases(&new, fraction, seed);
                    let at = format!("seed {seed}, fraction {fraction}, {n} -> {} cases", n + 1);
                    assert_eq!(a.val.len(), expected_val(n, fraction), "{at}");
                    assert_eq!(b.val.len(), expected_val(n + 1, fraction), "{at}");
                    let mut shuffled = new.clone();
                    shuffled.reverse();
                    shuffled.rotate_left(n / 2);
                    assert_eq!(split_cases(&shuffled, fraction, seed), b, "{at}");

                    let moved: Vec<&String> = old
                        .iter()
                        .filter(|id| a.val.contains(id) != b.val.contains(id))
                        .collect();
                    assert!(moved.len() <= 1, "{at}: {moved:?} changed sides");
                    let key = |id: &&String| hash_key(seed, id);
                    let last_val = a.val.iter().max_by_key(key);
                    let first_train = a.train.iter().min_by_key(key);
                    let grew = b.val.len() as i64 - a.val.len() as i64;
                    match (grew, b.val.contains(added), moved.as_slice()) {
                        // The new case takes the new validation place, or trains while the
                        // count stays: nothing else moves.
                        (0, false, []) | (1, true, []) => seen[0] += 1,
                        (0, true, [m]) => {
                            assert_eq!(Some(*m), last_val, "{at}");
                            assert!(b.train.contains(m), "{at}");
                            seen[1] += 1;
                        }
                        (1, false, [m]) => {
                            assert_eq!(Some(*m), first_train, "{at}");
                            assert!(b.val.contains(m), "{at}");
                            seen[2] += 1;
                        }
                        other => panic!("{at}: undocumented outcome {other:?}"),
                    }
                }
            }
        }
        assert!(seen.iter().all(|&k| k > 0), "outcomes seen: {seen:?}");
    }
}
