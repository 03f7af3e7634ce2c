//! Executing plans: host fallback and strict mode on every machine, and
//! (where a CUDA device exists) the bytes on the device.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ptload_device::{load, probe, LoadOptions, Placed};
use ptload_reader::placement::{Device, DeviceMap, Keep, To};
use ptload_reader::state_dict::StateDictOptions;
use ptload_reader::{Checkpoint, DType};

/// The tests that probe for a GPU take turns: the device's memory is shared by
/// every test in the process, and a test that asserts where tensors went
/// (a budget that fits, a fallback for lack of memory) must not see
/// another test's allocations.
fn gpu_turn() -> MutexGuard<'static, ()> {
    static GPU: Mutex<()> = Mutex::new(());
    GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The machine's GPUs, for a test that needs one: it fails (never passes
/// quietly) without.
fn a_gpu() -> ptload_device::Gpus {
    let gpus = probe();
    assert!(
        !gpus.devices().is_empty(),
        "this test needs a CUDA device: {}",
        gpus.why_none()
    );
    gpus
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/files")
        .join(name)
}

fn open(name: &str) -> Arc<Checkpoint> {
    Arc::new(Checkpoint::open(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}")))
}

/// Everything in `ckpt`, loaded where `plan` says; the test fails if the
/// load does.
fn load_all(
    ckpt: &Arc<Checkpoint>,
    plan: &DeviceMap,
    gpus: &ptload_device::Gpus,
    opts: &LoadOptions,
) -> ptload_device::Loaded {
    load(Arc::clone(ckpt), &everything(ckpt), plan, gpus, opts).expect("load")
}

fn everything(ckpt: &Checkpoint) -> ptload_reader::state_dict::StateDict<'_> {
    StateDictOptions {
        key: ptload_reader::state_dict::KeySelect::All,
        strip: ptload_reader::state_dict::Strip::None,
        ..Default::default()
    }
    .select(ckpt)
    .expect("select")
}

/// The row-major bytes of a loaded host tensor, gathered here from its
/// storage by its offset and strides; `Loaded::host_data` must agree.
fn host_tensor_bytes(loaded: &ptload_device::Loaded, t: &ptload_device::LoadedTensor) -> Vec<u8> {
    let Some(Placed::Host(storage)) = loaded.storage_of(t) else {
        panic!("{} is not on the host", t.info.name);
    };
    let storage = storage.bytes().expect("host bytes");
    let elem = t.info.dtype.size() as u64;
    let mut out = Vec::new();
    let numel: u64 = t.info.shape.iter().product();
    for flat in 0..numel {
        let mut rest = flat;
        let mut offset = t.info.storage_offset;
        for (size, stride) in t.info.shape.iter().zip(&t.info.stride).rev() {
            offset += (rest % size) * stride;
            rest /= size;
        }
        let at = (offset * elem) as usize;
        out.extend_from_slice(&storage[at..at + elem as usize]);
    }
    assert_eq!(
        &*loaded.host_data(t).expect("host data"),
        &out[..],
        "{}: host_data",
        t.info.name
    );
    out
}

#[test]
fn missing_gpus_fall_back_to_the_host_per_tensor() {
    // As a machine without a driver sees it, whatever this one has.
    let gpus = ptload_device::Gpus::NoDriver;
    let ckpt = open("multi_gpu.pt");
    let plan = DeviceMap::new(&ckpt, &mut Keep).expect("plan");
    let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
    for (t, view) in loaded.tensors().iter().zip(ckpt.tensors()) {
        assert_eq!(t.target.to_string(), view.location(), "{}", t.info.name);
        assert_eq!(t.device, Device::Host, "{}", t.info.name);
        if view.location() == "cpu" {
            assert_eq!(t.fallback, None, "{}", t.info.name);
        } else {
            let why = t
                .fallback
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            assert!(why.contains("CUDA"), "{}: {why}", t.info.name);
        }
        assert_eq!(
            host_tensor_bytes(&loaded, t),
            &*view.data().expect("data"),
            "{}",
            t.info.name
        );
    }
    let host = loaded
        .devices()
        .iter()
        .find(|d| d.device == Device::Host)
        .expect("host report");
    assert_eq!(host.tensors, 7);
    assert_eq!(
        host.bytes,
        ckpt.storages().iter().map(|s| s.nbytes).sum::<u64>()
    );
}

#[test]
fn strict_fails_before_copying_with_torchs_words() {
    let _turn = gpu_turn();
    let gpus = probe();
    let ckpt = open("multi_gpu.pt");
    let ordinal = gpus.devices().len() as u32 + 3;
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(ordinal))).expect("plan");
    let opts = LoadOptions {
        strict: true,
        ..Default::default()
    };
    let e = load(Arc::clone(&ckpt), &everything(&ckpt), &plan, &gpus, &opts)
        .expect_err("no such device");
    let text = e.to_string();
    if gpus.devices().is_empty() {
        assert!(
            text.starts_with(
                "Attempting to deserialize object on a CUDA device but no CUDA device is usable"
            ),
            "{text}"
        );
        assert!(text.contains("map location \"cpu\""), "{text}");
        assert!(
            matches!(&e, ptload_device::LoadError::Strict { hint: Some(ptload_reader::advice::Hint::MapLocation { to: Some(to), .. }), .. } if to == "cpu"),
            "the advice as data: {e:?}"
        );
        assert!(
            !text.contains("--"),
            "library text names no CLI flag: {text}"
        );
    } else {
        assert!(
            text.starts_with(&format!(
                "Attempting to deserialize object on CUDA device {ordinal}"
            )),
            "{text}"
        );
    }
}

#[test]
fn host_storages_are_borrowed_from_the_map_and_copied_once() {
    let _turn = gpu_turn();
    let ckpt = open("views.pt");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
    let loaded = load_all(&ckpt, &plan, &probe(), &LoadOptions::default());
    assert_eq!(
        loaded.storages().len(),
        ckpt.storages().len(),
        "each storage once"
    );
    assert_eq!(loaded.tensors().len(), 10);
    for (i, p) in loaded.storages().iter().enumerate() {
        match p {
            Placed::Host(h) if h.is_mapped() => assert_eq!(
                h.bytes().expect("bytes").as_ptr(),
                ckpt.storage_bytes(i).expect("bytes").as_ptr()
            ),
            other => panic!("storage {i} is not borrowed: {other:?}"),
        }
    }
    let tied: Vec<_> = loaded
        .tensors()
        .iter()
        .filter(|t| t.info.name.ends_with("embed.weight") || t.info.name == "lm_head.weight")
        .collect();
    assert_eq!(tied.len(), 2);
    assert_eq!(tied[0].info.storage, tied[1].info.storage);
    for (t, view) in loaded.tensors().iter().zip(ckpt.tensors()) {
        assert_eq!(
            host_tensor_bytes(&loaded, t),
            &*view.data().expect("data"),
            "{}",
            t.info.name
        );
    }
}

