//! `ptload inspect`: list the tensors of checkpoints.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use super::MachineGpus;
use crate::args::{self, CliResult, MapArgs, OpenArgs, StateDictArgs};
use crate::inspect;

#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("all, the file as saved"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("none")))
)]
pub(crate) struct InspectArgs {
    /// Checkpoints (.pt, .pth, .bin, .ckpt: the layout is detected from the content), or
    /// http(s)://, s3://, gs://, az:// URLs read by ranged requests (the directory and pickles;
    /// tensors when read).
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
    let set = crate::remote::open_set(file, &a.open.options())?;
    let sd = a.state.options(true)?.select_set(&set)?;
    let rows = inspect::rows(&sd, &a.map, &MachineGpus)?;
    let print = |mut out: &mut dyn Write| -> CliResult<()> {
        if a.json {
            inspect::json(&mut out, &set, &rows, label, a.hash)?;
        } else {
            let columns = inspect::terminal_columns();
            inspect::table(&mut out, &set, &rows, label, a.hash, columns)?;
        }
        Ok(())
    };
    // Hashing a file read by ranges reads every storage: they are fetched
    // ahead of the hashing, several requests in flight.
    if a.hash {
        crate::remote::reading_ahead(&sd, || print(out))?;
    } else {
        print(out)?;
    }
    if !a.json && ptload_reader::dcp::is_dcp_dir(file) {
        let dcp = ptload_reader::dcp::Dcp::open_with(file, &a.open.options())?;
        inspect::dcp_chunks(out, &dcp)?;
    }
    out.flush()?;
    // The process ends soon: the OS reclaims the checkpoint's memory
    // faster than freeing it piece by piece.
    std::mem::forget(rows);
    std::mem::forget(sd);
    std::mem::forget(set);
    Ok(())
}
