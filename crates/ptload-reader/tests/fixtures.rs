//! The reader against checkpoints written by real torch, compared with the
//! answers torch itself computed (fixtures/generate.py).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ptload_reader::checkpoint::{Quantization, Scalar};
use ptload_reader::{Checkpoint, DType, Element, ErrorKind, TensorView};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn expected(file: &str) -> Json {
    let path = root().join("expected").join(format!("{file}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sha256_of(view: &ptload_reader::TensorView<'_>) -> String {
    let mut h = Sha256::new();
    view.visit_bytes(|chunk| h.update(chunk))
        .expect("visit bytes");
    hex::encode(h.finalize())
}

/// The typed reads give exactly `data()`'s bytes: borrowed when
/// `as_slice` can borrow, which it does whenever `data()` borrowed and the
/// address suits the type; any other element type is refused.
fn typed_access(view: &TensorView<'_>, data: &[u8], borrowed: bool) {
    fn check<T: Element>(view: &TensorView<'_>, data: &[u8], borrowed: bool) {
        let name = view.name();
        let owned = view.to_vec::<T>().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            bytemuck::cast_slice::<T, u8>(&owned),
            data,
            "{name}: to_vec"
        );
        let cow = view.to_cow::<T>().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(bytemuck::cast_slice::<T, u8>(&cow), data, "{name}: to_cow");
        match view.as_slice::<T>() {
            Ok(slice) => {
                assert_eq!(bytemuck::cast_slice::<T, u8>(slice), data, "{name}");
                assert!(matches!(cow, Cow::Borrowed(_)), "{name}: to_cow copied");
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::NotBorrowable, "{name}: {e}");
                let aligned = data.as_ptr() as usize % std::mem::align_of::<T>() == 0;
                assert!(
                    !borrowed || !aligned,
                    "{name}: data() borrowed an aligned slice that as_slice refused: {e}"
                );
            }
        }
        let wrong = if T::DTYPE == DType::U8 {
            view.as_slice::<i8>().map(|_| ())
        } else {
            view.as_slice::<u8>().map(|_| ())
        };
        assert_eq!(
            wrong.unwrap_err().kind(),
            ErrorKind::DTypeMismatch,
            "{name}"
        );
    }
    match view.dtype() {
        DType::F64 => check::<f64>(view, data, borrowed),
        DType::F32 => check::<f32>(view, data, borrowed),
        #[cfg(feature = "half")]
        DType::F16 => check::<half::f16>(view, data, borrowed),
        #[cfg(feature = "half")]
        DType::BF16 => check::<half::bf16>(view, data, borrowed),
        DType::I8 => check::<i8>(view, data, borrowed),
        DType::I16 => check::<i16>(view, data, borrowed),
        DType::I32 => check::<i32>(view, data, borrowed),
        DType::I64 => check::<i64>(view, data, borrowed),
        DType::U8 => check::<u8>(view, data, borrowed),
        DType::U16 => check::<u16>(view, data, borrowed),
        DType::U32 => check::<u32>(view, data, borrowed),
        DType::U64 => check::<u64>(view, data, borrowed),
        _ => assert_eq!(
            view.as_slice::<u8>().unwrap_err().kind(),
            ErrorKind::DTypeMismatch
        ),
    }
}

fn scalar_json(s: &Scalar) -> Option<Json> {
    Some(match s {
        Scalar::None => Json::Null,
        Scalar::Bool(b) => Json::Bool(*b),
        Scalar::Int(i) => Json::from(*i),
        Scalar::Float(f) => Json::from(*f),
        Scalar::Str(s) => Json::from(s.as_str()),
        _ => return None,
    })
}