#[test]
fn big_endian_storages_are_swapped_into_owned_buffers() {
    let _turn = gpu_turn();
    let ckpt = open("bigendian.pt");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
    let loaded = load_all(&ckpt, &plan, &probe(), &LoadOptions::default());
    for (t, view) in loaded.tensors().iter().zip(ckpt.tensors()) {
        assert_eq!(
            host_tensor_bytes(&loaded, t),
            &*view.data().expect("data"),
            "{}",
            t.info.name
        );
        if t.info.dtype.size() > 1 {
            assert!(
                matches!(loaded.storage_of(t), Some(Placed::Host(h)) if !h.is_mapped()),
                "{}",
                t.info.name
            );
        }
    }
}

#[test]
fn meta_reads_nothing() {
    let _turn = gpu_turn();
    let ckpt = open("multi_gpu.pt");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Meta)).expect("plan");
    let loaded = load_all(&ckpt, &plan, &probe(), &LoadOptions::default());
    assert!(loaded
        .tensors()
        .iter()
        .all(|t| t.device == Device::Meta && t.info.storage.is_none()));
    assert!(loaded.storages().is_empty());
}

#[test]
fn dtype_conversion_is_explicit_and_per_tensor() {
    let _turn = gpu_turn();
    let ckpt = open("training.ckpt");
    let selection = StateDictOptions::default().select(&ckpt).expect("select");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
    let opts = LoadOptions {
        dtype: Some(DType::BF16),
        ..Default::default()
    };
    let loaded = load(Arc::clone(&ckpt), &selection, &plan, &probe(), &opts).expect("load");
    assert_eq!(loaded.tensors().len(), selection.len());
    for (t, s) in loaded.tensors().iter().zip(&selection) {
        let view = ckpt.tensor_at(s.index).expect("tensor");
        assert_eq!(t.info.dtype, DType::BF16);
        assert_eq!(t.converted_from, Some(DType::F32));
        // The placed metadata describes the converted, row-major buffer.
        assert_eq!(t.info.nbytes, view.info().numel * 2, "{}", t.info.name);
        assert_eq!(t.info.storage_offset, 0);
        assert!(t.info.is_contiguous(), "{}", t.info.name);
        assert_eq!(t.info.shape, view.shape());
        let want =
            ptload_reader::cast::convert(&view.data().expect("data"), DType::F32, DType::BF16)
                .expect("convert");
        assert_eq!(host_tensor_bytes(&loaded, t), want, "{}", t.info.name);
    }
}

/// With a CUDA device: every fixture's bytes read back from the device
/// equal the file's, an ordinal past the count falls back, and a budget
/// smaller than the model spills to the host.
#[test]
#[ignore = "needs a CUDA device: run with --ignored on a GPU machine"]
fn gpu_round_trip() {
    let _turn = gpu_turn();
    let gpus = a_gpu();
    for name in [
        "basic.pt",
        "views.pt",
        "dtypes.pt",
        "multi_gpu.pt",
        "bigendian.pt",
        "deflated.pt",
        "legacy.pt",
    ] {
        let ckpt = open(name);
        let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
        let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
        for (t, view) in loaded.tensors().iter().zip(ckpt.tensors()) {
            let Some(Placed::Cuda(c)) = loaded.storage_of(t) else {
                assert!(
                    view.storage().is_none()
                        || view.info().nbytes == 0
                        || t.device != Device::Cuda(0),
                    "{name}: {}",
                    t.info.name
                );
                continue;
            };
            let back = c.read_back().expect("read back");
            let storage = view.storage_bytes().expect("storage");
            if ckpt.byte_order() == ptload_reader::checkpoint::ByteOrder::Little {
                assert_eq!(back, storage, "{name}: {}", t.info.name);
            } else {
                assert_eq!(back.len(), storage.len(), "{name}: {}", t.info.name);
            }
        }
    }
    let ckpt = open("multi_gpu.pt");
    let beyond = gpus.devices().len() as u32;
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(beyond))).expect("plan");
    let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
    assert!(loaded
        .tensors()
        .iter()
        .all(|t| t.device == Device::Host && t.fallback.is_some()));
    let mut budget = ptload_reader::placement::Budget::new(vec![(Device::Cuda(0), 70_000)]);
    let plan = DeviceMap::new(&ckpt, &mut budget).expect("plan");
    let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
    let fallbacks: Vec<_> = loaded.tensors().iter().map(|t| &t.fallback).collect();
    assert!(
        loaded.tensors().iter().any(|t| t.device == Device::Cuda(0)),
        "{fallbacks:?}"
    );
    assert!(loaded.tensors().iter().any(|t| t.device == Device::Host));
}

#[test]
fn tied_weights_share_one_converted_storage() {
    let _turn = gpu_turn();
    let ckpt = open("views.pt");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
    let opts = LoadOptions {
        dtype: Some(DType::F16),
        ..Default::default()
    };
    let loaded = load_all(&ckpt, &plan, &probe(), &opts);
    let find = |n: &str| {
        loaded
            .tensors()
            .iter()
            .find(|t| t.info.name == n)
            .expect("tensor")
    };
    assert_eq!(
        find("embed.weight").info.storage,
        find("lm_head.weight").info.storage
    );
    assert_ne!(
        find("base").info.storage,
        find("transposed").info.storage,
        "different views convert separately"
    );
}

