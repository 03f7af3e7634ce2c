//! `ptload load`: place every storage where the mapping says.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use ptload_device::{load, Gpus, LoadOptions, Loaded, LoadedTensor, Placed};
use ptload_reader::placement::{Device, DeviceMap};
use ptload_reader::Checkpoint;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::args::{self, parse_dtype, CliResult, GpuInfo, MapArgs, OpenArgs, StateDictArgs};
use crate::render::{human_size, HashMemo};

#[derive(Args)]
#[command(
    mut_arg("key", |a| a.help(args::key_help("auto"))),
    mut_arg("strip_prefix", |a| a.help(args::strip_help("auto")))
)]
#[command(mut_arg("strict", |a| a.help(
    "Behave like torch: refuse globals outside torch's weights_only allowlist (as \
     torch.load(weights_only=True)), and fail before copying when a planned GPU is missing \
     instead of falling back to the host"
)))]
pub(crate) struct LoadArgs {
    /// The checkpoint (a path, or an http(s)://, s3://, gs:// or az:// URL read by ranged requests).
    file: PathBuf,
    /// Print JSON: {"tensors": [{"name", "target", "device", "fallback", "dtype", "converted_from"}], "devices": [...], "seconds"}.
    #[arg(long)]
    json: bool,
    /// Convert floating tensors on load: F64, F32, F16, BF16, F8_E4M3, F8_E5M2.
    #[arg(long, value_name = "DTYPE")]
    dtype: Option<String>,
    /// Read each tensor back from where it landed (GPU or host) and print the sha256 of its elements, as `inspect --hash` does: equal hashes prove the upload.
    #[arg(long)]
    hash: bool,
    #[command(flatten)]
    open: OpenArgs,
    #[command(flatten)]
    map: MapArgs,
    #[command(flatten)]
    state: StateDictArgs,
}

/// Load the file (a set file by file, each reported on its own) and
/// report where everything went.
pub(crate) fn run(a: &LoadArgs, out: &mut impl Write) -> CliResult<u8> {
    let started = std::time::Instant::now();
    let set = a.open.open_set(&a.file, &a.open.options())?;
    let open_seconds = started.elapsed().as_secs_f64();
    let gpus = ptload_device::probe();
    let request = Request {
        map: &a.map,
        state: &a.state,
        strict: a.open.strict,
        dtype: a.dtype.as_deref(),
        // Hashing reads each host tensor once: from a URL, fetched as it
        // is hashed and dropped, not held by the load.
        host_on_read: a.hash,
    };
    let several = set.files().len() > 1;
    for file in set.files() {
        let name = file.name();
        let (loaded, decisions) = load_file(file.checkpoint(), &gpus, &request)?;
        // Host tensors left in the file are fetched ahead of the hashing.
        loaded.while_reading_ahead(|| -> CliResult<()> {
            if a.json {
                let label = several.then_some(name.as_str());
                json(out, &loaded, &decisions, a.hash, label)?;
            } else {
                if several {
                    writeln!(out, "{name}:")?;
                }
                summary(out, &loaded, &gpus, open_seconds, a.hash)?;
                if a.hash {
                    hashes(out, &loaded)?;
                }
            }
            Ok(())
        })?;
    }
    Ok(0)
}

/// GPU facts from one probe.
pub(crate) struct Probed<'g>(pub(crate) &'g Gpus);

impl GpuInfo for Probed<'_> {
    fn count(&self) -> usize {
        self.0.devices().len()
    }

    fn totals(&self) -> Vec<(u32, u64)> {
        self.0
            .devices()
            .iter()
            .map(|g| (g.ordinal, g.total))
            .collect()
    }

    fn why_none(&self) -> String {
        self.0.why_none()
    }
}

pub(crate) struct Request<'a> {
    pub(crate) map: &'a MapArgs,
    pub(crate) state: &'a StateDictArgs,
    pub(crate) strict: bool,
    pub(crate) dtype: Option<&'a str>,
    /// Leave host storages of a file read by ranges to be fetched when
    /// read (`LoadOptions::host_on_read`).
    pub(crate) host_on_read: bool,
}

