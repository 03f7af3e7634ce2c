//! `ptload diff`: two checkpoints compared tensor by tensor (each file's
//! model, as convert takes it: torch files and safetensors files alike).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use ptload_reader::set::CheckpointSet;
use ptload_reader::{DType, TensorView};
use serde::Serialize;

use crate::args::{self, CliResult, OpenArgs, StateDictArgs};

/// Exit code of a command that judges: 0 nothing found, 1 findings, 2 error.
pub(crate) type Verdict = u8;

// Compares the models two checkpoints hold, as convert and load take them
// (`--key auto --strip-prefix auto` unless given; each automatic choice is
// noted), so a plain state dict and a training or DataParallel checkpoint
// of the same weights compare equal.
#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("auto"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("auto")))
)]
pub(crate) struct DiffArgs {
    /// First checkpoint (a torch or safetensors file, a set of either, or a URL (http(s)://, s3://, gs://, az://)).
    a: PathBuf,
    /// Second checkpoint (a torch or safetensors file, a set of either, or a URL (http(s)://, s3://, gs://, az://)).
    b: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// --key for the first file only.
    #[arg(long = "key-a", value_name = "PATH|auto|all")]
    key_a: Option<String>,
    /// --key for the second file only.
    #[arg(long = "key-b", value_name = "PATH|auto|all")]
    key_b: Option<String>,
    /// Floating tensors within this absolute difference are equal (with --rtol: |a - b| <=
    /// atol + rtol * |b|, as torch.allclose); tensors of two floating dtypes then compare by value.
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    atol: f64,
    /// Floating tensors within this relative difference are equal (see --atol).
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    rtol: f64,
    #[command(flatten)]
    open: OpenArgs,
    #[command(flatten)]
    state: StateDictArgs,
}

/// A side of `diff` ready to compare: the checkpoint's model (a torch
/// file, a safetensors file or a set of either), selected as convert
/// selects it (`key` overriding `--key`).
fn diff_side<'o>(
    set: &'o CheckpointSet,
    key: &Option<String>,
    path: &std::path::Path,
    state: &StateDictArgs,
) -> CliResult<Side<'o>> {
    let mut state = state.clone();
    if key.is_some() {
        state.key.clone_from(key);
    }
    let sel = state.options(false)?.select_set(set)?;
    // Two files: each note says which.
    for d in crate::terms::decisions(sel.decisions()) {
        crate::ui::note(&format!("{}: {d}", path.display()));
    }
    Ok(sel)
}

/// Compare the two sides; exit 1 when they differ.
pub(crate) fn run(a: &DiffArgs, out: &mut impl Write) -> CliResult<u8> {
    if !(a.atol >= 0.0 && a.rtol >= 0.0) {
        return Err("invalid --atol/--rtol: expected numbers of 0 or more".into());
    }
    let opts = a.open.options();
    // An error says which side failed.
    let read = |path: &PathBuf| -> CliResult<CheckpointSet> {
        a.open
            .open_set(path, &opts)
            .map_err(|e| format!("{}: {}", path.display(), e.render(&crate::terms::Flags)).into())
    };
    let (oa, ob) = (read(&a.a)?, read(&a.b)?);
    let sa = diff_side(&oa, &a.key_a, &a.a, &a.state)?;
    let sb = diff_side(&ob, &a.key_b, &a.b, &a.state)?;
    let tol = Tolerance {
        atol: a.atol,
        rtol: a.rtol,
    };
    // Both sides' storages fetched ahead of the comparison when read by
    // ranges (each dropped once compared).
    let verdict =
        sa.while_reading_ahead(|| sb.while_reading_ahead(|| diff(out, &sa, &sb, tol, a.json)))?;
    out.flush()?;
    Ok(verdict)
}

#[derive(Serialize, Default)]
struct DiffOut {
    only_in_a: Vec<String>,
    only_in_b: Vec<String>,
    different: Vec<Difference>,
    equal: usize,
}

