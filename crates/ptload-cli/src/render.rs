//! What the commands print: `inspect`'s table and JSON document, and the
//! pieces `load`, `convert`, `scan`, `demo` and streams render with it
//! (sizes, wrapped prose, padded cells, shortened names).

use std::borrow::Cow;
use std::io::{self, Write};

use ptload_reader::checkpoint::Scalar;
use ptload_reader::placement::DeviceMap;
use ptload_reader::scan::Level;
use ptload_reader::set::CheckpointSet;
use ptload_reader::state_dict::StateDict;
use ptload_reader::tp::Slice;
use ptload_reader::TensorView;
use serde::Serialize;

use crate::args::{CliResult, GpuInfo, MapArgs};

/// One tensor as a command shows it: its (possibly renamed) name, the
/// tensor (a rank's slice of it, under --shard), its file in a set, and
/// where the plan puts it.
pub(crate) struct Row<'a> {
    pub(crate) name: String,
    pub(crate) view: TensorView<'a>,
    pub(crate) target: String,
    pub(crate) file: usize,
    pub(crate) slice: Option<Slice>,
}

/// The selected tensors with their names and targets. Without mapping
/// options the target is the saved location, as saved.
pub(crate) fn rows<'a>(
    sd: &'a StateDict<'a>,
    map: &MapArgs,
    gpus: &dyn GpuInfo,
) -> CliResult<Vec<Row<'a>>> {
    let mut plans = Vec::with_capacity(sd.checkpoints().len());
    for ckpt in sd.checkpoints() {
        plans.push(if map.is_set() {
            let mut mapper = map.mapper(ckpt, gpus)?;
            Some(DeviceMap::new(ckpt, mapper.as_mut())?)
        } else {
            None
        });
    }
    crate::args::tell_decisions(sd.decisions());
    let mut rows = Vec::with_capacity(sd.len());
    for entry in sd.iter() {
        let Some(view) = sd.view(entry) else { continue };
        let target = match plans.get(entry.file).and_then(Option::as_ref) {
            Some(p) => p.tensor_target(view.info()).to_string(),
            None => view.location().to_owned(),
        };
        rows.push(Row {
            name: entry.name.clone(),
            view,
            target,
            file: entry.file,
            slice: entry.slice,
        });
    }
    Ok(rows)
}
use sha2::{Digest, Sha256};

/// Sizes in B, KiB, MiB, GiB.
pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS.get(unit).copied().unwrap_or("TiB"))
}

fn display_name(name: &str) -> &str {
    if name.is_empty() {
        "(root)"
    } else {
        name
    }
}

fn shape_text(shape: &[u64]) -> String {
    let parts: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// Hashes of the tensors hashed so far, by the elements they view: a
/// tensor viewing the same elements as one hashed before (tied weights,
/// two names for one view of one storage, as GPT-2's embedding and
/// output) takes its hash instead of reading the elements again.
#[derive(Default)]
pub(crate) struct HashMemo(std::cell::RefCell<std::collections::HashMap<ViewKey, String>>);

/// A view of a file's storage: the file, the storage, offset, shape,
/// strides, dtype and conj/neg bits.
pub(crate) type ViewKey = (
    usize,
    usize,
    u64,
    Vec<u64>,
    Vec<u64>,
    ptload_reader::DType,
    bool,
    bool,
);

/// The elements `info`, a tensor of file `file`, views; `None` for a
/// tensor without a storage.
pub(crate) fn view_key(file: usize, info: &ptload_reader::TensorInfo) -> Option<ViewKey> {
    Some((
        file,
        info.storage?,
        info.storage_offset,
        info.shape.clone(),
        info.stride.clone(),
        info.dtype,
        info.conj,
        info.neg,
    ))
}

impl HashMemo {
    /// The hash of `info`, a tensor of file `file`: remembered, or
    /// `hash()` (of a tensor without a storage, always `hash()`).
    pub(crate) fn get_or<E>(
        &self,
        file: usize,
        info: &ptload_reader::TensorInfo,
        hash: impl FnOnce() -> Result<String, E>,
    ) -> Result<String, E> {
        let Some(key) = view_key(file, info) else {
            return hash();
        };
        if let Some(done) = self.0.borrow().get(&key) {
            return Ok(done.clone());
        }
        let done = hash()?;
        self.0.borrow_mut().insert(key, done.clone());
        Ok(done)
    }
}

pub(crate) fn sha256(view: &TensorView<'_>) -> Result<String, ptload_reader::Error> {
    let mut h = Sha256::new();
    view.visit_bytes(|chunk| {
        READ.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
        h.update(chunk);
    })?;
    Ok(hex::encode(h.finalize()))
}

pub(crate) fn scalar_text(s: &Scalar) -> String {
    match s {
        Scalar::None => "None".into(),
        Scalar::Bool(b) => if *b { "True" } else { "False" }.into(),
        Scalar::Int(i) => i.to_string(),
        Scalar::BigInt(b) => format!("<int of {} bytes>", b.len()),
        Scalar::Float(f) => format!("{f:?}"),
        Scalar::Str(s) => format!("{s:?}"),
        Scalar::Bytes(b) => format!("<{} bytes>", b.len()),
        Scalar::Device(d) => format!("device({d})"),
        Scalar::Global(g) => g.clone(),
        Scalar::Array { dtype, shape } => format!("numpy array {dtype} {}", shape_text(shape)),
        Scalar::Object(class) => format!("<{class} object>"),
        _ => "<value>".into(),
    }
}

fn distinct_globals<'a>(paths: impl Iterator<Item = String> + 'a) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    paths.filter(|p| seen.insert(p.clone())).collect()
}

