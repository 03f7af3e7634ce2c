//! The pickle virtual machine: protocols 0 to 5, executing no code.
//!
//! GLOBAL pushes a name; REDUCE, NEWOBJ, BUILD and persistent ids are handed
//! to an [`Interpreter`], which gives them meaning or keeps them inert. Every
//! length is checked against the bytes present before anything is allocated,
//! and every resource is charged against [`Limits`].

use std::collections::HashMap;

use super::value::{Heap, Obj, Tag, Value};
use crate::bytes::{negate_le, ByteReader};
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;

/// How Python 2 `str` values (STRING, BINSTRING, SHORT_BINSTRING) decode,
/// as torch.load's `encoding` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StringEncoding {
    /// Decode as UTF-8; invalid UTF-8 is an error (torch's default).
    #[default]
    Utf8,
    /// Decode as Latin-1 (every byte is a character).
    Latin1,
    /// Decode as ASCII; a byte over 0x7f is an error.
    Ascii,
    /// Keep the raw bytes.
    Bytes,
}

impl std::str::FromStr for StringEncoding {
    type Err = Error;

    /// Python's names for the encodings (any case): `utf-8`/`utf8`,
    /// `latin1`/`latin-1`/`iso-8859-1`/`l1`, `ascii`/`us-ascii`/`646`,
    /// `bytes`.
    fn from_str(text: &str) -> Result<StringEncoding> {
        Ok(match text.to_ascii_lowercase().as_str() {
            "utf-8" | "utf8" => StringEncoding::Utf8,
            "latin1" | "latin-1" | "iso-8859-1" | "l1" => StringEncoding::Latin1,
            "ascii" | "us-ascii" | "646" => StringEncoding::Ascii,
            "bytes" => StringEncoding::Bytes,
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidSpec,
                    format!(
                        "encoding {text:?}: ptload decodes Python 2 strings as 'utf-8', \
                         'latin1', 'ascii' or 'bytes'"
                    ),
                ))
            }
        })
    }
}

/// Gives meaning to the operations that would call code in Python.
pub(crate) trait Interpreter {
    /// GLOBAL / STACK_GLOBAL / INST: a reference to `module.name`.
    fn global(&mut self, heap: &mut Heap, module: &str, name: &str, offset: u64) -> Result<Value>;
    /// STACK_GLOBAL whose module or name is not a string in the pickle
    /// (a value computed while unpickling, which may be a string by then).
    /// Python refuses operands that are not strings when it gets there.
    fn dynamic_global(
        &mut self,
        _heap: &mut Heap,
        _module: Value,
        _name: Value,
        _offset: u64,
    ) -> Result<Value> {
        Err(pickle_err("STACK_GLOBAL requires str"))
    }
    /// REDUCE: `callable(*args)`.
    fn call(&mut self, heap: &mut Heap, callable: Value, args: Value) -> Result<Value>;
    /// NEWOBJ / NEWOBJ_EX: `cls.__new__(cls, *args)`.
    fn new_object(&mut self, heap: &mut Heap, cls: Value, args: Value) -> Result<Value>;
    /// INST / OBJ: `cls(*args)`, which Python runs as a call (`__init__`
    /// runs, or a function). By default, as NEWOBJ.
    fn instantiate(&mut self, heap: &mut Heap, cls: Value, args: Value) -> Result<Value> {
        self.new_object(heap, cls, args)
    }
    /// BUILD: `obj.__setstate__(state)`.
    fn build(&mut self, heap: &mut Heap, obj: Value, state: Value) -> Result<()>;
    /// PERSID / BINPERSID.
    fn persistent_load(&mut self, heap: &mut Heap, pid: Value) -> Result<Value>;
    /// APPEND / APPENDS / SETITEM / SETITEMS / ADDITEMS on `target`, an
    /// object the interpreter made (not a list, dict or set): for ADDITEMS
    /// Python calls `target.add(value)` for each value; for APPEND and APPENDS
    /// Python calls `target.extend(values)` when it has one, else
    /// `target.append(value)` for each value (looked up on the instance
    /// first); for SETITEM(S) the type's `__setitem__`. `methods` are the
    /// names looked up, in order. By default nothing is recorded (the
    /// items are kept).
    fn method_call(
        &mut self,
        _heap: &mut Heap,
        _target: Value,
        _methods: &[&str],
        _values: &[Value],
    ) -> Result<()> {
        Ok(())
    }
    /// EXT1 / EXT2 / EXT4: the object `copyreg`'s extension registry holds
    /// for `code` when the file is loaded (whatever was registered there,
    /// by the process or by an earlier part of the same file). Refused by
    /// default.
    fn extension(&mut self, _heap: &mut Heap, _code: u32, _offset: u64) -> Result<Value> {
        Err(pickle_err(
            "extension registry codes (EXT1/2/4) are not supported",
        ))
    }
}

/// The result of running one pickle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VmOutput {
    pub(crate) value: Value,
    /// Offset just past the STOP opcode.
    pub(crate) end: usize,
    /// The PROTO opcode's value; 0 or 1 (by the opcodes seen) when absent.
    pub(crate) protocol: u8,
    /// PUTs that replaced a defined memo entry (legal, and rare; some other
    /// unpicklers get them wrong, which differential tests must know).
    #[cfg_attr(not(feature = "fuzzing"), allow(dead_code))]
    pub(crate) memo_overwrites: usize,
    /// The end of the FRAME the STOP was in, when bytes of it follow the
    /// STOP: CPython's C unpickler reading a file without `peek` (one
    /// opened unbuffered) has read the whole frame, so the file's next
    /// reader starts there.
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    pub(crate) frame_end: Option<usize>,
}

/// The memo: dense for the indices pickles normally use, sparse otherwise,
/// so a huge index costs one entry, not a huge vector.
#[derive(Default)]
struct Memo {
    dense: Vec<Option<Value>>,
    sparse: HashMap<u64, Value>,
    count: usize,
    overwrites: usize,
}

/// The most memo entries reserved before a pickle runs (16 MiB): a legacy
/// file's pickles are followed by its tensors' bytes, which put nothing in
/// the memo.
const MEMO_RESERVE_MAX: usize = 1 << 20;

