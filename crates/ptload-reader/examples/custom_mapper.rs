//! A placement policy of your own: a closure that places storages by tensor
//! name, composed with [`First`] and a [`Budget`], planned on
//! `fixtures/files/multi_gpu.pt` (saved on cuda:0..cuda:3 and the host).
//!
//! ```text
//! cargo run -p ptload-reader --example custom_mapper [-- CHECKPOINT]
//! ```
//!
//! Planning is pure: no GPU is needed, nothing is copied. The device crate's
//! `load()` executes the plan printed here.

use std::path::{Path, PathBuf};

use ptload_reader::placement::{glob, Budget, Device, DeviceMap, First, Mapper, StorageRequest};
use ptload_reader::Checkpoint;

/// Whether any tensor viewing the storage matches the glob.
fn named(s: &StorageRequest<'_>, pattern: &str) -> bool {
    s.tensors.iter().any(|name| glob(pattern, name))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = match std::env::args_os().nth(1) {
        Some(arg) => PathBuf::from(arg),
        // The repository root is two levels above this crate.
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .canonicalize()?
            .join("fixtures/files/multi_gpu.pt"),
    };
    let ckpt = Checkpoint::open(&path)?;

    // Fixed rules by name. `None` means "no opinion": the next mapper in
    // `First` decides, and if none does, the storage keeps its saved location.
    let by_name = |s: &StorageRequest<'_>| {
        if named(s, "*embed*") {
            Some(Device::Host) // looked up row by row: keep them off the GPU
        } else if named(s, "encoder.*") {
            Some(Device::Cuda(0))
        } else {
            None
        }
    };

    // cuda:1 is shared with another model: give the decoder at most 64 KiB
    // of it. A Budget fills its devices in order, then sends the rest to the
    // host; this closure only lets decoder storages reach it.
    let mut cuda1 = Budget::new(vec![(Device::Cuda(1), 64 << 10)]);
    let decoder = move |s: &StorageRequest<'_>| {
        if named(s, "decoder.*") {
            cuda1.map(s)
        } else {
            None
        }
    };

    let mut mapper = First(vec![Box::new(by_name), Box::new(decoder)]);
    let plan = DeviceMap::new(&ckpt, &mut mapper)?;

    println!("{}", path.display());
    println!("{:<26} {:>7} {:<6}    TARGET", "TENSOR", "BYTES", "SAVED");
    for t in ckpt.tensors() {
        let target = plan.tensor_target(t.info());
        let kept = t
            .info()
            .storage
            .and_then(|i| plan.placements().iter().find(|p| p.storage == i))
            .is_some_and(|p| !p.mapped);
        println!(
            "{:<26} {:>7} {:<6} -> {target}{}",
            t.name(),
            t.info().nbytes,
            t.location(),
            if kept { " (saved location kept)" } else { "" }
        );
    }

    println!("\nper device:");
    for (device, bytes, storages) in plan.per_device(&ckpt) {
        println!(
            "  {:<7} {bytes:>7} bytes in {storages} storages",
            device.to_string()
        );
    }
    Ok(())
}
