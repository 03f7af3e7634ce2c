//! How an inference engine embeds ptload: open a checkpoint, take its state
//! dict with wrapper prefixes (`module.`, `_orig_mod.`) stripped, plan every
//! storage onto `cuda:0`, load with per-tensor host fallback, and hand each
//! tensor's address (device pointer or host bytes) to the engine.
//!
//! ```text
//! cargo run -p ptload-device --example inference_engine [-- CHECKPOINT]
//! ```
//!
//! Without an argument it loads `fixtures/files/dataparallel.pt`. On a
//! machine without a usable GPU every tensor lands on the host, and the
//! reason is printed next to it.

use std::path::{Path, PathBuf};

use ptload_device::{load, probe, LoadOptions, Placed};
use ptload_reader::placement::{Device, DeviceMap, To};
use ptload_reader::state_dict::StateDictOptions;
use ptload_reader::Checkpoint;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = match std::env::args_os().nth(1) {
        Some(arg) => PathBuf::from(arg),
        // The repository root is two levels above this crate.
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .canonicalize()?
            .join("fixtures/files/dataparallel.pt"),
    };
    // Shared with the load's result, which keeps it alive: host tensors
    // that need no change stay slices of its memory map.
    let ckpt = std::sync::Arc::new(Checkpoint::open(&path)?);

    // The default options pick the model of a training checkpoint
    // (`--key auto`) and strip `module.` / `_orig_mod.` (`--strip-prefix auto`).
    let selection = StateDictOptions::default().select(&ckpt)?;
    // Everything to cuda:0, whatever location it was saved with.
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0)))?;

    let gpus = probe();
    match gpus.devices() {
        [] => println!("GPUs: none ({})", gpus.why_none()),
        devices => {
            for g in devices {
                println!("GPU cuda:{}: {}, {} MiB", g.ordinal, g.name, g.total >> 20);
            }
        }
    }

    // strict: false (the default) falls back to the host per tensor
    // instead of failing when cuda:0 is missing or full.
    let loaded = load(
        ckpt.clone(),
        &selection,
        &plan,
        &gpus,
        &LoadOptions::default(),
    )?;
    drop(selection);
    println!(
        "{}: {} tensors in {:.3} ms\n",
        path.display(),
        loaded.tensors().len(),
        loaded.seconds() * 1e3
    );

    for t in loaded.tensors() {
        // Tensors are views: on a GPU the engine takes the storage (a
        // cudarc view, or its address) plus the element offset, shape and
        // strides; on the host, `host_data` applies them.
        let place = match loaded.storage_of(t) {
            Some(Placed::Cuda(c)) => format!("cuda:{} ptr {:#x}", c.ordinal(), c.device_ptr()),
            Some(Placed::Host(_)) => {
                format!("host, {} bytes row-major", loaded.host_data(t)?.len())
            }
            _ => "meta, no data".to_owned(),
        };
        println!(
            "{:<20} {:<4} {:<10} offset {:<3} {place}",
            t.info.name,
            t.info.dtype.name(),
            format!("{:?}", t.info.shape),
            t.info.storage_offset
        );
        if let Some(why) = &t.fallback {
            println!("{:<20} wanted {}, on {}: {why}", "", t.target, t.device);
        }
    }

    println!();
    for d in loaded.devices() {
        println!(
            "{:<7} {:>3} tensors {:>8} bytes",
            d.device.to_string(),
            d.tensors,
            d.bytes
        );
    }
    Ok(())
}
