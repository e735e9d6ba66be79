//! The one table of element types voxcache stores: their Zarr names, sizes and zarrs types.

use serde::{Deserialize, Serialize};
use zarrs::array::{data_type, DataType, FillValue};

/// Element type of a stored array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE single precision: images.
    Float32,
    /// IEEE half precision: images cached as float16.
    Float16,
    /// Labels whose values are all under 256.
    Uint8,
    /// Labels with a value of 256 or more.
    Uint16,
    /// Only the foreground index (`fg`) uses it.
    Uint32,
}

impl Dtype {
    /// Every type, for lookups by name.
    pub const ALL: [Dtype; 5] = [
        Dtype::Float32,
        Dtype::Float16,
        Dtype::Uint8,
        Dtype::Uint16,
        Dtype::Uint32,
    ];

    /// From a Zarr v3 `data_type` name.
    pub fn from_zarr(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The Zarr v3 `data_type` name.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float32 => "float32",
            Dtype::Float16 => "float16",
            Dtype::Uint8 => "uint8",
            Dtype::Uint16 => "uint16",
            Dtype::Uint32 => "uint32",
        }
    }

    /// A short name for tables: f32, f16, u8, u16, u32.
    pub fn short_name(self) -> &'static str {
        match self {
            Dtype::Float32 => "f32",
            Dtype::Float16 => "f16",
            Dtype::Uint8 => "u8",
            Dtype::Uint16 => "u16",
            Dtype::Uint32 => "u32",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Uint8 => 1,
            Dtype::Float16 | Dtype::Uint16 => 2,
            Dtype::Float32 | Dtype::Uint32 => 4,
        }
    }

    /// zarrs' data type, for building arrays.
    pub fn zarrs(self) -> DataType {
        match self {
            Dtype::Float32 => data_type::float32(),
            Dtype::Float16 => data_type::float16(),
            Dtype::Uint8 => data_type::uint8(),
            Dtype::Uint16 => data_type::uint16(),
            Dtype::Uint32 => data_type::uint32(),
        }
    }

    /// The fill value voxcache uses for every array: zero.
    pub fn zero_fill(self) -> FillValue {
        match self {
            Dtype::Float32 => FillValue::from(0.0f32),
            Dtype::Float16 => FillValue::from(half::f16::ZERO),
            Dtype::Uint8 => FillValue::from(0u8),
            Dtype::Uint16 => FillValue::from(0u16),
            Dtype::Uint32 => FillValue::from(0u32),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_serde() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_zarr(d.name()), Some(d));
            assert_eq!(serde_json::to_value(d).unwrap(), d.name());
            assert_eq!(d.zarrs().fixed_size(), Some(d.size()));
        }
        assert_eq!(Dtype::from_zarr("int8"), None);
    }
}