fn check(file: &str) {
    let want = expected(file);
    let path = root().join("files").join(file);
    let opened = Checkpoint::open(&path);
    if let Some(err) = want["error"].as_str() {
        let e = opened.expect_err("torch's answer says this file is not readable");
        let message = e.to_string().to_lowercase();
        assert!(
            message.contains(err),
            "{file}: error {message:?} lacks {err:?}"
        );
        return;
    }
    let ckpt = opened.unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(ckpt.format().name(), want["format"], "{file}: format");
    assert_eq!(
        ckpt.byte_order().name(),
        want["byteorder"],
        "{file}: byte order"
    );
    assert_eq!(
        u64::from(ckpt.pickle_protocol()),
        want["pickle_protocol"],
        "{file}: pickle protocol"
    );

    let want_tensors = want["tensors"].as_array().expect("tensors");
    let names: Vec<&str> = ckpt.tensors().map(|t| t.name()).collect();
    let want_names: Vec<&str> = want_tensors
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, want_names, "{file}: tensor names and order");

    for (view, w) in ckpt.tensors().zip(want_tensors) {
        let name = view.name();
        assert_eq!(view.dtype().name(), w["dtype"], "{file}: {name}: dtype");
        assert_eq!(
            Json::from(view.shape().to_vec()),
            w["shape"],
            "{file}: {name}: shape"
        );
        assert_eq!(
            Json::from(view.stride().to_vec()),
            w["stride"],
            "{file}: {name}: stride"
        );
        assert_eq!(
            view.storage_offset(),
            w["storage_offset"],
            "{file}: {name}: storage offset"
        );
        assert_eq!(view.location(), w["location"], "{file}: {name}: location");
        let quantization = view.info().quantization.as_ref().map(|q| match q {
            Quantization::PerTensor {
                kind,
                scheme,
                scale,
                zero_point,
                values_shape,
            } => with_values_shape(
                serde_json::json!({
                    "kind": kind, "scheme": scheme, "scale": scale, "zero_point": zero_point
                }),
                values_shape,
            ),
            Quantization::PerChannel {
                kind,
                scheme,
                axis,
                values_shape,
            } => with_values_shape(
                serde_json::json!({"kind": kind, "scheme": scheme, "axis": axis}),
                values_shape,
            ),
            other => panic!("{file}: {name}: {other:?}"),
        });
        assert_eq!(
            quantization.unwrap_or(Json::Null),
            w["quantization"],
            "{file}: {name}: quantization"
        );
        if !w["storage"].is_null() {
            let key = view.storage().map(|s| s.key.as_str());
            assert_eq!(key, w["storage"].as_str(), "{file}: {name}: storage key");
        }
        match w["sha256"].as_str() {
            Some(digest) => {
                assert_eq!(sha256_of(&view), digest, "{file}: {name}: bytes");
                let data = view.data().expect("data");
                assert_eq!(
                    data.len() as u64,
                    view.info().nbytes,
                    "{file}: {name}: data length"
                );
                typed_access(&view, &data, matches!(data, Cow::Borrowed(_)));
            }
            None => assert!(
                view.data().is_err(),
                "{file}: {name}: a meta tensor has no data"
            ),
        }
        for flag in ["conj", "neg"] {
            if let Some(b) = w[flag].as_bool() {
                let got = if flag == "conj" {
                    view.info().conj
                } else {
                    view.info().neg
                };
                assert_eq!(got, b, "{file}: {name}: {flag} bit");
            }
        }
    }

    // Plain values: exactly torch's, both ways.
    let want_values = want["values"].as_object().expect("values");
    let mut ours = serde_json::Map::new();
    for (name, scalar) in ckpt.values() {
        if let Some(j) = scalar_json(scalar) {
            ours.insert(name.clone(), j);
        }
    }
    let keys: BTreeSet<&String> = ours.keys().collect();
    let want_keys: BTreeSet<&String> = want_values.keys().collect();
    assert_eq!(keys, want_keys, "{file}: value names");
    for (k, v) in want_values {
        let got = &ours[k];
        match (v.as_f64(), got.as_f64()) {
            (Some(a), Some(b)) if v.is_f64() || got.is_f64() => {
                assert_eq!(a, b, "{file}: value {k}")
            }
            _ => assert_eq!(got, v, "{file}: value {k}"),
        }
    }
}

