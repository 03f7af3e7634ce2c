//! Writing a state dict as a safetensors file, streamed from the memory
//! map: memory use does not grow with the file.

use std::io::Write;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::statedict::Selected;
use crate::torch::dtype::DType;
use crate::torch::names::Scalar;

/// Told how many bytes each step of long work wrote or placed (for
/// progress bars).
pub type Progress = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// Options for [`write_safetensors`].
#[derive(Clone, Default)]
pub struct SafetensorsOptions {
    /// Convert floating tensors to this dtype.
    pub dtype: Option<DType>,
    /// Skip tensors safetensors cannot hold (complex32/128, packed float4,
    /// meta tensors) instead of failing; each is reported.
    pub skip_unsupported: bool,
    /// Told the bytes of each tensor written (for progress bars).
    pub progress: Option<Progress>,
}

impl std::fmt::Debug for SafetensorsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsOptions")
            .field("dtype", &self.dtype)
            .field("skip_unsupported", &self.skip_unsupported)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// What [`write_safetensors`] wrote.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: u64,
    /// Plain values written to `__metadata__`.
    pub metadata: usize,
    /// One line per skipped tensor: name and reason.
    pub skipped: Vec<String>,
}

/// Whether safetensors has a dtype for `d` (0.8 names match ptload's).
pub fn safetensors_dtype(d: DType) -> Option<&'static str> {
    match d {
        DType::C32 | DType::C128 | DType::F4E2M1X2 => None,
        other => Some(other.name()),
    }
}

fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A plain value as JSON text, or `None` for values that are not plain.
fn plain_json(v: &Scalar) -> Option<String> {
    Some(match v {
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) if f.is_finite() => format!("{f:?}"),
        Scalar::Str(s) => {
            let mut t = String::new();
            json_string(s, &mut t);
            t
        }
        _ => return None,
    })
}

const PAGE: u64 = 4096;

struct Planned {
    index: usize,
    name: String,
    dtype: DType,
    convert: bool,
    nbytes: u64,
}

/// The header and the tensors to write, checked before anything is written.
fn plan(
    ckpt: &Checkpoint,
    selection: &[Selected],
    opts: &SafetensorsOptions,
) -> Result<(String, Vec<Planned>, Written)> {
    let mut written = Written::default();
    let mut planned = Vec::with_capacity(selection.len());
    let mut refused = Vec::new();
    for s in selection {
        let Some(view) = ckpt.tensor_at(s.index) else {
            continue;
        };
        let info = view.info();
        let convert = opts.dtype.filter(|&to| {
            info.dtype.is_float() && info.dtype != to && crate::can_convert(info.dtype, to)
        });
        let dtype = convert.unwrap_or(info.dtype);
        let reason = if info.storage.is_none() {
            Some("a meta tensor has no data".to_owned())
        } else if safetensors_dtype(dtype).is_none() {
            Some(format!("safetensors has no {dtype} dtype"))
        } else {
            None
        };
        if let Some(reason) = reason {
            if opts.skip_unsupported {
                written.skipped.push(format!("{}: {reason}", s.name));
            } else {
                refused.push(format!("{} ({reason})", s.name));
            }
            continue;
        }
        let nbytes = info
            .numel
            .checked_mul(dtype.size() as u64)
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "size overflows"))?;
        planned.push(Planned {
            index: s.index,
            name: s.name.clone(),
            dtype,
            convert: convert.is_some(),
            nbytes,
        });
    }
    if !refused.is_empty() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "cannot write to safetensors: {} (use --skip-unsupported to leave them out)",
                refused.join(", ")
            ),
        ));
    }
    let mut header = String::from("{");
    let metadata: Vec<(String, String)> = ckpt
        .values()
        .iter()
        .filter_map(|(name, v)| plain_json(v).map(|j| (name.clone(), j)))
        .collect();
    if !metadata.is_empty() {
        header.push_str("\"__metadata__\":{");
        for (i, (name, json)) in metadata.iter().enumerate() {
            if i > 0 {
                header.push(',');
            }
            json_string(name, &mut header);
            header.push(':');
            json_string(json, &mut header);
        }
        header.push('}');
    }
    let mut offset = 0u64;
    for (i, p) in planned.iter().enumerate() {
        if i > 0 || !metadata.is_empty() {
            header.push(',');
        }
        let view = ckpt
            .tensor_at(p.index)
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index"))?;
        json_string(&p.name, &mut header);
        let shape: Vec<String> = view.shape().iter().map(u64::to_string).collect();
        header.push_str(&format!(
            ":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            p.dtype.name(),
            shape.join(","),
            offset,
            offset + p.nbytes
        ));
        offset += p.nbytes;
    }
    header.push('}');
    // The data starts 8-byte aligned.
    while (header.len() + 8) % 8 != 0 {
        header.push(' ');
    }
    written.metadata = metadata.len();
    Ok((header, planned, written))
}

