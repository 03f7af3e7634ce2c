//! `ptload`: inspect PyTorch checkpoints without Python.
//!
//! Exit codes: 0 success, 2 error (one line on stderr). A closed pipe on
//! stdout ends quietly.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ptload_reader::{Checkpoint, OpenOptions, Policy, StringEncoding};

mod inspect;

/// Opening a checkpoint makes many small allocations; mimalloc serves them
/// faster than the system allocator and touches fewer fresh pages.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The checkpoint `ptload demo` runs on: a training checkpoint written by
/// torch 2.15 (model and optimizer state, argparse args, a numpy scalar).
const DEMO_CHECKPOINT: &[u8] = include_bytes!("../../../fixtures/files/training.ckpt");

#[derive(Parser)]
#[command(
    name = "ptload",
    version,
    about = "Read PyTorch checkpoints without Python, libtorch, or running the pickle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the tensors of a checkpoint: name, dtype, shape, location, size.
    Inspect(InspectArgs),
    /// Inspect the embedded demo checkpoint.
    Demo,
}

#[derive(Args)]
struct InspectArgs {
    /// The checkpoint (.pt, .pth, .bin, .ckpt: the layout is detected from the content).
    file: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Add the sha256 of each tensor's elements (row-major, little-endian).
    #[arg(long)]
    hash: bool,
    #[command(flatten)]
    open: OpenArgs,
}

/// Options shared by every command that opens a checkpoint.
#[derive(Args)]
struct OpenArgs {
    /// Refuse globals outside torch's weights_only allowlist, as torch.load(weights_only=True).
    #[arg(long)]
    strict: bool,
    /// Allow a global under --strict (module.name), like torch.serialization.add_safe_globals.
    #[arg(long = "allow-global", value_name = "MODULE.NAME")]
    allow_global: Vec<String>,
    /// How Python 2 strings in old checkpoints decode (torch.load's `encoding`).
    #[arg(long, value_enum, default_value = "utf8")]
    encoding: Encoding,
}

#[derive(Clone, Copy, ValueEnum)]
enum Encoding {
    Utf8,
    Latin1,
    Bytes,
}

impl OpenArgs {
    fn options(&self) -> OpenOptions {
        let mut opts = OpenOptions::new()
            .policy(if self.strict {
                Policy::Strict
            } else {
                Policy::Default
            })
            .encoding(match self.encoding {
                Encoding::Utf8 => StringEncoding::Utf8,
                Encoding::Latin1 => StringEncoding::Latin1,
                Encoding::Bytes => StringEncoding::Bytes,
            });
        for g in &self.allow_global {
            opts = opts.allow_global(g.clone());
        }
        opts
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    match cli.command {
        Command::Inspect(args) => {
            let ckpt = args.open.options().open(&args.file)?;
            if args.json {
                inspect::json(&mut out, &ckpt, args.hash)?;
            } else {
                inspect::table(&mut out, &ckpt, &args.file.display().to_string(), args.hash)?;
            }
            out.flush()?;
            // The process ends right after: the OS reclaims the checkpoint's
            // memory faster than freeing it piece by piece.
            std::mem::forget(ckpt);
        }
        Command::Demo => demo(&mut out)?,
    }
    out.flush()?;
    Ok(())
}

fn demo(out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    writeln!(
        out,
        "ptload demo: a training checkpoint written by torch 2.15 ({} bytes, embedded in the binary),\n\
         read without Python or libtorch and without executing its pickle.\n",
        DEMO_CHECKPOINT.len()
    )?;
    let ckpt = Checkpoint::from_bytes(DEMO_CHECKPOINT.to_vec())?;
    inspect::table(out, &ckpt, "training.ckpt (embedded)", false)?;
    writeln!(out, "\nValues (non-tensor leaves):")?;
    for (name, value) in ckpt.values() {
        writeln!(out, "  {name} = {}", inspect::scalar_text(value))?;
    }
    writeln!(
        out,
        "\nThe globals listed as outside torch's allowlist were kept as inert values, never imported\n\
         or called; `ptload inspect --strict` refuses such a file as torch.load(weights_only=True) does."
    )?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if io.kind() == io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("ptload: {e}");
            ExitCode::from(2)
        }
    }
}
