//! `ptload convert`: the state dict as a safetensors file (or a sharded
//! set), streamed from the checkpoint; model-parallel rank files merged.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use clap::Args;
use ptload_reader::export::{Export, Metadata, SafetensorsOptions};
use ptload_reader::set::CheckpointSet;
use ptload_reader::state_dict::{StateDict, StateDictOptions};
use ptload_reader::ErrorKind;
use serde::Serialize;

use crate::args::{self, parse_dtype, CliResult, OpenArgs, StateDictArgs};
use crate::render::human_size;

#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("auto"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("auto")))
)]
pub(crate) struct ConvertArgs {
    /// The checkpoint (a path, or an http(s)://, s3://, gs:// or az:// URL read by ranged requests).
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

/// Convert the input (`--merge-ranks`: rank files put back together).
pub(crate) fn run(a: &ConvertArgs, out: &mut impl Write) -> CliResult<u8> {
    if a.merge_ranks {
        return merge_ranks(a, out);
    }
    // A distributed checkpoint converts tensor by tensor from its chunks
    // (one sharded output is written from the set put together in memory).
    let dcp = if a.max_shard_size.is_none() && ptload_reader::dcp::is_dcp_dir(&a.input) {
        Some(ptload_reader::dcp::Dcp::open_with(
            &a.input,
            &a.open.options(),
        )?)
    } else {
        None
    };
    let set = match &dcp {
        Some(d) => CheckpointSet::of(&a.input, Arc::new(d.skeleton()?))?,
        None => a.open.open_set(&a.input, &a.open.options())?,
    };
    let state = a.state.options(false)?;
    let request =
        ConvertRequest {
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
                    ptload_reader::placement::parse_size(t).filter(|&b| b > 0).ok_or_else(|| {
                    format!("invalid --max-shard-size {t:?}: expected a size such as 5GB or 500MiB")
                })
                })
                .transpose()?,
            dcp: dcp.as_ref(),
        };
    // Standard output carries the data: the report goes to stderr.
    if a.output.as_os_str() == "-" {
        out.flush()?;
        convert(&mut std::io::stderr(), &set, &state, &request)?;
    } else {
        convert(out, &set, &state, &request)?;
    }
    Ok(0)
}

/// Rank files put back together by the split rules they were cut by, and
/// cut again for `--shard` when given.
fn merge_ranks(a: &ConvertArgs, out: &mut impl Write) -> CliResult<u8> {
    let opts = a.open.options();
    let set = CheckpointSet::open_ranks(&a.input, &opts)?;
    let splits =
        ptload_reader::tp::Splits::with_preset(&a.state.split, a.state.split_preset.as_deref())?;
    if splits.rules().is_empty() {
        return Err("--merge-ranks needs the rules the files were cut by: --split GLOB=DIM or --split-preset NAME".into());
    }
    let shard = a
        .state
        .shard
        .as_deref()
        .map(ptload_reader::tp::Shard::from_arg)
        .transpose()?;
    let merged = ptload_reader::merge::merge(&set, &splits)?;
    let sopts = SafetensorsOptions {
        dtype: a.dtype.as_deref().map(parse_dtype).transpose()?,
        skip_unsupported: a.skip_unsupported,
        overwrite: a.force,
        ..Default::default()
    };
    let written = Export::merged(&set, &merged, shard, &sopts)
        .to_file(&a.output)
        .map_err(output_error)?;
    writeln!(
        out,
        "wrote {}: {} tensors from {} rank files{}, {} of data",
        a.output.display(),
        written.tensors,
        set.files().len(),
        shard
            .map(|s| format!(" (rank {} of {})", s.rank, s.world))
            .unwrap_or_default(),
        human_size(written.bytes)
    )?;
    Ok(0)
}

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
        // From a URL the bar counts the bytes fetched.
        progress: bar.clone().map(|bar| {
            let fetched =
                crate::remote::FetchCount::of(set.files().iter().map(|f| f.checkpoint().clone()));
            crate::remote::progress(bar, fetched)
        }),
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
        return selection
            .while_reading_ahead(|| write_shards(out, &selection, &opts, request, max, bar));
    }
    // From a URL, the tensors' bytes are fetched ahead of the writer.
    let result = selection.while_reading_ahead(|| -> CliResult<_> {
        Ok(match (request.dcp, to_stdout) {
            (Some(dcp), true) => {
                let mut stdout =
                    std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
                let written = Export::dcp(dcp, &selection, &opts).to_writer(&mut stdout);
                stdout.flush()?;
                written
            }
            (Some(dcp), false) => Export::dcp(dcp, &selection, &opts).to_file(output),
            (None, true) => {
                let mut stdout =
                    std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
                let written = Export::state_dict(&selection, &opts).to_writer(&mut stdout);
                stdout.flush()?;
                written
            }
            (None, false) => Export::state_dict(&selection, &opts).to_file(output),
        })
    })?;
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
        struct ConvertOut {
            output: String,
            tensors: usize,
            bytes: u64,
            metadata: usize,
            skipped: Vec<String>,
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
                skipped: written.skipped.iter().map(ToString::to_string).collect(),
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

/// `--max-shard-size`: a directory of shards and their index.
fn write_shards(
    out: &mut impl Write,
    selection: &StateDict<'_>,
    opts: &SafetensorsOptions,
    request: &ConvertRequest<'_>,
    max: u64,
    bar: Option<indicatif::ProgressBar>,
) -> CliResult<()> {
    let output = request.output;
    let set = Export::state_dict(selection, opts).to_shards(output, max);
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
            "skipped": set.skipped.iter().map(ToString::to_string).collect::<Vec<_>>(),
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
    Ok(())
}
