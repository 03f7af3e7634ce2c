//! Writing a state dict as a safetensors file, streamed from the memory
//! map: memory use does not grow with the file.

use std::io::Write;

use crate::advice::Hint;
use crate::dcp::Dcp;
use crate::error::{Error, ErrorKind, Result};
use crate::state_dict::{Selected, StateDict};
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
    /// [`write_safetensors_file`] replaces an existing regular file only
    /// when this is set (never the checkpoint being read).
    pub overwrite: bool,
    /// Set from another thread (a Ctrl-C handler) to stop the write: it
    /// ends with [`ErrorKind::Cancelled`] and leaves no partial file.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// What goes to `__metadata__` besides `{"format": "pt"}` (which
    /// loaders such as Hugging Face's look for) and each quantized tensor's
    /// parameters (which its integers need).
    pub metadata: Metadata,
}

/// The plain values (epoch, args, config, ...) written to `__metadata__`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Metadata {
    /// None: only the format marker and quantization parameters.
    None,
    /// Those of the selected sub-tree: the values under `key` (named
    /// without it; [`StateDict::key`](crate::state_dict::StateDict::key)),
    /// or every value when `key` is `None` (the whole file was selected).
    Selected {
        /// The selection's key.
        key: Option<String>,
    },
    /// Every plain value in the file, under its full name.
    #[default]
    All,
}

impl SafetensorsOptions {
    fn check_cancel(&self) -> Result<()> {
        match &self.cancel {
            Some(flag) if flag.load(std::sync::atomic::Ordering::Relaxed) => {
                Err(Error::new(ErrorKind::Cancelled, "the write was cancelled"))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for SafetensorsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsOptions")
            .field("dtype", &self.dtype)
            .field("skip_unsupported", &self.skip_unsupported)
            .field("progress", &self.progress.is_some())
            .field("overwrite", &self.overwrite)
            .field("cancel", &self.cancel)
            .field("metadata", &self.metadata)
            .finish()
    }
}

/// What [`write_safetensors`] wrote.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Written {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: u64,
    /// Plain values written to `__metadata__`.
    pub metadata: usize,
    /// One line per skipped tensor: name and reason.
    pub skipped: Vec<String>,
    /// Values left out of `__metadata__` because they are arguments of a
    /// call the file asks for (`os.system("...")`), not plain data: each
    /// `(name, callable)` ([`Checkpoint::value_call`](crate::Checkpoint::value_call)).
    pub metadata_left_out: Vec<(String, String)>,
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
    /// Position in the state dict's entries.
    position: usize,
    name: String,
    dtype: DType,
    convert: bool,
    nbytes: u64,
}

/// The header and the tensors to write, checked before anything is written.
/// With `elsewhere`, tensors without storage are written from elsewhere (a
/// distributed checkpoint's chunks) rather than refused as meta tensors.
fn plan(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    elsewhere: bool,
) -> Result<(String, Vec<Planned>, Written)> {
    let mut written = Written::default();
    let mut planned = Vec::with_capacity(sd.len());
    let mut refused = Vec::new();
    for (position, s) in sd.iter().enumerate() {
        let Some(view) = sd.view(s) else {
            continue;
        };
        let info = view.info();
        let convert = crate::convert::target(info.dtype, opts.dtype);
        let dtype = convert.unwrap_or(info.dtype);
        let reason = if info.storage.is_none() && !elsewhere {
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
            position,
            name: s.name.clone(),
            dtype,
            convert: convert.is_some(),
            nbytes,
        });
    }
    if !refused.is_empty() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("cannot write to safetensors: {}", refused.join(", ")),
        )
        .with_hint(Hint::SkipUnsupported));
    }
    let mut header = String::from("{");
    let mut metadata: Vec<(String, String)> = vec![("format".to_owned(), "pt".to_owned())];
    // The selected values under the names they are written with, each
    // with the call it is an argument of, if any.
    let selected = sd.checkpoints().iter().flat_map(|c| {
        c.values()
            .iter()
            .enumerate()
            .map(move |(i, (name, v))| (name.as_str(), v, c.value_call(i)))
    });
    let selected: Vec<_> = match &opts.metadata {
        Metadata::None => Vec::new(),
        Metadata::All | Metadata::Selected { key: None } => selected.collect(),
        Metadata::Selected { key: Some(key) } => {
            let key = key.trim_end_matches('.');
            selected
                .filter_map(|(n, v, call)| {
                    let rest = n.strip_prefix(key)?.strip_prefix('.')?;
                    Some((rest, v, call))
                })
                .collect()
        }
    };
    for (name, value, call) in selected {
        let Some(json) = plain_json(value) else {
            continue;
        };
        match call.filter(|c| !plain_call(c)) {
            // What the file would hand to a call that may act (a command
            // line, a file to open) is not a setting of the model: never
            // copied silently.
            Some(callable) => written
                .metadata_left_out
                .push((name.to_owned(), callable.to_owned())),
            None => metadata.push((name.to_owned(), json)),
        }
    }
    // A quantized tensor's integers mean nothing without their scale and
    // zero point: they go to the metadata as `<name>.quantization`.
    for p in &planned {
        let quantization = entry(sd, p)
            .ok()
            .and_then(|v| v.info().quantization.clone());
        if let Some(q) = quantization {
            let record = serde_json::to_string(&q.record(&p.name))
                .map_err(|e| Error::new(ErrorKind::Tensor, e.to_string()).for_tensor(&p.name))?;
            metadata.push((format!("{}.quantization", p.name), record));
        }
    }
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
        let view = entry(sd, p)?;
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
    // The format marker is not a value of the file.
    written.metadata = metadata.len() - 1;
    Ok((header, planned, written))
}

