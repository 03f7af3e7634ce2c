//! Structure-aware fuzzing: generate a valid checkpoint from the fuzzer's
//! bytes, check that it reads back exactly as generated, then mutate it.

use arbitrary::Arbitrary;

use crate::craft::{legacy, zip, Pickle, TensorRecord, ZipEntry};
use crate::{check_error, exercise, limits};
use ptload_reader::{DType, ErrorKind, OpenOptions};

/// The element types the generator writes, with torch's storage class.
const DTYPES: [(DType, &str); 8] = [
    (DType::F32, "FloatStorage"),
    (DType::F16, "HalfStorage"),
    (DType::BF16, "BFloat16Storage"),
    (DType::I64, "LongStorage"),
    (DType::I8, "CharStorage"),
    (DType::U8, "ByteStorage"),
    (DType::Bool, "BoolStorage"),
    (DType::F64, "DoubleStorage"),
];

const LOCATIONS: [&str; 4] = ["cpu", "cuda:0", "cuda:1", "mps"];

/// A checkpoint to generate, and how to damage it.
#[derive(Debug, Arbitrary)]
pub struct Model {
    /// Storages: dtype index, element count, location index.
    pub storages: Vec<(u8, u8, u8)>,
    /// Tensors.
    pub tensors: Vec<TensorSpec>,
    /// Write the legacy layout instead of a zip.
    pub legacy: bool,
    /// Mark the zip's data big-endian (a `byteorder` record).
    pub big_endian: bool,
    /// Deep or large values placed beside the tensors.
    pub extras: Vec<Extra>,
    /// Damage applied to the file after writing it.
    pub mutations: Vec<Mutation>,
}

/// A value that costs the reader in proportion to its depth or to how
/// often it is referenced, placed where a name or a call reaches it. The
/// tensors must read the same with it there, or a limit must stop it.
#[derive(Debug, Arbitrary)]
pub struct Extra {
    /// What to build.
    pub shape: ExtraShape,
    /// Where to put it.
    pub place: Place,
}

/// Deep values nest `depth` levels; long ones are `len % 4096 * 16`
/// bytes, referenced again `refs % 4096` times through the memo.
#[derive(Debug, Arbitrary)]
pub enum ExtraShape {
    /// `[[[...]]]`
    DeepList(u16),
    /// `((((),),),)`
    DeepTuple(u16),
    /// `{0: {0: {...}}}`
    DeepDict(u16),
    /// `frozenset({frozenset({...})})`
    DeepFrozenset(u16),
    /// One long string, referenced again and again in a tuple.
    LongString { len: u16, refs: u16 },
    /// A protocol-0 integer of `digits` digits.
    IntText { digits: u16 },
}

/// Where an [`Extra`] goes.
#[derive(Debug, Arbitrary)]
pub enum Place {
    /// The value of a key of the root dict.
    Value,
    /// A key of the root dict (its text becomes a value's name).
    Key,
    /// The arguments of a call to a class the reader keeps inert.
    CallArgs,
    /// The BUILD state of an inert object.
    BuildState,
    /// The size argument of a tensor's rebuild call: never a valid size,
    /// so the open must fail.
    TensorSize,
}

/// One tensor: a view into a storage.
#[derive(Debug, Arbitrary)]
pub struct TensorSpec {
    /// Which storage (modulo their count).
    pub storage: u8,
    /// Offset in elements.
    pub offset: u8,
    /// Sizes and strides, up to 4 dimensions used.
    pub dims: Vec<(u8, u8)>,
    /// Use row-major strides rather than `dims`' strides.
    pub contiguous: bool,
    /// Put it in a nested dict: `g{group}.t{i}`.
    pub group: Option<u8>,
    /// requires_grad.
    pub requires_grad: bool,
}

/// Damage to a written file; positions are taken modulo its length.
#[derive(Debug, Arbitrary)]
pub enum Mutation {
    /// Flip one bit.
    Flip(u32, u8),
    /// Overwrite one byte.
    Set(u32, u8),
    /// Cut the file here.
    Truncate(u32),
    /// Insert bytes here.
    Insert(u32, Vec<u8>),
    /// Overwrite a little-endian u32 here (lengths and offsets).
    Word(u32, u32),
}

struct Expected {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    stride: Vec<u64>,
    location: &'static str,
    /// Row-major element bytes in host (little-endian) order, or `None`
    /// when the view does not fit its storage (the open must fail).
    bytes: Option<Vec<u8>>,
}