impl Memo {
    /// Room for `entries` dense entries, never more than `max` nor
    /// `MEMO_RESERVE_MAX`. `run` passes an eighth of the bytes from the
    /// pickle's start (each entry takes a PUT and the opcodes of its value;
    /// torch's pickles spend about 11 bytes an entry): sized by bytes
    /// present, so the table of a pickle up to 8 MiB grows without copies.
    fn with_capacity(entries: usize, max: usize) -> Memo {
        Memo {
            dense: Vec::with_capacity(entries.min(max).min(MEMO_RESERVE_MAX)),
            ..Memo::default()
        }
    }

    fn put(&mut self, index: u64, value: Value, max: usize) -> Result<()> {
        let dense_len = self.dense.len() as u64;
        let is_new = if index < dense_len {
            let slot = self
                .dense
                .get_mut(index as usize)
                .ok_or_else(|| pickle_err("memo"))?;
            let new = slot.is_none();
            *slot = Some(value);
            new
        } else if index == dense_len && !self.sparse.contains_key(&index) {
            self.dense.push(Some(value));
            true
        } else {
            self.sparse.insert(index, value).is_none()
        };
        if !is_new {
            self.overwrites += 1;
        }
        if is_new {
            self.count += 1;
            if self.count > max {
                return Err(Error::limit("max_memo_entries", max as u64));
            }
        }
        Ok(())
    }

    fn get(&self, index: u64) -> Result<Value> {
        let found = if index < self.dense.len() as u64 {
            self.dense.get(index as usize).copied().flatten()
        } else {
            self.sparse.get(&index).copied()
        };
        found.ok_or_else(|| pickle_err(format!("memo key {index} is not defined")))
    }
}

fn frame_crossed() -> Error {
    pickle_err(
        "an opcode reads past the end of its FRAME: Python refuses such a pickle, \
         or (its C unpickler reading a file) runs other opcodes than these bytes show",
    )
}

fn pickle_err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Pickle, message)
}

/// A Python 2 string that does not decode in the encoding asked for.
fn decode_err(message: String) -> Error {
    Error::new(ErrorKind::Decode, message)
}

/// The VM; opcode budgets are shared across every pickle of one file.
pub(crate) struct Vm<'l> {
    limits: &'l Limits,
    encoding: StringEncoding,
    opcodes: u64,
    /// Whether the last run stopped at an opcode that reads past the end
    /// of its FRAME (or a FRAME inside an unfinished one): Python's pure
    /// unpickler refuses such a pickle, and its C unpickler, reading from a
    /// file, drops and re-reads bytes there, so it runs other opcodes than
    /// the bytes show.
    pub(crate) frame_crossed: bool,
    /// With this set (the scanner), a FRAME that declares more bytes than
    /// are left is read to the end of the bytes instead of refused:
    /// Python's C unpickler stops there, its pure-Python one (which does
    /// not check the length) runs what the frame holds.
    pub(crate) read_short_frames: bool,
    /// Whether the last run met such a FRAME.
    pub(crate) frame_short: bool,
    /// With this set (the scanner), text holding lone surrogates, which
    /// Python's unpickler accepts (BINUNICODE's `surrogatepass`, UNICODE's
    /// `\ud800` escapes) and Rust strings cannot hold, is read with each
    /// surrogate as U+FFFD instead of refused, so what follows is seen.
    pub(crate) lone_surrogates: bool,
    /// Set by another thread to stop the run ([`crate::OpenOptions::cancel`]).
    pub(crate) cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// Opcodes between looks at the cancel flag.
const CANCEL_EVERY: u64 = 1 << 12;

struct Machine<'a, 'h, I> {
    r: ByteReader<'a>,
    heap: &'h mut Heap,
    interp: &'h mut I,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    /// Where the current FRAME ends, while one is open.
    frame_end: Option<usize>,
    /// A FRAME began before the current one ended.
    frame_crossed: bool,
    /// See `Vm::read_short_frames` and `Vm::frame_short`.
    read_short_frames: bool,
    frame_short: bool,
    lone_surrogates: bool,
    protocol: Option<u8>,
    binary_seen: bool,
    encoding: StringEncoding,
    max_stack: usize,
    max_memo: usize,
}

impl<'l> Vm<'l> {
    pub(crate) fn new(limits: &'l Limits, encoding: StringEncoding) -> Self {
        Vm {
            limits,
            encoding,
            opcodes: 0,
            frame_crossed: false,
            read_short_frames: false,
            frame_short: false,
            lone_surrogates: false,
            cancel: None,
        }
    }