/// Write the `selection` of `ckpt` to `out` in the safetensors format:
/// contiguous, little-endian, one entry per tensor (a storage shared by
/// several tensors is written once per tensor), plain values in
/// `__metadata__` as JSON text under their flattened names.
pub fn write_safetensors(
    ckpt: &Checkpoint,
    selection: &[Selected],
    opts: &SafetensorsOptions,
    out: &mut impl Write,
) -> Result<Written> {
    let (header, planned, mut written) = plan(ckpt, selection, opts)?;
    let io = |e: std::io::Error| Error::io("cannot write the safetensors file", e);
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)?;
    for p in &planned {
        let view = ckpt
            .tensor_at(p.index)
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index"))?;
        write_tensor_bytes(&view, p, out)?;
        written.tensors += 1;
        written.bytes += p.nbytes;
        if let Some(progress) = &opts.progress {
            progress(p.nbytes);
        }
    }
    Ok(written)
}

/// Write a safetensors file at `path`. Tensors that lie unchanged in a
/// mapped source file are copied by the kernel where the OS can
/// (`copy_file_range` on Linux, through `std::io::copy`), with a handle of
/// this call's own; the others are gathered from the map. Same format as
/// [`write_safetensors`].
pub fn write_safetensors_file(
    ckpt: &Checkpoint,
    selection: &[Selected],
    opts: &SafetensorsOptions,
    path: &std::path::Path,
) -> Result<Written> {
    use std::io::{Read, Seek, SeekFrom};
    let (header, planned, mut written) = plan(ckpt, selection, opts)?;
    let io = |e: std::io::Error| Error::io(format!("cannot write {}", path.display()), e);
    let out = std::fs::File::create(path).map_err(io)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)?;
    // A handle of our own: its file position is ours to move.
    let mut source = match ckpt.source_path() {
        Some(p) => Some(std::fs::File::open(p).map_err(io)?),
        None => None,
    };
    let mut position = 8 + header.len() as u64;
    for p in &planned {
        let view = ckpt
            .tensor_at(p.index)
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index"))?;
        let range = view.file_range().filter(|_| !p.convert);
        match (source.as_mut(), range) {
            (Some(src), Some((offset, len))) => {
                // The kernel copies fastest into whole pages of the output,
                // so the head up to the next page boundary comes from the map.
                let head = ((PAGE - position % PAGE) % PAGE).min(len);
                let data = view.data()?;
                out.write_all(data.get(..head as usize).unwrap_or_default())
                    .map_err(io)?;
                src.seek(SeekFrom::Start(offset + head)).map_err(io)?;
                let copied = std::io::copy(&mut src.take(len - head), &mut out).map_err(io)?;
                if copied != len - head {
                    return Err(Error::new(
                        ErrorKind::Tensor,
                        format!("file ended {} bytes early", len - head - copied),
                    )
                    .for_tensor(view.name()));
                }
            }
            _ => write_tensor_bytes(&view, p, &mut out)?,
        }
        position += p.nbytes;
        written.tensors += 1;
        written.bytes += p.nbytes;
        if let Some(progress) = &opts.progress {
            progress(p.nbytes);
        }
    }
    out.flush().map_err(io)?;
    Ok(written)
}

/// Stream one tensor's output bytes (converted if planned so) to `out`.
fn write_tensor_bytes(
    view: &crate::TensorView<'_>,
    p: &Planned,
    out: &mut impl Write,
) -> Result<()> {
    let io = |e: std::io::Error| Error::io("cannot write the safetensors file", e);
    if p.convert {
        let data = view.data()?;
        let bytes = crate::convert(&data, view.dtype(), p.dtype)?;
        return out.write_all(&bytes).map_err(io);
    }
    let mut failure = None;
    view.visit_bytes(|chunk| {
        if failure.is_none() {
            if let Err(e) = out.write_all(chunk) {
                failure = Some(e);
            }
        }
    })?;
    failure.map_or(Ok(()), |e| Err(io(e)))
}