/// Plan and load `ckpt`; also what the automatic options decided.
pub(crate) fn load_file(
    ckpt: &Arc<Checkpoint>,
    gpus: &Gpus,
    req: &Request<'_>,
) -> CliResult<(Loaded, Vec<String>)> {
    let mut mapper = req.map.mapper(ckpt, &Probed(gpus))?;
    let plan = DeviceMap::new(ckpt, mapper.as_mut())?;
    let selection = req.state.options(false)?.select(ckpt)?;
    crate::args::tell_decisions(selection.decisions());
    let mut opts = LoadOptions {
        strict: req.strict,
        host_on_read: req.host_on_read,
        // A set's files load one after another: the staging pinned for
        // the first serves the others (kept, the default).
        ..Default::default()
    };
    if let Some(d) = req.dtype {
        opts.dtype = Some(parse_dtype(d)?);
    }
    // The bytes of the storages the selection views, each once; a rank's
    // slice counts its own bytes.
    let mut used: Vec<usize> = selection
        .iter()
        .filter(|e| e.slice.is_none())
        .filter_map(|e| selection.view(e)?.info().storage)
        .collect();
    used.sort_unstable();
    used.dedup();
    let sliced: u64 = selection
        .iter()
        .filter(|e| e.slice.is_some())
        .filter_map(|e| Some(selection.view(e)?.info().nbytes))
        .sum();
    let total: u64 = used
        .iter()
        .filter_map(|&i| ckpt.storages().get(i))
        .map(|s| s.nbytes)
        .sum::<u64>()
        + sliced;
    let bar = crate::ui::progress_bar(
        if opts.dtype.is_some() {
            "converting and loading"
        } else {
            "loading"
        },
        total,
    );
    if let Some(bar) = &bar {
        // From a URL the bar counts the bytes fetched.
        let fetched = crate::remote::FetchCount::of([Arc::clone(ckpt)]);
        opts.progress = Some(crate::remote::progress(bar.clone(), fetched));
    }
    let loaded = load(Arc::clone(ckpt), &selection, &plan, gpus, &opts)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok((loaded, crate::terms::decisions(selection.decisions())))
}

#[derive(Serialize)]
struct TensorOut<'a> {
    name: &'a str,
    target: String,
    device: String,
    fallback: Option<String>,
    /// The dtype as loaded (after --dtype).
    dtype: &'static str,
    /// With --dtype, what it was converted from.
    #[serde(skip_serializing_if = "Option::is_none")]
    converted_from: Option<&'static str>,
    shape: &'a [u64],
    /// Under --shard, the rank's part (the shape and sha256 are its).
    #[serde(skip_serializing_if = "Option::is_none")]
    slice: Option<serde_json::Value>,
    /// With --hash: the elements' sha256, read back from where they are
    /// (`null` for a meta tensor).
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<Option<String>>,
}

/// A bar for reading back and hashing every tensor.
fn hash_bar(loaded: &Loaded) -> Option<indicatif::ProgressBar> {
    let total = loaded.tensors().iter().map(|t| t.info.nbytes).sum();
    crate::ui::progress_bar("hashing", total)
}

/// The sha256 of a loaded tensor's elements (row-major, host byte order:
/// `inspect --hash`'s convention), read back from wherever it landed a
/// piece at a time; `None` for a meta tensor.
/// A tensor viewing the elements of one hashed before (tied weights) takes
/// its hash.
fn sha256(loaded: &Loaded, t: &LoadedTensor, memo: &HashMemo) -> CliResult<Option<String>> {
    if t.device == Device::Meta {
        return Ok(None);
    }
    let digest = memo.get_or(0, &t.info, || -> CliResult<String> {
        let mut h = Sha256::new();
        loaded.visit_elements(t, |piece| h.update(piece))?;
        Ok(hex::encode(h.finalize()))
    })?;
    Ok(Some(digest))
}