/// Whether calling `callable` (`module.name`) only makes plain data or
/// tensor machinery (a path, a date, a numpy scalar, torch's rebuild
/// functions): the scanner's classes, so the two never disagree.
fn plain_call(callable: &str) -> bool {
    let Some((module, name)) = callable.rsplit_once('.') else {
        return false;
    };
    matches!(
        crate::scan::classify(module, name),
        crate::scan::GlobalClass::Data | crate::scan::GlobalClass::Tensor
    )
}

/// The view a planned tensor writes.
fn entry<'s>(sd: &'s StateDict, p: &Planned) -> Result<crate::view::TensorView<'s>> {
    <[Selected]>::get(sd, p.position)
        .and_then(|s| sd.view(s))
        .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index").for_tensor(&p.name))
}

/// Write the state dict `sd` (every file of a set; each rank's part of
/// sliced tensors) to `out` in the safetensors format:
/// contiguous, little-endian, one entry per tensor (a storage shared by
/// several tensors is written once per tensor), plain values in
/// `__metadata__` as JSON text under their flattened names.
pub fn write_safetensors(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    out: &mut impl Write,
) -> Result<Written> {
    let io = |e: std::io::Error| Error::io("cannot write the safetensors file", e);
    write_with(sd, opts, out, &mut Vec::new(), &io)
}

/// Write a safetensors file at `path`, safely:
///
/// - a symbolic link at `path` is followed, and its target is written;
/// - the checkpoint's own file is never written, by any path or link;
/// - anything but a regular file (a directory, a device, a pipe) is
///   refused: stream to it with [`write_safetensors`] instead;
/// - an existing file is replaced only with
///   [`SafetensorsOptions::overwrite`];
/// - the data goes to a new hidden file beside the target, which is renamed
///   into place when complete and removed on any error or cancellation, so
///   the target is never seen half-written.
///
/// Tensors that lie unchanged in a mapped file are copied by the kernel
/// (`copy_file_range` on Linux, through `std::io::copy`) from the file the
/// checkpoint holds open, never from whatever its path names now; the
/// others stream from the map. Same format as [`write_safetensors`].
pub fn write_safetensors_file(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    path: &std::path::Path,
) -> Result<Written> {
    let target = output::target(path)?;
    for source in sd.checkpoints().iter().flat_map(|c| c.inputs()) {
        output::check(&target, source.identity(), opts.overwrite)?;
    }
    let (tmp, file) = output::create_beside(&target)?;
    let written = write_to_file(sd, opts, file, &target);
    let done = written.and_then(|w| output::finish(&tmp, &target, opts.overwrite).map(|()| w));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// What [`write_safetensors_set`] wrote: each file with what it holds.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WrittenSet {
    /// The shard files, in order, each with what it holds.
    pub files: Vec<(std::path::PathBuf, Written)>,
    /// The index (`model.safetensors.index.json`), when there is more
    /// than one shard.
    pub index: Option<std::path::PathBuf>,
    /// One line per skipped tensor: name and reason.
    pub skipped: Vec<String>,
}

