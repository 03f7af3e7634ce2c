//! `ptload inspect`: list the tensors of checkpoints.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use ptload_reader::checkpoint::Scalar;
use ptload_reader::set::CheckpointSet;

use super::MachineGpus;
use crate::args::{self, CliResult, MapArgs, OpenArgs, StateDictArgs};
use crate::render;

#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("all, the file as saved"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("none")))
)]
pub(crate) struct InspectArgs {
    /// Checkpoints (.pt, .pth, .bin, .ckpt: the layout is detected from the content; objects
    /// saved one after another are shown in turn), safetensors files, or http(s)://, s3://,
    /// gs://, az:// URLs read by ranged requests (the directory and pickles; tensors when read).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print JSON instead of a table (one document per line, one line per file).
    #[arg(long)]
    json: bool,
    /// Add the sha256 of each tensor's elements (row-major, little-endian).
    #[arg(long)]
    hash: bool,
    #[command(flatten)]
    open: OpenArgs,
    #[command(flatten)]
    map: MapArgs,
    #[command(flatten)]
    state: StateDictArgs,
}

/// Each file in turn; with several, a file that fails is reported and
/// the others still listed (exit 2 at the end).
pub(crate) fn run(a: &InspectArgs, out: &mut impl Write) -> CliResult<u8> {
    let several = a.files.len() > 1;
    let mut failed = false;
    for (i, file) in a.files.iter().enumerate() {
        let label = file.display().to_string();
        if several && !a.json && i > 0 {
            writeln!(out)?;
        }
        match one(a, file, &label, out) {
            Ok(()) => {}
            // One file: its error is the command's.
            Err(e) if !several => return Err(e),
            Err(e) => {
                if let Some(io) = e.downcast_ref::<io::Error>() {
                    if io.kind() == io::ErrorKind::BrokenPipe {
                        return Err(e);
                    }
                }
                out.flush()?;
                eprintln!("ptload: {label}: {}", crate::terms::error_text(&*e));
                failed = true;
            }
        }
    }
    if failed {
        out.flush()?;
        return Ok(2);
    }
    Ok(0)
}

fn one(a: &InspectArgs, file: &Path, label: &str, out: &mut impl Write) -> CliResult<()> {
    let columns = render::terminal_columns();
    // Scanned while decoded: the findings inspect prints cost the longer
    // of the two passes, not their sum.
    let opts = a.open.options().scan(true);
    let set = a.open.open_set(file, &opts)?;
    // Objects saved one after another on one stream: each in turn.
    let stream = crate::stream::after_first(file, &set, &opts);
    if a.json {
        let mut more = Vec::with_capacity(stream.objects.len());
        for (i, (offset, later)) in stream.objects.iter().enumerate() {
            let mut doc = Vec::new();
            let at = render::InStream {
                object: Some(render::ObjectAt {
                    index: i + 1,
                    offset: *offset,
                }),
                no_fetched: true,
                ..Default::default()
            };
            match show(a, later, label, &mut doc, &at, columns) {
                Ok(()) => more.push(serde_json::from_slice(&doc)?),
                Err(e) => later_failed(label, i, *offset, &*e),
            }
        }
        let at = render::InStream {
            object: (!more.is_empty() || stream.trailing.is_some()).then_some(render::ObjectAt {
                index: 0,
                offset: 0,
            }),
            more_objects: &more,
            trailing: stream.trailing.as_ref(),
            no_fetched: false,
        };
        show(a, &set, label, out, &at, columns)?;
    } else {
        show(a, &set, label, out, &render::InStream::default(), columns)?;
        for (i, (offset, later)) in stream.objects.iter().enumerate() {
            let title = format!("{label}, object {} (at byte {offset})", i + 2);
            let mut table = Vec::new();
            let shown = show(
                a,
                later,
                &title,
                &mut table,
                &render::InStream::default(),
                columns,
            );
            match shown {
                Ok(()) => {
                    writeln!(out)?;
                    out.write_all(&table)?;
                }
                Err(e) => {
                    out.flush()?;
                    later_failed(label, i, *offset, &*e);
                }
            }
        }
        if let Some(t) = &stream.trailing {
            for line in render::wrap(
                &format!(
                    "warning: {} bytes after the last object (at byte {}) are not another \
                     object: {}",
                    t.bytes, t.offset, t.error
                ),
                columns,
            ) {
                writeln!(out, "{line}")?;
            }
        }
    }
    if !a.json && ptload_reader::dcp::is_dcp_dir(file) {
        let dcp = ptload_reader::dcp::Dcp::open_with(file, &opts)?;
        render::dcp_chunks(out, &dcp, columns)?;
    }
    out.flush()?;
    // The process ends soon: the OS reclaims the checkpoints' memory
    // faster than freeing it piece by piece.
    std::mem::forget(stream);
    std::mem::forget(set);
    Ok(())
}