    /// Run the pickle starting at `start` in `data`, to its STOP.
    /// Count `n` opcodes run by another reader of the same file (the
    /// plain state dict's, `torch/plain.rs`) against [`Limits::max_opcodes`],
    /// as if this machine had run them. False, counting nothing, when they
    /// would pass the limit: this machine then runs them and stops where
    /// it does.
    #[cfg(feature = "scan")]
    pub(crate) fn count_opcodes(&mut self, n: u64) -> bool {
        match self.opcodes.checked_add(n) {
            Some(total) if total <= self.limits.max_opcodes => {
                self.opcodes = total;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn run<I: Interpreter>(
        &mut self,
        heap: &mut Heap,
        interp: &mut I,
        data: &[u8],
        start: usize,
    ) -> Result<VmOutput> {
        heap.reserve_for(data.len().saturating_sub(start));
        heap.allow_work_for(data.len().saturating_sub(start));
        self.frame_crossed = false;
        self.frame_short = false;
        let mut m = Machine {
            r: ByteReader::at(data, start, ErrorKind::Pickle),
            heap,
            interp,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Memo::with_capacity(
                data.len().saturating_sub(start) / 8,
                self.limits.max_memo_entries,
            ),
            frame_end: None,
            frame_crossed: false,
            read_short_frames: self.read_short_frames,
            frame_short: false,
            lone_surrogates: self.lone_surrogates,
            protocol: None,
            binary_seen: false,
            encoding: self.encoding,
            max_stack: self.limits.max_stack_depth,
            max_memo: self.limits.max_memo_entries,
        };
        loop {
            let offset = m.r.pos();
            self.opcodes += 1;
            if self.opcodes > self.limits.max_opcodes {
                return Err(Error::limit("max_opcodes", self.limits.max_opcodes).at(offset as u64));
            }
            if self.opcodes % CANCEL_EVERY == 0 {
                if let Some(flag) = &self.cancel {
                    if flag.load(std::sync::atomic::Ordering::Relaxed) {
                        return Err(Error::new(ErrorKind::Cancelled, "the open was cancelled")
                            .at(offset as u64));
                    }
                }
            }
            self.frame_short |= m.frame_short;
            m.heap.charge_work(1).map_err(|e| e.at(offset as u64))?;
            let op = m.r.u8().map_err(|e| {
                let err = pickle_err("pickle ended without STOP").at(offset as u64);
                // The bytes ended, not the program: the file was cut.
                if e.ran_out() {
                    err.truncated()
                } else {
                    err
                }
            })?;
            let stepped = m.step(op);
            // An opcode (or its argument) that ends past the frame it began
            // in: see `Vm::frame_crossed`.
            if let Some(end) = m.frame_end {
                let pos = m.r.pos();
                if pos > end || m.frame_crossed {
                    self.frame_crossed = true;
                    return Err(frame_crossed().at(offset as u64));
                }
                if pos == end {
                    m.frame_end = None;
                }
            }
            match stepped {
                Ok(Some(value)) => {
                    let protocol = m.protocol.unwrap_or(u8::from(m.binary_seen));
                    return Ok(VmOutput {
                        value,
                        end: m.r.pos(),
                        protocol,
                        memo_overwrites: m.memo.overwrites,
                        frame_end: m.frame_end.filter(|&end| end > m.r.pos()),
                    });
                }
                Ok(None) => {}
                Err(e) => return Err(e.at(offset as u64)),
            }
        }
    }
}

impl<'a, I: Interpreter> Machine<'a, '_, I> {
    fn push(&mut self, v: Value) -> Result<()> {
        if self.stack.len() + self.marks.len() >= self.max_stack {
            return Err(Error::limit("max_stack_depth", self.max_stack as u64));
        }
        self.stack.push(v);
        Ok(())
    }

    fn push_new(&mut self, make: impl FnOnce(&mut Heap) -> Result<Value>) -> Result<()> {
        let v = make(self.heap)?;
        self.push(v)
    }

    fn alloc_push(&mut self, obj: Obj) -> Result<()> {
        let v = self.heap.alloc(obj)?;
        self.push(v)
    }

    fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<Value> {
        if self.stack.len() <= self.base() {
            return Err(pickle_err("stack underflow"));
        }
        self.stack
            .pop()
            .ok_or_else(|| pickle_err("stack underflow"))
    }

    fn top(&self) -> Result<Value> {
        if self.stack.len() <= self.base() {
            return Err(pickle_err("stack underflow"));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| pickle_err("stack underflow"))
    }

    /// Pop everything above the innermost MARK, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Value>> {
        let base = self.pop_mark_base()?;
        Ok(self.stack.split_off(base))
    }

    /// Pop the innermost MARK; the items above it stay on the stack from
    /// the returned index, for the caller to consume and truncate.
    fn pop_mark_base(&mut self) -> Result<usize> {
        let base = self.marks.pop().ok_or_else(|| pickle_err("MARK missing"))?;
        if base > self.stack.len() {
            return Err(pickle_err("MARK beyond the stack"));
        }
        Ok(base)
    }

    /// The stack from `from` on, as a tuple, removed from the stack.
    fn tuple_from(&mut self, from: usize) -> Result<Value> {
        let items = self
            .stack
            .get(from..)
            .ok_or_else(|| pickle_err("MARK lies past the top of the stack"))?;
        let t = self.heap.alloc_tuple(items)?;
        self.stack.truncate(from);
        Ok(t)
    }

    fn len_from(&self, n: u64) -> Result<usize> {
        let n = usize::try_from(n).map_err(|_| pickle_err(format!("length {n} out of range")))?;
        if n > self.r.remaining() {
            return Err(Error::end_of_data(
                ErrorKind::Pickle,
                format!("length {n} exceeds the {} bytes left", self.r.remaining()),
            ));
        }
        Ok(n)
    }

    /// The next `n` bytes, checked against what is left (the heap charges
    /// them when they become a value).
    fn read_counted(&mut self, n: u64) -> Result<&'a [u8]> {
        let n = self.len_from(n)?;
        self.r.bytes(n)
    }

    fn push_str(&mut self, bytes: &[u8]) -> Result<()> {
        match std::str::from_utf8(bytes) {
            Ok(s) => self.push_new(|h| h.alloc_str(s)),
            Err(e) => {
                let s = self
                    .lone_surrogates
                    .then(|| surrogates_replaced(bytes))
                    .flatten()
                    .ok_or_else(|| pickle_err(format!("invalid UTF-8 in string: {e}")))?;
                self.push_new(|h| h.alloc_str(&s))
            }
        }
    }

    fn push_py2_str(&mut self, bytes: Vec<u8>) -> Result<()> {
        match self.encoding {
            StringEncoding::Utf8 => {
                let s = String::from_utf8(bytes).map_err(|e| {
                    decode_err(format!(
                        "Python 2 string is not UTF-8 ({e}); open with the Latin-1 or bytes encoding"
                    ))
                })?;
                self.push_new(|h| h.alloc_str(&s))
            }
            StringEncoding::Ascii => match bytes.iter().enumerate().find(|(_, b)| !b.is_ascii()) {
                Some((at, b)) => Err(decode_err(format!(
                    "Python 2 string is not ASCII: byte {b:#04x} in position {at}"
                ))),
                // ASCII is UTF-8.
                None => {
                    let s = String::from_utf8_lossy(&bytes);
                    self.push_new(|h| h.alloc_str(&s))
                }
            },
            StringEncoding::Latin1 => {
                let s: String = bytes.iter().map(|&b| char::from(b)).collect();
                self.push_new(|h| h.alloc_str(&s))
            }
            StringEncoding::Bytes => self.push_new(|h| h.alloc_bytes(&bytes)),
        }
    }

    fn push_long(&mut self, le: &[u8]) -> Result<()> {
        match long_to_i64(le) {
            Some(i) => self.push(Value::Int(i)),
            None => self.push_new(|h| h.alloc_bigint(le)),
        }
    }