/// What an engine keeps: the result owns the checkpoint, names find
/// tensors, and host reads are typed; asking for what is not there is an
/// error, not an empty value.
#[test]
fn the_result_owns_its_checkpoint_and_answers_by_name() {
    let loaded = {
        let ckpt = open("dataparallel.pt");
        let selection = StateDictOptions::default().select(&ckpt).expect("select");
        let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
        load(
            Arc::clone(&ckpt),
            &selection,
            &plan,
            &ptload_device::Gpus::NoDriver,
            &LoadOptions::default(),
        )
        .expect("load")
    };
    let ckpt = Arc::clone(loaded.checkpoint());
    for t in loaded.tensors() {
        assert!(!t.info.name.starts_with("module."), "{}", t.info.name);
        assert_eq!(loaded.get(&t.info.name).map(|g| g.index), Some(t.index));
        let view = ckpt.tensor_at(t.index).expect("tensor");
        assert_eq!(format!("module.{}", t.info.name), view.name());
        let values: Vec<f32> = loaded.host_vec(t).expect("host_vec");
        assert_eq!(
            values,
            view.to_vec::<f32>().expect("to_vec"),
            "{}",
            t.info.name
        );
        let wrong = loaded.host_vec::<f64>(t).expect_err("not f64");
        assert!(wrong.to_string().contains("holds F32"), "{wrong}");
    }
    assert!(loaded.get("module.encoder.0.weight").is_none());
    let meta = load(
        Arc::clone(&ckpt),
        &everything(&ckpt),
        &DeviceMap::new(&ckpt, &mut To(Device::Meta)).expect("plan"),
        &ptload_device::Gpus::NoDriver,
        &LoadOptions::default(),
    )
    .expect("load");
    let t = &meta.tensors()[0];
    let e = meta.host_data(t).expect_err("meta has no data");
    assert!(e.to_string().contains("not in host memory"), "{e}");
}

/// The row-major elements of `info` over `storage` (host order).
fn gather(storage: &[u8], info: &ptload_reader::TensorInfo) -> Vec<u8> {
    let elem = info.dtype.size() as u64;
    let numel: u64 = info.shape.iter().product();
    let mut out = Vec::with_capacity((numel * elem) as usize);
    for flat in 0..numel {
        let mut rest = flat;
        let mut offset = info.storage_offset;
        for (size, stride) in info.shape.iter().zip(&info.stride).rev() {
            offset += (rest % size) * stride;
            rest /= size;
        }
        let at = (offset * elem) as usize;
        out.extend_from_slice(&storage[at..at + elem as usize]);
    }
    out
}

/// Every tensor of every fixture and hostile file that opens, loaded to a
/// GPU and read back, is the reader's `data()`, element for element:
/// big-endian files with a staging size that is no multiple of the
/// element size, conj/neg bits, views, tied storages, conversion.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn uploads_read_back_as_the_readers_values() {
    let _turn = gpu_turn();
    let gpus = a_gpu();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in ["fixtures/files", "tests/hostile"] {
        for e in std::fs::read_dir(root.join(dir)).expect("dir") {
            files.push(e.expect("entry").path());
        }
    }
    files.sort();
    // Odd runs, filled from the map and by positioned reads.
    let odd = ptload_device::Staging {
        buffer_bytes: 4096 + 6,
        streams_per_device: 3,
        fill: ptload_device::Fill::Map,
        ..Default::default()
    };
    let stagings = [
        odd,
        ptload_device::Staging {
            fill: ptload_device::Fill::Read,
            pin: ptload_device::Pin::Allocate,
            keep: false,
            ..odd
        },
        ptload_device::Staging::default(),
    ];
    let mut checked = 0;
    for path in &files {
        let Ok(ckpt) = Checkpoint::open(path) else {
            continue;
        };
        let ckpt = Arc::new(ckpt);
        let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
        for (i, staging) in stagings.iter().enumerate() {
            for dtype in [None, Some(DType::BF16)] {
                let opts = LoadOptions {
                    staging: *staging,
                    dtype,
                    ..Default::default()
                };
                let loaded = load(Arc::clone(&ckpt), &everything(&ckpt), &plan, &gpus, &opts)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                for t in loaded.tensors() {
                    let view = ckpt.tensor_at(t.index).expect("tensor");
                    let Ok(data) = view.data() else {
                        assert_eq!(
                            t.device,
                            Device::Meta,
                            "{}: {}",
                            path.display(),
                            t.info.name
                        );
                        continue;
                    };
                    let want = match t.converted_from {
                        Some(from) => ptload_reader::cast::convert(&data, from, t.info.dtype)
                            .expect("convert"),
                        None => data.into_owned(),
                    };
                    // Wherever it landed; on a GPU, read back from the
                    // view's span and checked against a gather of the
                    // whole storage.
                    let got = loaded.elements(t).expect("elements").into_owned();
                    match loaded.storage_of(t) {
                        Some(Placed::Cuda(c)) => assert_eq!(
                            gather(&c.read_back().expect("read back"), &t.info),
                            got,
                            "{}: {}",
                            path.display(),
                            t.info.name
                        ),
                        Some(Placed::Host(_)) => {}
                        other => panic!("{}: {}: {other:?}", path.display(), t.info.name),
                    }
                    assert_eq!(
                        got,
                        want,
                        "{}: {} (staging {i}, dtype {dtype:?})",
                        path.display(),
                        t.info.name
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} tensors checked");
}

/// Whether the driver holds device `ordinal`'s primary context (ptload's
/// or anyone's in this process).
#[allow(unsafe_code)]
fn primary_context_active(ordinal: i32) -> bool {
    use ptload_device::cudarc::driver::{result, sys};
    let dev = result::device::get(ordinal).expect("device");
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: `dev` comes from cuDeviceGet; both out-pointers are valid.
    unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) }
        .result()
        .expect("primary context state");
    active != 0
}

/// The thread's current CUDA context, as a number to compare.
fn current_context() -> usize {
    ptload_device::cudarc::driver::result::ctx::get_current()
        .expect("current context")
        .map_or(0, |c| c as usize)
}

/// probe opens no context; a load opens the contexts of the devices it
/// places storages on and no other; none of it changes the calling
/// thread's current context (none, or the caller's own).
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn contexts_are_opened_only_where_storages_go_and_the_callers_stays_current() {
    let _turn = gpu_turn();
    let gpus = a_gpu();
    let ordinals: Vec<i32> = gpus.devices().iter().map(|g| g.ordinal as i32).collect();
    // Staging kept by earlier loads holds its device's context.
    ptload_device::release_staging();
    assert!(ordinals.iter().all(|&i| !primary_context_active(i)));
    assert_eq!(current_context(), 0);
    let ckpt = open("basic.pt");
    // Everything to the host: no device is touched.
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
    let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
    assert!(loaded.tensors().iter().all(|t| t.device == Device::Host));
    assert!(ordinals.iter().all(|&i| !primary_context_active(i)));
    assert!(gpus.devices().iter().all(|g| !g.is_open()));
    // To the last device: that one alone is opened; the thread still has
    // no current context, through the load, reads, addresses and drops.
    let last = *ordinals.last().expect("a device");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(last as u32))).expect("plan");
    let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
    for &i in &ordinals {
        assert_eq!(primary_context_active(i), i == last, "cuda:{i}");
    }
    for t in loaded.tensors() {
        if let Some(Placed::Cuda(c)) = loaded.storage_of(t) {
            assert!(c.device_ptr() != 0);
            c.read_back().expect("read back");
        }
    }
    assert_eq!(current_context(), 0);
    drop(loaded);
    assert_eq!(current_context(), 0);
    // An engine with its own context current, loading into it.
    let mine = ptload_device::cudarc::driver::CudaContext::new(ordinals[0] as usize)
        .expect("the engine's context");
    let current = current_context();
    assert_eq!(current, mine.cu_ctx() as usize);
    let theirs = ptload_device::Gpus::from_contexts([Arc::clone(&mine)]);
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(ordinals[0] as u32))).expect("plan");
    let loaded = load_all(&ckpt, &plan, &theirs, &LoadOptions::default());
    assert!(loaded
        .tensors()
        .iter()
        .all(|t| t.device == Device::Cuda(ordinals[0] as u32)));
    for t in loaded.tensors() {
        if let Some(Placed::Cuda(c)) = loaded.storage_of(t) {
            let view = c.view().expect("view");
            let back = mine
                .default_stream()
                .clone_dtoh(&view)
                .expect("engine reads it");
            assert_eq!(back, c.read_back().expect("read back"));
        }
    }
    assert_eq!(current_context(), current);
    drop(loaded);
    drop(theirs);
    drop(gpus);
    assert_eq!(current_context(), current);
}

