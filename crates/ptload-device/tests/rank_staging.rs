//! A tensor-parallel rank's slices on a GPU: gathered from the map
//! straight into the staging buffers, equal to torch's `tensor_split`,
//! with no copy of the rank's share on the host.
//!
//! A test binary of its own: the allocator below counts every heap byte
//! the process holds, so no other test may run beside these.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ptload_device::{load, probe, Fallback, LoadOptions};
use ptload_reader::placement::{Device, DeviceMap, To};
use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
use ptload_reader::tp::{Shard, Splits};
use ptload_reader::Checkpoint;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

mod common;
use common::heap::peak_during;

/// One test at a time: they share the device and the counters.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn a_gpu() -> ptload_device::Gpus {
    let gpus = probe();
    assert!(
        !gpus.devices().is_empty(),
        "this test needs a CUDA device: {}",
        gpus.why_none()
    );
    gpus
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn open(name: &str) -> Arc<Checkpoint> {
    let path = fixtures().join("files").join(name);
    Arc::new(Checkpoint::open(&path).unwrap_or_else(|e| panic!("{name}: {e}")))
}

fn options(shard: Shard, splits: Splits) -> StateDictOptions {
    StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        parallel: Some((shard, splits)),
        ..Default::default()
    }
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether the simulated device was made too small for the loads here
/// (`SIMCUDA_MEMORY`, see .ci/run): slices then fall back to the host.
fn small_device() -> bool {
    std::env::var_os("SIMCUDA_MEMORY").is_some()
}

/// Every fixture tensor of fixtures/slices.json, split along each dim for
/// 2 and 3 ranks, loaded onto cuda:0 rank by rank: each slice's bytes
/// read back from the device are torch's `tensor_split` part. Big-endian
/// storages are swapped while staging; strided views and conj/neg
/// tensors take the host's gather, and land equal too.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn rank_slices_on_a_gpu_equal_torch_tensor_split() {
    let _turn = turn();
    let gpus = a_gpu();
    let text = std::fs::read_to_string(fixtures().join("slices.json")).expect("slices.json");
    let doc: Json = serde_json::from_str(&text).expect("json");
    let mut on_gpu = 0usize;
    let mut checked = 0usize;
    for (file, tensors) in doc["files"].as_object().expect("files") {
        let ckpt = open(file);
        let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
        let tensors = tensors.as_object().expect("tensors");
        let dims = tensors
            .values()
            .map(|t| t["dims"].as_array().expect("dims").len())
            .max()
            .unwrap_or(0);
        for dim in 0..dims {
            let rules: Vec<String> = tensors
                .iter()
                .filter(|(_, t)| t["dims"].as_array().expect("dims").len() > dim)
                .map(|(name, _)| format!("{name}={dim}"))
                .collect();
            let splits = Splits::parse(&rules).expect("rules");
            for world in [2u32, 3] {
                for rank in 0..world {
                    let shard = Shard::new(rank, world).expect("shard");
                    let sd = options(shard, splits.clone())
                        .select(&ckpt)
                        .expect("select");
                    let loaded = load(
                        Arc::clone(&ckpt),
                        &sd,
                        &plan,
                        &gpus,
                        &LoadOptions::default(),
                    )
                    .unwrap_or_else(|e| panic!("{file} dim {dim} rank {rank}/{world}: {e}"));
                    for (name, t) in tensors {
                        let Some(parts) = t["dims"][dim][world.to_string()].as_array() else {
                            continue;
                        };
                        let want = parts[rank as usize][1].as_str().expect("sha");
                        let got = loaded.get(name).unwrap_or_else(|| panic!("{name}"));
                        let bytes = loaded.elements(got).expect("elements");
                        let at = format!("{file} {name} dim {dim} rank {rank}/{world}");
                        assert_eq!(sha256(&bytes), want, "{at}");
                        if got.device == Device::Cuda(0) {
                            on_gpu += 1;
                        } else {
                            assert!(small_device(), "{at}: {:?}", got.fallback);
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 500, "only {checked} slices checked");
    if !small_device() {
        assert_eq!(on_gpu, checked);
    }
}

/// Rank 0 of 2 of a Llama-shaped checkpoint (llama preset: embeddings,
/// q/k/v, gate/up split on dim 0; o and down on dim 1): every slice lands
/// on cuda:0 equal to the reader's gather of it, and the heap never held
/// more than a small part of the rank's share during the load. Gathered
/// on the host first (as before), the share itself was held.
/// On a simulated device too small for the share (`SIMCUDA_MEMORY`),
/// what does not fit falls back to the host, gathered there, equal too.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn a_rank_share_is_staged_without_a_host_copy() {
    let _turn = turn();
    let gpus = a_gpu();
    let ckpt = open("llama_wide.pt");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let splits = Splits::preset("llama").expect("preset");
    let sd = options(Shard::new(0, 2).expect("shard"), splits)
        .select(&ckpt)
        .expect("select");
    let share: u64 = sd
        .tensors()
        .filter(|(name, _)| sd.selected(name).is_some_and(|e| e.slice.is_some()))
        .map(|(_, view)| view.info().nbytes)
        .sum();
    let dims: std::collections::BTreeSet<usize> =
        sd.iter().filter_map(|e| e.slice.map(|s| s.dim)).collect();
    assert_eq!(dims, [0, 1].into(), "slices along both dims");
    assert!(share > 4_000_000, "{share} bytes of slices");

    let (loaded, peak) = peak_during(|| {
        load(
            Arc::clone(&ckpt),
            &sd,
            &plan,
            &gpus,
            &LoadOptions::default(),
        )
        .expect("load")
    });
    let peak = peak as u64;

    let mut fell_back = 0;
    for (name, view) in sd.tensors() {
        let got = loaded.get(name).unwrap_or_else(|| panic!("{name}"));
        match (&got.device, &got.fallback) {
            (Device::Cuda(0), None) => {}
            (Device::Host, Some(Fallback::OutOfMemory { .. })) if small_device() => fell_back += 1,
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(
            sha256(&loaded.elements(got).expect("elements")),
            sha256(&view.data().expect("data")),
            "{name} on {}",
            got.device
        );
    }
    if small_device() {
        assert!(fell_back > 0, "the share fitted a small device");
    } else {
        assert!(
            peak < share / 8,
            "the heap held {peak} more bytes during the load, for a share of {share}"
        );
    }
}
