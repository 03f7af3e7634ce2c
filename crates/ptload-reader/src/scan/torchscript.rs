//! TorchScript code as a scan reads it. torch.load hands a TorchScript
//! archive to torch.jit.load, which compiles the archive's `code/` records
//! and runs some of that code on load: each scripted `__setstate__`, and
//! what it calls. Its ops are TorchScript's, not Python's; what reaches
//! outside the process is found here, in the text as TorchScript's lexer
//! reads it (comments and line continuations as space, string literals
//! kept apart): the ops that reach the file system (`from_file`, `save`),
//! ops of namespaces other than the computing ones (a C++ extension's, a
//! kernel written in Python), and, in the code a load runs, output
//! (`print`, `warn`). Every walk here is a loop over the text, each
//! identifier and each name read a bounded number of times.

use std::ops::Range;

use hashbrown::{HashMap, HashSet};

use super::{classify, Danger, GlobalClass};
use crate::bytes::occurrences;

/// A call a code record makes that reaches outside TorchScript's own ops:
/// reported as a call of `module.name`, at `offset` in the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Call {
    pub module: &'static str,
    pub name: String,
    pub offset: usize,
    pub class: GlobalClass,
}

/// What each of a TorchScript archive's code `records` calls: the ops
/// that reach the file system, the ops of a library's namespace (at its
/// effect where it is known), and output in the code a load runs (a call
/// of library code no checkpoint's load makes; the same words in code the
/// load does not run, `forward`, are what the model does when used).
pub(super) fn calls(records: &[&[u8]]) -> Vec<Vec<Call>> {
    let texts: Vec<(Vec<u8>, Vec<usize>)> = records
        .iter()
        .map(|code| {
            let (text, at, _) = text_of(code);
            (text, at)
        })
        .collect();
    let on_load = run_on_load(&texts);
    let mut out = Vec::with_capacity(records.len());
    for ((code, (text, at)), run) in records.iter().zip(&texts).zip(&on_load) {
        // The ops as TorchScript's code calls them: `torch.from_file(`,
        // `torch.save(` (or aten's), with any whitespace between the
        // tokens, as TorchScript's parser allows.
        let mut found: Vec<Call> = ["from_file", "save"]
            .iter()
            .filter_map(|&op| {
                call_of(code, op).map(|offset| Call {
                    module: "torch",
                    name: op.into(),
                    offset,
                    class: classify("torch", op),
                })
            })
            .collect();
        // Ops of a library's namespace: its code runs (a kernel in
        // Python, a C++ extension), at its effect where it is known.
        found.extend(op_namespaces(code).into_iter().map(|(ns, offset)| Call {
            class: match ops_namespace_danger(&ns) {
                Some(d) => GlobalClass::Dangerous(d),
                None => GlobalClass::Unknown,
            },
            module: "torch.ops",
            name: ns,
            offset,
        }));
        // Output of the code a load runs: `print`, `prim::Print`,
        // `aten::_print`; `torch.warn`, `aten::warn` and aten's test op
        // that warns, which Python's `warnings` shows.
        let output = [
            ("builtins", "print", "print"),
            ("builtins", "print", "Print"),
            ("builtins", "print", "_print"),
            ("torch", "warn", "warn"),
            ("torch", "warn", "_test_warn_in_autograd"),
        ];
        for (module, name, word) in output {
            let seen = found.iter().any(|c| c.module == module && c.name == name);
            if let Some(i) = word_in(text, run, word).filter(|_| !seen) {
                found.push(Call {
                    module,
                    name: name.into(),
                    offset: at.get(i).copied().unwrap_or(0),
                    class: GlobalClass::Unknown,
                });
            }
        }
        out.push(found);
    }
    out
}

