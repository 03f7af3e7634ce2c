//! Writes the crafted files of `tests/hostile/`: one file per hostile case,
//! by family (c_ container, p_ pickle VM, w_ wrong calls, t_ tensor
//! metadata, x_ code payloads). What each must produce is stated in
//! `crates/ptload-cli/tests/hostile.rs`, not here. The files made by real torch (torch_*)
//! come from fixtures/generate.py.
//!
//! `cargo run -p ptload-fuzz --example hostile_corpus` (rewrites the files).

use std::io::Write;

use ptload_fuzz::craft::{legacy, zip, Pickle, TensorRecord, ZipEntry};

/// Where a payload would leave its mark if anything ever ran it.
const MARK: &str = "/tmp/ptload-hostile-pwned";

fn storage4() -> Vec<u8> {
    [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

fn record<'a>(
    key: &'a str,
    numel: u64,
    offset: u64,
    shape: &'a [u64],
    stride: &'a [u64],
) -> TensorRecord<'a> {
    TensorRecord {
        storage_class: "FloatStorage",
        key,
        location: "cpu",
        storage_numel: numel,
        offset,
        shape,
        stride,
        requires_grad: false,
    }
}

/// `{'w': <4 floats>}` after PROTO 2 and the dict's MARK, without closing.
fn with_tensor() -> Pickle {
    let mut p = Pickle::proto(2);
    p.op(b"}(").str("w").tensor(&record("0", 4, 0, &[4], &[1]));
    p
}

/// The standard archive around a data.pkl: `archive/data.pkl`, `data/0`.
fn archive(pickle: Vec<u8>) -> Vec<u8> {
    zip(&[
        ZipEntry::new("archive/data.pkl", pickle),
        ZipEntry::new("archive/data/0", storage4()),
        ZipEntry::new("archive/version", b"3\n".to_vec()),
    ])
}

fn one_tensor() -> Vec<u8> {
    let mut p = with_tensor();
    p.op(b"u");
    archive(p.stop())
}

/// `{'w': tensor, 'x': <payload>}`: the payload written by `f`.
fn payload(f: impl FnOnce(&mut Pickle)) -> Vec<u8> {
    let mut p = with_tensor();
    p.str("x");
    f(&mut p);
    p.op(b"u");
    archive(p.stop())
}

/// A data.pkl that is only `ops` (no tensor), in the standard archive.
fn raw_pickle(ops: &[u8]) -> Vec<u8> {
    archive(ops.to_vec())
}

/// A data.pkl holding one tensor whose rebuild call is written by `f`.
fn tensor_call(f: impl FnOnce(&mut Pickle)) -> Vec<u8> {
    let mut p = Pickle::proto(2);
    p.op(b"}(").str("w");
    f(&mut p);
    p.op(b"u");
    archive(p.stop())
}