/// Element `i` of a storage, as little-endian bytes of `size`.
fn element(storage: usize, i: u64, size: usize, dtype: DType) -> Vec<u8> {
    let v = (storage as u64)
        .wrapping_mul(1_000_003)
        .wrapping_add(i.wrapping_mul(2_654_435_761));
    let mut b = v.to_le_bytes()[..size].to_vec();
    if dtype == DType::Bool {
        b[0] &= 1;
    }
    b
}

/// A storage to generate: dtype, torch's storage class, element count,
/// location.
type StorageSpec = (DType, &'static str, u64, &'static str);

/// Write the model, check the untouched file reads back exactly, then
/// check every mutation of it is read or refused cleanly.
pub fn structured(model: &Model) {
    if model.storages.is_empty() || model.storages.len() > 8 || model.tensors.len() > 16 {
        return;
    }
    let storages: Vec<StorageSpec> = model
        .storages
        .iter()
        .map(|&(d, n, l)| {
            let (dtype, class) = DTYPES[usize::from(d) % DTYPES.len()];
            (
                dtype,
                class,
                u64::from(n % 64),
                LOCATIONS[usize::from(l) % LOCATIONS.len()],
            )
        })
        .collect();
    let (pickle, expected) = write_pickle(model, &storages);
    let file = write_file(model, &storages, pickle);
    check_read_back(model, &file, &expected);
    if model.mutations.is_empty() {
        return;
    }
    crate::checkpoint(&damage(file, &model.mutations));
}

/// The root dict's pickle: ungrouped tensors, the extras, then each
/// group's dict; with what each tensor must read back as.
fn write_pickle(model: &Model, storages: &[StorageSpec]) -> (Vec<u8>, Vec<Expected>) {
    let mut expected = Vec::new();
    let mut pickle = Pickle::proto(2);
    pickle.op(b"}(");
    let groups: Vec<Option<u8>> = model
        .tensors
        .iter()
        .map(|t| t.group.map(|g| g % 3))
        .collect();
    for (i, spec) in model.tensors.iter().enumerate() {
        if groups[i].is_none() {
            expected.push(emit(&mut pickle, storages, i, spec, format!("t{i}")));
        }
    }
    for (i, extra) in model.extras.iter().take(4).enumerate() {
        place_extra(&mut pickle, i, extra);
    }
    for g in 0..3u8 {
        let members: Vec<usize> = (0..model.tensors.len())
            .filter(|&i| groups[i] == Some(g))
            .collect();
        if members.is_empty() {
            continue;
        }
        pickle.str(&format!("g{g}")).op(b"}(");
        for i in members {
            let spec = &model.tensors[i];
            expected.push(emit(&mut pickle, storages, i, spec, format!("g{g}.t{i}")));
        }
        pickle.op(b"u");
    }
    pickle.op(b"u");
    (pickle.stop(), expected)
}

/// Write tensor `i` (key `t{i}`) into `pickle`; what it must read back as
/// under `name`.
fn emit(
    pickle: &mut Pickle,
    storages: &[StorageSpec],
    i: usize,
    spec: &TensorSpec,
    name: String,
) -> Expected {
    let s = usize::from(spec.storage) % storages.len();
    let (dtype, class, numel, location) = storages[s];
    let dims: Vec<(u64, u64)> = spec
        .dims
        .iter()
        .take(4)
        .map(|&(n, st)| (u64::from(n % 6), u64::from(st % 8)))
        .collect();
    let shape: Vec<u64> = dims.iter().map(|d| d.0).collect();
    let stride: Vec<u64> = if spec.contiguous {
        let mut acc = 1;
        let mut st = vec![0; shape.len()];
        for (k, &n) in shape.iter().enumerate().rev() {
            st[k] = acc;
            acc *= n.max(1);
        }
        st
    } else {
        dims.iter().map(|d| d.1).collect()
    };
    let offset = u64::from(spec.offset % 16);
    let count: u64 = shape.iter().product();
    let extent = shape
        .iter()
        .zip(&stride)
        .map(|(&n, &st)| n.saturating_sub(1) * st)
        .sum::<u64>();
    let fits = count == 0 || offset + extent < numel;
    let bytes = fits.then(|| {
        let mut out = Vec::new();
        let mut index = vec![0u64; shape.len()];
        for _ in 0..count {
            let at = offset + index.iter().zip(&stride).map(|(i, s)| i * s).sum::<u64>();
            out.extend(element(s, at, dtype.size(), dtype));
            for k in (0..index.len()).rev() {
                index[k] += 1;
                if index[k] < shape[k] {
                    break;
                }
                index[k] = 0;
            }
        }
        out
    });
    let key = s.to_string();
    pickle.str(&format!("t{i}")).tensor(&TensorRecord {
        storage_class: class,
        key: &key,
        location,
        storage_numel: numel,
        offset,
        shape: &shape,
        stride: &stride,
        requires_grad: spec.requires_grad,
    });
    Expected {
        name,
        dtype,
        shape,
        stride,
        location,
        bytes,
    }
}

