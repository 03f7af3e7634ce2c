//! The hostile corpus: every file in tests/hostile/ with the outcome it
//! must have. Crafted files come from
//! crates/ptload-fuzz/examples/hostile_corpus.rs, the torch_* payload files
//! from `fixtures/generate.py --only hostile` (torch.save itself).
//!
//! Each file is opened and fully read by the library (bounded in time), and
//! run through `ptload scan`, `ptload inspect --strict` and `ptload inspect`
//! from an empty directory that must stay empty; the marker file payloads
//! would create must never appear.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ptload_reader::{Checkpoint, ErrorKind};

/// What a payload would create if anything ever ran it.
const PWNED: &str = "/tmp/ptload-hostile-pwned";

enum Expect {
    /// Opens; every tensor reads; these globals are reported outside
    /// torch's allowlist (empty: nothing to report).
    Opens {
        tensors: usize,
        flagged: &'static [&'static str],
    },
    /// Refused with this kind, the message containing this text.
    Fails(ErrorKind, &'static str),
}

use ErrorKind::{DuplicateName, Legacy, LimitExceeded, NotACheckpoint, Pickle, Tensor, Zip};
use Expect::{Fails, Opens};

const fn clean(tensors: usize) -> Expect {
    Opens {
        tensors,
        flagged: &[],
    }
}