    /// INT (`c_first`: CPython reads it with C's `strtol(s, 0)` first:
    /// `0x` hex and `0` octal too) or LONG (Python's `int(s, 0)`: `0x`,
    /// `0o`, `0b`, underscores).
    fn push_text_int(&mut self, text: &[u8], c_first: bool) -> Result<()> {
        let text = text.strip_suffix(b"L").unwrap_or(text);
        let s = std::str::from_utf8(text).map_err(|_| pickle_err("invalid integer text"))?;
        if let Some(i) = c_first.then(|| c_strtol(s)).flatten() {
            return self.push(Value::Int(i));
        }
        if let Some(i) = s
            .trim()
            .parse::<i64>()
            .ok()
            .or_else(|| python_int(s.trim()))
        {
            return self.push(Value::Int(i));
        }
        let le = decimal_to_le(s.trim())?;
        self.push_long(&le)
    }

    /// PUT's and GET's index, as CPython reads it (`PyLong_FromString`
    /// in base 10: blanks around, a sign, single underscores between
    /// digits, leading zeros).
    fn memo_index_text(&mut self) -> Result<u64> {
        let line = self.r.line()?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| decimal_int(s.trim_matches(python_space)))
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| pickle_err("invalid memo index"))
    }

    fn global_line(&mut self) -> Result<(String, String)> {
        let module = self.r.line()?;
        let name = self.r.line()?;
        let module =
            std::str::from_utf8(module).map_err(|_| pickle_err("GLOBAL module is not UTF-8"))?;
        let name = std::str::from_utf8(name).map_err(|_| pickle_err("GLOBAL name is not UTF-8"))?;
        Ok((module.to_owned(), name.to_owned()))
    }

    fn global(&mut self, module: &str, name: &str, offset: u64) -> Result<Value> {
        // Python 3 reads Python 2 names through its import mapping, as
        // torch's weights-only unpickler does: `torch.save`'s protocol 2
        // writes `int` as `__builtin__.long`. The builtins Python 3 renamed
        // are read as what Python 3 would call (`reduce` is
        // `functools.reduce`, `intern` is `sys.intern`), so they are
        // judged as that; other Python 2 modules keep their names, which
        // the scanner knows (`commands`, `cPickle`).
        let py2 = self.protocol.unwrap_or(0) < 3;
        let module = if py2 { python3_module(module) } else { module };
        let (module, name) = match (py2, module, name) {
            (true, "__builtin__", "xrange") => ("builtins", "range"),
            (true, "__builtin__", "long") => ("builtins", "int"),
            (true, "__builtin__", "unicode" | "basestring") => ("builtins", "str"),
            (true, "__builtin__", "unichr") => ("builtins", "chr"),
            (true, "__builtin__", "reduce") => ("functools", "reduce"),
            (true, "__builtin__", "intern") => ("sys", "intern"),
            (true, "__builtin__", n) => ("builtins", n),
            (true, "copy_reg", n) => ("copyreg", n),
            (_, m, n) => (m, n),
        };
        self.interp.global(self.heap, module, name, offset)
    }

    fn step(&mut self, op: u8) -> Result<Option<Value>> {
        if op >= 0x80
            || matches!(
                op,
                b'J' | b'K'
                    | b'M'
                    | b'G'
                    | b'T'
                    | b'U'
                    | b'X'
                    | b'B'
                    | b'C'
                    | b'h'
                    | b'j'
                    | b'q'
                    | b'r'
                    | b'}'
                    | b']'
                    | b')'
                    | b'Q'
            )
        {
            self.binary_seen = true;
        }
        match op {
            0x80 => {
                let p = self.r.u8()?;
                if p > 5 {
                    return Err(pickle_err(format!("unsupported pickle protocol {p}")));
                }
                // Each PROTO sets the protocol in force from there on, as
                // CPython's unpickler does (Python 2's names are mapped
                // for globals read while it is below 3).
                self.protocol = Some(p);
            }
            0x95 => {
                let n = self.r.u64()?;
                let n = match self.len_from(n) {
                    Err(_) if self.read_short_frames => {
                        self.frame_short = true;
                        self.r.remaining()
                    }
                    n => n?,
                };
                if self.frame_end.is_some() {
                    // A new frame before the current one ends.
                    self.frame_crossed = true;
                    return Ok(None);
                }
                self.frame_end = self.r.pos().checked_add(n);
            }
            b'.' => return self.pop().map(Some),
            b'(' => {
                if self.stack.len() + self.marks.len() >= self.max_stack {
                    return Err(Error::limit("max_stack_depth", self.max_stack as u64));
                }
                self.marks.push(self.stack.len());
            }
            b'0' => {
                if self.stack.len() > self.base() {
                    self.stack.pop();
                } else if self.marks.is_empty() {
                    return Err(pickle_err("POP on an empty stack"));
                } else {
                    self.pop_mark()?;
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self.top()?;
                self.push(v)?;
            }
            // Integers and floats.
            b'I' => {
                let line = self.r.line()?;
                match line {
                    b"01" => self.push(Value::Bool(true))?,
                    b"00" => self.push(Value::Bool(false))?,
                    _ => self.push_text_int(line, true)?,
                }
            }
            b'J' => {
                let v = i32::from_le_bytes(self.r.array()?);
                self.push(Value::Int(v.into()))?;
            }
            b'K' => {
                let v = self.r.u8()?;
                self.push(Value::Int(v.into()))?;
            }
            b'M' => {
                let v = self.r.u16()?;
                self.push(Value::Int(v.into()))?;
            }
            b'L' => {
                let line = self.r.line()?;
                self.push_text_int(line, false)?;
            }
            0x8a => {
                let n = self.r.u8()?;
                let le = self.read_counted(n.into())?.to_vec();
                self.push_long(&le)?;
            }
            0x8b => {
                let n = i32::from_le_bytes(self.r.array()?);
                let n = u64::try_from(n).map_err(|_| pickle_err("LONG4 with negative length"))?;
                let le = self.read_counted(n)?.to_vec();
                self.push_long(&le)?;
            }
            b'F' => {
                let line = self.r.line()?;
                let v = std::str::from_utf8(line)
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok())
                    .ok_or_else(|| pickle_err("invalid FLOAT text"))?;
                self.push(Value::Float(v))?;
            }
            b'G' => {
                let v = f64::from_be_bytes(self.r.array()?);
                self.push(Value::Float(v))?;
            }
            b'N' => self.push(Value::None)?,
            0x88 => self.push(Value::Bool(true))?,
            0x89 => self.push(Value::Bool(false))?,
            // Strings and bytes.
            b'S' => {
                let line = self.r.line()?;
                let inner = match line {
                    [q, inner @ .., e] if q == e && (*q == b'\'' || *q == b'"') => inner,
                    _ => return Err(pickle_err("the STRING opcode argument must be quoted")),
                };
                let decoded = escape_decode(inner);
                self.push_py2_str(decoded)?;
            }
            b'T' => {
                let n = i32::from_le_bytes(self.r.array()?);
                let n =
                    u64::try_from(n).map_err(|_| pickle_err("BINSTRING with negative length"))?;
                let b = self.read_counted(n)?.to_vec();
                self.push_py2_str(b)?;
            }
            b'U' => {
                let n = self.r.u8()?;
                let b = self.read_counted(n.into())?.to_vec();
                self.push_py2_str(b)?;
            }
            b'V' => {
                let line = self.r.line()?;
                let s = raw_unicode_escape_decode(line, self.lone_surrogates)?;
                self.push_new(|h| h.alloc_str(&s))?;
            }
            b'X' => {
                let n = self.r.u32()?;
                let b = self.read_counted(n.into())?;
                self.push_str(b)?;
            }
            0x8c => {
                let n = self.r.u8()?;
                let b = self.read_counted(n.into())?;
                self.push_str(b)?;
            }
            0x8d => {
                let n = self.r.u64()?;
                let b = self.read_counted(n)?;
                self.push_str(b)?;
            }
            b'B' => {
                let n = self.r.u32()?;
                let b = self.read_counted(n.into())?;
                self.push_new(|h| h.alloc_bytes(b))?;
            }
            b'C' => {
                let n = self.r.u8()?;
                let b = self.read_counted(n.into())?;
                self.push_new(|h| h.alloc_bytes(b))?;
            }
            0x8e | 0x96 => {
                let n = self.r.u64()?;
                let b = self.read_counted(n)?;
                self.push_new(|h| h.alloc_bytes(b))?;
                if op == 0x96 {
                    let top = self.top()?;
                    self.heap.tag(top, Tag::ByteArray);
                }
            }
            0x97 => {
                return Err(pickle_err(
                    "out-of-band buffers (NEXT_BUFFER) are not supported",
                ))
            }
            0x98 => {
                // READONLY_BUFFER: only bytes-like objects are buffers.
                let top = self.top()?;
                if self.heap.bytes(top).is_none() {
                    return Err(pickle_err("READONLY_BUFFER on a value that is not bytes"));
                }
            }
            // Containers.
            b')' => self.push_new(|h| h.alloc_tuple(&[]))?,
            b't' => {
                let base = self.pop_mark_base()?;
                let v = self.tuple_from(base)?;
                self.push(v)?;
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if self.stack.len() < self.base() + n {
                    return Err(pickle_err("stack underflow"));
                }
                let v = self.tuple_from(self.stack.len() - n)?;
                self.push(v)?;
            }
            b']' => self.alloc_push(Obj::List(Vec::new()))?,
            b'l' => {
                let items = self.pop_mark()?;
                self.heap.check_len(items.len())?;
                self.alloc_push(Obj::List(items))?;
            }
            b'}' => self.alloc_push(Obj::Dict(Default::default()))?,
            b'd' => {
                let items = self.pop_mark()?;
                if items.len() % 2 != 0 {
                    return Err(pickle_err("DICT with an odd number of items"));
                }
                let d = self.heap.new_dict_from(&items)?;
                self.push(d)?;
            }
            0x8f => self.alloc_push(Obj::Set(Default::default()))?,
            0x91 => {
                let items = self.pop_mark()?;
                self.heap.check_len(items.len())?;
                let s = self.heap.new_set_from(&items)?;
                self.heap.tag(s, Tag::FrozenSet);
                self.push(s)?;
            }
            b'a' => {
                let v = self.pop()?;
                let list = self.top()?;
                // CPython's unpickler calls `extend` for APPEND too when
                // the object has one (`append` otherwise).
                if matches!(self.heap.get(list), Some(Obj::Object(_))) {
                    self.interp
                        .method_call(self.heap, list, &["extend", "append"], &[v])?;
                }
                self.heap
                    .append(list, &[v])
                    .map_err(|m| self.heap.container_error("APPEND", m))?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                let list = self.top()?;
                if matches!(self.heap.get(list), Some(Obj::Object(_))) {
                    self.interp
                        .method_call(self.heap, list, &["extend", "append"], &items)?;
                }
                self.heap
                    .append(list, &items)
                    .map_err(|m| self.heap.container_error("APPENDS", m))?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                let d = self.top()?;
                if matches!(self.heap.get(d), Some(Obj::Object(_))) {
                    self.interp
                        .method_call(self.heap, d, &["__setitem__"], &[k, v])?;
                }
                self.heap
                    .set_item(d, k, v)
                    .map_err(|m| self.heap.container_error("SETITEM", m))?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                if items.len() % 2 != 0 {
                    return Err(pickle_err("SETITEMS with an odd number of items"));
                }
                let d = self.top()?;
                if matches!(self.heap.get(d), Some(Obj::Object(_))) {
                    self.interp
                        .method_call(self.heap, d, &["__setitem__"], &items)?;
                }
                self.heap
                    .set_items(d, &items)
                    .map_err(|m| self.heap.container_error("SETITEMS", m))?;
            }
            0x90 => {
                let items = self.pop_mark()?;
                let s = self.top()?;
                // On an object the interpreter made, CPython calls its
                // `add` for each item (a set is updated in place).
                if matches!(self.heap.get(s), Some(Obj::Object(_))) {
                    self.interp.method_call(self.heap, s, &["add"], &items)?;
                } else {
                    self.heap
                        .add_to_set(s, &items)
                        .map_err(|m| self.heap.container_error("ADDITEMS", m))?;
                }
            }
            // Memo.
            b'p' => {
                let i = self.memo_index_text()?;
                let v = self.top()?;
                self.memo.put(i, v, self.max_memo)?;
            }
            b'q' => {
                let i = self.r.u8()?;
                let v = self.top()?;
                self.memo.put(i.into(), v, self.max_memo)?;
            }
            b'r' => {
                let i = self.r.u32()?;
                let v = self.top()?;
                self.memo.put(i.into(), v, self.max_memo)?;
            }
            0x94 => {
                let v = self.top()?;
                let i = self.memo.count as u64;
                self.memo.put(i, v, self.max_memo)?;
            }
            b'g' => {
                let i = self.memo_index_text()?;
                let v = self.memo.get(i)?;
                self.push(v)?;
            }
            b'h' => {
                let i = self.r.u8()?;
                let v = self.memo.get(i.into())?;
                self.push(v)?;
            }
            b'j' => {
                let i = self.r.u32()?;
                let v = self.memo.get(i.into())?;
                self.push(v)?;
            }
            // Names and calls: nothing is ever imported or called.
            b'c' => {
                // The opcode's own position, as pickletools shows it.
                let offset = (self.r.pos() as u64).saturating_sub(1);
                let (module, name) = self.global_line()?;
                let g = self.global(&module, &name, offset)?;
                self.push(g)?;
            }
            0x93 => {
                // The opcode's own position, as pickletools shows it.
                let offset = (self.r.pos() as u64).saturating_sub(1);
                let name = self.pop()?;
                let module = self.pop()?;
                let (Some(module), Some(name)) = (self.heap.str(module), self.heap.str(name))
                else {
                    let g = self
                        .interp
                        .dynamic_global(self.heap, module, name, offset)?;
                    self.push(g)?;
                    return Ok(None);
                };
                let (module, name) = (module.to_owned(), name.to_owned());
                // Memo references can name the same long strings again and
                // again; the copies are charged.
                self.heap.charge_bytes(module.len() + name.len())?;
                let g = self.global(&module, &name, offset)?;
                self.push(g)?;
            }
            b'R' => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.interp.call(self.heap, callable, args)?;
                self.push(v)?;
            }
            0x81 => {
                let args = self.pop()?;
                let cls = self.pop()?;
                let v = self.interp.new_object(self.heap, cls, args)?;
                self.push(v)?;
            }
            0x92 => {
                let _kwargs = self.pop()?;
                let args = self.pop()?;
                let cls = self.pop()?;
                let v = self.interp.new_object(self.heap, cls, args)?;
                self.push(v)?;
            }
            b'i' => {
                // The opcode's own position, as pickletools shows it.
                let offset = (self.r.pos() as u64).saturating_sub(1);
                let (module, name) = self.global_line()?;
                let base = self.pop_mark_base()?;
                let args = self.tuple_from(base)?;
                let cls = self.global(&module, &name, offset)?;
                let v = self.interp.instantiate(self.heap, cls, args)?;
                self.push(v)?;
            }
            b'o' => {
                let base = self.pop_mark_base()?;
                let cls = *self
                    .stack
                    .get(base)
                    .ok_or_else(|| pickle_err("OBJ without a class"))?;
                let args = self.tuple_from(base + 1)?;
                self.stack.truncate(base);
                let v = self.interp.instantiate(self.heap, cls, args)?;
                self.push(v)?;
            }
            b'b' => {
                let state = self.pop()?;
                let obj = self.top()?;
                self.interp.build(self.heap, obj, state)?;
            }
            b'P' => {
                let line = self.r.line()?;
                let s = std::str::from_utf8(line).map_err(|_| pickle_err("PERSID is not text"))?;
                let pid = self.heap.alloc_str(s)?;
                let v = self.interp.persistent_load(self.heap, pid)?;
                self.push(v)?;
            }
            b'Q' => {
                let pid = self.pop()?;
                let v = self.interp.persistent_load(self.heap, pid)?;
                self.push(v)?;
            }
            0x82..=0x84 => {
                let offset = (self.r.pos() as u64).saturating_sub(1);
                let code = match op {
                    0x82 => u32::from(self.r.u8()?),
                    0x83 => u32::from(self.r.u16()?),
                    _ => self.r.u32()?,
                };
                let v = self.interp.extension(self.heap, code, offset)?;
                self.push(v)?;
            }
            other => return Err(pickle_err(format!("unknown opcode {other:#04x}"))),
        }
        Ok(None)
    }
}

