//! The fuzz targets of ptload, as plain functions.
//!
//! `fuzz/` (cargo-fuzz, libFuzzer) calls each of them with generated input;
//! `cargo test` replays them on a fixed set of seeds (the fixtures, the
//! hostile corpus, every regression file) so a finding, once fixed, stays
//! fixed. A target returns normally for every input: an `Err` from the
//! reader is a correct answer. It panics only when an invariant the reader
//! promises is broken, which is what the fuzzer reports.

use arbitrary::{Arbitrary, Unstructured};
use ptload_reader::checkpoint::StringEncoding;
use ptload_reader::export::SafetensorsOptions;
use ptload_reader::fuzzing::{read_container, run_pickle, Plain};
use ptload_reader::placement::{Device, DeviceMap, Keep, MapLocation, To};
use ptload_reader::scan::{classify, GlobalClass};
use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
use ptload_reader::tp::{Shard, Splits};
use ptload_reader::{Checkpoint, ErrorKind, Limits, OpenOptions, Policy};

pub mod craft;
mod differential;
mod output_paths;
mod structured;

pub use differential::{canonical, serde_pickle_agrees};
pub use output_paths::{output_paths, output_paths_bytes, Scene};
pub use structured::{structured, Model};

/// Limits for fuzzing: the defaults scaled down so one input stays within a
/// 2 GiB RSS limit and a few seconds, while every limit can still be hit.
pub fn limits() -> Limits {
    let mut l = Limits::default();
    l.max_pickle_bytes = 16 << 20;
    l.max_opcodes = 2_000_000;
    l.max_stack_depth = 100_000;
    l.max_memo_entries = 1_000_000;
    l.max_container_len = 1_000_000;
    l.max_objects = 2_000_000;
    l.max_decoded_bytes = 64 << 20;
    l.max_decompressed_bytes = 256 << 20;
    l.max_zip_entries = 100_000;
    l.max_tensors = 100_000;
    l.max_walk_steps = 2_000_000;
    l.max_shared_visits = 10_000;
    l.max_name_bytes = 64 << 20;
    l.max_expanded_view_bytes = 64 << 20;
    l
}

/// Every error must say what went wrong.
fn check_error(e: &ptload_reader::Error) {
    assert!(!e.message().is_empty(), "error without a message: {e:?}");
    assert!(!e.to_string().is_empty());
}

/// The pickle VM with the torch interpreter, on one pickle program.
pub fn pickle_vm(data: &[u8]) {
    let limits = limits();
    for encoding in [StringEncoding::Utf8, StringEncoding::Bytes] {
        if let Err(e) = run_pickle(data, &limits, encoding) {
            check_error(&e);
        }
    }
}

/// The container layer: layout detection, zip directory and records
/// (inflated and CRC-checked), the legacy stream.
pub fn container(data: &[u8]) {
    if let Err(e) = read_container(data, &limits()) {
        check_error(&e);
    }
}

/// A whole checkpoint: open it under both policies, read every tensor,
/// place it with a mapper, classify its globals, and export it.
pub fn checkpoint(data: &[u8]) {
    let limits = limits();
    let default = OpenOptions::new()
        .limits(limits.clone())
        .open_bytes(data.to_vec());
    let strict = OpenOptions::new()
        .limits(limits)
        .policy(Policy::Strict)
        .open_bytes(data.to_vec());
    // Strict only ever refuses more: what it opens, the default opens the same.
    match (&default, &strict) {
        (Ok(d), Ok(s)) => {
            let names =
                |c: &Checkpoint| c.tensors().map(|t| t.name().to_owned()).collect::<Vec<_>>();
            assert_eq!(names(d), names(s), "policies disagree on tensors");
        }
        (Err(e), Ok(_)) => panic!("strict opened what the default policy refused: {e}"),
        (Ok(_), Err(e)) => assert!(
            e.kind() == ErrorKind::UnsupportedGlobal,
            "strict failed with a non-policy error the default did not see: {e}"
        ),
        (Err(_), Err(_)) => {}
    }
    if let Err(e) = &strict {
        check_error(e);
    }
    // The object graph (what ptload.torch.load rebuilds): every node's
    // members exist, and every tensor it holds reads.
    let with_objects = OpenOptions::new()
        .limits(self::limits())
        .objects(true)
        .open_bytes(data.to_vec());
    if let Some(objects) = with_objects.as_ref().ok().and_then(|c| c.objects()) {
        assert!(
            objects.node(objects.root()).is_some(),
            "root outside the graph"
        );
        if let Ok(c) = &with_objects {
            for i in 0..objects.tensors().len() {
                if let Some(view) = c.object_tensor(i) {
                    let _ = view.data();
                }
            }
        }
    }
    // A plain state dict is read by a shortcut unless the object graph is
    // asked for: what the default open found, the general path finds.
    if let (Ok(d), Ok(o)) = (&default, &with_objects) {
        let infos = |c: &Checkpoint| c.tensors().map(|t| t.info().clone()).collect::<Vec<_>>();
        assert_eq!(
            infos(d),
            infos(o),
            "the shortcut and the general path disagree"
        );
        assert_eq!(d.globals(), o.globals(), "globals differ between the paths");
        assert_eq!(
            format!("{:?}", d.storages()),
            format!("{:?}", o.storages()),
            "storages differ between the paths"
        );
    }
    match default {
        Ok(ckpt) => {
            exercise(&ckpt);
            exercise_plans(std::sync::Arc::new(ckpt));
        }
        Err(e) => check_error(&e),
    }
}

