//! What a write will put where, decided and checked before any byte is
//! written: each tensor's output dtype and size, the header, the shards.

use super::header::{plain_json, Entry, Header};
use super::{safetensors_dtype, Metadata, SafetensorsOptions, Skipped, Unwritable, Written};
use crate::advice::Hint;
use crate::checkpoint::Scalar;
use crate::error::{Error, ErrorKind, Result};
use crate::state_dict::{Selected, StateDict};
use crate::torch::dtype::DType;

/// One tensor as it will be written.
pub(super) struct Planned {
    /// Position in the state dict's entries.
    pub(super) position: usize,
    pub(super) name: String,
    /// The dtype written.
    pub(super) dtype: DType,
    /// Whether the bytes are cast to `dtype` on the way out.
    pub(super) cast: bool,
    /// Output bytes.
    pub(super) nbytes: u64,
}

/// A checked write: its header and its tensors, in order.
pub(super) struct Layout {
    pub(super) header: String,
    pub(super) planned: Vec<Planned>,
    /// Skipped tensors and the count of plain values; tensors and bytes
    /// are counted as they are written.
    pub(super) written: Written,
}

/// The header and the tensors to write, checked before anything is written.
/// With `elsewhere`, tensors without storage are written from elsewhere (a
/// distributed checkpoint's chunks) rather than refused as meta tensors.
pub(super) fn plan(sd: &StateDict, opts: &SafetensorsOptions, elsewhere: bool) -> Result<Layout> {
    let (planned, mut written) = tensors(sd, opts, elsewhere)?;
    let metadata = metadata(sd, opts, &planned, &mut written)?;
    let mut offset = 0u64;
    let mut entries = Vec::with_capacity(planned.len());
    let mut shapes = Vec::with_capacity(planned.len());
    for p in &planned {
        shapes.push(entry(sd, p)?.shape().to_vec());
    }
    for (p, shape) in planned.iter().zip(&shapes) {
        let end = offset + p.nbytes;
        entries.push((
            p.name.as_str(),
            Entry {
                dtype: p.dtype,
                shape,
                data_offsets: [offset, end],
            },
        ));
        offset = end;
    }
    let header = Header {
        metadata: &metadata,
        tensors: entries,
    }
    .to_padded()?;
    // The format marker is not a value of the file.
    written.metadata = metadata.len() - 1;
    Ok(Layout {
        header,
        planned,
        written,
    })
}

