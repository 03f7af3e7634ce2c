//! `ptload`: inspect PyTorch checkpoints without Python.
//!
//! Exit codes: 0 success (or nothing found), 1 findings or differences
//! (scan, diff), 2 error (one line on stderr). A closed pipe on stdout ends
//! quietly.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ptload_reader::set::CheckpointSet;
use ptload_reader::Checkpoint;

mod args;
mod inspect;
mod loadcmd;
mod scancmd;
mod terms;
mod tools;
mod ui;

use args::{CliResult, GpuInfo, MapArgs, OpenArgs, StateDictArgs};

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

#[derive(Subcommand)]
enum Command {
    /// List the tensors of a checkpoint: name, dtype, shape, location, size.
    Inspect(Box<InspectArgs>),
    /// Load the storages where the mapping says: CUDA devices, with host fallback per tensor.
    Load(Box<LoadArgs>),
    /// Write the state dict as a safetensors file, streamed from the file.
    Convert(Box<ConvertArgs>),
    /// List every global the pickles torch.load would run reference, with its level; exit 1 at --fail-on or above.
    Scan(ScanArgs),
    /// Compare two checkpoints tensor by tensor; exit 1 if they differ.
    Diff(Box<DiffArgs>),
    /// Plan which bytes each rank of a tensor-parallel job reads (JSON): its slices, or a share of a read-once pass.
    Plan(Box<PlanArgs>),
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

#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("auto"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("auto")))
)]
struct ConvertArgs {
    /// The checkpoint.
    input: PathBuf,
    /// The safetensors file to write (through a symbolic link to its target), or `-`
    /// for standard output; with --max-shard-size, a directory. Never the input; an
    /// existing file only with --force.
    output: PathBuf,
    /// Write a sharded set into the OUTPUT directory, as Hugging Face shards one:
    /// model-00001-of-0000N.safetensors ... (each at most SIZE unless one tensor is larger)
    /// and model.safetensors.index.json. All files appear together, or none.
    #[arg(long = "max-shard-size", value_name = "SIZE")]
    max_shard_size: Option<String>,
    /// The input is model-parallel rank files (a directory of Meta's consolidated.NN.pth, or
    /// one file per rank): put each tensor back together by the --split/--split-preset rules
    /// the files were cut by; with --shard, cut it again for that rank of another world size.
    #[arg(long = "merge-ranks")]
    merge_ranks: bool,
    /// Replace an existing output file.
    #[arg(long)]
    force: bool,
    /// Convert floating tensors: F64, F32, F16, BF16, F8_E4M3, F8_E5M2.
    #[arg(long, value_name = "DTYPE")]
    dtype: Option<String>,
    /// Leave out tensors safetensors cannot hold (complex128, ...), with a warning each.
    #[arg(long = "skip-unsupported")]
    skip_unsupported: bool,
    /// Plain values written to __metadata__ beside {"format": "pt"}: those of the selected
    /// state dict (values), none, or every value in the file (all).
    #[arg(long, value_enum, default_value = "values")]
    metadata: args::MetadataArg,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    open: OpenArgs,
    #[command(flatten)]
    state: StateDictArgs,
}

#[derive(Args)]
struct PlanArgs {
    /// The checkpoint: a file, a directory of shards, or a *.index.json.
    input: PathBuf,
    /// Ranks in the job.
    #[arg(long)]
    world: u32,
    /// Nodes the ranks run on (ranks 0..world/nodes on the first, and so on).
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// Instead of each rank's slices: every byte read once per node, split evenly among its
    /// ranks, for an engine that exchanges them with its own collectives.
    #[arg(long = "read-once")]
    read_once: bool,
    /// Split tensors whose final name matches GLOB along DIM (see `inspect --split`).
    #[arg(long, value_name = "GLOB=DIM")]
    split: Vec<String>,
    /// A ready rule set after any --split rules: llama, meta-llama, mixtral, gpt-neox, gpt2.
    #[arg(long = "split-preset", value_name = "NAME")]
    split_preset: Option<String>,
    #[command(flatten)]
    open: OpenArgs,
}