/// Where TorchScript `code` names `op` on `torch` or `aten` (`torch.save(`,
/// `torch . save (`, `(torch.save)(`, `aten::save(`, `ops.aten.save(`):
/// the identifier `op`, whole, after a `.` or `::` and a qualifier ending
/// in `torch` or `aten`, not followed by an attribute of it, with any
/// whitespace between the tokens.
fn call_of(code: &[u8], op: &str) -> Option<usize> {
    let (text, at, literals) = text_of(code);
    let aliases = module_aliases(&text);
    let found =
        call_in(&text, op, &aliases).or_else(|| getattr_of(&text, &literals, op, &aliases))?;
    at.get(found).copied()
}

/// TorchScript code's text with comments and line continuations made
/// space and string literals blanked between their quotes, each byte's
/// index in the code, and the literals (where each starts in the text,
/// and what it holds).
#[allow(clippy::type_complexity)]
fn text_of(code: &[u8]) -> (Vec<u8>, Vec<usize>, Vec<(usize, Vec<u8>)>) {
    // The code as the TorchScript lexer sees its tokens: comments (`#` to
    // the end of the line) and line continuations (`\` then a newline)
    // are space, so neither hides a call; a string literal (quoted once
    // or three times, `\` escaping the next byte) is kept whole, so a `#`
    // inside one starts no comment; `at` maps back to the code.
    let mut text = Vec::with_capacity(code.len());
    let mut at = Vec::with_capacity(code.len());
    // Each string literal: where it starts in `text`, and what it holds.
    let mut literals: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut i = 0;
    while let Some(&b) = code.get(i) {
        if b == b'"' || b == b'\'' {
            let triple = code.get(i..i + 3) == Some(&[b, b, b][..]);
            let quote = if triple { 3 } else { 1 };
            let start = i;
            i += quote;
            loop {
                match code.get(i) {
                    None => break,
                    Some(b'\\') => i += 2,
                    Some(&c)
                        if c == b && (!triple || code.get(i..i + 3) == Some(&[b, b, b][..])) =>
                    {
                        i += quote;
                        break;
                    }
                    // A single-quoted literal ends with its line.
                    Some(b'\n') if !triple => break,
                    Some(_) => i += 1,
                }
            }
            // The quotes stay, what is between them is space: a call
            // written inside a string is no call (its text is kept for
            // `getattr(torch, "save")`).
            let end = i.min(code.len());
            let inner = code
                .get(start + quote..end.saturating_sub(quote).max(start + quote))
                .unwrap_or_default();
            literals.push((text.len(), inner.to_vec()));
            for (k, &c) in code.get(start..end).unwrap_or_default().iter().enumerate() {
                let quoted = k < quote || k + quote >= end - start;
                text.push(if quoted { c } else { b' ' });
            }
            at.extend(start..end);
            continue;
        }
        if b == b'#' {
            while code.get(i).is_some_and(|&c| c != b'\n') {
                i += 1;
            }
            continue;
        }
        if b == b'\\' && matches!(code.get(i + 1), Some(b'\n' | b'\r')) {
            text.push(b' ');
            at.push(i);
            i += 2;
            continue;
        }
        text.push(b);
        at.push(i);
        i += 1;
    }
    (text, at, literals)
}

