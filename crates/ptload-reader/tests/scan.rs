//! The scanner against files built to slip a payload past scanners
//! (`tests/scan/`, written by `crates/ptload-fuzz/examples/scan_corpus.rs`),
//! and against torch itself: for every file of `tests/scan/` and
//! `tests/hostile/`, `tests/scan/torch_reach.json` lists the globals
//! torch.load would resolve, found by `fixtures/generate.py --only scan`
//! with torch's own zip-or-stream decision and an unpickler whose
//! `find_class` records names and returns a stand-in. The scanner must
//! report every one of them, in a pickle it marks as read by torch.load.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ptload_reader::scan::{scan_file, Danger, GlobalClass, Level, Verdict};
use ptload_reader::Limits;

/// BINUNICODE of `text`.
fn s(text: &str) -> Vec<u8> {
    let mut out = b"X".to_vec();
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// The scan of a protocol 2 pickle that calls `global` (`"module\nname\n"`,
/// as GLOBAL writes it) with one string; the pickle must be read to its
/// STOP.
fn called_with_a_string(global: &str) -> ptload_reader::scan::ScanReport {
    let mut p = b"\x80\x02c".to_vec();
    p.extend_from_slice(global.as_bytes());
    p.extend_from_slice(b"X\x01\x00\x00\x00x\x85R.");
    let report = ptload_reader::scan::scan_bytes(&p, &Limits::default());
    assert!(report.pickles[0].complete, "{global}: {report:#?}");
    report
}

/// A protocol 2 pickle of `parts`, ended by STOP.
fn pickle(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = b"\x80\x02".to_vec();
    for p in parts {
        out.extend_from_slice(p);
    }
    out.push(b'.');
    out
}

/// `class` (a GLOBAL's bytes) made by NEWOBJ with no arguments, then
/// BUILD with a dict holding `items` (the SETITEM opcodes' bytes).
fn built(class: &[u8], items: &[u8]) -> Vec<u8> {
    let mut out = class.to_vec();
    out.extend_from_slice(b")\x81}");
    out.extend_from_slice(items);
    out.push(b'b');
    out
}

/// A legacy file: the magic number, the protocol, sys_info, the object
/// (protocol 2 pickle of `object`), then the storage keys, which torch
/// iterates.
fn legacy_file(object: &[u8], keys: &[u8]) -> Vec<u8> {
    let mut out = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.".to_vec();
    out.extend_from_slice(b"\x80\x02M\xe9\x03.\x80\x02}.");
    out.extend(pickle(&[object]));
    out.extend(pickle(&[keys]));
    out
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

use Verdict::{Ambiguous, Clean, Dangerous, NeedsCode, UnknownCall, Unreadable};

/// The finding that must make a verdict: the global (for an ambiguous
/// verdict, words of the ambiguity), and whether torch.load reaches the
/// pickle it is in.
type Finding = Option<(&'static str, bool)>;

/// Each file, its verdict, and the finding that makes it.
const CASES: &[(&str, Verdict, Finding)] = &[
    // Parsing as torch does: no PK at offset 0 means the stream is
    // unpickled from byte 0, at any protocol.
    (
        "polyglot_pickle_then_zip.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    ("bare_protocol_0.pkl", Dangerous, Some(("os.system", true))),
    ("bare_protocol_1.pkl", Dangerous, Some(("os.system", true))),
    ("bare_protocol_2.pkl", Dangerous, Some(("os.system", true))),
    ("bare_protocol_3.pkl", Dangerous, Some(("os.system", true))),
    ("bare_protocol_4.pkl", Dangerous, Some(("os.system", true))),
    ("bare_protocol_5.pkl", Dangerous, Some(("os.system", true))),
    ("bare_clean.pkl", Clean, None),
    (
        "stacked_magic_then_payload.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    // torch stops at a first pickle that is not the magic number; the
    // payload behind it is still reported.
    (
        "stacked_clean_then_payload.pkl",
        Dangerous,
        Some(("os.system", false)),
    ),
    (
        "legacy_payload_truncated.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    (
        "payload_then_broken_stream.pkl",
        Dangerous,
        Some(("os.system", true)),
    ),
    (
        "tar_payload_in_pickle_member.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    // Zip tricks torch tolerates.
    ("zip_bad_crc.pt", Dangerous, Some(("os.system", true))),
    (
        "zip_local_name_mismatch.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    (
        "zip_duplicate_last_is_payload.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    (
        "zip_duplicate_first_is_payload.pt",
        Dangerous,
        Some(("os.system", false)),
    ),
    (
        "zip_other_pkl_entry.pt",
        Dangerous,
        Some(("os.system", false)),
    ),
    (
        "zip_torchscript_constants.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    // Marked encrypted: torch refuses the entry (torch_reach.json lists
    // nothing for it); the payload is still reported.
    (
        "zip_encrypted_flag.pt",
        Dangerous,
        Some(("os.system", false)),
    ),
    // Attribute paths from allowed starts.
    (
        "dotted_torch_storage.pt",
        Dangerous,
        Some(("torch.storage.TypedStorage.__init__.__builtins__.get", true)),
    ),
    (
        "dotted_numpy_dtypes.pt",
        Dangerous,
        Some(("numpy.dtypes._add_dtype_helper.__builtins__.get", true)),
    ),
    // Calls that do not look like calls: OBJ and INST call the class;
    // NEWOBJ only runs its `__new__`, and BUILD fills the instance (a
    // construction, not a call: the class's code must be installed).
    (
        "obj_file_handler.pt",
        Dangerous,
        Some(("logging.StreamHandler", true)),
    ),
    (
        "inst_file_handler.pt",
        Dangerous,
        Some(("logging.StreamHandler", true)),
    ),
    (
        "newobj_file_handler.pt",
        Dangerous,
        Some(("logging.StreamHandler", true)),
    ),
    (
        "newobj_ex_file_handler.pt",
        Dangerous,
        Some(("logging.StreamHandler", true)),
    ),
    (
        "reconstructor_runs_base_init.pt",
        UnknownCall,
        Some(("mylib.hooks.Installer", true)),
    ),
    (
        "rebuild_from_type_calls_func.pt",
        UnknownCall,
        Some(("mylib.hooks.make_tensor", true)),
    ),
    (
        "build_setstate_of_unknown_class.pt",
        NeedsCode,
        Some(("mylib.state.Restorer", true)),
    ),
    // A pickle stored as bytes inside the checkpoint.
    (
        "nested_pickle_in_bytes.pt",
        Dangerous,
        Some(("os.system", false)),
    ),
    // Harmless: no false alarm.
    // Changing what a later lookup finds: BUILD on a module, and a
    // STACK_GLOBAL of names computed while unpickling.
    ("build_on_module.pkl", Dangerous, Some(("torch._utils", true))),
    (
        "stack_global_of_computed_names.pkl",
        Dangerous,
        Some((
            "<computed from torch._utils._rebuild_tensor>.<computed from torch._utils._rebuild_tensor>",
            true,
        )),
    ),
    (
        "stack_global_of_protocol_0_strings.pkl",
        Dangerous,
        Some(("os.system", true)),
    ),
    // Values that come back as what went in: TorchScript's wrappers,
    // builtins that call or return their arguments, a legacy persistent
    // id; and a later pickle of a tar member.
    (
        "torchscript_wrapper_returns_global.pt",
        UnknownCall,
        Some(("mypkg.tools.helper", true)),
    ),
    (
        "builtins_map_calls_its_function.pkl",
        UnknownCall,
        Some(("mypkg.tools.helper", true)),
    ),
    (
        "builtins_next_returns_its_member.pkl",
        UnknownCall,
        Some(("mypkg.tools.helper", true)),
    ),
    (
        "legacy_persistent_id_returns_global.pt",
        UnknownCall,
        Some(("mypkg.tools.helper", true)),
    ),
    (
        "tar_payload_in_second_storage_pickle.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    (
        "frame_read_crosses_boundary.pkl",
        Ambiguous,
        Some(("past the end of its FRAME", true)),
    ),
    // Benign look-alikes written by torch.save (fixtures/generate.py
    // --only scan_levels): full models and training checkpoints only
    // construct and fill their classes. They need the classes' code, and
    // are not payloads.
    (
        "benign_full_sequential.pt",
        NeedsCode,
        Some(("torch.nn.modules.container.Sequential", true)),
    ),
    (
        "benign_full_conv2d.pt",
        NeedsCode,
        Some(("torch.nn.modules.conv.Conv2d", true)),
    ),
    (
        "benign_full_gru.pt",
        NeedsCode,
        Some(("torch.nn.modules.rnn.GRU", true)),
    ),
    (
        "benign_full_main_class.pt",
        NeedsCode,
        Some(("__main__.ScanNet", true)),
    ),
    (
        "benign_full_legacy.pt",
        NeedsCode,
        Some(("__main__.ScanNet", true)),
    ),
    (
        "benign_full_partial_attribute.pt",
        NeedsCode,
        Some(("functools.partial", true)),
    ),
    (
        "benign_dict_of_modules.pt",
        NeedsCode,
        Some(("torch.nn.modules.linear.Linear", true)),
    ),
    (
        "benign_lightning_style.ckpt",
        NeedsCode,
        Some(("lightning.fabric.utilities.data.AttributeDict", true)),
    ),
    (
        "benign_yolo_style.pt",
        NeedsCode,
        Some(("models.yolo.DetectionModel", true)),
    ),
    // transformers' training_args.bin: a dataclass constructed, its enum
    // fields (a call of the enum class with the value: known data).
    (
        "benign_hf_training_args.bin",
        NeedsCode,
        Some(("transformers.training_args.TrainingArguments", true)),
    ),
    // numpy generators (whose constructors are given their bit generator
    // class), a compiled pattern, RNG states: plain data.
    ("benign_rng_states.pth", Clean, None),
    // 2025-2026 techniques, each made as its write-up makes it.
    ("t_pip_main.pkl", Dangerous, Some(("pip.main", true))),
    (
        "t_ensurepip_run_pip.pkl",
        Dangerous,
        Some(("ensurepip._run_pip", true)),
    ),
    (
        "t_pkgutil_resolve_name.pkl",
        Dangerous,
        Some(("pkgutil.resolve_name", true)),
    ),
    (
        "t_importlib_chain.pkl",
        Dangerous,
        Some(("importlib.import_module", true)),
    ),
    (
        "t_marshal_function.pkl",
        Dangerous,
        Some(("types.FunctionType", true)),
    ),
    (
        "t_collect_env_run.pkl",
        Dangerous,
        Some(("torch.utils.collect_env.run", true)),
    ),
    (
        "t_collect_env_run_and_read_all.pkl",
        Dangerous,
        Some(("torch.utils.collect_env.run_and_read_all", true)),
    ),
    (
        "t_spawnv_passfds.pkl",
        Dangerous,
        Some(("multiprocessing.util.spawnv_passfds", true)),
    ),
    (
        "t_fx_graph_module_exec.pkl",
        Dangerous,
        Some(("torch.fx.graph_module.reduce_graph_module", true)),
    ),
    (
        "t_config_module_pickle_loads.pkl",
        Dangerous,
        Some(("torch.utils._config_module.ConfigModule", true)),
    ),
    (
        "t_numpy_load_allow_pickle.pkl",
        Dangerous,
        Some(("numpy.load", true)),
    ),
    ("t_io_private_open.pkl", Dangerous, Some(("_io.open", true))),
    ("t_ssl_private.pkl", Dangerous, Some(("_ssl.RAND_status", true))),
    (
        "t_posixsubprocess.pkl",
        Dangerous,
        Some(("_posixsubprocess.fork_exec", true)),
    ),
    (
        "t_argparse_os_system.pkl",
        Dangerous,
        Some(("argparse._os.system", true)),
    ),
    (
        "t_torch_utils_os_system.pkl",
        Dangerous,
        Some(("torch._utils.os.system", true)),
    ),
    (
        "t_payload_before_unhashable_stack_global.pkl",
        Dangerous,
        Some(("os.system", true)),
    ),
    (
        "t_build_sets_setstate.pkl",
        Dangerous,
        Some(("mypkg.tools.Holder", true)),
    ),
    // A partial that is called runs its function: the partial is the
    // gadget, and what it wraps is called.
    (
        "t_partial_called.pkl",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    // Tar checkpoints as Python's tarfile names their members
    // (torch_tar.json): a PAX path, a GNU long name, the last of a name.
    ("t_tar_plain.pt", Dangerous, Some(("builtins.print", true))),
    // Behind a storage's raw bytes, and a tensor record's, which torch
    // steps over to unpickle what follows.
    (
        "t_tar_payload_after_raw_storage.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    (
        "t_tar_payload_after_raw_tensor.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    (
        "t_tar_pax_path.pt",
        Dangerous,
        Some(("a PAX or GNU long-name record", true)),
    ),
    (
        "t_tar_pax_path_hides.pt",
        Dangerous,
        Some(("a PAX or GNU long-name record", true)),
    ),
    (
        "t_tar_duplicate_last_payload.pt",
        Dangerous,
        Some(("two members named \"pickle\"", true)),
    ),
    (
        "t_tar_duplicate_first_payload.pt",
        Dangerous,
        Some(("two members named \"pickle\"", true)),
    ),
    (
        "t_tar_gnu_long_name.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    // Records read as tarfile reads them: a PAX value's last byte dropped
    // whatever it is, a PAX header or GNU long name parsed over its whole
    // block whatever its size says.
    (
        "t_tar_pax_value_last_byte.pt",
        Dangerous,
        Some(("a PAX or GNU long-name record", true)),
    ),
    (
        "t_tar_pax_header_short_size.pt",
        Dangerous,
        Some(("a PAX or GNU long-name record", true)),
    ),
    (
        "t_tar_gnu_long_name_short_size.pt",
        Dangerous,
        Some(("a PAX or GNU long-name record", true)),
    ),
    // Links among the members torch extracts to disk (torch_tar_links.json):
    // a hard link's target gets the member's mode, a symbolic link's is
    // unpickled, whatever the archive holds under the target's name.
    (
        "t_tarlink_hard_storages_relative.pt",
        Dangerous,
        Some(("torch extracts this member, a link", true)),
    ),
    (
        "t_tarlink_hard_tensors_absolute.pt",
        Dangerous,
        Some(("torch extracts this member, a link", true)),
    ),
    (
        "t_tarlink_symbolic_storages.pt",
        Dangerous,
        Some(("torch extracts this member, a link", true)),
    ),
    // Names as torch's zip reader finds them, letter case aside
    // (torch_case.json): DATA.PKL is the pickle torch reads.
    (
        "zcase_upper_data_pkl_payload.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    ("zcase_upper_data_pkl.pt", Clean, None),
    ("zcase_upper_folder.pt", Clean, None),
    ("zcase_upper_data_folder.pt", Clean, None),
    ("zcase_upper_byteorder_big.pt", Clean, None),
    (
        "zcase_duplicate_lower_first.pt",
        Ambiguous,
        Some(("without regard to letter case", true)),
    ),
    (
        "zcase_duplicate_upper_first.pt",
        Ambiguous,
        Some(("without regard to letter case", true)),
    ),
    // Enum members (torch_enum.json): looked up by a call of their class,
    // at needs-code when the class is of a package or `__main__` (with a
    // model of it, or alone), an unknown call when it is of the standard
    // library.
    ("en_model_enum.pt", NeedsCode, None),
    ("en_main_enum.pt", NeedsCode, None),
    ("en_model_class_call.pt", NeedsCode, None),
    ("en_lone_enum.pt", NeedsCode, None),
    (
        "en_class_given_path.pt",
        UnknownCall,
        Some(("ptload_enum_model.runner.Runner", true)),
    ),
    // Functions kept in hashed values (a namedtuple in a set, a frozen
    // dataclass as a key): hashing calls none of them.
    ("en_namedtuple_set.pt", NeedsCode, None),
    ("en_frozen_key.pt", NeedsCode, None),
    // A standard library class called with a number: no lookup (any file
    // can name it; its enums are listed by name), a library call no
    // checkpoint makes, whatever this one does.
    (
        "en_stdlib_call.pt",
        Dangerous,
        Some(("calendar.TextCalendar", true)),
    ),
    // Calls the unpickler makes (torch_implicit.json): APPEND / APPENDS
    // call an instance attribute BUILD set.
    ("ia_append_attr.pkl", Dangerous, Some(("logging.warning", true))),
    ("ia_extend_attr.pkl", Dangerous, Some(("logging.warning", true))),
    ("ia_slotstate.pkl", Dangerous, Some(("logging.warning", true))),
    ("ia_partial_attr.pkl", Dangerous, Some(("functools.partial", true))),
    ("ia_benign_deque.pkl", Clean, None),
    (
        "t_plain_pickle_renamed.bin",
        Dangerous,
        Some(("posix.system", true)),
    ),
    (
        "t_protocol_0_in_zip.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    // numpy.load(allow_pickle=True) runs an object array's pickle; torch.load
    // reads neither file.
    (
        "t_npy_object_array.npy",
        Dangerous,
        Some(("posix.system", false)),
    ),
    (
        "t_npz_object_array.npz",
        Dangerous,
        Some(("posix.system", false)),
    ),
    // Duplicate data.pkl entries in three orders (torch reads the last in
    // the central directory) and flag bits on the payload's data.pkl
    // (torch loads 0x8, 0x800, 0x4000, refuses 0x1, 0x40, 0x2000; the
    // payload is reported either way). See torch_levels.json.
    (
        "z_duplicate_payload_first.pt",
        Dangerous,
        Some(("duplicate entry name", true)),
    ),
    (
        "z_duplicate_payload_second.pt",
        Dangerous,
        Some(("duplicate entry name", true)),
    ),
    (
        "z_duplicate_payload_at_end.pt",
        Dangerous,
        Some(("duplicate entry name", true)),
    ),
    (
        "z_flag_0x0001_payload.pt",
        Dangerous,
        Some(("builtins.print", false)),
    ),
    (
        "z_flag_0x0040_payload.pt",
        Dangerous,
        Some(("builtins.print", false)),
    ),
    (
        "z_flag_0x0008_payload.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    (
        "z_flag_0x0800_payload.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    (
        "z_flag_0x2000_payload.pt",
        Dangerous,
        Some(("builtins.print", false)),
    ),
    (
        "z_flag_0x4000_payload.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    // torch loads an archive whose unrelated entry has a broken local
    // header: the scan reads it too, and reaches the payload.
    (
        "z_unrelated_broken_local_header_payload.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    // Callables by effect (a fresh corpus labelled by torch 2.15 ran each):
    // files written, processes started, strings evaluated, names imported,
    // callables run later or wrapped: dangerous, so that `--fail-on
    // dangerous` stops them too.
    ("c_codecs_open.pkl", Dangerous, Some(("codecs.open", true))),
    ("c_sqlite3_connect.pkl", Dangerous, Some(("sqlite3.connect", true))),
    ("c_py_compile.pkl", Dangerous, Some(("py_compile.compile", true))),
    (
        "c_lightning_save_hparams.pkl",
        Dangerous,
        Some(("pytorch_lightning.core.saving.save_hparams_to_yaml", true)),
    ),
    (
        "c_subprocess_helper.pkl",
        Dangerous,
        Some(("huggingface_hub.utils._subprocess.run_subprocess", true)),
    ),
    ("c_sympy_expand.pkl", Dangerous, Some(("sympy.expand", true))),
    (
        "c_jinja2_import_string.pkl",
        Dangerous,
        Some(("jinja2.utils.import_string", true)),
    ),
    (
        "c_warnings_getcategory.pkl",
        Dangerous,
        Some(("warnings._getcategory", true)),
    ),
    (
        "c_typing_get_type_hints.pkl",
        Dangerous,
        Some(("typing.get_type_hints", true)),
    ),
    ("c_atexit_register.pkl", Dangerous, Some(("atexit.register", true))),
    ("c_numpy_vectorize.pkl", Dangerous, Some(("numpy.vectorize", true))),
    (
        "c_functools_lru_cache.pkl",
        Dangerous,
        Some(("functools.lru_cache", true)),
    ),
    ("c_package_main.pkl", Dangerous, Some(("unittest.__main__.main", true))),
    ("c_import_side_effect.pkl", Dangerous, Some(("this.s", true))),
    (
        "c_type_namespace_setstate.pkl",
        Dangerous,
        Some(("builtins.type", true)),
    ),
    ("c_type_of_none.pkl", Clean, None),
    ("c_pyio_fileio.pkl", Dangerous, Some(("_pyio.FileIO", true))),
    ("c_torch_from_file.pkl", Dangerous, Some(("torch.from_file", true))),
    (
        "c_import_dotted_name.pkl",
        Dangerous,
        Some(("torch._utils._import_dotted_name", true)),
    ),
    ("c_add_extension.pkl", Dangerous, Some(("copyreg.add_extension", true))),
    (
        "c_logging_file_handler.pkl",
        Dangerous,
        Some(("logging.FileHandler", true)),
    ),
    ("c_py2_anydbm_open.pkl", Dangerous, Some(("dbm.open", true))),
    ("c_http_status_enum.pkl", Clean, None),
    // A third fresh corpus (torch 2.15 ran each payload).
    (
        "c_dataclasses_create_fn.pkl",
        Dangerous,
        Some(("dataclasses._create_fn", true)),
    ),
    (
        "c_storage_weakref.pkl",
        Dangerous,
        Some(("torch.multiprocessing.reductions.StorageWeakRef", true)),
    ),
    (
        "c_dataloader.pkl",
        Dangerous,
        Some(("torch.utils.data.dataloader.DataLoader", true)),
    ),
    (
        "c_itertools_takewhile.pkl",
        Dangerous,
        Some(("itertools.takewhile", true)),
    ),
    ("c_heapq_nsmallest.pkl", Dangerous, Some(("heapq.nsmallest", true))),
    (
        "c_lightning_logger_writer.pkl",
        Dangerous,
        Some(("pytorch_lightning.loggers.csv_logs.ExperimentWriter", true)),
    ),
    ("c_numpy_frombuffer.pkl", Clean, None),
    (
        "torchscript_setstate_from_file.pt",
        Dangerous,
        Some(("torch.from_file", true)),
    ),
    ("builtins_len.pt", Clean, None),
    ("torchscript_helpers.pt", Clean, None),
    // TorchScript 1.x modules (PyTorch's iOS demo models): `__constants__`
    // and `__overloads__` in a `__torch__` class's state are attributes
    // TorchScript's loader sets, not a smuggled `__setstate__`.
    ("torchscript_1x_module_attributes.pt", Clean, None),
    // The same place holding os.system: it is in the file.
    (
        "torchscript_1x_dunder_holds_payload.pt",
        Dangerous,
        Some(("os.system", true)),
    ),
    // An entry torch never reads whose local header is broken: torch
    // loads the file, and so do scan and open (torch_zip.json).
    ("zb_benign_unrelated_broken_local_header.pt", Clean, None),
    // A shadow data.pkl only local headers show: torch goes by the central
    // directory and reads the clean one (torch_zip.json).
    (
        "zh_shadow_data_pkl_between_entries.pt",
        Dangerous,
        Some(("the central directory does not list", true)),
    ),
    (
        "zh_shadow_data_pkl_first.pt",
        Dangerous,
        Some(("the central directory does not list", true)),
    ),
    // Two archives end to end: torch reads what the second's recorded
    // offsets land on, counted from byte 0 (torch_zip.json); readers
    // that shift them, or take the first archive, read another.
    (
        "zc_same_layout_clean_clean.pt",
        Ambiguous,
        Some(("the directory found from the end records offsets", true)),
    ),
    (
        "zc_sizes_differ_clean_clean.pt",
        Ambiguous,
        Some(("the directory found from the end records offsets", true)),
    ),
    (
        "zc_sizes_differ_payload_first.pt",
        Dangerous,
        Some(("the directory found from the end records offsets", true)),
    ),
    (
        "zc_sizes_differ_payload_second.pt",
        Dangerous,
        Some(("the directory found from the end records offsets", true)),
    ),
    (
        "zc_same_layout_payload_first.pt",
        Dangerous,
        Some(("the directory found from the end records offsets", true)),
    ),
    (
        "zc_same_layout_payload_second.pt",
        Dangerous,
        Some(("the directory found from the end records offsets", true)),
    ),
    (
        "zc_same_layout_payload_both.pt",
        Dangerous,
        Some(("the directory found from the end records offsets", true)),
    ),
    (
        "zc_offsets_from_start_payload_first.pt",
        Dangerous,
        Some(("a second archive follows", true)),
    ),
    (
        "zc_offsets_from_start_payload_second.pt",
        Dangerous,
        Some(("a second archive follows", true)),
    ),
    // State changed, classes made, lookups answered (torch_state.json).
    (
        "ss_ext_registry.pkl",
        Dangerous,
        Some(("copyreg._inverted_registry", true)),
    ),
    ("ss_newobj_type.pkl", Dangerous, Some(("builtins.type", true))),
    (
        "ss_getattr_items.pkl",
        Dangerous,
        Some(("logging.warning", true)),
    ),
    (
        "ss_append_calls_extend.pkl",
        Dangerous,
        Some(("logging.warning", true)),
    ),
    (
        "ss_setitem_policy.pkl",
        Dangerous,
        Some(("logging.warning", true)),
    ),
    ("ss_tar_v7.pt", Dangerous, Some(("logging.warning", true))),
    (
        "ss_repr_calls_attribute.pkl",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_reversed_list.pkl",
        Dangerous,
        Some(("logging.warning", true)),
    ),
    (
        "ss_bound_method_update.pkl",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    ("ss_build_bytes_key.pkl", Dangerous, Some(("argparse.Namespace", true))),
    (
        "ss_legacy_magic_instance.pt",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_legacy_hex_protocol.pt",
        Dangerous,
        Some(("logging.warning", true)),
    ),
    ("ss_script_save.pt", Dangerous, Some(("torch.save", true))),
    ("ss_script_save_caps.pt", Dangerous, Some(("torch.save", true))),
    (
        "ss_optimizer_setstate.pt",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_made_mapping_key.pt",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_dropped_finalizer.pt",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_left_on_stack.pt",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_second_proto.pt",
        Dangerous,
        Some(("functools.reduce", true)),
    ),
    // Callables a nineteenth blind corpus ran, each called by a state
    // dict's extra value; torch_callables.json records what each did
    // under torch.
    (
        "cb_filestore.pt",
        Dangerous,
        Some(("torch._C._distributed_c10d.FileStore", true)),
    ),
    (
        "cb_tcpstore.pt",
        Dangerous,
        Some(("torch._C._distributed_c10d.TCPStore", true)),
    ),
    (
        "cb_tensor_to_object.pt",
        Dangerous,
        Some(("torch.distributed.distributed_c10d._tensor_to_object", true)),
    ),
    (
        "cb_start_processes.pt",
        Dangerous,
        Some(("torch.multiprocessing.spawn.start_processes", true)),
    ),
    (
        "cb_unittest_program.pt",
        Dangerous,
        Some(("unittest.main.TestProgram", true)),
    ),
    (
        "cb_check_module_exists.pt",
        Dangerous,
        Some(("torch.utils._import_utils._check_module_exists", true)),
    ),
    (
        "cb_datasource_open.pt",
        Dangerous,
        Some(("numpy.lib._datasource.open", true)),
    ),
    ("cb_mpmath_identify.pt", Dangerous, Some(("mpmath.identify", true))),
    (
        "cb_pygments_lexer.pt",
        Dangerous,
        Some(("pygments.lexers.load_lexer_from_file", true)),
    ),
    // And a twentieth corpus's, whose names say nothing of their effect.
    (
        "cb_resolve_annotations.pt",
        Dangerous,
        Some(("pydantic.v1.typing.resolve_annotations", true)),
    ),
    (
        "cb_inlined_forward.pt",
        Dangerous,
        Some(("torch._precompile._make_inlined_forward", true)),
    ),
    (
        "cb_import_string_logic.pt",
        Dangerous,
        Some(("pydantic._internal._validators._import_string_logic", true)),
    ),
    (
        "cb_emit_importable.pt",
        Dangerous,
        Some(("torch._functorch._aot_autograd.source_emit._emit_importable", true)),
    ),
    // And a twenty-second's: library callables under the names of the
    // modules that import them, and a helper given a function to call
    // (uncatalogued library calls).
    (
        "cb_alias_open.pt",
        Dangerous,
        Some(("tokenize._builtin_open", true)),
    ),
    (
        "cb_alias_call.pt",
        Dangerous,
        Some((
            "pytorch_lightning.trainer.connectors.signal_connector.call",
            true,
        )),
    ),
    (
        "cb_alias_mkstemp.pt",
        Dangerous,
        Some(("torch._numpy.testing.utils.mkstemp", true)),
    ),
    (
        "cb_tree_map_logs.pt",
        Dangerous,
        Some(("torch._logging._init_logs", true)),
    ),
    // A twenty-third's: a library's mapping whose lookup imports what its
    // state names, iterated by OrderedDict (its methods run: library code
    // no checkpoint runs).
    (
        "cb_lazy_mapping.pt",
        Dangerous,
        Some(("transformers.processing_utils._LazyAutoProcessorMapping", true)),
    ),
    // A twenty-fourth's: CPython's test suite re-exports `Popen`, called
    // with one tuple of words (no enum lookup: library code).
    ("cb_test_suite_popen.pt", Dangerous, Some(("test.test_gzip.Popen", true))),
    (
        "cb_test_module_named.pt",
        Dangerous,
        Some(("test._test_embed_structseq.TestStructSeq", true)),
    ),
    (
        "cb_defaultdict_factory.pt",
        Dangerous,
        Some(("cgi.print_directory", true)),
    ),
    (
        "cb_state_lazy_mapping.pt",
        Dangerous,
        Some(("transformers.processing_utils._LazyAutoProcessorMapping", true)),
    ),
    (
        "cb_named_table_pairs.pt",
        Dangerous,
        Some(("transformers.MODEL_FOR_TABLE_QUESTION_ANSWERING_MAPPING", true)),
    ),
    // A twenty-eighth's: numpy's `testing` reached as numpy's attribute
    // (its lazy `__getattr__` imports it), a pattern compiled with
    // `re.DEBUG`, and `_codecs.encode` with a codec that imports its module.
    ("cb_submodule_by_attribute.pt", Dangerous, Some(("numpy.testing", true))),
    ("cb_re_debug.pt", Dangerous, Some(("re._compile", true))),
    ("cb_codec_import.pt", Dangerous, Some(("_codecs.encode", true))),
    // A thirtieth's: pytree's registration, reached as a name of the
    // module of torch's result types.
    (
        "cb_result_types_pytree.pt",
        Dangerous,
        Some(("torch.return_types.register_pytree_node", true)),
    ),
    // A thirty-first's: a generic alias called, and functions in the
    // attribute dicts of a `Counter` and a namespace, under the names of
    // the methods their reprs call.
    ("cb_generic_alias_called.pt", Dangerous, Some(("builtins.print", true))),
    ("cb_counter_method_shadowed.pt", Dangerous, Some(("builtins.print", true))),
    ("cb_namespace_method_shadowed.pt", Dangerous, Some(("builtins.print", true))),
    // A thirty-second's: a partial made by `copyreg.__newobj__`, and a
    // namespace as a state dict's `_metadata` (its `get` is called).
    ("cb_newobj_partial_shadowing.pt", Dangerous, Some(("builtins.print", true))),
    ("cb_namespace_as_metadata.pt", Dangerous, Some(("builtins.print", true))),
    // A thirty-third's: a wrapper in a `Logger`'s dict, under the name of
    // the method its repr calls.
    ("cb_logger_method_shadowed.pt", Dangerous, Some(("builtins.print", true))),
    // A thirty-fourth's: a standard library object made without its
    // `__init__` (a `FrameSummary` that reads the file it names when
    // compared); a thirty-fifth's: a function under the name of a method
    // torch's or a library's code calls on the object.
    (
        "cb_stdlib_frame_summary.pt",
        Dangerous,
        Some(("traceback.FrameSummary", true)),
    ),
    (
        "cb_function_as_tensor_method.pt",
        Dangerous,
        Some(("sysconfig._main", true)),
    ),
    (
        "cb_function_as_module_method.pt",
        Dangerous,
        Some(("sysconfig._main", true)),
    ),
    (
        "cb_function_as_config_method.pt",
        Dangerous,
        Some(("sysconfig._main", true)),
    ),
    (
        "cb_function_as_mapping_method.pt",
        Dangerous,
        Some(("sysconfig._main", true)),
    ),
    // A thirty-sixth's: a mapping method of torch's `ParameterDict`, a
    // feature extractor's `to_json_string`, the `numel` and `size` a
    // distribution's repr calls on a parameter that is a namespace; a
    // thirty-seventh's: another package's function held by a networkx
    // view, which calls it on each key.
    (
        "cb_function_as_items_of_module.pt",
        Dangerous,
        Some(("sysconfig._main", true)),
    ),
    (
        "cb_function_as_extractor_method.pt",
        Dangerous,
        Some(("sysconfig._main", true)),
    ),
    (
        "cb_namespace_as_distribution_parameter.pt",
        Dangerous,
        Some(("sysconfig._main", true)),
    ),
    (
        "cb_library_view_filter.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    // A thirty-ninth's: a data pipe calling the function it holds; a
    // fortieth's: a tool of torch's doing so (a lazy log string).
    (
        "cb_data_pipe_function.pt",
        Dangerous,
        Some(("sysconfig._main", true)),
    ),
    (
        "cb_torch_tool_function.pt",
        Dangerous,
        Some(("builtins.print", true)),
    ),
    // And a twenty-ninth's: a scripted `__setstate__` calling an op of
    // torch's `debugprims` namespace, whose kernel is Python and reads
    // files (torch_ts_ops.json).
    ("tsop_debugprims.pt", Dangerous, Some(("torch.ops.debugprims", true))),
    // The twenty-ninth's other kind: a scripted `__setstate__` that
    // prints (through a method of its own) or warns; one that prints only
    // in `forward`, which a load does not run, is clean.
    ("tsop_setstate_print.pt", UnknownCall, Some(("builtins.print", true))),
    ("tsop_setstate_warn.pt", UnknownCall, Some(("torch.warn", true))),
    ("tsop_forward_print.pt", Clean, None),
    (
        "ss_additems_object.pkl",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_state_namespace_keys.pt",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_counter_member_hash.pt",
        Dangerous,
        Some(("functools.partial", true)),
    ),
    (
        "ss_deep_chain_append.pt",
        Dangerous,
        Some(("functools.partial", true)),
    ),
];

/// A file scanned from disk (its zip's local headers and the small gaps
/// between its records read with positioned reads where the records lie
/// far apart) is reported as its bytes are.
#[test]
fn a_file_scans_as_its_bytes() {
    let mut files = Vec::new();
    for dir in ["tests/scan", "fixtures/files", "tests/hostile"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() && path.extension().is_none_or(|e| e != "json") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 300, "{}", files.len());
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let from_file = scan_file(&path, &Limits::default(), false).unwrap();
        let from_bytes = ptload_reader::scan::scan_bytes(&bytes, &Limits::default());
        assert_eq!(
            format!("{from_file:?}"),
            format!("{from_bytes:?}"),
            "{}",
            path.display()
        );
    }
    // An archive whose records lie far apart (read with positioned reads),
    // and the same with a local header's signature written over each
    // 16-byte data descriptor between its records (found in the gaps,
    // too short to hold a header): alike both ways.
    let wide = std::fs::read(root().join("fixtures/files/llama_wide.pt")).unwrap();
    let mut marked = wide.clone();
    let mut descriptors = 0;
    let mut at = 0;
    while let Some(i) = marked
        .get(at..)
        .and_then(|m| m.windows(4).position(|w| w == b"PK\x07\x08"))
    {
        marked[at + i + 2..at + i + 4].copy_from_slice(b"\x03\x04");
        descriptors += 1;
        at += i + 4;
    }
    assert!(descriptors > 10, "{descriptors}");
    let dir = std::env::temp_dir().join(format!("ptload-scan-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in [("wide.pt", &wide), ("marked.pt", &marked)] {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let from_file = scan_file(&path, &Limits::default(), false).unwrap();
        let from_bytes = ptload_reader::scan::scan_bytes(bytes, &Limits::default());
        assert_eq!(
            format!("{from_file:?}"),
            format!("{from_bytes:?}"),
            "{name}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Names of torch's modules that the scanner takes as data are those torch
/// 2.15 defines as such (torch_data_names.json: every name of each
/// module, its type and the module that defines it): the result types
/// in `all_return_types`, and the public functions torch defines in
/// `torch.nn.functional` and `torch.nn.init`, not their imports, type
/// helpers or dispatch checks. Every other name is not data, and a call
/// of one is dangerous (pytree's registration, `numpy` as `np`).
#[test]
fn names_of_torch_modules_are_data_as_torch_defines_them() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_data_names.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let result_types: BTreeSet<&str> = doc["all_return_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(result_types.len(), 67);
    let mut data = 0;
    for module in ["torch.return_types", "torch.nn.functional", "torch.nn.init"] {
        let names = doc[module].as_object().unwrap();
        assert!(names.len() > 40, "{module}");
        for (name, facts) in names {
            let defined_by = facts["module"].as_str().unwrap_or("");
            let function = matches!(
                facts["type"].as_str().unwrap(),
                "function" | "builtin_function_or_method"
            ) && matches!(
                defined_by,
                "torch.nn.functional" | "torch.nn.init" | "torch" | "torch._C._nn"
            ) && !name.starts_with('_');
            let expected = if module == "torch.return_types" {
                result_types.contains(name.as_str())
            } else {
                function
            };
            let class = ptload_reader::scan::classify(module, name);
            assert_eq!(
                class == GlobalClass::Data,
                expected,
                "{module}.{name} ({facts}): {class:?}"
            );
            data += usize::from(expected);
            if !expected {
                let report = called_with_a_string(&format!("{module}\n{name}\n"));
                assert_eq!(report.verdict(), Dangerous, "{module}.{name}: {report:#?}");
            }
        }
    }
    assert_eq!(data, 67 + 135 + 26);
}

/// A function in the attribute dict of an instance of data shadows the
/// method of that name that library code calls (an `OrderedDict`'s
/// `keys` when a state dict is loaded, a `Counter`'s `most_common` in its
/// repr, a model output's `values` when pytree flattens it): called. A
/// namespace's dict is the user's (a parser's `func`): there only its
/// class's own methods shadow. A generic alias called calls its origin,
/// however it was made; one only kept (`list[int]`) is data.
#[test]
fn data_keeps_no_functions_and_an_alias_calls_its_origin() {
    use ptload_reader::scan::scan_bytes;
    let items = |key: &str, value: &[u8]| {
        let mut out = s(key);
        out.extend_from_slice(value);
        out.push(b's');
        out
    };
    let opener: &[u8] = b"ctokenize\n_builtin_open\n";
    let user_function: &[u8] = b"ctrain_script\nmain\n";
    let partial_of_opener = [&b"cfunctools\npartial\n"[..], opener, &s("x"), b"\x86R"].concat();
    let newobj_partial = [
        &b"ccopyreg\n__newobj__\ncfunctools\npartial\n"[..],
        opener,
        &s("x"),
        b"\x87R",
    ]
    .concat();
    for (what, class, key, value, verdict) in [
        (
            "OrderedDict keys",
            &b"ccollections\nOrderedDict\n"[..],
            "keys",
            opener,
            Dangerous,
        ),
        (
            "Counter most_common",
            b"ccollections\nCounter\n",
            "most_common",
            opener,
            Dangerous,
        ),
        (
            "a model output's values",
            b"ctransformers.modeling_outputs\nBaseModelOutput\n",
            "values",
            opener,
            Dangerous,
        ),
        (
            "an address's helper",
            b"cipaddress\nIPv4Interface\n",
            "_string_from_ip_int",
            opener,
            Dangerous,
        ),
        (
            "Namespace _get_kwargs",
            b"cargparse\nNamespace\n",
            "_get_kwargs",
            opener,
            Dangerous,
        ),
        (
            "Namespace func",
            b"cargparse\nNamespace\n",
            "func",
            user_function,
            NeedsCode,
        ),
        (
            "SimpleNamespace func",
            b"ctypes\nSimpleNamespace\n",
            "func",
            user_function,
            NeedsCode,
        ),
        // A namespace taken for a mapping (a state dict's `_metadata`):
        // `load_state_dict` calls its `get`.
        (
            "Namespace get",
            b"cargparse\nNamespace\n",
            "get",
            opener,
            Dangerous,
        ),
        // torch asks each op's argument for `__torch_function__` by
        // `getattr`: an instance's own entry is what it calls.
        (
            "SimpleNamespace __torch_function__",
            b"ctypes\nSimpleNamespace\n",
            "__torch_function__",
            opener,
            Dangerous,
        ),
        // Another class of the standard library: a wrapper in its dict is
        // what its own code calls on itself (`Logger.__repr__` calls
        // `getEffectiveLevel`); its functions and classes are its own.
        (
            "a Logger's getEffectiveLevel",
            b"clogging\nLogger\n",
            "getEffectiveLevel",
            &partial_of_opener[..],
            Dangerous,
        ),
        // (Such an object, made without its `__init__`, is itself a
        // library object acting on the file's state.)
        (
            "a parser's formatter_class",
            b"cargparse\nArgumentParser\n",
            "formatter_class",
            b"cargparse\nHelpFormatter\n",
            Dangerous,
        ),
        // A partial made by `copyreg.__newobj__` wraps its function as one
        // made by REDUCE or NEWOBJ does.
        (
            "OrderedDict keys, a partial by __newobj__",
            b"ccollections\nOrderedDict\n",
            "keys",
            &newobj_partial[..],
            Dangerous,
        ),
    ] {
        // The object the load returns, in a dict (not the first pickle,
        // which torch compares with its magic number).
        let object = [
            b"}",
            &s("args")[..],
            &built(class, &items(key, value)),
            b"s",
        ]
        .concat();
        let report = scan_bytes(&legacy_file(&object, b"]"), &Limits::default());
        assert!(
            report.pickles.iter().all(|p| p.complete),
            "{what}: {report:#?}"
        );
        assert_eq!(report.verdict(), verdict, "{what}: {report:#?}");
    }
    // `GenericAlias(tokenize._builtin_open, ())()`, by REDUCE and by NEWOBJ; and
    // `list[int]` kept.
    let alias: &[u8] = b"ctypes\nGenericAlias\n";
    let by_reduce = [alias, b"ctokenize\n_builtin_open\n)\x86R)R"].concat();
    let by_newobj = [alias, b"ctokenize\n_builtin_open\n)\x86\x81)R"].concat();
    for (what, body) in [("REDUCE", by_reduce), ("NEWOBJ", by_newobj)] {
        let report = scan_bytes(&pickle(&[&body]), &Limits::default());
        assert_eq!(report.verdict(), Dangerous, "{what}: {report:#?}");
        assert!(
            report.pickles[0]
                .globals
                .iter()
                .any(|g| g.path() == "tokenize._builtin_open"
                    && g.usage == ptload_reader::scan::Usage::Called),
            "{what}: {report:#?}"
        );
    }
    let kept = [alias, b"cbuiltins\nlist\ncbuiltins\nint\n\x85\x86R"].concat();
    let report = scan_bytes(&pickle(&[&kept]), &Limits::default());
    assert_eq!(report.verdict(), Clean, "{report:#?}");
}

#[test]
fn every_file_has_a_verdict() {
    let files: BTreeSet<String> = std::fs::read_dir(root().join("tests/scan"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".json"))
        .collect();
    let named: BTreeSet<String> = CASES.iter().map(|c| c.0.to_owned()).collect();
    assert_eq!(files, named, "tests/scan and CASES disagree");
}

#[test]
fn verdicts() {
    for (name, verdict, finding) in CASES {
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.verdict(), *verdict, "{name}: {report:#?}");
        check_finding(name, &report, *verdict, *finding);
    }
}

/// The finding that makes `verdict` is in `report`, at the verdict's
/// level; with none, nothing fails the default line.
fn check_finding(
    name: &str,
    report: &ptload_reader::scan::ScanReport,
    verdict: Verdict,
    finding: Finding,
) {
    let level = verdict.level().unwrap_or(Level::Clean);
    let findings: Vec<(String, bool)> = report
        .pickles
        .iter()
        .flat_map(|p| p.globals.iter().map(move |g| (g, p.reachable)))
        .filter(|(g, _)| g.level() == level && level > Level::Clean)
        .map(|(g, reachable)| (g.path(), reachable))
        .collect();
    match finding {
        // A global at the verdict's level; or words of an effect of the
        // container's reading (dangerous), or of an ambiguity (at its
        // level or below a payload's).
        Some((what, reachable)) => {
            let global = findings.contains(&(what.to_owned(), reachable));
            let effect =
                level == Level::Dangerous && report.effects.iter().any(|e| e.what.contains(what));
            let ambiguity = level >= Level::Ambiguous
                && report.ambiguities.iter().any(|a| a.what.contains(what));
            assert!(
                global || effect || ambiguity,
                "{name}: {what:?} (reachable: {reachable}) at {level:?} not in {findings:?}, \
                 {:?} or {:?}",
                report.effects,
                report.ambiguities
            );
        }
        None => assert!(
            report.level() < Level::UnknownCall,
            "{name}: {:?}",
            report.level()
        ),
    }
}

/// Python 2 names as Python 3 reads them.
fn python3_name(path: &str) -> String {
    // The Python 2 modules the corpus names (torch's find_class sees the
    // name as written, and maps it as the scanner does).
    for (old, new) in [
        ("__builtin__.", "builtins."),
        ("copy_reg.", "copyreg."),
        ("anydbm.", "dbm."),
    ] {
        if let Some(rest) = path.strip_prefix(old) {
            return format!("{new}{rest}");
        }
    }
    path.to_owned()
}

#[test]
fn reports_every_global_torch_would_resolve() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_reach.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = doc.as_object().unwrap();
    assert!(files.len() > 100, "{} files", files.len());
    for (file, facts) in files {
        let report = scan_file(&root().join(file), &Limits::default(), false)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(report.layout, facts["layout"], "{file}: layout");
        let reached: BTreeSet<String> = report
            .pickles
            .iter()
            .filter(|p| p.reachable)
            .flat_map(|p| p.globals.iter().map(|g| python3_name(&g.path())))
            .collect();
        for name in facts["globals"].as_array().unwrap() {
            let name = python3_name(name.as_str().unwrap());
            assert!(
                reached.contains(&name),
                "{file}: torch resolves {name}; the scanner reports {reached:?}"
            );
        }
    }
}

#[test]
fn a_pickle_before_the_zip_is_judged_as_torch_reads_it() {
    use ptload_reader::{Checkpoint, ErrorKind, OpenOptions, Policy};
    let path = root().join("tests/scan/polyglot_pickle_then_zip.pt");
    // weights_only=True refuses it: torch unpickles the leading pickle.
    let e = OpenOptions::new()
        .policy(Policy::Strict)
        .open(&path)
        .expect_err("strict");
    assert_eq!(e.kind(), ErrorKind::UnsupportedGlobal);
    assert!(e.to_string().contains("os.system"), "{e}");
    // os is never allowed, even by name.
    let e = OpenOptions::new()
        .policy(Policy::Strict)
        .allow_global("os.system")
        .open(&path)
        .expect_err("strict, allowed by name");
    assert_eq!(e.kind(), ErrorKind::UnsupportedGlobal);
    // The default policy reads the archive and names the leading global.
    let ckpt = Checkpoint::open(&path).expect("default");
    assert_eq!(ckpt.len(), 1);
    let suspicious: Vec<String> = ckpt
        .suspicious()
        .expect("scanned")
        .iter()
        .map(|g| g.path())
        .collect();
    assert_eq!(suspicious, ["os.system"]);
    // A prefix that is no pickle (torch cannot read the file either) leaves
    // the archive readable under both policies.
    let prefixed = root().join("fixtures/files/prefixed.pt");
    assert!(OpenOptions::new()
        .policy(Policy::Strict)
        .open(&prefixed)
        .is_ok());
}

/// No false alarm on anything torch wrote for the fixtures (TorchScript
/// archives, scripted and traced, quantized ones included, with their
/// mangled class names): only the whole pickled module, whose classes are
/// instantiated from Python code, is flagged.
#[test]
fn torch_written_fixtures_are_clean() {
    let dir = root().join("fixtures/files");
    let mut names: Vec<String> = Vec::new();
    for e in std::fs::read_dir(&dir).expect("fixtures") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        if !dir.join(&name).is_dir() {
            names.push(name);
            continue;
        }
        // The checkpoints of a set (shards, model-parallel ranks).
        for f in std::fs::read_dir(dir.join(&name)).expect("set") {
            let file = f.expect("entry").file_name().to_string_lossy().into_owned();
            if file.ends_with(".bin") || file.ends_with(".pth") {
                names.push(format!("{name}/{file}"));
            }
        }
    }
    names.sort();
    assert!(names.len() > 30, "{names:?}");
    for name in names {
        let report = scan_file(&dir.join(&name), &Limits::default(), false)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = match name.as_str() {
            "whole_module.pt" => NeedsCode,
            // No pickle torch could reach: what torch.load fails on.
            "download.html.pt" | "empty.pt" | "lfs_pointer.pt" | "prefixed.pt" | "random.bin"
            | "truncated.pt" => Unreadable,
            // safetensors files (weights.safetensors.pt is one under a torch
            // name): no pickle, a header that reads, nothing that can run.
            _ => Clean,
        };
        let found: Vec<String> = report
            .pickles
            .iter()
            .flat_map(|p| p.globals.iter())
            .filter(|g| g.is_finding())
            .map(|g| g.path())
            .collect();
        assert_eq!(report.verdict(), want, "{name}: {found:?}");
        if want == Clean {
            assert!(found.is_empty(), "{name}: {found:?}");
        }
    }
}

/// What torch 2.15 did with each file (`tests/scan/torch_levels.json`):
/// every benign file loads with `weights_only=False`; the scanner passes
/// each at the default line (clean or needs-code), and reports no call of
/// anything beyond plain data in it. A called partial's function is called.
#[test]
fn benign_look_alikes_pass_and_calls_stay_calls() {
    use ptload_reader::scan::Usage;
    let text = std::fs::read_to_string(root().join("tests/scan/torch_levels.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = doc.as_object().unwrap();
    let benign: Vec<&String> = files.keys().filter(|n| n.starts_with("benign_")).collect();
    assert!(benign.len() >= 11, "{benign:?}");
    for name in benign {
        assert_eq!(files[name]["weights_only_false"], "loads", "{name}");
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap();
        assert!(report.level() <= Level::NeedsCode, "{name}");
        let called: Vec<String> = report
            .pickles
            .iter()
            .flat_map(|p| &p.globals)
            .filter(|g| g.usage == Usage::Called && g.level() > Level::Clean)
            .map(|g| g.path())
            .collect();
        assert!(called.is_empty(), "{name}: {called:?}");
    }
    let report = scan_file(
        &root().join("tests/scan/t_partial_called.pkl"),
        &Limits::default(),
        false,
    )
    .unwrap();
    let linear = report
        .pickles
        .iter()
        .flat_map(|p| &p.globals)
        .find(|g| g.path() == "torch.nn.modules.linear.Linear")
        .unwrap();
    // torch's own class called, not constructed: no checkpoint does that.
    assert_eq!(
        (linear.usage, linear.class),
        (Usage::Called, GlobalClass::Dangerous(Danger::LibraryCall))
    );
}

/// Which data.pkl torch read, by experiment (`torch_levels.json`, both
/// weights_only modes): the scanner marks that one as read by torch.load,
/// and reports the payload wherever it is.
#[test]
fn the_data_pkl_torch_reads_is_the_one_marked_reachable() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_levels.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for (name, facts) in doc.as_object().unwrap() {
        if !name.starts_with("z_") {
            continue;
        }
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap();
        let print: Vec<bool> = report
            .pickles
            .iter()
            .filter(|p| p.globals.iter().any(|g| g.path() == "builtins.print"))
            .map(|p| p.reachable)
            .collect();
        assert_eq!(print.len(), 1, "{name}: the payload is reported once");
        let reached = report.pickles.iter().filter(|p| p.reachable).count();
        match facts["weights_only_false"].as_str().unwrap() {
            "reads the payload" => assert_eq!((print, reached), (vec![true], 1), "{name}"),
            "reads the clean data.pkl" => {
                assert_eq!((print, reached), (vec![false], 1), "{name}");
                // weights_only=True reads the same entry, and loads it.
                assert_eq!(facts["weights_only_true"], "reads the clean data.pkl");
            }
            // torch refuses the entry: nothing is read by torch.load, and
            // the payload is still reported.
            _ => {
                assert_eq!((print, reached), (vec![false], 0), "{name}");
                assert!(report.level() >= Level::UnknownCall, "{name}");
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 10);
}

/// A partial calls what it holds when it is called, however it was made
/// (REDUCE or NEWOBJ) and whatever BUILD put in it; kept, it calls nothing.
#[test]
fn a_partial_calls_its_function_only_when_called() {
    use ptload_reader::scan::{scan_bytes, Usage};
    let usage = |pickle: &[u8], path: &str| {
        let report = scan_bytes(pickle, &Limits::default());
        let g = report
            .pickles
            .iter()
            .flat_map(|p| &p.globals)
            .find(|g| g.path() == path)
            .map(|g| (g.usage, g.level()));
        (g, report.level())
    };
    // partial(helper) kept: a construction.
    let kept: &[u8] = b"\x80\x02cfunctools\npartial\ncmypkg.tools\nhelper\n\x85R.";
    assert_eq!(
        usage(kept, "mypkg.tools.helper"),
        (
            Some((Usage::Referenced, Level::NeedsCode)),
            Level::NeedsCode
        )
    );
    // partial.__new__(partial, helper), then called.
    let newobj: &[u8] = b"\x80\x02cfunctools\npartial\ncmypkg.tools\nhelper\n\x85\x81)R.";
    assert_eq!(
        usage(newobj, "mypkg.tools.helper"),
        (Some((Usage::Called, Level::UnknownCall)), Level::Dangerous)
    );
    // partial(helper) whose BUILD state swaps in other, then called.
    let swapped: &[u8] =
        b"\x80\x02cfunctools\npartial\ncmypkg.tools\nhelper\n\x85R(cmypkg.tools\nother\n)NNtb)R.";
    assert_eq!(
        usage(swapped, "mypkg.tools.other"),
        (Some((Usage::Called, Level::UnknownCall)), Level::Dangerous)
    );
}

/// An instance made by a constructor helper is an instance of the class it
/// was given: calling it runs that class's `__call__`, an unknown call.
#[test]
fn calling_a_reconstructed_instance_calls_its_class() {
    use ptload_reader::scan::{scan_bytes, Usage};
    for pickle in [
        // copyreg._reconstructor(Hook, object, None)("id")
        &b"\x80\x02ccopyreg\n_reconstructor\ncmypkg.tools\nHook\ncbuiltins\nobject\nN\x87R(X\x02\x00\x00\x00idtR."[..],
        // copyreg.__newobj__(Hook)("id")
        &b"\x80\x02ccopyreg\n__newobj__\ncmypkg.tools\nHook\n\x85R(X\x02\x00\x00\x00idtR."[..],
    ] {
        let report = scan_bytes(pickle, &Limits::default());
        let hook = report
            .pickles
            .iter()
            .flat_map(|p| &p.globals)
            .find(|g| g.path() == "mypkg.tools.Hook")
            .unwrap();
        assert_eq!((hook.usage, hook.level()), (Usage::Called, Level::UnknownCall));
        assert_eq!(report.verdict(), UnknownCall);
    }
    // Constructed and kept: needs its code only.
    let kept: &[u8] = b"\x80\x02ccopyreg\n__newobj__\ncmypkg.tools\nHook\n\x85R.";
    assert_eq!(scan_bytes(kept, &Limits::default()).verdict(), NeedsCode);
}

/// numpy's generator constructors are data, but call what they are given.
#[test]
fn numpy_generator_constructors_call_their_bit_generator() {
    use ptload_reader::scan::scan_bytes;
    let evil: &[u8] =
        b"\x80\x02cnumpy.random._pickle\n__bit_generator_ctor\ncmypkg.tools\nEvil\n\x85R.";
    assert_eq!(scan_bytes(evil, &Limits::default()).verdict(), UnknownCall);
    let numpy: &[u8] =
        b"\x80\x02cnumpy.random._pickle\n__bit_generator_ctor\ncnumpy.random._pcg64\nPCG64\n\x85R.";
    assert_eq!(scan_bytes(numpy, &Limits::default()).verdict(), Clean);
}

/// Two zip archives end to end (`torch_zip.json`, by experiment in both
/// weights_only modes): the scanner marks as read by torch.load the
/// data.pkl torch read (none where torch failed), reports a payload in
/// either archive, and calls the file ambiguous; opening it as a
/// checkpoint reads the archive torch reads.
#[test]
fn two_archives_end_to_end_are_read_as_torch_reads_them() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_zip.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for (name, facts) in doc.as_object().unwrap() {
        if !name.starts_with("zc_") {
            continue;
        }
        let path = root().join("tests/scan").join(name);
        let report = scan_file(&path, &Limits::default(), false).unwrap();
        let payloads = if name.contains("payload_both") {
            2
        } else if name.contains("payload") {
            1
        } else {
            0
        };
        // Ambiguous, and dangerous with a payload (a `print`: a library
        // call no checkpoint makes).
        assert!(
            report
                .ambiguities
                .iter()
                .any(|a| a.what.contains("archive")),
            "{name}: {:?}",
            report.ambiguities
        );
        let verdict = if payloads > 0 { Dangerous } else { Ambiguous };
        assert_eq!(report.verdict(), verdict, "{name}: {report:#?}");
        let with_print: Vec<bool> = report
            .pickles
            .iter()
            .filter(|p| p.globals.iter().any(|g| g.path() == "builtins.print"))
            .map(|p| p.reachable)
            .collect();
        assert_eq!(with_print.len(), payloads, "{name}: every payload reported");
        let reached: Vec<_> = report.pickles.iter().filter(|p| p.reachable).collect();
        // Where each data.pkl scanned starts: the first archive's is the
        // lowest.
        let bases: Vec<u64> = report.pickles.iter().filter_map(|p| p.base).collect();
        let (low, high) = (bases.iter().min().copied(), bases.iter().max().copied());
        let torch = facts["weights_only_false"].as_str().unwrap();
        match torch {
            "reads the payload" => {
                assert_eq!(reached.len(), 1, "{name}");
                assert!(with_print.contains(&true), "{name}");
                assert_eq!(facts["weights_only_true"], "UnpicklingError", "{name}");
            }
            "reads the first archive" | "reads the second archive" => {
                assert_eq!(reached.len(), 1, "{name}");
                assert!(!with_print.contains(&true), "{name}");
                assert_eq!(facts["weights_only_true"], torch, "{name}");
                let want = if torch.contains("first") { low } else { high };
                assert_eq!(reached[0].base, want, "{name}");
                // The loader opens the same archive: zeros in the first,
                // ones in the second.
                let ckpt = ptload_reader::Checkpoint::open(&path).unwrap();
                let data = ckpt.tensor("w").unwrap().data().unwrap().to_vec();
                let one = if torch.contains("first") { 0.0f32 } else { 1.0 };
                let want: Vec<u8> = [one, one].iter().flat_map(|v| v.to_le_bytes()).collect();
                assert_eq!(data, want, "{name}");
            }
            _ => {
                assert_eq!(torch, "RuntimeError", "{name}");
                assert_eq!(facts["weights_only_true"], "RuntimeError", "{name}");
                assert!(reached.is_empty(), "{name}: torch reads nothing");
                assert!(
                    report.notes.iter().any(|n| n.contains("torch.load fails")),
                    "{name}: {:?}",
                    report.notes
                );
            }
        }
        for stand_in in facts["stand_ins"].as_array().unwrap() {
            let stand_in = stand_in.as_str().unwrap();
            assert!(
                reached
                    .iter()
                    .any(|p| p.globals.iter().any(|g| g.path() == stand_in)),
                "{name}: {stand_in}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 9);
}

/// The local header of `name` in `data` (a zip) overwritten, as a broken
/// local header.
fn break_local_header(data: &mut [u8], name: &str) {
    let eocd = (0..=data.len() - 22)
        .rev()
        .find(|&i| data[i..i + 4] == *b"PK\x05\x06")
        .unwrap();
    let count = u16::from_le_bytes([data[eocd + 10], data[eocd + 11]]) as usize;
    let mut at = u32::from_le_bytes(data[eocd + 16..eocd + 20].try_into().unwrap()) as usize;
    for _ in 0..count {
        let le16 = |i: usize| u16::from_le_bytes([data[i], data[i + 1]]) as usize;
        let (name_len, extra_len, comment_len) = (le16(at + 28), le16(at + 30), le16(at + 32));
        if &data[at + 46..at + 46 + name_len] == name.as_bytes() {
            let local = u32::from_le_bytes(data[at + 42..at + 46].try_into().unwrap()) as usize;
            data[local..local + 4].copy_from_slice(b"XXXX");
            return;
        }
        at += 46 + name_len + extra_len + comment_len;
    }
    panic!("{name} not in the directory");
}

/// An entry torch never reads whose local header is broken: torch loads
/// the file (`torch_zip.json`), and opening it reads the checkpoint, the
/// entry named in a warning. A record the load needs, or one torch reads
/// (and fails on: `version`, `.format_version`, ...), fails the open with
/// the record named.
#[test]
fn an_unrelated_broken_local_header_fails_only_what_needs_it() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_zip.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let name = "zb_benign_unrelated_broken_local_header.pt";
    let facts = &doc[name];
    for mode in ["weights_only_false", "weights_only_true"] {
        assert_eq!(facts[mode], "reads w = [0.0, 1.0, 2.0, 3.0]", "{mode}");
    }
    let path = root().join("tests/scan").join(name);
    let ckpt = ptload_reader::Checkpoint::open(&path).unwrap();
    let data = ckpt.tensor("w").unwrap().data().unwrap().to_vec();
    let want: Vec<u8> = [0.0f32, 1.0, 2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(data, want);
    assert!(
        ckpt.warnings().iter().any(|w| matches!(
            w,
            ptload_reader::advice::Warning::NoLocalHeader { entry, .. }
                if entry == "archive/extra/notes.txt"
        ) && w.to_string().contains("no local header")),
        "{:?}",
        ckpt.warnings()
    );
    let bytes = std::fs::read(&path).unwrap();
    let dir = std::env::temp_dir().join(format!("ptload-scan-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for needed in [
        "archive/data.pkl",
        "archive/data/0",
        "archive/byteorder",
        "archive/version",
        "archive/.format_version",
    ] {
        let mut broken = bytes.clone();
        break_local_header(&mut broken, needed);
        let file = dir.join("broken.pt");
        std::fs::write(&file, &broken).unwrap();
        let err = ptload_reader::Checkpoint::open(&file)
            .err()
            .unwrap_or_else(|| panic!("{needed}: opened"));
        let text = err.to_string();
        assert!(
            text.contains("no local header") && text.contains(needed),
            "{needed}: {text}"
        );
    }
    // The broken entry named like a listed one (same length, renamed in
    // the central directory): a duplicate name, refused.
    let mut renamed = bytes.clone();
    let at = renamed
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == b"PK\x01\x02")
        .map(|(i, _)| i + 46)
        .find(|&i| renamed[i..].starts_with(b"archive/extra/notes.txt"))
        .unwrap();
    renamed[at..at + 23].copy_from_slice(b"archive/.format_version");
    let file = dir.join("renamed.pt");
    std::fs::write(&file, &renamed).unwrap();
    let err = ptload_reader::Checkpoint::open(&file).expect_err("opened");
    assert!(err.to_string().contains("duplicate entry name"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A local header the central directory does not list (a shadow
/// data.pkl): torch reads the listed one (`torch_zip.json`); the scanner
/// marks that one as read by torch.load, reports the shadow's payload as
/// not read, and names the hidden header with its offset.
#[test]
fn a_shadow_data_pkl_in_local_headers_is_reported_not_reached() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_zip.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (name, shadow_at) in [
        ("zh_shadow_data_pkl_between_entries.pt", None),
        ("zh_shadow_data_pkl_first.pt", Some(0)),
    ] {
        for mode in ["weights_only_false", "weights_only_true"] {
            assert_eq!(doc[name][mode], "reads w = [0.0, 0.0]", "{name} {mode}");
        }
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap();
        let reached: Vec<_> = report.pickles.iter().filter(|p| p.reachable).collect();
        assert_eq!(reached.len(), 1, "{name}");
        assert!(reached[0]
            .globals
            .iter()
            .all(|g| g.path() != "builtins.print"));
        let shadow: Vec<_> = report
            .pickles
            .iter()
            .filter(|p| p.globals.iter().any(|g| g.path() == "builtins.print"))
            .collect();
        assert_eq!(shadow.len(), 1, "{name}");
        assert!(!shadow[0].reachable, "{name}");
        let hidden: Vec<u64> = report
            .ambiguities
            .iter()
            .filter(|a| a.what.contains("does not list"))
            .map(|a| a.offset)
            .collect();
        assert_eq!(hidden.len(), 1, "{name}: {:?}", report.ambiguities);
        // The shadow's data follows its header: header, name, then bytes.
        let base = shadow[0].base.unwrap();
        assert_eq!(
            base,
            hidden[0] + 30 + "archive/data.pkl".len() as u64,
            "{name}"
        );
        if let Some(at) = shadow_at {
            assert_eq!(hidden[0], at, "{name}");
        }
    }
}

/// Calls that are plain data only for some arguments: an enum member
/// looked up by one constant (`Class(value)`, as an enum pickles), an item
/// taken from a container the pickle built by a constant key. Every other
/// call of the same callables, and whatever comes out of them and is
/// called, stays a call (hand-made pickles).
#[test]
fn enum_lookups_and_plain_getitem_are_data_and_nothing_else_is() {
    const ENUM: &[u8] = b"ctorchvision.transforms.functional\nInterpolationMode\n";
    const GETITEM: &[u8] = b"coperator\ngetitem\n";
    let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
        // Plain data.
        (
            "enum member",
            pickle(&[ENUM, &s("bilinear"), b"\x85R"]),
            Clean,
        ),
        (
            "enum member by a tuple value",
            pickle(&[ENUM, b"K\x01K\x02\x86\x85R"]),
            Clean,
        ),
        (
            "item of a list",
            pickle(&[GETITEM, b"](K\x01K\x02K\x03eK\x01\x86R"]),
            Clean,
        ),
        (
            "item of a dict",
            pickle(&[GETITEM, b"}", &s("a"), b"K\x01s", &s("a"), b"\x86R"]),
            Clean,
        ),
        // Calls: of the enum class or getitem, into libraries every
        // loading machine has (torchvision, the standard library), an
        // uncatalogued library call, dangerous; of a package's function,
        // an unknown call.
        (
            "enum class given a list",
            pickle(&[ENUM, b"]\x85R"]),
            Dangerous,
        ),
        (
            "enum class given two values",
            pickle(&[ENUM, &s("a"), &s("b"), b"\x86R"]),
            Dangerous,
        ),
        (
            "enum member called",
            pickle(&[ENUM, &s("bilinear"), b"\x85R)R"]),
            Dangerous,
        ),
        (
            "item of an instance (its __getitem__)",
            pickle(&[GETITEM, b"csomepkg\nThing\n)\x81", &s("k"), b"\x86R"]),
            Dangerous,
        ),
        (
            "item of a call's result",
            pickle(&[GETITEM, b"csomepkg\nmake\n)R", &s("k"), b"\x86R"]),
            Dangerous,
        ),
        (
            "getitem with a key that is no constant",
            pickle(&[GETITEM, b"]]\x86R"]),
            Dangerous,
        ),
        (
            "getitem called by map",
            pickle(&[b"cbuiltins\nmap\n", GETITEM, b"]\x86R"]),
            Dangerous,
        ),
        (
            "an unknown function taken from a list and called",
            pickle(&[GETITEM, b"]csomepkg\nfrob\naK\x00\x86R", &s("id"), b"\x85R"]),
            UnknownCall,
        ),
        (
            "os.system taken from a list and called",
            pickle(&[GETITEM, b"]cos\nsystem\naK\x00\x86R", &s("id"), b"\x85R"]),
            Dangerous,
        ),
        // A package's class called with one word is an enum member looked
        // up (needs-code); with a string no enum value is (code, a path,
        // a sentence), a call of an unknown class.
        (
            "a package's enum member",
            pickle(&[b"csomepkg.config\nStage\n", &s("bf16-mixed"), b"\x85R"]),
            NeedsCode,
        ),
        (
            "a package's enum member by a number",
            pickle(&[b"csomepkg.config\nLevel\n", b"K\x03\x85R"]),
            NeedsCode,
        ),
        (
            "a package's class given code",
            pickle(&[
                b"csomepkg.config\nStage\n",
                &s("__import__('os')"),
                b"\x85R",
            ]),
            UnknownCall,
        ),
        (
            "a package's class given a path",
            pickle(&[b"csomepkg.config\nStage\n", &s("/tmp/x"), b"\x85R"]),
            UnknownCall,
        ),
        (
            "a package's function given a word",
            pickle(&[b"csomepkg.config\nstage\n", &s("train"), b"\x85R"]),
            UnknownCall,
        ),
        (
            "a standard library class given a word",
            pickle(&[b"ccalendar\nTextCalendar\n", b"K\x00\x85R"]),
            Dangerous,
        ),
        (
            "pydantic evaluates a type given as a string",
            pickle(&[b"cpydantic\nTypeAdapter\n", &s("List"), b"\x85R"]),
            Dangerous,
        ),
        (
            "attrgetter stays dangerous",
            pickle(&[b"coperator\nattrgetter\n", &s("system"), b"\x85R"]),
            Dangerous,
        ),
        (
            "methodcaller stays dangerous",
            pickle(&[b"coperator\nmethodcaller\n", &s("system"), b"\x85R"]),
            Dangerous,
        ),
    ];
    for (what, bytes, verdict) in cases {
        let report = ptload_reader::scan::scan_bytes(&bytes, &Limits::default());
        assert!(report.pickles[0].complete, "{what}: {report:#?}");
        assert_eq!(report.verdict(), verdict, "{what}: {report:#?}");
    }
}

/// A FRAME that declares more bytes than are left: Python's C unpickler
/// stops at it, its pure-Python unpickler (which does not check the
/// length) runs what it holds. The scanner reads on and calls the file
/// ambiguous; the global inside is reported (hand-made).
#[test]
fn a_frame_longer_than_the_bytes_left_is_read_on() {
    let mut pickle = b"\x80\x04\x95".to_vec();
    let body = b"\x8c\x02os\x94\x8c\x06system\x94\x93\x94.";
    pickle.extend_from_slice(&(body.len() as u64 + 3).to_le_bytes());
    pickle.extend_from_slice(body);
    let report = ptload_reader::scan::scan_bytes(&pickle, &Limits::default());
    assert_eq!(report.verdict(), Dangerous, "{report:#?}");
    assert!(report
        .ambiguities
        .iter()
        .any(|a| a.what.contains("FRAME declares more bytes")));
    // The same pickle with its true length is no ambiguity.
    pickle[3..11].copy_from_slice(&(body.len() as u64).to_le_bytes());
    let report = ptload_reader::scan::scan_bytes(&pickle, &Limits::default());
    assert_eq!(report.verdict(), Dangerous);
    assert!(report.ambiguities.is_empty(), "{report:#?}");
}

/// A safetensors file holds no pickle: clean when its header reads and
/// checks out, unreadable (never clean) when it is hostile, whatever the
/// file is named.
#[test]
fn safetensors_headers_are_checked_not_trusted() {
    use ptload_reader::scan::{scan_bytes, Verdict};
    let file = |header: &str, data: usize| {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.resize(out.len() + data, 0);
        out
    };
    let good = file(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        8,
    );
    let report = scan_bytes(&good, &Limits::default());
    assert_eq!(
        (report.layout, report.verdict()),
        ("safetensors", Verdict::Clean)
    );
    assert!(report.holds_no_pickle && report.notes[0].contains("scanned too"));
    for (header, data) in [
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            8,
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
            16,
        ),
    ] {
        let report = scan_bytes(&file(header, data), &Limits::default());
        assert_eq!(report.verdict(), Verdict::Unreadable, "{header}");
        assert!(!report.holds_no_pickle, "{header}");
    }
}

/// A safetensors file whose first bytes are also a pickle program: torch
/// unpickles any file not named `.safetensors` from byte 0 (every torch
/// before 2.15 does so with any name), so the header's checks do not make
/// it clean. The header length 0x03580280 reads as PROTO 2 and a
/// BINUNICODE of 3 bytes that swallows the length's last byte and `{"`;
/// what follows, inside the first name, is a call of `os.system`.
#[test]
fn a_safetensors_header_that_is_also_a_pickle_is_scanned_as_one() {
    use ptload_reader::scan::{scan_bytes, Verdict};
    let n: u64 = 0x0358_0280;
    let mut file = vec![b' '; usize::try_from(n).unwrap() + 8 + 1];
    file[..8].copy_from_slice(&n.to_le_bytes());
    let program = b"{\"cos\nsystem\n)R.";
    file[8..8 + program.len()].copy_from_slice(program);
    let report = scan_bytes(&file, &Limits::default());
    assert_eq!(report.layout, "safetensors");
    assert_eq!(report.verdict(), Verdict::Dangerous, "{report:?}");
}

/// Calls the unpickler makes for the file (`tests/scan/torch_implicit.json`,
/// labelled by running torch.load on each): APPEND and APPENDS on an
/// object that is no list call its `append` / `extend`, looked up on the
/// instance first, so a BUILD state that put a callable there (from a dict
/// state, a slot state, or nested in a partial) chose what runs. Each
/// payload torch ran is reported with the callable called, at the default
/// gate; a class that fills itself with its own method is not.
#[test]
fn calls_the_unpickler_makes_are_calls() {
    use ptload_reader::scan::Usage;
    let text = std::fs::read_to_string(root().join("tests/scan/torch_implicit.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = doc.as_object().unwrap();
    assert!(files.len() >= 5, "{files:?}");
    let mut ran = 0;
    for (name, facts) in files {
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap();
        let called: Vec<String> = report
            .pickles
            .iter()
            .flat_map(|p| &p.globals)
            .filter(|g| g.usage == Usage::Called)
            .map(|g| g.path())
            .collect();
        if facts["payload_ran"] == true {
            ran += 1;
            assert!(report.level() >= Level::UnknownCall, "{name}: {called:?}");
            assert!(
                called.iter().any(|c| c == "logging.warning"),
                "{name}: {called:?}"
            );
        } else {
            assert!(report.level() <= Level::NeedsCode, "{name}: {called:?}");
            assert!(called.is_empty(), "{name}: {called:?}");
        }
    }
    assert!(ran >= 4, "{ran} payloads torch ran");
}

/// Calls a pickle gets made without naming a dangerous global
/// (`tests/scan/torch_state.json`, labelled by running torch.load on
/// each): copyreg's extension registry changed by SETITEM then used by
/// EXT1, a class made by NEWOBJ of `type`, `extend` answered by a dict
/// subclass's `__getattr__`, APPEND calling `extend`, a class's own
/// `__setitem__` calling what its state holds, a v7 tar torch reads
/// first, and TorchScript code that writes a file (`save`), its records
/// named in capitals; code that uses an object the file made running
/// the object's methods (`repr` of a Namespace whose `_get_args` is a
/// partial, torch comparing a legacy magic number that is a UserList
/// whose `__cast` is one, `OrderedDict().update` given a namespace whose
/// `keys` is one), what a builtin hands back being any of what
/// it was given (the last of a reversed list), a BUILD key written as a
/// protocol-1 string, a legacy protocol version written in hex, an
/// optimizer's `__setstate__` calling `setdefault` of its `defaults` (a
/// namespace whose `setdefault` is a partial), and a key put into a
/// mapping a call made (`OrderedDict()`) whose `__hash__` calls what
/// BUILD set (a SymInt's `node.is_nested_int`), each made and dropped
/// inside a zip's data.pkl; and an object the load does not return,
/// dropped by POP or left on the stack under the result, whose `__del__`
/// calls what BUILD set (torch's async checkpoint process and its
/// `_save_process.is_alive`); a second PROTO that sets protocol 2 (a
/// Python 2 name then maps: `__builtin__.reduce` is `functools.reduce`),
/// ADDITEMS on an object that is no set (its `add` is called), a BUILD
/// state that is no dict (Module's `__setstate__` calls its `keys`), and
/// a SymInt in a tuple given to `Counter` (hashed), and APPEND on a
/// ParameterList whose `_get_abs_string_index` is a chain of three
/// Identity modules, each one's `forward` the next (deeper than the
/// walk of four levels that found what an object holds).
/// Every payload torch ran is flagged, at the level the technique is
/// (changing the interpreter's state, making a class, calling a partial
/// and writing files are dangerous whatever is called).
#[test]
fn state_changes_made_classes_and_answered_lookups_are_caught() {
    let expected = [
        ("ss_ext_registry.pkl", Level::Dangerous),
        ("ss_newobj_type.pkl", Level::Dangerous),
        ("ss_getattr_items.pkl", Level::Dangerous),
        ("ss_append_calls_extend.pkl", Level::Dangerous),
        ("ss_setitem_policy.pkl", Level::Dangerous),
        ("ss_tar_v7.pt", Level::Dangerous),
        ("ss_repr_calls_attribute.pkl", Level::Dangerous),
        ("ss_reversed_list.pkl", Level::Dangerous),
        ("ss_bound_method_update.pkl", Level::Dangerous),
        ("ss_build_bytes_key.pkl", Level::Dangerous),
        ("ss_legacy_magic_instance.pt", Level::Dangerous),
        ("ss_legacy_hex_protocol.pt", Level::Dangerous),
        ("ss_script_save.pt", Level::Dangerous),
        ("ss_script_save_caps.pt", Level::Dangerous),
        ("ss_optimizer_setstate.pt", Level::Dangerous),
        ("ss_made_mapping_key.pt", Level::Dangerous),
        ("ss_dropped_finalizer.pt", Level::Dangerous),
        ("ss_left_on_stack.pt", Level::Dangerous),
        ("ss_second_proto.pt", Level::Dangerous),
        ("ss_additems_object.pkl", Level::Dangerous),
        ("ss_state_namespace_keys.pt", Level::Dangerous),
        ("ss_counter_member_hash.pt", Level::Dangerous),
        ("ss_deep_chain_append.pt", Level::Dangerous),
    ];
    let text = std::fs::read_to_string(root().join("tests/scan/torch_state.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc.as_object().unwrap().len(), expected.len());
    for (name, level) in expected {
        assert_eq!(doc[name]["payload_ran"], true, "{name}: torch ran it");
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap();
        let globals: Vec<String> = report
            .pickles
            .iter()
            .flat_map(|p| &p.globals)
            .map(|g| format!("{} {:?} {:?}", g.path(), g.usage, g.level()))
            .collect();
        assert_eq!(report.level(), level, "{name}: {globals:?}");
    }
}

/// The rules behind the levels of callables the scanner has no entry
/// for (hand-made pickles): a module's own object changed by APPEND is a
/// change of the interpreter's state; a callable the file calls is at the
/// level its name says (it writes, serves, runs a program), one it only
/// names is not judged by its name; a C accelerator's name is its public
/// module's; an unknown callable given a function may call it; torch's
/// result types are data.
#[test]
fn callables_without_an_entry_are_judged_by_what_they_are_given_and_named() {
    use ptload_reader::scan::scan_bytes;
    // A dict key that is a chain of 12 objects of a class the scanner
    // does not know, each holding the next, the last a partial: hashing
    // the key runs its methods, and the walk of what is used follows it
    // 24 levels down (it stopped at 16).
    let mut chain = Vec::new();
    for _ in 0..12 {
        chain.extend_from_slice(b"csomepkg\nNode\n)\x81}");
        chain.extend_from_slice(&s("next"));
    }
    chain.extend_from_slice(b"cfunctools\npartial\ncsomepkg\nhook\n\x85R");
    for _ in 0..12 {
        chain.extend_from_slice(b"sb");
    }
    let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
        (
            "a key 24 levels above a partial",
            pickle(&[b"}", &chain, b"K\x01s"]),
            Dangerous,
        ),
        // A BUILD state's dunders: pydantic's `__pydantic_fields_set__`
        // and `__dict__` are data put into the instance's dict; a
        // `__setstate__` there is what a later BUILD calls; `__class__`
        // set by a slot state changes the instance's type.
        (
            "pydantic's dunders in a BUILD state",
            pickle(&[
                b"csomepkg\nRunCfg\n)\x81}(",
                &s("__dict__"),
                b"}",
                &s("__pydantic_fields_set__"),
                b"cbuiltins\nset\n)R",
                &s("__pydantic_extra__"),
                b"Nub",
            ]),
            NeedsCode,
        ),
        (
            "a __setstate__ in a BUILD state",
            pickle(&[
                b"csomepkg\nRunCfg\n)\x81}",
                &s("__setstate__"),
                b"csomepkg\nhook\nsb",
            ]),
            Dangerous,
        ),
        (
            "a __class__ in a slot state",
            pickle(&[
                b"csomepkg\nRunCfg\n)\x81N}",
                &s("__class__"),
                b"csomepkg\nOther\ns\x86b",
            ]),
            Dangerous,
        ),
        (
            "APPEND on a module's list",
            pickle(&[b"cgc\ncallbacks\ncsomepkg\nhook\na"]),
            Dangerous,
        ),
        (
            "a writer called",
            pickle(&[b"csomepkg\nwrite_report\n", &s("/tmp/x"), b"\x85R"]),
            Dangerous,
        ),
        (
            "a server class called",
            pickle(&[b"csomepkg\nUnixStreamServer\n", &s("/tmp/x"), b"\x85R"]),
            Dangerous,
        ),
        (
            "a program's main called",
            pickle(&[b"csomepkg.cli\nmain\n", &s("--out"), b"\x85R"]),
            Dangerous,
        ),
        (
            "a writer only named",
            pickle(&[b"}", &s("w"), b"csomepkg\nwrite_report\ns"]),
            NeedsCode,
        ),
        (
            "a function without such words called",
            pickle(&[b"csomepkg\nfrob\n", &s("x"), b"\x85R"]),
            UnknownCall,
        ),
        (
            "attrgetter by its C module",
            pickle(&[b"c_operator\nattrgetter\n", &s("system"), b"\x85R"]),
            Dangerous,
        ),
        (
            "an unknown callable given a writer",
            pickle(&[b"csomepkg\nworker\ncother\nwrite_log\n\x85R"]),
            Dangerous,
        ),
        (
            "an unknown callable given a plain function",
            pickle(&[b"csomepkg\nworker\ncother\nfrob\n\x85R"]),
            UnknownCall,
        ),
        (
            "torch's result type",
            pickle(&[b"ctorch.return_types\ntopk\n)\x85R"]),
            Clean,
        ),
        (
            "numpy's memmap by its implementation module",
            pickle(&[b"cnumpy._core.memmap\nmemmap\n", &s("/tmp/x"), b"\x85R"]),
            Dangerous,
        ),
        (
            "shared memory by multiprocessing's C part",
            pickle(&[b"c_posixshmem\nshm_open\n", &s("/x"), b"\x85R"]),
            Dangerous,
        ),
        (
            "CPython's test helpers",
            pickle(&[b"ctest.support.script_helper\nassert_python_ok\n", &s("-c"), b"\x85R"]),
            Dangerous,
        ),
        (
            "a model's own module named test",
            pickle(&[b"ctest\nNet\n)\x81"]),
            NeedsCode,
        ),
        (
            "diffusers' frozen config",
            pickle(&[b"cdiffusers.configuration_utils\nFrozenDict\n)\x85R"]),
            Clean,
        ),
        (
            "a torch random generator",
            pickle(&[b"ctorch._C\nGenerator\n", &s("cpu"), b"\x85R"]),
            Clean,
        ),
        (
            "an object given to a call runs what it holds",
            pickle(&[
                b"cbuiltins\nstr\ncargparse\nNamespace\n)\x81}",
                &s("_get_args"),
                b"csomepkg\nfrob\nsb\x85R",
            ]),
            UnknownCall,
        ),
        (
            "a function in a plain list given to a call is not called",
            pickle(&[b"cbuiltins\nlen\n](csomepkg\nfrob\ne\x85R"]),
            NeedsCode,
        ),
        (
            "an item taken two levels down is called",
            pickle(&[
                b"cbuiltins\nnext\ncbuiltins\niter\n](](csomepkg\nfrob\nee\x85R\x85R)R",
            ]),
            UnknownCall,
        ),
        (
            "a path's file-system method, only named",
            pickle(&[
                b"cbuiltins\ngetattr\ncpathlib\nPosixPath\n",
                &s("/tmp/x"),
                b"\x85R",
                &s("touch"),
                b"\x86R",
            ]),
            Dangerous,
        ),
        (
            "a method of data called with an object holding a function",
            pickle(&[
                b"cbuiltins\ngetattr\ncollections\nOrderedDict\n)R",
                &s("update"),
                b"\x86Rctypes\nSimpleNamespace\n)\x81}",
                &s("keys"),
                b"csomepkg\nfrob\nsb\x85R",
            ]),
            UnknownCall,
        ),
        (
            "torch's native function by getattr of its class",
            pickle(&[
                b"cbuiltins\ngetattr\nctorch._C\n_VariableFunctionsClass\n",
                &s("tanh"),
                b"\x86R",
            ]),
            NeedsCode,
        ),
        (
            "torch's native file reader by getattr of its class",
            pickle(&[
                b"cbuiltins\ngetattr\nctorch._C\n_VariableFunctionsClass\n",
                &s("from_file"),
                b"\x86R",
            ]),
            Dangerous,
        ),
        (
            "a dict's key handed back is called",
            pickle(&[
                b"cbuiltins\nnext\ncbuiltins\nreversed\n}(cbuiltins\nrepr\nK\x00csomepkg\nfrob\nK\x01u\x85R\x85R)R",
            ]),
            UnknownCall,
        ),
        (
            "a class made by a metaclass",
            pickle(&[
                b"cabc\nABCMeta\n",
                &s("C"),
                b")}",
                &s("__del__"),
                b"csomepkg\nfrob\ns\x87\x81",
            ]),
            Dangerous,
        ),
        (
            "a map made by NEWOBJ calls its function",
            pickle(&[b"cbuiltins\nmap\ncsomepkg\nfrob\n]\x86\x81"]),
            UnknownCall,
        ),
        (
            "a class patched through type(instance)",
            pickle(&[
                b"cbuiltins\ntype\ncsomepkg\nThing\n)\x81\x85R}",
                &s("update"),
                b"csomepkg\nfrob\nsb",
            ]),
            Dangerous,
        ),
        (
            "a bound method of an instance (a module's hook)",
            pickle(&[
                b"cbuiltins\ngetattr\ncsomepkg\nThing\n)\x81",
                &s("hook"),
                b"\x86R",
            ]),
            NeedsCode,
        ),
        (
            "getattr of a module's attribute stays a gadget",
            pickle(&[b"cbuiltins\ngetattr\ncos\npath\n", &s("join"), b"\x86R"]),
            Dangerous,
        ),
        (
            "APPENDS on a module list holding a function",
            pickle(&[
                b"ctorch.nn.modules.container\nModuleList\n)\x81}",
                &s("add_module"),
                b"csomepkg\nfrob\nsb(K\x01e",
            ]),
            UnknownCall,
        ),
        (
            "a payload after a lone surrogate",
            pickle(&[b"X\x03\x00\x00\x00\xed\xa0\x800csomepkg\nwrite_it\n)R"]),
            Dangerous,
        ),
    ];
    for (what, bytes, verdict) in cases {
        let report = scan_bytes(&bytes, &Limits::default());
        assert!(report.pickles[0].complete, "{what}: {report:#?}");
        assert_eq!(report.verdict(), verdict, "{what}: {report:#?}");
    }
}

/// A ustar header for `name` whose size field is `size_field` as written
/// (octal text, or whatever a test puts there), of type `kind`, linking to
/// `link`, with its checksum.
fn tar_header(name: &str, size_field: &[u8], kind: u8, link: &str) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[124..124 + size_field.len()].copy_from_slice(size_field);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// A pre-1.0 tar checkpoint of regular members `(name, data)`, ended by
/// two zero blocks.
fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        let size = format!("{:011o}\0", data.len());
        out.extend(tar_header(name, size.as_bytes(), b'0', ""));
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend(vec![0u8; 1024]);
    out
}

/// The `storages` and `tensors` members as torch reads them (a blind
/// corpus's shapes, run by torch 2.15): extracted and opened unbuffered,
/// so a pickle whose STOP is inside a FRAME leaves the file at the
/// frame's end; a storage record's raw bytes sized by the class in its
/// third field (`key, location, storage_type`), not by the first storage
/// class it names; memo indexes as CPython reads them (`p1_0`); and a
/// pickle torch reads that the scanner cannot read to its end is
/// ambiguous, not passed over.
#[test]
fn tar_members_are_read_as_torch_reads_them() {
    use ptload_reader::scan::scan_bytes;
    let empty: &[u8] = b"\x80\x02}.";
    let payload: &[u8] = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R.";
    let with = |storages: &[u8]| {
        tar_of(&[
            ("sys_info", empty),
            ("pickle", empty),
            ("storages", storages),
            ("tensors", b"K\x00."),
        ])
    };
    // The count 0 in a frame that goes on past its STOP with the start
    // of a string; the views pickle (the payload) at the frame's end,
    // the string's length covering it.
    let mut storages = b"\x80\x04\x95".to_vec();
    storages.extend_from_slice(&8u64.to_le_bytes());
    storages.extend_from_slice(b"K\x00.X");
    storages.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    storages.extend_from_slice(payload);
    storages.extend_from_slice(b".");
    let report = scan_bytes(&with(&storages), &Limits::default());
    assert_eq!(report.layout, "tar");
    assert_eq!(report.verdict(), Dangerous, "frame tail: {report:#?}");
    // One record whose key is a `DoubleStorage` and whose type is a
    // `ByteStorage`: 8 elements of 1 byte, then the views (the payload);
    // read by the key's class, the raw bytes would end at a decoy list.
    let mut storages = b"K\x01.".to_vec();
    storages.extend_from_slice(
        b"\x80\x02ctorch\nDoubleStorage\nX\x03\x00\x00\x00cpuctorch\nByteStorage\n\x87.",
    );
    let end = storages.len();
    storages.extend_from_slice(&8i64.to_le_bytes());
    storages.extend_from_slice(&[0u8; 8]);
    storages.extend_from_slice(payload);
    storages.resize(end + 8 + 64, 0);
    storages.extend_from_slice(b"].");
    let report = scan_bytes(&with(&storages), &Limits::default());
    assert_eq!(report.verdict(), Dangerous, "storage class: {report:#?}");
    // Memo indexes with underscores, a sign and leading zeros.
    let memo = b"\x80\x02X\x01\x00\x00\x00ap1_0\n0g+00_10\n.";
    let report = scan_bytes(&with(&[&b"K\x00."[..], memo].concat()), &Limits::default());
    assert!(
        report.pickles.iter().all(|p| p.complete),
        "memo: {report:#?}"
    );
    assert_eq!(report.verdict(), Clean, "memo: {report:#?}");
    // A views pickle torch reads that does not parse.
    let report = scan_bytes(&with(b"K\x00.\x80\x02}\xff."), &Limits::default());
    assert_eq!(report.verdict(), Ambiguous, "broken views: {report:#?}");
}

/// A tar member that is a link is read as Python's tarfile reads it: a
/// hard or symbolic link to another member is that member's data; one to
/// a path outside the archive is ambiguous (torch reads whatever is there
/// when the file is loaded).
#[test]
fn tar_links_are_followed_as_tarfile_follows_them() {
    use ptload_reader::scan::scan_bytes;
    fn tar(members: &[(&str, u8, &str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, kind, link, data) in members {
            let size = format!("{:011o}\0", data.len());
            out.extend(tar_header(name, size.as_bytes(), *kind, link));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend(vec![0u8; 1024]);
        out
    }
    let payload: &[u8] = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R.";
    let empty: &[u8] = b"\x80\x02}.";
    for (what, kind, link) in [
        ("hard link", b'1', "other"),
        ("symbolic link", b'2', "./other"),
    ] {
        let file = tar(&[
            ("other", b'0', "", payload),
            ("sys_info", b'0', "", empty),
            ("pickle", kind, link, b""),
        ]);
        let report = scan_bytes(&file, &Limits::default());
        assert_eq!(report.layout, "tar", "{what}");
        assert_eq!(report.verdict(), Dangerous, "{what}: {report:#?}");
    }
    let outside = tar(&[
        ("sys_info", b'0', "", empty),
        ("storages", b'2', "/proc/self/fd/3", b""),
        ("pickle", b'0', "", empty),
    ]);
    let report = scan_bytes(&outside, &Limits::default());
    assert!(report
        .ambiguities
        .iter()
        .any(|a| a.what.contains("/proc/self/fd/3")));
    // torch extracts `storages` and `tensors` to disk before reading them:
    // a link among them is made there (a hard link's target gets the
    // header's mode, time and owner; a symbolic link is unpickled from
    // wherever it points), whatever member bears the target's name.
    assert_eq!(report.verdict(), Dangerous, "{report:#?}");
    for (member, kind, link) in [
        ("storages", b'1', "../../victim"),
        ("tensors", b'1', "/etc/victim"),
        ("tensors", b'2', "../staged.bin"),
    ] {
        let mut members: Vec<(&str, u8, &str, &[u8])> = vec![
            (link, b'0', "", b"\x80\x02K\x00."),
            ("sys_info", b'0', "", empty),
            ("storages", b'0', "", b"\x80\x02K\x00."),
            ("tensors", b'0', "", b"\x80\x02K\x00."),
            ("pickle", b'0', "", empty),
        ];
        if let Some(m) = members.iter_mut().find(|m| m.0 == member) {
            *m = (member, kind, link, b"");
        }
        let report = scan_bytes(&tar(&members), &Limits::default());
        assert_eq!(
            report.verdict(),
            Dangerous,
            "{member} -> {link}: {report:#?}"
        );
        assert!(
            report.effects.iter().any(|e| e.record == member),
            "{report:#?}"
        );
    }
    // `pickle` and `sys_info` are read from the archive, not extracted: a
    // link there reads the member it names, as before.
    let read = tar(&[
        ("other", b'0', "", empty),
        ("sys_info", b'0', "", empty),
        ("pickle", b'1', "other", b""),
    ]);
    let report = scan_bytes(&read, &Limits::default());
    assert!(report.effects.is_empty(), "{report:#?}");
}

/// `OpenOptions::refuse_at`: the open follows the scanner's verdict,
/// refusing at the level the caller chooses and reading the rest.
#[test]
fn an_open_can_refuse_what_the_scan_puts_at_a_level() {
    use ptload_reader::{ErrorKind, OpenOptions};
    let payload = root().join("tests/scan/polyglot_pickle_then_zip.pt");
    // The default reads its tensors (running nothing)...
    assert!(OpenOptions::new().open(&payload).is_ok());
    // ...refusing at dangerous names the finding.
    let e = OpenOptions::new()
        .refuse_at(Some(Level::Dangerous))
        .open(&payload)
        .expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.to_string().contains("os.system"), "{e}");
    assert!(e.to_string().contains("dangerous"), "{e}");
    // A whole pickled model needs its classes' code: read at dangerous
    // and unknown-call, refused at needs-code.
    let model = root().join("fixtures/files/whole_module.pt");
    for level in [Level::Dangerous, Level::UnknownCall] {
        let ckpt = OpenOptions::new()
            .refuse_at(Some(level))
            .open(&model)
            .unwrap_or_else(|e| panic!("{level:?}: {e}"));
        assert!(!ckpt.is_empty());
    }
    let e = OpenOptions::new()
        .refuse_at(Some(Level::NeedsCode))
        .open(&model)
        .expect_err("needs code");
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    // A plain state dict passes every level.
    let plain = root().join("fixtures/files/basic.pt");
    assert!(OpenOptions::new()
        .refuse_at(Some(Level::NeedsCode))
        .open(&plain)
        .is_ok());
    // An implicit call the unpickler would make: refused at unknown-call.
    let bytes = std::fs::read(root().join("tests/scan/ia_append_attr.pkl")).unwrap();
    let e = OpenOptions::new()
        .refuse_at(Some(Level::UnknownCall))
        .open_bytes(bytes)
        .expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.to_string().contains("logging.warning called"), "{e}");
}

/// Zip names as torch's reader finds them (`tests/scan/torch_case.json`,
/// torch 2.15's answers): without regard to letter case. The reader reads
/// each benign file as torch does (`DATA.PKL`, `ARCHIVE/`, `DATA/`, a
/// big-endian file's `BYTEORDER`); names equal but for case are
/// duplicates, refused as duplicates are (torch takes the last).
#[test]
fn zip_names_are_found_as_torch_finds_them() {
    use ptload_reader::Checkpoint;
    use sha2::{Digest, Sha256};
    let text = std::fs::read_to_string(root().join("tests/scan/torch_case.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = doc.as_object().unwrap();
    assert_eq!(files.len(), 7);
    for (name, answer) in files {
        let path = root().join("tests/scan").join(name);
        let opened = Checkpoint::open(&path);
        if name.contains("duplicate") {
            let e = opened.expect_err(name);
            assert!(e.to_string().contains("letter case"), "{name}: {e}");
            continue;
        }
        if answer["loads"] == false {
            // The payload: torch refused the pickle it read, DATA.PKL.
            assert_eq!(answer["error"], "UnpicklingError", "{name}");
            let ckpt = opened.expect(name);
            let outside: Vec<String> = ckpt.outside_allowlist().map(|g| g.path()).collect();
            assert_eq!(outside, ["builtins.print"], "{name}");
            continue;
        }
        let ckpt = opened.unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = answer["tensors"].as_object().unwrap();
        assert_eq!(ckpt.len(), want.len(), "{name}");
        for (key, w) in want {
            let t = ckpt.tensor(key).unwrap_or_else(|| panic!("{name}: {key}"));
            let digest = hex::encode(Sha256::digest(t.data().unwrap()));
            assert_eq!(digest, w["sha256"].as_str().unwrap(), "{name} {key}");
        }
    }
}

/// Tar checkpoints (`tests/scan/torch_tar.json`, torch 2.15 run on each):
/// the payload torch ran is reported called in a pickle marked read by
/// torch.load, whatever names it (a PAX `path` record, the last of two
/// members, behind a storage's or a tensor record's raw bytes, a PAX value
/// whose last byte is not a newline, a PAX header or a GNU long name whose
/// size says less than its block holds); the one torch did not run (the
/// first of two) is reported, not marked read, and the file is ambiguous.
#[test]
fn tar_members_are_named_as_torch_names_them() {
    use ptload_reader::scan::Usage;
    let text = std::fs::read_to_string(root().join("tests/scan/torch_tar.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = doc.as_object().unwrap();
    assert_eq!(files.len(), 11);
    for (name, facts) in files {
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap();
        let print = |reachable: bool| {
            report.pickles.iter().any(|p| {
                p.reachable == reachable
                    && p.globals
                        .iter()
                        .any(|g| g.path() == "builtins.print" && g.usage == Usage::Called)
            })
        };
        assert!(report.level() >= Level::UnknownCall, "{name}");
        if facts["payload_ran"] == true {
            assert!(
                print(true),
                "{name}: the payload torch ran is read by torch.load"
            );
        } else {
            assert!(print(false) && !print(true), "{name}");
            assert!(report.level() >= Level::Ambiguous, "{name}");
        }
    }
}

/// An archive of many records (20,000 storages) is scanned on a second
/// thread while it is decoded (`OpenOptions::scan`): the same tensors as
/// a plain open, the scanner's report kept for `suspicious` (the same as
/// a scan of the bytes), and `refuse_at` decided on it.
#[test]
fn a_large_archive_scanned_while_decoded_reads_and_reports_alike() {
    use ptload_reader::{Checkpoint, OpenOptions};
    let path = root().join("fixtures/files/many_tensors.pt");
    let plain = Checkpoint::open(&path).expect("open");
    let scanned = OpenOptions::new().scan(true).open(&path).expect("open");
    assert_eq!(plain.len(), scanned.len());
    assert!(plain.len() >= 20_000);
    for (a, b) in plain.tensors().zip(scanned.tensors()) {
        assert_eq!(a.info(), b.info());
    }
    let bytes = std::fs::read(&path).expect("read");
    let report = ptload_reader::scan::scan_bytes(&bytes, &ptload_reader::Limits::default());
    let from_report: Vec<String> = report
        .pickles
        .iter()
        .flat_map(|p| &p.globals)
        .filter(|g| g.level() >= Level::UnknownCall)
        .map(|g| g.path())
        .collect();
    let found: Vec<String> = scanned
        .suspicious()
        .expect("kept")
        .iter()
        .map(|g| g.path())
        .collect();
    assert_eq!(found, from_report);
    // Torch's own file of plain tensors: not refused even at needs-code;
    // its report says clean.
    assert_eq!(report.level(), Level::Clean);
    OpenOptions::new()
        .refuse_at(Some(Level::NeedsCode))
        .open(&path)
        .expect("clean");
}

/// Enum members (`tests/scan/torch_enum.json`, each file loaded by torch
/// with its package importable): a class of a package or `__main__` (not
/// the standard library, torch or numpy) called with one constant is an
/// enum member looked up, at needs-code like the model's classes, beside
/// a model of its package or alone (a user's enum in hyper-parameters);
/// the same call of a standard library class stays an unknown call. The
/// limit, tested as such: a class of the model's package whose
/// constructor does something (it logs a marker, which torch ran) is
/// looked up the same way, as its code would run if the class were
/// instantiated.
#[test]
fn enum_members_of_a_package_need_code() {
    use ptload_reader::scan::Usage;
    let text = std::fs::read_to_string(root().join("tests/scan/torch_enum.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let usage = |name: &str, global: &str| {
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap();
        report
            .pickles
            .iter()
            .flat_map(|p| &p.globals)
            .find(|g| g.path() == global)
            .map(|g| g.usage)
            .unwrap_or_else(|| panic!("{name}: no {global}"))
    };
    for name in [
        "en_model_enum.pt",
        "en_main_enum.pt",
        "en_lone_enum.pt",
        "en_stdlib_call.pt",
    ] {
        assert_eq!(doc[name]["weights_only_false"], "loads", "{name}");
        assert_eq!(doc[name]["payload_ran"], false, "{name}");
    }
    let format = "ptload_enum_model.format.Format";
    assert_eq!(usage("en_model_enum.pt", format), Usage::LookedUp);
    assert_eq!(
        usage("en_main_enum.pt", "__main__.EnColor"),
        Usage::LookedUp
    );
    assert_eq!(usage("en_lone_enum.pt", format), Usage::LookedUp);
    assert_eq!(
        usage("en_stdlib_call.pt", "calendar.TextCalendar"),
        Usage::Called
    );
    // Given a path, no enum's value: a call, which torch ran.
    assert_eq!(doc["en_class_given_path.pt"]["payload_ran"], true);
    assert_eq!(
        usage("en_class_given_path.pt", "ptload_enum_model.runner.Runner"),
        Usage::Called
    );
    // A function in a namedtuple put in a set, or in a frozen dataclass
    // used as a key: hashed, never called (torch ran nothing).
    for name in ["en_namedtuple_set.pt", "en_frozen_key.pt"] {
        assert_eq!(doc[name]["weights_only_false"], "loads", "{name}");
        assert_eq!(doc[name]["payload_ran"], false, "{name}");
        assert_eq!(
            usage(name, "ptload_enum_model.configs.warmup"),
            Usage::Referenced,
            "{name}"
        );
    }
    // The limit: torch ran the class's constructor, reported looked up.
    assert_eq!(doc["en_model_class_call.pt"]["payload_ran"], true);
    assert_eq!(
        usage("en_model_class_call.pt", "ptload_enum_model.runner.Runner"),
        Usage::LookedUp
    );
}

/// A callable hidden behind more values than the scanner follows from one
/// object (a namespace padded with 5,000 entries, then given to `str`)
/// fails closed: the pickle is ambiguous, never clean.
#[test]
fn a_padded_object_fails_closed() {
    use ptload_reader::scan::scan_bytes;
    let mut p = b"\x80\x02cbuiltins\nstr\ncargparse\nNamespace\n)\x81}(".to_vec();
    for i in 0..5000u32 {
        let key = format!("k{i}");
        p.push(b'X');
        p.extend_from_slice(&(key.len() as u32).to_le_bytes());
        p.extend_from_slice(key.as_bytes());
        p.extend_from_slice(b"K\x01");
    }
    p.extend_from_slice(b"X\x05\x00\x00\x00zzzzzcsomepkg\nfrob\nub\x85R.");
    let report = scan_bytes(&p, &Limits::default());
    assert!(report.level() >= Level::Ambiguous, "{:?}", report.verdict());
    assert!(
        report
            .ambiguities
            .iter()
            .any(|a| a.what.contains("more than the scanner follows")),
        "{:?}",
        report.ambiguities
    );
}

/// Classes whose own finalizer removes a directory their state names
/// (numpy's `DataSource` and `Repository` with `_istmpdest`, transformers'
/// `NeptuneCallback`): made, filled by BUILD and dropped, with nothing
/// else callable in the file, they are dangerous (hand-made pickles; the
/// shapes torch ran in a blind corpus).
#[test]
fn finalizers_that_remove_what_their_state_names_are_dangerous() {
    for (class, key) in [
        ("numpy.lib._datasource\nDataSource\n", "_destpath"),
        ("numpy.lib._datasource\nRepository\n", "_destpath"),
        (
            "transformers.integrations.integration_utils\nNeptuneCallback\n",
            "_volatile_checkpoints_dir",
        ),
    ] {
        let mut p = b"\x80\x02c".to_vec();
        p.extend_from_slice(class.as_bytes());
        p.extend_from_slice(b")\x81}");
        p.extend_from_slice(&s(key));
        p.extend_from_slice(&s("/tmp/victim"));
        p.extend_from_slice(b"sb0N.");
        let report = ptload_reader::scan::scan_bytes(&p, &Limits::default());
        assert!(report.pickles[0].complete, "{class}: {report:#?}");
        assert_eq!(report.verdict(), Dangerous, "{class}: {report:#?}");
    }
}

/// Callables whose effect the catalogue names (files written, a compiler
/// run, a handler registered, the network) are dangerous when called,
/// whatever the argument; methods named by an attribute path are judged
/// by their own name (`chararray.tofile`), and unknown callables by the
/// words of theirs (`to_json_file`, `cached_assets_path`). Hand-made
/// pickles of the shapes the blind corpora used.
#[test]
fn callables_of_a_known_effect_are_dangerous_when_called() {
    for global in [
        "torch.profiler\ntensorboard_trace_handler\n",
        "torch.utils.hipify.hipify_python\nhipify\n",
        "torch._logging._internal\n_init_logs\n",
        "PIL.PdfParser\nPdfParser\n",
        "filelock\nFileLock\n",
        "triton.runtime.build\n_build\n",
        "codecs\nregister_error\n",
        "httpx2\nget\n",
        "numpy._core.defchararray\nchararray.tofile\n",
        "transformers.configuration_utils\nPreTrainedConfig.to_json_file\n",
        "huggingface_hub.utils._cache_assets\ncached_assets_path\n",
    ] {
        let report = called_with_a_string(global);
        assert_eq!(report.verdict(), Dangerous, "{global:?}: {report:#?}");
    }
}

/// The callables a nineteenth blind corpus ran under torch 2.15 (each
/// called with a string), by what they do: torch.distributed's stores,
/// rendezvous and process groups (files, sockets), its object collectives
/// (unpickle a tensor's bytes) and remote-module templates (exec), torch's
/// process starters, unittest's program and loader, torch's and
/// networkx's importers by name, numpy's data source `open`, mpmath's
/// `identify` and pygments' loaders from files (eval, exec); and, by their
/// words, `open` and readers of files. torch.distributed's data (its
/// errors, backends, option structs) and the tensor and checkpoint types
/// under it are not dangerous.
#[test]
fn callables_of_the_nineteenth_corpus_are_dangerous_when_called() {
    let call = |global: &str| called_with_a_string(global).verdict();
    for global in [
        "torch.distributed\nFileStore\n",
        "torch.distributed\nTCPStore\n",
        "torch.distributed\ninit_process_group\n",
        "torch._C._distributed_c10d\nFileStore\n",
        "torch.distributed.distributed_c10d\n_tensor_to_object\n",
        "torch.distributed.distributed_c10d\nbroadcast_object_list\n",
        "torch.distributed.rendezvous\nrendezvous\n",
        "torch.distributed.nn.jit.instantiator\n_do_instantiate_remote_module_template\n",
        "torch.distributed.elastic.multiprocessing\nstart_processes\n",
        "torch.multiprocessing\nstart_processes\n",
        "torch.multiprocessing.spawn\nstart_processes\n",
        "unittest\nTestProgram\n",
        "unittest.loader\nTestLoader\n",
        "torch.utils._import_utils\n_check_module_exists\n",
        "networkx.lazy_imports\n_lazy_import\n",
        "somepkg.lazy\nlazy_import\n",
        "numpy.lib._datasource\nopen\n",
        "mpmath\nidentify\n",
        "mpmath.identification\nidentify\n",
        "pygments.lexers\nload_lexer_from_file\n",
        "pygments.formatters\nload_formatter_from_file\n",
        "somepkg.io\nopen\n",
        "somepkg.config\nload_from_file\n",
        "somepkg.config\nreadFiles\n",
    ] {
        assert_eq!(call(global), Dangerous, "{global:?}");
    }
    for global in [
        "torch.distributed.distributed_c10d\nBackend\n",
        "torch.distributed\nDistBackendError\n",
        "torch.distributed\nAllreduceOptions\n",
        "somepkg.models\nOpenAIGPTConfig\n",
    ] {
        assert_ne!(call(global), Dangerous, "{global:?}");
    }
    // A placement and checkpoint metadata are constructed and filled when
    // they pickle; called with a string they are library calls, not the
    // network.
    for global in [
        "torch.distributed.tensor.placement_types\nShard\n",
        "torch.distributed.checkpoint.metadata\nChunkStorageMetadata\n",
    ] {
        let report = called_with_a_string(global);
        assert_eq!(
            report.pickles[0].globals[0].class,
            GlobalClass::Dangerous(Danger::LibraryCall),
            "{global:?}"
        );
    }
}

/// Callables a survey of the installed packages found to unpickle,
/// evaluate, load native code, import, start processes, reach the network
/// or write files from the arguments they are given, and the twentieth
/// and twenty-first blind corpora's, listed in
/// tests/scan/survey_callables.json (each with
/// its effect and whether it was confirmed by running or reading it, or
/// only found by the survey's pass): each is dangerous when called,
/// whatever module or words name it.
#[test]
fn callables_a_survey_found_are_dangerous_when_called() {
    let text = std::fs::read_to_string(root().join("tests/scan/survey_callables.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let callables = doc["callables"].as_array().unwrap();
    assert!(callables.len() > 200, "{}", callables.len());
    for c in callables {
        let global = format!(
            "{}\n{}\n",
            c["module"].as_str().unwrap(),
            c["name"].as_str().unwrap()
        );
        let report = called_with_a_string(&global);
        assert_eq!(report.verdict(), Dangerous, "{c}: {report:#?}");
    }
}

/// An object of a class of the standard library the scanner has no entry
/// for, made without its `__init__` by any of the three ways a pickle can
/// (NEWOBJ, `copyreg.__newobj__`, `copyreg._reconstructor`), is library
/// code acting on the file's state; the standard library's mappings and
/// builtin types, a model's class and torch's are not. A function (not
/// only a wrapper) under the name of a method torch's or a library's own
/// code calls on the object is called; under another name it is kept.
/// An object of a library outside the model libraries, a torch data pipe
/// and a tool of torch's (outside the parts models are made of) call a
/// library's callable they hold; their own package's and a model's own
/// function they keep.
#[test]
fn library_objects_and_functions_under_method_names() {
    use ptload_reader::scan::scan_bytes;
    let frame: &[u8] = b"ctraceback\nFrameSummary\n";
    let slots = [&b"N}"[..], &s("filename"), &s("victim.txt"), b"s\x86b"].concat();
    let named =
        |class: &[u8], key: &str, value: &[u8]| [class, b")\x81}", &s(key), value, b"sb"].concat();
    let linear: &[u8] = b"ctorch.nn.modules.linear\nLinear\n";
    let config: &[u8] = b"ctransformers.models.bert.configuration_bert\nBertConfig\n";
    let own_function: &[u8] = b"cmymodels.net\nshow\n";
    let pipe: &[u8] = b"ctorch.utils.data.datapipes.iter.callable\nMapperIterDataPipe\n";
    let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
        (
            "a FrameSummary by NEWOBJ",
            [frame, b")\x81", &slots].concat(),
            Dangerous,
        ),
        (
            "a FrameSummary by copyreg.__newobj__",
            [b"ccopyreg\n__newobj__\n", frame, b"\x85R", &slots].concat(),
            Dangerous,
        ),
        (
            "a FrameSummary by copyreg._reconstructor",
            [
                b"ccopyreg\n_reconstructor\n",
                frame,
                b"cbuiltins\nobject\nN\x87R",
                &slots,
            ]
            .concat(),
            Dangerous,
        ),
        (
            "a ChainMap of a dict",
            named(b"ccollections\nChainMap\n", "maps", b"]}a"),
            Clean,
        ),
        (
            "a model package's class",
            b"cmymodels.net\nNet\n)\x81}b".to_vec(),
            NeedsCode,
        ),
        ("torch's Linear", [linear, b")\x81}b"].concat(), NeedsCode),
        (
            "a model package's function as a module's extra_repr",
            named(linear, "extra_repr", own_function),
            UnknownCall,
        ),
        (
            "a library function as a module's extra_repr",
            named(linear, "extra_repr", b"csysconfig\n_main\n"),
            Dangerous,
        ),
        (
            "a model package's function as a module's attribute",
            named(linear, "act", own_function),
            NeedsCode,
        ),
        (
            "a function as a config's to_json_string",
            named(config, "to_json_string", own_function),
            UnknownCall,
        ),
        (
            "a dtype as a config's value",
            named(config, "torch_dtype", b"ctorch\nfloat16\n"),
            NeedsCode,
        ),
        (
            "a function in an AttributeDict's own dict",
            named(
                b"clightning_fabric.utilities.data\nAttributeDict\n",
                "keys",
                own_function,
            ),
            UnknownCall,
        ),
        (
            "a function as a ParameterDict's items",
            named(
                b"ctorch.nn.modules.container\nParameterDict\n",
                "items",
                own_function,
            ),
            UnknownCall,
        ),
        (
            "a function as a feature extractor's to_json_string",
            named(
                b"ctransformers.models.whisper.feature_extraction_whisper\nWhisperFeatureExtractor\n",
                "to_json_string",
                own_function,
            ),
            UnknownCall,
        ),
        (
            "a function in a Lightning registry's own dict",
            named(
                b"clightning_fabric.accelerators.registry\n_AcceleratorRegistry\n",
                "available_accelerators",
                own_function,
            ),
            UnknownCall,
        ),
        (
            "another library's function held by a networkx view",
            named(
                b"cnetworkx.classes.coreviews\nFilterAtlas\n",
                "NODE_OK",
                b"csysconfig\n_main\n",
            ),
            Dangerous,
        ),
        (
            "a model's function held by a networkx view",
            named(
                b"cnetworkx.classes.coreviews\nFilterAtlas\n",
                "NODE_OK",
                own_function,
            ),
            NeedsCode,
        ),
        (
            "a library's function as a data pipe's fn",
            named(pipe, "fn", b"csysconfig\n_main\n"),
            Dangerous,
        ),
        (
            "a library's function as a data pipe's repr_hook",
            named(pipe, "repr_hook", b"cbuiltins\nprint\n"),
            Dangerous,
        ),
        ("a model's function as a data pipe's fn", named(pipe, "fn", own_function), NeedsCode),
        (
            "a builtin as a data pipe's fn",
            named(pipe, "fn", b"cbuiltins\nabs\n"),
            NeedsCode,
        ),
        (
            "a library's function in a torch profiler's own dict",
            named(
                b"ctorch.autograd.profiler\nprofile\n",
                "_ensure_function_events",
                b"csysconfig\n_main\n",
            ),
            Dangerous,
        ),
        (
            "torch's own class in a weak-key dictionary",
            named(
                b"ctorch.utils.weak\nWeakIdKeyDictionary\n",
                "ref_type",
                b"ctorch.utils.weak\nWeakIdRef\n",
            ),
            NeedsCode,
        ),
        (
            "a library's function as a Linear's attribute",
            named(linear, "act", b"csysconfig\n_main\n"),
            NeedsCode,
        ),
        (
            "torch's own chunk class in a batching pipe",
            named(
                b"ctorch.utils.data.datapipes.iter.grouping\nBatcherIterDataPipe\n",
                "wrapper_class",
                b"ctorch.utils.data.datapipes.datapipe\nDataChunk\n",
            ),
            NeedsCode,
        ),
        (
            "networkx's own filter held by its view",
            named(
                b"cnetworkx.classes.coreviews\nFilterAtlas\n",
                "NODE_OK",
                b"cnetworkx.classes.filters\nno_filter\n",
            ),
            NeedsCode,
        ),
        (
            "math's cos held by an mpmath solver",
            named(
                b"cmpmath.calculus.optimization\nSecant\n",
                "f",
                b"cmath\ncos\n",
            ),
            NeedsCode,
        ),
        (
            "a function as a namespace's numel",
            named(b"ctypes\nSimpleNamespace\n", "numel", own_function),
            UnknownCall,
        ),
        (
            "a function as a namespace's value",
            named(b"ctypes\nSimpleNamespace\n", "act", own_function),
            NeedsCode,
        ),
    ];
    for (what, object, verdict) in cases {
        // The object the load returns, in a dict (not the first pickle,
        // which torch compares with its magic number).
        let object = [b"}", &s("extra")[..], &object, b"s"].concat();
        let report = scan_bytes(&legacy_file(&object, b"]"), &Limits::default());
        assert!(
            report.pickles.iter().all(|p| p.complete),
            "{what}: {report:#?}"
        );
        assert_eq!(report.verdict(), verdict, "{what}: {report:#?}");
    }
}

/// Each file of the nineteenth and twentieth corpora's callables did
/// what it was made to do under torch 2.15 (torch_callables.json: a file
/// made, emptied or read in the loading process's folder, `this` or a watched
/// module imported, a socket listening, a child process's line, a line a
/// payload printed):
/// the scan puts every one at `dangerous`.
#[test]
fn callables_torch_ran_are_dangerous() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_callables.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = doc.as_object().unwrap();
    assert_eq!(files.len(), 44);
    for (name, facts) in files {
        let happened = facts["files_made"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
            || facts["victim_changed"] == true
            || facts["victim_read"] == true
            || facts["imported_this"] == true
            || facts["listens"] == true
            || facts["printed_the_zen"] == true
            || facts["child_process_printed"] == true
            || facts["printed"].as_array().is_some_and(|p| !p.is_empty())
            || facts["imported_model_packages"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
            || facts["imported_watched"]
                .as_array()
                .is_some_and(|m| !m.is_empty())
            || facts["pytree_registered"]
                .as_array()
                .is_some_and(|t| !t.is_empty())
            // A test module's `unittest.main()` run on import ends the
            // process (its arguments are the loader's).
            || facts["weights_only_false"] == "SystemExit";
        assert!(happened, "{name}: nothing happened under torch: {facts}");
        let path = root().join("tests/scan").join(name);
        let report = scan_file(&path, &Limits::default(), false).unwrap();
        assert_eq!(report.verdict(), Dangerous, "{name}: {report:#?}");
    }
}

/// A tar's number fields and PAX sizes are read as Python's tarfile reads
/// them (`nti`: base-256, `int(text, 8)` with a `0o` prefix and
/// underscores, text cut at a NUL; a PAX size by `int`), and a global
/// PAX size sets how much of a member is read but not where the next
/// header is: in each file the `pickle` member that torch reads holds the
/// payload (hand-made, the shapes a blind corpus ran under torch 2.15).
#[test]
fn tar_number_fields_read_as_tarfile_reads_them() {
    use ptload_reader::scan::scan_bytes;
    fn member(out: &mut Vec<u8>, name: &str, size_field: &[u8], kind: u8, data: &[u8]) {
        out.extend(tar_header(name, size_field, kind, ""));
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    let payload: &[u8] = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R.";
    let empty: &[u8] = b"\x80\x02}.";
    let octal = |n: usize| format!("{n:011o}\0").into_bytes();
    let n = payload.len();
    let mut base256_field = vec![0x80u8];
    base256_field.extend_from_slice(&[0u8; 3]);
    base256_field.extend_from_slice(&(n as u64).to_be_bytes());
    for (what, field) in [
        ("0o prefix", format!("0o{n:o}\0").into_bytes()),
        ("underscores", {
            let digits = format!("{n:o}");
            let spaced: Vec<String> = digits.chars().map(String::from).collect();
            format!("{}\0", spaced.join("_")).into_bytes()
        }),
        ("text cut at a NUL", format!("{n:o}\0junk").into_bytes()),
        ("base-256", base256_field.clone()),
    ] {
        let mut file = Vec::new();
        member(&mut file, "sys_info", &octal(empty.len()), b'0', empty);
        member(&mut file, "pickle", &field, b'0', payload);
        file.extend(vec![0u8; 1024]);
        let report = scan_bytes(&file, &Limits::default());
        assert_eq!(report.layout, "tar", "{what}");
        assert_eq!(report.verdict(), Dangerous, "{what}: {report:#?}");
    }
    // A global PAX size: the benign `pickle` is read 4096 bytes long, but
    // the next header follows its own size, and torch reads the last
    // `pickle`, the payload.
    let mut file = Vec::new();
    let body = "size=1024\n";
    let record = format!("{} {body}", body.len() + 3);
    member(
        &mut file,
        "pax",
        &octal(record.len()),
        b'g',
        record.as_bytes(),
    );
    member(&mut file, "sys_info", &octal(empty.len()), b'0', empty);
    member(&mut file, "pickle", &octal(empty.len()), b'0', empty);
    member(&mut file, "pickle", &octal(n), b'0', payload);
    file.extend(vec![0u8; 1024]);
    let report = scan_bytes(&file, &Limits::default());
    assert_eq!(report.verdict(), Dangerous, "{report:#?}");
    // A header whose size no reader takes: the listing stops there,
    // ambiguous rather than clean.
    let mut file = Vec::new();
    member(&mut file, "sys_info", &octal(empty.len()), b'0', empty);
    member(&mut file, "junk", b"9zz\0", b'0', b"");
    member(&mut file, "pickle", &octal(n), b'0', payload);
    file.extend(vec![0u8; 1024]);
    let report = scan_bytes(&file, &Limits::default());
    assert_eq!(report.verdict(), Ambiguous, "{report:#?}");
}

/// The calls a tenth blind corpus made torch run, one per class, in
/// hand-made pickles: an object whose `node` is a `functools.partial` of
/// a function the scanner does not know (`somepkg.sink`) is called where
/// Python would call it (a partial called is a gadget: dangerous), and
/// only referenced where nothing calls it (needs-code).
#[test]
fn calls_of_the_tenth_corpus_classes_are_found() {
    use ptload_reader::scan::scan_bytes;
    let partial = b"cfunctools\npartial\ncsomepkg\nsink\n\x85R".to_vec();
    // `somepkg.Thing()` filled with `{name: partial(sink)}`.
    let thing = |name: &str| {
        let mut out = b"csomepkg\nThing\n)\x81}".to_vec();
        out.extend(s(name));
        out.extend(&partial);
        out.extend(b"sb");
        out
    };
    let node = thing("node");
    // `somepkg.Filtered()` filled with `{"NODE_OK": somepkg.sink}`, the
    // function itself.
    let filtered = {
        let mut out = b"csomepkg\nFiltered\n)\x81}".to_vec();
        out.extend(s("NODE_OK"));
        out.extend(b"csomepkg\nsink\nsb");
        out
    };
    let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
        (
            "Counter of a tuple of a tuple of an object: hashed however deep",
            pickle(&[b"ccollections\nCounter\n]", &node, b"\x85\x85a\x85R"]),
            Dangerous,
        ),
        (
            "an object appended to a bytearray: converted",
            pickle(&[b"cbuiltins\nbytearray\n)R", &node, b"a"]),
            Dangerous,
        ),
        (
            "an object appended to a list: stored",
            pickle(&[b"]", &node, b"a"]),
            NeedsCode,
        ),
        (
            "a defaultdict's factory that carries arguments",
            pickle(&[b"ccollections\ndefaultdict\n", &partial, b"\x85R"]),
            Dangerous,
        ),
        (
            "a defaultdict of lists",
            pickle(&[b"ccollections\ndefaultdict\ncbuiltins\nlist\n\x85R"]),
            Clean,
        ),
        (
            "a weak reference's callback",
            pickle(&[b"cweakref\nref\n]", &node, b"\x86\x81"]),
            Dangerous,
        ),
        (
            "a module whose _parameters is an object",
            pickle(&[
                b"ctorch.nn.modules.linear\nLinear\n)\x81}",
                &s("_parameters"),
                &node,
                b"sb",
            ]),
            Dangerous,
        ),
        (
            "a module whose _parameters is an OrderedDict",
            pickle(&[
                b"ctorch.nn.modules.linear\nLinear\n)\x81}",
                &s("_parameters"),
                b"ccollections\nOrderedDict\n)R",
                &s("act"),
                &partial,
                b"sb",
            ]),
            NeedsCode,
        ),
        (
            "a state that is a tuple, an object in its tuples",
            pickle(&[b"csomepkg\nArr\n)\x81(K\x01", &node, b"\x85K\x00tb"]),
            Dangerous,
        ),
        (
            "a returned object whose teardown is a partial",
            pickle(&[&thing("teardown")]),
            Dangerous,
        ),
        (
            "a returned object holding a partial under another name",
            pickle(&[&thing("act")]),
            NeedsCode,
        ),
        // The eleventh corpus's classes.
        (
            "a wrapper under the name of a method torch's Module calls",
            pickle(&[
                b"ctorch.nn.modules.linear\nLinear\n)\x81}",
                &s("register_parameter"),
                &partial,
                b"sb",
            ]),
            Dangerous,
        ),
        (
            "a wrapper under a name no base class calls",
            pickle(&[
                b"ctorch.nn.modules.linear\nLinear\n)\x81}",
                &s("norm_layer"),
                &partial,
                b"sb",
            ]),
            NeedsCode,
        ),
        (
            "a slot state set through the class's own __setattr__",
            pickle(&[
                b"csomepkg\nOutputLike\n)\x81}",
                &s("helper"),
                &partial,
                b"s}",
                &s("x"),
                b"K\x01s\x86b",
            ]),
            Dangerous,
        ),
        (
            "a second BUILD runs the class's code with what the first set",
            pickle(&[
                b"csomepkg\nSparsifier\n)\x81}",
                &s("helper"),
                &partial,
                b"sb}b",
            ]),
            Dangerous,
        ),
        (
            "a returned object of a class whose __del__ calls through it",
            pickle(&[
                b"ctorch.cuda._sanitizer\nCUDASanitizer\n)\x81}",
                &s("dispatch"),
                &node,
                b"sb",
            ]),
            Dangerous,
        ),
        // The twelfth's: a rebuild's state, set by `setattr` on the tensor.
        (
            "a rebuild's state with a wrapper under a Tensor method's name",
            pickle(&[
                b"ctorch._utils\n_rebuild_parameter_with_state\n(N\x88ccollections\nOrderedDict\n)R}",
                &s("set_"),
                &partial,
                b"stR",
            ]),
            Dangerous,
        ),
        (
            "a rebuild's state with a wrapper under another name",
            pickle(&[
                b"ctorch._utils\n_rebuild_parameter_with_state\n(N\x88ccollections\nOrderedDict\n)R}",
                &s("init_fn"),
                &partial,
                b"stR",
            ]),
            NeedsCode,
        ),
        (
            "a subclass's rebuild state holding an object a setter uses",
            pickle(&[
                b"ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._utils\n_rebuild_tensor_v2\ncsomepkg\nNested\n)}",
                &s("_metadata_cache"),
                &node,
                b"stR",
            ]),
            Dangerous,
        ),
        (
            "a parameter's rebuild state holding an object",
            pickle(&[
                b"ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._utils\n_rebuild_tensor_v2\nctorch.nn.parameter\nParameter\n)}",
                &s("_metadata_cache"),
                &node,
                b"stR",
            ]),
            NeedsCode,
        ),
        // The thirteenth's: `func(*args)` of a rebuild, a dict's values
        // among the arguments.
        (
            "a rebuild's func given a dict holding an object",
            pickle(&[
                b"ctorch._tensor\n_rebuild_from_type_v2\n(ctorch.nested._internal.nested_tensor\n_rebuild_njt\nctorch\nTensor\n}",
                &s("_metadata_cache"),
                &node,
                b"s\x85}tR",
            ]),
            Dangerous,
        ),
        // The fourteenth's: an object of a class the scanner does not
        // know, iterated, measured or tested for truth by a rebuild, runs
        // its own protocol, which may call a function it keeps as an
        // attribute (networkx's `FilterAtlas` calls `NODE_OK(key)` for
        // each key).
        (
            "a rebuild's args: an object keeping a bare function as an attribute",
            pickle(&[
                b"ctorch._tensor\n_rebuild_from_type_v2\n(ctorch\nTensor\nctorch\nTensor\n",
                &filtered,
                b"}tR",
            ]),
            UnknownCall,
        ),
        (
            "a rebuild's state: an object keeping a bare function as an attribute",
            pickle(&[
                b"ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._utils\n_rebuild_tensor\nctorch.nn\nParameter\n)",
                &filtered,
                b"tR",
            ]),
            UnknownCall,
        ),
        // The same object hashed (a dict's key) runs `__hash__`, which is
        // given nothing; a bare function a class's `__new__` was given (a
        // namedtuple's field) is no attribute.
        (
            "an object keeping a bare function, as a key",
            pickle(&[b"}", &filtered, b"K\x01s"]),
            NeedsCode,
        ),
        (
            "a rebuild's args: a namedtuple with a bare function field",
            pickle(&[
                b"ctorch._tensor\n_rebuild_from_type_v2\n(ctorch\nTensor\nctorch\nTensor\ncsomepkg\nPair\n",
                &s("warm"),
                b"csomepkg\nsink\n\x86\x81}tR",
            ]),
            NeedsCode,
        ),
        // The fifteenth's harmless file: a datapipe of plain data (its
        // finalizer is catalogued, its buffer holds numbers); a datapipe's
        // serialization wrapper unpickles the bytes of its state.
        (
            "a shuffling datapipe of numbers",
            pickle(&[
                b"ctorch.utils.data.datapipes.iter.combinatorics\nShufflerIterDataPipe\n)\x81}",
                &s("_buffer"),
                b"](K\x01K\x02esb",
            ]),
            NeedsCode,
        ),
        (
            "a datapipe's serialization wrapper",
            pickle(&[
                b"ctorch.utils.data.datapipes.datapipe\n_IterDataPipeSerializationWrapper\n)\x81",
                b"C\x02..\x89\x86b",
            ]),
            Dangerous,
        ),
        // The sixteenth's: a legacy `module` persistent id whose
        // container is an object the pickle made (a module object with a
        // chosen `__name__`): torch's source check writes
        // `<__name__>.patch`. A class there is what torch.save writes.
        (
            "a legacy module id holding a made module object",
            pickle(&[
                b"(",
                &s("module"),
                b"ctypes\nModuleType\n",
                &s("/tmp/x"),
                b"\x85R",
                &s("x.py"),
                &s("source"),
                b"tQ",
            ]),
            Dangerous,
        ),
        (
            "a legacy module id holding a class",
            pickle(&[
                b"(",
                &s("module"),
                b"ctorch.nn.modules.linear\nLinear\n",
                &s("linear.py"),
                &s("source"),
                b"tQ",
            ]),
            NeedsCode,
        ),
        (
            "an aware datetime's zone",
            pickle(&[
                b"cbuiltins\ngetattr\nczoneinfo\nZoneInfo\n",
                &s("_unpickle"),
                b"\x86R",
                &s("UTC"),
                b"K\x01\x86R",
            ]),
            Clean,
        ),
        (
            "Python's random generator",
            pickle(&[b"crandom\nRandom\n)R(K\x03(K\x01K\x02tNtb"]),
            Clean,
        ),
    ];
    // Each as the object of a legacy stream (the fourth pickle, which
    // torch returns), after the magic number, the protocol and sys_info,
    // before empty storage keys.
    let legacy = |object: &[u8]| {
        let mut out = b"\x80\x02\x8a\x0a".to_vec();
        out.extend_from_slice(&[0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19]);
        out.push(b'.');
        out.extend_from_slice(b"\x80\x02M\xe9\x03.\x80\x02}.");
        out.extend_from_slice(object);
        out.extend_from_slice(b"\x80\x02].");
        out
    };
    for (what, bytes, verdict) in cases {
        let report = scan_bytes(&legacy(&bytes), &Limits::default());
        assert_eq!(report.pickles.len(), 5, "{what}: {report:#?}");
        assert!(
            report.pickles.iter().all(|p| p.complete),
            "{what}: {report:#?}"
        );
        assert_eq!(report.verdict(), verdict, "{what}: {report:#?}");
    }
    // A legacy stream whose magic number is made by a call: torch's `!=`
    // may find it equal and read on, so the storage keys (the fifth
    // pickle) are torch's data, used: an object among them is hashed.
    let mut stream = pickle(&[
        b"cbuiltins\nint\n",
        &s("1950a86a20f9469cfc6c"),
        b"K\x10\x86R",
    ]);
    stream.extend(pickle(&[b"M\xe9\x03"]));
    stream.extend(pickle(&[b"}"]));
    stream.extend(pickle(&[b"}"]));
    stream.extend(pickle(&[b"]", &node, b"a"]));
    let report = scan_bytes(&stream, &Limits::default());
    assert_eq!(report.verdict(), Dangerous, "{report:#?}");
}

#[test]
fn objects_that_act_on_their_own_state_are_dangerous() {
    use ptload_reader::scan::scan_bytes;
    // `cls.__new__(cls)` filled with `{field: value}`: no callable given,
    // the class's own code acts on the strings and numbers.
    let made = |class: &str, field: &str, value: &[u8]| {
        let mut out = format!("c{}\n", class.replacen(' ', "\n", 1)).into_bytes();
        out.extend_from_slice(b")\x81}");
        out.extend(s(field));
        out.extend_from_slice(value);
        out.extend(b"sb");
        out
    };
    let lazy_file = made("typer._click.utils LazyFile", "name", &s("/tmp/x"));
    let opener = made(
        "torch.utils.data.datapipes.iter.fileopener FileOpenerIterDataPipe",
        "mode",
        &s("a"),
    );
    let requirement = made(
        "lightning_utilities.core.imports RequirementCache",
        "module",
        &s("this"),
    );
    let observer = made(
        "torch.profiler.profiler ExecutionTraceObserver",
        "_output_file_path",
        &s("/tmp/x"),
    );
    let gds = made("torch.cuda.gds GdsFile", "fd", b"KM");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "a vendored click's lazy file, iterated by set()",
            pickle(&[b"cbuiltins\nset\n", &lazy_file, b"\x85R"]),
        ),
        (
            "a file-opening datapipe, iterated by Counter()",
            pickle(&[b"ccollections\nCounter\n", &opener, b"\x85R"]),
        ),
        (
            "a requirement cache, tested for truth by any()",
            pickle(&[b"cbuiltins\nany\n", &requirement, b"\x85\x85R"]),
        ),
        (
            "a trace observer dropped while loading",
            pickle(&[&observer, b"0N"]),
        ),
        (
            "a GDS file kept in the result",
            pickle(&[b"}", &s("f"), &gds, b"s"]),
        ),
    ];
    for (what, bytes) in cases {
        let report = scan_bytes(&bytes, &Limits::default());
        assert_eq!(report.verdict(), Dangerous, "{what}: {report:#?}");
    }
    // A class of the same packages that only holds data stays as it was.
    let plain = pickle(&[&made("typer.models ParameterInfo", "default", &s("x"))]);
    assert_eq!(scan_bytes(&plain, &Limits::default()).verdict(), NeedsCode);
}

/// Pre-1.0 tar checkpoints whose `storages` or `tensors` member is a link
/// (`tests/scan/torch_tar_links.json`, torch 2.15 run on each): torch
/// extracted it to disk, so a hard link's target got the member's mode and
/// was read, and a symbolic link's target was unpickled, though the
/// archive holds a member of the target's name. Each is dangerous, by an
/// effect on that member.
#[test]
fn links_among_the_tar_members_torch_extracts_are_dangerous() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_tar_links.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = doc.as_object().unwrap();
    assert_eq!(files.len(), 3);
    for (name, facts) in files {
        assert_eq!(facts["target_unpickled"], true, "{name}: {facts}");
        let path = root().join("tests/scan").join(name);
        let report = scan_file(&path, &Limits::default(), false).unwrap();
        assert_eq!(report.layout, "tar", "{name}");
        assert_eq!(report.verdict(), Dangerous, "{name}: {report:#?}");
        let member = facts["member"].as_str().unwrap();
        assert!(
            report.effects.iter().any(|e| e.record == member),
            "{name}: {report:#?}"
        );
    }
}

/// A call the scanner has no entry for is judged by whose code it is:
/// into the standard library, torch or a package every loading machine
/// has, no checkpoint makes it (`dangerous`, an uncatalogued library
/// call); into a model's own package, `__main__` or the data stack
/// (pandas, whose frames pickle as calls), an unknown call. A library's
/// class called with one word is a call too unless it is a listed enum; a
/// model package's class so called is looked up, and classes only
/// constructed stay below; an object of a library's class whose methods
/// a builtin or torch's OrderedDict runs is library code run (hand-made
/// pickles).
#[test]
fn library_calls_no_checkpoint_makes_are_dangerous() {
    use ptload_reader::scan::scan_bytes;
    let library = GlobalClass::Dangerous(Danger::LibraryCall);
    // NEWOBJ of a mapping class, then BUILD with a table of names.
    let mapping = |class: &[u8]| {
        let mut table = s("_MAPPING_NAMES");
        table.extend_from_slice(b"}");
        table.extend(s("tokenizer"));
        table.extend(s("this"));
        table.extend(s("s"));
        table.extend_from_slice(b"\x86ss");
        built(class, &table)
    };
    // A library's mapping the scanner has no entry for (transformers'
    // lazy tables are listed now, below).
    let lazy = mapping(b"ctransformers.processing_utils\nLazyTable\n");
    let own = mapping(b"cmymodels.tables\nLazyTable\n");
    let listed = mapping(b"ctransformers.processing_utils\n_LazyAutoProcessorMapping\n");
    let listed = scan_bytes(&pickle(&[&listed]), &Limits::default());
    assert_eq!(
        listed.pickles[0].globals[0].class,
        GlobalClass::Dangerous(Danger::Import),
        "{listed:#?}"
    );
    let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
        (
            "a standard library function",
            pickle(&[b"ccalendar\nisleap\nM\xe8\x07\x85R"]),
            Dangerous,
        ),
        (
            "a re-exported name",
            pickle(&[b"ctokenize\n_builtin_open\n", &s("x"), b"\x85R"]),
            Dangerous,
        ),
        (
            "a torch function",
            pickle(&[b"ctorch.utils._pytree\ntree_leaves\n]\x85R"]),
            Dangerous,
        ),
        (
            "an installed package's function",
            pickle(&[b"ctqdm.contrib\nthread_map\n]]\x86R"]),
            Dangerous,
        ),
        (
            "a model package's function",
            pickle(&[b"cmymodels.build\nmake_model\n", &s("resnet"), b"\x85R"]),
            UnknownCall,
        ),
        (
            "a function of __main__",
            pickle(&[b"c__main__\nmake\n)R"]),
            UnknownCall,
        ),
        (
            "a name that only starts like a library's",
            pickle(&[b"ctorchx_models\nmake\n)R"]),
            UnknownCall,
        ),
        (
            "the data stack's reconstructor",
            pickle(&[b"cpandas.core.indexes.base\n_new_Index\n)R"]),
            UnknownCall,
        ),
        // A library's class called with one word is no lookup: its enums
        // are listed by name, and `Popen("pwd")` looks the same.
        (
            "a torch class called with a number",
            pickle(&[b"ctorch.nn.attention\nSDPBackend\nK\x01\x85R"]),
            Dangerous,
        ),
        (
            "a re-export of Popen in CPython's test suite, given a word",
            pickle(&[b"ctest.test_gzip\nPopen\n", &s("pwd"), b"\x85R"]),
            Dangerous,
        ),
        (
            "a library's listed enum",
            pickle(&[b"ctimm.layers.format\nFormat\n", &s("NCHW"), b"\x85R"]),
            Clean,
        ),
        (
            "a model package's enum",
            pickle(&[b"cmymodels.config\nStage\n", &s("fit"), b"\x85R"]),
            NeedsCode,
        ),
        (
            "a standard library class constructed, not called",
            pickle(&[b"ccalendar\nTextCalendar\n)\x81}b"]),
            Dangerous,
        ),
        // An object of a library's class, its methods run by a builtin or
        // by torch's OrderedDict: library code acting on the file's state.
        (
            "a library's mapping given to dict()",
            pickle(&[b"cbuiltins\ndict\n", &lazy, b"\x85R"]),
            Dangerous,
        ),
        (
            "a library's mapping given to OrderedDict()",
            pickle(&[b"ccollections\nOrderedDict\n", &lazy, b"\x85R"]),
            Dangerous,
        ),
        ("a library's mapping only kept", pickle(&[&lazy]), NeedsCode),
        (
            "a model package's mapping given to OrderedDict()",
            pickle(&[b"ccollections\nOrderedDict\n", &own, b"\x85R"]),
            NeedsCode,
        ),
    ];
    for (what, bytes, verdict) in cases {
        let report = scan_bytes(&bytes, &Limits::default());
        assert!(report.pickles[0].complete, "{what}: {report:#?}");
        assert_eq!(report.verdict(), verdict, "{what}: {report:#?}");
        // Dangerous as a library call, or by what its name says (`Popen`).
        let classes: Vec<_> = report.pickles[0].globals.iter().map(|g| g.class).collect();
        let by_name = classes
            .iter()
            .any(|c| matches!(c, GlobalClass::Dangerous(d) if *d != Danger::LibraryCall));
        assert_eq!(
            classes.contains(&library) || by_name,
            verdict == Dangerous,
            "{what}: {classes:?}"
        );
    }
}

/// What the twenty-fifth blind corpus ran under torch 2.15 with nothing
/// called by name: a library's test module only named (importing it runs
/// its tests), an object a library already holds given to a builtin or to
/// torch's `OrderedDict` (a lazy mapping's iteration imports a thousand
/// modules; `str(license)` reads a file), a library's function as a
/// `defaultdict`'s factory (called by the first lookup of a missing key, as
/// `UUID.__setstate__` makes), site's interactive helpers, and a legacy
/// file's storage keys made by a library's class (torch iterates them: a
/// CSV reader reads its file). The same shapes with a model's own code
/// (an unknown call at most), a class's name, a builtin factory or an
/// object only kept stay below (hand-made pickles).
#[test]
fn library_tests_objects_and_factories_run_library_code() {
    use ptload_reader::scan::scan_bytes;
    let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
        (
            "a module of CPython's test suite, only named",
            pickle(&[b"ctest._test_embed_structseq\nTestStructSeq\n"]),
            Dangerous,
        ),
        (
            "a library's test module, only named",
            pickle(&[b"cnumpy._pyinstaller.tests.pyinstaller-smoke\nx\n"]),
            Dangerous,
        ),
        (
            "a model's own test.py, only named",
            pickle(&[b"ctest\nNet\n"]),
            NeedsCode,
        ),
        (
            "a model package's tests, only named",
            pickle(&[b"cmypkg.tests.helpers\nmake\n"]),
            NeedsCode,
        ),
        (
            "a library's mapping given to dict()",
            pickle(&[b"cbuiltins\ndict\nctransformers\nCONFIG_MAPPING\n\x85R"]),
            Dangerous,
        ),
        (
            "a library's mapping given to OrderedDict()",
            pickle(&[b"ccollections\nOrderedDict\nctransformers.models.rag.configuration_rag\nCONFIG_MAPPING\n\x85R"]),
            Dangerous,
        ),
        (
            "a library's mapping only kept",
            pickle(&[b"ctransformers\nCONFIG_MAPPING\n"]),
            NeedsCode,
        ),
        (
            "a library's class given to str()",
            pickle(&[b"cbuiltins\nstr\nctransformers\nBertConfig\n\x85R"]),
            NeedsCode,
        ),
        (
            "a model package's object given to dict()",
            pickle(&[b"cbuiltins\ndict\ncmypkg\nTABLE\n\x85R"]),
            UnknownCall,
        ),
        ("site's licence text", pickle(&[b"cbuiltins\nlicense\n"]), Dangerous),
        ("site's help", pickle(&[b"cbuiltins\nhelp\n"]), Dangerous),
    ];
    for (what, bytes, verdict) in cases {
        let report = scan_bytes(&bytes, &Limits::default());
        assert!(report.pickles[0].complete, "{what}: {report:#?}");
        assert_eq!(report.verdict(), verdict, "{what}: {report:#?}");
    }
    let legacy = legacy_file;
    // A UUID returned by the load, its state a defaultdict: `__setstate__`
    // reads its `int`, and the missing key calls the factory.
    for (what, factory, verdict) in [
        (
            "a library's function",
            &b"ccgi\nprint_directory\n"[..],
            Dangerous,
        ),
        ("a builtin", b"cbuiltins\nlist\n", Clean),
        ("a model package's function", b"cmypkg\nmake\n", NeedsCode),
    ] {
        let mut uuid = b"cuuid\nUUID\n)\x81ccollections\ndefaultdict\n".to_vec();
        uuid.extend_from_slice(factory);
        uuid.extend_from_slice(b"\x85Rb");
        let report = scan_bytes(&legacy(&uuid, b"]"), &Limits::default());
        assert_eq!(report.pickles.len(), 5, "{what}: {report:#?}");
        assert_eq!(
            report.verdict(),
            verdict,
            "{what} as a factory: {report:#?}"
        );
    }
    // A library class without an entry (transformers' pipeline data
    // formats, which read their files when iterated, are listed).
    let csv_reader = b"ctransformers.data.rows\nRowReader\n)\x81}b";
    let listed = b"ctransformers.pipelines.base\nCsvPipelineDataFormat\n)\x81}b";
    let listed = scan_bytes(&pickle(&[listed]), &Limits::default());
    assert_eq!(
        listed.pickles[0].globals[0].class,
        GlobalClass::Dangerous(Danger::FileSystem)
    );
    let keys_made = scan_bytes(&legacy(b"}", csv_reader), &Limits::default());
    assert_eq!(keys_made.pickles.len(), 5, "{keys_made:#?}");
    assert_eq!(keys_made.verdict(), Dangerous, "{keys_made:#?}");
    let class = &keys_made.pickles[4].globals[0];
    assert_eq!(class.class, GlobalClass::Dangerous(Danger::LibraryCall));
    // The same object returned by the load, and plain keys: kept.
    let object_made = scan_bytes(&legacy(csv_reader, b"]"), &Limits::default());
    assert_eq!(object_made.pickles.len(), 5, "{object_made:#?}");
    assert_eq!(object_made.verdict(), NeedsCode, "{object_made:#?}");
}

/// What the twenty-sixth blind corpus ran under torch 2.15 with every
/// call allowlisted: an object of a library class (a lazy table whose
/// lookup imports, a reader whose iteration opens a file) handed to code
/// that consults it as data. As a BUILD state (`UUID.__setstate__` reads
/// `state['int']`), in a persistent id (torch reads the storage type's
/// `dtype`), as a module's `_parameters` (its `__setattr__` asks `name in
/// _parameters`), given to a builtin type's `__new__` by NEWOBJ
/// (`tuple.__new__(tuple, reader)`), or put in the dict of a library
/// object whose own `__setattr__` then runs for a slot state
/// (`PretrainedConfig` looks names up in `attribute_map`). A model
/// package's object in the same places stays below (hand-made pickles).
#[test]
fn library_objects_consulted_as_data_run_library_code() {
    use ptload_reader::scan::scan_bytes;
    // NEWOBJ of a class, then BUILD with a table.
    let made = |class: &[u8]| {
        let mut table = s("table");
        table.extend(s("this"));
        table.extend_from_slice(b"s");
        built(class, &table)
    };
    let library = made(b"ctransformers.data.rows\nRowReader\n");
    let own = made(b"cmymodels.tables\nLazyTable\n");
    // Each place, given the object's bytes.
    type Shape = fn(&[u8]) -> Vec<u8>;
    let shapes: Vec<(&str, Shape)> = vec![
        ("a UUID's state", |m: &[u8]| {
            pickle(&[b"cuuid\nUUID\n)\x81", m, b"b"])
        }),
        ("a persistent id's storage type", |m: &[u8]| {
            let mut pid = b"(".to_vec();
            pid.extend(s("storage"));
            pid.extend_from_slice(m);
            pid.extend(s("0"));
            pid.extend(s("cpu"));
            pid.extend_from_slice(b"K\x04tQ");
            pickle(&[&pid])
        }),
        ("a module's _parameters", |m: &[u8]| {
            let mut module = b"ctorch.nn.modules.activation\nReLU\n)\x81}".to_vec();
            module.extend(s("_parameters"));
            module.extend_from_slice(m);
            module.extend_from_slice(b"sb");
            pickle(&[&module])
        }),
        ("a tuple made by NEWOBJ", |m: &[u8]| {
            pickle(&[b"cbuiltins\ntuple\n", m, b"\x85\x81"])
        }),
        (
            "a config's attribute map, then a slot state",
            |m: &[u8]| {
                let mut config =
                    b"ctransformers.configuration_utils\nPretrainedConfig\n)\x81}".to_vec();
                config.extend(s("attribute_map"));
                config.extend_from_slice(m);
                config.extend_from_slice(b"s}");
                config.extend(s("hidden"));
                config.extend_from_slice(b"K\x01s\x86b");
                pickle(&[&config])
            },
        ),
    ];
    // The twenty-seventh corpus: a table transformers itself holds, only
    // named, in the same places; and one level inside the list given to
    // `dict` or `OrderedDict` (each pair is unpacked), in the arguments
    // of a tensor subclass's rebuild. A model package's table is no
    // library call (a class's name, `BertConfig` or an acronym like a
    // legacy whole model's `GRU`, is passed over: see the tests above and
    // tests/scan/benign_full_legacy.pt).
    let named = b"ctransformers\nMODEL_FOR_TABLE_QUESTION_ANSWERING_MAPPING\n";
    let mut in_places: Vec<(&str, Vec<u8>)> = shapes
        .iter()
        .map(|(what, shape)| (*what, shape(named)))
        .collect();
    in_places.push((
        "a pair in dict()'s list",
        pickle(&[b"cbuiltins\ndict\n]", named, b"a\x85R"]),
    ));
    in_places.push((
        "a pair in OrderedDict()'s list",
        pickle(&[b"ccollections\nOrderedDict\n]", named, b"a\x85R"]),
    ));
    in_places.push((
        "a rebuilt subclass's arguments",
        pickle(&[
            b"ctorch._tensor\n_rebuild_from_type_v2\n(cbuiltins\ntuple\ncbuiltins\ntuple\n",
            named,
            b"\x85}tR",
        ]),
    ));
    for (what, bytes) in &in_places {
        let report = scan_bytes(bytes, &Limits::default());
        let table = report.pickles[0]
            .globals
            .iter()
            .find(|g| g.name.ends_with("_MAPPING"))
            .unwrap_or_else(|| panic!("{what}: {report:#?}"));
        assert_eq!(
            table.class,
            GlobalClass::Dangerous(Danger::LibraryCall),
            "a named library table as {what}: {report:#?}"
        );
    }
    let own_table = scan_bytes(
        &shapes[3].1(b"cmymodels.tables\nTABLE\n"),
        &Limits::default(),
    );
    assert!(own_table.level() < Level::Dangerous, "{own_table:#?}");
    for (what, shape) in &shapes {
        let report = scan_bytes(&shape(&library), &Limits::default());
        assert!(report.pickles[0].complete, "{what}: {report:#?}");
        assert_eq!(
            report.verdict(),
            Dangerous,
            "a library's object as {what}: {report:#?}"
        );
        let reader = report.pickles[0]
            .globals
            .iter()
            .find(|g| g.name == "RowReader")
            .expect("the reader's class");
        assert_eq!(
            reader.class,
            GlobalClass::Dangerous(Danger::LibraryCall),
            "{what}"
        );
        let report = scan_bytes(&shape(&own), &Limits::default());
        assert!(report.pickles[0].complete, "{what}: {report:#?}");
        assert!(
            report.level() <= Level::NeedsCode,
            "a model's object as {what}: {report:#?}"
        );
    }
}

/// Standard library data that pickles as calls of its own types (typing's
/// annotations, builtin generics, addresses, arrays, signatures, as
/// Python 3.11 pickles them at protocols 2 and 4): plain data, and a
/// typing form subscribed with what is no annotation a call.
#[test]
fn standard_library_values_that_pickle_as_calls_are_data() {
    use ptload_reader::scan::scan_bytes;
    let cases: &[(&str, &[u8])] = &[
        (
            "an annotation, protocol 2",
            b"\x80\x02c_operator\x0agetitem\x0aq\x00ctyping\x0aUnion\x0aq\x01h\x00ctyp\
              ing\x0aDict\x0aq\x02c__builtin__\x0aunicode\x0aq\x03h\x00ctyping\x0aList\
              \x0aq\x04c__builtin__\x0along\x0aq\x05\x86q\x06Rq\x07\x86q\x08\x86q\x09R\
              q\x0ac__builtin__\x0atype\x0aq\x0bN\x85q\x0cRq\x0d\x86q\x0e\x86q\x0fRq\
              \x10.",
        ),
        (
            "an annotation, protocol 4",
            b"\x80\x04\x95\x83\x00\x00\x00\x00\x00\x00\x00\x8c\x09_operator\x94\x8c\
              \x07getitem\x94\x93\x94\x8c\x06typing\x94\x8c\x05Union\x94\x93\x94h\x02h\
              \x03\x8c\x04Dict\x94\x93\x94\x8c\x08builtins\x94\x8c\x03str\x94\x93\x94h\
              \x02h\x03\x8c\x04List\x94\x93\x94h\x08\x8c\x03int\x94\x93\x94\x86\x94R\
              \x94\x86\x94\x86\x94R\x94h\x08\x8c\x04type\x94\x93\x94N\x85\x94R\x94\x86\
              \x94\x86\x94R\x94.",
        ),
        (
            "a builtin generic, protocol 2",
            b"\x80\x02ctypes\x0aGenericAlias\x0aq\x00c__builtin__\x0alist\x0aq\x01c__b\
              uiltin__\x0along\x0aq\x02\x85q\x03\x86q\x04Rq\x05.",
        ),
        (
            "a builtin generic, protocol 4",
            b"\x80\x04\x95>\x00\x00\x00\x00\x00\x00\x00\x8c\x05types\x94\x8c\x0cGeneri\
              cAlias\x94\x93\x94\x8c\x08builtins\x94\x8c\x04list\x94\x93\x94h\x03\x8c\
              \x03int\x94\x93\x94\x85\x94\x86\x94R\x94.",
        ),
        (
            "an address, protocol 2",
            b"\x80\x02cipaddress\x0aIPv4Network\x0aq\x00X\x0a\x00\x00\x0010.0.0.0/8q\
              \x01\x85q\x02Rq\x03.",
        ),
        (
            "an address, protocol 4",
            b"\x80\x04\x95.\x00\x00\x00\x00\x00\x00\x00\x8c\x09ipaddress\x94\x8c\x0bIP\
              v4Network\x94\x93\x94\x8c\x0a10.0.0.0/8\x94\x85\x94R\x94.",
        ),
        (
            "an array, protocol 2",
            b"\x80\x02carray\x0aarray\x0aq\x00X\x01\x00\x00\x00fq\x01]q\x02G?\xf0\x00\
              \x00\x00\x00\x00\x00a\x86q\x03Rq\x04.",
        ),
        (
            "an array, protocol 4",
            b"\x80\x04\x95F\x00\x00\x00\x00\x00\x00\x00\x8c\x05array\x94\x8c\x14_array\
              _reconstructor\x94\x93\x94(\x8c\x05array\x94\x8c\x05array\x94\x93\x94\
              \x8c\x01f\x94K\x0eC\x04\x00\x00\x80?\x94t\x94R\x94.",
        ),
        (
            "a signature, protocol 2",
            b"\x80\x02cinspect\x0aSignature\x0aq\x00cinspect\x0aParameter\x0aq\x01X\
              \x01\x00\x00\x00aq\x02cinspect\x0a_ParameterKind\x0aq\x03K\x01\x85q\x04R\
              q\x05\x86q\x06Rq\x07}q\x08(X\x08\x00\x00\x00_defaultq\x09cinspect\x0a_em\
              pty\x0aq\x0aX\x0b\x00\x00\x00_annotationq\x0bh\x0aubh\x01X\x01\x00\x00\
              \x00bq\x0ch\x05\x86q\x0dRq\x0e}q\x0f(h\x09K\x01h\x0bh\x0aub\x86q\x10\x85\
              q\x11Rq\x12}q\x13X\x12\x00\x00\x00_return_annotationq\x14h\x0asb.",
        ),
        (
            "a signature, protocol 4",
            b"\x80\x04\x95\xb3\x00\x00\x00\x00\x00\x00\x00\x8c\x07inspect\x94\x8c\x09S\
              ignature\x94\x93\x94h\x00\x8c\x09Parameter\x94\x93\x94\x8c\x01a\x94h\x00\
              \x8c\x0e_ParameterKind\x94\x93\x94K\x01\x85\x94R\x94\x86\x94R\x94}\x94(\
              \x8c\x08_default\x94h\x00\x8c\x06_empty\x94\x93\x94\x8c\x0b_annotation\
              \x94h\x0fubh\x04\x8c\x01b\x94h\x09\x86\x94R\x94}\x94(h\x0dK\x01h\x10h\
              \x0fub\x86\x94\x85\x94R\x94}\x94\x8c\x12_return_annotation\x94h\x0fsb.",
        ),
    ];
    for (what, bytes) in cases {
        let report = scan_bytes(bytes, &Limits::default());
        assert!(report.pickles[0].complete, "{what}: {report:#?}");
        assert!(report.level() <= Level::NeedsCode, "{what}: {report:#?}");
    }
    // A typing form given an object the pickle made (its checks run that
    // object's methods): a call of `getitem`, a library call.
    let made = pickle(&[b"c_operator\ngetitem\nctyping\nList\ncmymodels\nThing\n)\x81\x86R"]);
    assert_eq!(scan_bytes(&made, &Limits::default()).verdict(), Dangerous);
}

/// The twenty-eighth corpus: a package's attribute that is a module of
/// its own (torch's and numpy's lazy `__getattr__` import it) is judged
/// as that module; known data whose arguments make it act is judged by
/// what they make it do: `re._compile` with `re.DEBUG` prints, and
/// `_codecs.encode` with a codec pickles never name imports
/// `encodings.<codec>`. Each boundary stays where it was.
#[test]
fn submodules_by_attribute_and_acting_arguments_are_caught() {
    use ptload_reader::scan::scan_bytes;
    // `re._compile(pattern, flags)` and `_codecs.encode(text, codec)`.
    let compiled = |flags: &[u8]| {
        let mut p = b"cre\n_compile\n".to_vec();
        p.extend_from_slice(&s("a+b"));
        p.extend_from_slice(flags);
        p.extend_from_slice(b"\x86R");
        pickle(&[&p])
    };
    let encoded = |codec: &str| {
        let mut p = b"c_codecs\nencode\n".to_vec();
        p.extend_from_slice(&s("x"));
        p.extend_from_slice(&s(codec));
        p.extend_from_slice(b"\x86R");
        pickle(&[&p])
    };
    let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
        (
            "torch's _dynamo by attribute",
            pickle(&[b"ctorch\n_dynamo\n"]),
            Dangerous,
        ),
        (
            "numpy's testing by attribute",
            pickle(&[b"cnumpy\ntesting\n"]),
            Dangerous,
        ),
        (
            "numpy's f2py by attribute",
            pickle(&[b"cnumpy\nf2py\n"]),
            Dangerous,
        ),
        (
            "torch's onnx by attribute",
            pickle(&[b"ctorch\nonnx\n"]),
            NeedsCode,
        ),
        ("a model's class", pickle(&[b"cmymodel\nNet\n"]), NeedsCode),
        (
            "an enum of a network package",
            pickle(&[b"chttp\nHTTPStatus\n"]),
            Clean,
        ),
        ("a pattern with IGNORECASE", compiled(b"K\x02"), Clean),
        ("a pattern with DEBUG", compiled(b"K\x80"), Dangerous),
        (
            "a pattern with DEBUG and IGNORECASE",
            compiled(b"K\x82"),
            Dangerous,
        ),
        ("bytes as protocol 2 writes them", encoded("latin1"), Clean),
        (
            "bytes spelt as the registry accepts",
            encoded("ISO-8859-1"),
            Clean,
        ),
        ("a codec that imports bz2", encoded("bz2"), Dangerous),
        (
            "a codec that imports stringprep",
            encoded("idna"),
            Dangerous,
        ),
    ];
    for (what, bytes, verdict) in cases {
        let report = scan_bytes(&bytes, &Limits::default());
        assert!(report.pickles[0].complete, "{what}: {report:#?}");
        assert_eq!(report.verdict(), verdict, "{what}: {report:#?}");
    }
}

/// TorchScript archives whose scripted `__setstate__` (which torch.jit.load
/// runs) calls an op of a namespace whose kernels are Python, prints, or
/// warns, and one that prints and warns only in `forward`
/// (torch_ts_ops.json: what torch 2.15's load imported and printed). The
/// scan finds each effect the load had, at its level, in the code
/// record, and none the load did not have.
#[test]
fn torchscript_code_a_load_runs_is_judged_by_what_it_does() {
    let text = std::fs::read_to_string(root().join("tests/scan/torch_ts_ops.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = doc.as_object().unwrap();
    assert_eq!(files.len(), 4);
    let mut quiet = 0;
    for (name, facts) in files {
        assert_eq!(facts["outcome"], "loads", "{name}: {facts}");
        let report = scan_file(
            &root().join("tests/scan").join(name),
            &Limits::default(),
            false,
        )
        .unwrap();
        let found: Vec<(String, Level)> = report
            .pickles
            .iter()
            .filter(|p| matches!(&p.source, ptload_reader::scan::PickleSource::Entry(e) if e.ends_with(".py")))
            .flat_map(|p| p.globals.iter().map(|g| (g.path(), g.level())))
            .collect();
        let printed: Vec<&str> = facts["printed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap())
            .collect();
        let mut expected = Vec::new();
        if facts["imported_dynamo"] == true {
            expected.push(("torch.ops.debugprims".to_owned(), Level::Dangerous));
        }
        if printed.contains(&"made_by_setstate_print") {
            expected.push(("builtins.print".to_owned(), Level::UnknownCall));
        }
        if printed.contains(&"made_by_setstate_warn") {
            expected.push(("torch.warn".to_owned(), Level::UnknownCall));
        }
        if expected.is_empty() {
            quiet += 1;
        }
        assert_eq!(found, expected, "{name}: {report:#?}");
        let level = expected.iter().map(|e| e.1).max().unwrap_or(Level::Clean);
        assert_eq!(report.level(), level, "{name}: {report:#?}");
    }
    // The module that prints only when it is run loads quietly.
    assert_eq!(quiet, 1);
}