macro_rules! fixtures {
    ($($test:ident => $file:literal,)*) => {
        $(#[test] fn $test() { check($file); })*
        const COVERED: &[&str] = &[$($file),*];
    };
}

fixtures! {
    align4096 => "align4096.pt",
    basic => "basic.pt",
    bigendian => "bigendian.pt",
    compiled => "compiled.pt",
    conj_neg => "conj_neg.pt",
    conversions => "conversions.pt",
    dataparallel => "dataparallel.pt",
    dino => "dino.pth",
    deflated => "deflated.pt",
    download_html => "download.html.pt",
    dtypes => "dtypes.pt",
    empty => "empty.pt",
    hf_lm => "hf_lm.pt",
    llama_tiny => "llama_tiny.pt",
    llama_wide => "llama_wide.pt",
    legacy => "legacy.pt",
    legacy_proto0 => "legacy_proto0.pt",
    legacy_proto1 => "legacy_proto1.pt",
    legacy_proto4 => "legacy_proto4.pt",
    legacy_views => "legacy_views.pt",
    lightning => "lightning.ckpt",
    lightning_loops => "lightning_loops.ckpt",
    lfs_pointer => "lfs_pointer.pt",
    many_tensors => "many_tensors.pt",
    meta => "meta.pt",
    model_ema => "model_ema.pth",
    multi_gpu => "multi_gpu.pt",
    parameter_state => "parameter_state.pt",
    plain_model => "plain_model.pt",
    pre1_0_tar => "pre1.0_tar.pt",
    prefixed => "prefixed.pt",
    proto1 => "proto1.pt",
    proto3 => "proto3.pt",
    proto4 => "proto4.pt",
    proto5 => "proto5.pt",
    quantized => "quantized.pt",
    quantized_dynamic_script => "quantized_dynamic_script.pt",
    quantized_dynamic_traced => "quantized_dynamic_traced.pt",
    quantized_frozen => "quantized_frozen.pt",
    quantized_script => "quantized_script.pt",
    quantized_traced => "quantized_traced.pt",
    random => "random.bin",
    resemblyzer => "resemblyzer.pt",
    sparse => "sparse.pt",
    st_dtypes => "st_dtypes.safetensors",
    st_shard_1 => "st_sharded/model-00001-of-00002.safetensors",
    st_shard_2 => "st_sharded/model-00002-of-00002.safetensors",
    stream => "stream.pt",
    tensor_root => "tensor_root.pt",
    torchscript => "torchscript.pt",
    training => "training.ckpt",
    training_rng => "training_rng.ckpt",
    truncated => "truncated.pt",
    views => "views.pt",
    weights_safetensors => "weights.safetensors.pt",
    whole_module => "whole_module.pt",
    wide_storages => "wide_storages.pt",
}

#[test]
fn every_generated_fixture_is_tested() {
    let mut missing = Vec::new();
    // The answers of a set's files lie in a folder named as the set's.
    let mut dirs = vec![(root().join("expected"), String::new())];
    while let Some((dir, prefix)) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("expected dir") {
            let entry = entry.expect("entry");
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.path().is_dir() {
                dirs.push((entry.path(), format!("{name}/")));
                continue;
            }
            let file = name.strip_suffix(".json").expect("json");
            if !COVERED.contains(&file) {
                missing.push(file.to_owned());
            }
        }
    }
    assert!(missing.is_empty(), "fixtures without a test: {missing:?}");
}

/// torch's answer for a packed kind carries the shape of its values.
fn with_values_shape(mut doc: Json, values_shape: &Option<Vec<u64>>) -> Json {
    if let (Some(shape), Some(map)) = (values_shape, doc.as_object_mut()) {
        map.insert("values_shape".into(), Json::from(shape.clone()));
    }
    doc
}