/// Many small storages share copies: the arena is copied in runs of the
/// staging size, and the pinned pool is no larger than the work.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn many_small_storages_make_few_copies() {
    let _turn = gpu_turn();
    let gpus = a_gpu();
    let ckpt = open("many_tensors.pt");
    assert_eq!(ckpt.storages().len(), 20_000);
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let copies = |staging: ptload_device::Staging| {
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = Arc::clone(&done);
        let opts = LoadOptions {
            staging,
            progress: Some(Arc::new(move |n| {
                counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            })),
            ..Default::default()
        };
        let loaded = load_all(&ckpt, &plan, &gpus, &opts);
        let report = loaded
            .devices()
            .iter()
            .find(|d| d.device == Device::Cuda(0))
            .cloned()
            .expect("cuda:0");
        assert_eq!(report.tensors, 20_000);
        // Progress counts each byte of the checkpoint once, padding never.
        assert_eq!(
            done.load(std::sync::atomic::Ordering::Relaxed),
            report.bytes
        );
        // The workers' time is accounted: each made its buffers, filled
        // at least one and waited for its copy.
        let time = report.time;
        assert!(
            time.setup_seconds > 0.0 && time.fill_seconds > 0.0 && time.wait_seconds > 0.0,
            "{time:?}"
        );
        (report.copies, report.pinned_bytes)
    };
    // 20,000 storages of at most 16 bytes, each at a 256-byte boundary:
    // an arena of under 5 MiB, one run of the default 32 MiB buffer.
    let (n, pinned) = copies(ptload_device::Staging::default());
    assert_eq!(n, 1);
    assert!(pinned <= 5 << 20, "{pinned} pinned bytes");
    // 1 MiB runs: five.
    let (n, pinned) = copies(ptload_device::Staging {
        buffer_bytes: 1 << 20,
        streams_per_device: 4,
        ..Default::default()
    });
    assert_eq!(n, 5);
    assert!(pinned <= 8 << 20, "{pinned} pinned bytes");
}