/// Sign-extend a little-endian two's complement integer, if it fits in i64.
fn long_to_i64(le: &[u8]) -> Option<i64> {
    if le.is_empty() {
        return Some(0);
    }
    let negative = le.last().is_some_and(|b| b & 0x80 != 0);
    let fill = if negative { 0xff } else { 0x00 };
    if le.len() > 8 {
        let (low, high) = le.split_at(8);
        if high.iter().any(|&b| b != fill)
            || (low.get(7).is_some_and(|b| b & 0x80 != 0) != negative)
        {
            return None;
        }
    }
    let mut buf = [fill; 8];
    for (dst, src) in buf.iter_mut().zip(le.iter()) {
        *dst = *src;
    }
    Some(i64::from_le_bytes(buf))
}

/// `s` as C's `strtol(s, &end, 0)` reads it when it reads all of it (up
/// to a NUL): leading whitespace, a sign, then `0x`/`0X` and hex digits,
/// `0` and octal digits, or decimal digits. `None` when something is left
/// over or the value leaves `i64` (CPython then reads it as Python does).
fn c_strtol(s: &str) -> Option<i64> {
    let s = s.split('\0').next().unwrap_or(s);
    let s = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, s.get(1..)?),
        Some(b'+') => (false, s.get(1..)?),
        _ => (false, s),
    };
    let (radix, digits) =
        if let Some(hex) = rest.strip_prefix("0x").or_else(|| rest.strip_prefix("0X")) {
            (16, hex)
        } else if rest.len() > 1 && rest.starts_with('0') {
            (8, rest.get(1..)?)
        } else {
            (10, rest)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(digits, radix).ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

/// `s` as Python's `int(s, 0)` reads it, within `i64`: a sign, then `0x`,
/// `0o` or `0b` and digits of that base, or decimal digits without a
/// leading zero; single underscores between digits.
fn python_int(s: &str) -> Option<i64> {
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, s.get(1..)?),
        Some(b'+') => (false, s.get(1..)?),
        _ => (false, s),
    };
    let lower = rest.to_ascii_lowercase();
    let (radix, digits) = match lower.get(..2) {
        Some("0x") => (16, lower.get(2..)?),
        Some("0o") => (8, lower.get(2..)?),
        Some("0b") => (2, lower.get(2..)?),
        _ => (10, lower.as_str()),
    };
    let digits = digits
        .strip_prefix('_')
        .filter(|_| radix != 10)
        .unwrap_or(digits);
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || (radix == 10
            && digits.len() > 1
            && digits.starts_with('0')
            && digits.bytes().any(|b| b != b'0' && b != b'_'))
    {
        return None;
    }
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    if clean.len() > 64 || !clean.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(&clean, radix).ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