/// Bytes handed to `from_bytes` are read where they lie: a contiguous
/// tensor's data points into the caller's buffer, whoever owns it.
#[test]
fn bytes_handed_over_are_read_in_place() {
    fn inside(outer: &[u8], inner: &[u8]) -> bool {
        let range = outer.as_ptr_range();
        range.start <= inner.as_ptr() && inner.as_ptr_range().end <= range.end
    }
    let path = root().join("files/basic.pt");
    let shared: std::sync::Arc<[u8]> = std::fs::read(&path).unwrap().into();
    let ckpt = Checkpoint::from_bytes(std::sync::Arc::clone(&shared)).unwrap();
    let data = ckpt.tensor("0.weight").unwrap().data().unwrap();
    assert!(matches!(data, Cow::Borrowed(_)));
    assert!(inside(&shared, &data));
    static BASIC: &[u8] = include_bytes!("../../../fixtures/files/basic.pt");
    let ckpt = Checkpoint::from_bytes(BASIC).unwrap();
    let weight = ckpt.tensor("0.weight").unwrap();
    assert!(inside(BASIC, &weight.data().unwrap()));
    let from_file = Checkpoint::open(&path).unwrap();
    let want = from_file
        .tensor("0.weight")
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(weight.to_cow::<f32>().unwrap().as_ref(), want.as_slice());
}