/// Write `sd` as a sharded safetensors set in the directory `dir`, the way
/// Hugging Face's `save_pretrained` shards one: tensors in order, a new
/// shard when the next tensor would take the current one past
/// `max_shard_bytes` (a larger tensor gets a shard of its own), files
/// `model-00001-of-0000N.safetensors` and `model.safetensors.index.json`
/// (`{"metadata": {"total_size"}, "weight_map"}`); one shard is
/// `model.safetensors` alone. The plain values go to the first shard's
/// `__metadata__`. Every file is written beside its target first and put
/// in place only when all are complete: an error or a cancellation
/// leaves none of them, and existing files are replaced only with
/// [`SafetensorsOptions::overwrite`].
pub fn write_safetensors_set(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    dir: &std::path::Path,
    max_shard_bytes: u64,
) -> Result<WrittenSet> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    // Shards by output bytes, as planned (dtype conversion included).
    let (_, planned, first) = plan(sd, opts, false)?;
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut size = 0u64;
    for p in &planned {
        match shards.last_mut() {
            Some(last) if !last.is_empty() && size.saturating_add(p.nbytes) <= max_shard_bytes => {
                last.push(p.position);
                size += p.nbytes;
            }
            _ => {
                shards.push(vec![p.position]);
                size = p.nbytes;
            }
        }
    }
    if shards.is_empty() {
        shards.push(Vec::new());
    }
    let n = shards.len();
    let names: Vec<String> = if n == 1 {
        vec!["model.safetensors".to_owned()]
    } else {
        (1..=n)
            .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
            .collect()
    };
    let mut targets = Vec::with_capacity(n + 1);
    for name in &names {
        targets.push(output::target(&dir.join(name))?);
    }
    let index_target = (n > 1)
        .then(|| output::target(&dir.join("model.safetensors.index.json")))
        .transpose()?;
    for t in targets.iter().chain(&index_target) {
        for source in sd.checkpoints().iter().flat_map(|c| c.inputs()) {
            output::check(t, source.identity(), opts.overwrite)?;
        }
    }
    let mut done: Vec<(std::path::PathBuf, std::path::PathBuf, Written)> = Vec::new();
    let result = (|| -> Result<()> {
        let mut weight_map: Vec<(String, String)> = Vec::new();
        let mut total = 0u64;
        for (k, positions) in shards.iter().enumerate() {
            let part = sd.subset(positions);
            let mut shard_opts = opts.clone();
            if k > 0 {
                shard_opts.metadata = Metadata::None;
            }
            let (Some(target), Some(name)) = (targets.get(k), names.get(k)) else {
                return Err(Error::new(ErrorKind::Tensor, "shard index"));
            };
            let (tmp, file) = output::create_beside(target)?;
            done.push((tmp.clone(), target.clone(), Written::default()));
            let written = write_to_file(&part, &shard_opts, file, target)?;
            for e in part.iter() {
                weight_map.push((e.name.clone(), name.clone()));
            }
            total += written.bytes;
            if let Some(last) = done.last_mut() {
                last.2 = written;
            }
        }
        if let Some(index) = &index_target {
            weight_map.sort();
            let mut text = format!(
                "{{\n  \"metadata\": {{\n    \"total_size\": {total}\n  }},\n  \"weight_map\": {{"
            );
            for (i, (tensor, file)) in weight_map.iter().enumerate() {
                text.push_str(if i == 0 { "\n    " } else { ",\n    " });
                json_string(tensor, &mut text);
                text.push_str(": ");
                json_string(file, &mut text);
            }
            text.push_str("\n  }\n}\n");
            let (tmp, mut file) = output::create_beside(index)?;
            done.push((tmp, index.clone(), Written::default()));
            file.write_all(text.as_bytes())
                .and_then(|()| file.flush())
                .map_err(|e| Error::io(format!("cannot write {}", index.display()), e))?;
        }
        opts.check_cancel()?;
        Ok(())
    })();
    // The index goes in place last. A placement that fails takes back the
    // files this call put in place (those it created: a replaced file is
    // not restored), so no reader finds half a set.
    let mut placed: Vec<&std::path::Path> = Vec::new();
    let placing = result.and_then(|()| {
        for (tmp, target, _) in &done {
            output::finish(tmp, target, opts.overwrite)?;
            placed.push(target);
        }
        Ok(())
    });
    if let Err(e) = placing {
        for (tmp, _, _) in &done {
            let _ = std::fs::remove_file(tmp);
        }
        if !opts.overwrite {
            for target in placed {
                let _ = std::fs::remove_file(target);
            }
        }
        return Err(e);
    }
    let mut out = WrittenSet {
        skipped: first.skipped,
        ..WrittenSet::default()
    };
    for (_, target, written) in done {
        if Some(&target) == index_target.as_ref() {
            out.index = Some(target);
        } else {
            out.files.push((target, written));
        }
    }
    Ok(out)
}