/// A later object of a stream that could not be shown (its selection
/// failed): said on stderr; the first object is the command's.
fn later_failed(label: &str, i: usize, offset: u64, e: &(dyn std::error::Error + 'static)) {
    eprintln!(
        "ptload: {label}, object {} (at byte {offset}): {}",
        i + 2,
        crate::terms::error_text(e)
    );
}

/// One object: the tensors the options select and the file's plain
/// values, or, when `--key` names a subtree of plain values only, those
/// values.
fn show(
    a: &InspectArgs,
    set: &CheckpointSet,
    label: &str,
    mut out: &mut dyn Write,
    stream: &render::InStream<'_>,
    columns: Option<usize>,
) -> CliResult<()> {
    if let Some(key) = values_only_key(a.state.key.as_deref(), set) {
        let values = values_under(set, &key);
        if a.json {
            return render::json(&mut out, set, &[], &values, label, a.hash, stream);
        }
        return render::values_view(&mut out, set, &key, &values, label, columns);
    }
    let sd = a.state.options(true)?.select_set(set)?;
    let rows = render::rows(&sd, &a.map, &MachineGpus)?;
    let values = render::file_values(set);
    // Hashing a file read by ranges reads every storage: they are fetched
    // ahead of the hashing, several requests in flight.
    if a.hash {
        sd.while_reading_ahead(|| print(a, set, &rows, &values, label, out, stream, columns))?;
    } else {
        print(a, set, &rows, &values, label, out, stream, columns)?;
    }
    std::mem::forget(rows);
    std::mem::forget(sd);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn print(
    a: &InspectArgs,
    set: &CheckpointSet,
    rows: &[render::Row<'_>],
    values: &[(&str, &Scalar)],
    label: &str,
    mut out: &mut dyn Write,
    stream: &render::InStream<'_>,
    columns: Option<usize>,
) -> CliResult<()> {
    if a.json {
        render::json(&mut out, set, rows, values, label, a.hash, stream)
    } else {
        render::table(&mut out, set, rows, values, label, a.hash, columns)
    }
}

/// The dotted path `--key` names when no tensor lies under it in any
/// file of `set` but plain values do (Lightning's `hyper_parameters`).
fn values_only_key(key: Option<&str>, set: &CheckpointSet) -> Option<String> {
    let key = key?.trim_end_matches('.');
    if matches!(key, "" | "auto" | "all") {
        return None;
    }
    let files = || set.files().iter().map(|f| f.checkpoint());
    let tensors = files().any(|c| c.tensors().any(|t| under(t.name(), key).is_some()));
    let values = files().any(|c| c.values().iter().any(|(n, _)| under(n, key).is_some()));
    (!tensors && values).then(|| key.to_owned())
}

/// The plain values under `key`, named below it (a value that is the key
/// itself keeps its whole name).
fn values_under<'s>(set: &'s CheckpointSet, key: &str) -> Vec<(&'s str, &'s Scalar)> {
    set.files()
        .iter()
        .flat_map(|f| f.checkpoint().values())
        .filter_map(|(n, v)| match under(n, key)? {
            "" => Some((n.as_str(), v)),
            rest => Some((rest, v)),
        })
        .collect()
}

/// `name` below `key`: empty when it is the key, `None` when it is not
/// under it.
fn under<'n>(name: &'n str, key: &str) -> Option<&'n str> {
    match name.strip_prefix(key)? {
        "" => Some(""),
        rest => rest.strip_prefix('.'),
    }
}
