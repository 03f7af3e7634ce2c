//! `convert` and `diff`.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use ptload_reader::export::{Metadata, SafetensorsOptions};
use ptload_reader::set::CheckpointSet;
use ptload_reader::state_dict::StateDictOptions;
use ptload_reader::{DType, ErrorKind};
use serde::Serialize;

use crate::args::{parse_dtype, CliResult};
use crate::inspect::human_size;

/// Exit code of a command that judges: 0 nothing found, 1 findings, 2 error.
pub(crate) type Verdict = u8;

// ---- convert ----------------------------------------------------------

/// What `convert` writes, and how.
pub(crate) struct ConvertRequest<'a> {
    pub(crate) output: &'a Path,
    pub(crate) force: bool,
    pub(crate) dtype: Option<&'a str>,
    pub(crate) skip_unsupported: bool,
    pub(crate) metadata: crate::args::MetadataArg,
    pub(crate) json: bool,
    /// Write a directory of shards of at most this many bytes each.
    pub(crate) max_shard_size: Option<u64>,
    /// The distributed checkpoint the set is the skeleton of: tensors are
    /// read from its chunks as they are written.
    pub(crate) dcp: Option<&'a ptload_reader::dcp::Dcp>,
}

/// Set by Ctrl-C (SIGINT) or SIGTERM: the write stops, removes its partial
/// file and the process exits 130. A second signal exits at once.
fn cancel_flag() -> Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let seen = flag.clone();
        // Without a handler, a signal ends the process before the partial
        // file can be removed; a failure to install one is not fatal.
        let _ = ctrlc::set_handler(move || {
            if seen.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
        flag
    })
    .clone()
}

/// Whether `e` reports a cancelled write.
pub(crate) fn cancelled(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<ptload_reader::Error>()
        .is_some_and(|e| e.kind() == ErrorKind::Cancelled)
}

/// A write's error, with the flag that gets past an existing output.
pub(crate) fn output_error(e: ptload_reader::Error) -> Box<dyn std::error::Error> {
    if e.kind() == ErrorKind::OutputExists {
        format!(
            "{} (pass --force to replace it)",
            e.render(&crate::terms::Flags)
        )
        .into()
    } else {
        e.into()
    }
}