/// The `def`s of TorchScript `text` (as [`text_of`] gives it):
/// each one's name and the span from its line to the end of its block,
/// the next logical line indented no deeper. A tab counts as a run to
/// the next multiple of eight columns: read deeper than the lexer may,
/// a block only grows.
fn defs(text: &[u8]) -> Vec<(&[u8], Range<usize>)> {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut defs: Vec<(&[u8], Range<usize>)> = Vec::new();
    // The defs whose blocks are open: index into `defs`, and indent.
    let mut open: Vec<(usize, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    let mut line_start = true;
    while i < text.len() {
        if line_start {
            line_start = false;
            let start = i;
            let mut indent = 0usize;
            while let Some(&b) = text.get(i) {
                match b {
                    b' ' => indent += 1,
                    b'\t' => indent = (indent / 8 + 1) * 8,
                    b'\x0c' | b'\r' => {}
                    _ => break,
                }
                i += 1;
            }
            if text.get(i).is_none_or(|&b| b == b'\n') {
                // A blank line closes nothing.
                continue;
            }
            while open.last().is_some_and(|&(_, d)| indent <= d) {
                if let Some((k, _)) = open.pop() {
                    if let Some(def) = defs.get_mut(k) {
                        def.1.end = start;
                    }
                }
            }
            if text.get(i..i + 3) == Some(&b"def"[..]) {
                let mut k = i + 3;
                let gap = k;
                while text
                    .get(k)
                    .is_some_and(|&b| matches!(b, b' ' | b'\t' | b'\x0c'))
                {
                    k += 1;
                }
                let name_start = k;
                while text.get(k).is_some_and(|&b| ident(b)) {
                    k += 1;
                }
                if k > gap && name_start > gap && k > name_start {
                    if let Some(name) = text.get(name_start..k) {
                        open.push((defs.len(), indent));
                        defs.push((name, start..text.len()));
                    }
                }
            }
            continue;
        }
        match text.get(i).copied().unwrap_or(b' ') {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b'\n' if depth == 0 => line_start = true,
            _ => {}
        }
        i += 1;
    }
    defs
}

/// For each of a TorchScript archive's code `texts`, the spans a load
/// runs, in order and apart: every `__setstate__` (torch.jit.load calls
/// it on each object whose class defines it), and every `def` whose name
/// the code it runs names, in any record. Each identifier is read once,
/// as its innermost `def`'s, and each name is looked up once.
fn run_on_load(texts: &[(Vec<u8>, Vec<usize>)]) -> Vec<Vec<Range<usize>>> {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let defs: Vec<Vec<(&[u8], Range<usize>)>> = texts.iter().map(|(text, _)| defs(text)).collect();
    // The identifiers each def's own lines hold (not those of a def within it).
    let mut own: Vec<Vec<Vec<&[u8]>>> = Vec::with_capacity(texts.len());
    for ((text, _), list) in texts.iter().zip(&defs) {
        let mut words: Vec<Vec<&[u8]>> = vec![Vec::new(); list.len()];
        let mut open: Vec<usize> = Vec::new();
        let mut next = 0;
        let mut k = 0;
        while k < text.len() {
            if !text.get(k).copied().is_some_and(ident) {
                k += 1;
                continue;
            }
            let start = k;
            while text.get(k).copied().is_some_and(ident) {
                k += 1;
            }
            while open
                .last()
                .is_some_and(|&d| list.get(d).is_none_or(|(_, span)| span.end <= start))
            {
                open.pop();
            }
            while let Some((_, span)) = list.get(next).filter(|(_, span)| span.start <= start) {
                if start < span.end {
                    open.push(next);
                }
                next += 1;
            }
            if let (Some(&d), Some(word)) = (open.last(), text.get(start..k)) {
                if let Some(w) = words.get_mut(d) {
                    w.push(word);
                }
            }
        }
        own.push(words);
    }
    let mut by_name: HashMap<&[u8], Vec<(usize, usize)>> = HashMap::new();
    for (r, list) in defs.iter().enumerate() {
        for (d, (name, _)) in list.iter().enumerate() {
            by_name.entry(name).or_default().push((r, d));
        }
    }
    let mut out: Vec<Vec<Range<usize>>> = vec![Vec::new(); texts.len()];
    let mut looked_up: HashSet<&[u8]> = HashSet::new();
    let mut names: Vec<&[u8]> = vec![b"__setstate__"];
    while let Some(name) = names.pop() {
        if !looked_up.insert(name) {
            continue;
        }
        for &(r, d) in by_name.get(name).map(Vec::as_slice).unwrap_or_default() {
            if let (Some(spans), Some((_, span))) =
                (out.get_mut(r), defs.get(r).and_then(|l| l.get(d)))
            {
                spans.push(span.clone());
            }
            let words = own.get(r).and_then(|w| w.get(d)).map(Vec::as_slice);
            names.extend(
                words
                    .unwrap_or_default()
                    .iter()
                    .filter(|&&w| by_name.contains_key(w) && !looked_up.contains(w)),
            );
        }
    }
    // A def within another that runs is within its span, and spans that
    // meet are one.
    for spans in &mut out {
        spans.sort_by_key(|s| s.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
        for span in spans.drain(..) {
            match merged.last_mut() {
                Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
                _ => merged.push(span),
            }
        }
        *spans = merged;
    }
    out
}

/// Where `word` first stands whole (not part of a longer identifier) in
/// one of `spans` of TorchScript `text`.
fn word_in(text: &[u8], spans: &[Range<usize>], word: &str) -> Option<usize> {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    spans
        .iter()
        .filter_map(|span| {
            let part = text.get(span.clone())?;
            occurrences(part, word.as_bytes())
                .find(|&at| {
                    let end = at + word.len();
                    !at.checked_sub(1)
                        .and_then(|j| part.get(j))
                        .copied()
                        .is_some_and(ident)
                        && !part.get(end).copied().is_some_and(ident)
                })
                .map(|at| span.start + at)
        })
        .min()
}

/// Namespaces of torch's ops whose ops compute on tensors: aten's,
/// TorchScript's own, quantization's, and the domain libraries' kernels.
/// Ops of any other namespace a scripted module calls are a library's
/// (a C++ extension's, or a kernel written in Python).
const COMPUTING_OPS: &[&str] = &[
    "aten",
    "prim",
    "quantized",
    "_quantized",
    "quantized_decomposed",
    "prepacked",
    "mkldnn",
    "mkldnn_prepacked",
    "torchvision",
    "torchaudio",
    "torchtext",
];

/// What calling an op of namespace `ns` does, for the namespaces whose
/// ops reach outside the process: `debugprims` (`load_tensor` reads a
/// tensor from the files of a content store, in Python), `c10d` and
/// `_c10d_functional` (collectives over a process group's network),
/// `profiler` (traces written to files).
fn ops_namespace_danger(ns: &str) -> Option<Danger> {
    match ns {
        "debugprims" => Some(Danger::FileSystem),
        "c10d" | "_c10d_functional" | "c10d_functional" => Some(Danger::Network),
        "profiler" => Some(Danger::FileSystem),
        _ => None,
    }
}

/// The namespaces of torch's ops that `code` reaches other than the
/// computing ones (`ops.debugprims.load_tensor(...)`, `a = ops.my_ext`,
/// `getattr(ops, "debugprims")` for the namespaces known to reach
/// outside), each once with the index of its first use in the code; at
/// most 64.
fn op_namespaces(code: &[u8]) -> Vec<(String, usize)> {
    let (text, at, literals) = text_of(code);
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\x0b' | b'\x0c' | b'\r' | b'\n');
    let mut out: Vec<(String, usize)> = Vec::new();
    let add = |ns: &str, i: usize, out: &mut Vec<(String, usize)>| {
        if out.len() < 64 && !COMPUTING_OPS.contains(&ns) && !out.iter().any(|(n, _)| n == ns) {
            out.push((ns.to_owned(), at.get(i).copied().unwrap_or(0)));
        }
    };
    let word = b"ops";
    for start in occurrences(&text, word) {
        let end = start + word.len();
        let before = start.checked_sub(1).and_then(|j| text.get(j)).copied();
        if before.is_some_and(ident) || text.get(end).copied().is_some_and(ident) {
            continue;
        }
        let mut k = end;
        while text.get(k).is_some_and(|&b| space(b)) {
            k += 1;
        }
        if text.get(k) != Some(&b'.') {
            continue;
        }
        k += 1;
        while text.get(k).is_some_and(|&b| space(b)) {
            k += 1;
        }
        let ns_start = k;
        while text.get(k).is_some_and(|&b| ident(b)) {
            k += 1;
        }
        if let Some(ns) = text
            .get(ns_start..k)
            .filter(|n| !n.is_empty())
            .and_then(|n| std::str::from_utf8(n).ok())
        {
            add(ns, start, &mut out);
        }
    }
    // A namespace known to reach outside, looked up by a constant name.
    let aliases = module_aliases(&text);
    for ns in [
        "debugprims",
        "c10d",
        "_c10d_functional",
        "c10d_functional",
        "profiler",
    ] {
        if let Some(i) = getattr_of(&text, &literals, ns, &aliases) {
            add(ns, i, &mut out);
        }
    }
    out
}

/// Names the code binds to a module of torch's ops (`t = torch`,
/// `g = torch.autograd`, `a = ops.aten`): TorchScript lets a local name
/// hold a module, and `t.save(...)` is `aten::save`. At most 64.
fn module_aliases(text: &[u8]) -> Vec<Vec<u8>> {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\x0b' | b'\x0c');
    let mut out: Vec<Vec<u8>> = Vec::new();
    for (eq, _) in text.iter().enumerate().filter(|&(_, &b)| b == b'=') {
        if out.len() >= 64 {
            break;
        }
        let before = eq.checked_sub(1).and_then(|j| text.get(j)).copied();
        let after = text.get(eq + 1).copied();
        if matches!(before, Some(b'=' | b'!' | b'<' | b'>')) || after == Some(b'=') {
            continue;
        }
        // The name before.
        let mut j = eq;
        while j > 0 && text.get(j - 1).is_some_and(|&b| space(b)) {
            j -= 1;
        }
        let name_end = j;
        while j > 0 && text.get(j - 1).is_some_and(|&b| ident(b)) {
            j -= 1;
        }
        let Some(name) = text.get(j..name_end).filter(|n| !n.is_empty()) else {
            continue;
        };
        // The first name of the chain after.
        let mut k = eq + 1;
        while text.get(k).is_some_and(|&b| space(b)) {
            k += 1;
        }
        let root_start = k;
        while text.get(k).is_some_and(|&b| ident(b)) {
            k += 1;
        }
        let root = text.get(root_start..k).unwrap_or_default();
        let rest_is_chain = text
            .get(k..)
            .unwrap_or_default()
            .iter()
            .take_while(|&&b| b != b'\n')
            .all(|&b| ident(b) || b == b'.' || space(b) || b == b'\r');
        if matches!(root, b"torch" | b"aten" | b"ops") && rest_is_chain {
            out.push(name.to_vec());
        }
    }
    out
}

/// `getattr(<torch, aten, ops or an alias of one>, "op")`, the name given
/// as one or more adjacent string literals (`"from_" "file"`): how
/// TorchScript compiles an attribute looked up by a constant string. The
/// index of `getattr`.
fn getattr_of(
    text: &[u8],
    literals: &[(usize, Vec<u8>)],
    op: &str,
    aliases: &[Vec<u8>],
) -> Option<usize> {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let space = |b: u8| b.is_ascii_whitespace() || b == b'\x0b' || b == b'\x0c';
    let word = b"getattr";
    for at in occurrences(text, word) {
        let end = at + word.len();
        if at > 0 && text.get(at - 1).is_some_and(|&b| ident(b) || b == b'.') {
            continue;
        }
        let mut k = end;
        while text.get(k).is_some_and(|&b| space(b)) {
            k += 1;
        }
        if text.get(k) != Some(&b'(') {
            continue;
        }
        // The first argument, up to its comma at depth 0 (a few KiB at
        // most).
        let first_start = k + 1;
        let mut depth = 0usize;
        let mut comma = None;
        for (n, &b) in text
            .get(first_start..)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .take(4096)
        {
            match b {
                b'(' | b'[' => depth += 1,
                b')' | b']' if depth == 0 => break,
                b')' | b']' => depth -= 1,
                b',' if depth == 0 => {
                    comma = Some(first_start + n);
                    break;
                }
                _ => {}
            }
        }
        let Some(comma) = comma else {
            continue;
        };
        let first = text.get(first_start..comma).unwrap_or_default();
        let names_module = first
            .split(|&b| !ident(b))
            .any(|n| matches!(n, b"torch" | b"aten" | b"ops") || aliases.iter().any(|a| a == n));
        if !names_module {
            continue;
        }
        // Adjacent literals after the comma, joined.
        let mut k = comma + 1;
        let mut name = Vec::new();
        loop {
            while text.get(k).is_some_and(|&b| space(b)) {
                k += 1;
            }
            let Ok(found) = literals.binary_search_by_key(&k, |&(start, _)| start) else {
                break;
            };
            let Some((_, inner)) = literals.get(found) else {
                break;
            };
            name.extend_from_slice(inner);
            // Past the literal: its quotes and what they hold.
            let quote = text.get(k).copied().unwrap_or(b'"');
            let triple = text.get(k..k + 3) == Some(&[quote, quote, quote][..]);
            k += inner.len() + if triple { 6 } else { 2 };
        }
        if name == op.as_bytes() {
            return Some(at);
        }
    }
    None
}

/// [`call_of`] in code without comments or continuations.
fn call_in(code: &[u8], op: &str, aliases: &[Vec<u8>]) -> Option<usize> {
    let op = op.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    // Space as TorchScript's lexer skips it: vertical tab too.
    let space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c');
    let before = |i: usize| i.checked_sub(1).and_then(|j| code.get(j)).copied();
    for at in occurrences(code, op) {
        let end = at + op.len();
        let whole = !before(at).is_some_and(ident) && !code.get(end).copied().is_some_and(ident);
        let after = code
            .get(end..)
            .and_then(|rest| rest.iter().find(|b| !space(b)));
        // Called where it stands or through parentheses, a name it is
        // bound to, anything but an attribute of it: TorchScript code never
        // names the op otherwise.
        if !whole || after == Some(&b'.') {
            continue;
        }
        // Back over whitespace, the separator, whitespace, the qualifier.
        let mut i = at;
        while before(i).is_some_and(|b| space(&b)) {
            i -= 1;
        }
        if before(i) == Some(b'.') {
            i -= 1;
        } else if before(i) == Some(b':') && before(i - 1) == Some(b':') {
            i -= 2;
        } else {
            continue;
        }
        while before(i).is_some_and(|b| space(&b)) {
            i -= 1;
        }
        let qualifier_end = i;
        while before(i).is_some_and(ident) {
            i -= 1;
        }
        // The qualifier, then back over the rest of its chain, a few names
        // at most: the op is aten's when a name of the chain is `torch` or
        // `aten` (`ops.aten.save`; `torch.autograd.autograd.save`, as
        // TorchScript resolves `torch.autograd` to `aten` again).
        let (mut start, mut end) = (i, qualifier_end);
        for _ in 0..16 {
            let name = code.get(start..end).unwrap_or_default();
            if name == b"torch" || name == b"aten" || aliases.iter().any(|a| a == name) {
                return Some(at);
            }
            let mut j = start;
            while before(j).is_some_and(|b| space(&b)) {
                j -= 1;
            }
            if before(j) != Some(b'.') {
                break;
            }
            j -= 1;
            while before(j).is_some_and(|b| space(&b)) {
                j -= 1;
            }
            end = j;
            while before(j).is_some_and(ident) {
                j -= 1;
            }
            if j == end {
                break;
            }
            start = j;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The op named in TorchScript code however it is called; not an
    /// attribute of it, not another identifier.
    #[test]
    fn torchscript_calls_are_found_however_written() {
        for code in [
            &b"torch.save(x, p)"[..],
            b"torch . save (x, p)",
            b"(torch.save)(x, p)",
            b"f = torch.save\nf(x, p)",
            b"ops.aten.save(x, p)",
            b"aten::save(x, p)",
            b"torch.  # a comment\n  save(x, p)",
            b"torch. \\\n save(x, p)",
            b"torch.\x0bsave(x, p)",
            // A `#` inside a string literal starts no comment.
            b"_9 = (\"#\", torch.save(x, p))",
            b"_0 = x if '#' == '' else torch.save(x, p)",
            b"_0 = \"\"\"#\n#\"\"\"; torch.save(x, p)",
            b"_0 = \"\\\"#\"; torch.save(x, p)",
            // torch.autograd is aten again in TorchScript.
            b"torch.autograd.save(x, p)",
            // A local name bound to a module, getattr by a constant.
            b"t = torch\n    t.save(x, p)",
            b"a = ops.aten\n    _0 = a.save(x, p)",
            b"getattr(torch, \"save\")(x, p)",
            b"getattr(getattr(torch, \"autograd\"), \"sa\" \"ve\")(x, p)",
            b"torch.autograd.autograd.save(x, p)",
            b"torch . autograd . save(x, p)",
        ] {
            assert!(
                call_of(code, "save").is_some(),
                "{}",
                String::from_utf8_lossy(code)
            );
        }
        for code in [
            &b"torch.saved(x)"[..],
            b"torch.save.__doc__",
            b"mytorch.save(x)",
            b"save(x)",
            b"x = 1  # torch.save(x, p)",
            b"x = \"a\"  # \"b\" torch.save(x, p)",
            // Written inside strings: no call.
            b"print(\"t = torch\\nt.save(x, p)\", note)",
            b"print(\"getattr(torch, 'save')\")",
            b"_0 = \"torch.save(x, p)\"",
            // A name bound to something else.
            b"t = model\n    t.save(x, p)",
        ] {
            assert!(
                call_of(code, "save").is_none(),
                "{}",
                String::from_utf8_lossy(code)
            );
        }
    }

    /// The code a load runs: every `__setstate__`, the defs it names in
    /// any record, and nothing else; each def's block as TorchScript's
    /// indentation makes it.
    #[test]
    fn code_a_torchscript_load_runs_is_every_setstate_and_what_it_names() {
        let defs = |code: &[u8]| -> Vec<(String, String)> {
            let (text, _, _) = text_of(code);
            defs(&text)
                .into_iter()
                .map(|(name, span)| {
                    let body = String::from_utf8_lossy(&text[span]).trim_end().to_owned();
                    (String::from_utf8_lossy(name).into_owned(), body)
                })
                .collect()
        };
        // A block ends at the next line indented no deeper; a signature
        // over several lines (however indented inside its parentheses)
        // and blank lines do not end it; a tab reads as deep.
        let code = b"class A(Module):\n  def __setstate__(self,\ns: int) -> None:\n\n    x = 1\n\tprint(x)\n  def forward(self) -> int:\n    return 1\ndef f(x):\n  return x\n";
        let got = defs(code);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["__setstate__", "forward", "f"]);
        assert!(
            got[0].1.contains("print(x)") && !got[0].1.contains("forward"),
            "{got:?}"
        );
        assert!(got[1].1.ends_with("return 1"), "{got:?}");
        // What a `__setstate__` names runs, in any record, and what that
        // names; a def nothing reached does not.
        let one = b"class A(Module):\n  def __setstate__(self, s: int) -> None:\n    _0 = (self).helper(s, )\n    return None\n  def helper(self, s: int) -> None:\n    _1 = __torch__.util.announce(s)\n  def forward(self, x: Tensor) -> Tensor:\n    print(x)\n    return x\n";
        let two = b"def announce(s: int) -> None:\n  print(s)\ndef unused(s: int) -> None:\n  torch.warn(s)\n";
        let texts: Vec<(Vec<u8>, Vec<usize>)> = [&one[..], &two[..]]
            .iter()
            .map(|code| {
                let (text, at, _) = text_of(code);
                (text, at)
            })
            .collect();
        let run = run_on_load(&texts);
        assert!(word_in(&texts[0].0, &run[0], "print").is_none(), "{run:?}");
        let at = word_in(&texts[1].0, &run[1], "print").unwrap();
        assert_eq!(&two[texts[1].1[at]..texts[1].1[at] + 5], b"print");
        assert!(word_in(&texts[1].0, &run[1], "warn").is_none(), "{run:?}");
        // No `__setstate__`: nothing runs; a word inside a longer one or a
        // string is no word.
        let none = [(b"def forward(self):\n  print(1)\n".to_vec(), vec![])];
        assert!(run_on_load(&none)[0].is_empty());
        let (text, _, _) =
            text_of(b"def __setstate__(self):\n  reprint(\"print\")\n  prints = 1\n");
        let run = run_on_load(&[(text.clone(), vec![])]);
        assert!(word_in(&text, &run[0], "print").is_none());
        let (text, _, _) = text_of(b"def __setstate__(self):\n  ops.aten._print(\"x\")\n");
        let run = run_on_load(&[(text.clone(), vec![])]);
        assert_eq!(word_in(&text, &run[0], "_print"), Some(35));
        // Each def and each name once: many defs of one name, each naming
        // it, and defs nested as deep as the text allows, read in one pass.
        let many = b"def __setstate__(self):\n  __setstate__(self)\n".repeat(50_000);
        let deep: Vec<u8> = (0..2_000)
            .flat_map(|d| {
                let mut line = vec![b'\t'; d];
                line.extend_from_slice(b"def __setstate__(self):\n");
                line
            })
            .chain(b"print(1)\n".iter().copied())
            .collect();
        let texts: Vec<(Vec<u8>, Vec<usize>)> = [many, deep]
            .into_iter()
            .map(|code| (text_of(&code).0, vec![]))
            .collect();
        let run = run_on_load(&texts);
        assert_eq!(run[0].len(), 1);
        assert_eq!(run[0][0], 0..texts[0].0.len());
        assert_eq!(run[1].len(), 1);
        assert!(word_in(&texts[1].0, &run[1], "print").is_none());
    }

    /// The namespaces of ops a scripted module's code reaches other than
    /// the computing ones, however it reaches them; aten's, TorchScript's
    /// own and quantization's ops, names in strings and comments, and
    /// other identifiers ending in `ops` are none.
    #[test]
    fn torchscript_op_namespaces_are_found_however_reached() {
        let found = |code: &[u8]| -> Vec<String> {
            op_namespaces(code).into_iter().map(|(ns, _)| ns).collect()
        };
        for code in [
            &b"t = ops.debugprims.load_tensor(tag, [3], [1], dtype=6)"[..],
            b"t = torch.ops.debugprims.load_tensor(tag)",
            b"t = ops . debugprims . load_tensor(tag)",
            b"p = ops.debugprims\n    t = p.load_tensor(tag)",
            b"t = getattr(ops, \"debugprims\").load_tensor(tag)",
            b"t = ops.  # a comment\n  debugprims.load_tensor(tag)",
        ] {
            assert_eq!(
                found(code),
                ["debugprims"],
                "{}",
                String::from_utf8_lossy(code)
            );
        }
        assert_eq!(
            found(b"x = ops.my_ext.fused(x)\ny = ops.aten.add(x, x)\nz = ops.my_ext.other(y)"),
            ["my_ext"]
        );
        for code in [
            &b"x = ops.aten.add(x, y)"[..],
            b"x = ops.prim.NumToTensor(n)\ny = ops.quantized.linear(x, w, 1.0, 0)",
            b"x = torch.ops.torchvision.nms(b, s, 0.5)",
            b"_0 = \"ops.debugprims.load_tensor\"",
            b"x = 1  # ops.debugprims.load_tensor(tag)",
            b"x = mops.debugprims(y)",
        ] {
            let got = found(code);
            assert!(got.is_empty(), "{}: {got:?}", String::from_utf8_lossy(code));
        }
    }
}
