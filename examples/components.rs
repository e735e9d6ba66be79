//! Connected components of a mask, slice by slice (geometry::components), for the cross-check
//! against scipy.ndimage.label (scripts/components_check.py):
//!
//!   cargo run --example components -- MASK.u8 D,H,W faces|full LABELS.u32
//!
//! MASK.u8: D*H*W bytes (z slowest, nonzero = foreground), read one slice at a time; writes the
//! labels as little-endian u32, numbered as scipy numbers them, and prints the component count
//! and the largest component's label.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};

use anyhow::Context;
use voxcache::geometry::components::{Components, Connectivity};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        args.len() == 4,
        "usage: components MASK.u8 D,H,W faces|full LABELS.u32"
    );
    let dims: Vec<usize> = args[1]
        .split(',')
        .map(|v| v.parse())
        .collect::<Result<_, _>>()
        .context("D,H,W")?;
    anyhow::ensure!(dims.len() == 3, "D,H,W: three numbers");
    let shape = [dims[0], dims[1], dims[2]];
    let connectivity = match args[2].as_str() {
        "faces" => Connectivity::Faces,
        "full" => Connectivity::Full,
        c => anyhow::bail!("connectivity {c}: faces or full"),
    };
    let plane = shape[1] * shape[2];
    let path = std::path::PathBuf::from(&args[0]);
    let mut file = File::open(&path).with_context(|| args[0].clone())?;
    let mut slice = |z: usize| -> voxcache::Result<Vec<bool>> {
        let mut buf = vec![0u8; plane];
        file.seek(SeekFrom::Start((z * plane) as u64))
            .and_then(|_| file.read_exact(&mut buf))
            .map_err(|e| voxcache::Error::io(&path, e))?;
        Ok(buf.into_iter().map(|b| b != 0).collect())
    };
    let out_path = std::path::PathBuf::from(&args[3]);
    let mut comps = Components::find(shape, connectivity, &mut slice)?;
    let mut out = std::io::BufWriter::new(File::create(&args[3])?);
    comps.relabel(&mut slice, |_, labels| {
        let bytes: Vec<u8> = labels.iter().flat_map(|l| l.to_le_bytes()).collect();
        out.write_all(&bytes)
            .map_err(|e| voxcache::Error::io(&out_path, e))
    })?;
    out.flush()?;
    println!(
        "{} components, largest {:?}",
        comps.sizes().len(),
        comps.largest()
    );
    Ok(())
}