pub(crate) fn convert(
    out: &mut impl Write,
    set: &CheckpointSet,
    state: &StateDictOptions,
    request: &ConvertRequest<'_>,
) -> CliResult<()> {
    let output = request.output;
    let to_stdout = output.as_os_str() == "-";
    if to_stdout && std::io::stdout().is_terminal() {
        return Err(
            "refusing to write a binary safetensors file to a terminal; redirect standard output"
                .into(),
        );
    }
    let selection = state.select_set(set)?;
    crate::args::tell_decisions(selection.decisions());
    let total: u64 = selection.tensors().map(|(_, t)| t.info().nbytes).sum();
    let bar = crate::ui::progress_bar("converting", total);
    let opts = SafetensorsOptions {
        dtype: request.dtype.map(parse_dtype).transpose()?,
        skip_unsupported: request.skip_unsupported,
        progress: bar
            .clone()
            .map(|bar| std::sync::Arc::new(move |n| bar.inc(n)) as ptload_reader::export::Progress),
        overwrite: request.force,
        cancel: Some(cancel_flag()),
        metadata: match request.metadata {
            crate::args::MetadataArg::None => Metadata::None,
            crate::args::MetadataArg::Values => Metadata::Selected {
                key: selection.key().map(str::to_owned),
            },
            crate::args::MetadataArg::All => Metadata::All,
        },
    };
    if let Some(max) = request.max_shard_size {
        if to_stdout {
            return Err(
                "--max-shard-size writes a directory of shards, not standard output".into(),
            );
        }
        let set = ptload_reader::export::write_safetensors_set(&selection, &opts, output, max);
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let set = set.map_err(output_error)?;
        for s in &set.skipped {
            eprintln!("ptload: warning: skipped {s}");
        }
        let left_out: Vec<(String, String)> = set
            .files
            .iter()
            .flat_map(|(_, w)| w.metadata_left_out.iter().cloned())
            .collect();
        note_left_out(&left_out);
        let tensors: usize = set.files.iter().map(|(_, w)| w.tensors).sum();
        let bytes: u64 = set.files.iter().map(|(_, w)| w.bytes).sum();
        if request.json {
            let files: Vec<serde_json::Value> = set
                .files
                .iter()
                .map(|(p, w)| serde_json::json!({"file": p.display().to_string(), "tensors": w.tensors, "bytes": w.bytes}))
                .collect();
            let doc = serde_json::json!({
                "output": output.display().to_string(),
                "files": files,
                "index": set.index.as_ref().map(|p| p.display().to_string()),
                "tensors": tensors,
                "bytes": bytes,
                "skipped": set.skipped,
                "metadata_left_out": left_out_json(&left_out),
                "decisions": crate::terms::decisions(selection.decisions()),
            });
            serde_json::to_writer(&mut *out, &doc)?;
            writeln!(out)?;
        } else {
            writeln!(
                out,
                "wrote {}: {} file{}{}, {tensors} tensors, {} of data{}",
                output.display(),
                set.files.len(),
                if set.files.len() == 1 { "" } else { "s" },
                set.index
                    .as_ref()
                    .and_then(|p| p.file_name())
                    .map(|n| format!(" and {}", n.to_string_lossy()))
                    .unwrap_or_default(),
                human_size(bytes),
                if set.skipped.is_empty() {
                    String::new()
                } else {
                    format!(", {} skipped", set.skipped.len())
                }
            )?;
        }
        return Ok(());
    }
    let result = match (request.dcp, to_stdout) {
        (Some(dcp), true) => {
            let mut stdout = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
            let written =
                ptload_reader::export::write_dcp_safetensors(dcp, &selection, &opts, &mut stdout);
            stdout.flush()?;
            written
        }
        (Some(dcp), false) => {
            ptload_reader::export::write_dcp_safetensors_file(dcp, &selection, &opts, output)
        }
        (None, true) => {
            let mut stdout = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
            let written = ptload_reader::export::write_safetensors(&selection, &opts, &mut stdout);
            stdout.flush()?;
            written
        }
        (None, false) => ptload_reader::export::write_safetensors_file(&selection, &opts, output),
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let written = result.map_err(output_error)?;
    for s in &written.skipped {
        eprintln!("ptload: warning: skipped {s}");
    }
    note_left_out(&written.metadata_left_out);
    if request.json {
        #[derive(Serialize)]
        struct ConvertOut<'a> {
            output: String,
            tensors: usize,
            bytes: u64,
            metadata: usize,
            skipped: &'a [String],
            metadata_left_out: Vec<serde_json::Value>,
            decisions: Vec<String>,
        }
        serde_json::to_writer(
            &mut *out,
            &ConvertOut {
                output: output.display().to_string(),
                tensors: written.tensors,
                bytes: written.bytes,
                metadata: written.metadata,
                skipped: &written.skipped,
                metadata_left_out: left_out_json(&written.metadata_left_out),
                decisions: crate::terms::decisions(selection.decisions()),
            },
        )?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "wrote {}: {} tensors, {} of data, {} metadata values{}",
            output.display(),
            written.tensors,
            human_size(written.bytes),
            written.metadata,
            if written.skipped.is_empty() {
                String::new()
            } else {
                format!(", {} skipped", written.skipped.len())
            }
        )?;
    }
    Ok(())
}

/// Say which values `convert` kept out of the metadata, and why: they are
/// what the file hands to a call it asks for (a command line, a path).
fn note_left_out(left_out: &[(String, String)]) {
    if left_out.is_empty() {
        return;
    }
    let list: Vec<String> = left_out
        .iter()
        .map(|(name, call)| format!("{name} (an argument of {call})"))
        .collect();
    crate::ui::note(&format!(
        "left out of the metadata, as arguments of calls the file asks for rather than plain \
         values: {}; `ptload scan` judges those calls",
        list.join(", ")
    ));
}

fn left_out_json(left_out: &[(String, String)]) -> Vec<serde_json::Value> {
    left_out
        .iter()
        .map(|(name, call)| serde_json::json!({"name": name, "call": call}))
        .collect()
}

// ---- diff -------------------------------------------------------------

#[derive(Serialize, Default)]
struct DiffOut {
    only_in_a: Vec<String>,
    only_in_b: Vec<String>,
    different: Vec<Difference>,
    equal: usize,
}