const CASES: &[(&str, Expect)] = &[
    // Container lies.
    ("c_bad_crc.pt", Fails(Zip, "CRC-32 mismatch")),
    (
        "c_deflate_bomb_declared.pt",
        Fails(LimitExceeded, "max_pickle_bytes"),
    ),
    (
        "c_deflate_size_lie.pt",
        Fails(Zip, "the directory says 100"),
    ),
    (
        "c_directory_outside_file.pt",
        Fails(Zip, "lies outside the file"),
    ),
    ("c_duplicate_names.pt", Fails(Zip, "duplicate entry name")),
    ("c_empty.pt", Fails(NotACheckpoint, "empty file")),
    ("c_encrypted.pt", Fails(Zip, "encrypted")),
    (
        "c_entry_count_lie.pt",
        Fails(Zip, "entry count 1000 does not fit"),
    ),
    (
        "c_eocd_only.pt",
        Fails(NotACheckpoint, "without a data.pkl"),
    ),
    (
        "c_legacy_numel_lie.pt",
        Fails(Legacy, "the data header says 1152921504606846976"),
    ),
    (
        "c_legacy_truncated.pt",
        Fails(Legacy, "runs past the end of the file"),
    ),
    ("c_local_name_mismatch.pt", Fails(Zip, "local header name")),
    (
        "c_no_data_pkl.pt",
        Fails(NotACheckpoint, "without a data.pkl"),
    ),
    (
        "c_overlapping_entries.pt",
        Fails(Zip, "overlaps the next entry"),
    ),
    ("c_random.bin", Fails(NotACheckpoint, "unknown format")),
    (
        "c_truncated_zip.pt",
        Fails(NotACheckpoint, "truncated zip archive"),
    ),
    ("c_two_names_one_entry.pt", Fails(Zip, "local header name")),
    // Pickle VM abuse.
    ("p_append_on_dict.pt", Fails(Pickle, "APPEND on a dict")),
    ("p_bad_string_quotes.pt", Fails(Pickle, "must be quoted")),
    (
        "p_binbytes8_length_lie.pt",
        Fails(Pickle, "length 4611686018427387904 exceeds"),
    ),
    (
        "p_binget_undefined.pt",
        Fails(Pickle, "memo key 7 is not defined"),
    ),
    ("p_deep_marks.pt", Fails(Pickle, "stack underflow")),
    ("p_deep_nesting.pt", clean(0)),
    ("p_deep_tuple_key.pt", clean(1)),
    (
        "p_deep_call_args.pt",
        Opens {
            tensors: 1,
            flagged: &["__main__.Thing"],
        },
    ),
    (
        "p_deep_build_state.pt",
        Opens {
            tensors: 1,
            flagged: &["__main__.Thing"],
        },
    ),
    (
        "p_int_million_digits.pt",
        Fails(Pickle, "over Python's limit of 4300"),
    ),
    (
        "p_work_long_key.pt",
        Fails(LimitExceeded, "max_work_per_byte"),
    ),
    (
        "p_work_stack_global.pt",
        Fails(LimitExceeded, "max_work_per_byte"),
    ),
    (
        "p_work_bytearray.pt",
        Fails(LimitExceeded, "max_work_per_byte"),
    ),
    (
        "p_work_tuple_key.pt",
        Fails(LimitExceeded, "max_work_per_byte"),
    ),
    (
        "p_work_value_copies.pt",
        Fails(LimitExceeded, "max_name_bytes"),
    ),
    ("p_dict_cycle.pt", clean(1)),
    ("p_dup_bomb.pt", Fails(LimitExceeded, "max_shared_visits")),
    ("p_empty_pickle.pt", Fails(Pickle, "without STOP")),
    (
        "p_frame_length_lie.pt",
        Fails(Pickle, "length 1099511627776 exceeds"),
    ),
    ("p_list_cycle.pt", clean(1)),
    (
        "p_long4_length_lie.pt",
        Fails(Pickle, "length 2147483647 exceeds"),
    ),
    ("p_long_binput_max.pt", clean(1)),
    ("p_missing_mark.pt", Fails(Pickle, "MARK missing")),
    ("p_missing_stop.pt", Fails(Pickle, "without STOP")),
    (
        "p_protocol_6.pt",
        Fails(Pickle, "unsupported pickle protocol 6"),
    ),
    (
        "p_reference_bomb.pt",
        Fails(LimitExceeded, "max_shared_visits"),
    ),
    ("p_setitem_on_list.pt", Fails(Pickle, "SETITEM on a list")),
    (
        "p_setitem_on_tensor.pt",
        Fails(Pickle, "SETITEM on a tensor"),
    ),
    (
        "p_stack_underflow.pt",
        Fails(Pickle, "POP on an empty stack"),
    ),
    (
        "p_unicode_length_lie.pt",
        Fails(Pickle, "length 4294967295 exceeds"),
    ),
    ("p_unknown_opcode.pt", Fails(Pickle, "unknown opcode 0xff")),
    // Tensor metadata lies.
    (
        "t_dotted_name_collision.pt",
        Fails(DuplicateName, "['a.b'] and ['a']['b']"),
    ),
    (
        "t_extent_beyond_storage.pt",
        Fails(Tensor, "exceeds storage 0 of 16 bytes"),
    ),
    (
        "t_key_escapes_archive.pt",
        Fails(Tensor, "storage record is missing"),
    ),
    (
        "t_key_with_nul.pt",
        Fails(Tensor, "storage record is missing"),
    ),
    ("t_location_cuda99.pt", clean(1)),
    (
        "t_missing_record.pt",
        Fails(Tensor, "storage record is missing"),
    ),
    ("t_negative_size.pt", Fails(Tensor, "negative size -4")),
    ("t_negative_stride.pt", Fails(Tensor, "negative stride -1")),
    (
        "t_numel_beyond_record.pt",
        Fails(Tensor, "does not match expected size"),
    ),
    (
        "t_rank_mismatch.pt",
        Fails(Tensor, "size has 2 dimensions but stride has 1"),
    ),
    ("t_shape_overflow.pt", Fails(Tensor, "overflows")),
    // Typed by its first reference, as torch does: `v` is 2 float32s.
    ("t_shared_key_other_dtype.pt", clean(2)),
    (
        "t_zero_stride_huge.pt",
        Fails(LimitExceeded, "max_expanded_view_bytes"),
    ),
    // Calls of the wrong shape.
    ("w_ordereddict_junk_args.pt", clean(1)),
    (
        "w_persistent_id_module_in_zip.pt",
        Fails(Pickle, "unsupported persistent id kind \"module\""),
    ),
    (
        "w_persistent_id_not_tuple.pt",
        Fails(Pickle, "persistent id must be a tuple"),
    ),
    (
        "w_rebuild_arity.pt",
        Fails(Pickle, "called with 2 arguments"),
    ),
    (
        "w_rebuild_shape_is_text.pt",
        Fails(Pickle, "tensor size must be a tuple"),
    ),
    (
        "w_storage_type_not_a_global.pt",
        Fails(Pickle, "storage type must be a global"),
    ),
    // Code payloads: tensors load, the payload is reported, nothing runs.
    (
        "x_asyncio_subprocess.pt",
        Opens {
            tensors: 1,
            flagged: &[
                "asyncio.unix_events._UnixSubprocessTransport",
                "asyncio.subprocess.create_subprocess_shell",
            ],
        },
    ),
    (
        "x_build_on_a_function.pt",
        Opens {
            tensors: 1,
            flagged: &["subprocess.Popen"],
        },
    ),
    (
        "x_builtins_exec.pt",
        Opens {
            tensors: 1,
            flagged: &["builtins.exec"],
        },
    ),
    (
        "x_getattr_import_gadget.pt",
        Opens {
            tensors: 1,
            flagged: &["builtins.getattr", "builtins.__import__"],
        },
    ),
    (
        "x_legacy_payload.pt",
        Opens {
            tensors: 1,
            flagged: &["os.system"],
        },
    ),
    (
        "x_many_dangerous.pt",
        Opens {
            tensors: 1,
            flagged: &[
                "subprocess.check_output",
                "runpy.run_path",
                "webbrowser.open",
                "shutil.rmtree",
                "socket.create_connection",
                "urllib.request.urlopen",
                "importlib.import_module",
                "code.InteractiveInterpreter",
                "operator.attrgetter",
                "functools.partial",
            ],
        },
    ),
    (
        "x_os_system.pt",
        Opens {
            tensors: 1,
            flagged: &["os.system"],
        },
    ),
    (
        "x_payload_in_backward_hooks.pt",
        Opens {
            tensors: 1,
            flagged: &["os.system"],
        },
    ),
    (
        "x_pip_main.pt",
        Opens {
            tensors: 1,
            flagged: &["pip.main"],
        },
    ),
    (
        "x_posix_system_stack_global.pt",
        Opens {
            tensors: 1,
            flagged: &["posix.system"],
        },
    ),
    (
        "x_rebuild_from_type_v2_wraps_system.pt",
        Opens {
            tensors: 1,
            flagged: &["os.system"],
        },
    ),
    ("x_torchscript_code.pt", clean(1)),
    (
        "x_unknown_class_called.pt",
        Opens {
            tensors: 1,
            flagged: &["mylib.hooks.Callback"],
        },
    ),
    (
        "torch_dotted_name_collision.pt",
        Fails(DuplicateName, "['a.b'] and ['a']['b']"),
    ),
    (
        "torch_payload_in_list.pt",
        Opens {
            tensors: 2,
            flagged: &["builtins.getattr", "builtins.__import__"],
        },
    ),
    (
        "torch_payload_legacy.pt",
        Opens {
            tensors: 2,
            flagged: &["posix.system"],
        },
    ),
    (
        "torch_payload_proto4_exec.pt",
        Opens {
            tensors: 2,
            flagged: &["builtins.exec"],
        },
    ),
    (
        "torch_payload_zip.pt",
        Opens {
            tensors: 2,
            flagged: &["posix.system"],
        },
    ),
];

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/hostile")
}