/// The simulated driver's fault settings (simcuda, see .ci/run): each
/// ends in a fallback with its reason, a degraded but correct load, or a
/// typed error; never a panic, never wrong bytes.
#[test]
#[ignore = "runs on the simulated CUDA driver, configured by SIMCUDA_* (.ci/run)"]
fn simulated_driver_faults() {
    let _turn = gpu_turn();
    let set = |name: &str| std::env::var(name).ok();
    let gpus = probe();
    // Nothing kept from another test: this load pins its own staging.
    ptload_device::release_staging();
    let ckpt = open("many_tensors.pt");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    // Small runs: many copies, so a fault at the k-th lands mid-load.
    let opts = LoadOptions {
        staging: ptload_device::Staging {
            buffer_bytes: 64 << 10,
            streams_per_device: 4,
            ..Default::default()
        },
        ..Default::default()
    };
    let result = load(Arc::clone(&ckpt), &everything(&ckpt), &plan, &gpus, &opts);
    let check_values = |loaded: &ptload_device::Loaded| {
        for t in loaded.tensors() {
            let want = ckpt
                .tensor_at(t.index)
                .expect("tensor")
                .data()
                .expect("data");
            let got = match loaded.storage_of(t) {
                Some(Placed::Cuda(c)) => gather(&c.read_back().expect("read back"), &t.info),
                _ => loaded.host_data(t).expect("host").into_owned(),
            };
            assert_eq!(got, &*want, "{}", t.info.name);
        }
    };
    if set("SIMCUDA_NO_DEVICE").is_some() {
        assert!(gpus.devices().is_empty());
        assert_eq!(gpus.why_none(), "no CUDA device (the driver reports none)");
        let loaded = result.expect("falls back");
        assert!(loaded.tensors().iter().all(|t| t.device == Device::Host
            && t.fallback.as_ref().map(ToString::to_string).as_deref()
                == Some("no CUDA device (the driver reports none)")));
    } else if set("SIMCUDA_COPY_FAULT_AT").is_some() || set("SIMCUDA_COPY_FAIL_AT").is_some() {
        match result {
            Err(ptload_device::LoadError::Cuda {
                ordinal: 0,
                message,
            }) => {
                assert!(!message.is_empty())
            }
            Ok(loaded) => panic!("a failed copy must fail the load: {:?}", loaded.devices()),
            Err(other) => panic!("a failed copy must fail the load with cuda:0: {other}"),
        }
    } else if let Some(symbol) = set("SIMCUDA_WITHOUT") {
        // A driver library without a symbol the binding calls: cudarc
        // panics on the call; the load ends in a typed error instead.
        match result {
            Err(ptload_device::LoadError::Cuda {
                ordinal: 0,
                message,
            }) => {
                assert!(message.contains(&symbol), "{message}")
            }
            Ok(loaded) => panic!(
                "a missing {symbol} must fail the load: {:?}",
                loaded.devices()
            ),
            Err(other) => panic!("a missing {symbol} must fail the load with cuda:0: {other}"),
        }
    } else if let Some(k) = set("SIMCUDA_TOTAL_MEM_FAIL") {
        // A device whose memory the driver cannot report: never a device
        // of 0 bytes. The driver is unusable, saying which device and why,
        // and every tensor falls back with that reason.
        let why = format!("cuda:{k}: its total memory cannot be read");
        assert!(gpus.devices().is_empty(), "{:?}", gpus.devices());
        assert!(gpus.why_none().contains(&why), "{}", gpus.why_none());
        let loaded = result.expect("falls back");
        for t in loaded.tensors() {
            assert_eq!(t.device, Device::Host, "{}", t.info.name);
            let fallback = t.fallback.as_ref().map(ToString::to_string);
            assert!(
                fallback.as_deref().is_some_and(|f| f.contains(&why)),
                "{fallback:?}"
            );
        }
        check_values(&loaded);
    } else if let Some(k) = set("SIMCUDA_OPEN_FAIL") {
        // That device alone cannot be opened: its tensors fall back, each
        // saying so; the machine and its other devices stay usable.
        let broken: u32 = k.parse().expect("ordinal");
        assert!(
            gpus.get(broken).is_some(),
            "probe lists it without opening it"
        );
        let loaded = result.expect("load");
        let why = format!("cuda:{broken} could not be opened");
        for t in loaded.tensors() {
            if broken == 0 {
                assert_eq!(t.device, Device::Host, "{}", t.info.name);
                assert!(
                    t.fallback
                        .as_ref()
                        .map(ToString::to_string)
                        .as_deref()
                        .is_some_and(|f| f.starts_with(&why)),
                    "{:?}",
                    t.fallback
                );
            } else {
                assert_eq!(t.device, Device::Cuda(0), "{}", t.info.name);
            }
        }
        check_values(&loaded);
        if gpus.devices().len() > 1 {
            // Saved on cuda:0..3: the broken device's tensors fall back,
            // the others land where they were saved.
            let ckpt = open("multi_gpu.pt");
            let plan = DeviceMap::new(&ckpt, &mut Keep).expect("plan");
            let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
            let mut fell = 0;
            for t in loaded.tensors() {
                if t.target == Device::Cuda(broken) {
                    assert_eq!(t.device, Device::Host);
                    assert!(t
                        .fallback
                        .as_ref()
                        .map(ToString::to_string)
                        .as_deref()
                        .is_some_and(|f| f.starts_with(&why)));
                    fell += 1;
                } else if matches!(t.target, Device::Cuda(i) if gpus.get(i).is_some()) {
                    assert_eq!(t.device, t.target, "{}", t.info.name);
                }
            }
            assert!(fell > 0);
            let strict = LoadOptions {
                strict: true,
                ..Default::default()
            };
            let e = load(Arc::clone(&ckpt), &everything(&ckpt), &plan, &gpus, &strict)
                .expect_err("strict refuses a device it cannot open");
            assert!(e.to_string().starts_with(&why), "{e}");
        }
    } else if set("SIMCUDA_PINNED_FAIL").is_some() || set("SIMCUDA_REGISTER_FAIL").is_some() {
        // Staging pinned the other way; where neither works, pageable
        // staging: slower, the same bytes.
        let loaded = result.expect("staged");
        assert!(loaded.tensors().iter().all(|t| t.device == Device::Cuda(0)));
        check_values(&loaded);
        let report = &loaded.devices()[0];
        let neither =
            set("SIMCUDA_PINNED_FAIL").is_some() && set("SIMCUDA_REGISTER_FAIL").is_some();
        assert_eq!(report.pinned_bytes == 0, neither, "{report:?}");
        assert_eq!(report.pinnings == 0, neither, "{report:?}");
    } else if set("SIMCUDA_MEMORY").is_some() {
        // Less device memory than the checkpoint: what fits stays, the
        // rest spills to the host, each saying why.
        let loaded = result.expect("spills");
        let spilled: Vec<_> = loaded
            .tensors()
            .iter()
            .filter(|t| t.device == Device::Host)
            .collect();
        assert!(!spilled.is_empty());
        assert!(spilled.iter().all(|t| t
            .fallback
            .as_ref()
            .map(ToString::to_string)
            .as_deref()
            .is_some_and(|f| f.contains("out of memory"))));
        check_values(&loaded);
    } else {
        check_values(&result.expect("load"));
    }
    if gpus.devices().len() >= 4 && set("SIMCUDA_OPEN_FAIL").is_none() {
        // Saved on cuda:0..3: each storage where it was saved.
        let ckpt = open("multi_gpu.pt");
        let plan = DeviceMap::new(&ckpt, &mut Keep).expect("plan");
        let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
        for t in loaded.tensors() {
            let view = ckpt.tensor_at(t.index).expect("tensor");
            assert_eq!(t.device.to_string(), view.location(), "{}", t.info.name);
        }
    }
}

