//! Differential decoding: our pickle VM against serde-pickle, an
//! independent implementation, on plain-data pickles.

use ptload_reader::checkpoint::StringEncoding;
use ptload_reader::fuzzing::{run_pickle, Plain};
use ptload_reader::ErrorKind;
use serde_pickle::{DeOptions, HashableValue, Value};

use crate::limits;

/// Reuses (DUP, memo GET) beyond which serde-pickle's copies could exceed
/// the fuzzer's memory limit (each can double what it holds).
const MAX_SERDE_REUSES: usize = 16;

/// DUP and memo GET opcodes in the first pickle of `data`, found by
/// walking the opcodes by their argument sizes alone (whatever either VM
/// would make of them), up to STOP, an unknown opcode or the end; and
/// whether a container-filling opcode (APPEND(S), SETITEM(S), ADDITEMS,
/// BUILD) comes after a reuse, where sharing decides the value; or a
/// global outside the plain-data constructors is named (GLOBAL, INST,
/// STACK_GLOBAL), which Python would import.
fn reuse_opcodes(data: &[u8]) -> (usize, bool) {
    let mut i = 0usize;
    let mut reuses = 0usize;
    let mut filled_after = false;
    let le = |at: usize, n: usize| -> Option<usize> {
        let b = data.get(at..at.checked_add(n)?)?;
        let mut v = 0u64;
        for (k, &x) in b.iter().enumerate() {
            v |= u64::from(x) << (8 * k);
        }
        usize::try_from(v).ok()
    };
    let line_end = |at: usize| data.get(at..)?.iter().position(|&b| b == b'\n');
    while let Some(&op) = data.get(i) {
        i += 1;
        if reuses > 0 && matches!(op, b'a' | b'e' | b's' | b'u' | 0x90 | b'b') {
            filled_after = true;
        }
        if op == 0x93 || (matches!(op, b'c' | b'i') && !plain_global_at(data, i)) {
            filled_after = true;
        }
        let skip = match op {
            b'.' => return (reuses, filled_after),
            b'2' | b'g' | b'h' | b'j' => {
                reuses += 1;
                match op {
                    b'2' => Some(0),
                    b'g' => line_end(i).map(|n| n + 1),
                    b'h' => Some(1),
                    _ => Some(4),
                }
            }
            // INT text with a base prefix or a leading zero (`0x3e9`,
            // `0645`): CPython's C unpickler reads it with strtol's base 0
            // (octal, hex), as we do; serde-pickle reads decimal. Outside
            // the comparison.
            b'I' if int_base_prefixed(data, i) => {
                filled_after = true;
                line_end(i).map(|n| n + 1)
            }
            // A newline-terminated argument; GLOBAL and INST take two.
            b'I' | b'L' | b'F' | b'S' | b'V' | b'p' | b'P' => line_end(i).map(|n| n + 1),
            b'c' | b'i' => line_end(i).and_then(|a| line_end(i + a + 1).map(|b| a + b + 2)),
            b'K' | b'q' | 0x80 | 0x82 => Some(1),
            b'M' | 0x83 => Some(2),
            b'J' | b'r' | 0x84 => Some(4),
            b'G' | 0x95 => Some(8),
            // Length-prefixed data.
            b'U' | b'C' | 0x8c | 0x8a => le(i, 1).map(|n| 1 + n),
            b'T' | b'X' | b'B' | 0x8b => le(i, 4).map(|n| 4 + n),
            0x8d | 0x8e | 0x96 => le(i, 8).and_then(|n| n.checked_add(8)),
            // Opcodes without an argument.
            b'(' | b')' | b']' | b'}' | b'0' | b'1' | b'N' | b'R' | b'a' | b'b' | b'd' | b'e'
            | b'l' | b'o' | b's' | b't' | b'u' | b'Q' | 0x81 | 0x85 | 0x86 | 0x87 | 0x88 | 0x89
            | 0x8f | 0x90 | 0x91 | 0x92 | 0x93 | 0x94 | 0x97 | 0x98 => Some(0),
            _ => return (reuses, filled_after),
        };
        match skip.and_then(|n| i.checked_add(n)) {
            Some(next) => i = next,
            None => return (reuses, filled_after),
        }
    }
    (reuses, filled_after)
}

