//! map_location semantics against torch's own answers
//! (fixtures/map_location.json, recorded by fixtures/generate.py), the
//! placements torch cannot express, and the state-dict tools.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ptload_reader::placement::{
    Balanced, Budget, ByName, BySize, Device, DeviceMap, First, Keep, Location, Mapper,
    StorageRequest, Table, To,
};
use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
use ptload_reader::Checkpoint;
use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn open(name: &str) -> Checkpoint {
    Checkpoint::open(fixtures().join("files").join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Each tensor's planned target, as text.
fn placements(
    ckpt: &Checkpoint,
    mapper: &mut dyn Mapper,
) -> Result<BTreeMap<String, String>, ptload_reader::Error> {
    let plan = DeviceMap::new(ckpt, mapper)?;
    Ok(ckpt
        .tensors()
        .map(|t| {
            (
                t.name().to_owned(),
                plan.tensor_target(t.info()).to_string(),
            )
        })
        .collect())
}

/// torch's tag `cuda` (no index) is restored on the current device, cuda:0.
fn torch_tag(tag: &str) -> String {
    if tag == "cuda" {
        "cuda:0".into()
    } else {
        tag.into()
    }
}

/// The Rust equivalent of each Python callable the generator used.
fn callable(source: &str) -> Box<dyn Mapper> {
    match source {
        "lambda storage, loc: None" => Box::new(|_: &StorageRequest<'_>| None),
        "lambda storage, loc: storage if loc == 'cpu' else None" => {
            Box::new(|s: &StorageRequest<'_>| {
                (*s.location == Location::Cpu).then_some(Device::Host)
            })
        }
        src if src.contains("cuda:2") && src.contains("cuda:3") => {
            Box::new(|s: &StorageRequest<'_>| {
                matches!(s.location, Location::Cuda(Some(2 | 3))).then_some(Device::Host)
            })
        }
        other => panic!("no Rust equivalent for callable {other:?}: add one"),
    }
}

fn mapper_for(case: &Json) -> Box<dyn Mapper> {
    match case["form"].as_str().expect("form") {
        "none" => Box::new(Keep),
        "str" | "device" => {
            let spec = case["spec"].as_str().expect("spec");
            Box::new(To(spec.parse::<Device>().expect("device")))
        }
        "dict" => {
            let table = case["spec"]
                .as_object()
                .expect("table")
                .iter()
                .map(|(from, to)| {
                    (
                        Location::parse(from),
                        to.as_str().expect("to").parse::<Device>().expect("device"),
                    )
                })
                .collect();
            Box::new(Table(table))
        }
        "callable" => callable(case["source"].as_str().expect("source")),
        other => panic!("unknown form {other}"),
    }
}

#[test]
fn every_torch_form_places_like_torch() {
    let text =
        std::fs::read_to_string(fixtures().join("map_location.json")).expect("map_location.json");
    let doc: Json = serde_json::from_str(&text).expect("json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for case in cases {
        let ckpt = open(case["file"].as_str().expect("file"));
        let mut mapper = mapper_for(case);
        let got = placements(&ckpt, mapper.as_mut()).expect("plan");
        let want: BTreeMap<String, String> = case["placements"]
            .as_object()
            .expect("placements")
            .iter()
            .map(|(k, v)| (k.clone(), torch_tag(v.as_str().expect("tag"))))
            .collect();
        assert_eq!(got, want, "{case}");
        // Where the target exists on this machine, torch's real device agrees.
        if let Some(devices) = case["torch_device"].as_object() {
            for (name, device) in devices {
                assert_eq!(
                    got[name],
                    device.as_str().expect("device"),
                    "{name} in {case}"
                );
            }
        }
    }
}

fn multi_gpu_targets(mapper: &mut dyn Mapper) -> Vec<String> {
    let ckpt = open("multi_gpu.pt");
    let plan = DeviceMap::new(&ckpt, mapper).expect("plan");
    ckpt.tensors()
        .map(|t| plan.tensor_target(t.info()).to_string())
        .collect()
}

// multi_gpu.pt, in order: encoder.layers.0.weight (65536 B), .bias (512),
// encoder.layers.1.weight (64), decoder.layers.0.weight (40960, F16),
// decoder.layers.0.scale (98304), decoder.layers.1.weight (12), embed.weight (320).

#[test]
fn placement_by_name() {
    let mut m = ByName(vec![
        ("encoder.*".into(), Device::Cuda(0)),
        ("decoder.*".into(), Device::Cuda(1)),
        ("*embed*".into(), Device::Host),
    ]);
    assert_eq!(
        multi_gpu_targets(&mut m),
        ["cuda:0", "cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:1", "cpu"]
    );
}

#[test]
fn placement_by_size() {
    let mut m = BySize {
        threshold: 4096,
        large: Device::Cuda(0),
        small: Device::Host,
    };
    assert_eq!(
        multi_gpu_targets(&mut m),
        ["cuda:0", "cpu", "cpu", "cuda:0", "cuda:0", "cpu", "cpu"]
    );
}

#[test]
fn placement_by_budget_fills_in_order_then_the_host() {
    let mut m = Budget::new(vec![(Device::Cuda(0), 70_000), (Device::Cuda(1), 70_000)]);
    // 65536 + 512 + 64 fill cuda:0 to 66112; 40960 does not fit there and
    // goes to cuda:1; 98304 fits nowhere: host; 12 and 320 still fit on cuda:0.
    assert_eq!(
        multi_gpu_targets(&mut m),
        ["cuda:0", "cuda:0", "cuda:0", "cuda:1", "cpu", "cuda:0", "cuda:0"]
    );
}

#[test]
fn balanced_keeps_consecutive_storages_together() {
    let ckpt = open("multi_gpu.pt");
    let mut m = Balanced::new(&ckpt, vec![Device::Cuda(0), Device::Cuda(1)]);
    let plan = DeviceMap::new(&ckpt, &mut m).expect("plan");
    let targets: Vec<String> = ckpt
        .tensors()
        .map(|t| plan.tensor_target(t.info()).to_string())
        .collect();
    assert_eq!(
        targets,
        ["cuda:0", "cuda:0", "cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:1"]
    );
    assert_eq!(
        plan.per_device(&ckpt),
        [
            (Device::Cuda(0), 65536 + 512 + 64 + 40960, 4),
            (Device::Cuda(1), 98304 + 12 + 320, 3)
        ]
    );
}

#[test]
fn composition_first_decision_wins_then_the_saved_location() {
    let mut m = First(vec![
        Box::new(ByName(vec![("*embed*".into(), Device::Meta)])),
        Box::new(Table(vec![(Location::Cuda(Some(3)), Device::Host)])),
    ]);
    assert_eq!(
        multi_gpu_targets(&mut m),
        ["cuda:0", "cuda:0", "cuda:1", "cuda:2", "cuda:2", "cpu", "meta"]
    );
}

#[test]
fn mappers_see_every_tensor_of_a_shared_storage_once() {
    let ckpt = open("views.pt");
    let mut calls = Vec::new();
    let mut record = |s: &StorageRequest<'_>| {
        calls.push((
            s.key.to_owned(),
            s.tensors.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        ));
        None
    };
    DeviceMap::new(&ckpt, &mut record).expect("plan");
    assert_eq!(calls.len(), ckpt.storages().len());
    assert_eq!(calls[0].0, "0");
    assert_eq!(calls[0].1.len(), 7, "{:?}", calls[0]);
    assert_eq!(calls[1].1, ["embed.weight", "lm_head.weight"]);
}

