//! A file read by ranges (a URL, a bucket object; here a local file read
//! by positioned reads, the same path) loaded onto a GPU: its storages go
//! from the requests into the staging buffers, and the host holds no more
//! than the read-ahead window and the requests in flight, never the file.
//!
//! A test binary of its own: the allocator counts every heap byte the
//! process holds, so no other test may run beside these.

mod common;
use common::heap::peak_during;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ptload_device::{load, probe, LoadOptions, Loaded, Staging};
use ptload_reader::placement::{Device, DeviceMap, To};
use ptload_reader::state_dict::{KeySelect, StateDict, StateDictOptions, Strip};
use ptload_reader::tp::{Shard, Splits};
use ptload_reader::{Checkpoint, DType, Limits, OpenOptions, TensorView};
use sha2::{Digest, Sha256};

/// One test at a time: they share the device and the counters.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/files")
        .join(name)
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Each tensor of `here` (a selection of the mapped file) that `want`
/// gives bytes for, and that has any, landed on cuda:0 in `loaded` with
/// those bytes (and as `dtype`, when given); how many were checked.
fn landed_on_cuda0(
    loaded: &Loaded,
    here: &StateDict,
    dtype: Option<DType>,
    want: impl Fn(&TensorView<'_>) -> Option<Vec<u8>>,
) -> usize {
    let mut checked = 0;
    for (name, view) in here.tensors() {
        let got = loaded.get(name).unwrap_or_else(|| panic!("{name}"));
        let Some(want) = want(&view).filter(|_| got.info.numel > 0) else {
            continue;
        };
        assert_eq!(got.device, Device::Cuda(0), "{name}");
        if let Some(d) = dtype {
            assert_eq!(got.info.dtype, d, "{name}");
        }
        assert_eq!(
            sha256(&loaded.elements(got).expect("elements")),
            sha256(&want),
            "{name}"
        );
        checked += 1;
    }
    checked
}

/// The tensor's bytes as the mapped file holds them.
fn as_stored(view: &TensorView<'_>) -> Option<Vec<u8>> {
    Some(view.data().expect("data").into_owned())
}

/// Requests of at most 256 KiB, four in flight: a read-ahead window of
/// 1 MiB, so that the files here are many windows long.
const REQUEST: u64 = 256 << 10;
const IN_FLIGHT: usize = 4;

fn ranged(name: &str) -> Arc<Checkpoint> {
    let mut limits = Limits::default();
    limits.max_fetch_request_bytes = REQUEST;
    limits.max_fetches_in_flight = IN_FLIGHT;
    let ckpt = OpenOptions::new()
        .limits(limits)
        .positioned(true)
        .open(fixture(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(ckpt.fetched_bytes().is_some(), "{name}: not read by ranges");
    Arc::new(ckpt)
}

/// Every tensor of a Llama-shaped file (8.3 MB, eight read-ahead windows
/// long: small storages fetched ahead and handed to the copies, storages
/// larger than a request read part by part into the staging buffers)
/// lands on cuda:0 equal to the mapped file's bytes; each byte of the file
/// is fetched at most once; and the heap's peak during the load stays
/// under the read-ahead window (small storages fetched ahead) and the
/// load's own records: the parts read for the staging buffers land in
/// them, not on the heap. Before, a load kept every storage it fetched
/// until the checkpoint was dropped (the whole file), and later each
/// part passed through a buffer of its own (a request per worker).
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn a_file_read_by_ranges_goes_to_the_gpu_without_a_host_copy() {
    let _turn = turn();
    let gpus = probe();
    assert!(
        !gpus.devices().is_empty(),
        "this test needs a CUDA device: {}",
        gpus.why_none()
    );
    let staging = Staging {
        buffer_bytes: 256 << 10,
        ..Default::default()
    };
    // The window and room for the load's own records; the storages read
    // part by part go from the requests into the staging buffers (the
    // driver's pinned memory, not the heap), whatever the workers.
    let bound = REQUEST as usize * IN_FLIGHT + (64 << 10);
    let name = "llama_wide.pt";
    let file_len = std::fs::metadata(fixture(name)).expect("metadata").len();
    let ckpt = ranged(name);
    let local = Arc::new(Checkpoint::open(fixture(name)).expect("open"));
    let options = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let sd = options.select(&ckpt).expect("select");
    let here = options.select(&local).expect("select");
    let stored: u64 = ckpt.storages().iter().map(|s| s.nbytes).sum();
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let opts = LoadOptions {
        staging,
        ..Default::default()
    };
    let (loaded, peak) = peak_during(|| {
        load(Arc::clone(&ckpt), &sd, &plan, &gpus, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
    });
    let (fetched, requests) = ckpt.fetched_bytes().expect("read by ranges");
    assert!(
        fetched <= file_len,
        "{name}: fetched {fetched} bytes of a {file_len}-byte file in {requests} requests"
    );
    assert!(
        peak < bound && (peak as u64) < stored / 8,
        "{name}: the heap held {peak} more bytes during the load (bound {bound}), for \
         {stored} bytes of storages"
    );
    let checked = landed_on_cuda0(&loaded, &here, None, as_stored);
    assert!(checked > 10, "{name}: {checked} tensors");
}

/// Rank 0 of 2 of the same file, read by ranges (the llama preset:
/// embeddings, q/k/v, gate/up split on dim 0, o and down on dim 1): every
/// slice lands on cuda:0 equal to the mapped file's slice; the row splits
/// go from their own ranges into the staging buffers, so the file is
/// fetched no more than once over and the heap never holds the rank's
/// share: under a sixteenth of it, whatever the workers (the column
/// splits read a span of rows at a time: see the next test). Before,
/// every slice was gathered on the host first, and later
/// each part of a row split passed through a buffer of its own (a
/// request per worker: about a quarter of the share).
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn a_rank_share_read_by_ranges_goes_to_the_gpu_by_its_own_ranges() {
    let _turn = turn();
    let gpus = probe();
    assert!(!gpus.devices().is_empty(), "{}", gpus.why_none());
    let name = "llama_wide.pt";
    let ckpt = ranged(name);
    let local = Arc::new(Checkpoint::open(fixture(name)).expect("open"));
    let options = || StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        parallel: Some((
            Shard::new(0, 2).expect("shard"),
            Splits::preset("llama").expect("preset"),
        )),
        ..Default::default()
    };
    let sd = options().select(&ckpt).expect("select");
    let here = options().select(&local).expect("select");
    let rows: u64 = sd
        .iter()
        .filter(|e| e.slice.is_some_and(|s| s.dim == 0))
        .filter_map(|e| sd.view(e).map(|v| v.info().nbytes))
        .sum();
    let share: u64 = sd
        .iter()
        .filter(|e| e.slice.is_some())
        .filter_map(|e| sd.view(e).map(|v| v.info().nbytes))
        .sum();
    assert!(rows > share / 4, "{rows} of {share} bytes in row splits");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let opts = LoadOptions {
        staging: Staging {
            buffer_bytes: 256 << 10,
            ..Default::default()
        },
        ..Default::default()
    };
    let (loaded, peak) = peak_during(|| {
        load(Arc::clone(&ckpt), &sd, &plan, &gpus, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
    });
    let (fetched, _) = ckpt.fetched_bytes().expect("read by ranges");
    let file_len = std::fs::metadata(fixture(name)).expect("metadata").len();
    assert!(fetched <= file_len, "fetched {fetched} of {file_len}");
    assert!(
        (peak as u64) < share / 16 && (peak as u64) < (share - rows) + (64 << 10),
        "the heap held {peak} more bytes during the load, for a share of {share} ({rows} in row \
         splits)"
    );
    let checked = landed_on_cuda0(&loaded, &here, None, as_stored);
    assert!(checked > 10, "{checked} tensors");
}

/// The same file, read by ranges, loaded onto cuda:0 converted to F32
/// (`--dtype F32` of a BF16 file: twice its size): every tensor lands
/// equal to the reader's own conversion of the mapped file's bytes, the
/// file is fetched no more than once over, and the heap never holds the
/// converted tensors: each is read and converted a piece at a time into
/// the staging buffers (a piece per worker at most, besides the
/// read-ahead window). Before, every converted tensor was made whole on
/// the host before any copy began, and all of them were held until the
/// upload was done.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn a_conversion_read_by_ranges_goes_to_the_gpu_a_piece_at_a_time() {
    let _turn = turn();
    let gpus = probe();
    assert!(!gpus.devices().is_empty(), "{}", gpus.why_none());
    let name = "llama_wide.pt";
    let ckpt = ranged(name);
    let local = Arc::new(Checkpoint::open(fixture(name)).expect("open"));
    let options = || StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let sd = options().select(&ckpt).expect("select");
    let here = options().select(&local).expect("select");
    let converted: u64 = sd
        .tensors()
        .filter(|(_, v)| v.dtype() == DType::BF16)
        .map(|(_, v)| v.info().numel * 4)
        .sum();
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let opts = LoadOptions {
        staging: Staging {
            buffer_bytes: 256 << 10,
            ..Default::default()
        },
        dtype: Some(DType::F32),
        ..Default::default()
    };
    let (loaded, peak) = peak_during(|| {
        load(Arc::clone(&ckpt), &sd, &plan, &gpus, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
    });
    let (fetched, _) = ckpt.fetched_bytes().expect("read by ranges");
    let file_len = std::fs::metadata(fixture(name)).expect("metadata").len();
    assert!(fetched <= file_len, "fetched {fetched} of {file_len}");
    // The window, a 64 KiB piece of BF16 for each of up to 16 workers,
    // and the load's own records.
    let bound = REQUEST as usize * IN_FLIGHT + 16 * (64 << 10) + (64 << 10);
    assert!(
        peak < bound && (peak as u64) < converted / 8,
        "the heap held {peak} more bytes during the load (bound {bound}), for {converted} \
         bytes converted"
    );
    let checked = landed_on_cuda0(&loaded, &here, Some(DType::F32), |view| {
        (view.dtype() == DType::BF16).then(|| {
            ptload_reader::cast::convert(&view.data().expect("data"), DType::BF16, DType::F32)
                .expect("convert")
        })
    });
    assert!(checked >= 8, "{checked} tensors");
}

/// Rank 0 of 2 of the same file, read by ranges, with its 3.9 MiB
/// embedding split by columns (`*embed_tokens.weight=1`: 32,000 runs of
/// 64 bytes, every other one the rank's): the rank's 2 MiB of it lands on
/// cuda:0 equal to the mapped file's slice, the file is fetched no more
/// than once over, and the heap never holds the slice: the rows are read
/// a span at a time and gathered into the staging buffers (a span per
/// worker, each twice the part of the buffer it fills). Before, a column
/// split of a file read by ranges was gathered whole on the host and held
/// until the upload was done.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn a_column_split_read_by_ranges_goes_to_the_gpu_a_span_at_a_time() {
    let _turn = turn();
    let gpus = probe();
    assert!(!gpus.devices().is_empty(), "{}", gpus.why_none());
    let name = "llama_wide.pt";
    let ckpt = ranged(name);
    let local = Arc::new(Checkpoint::open(fixture(name)).expect("open"));
    let options = || StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        parallel: Some((
            Shard::new(0, 2).expect("shard"),
            Splits::parse(&["*embed_tokens.weight=1"]).expect("rule"),
        )),
        ..Default::default()
    };
    let sd = options().select(&ckpt).expect("select");
    let here = options().select(&local).expect("select");
    let columns: u64 = sd
        .iter()
        .filter(|e| e.slice.is_some_and(|s| s.dim == 1))
        .filter_map(|e| sd.view(e).map(|v| v.info().nbytes))
        .sum();
    assert_eq!(columns, 32_000 * 32 * 2, "the rank's half of the embedding");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let buffer = 64 << 10;
    let opts = LoadOptions {
        // Four workers whatever the machine: the bound counts their spans.
        staging: Staging {
            buffer_bytes: buffer,
            streams_per_device: 4,
            ..Default::default()
        },
        ..Default::default()
    };
    let (loaded, peak) = peak_during(|| {
        load(Arc::clone(&ckpt), &sd, &plan, &gpus, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
    });
    let (fetched, _) = ckpt.fetched_bytes().expect("read by ranges");
    let file_len = std::fs::metadata(fixture(name)).expect("metadata").len();
    assert!(fetched <= file_len, "fetched {fetched} of {file_len}");
    // Storages fetched ahead (of the other tensors) and a span per worker.
    assert!(
        (peak as u64) < columns / 3,
        "the heap held {peak} more bytes during the load, for {columns} bytes of columns"
    );
    let checked = landed_on_cuda0(&loaded, &here, None, as_stored);
    assert!(checked > 10, "{checked} tensors");
}

/// The same file read by ranges, loaded to the host with
/// `host_on_read` and every tensor hashed in turn (`load --hash
/// --map-location cpu URL`): the load fetches nothing, the hashing reads
/// each tensor once with the read-ahead running beside it, every hash
/// equals the mapped file's, and the heap holds no more than the
/// read-ahead window and a request at any time, never the file nor its
/// largest storage (streamed in pieces).
/// The same load without `host_on_read` holds every storage it placed,
/// as a load to the host must when its tensors are kept. Before, the
/// hashing load held the whole file until it ended.
#[test]
fn a_host_load_read_by_ranges_can_leave_the_file_to_its_readers() {
    let _turn = turn();
    let name = "llama_wide.pt";
    let local = Arc::new(Checkpoint::open(fixture(name)).expect("open"));
    let options = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let here = options.select(&local).expect("select");
    let gpus = probe();
    let stored: u64 = local.storages().iter().map(|s| s.nbytes).sum();
    let largest = local.storages().iter().map(|s| s.nbytes).max().unwrap_or(0);
    for host_on_read in [true, false] {
        let ckpt = ranged(name);
        let sd = options.select(&ckpt).expect("select");
        let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
        let opts = LoadOptions {
            host_on_read,
            ..Default::default()
        };
        let (at_open, _) = ckpt.fetched_bytes().expect("read by ranges");
        let (loaded, load_peak) = peak_during(|| {
            load(Arc::clone(&ckpt), &sd, &plan, &gpus, &opts)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        });
        let by_load = ckpt.fetched_bytes().expect("ranges").0 - at_open;
        let (hashes, hash_peak) = peak_during(|| {
            loaded.while_reading_ahead(|| {
                loaded
                    .tensors()
                    .iter()
                    .map(|t| {
                        let mut h = Sha256::new();
                        loaded
                            .visit_elements(t, |piece| h.update(piece))
                            .unwrap_or_else(|e| panic!("{}: {e}", t.name()));
                        (t.name().to_owned(), hex::encode(h.finalize()))
                    })
                    .collect::<Vec<_>>()
            })
        });
        let (fetched, _) = ckpt.fetched_bytes().expect("ranges");
        let file_len = std::fs::metadata(fixture(name)).expect("metadata").len();
        assert!(fetched <= file_len, "fetched {fetched} of {file_len}");
        assert_eq!(hashes.len(), here.len());
        for (name, hash) in &hashes {
            let view = here.get(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(hash, &sha256(&view.data().expect("data")), "{name}");
            assert_eq!(loaded.get(name).expect("loaded").device, Device::Host);
        }
        let window = REQUEST as usize * IN_FLIGHT;
        if host_on_read {
            assert_eq!(by_load, 0, "the load fetched {by_load} bytes");
            assert!(
                load_peak < (64 << 10) && hash_peak < window + REQUEST as usize + (64 << 10),
                "the heap held {load_peak} more bytes during the load and {hash_peak} while \
                 hashing (window {window}; the largest storage is {largest} bytes), for {stored} \
                 bytes of storages"
            );
        } else {
            // What opening fetched (the file's head and tail) is held
            // already; the load fetches and holds the rest.
            assert!(
                by_load + at_open >= stored && load_peak as u64 >= by_load,
                "the load fetched {by_load} bytes (opening {at_open}) and held {load_peak}, for \
                 {stored} bytes of storages"
            );
        }
    }
}

/// What landed on a GPU, read back for a hash a piece at a time
/// (`load --hash` on `cuda:0`): every tensor's pieces put together equal
/// what [`Loaded::elements`] copies back, and the heap holds no more than
/// one piece while they are read; `elements` holds the copy and the
/// gathered tensor, twice the largest tensor. Before, the hash of a
/// GPU tensor held both.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn what_landed_on_a_gpu_is_read_back_a_piece_at_a_time() {
    let _turn = turn();
    let gpus = probe();
    assert!(!gpus.devices().is_empty(), "{}", gpus.why_none());
    let name = "llama_wide.pt";
    let ckpt = Arc::new(Checkpoint::open(fixture(name)).expect("open"));
    let options = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let sd = options.select(&ckpt).expect("select");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let loaded = load(
        Arc::clone(&ckpt),
        &sd,
        &plan,
        &gpus,
        &LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    let largest = loaded
        .tensors()
        .iter()
        .map(|t| t.info.nbytes)
        .max()
        .unwrap_or(0) as usize;
    let (pieces, piece_peak) = peak_during(|| {
        loaded
            .tensors()
            .iter()
            .map(|t| {
                assert_eq!(t.device, Device::Cuda(0), "{}", t.name());
                let mut h = Sha256::new();
                loaded
                    .visit_elements(t, |piece| h.update(piece))
                    .unwrap_or_else(|e| panic!("{}: {e}", t.name()));
                hex::encode(h.finalize())
            })
            .collect::<Vec<_>>()
    });
    let (whole, whole_peak) = peak_during(|| {
        loaded
            .tensors()
            .iter()
            .map(|t| sha256(&loaded.elements(t).expect("elements")))
            .collect::<Vec<_>>()
    });
    assert_eq!(pieces, whole);
    assert!(pieces.len() > 10, "{} tensors", pieces.len());
    assert!(
        piece_peak <= largest + (64 << 10) && whole_peak >= 2 * largest,
        "the heap held {piece_peak} more bytes reading back in pieces and {whole_peak} whole, \
         for a largest tensor of {largest} bytes"
    );
}