/// Write the tensors of model-parallel rank files, put back together
/// ([`crate::merge`]), as one safetensors file at `path`: whole, or with
/// `shard`, that rank's part of each split tensor for another world size.
/// `{"format": "pt"}` is the only metadata. The same output rules as
/// [`write_safetensors_file`].
pub fn write_merged_file(
    set: &crate::set::CheckpointSet,
    merged: &[crate::merge::Merged],
    shard: Option<crate::parallel::Shard>,
    opts: &SafetensorsOptions,
    path: &std::path::Path,
) -> Result<Written> {
    let target = output::target(path)?;
    for source in set.files().iter().flat_map(|f| f.checkpoint().inputs()) {
        output::check(&target, source.identity(), opts.overwrite)?;
    }
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut offset = 0u64;
    let mut plans = Vec::with_capacity(merged.len());
    let mut written = Written::default();
    for m in merged {
        let to = crate::convert::target(m.dtype, opts.dtype);
        let dtype = to.unwrap_or(m.dtype);
        if safetensors_dtype(dtype).is_none() {
            if opts.skip_unsupported {
                written
                    .skipped
                    .push(format!("{}: safetensors has no {dtype} dtype", m.name));
                continue;
            }
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("cannot write to safetensors: safetensors has no {dtype} dtype"),
            )
            .for_tensor(&m.name));
        }
        let shape = m.shape_for(shard);
        let nbytes = shape
            .iter()
            .try_fold(dtype.size() as u64, |a, &s| a.checked_mul(s))
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "size overflows").for_tensor(&m.name))?;
        header.push(',');
        json_string(&m.name, &mut header);
        let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
        header.push_str(&format!(
            ":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            dtype.name(),
            dims.join(","),
            offset,
            offset + nbytes
        ));
        offset += nbytes;
        plans.push((m, to, nbytes));
    }
    header.push('}');
    while (header.len() + 8) % 8 != 0 {
        header.push(' ');
    }
    let (tmp, file) = output::create_beside(&target)?;
    let io = |e: std::io::Error| Error::io(format!("cannot write {}", target.display()), e);
    let result = (|| -> Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        out.write_all(header.as_bytes()).map_err(io)?;
        for (m, to, nbytes) in &plans {
            opts.check_cancel()?;
            // Streamed in the chunks the parts are read in (whole elements
            // each), converted chunk by chunk.
            let mut count = 0u64;
            let mut failure: Option<Error> = None;
            m.visit_bytes(set, shard, |chunk| {
                if failure.is_some() {
                    return;
                }
                let done = match to {
                    Some(to) => crate::convert::convert(chunk, m.dtype, *to)
                        .and_then(|c| out.write_all(&c).map_err(io).map(|()| c.len())),
                    None => out.write_all(chunk).map_err(io).map(|()| chunk.len()),
                };
                match done {
                    Ok(n) => count += n as u64,
                    Err(e) => failure = Some(e),
                }
            })?;
            if let Some(e) = failure {
                return Err(e);
            }
            if count != *nbytes {
                return Err(Error::new(
                    ErrorKind::Tensor,
                    format!("its parts gave {count} bytes, not {nbytes}"),
                )
                .for_tensor(&m.name));
            }
            written.tensors += 1;
            written.bytes += nbytes;
            if let Some(progress) = &opts.progress {
                progress(*nbytes);
            }
        }
        out.flush().map_err(io)?;
        Ok(())
    })();
    let done = result.and_then(|()| output::finish(&tmp, &target, opts.overwrite));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done.map(|()| written)
}

