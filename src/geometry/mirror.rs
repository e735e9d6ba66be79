//! Mirroring a patch along its axes (test-time mirroring, augmentation).

/// Mirror a patch along each axis of `flips` in one pass (one pass per axis moved the patch up
/// to three times): row `(z, y)` and its mirror row swap places, each reversed when x flips.
pub fn mirror<T>(data: &mut [T], size_zyx: [usize; 3], flips: [bool; 3]) {
    let [nz, ny, nx] = size_zyx;
    if data.is_empty() || flips == [false; 3] {
        return;
    }
    let rows = nz * ny;
    // The mirror of a row is an involution on rows: each pair is swapped once, from its
    // lower member; rows that are their own mirror are only reversed.
    let mirror_row = |r: usize| {
        let (z, y) = (r / ny, r % ny);
        let z = if flips[0] { nz - 1 - z } else { z };
        let y = if flips[1] { ny - 1 - y } else { y };
        z * ny + y
    };
    for r in 0..rows {
        let m = mirror_row(r);
        if m < r {
            continue;
        }
        if m == r {
            if flips[2] {
                data[r * nx..(r + 1) * nx].reverse();
            }
            continue;
        }
        let (a, b) = data.split_at_mut(m * nx);
        let (a, b) = (&mut a[r * nx..(r + 1) * nx], &mut b[..nx]);
        a.swap_with_slice(b);
        if flips[2] {
            a.reverse();
            b.reverse();
        }
    }
}
