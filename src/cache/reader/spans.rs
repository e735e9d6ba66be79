//! Which part of each box row a read copies: the whole row ([`Whole`]), or one span of it per
//! row ([`RowSpans`]), for transformed patches whose footprint is only part of the box they
//! need. A type each, so that whole-row reads compile to what they were before spans existed.

/// The part of each box row a read copies.
pub(super) trait Spans: Copy {
    /// The number of spans (`None`: every row is whole).
    fn rows(self) -> Option<usize>;
    /// Whether the spans differ from plane to plane.
    fn per_plane(self) -> bool;
    /// The part of volume row `(z, y)`'s piece `x0..x1` to read, for a box from `start`.
    fn piece(self, start: [i64; 3], z: usize, y: usize, x0: usize, x1: usize) -> (usize, usize);
    /// Box row `(z, y)`'s span in box coordinates, cut to the row's `width`.
    fn in_box(self, z: usize, y: usize, width: usize) -> (usize, usize);
}

/// Every row whole.
#[derive(Clone, Copy)]
pub(super) struct Whole;

impl Spans for Whole {
    #[inline(always)]
    fn rows(self) -> Option<usize> {
        None
    }
    #[inline(always)]
    fn per_plane(self) -> bool {
        false
    }
    #[inline(always)]
    fn piece(self, _: [i64; 3], _: usize, _: usize, x0: usize, x1: usize) -> (usize, usize) {
        (x0, x1)
    }
    #[inline(always)]
    fn in_box(self, _: usize, _: usize, width: usize) -> (usize, usize) {
        (0, width)
    }
}

/// Each box row's x range (box coordinates, start and end): one per row y, the same in every
/// plane, or one per row (z, y) of the box (`planes`, `ny` rows a plane).
#[derive(Clone, Copy)]
pub(super) struct RowSpans<'a> {
    spans: &'a [(u32, u32)],
    ny: usize,
    planes: bool,
}

impl<'a> RowSpans<'a> {
    /// The spans of a box of `size`: per plane when there is one for each of its rows.
    pub(super) fn new(spans: &'a [(u32, u32)], size: [usize; 3]) -> Self {
        RowSpans {
            spans,
            ny: size[1],
            planes: spans.len() != size[1],
        }
    }

    #[inline(always)]
    fn at(self, bz: usize, by: usize) -> (u32, u32) {
        self.spans[if self.planes { bz * self.ny + by } else { by }]
    }
}

impl Spans for RowSpans<'_> {
    #[inline(always)]
    fn rows(self) -> Option<usize> {
        Some(self.spans.len())
    }
    #[inline(always)]
    fn per_plane(self) -> bool {
        self.planes
    }
    #[inline(always)]
    fn piece(self, start: [i64; 3], z: usize, y: usize, x0: usize, x1: usize) -> (usize, usize) {
        let (s0, s1) = self.at(
            (z as i64 - start[0]) as usize,
            (y as i64 - start[1]) as usize,
        );
        let a = (start[2] + i64::from(s0)).clamp(x0 as i64, x1 as i64);
        let b = (start[2] + i64::from(s1)).clamp(a, x1 as i64);
        (a as usize, b as usize)
    }
    #[inline(always)]
    fn in_box(self, z: usize, y: usize, width: usize) -> (usize, usize) {
        let (s0, s1) = self.at(z, y);
        let b = (s1 as usize).min(width);
        ((s0 as usize).min(b), b)
    }
}