#[derive(Args)]
struct ScanArgs {
    /// Checkpoints to scan (a directory: every checkpoint, pickle or archive in it, recursively).
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
}

/// Compares the models two checkpoints hold, as convert and load take them
/// (`--key auto --strip-prefix auto` unless given; each automatic choice is
/// noted), so a plain state dict and a training or DataParallel checkpoint
/// of the same weights compare equal.
#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("auto"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("auto")))
)]
struct DiffArgs {
    /// First checkpoint (a torch file, or a .safetensors file).
    a: PathBuf,
    /// Second checkpoint (a torch file, or a .safetensors file).
    b: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// --key for the first file only.
    #[arg(long = "key-a", value_name = "PATH|auto|all")]
    key_a: Option<String>,
    /// --key for the second file only.
    #[arg(long = "key-b", value_name = "PATH|auto|all")]
    key_b: Option<String>,
    /// Floating tensors within this absolute difference are equal (with --rtol: |a - b| <=
    /// atol + rtol * |b|, as torch.allclose); tensors of two floating dtypes then compare by value.
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    atol: f64,
    /// Floating tensors within this relative difference are equal (see --atol).
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    rtol: f64,
    #[command(flatten)]
    open: OpenArgs,
    #[command(flatten)]
    state: StateDictArgs,
}

#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("auto"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("auto")))
)]
#[command(mut_arg("strict", |a| a.help(
    "Behave like torch: refuse globals outside torch's weights_only allowlist (as \
     torch.load(weights_only=True)), and fail before copying when a planned GPU is missing \
     instead of falling back to the host"
)))]
struct LoadArgs {
    /// The checkpoint.
    file: PathBuf,
    /// Print JSON: {"tensors": [{"name", "target", "device", "fallback", "dtype", "converted_from"}], "devices": [...], "seconds"}.
    #[arg(long)]
    json: bool,
    /// Convert floating tensors on load: F64, F32, F16, BF16, F8_E4M3, F8_E5M2.
    #[arg(long, value_name = "DTYPE")]
    dtype: Option<String>,
    /// Read each tensor back from where it landed (GPU or host) and print the sha256 of its elements, as `inspect --hash` does: equal hashes prove the upload.
    #[arg(long)]
    hash: bool,
    #[command(flatten)]
    open: OpenArgs,
    #[command(flatten)]
    map: MapArgs,
    #[command(flatten)]
    state: StateDictArgs,
}

#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("all, the file as saved"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("none")))
)]
struct InspectArgs {
    /// Checkpoints (.pt, .pth, .bin, .ckpt: the layout is detected from the content).
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

/// One side of `diff`, as read.
enum Opened {
    Torch(CheckpointSet),
    Safetensors(Vec<u8>),
}

/// A side of `diff` ready to compare: a torch checkpoint's model, selected
/// as convert selects it (`key` overriding `--key`), or the safetensors
/// file's tensors.
fn diff_side<'o>(
    opened: &'o Opened,
    key: &Option<String>,
    path: &std::path::Path,
    state: &StateDictArgs,
) -> CliResult<tools::Side<'o>> {
    match opened {
        Opened::Torch(set) => {
            let mut state = state.clone();
            if key.is_some() {
                state.key.clone_from(key);
            }
            let sel = state.options(false)?.select_set(set)?;
            // Two files: each note says which.
            for d in terms::decisions(sel.decisions()) {
                ui::note(&format!("{}: {d}", path.display()));
            }
            Ok(tools::Side::Torch(sel))
        }
        Opened::Safetensors(bytes) => safetensors::SafeTensors::deserialize(bytes)
            .map(tools::Side::Safetensors)
            .map_err(|e| format!("{}: safetensors: {e}", path.display()).into()),
    }
}

/// The machine's GPUs, asked only when a mapping needs them.
struct MachineGpus;

impl GpuInfo for MachineGpus {
    fn count(&self) -> usize {
        ptload_device::device_count()
    }