/// Quantized tensors keep their scale, zero point and axis through a load
/// (converted or not: their integer data is never converted), and sparse
/// components load as the tensors they are.
#[test]
fn quantization_and_sparse_components_travel_with_the_loaded_tensors() {
    let _turn = gpu_turn();
    for name in ["quantized.pt", "sparse.pt"] {
        let ckpt = open(name);
        let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
        for dtype in [None, Some(DType::BF16)] {
            let opts = LoadOptions {
                dtype,
                ..Default::default()
            };
            let loaded = load_all(&ckpt, &plan, &probe(), &opts);
            assert_eq!(loaded.tensors().len(), ckpt.len(), "{name}");
            let mut quantized = 0;
            for t in loaded.tensors() {
                let view = ckpt.tensor_at(t.index).expect("tensor");
                assert_eq!(
                    t.info.quantization,
                    view.info().quantization,
                    "{name}: {}",
                    t.info.name
                );
                if t.info.quantization.is_some() {
                    quantized += 1;
                    assert_eq!(t.info.dtype, view.dtype(), "{name}: {}", t.info.name);
                    assert!(t.converted_from.is_none());
                }
                assert_eq!(
                    loaded.elements(t).expect("elements").len() as u64,
                    t.info.nbytes,
                    "{name}: {}",
                    t.info.name
                );
            }
            assert_eq!(quantized > 0, name == "quantized.pt", "{name}");
            if name == "sparse.pt" {
                // Components by their torch names; indices stay integers,
                // values convert like any floating tensor.
                let indices = loaded.get("coo.indices").expect("coo.indices");
                let values = loaded.get("coo.values").expect("coo.values");
                assert_eq!(indices.info.dtype, DType::I64);
                assert_eq!(values.info.dtype, dtype.unwrap_or(DType::F32));
            }
        }
    }
}

/// Progress counts each byte of the checkpoint once: placed on the host as
/// it is, or read by a conversion (never again when the converted buffer
/// is placed).
#[test]
fn progress_counts_each_byte_once() {
    let _turn = gpu_turn();
    let ckpt = open("training.ckpt");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
    for dtype in [None, Some(DType::BF16)] {
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = Arc::clone(&done);
        let opts = LoadOptions {
            dtype,
            progress: Some(Arc::new(move |n| {
                counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            })),
            ..Default::default()
        };
        let loaded = load_all(&ckpt, &plan, &probe(), &opts);
        // Every tensor has its own whole storage here: the storages' bytes.
        let want: u64 = ckpt.storages().iter().map(|s| s.nbytes).sum();
        assert_eq!(
            done.load(std::sync::atomic::Ordering::Relaxed),
            want,
            "{dtype:?}"
        );
        assert_eq!(loaded.tensors().len(), ckpt.len());
    }
}

/// A set's entries are loaded file by file: each file's own entries with
/// its own checkpoint; an entry of another file is refused, never read
/// from the wrong file.
#[test]
fn a_set_loads_file_by_file() {
    use ptload_reader::set::CheckpointSet;
    use ptload_reader::state_dict::{KeySelect, Strip};
    let set = CheckpointSet::open(fixture("llama_tiny_sharded")).expect("set");
    let sd = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    }
    .select_set(&set)
    .expect("select");
    let whole = Checkpoint::open(fixture("llama_tiny.pt")).expect("whole");
    let gpus = ptload_device::Gpus::NoDriver;
    let mut seen = 0;
    for (k, file) in set.files().iter().enumerate() {
        let ckpt = file.checkpoint();
        let plan = DeviceMap::new(ckpt, &mut To(Device::Host)).expect("plan");
        let entries = sd.of_file(k);
        let loaded = load(
            Arc::clone(ckpt),
            &entries,
            &plan,
            &gpus,
            &LoadOptions::default(),
        )
        .expect("load");
        for t in loaded.tensors() {
            let want = whole
                .tensor(t.name())
                .unwrap_or_else(|| panic!("{}", t.name()));
            assert_eq!(
                loaded.host_data(t).expect("data"),
                want.data().expect("whole")
            );
            seen += 1;
        }
    }
    assert_eq!(seen, whole.len());
    let first = set.files()[0].checkpoint();
    let plan = DeviceMap::new(first, &mut To(Device::Host)).expect("plan");
    let e = load(
        Arc::clone(first),
        &sd,
        &plan,
        &gpus,
        &LoadOptions::default(),
    )
    .expect_err("entries of other files");
    assert!(e.to_string().contains("of a set"), "{e}");
}

/// Whole storages, as torch's `map_location` moves them: each target's
/// bytes on its device in host order (big-endian files swapped by the
/// storage's type), or the reason it stays on the host.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn storages_upload_whole_in_host_order() {
    let _turn = gpu_turn();
    let gpus = a_gpu();
    let count = gpus.devices().len() as u32;
    let mut checked = 0;
    for name in [
        "multi_gpu.pt",
        "views.pt",
        "bigendian.pt",
        "dtypes.pt",
        "legacy.pt",
    ] {
        let ckpt = open(name);
        // Every other storage, onto the devices in turn; one past the last.
        let mut targets: Vec<(usize, u32)> = (0..ckpt.storages().len())
            .step_by(2)
            .map(|i| (i, i as u32 % count))
            .collect();
        if let Some(i) = (1..ckpt.storages().len()).step_by(2).next() {
            targets.push((i, count));
        }
        let placed =
            ptload_device::upload_storages(&ckpt, &targets, &gpus, &LoadOptions::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(placed.len(), targets.len(), "{name}");
        for (&(index, ordinal), got) in targets.iter().zip(&placed) {
            let storage = &ckpt.storages()[index];
            if ordinal == count {
                let why = got.as_ref().expect_err("a device past the last");
                assert!(
                    why.to_string()
                        .contains(&format!("cuda:{count} does not exist")),
                    "{why}"
                );
                continue;
            }
            let on = got
                .as_ref()
                .unwrap_or_else(|e| panic!("{name}: storage {index}: {e}"));
            assert_eq!(on.ordinal(), ordinal);
            let mut want = ckpt.storage_bytes(index).expect("bytes").to_vec();
            ckpt.byte_order()
                .to_host(&mut want, storage.dtype.swap_unit());
            assert_eq!(
                on.read_back().expect("read back"),
                want,
                "{name}: storage {index}"
            );
            checked += 1;
        }
    }
    assert!(checked > 10, "only {checked} storages checked");
}