/// A legacy file's pickles are followed by every tensor's bytes, and the
/// reader reserves room for what a pickle can make from the bytes after
/// it: that room is capped, so a huge legacy file costs what a small one
/// does. torch's legacy.pt with a sparse tail making it 200 GiB opens and
/// reads as the file itself (uncapped, the open asked the allocator for a
/// quarter of the file's length at once and died).
#[test]
fn a_huge_legacy_file_opens_like_a_small_one() {
    let small = root().join("files/legacy.pt");
    let dir = std::env::temp_dir().join(format!("ptload-huge-legacy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let huge = dir.join("legacy.pt");
    std::fs::copy(&small, &huge).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&huge)
        .and_then(|f| f.set_len(200 << 30))
        .unwrap();
    let want = Checkpoint::open(&small).unwrap();
    let got = Checkpoint::open(&huge);
    std::fs::remove_dir_all(&dir).unwrap();
    let got = got.unwrap();
    assert_eq!(got.len(), want.len());
    assert!(!want.is_empty());
    for (a, b) in got.tensors().zip(want.tensors()) {
        assert_eq!(a.name(), b.name());
        assert_eq!(a.data().unwrap(), b.data().unwrap(), "{}", a.name());
    }
}

/// `deflated.pt` with the deflated bytes of `record` damaged: found from
/// the local header that names it.
fn with_damaged_record(record: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(root().join("files/deflated.pt")).unwrap();
    let name = record.as_bytes();
    let at = (30..bytes.len() - name.len())
        .find(|&i| &bytes[i..i + name.len()] == name && bytes[i - 30..i - 26] == *b"PK\x03\x04")
        .expect("a local header names the record");
    let header = at - 30;
    let extra = u16::from_le_bytes([bytes[header + 28], bytes[header + 29]]) as usize;
    let compressed =
        u32::from_le_bytes(bytes[header + 18..header + 22].try_into().unwrap()) as usize;
    let start = at + name.len() + extra;
    for b in &mut bytes[start..start + compressed] {
        *b ^= 0x5a;
    }
    bytes
}

#[test]
fn deflated_storages_are_inflated_when_read_not_at_open() {
    // A repacked archive with deflated storage records: opening it (what
    // inspect and scan do) inflates none of them, so a damaged one is only
    // an error for the tensors that read it.
    let whole = Checkpoint::open(root().join("files/deflated.pt")).unwrap();
    let victim = whole.storages()[0].record.clone().expect("a zip record");
    let ckpt = Checkpoint::from_bytes(with_damaged_record(&victim)).expect("opens");
    assert_eq!(ckpt.len(), whole.len());
    let mut failed = 0;
    for (ours, theirs) in ckpt.tensors().zip(whole.tensors()) {
        assert_eq!(ours.name(), theirs.name());
        assert_eq!(ours.info(), theirs.info());
        if ours.info().storage == Some(0) {
            let e = ours.data().expect_err("the damaged record");
            assert_eq!(e.kind(), ErrorKind::Zip, "{e}");
            assert_eq!(e.record(), Some(victim.as_str()), "{e}");
            failed += 1;
        } else {
            assert_eq!(
                ours.data().unwrap(),
                theirs.data().unwrap(),
                "{}",
                ours.name()
            );
        }
    }
    assert!(failed > 0);
}

/// A deflated record read whole into a buffer of the reader's own
/// (`read_storage_at`, what Python's `torch.load` does) is inflated
/// straight into it: the same bytes as the kept inflation, before and
/// after a borrowing reader inflated it; a damaged record, or a buffer of
/// another size, is an error naming the record.
#[test]
fn deflated_storages_inflate_into_the_reader_s_buffer() {
    let path = root().join("files/deflated.pt");
    let owned = Checkpoint::open(&path).unwrap();
    let kept = Checkpoint::open(&path).unwrap();
    assert!(!owned.storages().is_empty());
    for (i, s) in owned.storages().iter().enumerate() {
        let mut buf = vec![0u8; s.nbytes as usize];
        owned.read_storage_at(i, 0, &mut buf).unwrap();
        assert_eq!(buf, kept.storage_bytes(i).unwrap(), "storage {i}");
        // Once inflated and kept, copied from there.
        let mut again = vec![0u8; s.nbytes as usize];
        kept.read_storage_at(i, 0, &mut again).unwrap();
        assert_eq!(again, buf);
        // A part of it: from the kept inflation.
        if s.nbytes > 8 {
            let mut part = [0u8; 4];
            owned.read_storage_at(i, 4, &mut part).unwrap();
            assert_eq!(part, buf[4..8]);
        }
    }
    let victim = owned.storages()[0].record.clone().expect("a zip record");
    let damaged = Checkpoint::from_bytes(with_damaged_record(&victim)).expect("opens");
    let mut buf = vec![0u8; damaged.storages()[0].nbytes as usize];
    let e = damaged
        .read_storage_at(0, 0, &mut buf)
        .expect_err("damaged");
    assert_eq!(e.kind(), ErrorKind::Zip, "{e}");
    assert_eq!(e.record(), Some(victim.as_str()), "{e}");
}

fn ckpt_len(file: &str) -> u64 {
    Checkpoint::open(root().join("files").join(file))
        .expect("open")
        .len() as u64
}

/// Advice is data: a refused file's error carries the globals to allow, a
/// limit's error the limit and its value; the reader's own text names no
/// front end's option, and `Display` leaves the source to a chain printer
/// (`render` gives the whole chain).
#[test]
fn errors_carry_their_advice_as_data() {
    use ptload_reader::advice::{Hint, Neutral};
    use ptload_reader::{Limits, OpenOptions, Policy};

    let files = root().join("files");
    let e = OpenOptions::new()
        .policy(Policy::Strict)
        .open(files.join("whole_module.pt"))
        .expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::UnsupportedGlobal);
    match e.hint() {
        Some(Hint::AllowGlobals(names)) => {
            assert_eq!(names.len(), 7, "{names:?}");
            assert_eq!(names[0], "__main__.WholeNet");
        }
        other => panic!("{other:?}: {e}"),
    }
    let text = e.to_string();
    assert!(
        !text.contains("--") && !text.contains("OpenOptions::"),
        "{text}"
    );
    assert!(
        text.contains("allow those you trust with the allowlist"),
        "{text}"
    );

    let mut limits = Limits::default();
    limits.max_tensors = 1;
    let e = OpenOptions::new()
        .limits(limits)
        .open(files.join("plain_model.pt"))
        .expect_err("over the limit");
    assert_eq!(e.kind(), ErrorKind::LimitExceeded);
    assert_eq!(
        e.hint(),
        Some(&Hint::RaiseLimit {
            limit: "max_tensors",
            value: 1,
            needed: Some(ckpt_len("plain_model.pt")),
        })
    );

    let e = Checkpoint::open(files.join("no such file.pt")).expect_err("missing");
    let source = std::error::Error::source(&e)
        .expect("the io error")
        .to_string();
    assert!(!e.to_string().contains(&source), "{e}");
    assert!(e.render(&Neutral).ends_with(&format!(": {source}")), "{e}");
}