fn write_to_file(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    file: std::fs::File,
    path: &std::path::Path,
) -> Result<Written> {
    let io = |e: std::io::Error| Error::io(format!("cannot write {}", path.display()), e);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    // A handle of our own on each file we mapped: its position is ours.
    let mut sources: Vec<Option<std::fs::File>> = sd
        .checkpoints()
        .iter()
        .map(|c| c.source().private_handle())
        .collect();
    let written = write_with(sd, opts, &mut out, &mut sources, &io)?;
    out.flush().map_err(io)?;
    Ok(written)
}

/// The safetensors bytes of `sd`, to `out`. With `sources` (each
/// checkpoint's own file, by file), tensors that lie unchanged in it are copied by
/// the kernel when `out` is a file; the others stream from the map.
fn write_with<W: Write>(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    out: &mut W,
    sources: &mut [Option<std::fs::File>],
    io: &dyn Fn(std::io::Error) -> Error,
) -> Result<Written> {
    use std::io::{Read, Seek, SeekFrom};
    let (header, planned, mut written) = plan(sd, opts, false)?;
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)?;
    let mut position = 8 + header.len() as u64;
    for p in &planned {
        opts.check_cancel()?;
        let view = entry(sd, p)?;
        let range = view.file_range().filter(|_| !p.convert);
        let file = <[Selected]>::get(sd, p.position).map_or(0, |s| s.file);
        match (sources.get_mut(file).and_then(Option::as_mut), range) {
            (Some(src), Some((offset, len))) => {
                // The kernel copies fastest into whole pages of the output,
                // so the head up to the next page boundary comes from the map.
                let head = ((PAGE - position % PAGE) % PAGE).min(len);
                let data = view.data()?;
                let head_bytes = usize::try_from(head)
                    .ok()
                    .and_then(|h| data.get(..h))
                    .ok_or_else(|| {
                        Error::new(ErrorKind::Tensor, "tensor shorter than its file range")
                            .for_tensor(view.name())
                    })?;
                out.write_all(head_bytes).map_err(io)?;
                src.seek(SeekFrom::Start(offset + head)).map_err(io)?;
                // In chunks, so a cancellation is seen within one.
                let mut left = len - head;
                while left > 0 {
                    opts.check_cancel()?;
                    let chunk = left.min(COPY_CHUNK);
                    let copied =
                        std::io::copy(&mut Read::take(&mut *src, chunk), out).map_err(io)?;
                    if copied != chunk {
                        return Err(Error::new(
                            ErrorKind::Tensor,
                            format!("file ended {} bytes early", left - copied),
                        )
                        .for_tensor(view.name()));
                    }
                    left -= chunk;
                }
            }
            _ => write_tensor_bytes(&view, p, out)?,
        }
        position += p.nbytes;
        written.tensors += 1;
        written.bytes += p.nbytes;
        if let Some(progress) = &opts.progress {
            progress(p.nbytes);
        }
    }
    Ok(written)
}

/// Bytes of a distributed checkpoint's tensor read and written at a time
/// (whole rows along its first dimension; one row at least).
const DCP_STAGE: u64 = 64 << 20;