/// One line per tensor: where it is and its elements' sha256.
pub(crate) fn hashes(out: &mut impl Write, loaded: &Loaded) -> CliResult<()> {
    let bar = hash_bar(loaded);
    let width = loaded
        .tensors()
        .iter()
        .map(|t| t.info.name.chars().count())
        .max()
        .unwrap_or(0);
    let memo = HashMemo::default();
    for t in loaded.tensors() {
        let hash = sha256(loaded, t, &memo)?.unwrap_or_else(|| "- (meta: no data)".into());
        if let Some(bar) = &bar {
            bar.inc(t.info.nbytes);
        }
        // Padded by hand: format!'s width panics past 65,535, and a name
        // from a file can be longer.
        let mut line = String::new();
        crate::render::pad(&mut line, &t.info.name, width, false);
        line.push_str("  ");
        crate::render::pad(&mut line, &t.device.to_string(), 8, false);
        writeln!(out, "{line}  sha256 {hash}")?;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(())
}

#[derive(Serialize)]
struct DeviceOut {
    device: String,
    tensors: usize,
    bytes: u64,
    seconds: f64,
    copies: usize,
    pinned_bytes: usize,
}

#[derive(Serialize)]
struct LoadOut<'a> {
    /// The file of a set this document is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    tensors: Vec<TensorOut<'a>>,
    devices: Vec<DeviceOut>,
    seconds: f64,
    decisions: &'a [String],
    /// Bytes of tensor data placed (read from the file): whole storages,
    /// or a rank's slices only.
    bytes_read: u64,
}

