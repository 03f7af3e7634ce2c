//! `ptload inspect` of a safetensors file (found by its content, as
//! `diff` finds it): its header's tensors (name, dtype, shape, size) and
//! its `__metadata__`. Only the header is read, with the library's own
//! checks; `--hash` reads each tensor's bytes through a small buffer.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use ptload_reader::checkpoint::Scalar;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::args::CliResult;
use crate::inspect::{self, human_size};

/// The largest header the safetensors library reads (its `MAX_HEADER_SIZE`).
const MAX_HEADER: u64 = 100_000_000;

/// One tensor of the header.
struct Tensor {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    /// Byte range in the data section (after the header).
    start: u64,
    end: u64,
}

/// A safetensors file's header, checked as the safetensors library checks
/// it: tensors in order of their data, each the size its dtype and shape
/// make, the last ending where the file does.
struct Header {
    /// Bytes of the JSON header.
    size: u64,
    tensors: Vec<Tensor>,
    metadata: Vec<(String, String)>,
}

fn read_header(path: &Path, file: &mut std::fs::File) -> CliResult<Header> {
    let fail = |e: String| format!("{}: safetensors: {e}", path.display());
    let len = file.metadata().map_err(|e| fail(format!("io: {e}")))?.len();
    let mut n = [0u8; 8];
    file.read_exact(&mut n)
        .map_err(|e| fail(format!("io: {e}")))?;
    let size = u64::from_le_bytes(n);
    if size > MAX_HEADER || size > len.saturating_sub(8) {
        return Err(fail(format!("a header of {size} bytes in a file of {len} bytes")).into());
    }
    let mut text = vec![0u8; usize::try_from(size).map_err(|_| fail("header too large".into()))?];
    file.read_exact(&mut text)
        .map_err(|e| fail(format!("io: {e}")))?;
    let meta: safetensors::tensor::Metadata =
        serde_json::from_slice(&text).map_err(|e| fail(format!("header: {e}")))?;
    let data = len - 8 - size;
    if meta.data_len() as u64 != data {
        return Err(fail(format!(
            "the header's tensors take {} bytes, the file holds {data} after the header",
            meta.data_len()
        ))
        .into());
    }
    let infos = meta.tensors();
    let mut tensors: Vec<Tensor> = meta
        .offset_keys()
        .into_iter()
        .filter_map(|name| {
            let info = infos.get(&name)?;
            Some(Tensor {
                dtype: format!("{:?}", info.dtype),
                shape: info.shape.iter().map(|&d| d as u64).collect(),
                start: info.data_offsets.0 as u64,
                end: info.data_offsets.1 as u64,
                name,
            })
        })
        .collect();
    tensors.sort_by_key(|t| t.start);
    let mut metadata: Vec<(String, String)> = meta
        .metadata()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.sort();
    Ok(Header {
        size,
        tensors,
        metadata,
    })
}

/// The sha256 of bytes `start..end` of the data section, read through a
/// buffer of at most 1 MiB.
fn sha256(file: &mut std::fs::File, data_at: u64, start: u64, end: u64) -> std::io::Result<String> {
    let mut h = Sha256::new();
    file.seek(SeekFrom::Start(data_at + start))?;
    let mut left = end - start;
    let mut buf = vec![0u8; left.min(1 << 20) as usize];
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        let chunk = buf.get_mut(..n).unwrap_or_default();
        file.read_exact(chunk)?;
        h.update(&*chunk);
        left -= n as u64;
    }
    Ok(hex::encode(h.finalize()))
}

/// Row-major strides of `shape`, in elements.
fn strides(shape: &[u64]) -> Vec<u64> {
    let mut out = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        let next = out.get(i + 1).copied().unwrap_or(1);
        let dim = shape.get(i + 1).copied().unwrap_or(1);
        if let Some(s) = out.get_mut(i) {
            *s = next.saturating_mul(dim);
        }
    }
    out
}

#[derive(Serialize)]
struct TensorJson<'a> {
    name: &'a str,
    dtype: &'a str,
    shape: &'a [u64],
    stride: Vec<u64>,
    storage_offset: u64,
    /// Each tensor is its own byte range: no storage key.
    storage: Option<&'a str>,
    location: &'static str,
    target: &'static str,
    nbytes: u64,
    /// `[start, end)` in the data section, as the header gives it.
    data_offsets: [u64; 2],
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
}