/// Whether the INT text at `at` (up to its newline) has a base prefix or
/// a leading zero after its whitespace and sign, other than the booleans
/// `00` and `01`.
fn int_base_prefixed(data: &[u8], at: usize) -> bool {
    let line = data.get(at..).unwrap_or_default();
    let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
    if line == b"00" || line == b"01" {
        return false;
    }
    let digits = line
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | 0x0b | 0x0c | b'+' | b'-'))
        .map_or(&[][..], |p| line.get(p..).unwrap_or_default());
    digits.first() == Some(&b'0') && digits.len() > 1
}

/// Whether the two newline-ended lines at `at` (GLOBAL's and INST's
/// arguments) name a plain-data constructor.
fn plain_global_at(data: &[u8], at: usize) -> bool {
    let mut lines = data
        .get(at..)
        .unwrap_or_default()
        .splitn(3, |&b| b == b'\n');
    match (lines.next(), lines.next()) {
        (Some(module), Some(name)) => {
            let path = format!(
                "{}.{}",
                String::from_utf8_lossy(module),
                String::from_utf8_lossy(name)
            );
            PLAIN_GLOBALS.contains(&path.as_str())
        }
        _ => false,
    }
}

/// Decode `data` with both VMs. `Ok` when they agree: both give the same
/// value, both refuse, or the input is outside what the comparison covers
/// (objects and globals, which serde-pickle cannot represent; inputs that
/// hit our limits, which serde-pickle does not have; values too large to
/// expand as a tree). `Err` says how they differ.
pub fn serde_pickle_agrees(data: &[u8]) -> Result<(), String> {
    // Like Python's pickle.loads, we stop at STOP; serde-pickle refuses
    // trailing bytes, so it is given only what we read.
    let mut end = data.len();
    // serde-pickle copies a value on DUP and memo GET where Python shares
    // it: nested reuse makes its memory grow exponentially, whatever our
    // own answer is; and a container filled after it was reused is seen
    // filled through every reference in Python (and by us), but only
    // through the last copy by serde-pickle.
    // A foreign global is no plain data either: Python would import it.
    let (reuses, outside) = reuse_opcodes(data);
    if reuses > MAX_SERDE_REUSES || outside {
        return Ok(());
    }
    let ours = match run_pickle(data, &limits(), StringEncoding::Bytes) {
        // serde-pickle gets a PUT that redefines a memo key wrong (it keeps
        // acting on the old value); Python and we replace the entry.
        Ok(run) if run.memo_overwrites > 0 => return Ok(()),
        // A global other than the plain-data constructors: Python would
        // import it (and fail, or run it); we keep it inert. Not plain data.
        Ok(run)
            if run
                .globals
                .iter()
                .any(|g| !PLAIN_GLOBALS.contains(&g.as_str())) =>
        {
            return Ok(())
        }
        Ok(run) => match run.plain {
            Some(v) => {
                end = run.end;
                Ok(v)
            }
            None => return Ok(()),
        },
        Err(e) if e.kind() == ErrorKind::LimitExceeded => return Ok(()),
        Err(e) => Err(e),
    };
    // serde-pickle can panic on its own (a set holding a NaN breaks its
    // BTreeSet ordering): then there is no answer to compare with.
    let input = data.get(..end).unwrap_or(data);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let theirs =
        std::panic::catch_unwind(|| serde_pickle::value_from_slice(input, DeOptions::new()));
    std::panic::set_hook(hook);
    let Ok(theirs) = theirs else {
        return Ok(());
    };
    match (ours, theirs) {
        (Ok(a), Ok(b)) => {
            let b = from_serde(&b);
            let (ca, cb) = (canonical(&a), canonical(&b));
            // serde-pickle drops a CR before the LF that ends a protocol 0
            // text argument; Python keeps it.
            // serde-pickle keeps True and 1 (and 1.0) as distinct keys;
            // Python and we merge them.
            // Tuple and frozenset keys over 64 members compare by identity
            // in our VM by design (bounded work per lookup): equal ones stay
            // separate where Python merges them.
            if ca == cb
                || data.windows(2).any(|w| w == b"\r\n")
                || merges_keys(&b)
                || large_compound_key(&b)
            {
                Ok(())
            } else {
                Err(format!("values differ:\n ours:  {ca}\n serde: {cb}"))
            }
        }
        (Err(_), Err(_)) => Ok(()),
        // serde-pickle resolves fewer globals than Python (`bytes()` for b""
        // at protocols 0-2, for one): outside the comparison.
        (Ok(_), Err(serde_pickle::Error::Syntax(serde_pickle::ErrorCode::UnresolvedGlobal))) => {
            Ok(())
        }
        // Protocol 0 text literals: serde-pickle parses a narrower grammar
        // than Python (raw-unicode-escape with non-ASCII bytes, for one).
        (
            Ok(_),
            Err(
                serde_pickle::Error::Eval(serde_pickle::ErrorCode::InvalidLiteral(_), _)
                | serde_pickle::Error::Syntax(serde_pickle::ErrorCode::InvalidLiteral(_)),
            ),
        ) => Ok(()),
        // _codecs.encode(text) with the encoding left out: UTF-8 in Python;
        // serde-pickle requires both arguments.
        (Ok(_), Err(serde_pickle::Error::Eval(serde_pickle::ErrorCode::InvalidValue(m), _)))
            if m.starts_with("encode()") =>
        {
            Ok(())
        }
        // Opcodes serde-pickle does not implement (READONLY_BUFFER...).
        (
            Ok(_),
            Err(
                serde_pickle::Error::Eval(serde_pickle::ErrorCode::Unsupported(_), _)
                | serde_pickle::Error::Syntax(serde_pickle::ErrorCode::Unsupported(_)),
            ),
        ) => Ok(()),
        // A list shared under several tuples: serde-pickle reports
        // "recursive structure" where there is no cycle.
        (Ok(_), Err(e)) if e.to_string().contains("recursive structure") => Ok(()),
        // SETITEMS / APPENDS with nothing to add: Python never looks at
        // the target; serde-pickle requires a dict or list.
        (Ok(_), Err(e)) if e.to_string().contains("invalid stack top, expected") => Ok(()),
        // bytearray() of something it cannot take (a nested tuple): a
        // TypeError in Python; we keep such a call inert by design (see the
        // reader's plain constructors), so the values differ from there on.
        (Ok(_), Err(e)) if e.to_string().contains("bytearray() arg") => Ok(()),
        // set() with no argument: an empty set in Python and here;
        // serde-pickle requires one. With an argument Python refuses, the
        // call stays inert here, as for bytearray().
        (Ok(_), Err(e)) if e.to_string().contains("set() arg") => Ok(()),
        // We keep set and frozenset as one kind, so a set inside a set is
        // accepted; Python and serde-pickle refuse a (mutable) set there.
        (Ok(_), Err(e)) if e.to_string().contains("not hashable") => Ok(()),
        (Ok(a), Err(e)) => Err(format!(
            "we decoded {} where serde-pickle refused: {e}",
            canonical(&a)
        )),
        (Err(e), Ok(_)) if stricter_than_serde(data, &e) => Ok(()),
        (Err(e), Ok(b)) => Err(format!(
            "we refused ({e}) what serde-pickle decoded: {}",
            canonical(&from_serde(&b))
        )),
    }
}