/// Tensor-parallel slices along dim 0 of three ranks, put back together,
/// are the whole tensor's elements (row-major order keeps dim 0 outermost).
fn exercise_slices(ckpt: &Checkpoint) {
    // A rule per name (each matching itself, at least), for tensors that
    // can be split; bounded, as every rule is tried on every name.
    if ckpt.len() > 256 {
        return;
    }
    let rules: Vec<String> = ckpt
        .tensors()
        .filter(|t| !t.shape().is_empty() && t.info().quantization.is_none())
        .map(|t| format!("{}=0", t.name()))
        .collect();
    let Ok(splits) = Splits::parse(&rules) else {
        return;
    };
    let world = 3;
    let mut parts: Vec<Option<Vec<u8>>> = Vec::new();
    for rank in 0..world {
        let Ok(shard) = Shard::new(rank, world) else {
            return;
        };
        let opts = StateDictOptions {
            key: KeySelect::All,
            strip: Strip::None,
            parallel: Some((shard, splits.clone())),
            ..Default::default()
        };
        let sd = match opts.select(ckpt) {
            Ok(sd) => sd,
            Err(e) => return check_error(&e),
        };
        for (i, (_, view)) in sd.tensors().enumerate() {
            if rank == 0 {
                parts.push(Some(Vec::new()));
            }
            let Some(Some(acc)) = parts.get_mut(i) else {
                continue;
            };
            match view.data() {
                Ok(bytes) => acc.extend_from_slice(&bytes),
                Err(e) => {
                    check_error(&e);
                    parts[i] = None;
                }
            }
        }
    }
    let every = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let Ok(sd) = every.select(ckpt) else { return };
    for ((name, view), joined) in sd.tensors().zip(&parts) {
        let split = !view.shape().is_empty() && view.info().quantization.is_none();
        if let (Some(joined), Ok(whole), true) = (joined, view.data(), split) {
            assert!(
                *joined == *whole,
                "tensor {name}: its three slices differ from it"
            );
        }
    }
}

/// Read plans over the checkpoint as a set of one: each rank of a read-once
/// plan takes an equal share, and together the ranks of a node cover the
/// stored bytes once; a sliced plan's ranks read no more than the whole.
fn exercise_plans(ckpt: std::sync::Arc<Checkpoint>) {
    use ptload_reader::read_plan::ReadPlan;
    let Ok(set) = ptload_reader::set::CheckpointSet::of("fuzzed.pt", ckpt) else {
        return;
    };
    let every = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let limits = limits();
    match ReadPlan::read_once(&set, &every, 4, 2, &limits) {
        Ok(plan) => {
            for node in 0..2 {
                let ranks = plan.ranks.iter().filter(|r| r.node == node);
                let total: u64 = ranks
                    .clone()
                    .flat_map(|r| &r.ranges)
                    .map(|g| g.len * g.count)
                    .sum();
                assert_eq!(total, plan.total_bytes, "node {node} reads every byte once");
                let shares: Vec<u64> = ranks.map(|r| r.bytes).collect();
                let (lo, hi) = (shares.iter().min(), shares.iter().max());
                assert!(hi.zip(lo).is_none_or(|(h, l)| h - l <= 1), "{shares:?}");
            }
        }
        Err(e) => check_error(&e),
    }
    let Ok(splits) = Splits::parse(&["*=replicate"]) else {
        return;
    };
    match ReadPlan::sliced(&set, &every, &splits, 2, 1, &limits) {
        // Everything replicated: each rank reads what the tensors span.
        Ok(plan) => {
            for r in &plan.ranks {
                let bytes: u64 = r.ranges.iter().map(|g| g.len * g.count).sum();
                assert_eq!(bytes, r.bytes);
            }
        }
        Err(e) => check_error(&e),
    }
}