/// A cancelled upload stops taking runs, waits for the copies it queued,
/// frees its device memory and says it was cancelled: set before the
/// upload, nothing is copied; set from the progress callback after the
/// first run, the rest of the file is not copied.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn a_cancelled_upload_stops_and_frees_its_memory() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let _turn = gpu_turn();
    let gpus = a_gpu();
    let gpu = gpus.get(0).expect("cuda:0");
    let ckpt = open("many_tensors.pt");
    let targets: Vec<(usize, u32)> = (0..ckpt.storages().len()).map(|i| (i, 0)).collect();
    let total: u64 = ckpt.storages().iter().map(|s| s.nbytes).sum();
    let free_before = gpu.free_memory().expect("free memory");
    for early in [true, false] {
        let cancel = Arc::new(AtomicBool::new(early));
        let copied = Arc::new(AtomicU64::new(0));
        let (flag, seen) = (Arc::clone(&cancel), Arc::clone(&copied));
        let opts = LoadOptions {
            // One stream, runs of 64 KiB: the file is many runs.
            staging: ptload_device::Staging {
                buffer_bytes: 64 << 10,
                streams_per_device: 1,
                ..Default::default()
            },
            progress: Some(Arc::new(move |n| {
                seen.fetch_add(n, Ordering::Relaxed);
                flag.store(true, Ordering::Relaxed);
            })),
            cancel: Some(cancel),
            ..Default::default()
        };
        let e =
            ptload_device::upload_storages(&ckpt, &targets, &gpus, &opts).expect_err("cancelled");
        assert!(
            matches!(e, ptload_device::LoadError::Cancelled),
            "early {early}: {e}"
        );
        let copied = copied.load(Ordering::Relaxed);
        if early {
            assert_eq!(copied, 0, "nothing is copied once cancelled");
        } else {
            assert!(copied > 0 && copied < total, "{copied} of {total} bytes");
        }
        // The arena (the file's 5.7 MB) is freed; a real driver may keep a
        // little for itself.
        let free = gpu.free_memory().expect("free memory");
        assert!(
            free + (2 << 20) >= free_before,
            "early {early}: {free} bytes free, {free_before} before"
        );
    }
}

#[test]
fn storage_uploads_without_a_driver_say_why() {
    let ckpt = open("multi_gpu.pt");
    let gpus = ptload_device::Gpus::from_contexts([]);
    let targets = [(0, 0), (1, 3)];
    let placed = ptload_device::upload_storages(&ckpt, &targets, &gpus, &LoadOptions::default())
        .expect("upload");
    for got in &placed {
        assert!(got.is_err(), "{got:?}");
    }
    let twice =
        ptload_device::upload_storages(&ckpt, &[(0, 0), (0, 0)], &gpus, &LoadOptions::default());
    assert!(twice.is_err());
    let past =
        ptload_device::upload_storages(&ckpt, &[(10_000, 0)], &gpus, &LoadOptions::default());
    assert!(past.is_err());
}

/// A file in memory read by ranges, as from a URL; reads are logged, and
/// fail once `failing` is set.
#[derive(Debug)]
struct Remote {
    bytes: Vec<u8>,
    reads: Mutex<Vec<(u64, u64)>>,
    failing: std::sync::atomic::AtomicBool,
}

impl ptload_reader::ranged::RangeRead for Remote {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("connection reset"));
        }
        self.reads.lock().unwrap().push((offset, len));
        Ok(self.bytes[offset as usize..(offset + len) as usize].to_vec())
    }
    fn name(&self) -> &str {
        "https://models.example/ckpt.pt"
    }
}

fn remote(name: &str) -> (Arc<Remote>, Arc<Checkpoint>) {
    let file = Arc::new(Remote {
        bytes: std::fs::read(fixture(name)).unwrap(),
        reads: Mutex::new(Vec::new()),
        failing: std::sync::atomic::AtomicBool::new(false),
    });
    // Small requests: a prefetch of wide_storages.pt makes several.
    let mut limits = ptload_reader::Limits::default();
    limits.max_fetch_request_bytes = 256 << 10;
    let ckpt = ptload_reader::OpenOptions::new()
        .limits(limits)
        .open_ranged(file.clone())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    (file, Arc::new(ckpt))
}

/// Each byte was fetched once, and all of the storages' bytes were.
fn fetched_once_and_all(name: &str, file: &Remote, ckpt: &Checkpoint) {
    let mut reads = file.reads.lock().unwrap().clone();
    reads.sort_unstable();
    for pair in reads.windows(2) {
        assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{name}: {reads:?}");
    }
    for s in ckpt.storages() {
        let (Some(o), n) = (s.file_offset, s.nbytes) else {
            continue;
        };
        let covered = reads.iter().any(|&(a, l)| a <= o && o + n <= a + l);
        let pieces: u64 = reads
            .iter()
            .map(|&(a, l)| (a.max(o), (a + l).min(o + n)))
            .filter(|(a, b)| a < b)
            .map(|(a, b)| b - a)
            .sum();
        assert!(covered || pieces == n, "{name}: storage at {o}: {reads:?}");
    }
}

#[test]
fn a_file_read_by_ranges_loads_onto_the_host_as_the_local_file() {
    for name in [
        "wide_storages.pt",
        "multi_gpu.pt",
        "bigendian.pt",
        "legacy.pt",
    ] {
        let (file, ckpt) = remote(name);
        let local = open(name);
        let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
        let loaded = load_all(&ckpt, &plan, &probe(), &LoadOptions::default());
        // Everything was fetched by the load, ahead of the placement.
        fetched_once_and_all(name, &file, &ckpt);
        let reads = file.reads.lock().unwrap().len();
        let here = load_all(&local, &plan, &probe(), &LoadOptions::default());
        assert_eq!(loaded.tensors().len(), here.tensors().len(), "{name}");
        for (t, h) in loaded.tensors().iter().zip(here.tensors()) {
            assert_eq!(t.info.name, h.info.name);
            assert_eq!(
                loaded.elements(t).unwrap(),
                here.elements(h).unwrap(),
                "{name}: {}",
                t.info.name
            );
        }
        assert_eq!(file.reads.lock().unwrap().len(), reads, "{name}");
    }
}

#[test]
fn a_failing_request_while_loading_is_an_error_naming_the_file() {
    let (file, ckpt) = remote("wide_storages.pt");
    file.failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("plan");
    let Err(err) = load(
        Arc::clone(&ckpt),
        &everything(&ckpt),
        &plan,
        &probe(),
        &LoadOptions::default(),
    ) else {
        panic!("loaded from a failing file");
    };
    let text = err.to_string();
    assert!(text.contains("https://models.example/ckpt.pt"), "{text}");
    assert!(text.contains("connection reset"), "{text}");
}

