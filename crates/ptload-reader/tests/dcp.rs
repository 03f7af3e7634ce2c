//! Distributed checkpoints (torch.distributed.checkpoint directories)
//! against the saves and answers torch wrote (fixtures/generate.py --only
//! dcp), and hostile directories made here.

use std::path::{Path, PathBuf};

use ptload_reader::advice::Warning;
use ptload_reader::checkpoint::Scalar;
use ptload_reader::dcp::{Dcp, Transform};
use ptload_reader::set::CheckpointSet;
use ptload_reader::tp::Shard;
use ptload_reader::{DType, ErrorKind, Limits, OpenOptions};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn answers() -> Json {
    let text = std::fs::read_to_string(fixtures().join("dcp.json")).expect("dcp.json");
    serde_json::from_str(&text).expect("json")
}

fn saves() -> Vec<(String, Json)> {
    let doc = answers();
    let saves = doc["saves"].as_object().expect("saves");
    assert_eq!(saves.len(), 8);
    saves
        .iter()
        .filter(|(k, _)| cfg!(feature = "zstd") || k.as_str() != "world2_zstd")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn dir_of(name: &str) -> PathBuf {
    fixtures().join("files/dcp").join(name)
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn dims(v: &Json) -> Vec<u64> {
    v.as_array()
        .expect("dims")
        .iter()
        .map(|d| d.as_u64().expect("dim"))
        .collect()
}

#[test]
fn every_tensor_equals_torchs() {
    for (name, save) in saves() {
        let dcp = Dcp::open(dir_of(&name)).expect("open");
        let want = save["tensors"].as_object().expect("tensors");
        assert_eq!(dcp.tensors().len(), want.len(), "{name}");
        for (key, w) in want {
            let t = dcp.tensor(key).unwrap_or_else(|| panic!("{name}: {key}"));
            assert_eq!(
                t.dtype().name(),
                w["dtype"].as_str().unwrap(),
                "{name} {key}"
            );
            assert_eq!(t.shape(), dims(&w["shape"]).as_slice(), "{name} {key}");
            let chunks: Vec<(Vec<u64>, Vec<u64>)> = w["chunks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (dims(&c[0]), dims(&c[1])))
                .collect();
            let got: Vec<(Vec<u64>, Vec<u64>)> = t
                .chunks()
                .iter()
                .map(|c| (c.offsets.clone(), c.sizes.clone()))
                .collect();
            assert_eq!(got, chunks, "{name} {key}");
            let bytes = dcp.read_tensor(key).expect("read");
            assert_eq!(sha(&bytes), w["sha256"].as_str().unwrap(), "{name} {key}");
        }
        let files: Vec<&str> = dcp.files().collect();
        let listed: Vec<String> = save["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .filter(|f| !f.ends_with(".metadata"))
            .collect();
        let mut sorted = files.clone();
        sorted.sort();
        assert_eq!(sorted, listed, "{name}");
        let mut items: Vec<&str> = dcp.items().collect();
        let mut want_items: Vec<&str> = save["values"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        items.sort();
        want_items.sort();
        assert_eq!(items, want_items, "{name}");
    }
}

/// A distributed checkpoint exported from its chunks (a slab at a time)
/// is byte for byte the export of the same save opened as a set; the
/// stream and the file agree; shards are refused (one file only).
#[cfg(feature = "export")]
#[test]
fn a_dcp_exports_from_its_chunks_as_from_the_opened_set() {
    use ptload_reader::export::{Export, SafetensorsOptions};
    use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
    let every = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let opts = SafetensorsOptions::default();
    // Without the `zstd` feature the zstd save is refused, naming it
    // (the_safetensors_format_and_the_zstd_transform_are_what_torch_wrote).
    let names: &[&str] = if cfg!(feature = "zstd") {
        &["world2", "world4", "world2_zstd"]
    } else {
        &["world2", "world4"]
    };
    for &name in names {
        let dir = dir_of(name);
        let dcp = Dcp::open(&dir).expect("dcp");
        let skeleton =
            CheckpointSet::of(&dir, std::sync::Arc::new(dcp.skeleton().expect("skeleton")))
                .expect("set");
        let sd = every.select_set(&skeleton).expect("select");
        let export = Export::dcp(&dcp, &sd, &opts);
        let mut from_chunks = Vec::new();
        let written = export.to_writer(&mut from_chunks).expect("stream");
        assert_eq!(written.tensors, dcp.tensors().len(), "{name}");
        let opened = CheckpointSet::open(&dir).expect("open");
        let sd_opened = every.select_set(&opened).expect("select");
        let mut from_set = Vec::new();
        Export::state_dict(&sd_opened, &opts)
            .to_writer(&mut from_set)
            .expect("stream");
        assert!(from_chunks == from_set, "{name}: the two exports differ");
        let out =
            std::env::temp_dir().join(format!("ptload-dcp-export-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&out);
        export.to_file(&out).expect("file");
        let on_disk = std::fs::read(&out).expect("read");
        let _ = std::fs::remove_file(&out);
        assert!(
            on_disk == from_chunks,
            "{name}: the file differs from the stream"
        );
        let e = export
            .to_shards(&std::env::temp_dir(), 1 << 20)
            .expect_err("shards of a dcp");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
}

#[test]
fn a_dcp_directory_opens_as_a_checkpoint_set() {
    for (name, save) in saves() {
        let set = CheckpointSet::open(dir_of(&name)).expect("open");
        assert_eq!(set.files().len(), 1);
        let want = save["tensors"].as_object().expect("tensors");
        assert_eq!(set.len(), want.len(), "{name}");
        for (key, w) in want {
            let (_, view) = set.tensor(key).unwrap_or_else(|| panic!("{name}: {key}"));
            assert_eq!(view.dtype().name(), w["dtype"].as_str().unwrap());
            assert_eq!(view.shape(), dims(&w["shape"]).as_slice());
            assert_eq!(sha(&view.data().unwrap()), w["sha256"].as_str().unwrap());
        }
        let ckpt = set.files()[0].checkpoint();
        let values: Vec<(&str, &Scalar)> =
            ckpt.values().iter().map(|(k, v)| (k.as_str(), v)).collect();
        let find = |k: &str| {
            values
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).clone())
                .unwrap_or_else(|| panic!("{name}: no value {k} in {values:?}"))
        };
        let w = &save["values"];
        if name == "fsdp2_adamw" {
            // The optimizer's param_groups, item by item.
            assert_eq!(
                find("optim.param_groups.0.lr"),
                Scalar::Float(w["optim.param_groups.0.lr"].as_f64().unwrap())
            );
            assert_eq!(
                find("optim.param_groups.0.params.1"),
                Scalar::Str(
                    w["optim.param_groups.0.params"][1]
                        .as_str()
                        .unwrap()
                        .to_owned()
                )
            );
            continue;
        }
        assert_eq!(find("step"), Scalar::Int(w["step"].as_i64().unwrap()));
        assert_eq!(
            find("extra.lr"),
            Scalar::Float(w["extra.lr"].as_f64().unwrap())
        );
        assert_eq!(
            find("extra.note"),
            Scalar::Str(w["extra.note"].as_str().unwrap().to_owned())
        );
        assert_eq!(
            find("extra.betas.1"),
            Scalar::Float(w["extra.betas"][1].as_f64().unwrap())
        );
    }
}

/// `torch.tensor_split(t, world, dim)[rank]` of a row-major tensor.
fn split(whole: &[u8], shape: &[u64], elem: usize, dim: usize, shard: Shard) -> Vec<u8> {
    let (start, len) = shard.part(shape[dim]);
    let outer: u64 = shape[..dim].iter().product();
    let inner: u64 = shape[dim + 1..].iter().product::<u64>() * elem as u64;
    let mut out = Vec::new();
    for o in 0..outer {
        let base = (o * shape[dim] + start) * inner;
        out.extend_from_slice(&whole[base as usize..(base + len * inner) as usize]);
    }
    out
}

#[test]
fn every_reshard_equals_tensor_split_of_the_whole() {
    let mut checked = 0;
    for (name, _) in saves() {
        let dcp = Dcp::open(dir_of(&name)).expect("open");
        for t in dcp.tensors() {
            let whole = dcp.read_tensor(t.name()).expect("whole");
            for dim in 0..t.shape().len() {
                for world in [1u32, 2, 3, 4, 8] {
                    for rank in 0..world {
                        let shard = Shard::new(rank, world).unwrap();
                        let (shape, part) = dcp.read_slice(t.name(), dim, shard).expect("slice");
                        let want = split(&whole, t.shape(), t.dtype().size(), dim, shard);
                        assert_eq!(part, want, "{name} {} dim {dim} {rank}/{world}", t.name());
                        assert_eq!(shape[dim], shard.part(t.shape()[dim]).1);
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 500, "{checked}");
}

#[test]
fn the_same_tensor_reads_alike_at_every_world_size() {
    let one = Dcp::open(dir_of("world1")).expect("open");
    for other in [
        "world2",
        "world4",
        "world2_threads",
        "world2_safetensors",
        "world2_zstd",
        "world2_rank_metadata",
    ] {
        if other == "world2_zstd" && !cfg!(feature = "zstd") {
            continue;
        }
        let dcp = Dcp::open(dir_of(other)).expect("open");
        for t in one.tensors() {
            assert_eq!(
                one.read_tensor(t.name()).unwrap(),
                dcp.read_tensor(t.name()).unwrap(),
                "{other} {}",
                t.name()
            );
        }
    }
}

// --- hostile directories -----------------------------------------------------

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ptload-dcp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A field of a record and what writes its value.
type Field<'a> = (&'a str, &'a dyn Fn(&mut Pickle));

/// A geometry case: name, tensor shape, chunk offsets, chunk sizes, what
/// the error says.
type GeometryCase = (
    &'static str,
    Vec<u64>,
    Vec<Vec<u64>>,
    Vec<Vec<u64>>,
    &'static str,
);

/// A storage case: name, relative path, byte range, error kind, what the
/// error says.
type StorageCase = (
    &'static str,
    &'static str,
    (u64, u64),
    ErrorKind,
    &'static str,
);

/// A hand-written `.metadata` pickle (protocol 2), shaped as torch writes it.
#[derive(Default)]
struct Pickle(Vec<u8>);

const MD: &str = "torch.distributed.checkpoint.metadata";

impl Pickle {
    fn op(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.op(format!("c{module}\n{name}\n").as_bytes())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.op(b"X");
        self.op(&(s.len() as u32).to_le_bytes());
        self.op(s.as_bytes())
    }
    fn int(&mut self, i: i64) -> &mut Self {
        self.op(b"\x8a\x08");
        self.op(&i.to_le_bytes())
    }
    fn size(&mut self, dims: &[u64]) -> &mut Self {
        self.global("torch", "Size").op(b"(");
        for &d in dims {
            self.int(d as i64);
        }
        self.op(b"t\x85R")
    }
    /// `cls()` then BUILD with a dict whose values `fields` write.
    fn record(&mut self, cls: &str, fields: &[Field<'_>]) -> &mut Self {
        self.global(MD, cls).op(b")\x81}(");
        for (k, f) in fields {
            self.str(k);
            f(self);
        }
        self.op(b"ub")
    }
    fn properties(&mut self, dtype: &str) -> &mut Self {
        self.global(MD, "TensorProperties").op(b")\x81(");
        self.global("torch", dtype);
        self.global("torch.serialization", "_get_layout")
            .str("torch.strided")
            .op(b"\x85R\x89");
        self.global(MD, "_MEM_FORMAT_ENCODING")
            .int(0)
            .op(b"\x85R\x89Ntb")
    }
}

/// One chunk of a hand-made checkpoint: box, and the file range holding it.
struct ChunkSpec {
    offsets: Vec<u64>,
    sizes: Vec<u64>,
    path: String,
    start: u64,
    length: u64,
    transform: Option<&'static str>,
}

/// Write `.metadata` for one tensor `t` of `dtype` and `shape` with these
/// chunks; `planner` writes the planner_data value.
fn metadata(
    dtype: &str,
    shape: &[u64],
    chunks: &[ChunkSpec],
    planner: &dyn Fn(&mut Pickle),
) -> Vec<u8> {
    let mut p = Pickle::default();
    p.op(b"\x80\x02");
    p.global(MD, "Metadata").op(b")\x81}(");
    p.str("state_dict_metadata").op(b"}(");
    p.str("t");
    p.record(
        "TensorStorageMetadata",
        &[
            ("properties", &|p: &mut Pickle| {
                p.properties(dtype);
            }),
            ("size", &|p: &mut Pickle| {
                p.size(shape);
            }),
            ("chunks", &|p: &mut Pickle| {
                p.op(b"](");
                for c in chunks {
                    p.record(
                        "ChunkStorageMetadata",
                        &[
                            ("offsets", &|p: &mut Pickle| {
                                p.size(&c.offsets);
                            }),
                            ("sizes", &|p: &mut Pickle| {
                                p.size(&c.sizes);
                            }),
                        ],
                    );
                }
                p.op(b"e");
            }),
        ],
    );
    p.op(b"u");
    p.str("planner_data");
    planner(&mut p);
    p.str("storage_data").op(b"}(");
    for c in chunks {
        p.record(
            "MetadataIndex",
            &[
                ("fqn", &|p: &mut Pickle| {
                    p.str("t");
                }),
                ("offset", &|p: &mut Pickle| {
                    p.size(&c.offsets);
                }),
            ],
        );
        p.global("torch.distributed.checkpoint.filesystem", "_StorageInfo")
            .op(b")\x81}(");
        p.str("relative_path").str(&c.path);
        p.str("offset").int(c.start as i64);
        p.str("length").int(c.length as i64);
        if let Some(t) = c.transform {
            p.str("transform_descriptors").op(b"]").str(t).op(b"a");
        }
        p.op(b"ub");
    }
    p.op(b"u");
    p.op(b"ub.");
    p.0
}

/// The archives of world2's `layers.0.weight` ([8, 6] F32, two chunks of
/// four rows), copied end to end into `dir/data.distcp`: their ranges.
fn two_chunks(dir: &Path) -> Vec<(u64, u64)> {
    let src = Dcp::open(dir_of("world2")).expect("open");
    let t = src.tensor("layers.0.weight").unwrap();
    let names: Vec<&str> = src.files().collect();
    let mut out = Vec::new();
    let mut ranges = Vec::new();
    for c in t.chunks() {
        let file = std::fs::read(dir_of("world2").join(names[c.piece.file])).unwrap();
        let at = out.len() as u64;
        out.extend_from_slice(
            &file[c.piece.offset as usize..(c.piece.offset + c.piece.length) as usize],
        );
        ranges.push((at, c.piece.length));
    }
    std::fs::write(dir.join("data.distcp"), out).unwrap();
    ranges
}

/// A `.metadata` in `dir` for tensor `t`, F32 [8, 6], as the two row
/// halves `two_chunks` wrote (`extra` adds to the pickle).
fn write_two_chunk_metadata(dir: &Path, r: &[(u64, u64)], extra: &dyn Fn(&mut Pickle)) {
    let md = metadata(
        "float32",
        &[8, 6],
        &[
            chunk(&[0, 0], &[4, 6], "data.distcp", r[0]),
            chunk(&[4, 0], &[4, 6], "data.distcp", r[1]),
        ],
        extra,
    );
    std::fs::write(dir.join(".metadata"), md).unwrap();
}

fn chunk(offsets: &[u64], sizes: &[u64], path: &str, (start, length): (u64, u64)) -> ChunkSpec {
    ChunkSpec {
        offsets: offsets.to_vec(),
        sizes: sizes.to_vec(),
        path: path.into(),
        start,
        length,
        transform: None,
    }
}

fn none(p: &mut Pickle) {
    p.op(b"N");
}

fn open_err(dir: &Path) -> ptload_reader::Error {
    let e = Dcp::open(dir).expect_err("must fail");
    let set = CheckpointSet::open(dir).expect_err("the set must fail too");
    assert_eq!(set.kind(), e.kind());
    e
}

#[test]
fn a_hand_made_checkpoint_reads_as_torchs() {
    let s = Scratch::new("good");
    let r = two_chunks(&s.0);
    write_two_chunk_metadata(&s.0, &r, &none);
    let dcp = Dcp::open(&s.0).expect("open");
    let torch = Dcp::open(dir_of("world2")).expect("open");
    assert_eq!(
        dcp.read_tensor("t").unwrap(),
        torch.read_tensor("layers.0.weight").unwrap()
    );
    assert_eq!(dcp.tensor("t").unwrap().dtype(), DType::F32);
}

#[test]
fn a_slice_reads_only_the_chunks_it_overlaps() {
    let s = Scratch::new("lazy");
    let r = two_chunks(&s.0);
    // The second chunk's archive is spoiled: rank 0 of 2 along dim 0 never
    // reads it, the whole tensor must.
    let mut data = std::fs::read(s.0.join("data.distcp")).unwrap();
    let end = (r[1].0 + r[1].1) as usize;
    data[end - 40..end].fill(0xee);
    std::fs::write(s.0.join("data.distcp"), data).unwrap();
    write_two_chunk_metadata(&s.0, &r, &none);
    let dcp = Dcp::open(&s.0).expect("open");
    let (shape, part) = dcp
        .read_slice("t", 0, Shard::new(0, 2).unwrap())
        .expect("rank 0");
    assert_eq!(shape, [4, 6]);
    let torch = Dcp::open(dir_of("world2")).expect("open");
    let whole = torch.read_tensor("layers.0.weight").unwrap();
    assert_eq!(part, whole[..4 * 6 * 4]);
    let e = dcp.read_tensor("t").expect_err("the spoiled chunk");
    let text = e.to_string();
    assert!(
        text.contains("data.distcp") && text.contains(&r[1].0.to_string()),
        "{text}"
    );
    assert_eq!(e.tensor(), Some("t"));
}

#[test]
fn hostile_chunk_geometry_is_refused() {
    let cases: Vec<GeometryCase> = vec![
        (
            "overlap",
            vec![8, 6],
            vec![vec![0, 0], vec![3, 0]],
            vec![vec![4, 6], vec![4, 6]],
            "overlap",
        ),
        (
            "gap",
            vec![9, 6],
            vec![vec![0, 0], vec![4, 0]],
            vec![vec![4, 6], vec![4, 6]],
            "cover",
        ),
        (
            "outside",
            vec![8, 6],
            vec![vec![0, 0], vec![5, 0]],
            vec![vec![4, 6], vec![4, 6]],
            "past",
        ),
        (
            "rank",
            vec![8, 6],
            vec![vec![0], vec![4, 0]],
            vec![vec![4], vec![4, 6]],
            "rank",
        ),
        (
            "larger_than_its_bytes",
            vec![8, 60000],
            vec![vec![0, 0], vec![4, 0]],
            vec![vec![4, 60000], vec![4, 60000]],
            "more than its",
        ),
        (
            "huge",
            vec![1 << 62, 6],
            vec![vec![0, 0], vec![4, 0]],
            vec![vec![4, 6], vec![4, 6]],
            "overflows",
        ),
    ];
    for (name, shape, offsets, sizes, says) in cases {
        let s = Scratch::new(name);
        let r = two_chunks(&s.0);
        let chunks: Vec<ChunkSpec> = (0..2)
            .map(|i| chunk(&offsets[i], &sizes[i], "data.distcp", r[i]))
            .collect();
        std::fs::write(
            s.0.join(".metadata"),
            metadata("float32", &shape, &chunks, &none),
        )
        .unwrap();
        let e = open_err(&s.0);
        assert_eq!(e.kind(), ErrorKind::Tensor, "{name}: {e}");
        assert!(e.to_string().contains(says), "{name}: {e}");
        assert_eq!(e.tensor(), Some("t"), "{name}");
        assert_eq!(e.file(), Some(".metadata"), "{name}");
    }
}

#[test]
fn hostile_storage_entries_are_refused() {
    let cases: Vec<StorageCase> = vec![
        ("escape", "../x", (0, 10), ErrorKind::InvalidSpec, "../x"),
        (
            "absolute",
            "/etc/passwd",
            (0, 10),
            ErrorKind::InvalidSpec,
            "/etc/passwd",
        ),
        (
            "subdir",
            "a/data.distcp",
            (0, 10),
            ErrorKind::InvalidSpec,
            "a/data.distcp",
        ),
        (
            "missing",
            "other.distcp",
            (0, 10),
            ErrorKind::Io,
            "other.distcp",
        ),
        (
            "past_end",
            "data.distcp",
            (0, 1 << 40),
            ErrorKind::Tensor,
            "outside",
        ),
        (
            "far",
            "data.distcp",
            (1 << 62, (1 << 62) + 10),
            ErrorKind::Tensor,
            "outside",
        ),
    ];
    for (name, path, range, kind, says) in cases {
        let s = Scratch::new(name);
        let r = two_chunks(&s.0);
        let md = metadata(
            "float32",
            &[8, 6],
            &[
                chunk(&[0, 0], &[4, 6], "data.distcp", r[0]),
                chunk(&[4, 0], &[4, 6], path, range),
            ],
            &none,
        );
        std::fs::write(s.0.join(".metadata"), md).unwrap();
        let e = open_err(&s.0);
        assert_eq!(e.kind(), kind, "{name}: {e}");
        assert!(e.to_string().contains(says), "{name}: {e}");
        assert_eq!(e.tensor(), Some("t"), "{name}");
    }
}

#[test]
fn a_global_outside_the_dcp_classes_is_refused() {
    for (module, name) in [
        ("os", "system"),
        ("builtins", "eval"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch.distributed.checkpoint.metadata", "os"),
    ] {
        let s = Scratch::new("global");
        let r = two_chunks(&s.0);
        let planner = |p: &mut Pickle| {
            p.global(module, name).str("echo").op(b"\x85R");
        };
        let md = metadata(
            "float32",
            &[8, 6],
            &[
                chunk(&[0, 0], &[4, 6], "data.distcp", r[0]),
                chunk(&[4, 0], &[4, 6], "data.distcp", r[1]),
            ],
            &planner,
        );
        std::fs::write(s.0.join(".metadata"), md).unwrap();
        let e = open_err(&s.0);
        assert_eq!(
            e.kind(),
            ErrorKind::UnsupportedGlobal,
            "{module}.{name}: {e}"
        );
        assert!(e.to_string().contains(&format!("{module}.{name}")), "{e}");
        assert!(e.offset().is_some(), "{e}");
    }
}

#[test]
fn deeply_nested_metadata_gives_an_answer_not_a_crash() {
    let depth = 200_000;
    // Nested lists in planner_data (which is not read) and as a chunk's
    // sizes (which is).
    let nest = |p: &mut Pickle| {
        p.op(&vec![b'('; depth]).op(b"]").op(&vec![b'l'; depth]);
    };
    let s = Scratch::new("deep");
    let r = two_chunks(&s.0);
    write_two_chunk_metadata(&s.0, &r, &nest);
    let dcp = Dcp::open(&s.0).expect("planner_data is not read");
    assert_eq!(dcp.tensor("t").unwrap().shape(), [8, 6]);

    let mut p = Pickle::default();
    p.op(b"\x80\x02");
    p.global(MD, "Metadata").op(b")\x81}(");
    p.str("state_dict_metadata").op(b"}(");
    p.str("t");
    p.record(
        "TensorStorageMetadata",
        &[
            ("properties", &|p: &mut Pickle| {
                p.properties("float32");
            }),
            ("size", &nest),
            ("chunks", &|p: &mut Pickle| {
                p.op(b"]");
            }),
        ],
    );
    p.op(b"uub.");
    std::fs::write(s.0.join(".metadata"), &p.0).unwrap();
    let e = open_err(&s.0);
    assert_eq!(e.kind(), ErrorKind::Pickle, "{e}");

    // Nesting past the stack limit.
    let mut p = Pickle::default();
    p.op(b"\x80\x02").op(&vec![b'('; 2_000_000]);
    std::fs::write(s.0.join(".metadata"), &p.0).unwrap();
    let e = open_err(&s.0);
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
}

#[test]
fn truncated_and_garbage_metadata_is_refused() {
    let s = Scratch::new("truncated");
    let good = std::fs::read(dir_of("world2").join(".metadata")).unwrap();
    for f in std::fs::read_dir(dir_of("world2")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), s.0.join(f.file_name())).unwrap();
    }
    for cut in [0, 1, 2, 10, good.len() / 2, good.len() - 1] {
        std::fs::write(s.0.join(".metadata"), &good[..cut]).unwrap();
        let e = open_err(&s.0);
        assert!(matches!(e.kind(), ErrorKind::Pickle), "{cut}: {e}");
    }
    // A file cut short: its chunks no longer fit.
    std::fs::write(s.0.join(".metadata"), &good).unwrap();
    let f = s.0.join("__1_0.distcp");
    let data = std::fs::read(&f).unwrap();
    std::fs::write(&f, &data[..data.len() - 100]).unwrap();
    let e = open_err(&s.0);
    assert_eq!(e.kind(), ErrorKind::Tensor, "{e}");
    assert!(e.to_string().contains("__1_0.distcp"), "{e}");
}

#[test]
fn the_safetensors_format_and_the_zstd_transform_are_what_torch_wrote() {
    let st = Dcp::open(dir_of("world2_safetensors")).expect("open");
    // Each file's tensor chunks share one blob: one offset per file.
    let mut starts: Vec<(usize, u64)> = st
        .tensors()
        .iter()
        .flat_map(|t| t.chunks().iter().map(|c| (c.piece.file, c.piece.offset)))
        .collect();
    starts.sort();
    starts.dedup();
    assert_eq!(starts.len(), 2, "{starts:?}");
    let z = Dcp::open(dir_of("world2_zstd")).expect("open");
    assert!(z
        .tensors()
        .iter()
        .flat_map(|t| t.chunks())
        .all(|c| c.piece.transform == Transform::Zstd));
    if !cfg!(feature = "zstd") {
        let e = z.read_tensor("layers.0.weight").expect_err("no zstd");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        return;
    }
    assert_eq!(z.read_item("step").unwrap().values()[0].1, Scalar::Int(7));
    // Decompression stays within the limit: a chunk whose elements alone
    // exceed it is refused at open, and an archive that does when read.
    let mut limits = Limits::default();
    limits.max_decompressed_bytes = 64;
    let e = Dcp::open_with(
        dir_of("world2_zstd"),
        &OpenOptions::new().limits(limits.clone()),
    )
    .expect_err("96 bytes of elements");
    assert_eq!(e.kind(), ErrorKind::Tensor, "{e}");
    assert!(e.to_string().contains("more than its 64 bytes"), "{e}");
    limits.max_decompressed_bytes = 200;
    let small =
        Dcp::open_with(dir_of("world2_zstd"), &OpenOptions::new().limits(limits)).expect("open");
    let e = small.read_tensor("layers.0.weight").expect_err("limit");
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    assert_eq!(e.tensor(), Some("layers.0.weight"));
}

#[test]
fn a_safetensors_blob_that_disagrees_with_the_metadata_is_refused() {
    let s = Scratch::new("blob");
    for f in std::fs::read_dir(dir_of("world2_safetensors")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), s.0.join(f.file_name())).unwrap();
    }
    let path = s.0.join("__1_0.distcp");
    let mut data = std::fs::read(&path).unwrap();
    let needle = br#"\"layers.0.weight\": {\"saved_offsets\": [4, 0]}"#;
    let at = data
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the sharding info");
    let digit = at + needle.len() - 6;
    assert_eq!(data[digit], b'4');
    data[digit] = b'3';
    std::fs::write(&path, data).unwrap();
    let dcp = Dcp::open(&s.0).expect("open");
    assert!(dcp.read_tensor("embed.weight").is_ok());
    let e = dcp.read_tensor("layers.0.weight").expect_err("moved");
    assert_eq!(e.kind(), ErrorKind::Tensor, "{e}");
    assert!(e.to_string().contains("__1_0.distcp at offset"), "{e}");
}

#[test]
fn an_unknown_transform_is_named() {
    let s = Scratch::new("transform");
    let r = two_chunks(&s.0);
    let mut second = chunk(&[4, 0], &[4, 6], "data.distcp", r[1]);
    second.transform = Some("stream.brotli/1");
    let md = metadata(
        "float32",
        &[8, 6],
        &[chunk(&[0, 0], &[4, 6], "data.distcp", r[0]), second],
        &none,
    );
    std::fs::write(s.0.join(".metadata"), md).unwrap();
    let e = open_err(&s.0);
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("stream.brotli/1"), "{e}");
    assert_eq!(e.tensor(), Some("t"));
}

#[test]
fn a_save_without_collectives_reads_as_one() {
    // Every rank wrote the replicated tensors; they are read once, from
    // rank 0's file, and the sharded ones from both.
    let dcp = Dcp::open(dir_of("world2_rank_metadata")).expect("open");
    let names: Vec<&str> = dcp.files().collect();
    let bias = dcp.tensor("layers.0.bias").unwrap();
    assert_eq!(bias.chunks().len(), 1);
    assert_eq!(names[bias.chunks()[0].piece.file], "__0_0.distcp");
    let w = dcp.tensor("layers.0.weight").unwrap();
    let files: Vec<&str> = w.chunks().iter().map(|c| names[c.piece.file]).collect();
    assert_eq!(files, ["__0_0.distcp", "__1_0.distcp"]);
    // Ranks that disagree on a tensor, or a lost rank, are errors.
    let s = Scratch::new("ranks");
    for f in std::fs::read_dir(dir_of("world2_rank_metadata")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), s.0.join(f.file_name())).unwrap();
    }
    let rank1 = std::fs::read(s.0.join("__1.metadata")).unwrap();
    let mut rank1_moved = rank1.clone();
    let needle = b"__1_0.distcp";
    let at = rank1_moved
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    rank1_moved[at..at + needle.len()].copy_from_slice(b"__0_0.distcp");
    std::fs::write(s.0.join("__1.metadata"), &rank1_moved).unwrap();
    let e = open_err(&s.0);
    assert_eq!(e.file(), Some("__0.metadata to __1.metadata"), "{e}");
    std::fs::remove_file(s.0.join("__0.metadata")).unwrap();
    let e = CheckpointSet::open(&s.0).expect_err("no metadata");
    assert_ne!(e.kind(), ErrorKind::Tensor, "{e}");
}

#[test]
fn replicated_copies_saved_without_collectives_are_compared() {
    // Both ranks wrote layers.0.bias (replicated); rank 1's copy is
    // compared with rank 0's whenever the tensor is read.
    let dcp = Dcp::open(dir_of("world2_rank_metadata")).expect("open");
    let bias = dcp.read_tensor("layers.0.bias").expect("equal copies");
    let s = Scratch::new("copies");
    for f in std::fs::read_dir(dir_of("world2_rank_metadata")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), s.0.join(f.file_name())).unwrap();
    }
    let path = s.0.join("__1_0.distcp");
    let mut rank1 = std::fs::read(&path).unwrap();
    let at = rank1
        .windows(bias.len())
        .position(|w| w == bias.as_slice())
        .expect("rank 1's copy of the bias");
    rank1[at] ^= 0x01;
    std::fs::write(&path, &rank1).unwrap();
    let dcp = Dcp::open(&s.0).expect("open: nothing is read yet");
    let e = dcp.read_tensor("layers.0.bias").unwrap_err();
    assert!(
        e.to_string()
            .contains("replicated, but rank 0 and rank 1 wrote different values"),
        "{e}"
    );
    assert_eq!(e.tensor(), Some("layers.0.bias"));
    // The tensors only rank 0 or only rank 1 wrote read as before.
    dcp.read_tensor("layers.0.weight").expect("sharded");
    // As a set, the copies are compared when the tensor's data is read.
    let set = CheckpointSet::open(&s.0).expect("open: nothing is read yet");
    let e = set.tensor("layers.0.bias").unwrap().1.data().unwrap_err();
    assert!(e.to_string().contains("wrote different values"), "{e}");
}

#[test]
fn two_chunks_reading_the_same_bytes_are_refused() {
    let s = Scratch::new("shared");
    let r = two_chunks(&s.0);
    // The second chunk's entry names the first chunk's archive, whole or
    // overlapping it.
    for range in [r[0], (r[0].0 + 10, r[0].1)] {
        let md = metadata(
            "float32",
            &[8, 6],
            &[
                chunk(&[0, 0], &[4, 6], "data.distcp", r[0]),
                chunk(&[4, 0], &[4, 6], "data.distcp", range),
            ],
            &none,
        );
        std::fs::write(s.0.join(".metadata"), md).unwrap();
        let e = open_err(&s.0);
        assert_eq!(e.kind(), ErrorKind::Tensor, "{e}");
        assert!(e.to_string().contains("are also those of t"), "{e}");
    }
}

#[test]
fn an_fsdp2_model_and_its_optimizer_state_read_as_torchs() {
    let dcp = Dcp::open(dir_of("fsdp2_adamw")).expect("open");
    // FSDP2 shards every parameter and its moments on dim 0 across the two
    // ranks; the steps are plain tensors, saved once.
    for name in [
        "model.0.weight",
        "optim.state.0.weight.exp_avg",
        "optim.state.2.weight.exp_avg_sq",
    ] {
        let t = dcp.tensor(name).unwrap();
        assert_eq!(t.chunks().len(), 2, "{name}");
        assert!(t
            .chunks()
            .iter()
            .all(|c| c.offsets[1..].iter().all(|&o| o == 0)));
    }
    assert!(dcp
        .tensor("optim.state.0.weight.step")
        .unwrap()
        .shape()
        .is_empty());
    assert_eq!(dcp.tensors().len(), 16);
}

#[test]
fn many_chunks_along_a_later_dimension_cost_little_to_check() {
    // A hundred column chunks: checked in about a hundred steps, within a
    // budget that comparing every pair (about 5,000) would exceed.
    let s = Scratch::new("columns");
    let r = two_chunks(&s.0);
    let chunks: Vec<ChunkSpec> = (0..100)
        .map(|i| chunk(&[0, i], &[8, 1], "data.distcp", r[0]))
        .collect();
    std::fs::write(
        s.0.join(".metadata"),
        metadata("float32", &[8, 100], &chunks, &none),
    )
    .unwrap();
    let mut limits = Limits::default();
    limits.max_walk_steps = 1000;
    let e = Dcp::open_with(&s.0, &OpenOptions::new().limits(limits)).expect_err("shared bytes");
    // The geometry passed; what fails is the chunks sharing one archive.
    assert_eq!(e.kind(), ErrorKind::Tensor, "{e}");
    assert!(e.to_string().contains("are also those of"), "{e}");
}

// ---- FSDP rank files (fixtures/generate.py --only fsdp) --------------------

fn fsdp_answers() -> Json {
    let text = std::fs::read_to_string(fixtures().join("fsdp.json")).expect("fsdp.json");
    serde_json::from_str(&text).expect("json")
}

fn fsdp_dir(name: &str) -> PathBuf {
    fixtures().join("files/fsdp").join(name)
}

fn rank_files(name: &str, world: usize) -> Vec<PathBuf> {
    (0..world)
        .map(|r| fsdp_dir(name).join(format!("model_world_size_{world}_rank_{r}.pt")))
        .collect()
}

fn assert_fsdp_as_torch(set: &CheckpointSet, want: &Json, what: &str) {
    let tensors = want["tensors"].as_object().expect("tensors");
    assert_eq!(set.files().len(), 1, "{what}");
    assert_eq!(set.len(), tensors.len(), "{what}");
    for (key, w) in tensors {
        let (_, view) = set.tensor(key).unwrap_or_else(|| panic!("{what}: {key}"));
        assert_eq!(
            view.dtype().name(),
            w["dtype"].as_str().unwrap(),
            "{what} {key}"
        );
        assert_eq!(view.shape(), dims(&w["shape"]).as_slice(), "{what} {key}");
        assert_eq!(
            sha(&view.data().unwrap()),
            w["sha256"].as_str().unwrap(),
            "{what} {key}"
        );
    }
    let ckpt = set.files()[0].checkpoint();
    assert_eq!(ckpt.format().name(), "ranks");
    let values = want["values"].as_object().expect("values");
    assert_eq!(ckpt.values().len(), values.len(), "{what}");
    for (k, v) in ckpt.values() {
        let w = &values[k.as_str()];
        match v {
            Scalar::Float(f) => assert_eq!(Some(*f), w.as_f64(), "{what} {k}"),
            Scalar::Int(i) => assert_eq!(Some(*i), w.as_i64(), "{what} {k}"),
            Scalar::Bool(b) => assert_eq!(Some(*b), w.as_bool(), "{what} {k}"),
            Scalar::None => assert!(w.is_null(), "{what} {k}"),
            other => panic!("{what} {k}: {other:?}"),
        }
    }
}

#[test]
fn fsdp_rank_files_read_as_torchs_full_tensors() {
    let doc = fsdp_answers();
    for name in ["world2", "world4", "local2"] {
        let want = &doc["sets"][name];
        // torch itself loads these files with weights_only=True.
        let types = want["weights_only_true_types"].as_array().unwrap();
        assert_eq!(types.len(), if name == "local2" { 1 } else { 2 }, "{name}");
        // The directory (local shards: with its placements sidecar).
        let set = CheckpointSet::open(fsdp_dir(name)).expect(name);
        assert_fsdp_as_torch(&set, want, name);
        // The same under the strict policy: torch admits the DTensor
        // classes once torch.distributed.tensor is imported.
        let strict = OpenOptions::new().policy(ptload_reader::Policy::Strict);
        let set = CheckpointSet::open_with(fsdp_dir(name), &strict).expect(name);
        assert_fsdp_as_torch(&set, want, name);
    }
    // A list of DTensor files, in any order: each file records its place.
    let mut files = rank_files("world4", 4);
    files.reverse();
    let set = CheckpointSet::open_files(&files, &OpenOptions::new()).expect("list");
    assert_fsdp_as_torch(&set, &doc["sets"]["world4"], "world4 reversed");
}

/// FSDP2 local shards that record no placement (each rank's
/// `torch.save` of `to_local()`), at worlds 2 and 4: refused as one state
/// dict until the rule is stated, then torch's whole tensors; the
/// world-2 set has a placements sidecar, the world-4 set none.
#[test]
fn fsdp2_local_shards_read_by_the_stated_rule_at_worlds_2_and_4() {
    let doc = fsdp_answers();
    let rules = ptload_reader::dcp::fsdp::rank_rules("model.scale=replicate,fsdp2").expect("rules");
    for (name, world) in [("local2", 2), ("local4", 4)] {
        let want = &doc["sets"][name];
        assert_eq!(want["world"], world);
        let set = CheckpointSet::open_rank_parts(fsdp_dir(name), &rules, &OpenOptions::new())
            .expect(name);
        assert_fsdp_as_torch(&set, want, name);
    }
    let e = CheckpointSet::open(fsdp_dir("local4")).expect_err("no rule stated");
    assert_eq!(e.kind(), ErrorKind::DuplicateName, "{e}");
    // The preset alone splits the replicated buffer too: its four
    // copies do not make one tensor of the saved shape.
    let preset = ptload_reader::dcp::fsdp::rank_rules("fsdp2").expect("preset");
    let wrong = CheckpointSet::open_rank_parts(fsdp_dir("local4"), &preset, &OpenOptions::new())
        .map(|set| set.tensor("model.scale").map(|(_, v)| v.shape().to_vec()));
    assert!(!matches!(wrong, Ok(Some(ref s)) if s == &[2]), "{wrong:?}");
}

#[test]
fn one_fsdp_rank_file_lists_its_local_parts_with_their_spec() {
    use ptload_reader::dcp::fsdp::MeshPlacement;
    let ckpt = ptload_reader::Checkpoint::open(&rank_files("world4", 4)[3]).expect("open");
    let at = ckpt.position("model.fc1.weight").unwrap();
    let view = ckpt.tensor_at(at).unwrap();
    // Shard(0) of 10 rows among 4 ranks, as torch.chunk cuts: 3, 3, 3, 1.
    assert_eq!(view.shape(), &[1, 6]);
    let spec = ckpt.dtensor_at(at).expect("a DTensor");
    assert_eq!(spec.global_shape, vec![10, 6]);
    assert_eq!(spec.mesh, vec![4]);
    assert_eq!(spec.coordinate, vec![3]);
    assert_eq!(spec.rank, Some(3));
    assert_eq!(spec.placements, vec![MeshPlacement::Shard(0)]);
    // 3 rows of fc2 among 4 ranks: the last rank's part is empty.
    let at = ckpt.position("model.fc2.weight").unwrap();
    assert_eq!(ckpt.tensor_at(at).unwrap().shape(), &[0, 10]);
    // The buffer is a plain tensor, not a DTensor.
    assert!(ckpt
        .dtensor_at(ckpt.position("model.scale").unwrap())
        .is_none());
    // The warning is data: the first DTensor's rank, coordinate and mesh.
    let local = ckpt
        .warnings()
        .iter()
        .find(|w| matches!(w, Warning::LocalParts { .. }))
        .expect("a warning that the tensors are local parts");
    let Warning::LocalParts {
        count,
        rank,
        coordinate,
        mesh,
    } = local
    else {
        unreachable!()
    };
    assert_eq!(
        (*rank, coordinate.as_slice(), mesh.as_slice()),
        (Some(3), &[3][..], &[4][..])
    );
    assert!(*count >= 2, "{local}");
    assert_eq!(local.name(), "local_parts");
    assert!(local.to_string().contains("are DTensors: each is listed as this file's local part (rank 3 at [3] on a mesh of [4])"), "{local}");
    assert!(
        ckpt.suspicious().expect("scanned").is_empty(),
        "{:?}",
        ckpt.globals()
    );
}

fn fsdp_err(paths: &[PathBuf]) -> String {
    CheckpointSet::open_files(paths, &OpenOptions::new())
        .expect_err("must be refused")
        .to_string()
}

#[test]
fn fsdp_rank_files_that_do_not_make_one_tensor_are_refused() {
    // Partial: a reduction not yet done.
    let e = CheckpointSet::open(fsdp_dir("partial2"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Partial(sum)") && e.contains("'weight'"), "{e}");
    // Replicated copies that differ name the key and the ranks.
    let e = CheckpointSet::open(fsdp_dir("replicate_mismatch2"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 0 and rank 1 hold different values") && e.contains("'weight'"),
        "{e}"
    );
    // Parts that do not have the shape their placements give.
    let e = CheckpointSet::open(fsdp_dir("bad_tiling2"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("do not tile") && e.contains("[5, 2]"), "{e}");
    // A rank missing.
    let mut three = rank_files("world4", 4);
    three.remove(2);
    let e = fsdp_err(&three);
    assert!(e.contains("no file holds the part at [2]"), "{e}");
    // The same rank twice.
    let twice = vec![
        rank_files("world2", 2)[0].clone(),
        rank_files("world2", 2)[0].clone(),
    ];
    let e = fsdp_err(&twice);
    assert!(e.contains("both hold the part at [0]"), "{e}");
    // Files of two meshes.
    let mixed = vec![
        rank_files("world2", 2)[0].clone(),
        rank_files("world4", 4)[1].clone(),
    ];
    let e = fsdp_err(&mixed);
    assert!(e.contains("the files disagree: a mesh of [4]"), "{e}");
    // A DTensor in one file, a plain local shard in the other.
    let mixed = vec![
        rank_files("world2", 2)[0].clone(),
        rank_files("local2", 2)[1].clone(),
    ];
    let e = fsdp_err(&mixed);
    assert!(
        e.contains("a DTensor in") && e.contains("a plain tensor in"),
        "{e}"
    );
    // Local shards without their placements are not concatenated: as a
    // list of files they name each tensor twice; as rank files, plain
    // tensors must be equal on every rank, and are not.
    let local = rank_files("local2", 2);
    let e = fsdp_err(&local);
    assert!(e.contains("in two files of the set"), "{e}");
    let e = CheckpointSet::open_fsdp_files(&local, None, &OpenOptions::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 0 and rank 1 hold different values"), "{e}");
}

#[test]
fn the_placements_sidecar_is_checked() {
    use ptload_reader::dcp::fsdp::{LocalLayout, MeshPlacement};
    let text = std::fs::read(fsdp_dir("local2").join("ptload-placements.json")).unwrap();
    let layout = LocalLayout::from_json(&text).expect("sidecar");
    assert_eq!(layout.mesh(), &[2]);
    assert_eq!(
        layout.placements_for("optim.state.3.step"),
        Some(&[MeshPlacement::Replicate][..])
    );
    assert_eq!(
        layout.placements_for("model.fc1.weight"),
        Some(&[MeshPlacement::Shard(0)][..])
    );
    for bad in [
        &br#"{"mesh": [2], "placements": [{"match": "*", "placements": ["Shard(0)", "Replicate()"]}]}"#[..],
        br#"{"mesh": [0], "placements": []}"#,
        br#"{"mesh": [2], "placements": [{"match": "*", "placements": ["Partial()"]}]}"#,
        br#"{"mesh": [2]}"#,
        b"not json",
    ] {
        let e = LocalLayout::from_json(bad).expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    }
    // A layout whose rules leave a tensor out, or shard a scalar.
    let files = rank_files("local2", 2);
    let partial = LocalLayout::new(
        vec![2],
        vec![("model.*".into(), vec![MeshPlacement::Shard(0)])],
    )
    .unwrap();
    let e = CheckpointSet::open_fsdp_files(&files, Some(&partial), &OpenOptions::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no rule of ptload-placements.json matches"),
        "{e}"
    );
    let scalar =
        LocalLayout::new(vec![2], vec![("*".into(), vec![MeshPlacement::Shard(0)])]).unwrap();
    let e = CheckpointSet::open_fsdp_files(&files, Some(&scalar), &OpenOptions::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Shard(0) of a tensor of 0 dimensions"), "{e}");
    // A mesh of another size than the files given.
    let four =
        LocalLayout::new(vec![4], vec![("*".into(), vec![MeshPlacement::Replicate])]).unwrap();
    let e = CheckpointSet::open_fsdp_files(&files, Some(&four), &OpenOptions::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("has 4 ranks, and 2 files were given"), "{e}");
}

/// `file` (a stored torch zip, as torch writes it: sizes and CRC-32 in a
/// data descriptor after each record and in the central directory) with
/// `from` replaced by `to` (the same length) in its `data.pkl`, and that
/// record's CRC-32 made right again wherever it is recorded.
fn patch_pickle(file: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = file.to_vec();
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
    let u32_at =
        |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let find = |out: &[u8], sig: &[u8; 4], name_at: usize, len_at: usize| {
        out.windows(4)
            .enumerate()
            .filter(|(_, w)| w == sig)
            .map(|(i, _)| i)
            .find(|&i| {
                let n = u16_at(out, i + len_at);
                out[i + name_at..i + name_at + n].ends_with(b"data.pkl")
            })
            .expect("data.pkl")
    };
    let local = find(&out, b"PK\x03\x04", 30, 26);
    let central = find(&out, b"PK\x01\x02", 46, 28);
    let size = u32_at(&out, central + 20);
    let start = local + 30 + u16_at(&out, local + 26) + u16_at(&out, local + 28);
    let data = &mut out[start..start + size];
    let at = data
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{:?} not in the pickle", String::from_utf8_lossy(from)));
    data[at..at + to.len()].copy_from_slice(to);
    let crc = crc32fast::hash(data).to_le_bytes();
    if u16_at(&out, local + 6) & 0x8 == 0 {
        out[local + 14..local + 18].copy_from_slice(&crc);
    }
    out[central + 16..central + 20].copy_from_slice(&crc);
    let mut descriptor = start + size;
    if out[descriptor..].starts_with(b"PK\x07\x08") {
        descriptor += 4;
    }
    out[descriptor..descriptor + 4].copy_from_slice(&crc);
    out
}

#[test]
fn hostile_dtensor_specs_are_refused() {
    let rank1 = std::fs::read(&rank_files("world2", 2)[1]).unwrap();
    let open = |bytes: Vec<u8>, policy| {
        OpenOptions::new()
            .policy(policy)
            .open_bytes(bytes)
            .map(|c| format!("opened with {} tensors", c.len()))
            .unwrap_or_else(|e| e.to_string())
    };
    // The untouched file opens; the patch keeps what it does not change.
    let same = patch_pickle(
        &rank1,
        b"_coordinate_on_dimqTK\x01",
        b"_coordinate_on_dimqTK\x01",
    );
    assert_eq!(
        open(same, ptload_reader::Policy::Strict),
        "opened with 17 tensors"
    );
    let cases: &[(&[u8], &[u8], &str)] = &[
        // A coordinate off the mesh.
        (
            b"_coordinate_on_dimqTK\x01",
            b"_coordinate_on_dimqTK\x07",
            "is not on its mesh",
        ),
        // A placement of a class that is not one of torch's.
        (
            b"placement_types\nShard\n",
            b"placement_types\nShord\n",
            "not Shard, Replicate or Partial",
        ),
        // No local tensor in the state.
        (
            b"_local_tensor",
            b"_local_tensoR",
            "no _local_tensor in its state",
        ),
        // A spec of another class.
        (
            b"_dtensor_spec\nDTensorSpec\n",
            b"_dtensor_spec\nDTensorSpex\n",
            "expected a torch.distributed.tensor._dtensor_spec.DTensorSpec",
        ),
    ];
    for (from, to, want) in cases {
        let got = open(
            patch_pickle(&rank1, from, to),
            ptload_reader::Policy::Default,
        );
        assert!(got.contains(want), "{}: {got}", String::from_utf8_lossy(to));
    }
    // Under the strict policy a class outside the DTensor ones is refused
    // as a global before anything is read.
    let got = open(
        patch_pickle(
            &rank1,
            b"placement_types\nShard\n",
            b"placement_types\nShord\n",
        ),
        ptload_reader::Policy::Strict,
    );
    assert!(
        got.contains("Unsupported global") && got.contains("Shord"),
        "{got}"
    );
}