/// Positioned reads of storages (for filling buffers of one's own) give
/// the map's bytes, whatever the window, in zip and legacy files and in a
/// checkpoint held in memory; a window past a storage is an error, never
/// a short or zero-filled read.
#[test]
fn positioned_storage_reads_equal_the_map() {
    for file in ["dtypes.pt", "legacy.pt", "bigendian.pt", "llama_tiny.pt"] {
        let path = root().join("files").join(file);
        let mapped = Checkpoint::open(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let held = Checkpoint::from_bytes(std::fs::read(&path).expect("read")).expect("bytes");
        assert!(mapped.is_mapped() && !held.is_mapped());
        for ckpt in [&mapped, &held] {
            for (i, s) in ckpt.storages().iter().enumerate() {
                let whole = ckpt.storage_bytes(i).expect("bytes");
                let n = whole.len();
                for (from, len) in [(0, n), (n / 3, n - n / 3), (n / 2, n / 4), (n, 0)] {
                    let mut out = vec![0xAB; len];
                    ckpt.read_storage_at(i, from as u64, &mut out)
                        .unwrap_or_else(|e| panic!("{file} storage {i}: {e}"));
                    assert_eq!(out, whole[from..from + len], "{file} storage {i} at {from}");
                }
                let mut past = vec![0; 1];
                let e = ckpt
                    .read_storage_at(i, s.nbytes, &mut past)
                    .expect_err("past the storage");
                assert!(e.to_string().contains("outside"), "{e}");
            }
        }
    }
}

/// Three objects saved one after another on one stream: each starts where
/// torch's stream was when it read it and ends where torch left it, with
/// torch's tensors and values (the first is `stream`'s answers).
#[test]
fn stream_objects_end_where_torch_left_the_stream() {
    let want = expected("stream.pt");
    let bytes = std::fs::read(root().join("files/stream.pt")).expect("read");
    let objects = want["objects"].as_array().expect("objects");
    assert_eq!(objects.len(), 3);
    for (i, o) in objects.iter().enumerate() {
        let at = o["offset"].as_u64().expect("offset") as usize;
        let end = o["end"].as_u64().expect("end") as usize;
        let rest = bytes.get(at..).expect("in the file").to_vec();
        let ckpt = Checkpoint::from_bytes(rest).unwrap_or_else(|e| panic!("object {i}: {e}"));
        assert_eq!(ckpt.end_offset() as usize, end - at, "object {i}");
        let ours: Vec<(String, String)> = ckpt
            .tensors()
            .map(|t| (t.name().to_owned(), sha256_of(&t)))
            .collect();
        let theirs: Vec<(String, String)> = o["tensors"]
            .as_array()
            .expect("tensors")
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or_default().to_owned(),
                    t["sha256"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        assert_eq!(ours, theirs, "object {i}");
        let values: serde_json::Map<String, Json> = ckpt
            .values()
            .iter()
            .filter_map(|(n, v)| Some((n.clone(), scalar_json(v)?)))
            .collect();
        assert_eq!(Json::Object(values), o["values"], "object {i}");
    }
    assert_eq!(
        objects.last().and_then(|o| o["end"].as_u64()),
        Some(bytes.len() as u64)
    );
}

/// A sharded safetensors set as transformers wrote it, opened by its
/// directory and by its index: every tensor of every shard, each equal to
/// safetensors' own reading of its shard.
#[test]
fn safetensors_set_reads_as_its_shards() {
    let dir = root().join("files").join("st_sharded");
    let mut want = std::collections::BTreeMap::new();
    for shard in ["model-00001-of-00002", "model-00002-of-00002"] {
        let doc = expected(&format!("st_sharded/{shard}.safetensors"));
        for t in doc["tensors"].as_array().expect("tensors") {
            want.insert(
                t["name"].as_str().expect("name").to_owned(),
                t["sha256"].as_str().expect("sha256").to_owned(),
            );
        }
    }
    for path in [dir.clone(), dir.join("model.safetensors.index.json")] {
        let set = ptload_reader::set::CheckpointSet::open(&path).expect("set");
        let mut got = std::collections::BTreeMap::new();
        for file in set.files() {
            let ckpt = file.checkpoint();
            assert_eq!(ckpt.format().name(), "safetensors");
            for view in ckpt.tensors() {
                got.insert(view.name().to_owned(), sha256_of(&view));
            }
        }
        assert_eq!(got, want, "{}", path.display());
    }
}