/// What `scan` reports at unknown-call or above, by the same decision
/// (`Checkpoint::suspicious`): each global once, with its level and use,
/// the highest seen across the files of a set.
fn suspicious(
    set: &CheckpointSet,
) -> Result<Vec<ptload_reader::scan::GlobalUse>, ptload_reader::Error> {
    let mut found: Vec<ptload_reader::scan::GlobalUse> = Vec::new();
    for f in set.files() {
        for g in f.checkpoint().suspicious()? {
            match found.iter_mut().find(|s| s.path() == g.path()) {
                Some(seen) if g.level() > seen.level() => *seen = g,
                Some(_) => {}
                None => found.push(g),
            }
        }
    }
    Ok(found)
}

/// A finding as `inspect` prints it: a dangerous one with what it can do
/// (`posix.system (process, called)`), any other with its level
/// (`somepkg.run (unknown-call, called)`).
fn finding_text(g: &ptload_reader::scan::GlobalUse) -> String {
    match g.class {
        ptload_reader::scan::GlobalClass::Dangerous(d) if g.level() == Level::Dangerous => {
            format!("{} ({}, {})", g.path(), d.name(), g.usage.name())
        }
        _ => format!("{} ({}, {})", g.path(), g.level().name(), g.usage.name()),
    }
}

/// One of `suspicious` in `inspect --json`.
#[derive(Serialize)]
struct SuspiciousJson {
    global: String,
    level: &'static str,
    #[serde(rename = "use")]
    usage: &'static str,
}

/// One tensor of `inspect --json`, borrowing from the checkpoint.
#[derive(Serialize)]
struct TensorJson<'a> {
    name: &'a str,
    dtype: &'static str,
    shape: &'a [u64],
    stride: &'a [u64],
    storage_offset: u64,
    storage: Option<&'a str>,
    location: &'a str,
    target: &'a str,
    nbytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    quantization: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<Option<String>>,
    /// The file of a set holding it.
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    /// The rank's part under --shard (shape, stride, offset and sha256 are the slice's).
    #[serde(skip_serializing_if = "Option::is_none")]
    slice: Option<SliceJson>,
}

#[derive(Serialize)]
struct SliceJson {
    dim: usize,
    start: u64,
    len: u64,
}

/// The document `inspect --json` prints.
#[derive(Serialize)]
struct InspectJson<'r, 'a> {
    file: &'r str,
    format: &'static str,
    byteorder: &'static str,
    pickle_protocol: u8,
    tensors: Tensors<'r, 'a>,
    totals: Totals,
    values: Vec<ValueJson<'a>>,
    globals: Vec<String>,
    /// The globals outside torch's `weights_only` allowlist: what
    /// `--strict` refuses and `--allow-global` admits.
    outside_allowlist: Vec<String>,
    /// What `scan` reports at unknown-call or above, by the same decision:
    /// each global with its level and use.
    suspicious: Vec<SuspiciousJson>,
    /// Those of `suspicious` at the dangerous level, with what they can
    /// do (`posix.system (process)`).
    dangerous: Vec<String>,
    /// The files of a set, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<&'r [String]>,
    /// Bytes of tensor data read (hashing reads each tensor's, a slice's
    /// own bytes only, and nothing for a view hashed before);
    /// serialized after the tensors, once they are read.
    bytes_read: BytesRead,
    /// For a URL: the bytes and requests fetched, the tensors' included.
    #[serde(skip_serializing_if = "Option::is_none")]
    fetched: Option<FetchedJson<'r>>,
    /// In a stream of objects saved one after another: this one's place.
    #[serde(skip_serializing_if = "Option::is_none")]
    object: Option<ObjectAt>,
    /// The objects after the first of a stream, each a document of its
    /// own (with its `object`).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    more_objects: &'r [serde_json::Value],
    /// Bytes after the last object that are not another one.
    #[serde(skip_serializing_if = "Option::is_none")]
    trailing: Option<&'r Trailing>,
}

/// Where an object of a stream lies: its index (0 for the first) and the
/// byte it starts at.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct ObjectAt {
    pub(crate) index: usize,
    pub(crate) offset: u64,
}

/// Bytes after the last object of a file that are not another object.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Trailing {
    pub(crate) offset: u64,
    pub(crate) bytes: u64,
    /// Why they are not read as an object.
    pub(crate) error: String,
}

/// What a document of `inspect --json` adds about the stream its object
/// is in.
#[derive(Default)]
pub(crate) struct InStream<'r> {
    pub(crate) object: Option<ObjectAt>,
    pub(crate) more_objects: &'r [serde_json::Value],
    pub(crate) trailing: Option<&'r Trailing>,
    /// Whether to report what was fetched by ranges (not for the later
    /// objects of a local stream, which are read by positioned reads).
    pub(crate) no_fetched: bool,
}

