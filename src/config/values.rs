//! Parsers for option values written as text. The command line and the pipeline files share
//! them, so an option is spelled the same way wherever it is written.

use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};

/// Three comma-separated numbers (`a,b,c`, spaces allowed around each); with `one_means_all`,
/// a single number stands for all three. `None` when the text is anything else.
pub fn parse_three<T: std::str::FromStr + Copy>(s: &str, one_means_all: bool) -> Option<[T; 3]> {
    let parts: Vec<T> = s
        .split(',')
        .map(|p| p.trim().parse::<T>())
        .collect::<Result<_, _>>()
        .ok()?;
    match parts.as_slice() {
        [a] if one_means_all => Some([*a; 3]),
        [a, b, c] => Some([*a, *b, *c]),
        _ => None,
    }
}

/// A shape `z,y,x` in voxels (`--chunk`, `--shard`, `--patch`). Zeros and sizes are checked by
/// the validation of the settings they go into, which knows the limits.
pub fn parse_zyx(s: &str) -> Result<[usize; 3]> {
    parse_three(s, false).ok_or_else(|| {
        Error::Config(format!(
            "{s:?}: give three numbers z,y,x (whole numbers of voxels)"
        ))
    })
}

/// `--shard`: a shard shape, or no sharding (written `none`). A type of its own because it
/// overrides a setting that is itself optional.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard(pub Option<[usize; 3]>);

impl std::str::FromStr for Shard {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.trim() == "none" {
            return Ok(Shard(None));
        }
        parse_zyx(s).map(|v| Shard(Some(v)))
    }
}

/// `--part I/N`: build only part I of N (0-based).
pub fn parse_part(s: &str) -> Result<(usize, usize)> {
    let bad = || Error::Config(format!("part {s:?}: give I/N with 0 <= I < N, e.g. 0/8"));
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (
        i.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// Serde adapter: read a string through the type's `FromStr`, so a pipeline file accepts exactly
/// what the command line accepts, with the same error message.
pub(crate) fn from_str<'de, D, T>(d: D) -> std::result::Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    Option::<String>::deserialize(d)?
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_numbers() {
        assert_eq!(parse_zyx("32, 128,128").unwrap(), [32, 128, 128]);
        for bad in ["8,32", "8,32,32,1", "8,x,32", "", "-1,2,3", "1.5,2,3"] {
            let e = parse_zyx(bad).unwrap_err().to_string();
            assert!(e.contains("three numbers"), "{bad}: {e}");
        }
        assert_eq!(parse_three::<f64>("0.5", true), Some([0.5; 3]));
        assert_eq!(parse_three::<usize>("5", false), None);
        assert_eq!("none".parse::<Shard>().unwrap(), Shard(None));
        assert_eq!(
            "8,16,16".parse::<Shard>().unwrap(),
            Shard(Some([8, 16, 16]))
        );
    }

    #[test]
    fn parts() {
        assert_eq!(parse_part("1/8").unwrap(), (1, 8));
        for bad in ["8/8", "0/0", "1", "a/2", "-1/2"] {
            assert!(parse_part(bad).is_err(), "{bad}");
        }
    }
}