#[derive(Serialize)]
struct Difference {
    name: String,
    what: String,
    max_abs_diff: Option<f64>,
}

fn as_f64(bytes: &[u8], dtype: DType) -> Option<Vec<f64>> {
    let wide = ptload_reader::cast::convert(bytes, dtype, DType::F64).ok()?;
    Some(
        wide.chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
    )
}

/// How close two floating tensors must be to count as equal:
/// `|a - b| <= atol + rtol * |b|` for every element (as `torch.allclose`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tolerance {
    pub(crate) atol: f64,
    pub(crate) rtol: f64,
}

impl Tolerance {
    fn is_set(&self) -> bool {
        self.atol > 0.0 || self.rtol > 0.0
    }
}

/// One side of a diff: the selection of a checkpoint's model.
pub(crate) type Side<'a> = ptload_reader::state_dict::StateDict<'a>;

/// A tensor of either side.
struct Entry<'a> {
    dtype: DType,
    shape: Vec<u64>,
    /// Row-major little-endian elements; `None` for a meta tensor.
    data: Option<std::borrow::Cow<'a, [u8]>>,
}

/// The names, sizes and elements of a side's tensors.
trait Tensors {
    fn names(&self) -> Vec<String>;
    /// Bytes of the tensor's elements.
    fn nbytes(&self, name: &str) -> Option<u64>;
    fn entry(&self, name: &str) -> CliResult<Option<Entry<'_>>>;
}

impl Tensors for Side<'_> {
    fn names(&self) -> Vec<String> {
        self.iter().map(|s| s.name.clone()).collect()
    }

    fn nbytes(&self, name: &str) -> Option<u64> {
        self.get(name).map(|t| t.info().nbytes)
    }

    fn entry(&self, name: &str) -> CliResult<Option<Entry<'_>>> {
        let Some(t) = self.get(name) else {
            return Ok(None);
        };
        Ok(Some(Entry {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            data: t.storage().map(|_| t.data()).transpose()?,
        }))
    }
}

/// The largest `|a - b|` over elements seen so far, and whether every one
/// was within the tolerance.
struct Closeness {
    max: f64,
    within: bool,
}

impl Closeness {
    fn new() -> Closeness {
        Closeness {
            max: 0.0,
            within: true,
        }
    }

    /// Elements `x` of one side and `y` of the other, in step.
    fn add(&mut self, x: &[f64], y: &[f64], tol: Tolerance) {
        for (p, q) in x.iter().zip(y) {
            let d = (p - q).abs();
            // NaN anywhere makes the largest difference NaN.
            self.max = if self.max.is_nan() || d.is_nan() {
                f64::NAN
            } else {
                self.max.max(d)
            };
            self.within &= d <= tol.atol + tol.rtol * q.abs() || (p.is_nan() && q.is_nan());
        }
    }
}

/// The largest `|a - b|` and whether every element is within `tol`
/// (`None` when the dtypes have no numeric values to compare).
fn closeness(a: &Entry<'_>, b: &Entry<'_>, tol: Tolerance) -> Option<(f64, bool)> {
    let (x, y) = (
        as_f64(a.data.as_deref()?, a.dtype)?,
        as_f64(b.data.as_deref()?, b.dtype)?,
    );
    let mut seen = Closeness::new();
    seen.add(&x, &y, tol);
    Some((seen.max, seen.within))
}

