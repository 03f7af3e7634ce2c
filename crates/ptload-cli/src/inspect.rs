//! `ptload inspect`: the table and the JSON document.

use std::io::{self, Write};

use ptload_reader::placement::Plan;
use ptload_reader::{Checkpoint, Quantization, Scalar, TensorView};
use serde::Serialize;

use crate::args::{CliResult, GpuInfo, MapArgs, StateDictArgs};

/// One tensor as a command shows it: its (possibly renamed) name, the
/// tensor, and where the plan puts it.
pub(crate) struct Row<'a> {
    pub(crate) name: String,
    pub(crate) view: TensorView<'a>,
    pub(crate) target: String,
}

/// The selected tensors with their names and targets. Without mapping
/// options the target is the saved location, as saved.
pub(crate) fn rows<'a>(
    ckpt: &'a Checkpoint,
    map: &MapArgs,
    state: &StateDictArgs,
    gpus: &dyn GpuInfo,
) -> CliResult<Vec<Row<'a>>> {
    let plan = if map.is_set() {
        let mut mapper = map.mapper(ckpt, gpus)?;
        Some(Plan::new(ckpt, mapper.as_mut())?)
    } else {
        None
    };
    let selected = state.options(true)?.select(ckpt)?;
    crate::args::tell_decisions(selected.decisions());
    let mut rows = Vec::with_capacity(selected.len());
    for (name, view) in selected.tensors() {
        let target = match &plan {
            Some(p) => p.tensor_target(view.info()).to_string(),
            None => view.location().to_owned(),
        };
        rows.push(Row {
            name: name.to_owned(),
            view,
            target,
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

pub(crate) fn sha256(view: &TensorView<'_>) -> Result<String, ptload_reader::Error> {
    let mut h = Sha256::new();
    view.visit_bytes(|chunk| h.update(chunk))?;
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
    quantization: Option<QuantJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<Option<String>>,
}

/// What makes a quantized tensor's integers meaningful.
#[derive(Serialize)]
#[serde(untagged)]
enum QuantJson {
    PerTensor {
        kind: &'static str,
        scheme: String,
        scale: f64,
        zero_point: i64,
        /// Packed kinds: the shape of the values (the tensor is their bytes).
        #[serde(skip_serializing_if = "Option::is_none")]
        values_shape: Option<Vec<u64>>,
    },
    PerChannel {
        kind: &'static str,
        scheme: String,
        axis: i64,
        /// The tensors holding them.
        scales: String,
        zero_points: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        values_shape: Option<Vec<u64>>,
    },
}

impl QuantJson {
    fn of(name: &str, q: &Quantization) -> Option<QuantJson> {
        Some(match q {
            Quantization::PerTensor {
                kind,
                scheme,
                scale,
                zero_point,
                values_shape,
            } => QuantJson::PerTensor {
                kind,
                scheme: scheme.clone(),
                scale: *scale,
                zero_point: *zero_point,
                values_shape: values_shape.clone(),
            },
            Quantization::PerChannel {
                kind,
                scheme,
                axis,
                values_shape,
            } => QuantJson::PerChannel {
                kind,
                scheme: scheme.clone(),
                axis: *axis,
                scales: format!("{name}.scales"),
                zero_points: format!("{name}.zero_points"),
                values_shape: values_shape.clone(),
            },
            _ => return None,
        })
    }
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
    suspicious: Vec<String>,
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
    fn of(ckpt: &Checkpoint, rows: &[Row<'_>]) -> Totals {
        let mut storages: Vec<usize> = rows.iter().filter_map(|r| r.view.info().storage).collect();
        storages.sort_unstable();
        storages.dedup();
        Totals {
            tensors: rows.len(),
            storages: storages.len(),
            bytes: rows.iter().map(|r| r.view.info().nbytes).sum(),
            stored_bytes: storages
                .iter()
                .filter_map(|&i| ckpt.storages().get(i))
                .map(|s| s.nbytes)
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
    hash: bool,
    /// Drawn while hashing.
    bar: Option<indicatif::ProgressBar>,
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
            seq.serialize_element(&tensor_json(row, self.hash).map_err(S::Error::custom)?)?;
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

fn tensor_json<'r>(row: &'r Row<'_>, hash: bool) -> Result<TensorJson<'r>, ptload_reader::Error> {
    let t = &row.view;
    let sha256 = match (hash, t.storage().is_some()) {
        (false, _) => None,
        (true, false) => Some(None),
        (true, true) => Some(Some(sha256(t)?)),
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
            .and_then(|q| QuantJson::of(&row.name, q)),
        sha256,
    })
}

pub(crate) fn json(
    out: &mut impl Write,
    ckpt: &Checkpoint,
    rows: &[Row<'_>],
    file: &str,
    hash: bool,
) -> CliResult<()> {
    let doc = InspectJson {
        file,
        format: ckpt.format().name(),
        byteorder: ckpt.byte_order().name(),
        pickle_protocol: ckpt.pickle_protocol(),
        tensors: Tensors {
            rows,
            hash,
            bar: hash_bar(rows, hash),
        },
        totals: Totals::of(ckpt, rows),
        values: ckpt
            .values()
            .iter()
            .map(|(name, v)| value_json(name, v))
            .collect(),
        globals: distinct_globals(ckpt.globals().iter().map(|g| g.path())),
        suspicious: distinct_globals(ckpt.suspicious().map(|g| g.path())),
    };
    serde_json::to_writer(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

pub(crate) fn table(
    out: &mut impl Write,
    ckpt: &Checkpoint,
    rows: &[Row<'_>],
    label: &str,
    hash: bool,
) -> CliResult<()> {
    // A TARGET column only when a mapping moves something.
    let mapped = rows.iter().any(|r| r.target != r.view.location());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let t = &r.view;
            let mut row = vec![
                display_name(&r.name).to_owned(),
                t.dtype().name().to_owned(),
                shape_text(t.shape()),
                t.location().to_owned(),
            ];
            if mapped {
                row.push(r.target.clone());
            }
            row.push(human_size(t.info().nbytes));
            row
        })
        .collect();
    let mut header = vec!["NAME", "DTYPE", "SHAPE", "LOCATION"];
    if mapped {
        header.push("TARGET");
    }
    header.push("SIZE");
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    writeln!(
        out,
        "{label}: {} checkpoint, {}-endian, pickle protocol {}",
        ckpt.format().name(),
        ckpt.byte_order().name(),
        ckpt.pickle_protocol()
    )?;
    let line = |out: &mut dyn Write, cells: &[&str]| -> io::Result<()> {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, (cell, &w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                pad(&mut text, cell, w, true);
            } else {
                pad(&mut text, cell, w, false);
                text.push_str("  ");
            }
        }
        writeln!(out, "{text}")
    };
    line(out, &header)?;
    let bar = hash_bar(rows, hash);
    for (row, r) in cells.iter().zip(rows) {
        let refs: Vec<&str> = row.iter().map(String::as_str).collect();
        line(out, &refs)?;
        if hash && r.view.storage().is_some() {
            writeln!(out, "    sha256 {}", sha256(&r.view)?)?;
        }
        if let Some(bar) = &bar {
            bar.inc(r.view.info().nbytes);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let totals = Totals::of(ckpt, rows);
    writeln!(
        out,
        "{} tensors, {} storages, {} of tensor data ({} stored)",
        totals.tensors,
        totals.storages,
        human_size(totals.bytes),
        human_size(totals.stored_bytes)
    )?;
    values_table(out, ckpt)?;
    let suspicious = distinct_globals(ckpt.suspicious().map(|g| g.path()));
    if !suspicious.is_empty() {
        writeln!(
            out,
            "globals outside torch's weights_only allowlist (read, never run): {}",
            suspicious.join(", ")
        )?;
    }
    for w in ckpt.warnings() {
        writeln!(out, "warning: {w}")?;
    }
    Ok(())
}

/// Plain values shown at most; `--json` lists them all.
const VALUES_SHOWN: usize = 40;

/// The file's plain values (epoch, step, args, config), a second table.
fn values_table(out: &mut impl Write, ckpt: &Checkpoint) -> io::Result<()> {
    let values = ckpt.values();
    if values.is_empty() {
        return Ok(());
    }
    let shown = values
        .get(..values.len().min(VALUES_SHOWN))
        .unwrap_or_default();
    let width = shown
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0)
        .max("NAME".len());
    let mut line = String::new();
    pad(&mut line, "NAME", width, false);
    writeln!(out, "{line}  VALUE")?;
    for (name, v) in shown {
        let mut line = String::new();
        pad(&mut line, display_name(name), width, false);
        writeln!(out, "{line}  {}", scalar_text(v))?;
    }
    if values.len() > shown.len() {
        writeln!(
            out,
            "... {} more values (--json lists them all)",
            values.len() - shown.len()
        )?;
    }
    Ok(())
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
    fn sizes() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(500 << 20), "500.0 MiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
    }
}
