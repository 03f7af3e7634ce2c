//! Checkpoint sets, tensor-parallel slices and read plans, against files
//! and answers torch wrote (fixtures/generate.py --only sharding).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ptload_reader::ranged::RangeRead;
use ptload_reader::read_plan::ReadPlan;
use ptload_reader::set::CheckpointSet;
use ptload_reader::state_dict::{KeySelect, StateDict, StateDictOptions, Strip};
use ptload_reader::tp::{Shard, Splits};
use ptload_reader::{Checkpoint, ErrorKind, Limits, OpenOptions};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn files() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files")
}

fn every() -> StateDictOptions {
    StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    }
}

fn sha(view: &ptload_reader::TensorView<'_>) -> String {
    let mut h = Sha256::new();
    view.visit_bytes(|c| h.update(c)).expect("read");
    hex::encode(h.finalize())
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ptload-sets-{name}-{}", std::process::id()));
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

fn shard_names() -> Vec<String> {
    (1..=3)
        .map(|i| format!("pytorch_model-0000{i}-of-00003.bin"))
        .collect()
}

#[test]
fn a_sharded_set_reads_as_the_unsharded_file() {
    let whole = Checkpoint::open(files().join("llama_tiny.pt")).expect("whole");
    let dir = files().join("llama_tiny_sharded");
    let index: Json = serde_json::from_str(
        &std::fs::read_to_string(dir.join("pytorch_model.bin.index.json")).expect("index"),
    )
    .expect("json");
    for opened in [
        CheckpointSet::open(&dir).expect("directory"),
        CheckpointSet::open(dir.join("pytorch_model.bin.index.json")).expect("index"),
    ] {
        assert_eq!(opened.files().len(), 3);
        assert!(opened.index().is_some());
        assert_eq!(opened.len(), whole.len());
        for t in whole.tensors() {
            let (file, s) = opened
                .tensor(t.name())
                .unwrap_or_else(|| panic!("{}", t.name()));
            assert_eq!(
                opened.files()[file].name(),
                index["weight_map"][t.name()].as_str().expect("listed"),
                "{}",
                t.name()
            );
            assert_eq!(
                (s.dtype(), s.shape()),
                (t.dtype(), t.shape()),
                "{}",
                t.name()
            );
            assert_eq!(
                s.data().expect("shard"),
                t.data().expect("whole"),
                "{}",
                t.name()
            );
        }
        // The state dict of the set is the file's, entry for entry.
        let sd = every().select_set(&opened).expect("select");
        let names: Vec<&str> = sd.iter().map(|e| e.name.as_str()).collect();
        let mut want: Vec<&str> = whole.tensors().map(|t| t.name()).collect();
        let mut got = names.clone();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        for e in sd.iter() {
            assert_eq!(opened.files()[e.file].name(), index["weight_map"][&e.name]);
        }
    }
}

#[test]
fn broken_sets_are_errors_naming_the_files() {
    let src = files().join("llama_tiny_sharded");
    let names = shard_names();
    // A shard the index names is missing.
    let missing = Scratch::new("missing");
    std::fs::copy(
        src.join("pytorch_model.bin.index.json"),
        missing.0.join("pytorch_model.bin.index.json"),
    )
    .expect("copy");
    for n in &names[..2] {
        std::fs::copy(src.join(n), missing.0.join(n)).expect("copy");
    }
    let e = CheckpointSet::open(&missing.0).expect_err("missing shard");
    assert!(e.to_string().contains(&names[2]), "{e}");
    // A tensor in two files (no index: every file of the directory).
    let twice = Scratch::new("twice");
    for n in &names {
        std::fs::copy(src.join(n), twice.0.join(n)).expect("copy");
    }
    std::fs::copy(src.join(&names[0]), twice.0.join("zz_copy.bin")).expect("copy");
    let e = CheckpointSet::open(&twice.0).expect_err("duplicate");
    assert_eq!(e.kind(), ErrorKind::DuplicateName);
    let text = e.to_string();
    assert!(
        text.contains(&names[0]) && text.contains("zz_copy.bin"),
        "{text}"
    );
    // The index places a tensor in a shard that lacks it.
    let moved = Scratch::new("moved");
    for n in &names {
        std::fs::copy(src.join(n), moved.0.join(n)).expect("copy");
    }
    let mut index: Json = serde_json::from_str(
        &std::fs::read_to_string(src.join("pytorch_model.bin.index.json")).expect("index"),
    )
    .expect("json");
    index["weight_map"]["lm_head.weight"] = Json::from(names[0].clone());
    std::fs::write(
        moved.0.join("pytorch_model.bin.index.json"),
        serde_json::to_string(&index).expect("json"),
    )
    .expect("write");
    let e = CheckpointSet::open(&moved.0).expect_err("misplaced");
    assert_eq!(e.tensor(), Some("lm_head.weight"));
    assert!(e.to_string().contains(&names[0]), "{e}");
    // An index naming a file outside its directory.
    index["weight_map"]["lm_head.weight"] = Json::from("../llama_tiny.pt");
    std::fs::write(
        moved.0.join("pytorch_model.bin.index.json"),
        serde_json::to_string(&index).expect("json"),
    )
    .expect("write");
    let e = CheckpointSet::open(&moved.0).expect_err("escape");
    assert!(e.to_string().contains("not a file beside it"), "{e}");
    // A broken shard: the error names it.
    let bad = Scratch::new("bad");
    for n in &names {
        std::fs::copy(src.join(n), bad.0.join(n)).expect("copy");
    }
    std::fs::write(bad.0.join(&names[1]), b"not a checkpoint").expect("write");
    let e = CheckpointSet::open(&bad.0).expect_err("bad shard");
    assert!(
        e.file().is_some_and(|f| f.ends_with(names[1].as_str())),
        "{e}"
    );
    // Meta's per-rank files repeat every name: said so.
    let e = CheckpointSet::open(files().join("llama_tiny_consolidated")).expect_err("ranks");
    assert!(e.to_string().contains("model-parallel rank"), "{e}");
}

/// Tensors the shards hold that the index does not list open with a
/// warning (as transformers loads such a set: by its index), given as data.
#[test]
fn tensors_the_index_leaves_out_are_a_warning() {
    let src = files().join("llama_tiny_sharded");
    let dir = Scratch::new("unlisted");
    for n in shard_names() {
        std::fs::copy(src.join(&n), dir.0.join(&n)).expect("copy");
    }
    let mut index: Json = serde_json::from_str(
        &std::fs::read_to_string(src.join("pytorch_model.bin.index.json")).expect("index"),
    )
    .expect("json");
    let map = index["weight_map"].as_object_mut().expect("weight_map");
    let dropped: Vec<String> = map.keys().take(2).cloned().collect();
    for name in &dropped {
        map.remove(name);
    }
    std::fs::write(
        dir.0.join("pytorch_model.bin.index.json"),
        serde_json::to_string(&index).expect("json"),
    )
    .expect("write");
    let set = CheckpointSet::open(dir.0.join("pytorch_model.bin.index.json")).expect("set");
    assert_eq!(
        set.warnings(),
        &[ptload_reader::advice::Warning::NotInIndex { count: 2 }]
    );
    assert_eq!(
        set.warnings()[0].to_string(),
        "2 tensors in the shards are not in the index"
    );
    // The whole set, listed or not, has no warning.
    let whole = CheckpointSet::open(src.join("pytorch_model.bin.index.json")).expect("set");
    assert!(whole.warnings().is_empty(), "{:?}", whole.warnings());
}

/// Torch's `tensor_split` answers for every fixture tensor, dim, world
/// and rank (fixtures/slices.json), from rules that split exactly one dim.
#[test]
fn slices_equal_torch_tensor_split() {
    let path = files().join("../slices.json");
    let doc: Json =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("slices.json")).expect("json");
    let mut checked = 0usize;
    for (file, tensors) in doc["files"].as_object().expect("files") {
        let ckpt = Checkpoint::open(files().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let tensors = tensors.as_object().expect("tensors");
        let max_dims = tensors
            .values()
            .map(|t| t["dims"].as_array().expect("dims").len())
            .max()
            .unwrap_or(0);
        for dim in 0..max_dims {
            let rules: Vec<String> = tensors
                .iter()
                .filter(|(_, t)| t["dims"].as_array().expect("dims").len() > dim)
                .map(|(name, _)| format!("{name}={dim}"))
                .collect();
            let splits = Splits::parse(&rules).expect("rules");
            for world in doc["worlds"].as_array().expect("worlds") {
                let world = world.as_u64().expect("world") as u32;
                let mut whole_len: std::collections::HashMap<&str, u64> = Default::default();
                for rank in 0..world {
                    let opts = StateDictOptions {
                        parallel: Some((Shard::new(rank, world).expect("shard"), splits.clone())),
                        ..every()
                    };
                    let sd = opts.select(&ckpt).expect("select");
                    for (name, t) in tensors {
                        let Some(parts) = t["dims"][dim][world.to_string()].as_array() else {
                            continue;
                        };
                        let want = &parts[rank as usize];
                        let entry = sd.selected(name).unwrap_or_else(|| panic!("{name}"));
                        let slice = entry.slice.expect("sliced");
                        let view = sd.get(name).unwrap_or_else(|| panic!("{name}"));
                        assert_eq!(slice.dim, dim);
                        assert_eq!(slice.len, want[0].as_u64().expect("len"), "{file} {name}");
                        assert_eq!(view.shape()[dim], slice.len);
                        assert_eq!(
                            sha(&view),
                            want[1].as_str().expect("sha"),
                            "{file} {name} dim {dim} rank {rank}/{world}"
                        );
                        *whole_len.entry(name).or_default() += slice.len;
                        checked += 1;
                    }
                }
                // The ranks' parts together are the whole dimension.
                for (name, t) in tensors {
                    if let Some(&total) = whole_len.get(name.as_str()) {
                        assert_eq!(total, t["shape"][dim].as_u64().expect("size"), "{name}");
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} slices checked");
}

/// Along dim 0 the ranks' slices, end to end, are the whole tensor's
/// elements, for every dtype and layout the dtype and view fixtures hold.
#[test]
fn dim0_slices_concatenate_to_the_whole() {
    for file in [
        "dtypes.pt",
        "views.pt",
        "bigendian.pt",
        "conj_neg.pt",
        "llama_tiny.pt",
    ] {
        let ckpt = Checkpoint::open(files().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let rules: Vec<String> = ckpt
            .tensors()
            .filter(|t| !t.shape().is_empty() && t.info().quantization.is_none())
            .map(|t| format!("{}=0", t.name()))
            .collect();
        let splits = Splits::parse(&rules).expect("rules");
        let whole = every().select(&ckpt).expect("select");
        for world in [2u32, 3, 8] {
            let parts: Vec<StateDict<'_>> = (0..world)
                .map(|rank| {
                    StateDictOptions {
                        parallel: Some((Shard::new(rank, world).expect("shard"), splits.clone())),
                        ..every()
                    }
                    .select(&ckpt)
                    .expect("select")
                })
                .collect();
            for (name, t) in whole.tensors() {
                if t.shape().is_empty() || t.storage().is_none() {
                    continue;
                }
                let mut joined = Vec::new();
                for sd in &parts {
                    joined.extend_from_slice(
                        &sd.get(name)
                            .unwrap_or_else(|| panic!("{name}"))
                            .data()
                            .expect("slice"),
                    );
                }
                assert_eq!(
                    joined,
                    t.data().expect("whole").into_owned(),
                    "{file} {name} /{world}"
                );
            }
        }
    }
}

#[test]
fn split_rules_that_do_not_fit_are_errors() {
    let ckpt = Checkpoint::open(files().join("llama_tiny.pt")).expect("open");
    let opts = StateDictOptions {
        parallel: Some((
            Shard::new(0, 2).expect("shard"),
            Splits::parse(&["*norm.weight=1"]).expect("rules"),
        )),
        ..every()
    };
    let e = opts.select(&ckpt).expect_err("1-D tensor split on dim 1");
    assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    assert!(
        e.tensor().is_some_and(|t| t.ends_with("norm.weight")),
        "{e}"
    );
    // The llama preset splits the attention and MLP projections only.
    let opts = StateDictOptions {
        parallel: Some((
            Shard::new(1, 4).expect("shard"),
            Splits::preset("llama").expect("preset"),
        )),
        ..every()
    };
    let sd = opts.select(&ckpt).expect("preset");
    for e in sd.iter() {
        let split = e.slice.map(|s| s.dim);
        let want = if e.name.contains("norm") {
            None
        } else if e.name.ends_with("o_proj.weight") || e.name.ends_with("down_proj.weight") {
            Some(1)
        } else {
            Some(0)
        };
        assert_eq!(split, want, "{}", e.name);
    }
}

/// Each rank's planned ranges, read from the files in order, are its
/// slices' bytes; nothing else is read.
#[test]
fn sliced_plans_address_exactly_each_ranks_bytes() {
    let set = CheckpointSet::open(files().join("llama_tiny_sharded")).expect("set");
    let maps: Vec<Vec<u8>> = set
        .files()
        .iter()
        .map(|f| std::fs::read(f.path()).expect("read"))
        .collect();
    let splits = Splits::preset("llama").expect("preset");
    for world in [1u32, 2, 3, 4, 8] {
        let plan =
            ReadPlan::sliced(&set, &every(), &splits, world, 1, &Limits::default()).expect("plan");
        assert_eq!(plan.ranks.len(), world as usize);
        for r in &plan.ranks {
            let mut read = Vec::new();
            for range in &r.ranges {
                for k in 0..range.count {
                    let at = (range.offset + k * range.step) as usize;
                    read.extend_from_slice(&maps[range.file][at..at + range.len as usize]);
                }
            }
            assert_eq!(read.len() as u64, r.bytes);
            let sd = StateDictOptions {
                parallel: Some((Shard::new(r.rank, world).expect("shard"), splits.clone())),
                ..every()
            }
            .select_set(&set)
            .expect("select");
            let mut want = Vec::new();
            for (_, t) in sd.tensors() {
                want.extend_from_slice(&t.data().expect("slice"));
            }
            assert_eq!(read, want, "rank {} of {world}", r.rank);
        }
        if world > 1 {
            // Ranks read less than the whole; at most their share plus
            // what is replicated.
            let replicated: u64 = every()
                .select_set(&set)
                .expect("all")
                .tensors()
                .filter(|(n, _)| splits.split_of(n) == ptload_reader::tp::Split::Replicate)
                .map(|(_, t)| t.info().nbytes)
                .sum();
            for r in &plan.ranks {
                assert!(r.bytes < plan.total_bytes);
                assert!(r.bytes <= plan.total_bytes.div_ceil(world as u64) + replicated + 4096);
            }
        }
    }
}

#[test]
fn read_once_plans_cover_every_byte_once_per_node() {
    let set = CheckpointSet::open(files().join("llama_tiny_sharded")).expect("set");
    let plan = ReadPlan::read_once(&set, &every(), 8, 2, &Limits::default()).expect("plan");
    let stored: u64 = set
        .files()
        .iter()
        .flat_map(|f| f.checkpoint().storages().iter().map(|s| s.nbytes))
        .sum();
    assert_eq!(plan.total_bytes, stored);
    for node in 0..2 {
        let mut covered: Vec<(usize, u64, u64)> = plan
            .ranks
            .iter()
            .filter(|r| r.node == node)
            .flat_map(|r| {
                r.ranges
                    .iter()
                    .map(|g| (g.file, g.offset, g.offset + g.len))
            })
            .collect();
        covered.sort_unstable();
        let total: u64 = covered.iter().map(|(_, a, b)| b - a).sum();
        assert_eq!(total, stored, "node {node}");
        for w in covered.windows(2) {
            assert!(w[0].0 < w[1].0 || w[0].2 <= w[1].1, "overlap {w:?}");
        }
        let shares: Vec<u64> = plan
            .ranks
            .iter()
            .filter(|r| r.node == node)
            .map(|r| r.bytes)
            .collect();
        assert!(
            shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1,
            "{shares:?}"
        );
    }
    assert!(ReadPlan::read_once(&set, &every(), 6, 4, &Limits::default()).is_err());
    assert!(ReadPlan::read_once(&set, &every(), 4_000_000_000, 1, &Limits::default()).is_err());
}

#[test]
fn set_limits_hold() {
    let mut limits = Limits::default();
    limits.max_set_files = 2;
    let e = CheckpointSet::open_with(
        files().join("llama_tiny_sharded"),
        &OpenOptions::new().limits(limits),
    )
    .expect_err("three files");
    assert_eq!(e.kind(), ErrorKind::LimitExceeded);
}

/// A sharded safetensors set appears whole or not at all.
#[cfg(feature = "export")]
#[test]
fn sharded_output_is_all_or_nothing() {
    use ptload_reader::export::{Export, SafetensorsOptions};
    let set = CheckpointSet::open(files().join("llama_tiny_sharded")).expect("set");
    let sd = every().select_set(&set).expect("select");
    let out = Scratch::new("shards-out");
    let cancelled = SafetensorsOptions {
        cancel: Some(std::sync::Arc::new(std::sync::atomic::AtomicBool::new(
            true,
        ))),
        ..Default::default()
    };
    let e = Export::state_dict(&sd, &cancelled)
        .to_shards(&out.0, 20_000)
        .expect_err("cancelled");
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    assert_eq!(std::fs::read_dir(&out.0).expect("dir").count(), 0);
    let written = Export::state_dict(&sd, &Default::default())
        .to_shards(&out.0, 20_000)
        .expect("write");
    assert!(written.files.len() > 1 && written.index.is_some());
    let tensors: usize = written.files.iter().map(|(_, w)| w.tensors).sum();
    assert_eq!(tensors, sd.len());
    // One shard when everything fits: model.safetensors, no index.
    let one = Scratch::new("shards-one");
    let written = Export::state_dict(&sd, &Default::default())
        .to_shards(&one.0, 1 << 30)
        .expect("write");
    assert_eq!(written.files.len(), 1);
    assert!(written.index.is_none());
    assert!(one.0.join("model.safetensors").is_file());
}

fn rank_rules() -> Splits {
    let doc: Json = serde_json::from_str(
        &std::fs::read_to_string(files().join("llama_tiny_consolidated/rules.json"))
            .expect("rules"),
    )
    .expect("json");
    let rules: Vec<String> = doc["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| format!("{}={}", r[0].as_str().expect("glob"), r[1]))
        .collect();
    Splits::parse(&rules).expect("rules")
}

/// Meta-style rank files, merged by the rules they were cut by, are the
/// unsharded file; cut again for another world size, each rank's part is
/// torch's tensor_split of the whole.
#[cfg(feature = "export")]
#[test]
fn rank_files_merge_and_reslice() {
    use ptload_reader::merge::merge;
    let ranks =
        CheckpointSet::open_ranks(files().join("llama_tiny_consolidated"), &OpenOptions::new())
            .expect("ranks");
    assert!(ranks.is_ranks());
    assert_eq!(ranks.files().len(), 2);
    let whole = Checkpoint::open(files().join("llama_tiny.pt")).expect("whole");
    let merged = merge(&ranks, &rank_rules()).expect("merge");
    assert_eq!(merged.len(), whole.len());
    let answers: Json = serde_json::from_str(
        &std::fs::read_to_string(files().join("../slices.json")).expect("slices"),
    )
    .expect("json");
    let answers = &answers["files"]["llama_tiny.pt"];
    let mut resliced = 0;
    for m in &merged {
        let t = whole
            .tensor(&m.name)
            .unwrap_or_else(|| panic!("{}", m.name));
        assert_eq!(
            (m.dtype, m.shape.as_slice()),
            (t.dtype(), t.shape()),
            "{}",
            m.name
        );
        let mut bytes = Vec::new();
        m.visit_bytes(&ranks, None, |b| bytes.extend_from_slice(b))
            .expect("merged");
        assert_eq!(bytes, t.data().expect("whole").into_owned(), "{}", m.name);
        let Some(dim) = m.dim else { continue };
        for world in [3u32, 4, 8] {
            for rank in 0..world {
                let shard = Shard::new(rank, world).expect("shard");
                let mut h = Sha256::new();
                m.visit_bytes(&ranks, Some(shard), |b| h.update(b))
                    .expect("part");
                let want = &answers[&m.name]["dims"][dim][world.to_string()][rank as usize];
                assert_eq!(
                    m.shape_for(Some(shard))[dim],
                    want[0].as_u64().expect("len")
                );
                assert_eq!(
                    hex::encode(h.finalize()),
                    want[1].as_str().expect("sha"),
                    "{} {rank}/{world}",
                    m.name
                );
                resliced += 1;
            }
        }
    }
    assert!(resliced > 100);
    // Exported: the stream and the file hold the same bytes, each tensor
    // the whole one (safetensors' layout, read back by the reader); one
    // file only, not shards.
    use ptload_reader::export::{Export, SafetensorsOptions};
    let opts = SafetensorsOptions::default();
    let export = Export::merged(&ranks, &merged, None, &opts);
    let mut streamed = Vec::new();
    let written = export.to_writer(&mut streamed).expect("stream");
    assert_eq!(written.tensors, merged.len());
    let out = Scratch::new("merged-export");
    let path = out.0.join("merged.safetensors");
    export.to_file(&path).expect("file");
    assert_eq!(std::fs::read(&path).expect("read"), streamed);
    let back = Checkpoint::open(&path).expect("safetensors");
    for t in whole.tensors() {
        let b = back
            .tensor(t.name())
            .unwrap_or_else(|| panic!("{}", t.name()));
        assert_eq!(
            b.data().expect("back"),
            t.data().expect("whole"),
            "{}",
            t.name()
        );
    }
    let e = export
        .to_shards(&out.0, 1 << 20)
        .expect_err("shards of merged ranks");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    // Rules that do not fit the parts are refused.
    let e = merge(&ranks, &Splits::new()).expect_err("split tensors taken as replicated");
    assert!(e.to_string().contains("do not fit"), "{e}");
}

/// The automatic options decide for the set as a whole: a file with
/// nothing under the key adds nothing, and a prefix is stripped only when
/// every name of every file has it.
#[test]
fn automatic_options_decide_for_the_whole_set() {
    let dir = Scratch::new("auto");
    for f in ["training.ckpt", "basic.pt"] {
        std::fs::copy(files().join(f), dir.0.join(f)).expect("copy");
    }
    let set = CheckpointSet::open(&dir.0).expect("set");
    let opts = StateDictOptions {
        key: KeySelect::Path("model_state_dict".into()),
        ..every()
    };
    let sd = opts
        .select_set(&set)
        .expect("basic.pt has no model_state_dict: it adds nothing");
    let training = Checkpoint::open(files().join("training.ckpt")).expect("open");
    let want = training
        .tensors()
        .filter(|t| t.name().starts_with("model_state_dict."))
        .count();
    assert_eq!(sd.len(), want);
    assert!(sd
        .iter()
        .all(|e| set.files()[e.file].name() == "training.ckpt"));
    let opts = StateDictOptions {
        key: KeySelect::Path("nowhere".into()),
        ..every()
    };
    assert!(opts.select_set(&set).is_err());
    // module. on every name of one file, not of the other: nothing stripped.
    let mixed = Scratch::new("mixed");
    for f in ["dataparallel.pt", "basic.pt"] {
        std::fs::copy(files().join(f), mixed.0.join(f)).expect("copy");
    }
    let set = CheckpointSet::open(&mixed.0).expect("set");
    let sd = StateDictOptions::default()
        .select_set(&set)
        .expect("select");
    assert!(sd.iter().any(|e| e.name.starts_with("module.")));
    assert!(sd.iter().any(|e| !e.name.starts_with("module.")));
    // An index naming a shard in a subdirectory is refused as such.
    let src = files().join("llama_tiny_sharded");
    let sub = Scratch::new("sub");
    std::fs::create_dir_all(sub.0.join("s")).expect("dir");
    let mut index: Json = serde_json::from_str(
        &std::fs::read_to_string(src.join("pytorch_model.bin.index.json")).expect("index"),
    )
    .expect("json");
    for n in shard_names() {
        std::fs::copy(src.join(&n), sub.0.join("s").join(&n)).expect("copy");
    }
    for v in index["weight_map"]
        .as_object_mut()
        .expect("map")
        .values_mut()
    {
        *v = Json::from(format!("s/{}", v.as_str().expect("file")));
    }
    std::fs::write(
        sub.0.join("pytorch_model.bin.index.json"),
        serde_json::to_string(&index).expect("json"),
    )
    .expect("write");
    let e = CheckpointSet::open(&sub.0).expect_err("subdirectory");
    assert!(e.to_string().contains("not a file beside it"), "{e}");
}

/// A sharded set whose last file cannot be put in place takes back the
/// files it placed: no reader finds part of a set.
#[cfg(feature = "export")]
#[test]
fn a_set_that_cannot_be_placed_leaves_nothing() {
    use ptload_reader::export::{Export, SafetensorsOptions};
    let set = CheckpointSet::open(files().join("llama_tiny_sharded")).expect("set");
    let sd = every().select_set(&set).expect("select");
    let out = Scratch::new("placed");
    let index = out.0.join("model.safetensors.index.json");
    let racer = index.clone();
    // Someone else's index appears while the shards are written.
    let opts = SafetensorsOptions {
        progress: Some(std::sync::Arc::new(move |_| {
            let _ = std::fs::write(&racer, b"theirs");
        })),
        ..Default::default()
    };
    let e = Export::state_dict(&sd, &opts)
        .to_shards(&out.0, 20_000)
        .expect_err("index appeared");
    assert_eq!(e.kind(), ErrorKind::OutputExists, "{e}");
    let left: Vec<String> = std::fs::read_dir(&out.0)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["model.safetensors.index.json"]);
    assert_eq!(std::fs::read(&index).expect("theirs"), b"theirs");
}

/// Files of a store read by ranges (an object store, a web server), by
/// URL; every URL asked for is logged.
#[derive(Debug, Default)]
struct Store {
    files: std::collections::BTreeMap<String, Vec<u8>>,
    asked: std::sync::Mutex<Vec<String>>,
}

#[derive(Debug)]
struct StoreFile(String, Arc<Vec<u8>>);

impl RangeRead for StoreFile {
    fn len(&self) -> u64 {
        self.1.len() as u64
    }
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        Ok(self.1[offset as usize..(offset + len) as usize].to_vec())
    }
    fn name(&self) -> &str {
        &self.0
    }
}

impl Store {
    fn open(&self, url: &str) -> std::io::Result<Arc<dyn RangeRead>> {
        self.asked.lock().unwrap().push(url.to_owned());
        match self.files.get(url) {
            Some(b) => Ok(Arc::new(StoreFile(url.to_owned(), Arc::new(b.clone())))),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such object",
            )),
        }
    }

    fn open_set(&self, index: &str, opts: &OpenOptions) -> ptload_reader::Result<CheckpointSet> {
        let index = self.open(index).expect("the index is in the store");
        CheckpointSet::open_ranged_index(index, |u| self.open(u), opts)
    }
}

const HUB: &str = "mem://hub/org/model/resolve/main/";

/// llama_tiny_sharded/ in a store, its index given `weight_map`'s text
/// (the real one when `None`).
fn sharded_store(index: Option<&str>) -> Store {
    let dir = files().join("llama_tiny_sharded");
    let mut store = Store::default();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        store
            .files
            .insert(format!("{HUB}{name}"), std::fs::read(entry.path()).unwrap());
    }
    if let Some(text) = index {
        store.files.insert(
            format!("{HUB}pytorch_model.bin.index.json"),
            text.as_bytes().to_vec(),
        );
    }
    store
}

/// An index read by ranges opens the shards beside it, by URL: the same
/// set as the local index, checked the same way.
#[test]
fn an_index_read_by_ranges_opens_its_shards_beside_it() {
    let local = CheckpointSet::open(files().join("llama_tiny_sharded")).unwrap();
    let store = sharded_store(None);
    let url = format!("{HUB}pytorch_model.bin.index.json");
    let set = store.open_set(&url, &OpenOptions::new()).unwrap();
    assert_eq!(set.index().unwrap(), Path::new(&url));
    let names = |s: &CheckpointSet| s.files().iter().map(|f| f.name()).collect::<Vec<_>>();
    assert_eq!(names(&set), names(&local));
    assert_eq!(
        set.files()[0].path(),
        Path::new(&format!("{HUB}{}", names(&local)[0]))
    );
    let all = |s: &CheckpointSet| {
        s.tensors()
            .map(|(f, t)| (f, t.name().to_owned(), sha(&t)))
            .collect::<Vec<_>>()
    };
    assert_eq!(all(&set), all(&local));
    for f in set.files() {
        assert!(f.checkpoint().fetched_bytes().is_some());
    }
    // An index whose entry points at the wrong shard is refused, as locally.
    let text =
        std::fs::read_to_string(files().join("llama_tiny_sharded/pytorch_model.bin.index.json"))
            .unwrap();
    let mut doc: Json = serde_json::from_str(&text).unwrap();
    doc["weight_map"]["lm_head.weight"] = "pytorch_model-00001-of-00003.bin".into();
    let store = sharded_store(Some(&doc.to_string()));
    let err = store.open_set(&url, &OpenOptions::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tensor);
    assert!(
        err.to_string()
            .contains("the index places it in pytorch_model-00001-of-00003.bin"),
        "{err}"
    );
    assert!(err.to_string().contains(&url), "{err}");
}

/// Shard names that are not a plain file beside the index (a parent, a
/// folder, an absolute path, a scheme, a query, an escape) are refused
/// before any shard is asked for; an index over the limit is refused
/// before it is read; a missing shard is its store's error, naming it.
#[test]
fn hostile_indexes_read_by_ranges_are_refused() {
    let url = format!("{HUB}pytorch_model.bin.index.json");
    for shard in [
        "../other/model.bin",
        "..",
        ".",
        "sub/model.bin",
        "/etc/model.bin",
        "http://evil.example/model.bin",
        "s3://bucket/model.bin",
        "model.bin?x=1",
        "model.bin#frag",
        "%2e%2e%2fmodel.bin",
        "model\\..\\x.bin",
        "model .bin",
        "",
    ] {
        let index = serde_json::json!({"weight_map": {"w": shard}}).to_string();
        let store = sharded_store(Some(&index));
        let err = store.open_set(&url, &OpenOptions::new()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSpec, "{shard:?}: {err}");
        assert!(
            err.to_string().contains("not a file beside it"),
            "{shard:?}: {err}"
        );
        assert_eq!(*store.asked.lock().unwrap(), vec![url.clone()], "{shard:?}");
    }
    // An index URL without a path after its host has no directory: a
    // shard name must not become a host.
    let mut store = Store::default();
    let hostless = "https://weights.json";
    let index = serde_json::json!({"weight_map": {"w": "evil.example"}}).to_string();
    store.files.insert(hostless.to_owned(), index.into_bytes());
    let err = store.open_set(hostless, &OpenOptions::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidSpec, "{err}");
    assert!(
        err.to_string().contains("needs a path after its host"),
        "{err}"
    );
    assert_eq!(*store.asked.lock().unwrap(), vec![hostless.to_owned()]);
    // Over the limit: refused from its length, nothing read.
    let store = sharded_store(None);
    let mut limits = Limits::default();
    limits.max_index_bytes = 100;
    let err = store
        .open_set(&url, &OpenOptions::new().limits(limits))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert!(err.to_string().contains("max_index_bytes"), "{err}");
    // A shard the store lacks: its error names its URL.
    let index = serde_json::json!({"weight_map": {
        "model.norm.weight": "pytorch_model-00003-of-00003.bin",
        "w": "pytorch_model-00004-of-00004.bin",
    }})
    .to_string();
    let store = sharded_store(Some(&index));
    let err = store.open_set(&url, &OpenOptions::new()).unwrap_err();
    let missing = format!("{HUB}pytorch_model-00004-of-00004.bin");
    assert!(
        err.to_string()
            .contains(&format!("cannot open {missing}: no such object")),
        "{err}"
    );
    // Not JSON of an index.
    let store = sharded_store(Some("<html>"));
    let err = store.open_set(&url, &OpenOptions::new()).unwrap_err();
    assert!(err.to_string().contains("not a checkpoint index"), "{err}");
}

/// What a front end is given is decided in one place: a URL or a path,
/// whichever command or function opens it.
#[test]
fn an_input_is_a_url_or_a_path_and_opens_as_a_set() {
    use ptload_reader::set::Input;
    for url in [
        "http://host/model.pt",
        "HTTPS://host/a/model.safetensors.index.json?x=1",
        "s3://bucket/model.pt",
        "gs://bucket/model.pt",
        "az://container/model.pt",
    ] {
        assert_eq!(Input::new(url).url(), Some(url), "{url}");
        assert_eq!(Input::new(url).path(), None, "{url}");
    }
    for path in ["model.pt", "ftp://host/model.pt", "dir/", "C:/models/x.pt"] {
        assert_eq!(Input::new(path), Input::Path(path.into()), "{path}");
    }
    assert!(Input::new("https://host/i.json#frag").is_index());
    assert!(!Input::new("https://host/i.json.pt").is_index());
    let local = Input::new(files().join("llama_tiny_sharded"));
    let set = local.open(&OpenOptions::new()).expect("a directory");
    assert_eq!(set.files().len(), 3);
    assert_eq!(
        local.to_string(),
        files().join("llama_tiny_sharded").display().to_string()
    );
    let e = Input::new("https://host/ranks/")
        .open_rank_parts(&rank_rules(), &OpenOptions::new())
        .expect_err("a URL cannot be listed");
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
}

/// A rank's share with no rule saying what to cut would hand every rank
/// every whole tensor: the selection refuses it, for every front end.
#[test]
fn a_share_without_split_rules_is_refused() {
    let ckpt = Checkpoint::open(files().join("llama_tiny.pt")).expect("open");
    let opts = StateDictOptions {
        parallel: Some((Shard::new(0, 2).unwrap(), Splits::default())),
        ..every()
    };
    let e = opts.select(&ckpt).expect_err("nothing to cut");
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    assert!(e.to_string().contains("split rules"), "{e}");
    // A world of one is the whole tensor: nothing to say.
    let whole = StateDictOptions {
        parallel: Some((Shard::new(0, 1).unwrap(), Splits::default())),
        ..every()
    };
    assert_eq!(whole.select(&ckpt).expect("whole").len(), ckpt.len());
}

/// `Weights` owns what it reads: a rank's slices of a sharded set, read on
/// another thread after the set and its selection are gone, equal the
/// selection's own views.
#[test]
fn weights_outlive_the_selection_and_cross_threads() {
    use ptload_reader::state_dict::Weights;
    fn owned<T: Send + Sync + 'static>(_: &T) {}
    let set = CheckpointSet::open(files().join("llama_tiny_sharded")).expect("open");
    let opts = StateDictOptions {
        parallel: Some((
            Shard::new(1, 2).unwrap(),
            Splits::with_preset::<String>(&[], Some("llama")).unwrap(),
        )),
        ..every()
    };
    let want: Vec<(String, Vec<u64>, String)> = opts
        .select_set(&set)
        .expect("select")
        .tensors()
        .map(|(n, v)| (n.to_owned(), v.shape().to_vec(), sha(&v)))
        .collect();
    let weights = Weights::select_set(&opts, &set).expect("weights");
    drop(set);
    owned(&weights);
    let got = std::thread::spawn(move || {
        weights
            .iter()
            .map(|(n, v)| (n.to_owned(), v.shape().to_vec(), sha(&v)))
            .collect::<Vec<_>>()
    })
    .join()
    .expect("thread");
    assert_eq!(got, want);
    assert!(want.iter().any(|(n, ..)| n.ends_with("q_proj.weight")));
}