#[test]
fn every_file_has_an_expected_outcome() {
    let mut files: Vec<String> = std::fs::read_dir(corpus())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let mut named: Vec<String> = CASES.iter().map(|(n, _)| (*n).to_owned()).collect();
    named.sort();
    assert_eq!(files, named, "tests/hostile and CASES disagree");
}

/// Stack for the reader's thread: far below the main thread's 8 MiB, so
/// any recursion over file data (100,000 levels in the deep files)
/// overflows here.
const SMALL_STACK: usize = 256 << 10;

/// Only a hang trips this: each open takes well under a second.
const HANG_CEILING: Duration = Duration::from_secs(120);

/// Open `path` and read every tensor on a thread with a small stack.
/// Returns the outcome, or panics if the open hangs.
fn open_on_small_stack(path: PathBuf) -> Result<(Checkpoint, Vec<String>), ptload_reader::Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    let name = path.display().to_string();
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(move || {
            let outcome = Checkpoint::open(&path).map(|ckpt| {
                let mut problems = Vec::new();
                for t in ckpt.tensors() {
                    match t.data() {
                        Ok(bytes) if bytes.len() as u64 == t.info().nbytes => {}
                        Ok(bytes) => problems.push(format!("{}: {} bytes", t.name(), bytes.len())),
                        Err(e) => problems.push(format!("{}: {e}", t.name())),
                    }
                }
                // Debug walks nothing recursively either.
                let _ = format!("{ckpt:?}");
                (ckpt, problems)
            });
            let _ = tx.send(outcome);
        })
        .expect("spawn");
    rx.recv_timeout(HANG_CEILING)
        .unwrap_or_else(|e| panic!("{name}: no outcome within {HANG_CEILING:?} ({e})"))
}