/// Whitespace as CPython's `Py_ISSPACE` knows it (ASCII only).
fn python_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// `s` as CPython's `PyLong_FromString(s, NULL, 10)` reads it, within
/// `i64`: a sign, then ASCII digits (leading zeros allowed) with single
/// underscores between them.
fn decimal_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    {
        return None;
    }
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    let magnitude: i128 = clean
        .trim_start_matches('0')
        .parse()
        .ok()
        .or_else(|| clean.bytes().all(|b| b == b'0').then_some(0))?;
    i64::try_from(if s.starts_with('-') {
        -magnitude
    } else {
        magnitude
    })
    .ok()
}

/// CPython refuses to convert integer text longer than this
/// (`sys.int_max_str_digits`), so unpickling such a pickle fails there too.
const MAX_INT_DIGITS: usize = 4300;

/// A decimal integer as minimal little-endian two's complement, in
/// 64-bit limbs fed 19 digits at a time: linear in the limbs per chunk,
/// and CPython's digit limit keeps the whole conversion small.
fn decimal_to_le(s: &str) -> Result<Vec<u8>> {
    let (negative, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        let shown: String = s.chars().take(40).collect();
        return Err(pickle_err(format!("invalid integer text {shown:?}")));
    }
    if digits.len() > MAX_INT_DIGITS {
        return Err(pickle_err(format!(
            "integer text has {} digits, over Python's limit of {MAX_INT_DIGITS} \
             (sys.int_max_str_digits); Python refuses it too",
            digits.len()
        )));
    }
    let mut limbs: Vec<u64> = Vec::with_capacity(digits.len() / 19 + 1);
    for chunk in digits.as_bytes().chunks(19) {
        let mut value = 0u64;
        let mut scale = 1u64;
        for &d in chunk {
            value = value * 10 + u64::from(d - b'0');
            scale *= 10;
        }
        // limbs = limbs * scale + value
        let mut carry = u128::from(value);
        for limb in limbs.iter_mut() {
            let v = u128::from(*limb) * u128::from(scale) + carry;
            *limb = v as u64;
            carry = v >> 64;
        }
        if carry > 0 {
            limbs.push(carry as u64);
        }
    }
    let mut mag: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    while mag.len() > 1 && mag.last() == Some(&0) {
        mag.pop();
    }
    if mag.is_empty() {
        mag.push(0);
    }
    // Room for the sign bit.
    mag.push(0);
    if negative {
        negate_le(&mut mag);
    }
    // Minimal, as LONG1 writes it: no byte that only repeats the sign.
    while let [.., below, top] = mag[..] {
        let redundant = (top == 0 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0);
        if !redundant {
            break;
        }
        mag.pop();
    }
    Ok(mag)
}