/// Everything a user can do with an open checkpoint, with the invariants
/// each promises.
pub fn exercise(ckpt: &Checkpoint) {
    for t in ckpt.tensors() {
        let expected = t.info().nbytes;
        match t.data() {
            Ok(bytes) => {
                assert_eq!(
                    bytes.len() as u64,
                    expected,
                    "tensor {} data length",
                    t.name()
                );
                let mut seen = Vec::new();
                t.visit_bytes(|chunk| seen.extend_from_slice(chunk))
                    .unwrap_or_else(|e| {
                        panic!("data() read {} but visit_bytes failed: {e}", t.name())
                    });
                assert!(
                    seen == *bytes,
                    "tensor {}: visit_bytes and data() differ",
                    t.name()
                );
                // The same view over a copy of its storage, where no swap
                // or conj/neg bit changes the bytes.
                let info = t.info();
                let plain = ckpt.byte_order() == ptload_reader::checkpoint::ByteOrder::HOST
                    && !info.neg
                    && !(info.conj && info.dtype.is_complex());
                if let (true, Ok(storage)) = (plain, t.storage_bytes()) {
                    let gathered = info.gather(storage).unwrap_or_else(|e| {
                        panic!("data() read {} but gather failed: {e}", t.name())
                    });
                    assert!(
                        gathered == *bytes,
                        "tensor {}: gather and data() differ",
                        t.name()
                    );
                }
            }
            Err(e) => check_error(&e),
        }
    }
    exercise_slices(ckpt);
    for g in ckpt.globals() {
        let _: GlobalClass = classify(&g.module, &g.name);
    }
    // The default selection (key auto, prefixes stripped): every name it
    // gives is found by that name, and its decisions are sentences.
    let mut key = None;
    match ptload_reader::state_dict::StateDictOptions::default().select(ckpt) {
        Ok(sd) => {
            for entry in sd.iter() {
                assert!(
                    sd.get(&entry.name).is_some(),
                    "{} not found by name",
                    entry.name
                );
            }
            assert!(sd.decisions().iter().all(|d| !d.to_string().is_empty()));
            key = sd.key().map(str::to_owned);
        }
        Err(e) => check_error(&e),
    }
    let plan = DeviceMap::new(ckpt, &mut To(Device::Host))
        .unwrap_or_else(|e| panic!("placing everything on the host failed: {e}"));
    assert_eq!(plan.placements().len(), ckpt.storages().len());
    if let Err(e) = DeviceMap::new(ckpt, &mut Keep) {
        check_error(&e);
    }
    let mut out = Vec::new();
    let opts = SafetensorsOptions {
        skip_unsupported: true,
        // The selection's values (or all of them, with no key): names
        // with any bytes go to the header as JSON strings.
        metadata: ptload_reader::export::Metadata::Selected { key },
        ..Default::default()
    };
    // Names need not be unique across a whole checkpoint's walk only when
    // the file is odd; the writer must then refuse, never write a bad file.
    let every = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let selection = match every.select(ckpt) {
        Ok(sd) => sd,
        Err(e) => return check_error(&e),
    };
    match ptload_reader::export::Export::state_dict(&selection, &opts).to_writer(&mut out) {
        Ok(written) => {
            let st = safetensors::SafeTensors::deserialize(&out)
                .unwrap_or_else(|e| panic!("wrote a safetensors file its library rejects: {e}"));
            assert_eq!(st.len(), written.tensors);
            for (name, view) in st.tensors() {
                let t = ckpt
                    .tensor(&name)
                    .unwrap_or_else(|| panic!("wrote unknown tensor {name}"));
                if let Ok(bytes) = t.data() {
                    assert!(
                        view.data() == &*bytes,
                        "tensor {name}: exported bytes differ"
                    );
                }
            }
        }
        Err(e) => check_error(&e),
    }
}

/// The map-location spec parser and the glob matcher, on any text.
pub fn map_location(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<MapLocation>() {
        Ok(spec) => {
            // What parses prints back to something that parses the same.
            if let MapLocation::Table(table) = &spec {
                let again: String = table
                    .iter()
                    .map(|(from, to)| format!("{from}={to}"))
                    .collect::<Vec<_>>()
                    .join(",");
                let reparsed: MapLocation = again
                    .parse()
                    .unwrap_or_else(|e| panic!("{again:?} (from {text:?}) does not parse: {e}"));
                assert_eq!(reparsed, spec, "round trip of {text:?}");
            }
            let _ = spec.mapper(|| 2);
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidSpec);
            check_error(&e);
        }
    }
    if let Some((pattern, name)) = text.split_once('\n') {
        let _ = ptload_reader::placement::glob(pattern, name);
    }
}

/// Our VM against serde-pickle on plain-data pickles: where both decode,
/// they decode the same value. See [`serde_pickle_agrees`].
pub fn differential(data: &[u8]) {
    if let Err(why) = serde_pickle_agrees(data) {
        panic!("{why}");
    }
}

