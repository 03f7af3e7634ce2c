//! `ptload plan`: which bytes each rank of a tensor-parallel job reads.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use ptload_reader::read_plan::ReadPlan;
use ptload_reader::tp::Splits;

use crate::args::{CliResult, OpenArgs, StateDictArgs};

#[derive(Args)]
pub(crate) struct PlanArgs {
    /// The checkpoint: a file, a directory of shards, a *.index.json, or the URL of a file or an
    /// index.
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

/// The plan, as one JSON document.
pub(crate) fn run(a: &PlanArgs, out: &mut impl Write) -> CliResult<u8> {
    let opts = a.open.options();
    let set = a.open.open_set(&a.input, &opts)?;
    let state = StateDictArgs::default().options(false)?;
    let limits = ptload_reader::Limits::default();
    let plan = if a.read_once {
        ReadPlan::read_once(&set, &state, a.world, a.nodes, &limits)?
    } else {
        let splits = Splits::with_preset(&a.split, a.split_preset.as_deref())?;
        if splits.rules().is_empty() {
            return Err("a sliced plan needs rules: --split GLOB=DIM or --split-preset NAME (or --read-once)".into());
        }
        ReadPlan::sliced(&set, &state, &splits, a.world, a.nodes, &limits)?
    };
    serde_json::to_writer(&mut *out, &plan)?;
    writeln!(out)?;
    Ok(0)
}