#[derive(Serialize)]
struct Difference {
    name: String,
    what: String,
    max_abs_diff: Option<f64>,
}

fn as_f64(bytes: &[u8], dtype: DType) -> Option<Vec<f64>> {
    let wide = ptload_reader::convert::convert(bytes, dtype, DType::F64).ok()?;
    Some(
        wide.chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
    )
}

/// How close two floating tensors must be to count as equal:
/// `|a - b| <= atol + rtol * |b|` for every element (as `torch.allclose`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tolerance {
    pub(crate) atol: f64,
    pub(crate) rtol: f64,
}

impl Tolerance {
    fn is_set(&self) -> bool {
        self.atol > 0.0 || self.rtol > 0.0
    }
}

/// Whether `path` holds a safetensors file: an 8-byte little-endian
/// header length that fits the file, then `{`.
pub(crate) fn is_safetensors(path: &Path) -> bool {
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = [0u8; 9];
    if f.read_exact(&mut head).is_err() {
        return false;
    }
    let len = f.metadata().map_or(0, |m| m.len());
    let mut n = [0u8; 8];
    n.copy_from_slice(&head[..8]);
    let n = u64::from_le_bytes(n);
    n >= 2 && n <= len.saturating_sub(8) && head[8] == b'{'
}

/// One side of a diff: a torch checkpoint's selection, or a safetensors
/// file (read whole; its names as they are).
pub(crate) enum Side<'a> {
    Torch(ptload_reader::state_dict::StateDict<'a>),
    Safetensors(safetensors::SafeTensors<'a>),
}

/// A tensor of either side.
struct Entry<'a> {
    dtype: DType,
    shape: Vec<u64>,
    /// Row-major little-endian elements; `None` for a meta tensor.
    data: Option<std::borrow::Cow<'a, [u8]>>,
}

impl<'a> Side<'a> {
    fn names(&self) -> Vec<String> {
        match self {
            Side::Torch(sel) => sel.iter().map(|s| s.name.clone()).collect(),
            Side::Safetensors(st) => {
                // The header's order is the data's (offsets ascending).
                let mut named: Vec<(usize, String)> = st
                    .tensors()
                    .into_iter()
                    .map(|(n, v)| (v.data().as_ptr() as usize, n))
                    .collect();
                named.sort();
                named.into_iter().map(|(_, n)| n).collect()
            }
        }
    }

    /// Bytes of the tensor's elements.
    fn nbytes(&self, name: &str) -> Option<u64> {
        match self {
            Side::Torch(sel) => sel.get(name).map(|t| t.info().nbytes),
            Side::Safetensors(st) => st.tensor(name).ok().map(|v| v.data().len() as u64),
        }
    }

    fn contains(&self, name: &str) -> bool {
        match self {
            Side::Torch(sel) => sel.contains(name),
            Side::Safetensors(st) => st.tensor(name).is_ok(),
        }
    }

    fn entry(&self, name: &str) -> CliResult<Option<Entry<'_>>> {
        match self {
            Side::Torch(sel) => {
                let Some(t) = sel.get(name) else {
                    return Ok(None);
                };
                Ok(Some(Entry {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                    data: t.storage().map(|_| t.data()).transpose()?,
                }))
            }
            Side::Safetensors(st) => {
                let Ok(view) = st.tensor(name) else {
                    return Ok(None);
                };
                let dtype_name = format!("{:?}", view.dtype());
                let dtype = dtype_name.parse::<DType>().map_err(|_| {
                    format!("{name}: safetensors dtype {dtype_name} is not one ptload reads")
                })?;
                Ok(Some(Entry {
                    dtype,
                    shape: view.shape().iter().map(|&d| d as u64).collect(),
                    data: Some(std::borrow::Cow::Borrowed(view.data())),
                }))
            }
        }
    }
}