/// The globals that build plain values, resolved the same way by Python,
/// serde-pickle and us.
const PLAIN_GLOBALS: &[&str] = &[
    "_codecs.encode",
    "builtins.bytearray",
    "__builtin__.bytearray",
    "builtins.bytes",
    "__builtin__.bytes",
    "builtins.set",
    "__builtin__.set",
    "builtins.frozenset",
    "__builtin__.frozenset",
    "collections.OrderedDict",
];

/// Checks Python's unpickler makes and serde-pickle does not, where our
/// refusal is the right answer.
fn stricter_than_serde(data: &[u8], e: &ptload_reader::Error) -> bool {
    let opcode = e
        .offset()
        .and_then(|o| usize::try_from(o).ok())
        .and_then(|o| data.get(o));
    // FRAME (0x95) promising more bytes than are left: "pickle data was
    // truncated" in Python; serde-pickle ignores frame lengths.
    // _codecs.encode(text, name) with an encoding Python does not know is
    // a LookupError; serde-pickle returns the text's bytes whatever the name.
    // DICT / SETITEMS with a key left over: "odd number of items" in
    // Python; serde-pickle drops the key. PROTO above 5, a missing MARK and
    // stack underflow are errors in Python that serde-pickle lets pass.
    opcode == Some(&0x95)
        || [
            "_codecs.encode",
            "with an odd number of items",
            "unsupported pickle protocol",
            "MARK missing",
            "stack underflow",
            // GLOBAL names that are not UTF-8: UnicodeDecodeError in Python,
            // even when the global is never used; serde-pickle skips them.
            "is not UTF-8",
            // STRING without quotes: Python refuses, serde-pickle reads it.
            "must be quoted",
            // A read across a FRAME's end: Python's pure unpickler refuses
            // it, and its C unpickler reading a file runs other bytes; we
            // refuse by design (pickle.loads of bytes would accept it).
            "past the end of its FRAME",
            // A dict or list as a dict key: TypeError in Python.
            "unhashable",
            // REDUCE / NEWOBJ on a plain value: TypeError in Python.
            "not callable",
            "not a class",
            // BUILD on a value with no instance dict, or with a state that
            // is not one: AttributeError / "state is not a dictionary".
            "BUILD on a",
            // OBJ with an empty MARK: "unexpected MARK found" in Python.
            "without a class",
            // Protocol 0 INT / LONG text in Python's other integer forms
            // (0x.., 1_000, C octal): Python reads them, we and
            // serde-pickle read decimal only. torch never writes protocol 0.
            "invalid integer",
        ]
        .iter()
        .any(|m| e.message().contains(m))
}