fn names(ckpt: &Checkpoint, opts: &StateDictOptions) -> Vec<String> {
    opts.select(ckpt)
        .expect("select")
        .into_iter()
        .map(|s| s.name)
        .collect()
}

#[test]
fn stripping_wrappers_gives_the_plain_names_and_bytes() {
    let plain = open("plain_model.pt");
    let plain_names: Vec<String> = plain.tensors().map(|t| t.name().to_owned()).collect();
    for wrapped in ["dataparallel.pt", "compiled.pt"] {
        let ckpt = open(wrapped);
        let selected = StateDictOptions::default().select(&ckpt).expect("select");
        let got: Vec<&str> = selected.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(got, plain_names, "{wrapped}");
        for s in &selected {
            let t = ckpt.tensors().nth(s.index).expect("tensor");
            let p = plain.tensor(&s.name).expect("plain tensor");
            assert_eq!(
                t.data().expect("data"),
                p.data().expect("data"),
                "{wrapped}: {}",
                s.name
            );
        }
        let kept = StateDictOptions {
            strip: Strip::None,
            ..Default::default()
        };
        assert_ne!(
            names(&ckpt, &kept),
            plain_names,
            "{wrapped}: nothing stripped without Strip::Auto"
        );
    }
}

#[test]
fn training_checkpoints_select_the_model() {
    let ckpt = open("training.ckpt");
    let auto = ptload_reader::state_dict::auto_key(&ckpt);
    assert_eq!(auto.key, Some("model_state_dict"));
    assert_eq!(
        auto.why,
        "\"model_state_dict\": a training checkpoint's model (beside it: optimizer_state_dict, epoch, global_step and 4 more)"
    );
    let got = names(&ckpt, &StateDictOptions::default());
    let plain: Vec<String> = open("plain_model.pt")
        .tensors()
        .map(|t| t.name().to_owned())
        .collect();
    assert_eq!(got, plain);
    let optimizer = StateDictOptions {
        key: KeySelect::Path("optimizer_state_dict.state.0".into()),
        ..Default::default()
    };
    assert_eq!(names(&ckpt, &optimizer), ["step", "exp_avg", "exp_avg_sq"]);
    let missing = StateDictOptions {
        key: KeySelect::Path("nope".into()),
        ..Default::default()
    };
    let e = missing.select(&ckpt).expect_err("no such key");
    assert!(
        e.to_string()
            .contains("model_state_dict, optimizer_state_dict"),
        "{e}"
    );
    // Plain state dicts are left whole.
    assert_eq!(
        ptload_reader::state_dict::auto_key(&open("plain_model.pt")).key,
        None
    );
    assert_eq!(
        ptload_reader::state_dict::auto_key(&open("whole_module.pt")).key,
        None
    );
}