/// The largest `|a - b|` and whether every element is within `tol`
/// (`None` when the dtypes have no numeric values to compare).
fn closeness(a: &Entry<'_>, b: &Entry<'_>, tol: Tolerance) -> Option<(f64, bool)> {
    let (x, y) = (
        as_f64(a.data.as_deref()?, a.dtype)?,
        as_f64(b.data.as_deref()?, b.dtype)?,
    );
    let mut max = 0.0f64;
    let mut within = true;
    for (p, q) in x.iter().zip(&y) {
        let d = (p - q).abs();
        // NaN anywhere makes the largest difference NaN.
        max = if max.is_nan() || d.is_nan() {
            f64::NAN
        } else {
            max.max(d)
        };
        let close = d <= tol.atol + tol.rtol * q.abs() || (p.is_nan() && q.is_nan());
        within &= close;
    }
    Some((max, within))
}

/// `None` when equal (bytes equal, or within the tolerance).
fn compare(name: &str, a: &Entry<'_>, b: &Entry<'_>, tol: Tolerance) -> Option<Difference> {
    let differ = |what: String, max_abs_diff| {
        Some(Difference {
            name: name.to_owned(),
            what,
            max_abs_diff,
        })
    };
    if a.shape != b.shape {
        return differ(format!("shape {:?} vs {:?}", a.shape, b.shape), None);
    }
    if a.dtype != b.dtype {
        // With a tolerance, values of two floating dtypes compare (a
        // conversion to bf16 checked against its f32 source).
        if tol.is_set() && a.dtype.is_float() && b.dtype.is_float() {
            return match closeness(a, b, tol) {
                Some((_, true)) => None,
                Some((max, false)) => differ(
                    format!(
                        "dtype {} vs {}, values outside the tolerance",
                        a.dtype, b.dtype
                    ),
                    Some(max),
                ),
                None => differ(format!("dtype {} vs {}", a.dtype, b.dtype), None),
            };
        }
        return differ(format!("dtype {} vs {}", a.dtype, b.dtype), None);
    }
    match (&a.data, &b.data) {
        // Meta tensors: equal when dtype and shape are.
        (None, None) => None,
        (Some(x), Some(y)) if x == y => None,
        (Some(_), Some(_)) => match closeness(a, b, tol) {
            Some((_, true)) if tol.is_set() => None,
            Some((max, _)) => differ(
                if tol.is_set() {
                    "values outside the tolerance".into()
                } else {
                    "bytes differ".into()
                },
                Some(max),
            ),
            None => differ("bytes differ".into(), None),
        },
        _ => differ("one side has no data (meta)".into(), None),
    }
}

pub(crate) fn diff(
    out: &mut impl Write,
    a: &Side<'_>,
    b: &Side<'_>,
    tol: Tolerance,
    json: bool,
) -> CliResult<Verdict> {
    let mut result = DiffOut::default();
    let names = a.names();
    let total = names.iter().filter_map(|n| a.nbytes(n)).sum();
    let bar = crate::ui::progress_bar("comparing", total);
    for name in names {
        if let (Some(bar), Some(n)) = (&bar, a.nbytes(&name)) {
            bar.inc(n);
        }
        if !b.contains(&name) {
            result.only_in_a.push(name);
            continue;
        }
        let (Some(ea), Some(eb)) = (a.entry(&name)?, b.entry(&name)?) else {
            continue;
        };
        match compare(&name, &ea, &eb, tol) {
            Some(d) => result.different.push(d),
            None => result.equal += 1,
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    result.only_in_b = b.names().into_iter().filter(|n| !a.contains(n)).collect();
    let same =
        result.only_in_a.is_empty() && result.only_in_b.is_empty() && result.different.is_empty();
    if json {
        serde_json::to_writer(&mut *out, &result)?;
        writeln!(out)?;
    } else {
        for n in &result.only_in_a {
            writeln!(out, "only in A: {n}")?;
        }
        for n in &result.only_in_b {
            writeln!(out, "only in B: {n}")?;
        }
        for d in &result.different {
            match d.max_abs_diff {
                Some(m) => writeln!(
                    out,
                    "different: {}: {} (max abs diff {m:e})",
                    d.name, d.what
                )?,
                None => writeln!(out, "different: {}: {}", d.name, d.what)?,
            }
        }
        writeln!(
            out,
            "{}: {} equal, {} different, {} only in A, {} only in B",
            if same { "equal" } else { "different" },
            result.equal,
            result.different.len(),
            result.only_in_a.len(),
            result.only_in_b.len()
        )?;
    }
    Ok(if same { 0 } else { 1 })
}