/// Write `sd` (selected from [`Dcp::skeleton`](crate::dcp::Dcp::skeleton)
/// of `dcp`, as a set of one) to `path` as a safetensors file, safely as
/// [`write_safetensors_file`] does, reading each tensor (each rank's part
/// of a sliced one) from `dcp`'s chunks a slab of rows at a time: memory
/// stays within a few stages whatever the size of the checkpoint.
pub fn write_dcp_safetensors_file(
    dcp: &Dcp,
    sd: &StateDict,
    opts: &SafetensorsOptions,
    path: &std::path::Path,
) -> Result<Written> {
    let target = output::target(path)?;
    for source in dcp.sources() {
        output::check(&target, source.identity(), opts.overwrite)?;
    }
    let (tmp, file) = output::create_beside(&target)?;
    let io = |e: std::io::Error| Error::io(format!("cannot write {}", target.display()), e);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = write_dcp_with(dcp, sd, opts, &mut out, &io, DCP_STAGE)
        .and_then(|w| out.flush().map_err(io).map(|()| w));
    drop(out);
    let done = written.and_then(|w| output::finish(&tmp, &target, opts.overwrite).map(|()| w));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// [`write_dcp_safetensors_file`] to any writer (standard output).
pub fn write_dcp_safetensors(
    dcp: &Dcp,
    sd: &StateDict,
    opts: &SafetensorsOptions,
    out: &mut impl Write,
) -> Result<Written> {
    let io = |e: std::io::Error| Error::io("cannot write the safetensors file", e);
    write_dcp_with(dcp, sd, opts, out, &io, DCP_STAGE)
}

fn write_dcp_with<W: Write>(
    dcp: &Dcp,
    sd: &StateDict,
    opts: &SafetensorsOptions,
    out: &mut W,
    io: &dyn Fn(std::io::Error) -> Error,
    stage: u64,
) -> Result<Written> {
    let (header, planned, mut written) = plan(sd, opts, true)?;
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)?;
    for p in &planned {
        opts.check_cancel()?;
        let view = entry(sd, p)?;
        let selected = <[Selected]>::get(sd, p.position)
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index").for_tensor(&p.name))?;
        if view.info().storage.is_some() {
            // A tensor inside a bytes item, held in memory.
            write_tensor_bytes(&view, p, out)?;
        } else {
            let source = sd
                .checkpoints()
                .get(selected.file)
                .and_then(|c| c.tensor_at(selected.index))
                .map(|v| v.name())
                .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index").for_tensor(&p.name))?;
            let t = dcp.tensor(source).ok_or_else(|| {
                Error::new(ErrorKind::Tensor, "not in the distributed checkpoint")
                    .for_tensor(source)
            })?;
            let mut offsets = vec![0u64; t.shape().len()];
            let mut sizes = t.shape().to_vec();
            if let Some(slice) = selected.slice {
                if let (Some(o), Some(z)) = (offsets.get_mut(slice.dim), sizes.get_mut(slice.dim)) {
                    *o = slice.start;
                    *z = slice.len;
                }
            }
            let elem = t.dtype().size() as u64;
            let row = sizes
                .iter()
                .skip(1)
                .fold(elem, |n, &d| n.saturating_mul(d))
                .max(1);
            let rows = sizes.first().copied().unwrap_or(1);
            let step = (stage / row).max(1);
            let mut done = 0u64;
            loop {
                opts.check_cancel()?;
                let take = step.min(rows - done);
                if let (Some(o), Some(z)) = (offsets.first_mut(), sizes.first_mut()) {
                    let start = selected.slice.filter(|s| s.dim == 0).map_or(0, |s| s.start);
                    *o = start.saturating_add(done);
                    *z = take;
                }
                let bytes = dcp.read_region(source, &offsets, &sizes)?;
                if p.convert {
                    out.write_all(&crate::convert::convert(&bytes, t.dtype(), p.dtype)?)
                        .map_err(io)?;
                } else {
                    out.write_all(&bytes).map_err(io)?;
                }
                // The slab is copied out: its pages of the mapped files
                // need not stay in this process's resident memory.
                for source in dcp.sources() {
                    source.release();
                }
                done += take;
                if done >= rows {
                    break;
                }
            }
        }
        written.tensors += 1;
        written.bytes += p.nbytes;
        if let Some(progress) = &opts.progress {
            progress(p.nbytes);
        }
    }
    Ok(written)
}

/// Bytes per kernel copy between checks for cancellation.
const COPY_CHUNK: u64 = 64 << 20;

/// Where [`write_safetensors_file`] may write, and how it writes there.
mod output {
    use std::fs::{File, OpenOptions};
    use std::path::{Path, PathBuf};

    use crate::error::{Error, ErrorKind, Result};
    use crate::source::FileId;

    /// Symbolic links followed before giving up (the kernel's own limit).
    const MAX_LINKS: usize = 40;