fn from_serde(v: &Value) -> Plain {
    match v {
        Value::None => Plain::None,
        Value::Bool(b) => Plain::Bool(*b),
        Value::I64(i) => Plain::Int(*i),
        Value::Int(i) => Plain::BigInt(i.to_signed_bytes_le()),
        Value::F64(f) => Plain::Float(*f),
        Value::Bytes(b) => Plain::Bytes(b.clone()),
        Value::String(s) => Plain::Str(s.clone()),
        Value::List(l) => Plain::List(l.iter().map(from_serde).collect()),
        Value::Tuple(t) => Plain::Tuple(t.iter().map(from_serde).collect()),
        Value::Set(s) | Value::FrozenSet(s) => Plain::Set(s.iter().map(from_hashable).collect()),
        Value::Dict(d) => Plain::Dict(
            d.iter()
                .map(|(k, v)| (from_hashable(k), from_serde(v)))
                .collect(),
        ),
    }
}

fn from_hashable(v: &HashableValue) -> Plain {
    match v {
        HashableValue::None => Plain::None,
        HashableValue::Bool(b) => Plain::Bool(*b),
        HashableValue::I64(i) => Plain::Int(*i),
        HashableValue::Int(i) => Plain::BigInt(i.to_signed_bytes_le()),
        HashableValue::F64(f) => Plain::Float(*f),
        HashableValue::Bytes(b) => Plain::Bytes(b.clone()),
        HashableValue::String(s) => Plain::Str(s.clone()),
        HashableValue::Tuple(t) => Plain::Tuple(t.iter().map(from_hashable).collect()),
        HashableValue::FrozenSet(s) => Plain::Set(s.iter().map(from_hashable).collect()),
    }
}