/// `None` when equal (bytes equal, or within the tolerance).
fn compare(name: &str, a: &Entry<'_>, b: &Entry<'_>, tol: Tolerance) -> Option<Difference> {
    let differ = |what: String, max_abs_diff| {
        Some(Difference {
            name: name.to_owned(),
            what,
            max_abs_diff,
        })
    };
    if a.shape != b.shape {
        return differ(format!("shape {:?} vs {:?}", a.shape, b.shape), None);
    }
    if a.dtype != b.dtype {
        // With a tolerance, values of two floating dtypes compare (a
        // conversion to bf16 checked against its f32 source).
        if tol.is_set() && a.dtype.is_float() && b.dtype.is_float() {
            return match closeness(a, b, tol) {
                Some((_, true)) => None,
                Some((max, false)) => differ(
                    format!(
                        "dtype {} vs {}, values outside the tolerance",
                        a.dtype, b.dtype
                    ),
                    Some(max),
                ),
                None => differ(format!("dtype {} vs {}", a.dtype, b.dtype), None),
            };
        }
        return differ(format!("dtype {} vs {}", a.dtype, b.dtype), None);
    }
    match (&a.data, &b.data) {
        // Meta tensors: equal when dtype and shape are.
        (None, None) => None,
        (Some(x), Some(y)) if x == y => None,
        (Some(_), Some(_)) => match closeness(a, b, tol) {
            Some((_, true)) if tol.is_set() => None,
            Some((max, _)) => differ(
                if tol.is_set() {
                    "values outside the tolerance".into()
                } else {
                    "bytes differ".into()
                },
                Some(max),
            ),
            None => differ("bytes differ".into(), None),
        },
        _ => differ("one side has no data (meta)".into(), None),
    }
}

/// Tensors larger than this (on either side) are compared a piece at a
/// time, streamed from both files, never held whole: a file read by
/// ranges holds a piece of each side and the read-ahead.
const WHOLE: u64 = 8 << 20;

/// [`compare`] of two tensors with data, read a piece at a time: first
/// their bytes (same dtype), then, when they differ or the dtypes do
/// (two floating dtypes under a tolerance), their values in a second
/// pass. The same answer as reading both whole.
fn compare_streamed(
    name: &str,
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    tol: Tolerance,
) -> CliResult<Option<Difference>> {
    let differ = |what: String, max_abs_diff| {
        Some(Difference {
            name: name.to_owned(),
            what,
            max_abs_diff,
        })
    };
    let (da, db) = (a.dtype(), b.dtype());
    if a.shape() != b.shape() {
        return Ok(differ(
            format!("shape {:?} vs {:?}", a.shape(), b.shape()),
            None,
        ));
    }
    let by_value = tol.is_set() && da.is_float() && db.is_float();
    if da != db && !by_value {
        return Ok(differ(format!("dtype {da} vs {db}"), None));
    }
    if da == db {
        let mut same = true;
        in_step(a, b, |x, y| same &= x == y)?;
        if same {
            return Ok(None);
        }
    }
    // The values, element by element, as `closeness` takes them.
    let mut seen = Closeness::new();
    let mut numeric = true;
    in_step(a, b, |x, y| match (as_f64(x, da), as_f64(y, db)) {
        (Some(x), Some(y)) => seen.add(&x, &y, tol),
        _ => numeric = false,
    })?;
    let (max, within) = (seen.max, seen.within);
    Ok(match (numeric, within, da == db) {
        (false, _, true) => differ("bytes differ".into(), None),
        (false, _, false) => differ(format!("dtype {da} vs {db}"), None),
        (true, true, _) if tol.is_set() => None,
        (true, _, true) => differ(
            if tol.is_set() {
                "values outside the tolerance".into()
            } else {
                "bytes differ".into()
            },
            Some(max),
        ),
        (true, _, false) => differ(
            format!("dtype {da} vs {db}, values outside the tolerance"),
            Some(max),
        ),
    })
}