/// The checkpoint file: a zip (big-endian when asked) or the legacy
/// layout, with the storages some tensor uses.
fn write_file(model: &Model, storages: &[StorageSpec], pickle: Vec<u8>) -> Vec<u8> {
    let big = model.big_endian && !model.legacy;
    let storage_bytes: Vec<Vec<u8>> = storages
        .iter()
        .enumerate()
        .map(|(s, &(dtype, _, numel, _))| {
            (0..numel)
                .flat_map(|i| {
                    let mut e = element(s, i, dtype.size(), dtype);
                    if big {
                        e.reverse();
                    }
                    e
                })
                .collect()
        })
        .collect();
    // Only storages some tensor uses are written, as torch does.
    let used: Vec<usize> = (0..storages.len())
        .filter(|s| {
            model
                .tensors
                .iter()
                .any(|t| usize::from(t.storage) % storages.len() == *s)
        })
        .collect();
    if model.legacy {
        let keys: Vec<String> = used.iter().map(|s| s.to_string()).collect();
        let records: Vec<(&str, u64, &[u8])> = used
            .iter()
            .zip(&keys)
            .map(|(&s, k)| (k.as_str(), storages[s].2, storage_bytes[s].as_slice()))
            .collect();
        legacy(&pickle, &records, true)
    } else {
        let mut entries = vec![ZipEntry::new("archive/data.pkl", pickle)];
        if big {
            entries.push(ZipEntry::new("archive/byteorder", b"big".to_vec()));
        }
        for &s in &used {
            entries.push(ZipEntry::new(
                format!("archive/data/{s}"),
                storage_bytes[s].clone(),
            ));
        }
        entries.push(ZipEntry::new("archive/version", b"3\n".to_vec()));
        zip(&entries)
    }
}

/// The untouched file opens and every tensor reads back as generated, or
/// (a view outside its storage, an extra Python refuses, a deep or large
/// extra past a limit) it is refused cleanly.
fn check_read_back(model: &Model, file: &[u8], expected: &[Expected]) {
    let opened = OpenOptions::new()
        .limits(limits())
        .open_bytes(file.to_vec());
    // Extras Python itself refuses: a size that is no size, integer text
    // over CPython's 4,300 digits.
    let invalid_extra = model.extras.iter().take(4).any(|e| {
        matches!(e.place, Place::TensorSize)
            || matches!(e.shape, ExtraShape::IntText { digits } if digits > 4300)
    });
    let all_fit = expected.iter().all(|e| e.bytes.is_some()) && !invalid_extra;
    match opened {
        Ok(ckpt) => {
            assert!(
                all_fit,
                "opened a checkpoint with a view outside its storage"
            );
            assert_eq!(ckpt.len(), expected.len(), "tensor count");
            for e in expected {
                let t = ckpt
                    .tensor(&e.name)
                    .unwrap_or_else(|| panic!("tensor {} missing", e.name));
                assert_eq!(t.dtype(), e.dtype, "{}", e.name);
                assert_eq!(t.shape(), e.shape.as_slice(), "{}", e.name);
                assert_eq!(t.stride(), e.stride.as_slice(), "{}", e.name);
                assert_eq!(t.location(), e.location, "{}", e.name);
                let data = t
                    .data()
                    .unwrap_or_else(|err| panic!("reading {}: {err}", e.name));
                assert!(Some(&*data) == e.bytes.as_deref(), "bytes of {}", e.name);
            }
            exercise(&ckpt);
        }
        Err(err) => {
            // Deep and large extras may stop at a limit; nothing else may.
            assert!(
                !all_fit || err.kind() == ErrorKind::LimitExceeded,
                "a valid generated checkpoint failed to open: {err}"
            );
            check_error(&err);
        }
    }
}

