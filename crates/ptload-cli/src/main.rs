//! `ptload`: inspect PyTorch checkpoints without Python.
//!
//! Exit codes: 0 success (or nothing found), 1 findings or differences
//! (scan, diff), 2 error (one line on stderr). A closed pipe on stdout ends
//! quietly.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod alloc;
mod args;
mod cmd;
mod remote;
mod render;
mod stream;
mod terms;
mod ui;

use args::CliResult;
use cmd::{convert, diff, inspect as inspect_cmd, load, plan, scan};

#[derive(Parser)]
#[command(
    name = "ptload",
    version,
    about = "Read PyTorch checkpoints without Python, libtorch, or running the pickle",
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Say nothing on stderr but errors and warnings: no progress bars, no notes on what
    /// the automatic options decided.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// No progress bars (they are drawn only on a terminal, for work of 256 MiB or more).
    #[arg(long = "no-progress", global = true)]
    no_progress: bool,
}

// Each command's arguments are built only when it runs (or its help is
// asked for): building all of them took a tenth of a small `inspect`.
// Built after the command's about, an `Args` struct's doc comment would
// replace it, so those structs carry plain comments.
#[derive(Subcommand)]
#[command(defer = true)]
enum Command {
    /// List the tensors of a checkpoint: name, dtype, shape, location, size.
    Inspect(Box<inspect_cmd::InspectArgs>),
    /// Load the storages where the mapping says: CUDA devices, with host fallback per tensor.
    Load(Box<load::LoadArgs>),
    /// Write the state dict as a safetensors file, streamed from the file.
    Convert(Box<convert::ConvertArgs>),
    /// List every global the pickles torch.load would run reference, with its level; exit 1 at --fail-on or above.
    Scan(scan::ScanArgs),
    /// Compare two checkpoints tensor by tensor; exit 1 if they differ.
    Diff(Box<diff::DiffArgs>),
    /// Plan which bytes each rank of a tensor-parallel job reads (JSON): its slices, or a share of a read-once pass.
    Plan(Box<plan::PlanArgs>),
    /// Inspect and load the embedded demo checkpoint (--map-location auto).
    Demo,
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell.
    Completions {
        /// The shell (e.g. `ptload completions bash > /etc/bash_completion.d/ptload`).
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff): `ptload man > ptload.1`, `ptload man inspect > ptload-inspect.1`.
    Man {
        /// A command's own page (its options); the overview without one.
        command: Option<String>,
    },
}

fn run(cli: Cli) -> CliResult<u8> {
    ui::configure(cli.quiet, cli.no_progress);
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let code = match cli.command {
        Command::Inspect(a) => inspect_cmd::run(&a, &mut out)?,
        Command::Load(a) => load::run(&a, &mut out)?,
        Command::Convert(a) => convert::run(&a, &mut out)?,
        Command::Scan(a) => scan::run(&a, &mut out)?,
        Command::Diff(a) => diff::run(&a, &mut out)?,
        Command::Plan(a) => plan::run(&a, &mut out)?,
        Command::Demo => cmd::demo::run(&mut out)?,
        Command::Completions { shell } => cmd::completions::run(shell, &mut out)?,
        Command::Man { command } => cmd::man::run(command.as_deref(), &mut out)?,
    };
    out.flush()?;
    Ok(code)
}

fn main() -> ExitCode {
    alloc::arenas_at_full_size();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print on stdout and succeed; a bare
        // `ptload` prints the command list; usage errors are the parser's
        // own (the mistake, a usage line, a hint), exit 2.
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if io.kind() == io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("ptload: {}", terms::error_text(&*e));
            if cancelled(&*e) {
                return ExitCode::from(130);
            }
            ExitCode::from(2)
        }
    }
}

/// Whether `e` reports a cancelled operation (exit 130, as a signal).
fn cancelled(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<ptload_reader::Error>()
        .is_some_and(|e| e.kind() == ptload_reader::ErrorKind::Cancelled)
}