    fn totals(&self) -> Vec<(u32, u64)> {
        ptload_device::probe()
            .devices()
            .iter()
            .map(|g| (g.ordinal, g.total))
            .collect()
    }

    fn why_none(&self) -> String {
        ptload_device::probe().why_none()
    }
}

fn run(cli: Cli) -> CliResult<u8> {
    ui::configure(cli.quiet, cli.no_progress);
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    match cli.command {
        Command::Inspect(a) => {
            let several = a.files.len() > 1;
            let mut failed = false;
            for (i, file) in a.files.iter().enumerate() {
                let label = file.display().to_string();
                if several && !a.json && i > 0 {
                    writeln!(out)?;
                }
                let result = (|| -> CliResult<()> {
                    let set = CheckpointSet::open_with(file, &a.open.options())?;
                    let sd = a.state.options(true)?.select_set(&set)?;
                    let rows = inspect::rows(&sd, &a.map, &MachineGpus)?;
                    if a.json {
                        inspect::json(&mut out, &set, &rows, &label, a.hash)?;
                    } else {
                        let columns = inspect::terminal_columns();
                        inspect::table(&mut out, &set, &rows, &label, a.hash, columns)?;
                        if ptload_reader::dcp::is_dcp_dir(file) {
                            let dcp = ptload_reader::dcp::Dcp::open_with(file, &a.open.options())?;
                            inspect::dcp_chunks(&mut out, &dcp)?;
                        }
                    }
                    out.flush()?;
                    // The process ends soon: the OS reclaims the checkpoint's
                    // memory faster than freeing it piece by piece.
                    std::mem::forget(rows);
                    std::mem::forget(sd);
                    std::mem::forget(set);
                    Ok(())
                })();
                match result {
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
                        eprintln!("ptload: {label}: {}", terms::error_text(&*e));
                        failed = true;
                    }
                }
            }
            if failed {
                out.flush()?;
                return Ok(2);
            }
        }
        Command::Load(a) => {
            let started = std::time::Instant::now();
            let set = CheckpointSet::open_with(&a.file, &a.open.options())?;
            let open_seconds = started.elapsed().as_secs_f64();
            let gpus = ptload_device::probe();
            let request = loadcmd::Request {
                map: &a.map,
                state: &a.state,
                strict: a.open.strict,
                dtype: a.dtype.as_deref(),
            };
            // A set loads file by file, each reported on its own.
            let several = set.files().len() > 1;
            for file in set.files() {
                let name = file.name();
                let (loaded, decisions) = loadcmd::run(file.checkpoint(), &gpus, &request)?;
                if a.json {
                    let label = several.then_some(name.as_str());
                    loadcmd::json(&mut out, &loaded, &decisions, a.hash, label)?;
                } else {
                    if several {
                        writeln!(out, "{name}:")?;
                    }
                    loadcmd::summary(&mut out, &loaded, &gpus, open_seconds)?;
                    if a.hash {
                        loadcmd::hashes(&mut out, &loaded)?;
                    }
                }
            }
        }
        Command::Convert(a) if a.merge_ranks => {
            let opts = a.open.options();
            let set = CheckpointSet::open_ranks(&a.input, &opts)?;
            let splits = ptload_reader::parallel::Splits::with_preset(
                &a.state.split,
                a.state.split_preset.as_deref(),
            )?;
            if splits.rules().is_empty() {
                return Err("--merge-ranks needs the rules the files were cut by: --split GLOB=DIM or --split-preset NAME".into());
            }
            let shard = match a.state.shard.as_deref() {
                None => None,
                Some("env") => Some(ptload_reader::parallel::Shard::from_env()?),
                Some(s) => Some(ptload_reader::parallel::Shard::parse(s)?),
            };
            let merged = ptload_reader::merge::merge(&set, &splits)?;
            let sopts = ptload_reader::export::SafetensorsOptions {
                dtype: a.dtype.as_deref().map(args::parse_dtype).transpose()?,
                skip_unsupported: a.skip_unsupported,
                overwrite: a.force,
                ..Default::default()
            };
            let written =
                ptload_reader::export::write_merged_file(&set, &merged, shard, &sopts, &a.output)
                    .map_err(tools::output_error)?;
            writeln!(
                out,
                "wrote {}: {} tensors from {} rank files{}, {} of data",
                a.output.display(),
                written.tensors,
                set.files().len(),
                shard
                    .map(|s| format!(" (rank {} of {})", s.rank, s.world))
                    .unwrap_or_default(),
                inspect::human_size(written.bytes)
            )?;
        }
        Command::Convert(a) => {
            // A distributed checkpoint converts tensor by tensor from its
            // chunks (one sharded output is written from the set put
            // together in memory).
            let dcp = if a.max_shard_size.is_none() && ptload_reader::dcp::is_dcp_dir(&a.input) {
                Some(ptload_reader::dcp::Dcp::open_with(
                    &a.input,
                    &a.open.options(),
                )?)
            } else {
                None
            };
            let set = match &dcp {
                Some(d) => CheckpointSet::of(&a.input, std::sync::Arc::new(d.skeleton()?))?,
                None => CheckpointSet::open_with(&a.input, &a.open.options())?,
            };
            let state = a.state.options(false)?;
            let request = tools::ConvertRequest {
                output: &a.output,
                force: a.force,
                dtype: a.dtype.as_deref(),
                skip_unsupported: a.skip_unsupported,
                metadata: a.metadata,
                json: a.json,
                max_shard_size: a
                    .max_shard_size
                    .as_deref()
                    .map(|t| {
                        args::parse_bytes(t).filter(|&b| b > 0).ok_or_else(|| {
                            format!("invalid --max-shard-size {t:?}: expected a size such as 5GB or 500MiB")
                        })
                    })
                    .transpose()?,
                dcp: dcp.as_ref(),
            };
            // Standard output carries the data: the report goes to stderr.
            if a.output.as_os_str() == "-" {
                drop(out);
                return tools::convert(&mut io::stderr(), &set, &state, &request).map(|()| 0);
            }
            tools::convert(&mut out, &set, &state, &request)?;
        }
        Command::Scan(a) => {
            let files = scancmd::files_to_scan(&a.files)?;
            let request = scancmd::ScanRequest {
                format: if a.json {
                    scancmd::ScanFormat::Json
                } else {
                    a.format
                },
                fail_on: a.fail_on,
                in_memory: a.no_mmap,
            };
            let verdict = scancmd::run(&mut out, &files, &request)?;
            out.flush()?;
            return Ok(verdict);
        }
        Command::Diff(a) => {
            if !(a.atol >= 0.0 && a.rtol >= 0.0) {
                return Err("invalid --atol/--rtol: expected numbers of 0 or more".into());
            }
            let opts = a.open.options();
            // Each side is a torch checkpoint or a safetensors file; an
            // error says which side failed.
            let read = |path: &PathBuf| -> CliResult<Opened> {
                let fail = |e: String| format!("{}: {e}", path.display());
                if tools::is_safetensors(path) {
                    let bytes = std::fs::read(path).map_err(|e| fail(format!("io: {e}")))?;
                    return Ok(Opened::Safetensors(bytes));
                }
                CheckpointSet::open_with(path, &opts)
                    .map(Opened::Torch)
                    .map_err(|e| fail(e.render(&terms::Flags)).into())
            };
            let (oa, ob) = (read(&a.a)?, read(&a.b)?);
            let sa = diff_side(&oa, &a.key_a, &a.a, &a.state)?;
            let sb = diff_side(&ob, &a.key_b, &a.b, &a.state)?;
            let tol = tools::Tolerance {
                atol: a.atol,
                rtol: a.rtol,
            };
            let verdict = tools::diff(&mut out, &sa, &sb, tol, a.json)?;
            out.flush()?;
            return Ok(verdict);
        }
        Command::Plan(a) => {
            let opts = a.open.options();
            let set = CheckpointSet::open_with(&a.input, &opts)?;
            let state = StateDictArgs::default().options(false)?;
            let limits = ptload_reader::Limits::default();
            let plan = if a.read_once {
                ptload_reader::reads::ReadPlan::read_once(&set, &state, a.world, a.nodes, &limits)?
            } else {
                let splits = ptload_reader::parallel::Splits::with_preset(
                    &a.split,
                    a.split_preset.as_deref(),
                )?;
                if splits.rules().is_empty() {
                    return Err("a sliced plan needs rules: --split GLOB=DIM or --split-preset NAME (or --read-once)".into());
                }
                ptload_reader::reads::ReadPlan::sliced(
                    &set, &state, &splits, a.world, a.nodes, &limits,
                )?
            };
            serde_json::to_writer(&mut out, &plan)?;
            writeln!(out)?;
        }
        Command::Demo => demo(&mut out)?,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "ptload", &mut out);
        }
        Command::Man { command } => {
            use clap::CommandFactory;
            let cli = Cli::command();
            let page = match command {
                None => cli,
                Some(name) => {
                    let names: Vec<String> = cli
                        .get_subcommands()
                        .map(|c| c.get_name().to_owned())
                        .collect();
                    let sub = cli.find_subcommand(&name).cloned().ok_or_else(|| {
                        format!("no command {name:?}: one of {}", names.join(", "))
                    })?;
                    let title = format!("ptload-{name}");
                    sub.name(title.clone())
                        .bin_name(format!("ptload {name}"))
                        .display_name(title)
                        .version(env!("CARGO_PKG_VERSION"))
                }
            };
            clap_mangen::Man::new(page).render(&mut out)?;
        }
    }
    out.flush()?;
    Ok(0)
}