/// Python's `escape_decode` (the STRING opcode's repr form).
fn escape_decode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while let Some(&b) = input.get(i) {
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(&c) = input.get(i) else {
            out.push(b'\\');
            break;
        };
        i += 1;
        match c {
            b'\n' => {}
            b'\\' | b'\'' | b'"' => out.push(c),
            b'a' => out.push(0x07),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(0x0b),
            b'x' => {
                let hex = input
                    .get(i..i + 2)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.extend_from_slice(b"\\x"),
                }
            }
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match input.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push((v & 0xff) as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    out
}

/// UTF-8 as Python's `surrogatepass` reads it (BINUNICODE): an encoded
/// surrogate (`ED A0..BF 80..BF`) is a character Rust strings cannot
/// hold, here U+FFFD; any other invalid byte is refused (`None`), as
/// Python refuses it.
fn surrogates_replaced(mut bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return Some(out);
            }
            Err(e) => {
                let (good, rest) = bytes.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).ok()?);
                match rest {
                    [0xed, 0xa0..=0xbf, 0x80..=0xbf, tail @ ..] => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        bytes = tail;
                    }
                    _ => return None,
                }
            }
        }
    }
}

/// Python's `raw_unicode_escape` decoding (the UNICODE opcode); with
/// `lone_surrogates`, a `\uD800`-style escape is U+FFFD instead of an
/// error.
fn raw_unicode_escape_decode(input: &[u8], lone_surrogates: bool) -> Result<String> {
    let mut out = String::with_capacity(input.len());
    let mut i = 0;
    while let Some(&b) = input.get(i) {
        if b != b'\\' {
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let run = input.iter().skip(i).take_while(|&&c| c == b'\\').count();
        let after = input.get(i + run).copied();
        let width = match after {
            Some(b'u') => 4,
            Some(b'U') => 8,
            _ => 0,
        };
        if run % 2 == 1 && width > 0 {
            out.extend(std::iter::repeat_n('\\', run - 1));
            let start = i + run + 1;
            let code = input
                .get(start..start + width)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(|c| match char::from_u32(c) {
                    None if lone_surrogates && (0xd800..=0xdfff).contains(&c) => {
                        Some(char::REPLACEMENT_CHARACTER)
                    }
                    other => other,
                })
                .ok_or_else(|| pickle_err("invalid \\u escape in UNICODE"))?;
            out.push(code);
            i = start + width;
        } else {
            out.extend(std::iter::repeat_n('\\', run));
            i += run;
        }
    }
    Ok(out)
}

impl std::fmt::Debug for Vm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("opcodes", &self.opcodes)
            .finish()
    }
}