/// A text form in which equal Python values print the same: dict items
/// and set members sorted, floats by their bits, ints by value whatever
/// their width.
pub fn canonical(v: &Plain) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Plain, out: &mut String) {
    use std::fmt::Write;
    match v {
        Plain::None => out.push_str("None"),
        Plain::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Plain::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Plain::BigInt(le) => match small(le) {
            Some(i) => {
                let _ = write!(out, "{i}");
            }
            None => {
                // Minimal form: drop sign-extension bytes the encoder kept.
                let mut le = le.as_slice();
                while let [rest @ .., a, b] = le {
                    if (*b == 0 && a & 0x80 == 0) || (*b == 0xff && a & 0x80 != 0) {
                        le = le.get(..rest.len() + 1).unwrap_or(le);
                    } else {
                        break;
                    }
                }
                let _ = write!(out, "long{le:02x?}");
            }
        },
        Plain::Float(f) => {
            let _ = write!(out, "float({:#x})", f.to_bits());
        }
        Plain::Str(s) => {
            let _ = write!(out, "{s:?}");
        }
        Plain::Bytes(b) => {
            let _ = write!(out, "b{b:02x?}");
        }
        Plain::List(items) | Plain::Tuple(items) => {
            let (open, close) = if matches!(v, Plain::List(_)) {
                ('[', ']')
            } else {
                ('(', ')')
            };
            out.push(open);
            for i in items {
                write_canonical(i, out);
                out.push(',');
            }
            out.push(close);
        }
        Plain::Set(items) => {
            let mut members: Vec<String> = items.iter().map(canonical_key).collect();
            members.sort();
            let _ = write!(out, "{{{}}}", members.join(","));
        }
        Plain::Dict(entries) => {
            let mut items: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}:{}", canonical_key(k), canonical(v)))
                .collect();
            items.sort();
            let _ = write!(out, "{{{}}}", items.join(","));
        }
    }
}

/// Whether some dict or set in `v` holds keys Python would merge
/// (`True`, `1`, `1.0`).
fn merges_keys(v: &Plain) -> bool {
    let collide = |keys: Vec<String>| {
        let n = keys.len();
        let mut keys = keys;
        keys.sort();
        keys.dedup();
        keys.len() != n
    };
    match v {
        Plain::Dict(entries) => {
            collide(entries.iter().map(|(k, _)| canonical_key(k)).collect())
                || entries
                    .iter()
                    .any(|(k, v)| merges_keys(k) || merges_keys(v))
        }
        Plain::Set(items) => {
            collide(items.iter().map(canonical_key).collect()) || items.iter().any(merges_keys)
        }
        Plain::List(items) | Plain::Tuple(items) => items.iter().any(merges_keys),
        _ => false,
    }
}

/// Whether a dict key or set member is a tuple or frozenset of more than
/// 64 members, counting nested ones (the reader's `MAX_TUPLE_KEY_ITEMS`).
fn large_compound_key(v: &Plain) -> bool {
    fn members(v: &Plain) -> usize {
        match v {
            Plain::Tuple(items) | Plain::Set(items) => 1 + items.iter().map(members).sum::<usize>(),
            _ => 1,
        }
    }
    let large = |k: &Plain| matches!(k, Plain::Tuple(_) | Plain::Set(_)) && members(k) > 64;
    match v {
        Plain::Dict(entries) => entries
            .iter()
            .any(|(k, v)| large(k) || large_compound_key(k) || large_compound_key(v)),
        Plain::Set(items) => items.iter().any(|k| large(k) || large_compound_key(k)),
        Plain::List(items) | Plain::Tuple(items) => items.iter().any(large_compound_key),
        _ => false,
    }
}

/// A dict key or set member: Python treats `True`, `1` and `1.0` as the
/// same key, and keeps whichever came first, so they print alike here.
fn canonical_key(v: &Plain) -> String {
    match v {
        Plain::Bool(b) => i64::from(*b).to_string(),
        Plain::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => (*f as i64).to_string(),
        other => canonical(other),
    }
}

/// A little-endian two's complement integer that fits in i64.
fn small(le: &[u8]) -> Option<i64> {
    let negative = le.last().is_some_and(|b| b & 0x80 != 0);
    let fill = if negative { 0xff } else { 0 };
    if le.len() > 8 {
        let high_ok = le.get(8..)?.iter().all(|&b| b == fill);
        let sign_ok = le.get(7).is_some_and(|b| (b & 0x80 != 0) == negative);
        if !(high_ok && sign_ok) {
            return None;
        }
    }
    let mut buf = [fill; 8];
    for (d, s) in buf.iter_mut().zip(le) {
        *d = *s;
    }
    Some(i64::from_le_bytes(buf))
}