/// The library: each file opens with its expected outcome on a small
/// stack, every tensor of those that open reads, and the work counted by
/// the reader stays within its linear allowance.
#[test]
fn library_outcomes() {
    let _ = std::fs::remove_file(PWNED);
    let allowance = ptload_reader::Limits::default().max_work_per_byte;
    for (name, expect) in CASES {
        let path = corpus().join(name);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let opened = open_on_small_stack(path);
        match (expect, &opened) {
            (Opens { tensors, flagged }, Ok((ckpt, problems))) => {
                assert_eq!(ckpt.len(), *tensors, "{name}: tensors");
                assert!(problems.is_empty(), "{name}: {problems:?}");
                // Pickle work is allowed per byte (64 KiB at least); the
                // walk adds a step per value it names.
                let bound = allowance * len.max(64 << 10) + 4 * len;
                assert!(
                    ckpt.work() <= bound,
                    "{name}: work {} over {bound}",
                    ckpt.work()
                );
                let outside: Vec<String> = ckpt
                    .outside_allowlist()
                    .map(|g| format!("{}.{}", g.module, g.name))
                    .collect();
                for g in *flagged {
                    assert!(
                        outside.iter().any(|s| s == g),
                        "{name}: {g} not reported in {outside:?}"
                    );
                }
                if flagged.is_empty() {
                    assert!(outside.is_empty(), "{name}: unexpected {outside:?}");
                }
                // Its findings are scan's: what `scan` reports at
                // unknown-call and above, each once.
                let findings: std::collections::BTreeSet<String> = ckpt
                    .suspicious()
                    .expect("scanned")
                    .iter()
                    .map(|g| format!("{} {:?}", g.path(), g.level()))
                    .collect();
                let report = ptload_reader::scan::scan_file(
                    &corpus().join(name),
                    &ptload_reader::Limits::default(),
                    false,
                )
                .unwrap();
                let scanned: std::collections::BTreeSet<String> = report
                    .pickles
                    .iter()
                    .flat_map(|p| &p.globals)
                    .filter(|g| g.level() >= ptload_reader::scan::Level::UnknownCall)
                    .map(|g| format!("{} {:?}", g.path(), g.level()))
                    .collect();
                assert_eq!(findings, scanned, "{name}");
            }
            (Fails(kind, text), Err(e)) => {
                assert_eq!(e.kind(), *kind, "{name}: {e}");
                assert!(e.to_string().contains(text), "{name}: {e}");
            }
            (_, Ok((c, _))) => panic!(
                "{name}: opened with {} tensors, expected a failure",
                c.len()
            ),
            (_, Err(e)) => panic!("{name}: failed ({e}), expected to open"),
        }
    }
    assert!(!Path::new(PWNED).exists(), "a payload ran");
}

