//! Hugging Face-format distributed checkpoints: the directory torch's
//! `HuggingFaceStorageWriter` writes with `save_distributed=True`.
//!
//! Each rank writes its chunks as a safetensors file,
//! `shard-RRRRR-model-KKKKK-of-NNNNN.safetensors` (one per file of the
//! writer's `fqn_to_index_mapping`), and records where each chunk lies in
//! the global tensor in its header's `__metadata__`: `DCP_SHARDING_INFO`, a
//! JSON object of `{name: {"saved_offsets": [..]}}`. No `.metadata` file is
//! written. Like torch's `HuggingFaceStorageReader`, the metadata is
//! inferred from the headers: a tensor's chunks are the entries of that
//! name in every file, each at its saved offsets (zeros in a file without
//! `DCP_SHARDING_INFO`), and its global size reaches as far as its chunks
//! do. The inferred metadata then passes the checks a `.metadata` does:
//! the chunks tile the tensor, none overlaps another, every file a plain
//! name in the directory.

use std::path::Path;

use crate::container::safetensors::Header;
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::source::Source;
use crate::torch::dtype::DType;
#[cfg(feature = "dcp")]
use {crate::checkpoint::OpenOptions, crate::error::ErrorKind, std::collections::HashMap};

#[cfg(feature = "dcp")]
use super::metadata::{RawChunk, RawItem, RawMetadata, RawStorage};

/// The `__metadata__` key of each chunk's offsets.
pub(crate) const SHARDING_INFO: &str = "DCP_SHARDING_INFO";

const SUFFIX: &str = ".safetensors";

/// The `.safetensors` files directly in `dir`, by name, and whether it
/// holds a `*.index.json` (then it is a model's safetensors set, whatever
/// its headers say).
fn listing(dir: &Path, limits: &Limits) -> Result<(Vec<String>, bool)> {
    let mut names = Vec::new();
    let mut index = false;
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".index.json") {
            index = true;
        } else if name.ends_with(SUFFIX) && entry.path().is_file() {
            if names.len() >= limits.max_set_files {
                return Err(Error::limit("max_set_files", limits.max_set_files as u64));
            }
            names.push(name);
        }
    }
    names.sort();
    Ok((names, index))
}

/// The header of a safetensors file (or blob), checked as hostile input;
/// dtypes torch has no name for are refused.
pub(crate) fn header(source: &Source, limits: &Limits) -> Result<Header> {
    crate::container::safetensors::parse(source.view(), limits, |name| {
        DType::from_safetensors_name(name).map(|d| d.size() as u64)
    })
}

/// Whether `dir` is a Hugging Face-format DCP save: it has no
/// `*.index.json`, and the first of its `.safetensors` files by name
/// carries `DCP_SHARDING_INFO` in its header (read by content: the file
/// names are not trusted).
pub(crate) fn is_hf_dir(dir: &Path) -> bool {
    let limits = Limits::default();
    let Ok((names, false)) = listing(dir, &limits) else {
        return false;
    };
    let Some(first) = names.first() else {
        return false;
    };
    Source::map(&dir.join(first))
        .and_then(|s| header(&s, &limits))
        .is_ok_and(|h| h.metadata.iter().any(|(k, _)| k == SHARDING_INFO))
}

/// Whether `dir` holds a `.safetensors` file.
#[cfg(feature = "dcp")]
pub(crate) fn holds_safetensors(dir: &Path) -> bool {
    listing(dir, &Limits::default()).is_ok_and(|(names, _)| !names.is_empty())
}

/// Each tensor's saved offsets, from a header's `DCP_SHARDING_INFO`:
/// empty when the header has none.
#[cfg(feature = "dcp")]
pub(crate) fn saved_offsets(header: &Header) -> Result<HashMap<String, Vec<u64>>> {
    let bad = |m: String| Error::new(ErrorKind::Tensor, format!("{SHARDING_INFO}: {m}"));
    let Some((_, text)) = header.metadata.iter().find(|(k, _)| k == SHARDING_INFO) else {
        return Ok(HashMap::new());
    };
    // Bounded by the header it is part of; read token by token, its
    // nesting bounded (`crate::json`). A name given twice keeps the last.
    let json = |e: crate::json::JsonError| bad(e.to_string());
    let mut r = crate::json::Reader::new(text.as_bytes()).map_err(json)?;
    r.begin_object(SHARDING_INFO).map_err(json)?;
    let mut out = HashMap::new();
    while let Some(name) = r.key().map_err(json)? {
        let no_offsets = || bad(format!("no saved_offsets (a list of offsets) for {name}"));
        if r.token().map_err(json)? != crate::json::Token::BeginObject {
            return Err(no_offsets());
        }
        let mut at = None;
        while let Some(key) = r.key().map_err(json)? {
            if key == "saved_offsets" {
                at = Some(
                    r.u64_list("saved_offsets", usize::MAX)
                        .map_err(|_| no_offsets())?,
                );
            } else {
                let t = r.token().map_err(json)?;
                r.skip(&t).map_err(json)?;
            }
        }
        out.insert(name.clone().into_owned(), at.ok_or_else(no_offsets)?);
    }
    r.end().map_err(json)?;
    Ok(out)
}

/// One file of a save: its name, its checked header and each tensor's
/// saved offsets.
#[cfg(feature = "dcp")]
pub(crate) type FileHeader = (String, Header, HashMap<String, Vec<u64>>);