/// What the files read by ranges fetched, counted when serialized (after
/// the tensors were read).
struct FetchedJson<'r>(&'r CheckpointSet);

impl Serialize for FetchedJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::remote::Fetched::of(self.0)
            .unwrap_or_default()
            .serialize(serializer)
    }
}

/// Tensor bytes the command read.
static READ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

struct BytesRead;

impl Serialize for BytesRead {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(READ.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Counts over the selected tensors.
#[derive(Serialize)]
struct Totals {
    tensors: usize,
    storages: usize,
    /// Bytes of the tensors' elements.
    bytes: u64,
    /// Bytes of the storages they view, each once.
    stored_bytes: u64,
}

impl Totals {
    fn of(set: &CheckpointSet, rows: &[Row<'_>]) -> Totals {
        // A rank's slice stores only its own bytes.
        let mut storages: Vec<(usize, usize)> = rows
            .iter()
            .filter(|r| r.slice.is_none())
            .filter_map(|r| Some((r.file, r.view.info().storage?)))
            .collect();
        storages.sort_unstable();
        storages.dedup();
        let sliced = rows.iter().filter(|r| r.slice.is_some());
        Totals {
            tensors: rows.len(),
            storages: storages.len() + sliced.clone().count(),
            bytes: rows.iter().map(|r| r.view.info().nbytes).sum(),
            stored_bytes: storages
                .iter()
                .filter_map(|&(f, i)| set.files().get(f)?.checkpoint().storages().get(i))
                .map(|s| s.nbytes)
                .chain(sliced.map(|r| r.view.info().nbytes))
                .sum(),
        }
    }
}

/// A plain value of the file (epoch, args, config...): `value` as JSON
/// when it is a bool, int, float, str or None, `text` as `inspect` shows
/// it.
#[derive(Serialize)]
struct ValueJson<'a> {
    name: &'a str,
    value: serde_json::Value,
    text: String,
}

/// The plain values of every file of `set`, under their names.
pub(crate) fn file_values(set: &CheckpointSet) -> Vec<(&str, &Scalar)> {
    checkpoints(set)
        .flat_map(|c| c.values())
        .map(|(n, v)| (n.as_str(), v))
        .collect()
}

fn value_json<'a>(name: &'a str, v: &Scalar) -> ValueJson<'a> {
    let value = match v {
        Scalar::Bool(b) => serde_json::Value::Bool(*b),
        Scalar::Int(i) => serde_json::Value::from(*i),
        Scalar::Float(f) => serde_json::Number::from_f64(*f)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Scalar::Str(s) => serde_json::Value::String(s.clone()),
        _ => serde_json::Value::Null,
    };
    ValueJson {
        name,
        value,
        text: scalar_text(v),
    }
}

/// The tensor list, serialized as it is produced (nothing per tensor is
/// kept in memory); hashing errors surface through the serializer.
struct Tensors<'r, 'a> {
    rows: &'r [Row<'a>],
    /// File names, when the rows come from several files.
    files: Option<&'r [String]>,
    hash: bool,
    /// Drawn while hashing.
    bar: Option<indicatif::ProgressBar>,
    memo: HashMemo,
}

/// A bar for hashing the rows' tensors.
fn hash_bar(rows: &[Row<'_>], hash: bool) -> Option<indicatif::ProgressBar> {
    let total = rows.iter().map(|r| r.view.info().nbytes).sum();
    hash.then(|| crate::ui::progress_bar("hashing", total))
        .flatten()
}

impl Serialize for Tensors<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let mut seq = serializer.serialize_seq(Some(self.rows.len()))?;
        for row in self.rows {
            let mut json = tensor_json(row, self.hash, &self.memo).map_err(S::Error::custom)?;
            json.file = self.files.and_then(|f| f.get(row.file)).cloned();
            seq.serialize_element(&json)?;
            if let Some(bar) = &self.bar {
                bar.inc(row.view.info().nbytes);
            }
        }
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        seq.end()
    }
}

fn tensor_json<'r>(
    row: &'r Row<'_>,
    hash: bool,
    memo: &HashMemo,
) -> Result<TensorJson<'r>, ptload_reader::Error> {
    let t = &row.view;
    let sha256 = match (hash, t.storage().is_some()) {
        (false, _) => None,
        (true, false) => Some(None),
        (true, true) => Some(Some(memo.get_or(row.file, t.info(), || sha256(t))?)),
    };
    Ok(TensorJson {
        name: &row.name,
        dtype: t.dtype().name(),
        shape: t.shape(),
        stride: t.stride(),
        storage_offset: t.storage_offset(),
        storage: t.storage().map(|s| s.key.as_str()),
        location: t.location(),
        target: &row.target,
        nbytes: t.info().nbytes,
        quantization: t
            .info()
            .quantization
            .as_ref()
            .and_then(|q| serde_json::to_value(q.record(&row.name)).ok()),
        sha256,
        file: None,
        slice: row.slice.map(|s| SliceJson {
            dim: s.dim,
            start: s.start,
            len: s.len,
        }),
    })
}

