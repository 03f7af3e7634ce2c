//! The `ptload` binary on checkpoints written by torch: output, JSON
//! schema, hashes and exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// A directory of the test data the crates share, in the repository's
/// `tests/` (`hostile`, `scan`).
fn shared_data(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests")
        .join(dir)
}

fn fixture(name: &str) -> String {
    fixtures().join("files").join(name).display().to_string()
}

fn expected(name: &str) -> Json {
    let text = std::fs::read_to_string(fixtures().join("expected").join(format!("{name}.json")))
        .expect("expected json");
    serde_json::from_str(&text).expect("json")
}

/// `ptload` with `args`, its output piped; `COLUMNS` removed, so that a
/// width set where the tests run does not shorten names.
fn ptload(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ptload"))
        .args(args)
        .env_remove("COLUMNS")
        .output()
        .expect("run ptload")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn inspect_json(name: &str, extra: &[&str]) -> Json {
    let path = fixture(name);
    let mut args = vec!["inspect", "--json", path.as_str()];
    args.extend_from_slice(extra);
    let out = ptload(&args);
    assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("valid JSON on stdout")
}

#[test]
fn inspect_json_has_exactly_the_documented_keys() {
    let doc = inspect_json("basic.pt", &[]);
    let keys: Vec<&str> = doc
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "file",
            "format",
            "byteorder",
            "pickle_protocol",
            "tensors",
            "totals",
            "values",
            "globals",
            "outside_allowlist",
            "suspicious",
            "dangerous",
            "bytes_read"
        ]
    );
    let tensor_keys: Vec<&str> = doc["tensors"][0]
        .as_object()
        .expect("tensor")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tensor_keys,
        [
            "name",
            "dtype",
            "shape",
            "stride",
            "storage_offset",
            "storage",
            "location",
            "target",
            "nbytes"
        ]
    );
    assert_eq!(doc["format"], "zip");
    assert_eq!(doc["suspicious"], serde_json::json!([]));
    assert!(doc["globals"]
        .as_array()
        .expect("globals")
        .contains(&Json::from("torch._utils._rebuild_tensor_v2")));
}

#[test]
fn inspect_json_matches_torch_for_every_readable_fixture() {
    // The answers of a set's files lie in a folder named as the set's.
    let mut names = Vec::new();
    let mut dirs = vec![(fixtures().join("expected"), String::new())];
    while let Some((dir, prefix)) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("dir") {
            let entry = entry.expect("entry");
            let file_name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.path().is_dir() {
                dirs.push((entry.path(), format!("{file_name}/")));
            } else {
                names.push(file_name.strip_suffix(".json").expect("json").to_owned());
            }
        }
    }
    for name in &names {
        let name = name.as_str();
        let want = expected(name);
        if !want["error"].is_null() {
            continue;
        }
        let doc = inspect_json(name, &["--hash"]);
        assert_eq!(doc["format"], want["format"], "{name}");
        assert_eq!(doc["byteorder"], want["byteorder"], "{name}");
        assert_eq!(doc["pickle_protocol"], want["pickle_protocol"], "{name}");
        let ours = doc["tensors"].as_array().expect("tensors");
        let theirs = want["tensors"].as_array().expect("tensors");
        assert_eq!(ours.len(), theirs.len(), "{name}: tensor count");
        for (o, t) in ours.iter().zip(theirs) {
            for key in [
                "name",
                "dtype",
                "shape",
                "stride",
                "storage_offset",
                "location",
                "sha256",
            ] {
                assert_eq!(o[key], t[key], "{name}: {} {key}", t["name"]);
            }
            if !t["storage"].is_null() {
                assert_eq!(o["storage"], t["storage"], "{name}: {} storage", t["name"]);
            }
            assert_eq!(o["target"], o["location"], "{name}: target before mapping");
        }
    }
}

