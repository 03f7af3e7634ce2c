//! Hand-built checkpoints for the cases torch does not write by itself:
//! Python 2 strings, zip container rules, length lies, memo abuse, deep and
//! self-referencing structures, and the limits that stop them. Each case is
//! explicit bytes, so the rule it checks is visible here.

use ptload_fuzz::craft::{zip, ZipEntry};
use ptload_reader::checkpoint::{Scalar, StringEncoding};
use ptload_reader::{Checkpoint, ErrorKind, Limits, OpenOptions, Policy};

/// A pickle assembler: opcodes with their arguments, nothing implicit.
#[derive(Default)]
struct P(Vec<u8>);

impl P {
    fn op(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn proto(self, n: u8) -> Self {
        self.op(&[0x80, n])
    }
    fn unicode(self, s: &str) -> Self {
        let mut b = vec![b'X'];
        b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
        self.op(&b)
    }
    fn int(self, i: u8) -> Self {
        self.op(&[b'K', i])
    }
    fn global(self, module: &str, name: &str) -> Self {
        self.op(format!("c{module}\n{name}\n").as_bytes())
    }
    /// `{'w': tensor}` with a float32 storage `0` of `numel` elements on `location`,
    /// size `(n,)` and stride `(1,)` (everything after the dict's MARK).
    fn tensor_item(self, name: &str, location: &str, numel: u8, n: u8) -> Self {
        self.unicode(name)
            .global("torch._utils", "_rebuild_tensor_v2")
            .op(b"((")
            .unicode("storage")
            .global("torch", "FloatStorage")
            .unicode("0")
            .unicode(location)
            .int(numel)
            .op(b"tQ")
            .int(0)
            .int(n)
            .op(&[0x85])
            .int(1)
            .op(&[0x85, 0x89])
            .global("collections", "OrderedDict")
            .op(b")Rt")
            .op(b"R")
    }
    fn stop(self) -> Vec<u8> {
        let mut b = self.0;
        b.push(b'.');
        b
    }
}

/// A stored zip entry laid out plainly (no alignment padding), so the
/// offsets in errors are those of the bytes written here.
fn entry(name: &str, data: &[u8]) -> ZipEntry {
    ZipEntry {
        align: false,
        ..ZipEntry::new(name, data.to_vec())
    }
}

fn storage(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn one_tensor_pickle() -> Vec<u8> {
    P::default()
        .proto(2)
        .op(b"}(")
        .tensor_item("w", "cuda:1", 2, 2)
        .op(b"u")
        .stop()
}

fn checkpoint(pickle: &[u8]) -> Vec<u8> {
    let data = storage(&[1.5, -2.0]);
    zip(&[entry("m/data.pkl", pickle), entry("m/data/0", &data)])
}

fn open(bytes: Vec<u8>) -> Result<Checkpoint, ptload_reader::Error> {
    Checkpoint::from_bytes(bytes)
}

fn open_err(bytes: Vec<u8>) -> String {
    open(bytes)
        .map(|c| format!("opened with {} tensors", c.len()))
        .unwrap_or_else(|e| e.to_string())
}

#[test]
fn the_hand_built_checkpoint_reads() {
    let ckpt = open(checkpoint(&one_tensor_pickle())).expect("open");
    let t = ckpt.tensor("w").expect("w");
    assert_eq!(t.location(), "cuda:1");
    assert_eq!(&*t.data().expect("data"), storage(&[1.5, -2.0]).as_slice());
    assert_eq!(ckpt.storages()[0].record.as_deref(), Some("m/data/0"));
}

#[test]
fn zip_with_a_prefix_reads() {
    let mut bytes = b"some bytes before the archive".to_vec();
    bytes.extend(checkpoint(&one_tensor_pickle()));
    assert_eq!(open(bytes).expect("open").len(), 1);
}

#[test]
fn zip_rules() {
    let pickle = one_tensor_pickle();
    let data = storage(&[1.5, -2.0]);
    let dup = zip(&[
        entry("m/data.pkl", &pickle),
        entry("m/data/0", &data),
        entry("m/data/0", &data),
    ]);
    assert!(open_err(dup).contains("duplicate entry name \"m/data/0\""));

    let mismatch = zip(&[
        entry("m/data.pkl", &pickle),
        ZipEntry {
            local_name: "m/data/1".into(),
            ..entry("m/data/0", &data)
        },
    ]);
    assert!(open_err(mismatch).contains("differs from central directory name"));

    let encrypted = zip(&[
        entry("m/data.pkl", &pickle),
        ZipEntry {
            flags: 1,
            ..entry("m/data/0", &data)
        },
    ]);
    assert!(open_err(encrypted).contains("is encrypted"));

    let bad_crc = zip(&[
        ZipEntry {
            crc: Some(0xdead_beef),
            ..entry("m/data.pkl", &pickle)
        },
        entry("m/data/0", &data),
    ]);
    let message = open_err(bad_crc);
    assert!(
        message.contains("CRC-32 mismatch") && message.contains("m/data.pkl"),
        "{message}"
    );

    let zero_crc = zip(&[
        ZipEntry {
            crc: Some(0),
            ..entry("m/data.pkl", &pickle)
        },
        entry("m/data/0", &data),
    ]);
    assert_eq!(
        open(zero_crc).expect("a zero CRC is 'not computed'").len(),
        1
    );

    let short = zip(&[entry("m/data.pkl", &pickle), entry("m/data/0", &data[..4])]);
    assert!(
        open_err(short).contains("record size (4 bytes) does not match expected size (8 bytes)")
    );

    let missing = zip(&[entry("m/data.pkl", &pickle)]);
    assert!(open_err(missing).contains("storage record is missing"));

    let no_pickle = zip(&[entry("m/data/0", &data)]);
    assert!(open_err(no_pickle).contains("without a data.pkl"));

    let mut lying_count = checkpoint(&pickle);
    let n = lying_count.len();
    lying_count[n - 12..n - 10].copy_from_slice(&60_000u16.to_le_bytes());
    lying_count[n - 14..n - 12].copy_from_slice(&60_000u16.to_le_bytes());
    assert!(open_err(lying_count).contains("does not fit"));
}

#[test]
fn tensor_metadata_lies_name_the_tensor() {
    // Size 3 on a 2-element storage.
    let pickle = P::default()
        .proto(2)
        .op(b"}(")
        .tensor_item("w", "cpu", 2, 3)
        .op(b"u")
        .stop();
    let e = open(checkpoint(&pickle)).expect_err("extent past the storage");
    assert_eq!(e.kind(), ErrorKind::Tensor);
    assert_eq!(e.tensor(), Some("w"));
    assert!(
        e.to_string().contains("exceeds storage 0 of 8 bytes"),
        "{e}"
    );
}

#[test]
fn python2_strings_follow_the_encoding() {
    // Protocol 0 text pickle: {u'name': 'caf\xe9'} with a Python 2 str.
    let pickle = b"(dp0\nVname\np1\nS'caf\\xe9'\np2\ns.".to_vec();
    let legacy = legacy_stream(&pickle);
    let utf8 = OpenOptions::new()
        .open_bytes(legacy.clone())
        .expect_err("not UTF-8");
    assert_eq!(utf8.kind(), ErrorKind::Decode);
    assert!(utf8.to_string().contains("Latin-1 or bytes encoding"));
    let ascii = OpenOptions::new()
        .encoding(StringEncoding::Ascii)
        .open_bytes(legacy.clone())
        .expect_err("not ASCII");
    assert_eq!(ascii.kind(), ErrorKind::Decode);
    assert!(
        ascii.to_string().contains("byte 0xe9 in position 3"),
        "{ascii}"
    );
    let plain = legacy_stream(b"(dp0\nVname\np1\nS'cafe'\np2\ns.");
    let ascii = OpenOptions::new()
        .encoding(StringEncoding::Ascii)
        .open_bytes(plain)
        .expect("ascii");
    assert_eq!(
        ascii.values(),
        &[("name".to_owned(), Scalar::Str("cafe".into()))]
    );
    let latin1 = OpenOptions::new()
        .encoding(StringEncoding::Latin1)
        .open_bytes(legacy.clone())
        .expect("latin1");
    assert_eq!(
        latin1.values(),
        &[("name".to_owned(), Scalar::Str("caf\u{e9}".into()))]
    );
    let bytes = OpenOptions::new()
        .encoding(StringEncoding::Bytes)
        .open_bytes(legacy)
        .expect("bytes");
    assert_eq!(
        bytes.values(),
        &[("name".to_owned(), Scalar::Bytes(b"caf\xe9".to_vec()))]
    );
}

/// A legacy stream around `object`: magic, protocol version, sys_info,
/// the object, an empty key list.
fn legacy_stream(object: &[u8]) -> Vec<u8> {
    let mut out = vec![
        0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, b'.',
    ];
    out.extend(P::default().proto(2).op(b"M\xe9\x03").stop());
    out.extend(
        P::default()
            .proto(2)
            .op(b"}")
            .unicode("little_endian")
            .op(&[0x88, b's'])
            .stop(),
    );
    out.extend_from_slice(object);
    out.extend(P::default().proto(2).op(b"]").stop());
    out
}

#[test]
fn pickle_lies_are_errors_with_offsets() {
    let cases: &[(&[u8], &str)] = &[
        (b"\x80\x02X\xff\xff\xff\xff.", "exceeds the"),
        (
            b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f.",
            "exceeds the",
        ),
        (b"\x80\x02h\x05.", "memo key 5 is not defined"),
        (b"\x80\x02\xff", "unknown opcode 0xff"),
        (b"\x80\x02}", "without STOP"),
        (b"\x80\x02s.", "stack underflow"),
        (b"\x80\x02u.", "MARK missing"),
        (b"\x80\x02K\x01K\x01K\x02s.", "SETITEM on a scalar"),
        (b"\x80\x02)K\x01a.", "APPEND on a tuple"),
        (b"\x80\x09.", "unsupported pickle protocol 9"),
        (b"\x80\x02\x82\x01.", "extension registry"),
    ];
    for (pickle, needle) in cases {
        let e = open(checkpoint(pickle)).expect_err("malformed pickle");
        let text = e.to_string();
        assert!(text.contains(needle), "{pickle:?}: {text}");
        assert_eq!(e.record(), Some("m/data.pkl"), "{text}");
        assert!(e.offset().is_some(), "{text}");
    }
}

#[test]
fn huge_memo_index_costs_one_entry() {
    let pickle = P::default()
        .proto(2)
        .op(b"}r\xff\xff\xff\xffj\xff\xff\xff\xff0")
        .stop();
    assert!(open(checkpoint(&pickle)).expect("sparse memo").is_empty());
}

#[test]
#[cfg_attr(miri, ignore = "100,000 levels are too slow under Miri")]
fn deep_nesting_builds_and_drops_without_recursion() {
    // 100,000 nested lists: [[[...]]].
    let depth = 100_000;
    let mut b = P::default().proto(2).0;
    b.extend(std::iter::repeat_n(b']', depth));
    b.extend(std::iter::repeat_n(b'a', depth - 1));
    b.push(b'.');
    let ckpt = open(checkpoint(&b)).expect("deep lists are data");
    assert!(ckpt.is_empty());
}

#[test]
fn cycles_are_walked_once() {
    // l = []; l.append(l); {'l': l, 'w': tensor}
    let pickle = P::default()
        .proto(2)
        .op(b"}(")
        .unicode("l")
        .op(b"]q\x00h\x00a")
        .tensor_item("w", "cpu", 2, 2)
        .op(b"u")
        .stop();
    let ckpt = open(checkpoint(&pickle)).expect("cycle");
    let names: Vec<&str> = ckpt.tensors().map(|t| t.name()).collect();
    assert_eq!(names, ["w"]);
}

#[test]
#[cfg_attr(miri, ignore = "a million walk steps are too slow under Miri")]
fn reference_bombs_hit_the_walk_budget() {
    // Each level is a list holding the previous level twice: 2^40 paths.
    let mut p = P::default().proto(2).op(b"]");
    for _ in 0..40 {
        p = p.op(b"q\x00]h\x00h\x00\x86a");
    }
    let pickle = p.stop();
    // With shared visits unbounded, the step budget alone must stop it (a
    // budget below the default keeps this fast in debug builds).
    let mut limits = Limits::default();
    limits.max_walk_steps = 1_000_000;
    limits.max_shared_visits = u64::MAX;
    let e = OpenOptions::new()
        .limits(limits)
        .open_bytes(checkpoint(&pickle))
        .expect_err("bomb");
    assert_eq!(e.kind(), ErrorKind::LimitExceeded);
    assert!(e.to_string().contains("max_walk_steps"), "{e}");
}

#[test]
fn every_limit_is_named_in_its_error() {
    let pickle = one_tensor_pickle();
    type SetLimit = Box<dyn Fn(&mut Limits)>;
    let cases: Vec<(SetLimit, &str)> = vec![
        (Box::new(|l: &mut Limits| l.max_opcodes = 10), "max_opcodes"),
        (
            Box::new(|l: &mut Limits| l.max_stack_depth = 3),
            "max_stack_depth",
        ),
        (Box::new(|l: &mut Limits| l.max_objects = 5), "max_objects"),
        (
            Box::new(|l: &mut Limits| l.max_pickle_bytes = 16),
            "max_pickle_bytes",
        ),
        (Box::new(|l: &mut Limits| l.max_tensors = 0), "max_tensors"),
        (
            Box::new(|l: &mut Limits| l.max_decoded_bytes = 4),
            "max_decoded_bytes",
        ),
        (
            Box::new(|l: &mut Limits| l.max_zip_entries = 1),
            "max_zip_entries",
        ),
        (
            Box::new(|l: &mut Limits| l.max_name_bytes = 0),
            "max_name_bytes",
        ),
    ];
    for (set, name) in cases {
        let mut limits = Limits::default();
        set(&mut limits);
        let e = OpenOptions::new()
            .limits(limits)
            .open_bytes(checkpoint(&pickle))
            .expect_err(name);
        assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{name}: {e}");
        assert!(e.to_string().contains(name), "{name}: {e}");
    }
}

#[test]
fn strict_blocks_os_even_when_allowed() {
    let pickle = P::default()
        .proto(2)
        .global("os", "system")
        .unicode("echo")
        .op(&[0x85, b'R'])
        .stop();
    let e = OpenOptions::new()
        .policy(Policy::Strict)
        .allow_global("os.system")
        .open_bytes(checkpoint(&pickle))
        .expect_err("os is never allowed");
    assert_eq!(e.kind(), ErrorKind::UnsupportedGlobal);
    assert!(e.to_string().contains("GLOBAL os.system"), "{e}");
    // The default policy keeps it inert and reports it.
    let ckpt = open(checkpoint(&pickle)).expect("inert");
    assert_eq!(
        ckpt.suspicious()
            .expect("scanned")
            .iter()
            .map(|g| g.path())
            .collect::<Vec<_>>(),
        ["os.system"]
    );
    assert_eq!(
        ckpt.values(),
        &[("0".to_owned(), Scalar::Str("echo".into()))]
    );
}

/// The same bomb under the default limits: the shared-visit count stops
/// it long before the step budget would.
#[test]
#[cfg_attr(miri, ignore = "100,000 shared visits are too slow under Miri")]
fn reference_bomb_under_default_limits() {
    let mut p = P::default().proto(2).op(b"]");
    for _ in 0..40 {
        p = p.op(b"q\x00]h\x00h\x00\x86a");
    }
    let e = open(checkpoint(&p.stop())).expect_err("bomb");
    assert_eq!(e.kind(), ErrorKind::LimitExceeded);
    assert!(e.to_string().contains("max_shared_visits"), "{e}");
}

/// Archives whose records are far apart (large tensors) have their local
/// headers read with positioned reads instead of through the map: the
/// same rules must hold on that path.
#[test]
#[cfg_attr(miri, ignore = "maps a file: Miri cannot run mmap")]
fn sparse_archives_read_headers_with_pread() {
    let values: Vec<f32> = (0..200_000).map(|i| i as f32).collect();
    let data = storage(&values);
    // One 800 KB storage: 400 KB per entry on average.
    let pickle = P::default()
        .proto(2)
        .op(b"}(")
        .unicode("w")
        .global("torch._utils", "_rebuild_tensor_v2")
        .op(b"((")
        .unicode("storage")
        .global("torch", "FloatStorage")
        .unicode("0")
        .unicode("cpu")
        .op(b"J\x40\x0d\x03\x00tQK\x00J\x40\x0d\x03\x00\x85K\x01\x85\x89")
        .global("collections", "OrderedDict")
        .op(b")RtRu")
        .stop();
    let dir = std::env::temp_dir().join(format!("ptload-edge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");

    let good = dir.join("sparse.pt");
    std::fs::write(
        &good,
        zip(&[entry("m/data.pkl", &pickle), entry("m/data/0", &data)]),
    )
    .expect("write");
    let ckpt = Checkpoint::open(&good).expect("open");
    let t = ckpt.tensor("w").expect("w");
    assert_eq!(t.shape(), [200_000]);
    assert_eq!(&*t.data().expect("data"), data.as_slice());

    let bad = dir.join("mismatch.pt");
    let mismatch = zip(&[
        entry("m/data.pkl", &pickle),
        ZipEntry {
            local_name: "m/data/1".into(),
            ..entry("m/data/0", &data)
        },
    ]);
    std::fs::write(&bad, mismatch).expect("write");
    let e = Checkpoint::open(&bad).expect_err("names disagree");
    assert!(
        e.to_string()
            .contains("differs from central directory name"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// An unknown backend tag is no error until it must be restored with no
/// mapping for it; then the error is torch's, naming the tensor.
#[test]
fn unknown_location_fails_only_when_restored() {
    use ptload_reader::placement::{Device, DeviceMap, Keep, Location, Table, To};
    let pickle = P::default()
        .proto(2)
        .op(b"}(")
        .tensor_item("w", "npu:0", 2, 2)
        .op(b"u")
        .stop();
    let ckpt = open(checkpoint(&pickle)).expect("an unknown tag is fine to read");
    assert_eq!(ckpt.tensor("w").expect("w").location(), "npu:0");
    let e = DeviceMap::new(&ckpt, &mut Keep).expect_err("cannot restore npu:0");
    assert_eq!(
        e.message(),
        "don't know how to restore data location of torch.storage.UntypedStorage (tagged with npu:0)"
    );
    // The advice as data, for each front end to word.
    assert_eq!(
        e.hint(),
        Some(&ptload_reader::advice::Hint::MapLocation {
            from: Some("npu:0".into()),
            to: Some("cpu".into())
        })
    );
    assert!(
        e.to_string()
            .contains(": map it with a map location \"npu:0=cpu\""),
        "{e}"
    );
    assert_eq!(e.tensor(), Some("w"));
    let plan = DeviceMap::new(&ckpt, &mut To(Device::Host)).expect("mapped");
    assert_eq!(plan.target(0), Some(Device::Host));
    let mut table = Table(vec![(Location::parse("npu:0"), Device::Cuda(1))]);
    assert_eq!(
        DeviceMap::new(&ckpt, &mut table).expect("mapped").target(0),
        Some(Device::Cuda(1))
    );
}

#[test]
#[cfg_attr(miri, ignore = "file system")]
fn in_memory_checkpoints_survive_changes_to_the_file() {
    // A mapped file must not change while it is open; one read into memory
    // keeps what was read, whatever happens to the file afterwards.
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files/basic.pt");
    let dir = std::env::temp_dir().join(format!("ptload-edge-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("basic.pt");
    std::fs::copy(&fixture, &path).unwrap();
    let expected: Vec<(String, Vec<u8>)> = Checkpoint::open(&fixture)
        .unwrap()
        .tensors()
        .map(|t| (t.name().to_owned(), t.data().unwrap().into_owned()))
        .collect();
    let ckpt = OpenOptions::new().in_memory(true).open(&path).unwrap();
    assert!(!ckpt.is_mapped());
    // Truncated, then rewritten with other bytes.
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    std::fs::write(&path, vec![0xa5u8; 4096]).unwrap();
    let read: Vec<(String, Vec<u8>)> = ckpt
        .tensors()
        .map(|t| (t.name().to_owned(), t.data().unwrap().into_owned()))
        .collect();
    assert_eq!(read, expected);
    assert!(!expected.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn names_are_unique_and_looked_up_by_hash() {
    // {"a.b": t, "a": {"b": t}}: both flatten to "a.b".
    let pickle = P::default()
        .proto(2)
        .op(b"}(")
        .tensor_item("a.b", "cpu", 2, 2)
        .unicode("a")
        .op(b"}(")
        .tensor_item("b", "cpu", 2, 2)
        .op(b"uu")
        .stop();
    let e = open(checkpoint(&pickle)).expect_err("collision");
    assert_eq!(e.kind(), ErrorKind::DuplicateName);
    assert!(e.to_string().contains("['a.b'] and ['a']['b']"), "{e}");
    // With the object (torch.load's view, which never flattens), the later
    // tensor is named by its Python path instead; both are in the tree.
    let ckpt = OpenOptions::new()
        .objects(true)
        .open_bytes(checkpoint(&pickle))
        .expect("objects");
    let names: Vec<&str> = ckpt.tensors().map(|t| t.name()).collect();
    assert_eq!(names, ["a.b", "['a']['b']"]);
    assert!(ckpt.tensor("['a']['b']").is_some());
    assert_eq!(ckpt.objects().map(|o| o.tensors().len()), Some(2));
    // Distinct names: every one is found by name, and only those.
    let pickle = P::default()
        .proto(2)
        .op(b"}(")
        .tensor_item("a.b", "cpu", 2, 2)
        .unicode("a")
        .op(b"}(")
        .tensor_item("c", "cpu", 2, 2)
        .op(b"uu")
        .stop();
    let ckpt = open(checkpoint(&pickle)).expect("distinct");
    for t in ckpt.tensors() {
        assert_eq!(ckpt.tensor(t.name()).map(|v| v.name()), Some(t.name()));
    }
    assert!(ckpt.tensor("a").is_none());
    assert!(ckpt.tensor("a.c").is_some());
}

#[test]
fn integer_text_follows_pythons_digit_limit() {
    // CPython refuses to convert integer text over 4,300 digits; so does
    // the reader, in time linear in the text.
    for (digits, ok) in [(4300usize, true), (4301, false), (1_000_000, false)] {
        let mut b = P::default().proto(2).op(b"}(").unicode("n").0;
        b.push(b'I');
        b.extend(std::iter::repeat_n(b'9', digits));
        b.extend_from_slice(b"\nu.");
        let result = open(checkpoint(&b));
        assert_eq!(result.is_ok(), ok, "{digits} digits");
        if let Err(e) = result {
            assert!(e.to_string().contains("4300"), "{e}");
        }
    }
}

/// `_rebuild_tensor_v2` of storage "0" (2 floats) whose persistent id ends
/// with `sixth` (raw opcodes), as TorchScript archives of torch 1.3/1.4
/// write it.
fn six_item_tensor(p: P, sixth: &[u8]) -> P {
    p.global("torch._utils", "_rebuild_tensor_v2")
        .op(b"((")
        .unicode("storage")
        .global("torch", "FloatStorage")
        .unicode("0")
        .unicode("cpu")
        .int(2)
        .op(sixth)
        .op(b"tQ")
        .int(0)
        .int(2)
        .op(&[0x85])
        .int(1)
        .op(&[0x85, 0x89])
        .global("collections", "OrderedDict")
        .op(b")Rt")
        .op(b"R")
}

#[test]
fn torchscript_v1_storage_ids_have_a_sixth_item() {
    // A TorchScript archive (constants.pkl, version 1) whose module holds
    // one tensor attribute; its storage id is ('storage', FloatStorage,
    // '0', 'cpu', 2, None).
    let build = |sixth: &[u8]| {
        let pickle = six_item_tensor(
            P::default()
                .proto(2)
                .global("__torch__", "M")
                .op(b")")
                .op(&[0x81])
                .op(b"}(")
                .unicode("weight"),
            sixth,
        )
        .op(b"ub")
        .stop();
        let data = storage(&[1.5, -2.0]);
        let constants = P::default().proto(2).op(b")").stop();
        zip(&[
            entry("m/data.pkl", &pickle),
            entry("m/constants.pkl", &constants),
            entry("m/version", b"1\n"),
            entry("m/data/0", &data),
        ])
    };
    let ckpt = open(build(b"N")).expect("six items, the last None");
    let names: Vec<&str> = ckpt.tensors().map(|t| t.name()).collect();
    assert_eq!(names, ["weight"]);
    let w = ckpt.tensor("weight").unwrap();
    assert_eq!(&*w.data().unwrap(), storage(&[1.5, -2.0]).as_slice());
    // In a zip, only None may follow: view metadata is a legacy feature.
    let e = open(build(b"K\x05")).expect_err("sixth item not None");
    assert!(e.to_string().contains("6 items"), "{e}");
}

/// A cancelled open stops in the pickle machine with `Cancelled`; an
/// untouched flag changes nothing.
#[test]
fn an_open_stops_when_cancelled() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/files/many_tensors.pt");
    let set = Arc::new(AtomicBool::new(true));
    let err = OpenOptions::new()
        .cancel(set)
        .open(&path)
        .expect_err("cancelled");
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert!(err.offset().is_some(), "{err}");
    let clear = Arc::new(AtomicBool::new(false));
    let ckpt = OpenOptions::new().cancel(clear).open(&path).expect("open");
    assert_eq!(ckpt.len(), 20_000);
}

/// torch.save's default protocol 2 writes Python 3's `int`, `range`, `str`
/// by their Python 2 names; they are read as Python 3 names, as torch's
/// unpickler reads them (and `reduce` as the `functools.reduce` Python 3
/// would call). Protocol 3 and later names are taken as written.
#[test]
fn python2_builtin_names_read_as_python3s() {
    let names = |proto: u8| {
        let pickle = P::default()
            .proto(proto)
            .op(b"}(")
            .unicode("n")
            .global("__builtin__", "long")
            .op(b"(")
            .int(5)
            .op(b"tR")
            .unicode("r")
            .global("__builtin__", "xrange")
            .op(b"(")
            .int(3)
            .op(b"tR")
            .unicode("s")
            .global("__builtin__", "unicode")
            .unicode("f")
            .global("__builtin__", "reduce")
            .op(b"u")
            .stop();
        let ckpt = open(checkpoint(&pickle)).expect("open");
        ckpt.globals()
            .iter()
            .map(|g| format!("{}.{}", g.module, g.name))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(2),
        [
            "builtins.int",
            "builtins.range",
            "builtins.str",
            "functools.reduce"
        ]
    );
    assert_eq!(
        names(3),
        [
            "__builtin__.long",
            "__builtin__.xrange",
            "__builtin__.unicode",
            "__builtin__.reduce"
        ]
    );
}
