//! Dtype conversion against torch's own `.to(dtype)` for every pair of
//! F64 F32 F16 BF16 F8_E4M3 F8_E5M2 (fixtures/conversions.json, computed
//! by torch's scalar CPU kernels on edge values, ties, subnormals,
//! overflow, infinities, NaNs and every 8-bit pattern).

use std::path::{Path, PathBuf};

use ptload_reader::cast::convert;
use ptload_reader::{Checkpoint, DType};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn dtype(name: &str) -> DType {
    match name {
        "F64" => DType::F64,
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "F8_E4M3" => DType::F8E4M3,
        "F8_E5M2" => DType::F8E5M2,
        other => panic!("unknown dtype {other}"),
    }
}

#[test]
fn every_pair_matches_torch() {
    let text =
        std::fs::read_to_string(fixtures().join("conversions.json")).expect("conversions.json");
    let doc: Json = serde_json::from_str(&text).expect("json");
    let ckpt = Checkpoint::open(fixtures().join("files/conversions.pt")).expect("open");
    let pairs = doc["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 30);
    let mut failures = Vec::new();
    for pair in pairs {
        let (from, to) = (
            dtype(pair["from"].as_str().expect("from")),
            dtype(pair["to"].as_str().expect("to")),
        );
        let source = ckpt
            .tensor(pair["source"].as_str().expect("source"))
            .expect("source tensor");
        assert_eq!(source.dtype(), from);
        let out = convert(&source.data().expect("data"), from, to).expect("convert");
        let digest = hex::encode(Sha256::digest(&out));
        if digest != pair["sha256"].as_str().expect("sha") {
            let head = hex::encode(&out[..out.len().min(64)]);
            failures.push(format!(
                "{from} -> {to}: head {head} want {}",
                pair["hex_head"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} pairs differ from torch:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The streaming writer (any `Write`) and the file writer (kernel copies
/// from the source file) produce the same bytes.
#[cfg(feature = "export")]
#[test]
fn both_safetensors_writers_agree() {
    use ptload_reader::export::{Export, SafetensorsOptions};
    use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
    let dir = std::env::temp_dir().join(format!("ptload-writers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for name in [
        "views.pt",
        "training.ckpt",
        "bigendian.pt",
        "multi_gpu.pt",
        "conversions.pt",
    ] {
        let ckpt = Checkpoint::open(fixtures().join("files").join(name)).expect("open");
        let sel = StateDictOptions {
            key: KeySelect::All,
            strip: Strip::None,
            ..Default::default()
        }
        .select(&ckpt)
        .expect("select");
        let opts = SafetensorsOptions {
            skip_unsupported: true,
            ..Default::default()
        };
        let mut streamed = Vec::new();
        Export::state_dict(&sel, &opts)
            .to_writer(&mut streamed)
            .expect("stream");
        let path = dir.join(format!("{name}.safetensors"));
        Export::state_dict(&sel, &opts)
            .to_file(&path)
            .expect("file");
        assert_eq!(std::fs::read(&path).expect("read"), streamed, "{name}");
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// What safetensors cannot hold is left out when asked, as data: each
/// tensor's name and why (a dtype safetensors lacks, a meta tensor), and
/// otherwise refused naming them.
#[cfg(feature = "export")]
#[test]
fn tensors_safetensors_cannot_hold_are_skipped_as_data() {
    use ptload_reader::export::{Export, SafetensorsOptions, Unwritable};
    use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
    let every = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    for (name, want) in [
        ("dtypes.pt", Unwritable::NoDtype(DType::C128)),
        ("meta.pt", Unwritable::NoData),
    ] {
        let ckpt = Checkpoint::open(fixtures().join("files").join(name)).expect("open");
        let sel = every.select(&ckpt).expect("select");
        let skip = SafetensorsOptions {
            skip_unsupported: true,
            ..Default::default()
        };
        let written = Export::state_dict(&sel, &skip)
            .to_writer(&mut Vec::new())
            .expect("written");
        let found = written
            .skipped
            .iter()
            .find(|s| s.why == want)
            .unwrap_or_else(|| panic!("{name}: {:?}", written.skipped));
        assert!(sel.get(&found.name).is_some(), "{name}: {found}");
        assert_eq!(found.to_string(), format!("{}: {}", found.name, found.why));
        let refused = Export::state_dict(&sel, &SafetensorsOptions::default())
            .to_writer(&mut Vec::new())
            .expect_err("refused");
        assert!(refused.to_string().contains(&found.name), "{refused}");
    }
}

/// `TensorView::read_as` converts as `cast::convert` does (itself checked
/// against torch above), into the type asked for; the same type is
/// `to_vec`, and a pair the casts do not cover is refused naming both.
#[test]
fn typed_reads_convert_as_the_casts_do() {
    use ptload_reader::cast::ReadAs;
    use ptload_reader::{Checkpoint, DType, ErrorKind};
    let ckpt = Checkpoint::open(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files/dtypes.pt"),
    )
    .expect("open");
    for name in [
        "f64",
        "f32",
        "f16",
        "bf16",
        "f8_e4m3fn",
        "f8_e5m2",
        "scalar_bf16",
        "empty_f32",
    ] {
        let t = ckpt.tensor(name).expect(name);
        let wide: Vec<f32> = t.read_as().expect(name);
        let want = ptload_reader::cast::convert(&t.data().unwrap(), t.dtype(), DType::F32).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<f32, u8>(&wide),
            want.as_slice(),
            "{name}"
        );
        #[cfg(feature = "half")]
        {
            let narrow: Vec<half::bf16> = t.read_as().expect(name);
            let want =
                ptload_reader::cast::convert(&t.data().unwrap(), t.dtype(), DType::BF16).unwrap();
            assert_eq!(
                bytemuck::cast_slice::<half::bf16, u8>(&narrow),
                want.as_slice(),
                "{name}"
            );
        }
    }
    let f32s = ckpt.tensor("f32").unwrap();
    assert_eq!(
        f32s.read_as::<f32>().unwrap(),
        f32s.to_vec::<f32>().unwrap()
    );
    let e = ckpt
        .tensor("i64")
        .unwrap()
        .read_as::<f32>()
        .expect_err("int");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert_eq!(e.tensor(), Some("i64"));
}