#[derive(Serialize)]
struct ValueJson<'a> {
    name: String,
    value: &'a str,
    text: String,
}

#[derive(Serialize)]
struct Totals {
    tensors: usize,
    storages: usize,
    bytes: u64,
    stored_bytes: u64,
}

/// The document `inspect --json` prints for a safetensors file: the same
/// keys as for a torch checkpoint, `metadata` added.
#[derive(Serialize)]
struct DocJson<'a> {
    file: &'a str,
    format: &'static str,
    byteorder: &'static str,
    pickle_protocol: Option<u8>,
    tensors: Vec<TensorJson<'a>>,
    totals: Totals,
    values: Vec<ValueJson<'a>>,
    globals: [&'static str; 0],
    outside_allowlist: [&'static str; 0],
    suspicious: [&'static str; 0],
    dangerous: [&'static str; 0],
    bytes_read: u64,
    /// The header's `__metadata__`.
    metadata: serde_json::Map<String, serde_json::Value>,
}

/// Show the safetensors file at `path`: its tensors and metadata, as a
/// table or a JSON document.
pub(crate) fn inspect(
    out: &mut impl Write,
    path: &Path,
    label: &str,
    json: bool,
    hash: bool,
    columns: Option<usize>,
) -> CliResult<()> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| format!("io: cannot open {}: {e}", path.display()))?;
    let header = read_header(path, &mut file)?;
    let data_at = 8 + header.size;
    let mut digests = Vec::with_capacity(header.tensors.len());
    let mut read = 0;
    for t in header.tensors.iter().filter(|_| hash) {
        digests.push(
            sha256(&mut file, data_at, t.start, t.end)
                .map_err(|e| format!("{}: io: {e}", path.display()))?,
        );
        read += t.end - t.start;
    }
    let bytes: u64 = header.tensors.iter().map(|t| t.end - t.start).sum();
    let values: Vec<(String, Scalar)> = header
        .metadata
        .iter()
        .map(|(k, v)| (format!("__metadata__.{k}"), Scalar::Str(v.clone())))
        .collect();
    if json {
        let doc = DocJson {
            file: label,
            format: "safetensors",
            byteorder: "little",
            pickle_protocol: None,
            tensors: header
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| TensorJson {
                    name: &t.name,
                    dtype: &t.dtype,
                    shape: &t.shape,
                    stride: strides(&t.shape),
                    storage_offset: 0,
                    storage: None,
                    location: "cpu",
                    target: "cpu",
                    nbytes: t.end - t.start,
                    data_offsets: [t.start, t.end],
                    sha256: digests.get(i).cloned(),
                })
                .collect(),
            totals: Totals {
                tensors: header.tensors.len(),
                storages: header.tensors.len(),
                bytes,
                stored_bytes: bytes,
            },
            values: header
                .metadata
                .iter()
                .map(|(k, v)| ValueJson {
                    name: format!("__metadata__.{k}"),
                    value: v,
                    text: format!("{v:?}"),
                })
                .collect(),
            globals: [],
            outside_allowlist: [],
            suspicious: [],
            dangerous: [],
            bytes_read: read,
            metadata: header
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        };
        serde_json::to_writer(&mut *out, &doc)?;
        writeln!(out)?;
        return Ok(());
    }
    let header_row = ["NAME", "DTYPE", "SHAPE", "SIZE"];
    let cells: Vec<Vec<String>> = header
        .tensors
        .iter()
        .map(|t| {
            let dims: Vec<String> = t.shape.iter().map(u64::to_string).collect();
            vec![
                t.name.clone(),
                t.dtype.clone(),
                format!("[{}]", dims.join(", ")),
                human_size(t.end - t.start),
            ]
        })
        .collect();
    inspect::prose_line(
        out,
        &format!(
            "{label}: safetensors file, little-endian, header of {} bytes",
            header.size
        ),
        columns,
    )?;
    inspect::simple_table(out, &header_row, cells, columns, |i| {
        digests.get(i).map(|d| format!("    sha256 {d}"))
    })?;
    inspect::prose_line(
        out,
        &format!(
            "{} tensors, {} of tensor data",
            header.tensors.len(),
            human_size(bytes)
        ),
        columns,
    )?;
    let refs: Vec<(&str, &Scalar)> = values.iter().map(|(n, v)| (n.as_str(), v)).collect();
    inspect::values_table(out, &refs, columns)?;
    Ok(())
}