/// The binary: scan exits 1 on payloads (0 on clean files, 2 on broken
/// ones), --strict refuses payloads with exit 2, the default policy loads
/// the tensors and names the payload. Nothing is written anywhere.
#[test]
fn cli_outcomes() {
    let _ = std::fs::remove_file(PWNED);
    let dir = std::env::temp_dir().join(format!("ptload-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ptload"))
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    for (name, expect) in CASES {
        let path = corpus().join(name);
        let file = path.to_str().unwrap();
        let scan = run(&["scan", file]);
        let strict = run(&["inspect", "--strict", file]);
        let default = run(&["inspect", file]);
        let code = |o: &std::process::Output| o.status.code();
        let text = |o: &std::process::Output| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        match expect {
            Opens { flagged, .. } if !flagged.is_empty() => {
                // A class only constructed and filled needs its code and
                // is no call: it passes the gate's default line, listed at
                // needs-code; anything else fails it.
                let constructed_only = flagged.iter().all(|g| {
                    text(&scan)
                        .lines()
                        .any(|l| l.contains(g) && l.contains("instantiated  needs-code"))
                });
                let want = if constructed_only { 0 } else { 1 };
                assert_eq!(code(&scan), Some(want), "{name}: scan\n{}", text(&scan));
                assert_eq!(code(&strict), Some(2), "{name}: strict\n{}", text(&strict));
                assert_eq!(
                    code(&default),
                    Some(0),
                    "{name}: default\n{}",
                    text(&default)
                );
                for g in *flagged {
                    assert!(text(&scan).contains(g), "{name}: scan does not name {g}");
                    assert!(
                        text(&default).contains(g),
                        "{name}: inspect does not name {g}"
                    );
                }
                assert!(
                    text(&strict).contains("weights_only")
                        || text(&strict).contains("Unsupported global"),
                    "{name}: {}",
                    text(&strict)
                );
            }
            Opens { .. } => {
                assert_eq!(code(&scan), Some(0), "{name}: scan\n{}", text(&scan));
                assert_eq!(code(&strict), Some(0), "{name}: strict\n{}", text(&strict));
                assert_eq!(
                    code(&default),
                    Some(0),
                    "{name}: default\n{}",
                    text(&default)
                );
            }
            Fails(..) => {
                for (what, o) in [("strict", &strict), ("inspect", &default)] {
                    assert_eq!(code(o), Some(2), "{name}: {what}\n{}", text(o));
                    assert!(!text(o).contains("panicked"), "{name}: {what} panicked");
                }
                // The scanner reads what torch would unpickle, whatever else
                // is wrong with the file: these hold no payload. A zip
                // directory other readers read differently from torch is
                // ambiguous, which fails the gate (exit 1) by itself.
                let ambiguous = code(&scan) == Some(1)
                    && text(&scan).contains(": AMBIGUOUS (")
                    && !text(&scan).contains("DANGEROUS");
                assert!(
                    matches!(code(&scan), Some(0 | 2)) || ambiguous,
                    "{name}: scan\n{}",
                    text(&scan)
                );
                assert!(!text(&scan).contains("panicked"), "{name}: scan panicked");
            }
        }
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(
        left.is_empty(),
        "files appeared in the working directory: {left:?}"
    );
    std::fs::remove_dir(&dir).unwrap();
    assert!(!Path::new(PWNED).exists(), "a payload ran");
}