#[test]
fn files_that_are_not_checkpoints_exit_2_with_one_line() {
    for (file, needle) in [
        ("empty.pt", "empty file"),
        ("lfs_pointer.pt", "git lfs pointer"),
        ("download.html.pt", "html page"),
        ("truncated.pt", "truncated"),
        ("pre1.0_tar.pt", "tar"),
        ("random.bin", "unknown format"),
    ] {
        let out = ptload(&["inspect", &fixture(file)]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        let err = stderr(&out);
        assert!(err.starts_with("ptload: "), "{file}: {err}");
        assert_eq!(err.lines().count(), 1, "{file}: one line: {err}");
        assert!(err.to_lowercase().contains(needle), "{file}: {err}");
        assert!(stdout(&out).is_empty(), "{file}: nothing on stdout");
    }
    let out = ptload(&["inspect", "/nonexistent/model.pt"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot open"));
}

#[test]
fn strict_refuses_what_torch_weights_only_refuses() {
    let out = ptload(&["inspect", "--strict", &fixture("whole_module.pt")]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("Unsupported global: GLOBAL __main__."),
        "{err}"
    );

    let out = ptload(&["inspect", "--strict", &fixture("basic.pt")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // The default policy loads it and reports what torch would refuse.
    let doc = inspect_json("training.ckpt", &[]);
    // Outside the allowlist; scan calls it plain data, so it is no
    // finding.
    let suspicious = doc["outside_allowlist"]
        .as_array()
        .expect("outside_allowlist");
    assert!(
        suspicious.contains(&Json::from("argparse.Namespace")),
        "{suspicious:?}"
    );
    assert_eq!(doc["suspicious"], serde_json::json!([]));
    let out = ptload(&["inspect", "--strict", &fixture("training.ckpt")]);
    assert_eq!(out.status.code(), Some(2));

    // Allowing every reported global makes the strict load succeed.
    let path = fixture("training.ckpt");
    let mut args = vec!["inspect", "--strict", path.as_str()];
    let allowed: Vec<String> = suspicious
        .iter()
        .map(|g| g.as_str().expect("str").to_owned())
        .collect();
    for g in &allowed {
        args.push("--allow-global");
        args.push(g);
    }
    let out = ptload(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn inspect_table_lists_every_tensor() {
    let out = ptload(&["inspect", &fixture("multi_gpu.pt")]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains("NAME") && text.contains("LOCATION"));
    let want = expected("multi_gpu.pt");
    let tensors = want["tensors"].as_array().expect("tensors");
    for t in tensors {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{} ", t["name"].as_str().expect("name"))))
            .unwrap_or_else(|| panic!("no row for {}", t["name"]));
        assert!(
            line.contains(t["location"].as_str().expect("loc")),
            "{line}"
        );
    }
    assert!(
        text.contains(&format!("{} tensors", tensors.len())),
        "{text}"
    );
}

#[test]
fn demo_runs_on_the_embedded_checkpoint() {
    let out = ptload(&["demo"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let want = expected("training.ckpt");
    for t in want["tensors"].as_array().expect("tensors") {
        assert!(
            text.contains(t["name"].as_str().expect("name")),
            "demo lacks {}",
            t["name"]
        );
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("epoch ") && l.ends_with(" 7")),
        "{text}"
    );
    assert!(text.contains("argparse.Namespace"), "{text}");
    assert!(text.contains("--map-location auto"), "{text}");
    assert!(text.contains("loaded 9 tensors"), "{text}");
}

fn targets(doc: &Json) -> Vec<(String, String, String)> {
    doc["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().expect("name").to_owned(),
                t["location"].as_str().expect("location").to_owned(),
                t["target"].as_str().expect("target").to_owned(),
            )
        })
        .collect()
}

#[test]
fn map_location_table_and_place_rules_set_targets() {
    let doc = inspect_json(
        "multi_gpu.pt",
        &[
            "--map-location",
            "cuda:1=cuda:0,cuda:3=cpu",
            "--place",
            "*embed*=meta",
        ],
    );
    let got: Vec<(String, String)> = targets(&doc)
        .into_iter()
        .map(|(_, loc, target)| (loc, target))
        .collect();
    let want = [
        ("cuda:0", "cuda:0"),
        ("cuda:0", "cuda:0"),
        ("cuda:1", "cuda:0"),
        ("cuda:2", "cuda:2"),
        ("cuda:2", "cuda:2"),
        ("cuda:3", "cpu"),
        ("cpu", "meta"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn map_location_auto_follows_the_machine() {
    let expected = if ptload_device::device_count() > 0 {
        "cuda:0"
    } else {
        "cpu"
    };
    let doc = inspect_json("multi_gpu.pt", &["--map-location", "auto"]);
    assert!(targets(&doc).iter().all(|(_, _, t)| t == expected), "{doc}");
}

#[test]
fn completions_and_manual_pages() {
    let bash = ptload(&["completions", "bash"]);
    assert_eq!(bash.status.code(), Some(0));
    assert!(stdout(&bash).contains("_ptload()"));
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = ptload(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        assert!(stdout(&out).contains("inspect"), "{shell}");
    }
    let man = stdout(&ptload(&["man"]));
    assert!(man.starts_with(".ie"), "{man}");
    assert!(man.contains(".TH ptload 1"), "{man}");
    let page = stdout(&ptload(&["man", "convert"]));
    assert!(page.contains(".TH ptload-convert 1"), "{page}");
    assert!(page.contains("skip\\-unsupported"), "{page}");
    let bad = ptload(&["man", "nope"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("one of inspect, load"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn the_command_line_speaks_like_other_tools() {
    // Bare `ptload`: the command list, exit 2.
    let bare = ptload(&[]);
    assert_eq!(bare.status.code(), Some(2));
    let help = stderr(&bare);
    for command in ["inspect", "load", "convert", "scan", "diff", "demo"] {
        assert!(help.contains(&format!("  {command} ")), "{help}");
    }
    // The parser's own errors: the mistake, a usage line, a hint.
    let bad = ptload(&["inspect", "--bogus", "x.pt"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = stderr(&bad);
    assert!(
        err.starts_with("error: unexpected argument '--bogus'"),
        "{err}"
    );
    assert!(err.contains("Usage: ptload inspect"), "{err}");
    // Device names in any case.
    let path = fixture("multi_gpu.pt");
    let upper = ptload(&["inspect", "--json", &path, "--map-location", "CPU"]);
    assert_eq!(upper.status.code(), Some(0), "{}", stderr(&upper));
    // diff says which side failed.
    let lfs = fixture("lfs_pointer.pt");
    let d = ptload(&["diff", &path, &lfs]);
    assert_eq!(d.status.code(), Some(2));
    assert!(
        stderr(&d).starts_with(&format!("ptload: {lfs}: format:")),
        "{}",
        stderr(&d)
    );
}

#[test]
fn strict_names_every_refused_global_and_allow_global_takes_lists_and_globs() {
    let path = fixture("whole_module.pt");
    let out = ptload(&["inspect", "--strict", &path]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    // torch's message for the first, then all of them in one run.
    assert!(
        err.starts_with("ptload: policy: Unsupported global: GLOBAL __main__.WholeNet"),
        "{err}"
    );
    assert!(err.contains("The file names 7 globals outside the allowlist: __main__.WholeNet, torch.nn.modules.linear.Linear,"), "{err}");
    assert!(
        err.contains("--allow-global, which takes a comma-separated list and globs"),
        "{err}"
    );
    assert!(!err.contains("OpenOptions"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let listed = ptload(&[
        "inspect",
        "--strict",
        "--allow-global",
        "__main__.*,torch.nn.modules.*",
        &path,
    ]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    let partial = ptload(&["inspect", "--strict", "--allow-global", "__main__.*", &path]);
    assert_eq!(partial.status.code(), Some(2));
    assert!(stderr(&partial).contains("GLOBAL torch.nn.modules.linear.Linear"));
    // A glob never reaches os.system.
    let dir = temp_dir("allow-glob");
    let payload = payload_checkpoint(&dir);
    let star = ptload(&["inspect", "--strict", "--allow-global", "*", &payload]);
    assert_eq!(star.status.code(), Some(2), "{}", stdout(&star));
    assert!(
        stderr(&star).contains("are never allowed"),
        "{}",
        stderr(&star)
    );
}

#[test]
fn inspect_shows_values_and_totals_and_takes_several_files() {
    let doc = inspect_json("training.ckpt", &[]);
    assert!(doc["file"]
        .as_str()
        .is_some_and(|f| f.ends_with("training.ckpt")));
    assert_eq!(doc["totals"]["tensors"], 36);
    assert_eq!(doc["totals"]["storages"], 36);
    assert_eq!(doc["totals"]["bytes"], doc["totals"]["stored_bytes"]);
    let values = doc["values"].as_array().expect("values");
    let get = |name: &str| {
        values
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    // torch's answers for the same file.
    assert_eq!(get("epoch")["value"], 7);
    assert_eq!(get("args.name")["value"], "run1");
    assert_eq!(get("best_acc")["value"], 0.875);
    assert_eq!(get("args.amp")["value"], true);
    assert_eq!(get("np_array")["value"], Json::Null);
    assert_eq!(get("np_array")["text"], "numpy array i8 [4]");
    let want = expected("training.ckpt");
    assert_eq!(
        values.len(),
        want["values"].as_object().map_or(0, |v| v.len()) + 1
    );
    // The table: a second one for the values.
    let text = stdout(&ptload(&["inspect", &fixture("training.ckpt")]));
    assert!(text.contains("\nNAME "), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("epoch ") && l.ends_with(" 7")),
        "{text}"
    );
    // Several files: a table each, or one JSON document per line; a file
    // that fails is named and the others still shown (exit 2).
    let both = ptload(&[
        "inspect",
        "--json",
        &fixture("basic.pt"),
        &fixture("legacy.pt"),
    ]);
    assert_eq!(both.status.code(), Some(0));
    let docs: Vec<Json> = stdout(&both)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[1]["format"], "legacy");
    let bad = ptload(&["inspect", &fixture("lfs_pointer.pt"), &fixture("basic.pt")]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("lfs_pointer.pt: format:"),
        "{}",
        stderr(&bad)
    );
    assert!(
        stdout(&bad).contains("4 tensors, 4 storages"),
        "{}",
        stdout(&bad)
    );
}

#[test]
fn include_and_exclude_pick_tensors_by_final_name() {
    let doc = inspect_json(
        "training.ckpt",
        &[
            "--key",
            "auto",
            "--include",
            "encoder.*,head.*",
            "--exclude",
            "*.bias",
        ],
    );
    let names: Vec<&str> = doc["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["encoder.0.weight", "encoder.2.weight", "head.weight"]
    );
    // The same selection through load and convert.
    let out = ptload(&[
        "load",
        "--json",
        "--exclude",
        "encoder.*",
        &fixture("training.ckpt"),
    ]);
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(doc["tensors"].as_array().map(Vec::len), Some(5));
    assert!(
        stderr(&out).contains("left out 4 tensors by name"),
        "{}",
        stderr(&out)
    );
}

/// Run `ptload` in a pseudo-terminal (util-linux `script`), with bars
/// drawn from 0 bytes on, and return what the terminal received.
fn in_terminal(args: &[&str]) -> String {
    let mut line = env!("CARGO_BIN_EXE_ptload").to_owned();
    for a in args {
        line.push_str(" '");
        line.push_str(a);
        line.push('\'');
    }
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("PTLOAD_PROGRESS_FROM", "0")
        .output()
        .expect("util-linux `script` runs commands in a pseudo-terminal");
    assert!(out.status.success(), "{line}: {}", stderr(&out));
    stdout(&out)
}

#[test]
fn progress_bars_are_labelled_drawn_on_a_terminal_and_can_be_turned_off() {
    let file = fixture("training.ckpt");
    let shown = in_terminal(&["load", "--map-location", "cpu", "--dtype", "bf16", &file]);
    assert!(shown.contains("converting and loading"), "{shown}");
    // Drawn, then cleared before the report.
    assert!(shown.contains("924 B/924 B"), "{shown}");
    assert!(shown.contains("\x1b[2K"), "{shown}");
    let hashed = in_terminal(&["inspect", "--hash", &file]);
    assert!(hashed.contains("hashing"), "{hashed}");
    let dir = temp_dir("bars");
    let out = dir.join("m.safetensors").display().to_string();
    let converted = in_terminal(&["convert", &file, &out]);
    assert!(converted.contains("converting"), "{converted}");
    let compared = in_terminal(&["diff", &file, &out]);
    assert!(compared.contains("comparing"), "{compared}");
    for off in ["--no-progress", "--quiet"] {
        let plain = in_terminal(&["load", off, "--dtype", "bf16", &file]);
        assert!(!plain.contains("converting and loading"), "{off}: {plain}");
        assert!(plain.contains("loaded 9 tensors"), "{plain}");
    }
    // --quiet also drops the notes on automatic choices; not a pipe's
    // output either way.
    let quiet = in_terminal(&["load", "--quiet", &file]);
    assert!(!quiet.contains("--key auto"), "{quiet}");
    let piped = ptload(&["load", "--dtype", "bf16", &file]);
    assert!(!stderr(&piped).contains("converting"), "{}", stderr(&piped));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn automatic_choices_are_said() {
    let out = ptload(&["load", "--json", &fixture("training_rng.ckpt")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("ptload: --key auto: \"model\": a training checkpoint's model"),
        "{err}"
    );
    assert!(
        err.contains("ptload: left out 10 tensors outside \"model\""),
        "{err}"
    );
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(doc["decisions"].as_array().map(Vec::len), Some(2), "{doc}");
    // Undecided: the whole file, and the flag that takes the model alone.
    let hf = ptload(&["load", &fixture("hf_lm.pt")]);
    assert!(
        stderr(&hf).contains("to take only \"model\", pass --key model"),
        "{}",
        stderr(&hf)
    );
    assert!(!stderr(&hf).contains("KeySelect"));
    let dp = ptload(&["convert", &fixture("dataparallel.pt"), "-"]);
    assert!(
        stderr(&dp).contains("ptload: --strip-prefix auto: removed \"module.\" from every name"),
        "{}",
        stderr(&dp)
    );
}

#[test]
fn malformed_specs_show_the_grammar() {
    let path = fixture("multi_gpu.pt");
    for (flag, value, needle) in [
        (
            "--map-location",
            "gpu",
            "expected cpu, cuda, cuda:N, meta, auto, or FROM=TO[,FROM=TO...]",
        ),
        (
            "--map-location",
            "cuda:1=mps",
            "expected cpu, cuda, cuda:N, meta, auto, or FROM=TO[,FROM=TO...]",
        ),
        ("--place", "encoder.*", "expected PATTERN=DEVICE"),
        (
            "--budget",
            "lots",
            "expected a share of each GPU's memory (0.9, 90%)",
        ),
        ("--budget", "2", "a bare number is bytes per GPU"),
        ("--balance", "0", "at least 1"),
        ("--rename", "nothing", "expected FROM=TO"),
    ] {
        let out = ptload(&["inspect", &path, flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = stderr(&out);
        assert!(err.contains(needle), "{flag} {value}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn key_selection_and_prefix_stripping() {
    let plain: Vec<String> = targets(&inspect_json("plain_model.pt", &[]))
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    for (file, args) in [
        ("training.ckpt", vec!["--key", "auto"]),
        ("training.ckpt", vec!["--key", "model_state_dict"]),
        ("dataparallel.pt", vec!["--strip-prefix", "auto"]),
        ("compiled.pt", vec!["--strip-prefix", "_orig_mod."]),
    ] {
        let names: Vec<String> = targets(&inspect_json(file, &args))
            .into_iter()
            .map(|(n, _, _)| n)
            .collect();
        assert_eq!(names, plain, "{file} {args:?}");
    }
    // inspect shows everything, as saved, unless asked.
    let all = targets(&inspect_json("training.ckpt", &[]));
    assert!(all
        .iter()
        .any(|(n, _, _)| n.starts_with("optimizer_state_dict.")));
}

#[test]
fn load_json_reports_every_tensor_and_its_fallback() {
    let path = fixture("multi_gpu.pt");
    let out = ptload(&["load", "--json", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let keys: Vec<&str> = doc
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        ["tensors", "devices", "seconds", "decisions", "bytes_read"]
    );
    let tensors = doc["tensors"].as_array().expect("tensors");
    let want = expected("multi_gpu.pt");
    assert_eq!(
        tensors.len(),
        want["tensors"].as_array().expect("tensors").len()
    );
    let gpus = ptload_device::device_count();
    for (t, w) in tensors
        .iter()
        .zip(want["tensors"].as_array().expect("tensors"))
    {
        let tk: Vec<&str> = t
            .as_object()
            .expect("tensor")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            tk,
            ["name", "target", "device", "fallback", "dtype", "shape"]
        );
        assert_eq!(t["dtype"], w["dtype"]);
        assert_eq!(t["name"], w["name"]);
        assert_eq!(
            t["target"], w["location"],
            "no mapping: torch's None keeps the saved location"
        );
        let ordinal = w["location"]
            .as_str()
            .and_then(|l| l.strip_prefix("cuda:"))
            .and_then(|n| n.parse::<usize>().ok());
        match ordinal {
            Some(n) if n >= gpus => {
                assert_eq!(t["device"], "cpu");
                assert!(t["fallback"].is_string(), "{t}");
            }
            _ => assert!(t["fallback"].is_null(), "{t}"),
        }
    }
    assert!(doc["seconds"].as_f64().is_some());
}

/// `load --hash` reads every tensor back from where it landed and hashes
/// its elements as `inspect --hash` hashes the file's: the same digests,
/// tensor for tensor. `device` is where every tensor with data must be.
fn load_hashes_equal_inspect_hashes(map_location: &str, device: &str) {
    let mut checked = 0;
    for name in [
        "basic.pt",
        "views.pt",
        "bigendian.pt",
        "conj_neg.pt",
        "dtypes.pt",
        "multi_gpu.pt",
        "legacy.pt",
        "quantized.pt",
        "sparse.pt",
        "meta.pt",
    ] {
        let path = fixture(name);
        let out = ptload(&[
            "load",
            "--json",
            "--hash",
            "--map-location",
            map_location,
            &path,
        ]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        let loaded: Json = serde_json::from_str(&stdout(&out)).expect("json");
        let inspected = inspect_json(name, &["--hash"]);
        let want: std::collections::HashMap<&str, &Json> = inspected["tensors"]
            .as_array()
            .expect("tensors")
            .iter()
            .map(|t| (t["name"].as_str().expect("name"), &t["sha256"]))
            .collect();
        for t in loaded["tensors"].as_array().expect("tensors") {
            let tname = t["name"].as_str().expect("name");
            let sha = want
                .get(tname)
                .unwrap_or_else(|| panic!("{name}: {tname} not in inspect"));
            assert_eq!(&t["sha256"], *sha, "{name}: {tname}");
            if t["sha256"].is_string() {
                assert_eq!(t["device"], device, "{name}: {tname}");
                checked += 1;
            } else {
                assert_eq!(t["device"], "meta", "{name}: {tname}");
            }
        }
    }
    assert!(checked > 50, "{checked}");
    // Converted tensors hash as converted: what landed.
    let path = fixture("basic.pt");
    let out = ptload(&[
        "load",
        "--json",
        "--hash",
        "--dtype",
        "bf16",
        "--map-location",
        map_location,
        &path,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let bf16: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let plain = inspect_json("basic.pt", &["--hash"]);
    assert_ne!(bf16["tensors"][0]["sha256"], plain["tensors"][0]["sha256"]);
    // The human form: one line per tensor.
    let out = ptload(&["load", "--hash", "--map-location", map_location, &path]);
    let text = stdout(&out);
    let sha = plain["tensors"][0]["sha256"].as_str().expect("sha");
    assert!(text.contains(&format!("sha256 {sha}")), "{text}");
}

/// An `#[ignore]`d GPU test run where there is none fails, never passes.
fn require_gpu() {
    assert!(
        ptload_device::device_count() > 0,
        "this test needs a CUDA device"
    );
}

#[test]
fn load_hash_reads_back_what_landed_on_the_host() {
    load_hashes_equal_inspect_hashes("cpu", "cpu");
}

#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn load_hash_reads_back_what_landed_on_a_gpu() {
    require_gpu();
    load_hashes_equal_inspect_hashes("cuda:0", "cuda:0");
}

#[test]
fn load_strict_fails_like_torch_without_the_device() {
    let out = ptload(&["load", "--strict", &fixture("multi_gpu.pt")]);
    if ptload_device::device_count() >= 4 {
        // Every device the checkpoint names exists: torch loads it too.
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    } else {
        assert_eq!(out.status.code(), Some(2));
        let err = stderr(&out);
        assert!(
            err.starts_with("ptload: Attempting to deserialize object on"),
            "{err}"
        );
        // The library's advice, in the command's terms.
        assert!(err.contains("--map-location"), "{err}");
        assert!(!err.contains("placement::"), "{err}");
        assert!(stdout(&out).is_empty());
    }
    let mapped = ptload(&[
        "load",
        "--strict",
        "--map-location",
        "cpu",
        &fixture("multi_gpu.pt"),
    ]);
    assert_eq!(mapped.status.code(), Some(0), "{}", stderr(&mapped));
}

#[test]
fn load_converts_only_when_asked() {
    let path = fixture("training.ckpt");
    let out = ptload(&["load", "--map-location", "cpu", "--dtype", "bf16", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("9 floating tensors converted to BF16"),
        "{}",
        stdout(&out)
    );
    let bad = ptload(&["load", "--dtype", "int3", &path]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("expected one of F64, F32, F16, BF16, F8_E4M3, F8_E5M2"));
}

/// A checkpoint whose pickle calls os.system('echo pwned') next to a plain
/// value: the classic payload. Written as torch would lay it out.
fn payload_checkpoint(dir: &Path) -> String {
    use std::io::Write as _;
    let pickle: &[u8] =
        b"\x80\x02}q\x00(X\x04\x00\x00\x00evilq\x01cos\nsystem\nq\x02X\n\x00\x00\x00echo pwnedq\x03\x85q\x04RX\x05\x00\x00\x00epochK\x07u.";
    let path = dir.join("payload.pt");
    let file = std::fs::File::create(&path).expect("create");
    let mut zip = zip::ZipWriter::new(file);
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("payload/data.pkl", stored).expect("entry");
    zip.write_all(pickle).expect("write");
    zip.start_file("payload/byteorder", stored).expect("entry");
    zip.write_all(b"little").expect("write");
    zip.finish().expect("finish");
    path.display().to_string()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ptload-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn scan_flags_payloads_and_passes_clean_checkpoints() {
    let dir = temp_dir("scan");
    let payload = payload_checkpoint(&dir);
    let out = ptload(&["scan", "--json", &payload, &fixture("basic.pt")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let files = doc["files"].as_array().expect("files");
    assert_eq!(files[0]["verdict"], "dangerous");
    let evil = files[0]["globals"]
        .as_array()
        .expect("globals")
        .iter()
        .find(|g| g["global"] == "os.system")
        .expect("os.system");
    assert_eq!(evil["class"], "dangerous: process");
    assert_eq!(evil["use"], "called");
    assert_eq!(evil["pickle"], "payload/data.pkl");
    assert_eq!(evil["reachable"], true);
    assert_eq!(evil["finding"], true);
    assert_eq!(evil["level"], "dangerous");
    assert_eq!(evil["offset"], 17, "the GLOBAL opcode's position");
    assert_eq!(files[0]["fails"], true);
    assert_eq!(files[1]["verdict"], "clean");
    assert_eq!(files[1]["fails"], false);
    assert_eq!(doc["fail_on"], "unknown-call");
    assert_eq!(
        doc["summary"],
        "scanned 2 files: 1 dangerous, 1 clean; 1 at or above unknown-call"
    );
    assert!(stderr(&out).contains("scanned 2 files"), "{}", stderr(&out));
    // --quiet keeps stderr for errors and warnings only.
    let quiet = ptload(&["scan", "-q", "--json", &fixture("basic.pt")]);
    assert_eq!(stderr(&quiet), "");

    for clean in ["basic.pt", "training.ckpt", "torchscript.pt", "legacy.pt"] {
        let out = ptload(&["scan", &fixture(clean)]);
        assert_eq!(out.status.code(), Some(0), "{clean}: {}", stdout(&out));
    }
    // A whole pickled model only constructs and fills its classes: it
    // needs their code (weights_only=True refuses it) but is no payload,
    // so the default line passes it and `--fail-on needs-code` fails it.
    let whole = ptload(&["scan", &fixture("whole_module.pt")]);
    assert_eq!(whole.status.code(), Some(0), "{}", stdout(&whole));
    assert!(
        stdout(&whole).contains("__main__.WholeNet"),
        "{}",
        stdout(&whole)
    );
    assert!(stdout(&whole).contains("NEEDS-CODE"), "{}", stdout(&whole));
    let strict = ptload(&[
        "scan",
        "--fail-on",
        "needs-code",
        &fixture("whole_module.pt"),
    ]);
    assert_eq!(strict.status.code(), Some(1), "{}", stdout(&strict));
    // And the line moves up: a payload passes `--fail-on` above its level
    // only when it is below it.
    let lenient = ptload(&["scan", "--fail-on", "dangerous", &payload]);
    assert_eq!(lenient.status.code(), Some(1));
    let bad = ptload(&["scan", "--fail-on", "bad", &payload]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("needs-code, unknown-call"),
        "{}",
        stderr(&bad)
    );
    let unreadable = ptload(&["scan", &fixture("basic.pt"), &fixture("lfs_pointer.pt")]);
    assert_eq!(unreadable.status.code(), Some(2));
    // A finding wins over an unreadable file: a gate must not read the
    // error as "nothing found".
    let both = ptload(&["scan", &payload, &fixture("lfs_pointer.pt")]);
    assert_eq!(both.status.code(), Some(1));

    // --strict refuses it as torch would; the default loads the plain
    // values and reports the dangerous name; nothing ever runs.
    let strict = ptload(&["inspect", "--strict", &payload]);
    assert_eq!(strict.status.code(), Some(2));
    assert!(stderr(&strict).contains("Unsupported global: GLOBAL os.system"));
    let doc = inspect_json_path(&payload);
    assert_eq!(
        doc["suspicious"],
        serde_json::json!([{"global": "os.system", "level": "dangerous", "use": "called"}])
    );
    assert_eq!(doc["outside_allowlist"], serde_json::json!(["os.system"]));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// `convert` of the payload file keeps the plain value and leaves the
/// command string out of the metadata, saying so; `inspect` still shows
/// it (it describes the file, it does not copy it).
#[test]
fn convert_leaves_call_arguments_out_of_the_metadata() {
    let dir = temp_dir("convert-call-arguments");
    let payload = payload_checkpoint(&dir);
    let output = dir.join("out.safetensors").display().to_string();
    let out = ptload(&["convert", "--json", &payload, &output]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(doc["metadata"], 1);
    assert_eq!(
        doc["metadata_left_out"],
        serde_json::json!([{"name": "evil.0", "call": "os.system"}])
    );
    assert!(
        stderr(&out).contains("evil.0 (an argument of os.system)"),
        "{}",
        stderr(&out)
    );
    let bytes = std::fs::read(&output).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors reads it");
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).expect("header");
    let metadata = header.metadata().clone().expect("metadata");
    assert_eq!(metadata.get("epoch").map(String::as_str), Some("7"));
    assert!(
        !metadata.values().any(|v| v.contains("echo pwned")),
        "{metadata:?}"
    );
    assert_eq!(st.len(), 0);
    let doc = inspect_json_path(&payload);
    assert!(doc.to_string().contains("echo pwned"), "{doc}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

fn inspect_json_path(path: &str) -> Json {
    let out = ptload(&["inspect", "--json", path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("json")
}

#[test]
fn convert_writes_what_safetensors_reads_with_torchs_bytes() {
    let dir = temp_dir("convert");
    for (name, extra) in [
        ("views.pt", vec![]),
        ("bigendian.pt", vec!["--skip-unsupported"]),
        ("dtypes.pt", vec!["--skip-unsupported"]),
        ("legacy.pt", vec![]),
        ("deflated.pt", vec![]),
        ("quantized.pt", vec![]),
    ] {
        let out_path = dir.join(format!("{name}.safetensors"));
        let mut args = vec!["convert", "--key", "all"];
        let (input, output) = (fixture(name), out_path.display().to_string());
        args.push(&input);
        args.push(&output);
        args.extend(extra.iter().copied());
        let out = ptload(&args);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        let bytes = std::fs::read(&out_path).expect("read");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors reads it");
        let want = expected(name);
        let mut written = 0;
        for t in want["tensors"].as_array().expect("tensors") {
            let tname = t["name"].as_str().expect("name");
            let Ok(view) = st.tensor(tname) else {
                assert!(
                    matches!(t["dtype"].as_str(), Some("C32" | "C128")),
                    "{name}: {tname} missing"
                );
                continue;
            };
            written += 1;
            assert_eq!(
                format!("{:?}", view.dtype()),
                t["dtype"].as_str().expect("dtype"),
                "{name}: {tname}"
            );
            assert_eq!(
                Json::from(view.shape().to_vec()),
                t["shape"],
                "{name}: {tname}"
            );
            let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(view.data()));
            assert_eq!(
                digest,
                t["sha256"].as_str().expect("sha"),
                "{name}: {tname}"
            );
        }
        assert_eq!(st.len(), written, "{name}");
    }
    // Unsupported dtypes are refused by name unless skipped; nothing is left behind.
    let refused = dir.join("refused.safetensors");
    let out = ptload(&[
        "convert",
        &fixture("dtypes.pt"),
        &refused.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("c128 (safetensors has no C128 dtype)"),
        "{}",
        stderr(&out)
    );
    assert!(!refused.exists());
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn convert_puts_plain_values_in_the_metadata() {
    let dir = temp_dir("meta");
    let path = dir.join("t.safetensors");
    let input = fixture("training.ckpt");
    let output = path.display().to_string();
    let metadata = |extra: &[&str]| {
        let mut args = vec!["convert", "--force", &input, &output];
        args.extend_from_slice(extra);
        let out = ptload(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let bytes = std::fs::read(&path).expect("read");
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("header");
        meta.metadata().clone().expect("__metadata__")
    };
    // By default the values of the selected state dict: the model of a
    // training checkpoint has none, so only the format marker that
    // Hugging Face loaders look for.
    let meta = metadata(&[]);
    assert_eq!(meta.len(), 1, "{meta:?}");
    assert_eq!(meta["format"], "pt");
    let meta = metadata(&["--metadata", "none"]);
    assert_eq!(meta.len(), 1, "{meta:?}");
    // Everything in the file.
    let meta = metadata(&["--metadata", "all"]);
    assert_eq!(meta["format"], "pt");
    assert_eq!(meta["epoch"], "7");
    assert_eq!(meta["args.name"], "\"run1\"");
    assert_eq!(meta["best_acc"], "0.875");
    // The values under a chosen key, named without it.
    let meta = metadata(&["--key", "all"]);
    assert_eq!(meta["epoch"], "7");
    let meta = metadata(&["--key", "optimizer_state_dict"]);
    assert_eq!(meta["param_groups.0.lr"], "0.001", "{meta:?}");
    assert!(!meta.contains_key("epoch"));
    metadata(&[]);
    let bytes = std::fs::read(&path).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("read");
    let plain: Vec<String> = targets(&inspect_json("plain_model.pt", &[]))
        .into_iter()
        .map(|(n, _, _)| n)
        .collect();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    names.sort();
    let mut want = plain.clone();
    want.sort();
    assert_eq!(
        names, want,
        "the model of the training checkpoint, by default"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn diff_reports_equal_and_different_pairs() {
    let same = ptload(&[
        "diff",
        "--strip-prefix",
        "auto",
        &fixture("plain_model.pt"),
        &fixture("dataparallel.pt"),
    ]);
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));
    let out = ptload(&[
        "diff",
        "--json",
        "--key",
        "auto",
        &fixture("plain_model.pt"),
        &fixture("training.ckpt"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(doc["different"].as_array().expect("different").len(), 9);
    let d = &doc["different"][0];
    assert_eq!(d["what"], "bytes differ");
    // One Adam step with lr 1e-3 moves every weight by about 1e-3.
    let max = d["max_abs_diff"].as_f64().expect("max");
    assert!((0.0009..0.0011).contains(&max), "{max}");
    let names = ptload(&[
        "diff",
        "--json",
        &fixture("basic.pt"),
        &fixture("plain_model.pt"),
    ]);
    assert_eq!(names.status.code(), Some(1));
    let doc: Json = serde_json::from_str(&stdout(&names)).expect("json");
    assert!(!doc["only_in_a"].as_array().expect("a").is_empty());
    assert!(!doc["only_in_b"].as_array().expect("b").is_empty());
    // A tied weight (two names for one view, on both sides) is compared
    // once and counted under both names.
    let tied = ptload(&["diff", &fixture("views.pt"), &fixture("views.pt")]);
    assert_eq!(tied.status.code(), Some(0));
    assert!(
        stdout(&tied).starts_with("equal: 10 equal"),
        "{}",
        stdout(&tied)
    );
}

/// `diff` proves a conversion: a torch file against the safetensors file
/// `convert` wrote (the torch side selected as convert selects it), exact
/// or, after a dtype conversion, within a tolerance; and each side takes
/// its own key.
#[test]
fn diff_checks_a_conversion_and_takes_keys_and_tolerances() {
    let dir = temp_dir("diff-conv");
    let input = fixture("training.ckpt");
    let exact = dir.join("m.safetensors").display().to_string();
    let half = dir.join("b.safetensors").display().to_string();
    for (out, extra) in [(&exact, None), (&half, Some("bf16"))] {
        let mut args = vec!["convert", "--force", &input, out];
        if let Some(d) = extra {
            args.extend(["--dtype", d]);
        }
        let o = ptload(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let same = ptload(&["diff", &input, &exact]);
    assert_eq!(
        same.status.code(),
        Some(0),
        "{}{}",
        stdout(&same),
        stderr(&same)
    );
    assert!(
        stdout(&same).starts_with("equal: 9 equal"),
        "{}",
        stdout(&same)
    );
    // Either order.
    assert_eq!(ptload(&["diff", &exact, &input]).status.code(), Some(0));
    let bf16 = ptload(&["diff", "--json", &input, &half]);
    assert_eq!(bf16.status.code(), Some(1));
    let doc: Json = serde_json::from_str(&stdout(&bf16)).expect("json");
    assert_eq!(doc["different"][0]["what"], "dtype F32 vs BF16");
    // bf16 keeps 8 bits of mantissa: within 1% of each value.
    let close = ptload(&["diff", "--rtol", "0.01", &input, &half]);
    assert_eq!(close.status.code(), Some(0), "{}", stdout(&close));
    let too_tight = ptload(&["diff", "--json", "--rtol", "0.0001", &input, &half]);
    assert_eq!(too_tight.status.code(), Some(1));
    let doc: Json = serde_json::from_str(&stdout(&too_tight)).expect("json");
    assert!(doc["different"][0]["what"]
        .as_str()
        .is_some_and(|w| w.contains("values outside the tolerance")));
    // Per-side keys: the model of a training checkpoint against a plain
    // state dict of another run.
    let keyed = ptload(&[
        "diff",
        "--json",
        "--key-a",
        "model_state_dict",
        &input,
        &fixture("plain_model.pt"),
    ]);
    let doc: Json = serde_json::from_str(&stdout(&keyed)).expect("json");
    assert!(
        doc["only_in_a"].as_array().is_some_and(Vec::is_empty),
        "{doc}"
    );
    assert_eq!(doc["different"].as_array().map(Vec::len), Some(9));
    // One Adam step moves every weight by about 1e-3: within atol 2e-3.
    let near = ptload(&[
        "diff",
        "--key-a",
        "model_state_dict",
        "--atol",
        "0.002",
        &input,
        &fixture("plain_model.pt"),
    ]);
    assert_eq!(near.status.code(), Some(0), "{}", stdout(&near));
    let bad = ptload(&["diff", "--atol", "-1", &input, &exact]);
    assert_eq!(bad.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// docs/cli.md ends with every command's `--help` as the binary prints it:
/// the command tree walked from `ptload --help` down, each command's
/// subcommands as its help lists them, so a new command cannot be missed.
#[test]
fn help_texts_in_the_docs_are_the_binarys() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join("docs/cli.md");
    let doc = std::fs::read_to_string(&path).expect("docs/cli.md");
    let (begin, end) = ("<!-- help:begin -->\n", "<!-- help:end -->");
    let start = doc.find(begin).expect("help:begin marker") + begin.len();
    let stop = doc.find(end).expect("help:end marker");
    let mut want = String::new();
    let mut seen = Vec::new();
    // Depth first, in the order each help lists its commands.
    let mut stack: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(command) = stack.pop() {
        let mut args: Vec<&str> = command.iter().map(String::as_str).collect();
        args.push("--help");
        let out = ptload(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = stdout(&out);
        want.push_str(&format!(
            "### `ptload {}--help`\n\n```text\n{help}```\n\n",
            command.iter().map(|c| format!("{c} ")).collect::<String>(),
        ));
        let children: Vec<Vec<String>> = subcommands(&help)
            .into_iter()
            .map(|name| {
                let mut child = command.clone();
                child.push(name);
                child
            })
            .collect();
        stack.extend(children.into_iter().rev());
        seen.push(command.join(" "));
    }
    for command in ["inspect", "load", "convert", "scan", "diff", "plan"] {
        assert!(seen.iter().any(|c| c == command), "{command}: {seen:?}");
    }
    if std::env::var_os("PTLOAD_UPDATE_DOCS").is_some() {
        let updated = format!("{}{want}{}", &doc[..start], &doc[stop..]);
        std::fs::write(&path, updated).expect("write docs/cli.md");
        return;
    }
    assert!(
        doc[start..stop] == want,
        "docs/cli.md's help texts differ from the binary's; rerun with PTLOAD_UPDATE_DOCS=1"
    );
}

/// The subcommands a `--help` text lists under `Commands:` (clap's
/// layout: two spaces, the name, its description), `help` left out.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Whole outputs against golden files in crates/ptload-cli/tests/golden/. Set
/// PTLOAD_UPDATE_GOLDEN=1 to rewrite them after a deliberate change, then
/// review the diff. Commands run from the repository root with relative
/// paths, so no machine-specific path appears.
#[test]
fn outputs_match_golden_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let update = std::env::var_os("PTLOAD_UPDATE_GOLDEN").is_some();
    let cases: &[(&str, &[&str])] = &[
        ("inspect_basic.txt", &["inspect", "fixtures/files/basic.pt"]),
        (
            "inspect_views.json",
            &["inspect", "--json", "--hash", "fixtures/files/views.pt"],
        ),
        (
            "inspect_multi_gpu_mapped.txt",
            &[
                "inspect",
                "fixtures/files/multi_gpu.pt",
                "--map-location",
                "cuda:1=cuda:0,cuda:3=cpu",
            ],
        ),
        (
            "scan_training.txt",
            &["scan", "fixtures/files/training.ckpt"],
        ),
        (
            "scan_whole_module.json",
            &["scan", "--json", "fixtures/files/whole_module.pt"],
        ),
        (
            "diff_plain_training.txt",
            &[
                "diff",
                "--key",
                "auto",
                "fixtures/files/plain_model.pt",
                "fixtures/files/training.ckpt",
            ],
        ),
        // What people see: values, decisions, errors (stderr after
        // `--- stderr`).
        (
            "inspect_training.txt",
            &["inspect", "fixtures/files/training.ckpt"],
        ),
        (
            "inspect_rng_auto.txt",
            &[
                "inspect",
                "--key",
                "auto",
                "fixtures/files/training_rng.ckpt",
            ],
        ),
        (
            "inspect_hf_auto.txt",
            &["inspect", "--key", "auto", "fixtures/files/hf_lm.pt"],
        ),
        (
            "strict_whole_module.txt",
            &["inspect", "--strict", "fixtures/files/whole_module.pt"],
        ),
        (
            "download_html.txt",
            &["inspect", "fixtures/files/download.html.pt"],
        ),
        (
            "budget_bare_number.txt",
            &["inspect", "fixtures/files/multi_gpu.pt", "--budget", "2"],
        ),
        ("bare.txt", &[]),
        (
            "inspect_dcp_world4.txt",
            &["inspect", "fixtures/files/dcp/world4"],
        ),
        (
            "inspect_lightning_loops.txt",
            &["inspect", "fixtures/files/lightning_loops.ckpt"],
        ),
        (
            "inspect_model_ema_auto.txt",
            &["inspect", "--key", "auto", "fixtures/files/model_ema.pth"],
        ),
        (
            "inspect_dino_auto.txt",
            &["inspect", "--key", "auto", "fixtures/files/dino.pth"],
        ),
        (
            "inspect_stream.txt",
            &["inspect", "fixtures/files/stream.pt"],
        ),
        (
            "inspect_safetensors.txt",
            &["inspect", "fixtures/files/weights.safetensors.pt"],
        ),
    ];
    let mut stale = Vec::new();
    for (golden, args) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_ptload"))
            .args(*args)
            .current_dir(&root)
            .env_remove("COLUMNS")
            .output()
            .expect("run");
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.stderr.is_empty() {
            text.push_str("--- stderr\n");
            text.push_str(&String::from_utf8_lossy(&out.stderr));
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(golden);
        if update {
            std::fs::write(&path, &text).expect("write golden");
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (run with PTLOAD_UPDATE_GOLDEN=1)", path.display())
        });
        if text != want {
            stale.push(format!("{golden}:\n--- want\n{want}\n--- got\n{text}"));
        }
    }
    assert!(
        stale.is_empty(),
        "outputs differ from crates/ptload-cli/tests/golden:\n{}",
        stale.join("\n")
    );
}

#[test]
fn quantized_tensors_keep_their_scales() {
    // inspect --json and convert carry what torch.load gives for each
    // quantized tensor: its kind, scheme, scale and zero point (or axis,
    // with the per-channel scales as tensors of their own).
    let want = expected("quantized.pt");
    let doc = inspect_json("quantized.pt", &[]);
    for (got, w) in doc["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .zip(want["tensors"].as_array().expect("tensors"))
    {
        let Some(q) = w.get("quantization") else {
            assert!(got.get("quantization").is_none(), "{got}");
            continue;
        };
        let q = q.as_object().expect("object");
        for (key, value) in q {
            assert_eq!(&got["quantization"][key], value, "{}: {key}", w["name"]);
        }
    }
    let dir = temp_dir("quantized");
    let path = dir.join("q.safetensors");
    let out = ptload(&[
        "convert",
        &fixture("quantized.pt"),
        &path.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let bytes = std::fs::read(&path).expect("read");
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("header");
    let meta = meta.metadata().clone().expect("__metadata__");
    let per_tensor: Json = serde_json::from_str(&meta["per_tensor_qint8.quantization"]).unwrap();
    assert_eq!(
        per_tensor,
        serde_json::json!({"kind": "qint8", "scheme": "per_tensor_affine", "scale": 0.1, "zero_point": -3})
    );
    let per_channel: Json = serde_json::from_str(&meta["per_channel_qint8.quantization"]).unwrap();
    assert_eq!(per_channel["axis"], 0);
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("read");
    let scales = st
        .tensor(per_channel["scales"].as_str().unwrap())
        .expect("scales");
    let scales: Vec<f64> = scales
        .data()
        .chunks(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(scales, [0.02, 0.05, 0.1]);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn sharded_sets_and_rank_slices_from_the_command_line() {
    let dir = fixture("llama_tiny_sharded");
    // inspect: each tensor names its file; under --shard, its slice, the
    // slice's shape and hash; bytes_read counts the slices only.
    let out = ptload(&[
        "inspect",
        "--json",
        "--hash",
        "--shard",
        "1/3",
        "--split-preset",
        "llama",
        &dir,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(doc["files"].as_array().expect("files").len(), 3);
    let tensors = doc["tensors"].as_array().expect("tensors");
    let mut sum = 0;
    for t in tensors {
        assert!(t["file"]
            .as_str()
            .expect("file")
            .starts_with("pytorch_model-"));
        sum += t["nbytes"].as_u64().expect("nbytes");
        let name = t["name"].as_str().expect("name");
        if name.contains("norm") {
            assert!(t.get("slice").is_none(), "{name}");
        } else {
            let dim = t["slice"]["dim"].as_u64().expect("dim") as usize;
            assert_eq!(t["shape"][dim], t["slice"]["len"], "{name}");
        }
    }
    assert_eq!(doc["bytes_read"].as_u64(), Some(sum));
    let whole = inspect_json("llama_tiny.pt", &[]);
    assert!(sum < whole["totals"]["bytes"].as_u64().expect("bytes"));
    // --shard env reads torchrun's variables.
    let env_out = Command::new(env!("CARGO_BIN_EXE_ptload"))
        .args([
            "inspect",
            "--json",
            "--hash",
            "--shard",
            "env",
            "--split-preset",
            "llama",
            &dir,
        ])
        .env("RANK", "1")
        .env("WORLD_SIZE", "3")
        .output()
        .expect("run");
    assert_eq!(stdout(&env_out), stdout(&out));
    // convert: the whole set to one safetensors file, equal to the
    // unsharded checkpoint.
    let tmp = std::env::temp_dir().join(format!("ptload-set-{}.safetensors", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let out = ptload(&["convert", &dir, tmp.to_str().expect("path")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = ptload(&[
        "diff",
        &fixture("llama_tiny.pt"),
        tmp.to_str().expect("path"),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let _ = std::fs::remove_file(&tmp);
    // convert --max-shard-size: a sharded safetensors set with its index,
    // equal to the checkpoint; an existing set is left alone without --force.
    let outdir = std::env::temp_dir().join(format!("ptload-shards-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outdir);
    let o = outdir.to_str().expect("path");
    let out = ptload(&["convert", "--json", &dir, o, "--max-shard-size", "25KB"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let shards = report["files"].as_array().expect("files");
    assert_eq!(shards.len(), 3);
    let index: Json = serde_json::from_str(
        &std::fs::read_to_string(outdir.join("model.safetensors.index.json")).expect("index"),
    )
    .expect("index json");
    let mut total = 0;
    for shard in shards {
        let path = shard["file"].as_str().expect("file");
        let bytes = std::fs::read(path).expect("shard");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let name = Path::new(path)
            .file_name()
            .expect("name")
            .to_str()
            .expect("utf-8");
        for (tensor, view) in st.tensors() {
            assert_eq!(index["weight_map"][&tensor], name, "{tensor}");
            total += view.data().len() as u64;
            assert!(
                bytes.len() <= 25_000 + 4096,
                "{name} is {} bytes",
                bytes.len()
            );
        }
    }
    assert_eq!(index["metadata"]["total_size"].as_u64(), Some(total));
    let before = std::fs::read(outdir.join("model-00002-of-00003.safetensors")).expect("shard");
    let out = ptload(&[
        "convert",
        &dir,
        o,
        "--max-shard-size",
        "25KB",
        "--dtype",
        "F32",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(outdir.join("model-00002-of-00003.safetensors")).expect("shard"),
        before
    );
    let leftovers = std::fs::read_dir(&outdir)
        .expect("dir")
        .filter(|e| {
            e.as_ref()
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .contains("partial")
        })
        .count();
    assert_eq!(leftovers, 0);
    let _ = std::fs::remove_dir_all(&outdir);
    // diff: the set against the file it was sharded from.
    let out = ptload(&["diff", &fixture("llama_tiny.pt"), &dir]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // plan: one entry per rank, each reading less than the whole.
    let out = ptload(&["plan", "--world", "4", "--split-preset", "llama", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let plan: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let ranks = plan["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 4);
    for r in ranks {
        assert!(r["bytes"].as_u64() < plan["total_bytes"].as_u64());
    }
    // scan: a directory is each checkpoint in it.
    let out = ptload(&["scan", "--json", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let scanned: Json = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(scanned["files"].as_array().expect("files").len(), 3);
    // Rules without a rank, and a rank without rules, are refused.
    let out = ptload(&["inspect", "--split", "*=0", &dir]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--shard"), "{}", stderr(&out));
    let out = ptload(&["inspect", "--shard", "0/2", &dir]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn rank_files_merge_and_reslice_from_the_command_line() {
    let ranks = fixture("llama_tiny_consolidated");
    let tmp = std::env::temp_dir().join(format!("ptload-ranks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("tmp");
    let path = |n: &str| tmp.join(n).to_str().expect("path").to_owned();
    let rules = [
        "--split",
        "model.embed_tokens.weight=1",
        "--split-preset",
        "llama",
    ];
    // Merged: the unsharded file.
    let merged = path("merged.safetensors");
    let mut args = vec!["convert", "--merge-ranks", &ranks, &merged];
    args.extend(rules);
    let out = ptload(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = ptload(&["diff", &fixture("llama_tiny.pt"), &merged]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // Cut again for rank 2 of 3: what --shard 2/3 takes from the whole file.
    let resliced = path("resliced.safetensors");
    let direct = path("direct.safetensors");
    let mut args = vec![
        "convert",
        "--merge-ranks",
        &ranks,
        &resliced,
        "--shard",
        "2/3",
    ];
    args.extend(rules);
    assert_eq!(ptload(&args).status.code(), Some(0));
    let whole = fixture("llama_tiny.pt");
    let mut args = vec!["convert", &whole, &direct, "--shard", "2/3"];
    args.extend(rules);
    let out = ptload(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = ptload(&["diff", &direct, &resliced]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // Without the rules, nothing is guessed.
    let out = ptload(&["convert", "--merge-ranks", &ranks, &path("x.safetensors")]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A rank's slices of a sharded set, loaded onto a GPU (or the host) and
/// read back, hash as `inspect --shard` hashes them from the file.
fn sliced_load_hashes_equal_inspect(map_location: &str, device: &str) {
    let dir = fixture("llama_tiny_sharded");
    let shard = ["--shard", "2/3", "--split-preset", "llama"];
    let mut args = vec!["inspect", "--json", "--hash", &dir];
    args.extend(shard);
    let out = ptload(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let inspected: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let want: std::collections::HashMap<String, Json> = inspected["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().expect("name").to_owned(),
                t["sha256"].clone(),
            )
        })
        .collect();
    let mut args = vec![
        "load",
        "--json",
        "--hash",
        "--map-location",
        map_location,
        &dir,
    ];
    args.extend(shard);
    let out = ptload(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut seen = 0;
    let mut read = 0;
    for line in stdout(&out).lines() {
        let doc: Json = serde_json::from_str(line).expect("json");
        read += doc["bytes_read"].as_u64().expect("bytes_read");
        for t in doc["tensors"].as_array().expect("tensors") {
            let name = t["name"].as_str().expect("name");
            assert_eq!(t["device"], device, "{name}: {}", t["fallback"]);
            assert_eq!(t["sha256"], want[name], "{name}");
            seen += 1;
        }
    }
    assert_eq!(seen, want.len());
    assert_eq!(Some(read), inspected["bytes_read"].as_u64());
}

#[test]
fn sliced_load_on_the_host_reads_the_rank_share() {
    sliced_load_hashes_equal_inspect("cpu", "cpu");
}

#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda)"]
fn sliced_load_onto_a_gpu_reads_back_the_rank_share() {
    require_gpu();
    sliced_load_hashes_equal_inspect("cuda:0", "cuda:0");
}

#[test]
fn piped_inspect_keeps_whole_names() {
    // On a terminal the NAME column fits its width and long names lose
    // their middle; a program reading the output gets every name whole.
    let path = fixture("lightning.ckpt");
    let out = ptload(&["inspect", path.as_str(), "--key", "all"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            "callbacks.ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}.best_model_score"
        ),
        "{text}"
    );
    assert!(!text.contains('…'), "{text}");
}

#[test]
fn diff_compares_the_models_as_convert_and_load_take_them() {
    // The same weights as a plain state dict and under DataParallel: diff
    // strips `module.` as convert would, says so, and finds them equal;
    // asked for the files as saved, every name is on one side only.
    let (plain, dp) = (fixture("plain_model.pt"), fixture("dataparallel.pt"));
    let out = ptload(&["diff", &plain, &dp]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("9 equal, 0 different"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("removed \"module.\""),
        "{}",
        stderr(&out)
    );
    let raw = ptload(&[
        "diff",
        &plain,
        &dp,
        "--key",
        "all",
        "--strip-prefix",
        "none",
    ]);
    assert_eq!(raw.status.code(), Some(1));
    assert!(
        stdout(&raw).contains("9 only in A, 9 only in B"),
        "{}",
        stdout(&raw)
    );
    let quiet = ptload(&["--quiet", "diff", &plain, &dp]);
    assert!(stderr(&quiet).is_empty(), "{}", stderr(&quiet));
}

#[test]
fn a_budget_without_gpus_and_a_dtype_conversion_say_what_they_did() {
    // --budget on a machine without a GPU says why everything stays on the
    // host (with one, real or simulated, it plans onto cuda:0 and says
    // nothing); load --dtype --json reports each tensor's dtype and what it
    // was.
    let basic = fixture("basic.pt");
    let out = ptload(&["inspect", &basic, "--budget", "0.9"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stderr(&out).contains("--budget 0.9: every storage it places stays on the host");
    if ptload_device::device_count() == 0 {
        assert!(said, "{}", stderr(&out));
    } else {
        assert!(!said, "{}", stderr(&out));
        assert_eq!(
            stdout(&out).matches("cuda:0").count(),
            4,
            "{}",
            stdout(&out)
        );
    }
    let out = ptload(&["load", &basic, "--dtype", "bf16", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    for t in doc["tensors"].as_array().expect("tensors") {
        assert_eq!(t["dtype"], "BF16", "{t}");
        assert_eq!(t["converted_from"], "F32", "{t}");
    }
}

/// `torch.tensor_split(t, world, 0)[rank]` of a row-major tensor.
fn split_rows(whole: &[u8], shape: &[u64], elem: usize, rank: u32, world: u32) -> Vec<u8> {
    let shard = ptload_reader::tp::Shard::new(rank, world).expect("shard");
    let (start, len) = shard.part(shape[0]);
    let row: u64 = shape[1..].iter().product::<u64>() * elem as u64;
    whole[(start * row) as usize..((start + len) * row) as usize].to_vec()
}

fn sha_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[test]
fn dcp_directories_from_the_command_line() {
    let doc: Json = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("dcp.json")).expect("dcp.json"),
    )
    .expect("json");
    for save in [
        "world1",
        "world2",
        "world4",
        "world2_threads",
        "world2_safetensors",
        "world2_zstd",
        "world2_rank_metadata",
        "fsdp2_adamw",
    ] {
        let dir = fixture(&format!("dcp/{save}"));
        let want = doc["saves"][save]["tensors"].as_object().expect("tensors");
        // inspect: torch's dtypes, shapes and hashes.
        let out = ptload(&["inspect", "--json", "--hash", &dir]);
        assert!(out.status.success(), "{}", stderr(&out));
        let got: Json = serde_json::from_str(&stdout(&out)).expect("json");
        assert_eq!(got["format"], "dcp");
        let tensors = got["tensors"].as_array().expect("tensors");
        assert_eq!(tensors.len(), want.len(), "{save}");
        for t in tensors {
            let w = &want[t["name"].as_str().expect("name")];
            assert_eq!(t["dtype"], w["dtype"], "{save} {t}");
            assert_eq!(t["shape"], w["shape"], "{save} {t}");
            assert_eq!(t["sha256"], w["sha256"], "{save} {t}");
        }
        // convert: a safetensors file the safetensors library reads as torch's.
        let out_path = std::env::temp_dir().join(format!(
            "ptload-dcp-{save}-{}.safetensors",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&out_path);
        let out = ptload(&["convert", &dir, out_path.to_str().expect("path")]);
        assert!(out.status.success(), "{}", stderr(&out));
        if save == "fsdp2_adamw" {
            // --key auto takes the model out of the training state, its
            // `model.` prefix left off.
            let bytes = std::fs::read(&out_path).expect("written");
            let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors reads it");
            let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
            names.sort();
            assert_eq!(names, ["0.bias", "0.weight", "2.bias", "2.weight"]);
            for name in &names {
                let w = &want[&format!("model.{name}")];
                assert_eq!(
                    sha_hex(st.tensor(name).expect("tensor").data()),
                    w["sha256"].as_str().expect("sha")
                );
            }
            let _ = std::fs::remove_file(&out_path);
            let out = ptload(&[
                "convert",
                "--key",
                "all",
                &dir,
                out_path.to_str().expect("path"),
            ]);
            assert!(out.status.success(), "{}", stderr(&out));
        }
        let bytes = std::fs::read(&out_path).expect("written");
        let _ = std::fs::remove_file(&out_path);
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors reads it");
        assert_eq!(st.len(), want.len());
        for (name, w) in want {
            let t = st.tensor(name).expect("tensor");
            let shape: Vec<Json> = t.shape().iter().map(|&d| Json::from(d)).collect();
            assert_eq!(Json::from(shape), w["shape"], "{save} {name}");
            assert_eq!(
                sha_hex(t.data()),
                w["sha256"].as_str().expect("sha"),
                "{save} {name}"
            );
        }
        let dcp = ptload_reader::dcp::Dcp::open(&dir).expect("open");
        // convert --shard: the rank's rows, read from the chunks they overlap.
        let out = ptload(&[
            "convert",
            "--key",
            "all",
            &dir,
            out_path.to_str().expect("path"),
            "--shard",
            "2/3",
            "--split",
            "norm.scale=replicate",
            "--split",
            "*.step=replicate",
            "--split",
            "*=0",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let bytes = std::fs::read(&out_path).expect("written");
        let _ = std::fs::remove_file(&out_path);
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors reads it");
        for name in want.keys() {
            let d = dcp.tensor(name).expect("tensor");
            let whole = dcp.read_tensor(name).expect("whole");
            let part = if d.shape().is_empty() {
                whole
            } else {
                split_rows(&whole, d.shape(), d.dtype().size(), 2, 3)
            };
            assert_eq!(
                st.tensor(name).expect("tensor").data(),
                part,
                "{save} {name}"
            );
        }
        // convert --dtype: tensor by tensor from the chunks, or (with
        // --max-shard-size) from the set put together, the same bytes.
        let shards =
            std::env::temp_dir().join(format!("ptload-dcp-shards-{save}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&shards);
        let a = ptload(&[
            "convert",
            &dir,
            out_path.to_str().expect("path"),
            "--dtype",
            "F32",
        ]);
        assert!(a.status.success(), "{}", stderr(&a));
        let b = ptload(&[
            "convert",
            &dir,
            shards.to_str().expect("path"),
            "--dtype",
            "F32",
            "--max-shard-size",
            "1GB",
        ]);
        assert!(b.status.success(), "{}", stderr(&b));
        let one = std::fs::read(&out_path).expect("written");
        let _ = std::fs::remove_file(&out_path);
        let shard_file = std::fs::read_dir(&shards)
            .expect("shards")
            .map(|e| e.expect("entry").path())
            .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .expect("a shard");
        let other = std::fs::read(&shard_file).expect("shard");
        let _ = std::fs::remove_dir_all(&shards);
        let (x, y) = (
            safetensors::SafeTensors::deserialize(&one).expect("one"),
            safetensors::SafeTensors::deserialize(&other).expect("other"),
        );
        assert_eq!(x.len(), y.len());
        for (name, t) in x.tensors() {
            let u = y.tensor(&name).expect("same names");
            assert_eq!(
                (t.dtype(), t.shape(), t.data()),
                (u.dtype(), u.shape(), u.data()),
                "{save} {name}"
            );
        }
        // load --shard: each rank's rows, as tensor_split cuts the whole.
        for (rank, world) in [(0, 3), (2, 3), (1, 2)] {
            let spec = format!("{rank}/{world}");
            let out = ptload(&[
                "load",
                "--key",
                "all",
                &dir,
                "--shard",
                &spec,
                "--split",
                "norm.scale=replicate",
                "--split",
                "*.step=replicate",
                "--split",
                "*=0",
                "--hash",
                "--json",
            ]);
            assert!(out.status.success(), "{}", stderr(&out));
            let got: Json = serde_json::from_str(&stdout(&out)).expect("json");
            let loaded = got["tensors"].as_array().expect("tensors");
            assert_eq!(loaded.len(), want.len());
            for t in loaded {
                let name = t["name"].as_str().expect("name");
                let d = dcp.tensor(name).expect("tensor");
                let whole = dcp.read_tensor(name).expect("whole");
                let part = if d.shape().is_empty() {
                    whole
                } else {
                    split_rows(&whole, d.shape(), d.dtype().size(), rank, world)
                };
                assert_eq!(
                    t["sha256"],
                    Json::from(sha_hex(&part)),
                    "{save} {spec} {name}"
                );
            }
        }
    }
}

/// SARIF 2.1.0 for CI gates: one result per finding, each with the file,
/// the record and the byte offset (in the file for a stored record).
#[test]
fn scan_writes_sarif_with_one_result_per_finding() {
    let scan = |name: &str| shared_data("scan").join(name).display().to_string();
    let files = [
        scan("bare_protocol_2.pkl"),
        scan("zip_bad_crc.pt"),
        scan("benign_full_sequential.pt"),
        fixture("basic.pt"),
    ];
    let mut args = vec!["scan", "--format", "sarif"];
    args.extend(files.iter().map(String::as_str));
    let out = ptload(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("sarif");
    assert_eq!(doc["version"], "2.1.0");
    let run = &doc["runs"][0];
    assert_eq!(run["tool"]["driver"]["name"], "ptload");
    let results = run["results"].as_array().expect("results");
    let of = |file: &str, rule: &str| -> Vec<&Json> {
        results
            .iter()
            .filter(|r| {
                r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == file
                    && r["ruleId"] == rule
            })
            .collect()
    };
    // The bare pickle: os.system at byte 2 of the file.
    let bare = of(&files[0], "dangerous");
    assert_eq!(bare.len(), 1, "{results:?}");
    assert_eq!(bare[0]["level"], "error");
    assert_eq!(bare[0]["properties"]["global"], "os.system");
    let region = &bare[0]["locations"][0]["physicalLocation"]["region"];
    assert_eq!(region["byteOffset"], 2);
    // The zip: the payload in its stored record (file offset = the
    // record's start + the opcode's offset), and the bad CRC.
    let payload = of(&files[1], "dangerous");
    assert_eq!(payload.len(), 1, "{results:?}");
    assert_eq!(payload[0]["properties"]["record"], "archive/data.pkl");
    let record_offset = payload[0]["properties"]["recordOffset"]
        .as_u64()
        .expect("offset");
    let file_offset = payload[0]["locations"][0]["physicalLocation"]["region"]["byteOffset"]
        .as_u64()
        .expect("file offset");
    assert!(file_offset > record_offset, "{file_offset} {record_offset}");
    let bytes = std::fs::read(&files[1]).expect("read");
    assert_eq!(
        bytes[usize::try_from(file_offset).expect("offset")],
        b'c',
        "a GLOBAL opcode"
    );
    assert_eq!(of(&files[1], "ambiguous").len(), 1, "{results:?}");
    // A full model: notes, not errors; a clean file: nothing.
    let model = of(&files[2], "needs-code");
    assert!(!model.is_empty());
    assert!(model.iter().all(|r| r["level"] == "note"));
    assert!(results.iter().all(
        |r| r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] != files[3].as_str()
    ));
    assert!(
        stderr(&out).contains("scanned 4 files: 2 dangerous, 1 needs-code, 1 clean"),
        "{}",
        stderr(&out)
    );
}

/// A directory is walked recursively; archives torch cannot load are
/// named, not skipped; files that are no checkpoint are left out.
#[test]
fn scan_walks_directories_and_names_archives_torch_cannot_load() {
    let dir = temp_dir("scan-walk");
    let nested = dir.join("a/b");
    std::fs::create_dir_all(&nested).expect("dirs");
    std::fs::copy(fixture("basic.pt"), nested.join("model.pt")).expect("copy");
    let payload = payload_checkpoint(&dir);
    std::fs::write(nested.join("weights.7z"), b"7z\xbc\xaf\x27\x1c\x00\x04rest").expect("7z");
    std::fs::write(dir.join("a/run.tar.gz"), b"\x1f\x8b\x08\x00rest").expect("gz");
    std::fs::write(dir.join("a/README.md"), b"# not a model").expect("readme");
    // A safetensors file holds no pickle; a pickle named .safetensors is
    // scanned as what it is.
    std::fs::copy(
        fixture("weights.safetensors.pt"),
        nested.join("model.safetensors"),
    )
    .expect("st");
    std::fs::write(
        dir.join("a/fake.safetensors"),
        b"\x80\x02cos\nsystem\nq\x00.",
    )
    .expect("fake");
    // A safetensors header that is hostile (two tensors over one range):
    // unreadable, never clean.
    let header = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut bad = (header.len() as u64).to_le_bytes().to_vec();
    bad.extend_from_slice(header);
    bad.extend_from_slice(&[0u8; 8]);
    std::fs::write(dir.join("a/bad.safetensors"), bad).expect("bad");
    // A link to a checkpoint is followed (a Hugging Face cache is links
    // into its blobs); a link to a directory is not.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&payload, dir.join("a/linked.bin")).expect("link");
        std::os::unix::fs::symlink(&dir, nested.join("loop")).expect("dir link");
    }
    // No extension, but pickle bytes: scanned.
    std::fs::write(dir.join("a/blob"), b"\x80\x02cos\nsystem\nq\x00.").expect("blob");
    let out = ptload(&["scan", "--json", &dir.display().to_string()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    #[cfg(unix)]
    assert!(
        stderr(&out).contains("loop: a link to a directory, not followed"),
        "{}",
        stderr(&out)
    );
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let verdicts: Vec<(String, String)> = doc["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            let file = f["file"].as_str().expect("file");
            let rel = Path::new(file).strip_prefix(&dir).expect("under dir");
            (
                rel.display().to_string(),
                f["verdict"].as_str().expect("verdict").to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("a/b/model.pt", "clean"),
        ("a/b/model.safetensors", "clean"),
        ("a/bad.safetensors", "unreadable"),
        ("a/b/weights.7z", "not-loadable"),
        ("a/blob", "dangerous"),
        ("a/fake.safetensors", "dangerous"),
        ("a/linked.bin", "dangerous"),
        ("a/run.tar.gz", "not-loadable"),
        (
            Path::new(&payload)
                .strip_prefix(&dir)
                .expect("payload")
                .to_str()
                .expect("utf8"),
            "dangerous",
        ),
    ]
    .iter()
    .map(|(f, v)| ((*f).to_owned(), (*v).to_owned()))
    .collect();
    let mut want = want;
    want.sort();
    assert_eq!(verdicts, want);
    assert!(
        doc["summary"]
            .as_str()
            .expect("summary")
            .contains("4 dangerous, 2 clean, 1 unreadable, 2 not-loadable"),
        "{}",
        doc["summary"]
    );
    // Text output names them too, with the summary last.
    let text = ptload(&["scan", &dir.display().to_string()]);
    let shown = stdout(&text);
    assert!(
        shown.contains("weights.7z: NOT-LOADABLE: a 7z archive"),
        "{shown}"
    );
    assert!(
        shown
            .lines()
            .last()
            .expect("summary")
            .starts_with("scanned 9 files"),
        "{shown}"
    );
    // Archives alone do not fail a gate.
    let archives = ptload(&["scan", &dir.join("a/run.tar.gz").display().to_string()]);
    assert_eq!(archives.status.code(), Some(0), "{}", stdout(&archives));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inspect_makes_dangerous_globals_stand_out() {
    // A file naming os.system: inspect reads it (nothing runs) and says, in
    // scan's words, which global is dangerous and that scan is the gate.
    let path = shared_data("hostile")
        .join("x_os_system.pt")
        .display()
        .to_string();
    let out = ptload(&["inspect", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("DANGEROUS globals"), "{text}");
    assert!(
        text.contains("os.system (process, called)") && text.contains("ptload scan"),
        "{text}"
    );
    // An unknown call is named with its level; a TorchScript archive, which
    // scan calls clean, has no finding (its classes are only outside the
    // allowlist, which --strict refuses).
    let script = inspect_json("torchscript.pt", &[]);
    assert_eq!(script["suspicious"], serde_json::json!([]));
    assert!(
        !script["outside_allowlist"]
            .as_array()
            .expect("outside_allowlist")
            .is_empty(),
        "{script}"
    );
    // A model package's class given a path: an unknown call. A library's
    // callable the scanner has no entry for is dangerous, with what it is.
    let call = shared_data("scan")
        .join("en_class_given_path.pt")
        .display()
        .to_string();
    let out = ptload(&["inspect", &call]);
    assert!(
        stdout(&out).contains(
            "scan would also report (read, never run): \
             ptload_enum_model.runner.Runner (unknown-call, called)"
        ),
        "{}",
        stdout(&out)
    );
    let call = shared_data("scan")
        .join("z_flag_0x0008_payload.pt")
        .display()
        .to_string();
    let out = ptload(&["inspect", &call]);
    assert!(
        stdout(&out).contains("builtins.print (uncatalogued library call, called)"),
        "{}",
        stdout(&out)
    );
    let out = ptload(&["inspect", "--json", &path]);
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let dangerous = doc["dangerous"].as_array().expect("dangerous");
    assert!(
        dangerous
            .iter()
            .any(|g| g.as_str().is_some_and(|g| g.ends_with("system (process)"))),
        "{doc}"
    );
    let plain = inspect_json("basic.pt", &[]);
    assert_eq!(plain["dangerous"], serde_json::json!([]));
}

/// A DCP directory (and FSDP rank files) diff equal to what convert wrote
/// from them: one safetensors file, or a sharded set's directory.
#[test]
fn distributed_checkpoints_diff_equal_to_their_conversions() {
    let tmp = std::env::temp_dir().join(format!("ptload-dcp-diff-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("tmp");
    for input in [
        "dcp/world4",
        "dcp/world2_safetensors",
        "fsdp/world4",
        "fsdp/local2",
    ] {
        let dir = fixture(input);
        let tag = input.replace('/', "-");
        let one = tmp.join(format!("{tag}.safetensors"));
        let sharded = tmp.join(format!("{tag}-shards"));
        for (out, extra) in [(&one, None), (&sharded, Some("200B"))] {
            let mut args = vec!["convert", "--key", "all", &dir, out.to_str().expect("path")];
            if let Some(size) = extra {
                args.extend(["--max-shard-size", size]);
            }
            let made = ptload(&args);
            assert!(made.status.success(), "{input}: {}", stderr(&made));
            let diff = ptload(&["diff", "--key", "all", &dir, out.to_str().expect("path")]);
            assert_eq!(diff.status.code(), Some(0), "{input}: {}", stdout(&diff));
            assert!(stdout(&diff).contains(" 0 different, 0 only in A, 0 only in B"));
        }
        let files = std::fs::read_dir(&sharded).expect("shards").count();
        assert!(files > 2, "{input}: a set of several files and its index");
        // A tensor changed in the conversion is found.
        let mut bytes = std::fs::read(&one).expect("written");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&one, &bytes).expect("write");
        let diff = ptload(&["diff", "--key", "all", &dir, one.to_str().expect("path")]);
        assert_eq!(diff.status.code(), Some(1), "{input}: {}", stdout(&diff));
    }
    // FSDP rank files from the command line: torch's whole tensors.
    let doc: Json = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("fsdp.json")).expect("fsdp.json"),
    )
    .expect("json");
    for set in ["world2", "world4", "local2"] {
        let out = ptload(&[
            "inspect",
            "--json",
            "--hash",
            &fixture(&format!("fsdp/{set}")),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let got: Json = serde_json::from_str(&stdout(&out)).expect("json");
        assert_eq!(got["format"], "ranks");
        let want = doc["sets"][set]["tensors"].as_object().expect("tensors");
        let tensors = got["tensors"].as_array().expect("tensors");
        assert_eq!(tensors.len(), want.len());
        for t in tensors {
            let w = &want[t["name"].as_str().expect("name")];
            assert_eq!(
                (&t["shape"], &t["sha256"]),
                (&w["shape"], &w["sha256"]),
                "{set}"
            );
        }
    }
    let out = ptload(&["inspect", &fixture("fsdp/replicate_mismatch2")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("rank 0 and rank 1 hold different values"));
    // Even with --force, no output overwrites a file the set was read
    // from: a rank file, or a .distcp file (one output, or shards).
    for (set, file) in [
        ("fsdp/world2", "model_world_size_2_rank_0.pt"),
        ("dcp/world2", "__0_0.distcp"),
    ] {
        let copy = tmp.join(set.replace('/', "-"));
        std::fs::create_dir_all(&copy).expect("copy");
        for f in std::fs::read_dir(fixture(set)).expect("fixture") {
            let f = f.expect("entry");
            std::fs::copy(f.path(), copy.join(f.file_name())).expect("copy");
        }
        let before = std::fs::read(copy.join(file)).expect("input");
        let target = copy.join(file);
        for extra in [None, Some("1GB")] {
            let mut args = vec!["convert", "--key", "all", "--force"];
            args.extend([copy.to_str().expect("path"), target.to_str().expect("path")]);
            if let Some(size) = extra {
                args.extend(["--max-shard-size", size]);
            }
            let out = ptload(&args);
            assert_eq!(out.status.code(), Some(2), "{set} {extra:?}");
            assert_eq!(
                std::fs::read(&target).expect("kept"),
                before,
                "{set} {extra:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `ptload` with `args` and the environment variable `COLUMNS` set to
/// `columns`, its output piped.
fn ptload_in_columns(columns: usize, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ptload"))
        .args(args)
        .env("COLUMNS", columns.to_string())
        .output()
        .expect("run ptload")
}

/// The tensor names of a safetensors file `convert` wrote, and its
/// metadata.
fn safetensors_names(path: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let bytes = std::fs::read(path).expect("read the output");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    names.sort();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("header");
    let mut metadata: Vec<(String, String)> = meta
        .metadata()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.sort();
    (names, metadata)
}

/// resemblyzer saves its model under `model_state`, beside
/// `optimizer_state` and `step`: `--key auto` takes the model, and
/// `convert` writes neither the optimizer's tensors nor its parameter ids.
#[test]
fn key_auto_takes_resemblyzers_model_state() {
    let dir = temp_dir("resemblyzer");
    let output = dir.join("encoder.safetensors");
    let out = ptload(&[
        "convert",
        &fixture("resemblyzer.pt"),
        &output.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--key auto: \"model_state\": a training checkpoint's model"),
        "{err}"
    );
    let (names, metadata) = safetensors_names(&output);
    // torch's answers: the model's tensors are those under model_state.
    let want = expected("resemblyzer.pt");
    let mut model: Vec<String> = want["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .filter_map(|t| t["name"].as_str()?.strip_prefix("model_state."))
        .map(str::to_owned)
        .collect();
    model.sort();
    assert_eq!(names, model);
    assert_eq!(names.len(), 16);
    assert!(
        metadata.iter().all(|(k, _)| !k.contains("optimizer")),
        "{metadata:?}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// A file with two models (torchvision's references: `model` and its
/// average `model_ema`) or none under a known key (DINO's `student` and
/// `teacher`): `--key auto` says it is unsure and names `--key`.
#[test]
fn key_auto_says_when_it_is_unsure() {
    let out = ptload(&["load", "--json", &fixture("model_ema.pth")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--key auto: unsure which model you want: took \"model\""),
        "{err}"
    );
    assert!(
        err.contains("to take only \"model_ema\", pass --key model_ema"),
        "{err}"
    );
    let doc: Json = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(doc["tensors"].as_array().map(Vec::len), Some(9), "{doc}");

    let out = ptload(&["load", "--json", &fixture("dino.pth")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--key auto: the whole file, unsure where the model is"),
        "{err}"
    );
    assert!(
        err.contains("the model may be one of student, teacher: select it with --key"),
        "{err}"
    );
    // A plain state dict: nothing to be unsure about, nothing said.
    let plain = ptload(&["load", "--json", &fixture("plain_model.pt")]);
    assert!(!stderr(&plain).contains("unsure"), "{}", stderr(&plain));
}

/// A Lightning checkpoint: the table shows the hyper-parameters, epoch,
/// step and version before the loops' counters, and `--key` shows a
/// subtree of plain values.
#[test]
fn inspect_shows_hyper_parameters_first_and_key_shows_plain_values() {
    let out = ptload(&["inspect", &fixture("lightning_loops.ckpt")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !(l.starts_with("NAME ") && l.ends_with(" VALUE")))
        .skip(1)
        .collect();
    let position = |name: &str| {
        table
            .iter()
            .position(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not shown:\n{text}"))
    };
    let hparams = position("hyper_parameters.lr");
    let first_loop = table
        .iter()
        .position(|l| l.starts_with("loops."))
        .unwrap_or(table.len());
    for name in [
        "hyper_parameters.data.path",
        "epoch",
        "global_step",
        "pytorch-lightning_version",
    ] {
        assert!(
            position(name) < first_loop,
            "{name} after the loops:\n{text}"
        );
    }
    assert!(hparams < first_loop, "{text}");
    // What the table leaves out, by entry.
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("... ") && last.contains("loops: ") && last.contains("--key"),
        "{last}"
    );
    // torch's answers: the values under hyper_parameters.
    let want = expected("lightning_loops.ckpt");
    let hyper: Vec<(&str, &Json)> = want["values"]
        .as_object()
        .expect("values")
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("hyper_parameters.")?, v)))
        .collect();
    assert_eq!(hyper.len(), 9);
    let out = ptload(&[
        "inspect",
        "--key",
        "hyper_parameters",
        &fixture("lightning_loops.ckpt"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("9 plain values under \"hyper_parameters\""),
        "{text}"
    );
    for (name, _) in &hyper {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "{name}:\n{text}"
        );
    }
    let doc = inspect_json("lightning_loops.ckpt", &["--key", "hyper_parameters.data"]);
    assert_eq!(doc["tensors"], serde_json::json!([]));
    let values: Vec<(&str, &Json)> = doc["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, &v["value"])))
        .collect();
    let want_data: Vec<(&str, &Json)> = hyper
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("data.")?, *v)))
        .collect();
    assert_eq!(values, want_data);
    // A key holding nothing still fails, naming what holds plain values.
    let out = ptload(&[
        "inspect",
        "--key",
        "hyper_parameter",
        &fixture("lightning_loops.ckpt"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("with plain values only: epoch, global_step"),
        "{}",
        stderr(&out)
    );
}

/// In a terminal of 100 columns (`COLUMNS=100`), no line of `inspect` is
/// longer: Lightning's callback state keys and long parameter names lose
/// their middle, long values and prose are shortened or wrapped.
#[test]
fn inspect_fits_the_terminal_width() {
    // (file, options, widths): a digest (71 columns with its indent) is
    // never shortened.
    for (file, extra, widths) in [
        ("lightning_loops.ckpt", &[][..], &[100, 60][..]),
        ("lightning_loops.ckpt", &["--hash"][..], &[100][..]),
        (
            "lightning_loops.ckpt",
            &["--key", "auto"][..],
            &[100, 60][..],
        ),
        ("training.ckpt", &[][..], &[100, 60][..]),
        ("dcp/world4", &[][..], &[100, 60][..]),
    ] {
        let path = fixture(file);
        let mut args = vec!["inspect", path.as_str()];
        args.extend_from_slice(extra);
        for &columns in widths {
            let out = ptload_in_columns(columns, &args);
            assert_eq!(out.status.code(), Some(0), "{file}: {}", stderr(&out));
            let text = stdout(&out);
            for line in text.lines() {
                assert!(
                    line.chars().count() <= columns,
                    "{file} {extra:?}, {columns} columns: {} characters: {line}",
                    line.chars().count()
                );
            }
            if file != "dcp/world4" {
                assert!(text.contains("…"), "{file}: nothing shortened:\n{text}");
            }
        }
    }
    // Piped without COLUMNS: every name whole.
    let text = stdout(&ptload(&["inspect", &fixture("lightning_loops.ckpt")]));
    assert!(text.contains(
        "callbacks.ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min', \
         'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}\
         .best_model_score"
    ));
}

/// Three objects saved one after another on one stream: `inspect` shows
/// each, where torch's stream was when it read it, and stops at the end
/// of the file, where torch.load has nothing left to read.
#[test]
fn inspect_shows_every_object_of_a_stream() {
    let want = expected("stream.pt");
    let objects = want["objects"].as_array().expect("objects");
    assert_eq!(objects.len(), 3);
    assert_eq!(want["load_after_last"], "EOFError: Ran out of input");
    let doc = inspect_json("stream.pt", &["--hash"]);
    let mut docs = vec![&doc];
    docs.extend(doc["more_objects"].as_array().expect("more_objects"));
    assert_eq!(docs.len(), objects.len());
    for (i, (ours, theirs)) in docs.iter().zip(objects).enumerate() {
        assert_eq!(ours["object"]["index"], i, "object {i}");
        assert_eq!(ours["object"]["offset"], theirs["offset"], "object {i}");
        assert_eq!(ours["format"], theirs["format"], "object {i}");
        let tensors = |d: &Json, key: &str| -> Vec<(Json, Json)> {
            d["tensors"]
                .as_array()
                .expect("tensors")
                .iter()
                .map(|t| (t["name"].clone(), t[key].clone()))
                .collect()
        };
        for key in ["sha256", "shape", "dtype"] {
            assert_eq!(
                tensors(ours, key),
                tensors(theirs, key),
                "object {i}: {key}"
            );
        }
        let values: serde_json::Map<String, Json> = ours["values"]
            .as_array()
            .expect("values")
            .iter()
            .filter_map(|v| Some((v["name"].as_str()?.to_owned(), v["value"].clone())))
            .collect();
        assert_eq!(Json::Object(values), theirs["values"], "object {i}");
    }
    assert!(doc.get("trailing").is_none(), "{doc}");
    let out = ptload(&["inspect", &fixture("stream.pt")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    for (i, o) in objects.iter().enumerate().skip(1) {
        let title = format!(
            "stream.pt, object {} (at byte {}): legacy",
            i + 1,
            o["offset"]
        );
        assert!(text.contains(&title), "{title}:\n{text}");
    }
    assert!(!text.to_lowercase().contains("empty"), "{text}");
    assert!(
        !stderr(&out).to_lowercase().contains("empty"),
        "{}",
        stderr(&out)
    );
    // A file of one checkpoint: one object, no stream fields.
    let plain = inspect_json("legacy.pt", &[]);
    assert!(plain.get("object").is_none() && plain.get("more_objects").is_none());
    // Bytes after the last object that are not one: said, not an error.
    let dir = temp_dir("stream");
    let junk = dir.join("junk_after.pt");
    let mut bytes = std::fs::read(fixture("legacy.pt")).expect("read");
    let end = bytes.len();
    bytes.extend_from_slice(b"not a checkpoint at all");
    std::fs::write(&junk, &bytes).expect("write");
    let out = ptload(&["inspect", &junk.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "warning: 23 bytes after the last object (at byte {end}) are not another object"
        )),
        "{}",
        stdout(&out)
    );
    let doc: Json = serde_json::from_str(&stdout(&ptload(&[
        "inspect",
        "--json",
        &junk.display().to_string(),
    ])))
    .expect("json");
    assert_eq!(doc["trailing"]["offset"], end);
    assert_eq!(doc["trailing"]["bytes"], 23);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// A safetensors file, found by its content (this one is named `.pt`):
/// `inspect` lists its tensors, dtypes, shapes and `__metadata__` (as
/// plain values), as the safetensors library reads them; `--hash` hashes
/// their bytes; the state-dict options apply as to any checkpoint.
#[test]
fn inspect_reads_a_safetensors_file_by_its_content() {
    let path = fixture("weights.safetensors.pt");
    let bytes = std::fs::read(&path).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let out = ptload(&["inspect", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("a safetensors file (no pickle)"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("format") && l.trim_end().ends_with("\"pt\"")),
        "{text}"
    );
    let doc = inspect_json("weights.safetensors.pt", &["--hash"]);
    assert_eq!(doc["format"], "safetensors");
    let tensors = doc["tensors"].as_array().expect("tensors");
    assert_eq!(tensors.len(), st.len());
    for t in tensors {
        let name = t["name"].as_str().expect("name");
        let view = st.tensor(name).expect("in the file");
        assert_eq!(t["dtype"], format!("{:?}", view.dtype()), "{name}");
        assert_eq!(t["shape"], serde_json::json!(view.shape()), "{name}");
        assert_eq!(t["nbytes"], view.data().len(), "{name}");
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(view.data()));
        assert_eq!(t["sha256"], digest, "{name}");
    }
    // The same file as `diff` takes it.
    let same = ptload(&["diff", &path, &path]);
    assert_eq!(same.status.code(), Some(0), "{}", stderr(&same));
    let out = ptload(&["inspect", "--include", "weight", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains("bias"), "{}", stdout(&out));
}

/// safetensors in, safetensors out: a file and transformers' sharded set
/// convert (whole, cast, resharded) to files the safetensors library reads,
/// equal to the input, the input's `__metadata__` kept once (a set's files
/// each say `format`).
#[test]
fn safetensors_files_and_sets_convert() {
    let dir = temp_dir("st-convert");
    let one = dir.join("one.safetensors");
    let out = ptload(&[
        "convert",
        &fixture("st_dtypes.safetensors"),
        &one.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).is_empty(),
        "a plain state dict: {}",
        stderr(&out)
    );
    let bytes = std::fs::read(&one).expect("read");
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("safetensors");
    let kept = meta.metadata().clone().expect("metadata");
    assert_eq!(kept.get("made_by").map(String::as_str), Some("generate.py"));
    assert_eq!(kept.get("format").map(String::as_str), Some("pt"));
    let same = ptload(&[
        "diff",
        &fixture("st_dtypes.safetensors"),
        &one.display().to_string(),
    ]);
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));
    let cast = dir.join("cast.safetensors");
    let out = ptload(&[
        "convert",
        &fixture("st_sharded"),
        &cast.display().to_string(),
        "--dtype",
        "bf16",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let bytes = std::fs::read(&cast).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    assert_eq!(st.len(), 28);
    assert!(st
        .tensors()
        .iter()
        .all(|(_, v)| v.dtype() == safetensors::Dtype::BF16));
    let shards = dir.join("shards");
    let out = ptload(&[
        "convert",
        &fixture("st_sharded/model.safetensors.index.json"),
        &shards.display().to_string(),
        "--max-shard-size",
        "10KB",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let same = ptload(&[
        "diff",
        &fixture("st_sharded"),
        &shards.display().to_string(),
    ]);
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));
    let _ = std::fs::remove_dir_all(&dir);
}

/// FSDP rank files that record no placement (each rank's
/// `torch.save` of its local shards): refused as duplicate names with the
/// option that reads them named; read with --rank-files as the placements
/// sidecar reads them; a missing rank is an error.
#[test]
fn rank_files_without_placements_read_by_stated_rules() {
    let dir = temp_dir("rank-files");
    std::fs::create_dir_all(&dir).expect("dir");
    for r in 0..2 {
        let name = format!("model_world_size_2_rank_{r}.pt");
        std::fs::copy(fixture(&format!("fsdp/local2/{name}")), dir.join(&name)).expect("copy");
    }
    let d = dir.display().to_string();
    let refused = ptload(&["inspect", &d]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("--rank-files"),
        "{}",
        stderr(&refused)
    );
    let sidecar = inspect_json("fsdp/local2", &["--hash"]);
    let stated = ptload(&[
        "inspect",
        "--json",
        "--hash",
        "--rank-files",
        "model.scale=replicate,fsdp2",
        &d,
    ]);
    assert_eq!(stated.status.code(), Some(0), "{}", stderr(&stated));
    let stated: Json = serde_json::from_str(&stdout(&stated)).expect("json");
    let digests = |doc: &Json| -> Vec<(String, Json, Json)> {
        let mut out: Vec<_> = doc["tensors"]
            .as_array()
            .expect("tensors")
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().expect("name").to_owned(),
                    t["shape"].clone(),
                    t["sha256"].clone(),
                )
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    };
    assert_eq!(digests(&stated), digests(&sidecar));
    std::fs::remove_file(dir.join("model_world_size_2_rank_1.pt")).expect("rm");
    let short = ptload(&["inspect", "--rank-files", "fsdp2", &d]);
    assert_eq!(short.status.code(), Some(2));
    assert!(stderr(&short).contains("world of 2"), "{}", stderr(&short));
    let bad = ptload(&["inspect", "--rank-files", "nonsense", &d]);
    assert_eq!(bad.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hugging Face-format DCP saves (safetensors shards that place their
/// chunks, no .metadata): inspect says what they are and gives torch's
/// whole tensors; convert writes a safetensors file and a sharded set
/// that diff equal to the save. FSDP2 local shards at world 4 read with
/// the stated rule.
#[test]
fn hugging_face_format_saves_and_world_4_rank_files_read_as_torchs() {
    let doc: Json = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("hf_dcp.json")).expect("hf_dcp.json"),
    )
    .expect("json");
    let tmp = temp_dir("hf-dcp");
    for (name, save) in doc["saves"].as_object().expect("saves") {
        let input = format!("dcp/{name}");
        let text = ptload(&["inspect", &fixture(&input)]);
        assert!(text.status.success(), "{}", stderr(&text));
        assert!(
            stdout(&text).contains("Hugging Face format (safetensors shards, no pickle)"),
            "{}",
            stdout(&text)
        );
        let got = inspect_json(&input, &["--hash"]);
        let want = save["tensors"].as_object().expect("tensors");
        let tensors = got["tensors"].as_array().expect("tensors");
        assert_eq!(tensors.len(), want.len(), "{name}");
        for t in tensors {
            let w = &want[t["name"].as_str().expect("name")];
            assert_eq!(
                (&t["shape"], &t["sha256"]),
                (&w["shape"], &w["sha256"]),
                "{name}"
            );
        }
        let one = tmp.join(format!("{name}.safetensors"));
        let shards = tmp.join(format!("{name}-shards"));
        for (out, size) in [(&one, None), (&shards, Some("100B"))] {
            let mut owned: Vec<String> = vec![
                "convert".into(),
                fixture(&input),
                out.to_str().expect("path").into(),
            ];
            if let Some(size) = size {
                owned.extend(["--max-shard-size".into(), size.into()]);
            }
            let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
            let made = ptload(&refs);
            assert!(made.status.success(), "{name}: {}", stderr(&made));
            let diff = ptload(&["diff", &fixture(&input), out.to_str().expect("path")]);
            assert_eq!(diff.status.code(), Some(0), "{name}: {}", stdout(&diff));
        }
    }
    let fsdp: Json = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("fsdp.json")).expect("fsdp.json"),
    )
    .expect("json");
    let out = ptload(&[
        "inspect",
        "--json",
        "--hash",
        "--rank-files",
        "model.scale=replicate,fsdp2",
        &fixture("fsdp/local4"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let got: Json = serde_json::from_str(&stdout(&out)).expect("json");
    let want = fsdp["sets"]["local4"]["tensors"]
        .as_object()
        .expect("tensors");
    let tensors = got["tensors"].as_array().expect("tensors");
    assert_eq!(tensors.len(), want.len());
    for t in tensors {
        let w = &want[t["name"].as_str().expect("name")];
        assert_eq!((&t["shape"], &t["sha256"]), (&w["shape"], &w["sha256"]));
    }
    let refused = ptload(&["inspect", &fixture("fsdp/local4")]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("--rank-files"),
        "{}",
        stderr(&refused)
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `--refuse-at LEVEL` follows the scanner: a payload is refused (exit 2,
/// the finding named), a whole pickled model read at `dangerous` and
/// refused at `needs-code`, a plain state dict read at every level.
#[test]
fn refuse_at_follows_the_scan() {
    let payload = shared_data("scan")
        .join("polyglot_pickle_then_zip.pt")
        .display()
        .to_string();
    let out = ptload(&["inspect", "--refuse-at", "dangerous", &payload]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("os.system called"),
        "{}",
        stderr(&out)
    );
    assert!(ptload(&["inspect", &payload]).status.success());
    let model = fixture("whole_module.pt");
    let read = ptload(&["inspect", "--refuse-at", "dangerous", &model]);
    assert_eq!(read.status.code(), Some(0), "{}", stderr(&read));
    let refused = ptload(&["load", "--refuse-at", "needs-code", &model]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("needs-code"),
        "{}",
        stderr(&refused)
    );
    let plain = ptload(&["inspect", "--refuse-at", "needs-code", &fixture("basic.pt")]);
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    let bad = ptload(&["inspect", "--refuse-at", "sometimes", &model]);
    assert_eq!(bad.status.code(), Some(2));
}