/// Layouts written by real training code: tensors outside the model
/// (random-number generator states, Lightning's callbacks) do not hide the
/// model, and a plain state dict whose names start with `model.` next to
/// other weights stays whole. Every decision says why.
#[test]
fn auto_key_reads_real_training_layouts() {
    use ptload_reader::state_dict::auto_key;
    let rng = open("training_rng.ckpt");
    assert!(rng.tensor("rng_state").is_some(), "a bare top-level tensor");
    let auto = auto_key(&rng);
    assert_eq!(auto.key, Some("model"), "{}", auto.why);
    let sd = StateDictOptions::default().select(&rng).expect("select");
    assert_eq!(sd.len(), 9);
    assert!(sd.get("head.bias").is_some());
    assert_eq!(
        sd.decisions()[1].to_string(),
        "left out 10 tensors outside \"model\" (optimizer: 9, rng_state: 1)"
    );

    let lightning = open("lightning.ckpt");
    assert!(lightning
        .tensors()
        .any(|t| t.name().ends_with("best_model_score")));
    let auto = auto_key(&lightning);
    assert_eq!(auto.key, Some("state_dict"), "{}", auto.why);
    let sd = StateDictOptions::default()
        .select(&lightning)
        .expect("select");
    // Lightning's own names: the LightningModule's attribute stays.
    assert!(sd.get("model.head.bias").is_some());
    assert_eq!(sd.len(), 9);

    let hf = open("hf_lm.pt");
    let auto = auto_key(&hf);
    assert_eq!(auto.key, None);
    assert!(
        auto.why
            .contains("so does lm_head, which is not training state"),
        "{}",
        auto.why
    );
    let sd = StateDictOptions::default().select(&hf).expect("select");
    assert_eq!(sd.len(), hf.len());
    assert!(sd.get("model.embed.weight").is_some() && sd.get("lm_head.weight").is_some());

    let dp = open("dataparallel.pt");
    let sd = StateDictOptions::default().select(&dp).expect("select");
    assert!(sd
        .decisions()
        .iter()
        .any(|d| d.to_string() == "strip-prefix auto: removed \"module.\" from every name"));
}