/// Each tensor's output dtype and size; those safetensors cannot hold are
/// skipped (and reported) or refused, all at once.
fn tensors(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    elsewhere: bool,
) -> Result<(Vec<Planned>, Written)> {
    let mut written = Written::default();
    let mut planned = Vec::with_capacity(sd.len());
    let mut refused = Vec::new();
    for (position, s) in sd.iter().enumerate() {
        let Some(view) = sd.view(s) else {
            continue;
        };
        let info = view.info();
        let cast = crate::cast::target(info.dtype, opts.dtype);
        let dtype = cast.unwrap_or(info.dtype);
        let reason = if info.storage.is_none() && !elsewhere {
            Some(Unwritable::NoData)
        } else if safetensors_dtype(dtype).is_none() {
            Some(Unwritable::NoDtype(dtype))
        } else {
            None
        };
        if let Some(why) = reason {
            if opts.skip_unsupported {
                written.skipped.push(Skipped {
                    name: s.name.clone(),
                    why,
                });
            } else {
                refused.push(format!("{} ({why})", s.name));
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
            cast: cast.is_some(),
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
    Ok((planned, written))
}

/// `__metadata__`: the format marker first, the plain values `opts` asks
/// for (those the file hands to a call that may act are left out, and
/// listed in `written`), then each quantized tensor's parameters.
fn metadata(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    planned: &[Planned],
    written: &mut Written,
) -> Result<Vec<(String, String)>> {
    let mut metadata: Vec<(String, String)> = vec![("format".to_owned(), "pt".to_owned())];
    // The selected values under the names they are written with, each
    // with the call it is an argument of, if any.
    // A safetensors file's values are its metadata's strings: copied as
    // they are, not as JSON text.
    let selected = sd.checkpoints().iter().flat_map(|c| {
        let verbatim = c.format() == crate::checkpoint::Format::Safetensors;
        c.values()
            .iter()
            .enumerate()
            .map(move |(i, (name, v))| (name.as_str(), v, c.value_call(i), verbatim))
    });
    let selected: Vec<_> = match &opts.metadata {
        Metadata::None => Vec::new(),
        Metadata::All | Metadata::Selected { key: None } => selected.collect(),
        Metadata::Selected { key: Some(key) } => {
            let key = key.trim_end_matches('.');
            selected
                .filter_map(|(n, v, call, verbatim)| {
                    let rest = n.strip_prefix(key)?.strip_prefix('.')?;
                    Some((rest, v, call, verbatim))
                })
                .collect()
        }
    };
    // A name once: the format marker, then the first value of a name (the
    // files of a safetensors set each say `format`).
    let mut named: std::collections::HashSet<String> =
        metadata.iter().map(|(k, _)| k.clone()).collect();
    for (name, value, call, verbatim) in selected {
        let text = match value {
            Scalar::Str(s) if verbatim => Some(s.clone()),
            _ => plain_json(value),
        };
        let Some(json) = text else {
            continue;
        };
        if !named.insert(name.to_owned()) {
            continue;
        }
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
    for p in planned {
        let quantization = entry(sd, p)
            .ok()
            .and_then(|v| v.info().quantization.clone());
        if let Some(q) = quantization {
            let record = serde_json::to_string(&q.record(&p.name))
                .map_err(|e| Error::new(ErrorKind::Tensor, e.to_string()).for_tensor(&p.name))?;
            metadata.push((format!("{}.quantization", p.name), record));
        }
    }
    Ok(metadata)
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
pub(super) fn entry<'s>(sd: &'s StateDict, p: &Planned) -> Result<crate::view::TensorView<'s>> {
    selected(sd, p).and_then(|s| {
        sd.view(s)
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index").for_tensor(&p.name))
    })
}

/// The state dict's entry for a planned tensor.
pub(super) fn selected<'s>(sd: &'s StateDict, p: &Planned) -> Result<&'s Selected> {
    <[Selected]>::get(sd, p.position)
        .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index").for_tensor(&p.name))
}

/// Positions of the tensors in each shard, the way Hugging Face's
/// `save_pretrained` cuts them: in order, a new shard when the next tensor
/// would take the current one past `max_shard_bytes` (a larger tensor gets
/// a shard of its own); one empty shard when there is nothing to write.
pub(super) fn shards(planned: &[Planned], max_shard_bytes: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut size = 0u64;
    for p in planned {
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
    shards
}

/// The header of merged rank files written as one: `{"format": "pt"}`
/// and each tensor's entry, with what each tensor writes (its cast and
/// size). Tensors safetensors cannot hold are skipped with
/// [`SafetensorsOptions::skip_unsupported`], refused otherwise.
pub(super) fn merged<'m>(
    merged: &'m [crate::merge::Merged],
    shard: Option<crate::tp::Shard>,
    opts: &SafetensorsOptions,
    written: &mut Written,
) -> Result<MergedLayout<'m>> {
    let mut offset = 0u64;
    let mut plans = Vec::with_capacity(merged.len());
    let mut shapes = Vec::with_capacity(merged.len());
    for m in merged {
        let to = crate::cast::target(m.dtype, opts.dtype);
        let dtype = to.unwrap_or(m.dtype);
        if safetensors_dtype(dtype).is_none() {
            if opts.skip_unsupported {
                written.skipped.push(Skipped {
                    name: m.name.clone(),
                    why: Unwritable::NoDtype(dtype),
                });
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
        plans.push(MergedPlan {
            merged: m,
            cast: to,
            dtype,
            offset,
            nbytes,
        });
        shapes.push(shape);
        offset += nbytes;
    }
    let metadata = [("format".to_owned(), "pt".to_owned())];
    let header = Header {
        metadata: &metadata,
        tensors: plans
            .iter()
            .zip(&shapes)
            .map(|(p, shape)| {
                (
                    p.merged.name.as_str(),
                    Entry {
                        dtype: p.dtype,
                        shape,
                        data_offsets: [p.offset, p.offset + p.nbytes],
                    },
                )
            })
            .collect(),
    }
    .to_padded()?;
    Ok(MergedLayout { header, plans })
}

/// Merged tensors' header and what each writes.
pub(super) struct MergedLayout<'m> {
    pub(super) header: String,
    pub(super) plans: Vec<MergedPlan<'m>>,
}

/// One merged tensor as it will be written.
pub(super) struct MergedPlan<'m> {
    pub(super) merged: &'m crate::merge::Merged,
    /// The dtype the bytes are cast to, if any.
    pub(super) cast: Option<DType>,
    dtype: DType,
    offset: u64,
    pub(super) nbytes: u64,
}