/// Hand `f` the elements of `a` and `b` (of the same shape) in step: each
/// call, the same run of elements of both (row-major, host order), read
/// from each file a piece at a time. `a` is read on a thread of its own
/// and handed over in parts of at most [`PART`] bytes, one waiting at
/// most; `b`'s pieces are compared where they lie.
fn in_step(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    mut f: impl FnMut(&[u8], &[u8]),
) -> CliResult<()> {
    let (ua, ub) = (a.dtype().size().max(1), b.dtype().size().max(1));
    let (parts, from_a) = std::sync::mpsc::sync_channel::<Vec<u8>>(1);
    std::thread::scope(|scope| -> CliResult<()> {
        let reader = scope.spawn(move || {
            a.visit_bytes(|piece| {
                for part in piece.chunks(PART) {
                    // The other side failed: the rest is read and dropped.
                    let _ = parts.send(part.to_vec());
                }
            })
        });
        // `a`'s part at hand and how far it was compared; the bytes of an
        // element of `b` cut by the end of its piece.
        let (mut held, mut at) = (Vec::new(), 0usize);
        let mut cut: Vec<u8> = Vec::new();
        let read_b = b.visit_bytes(|piece| {
            let joined;
            let bytes: &[u8] = if cut.is_empty() {
                piece
            } else {
                cut.extend_from_slice(piece);
                joined = std::mem::take(&mut cut);
                &joined
            };
            let whole = bytes.len() / ub * ub;
            let mut done = 0;
            while done < whole {
                let ready = (held.len() - at) / ua;
                if ready == 0 {
                    // The next part of `a`, after what is left of this one.
                    let Ok(next) = from_a.recv() else {
                        break;
                    };
                    held.drain(..at);
                    held.extend_from_slice(&next);
                    at = 0;
                    continue;
                }
                let n = ready.min((whole - done) / ub);
                f(&held[at..at + n * ua], &bytes[done..done + n * ub]);
                at += n * ua;
                done += n * ub;
            }
            cut.extend_from_slice(&bytes[whole..]);
        });
        drop(from_a);
        let read_a = reader
            .join()
            .map_err(|_| "a thread reading a tensor failed".to_owned())?;
        read_b?;
        read_a?;
        Ok(())
    })
}

/// Bytes of `a` handed from its reader's thread at a time.
const PART: usize = 1 << 20;