pub(crate) fn json(
    out: &mut impl Write,
    loaded: &Loaded,
    decisions: &[String],
    hash: bool,
    file: Option<&str>,
) -> CliResult<()> {
    let bar = hash.then(|| hash_bar(loaded)).flatten();
    let memo = HashMemo::default();
    let doc = LoadOut {
        file,
        bytes_read: loaded.devices().iter().map(|d| d.bytes).sum(),
        decisions,
        tensors: loaded
            .tensors()
            .iter()
            .map(|t| {
                Ok(TensorOut {
                    name: &t.info.name,
                    target: t.target.to_string(),
                    device: t.device.to_string(),
                    fallback: t.fallback.as_ref().map(ToString::to_string),
                    dtype: t.info.dtype.name(),
                    converted_from: t.converted_from.map(|d| d.name()),
                    shape: &t.info.shape,
                    slice: t
                        .slice
                        .map(|s| serde_json::json!({"dim": s.dim, "start": s.start, "len": s.len})),
                    sha256: if hash {
                        let digest = sha256(loaded, t, &memo)?;
                        if let Some(bar) = &bar {
                            bar.inc(t.info.nbytes);
                        }
                        Some(digest)
                    } else {
                        None
                    },
                })
            })
            .collect::<CliResult<_>>()?,
        devices: loaded
            .devices()
            .iter()
            .map(|d| DeviceOut {
                device: d.device.to_string(),
                tensors: d.tensors,
                bytes: d.bytes,
                seconds: d.seconds,
                copies: d.copies,
                pinned_bytes: d.pinned_bytes,
            })
            .collect(),
        seconds: loaded.seconds(),
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    serde_json::to_writer(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

/// What the load reports, a line per device; `on_read` when the load
/// left host storages of a file read by ranges to be fetched when read.
pub(crate) fn summary(
    out: &mut impl Write,
    loaded: &Loaded,
    gpus: &Gpus,
    open_seconds: f64,
    on_read: bool,
) -> CliResult<()> {
    let bytes: u64 = loaded.devices().iter().map(|d| d.bytes).sum();
    writeln!(
        out,
        "loaded {} tensors ({}): opened in {}, placed in {}",
        loaded.tensors().len(),
        human_size(bytes),
        human_time(open_seconds),
        human_time(loaded.seconds())
    )?;
    for d in loaded.devices() {
        let rate = match d.device {
            Device::Cuda(_) if d.seconds > 0.0 => format!(
                "  {:.2} GB/s, {} cop{}",
                d.bytes as f64 / d.seconds / 1e9,
                d.copies,
                if d.copies == 1 { "y" } else { "ies" }
            ),
            Device::Host => {
                let (mapped, copied) = host_bytes(loaded);
                // The file's own bytes: a map's pages, or those fetched
                // from a URL (by the load, or when read).
                let (all, part) = match (loaded.checkpoint().fetched_bytes(), on_read) {
                    (None, _) => ("the file's pages", "in the file's pages"),
                    (Some(_), false) => ("fetched from the file", "fetched from the file"),
                    (Some(_), true) => ("left in the file, fetched when read", "left in the file"),
                };
                if copied == 0 {
                    format!("  (host memory: {all}, nothing copied)")
                } else {
                    format!(
                        "  (host memory: {} {part}, {} copied)",
                        human_size(mapped),
                        human_size(copied)
                    )
                }
            }
            _ => String::new(),
        };
        writeln!(
            out,
            "  {:<8} {:>6} tensors  {:>10}{rate}",
            d.device.to_string(),
            d.tensors,
            human_size(d.bytes)
        )?;
    }
    // Fallbacks by reason: one line each, with a few of the tensors.
    let mut reasons: Vec<(&ptload_device::Fallback, Vec<&LoadedTensor>)> = Vec::new();
    for t in loaded.tensors() {
        if let Some(why) = t.fallback.as_ref() {
            match reasons.iter_mut().find(|(r, _)| *r == why) {
                Some((_, ts)) => ts.push(t),
                None => reasons.push((why, vec![t])),
            }
        }
    }
    if !reasons.is_empty() {
        let n: usize = reasons.iter().map(|(_, ts)| ts.len()).sum();
        writeln!(out, "{n} tensors fell back to the host:")?;
        for (why, ts) in reasons {
            let names: Vec<String> = ts
                .iter()
                .take(3)
                .map(|t| format!("{} ({})", t.info.name, t.target))
                .collect();
            let more = match ts.len().saturating_sub(3) {
                0 => String::new(),
                k => format!(" and {k} more"),
            };
            writeln!(
                out,
                "  {}: {} tensor{}: {}{more}",
                why,
                ts.len(),
                if ts.len() == 1 { "" } else { "s" },
                names.join(", ")
            )?;
        }
    }
    let converted = loaded
        .tensors()
        .iter()
        .filter(|t| t.converted_from.is_some())
        .count();
    if converted > 0 {
        writeln!(
            out,
            "{converted} floating tensors converted to {}",
            loaded
                .tensors()
                .iter()
                .find_map(|t| t.converted_from.map(|_| t.info.dtype))
                .map(|d| d.name())
                .unwrap_or("?")
        )?;
    }
    if gpus.devices().is_empty()
        && loaded
            .devices()
            .iter()
            .all(|d| d.device == Device::Host || d.device == Device::Meta)
    {
        writeln!(out, "GPU: {}", gpus.why_none())?;
    }
    Ok(())
}

/// Host storage bytes that are the file's own pages, and bytes copied
/// (swapped or converted).
fn host_bytes(loaded: &Loaded) -> (u64, u64) {
    let (mut mapped, mut copied) = (0u64, 0u64);
    for p in loaded.storages() {
        if let Placed::Host(h) = p {
            let n = h.len();
            if h.is_mapped() {
                mapped += n;
            } else {
                copied += n;
            }
        }
    }
    (mapped, copied)
}

/// Seconds for people: `0.4 ms`, `12.3 ms`, `1.25 s`.
pub(crate) fn human_time(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.1} ms", seconds * 1e3)
    } else {
        format!("{seconds:.2} s")
    }
}
