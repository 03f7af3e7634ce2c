//! `convert`, `scan` and `diff`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use ptload_reader::export::{Metadata, SafetensorsOptions};
use ptload_reader::state_dict::{Selected, StateDictOptions};
use ptload_reader::{scan, Checkpoint, DType, ErrorKind, Limits, OpenOptions};
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

pub(crate) fn convert(
    out: &mut impl Write,
    ckpt: &Checkpoint,
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
    let selection = state.select(ckpt)?;
    crate::args::tell_decisions(selection.decisions());
    let total: u64 = selection.tensors().map(|(_, t)| t.info().nbytes).sum();
    let bar = crate::loadcmd::progress_bar(total);
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
    let result = if to_stdout {
        let mut stdout = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
        let written =
            ptload_reader::export::write_safetensors(ckpt, &selection, &opts, &mut stdout);
        stdout.flush()?;
        written
    } else {
        ptload_reader::export::write_safetensors_file(ckpt, &selection, &opts, output)
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let written = match result {
        Ok(w) => w,
        Err(e) if e.kind() == ErrorKind::OutputExists => {
            return Err(format!("{e} (pass --force to replace it)").into())
        }
        Err(e) => return Err(e.into()),
    };
    for s in &written.skipped {
        eprintln!("ptload: warning: skipped {s}");
    }
    if request.json {
        #[derive(Serialize)]
        struct ConvertOut<'a> {
            output: String,
            tensors: usize,
            bytes: u64,
            metadata: usize,
            skipped: &'a [String],
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
                decisions: crate::args::cli_decisions(selection.decisions()),
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

// ---- scan -------------------------------------------------------------

#[derive(Serialize)]
struct GlobalOut {
    global: String,
    #[serde(rename = "use")]
    usage: &'static str,
    class: String,
    /// The pickle it is in (a zip entry, a stream pickle, a nested pickle).
    pickle: String,
    /// Whether torch.load would unpickle that pickle.
    reachable: bool,
    offset: u64,
    finding: bool,
}

#[derive(Serialize)]
struct PickleOut {
    pickle: String,
    reachable: bool,
    complete: bool,
    error: Option<String>,
}

#[derive(Serialize)]
struct FileScan {
    file: String,
    layout: Option<&'static str>,
    verdict: &'static str,
    globals: Vec<GlobalOut>,
    pickles: Vec<PickleOut>,
    notes: Vec<String>,
    error: Option<String>,
}

/// Scan one file as torch.load would read it.
fn scan_file(path: &Path, in_memory: bool) -> FileScan {
    let file = path.display().to_string();
    let report = match scan::scan_file(path, &Limits::default(), in_memory) {
        Ok(r) => r,
        Err(e) => {
            return FileScan {
                file,
                layout: None,
                verdict: "unreadable",
                globals: Vec::new(),
                pickles: Vec::new(),
                notes: Vec::new(),
                error: Some(e.to_string()),
            };
        }
    };
    let verdict = report.verdict();
    // An unreadable file: say what it is, as opening it would.
    let error = (verdict == scan::Verdict::Unreadable).then(|| {
        OpenOptions::new()
            .in_memory(in_memory)
            .open(path)
            .err()
            .map(|e| e.to_string())
            .or_else(|| report.pickles.iter().find_map(|p| p.error.clone()))
            .unwrap_or_else(|| "no pickle torch could read".into())
    });
    let mut globals = Vec::new();
    for p in &report.pickles {
        for g in &p.globals {
            globals.push(GlobalOut {
                global: g.path(),
                usage: g.usage.name(),
                class: g.class.label(),
                pickle: p.source.to_string(),
                reachable: p.reachable,
                offset: g.offset,
                finding: g.is_finding(),
            });
        }
    }
    FileScan {
        file,
        layout: Some(report.layout),
        verdict: verdict.name(),
        globals,
        pickles: report
            .pickles
            .iter()
            .map(|p| PickleOut {
                pickle: p.source.to_string(),
                reachable: p.reachable,
                complete: p.complete,
                error: p.error.clone(),
            })
            .collect(),
        notes: report.notes,
        error,
    }
}

/// Exit code of `scan`: 1 if any file has a finding (even next to an
/// unreadable one: a gate must not read "error" as "not flagged"), else 2
/// if any file is unreadable, else 0.
fn scan_exit(scans: &[FileScan]) -> Verdict {
    if scans
        .iter()
        .any(|s| matches!(s.verdict, "dangerous" | "unknown callable"))
    {
        1
    } else if scans.iter().any(|s| s.verdict == "unreadable") {
        2
    } else {
        0
    }
}

pub(crate) fn scan(
    out: &mut impl Write,
    files: &[PathBuf],
    in_memory: bool,
    json: bool,
) -> CliResult<Verdict> {
    let scans: Vec<FileScan> = files.iter().map(|f| scan_file(f, in_memory)).collect();
    let verdict = scan_exit(&scans);
    if json {
        #[derive(Serialize)]
        struct ScanOut<'a> {
            files: &'a [FileScan],
        }
        serde_json::to_writer(&mut *out, &ScanOut { files: &scans })?;
        writeln!(out)?;
        return Ok(verdict);
    }
    for s in &scans {
        if let Some(e) = &s.error {
            eprintln!("ptload: {}: cannot be read: {e}", s.file);
            continue;
        }
        let reachable = s.pickles.iter().filter(|p| p.reachable).count();
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        writeln!(
            out,
            "{}: {} ({}, {} in {}, {reachable} read by torch.load)",
            s.file,
            s.verdict.to_uppercase(),
            s.layout.unwrap_or("?"),
            plural(s.globals.len(), "global"),
            plural(s.pickles.len(), "pickle"),
        )?;
        let width = s.globals.iter().map(|g| g.global.chars().count()).max();
        for g in &s.globals {
            let mut line = String::from(if g.finding { "! " } else { "  " });
            crate::inspect::pad(&mut line, &g.global, width.unwrap_or(0), false);
            line.push_str("  ");
            crate::inspect::pad(&mut line, g.usage, 12, false);
            line.push_str("  ");
            crate::inspect::pad(&mut line, &g.class, 32, false);
            let unreached = if g.reachable {
                ""
            } else {
                " (not read by torch.load)"
            };
            writeln!(out, "{line}  {} +{:#x}{unreached}", g.pickle, g.offset)?;
        }
        for p in &s.pickles {
            if let Some(e) = &p.error {
                writeln!(out, "  {}: stopped: {e}", p.pickle)?;
            }
        }
        for n in &s.notes {
            writeln!(out, "  note: {n}")?;
        }
    }
    Ok(verdict)
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

fn compare(
    a: &Checkpoint,
    sa: &Selected,
    b: &Checkpoint,
    sb: &Selected,
) -> CliResult<Option<Difference>> {
    let (ta, tb) = match (a.tensor_at(sa.index), b.tensor_at(sb.index)) {
        (Some(x), Some(y)) => (x, y),
        _ => return Ok(None),
    };
    let name = sa.name.clone();
    if ta.dtype() != tb.dtype() {
        return Ok(Some(Difference {
            name,
            what: format!("dtype {} vs {}", ta.dtype(), tb.dtype()),
            max_abs_diff: None,
        }));
    }
    if ta.shape() != tb.shape() {
        return Ok(Some(Difference {
            name,
            what: format!("shape {:?} vs {:?}", ta.shape(), tb.shape()),
            max_abs_diff: None,
        }));
    }
    let (da, db) = match (ta.data(), tb.data()) {
        (Ok(x), Ok(y)) => (x, y),
        // Meta tensors: equal when dtype and shape are.
        (Err(_), Err(_)) => return Ok(None),
        _ => {
            return Ok(Some(Difference {
                name,
                what: "one side has no data (meta)".into(),
                max_abs_diff: None,
            }))
        }
    };
    if da == db {
        return Ok(None);
    }
    // NaN anywhere makes the largest difference NaN.
    let max = match (as_f64(&da, ta.dtype()), as_f64(&db, tb.dtype())) {
        (Some(x), Some(y)) => Some(x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(
            0.0f64,
            |m, d| {
                if m.is_nan() || d.is_nan() {
                    f64::NAN
                } else {
                    m.max(d)
                }
            },
        )),
        _ => None,
    };
    Ok(Some(Difference {
        name,
        what: "bytes differ".into(),
        max_abs_diff: max,
    }))
}

pub(crate) fn diff(
    out: &mut impl Write,
    a: &Checkpoint,
    b: &Checkpoint,
    state: &StateDictOptions,
    json: bool,
) -> CliResult<Verdict> {
    let sel_a = state.select(a)?;
    let sel_b = state.select(b)?;
    let mut result = DiffOut::default();
    for sa in &sel_a {
        match sel_b.selected(&sa.name) {
            None => result.only_in_a.push(sa.name.clone()),
            Some(sb) => match compare(a, sa, b, sb)? {
                Some(d) => result.different.push(d),
                None => result.equal += 1,
            },
        }
    }
    result.only_in_b = sel_b
        .iter()
        .filter(|s| !sel_a.contains(&s.name))
        .map(|s| s.name.clone())
        .collect();
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