/// `file` with the first eight mutations applied.
fn damage(mut damaged: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations.iter().take(8) {
        let len = damaged.len().max(1) as u32;
        match m {
            Mutation::Flip(at, bit) => {
                if let Some(b) = damaged.get_mut((at % len) as usize) {
                    *b ^= 1 << (bit % 8);
                }
            }
            Mutation::Set(at, v) => {
                if let Some(b) = damaged.get_mut((at % len) as usize) {
                    *b = *v;
                }
            }
            Mutation::Truncate(at) => damaged.truncate((at % len) as usize),
            Mutation::Insert(at, bytes) => {
                let at = ((at % len) as usize).min(damaged.len());
                damaged.splice(at..at, bytes.iter().copied().take(64));
            }
            Mutation::Word(at, v) => {
                let at = (at % len) as usize;
                for (d, s) in damaged.iter_mut().skip(at).zip(v.to_le_bytes()) {
                    *d = s;
                }
            }
        }
    }
    damaged
}

/// Write `extra` `i` as one more item of the root dict (after its MARK).
fn place_extra(p: &mut Pickle, i: usize, extra: &Extra) {
    let value = |p: &mut Pickle| write_shape(p, &extra.shape);
    // Lists and dicts cannot be keys (Python: unhashable type).
    let hashable = !matches!(
        extra.shape,
        ExtraShape::DeepList(_) | ExtraShape::DeepDict(_)
    );
    match extra.place {
        Place::Value | Place::Key if !hashable => {
            p.str(&format!("x{i}"));
            value(p);
        }
        Place::Value => {
            p.str(&format!("x{i}"));
            value(p);
        }
        Place::Key => {
            value(p);
            p.op(b"N");
        }
        Place::CallArgs => {
            p.str(&format!("x{i}")).global("fuzz.inert", "Thing");
            value(p);
            p.op(&[0x85]).op(b"R");
        }
        Place::BuildState => {
            p.str(&format!("x{i}"))
                .global("fuzz.inert", "Thing")
                .op(b")")
                .op(&[0x81]);
            value(p);
            p.op(b"b");
        }
        Place::TensorSize => {
            // _rebuild_tensor_v2(storage, 0, <extra>, (1,), False, OrderedDict())
            p.str(&format!("x{i}"))
                .global("torch._utils", "_rebuild_tensor_v2")
                .op(b"(");
            p.op(b"(")
                .str("storage")
                .global("torch", "FloatStorage")
                .str(&format!("extra{i}"))
                .str("cpu")
                .int(0)
                .op(b"tQ");
            p.int(0);
            value(p);
            p.int_tuple(&[1])
                .bool(false)
                .global("collections", "OrderedDict")
                .op(b")R")
                .op(b"tR");
        }
    }
}

/// Push the value `shape` describes.
fn write_shape(p: &mut Pickle, shape: &ExtraShape) {
    match *shape {
        ExtraShape::DeepList(depth) => {
            let depth = usize::from(depth).max(1);
            p.op(&b"]".repeat(depth)).op(&b"a".repeat(depth - 1));
        }
        ExtraShape::DeepTuple(depth) => {
            p.op(b")").op(&[0x85].repeat(usize::from(depth)));
        }
        ExtraShape::DeepDict(depth) => {
            let depth = usize::from(depth).max(1);
            p.op(&b"}K\x00".repeat(depth - 1))
                .op(b"}")
                .op(&b"s".repeat(depth - 1));
        }
        ExtraShape::DeepFrozenset(depth) => {
            // depth + 1 MARKs, then FROZENSET as often: each takes the
            // set built before it as its one member.
            let n = usize::from(depth) + 1;
            p.op(&b"(".repeat(n)).op(&[0x91].repeat(n));
        }
        ExtraShape::LongString { len, refs } => {
            // Up to 64 KiB referenced up to 4,095 times: enough to show
            // superlinear work, small enough to keep the fuzzer fast.
            p.str(&"s".repeat(usize::from(len % 4096) * 16))
                .op(b"q\x00")
                .op(b"0");
            p.op(b"(")
                .op(&b"h\x00".repeat(usize::from(refs % 4096)))
                .op(b"t");
        }
        ExtraShape::IntText { digits } => {
            let digits = usize::from(digits).max(1);
            p.op(b"I").op(&b"9".repeat(digits)).op(b"\n");
        }
    }
}
