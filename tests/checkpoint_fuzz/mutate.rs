//! The checkpoint mutator: a small deterministic PRNG and mutations at three levels: the zip
//! file's bytes (flips, interesting bytes, truncation, splices), its entries (a storage cut,
//! grown, dropped or renamed; a second data.pkl; the pickle deflated; another byte order)
//! and the pickle's opcodes (hostile snippets inserted: deep MARKs, memo gets of huge indices,
//! self-appends, huge lengths and ints, foreign globals; ranges deleted, duplicated, spliced
//! from another seed; operands changed). A mutated pickle is zipped again, so its CRC holds
//! and the reader goes past the zip layer.

use super::archive::{archive_entries, entries_of, global, int, tuple};

/// splitmix64: tiny, fast, and the same stream for the same seed on every machine.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In 0..n (0 when n is 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True `percent` times in a hundred.
    pub(crate) fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// Pickle snippets worth inserting.
fn snippets(rng: &mut Rng) -> Vec<u8> {
    let n = 1 + rng.below(3000);
    match rng.below(24) {
        0 => vec![b'('; n],
        1 => [vec![b']'; n], vec![b'a'; n - 1]].concat(),
        2 => vec![b'2', b'a'], // a list appended to itself
        3 => [b'h', rng.below(256) as u8].to_vec(), // memo get
        4 => [vec![b'r'], u32::MAX.to_le_bytes().to_vec()].concat(),
        5 => [vec![b'j'], (rng.next_u64() as u32).to_le_bytes().to_vec()].concat(),
        6 => [b'q', rng.below(256) as u8].to_vec(),
        7 => vec![0x94],
        8 => [vec![b'X'], u32::MAX.to_le_bytes().to_vec()].concat(),
        9 => [vec![0x8d], u64::MAX.to_le_bytes().to_vec()].concat(),
        10 => int(rng.next_u64() as i64),
        11 => int(-(rng.below(1 << 20) as i64)),
        12 => int(1 << 40),
        13 => global("os", "system"),
        14 => global("torch", "FloatStorage"),
        15 => global("torch._utils", "_rebuild_tensor_v2"),
        16 => global("numpy", "dtype"),
        17 => tuple(&vec![int(1024); 4]),
        18 => vec![b'R'],
        19 => vec![b'b'],
        20 => vec![b'Q'],
        21 => vec![b't'],
        22 => vec![
            [
                b'0', b'1', b'.', b'N', b'e', b'u', b's', b'd', b'l', 0x85, 0x86, 0x87,
            ][rng.below(12)],
        ],
        _ => {
            // The memo-doubling ladder.
            let mut v = vec![b']', b'q', 0];
            for _ in 0..rng.below(64) {
                v.extend([b'(', b'h', 0, b'h', 0, b'l', b'q', 0]);
            }
            v
        }
    }
}

/// Byte-level changes to `data` (flips, interesting bytes, deletes, copies, splices).
fn bytes(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let len = data.len().max(1);
    match rng.below(7) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(data.len());
                if let Some(b) = data.get_mut(i) {
                    *b ^= 1 << rng.below(8);
                }
            }
        }
        1 => {
            let i = rng.below(data.len());
            if let Some(b) = data.get_mut(i) {
                *b = [0, 0xff, 0x7f, 0x80, 1, b'(', b'.'][rng.below(7)];
            }
        }
        2 => data.truncate(rng.below(len)),
        3 => {
            let (a, n) = (rng.below(len), rng.below(64));
            let end = (a + n).min(data.len());
            if a < end {
                data.drain(a..end);
            }
        }
        4 => {
            let (a, n) = (rng.below(len), 1 + rng.below(256));
            let chunk: Vec<u8> = data.iter().skip(a).take(n).copied().collect();
            let at = rng.below(data.len() + 1);
            data.splice(at..at, chunk);
        }
        5 => {
            let (a, n) = (rng.below(other.len().max(1)), 1 + rng.below(512));
            let chunk: Vec<u8> = other.iter().skip(a).take(n).copied().collect();
            let at = rng.below(data.len() + 1);
            let end = (at + rng.below(64)).min(data.len());
            data.splice(at..end, chunk);
        }
        _ => {
            // An operand byte after a common opcode.
            let starts: Vec<usize> = (0..data.len().saturating_sub(1))
                .filter(|&i| matches!(data[i], b'K' | b'h' | b'q' | b'M' | b'J'))
                .collect();
            if !starts.is_empty() {
                let i = starts[rng.below(starts.len())] + 1;
                data[i] = [0, 0xff, 0x80, rng.below(256) as u8][rng.below(4)];
            }
        }
    }
}

/// The pickle changed.
fn pickle(rng: &mut Rng, p: &mut Vec<u8>, other: &[u8]) {
    if rng.chance(50) {
        let s = snippets(rng);
        let at = rng.below(p.len() + 1);
        p.splice(at..at, s);
    } else {
        bytes(rng, p, other);
    }
}

/// One mutation of `seed` (with `other` for splices).
pub(crate) fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let (Some(mut es), true) = (entries_of(seed), rng.chance(85)) else {
        let mut d = seed.to_vec();
        for _ in 0..1 + rng.below(3) {
            bytes(rng, &mut d, other);
        }
        return d;
    };
    let other_pickle = entries_of(other)
        .and_then(|o| o.into_iter().find(|(n, _)| n.ends_with("data.pkl")))
        .map(|(_, b)| b)
        .unwrap_or_default();
    let pkl = es.iter().position(|(n, _)| n.ends_with("data.pkl"));
    let mut deflate = false;
    for _ in 0..1 + rng.below(3) {
        match (rng.below(10), pkl) {
            (0..=5, Some(i)) => pickle(rng, &mut es[i].1, &other_pickle),
            (6, _) => {
                // A storage cut, grown or emptied.
                let i = rng.below(es.len());
                let e = &mut es[i].1;
                match rng.below(3) {
                    0 => e.truncate(rng.below(e.len().max(1))),
                    1 => e.extend(vec![0; 1 + rng.below(64)]),
                    _ => e.clear(),
                }
            }
            (7, _) => {
                if es.len() > 1 {
                    es.remove(rng.below(es.len()));
                }
            }
            (8, _) => {
                let i = rng.below(es.len());
                es[i].0 = [
                    "a/data.pkl",
                    "checkpoint_final/data/0",
                    "checkpoint_final/byteorder",
                    "data.pkl",
                    "x/y/data.pkl",
                ][rng.below(5)]
                .into();
                if rng.chance(30) {
                    es[i].1 = b"big".to_vec();
                }
            }
            _ => deflate = true,
        }
    }
    archive_entries(&es, deflate)
}