/// The Python 3 module a Python 2 module name is read as (Python's
/// `_compat_pickle.IMPORT_MAPPING`, which its unpickler applies to
/// protocols 0 to 2, torch.load included), or the name itself.
fn python3_module(module: &str) -> &str {
    match module {
        "copy_reg" => "copyreg",
        "Queue" => "queue",
        "SocketServer" => "socketserver",
        "ConfigParser" => "configparser",
        "repr" => "reprlib",
        "tkFileDialog" | "FileDialog" => "tkinter.filedialog",
        "tkSimpleDialog" | "SimpleDialog" => "tkinter.simpledialog",
        "tkColorChooser" => "tkinter.colorchooser",
        "tkCommonDialog" => "tkinter.commondialog",
        "Dialog" => "tkinter.dialog",
        "Tkdnd" => "tkinter.dnd",
        "tkFont" => "tkinter.font",
        "tkMessageBox" => "tkinter.messagebox",
        "ScrolledText" => "tkinter.scrolledtext",
        "Tkconstants" => "tkinter.constants",
        "Tix" => "tkinter.tix",
        "ttk" => "tkinter.ttk",
        "Tkinter" => "tkinter",
        "markupbase" => "_markupbase",
        "_winreg" => "winreg",
        "thread" => "_thread",
        "dummy_thread" => "_dummy_thread",
        "dbhash" => "dbm.bsd",
        "dumbdbm" => "dbm.dumb",
        "dbm" => "dbm.ndbm",
        "gdbm" => "dbm.gnu",
        "anydbm" | "whichdb" => "dbm",
        "xmlrpclib" => "xmlrpc.client",
        "SimpleXMLRPCServer" | "DocXMLRPCServer" => "xmlrpc.server",
        "httplib" => "http.client",
        "htmlentitydefs" => "html.entities",
        "HTMLParser" => "html.parser",
        "Cookie" => "http.cookies",
        "cookielib" => "http.cookiejar",
        "BaseHTTPServer" | "SimpleHTTPServer" | "CGIHTTPServer" => "http.server",
        "test.test_support" => "test.support",
        "commands" => "subprocess",
        "urlparse" => "urllib.parse",
        "robotparser" => "urllib.robotparser",
        "urllib2" => "urllib.request",
        "_abcoll" => "collections.abc",
        "cPickle" => "pickle",
        "_elementtree" => "xml.etree.ElementTree",
        "UserDict" | "UserList" | "UserString" => "collections",
        "StringIO" | "cStringIO" => "io",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs() {
        assert_eq!(long_to_i64(&[]), Some(0));
        assert_eq!(long_to_i64(&[0xff]), Some(-1));
        assert_eq!(long_to_i64(&[0x00, 0x80, 0xff]), Some(-32768));
        assert_eq!(long_to_i64(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]), None);
        assert_eq!(long_to_i64(&[1, 0, 0, 0, 0, 0, 0, 0, 0]), Some(1));
        // INT as CPython reads it: strtol(s, 0) first, then int(s, 0).
        assert_eq!(c_strtol("0x3e9"), Some(1001));
        assert_eq!(c_strtol(" -0X10"), Some(-16));
        assert_eq!(c_strtol("010"), Some(8));
        assert_eq!(c_strtol("12\0junk"), Some(12));
        assert_eq!(c_strtol("12 "), None);
        assert_eq!(c_strtol("0x"), None);
        assert_eq!(python_int("0b1_01"), Some(5));
        assert_eq!(python_int("-0o17"), Some(-15));
        assert_eq!(python_int("1_000"), Some(1000));
        assert_eq!(python_int("010"), None);
        assert_eq!(python_int("1__0"), None);
        assert_eq!(decimal_to_le("255").ok(), Some(vec![0xff, 0x00]));
        assert_eq!(decimal_to_le("0").ok(), Some(vec![0x00]));
        assert_eq!(decimal_to_le("-1").ok(), Some(vec![0xff]));
        assert_eq!(decimal_to_le("-128").ok(), Some(vec![0x80]));
        assert_eq!(decimal_to_le("-129").ok(), Some(vec![0x7f, 0xff]));
        // torch's legacy magic number, as protocols 0 and 1 write it.
        assert_eq!(
            decimal_to_le("119547037146038801333356").ok(),
            Some(vec![
                0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19
            ])
        );
        assert_eq!(long_to_i64(&decimal_to_le("-300").unwrap()), Some(-300));
        assert_eq!(
            long_to_i64(&decimal_to_le("9223372036854775807").unwrap()),
            Some(i64::MAX)
        );
        assert_eq!(
            long_to_i64(&decimal_to_le("-9223372036854775808").unwrap()),
            Some(i64::MIN)
        );
        assert_eq!(
            long_to_i64(&decimal_to_le("9223372036854775808").unwrap()),
            None
        );
        // 2**128 + 1, across the 19-digit chunks.
        let mut expected = vec![1u8];
        expected.extend([0u8; 15]);
        expected.push(1);
        assert_eq!(
            decimal_to_le("340282366920938463463374607431768211457").ok(),
            Some(expected)
        );
        assert!(decimal_to_le(&"9".repeat(4300)).is_ok());
        assert!(decimal_to_le(&"9".repeat(4301)).is_err());
    }

    #[test]
    fn escapes() {
        assert_eq!(escape_decode(br"a\nb\x41\101\\\'"), b"a\nbAA\\'".to_vec());
        assert_eq!(
            raw_unicode_escape_decode(br"caf\u00e9 \\u", false)
                .ok()
                .as_deref(),
            Some("caf\u{e9} \\\\u")
        );
        // A lone surrogate: refused where strings must be Rust's, a
        // replacement character for the scanner (Python takes it).
        assert!(raw_unicode_escape_decode(br"a\ud800b", false).is_err());
        assert_eq!(
            raw_unicode_escape_decode(br"a\ud800b", true)
                .ok()
                .as_deref(),
            Some("a\u{fffd}b")
        );
    }

    #[test]
    fn surrogatepass_utf8_reads_encoded_surrogates_only() {
        assert_eq!(
            surrogates_replaced(b"a\xed\xa0\x80b\xc3\xa9").as_deref(),
            Some("a\u{fffd}b\u{e9}")
        );
        assert_eq!(surrogates_replaced(b"a\xffb"), None);
        assert_eq!(surrogates_replaced(b"a\xed\xa0"), None);
    }
}
