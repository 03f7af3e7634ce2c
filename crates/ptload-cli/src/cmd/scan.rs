//! `ptload scan`: what `torch.load` would run, file by file (the work is
//! `scancmd`'s).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use crate::args::CliResult;
use crate::scancmd;

#[derive(Args)]
pub(crate) struct ScanArgs {
    /// Checkpoints to scan (a directory: every checkpoint, pickle or archive in it, recursively;
    /// an http(s)://, s3://, gs:// or az:// URL: only its directory and pickles are fetched).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output format: text, json, or sarif (SARIF 2.1.0, one result per finding).
    #[arg(long, value_enum, default_value = "text")]
    format: scancmd::ScanFormat,
    /// Print JSON (as --format json).
    #[arg(long, conflicts_with = "format")]
    json: bool,
    /// Exit 1 when a file reaches this level or above: needs-code, unknown-call, ambiguous,
    /// dangerous.
    #[arg(long = "fail-on", value_name = "LEVEL", default_value = "unknown-call", value_parser = scancmd::parse_level)]
    fail_on: ptload_reader::scan::Level,
    /// Read each file into memory instead of mapping it.
    #[arg(long = "no-mmap")]
    no_mmap: bool,
    /// Read each file by positioned reads (pread), only the parts scanned, instead of
    /// mapping it: for network file systems.
    #[arg(long, conflicts_with = "no_mmap")]
    pread: bool,
}

/// Scan the files; the exit code is the verdict (`--fail-on`).
pub(crate) fn run(a: &ScanArgs, out: &mut impl Write) -> CliResult<u8> {
    let files = scancmd::files_to_scan(&a.files)?;
    let request = scancmd::ScanRequest {
        format: if a.json {
            scancmd::ScanFormat::Json
        } else {
            a.format
        },
        fail_on: a.fail_on,
        in_memory: a.no_mmap,
        positioned: a.pread,
    };
    let verdict = scancmd::run(out, &files, &request)?;
    out.flush()?;
    Ok(verdict)
}
