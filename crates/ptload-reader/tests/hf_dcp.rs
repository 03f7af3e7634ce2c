//! Hugging Face-format distributed checkpoints (torch's
//! HuggingFaceStorageWriter with save_distributed=True) against the saves
//! and answers torch wrote (fixtures/generate.py --only hf_dcp), and
//! hostile directories made from them here.

use std::path::{Path, PathBuf};

use ptload_reader::dcp::Dcp;
use ptload_reader::set::CheckpointSet;
use ptload_reader::tp::Shard;
use ptload_reader::{ErrorKind, Limits, OpenOptions};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn saves() -> Vec<(String, Json)> {
    let text = std::fs::read_to_string(fixtures().join("hf_dcp.json")).expect("hf_dcp.json");
    let doc: Json = serde_json::from_str(&text).expect("json");
    let saves = doc["saves"].as_object().expect("saves");
    assert_eq!(saves.len(), 3);
    saves.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
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
fn every_tensor_and_chunk_is_what_torchs_reader_makes_of_it() {
    for (name, save) in saves() {
        assert!(ptload_reader::dcp::is_dcp_dir(&dir_of(&name)), "{name}");
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
            let mut want_chunks: Vec<(Vec<u64>, Vec<u64>)> = w["chunks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (dims(&c[0]), dims(&c[1])))
                .collect();
            let mut got: Vec<(Vec<u64>, Vec<u64>)> = t
                .chunks()
                .iter()
                .map(|c| (c.offsets.clone(), c.sizes.clone()))
                .collect();
            want_chunks.sort();
            got.sort();
            assert_eq!(got, want_chunks, "{name} {key}");
            let bytes = dcp.read_tensor(key).expect("read");
            assert_eq!(sha(&bytes), w["sha256"].as_str().unwrap(), "{name} {key}");
        }
        let mut files: Vec<&str> = dcp.files().collect();
        files.sort();
        let listed: Vec<&str> = save["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert_eq!(files, listed, "{name}");
        assert_eq!(dcp.items().len(), 0, "{name}");
        // As a set: one file (the directory), every tensor torch's.
        let set = CheckpointSet::open(dir_of(&name)).expect("set");
        assert_eq!(set.len(), want.len(), "{name}");
        for (key, w) in want {
            let (_, view) = set.tensor(key).unwrap_or_else(|| panic!("{name}: {key}"));
            assert_eq!(sha(&view.data().unwrap()), w["sha256"].as_str().unwrap());
        }
    }
}

#[test]
fn a_save_reads_as_the_torch_format_save_of_the_same_tensors() {
    let torch = Dcp::open(dir_of("world2")).expect("open");
    for (name, _) in saves() {
        let hf = Dcp::open(dir_of(&name)).expect("open");
        for t in torch.tensors() {
            assert_eq!(
                hf.read_tensor(t.name()).unwrap(),
                torch.read_tensor(t.name()).unwrap(),
                "{name} {}",
                t.name()
            );
        }
    }
}

#[test]
fn a_ranks_slice_reads_only_from_the_chunks_it_overlaps() {
    let dcp = Dcp::open(dir_of("hf_world2_split")).expect("open");
    let whole = dcp.read_tensor("layers.1.weight").expect("whole");
    // [6, 10] BF16, saved as two [6, 5] chunks; the third of three column
    // slices crosses from one chunk into the other.
    let (shape, part) = dcp
        .read_slice("layers.1.weight", 1, Shard::new(1, 3).unwrap())
        .expect("slice");
    assert_eq!(shape, vec![6, 3]);
    let mut want = Vec::new();
    for row in 0..6 {
        want.extend_from_slice(&whole[row * 20 + 8..row * 20 + 14]);
    }
    assert_eq!(part, want);
    // The empty chunk of a one-row tensor split among two ranks.
    let row = dcp.tensor("layers.1.row").expect("row");
    assert!(row.chunks().iter().any(|c| c.sizes == [0, 3]));
    assert_eq!(dcp.read_tensor("layers.1.row").unwrap().len(), 12);
}

// --- hostile directories -----------------------------------------------------

/// A copy of a fixture save, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn of(save: &str, case: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ptload-hf-dcp-{case}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        for f in std::fs::read_dir(dir_of(save)).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
        }
        Scratch(dir)
    }

    /// Rewrite the header of the file `name` with `edit`, keeping its data.
    fn edit_header(&self, name: &str, edit: impl FnOnce(&mut serde_json::Map<String, Json>)) {
        let path = self.0.join(name);
        let data = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
        let mut header: serde_json::Map<String, Json> =
            serde_json::from_slice(&data[8..8 + n]).unwrap();
        edit(&mut header);
        let text = serde_json::to_vec(&header).unwrap();
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(&data[8 + n..]);
        std::fs::write(&path, out).unwrap();
    }

    /// Edit `DCP_SHARDING_INFO` of the file `name`.
    fn edit_info(&self, name: &str, edit: impl FnOnce(&mut serde_json::Map<String, Json>)) {
        self.edit_header(name, |h| {
            let meta = h["__metadata__"].as_object_mut().unwrap();
            let mut info: serde_json::Map<String, Json> =
                serde_json::from_str(meta["DCP_SHARDING_INFO"].as_str().unwrap()).unwrap();
            edit(&mut info);
            meta.insert(
                "DCP_SHARDING_INFO".into(),
                Json::String(serde_json::to_string(&info).unwrap()),
            );
        });
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const RANK0: &str = "shard-00001-model-00001-of-00001.safetensors";
const RANK1: &str = "shard-00002-model-00001-of-00001.safetensors";

fn open_err(dir: &Path) -> ptload_reader::Error {
    match Dcp::open(dir) {
        Ok(d) => {
            let names: Vec<String> = d.tensors().iter().map(|t| t.name().to_owned()).collect();
            // Refused when a tensor is read, if not at open.
            for n in &names {
                if let Err(e) = d.read_tensor(n) {
                    return e;
                }
            }
            panic!("{} opened and read", dir.display())
        }
        Err(e) => e,
    }
}

#[test]
fn chunks_that_overlap_or_leave_a_gap_are_refused() {
    let s = Scratch::of("hf_world2", "overlap");
    s.edit_info(RANK1, |info| {
        info.insert(
            "embed.weight".into(),
            serde_json::json!({"saved_offsets": [3, 0]}),
        );
    });
    let e = open_err(&s.0);
    assert_eq!(e.kind(), ErrorKind::Tensor, "{e}");
    assert!(e.to_string().contains("overlap"), "{e}");
    assert_eq!(e.tensor(), Some("embed.weight"), "{e}");

    let s = Scratch::of("hf_world2", "gap");
    s.edit_info(RANK1, |info| {
        info.insert(
            "embed.weight".into(),
            serde_json::json!({"saved_offsets": [5, 0]}),
        );
    });
    let e = open_err(&s.0);
    assert!(e.to_string().contains("cover 28 of its 32 elements"), "{e}");
}

#[test]
fn offsets_that_do_not_fit_the_chunk_are_refused() {
    for (case, offsets, says) in [
        (
            "rank",
            serde_json::json!([4]),
            "not a place for shape [3, 4]",
        ),
        ("overflow", serde_json::json!([u64::MAX, 0]), "overflows"),
        ("text", serde_json::json!("4,0"), "no saved_offsets"),
    ] {
        let s = Scratch::of("hf_world2", case);
        s.edit_info(RANK1, |info| {
            info.insert(
                "embed.weight".into(),
                serde_json::json!({ "saved_offsets": offsets }),
            );
        });
        let e = Dcp::open(&s.0).expect_err(case);
        assert_eq!(e.kind(), ErrorKind::Tensor, "{case}: {e}");
        assert!(e.to_string().contains(says), "{case}: {e}");
        assert!(e.to_string().contains(RANK1), "{case}: {e}");
    }
    let s = Scratch::of("hf_world2", "stranger");
    s.edit_info(RANK1, |info| {
        info.insert("nowhere".into(), serde_json::json!({"saved_offsets": [0]}));
    });
    let e = Dcp::open(&s.0).expect_err("a name the file lacks");
    assert!(e.to_string().contains("\"nowhere\""), "{e}");
    let s = Scratch::of("hf_world2", "notjson");
    s.edit_header(RANK1, |h| {
        h["__metadata__"]["DCP_SHARDING_INFO"] = Json::String("{\"embed.weight\": [".into());
    });
    let e = Dcp::open(&s.0).expect_err("not JSON");
    assert!(e.to_string().contains("DCP_SHARDING_INFO"), "{e}");
}

#[test]
fn files_that_disagree_on_a_tensor_are_refused() {
    // Rank 1's chunk of embed.weight claims another dtype (with its bytes
    // still matching: two F16 elements are one F32).
    let s = Scratch::of("hf_world2", "dtype");
    s.edit_header(RANK1, |h| {
        let e = h["embed.weight"].as_object_mut().unwrap();
        e.insert("dtype".into(), Json::String("F32".into()));
        e.insert("shape".into(), serde_json::json!([3, 2]));
    });
    let e = Dcp::open(&s.0).expect_err("dtypes differ");
    assert_eq!(e.kind(), ErrorKind::Tensor, "{e}");
    assert!(e.to_string().contains("F32"), "{e}");
    assert_eq!(e.tensor(), Some("embed.weight"), "{e}");
}

#[test]
fn a_hostile_header_is_refused_as_in_any_safetensors_file() {
    // data_offsets past the data.
    let s = Scratch::of("hf_world2", "range");
    s.edit_header(RANK0, |h| {
        h["layers.1.small"]["data_offsets"] = serde_json::json!([0u64, 1u64 << 40]);
    });
    let e = Dcp::open(&s.0).expect_err("out of file");
    assert!(e.to_string().contains(RANK0), "{e}");
    // A header length far past the file: refused before anything is read.
    let s = Scratch::of("hf_world2", "length");
    let path = s.0.join(RANK0);
    let mut data = std::fs::read(&path).unwrap();
    data[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&path, data).unwrap();
    // Not a save any more by its first file's content; the directory
    // is then a plain set of safetensors files, which refuses it too.
    let e = CheckpointSet::open(&s.0).expect_err("enormous header");
    assert!(
        e.to_string().contains(RANK0) || e.to_string().contains("max_index_bytes"),
        "{e}"
    );
    // Too many files for the limit.
    let mut limits = Limits::default();
    limits.max_set_files = 1;
    let e = Dcp::open_with(dir_of("hf_world2"), &OpenOptions::new().limits(limits))
        .expect_err("two files");
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
}

#[test]
fn an_index_makes_the_directory_a_safetensors_set() {
    // The rank-0 layout of the writer (and any model's) has an index:
    // read as a set of safetensors files, not as a save to assemble.
    let s = Scratch::of("hf_world1", "index");
    let names: serde_json::Map<String, Json> = Dcp::open(&s.0)
        .unwrap()
        .tensors()
        .iter()
        .map(|t| (t.name().to_owned(), Json::String(RANK0.into())))
        .collect();
    std::fs::write(
        s.0.join("model.safetensors.index.json"),
        serde_json::to_vec(&serde_json::json!({"metadata": {}, "weight_map": names})).unwrap(),
    )
    .unwrap();
    assert!(!ptload_reader::dcp::is_dcp_dir(&s.0));
    let set = CheckpointSet::open(&s.0).expect("set");
    assert!(set.index().is_some());
    assert_eq!(set.len(), names.len());
}