fn demo(out: &mut impl Write) -> CliResult<()> {
    writeln!(
        out,
        "ptload demo: a training checkpoint written by torch 2.15 ({} bytes, embedded in the binary),\n\
         read without Python or libtorch and without executing its pickle.\n",
        DEMO_CHECKPOINT.len()
    )?;
    let started = std::time::Instant::now();
    let ckpt = std::sync::Arc::new(Checkpoint::from_bytes(DEMO_CHECKPOINT)?);
    let open_seconds = started.elapsed().as_secs_f64();
    let set = CheckpointSet::of("training.ckpt", std::sync::Arc::clone(&ckpt))?;
    let sd = StateDictArgs::default().options(true)?.select_set(&set)?;
    let rows = inspect::rows(&sd, &MapArgs::default(), &MachineGpus)?;
    inspect::table(
        out,
        &set,
        &rows,
        "training.ckpt (embedded)",
        false,
        inspect::terminal_columns(),
    )?;
    writeln!(
        out,
        "\nLoading the model (--key auto picks model_state_dict) with --map-location auto:"
    )?;
    let gpus = ptload_device::probe();
    let map = MapArgs {
        map_location: Some("auto".into()),
        ..Default::default()
    };
    let state = StateDictArgs::default();
    let request = loadcmd::Request {
        map: &map,
        state: &state,
        strict: false,
        dtype: None,
    };
    let (loaded, _) = loadcmd::run(&ckpt, &gpus, &request)?;
    loadcmd::summary(out, &loaded, &gpus, open_seconds)?;
    match gpus.devices().first() {
        Some(g) => writeln!(out, "GPU: the tensors above went to cuda:0 ({}, {} total).", g.name, inspect::human_size(g.total))?,
        None => writeln!(out, "Without a GPU, auto places everything on the host; on a CUDA machine the same command uploads to cuda:0.")?,
    }
    writeln!(
        out,
        "\nThe globals listed as outside torch's allowlist were kept as inert values, never imported\n\
         or called; `ptload inspect --strict` refuses such a file as torch.load(weights_only=True) does."
    )?;
    Ok(())
}

fn main() -> ExitCode {
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
            if tools::cancelled(&*e) {
                return ExitCode::from(130);
            }
            ExitCode::from(2)
        }
    }
}
