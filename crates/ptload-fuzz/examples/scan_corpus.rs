//! Writes `tests/scan/`: files built to get a payload past a scanner, one
//! per trick, each with the verdict `ptload scan` must give stated in
//! `crates/ptload-reader/tests/scan.rs`. The payload is always `os.system("true")` or a
//! harmless stand-in class: nothing here would do damage if run, and
//! nothing ever runs it.
//!
//! `cargo run -p ptload-fuzz --example scan_corpus` (rewrites the files).

use ptload_fuzz::craft::{legacy, zip, Pickle, TensorRecord, ZipEntry};

fn storage4() -> Vec<u8> {
    [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

fn tensor() -> TensorRecord<'static> {
    TensorRecord {
        storage_class: "FloatStorage",
        key: "0",
        location: "cpu",
        storage_numel: 4,
        offset: 0,
        shape: &[4],
        stride: &[1],
        requires_grad: false,
    }
}

/// `{'w': tensor, <extra key>: <written by f>}` at protocol 2.
fn checkpoint_pickle(f: impl FnOnce(&mut Pickle)) -> Vec<u8> {
    let mut p = Pickle::proto(2);
    p.op(b"}(").str("w").tensor(&tensor()).str("x");
    f(&mut p);
    p.op(b"u");
    p.stop()
}

fn clean_pickle() -> Vec<u8> {
    checkpoint_pickle(|p| {
        p.int(7);
    })
}

/// `os.system("true")` called, at protocol 2 (GLOBAL, REDUCE).
fn payload(p: &mut Pickle) {
    p.global("os", "system").str("true").op(&[0x85]).op(b"R");
}

fn payload_pickle() -> Vec<u8> {
    checkpoint_pickle(payload)
}

/// A zip of `entries` plus the `version` record torch's reader requires.
fn archive(mut entries: Vec<ZipEntry>) -> Vec<u8> {
    entries.push(ZipEntry::new("archive/version", b"3\n".to_vec()));
    zip(&entries)
}

fn standard(pickle: Vec<u8>) -> Vec<u8> {
    archive(vec![
        ZipEntry::new("archive/data.pkl", pickle),
        ZipEntry::new("archive/data/0", storage4()),
    ])
}

/// A bare pickle calling `os.system("true")` at `protocol`, written the way
/// Python's pickler writes it at that protocol.
fn bare(protocol: u8) -> Vec<u8> {
    match protocol {
        0 => b"cos\nsystem\n(S'true'\ntR.".to_vec(),
        1 => b"cos\nsystem\n(U\x04truetR.".to_vec(),
        2 | 3 => {
            let mut p = Pickle::proto(protocol);
            payload(&mut p);
            p.stop()
        }
        _ => {
            // STACK_GLOBAL with MEMOIZE, inside a FRAME.
            let body: &[u8] =
                b"\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c\x04true\x94\x85\x94R\x94.";
            let mut out = vec![0x80, protocol, 0x95];
            out.extend_from_slice(&(body.len() as u64).to_le_bytes());
            out.extend_from_slice(body);
            out
        }
    }
}

/// A protocol-4 STACK_GLOBAL of `module` `name`, called with `("os",)`.
fn stack_global_call(module: &str, name: &str) -> Vec<u8> {
    checkpoint_pickle(|p| {
        p.op(&[0x8c, module.len() as u8])
            .op(module.as_bytes())
            .op(&[0x8c, name.len() as u8])
            .op(name.as_bytes())
            .op(&[0x93])
            .str("os")
            .op(&[0x85])
            .op(b"R");
    })
}

fn tar(members: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        let mut header = [0u8; 512];
        header[..name.len()].copy_from_slice(name.as_bytes());
        header[100..107].copy_from_slice(b"0000644");
        header[108..115].copy_from_slice(b"0000000");
        header[116..123].copy_from_slice(b"0000000");
        let size = format!("{:011o}", data.len());
        header[124..135].copy_from_slice(size.as_bytes());
        header[136..147].copy_from_slice(b"00000000000");
        header[156] = b'0';
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/scan");
    std::fs::create_dir_all(&dir).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| files.push((name.to_owned(), bytes));

    // ---- parsing as torch does
    // A code-running pickle, then a real checkpoint zip: torch sees no PK at
    // offset 0 and unpickles the pickle.
    let mut polyglot = bare(2);
    polyglot.extend(standard(clean_pickle()));
    add("polyglot_pickle_then_zip.pt", polyglot);
    for protocol in 0..=5 {
        add(&format!("bare_protocol_{protocol}.pkl"), bare(protocol));
    }
    add("bare_clean.pkl", clean_pickle());
    // The legacy layout: payload in the protocol-version pickle and in
    // sys_info, both read after the magic number.
    let magic: &[u8] = &[
        0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, b'.',
    ];
    let mut stacked = magic.to_vec();
    stacked.extend(bare(2));
    stacked.extend(clean_pickle());
    add("stacked_magic_then_payload.pt", stacked);
    let mut not_magic = clean_pickle();
    not_magic.extend(bare(2));
    add("stacked_clean_then_payload.pkl", not_magic);
    let mut in_legacy = legacy(&payload_pickle(), &[("0", 4, &storage4())], true);
    in_legacy.truncate(in_legacy.len() - 3);
    add("legacy_payload_truncated.pt", in_legacy);
    let mut broken = bare(2);
    broken.pop();
    broken.extend_from_slice(b"\xff\xff");
    add("payload_then_broken_stream.pkl", broken);

    // ---- zip tricks torch tolerates
    let mut bad_crc = ZipEntry::new("archive/data.pkl", payload_pickle());
    bad_crc.crc = Some(0xdead_beef);
    add(
        "zip_bad_crc.pt",
        archive(vec![bad_crc, ZipEntry::new("archive/data/0", storage4())]),
    );
    let mut renamed = ZipEntry::new("archive/data.pkl", payload_pickle());
    renamed.local_name = "archive/other.bin".into();
    add(
        "zip_local_name_mismatch.pt",
        archive(vec![renamed, ZipEntry::new("archive/data/0", storage4())]),
    );
    add(
        "zip_duplicate_last_is_payload.pt",
        archive(vec![
            ZipEntry::new("archive/data.pkl", clean_pickle()),
            ZipEntry::new("archive/data/0", storage4()),
            ZipEntry::new("archive/data.pkl", payload_pickle()),
        ]),
    );
    add(
        "zip_duplicate_first_is_payload.pt",
        archive(vec![
            ZipEntry::new("archive/data.pkl", payload_pickle()),
            ZipEntry::new("archive/data/0", storage4()),
            ZipEntry::new("archive/data.pkl", clean_pickle()),
        ]),
    );
    add(
        "zip_other_pkl_entry.pt",
        archive(vec![
            ZipEntry::new("archive/data.pkl", clean_pickle()),
            ZipEntry::new("archive/data/0", storage4()),
            ZipEntry::new("archive/extra/hooks.pkl", bare(2)),
        ]),
    );
    add(
        "zip_torchscript_constants.pt",
        archive(vec![
            ZipEntry::new("archive/data.pkl", clean_pickle()),
            ZipEntry::new("archive/constants.pkl", bare(2)),
            ZipEntry::new("archive/data/0", storage4()),
        ]),
    );
    // TorchScript 1.x (PyTorch's own iOS demo models): each module of the
    // archive is a `__torch__` class whose state holds `__constants__` and
    // `__overloads__`, lists of names that TorchScript's loader sets as
    // attributes of the compiled type.
    let torchscript_module = |dunder_value: &dyn Fn(&mut Pickle)| {
        let mut p = Pickle::proto(2);
        p.global("__torch__", "Model")
            .op(b")")
            .op(&[0x81])
            .op(b"}(");
        p.str("weight").tensor(&tensor());
        p.str("fc")
            .global("__torch__.torch.nn.modules.linear", "Linear");
        p.op(b")").op(&[0x81]).op(b"}(").str("__constants__");
        p.op(b"(").str("in_features").str("out_features").op(b"l");
        p.str("training").bool(true).op(b"ub");
        p.str("__overloads__");
        dunder_value(&mut p);
        p.str("training").bool(true).op(b"ub");
        p.stop()
    };
    let torchscript_with_code = |pickle: Vec<u8>, code: &[u8]| {
        archive(vec![
            ZipEntry::new("archive/data.pkl", pickle),
            ZipEntry::new("archive/code/__torch__.py", code.to_vec()),
            ZipEntry::new("archive/constants.pkl", {
                let mut p = Pickle::proto(2);
                p.op(b")");
                p.stop()
            }),
            ZipEntry::new("archive/data/0", storage4()),
        ])
    };
    let torchscript_archive = |pickle: Vec<u8>| {
        archive(vec![
            ZipEntry::new("archive/data.pkl", pickle),
            ZipEntry::new(
                "archive/code/__torch__.py",
                b"class Model(Module):\n  __parameters__ = [\"weight\", ]\n".to_vec(),
            ),
            ZipEntry::new("archive/constants.pkl", {
                let mut p = Pickle::proto(2);
                p.op(b")");
                p.stop()
            }),
            ZipEntry::new("archive/data/0", storage4()),
        ])
    };
    add(
        "torchscript_1x_module_attributes.pt",
        torchscript_archive(torchscript_module(&|p| {
            p.op(b"}(")
                .str("forward")
                .op(b"(")
                .str("forward_tensor")
                .op(b"lu");
        })),
    );
    // A scripted `__setstate__`, run by torch.jit.load on load, that maps
    // a file it names (creating it when shared).
    add(
        "torchscript_setstate_from_file.pt",
        torchscript_with_code(
            torchscript_module(&|p| {
                p.op(b"}");
            }),
            b"class Model(Module):\n  def __setstate__(self, state: str) -> None:\n    self.x = torch.from_file(state, True, 1)\n",
        ),
    );
    // The same place holding a dangerous callable: TorchScript's loader
    // calls nothing there, but the callable is in the file.
    add(
        "torchscript_1x_dunder_holds_payload.pt",
        torchscript_archive(torchscript_module(&|p| {
            p.global("os", "system");
        })),
    );
    let mut encrypted = ZipEntry::new("archive/data.pkl", payload_pickle());
    encrypted.flags = 1;
    add(
        "zip_encrypted_flag.pt",
        archive(vec![encrypted, ZipEntry::new("archive/data/0", storage4())]),
    );

    // ---- names that start where allowed names start
    add(
        "dotted_torch_storage.pt",
        standard(stack_global_call(
            "torch.storage",
            "TypedStorage.__init__.__builtins__.get",
        )),
    );
    add(
        "dotted_numpy_dtypes.pt",
        standard(stack_global_call(
            "numpy.dtypes",
            "_add_dtype_helper.__builtins__.get",
        )),
    );

    // ---- calls that do not look like calls
    add(
        "obj_file_handler.pt",
        standard(checkpoint_pickle(|p| {
            p.op(b"(")
                .global("logging", "StreamHandler")
                .str("/tmp/ptload-scan-test.log")
                .op(b"o");
        })),
    );
    add(
        "inst_file_handler.pt",
        standard(checkpoint_pickle(|p| {
            p.op(b"(")
                .str("/tmp/ptload-scan-test.log")
                .op(b"ilogging\nStreamHandler\n");
        })),
    );
    add(
        "newobj_file_handler.pt",
        standard(checkpoint_pickle(|p| {
            p.global("logging", "StreamHandler")
                .str("/tmp/ptload-scan-test.log")
                .op(&[0x85, 0x81]);
        })),
    );
    add(
        "newobj_ex_file_handler.pt",
        standard(checkpoint_pickle(|p| {
            p.global("logging", "StreamHandler")
                .str("/tmp/ptload-scan-test.log")
                .op(&[0x85])
                .op(b"}")
                .op(&[0x92]);
        })),
    );
    add(
        "reconstructor_runs_base_init.pt",
        standard(checkpoint_pickle(|p| {
            p.global("copyreg", "_reconstructor")
                .op(b"(")
                .global("argparse", "Namespace")
                .global("mylib.hooks", "Installer")
                .str("state")
                .op(b"tR");
        })),
    );
    add(
        "rebuild_from_type_calls_func.pt",
        standard(checkpoint_pickle(|p| {
            p.global("torch._tensor", "_rebuild_from_type_v2")
                .op(b"(")
                .global("mylib.hooks", "make_tensor")
                .global("torch", "Tensor")
                .op(b")}tR");
        })),
    );
    add(
        "build_setstate_of_unknown_class.pt",
        standard(checkpoint_pickle(|p| {
            p.global("mylib.state", "Restorer")
                .op(b")")
                .op(&[0x81])
                .op(b"}b");
        })),
    );

    // ---- pickles inside pickles
    add(
        "nested_pickle_in_bytes.pt",
        standard(checkpoint_pickle(|p| {
            let inner = bare(2);
            p.op(b"B")
                .op(&(inner.len() as u32).to_le_bytes())
                .op(&inner);
        })),
    );

    // ---- effects by catalogue (each a bare pickle calling one callable
    // with a string argument): files, processes, evaluation, imports,
    // callables run later, and wrappers that call what they wrap.
    let call_with_str = |module: &str, name: &str| {
        let mut p = Pickle::proto(2);
        p.global(module, name).str("x").op(&[0x85]).op(b"R");
        p.stop()
    };
    for (file, module, name) in [
        ("c_codecs_open.pkl", "codecs", "open"),
        ("c_sqlite3_connect.pkl", "sqlite3", "connect"),
        ("c_py_compile.pkl", "py_compile", "compile"),
        (
            "c_lightning_save_hparams.pkl",
            "pytorch_lightning.core.saving",
            "save_hparams_to_yaml",
        ),
        (
            "c_subprocess_helper.pkl",
            "huggingface_hub.utils._subprocess",
            "run_subprocess",
        ),
        ("c_sympy_expand.pkl", "sympy", "expand"),
        (
            "c_jinja2_import_string.pkl",
            "jinja2.utils",
            "import_string",
        ),
        ("c_warnings_getcategory.pkl", "warnings", "_getcategory"),
        ("c_typing_get_type_hints.pkl", "typing", "get_type_hints"),
        ("c_atexit_register.pkl", "atexit", "register"),
        ("c_numpy_vectorize.pkl", "numpy", "vectorize"),
        ("c_functools_lru_cache.pkl", "functools", "lru_cache"),
        ("c_package_main.pkl", "unittest.__main__", "main"),
        ("c_pyio_fileio.pkl", "_pyio", "FileIO"),
        ("c_torch_from_file.pkl", "torch", "from_file"),
        (
            "c_import_dotted_name.pkl",
            "torch._utils",
            "_import_dotted_name",
        ),
        ("c_add_extension.pkl", "copyreg", "add_extension"),
        ("c_logging_file_handler.pkl", "logging", "FileHandler"),
        // A Python 2 name, read as Python 3 reads it (`dbm.open`).
        ("c_py2_anydbm_open.pkl", "anydbm", "open"),
        ("c_dataclasses_create_fn.pkl", "dataclasses", "_create_fn"),
        (
            "c_storage_weakref.pkl",
            "torch.multiprocessing.reductions",
            "StorageWeakRef",
        ),
        (
            "c_dataloader.pkl",
            "torch.utils.data.dataloader",
            "DataLoader",
        ),
        ("c_itertools_takewhile.pkl", "itertools", "takewhile"),
        ("c_heapq_nsmallest.pkl", "heapq", "nsmallest"),
        (
            "c_lightning_logger_writer.pkl",
            "pytorch_lightning.loggers.csv_logs",
            "ExperimentWriter",
        ),
        // Plain data: how numpy pickles an array at protocol 5.
        (
            "c_numpy_frombuffer.pkl",
            "numpy._core.numeric",
            "_frombuffer",
        ),
    ] {
        add(file, call_with_str(module, name));
    }
    // Naming a global imports its module: `this` prints when imported.
    add("c_import_side_effect.pkl", {
        let mut p = Pickle::proto(2);
        p.global("this", "s");
        p.stop()
    });
    // `type(name, bases, namespace)`: a class whose `__setstate__` is a
    // callable of the file's choosing, run by BUILD on its instance.
    add("c_type_namespace_setstate.pkl", {
        let mut p = Pickle::proto(2);
        p.global("builtins", "type").str("X");
        p.global("builtins", "str").op(&[0x85]);
        p.op(b"}")
            .str("__setstate__")
            .global("codecs", "open")
            .op(b"s");
        p.op(&[0x87]).op(b"R");
        p.op(b")").op(&[0x81]).str("w").op(b"b");
        p.stop()
    });
    // An enum of a package that is otherwise network code, looked up by
    // its value.
    add("c_http_status_enum.pkl", {
        let mut p = Pickle::proto(2);
        p.global("http", "HTTPStatus").int(200).op(&[0x85]).op(b"R");
        p.stop()
    });
    // `type(None)`, as pickle writes NoneType: one argument, no class made.
    add("c_type_of_none.pkl", {
        let mut p = Pickle::proto(2);
        p.global("builtins", "type").op(b"N").op(&[0x85]).op(b"R");
        p.stop()
    });

    // ---- harmless things other scanners flag
    add(
        "builtins_len.pt",
        standard(checkpoint_pickle(|p| {
            p.global("builtins", "len").str("abc").op(&[0x85]).op(b"R");
        })),
    );
    add(
        "torchscript_helpers.pt",
        archive(vec![
            ZipEntry::new(
                "archive/data.pkl",
                checkpoint_pickle(|p| {
                    p.global("torch.jit._pickle", "build_intlist")
                        .op(b"(")
                        .int(1)
                        .int(2)
                        .op(b"l")
                        .op(&[0x85])
                        .op(b"R");
                }),
            ),
            ZipEntry::new("archive/constants.pkl", {
                let mut p = Pickle::proto(2);
                p.op(b")");
                p.stop()
            }),
            ZipEntry::new("archive/data/0", storage4()),
        ]),
    );

    // ---- changing what a later lookup finds
    // BUILD on a module sets its attributes: a rebuild function looked up
    // there afterwards can be anything.
    add("build_on_module.pkl", {
        let mut p = Pickle::proto(4);
        p.str("torch")
            .str("_utils")
            .op(&[0x93])
            .op(b"}")
            .str("_rebuild_tensor")
            .str("builtins")
            .op(b"sb0");
        p.op(b"N");
        p.stop()
    });
    // STACK_GLOBAL of values computed while unpickling (the results of
    // other globals, strings by then after such a BUILD).
    add("stack_global_of_computed_names.pkl", {
        let mut p = Pickle::proto(4);
        for _ in 0..2 {
            p.str("torch._utils").str("_rebuild_tensor").op(&[0x93]);
        }
        p.op(&[0x93]).str("true").op(&[0x85]).op(b"R");
        p.stop()
    });

    // Protocol-0 strings naming a STACK_GLOBAL (a protocol-4 opcode in a
    // pickle with no PROTO): Python and torch.load take them as str.
    add(
        "stack_global_of_protocol_0_strings.pkl",
        b"S'os'\nS'system'\n\x93S'true'\n\x85R.".to_vec(),
    );

    // ---- values that come back as what went in
    // TorchScript's list wrapper returns its argument: the global inside
    // is what gets called.
    add(
        "torchscript_wrapper_returns_global.pt",
        standard(checkpoint_pickle(|p| {
            p.global("torch.jit._pickle", "build_intlist")
                .global("mypkg.tools", "helper")
                .op(&[0x85])
                .op(b"R")
                .str("x")
                .op(&[0x85])
                .op(b"R");
        })),
    );
    // list(map(helper, ['x'])): map calls what it is given.
    add("builtins_map_calls_its_function.pkl", {
        let mut p = Pickle::proto(2);
        p.global("builtins", "list")
            .global("builtins", "map")
            .global("mypkg.tools", "helper")
            .op(b"]")
            .str("x")
            .op(b"a")
            .op(&[0x86])
            .op(b"R")
            .op(&[0x85])
            .op(b"R");
        p.stop()
    });
    // next(iter([helper]))('x'): the function comes back out and is called.
    add("builtins_next_returns_its_member.pkl", {
        let mut p = Pickle::proto(2);
        p.global("builtins", "next")
            .global("builtins", "iter")
            .op(b"]")
            .global("mypkg.tools", "helper")
            .op(b"a")
            .op(&[0x85])
            .op(b"R")
            .op(&[0x85])
            .op(b"R")
            .str("x")
            .op(&[0x85])
            .op(b"R");
        p.stop()
    });
    // The legacy persistent_load returns a `module` id's second item.
    let mut by_persistent_id = magic.to_vec();
    by_persistent_id.extend({
        let mut p = Pickle::proto(2);
        p.int(1001);
        p.stop()
    });
    by_persistent_id.extend({
        let mut p = Pickle::proto(2);
        p.op(b"}");
        p.stop()
    });
    by_persistent_id.extend({
        let mut p = Pickle::proto(2);
        p.op(b"(")
            .str("module")
            .global("mypkg.tools", "helper")
            .op(b"NNt")
            .op(b"Q")
            .str("x")
            .op(&[0x85])
            .op(b"R");
        p.stop()
    });
    add("legacy_persistent_id_returns_global.pt", by_persistent_id);

    // A read that starts inside a FRAME and ends past it (here BINBYTES'
    // length): Python's pure unpickler refuses it; its C unpickler, reading
    // a file, drops the rest of the frame's buffer and reads fresh bytes,
    // so it runs other opcodes than the bytes show. The payload here sits
    // in what a linear reading takes for data.
    add("frame_read_crosses_boundary.pkl", {
        let mut out = vec![0x80, 0x04, 0x95];
        out.extend_from_slice(&2u64.to_le_bytes());
        out.extend_from_slice(b"B\x16");
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(b"cos\nsystem\n(S'true'\ntR");
        out.extend_from_slice(b"0N.");
        out
    });

    // ---- the pre-1.0 tar layout torch still reads
    // storages: a count, then one pickle per storage, each unpickled.
    add(
        "tar_payload_in_second_storage_pickle.pt",
        tar(&[
            ("sys_info", {
                let mut p = Pickle::proto(2);
                p.op(b"}");
                p.stop()
            }),
            ("storages", {
                let mut out = {
                    let mut p = Pickle::proto(2);
                    p.int(2);
                    p.stop()
                };
                out.extend({
                    let mut p = Pickle::proto(2);
                    p.op(b"N");
                    p.stop()
                });
                out.extend(bare(2));
                out
            }),
        ]),
    );
    add(
        "tar_payload_in_pickle_member.pt",
        tar(&[
            ("sys_info", {
                let mut p = Pickle::proto(2);
                p.op(b"}");
                p.stop()
            }),
            ("pickle", bare(2)),
        ]),
    );

    // Its own files only: the folder also holds files torch wrote
    // (fixtures/generate.py) and their answers.
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    println!("wrote {} files to {}", files.len(), dir.display());
}
