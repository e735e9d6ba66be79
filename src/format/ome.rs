//! OME-Zarr (NGFF 0.5) multiscale attributes, so viewers place an entry's image at its
//! physical size. Written beside ours, never read back.

use serde::Serialize;
use serde_json::Value;

#[derive(Serialize)]
struct Axis {
    name: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<&'static str>,
}

#[derive(Serialize)]
struct Scale {
    #[serde(rename = "type")]
    kind: &'static str,
    scale: [f64; 4],
}

#[derive(Serialize)]
struct Dataset {
    path: &'static str,
    #[serde(rename = "coordinateTransformations")]
    transforms: [Scale; 1],
}

#[derive(Serialize)]
struct Multiscale<'a> {
    name: &'a str,
    axes: [Axis; 4],
    datasets: [Dataset; 1],
}

#[derive(Serialize)]
struct Ome<'a> {
    version: &'static str,
    multiscales: [Multiscale<'a>; 1],
}

/// The `ome` attribute of an entry whose image, (c, z, y, x), has `spacing_xyz` in `unit`
/// (NIfTI's name).
pub(super) fn multiscales(name: &str, spacing_xyz: [f64; 3], unit: &str) -> Value {
    let unit = match unit {
        "um" => Some("micrometer"),
        "mm" => Some("millimeter"),
        "m" => Some("meter"),
        _ => None,
    };
    let axis = |name| Axis {
        name,
        kind: "space",
        unit,
    };
    let ome = Ome {
        version: "0.5",
        multiscales: [Multiscale {
            name,
            axes: [
                Axis {
                    name: "c",
                    kind: "channel",
                    unit: None,
                },
                axis("z"),
                axis("y"),
                axis("x"),
            ],
            datasets: [Dataset {
                path: super::entry::IMAGE_ARRAY,
                transforms: [Scale {
                    kind: "scale",
                    scale: [1.0, spacing_xyz[2], spacing_xyz[1], spacing_xyz[0]],
                }],
            }],
        }],
    };
    serde_json::to_value(ome).unwrap_or(Value::Null)
}
