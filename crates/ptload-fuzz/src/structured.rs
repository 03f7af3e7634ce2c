//! Structure-aware fuzzing: generate a valid checkpoint from the fuzzer's
//! bytes, check that it reads back exactly as generated, then mutate it.

use arbitrary::Arbitrary;

use crate::craft::{legacy, zip, Pickle, TensorRecord, ZipEntry};
use crate::{check_error, exercise, limits};
use ptload_reader::{DType, OpenOptions};

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
    /// Damage applied to the file after writing it.
    pub mutations: Vec<Mutation>,
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

/// Write the model, check the untouched file reads back exactly, then
/// check every mutation of it is read or refused cleanly.
pub fn structured(model: &Model) {
    if model.storages.is_empty() || model.storages.len() > 8 || model.tensors.len() > 16 {
        return;
    }
    let storages: Vec<(DType, &str, u64, &'static str)> = model
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
    let big = model.big_endian && !model.legacy;
    let mut expected = Vec::new();
    let mut pickle = Pickle::proto(2);
    pickle.op(b"}(");
    let groups: Vec<Option<u8>> = model
        .tensors
        .iter()
        .map(|t| t.group.map(|g| g % 3))
        .collect();
    let mut emit = |pickle: &mut Pickle, i: usize, spec: &TensorSpec, name: String| {
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
        expected.push(Expected {
            name,
            dtype,
            shape,
            stride,
            location,
            bytes,
        });
    };
    for (i, spec) in model.tensors.iter().enumerate() {
        if groups[i].is_none() {
            emit(&mut pickle, i, spec, format!("t{i}"));
        }
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
            emit(&mut pickle, i, &model.tensors[i], format!("g{g}.t{i}"));
        }
        pickle.op(b"u");
    }
    pickle.op(b"u");
    let pickle = pickle.stop();

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
    let file = if model.legacy {
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
    };

    let opened = OpenOptions::new().limits(limits()).open_bytes(file.clone());
    let all_fit = expected.iter().all(|e| e.bytes.is_some());
    match opened {
        Ok(ckpt) => {
            assert!(
                all_fit,
                "opened a checkpoint with a view outside its storage"
            );
            assert_eq!(ckpt.len(), expected.len(), "tensor count");
            for e in &expected {
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
            assert!(
                !all_fit,
                "a valid generated checkpoint failed to open: {err}"
            );
            check_error(&err);
        }
    }

    if model.mutations.is_empty() {
        return;
    }
    let mut damaged = file;
    for m in model.mutations.iter().take(8) {
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
    crate::checkpoint(&damaged);
}