/// The names of a set's files, when it has more than one.
fn file_names(set: &CheckpointSet) -> Option<Vec<String>> {
    (set.files().len() > 1).then(|| set.files().iter().map(|f| f.name()).collect())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn json(
    out: &mut impl Write,
    set: &CheckpointSet,
    rows: &[Row<'_>],
    values: &[(&str, &Scalar)],
    file: &str,
    hash: bool,
    stream: &InStream<'_>,
) -> CliResult<()> {
    let Some(first) = set.files().first().map(|f| &**f.checkpoint()) else {
        return Err("a set of no files".into());
    };
    let checkpoints = || set.files().iter().map(|f| &**f.checkpoint());
    let names = file_names(set);
    READ.store(0, std::sync::atomic::Ordering::Relaxed);
    let found = suspicious(set).map_err(|e| e.render(&crate::terms::Flags))?;
    let doc = InspectJson {
        file,
        format: first.format().name(),
        byteorder: first.byte_order().name(),
        pickle_protocol: first.pickle_protocol(),
        tensors: Tensors {
            rows,
            files: names.as_deref(),
            hash,
            bar: hash_bar(rows, hash),
            memo: HashMemo::default(),
        },
        totals: Totals::of(set, rows),
        values: values.iter().map(|(name, v)| value_json(name, v)).collect(),
        globals: distinct_globals(checkpoints().flat_map(|c| c.globals()).map(|g| g.path())),
        outside_allowlist: distinct_globals(
            checkpoints()
                .flat_map(|c| c.outside_allowlist())
                .map(|g| g.path()),
        ),
        suspicious: found
            .iter()
            .map(|g| SuspiciousJson {
                global: g.path(),
                level: g.level().name(),
                usage: g.usage.name(),
            })
            .collect(),
        dangerous: found
            .iter()
            .filter(|g| g.level() == Level::Dangerous)
            .map(|g| match g.class {
                ptload_reader::scan::GlobalClass::Dangerous(d) => {
                    format!("{} ({})", g.path(), d.name())
                }
                _ => g.path(),
            })
            .collect(),
        files: names.as_deref(),
        bytes_read: BytesRead,
        fetched: crate::remote::Fetched::of(set)
            .filter(|_| !stream.no_fetched)
            .map(|_| FetchedJson(set)),
        object: stream.object,
        more_objects: stream.more_objects,
        trailing: stream.trailing,
    };
    // serde_json writes a token at a time: into a buffer here, where the
    // writes are inlined, instead of each through the caller's writer
    // (a `dyn Write` for `inspect`).
    let mut buffered = std::io::BufWriter::with_capacity(1 << 16, &mut *out);
    serde_json::to_writer(&mut buffered, &doc)?;
    writeln!(buffered)?;
    buffered.flush()?;
    Ok(())
}

pub(crate) fn table(
    out: &mut impl Write,
    set: &CheckpointSet,
    rows: &[Row<'_>],
    values: &[(&str, &Scalar)],
    label: &str,
    hash: bool,
    columns: Option<usize>,
) -> CliResult<()> {
    let Some(ckpt) = set.files().first().map(|f| &**f.checkpoint()) else {
        return Err("a set of no files".into());
    };
    let shown = Columns::of(set, rows);
    let cells: Vec<Vec<String>> = rows.iter().map(|r| shown.cells(r)).collect();
    let header = shown.header();
    let widths = column_widths(&header, &cells, columns);
    let cells = shorten_names(cells, widths.first().copied().unwrap_or(0));
    title_line(out, set, ckpt, label, shown.files.as_deref(), columns)?;
    tensor_lines(out, &header, &cells, &widths, rows, hash)?;
    totals_line(out, set, rows, columns)?;
    values_table(out, values, columns)?;
    findings(out, set, columns)?;
    for w in set
        .warnings()
        .iter()
        .chain(checkpoints(set).flat_map(|c| c.warnings()))
    {
        prose(out, &format!("warning: {w}"), columns)?;
    }
    Ok(())
}

/// `inspect --key KEY` where `KEY` holds plain values only (Lightning's
/// `hyper_parameters`): the values under it, named below it.
pub(crate) fn values_view(
    out: &mut impl Write,
    set: &CheckpointSet,
    key: &str,
    values: &[(&str, &Scalar)],
    label: &str,
    columns: Option<usize>,
) -> CliResult<()> {
    let Some(ckpt) = set.files().first().map(|f| &**f.checkpoint()) else {
        return Err("a set of no files".into());
    };
    title_line(out, set, ckpt, label, file_names(set).as_deref(), columns)?;
    let count = values.len();
    let text = format!(
        "{count} plain value{} under {key:?} (no tensors)",
        if count == 1 { "" } else { "s" }
    );
    prose(out, &text, columns)?;
    values_table(out, values, columns)?;
    findings(out, set, columns)?;
    Ok(())
}

/// `text` as lines of at most `columns` characters (whole when the width
/// is not known): broken at spaces, each line after the first indented by
/// two; a word longer than a line loses its middle, marked `…`.
pub(crate) fn wrap(text: &str, columns: Option<usize>) -> Vec<String> {
    let Some(width) = columns.map(|c| c.max(MIN_PROSE_WIDTH)) else {
        return vec![text.to_owned()];
    };
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut used = 0;
    for word in text.split(' ') {
        // What a line after the first holds, past its indent.
        let word = shorten(word, width - 2);
        let len = word.chars().count();
        let room = if lines.is_empty() { width } else { width - 2 };
        if used > 0 && used + 1 + len > room {
            lines.push(std::mem::take(&mut line));
            used = 0;
        }
        if used > 0 {
            line.push(' ');
            used += 1;
        } else if !lines.is_empty() {
            line.push_str("  ");
        }
        line.push_str(&word);
        used += len;
    }
    lines.push(line);
    lines
}

/// A line of prose (a title, a warning, a list of globals), wrapped to the
/// terminal's width.
fn prose(out: &mut impl Write, text: &str, columns: Option<usize>) -> io::Result<()> {
    for line in wrap(text, columns) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The narrowest that prose is wrapped to, however narrow the terminal.
const MIN_PROSE_WIDTH: usize = 40;

/// Each file's checkpoint, in the set's order.
fn checkpoints(set: &CheckpointSet) -> impl Iterator<Item = &ptload_reader::Checkpoint> {
    set.files().iter().map(|f| &**f.checkpoint())
}

/// The table's optional columns, each shown only when some row needs it.
struct Columns {
    /// A TARGET column only when a mapping moves something.
    mapped: bool,
    /// A SLICE column when some row is a rank's slice.
    sliced: bool,
    /// A FILE column, with each file's name, for a set of several files.
    files: Option<Vec<String>>,
}

impl Columns {
    fn of(set: &CheckpointSet, rows: &[Row<'_>]) -> Self {
        Columns {
            mapped: rows.iter().any(|r| r.target != r.view.location()),
            sliced: rows.iter().any(|r| r.slice.is_some()),
            files: file_names(set),
        }
    }

    fn header(&self) -> Vec<&'static str> {
        let mut header = vec!["NAME", "DTYPE", "SHAPE", "LOCATION"];
        if self.mapped {
            header.push("TARGET");
        }
        if self.sliced {
            header.push("SLICE");
        }
        if self.files.is_some() {
            header.push("FILE");
        }
        header.push("SIZE");
        header
    }

    /// One row's cells, in the header's order.
    fn cells(&self, r: &Row<'_>) -> Vec<String> {
        let t = &r.view;
        let mut row = vec![
            display_name(&r.name).to_owned(),
            t.dtype().name().to_owned(),
            shape_text(t.shape()),
            t.location().to_owned(),
        ];
        if self.mapped {
            row.push(r.target.clone());
        }
        if self.sliced {
            row.push(r.slice.map_or_else(
                || "whole".to_owned(),
                |s| format!("dim {} [{}..{}]", s.dim, s.start, s.start + s.len),
            ));
        }
        if let Some(names) = &self.files {
            row.push(names.get(r.file).cloned().unwrap_or_default());
        }
        row.push(human_size(t.info().nbytes));
        row
    }
}

/// Each column's width: its widest cell or heading, the NAME column cut to
/// what a terminal of `columns` leaves of it.
fn column_widths(header: &[&str], cells: &[Vec<String>], columns: Option<usize>) -> Vec<usize> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    // On a terminal the NAME column takes what the others leave of its
    // width, and longer names are shortened, so no row wraps.
    let others: usize = widths.iter().skip(1).map(|w| w + 2).sum();
    if let (Some(first), Some(budget)) = (widths.first_mut(), name_budget(columns, others)) {
        *first = (*first).min(budget);
    }
    widths
}

/// The rows with each name longer than `name_width` shortened to it.
fn shorten_names(cells: Vec<Vec<String>>, name_width: usize) -> Vec<Vec<String>> {
    cells
        .into_iter()
        .map(|mut row| {
            if let Some(name) = row.first_mut() {
                if let Cow::Owned(short) = shorten(name, name_width) {
                    *name = short;
                }
            }
            row
        })
        .collect()
}

/// The line above the table: the set's files or the checkpoint's format.
fn title_line(
    out: &mut impl Write,
    set: &CheckpointSet,
    ckpt: &ptload_reader::Checkpoint,
    label: &str,
    names: Option<&[String]>,
    columns: Option<usize>,
) -> io::Result<()> {
    let text = match names {
        Some(names) => format!(
            "{label}: a set of {} files{}, {} checkpoints, {}-endian",
            names.len(),
            set.index()
                .and_then(|p| p.file_name())
                .map(|n| format!(" ({})", n.to_string_lossy()))
                .unwrap_or_default(),
            ckpt.format().name(),
            ckpt.byte_order().name(),
        ),
        // A safetensors file holds no pickle.
        None if ckpt.format() == ptload_reader::checkpoint::Format::Safetensors => format!(
            "{label}: a safetensors file (no pickle), {}-endian",
            ckpt.byte_order().name(),
        ),
        // A Hugging Face-format DCP save: safetensors shards, no pickle.
        None if ckpt.format() == ptload_reader::checkpoint::Format::Dcp
            && ckpt.pickle_protocol() == 0 =>
        {
            format!(
                "{label}: a dcp checkpoint in the Hugging Face format (safetensors shards, no pickle), {}-endian",
                ckpt.byte_order().name(),
            )
        }
        None => format!(
            "{label}: {} checkpoint, {}-endian, pickle protocol {}",
            ckpt.format().name(),
            ckpt.byte_order().name(),
            ckpt.pickle_protocol()
        ),
    };
    prose(out, &text, columns)
}

/// The header and one line per tensor, each followed by its sha256 under
/// `--hash`.
fn tensor_lines(
    out: &mut impl Write,
    header: &[&str],
    cells: &[Vec<String>],
    widths: &[usize],
    rows: &[Row<'_>],
    hash: bool,
) -> CliResult<()> {
    table_line(out, header, widths)?;
    let bar = hash_bar(rows, hash);
    let memo = HashMemo::default();
    for (row, r) in cells.iter().zip(rows) {
        let refs: Vec<&str> = row.iter().map(String::as_str).collect();
        table_line(out, &refs, widths)?;
        if hash && r.view.storage().is_some() {
            let digest = memo.get_or(r.file, r.view.info(), || sha256(&r.view))?;
            writeln!(out, "    sha256 {digest}")?;
        }
        if let Some(bar) = &bar {
            bar.inc(r.view.info().nbytes);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(())
}

/// One line of the table: cells padded to their column's width, the last
/// one to the right.
fn table_line(out: &mut impl Write, cells: &[&str], widths: &[usize]) -> io::Result<()> {
    let last = cells.len().saturating_sub(1);
    let mut text = String::new();
    for (i, (cell, &w)) in cells.iter().zip(widths).enumerate() {
        if i == last {
            pad(&mut text, cell, w, true);
        } else {
            pad(&mut text, cell, w, false);
            text.push_str("  ");
        }
    }
    writeln!(out, "{text}")
}

fn totals_line(
    out: &mut impl Write,
    set: &CheckpointSet,
    rows: &[Row<'_>],
    columns: Option<usize>,
) -> io::Result<()> {
    let totals = Totals::of(set, rows);
    let text = format!(
        "{} tensors, {} storages, {} of tensor data ({} stored)",
        totals.tensors,
        totals.storages,
        human_size(totals.bytes),
        human_size(totals.stored_bytes)
    );
    prose(out, &text, columns)
}

/// In scan's vocabulary: what scan reports at unknown-call or above; then,
/// apart, what --strict refuses.
fn findings(out: &mut impl Write, set: &CheckpointSet, columns: Option<usize>) -> CliResult<()> {
    let found = suspicious(set).map_err(|e| e.render(&crate::terms::Flags))?;
    let (dangerous, calls): (Vec<_>, Vec<_>) =
        found.iter().partition(|g| g.level() == Level::Dangerous);
    if !dangerous.is_empty() {
        let text = format!(
            "DANGEROUS globals (read, never run; torch.load(weights_only=False) would \
             reach them): {}. Run `ptload scan` on the file: it is the gate.",
            dangerous
                .iter()
                .map(|g| finding_text(g))
                .collect::<Vec<_>>()
                .join(", ")
        );
        prose(out, &text, columns)?;
    }
    if !calls.is_empty() {
        let text = format!(
            "scan would also report (read, never run): {}",
            calls
                .iter()
                .map(|g| finding_text(g))
                .collect::<Vec<_>>()
                .join(", ")
        );
        prose(out, &text, columns)?;
    }
    let outside = distinct_globals(
        checkpoints(set)
            .flat_map(|c| c.outside_allowlist())
            .map(|g| g.path()),
    );
    if !outside.is_empty() {
        let text = format!(
            "globals outside torch's weights_only allowlist (refused by --strict; read, never run): {}",
            outside.join(", ")
        );
        prose(out, &text, columns)?;
    }
    Ok(())
}

/// Plain values shown at most; `--json` lists them all.
const VALUES_SHOWN: usize = 40;

/// The top-level entries of a training checkpoint's plain values that a
/// person looks for first, in the order the table shows them; the other
/// values follow in file order, and training state (optimizer and
/// scheduler settings, Lightning's loop counters and callbacks: the
/// reader's `TRAINING_STATE`) comes last.
const FIRST_VALUES: &[&str] = &[
    // Hyper-parameters and configuration: Lightning ("hyper_parameters",
    // "hparams_name", "datamodule_hyper_parameters"), torchvision's
    // references and timm ("args"), fairseq and detectron2 ("cfg",
    // "config"), Ultralytics ("train_args"), nanoGPT ("model_args",
    // "config"), Whisper ("dims").
    "hyper_parameters",
    "hparams",
    "hparams_name",
    "hyper_params",
    "datamodule_hyper_parameters",
    "config",
    "cfg",
    "args",
    "train_args",
    "model_args",
    "dims",
    // Progress: Lightning ("epoch", "global_step"), resemblyzer ("step"),
    // detectron2 and Megatron-LM ("iteration"), nanoGPT ("iter_num"),
    // Ultralytics ("updates").
    "epoch",
    "global_step",
    "step",
    "steps",
    "iteration",
    "iter_num",
    "updates",
    // Results: timm ("metric"), torchvision's references ("best_acc1"),
    // Ultralytics ("best_fitness"), nanoGPT ("best_val_loss").
    "metric",
    "best_metric",
    "best_acc",
    "best_acc1",
    "best_fitness",
    "best_val_loss",
    "best_score",
    // Versions: Lightning, timm ("version", "arch"), DeepSpeed, Ultralytics
    // ("version", "date").
    "pytorch-lightning_version",
    "version",
    "torch_version",
    "ds_version",
    "arch",
    "date",
];

/// The values in the order the table shows them: [`FIRST_VALUES`] first,
/// then the others in file order, training state last.
fn ordered<'v, 'a>(values: &'v [(&'a str, &'a Scalar)]) -> Vec<&'v (&'a str, &'a Scalar)> {
    let rank = |name: &str| {
        let top = name.split('.').next().unwrap_or(name);
        match FIRST_VALUES.iter().position(|f| *f == top) {
            Some(at) => (0, at),
            None if ptload_reader::state_dict::TRAINING_STATE.contains(&top) => (2, 0),
            None => (1, 0),
        }
    };
    let mut shown: Vec<&(&str, &Scalar)> = values.iter().collect();
    // Stable: each group keeps the file's order.
    shown.sort_by_key(|(name, _)| rank(name));
    shown
}

/// What the values left out of the table are, by top-level entry: the
/// four largest groups, then how many more.
fn left_out_groups(left: &[&(&str, &Scalar)]) -> String {
    let mut groups: Vec<(&str, usize)> = Vec::new();
    for (name, _) in left {
        let top = name.split('.').next().unwrap_or(name);
        match groups.iter_mut().find(|(g, _)| *g == top) {
            Some((_, n)) => *n += 1,
            None => groups.push((top, 1)),
        }
    }
    groups.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let mut text: Vec<String> = groups
        .iter()
        .take(4)
        .map(|(g, n)| format!("{}: {n}", display_name(g)))
        .collect();
    match groups.len().saturating_sub(4) {
        0 => {}
        1 => text.push("1 more entry".to_owned()),
        more => text.push(format!("{more} more entries")),
    }
    text.join(", ")
}

/// The file's plain values (hyper-parameters, epoch, step, config first),
/// a second table.
pub(crate) fn values_table(
    out: &mut impl Write,
    values: &[(&str, &Scalar)],
    columns: Option<usize>,
) -> io::Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    let all = ordered(values);
    let (shown, left) = all.split_at(all.len().min(VALUES_SHOWN));
    let width = shown
        .iter()
        .map(|(n, _)| display_name(n).chars().count())
        .max()
        .unwrap_or(0)
        .max("NAME".len());
    // Half a terminal at most for names; values take the rest.
    let width = name_budget(columns.map(|c| c / 2), 0).map_or(width, |b| width.min(b));
    let value_width = columns.map(|c| c.saturating_sub(width + 2).max(MIN_VALUE_WIDTH));
    let mut line = String::new();
    pad(&mut line, "NAME", width, false);
    writeln!(out, "{line}  VALUE")?;
    for (name, v) in shown.iter().copied() {
        let mut line = String::new();
        pad(&mut line, &shorten(display_name(name), width), width, false);
        let text = scalar_text(v);
        let text = match value_width {
            Some(w) => shorten(&text, w).into_owned(),
            None => text,
        };
        writeln!(out, "{line}  {text}")?;
    }
    if !left.is_empty() {
        let text = format!(
            "... {} more values ({}); --json lists them all, --key ENTRY lists one entry",
            left.len(),
            left_out_groups(left)
        );
        prose(out, &text, columns)?;
    }
    Ok(())
}

/// The narrowest a shortened VALUE gets, however narrow the terminal.
const MIN_VALUE_WIDTH: usize = 12;

/// The narrowest a shortened NAME column gets, however narrow the terminal.
const MIN_NAME_WIDTH: usize = 24;

/// The width the NAME column may take on a terminal `columns` wide when
/// the other columns take `others`; None (whole names) off a terminal.
fn name_budget(columns: Option<usize>, others: usize) -> Option<usize> {
    columns.map(|c| c.saturating_sub(others).max(MIN_NAME_WIDTH))
}

/// The width the table must fit: `COLUMNS` when it is set to a number
/// (also when the output is piped: the caller asked for that width), else
/// the width of the terminal standard output is, if it is one. Other
/// piped output (and `--json`) keeps whole names for the programs that
/// read it.
pub(crate) fn terminal_columns() -> Option<usize> {
    let from_env = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&c| c > 0);
    from_env.or_else(|| {
        console::Term::stdout()
            .size_checked()
            .map(|(_rows, columns)| usize::from(columns))
    })
}

/// `name` in at most `width` characters: a longer one loses its middle,
/// marked `…`, since its start (the module) and its end (the parameter)
/// are what tell names apart.
pub(crate) fn shorten(name: &str, width: usize) -> Cow<'_, str> {
    let count = name.chars().count();
    if count <= width || width < 3 {
        return Cow::Borrowed(name);
    }
    let keep = width - 1;
    let tail = keep / 2;
    let head = keep - tail;
    let start: String = name.chars().take(head).collect();
    let end: String = name.chars().skip(count - tail).collect();
    Cow::Owned(format!("{start}…{end}"))
}

/// A distributed checkpoint's layout: each key's chunks (`offsets+sizes`
/// boxes) and the files they are in, or the file of a non-tensor item.
pub(crate) fn dcp_chunks(
    out: &mut impl Write,
    dcp: &ptload_reader::dcp::Dcp,
    columns: Option<usize>,
) -> CliResult<()> {
    let files: Vec<&str> = dcp.files().collect();
    let mut cells: Vec<[String; 3]> = Vec::new();
    for t in dcp.tensors() {
        let boxes: Vec<String> = t
            .chunks()
            .iter()
            .map(|c| {
                let at: Vec<String> = c.offsets.iter().map(u64::to_string).collect();
                format!("[{}]+{}", at.join(", "), shape_text(&c.sizes))
            })
            .collect();
        let mut in_files: Vec<&str> = t
            .chunks()
            .iter()
            .filter_map(|c| files.get(c.piece.file).copied())
            .collect();
        in_files.sort_unstable();
        in_files.dedup();
        cells.push([
            display_name(t.name()).to_owned(),
            capped(&boxes, " ", "chunks"),
            capped(&in_files, ", ", "files"),
        ]);
    }
    let title = format!(
        "DCP chunks: {} tensors in {} files",
        dcp.tensors().len(),
        files.len()
    );
    prose(out, &title, columns)?;
    let header = ["NAME", "CHUNKS (OFFSETS+SIZES)", "FILES"];
    let mut widths = [0usize; 3];
    for row in std::iter::once(&header.map(str::to_owned)).chain(&cells) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    // On a terminal: names, then chunks, give up what the line lacks.
    if let Some(c) = columns {
        let [name, chunks, in_files] = &mut widths;
        *name = (*name).min(
            c.saturating_sub(*chunks + *in_files + 4)
                .max(MIN_NAME_WIDTH),
        );
        *chunks = (*chunks).min(c.saturating_sub(*name + *in_files + 4).max(16));
        *in_files = (*in_files).min(c.saturating_sub(*name + *chunks + 4).max(8));
    }
    let mut text = String::new();
    for row in std::iter::once(header.map(str::to_owned)).chain(cells) {
        for (i, (cell, &w)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let last = i + 1 == row.len();
            let cell = shorten(cell, w);
            pad(&mut text, &cell, if last { 0 } else { w }, false);
        }
        text.push('\n');
    }
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// The first few of `items` joined, and how many there are when that is
/// not all (a checkpoint saved by a thousand ranks has a thousand chunks).
fn capped<S: AsRef<str>>(items: &[S], sep: &str, what: &str) -> String {
    const SHOWN: usize = 8;
    let shown: Vec<&str> = items.iter().take(SHOWN).map(AsRef::as_ref).collect();
    let mut text = shown.join(sep);
    if items.len() > SHOWN {
        text.push_str(&format!("{sep}... ({} {what})", items.len()));
    }
    text
}

/// Append `cell` padded with spaces to `width` characters, on the left when
/// `right` aligns it right. Written out because `format!`'s width panics
/// beyond 65,535, and a name from a file can be longer.
pub(crate) fn pad(out: &mut String, cell: &str, width: usize, right: bool) {
    let fill = width.saturating_sub(cell.chars().count());
    if right {
        out.extend(std::iter::repeat_n(' ', fill));
        out.push_str(cell);
    } else {
        out.push_str(cell);
        out.extend(std::iter::repeat_n(' ', fill));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_lose_their_middle() {
        assert_eq!(
            shorten("encoder.layers.0.weight", 40),
            "encoder.layers.0.weight"
        );
        let name =
            "callbacks.ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}.best_model_score";
        let short = shorten(name, 30);
        assert_eq!(short.chars().count(), 30);
        assert!(
            short.starts_with("callbacks.Model") && short.ends_with("model_score"),
            "{short}"
        );
        assert_eq!(shorten("naïve.ünïcode.weight", 9), "naïv…ight");
        assert_eq!(name_budget(None, 50), None);
        assert_eq!(name_budget(Some(80), 50), Some(30));
        assert_eq!(name_budget(Some(60), 50), Some(MIN_NAME_WIDTH));
    }

    #[test]
    fn prose_wraps_to_the_width_and_long_words_lose_their_middle() {
        let text = "globals outside the allowlist: argparse.Namespace, numpy.dtype, \
                    a.very.long.module.path.that.does.not.fit.on.one.line.of.forty.Class";
        let lines = wrap(text, Some(40));
        assert!(lines.len() > 2, "{lines:?}");
        assert!(lines.iter().all(|l| l.chars().count() <= 40), "{lines:?}");
        assert!(
            lines.iter().skip(1).all(|l| l.starts_with("  ")),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l.contains('…')), "{lines:?}");
        assert_eq!(wrap(text, None), [text]);
        // A word as long as a line, after the first: still within the width.
        let long = format!("{} {}", "a".repeat(39), "b".repeat(60));
        assert!(
            wrap(&long, Some(40))
                .iter()
                .all(|l| l.chars().count() <= 40),
            "{:?}",
            wrap(&long, Some(40))
        );
        assert_eq!(wrap("short", Some(80)), ["short"]);
    }

    #[test]
    fn values_people_look_for_come_first() {
        let v = Scalar::Int(1);
        let values = [
            ("loops.fit_loop.total", &v),
            ("optimizer.param_groups.0.lr", &v),
            ("note", &v),
            ("hyper_parameters.lr", &v),
            ("epoch", &v),
            ("hyper_parameters.data.path", &v),
        ];
        let names: Vec<&str> = ordered(&values).iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "hyper_parameters.lr",
                "hyper_parameters.data.path",
                "epoch",
                "note",
                "loops.fit_loop.total",
                "optimizer.param_groups.0.lr",
            ]
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(500 << 20), "500.0 MiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
    }
}