/// Keys of real projects: resemblyzer's `model_state` is a model; a model
/// beside its average (torchvision's `model` and `model_ema`) or tensors
/// under no known key beside training state (DINO's `student` and
/// `teacher`) leave `auto` unsure, and its decision says so, with the key
/// to pass. A plain state dict decides nothing.
#[test]
fn auto_key_knows_real_projects_keys_and_says_when_unsure() {
    use ptload_reader::advice::Hint;
    use ptload_reader::state_dict::{auto_key, Decision};
    let resemblyzer = open("resemblyzer.pt");
    let auto = auto_key(&resemblyzer);
    assert_eq!(auto.key, Some("model_state"), "{}", auto.why);
    let decision = auto.decision.expect("decided");
    assert!(!decision.is_unsure(), "{decision}");
    let sd = StateDictOptions::default()
        .select(&resemblyzer)
        .expect("select");
    assert_eq!(sd.len(), 16);
    assert!(sd.get("lstm.weight_ih_l0").is_some() && sd.get("similarity_bias").is_some());

    let ema = open("model_ema.pth");
    let auto = auto_key(&ema);
    assert_eq!(auto.key, Some("model"), "{}", auto.why);
    let decision = auto.decision.expect("decided");
    assert!(decision.is_unsure(), "{decision}");
    assert!(
        matches!(&decision, Decision::KeyChosen { other_models, .. } if other_models == &["model_ema"]),
        "{decision:?}"
    );
    assert_eq!(
        decision.hint(),
        Some(Hint::PassKey(Some("model_ema".into())))
    );
    assert!(
        auto.why
            .starts_with("unsure which model you want: took \"model\""),
        "{}",
        auto.why
    );
    // Beside the model: what is not another model.
    assert!(!auto.why.contains("beside them: model_ema"), "{}", auto.why);

    let dino = open("dino.pth");
    let auto = auto_key(&dino);
    assert_eq!(auto.key, None, "{}", auto.why);
    let decision = auto.decision.expect("decided");
    assert!(
        decision.is_unsure() && decision.is_automatic(),
        "{decision}"
    );
    match &decision {
        Decision::Unrecognized { candidates, beside } => {
            assert_eq!(candidates, &["student", "teacher"]);
            assert_eq!(beside, &["optimizer", "dino_loss", "epoch"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(decision.hint(), Some(Hint::PassKey(None)));
    let sd = StateDictOptions::default().select(&dino).expect("select");
    assert_eq!(sd.len(), dino.len());
    assert_eq!(sd.decisions().first(), Some(&decision));

    for plain in [
        "plain_model.pt",
        "whole_module.pt",
        "hf_lm.pt",
        "llama_tiny.pt",
    ] {
        let auto = auto_key(&open(plain));
        assert!(
            auto.decision.as_ref().is_none_or(|d| !d.is_unsure()),
            "{plain}: {}",
            auto.why
        );
    }
}

#[test]
fn renames_prefixes_and_collisions() {
    let ckpt = open("plain_model.pt");
    let opts = StateDictOptions {
        renames: vec![("encoder.*.weight".into(), "enc.*.w".into())],
        add_prefix: Some("model.".into()),
        ..Default::default()
    };
    let got = names(&ckpt, &opts);
    assert!(got.contains(&"model.enc.0.w".to_owned()), "{got:?}");
    assert!(got.contains(&"model.encoder.0.bias".to_owned()), "{got:?}");
    // Looked up by the final names only.
    let sd = opts.select(&ckpt).expect("select");
    assert_eq!(sd.len(), ckpt.len());
    let renamed = sd.get("model.enc.0.w").expect("renamed tensor");
    assert_eq!(renamed.name(), "encoder.0.weight");
    assert_eq!(
        sd.selected("model.enc.0.w").map(|s| s.index),
        ckpt.tensors().position(|t| t.name() == "encoder.0.weight")
    );
    assert!(sd.get("encoder.0.weight").is_none());
    assert!(sd.get("enc.0.w").is_none());
    assert!(sd.contains("model.encoder.0.bias"));
    for (name, view) in sd.tensors() {
        assert_eq!(sd.get(name).map(|v| v.name()), Some(view.name()));
    }
    let merge = StateDictOptions {
        renames: vec![("encoder.0.*".into(), "x".into())],
        ..Default::default()
    };
    let e = merge.select(&ckpt).expect_err("collision");
    assert!(
        e.to_string()
            .contains("\"encoder.0.weight\" and \"encoder.0.bias\" would both become \"x\""),
        "{e}"
    );
    // The same cause as a name in two files of a set (select_set).
    assert_eq!(e.kind(), ptload_reader::ErrorKind::DuplicateName);
    let stars = StateDictOptions {
        renames: vec![("encoder.*".into(), "*.*".into())],
        ..Default::default()
    };
    let e = stars.select(&ckpt).expect_err("more stars than captures");
    assert_eq!(e.kind(), ptload_reader::ErrorKind::InvalidSpec, "{e}");
}

/// A plan of a selection asks about the storages the selected tensors
/// read only, with their selected names and the bytes a load copies (a
/// rank's slices at their size), so a budget is spent on the model and
/// name rules see the model's names.
#[test]
fn a_plan_of_a_selection_sees_the_model_not_the_file() {
    use ptload_reader::tp::{Shard, Splits};
    struct Record(Vec<(Vec<String>, u64, u64)>);
    impl Mapper for Record {
        fn map(&mut self, s: &StorageRequest<'_>) -> Option<Device> {
            let whole = s.numel * s.dtype.size() as u64;
            self.0.push((
                s.tensors.iter().map(|t| t.to_string()).collect(),
                s.nbytes,
                whole,
            ));
            None
        }
    }
    // A training checkpoint: only the model's storages are asked about,
    // under the names the selection gives them.
    let ckpt = open("training.ckpt");
    let sd = StateDictOptions::default().select(&ckpt).expect("auto");
    let mut seen = Record(Vec::new());
    let plan = sd.device_map(0, &mut seen).expect("plan");
    let asked: usize = seen.0.iter().map(|(names, ..)| names.len()).sum();
    assert_eq!(asked, sd.len());
    for (names, copied, whole) in &seen.0 {
        for n in names {
            assert!(sd.contains(n), "{n} is not a selected name");
        }
        assert_eq!(copied, whole);
    }
    assert!(
        seen.0.len() < ckpt.storages().len(),
        "the optimizer's storages are not asked about"
    );
    let planned: u64 = plan.per_device(&ckpt).iter().map(|(_, b, _)| b).sum();
    let model: u64 = sd.tensors().map(|(_, v)| v.info().nbytes).sum();
    assert_eq!(planned, model);
    // A rank's slices are charged at their size: a budget of the rank's
    // share fits it all.
    let llama = open("llama_tiny.pt");
    let opts = StateDictOptions {
        parallel: Some((
            Shard::new(0, 2).unwrap(),
            Splits::with_preset::<String>(&[], Some("llama")).unwrap(),
        )),
        ..StateDictOptions::default()
    };
    let rank = opts.select(&llama).expect("rank");
    let mut seen = Record(Vec::new());
    rank.device_map(0, &mut seen).expect("plan");
    let q = seen
        .0
        .iter()
        .find(|(names, ..)| {
            names
                .iter()
                .any(|n| n.ends_with("layers.0.self_attn.q_proj.weight"))
        })
        .expect("q_proj");
    assert_eq!(q.1 * 2, q.2, "half of q_proj: {q:?}");
    let share: u64 = seen.0.iter().map(|(_, c, _)| c).sum();
    let mut budget = Budget::new(vec![(Device::Cuda(0), share)]);
    let plan = rank.device_map(0, &mut budget).expect("plan");
    let on_gpu = plan
        .per_device(&llama)
        .into_iter()
        .find(|(d, ..)| *d == Device::Cuda(0))
        .map_or(0, |(_, b, _)| b);
    assert_eq!(on_gpu, share, "the whole share fits the budget of its size");
    assert!(rank.device_map(1, &mut Keep).is_err());
}
