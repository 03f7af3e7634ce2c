//! `ptload demo`: the embedded training checkpoint, inspected and loaded.

use std::io::Write;

use ptload_reader::set::CheckpointSet;
use ptload_reader::Checkpoint;

use super::{load, MachineGpus};
use crate::args::{CliResult, MapArgs, StateDictArgs};
use crate::render;

/// The checkpoint `ptload demo` runs on: a training checkpoint written by
/// torch 2.15 (model and optimizer state, argparse args, a numpy scalar).
const DEMO_CHECKPOINT: &[u8] = include_bytes!("../../../../fixtures/files/training.ckpt");

/// Inspect the embedded checkpoint, then load its model.
pub(crate) fn run(out: &mut impl Write) -> CliResult<u8> {
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
    let rows = render::rows(&sd, &MapArgs::default(), &MachineGpus)?;
    render::table(
        out,
        &set,
        &rows,
        &render::file_values(&set),
        "training.ckpt (embedded)",
        false,
        render::terminal_columns(),
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
    let request = load::Request {
        map: &map,
        state: &state,
        strict: false,
        dtype: None,
        host_on_read: false,
    };
    let (loaded, _) = load::load_file(&ckpt, &gpus, &request)?;
    load::summary(out, &loaded, &gpus, open_seconds, false)?;
    match gpus.devices().first() {
        Some(g) => writeln!(out, "GPU: the tensors above went to cuda:0 ({}, {} total).", g.name, render::human_size(g.total))?,
        None => writeln!(out, "Without a GPU, auto places everything on the host; on a CUDA machine the same command uploads to cuda:0.")?,
    }
    writeln!(
        out,
        "\nThe globals listed as outside torch's allowlist were kept as inert values, never imported\n\
         or called; `ptload inspect --strict` refuses such a file as torch.load(weights_only=True) does."
    )?;
    Ok(0)
}