#[test]
#[ignore = "needs a CUDA device: run with --ignored on a GPU machine"]
fn a_file_read_by_ranges_uploads_as_the_local_file() {
    let _turn = gpu_turn();
    let gpus = a_gpu();
    for name in ["wide_storages.pt", "multi_gpu.pt", "bigendian.pt"] {
        let (file, ckpt) = remote(name);
        let local = open(name);
        let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
        let loaded = load_all(&ckpt, &plan, &gpus, &LoadOptions::default());
        fetched_once_and_all(name, &file, &ckpt);
        let here = load_all(&local, &plan, &gpus, &LoadOptions::default());
        for (t, h) in loaded.tensors().iter().zip(here.tensors()) {
            assert_eq!(t.device, h.device, "{name}: {}", t.info.name);
            assert_eq!(
                loaded.elements(t).unwrap(),
                here.elements(h).unwrap(),
                "{name}: {}",
                t.info.name
            );
        }
    }
    // A request failing during the copies is the load's error, naming the
    // file; the copies already queued finish first (the simulator checks).
    let (file, ckpt) = remote("wide_storages.pt");
    file.failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let Err(err) = load(
        Arc::clone(&ckpt),
        &everything(&ckpt),
        &plan,
        &gpus,
        &LoadOptions::default(),
    ) else {
        panic!("loaded from a failing file");
    };
    let text = err.to_string();
    assert!(text.contains("https://models.example/ckpt.pt"), "{text}");
    assert!(!text.starts_with("cuda:"), "{text}");
}

/// Filled by positioned reads, a file cut short after it was opened is an
/// error naming the storage it could not read, never a crash (copying from
/// the map would fault on the missing pages) nor a partial tensor.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn a_file_cut_short_while_read_into_staging_is_an_error() {
    let _turn = gpu_turn();
    let gpus = a_gpu();
    let dir = std::env::temp_dir().join(format!("ptload-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("llama_wide.pt");
    std::fs::copy(fixture("llama_wide.pt"), &path).expect("copy");
    let ckpt = Arc::new(Checkpoint::open(&path).expect("open"));
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let len = std::fs::metadata(&path).expect("metadata").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("reopen")
        .set_len(len / 2)
        .expect("cut");
    let opts = LoadOptions {
        staging: ptload_device::Staging {
            fill: ptload_device::Fill::Read,
            ..Default::default()
        },
        ..Default::default()
    };
    let e = load(Arc::clone(&ckpt), &everything(&ckpt), &plan, &gpus, &opts)
        .expect_err("half the file is gone");
    let text = e.to_string();
    assert!(matches!(e, ptload_device::LoadError::Reader(_)), "{e:?}");
    assert!(
        text.contains("storage") && text.contains("reading"),
        "{text}"
    );
    drop(ckpt);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The simulated driver's count of host memory pinned now, in bytes
/// (`simcuda_host_pinning`, not a driver call); `None` on a real driver.
#[allow(unsafe_code)]
fn simulated_pinned_now() -> Option<u64> {
    type Counts = unsafe extern "C" fn(*mut u64, *mut u64, *mut u64);
    // SAFETY: dlopen with RTLD_NOLOAD only finds the library cudarc has
    // loaded; the symbol, when present, has the signature above.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if lib.is_null() {
            return None;
        }
        let f = libc::dlsym(lib, c"simcuda_host_pinning".as_ptr());
        let live = (!f.is_null()).then(|| {
            let f: Counts = std::mem::transmute(f);
            let mut live = 0u64;
            f(std::ptr::null_mut(), std::ptr::null_mut(), &mut live);
            live
        });
        libc::dlclose(lib);
        live
    }
}

/// Staging is one pool per process (`Staging::keep`, the default): the
/// first load pins its buffers in two driver calls (the workers' first
/// buffers, then their second ones); later loads onto the device pin
/// nothing, however many, and land the same bytes; released, the pool
/// is unpinned and the next load pins again; a load told not to keep
/// pins and unpins its own, leaving the pool as it was.
#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn staging_is_pinned_once_per_process_and_released_on_request() {
    let _turn = gpu_turn();
    let gpus = a_gpu();
    ptload_device::release_staging();
    let before = simulated_pinned_now();
    let ckpt = open("llama_wide.pt");
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Cuda(0))).expect("plan");
    let load_with = |keep: bool| {
        let opts = LoadOptions {
            staging: ptload_device::Staging {
                buffer_bytes: 1 << 20,
                streams_per_device: 4,
                keep,
                ..Default::default()
            },
            ..Default::default()
        };
        let loaded = load_all(&ckpt, &plan, &gpus, &opts);
        for t in loaded.tensors() {
            let want = ckpt
                .tensor_at(t.index)
                .expect("tensor")
                .data()
                .expect("data");
            assert_eq!(t.device, Device::Cuda(0), "{}", t.info.name);
            assert_eq!(
                &*loaded.elements(t).expect("elements"),
                &*want,
                "{}",
                t.info.name
            );
        }
        let report = loaded
            .devices()
            .iter()
            .find(|d| d.device == Device::Cuda(0))
            .cloned()
            .expect("cuda:0");
        (report.pinned_bytes, report.pinnings)
    };
    // 8 MB in 1 MiB runs: 4 workers, 2 buffers each, in two rounds.
    let first = load_with(true);
    assert_eq!(first, (8 << 20, 2));
    let pool = before.map(|b| b + (8 << 20));
    for _ in 0..20 {
        assert_eq!(load_with(true), (0, 0), "the kept buffers serve the load");
        assert_eq!(simulated_pinned_now(), pool, "no more pinned");
    }
    assert_eq!(ptload_device::release_staging(), first.0);
    assert_eq!(simulated_pinned_now(), before, "released: unpinned");
    assert_eq!(ptload_device::release_staging(), 0);
    assert_eq!(load_with(true), first, "released: pinned again");
    // A load that keeps nothing leaves the pool alone and unpins its own.
    assert_eq!(load_with(false), first, "not kept: pins its own");
    assert_eq!(
        simulated_pinned_now(),
        pool,
        "not kept: unpinned at the end"
    );
    assert_eq!(ptload_device::release_staging(), first.0);
    assert_eq!(simulated_pinned_now(), before);
}