    /// `path` with every symbolic link at its end followed.
    pub(super) fn target(path: &Path) -> Result<PathBuf> {
        let mut path = path.to_path_buf();
        for _ in 0..MAX_LINKS {
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    let link = std::fs::read_link(&path).map_err(|e| {
                        Error::io(format!("cannot read link {}", path.display()), e)
                    })?;
                    path = match path.parent() {
                        Some(dir) if link.is_relative() => dir.join(link),
                        _ => link,
                    };
                }
                _ => return Ok(path),
            }
        }
        Err(Error::new(
            ErrorKind::OutputRefused,
            format!("{}: more than {MAX_LINKS} symbolic links", path.display()),
        ))
    }

    /// Refuse the input, anything but a regular file, and an existing file
    /// unless `overwrite`.
    pub(super) fn check(target: &Path, input: Option<FileId>, overwrite: bool) -> Result<()> {
        let Ok(meta) = std::fs::metadata(target) else {
            return Ok(());
        };
        let shown = target.display();
        if input.is_some() && FileId::of(&meta) == input {
            return Err(Error::new(
                ErrorKind::OutputRefused,
                format!("{shown} is the checkpoint being read; write somewhere else"),
            ));
        }
        if !meta.is_file() {
            return Err(Error::new(
                ErrorKind::OutputRefused,
                format!("{shown} is not a regular file (a directory, device or pipe)"),
            ));
        }
        if !overwrite {
            return Err(Error::new(
                ErrorKind::OutputExists,
                format!("{shown} exists; it is replaced only when overwriting is asked for"),
            ));
        }
        Ok(())
    }

    /// A new file beside `target`, created exclusively (never through a
    /// link someone placed under the temporary name).
    pub(super) fn create_beside(target: &Path) -> Result<(PathBuf, File)> {
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".into());
        let mut last = None;
        for attempt in 0..100u32 {
            let tmp = dir.join(format!(
                ".{name}.{}-{attempt}.ptload-partial",
                std::process::id()
            ));
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(f) => return Ok((tmp, f)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(Error::io(format!("cannot create {}", tmp.display()), e)),
            }
        }
        let e = last.unwrap_or_else(|| std::io::Error::other("no free name"));
        Err(Error::io(
            format!("cannot create a temporary file in {}", dir.display()),
            e,
        ))
    }

    /// Put the complete file in place: a rename when replacing is allowed;
    /// otherwise a hard link, which fails rather than replace a file that
    /// appeared meanwhile.
    pub(super) fn finish(tmp: &Path, target: &Path, overwrite: bool) -> Result<()> {
        let failed = |e| Error::io(format!("cannot write {}", target.display()), e);
        if overwrite {
            return std::fs::rename(tmp, target).map_err(failed);
        }
        match std::fs::hard_link(tmp, target) {
            Ok(()) => std::fs::remove_file(tmp).map_err(failed),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::new(
                ErrorKind::OutputExists,
                format!(
                    "{} appeared while writing; it was left as it is",
                    target.display()
                ),
            )),
            // File systems without hard links: the check at the start stands.
            Err(_) => std::fs::rename(tmp, target).map_err(failed),
        }
    }
}

/// Stream one tensor's output bytes (converted if planned so) to `out`.
fn write_tensor_bytes(
    view: &crate::view::TensorView<'_>,
    p: &Planned,
    out: &mut impl Write,
) -> Result<()> {
    let io = |e: std::io::Error| Error::io("cannot write the safetensors file", e);
    if p.convert {
        let data = view.data()?;
        let bytes = crate::convert::convert(&data, view.dtype(), p.dtype)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::{Shard, Splits};
    use crate::state_dict::{KeySelect, StateDictOptions, Strip};

    /// A distributed checkpoint written a row at a time gives the same
    /// file as in one slab per tensor, whole and as a rank's slices.
    #[test]
    fn dcp_slabs_of_any_size_write_the_same_bytes() {
        let dcp = Dcp::open("../../fixtures/files/dcp/world4").unwrap();
        let skeleton = dcp.skeleton().unwrap();
        let io = |e: std::io::Error| Error::io("write", e);
        for parallel in [
            None,
            Some((
                Shard::new(1, 3).unwrap(),
                Splits::parse(&["norm.scale=replicate", "*.weight=1", "*=0"]).unwrap(),
            )),
        ] {
            let sd = StateDictOptions {
                key: KeySelect::All,
                strip: Strip::None,
                parallel,
                ..Default::default()
            }
            .select(&skeleton)
            .unwrap();
            let opts = SafetensorsOptions::default();
            let mut big = Vec::new();
            let mut small = Vec::new();
            let a = write_dcp_with(&dcp, &sd, &opts, &mut big, &io, DCP_STAGE).unwrap();
            let b = write_dcp_with(&dcp, &sd, &opts, &mut small, &io, 1).unwrap();
            assert_eq!(big, small);
            assert_eq!((a.tensors, a.bytes), (b.tensors, b.bytes));
            assert_eq!(a.tensors, 7);
        }
    }
}