/// Generate a valid checkpoint from the input, check that it reads back
/// exactly, then mutate it and check the reader holds.
pub fn structured_bytes(data: &[u8]) {
    let mut u = Unstructured::new(data);
    if let Ok(model) = Model::arbitrary(&mut u) {
        structured(&model);
    }
}

/// What [`Plain`] each target sees, for the differential target's tests.
pub fn plain(data: &[u8]) -> Option<Plain> {
    run_pickle(data, &limits(), StringEncoding::Bytes)
        .ok()
        .and_then(|run| run.plain)
}

/// A distributed checkpoint as one fuzz input: records of a one-byte name
/// length, the name, a little-endian u32 length and the bytes; the record
/// named `.metadata` is the metadata, the others its files (with no
/// metadata record: a Hugging Face-format save of `.safetensors` files).
pub fn dcp_input(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, bytes) in files {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// The records of a [`dcp_input`]; a record cut short ends the list.
fn dcp_records(mut data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some((&n, rest)) = data.split_first() {
        let Some((name, rest)) = rest.split_at_checked(n as usize) else {
            break;
        };
        let Some((len, rest)) = rest.split_first_chunk::<4>() else {
            break;
        };
        let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
        let (bytes, rest) = rest.split_at(len);
        out.push((String::from_utf8_lossy(name).into_owned(), bytes.to_vec()));
        data = rest;
    }
    out
}

/// A distributed checkpoint (`.metadata` and its files, see
/// [`dcp_input`]): open it, read every tensor whole and as three ranks'
/// slices along each dimension (which must put the whole back together),
/// and every non-tensor item. Returns how many tensors read whole.
pub fn dcp(data: &[u8]) -> usize {
    use ptload_reader::dcp::Dcp;
    let records = dcp_records(data);
    // `.metadata`, or each rank's `__R.metadata` in rank order.
    let (mut metadata, files): (Vec<_>, Vec<_>) = records
        .into_iter()
        .partition(|(n, _)| n.ends_with(".metadata"));
    metadata.sort_by_key(|(n, _)| {
        n.strip_prefix("__")
            .and_then(|r| r.strip_suffix(".metadata"))
            .and_then(|r| r.parse::<u64>().ok())
    });
    if metadata.len() > 1 && metadata.iter().any(|(n, _)| n == ".metadata") {
        metadata.retain(|(n, _)| n == ".metadata");
    }
    if metadata.len() > 64 || (metadata.is_empty() && files.len() > 64) {
        return 0;
    }
    let metadata: Vec<&[u8]> = metadata.iter().map(|(_, b)| b.as_slice()).collect();
    let opts = OpenOptions::new().limits(limits());
    let dcp = match Dcp::from_memory(&metadata, files, &opts) {
        Ok(d) => d,
        Err(e) => {
            check_error(&e);
            return 0;
        }
    };
    let mut read = 0;
    let items: Vec<String> = dcp.items().map(str::to_owned).collect();
    for name in items.iter().take(64) {
        if let Err(e) = dcp.read_item(name) {
            check_error(&e);
        }
    }
    for t in dcp.tensors().iter().take(64) {
        // Bounded harness work: a dimension of zero makes the byte count
        // small whatever the others say.
        let dense = t
            .shape()
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d.max(1)));
        if dense.is_none_or(|n| n.saturating_mul(t.dtype().size() as u64) > 16 << 20) {
            continue;
        }
        let whole = match dcp.read_tensor(t.name()) {
            Ok(w) => w,
            Err(e) => {
                check_error(&e);
                continue;
            }
        };
        assert_eq!(whole.len() as u64, t.nbytes(), "{}: whole size", t.name());
        read += 1;
        for dim in 0..t.shape().len().min(4) {
            let mut parts = Vec::new();
            for rank in 0..3 {
                let shard = Shard::new(rank, 3).expect("shard");
                match dcp.read_slice(t.name(), dim, shard) {
                    Ok((shape, bytes)) => parts.push((shape, bytes)),
                    Err(e) => panic!("{}: the whole read but a slice failed: {e}", t.name()),
                }
            }
            // Put the slices back together along `dim` and compare.
            let elem = t.dtype().size();
            let outer: u64 = t.shape()[..dim].iter().product();
            let mut joined = Vec::with_capacity(whole.len());
            for o in 0..outer as usize {
                for (shape, bytes) in &parts {
                    let run = shape[dim..].iter().product::<u64>() as usize * elem;
                    joined.extend_from_slice(&bytes[o * run..(o + 1) * run]);
                }
            }
            assert!(
                joined == whole,
                "{}: slices along {dim} differ from the whole",
                t.name()
            );
        }
    }
    read
}
