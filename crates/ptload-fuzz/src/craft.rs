//! Writers for the byte formats torch produces, small and explicit, for
//! building checkpoints the fuzzers mutate and the hostile corpus is made of.

/// A pickle assembler: opcodes with their arguments, nothing implicit.
#[derive(Debug, Default, Clone)]
pub struct Pickle(pub Vec<u8>);

impl Pickle {
    /// Start a pickle with PROTO `n`.
    pub fn proto(n: u8) -> Pickle {
        Pickle(vec![0x80, n])
    }
    /// Raw opcode bytes.
    pub fn op(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// BINUNICODE.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.0.push(b'X');
        self.0.extend_from_slice(&len32(s.len()).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// BININT / BININT1, whichever fits.
    pub fn int(&mut self, i: i64) -> &mut Self {
        if let Ok(b) = u8::try_from(i) {
            self.op(&[b'K', b])
        } else if let Ok(v) = i32::try_from(i) {
            self.0.push(b'J');
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        } else {
            self.0.extend_from_slice(&[0x8a, 8]);
            self.0.extend_from_slice(&i.to_le_bytes());
            self
        }
    }
    /// NEWTRUE / NEWFALSE.
    pub fn bool(&mut self, b: bool) -> &mut Self {
        self.op(&[if b { 0x88 } else { 0x89 }])
    }
    /// GLOBAL `module.name`.
    pub fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.op(format!("c{module}\n{name}\n").as_bytes())
    }
    /// A tuple of small ints (MARK ... TUPLE).
    pub fn int_tuple(&mut self, items: &[u64]) -> &mut Self {
        self.op(b"(");
        for &i in items {
            self.int(i64::try_from(i).unwrap_or(i64::MAX));
        }
        self.op(b"t")
    }
    /// `torch._utils._rebuild_tensor_v2((storage pid), offset, size, stride,
    /// requires_grad, OrderedDict())`, the way `torch.save` writes a tensor.
    pub fn tensor(&mut self, t: &TensorRecord<'_>) -> &mut Self {
        self.global("torch._utils", "_rebuild_tensor_v2").op(b"((");
        self.str("storage")
            .global("torch", t.storage_class)
            .str(t.key)
            .str(t.location)
            .int(i64::try_from(t.storage_numel).unwrap_or(i64::MAX))
            .op(b"tQ");
        self.int(i64::try_from(t.offset).unwrap_or(i64::MAX))
            .int_tuple(t.shape)
            .int_tuple(t.stride)
            .bool(t.requires_grad)
            .global("collections", "OrderedDict")
            .op(b")R")
            .op(b"tR")
    }
    /// STOP, and the bytes.
    pub fn stop(&mut self) -> Vec<u8> {
        self.0.push(b'.');
        std::mem::take(&mut self.0)
    }
}

/// What one tensor's rebuild call says.
#[derive(Debug, Clone)]
pub struct TensorRecord<'a> {
    /// `FloatStorage`, `HalfStorage`, ...
    pub storage_class: &'a str,
    /// Storage key (the record name under `data/`).
    pub key: &'a str,
    /// Saved location (`cpu`, `cuda:1`).
    pub location: &'a str,
    /// Elements in the storage.
    pub storage_numel: u64,
    /// Offset into the storage, in elements.
    pub offset: u64,
    /// Sizes.
    pub shape: &'a [u64],
    /// Strides.
    pub stride: &'a [u64],
    /// requires_grad.
    pub requires_grad: bool,
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One stored zip entry, with the knobs the hostile corpus turns.
#[derive(Debug, Clone)]
pub struct ZipEntry {
    /// Name in the central directory.
    pub name: String,
    /// Name in the local header (normally the same).
    pub local_name: String,
    /// The stored bytes.
    pub data: Vec<u8>,
    /// General-purpose flags (bit 0: encrypted).
    pub flags: u16,
    /// CRC-32 to record; computed when `None`.
    pub crc: Option<u32>,
    /// Bytes to pad before the local header, so data starts 64-byte aligned
    /// the way torch's writer aligns it.
    pub align: bool,
}

impl ZipEntry {
    /// A plain stored entry.
    pub fn new(name: impl Into<String>, data: Vec<u8>) -> ZipEntry {
        let name = name.into();
        ZipEntry {
            local_name: name.clone(),
            name,
            data,
            flags: 0,
            crc: None,
            align: true,
        }
    }
}

/// A zip archive of stored entries, laid out as torch's writer does
/// (each record's data 64-byte aligned through the extra field).
pub fn zip(entries: &[ZipEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for e in entries {
        let offset = len32(out.len());
        let crc = e.crc.unwrap_or_else(|| crc32fast::hash(&e.data));
        let size = len32(e.data.len());
        let header_end = out.len() + 30 + e.local_name.len() + 4;
        let pad = if e.align {
            (64 - header_end % 64) % 64
        } else {
            0
        };
        let extra_len = if e.align { 4 + pad } else { 0 };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&[20, 0]);
        out.extend_from_slice(&e.flags.to_le_bytes());
        out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        for v in [crc, size, size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&u16::try_from(e.local_name.len()).unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&u16::try_from(extra_len).unwrap_or(0).to_le_bytes());
        out.extend_from_slice(e.local_name.as_bytes());
        if e.align {
            // An unknown extra field (id 0x4650, as torch uses) holding padding.
            out.extend_from_slice(&0x4650u16.to_le_bytes());
            out.extend_from_slice(&u16::try_from(pad).unwrap_or(0).to_le_bytes());
            out.resize(out.len() + pad, 0);
        }
        out.extend_from_slice(&e.data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[20, 0, 20, 0]);
        central.extend_from_slice(&e.flags.to_le_bytes());
        central.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        for v in [crc, size, size] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        central.extend_from_slice(&u16::try_from(e.name.len()).unwrap_or(0).to_le_bytes());
        central.extend_from_slice(&[0; 12]);
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(e.name.as_bytes());
    }
    let cd_offset = len32(out.len());
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    let n = u16::try_from(entries.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&len32(central.len()).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

/// The legacy layout (torch < 1.6): magic, protocol version and sys_info
/// pickles, the object pickle, the storage key list, then each storage as
/// an int64 element count and its bytes.
pub fn legacy(object: &[u8], storages: &[(&str, u64, &[u8])], little_endian: bool) -> Vec<u8> {
    let mut out = Vec::new();
    // Magic number 0x1950a86a20f9469cfc6c as LONG1.
    out.extend_from_slice(&[
        0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, b'.',
    ]);
    let mut p = Pickle::proto(2);
    out.extend(p.int(1001).stop());
    let mut p = Pickle::proto(2);
    p.op(b"}(")
        .str("protocol_version")
        .int(1001)
        .str("little_endian")
        .bool(little_endian)
        .str("type_sizes")
        .op(b"}(")
        .str("short")
        .int(2)
        .str("int")
        .int(4)
        .str("long")
        .int(4)
        .op(b"uu");
    out.extend(p.stop());
    out.extend_from_slice(object);
    let mut p = Pickle::proto(2);
    p.op(b"(");
    for (key, _, _) in storages {
        p.str(key);
    }
    p.op(b"l");
    out.extend(p.stop());
    for (_, numel, bytes) in storages {
        out.extend_from_slice(&numel.to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}