pub(crate) fn diff(
    out: &mut impl Write,
    a: &Side<'_>,
    b: &Side<'_>,
    tol: Tolerance,
    json: bool,
) -> CliResult<Verdict> {
    let mut result = DiffOut::default();
    // Two names for the same views on both sides (a tied weight) compare
    // as the first did, read once.
    let mut answered: std::collections::HashMap<_, Option<(String, Option<f64>)>> =
        std::collections::HashMap::new();
    let names = a.names();
    let total = names.iter().filter_map(|n| a.nbytes(n)).sum();
    let bar = crate::ui::progress_bar("comparing", total);
    for name in names {
        if let (Some(bar), Some(n)) = (&bar, a.nbytes(&name)) {
            bar.inc(n);
        }
        if !b.contains(&name) {
            result.only_in_a.push(name);
            continue;
        }
        let (Some(va), Some(vb)) = (a.get(&name), b.get(&name)) else {
            continue;
        };
        let key = |side: &Side<'_>, v: &TensorView<'_>| {
            let s = side.selected(&name).filter(|s| s.slice.is_none())?;
            crate::render::view_key(s.file, v.info())
        };
        let pair = key(a, &va).zip(key(b, &vb));
        if let Some(said) = pair.as_ref().and_then(|p| answered.get(p)) {
            match said {
                Some((what, max_abs_diff)) => result.different.push(Difference {
                    name: name.clone(),
                    what: what.clone(),
                    max_abs_diff: *max_abs_diff,
                }),
                None => result.equal += 1,
            }
            continue;
        }
        let large = va.info().nbytes > WHOLE || vb.info().nbytes > WHOLE;
        let found = if large && va.storage().is_some() && vb.storage().is_some() {
            compare_streamed(&name, &va, &vb, tol)?
        } else {
            let (Some(ea), Some(eb)) = (a.entry(&name)?, b.entry(&name)?) else {
                continue;
            };
            compare(&name, &ea, &eb, tol)
        };
        if let Some(pair) = pair {
            let said = found.as_ref().map(|d| (d.what.clone(), d.max_abs_diff));
            answered.insert(pair, said);
        }
        match found {
            Some(d) => result.different.push(d),
            None => result.equal += 1,
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    result.only_in_b = b.names().into_iter().filter(|n| !a.contains(n)).collect();
    let same =
        result.only_in_a.is_empty() && result.only_in_b.is_empty() && result.different.is_empty();
    if json {
        serde_json::to_writer(&mut *out, &result)?;
        writeln!(out)?;
    } else {
        for n in &result.only_in_a {
            writeln!(out, "only in A: {n}")?;
        }
        for n in &result.only_in_b {
            writeln!(out, "only in B: {n}")?;
        }
        for d in &result.different {
            match d.max_abs_diff {
                Some(m) => writeln!(
                    out,
                    "different: {}: {} (max abs diff {m:e})",
                    d.name, d.what
                )?,
                None => writeln!(out, "different: {}: {}", d.name, d.what)?,
            }
        }
        writeln!(
            out,
            "{}: {} equal, {} different, {} only in A, {} only in B",
            if same { "equal" } else { "different" },
            result.equal,
            result.different.len(),
            result.only_in_a.len(),
            result.only_in_b.len()
        )?;
    }
    Ok(if same { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ptload_reader::{Checkpoint, Limits, OpenOptions};

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/files")
            .join(name)
    }

    fn entry<'a>(v: &'a TensorView<'a>) -> Entry<'a> {
        Entry {
            dtype: v.dtype(),
            shape: v.shape().to_vec(),
            data: Some(v.data().unwrap()),
        }
    }

    fn said(d: &Option<Difference>) -> Option<(String, Option<u64>)> {
        d.as_ref()
            .map(|d| (d.what.clone(), d.max_abs_diff.map(f64::to_bits)))
    }

    /// Tensors compared a piece at a time (one side mapped, the other
    /// read by ranges in 64 KiB requests, so that their pieces never line
    /// up) give what comparing them whole gives: equal, bytes differing
    /// with the largest difference, within or outside a tolerance.
    #[test]
    fn streamed_comparison_answers_as_the_whole_one() {
        let path = fixture("llama_wide.pt");
        let mapped = Checkpoint::open(&path).unwrap();
        let mut limits = Limits::default();
        limits.max_fetch_request_bytes = 64 << 10;
        let ranged = OpenOptions::new()
            .limits(limits)
            .positioned(true)
            .open(&path)
            .unwrap();
        let none = Tolerance::default();
        let small = Tolerance {
            atol: 1e-3,
            rtol: 0.0,
        };
        let large = Tolerance {
            atol: 10.0,
            rtol: 0.0,
        };
        let (q, k) = (
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
        );
        let (gate, up) = (
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight",
        );
        let norms = ("model.layers.0.input_layernorm.weight", "model.norm.weight");
        let cases = [
            (
                "model.embed_tokens.weight",
                "model.embed_tokens.weight",
                none,
            ),
            ("model.embed_tokens.weight", "lm_head.weight", none),
            ("lm_head.weight", "model.embed_tokens.weight", large),
            (q, k, none),
            (q, k, small),
            (q, k, large),
            (gate, up, small),
            (norms.0, norms.1, none),
            (norms.0, norms.1, small),
        ];
        let mut differing = 0;
        for (x, y, tol) in cases {
            let a = mapped.tensor(x).unwrap();
            let b = ranged.tensor(y).unwrap();
            let streamed = compare_streamed(x, &a, &b, tol).unwrap();
            let whole = compare(x, &entry(&a), &entry(&b), tol);
            assert_eq!(said(&streamed), said(&whole), "{x} vs {y}, {tol:?}");
            differing += usize::from(streamed.is_some());
        }
        assert!(differing >= 4, "{differing} comparisons differed");
    }
}