/// `_rebuild_tensor_v2((storage pid of data/0: 4 floats on cpu), ` : the
/// opening of a hand-written rebuild call, whose other arguments the
/// caller writes (the corpus bends exactly those).
fn rebuild_head(p: &mut Pickle) {
    p.global("torch._utils", "_rebuild_tensor_v2").op(b"((");
    p.str("storage")
        .global("torch", "FloatStorage")
        .str("0")
        .str("cpu")
        .int(4)
        .op(b"tQ");
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A zip whose `archive/data.pkl` is deflated: `compressed`, declared to
/// inflate to `size` bytes with CRC `crc`.
fn deflated_pickle(compressed: &[u8], size: u32, crc: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let name = b"archive/data.pkl";
    out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
    out.extend_from_slice(&[20, 0, 0, 0, 8, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&(compressed.len() as u32).to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(name);
    out.extend_from_slice(compressed);
    let cd = out.len() as u32;
    out.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
    out.extend_from_slice(&[20, 0, 20, 0, 0, 0, 8, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&(compressed.len() as u32).to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(name);
    let cd_len = out.len() as u32 - cd;
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 1, 0, 1, 0]);
    out.extend_from_slice(&cd_len.to_le_bytes());
    out.extend_from_slice(&cd.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

fn eocd_at(file: &[u8]) -> usize {
    file.windows(4).rposition(|w| w == b"PK\x05\x06").unwrap()
}

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();

    // ---- container lies
    cases.push(("c_empty.pt", Vec::new()));
    let good = one_tensor();
    cases.push(("c_truncated_zip.pt", good[..good.len() / 2].to_vec()));
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    cases.push(("c_random.bin", random));
    let mut p = with_tensor();
    p.op(b"u");
    let pkl = p.stop();
    cases.push((
        "c_duplicate_names.pt",
        zip(&[
            ZipEntry::new("archive/data.pkl", pkl.clone()),
            ZipEntry::new("archive/data/0", storage4()),
            ZipEntry::new("archive/data/0", vec![0; 16]),
        ]),
    ));
    let mut mismatch = ZipEntry::new("archive/data/0", storage4());
    mismatch.local_name = "archive/data/1".into();
    cases.push((
        "c_local_name_mismatch.pt",
        zip(&[ZipEntry::new("archive/data.pkl", pkl.clone()), mismatch]),
    ));
    let mut enc = ZipEntry::new("archive/data/0", storage4());
    enc.flags = 1;
    cases.push((
        "c_encrypted.pt",
        zip(&[ZipEntry::new("archive/data.pkl", pkl.clone()), enc]),
    ));
    let mut bad = ZipEntry::new("archive/data.pkl", pkl.clone());
    bad.crc = Some(0xdead_beef);
    cases.push((
        "c_bad_crc.pt",
        zip(&[bad, ZipEntry::new("archive/data/0", storage4())]),
    ));
    let mut f = one_tensor();
    let e = eocd_at(&f);
    f[e + 16..e + 20].copy_from_slice(&0xffff_ff00u32.to_le_bytes());
    cases.push(("c_directory_outside_file.pt", f));
    let mut f = one_tensor();
    let e = eocd_at(&f);
    f[e + 8..e + 12].copy_from_slice(&[0xe8, 0x03, 0xe8, 0x03]);
    cases.push(("c_entry_count_lie.pt", f));
    // Two names for one local entry: their bytes overlap.
    let mut f = zip(&[
        ZipEntry::new("archive/data.pkl", pkl.clone()),
        ZipEntry::new("archive/data/0", storage4()),
    ]);
    let cd = f.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    let second = cd
        + 4
        + f[cd + 4..]
            .windows(4)
            .position(|w| w == b"PK\x01\x02")
            .unwrap();
    let first_offset = f[cd + 42..cd + 46].to_vec();
    f[second + 42..second + 46].copy_from_slice(&first_offset);
    cases.push(("c_two_names_one_entry.pt", f));
    // The first entry's sizes reach into the second entry's header.
    let mut f = zip(&[
        ZipEntry::new("archive/data.pkl", pkl.clone()),
        ZipEntry::new("archive/data/0", storage4()),
    ]);
    let size = pkl.len() as u32 + 64;
    for at in [cd + 20, cd + 24] {
        f[at..at + 4].copy_from_slice(&size.to_le_bytes());
    }
    for at in [18, 22] {
        f[at..at + 4].copy_from_slice(&size.to_le_bytes());
    }
    cases.push(("c_overlapping_entries.pt", f));
    cases.push((
        "c_no_data_pkl.pt",
        zip(&[ZipEntry::new("archive/data/0", storage4())]),
    ));
    let mut eocd = b"PK\x05\x06".to_vec();
    eocd.extend_from_slice(&[0; 18]);
    cases.push(("c_eocd_only.pt", eocd));
    // Deflate bombs: a data.pkl declared at 4 GiB (refused before
    // inflating), and one that inflates far past its declared size.
    let zeros = deflate(&vec![0u8; 1 << 20]);
    cases.push((
        "c_deflate_bomb_declared.pt",
        deflated_pickle(&zeros, u32::MAX, 1),
    ));
    cases.push(("c_deflate_size_lie.pt", deflated_pickle(&zeros, 100, 1)));
    // Legacy: a storage whose element count is far beyond the file, and a
    // stream cut inside the storage data.
    let mut obj = Pickle::proto(2);
    obj.op(b"}(")
        .str("w")
        .tensor(&record("0", 4, 0, &[4], &[1]))
        .op(b"u");
    let obj = obj.stop();
    let data = storage4();
    let mut f = legacy(&obj, &[("0", 4, &data)], true);
    let at = f.len() - 16 - 8;
    f[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    cases.push(("c_legacy_numel_lie.pt", f));
    let f = legacy(&obj, &[("0", 4, &data)], true);
    cases.push(("c_legacy_truncated.pt", f[..f.len() - 7].to_vec()));

    // ---- pickle VM abuse
    let mut p = Pickle::proto(2);
    p.op(b"X\xff\xff\xff\xff");
    cases.push(("p_unicode_length_lie.pt", raw_pickle(&p.stop())));
    let mut p = Pickle::proto(4);
    p.op(b"\x8e").op(&(1u64 << 62).to_le_bytes());
    cases.push(("p_binbytes8_length_lie.pt", raw_pickle(&p.stop())));
    let mut p = Pickle::proto(4);
    p.op(b"\x95").op(&(1u64 << 40).to_le_bytes()).op(b"}");
    cases.push(("p_frame_length_lie.pt", raw_pickle(&p.stop())));
    let mut p = Pickle::proto(2);
    p.op(b"\x8b\xff\xff\xff\x7f");
    cases.push(("p_long4_length_lie.pt", raw_pickle(&p.stop())));
    // LONG_BINPUT at the largest index, read back: one memo entry.
    let mut p = with_tensor();
    p.op(b"u")
        .op(b"r\xff\xff\xff\xff")
        .op(b"0j\xff\xff\xff\xff");
    cases.push(("p_long_binput_max.pt", archive(p.stop())));
    let mut p = Pickle::proto(2);
    p.op(b"h\x07");
    cases.push(("p_binget_undefined.pt", raw_pickle(&p.stop())));
    // Billion laughs: each level a list holding the previous level twice,
    // 40 levels over one tensor: 2^40 paths to it.
    let mut p = with_tensor();
    p.op(b"u").op(b"q\x00");
    for level in 0..40u8 {
        p.op(b"(")
            .op(&[b'h', level])
            .op(&[b'h', level])
            .op(b"l")
            .op(&[b'q', level + 1]);
    }
    cases.push(("p_reference_bomb.pt", archive(p.stop())));
    // DUP bomb without tensors: each level a pair of the level below.
    let mut p = Pickle::proto(2);
    p.op(b"]");
    for _ in 0..40 {
        p.op(b"2\x86");
    }
    cases.push(("p_dup_bomb.pt", raw_pickle(&p.stop())));
    // Nesting 100,000 lists deep, deflated (it is repetitive): deeper than
    // a recursive drop survives on a test thread's stack.
    let depth = 100_000;
    let mut ops = vec![0x80, 2];
    ops.extend(std::iter::repeat_n(b']', depth));
    ops.extend(std::iter::repeat_n(b'a', depth - 1));
    ops.push(b'.');
    cases.push((
        "p_deep_nesting.pt",
        deflated_pickle(&deflate(&ops), ops.len() as u32, crc32fast::hash(&ops)),
    ));
    let mut ops = vec![0x80, 2];
    ops.extend(std::iter::repeat_n(b'(', depth));
    ops.push(b'.');
    cases.push((
        "p_deep_marks.pt",
        deflated_pickle(&deflate(&ops), ops.len() as u32, crc32fast::hash(&ops)),
    ));
    // Deep values in every place a name or a call can reach them, each
    // 100,000 levels (a recursive walk overflows any thread's stack):
    // a dict key (its text becomes the tensor's name), the arguments of an
    // unknown class's call, and the BUILD state of an inert object.
    let mut p = Pickle::proto(2);
    p.op(b"}(").op(b")").op(&[0x85].repeat(depth));
    p.tensor(&record("0", 4, 0, &[4], &[1])).op(b"u");
    cases.push(("p_deep_tuple_key.pt", archive(p.stop())));
    let deep_list = |p: &mut Pickle| {
        p.op(&b"]".repeat(depth)).op(&b"a".repeat(depth - 1));
    };
    cases.push((
        "p_deep_call_args.pt",
        payload(|p| {
            p.global("__main__", "Thing");
            deep_list(p);
            p.op(&[0x85]).op(b"R");
        }),
    ));
    cases.push((
        "p_deep_build_state.pt",
        payload(|p| {
            p.global("__main__", "Thing").op(b")").op(&[0x81]);
            deep_list(p);
            p.op(b"b");
        }),
    ));
    // Work that grows faster than the file: a million-digit integer in
    // text (quadratic to convert; CPython refuses over 4,300 digits), and
    // memo references that make a few bytes hash or copy a megabyte again
    // and again (as a dict key, as STACK_GLOBAL's names, through
    // bytearray()).
    let mut ops = vec![b'I'];
    ops.extend(std::iter::repeat_n(b'7', 1_000_000));
    ops.extend_from_slice(b"\n.");
    cases.push((
        "p_int_million_digits.pt",
        deflated_pickle(&deflate(&ops), ops.len() as u32, crc32fast::hash(&ops)),
    ));
    let long = "k".repeat(1 << 20);
    let repeated = |setup: &mut Pickle, step: &[u8]| {
        setup.op(&step.repeat(100_000)).op(b"N");
        let ops = setup.stop();
        deflated_pickle(&deflate(&ops), ops.len() as u32, crc32fast::hash(&ops))
    };
    let mut p = Pickle::proto(2);
    p.op(b"}").str(&long).op(b"q\x000");
    cases.push(("p_work_long_key.pt", repeated(&mut p, b"h\x00Ns")));
    let mut p = Pickle::proto(4);
    p.str(&long).op(b"q\x00").str(&long).op(b"q\x01");
    cases.push((
        "p_work_stack_global.pt",
        repeated(&mut p, &[b'h', 0, b'h', 1, 0x93, b'0']),
    ));
    // Found by the structured fuzzer: one long string reached by 100,000
    // paths (each a value the walk copies out), and a tuple of long strings
    // used as a dict key again and again (each lookup encoded the tuple).
    let mut p = Pickle::proto(2);
    p.op(b"]").str(&long).op(b"q\x000(");
    p.op(&b"h\x00".repeat(100_000)).op(b"e");
    let ops = p.stop();
    cases.push((
        "p_work_value_copies.pt",
        deflated_pickle(&deflate(&ops), ops.len() as u32, crc32fast::hash(&ops)),
    ));
    let mut p = Pickle::proto(2);
    p.op(b"}")
        .str(&long)
        .op(b"q\x000(")
        .op(&b"h\x00".repeat(64))
        .op(b"tq\x010");
    cases.push(("p_work_tuple_key.pt", repeated(&mut p, b"h\x01Ns")));
    let mut p = Pickle::proto(2);
    p.global("__builtin__", "bytearray").op(b"q\x00");
    p.op(b"B")
        .op(&(1u32 << 20).to_le_bytes())
        .op(&vec![7u8; 1 << 20])
        .op(b"q\x01");
    cases.push((
        "p_work_bytearray.pt",
        repeated(&mut p, &[b'h', 0, b'h', 1, 0x85, b'R', b'0']),
    ));
    // A list that contains itself, next to a tensor.
    let mut p = with_tensor();
    p.str("loop").op(b"]q\x01h\x01a").op(b"u");
    cases.push(("p_list_cycle.pt", archive(p.stop())));
    let mut p = with_tensor();
    p.op(b"u")
        .op(b"q\x05")
        .op(b"h\x05")
        .str("self")
        .op(b"h\x05s");
    cases.push(("p_dict_cycle.pt", archive(p.stop())));
    cases.push(("p_stack_underflow.pt", raw_pickle(b"\x80\x020.")));
    cases.push(("p_missing_mark.pt", raw_pickle(b"\x80\x02K\x01K\x02t.")));
    cases.push(("p_unknown_opcode.pt", raw_pickle(b"\x80\x02\xff.")));
    cases.push(("p_missing_stop.pt", raw_pickle(b"\x80\x02}")));
    cases.push(("p_empty_pickle.pt", raw_pickle(b"")));
    cases.push(("p_protocol_6.pt", raw_pickle(b"\x80\x06}.")));
    cases.push(("p_bad_string_quotes.pt", raw_pickle(b"S'abc\n.")));
    // SETITEM on a tensor (torch CVE: an out-of-bounds write in C++).
    let mut p = Pickle::proto(2);
    p.tensor(&record("0", 4, 0, &[4], &[1]))
        .int(0)
        .int(99)
        .op(b"s");
    cases.push(("p_setitem_on_tensor.pt", raw_pickle(&p.stop())));
    let mut p = Pickle::proto(2);
    p.op(b"}").int(1).op(b"a");
    cases.push(("p_append_on_dict.pt", raw_pickle(&p.stop())));
    let mut p = Pickle::proto(2);
    p.op(b"]").int(1).int(2).op(b"s");
    cases.push(("p_setitem_on_list.pt", raw_pickle(&p.stop())));

    // ---- rebuild calls of the wrong shape
    cases.push((
        "w_rebuild_arity.pt",
        tensor_call(|p| {
            p.global("torch._utils", "_rebuild_tensor_v2")
                .op(b"(")
                .int(1)
                .int(2)
                .op(b"tR");
        }),
    ));
    cases.push((
        "w_rebuild_shape_is_text.pt",
        tensor_call(|p| {
            rebuild_head(p);
            p.int(0).str("four").int_tuple(&[1]).bool(false);
            p.global("collections", "OrderedDict").op(b")RtR");
        }),
    ));
    cases.push((
        "w_persistent_id_not_tuple.pt",
        tensor_call(|p| {
            p.int(7).op(b"Q");
        }),
    ));
    cases.push((
        "w_persistent_id_module_in_zip.pt",
        tensor_call(|p| {
            p.op(b"(")
                .str("module")
                .global("torch", "FloatStorage")
                .str("src")
                .op(b"tQ");
        }),
    ));
    cases.push((
        "w_storage_type_not_a_global.pt",
        tensor_call(|p| {
            p.global("torch._utils", "_rebuild_tensor_v2").op(b"((");
            p.str("storage")
                .str("FloatStorage")
                .str("0")
                .str("cpu")
                .int(4)
                .op(b"tQ");
            p.int(0).int_tuple(&[4]).int_tuple(&[1]).bool(false);
            p.global("collections", "OrderedDict").op(b")RtR");
        }),
    ));
    cases.push((
        "w_ordereddict_junk_args.pt",
        tensor_call(|p| {
            // OrderedDict(<a tensor>): not pairs, so the call stays inert
            // and the tensor inside its arguments is still found.
            p.global("collections", "OrderedDict").op(b"(");
            p.tensor(&record("0", 4, 0, &[4], &[1]));
            p.op(b"tR");
        }),
    ));

    // ---- tensor metadata lies
    // Two tensors whose flattened names are both `a.b`.
    let mut p = with_tensor();
    p.op(b"u")
        .op(b"}(")
        .str("a.b")
        .tensor(&record("0", 4, 0, &[4], &[1]));
    p.str("a")
        .op(b"}(")
        .str("b")
        .tensor(&record("0", 4, 0, &[4], &[1]));
    p.op(b"uu");
    cases.push(("t_dotted_name_collision.pt", archive(p.stop())));
    let lie = |numel: u64, offset: u64, shape: &[u64], stride: &[u64]| {
        tensor_call(|p| {
            p.tensor(&record("0", numel, offset, shape, stride));
        })
    };
    cases.push((
        "t_numel_beyond_record.pt",
        lie(1_000_000, 0, &[1_000_000], &[1]),
    ));
    cases.push(("t_extent_beyond_storage.pt", lie(4, 3, &[4], &[1])));
    cases.push(("t_rank_mismatch.pt", lie(4, 0, &[2, 2], &[1])));
    cases.push((
        "t_shape_overflow.pt",
        lie(4, 0, &[1 << 40, 1 << 40], &[1, 1]),
    ));
    cases.push(("t_zero_stride_huge.pt", lie(4, 0, &[1 << 50], &[0])));
    cases.push((
        "t_negative_stride.pt",
        tensor_call(|p| {
            rebuild_head(p);
            p.int(3)
                .int_tuple(&[4])
                .op(b"(")
                .int(-1)
                .op(b"t")
                .bool(false);
            p.global("collections", "OrderedDict").op(b")RtR");
        }),
    ));
    cases.push((
        "t_negative_size.pt",
        tensor_call(|p| {
            rebuild_head(p);
            p.int(0)
                .op(b"(")
                .int(-4)
                .op(b"t")
                .int_tuple(&[1])
                .bool(false);
            p.global("collections", "OrderedDict").op(b")RtR");
        }),
    ));
    let missing = |key: &str| {
        let mut p = Pickle::proto(2);
        p.op(b"}(")
            .str("w")
            .tensor(&TensorRecord {
                key,
                ..record("0", 4, 0, &[4], &[1])
            })
            .op(b"u");
        archive(p.stop())
    };
    cases.push(("t_missing_record.pt", missing("7")));
    cases.push((
        "t_key_escapes_archive.pt",
        missing("../../../../etc/passwd"),
    ));
    cases.push(("t_key_with_nul.pt", missing("0\0x")));
    let mut p = with_tensor();
    p.str("v")
        .tensor(&TensorRecord {
            storage_class: "LongStorage",
            ..record("0", 2, 0, &[2], &[1])
        })
        .op(b"u");
    cases.push(("t_shared_key_other_dtype.pt", archive(p.stop())));
    let mut p = Pickle::proto(2);
    p.op(b"}(")
        .str("w")
        .tensor(&TensorRecord {
            location: "cuda:99",
            ..record("0", 4, 0, &[4], &[1])
        })
        .op(b"u");
    cases.push(("t_location_cuda99.pt", archive(p.stop())));

    // ---- code payloads next to a valid tensor
    let cmd = format!("touch {MARK}");
    cases.push((
        "x_os_system.pt",
        payload(|p| {
            p.global("os", "system").op(b"(").str(&cmd).op(b"tR");
        }),
    ));
    cases.push((
        "x_posix_system_stack_global.pt",
        payload(|p| {
            p.op(b"\x8c\x05posix\x8c\x06system\x93(")
                .str(&cmd)
                .op(b"tR");
        }),
    ));
    cases.push((
        "x_builtins_exec.pt",
        payload(|p| {
            p.global("builtins", "exec")
                .op(b"(")
                .str(&format!("open('{MARK}','w')"))
                .op(b"tR");
        }),
    ));
    cases.push((
        "x_getattr_import_gadget.pt",
        payload(|p| {
            p.global("builtins", "getattr").op(b"(");
            p.global("builtins", "__import__")
                .op(b"(")
                .str("os")
                .op(b"tR");
            p.str("system").op(b"tR(").str(&cmd).op(b"tR");
        }),
    ));
    cases.push((
        "x_pip_main.pt",
        payload(|p| {
            p.global("pip", "main")
                .op(b"((")
                .str("install")
                .str("evil-package")
                .op(b"ltR");
        }),
    ));
    cases.push((
        "x_asyncio_subprocess.pt",
        payload(|p| {
            p.global("asyncio.unix_events", "_UnixSubprocessTransport")
                .op(b")R");
            p.global("asyncio.subprocess", "create_subprocess_shell")
                .op(b"(")
                .str(&cmd)
                .op(b"tR");
            p.op(b"\x86");
        }),
    ));
    cases.push((
        "x_rebuild_from_type_v2_wraps_system.pt",
        payload(|p| {
            p.global("torch._utils", "_rebuild_from_type_v2").op(b"(");
            p.global("os", "system")
                .global("builtins", "str")
                .op(b"(")
                .str(&cmd)
                .op(b"t}tR");
        }),
    ));
    cases.push((
        "x_build_on_a_function.pt",
        payload(|p| {
            p.global("subprocess", "Popen")
                .op(b"}(")
                .str("args")
                .str(&cmd)
                .op(b"ub");
        }),
    ));
    cases.push((
        "x_many_dangerous.pt",
        payload(|p| {
            p.op(b"(");
            for (m, n) in [
                ("subprocess", "check_output"),
                ("runpy", "run_path"),
                ("webbrowser", "open"),
                ("shutil", "rmtree"),
                ("socket", "create_connection"),
                ("urllib.request", "urlopen"),
                ("importlib", "import_module"),
                ("code", "InteractiveInterpreter"),
                ("operator", "attrgetter"),
                ("functools", "partial"),
            ] {
                p.global(m, n);
            }
            p.op(b"l");
        }),
    ));
    cases.push((
        "x_unknown_class_called.pt",
        payload(|p| {
            // Two arguments: no enum member lookup (one word would be
            // taken for one, at needs-code).
            p.global("mylib.hooks", "Callback")
                .op(b"(")
                .str("arg")
                .str("more")
                .op(b"tR");
        }),
    ));
    cases.push((
        "x_payload_in_backward_hooks.pt",
        tensor_call(|p| {
            rebuild_head(p);
            p.int(0).int_tuple(&[4]).int_tuple(&[1]).bool(false);
            p.global("collections", "OrderedDict").op(b")R");
            p.op(b"q\x09")
                .int(0)
                .global("os", "system")
                .op(b"(")
                .str(&cmd)
                .op(b"tRs");
            p.op(b"tR");
        }),
    ));
    let mut obj = Pickle::proto(2);
    obj.op(b"}(")
        .str("w")
        .tensor(&record("0", 4, 0, &[4], &[1]))
        .str("x")
        .global("os", "system")
        .op(b"(")
        .str(&cmd)
        .op(b"tRu");
    let obj = obj.stop();
    cases.push((
        "x_legacy_payload.pt",
        legacy(&obj, &[("0", 4, &storage4())], true),
    ));
    // A TorchScript-shaped archive: code/ holds Python that must never run
    // (CVE-2025-32434 handed such archives to torch.jit.load).
    let mut p = with_tensor();
    p.op(b"u");
    cases.push((
        "x_torchscript_code.pt",
        zip(&[
            ZipEntry::new("archive/data.pkl", p.stop()),
            ZipEntry::new(
                "archive/code/__torch__.py",
                format!("import os\nos.system('{cmd}')\n").into_bytes(),
            ),
            ZipEntry::new("archive/constants.pkl", b"\x80\x02).".to_vec()),
            ZipEntry::new("archive/data/0", storage4()),
            ZipEntry::new("archive/version", b"3\n".to_vec()),
        ]),
    ));

    for (name, bytes) in &cases {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    println!("wrote {} files to {}", cases.len(), dir.display());
}
