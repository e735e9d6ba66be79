//! The low-level pieces of writing an entry's Zarr arrays: codecs, array metadata, padded edge
//! blocks and the short hashes recorded per chunk. What an entry holds is written by
//! [`crate::prep::cache_build`].

use std::path::Path;
use std::sync::Arc;

use zarrs::array::codec::{
    BloscCodec, BloscCompressionLevel, BloscCompressor, BloscShuffleMode, Crc32cCodec,
    ShardingCodecOptions, SubchunkWriteOrder, ZstdCodec,
};
use zarrs::array::{Array, ArrayBuilder, BytesToBytesCodecTraits, CodecSpecificOptions};

use super::store::EntryStore;
use crate::error::{Error, Result};
use crate::format::{ChunkLayout, Compression, Dtype, OutputParams};

/// Turn off zarrs' own version block in metadata so that entries are byte-reproducible.
pub fn configure_zarrs() {
    zarrs::config::global_config_mut().set_include_zarrs_metadata(false);
}

/// The codecs after `bytes`: the compressor, then a CRC-32C of the compressed bytes, so each
/// chunk (each inner chunk of a shard) is checked when read without decoding anything else.
fn compression_codecs(
    c: Compression,
    typesize: usize,
) -> Result<Vec<Arc<dyn BytesToBytesCodecTraits>>> {
    let blosc = |compressor, level: u8| -> Result<Arc<dyn BytesToBytesCodecTraits>> {
        let clevel = BloscCompressionLevel::try_from(level)
            .map_err(|e| Error::Config(format!("blosc level {level}: {e}")))?;
        let codec = BloscCodec::new(
            compressor,
            clevel,
            None,
            BloscShuffleMode::Shuffle,
            Some(typesize),
        )
        .map_err(|e| Error::Config(format!("blosc: {e}")))?;
        Ok(Arc::new(codec))
    };
    let compressor: Arc<dyn BytesToBytesCodecTraits> = match c {
        Compression::None => return Ok(vec![]),
        Compression::Zstd { level } => Arc::new(ZstdCodec::new(level, false)),
        Compression::Blosc { level } => blosc(BloscCompressor::Zstd, level)?,
        Compression::BloscLz4 { level } => blosc(BloscCompressor::LZ4, level)?,
    };
    Ok(vec![compressor, Arc::new(Crc32cCodec::new())])
}

/// One array of an entry: its name, element type (the fill value is zero) and, for the image,
/// its channel count (a leading axis, one channel per chunk).
pub(crate) struct ArraySpec {
    pub(crate) name: &'static str,
    pub(crate) dtype: Dtype,
    pub(crate) channels: Option<usize>,
}

pub(crate) fn build_array(
    store: &Arc<EntryStore>,
    dir: &Path,
    params: &OutputParams,
    layout: &ChunkLayout,
    shape_zyx: [usize; 3],
    spec: ArraySpec,
) -> Result<Array<EntryStore>> {
    // With a channel axis: its length first, and a side of 1 in every chunk and shard.
    let lead = |v: u64| -> Vec<u64> { spec.channels.map(|_| v).into_iter().collect() };
    let with_lead = |first: u64, rest: [usize; 3]| -> Vec<u64> {
        let mut v = lead(first);
        v.extend(rest.iter().map(|&x| x as u64));
        v
    };
    let shape = with_lead(spec.channels.unwrap_or(0) as u64, shape_zyx);
    let write_block = with_lead(1, layout.write_block_zyx());
    let mut b = ArrayBuilder::new(
        shape,
        write_block,
        spec.dtype.zarrs(),
        spec.dtype.zero_fill(),
    );
    match spec.channels {
        Some(_) => b.dimension_names(Some(["c", "z", "y", "x"])),
        None => b.dimension_names(Some(["z", "y", "x"])),
    };
    b.bytes_to_bytes_codecs(compression_codecs(params.compression, spec.dtype.size())?);
    if layout.shard_zyx.is_some() {
        b.subchunk_shape(with_lead(1, layout.chunk_zyx));
        // Inner chunks in C order: the same shard bytes on every run.
        b.codec_specific_options(CodecSpecificOptions::default().with_option(
            ShardingCodecOptions::default().with_subchunk_write_order(SubchunkWriteOrder::C),
        ));
    }
    let path = dir.join(spec.name);
    let array = b
        .build(store.clone(), &format!("/{}", spec.name))
        .map_err(|e| Error::zarr(&path, e))?;
    array.store_metadata().map_err(|e| Error::zarr(&path, e))?;
    Ok(array)
}

/// Copy a block computed at its own size into a full-chunk buffer (edge blocks are padded with
/// the fill value, as Zarr stores them).
pub(crate) fn pad_block<T: Copy>(
    data: Vec<T>,
    size: [usize; 3],
    full: [usize; 3],
    fill: T,
) -> Vec<T> {
    if size == full {
        return data;
    }
    let mut out = vec![fill; full.iter().product()];
    for z in 0..size[0] {
        for y in 0..size[1] {
            let src = &data[(z * size[1] + y) * size[2]..][..size[2]];
            out[(z * full[1] + y) * full[2]..][..size[2]].copy_from_slice(src);
        }
    }
    out
}

/// The bytes of a slice of plain numbers, as Zarr stores them uncompressed (what each block's
/// hash is of).
pub(crate) fn bytes_of<T: bytemuck::Pod>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

pub(crate) fn short_hex(h: &blake3::Hash) -> String {
    h.to_hex()[..32].to_string()
}