/// A Hugging Face-format save read: the metadata torch's reader would
/// infer, each file opened (by name), and each file's header.
#[cfg(feature = "dcp")]
pub(crate) struct HfSave {
    pub(crate) raw: RawMetadata,
    pub(crate) files: HashMap<String, Source>,
    pub(crate) headers: Vec<FileHeader>,
}

/// Read the headers of the `.safetensors` files of `dir` and infer the
/// save's metadata from them.
#[cfg(feature = "dcp")]
pub(crate) fn read_dir(dir: &Path, opts: &OpenOptions) -> Result<HfSave> {
    let (names, _) = listing(dir, opts.limits_ref())?;
    if names.is_empty() {
        return Err(Error::new(
            ErrorKind::NotACheckpoint,
            format!("{} holds no .safetensors file", dir.display()),
        ));
    }
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name);
        let source = if opts.in_memory_ref() {
            Source::read(&path)
        } else {
            Source::map(&path)
        }
        .map_err(|e| e.in_file(&name))?;
        files.push((name, source));
    }
    read_files(files, opts.limits_ref())
}

/// The save whose files are `files` (by name, in name order; the
/// `.safetensors` ones are read, others ignored): each header checked, the
/// metadata inferred from them.
#[cfg(feature = "dcp")]
pub(crate) fn read_files(files: Vec<(String, Source)>, limits: &Limits) -> Result<HfSave> {
    let mut sources = HashMap::with_capacity(files.len());
    let mut headers = Vec::with_capacity(files.len());
    for (name, source) in files {
        if !name.ends_with(SUFFIX) {
            continue;
        }
        if headers.len() >= limits.max_set_files {
            return Err(Error::limit("max_set_files", limits.max_set_files as u64));
        }
        let h = header(&source, limits).map_err(|e| e.in_file(&name))?;
        let offsets = saved_offsets(&h).map_err(|e| e.in_file(&name))?;
        sources.insert(name.clone(), source);
        headers.push((name, h, offsets));
    }
    if headers.is_empty() {
        return Err(Error::new(
            ErrorKind::NotACheckpoint,
            "no .safetensors file, and no .metadata",
        ));
    }
    let raw = infer(&headers, limits)?;
    Ok(HfSave {
        raw,
        files: sources,
        headers,
    })
}

/// The metadata the headers describe: each name's chunks, in the order
/// the files (by name) and their headers list them, and its global size
/// as far as they reach.
#[cfg(feature = "dcp")]
fn infer(headers: &[FileHeader], limits: &Limits) -> Result<RawMetadata> {
    let mut items: Vec<(String, RawItem)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    let mut storages = Vec::new();
    for (file, h, offsets) in headers {
        if let Some(name) = offsets
            .keys()
            .find(|n| !h.entries.iter().any(|e| &e.name == *n))
        {
            return Err(Error::new(
                ErrorKind::Tensor,
                format!("{SHARDING_INFO} places {name:?}, which the file does not hold"),
            )
            .in_file(file));
        }
        for e in &h.entries {
            let bad = |m: String| {
                Error::new(ErrorKind::Tensor, m)
                    .for_tensor(&e.name)
                    .in_file(file)
            };
            if storages.len() >= limits.max_tensors {
                return Err(Error::limit("max_tensors", limits.max_tensors as u64));
            }
            let dtype = DType::from_safetensors_name(&e.dtype)
                .ok_or_else(|| bad(format!("dtype {:?} is not one ptload reads", e.dtype)))?;
            let start = match offsets.get(&e.name) {
                Some(o) if o.len() == e.shape.len() => o.clone(),
                Some(o) => {
                    return Err(bad(format!(
                        "{SHARDING_INFO} places it at {o:?}, which is not a place for shape {:?}",
                        e.shape
                    )))
                }
                None => vec![0; e.shape.len()],
            };
            let mut end = Vec::with_capacity(start.len());
            for (&o, &s) in start.iter().zip(&e.shape) {
                end.push(o.checked_add(s).ok_or_else(|| {
                    bad(format!(
                        "its chunk at {start:?} of shape {:?} overflows",
                        e.shape
                    ))
                })?);
            }
            let chunk = RawChunk {
                offsets: start.clone(),
                sizes: e.shape.clone(),
            };
            match at.get(&e.name).and_then(|&i| items.get_mut(i)) {
                Some((
                    _,
                    RawItem::Tensor {
                        dtype: d,
                        size,
                        chunks,
                    },
                )) => {
                    if *d != dtype || size.len() != end.len() {
                        return Err(bad(format!(
                            "a chunk of it is {} with {} dimensions here, {} with {} in another file",
                            e.dtype,
                            end.len(),
                            d.name(),
                            size.len()
                        )));
                    }
                    for (s, e) in size.iter_mut().zip(&end) {
                        *s = (*s).max(*e);
                    }
                    chunks.push(chunk);
                }
                _ => {
                    at.insert(e.name.clone(), items.len());
                    items.push((
                        e.name.clone(),
                        RawItem::Tensor {
                            dtype,
                            size: end,
                            chunks: vec![chunk],
                        },
                    ));
                }
            }
            storages.push(RawStorage {
                fqn: e.name.clone(),
                offset: Some(start),
                relative_path: file.clone(),
                // The chunk is found by name in the file's safetensors
                // blob, which starts the file.
                start: 0,
                length: e.end - e.begin,
                transforms: Vec::new(),
            });
        }
    }
    Ok(RawMetadata {
        // No pickle: nothing here was written by one.
        protocol: 0,
        items,
        storages,
        copies: Vec::new(),
    })
}
