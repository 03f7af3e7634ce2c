//! `ptload scan`: which pickles torch.load would run in each file, what
//! they name, and the level each finding reaches; text, JSON or SARIF 2.1.0.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use ptload_reader::scan::{self, Level, Verdict};
use ptload_reader::set::{CheckpointSet, Input};
use ptload_reader::{Limits, OpenOptions};
use serde::Serialize;
use serde_json::json;

use crate::args::CliResult;

use clap::Args;

#[derive(Args)]
pub(crate) struct ScanArgs {
    /// Checkpoints to scan (a directory: every checkpoint, pickle or archive in it, recursively;
    /// an http(s)://, s3://, gs:// or az:// URL: only its directory and pickles are fetched).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output format: text, json, or sarif (SARIF 2.1.0, one result per finding).
    #[arg(long, value_enum, default_value = "text")]
    format: ScanFormat,
    /// Print JSON (as --format json).
    #[arg(long, conflicts_with = "format")]
    json: bool,
    /// Exit 1 when a file reaches this level or above: needs-code, unknown-call, ambiguous,
    /// dangerous.
    #[arg(long = "fail-on", value_name = "LEVEL", default_value = "unknown-call", value_parser = parse_level)]
    fail_on: ptload_reader::scan::Level,
    /// Read each file into memory instead of mapping it.
    #[arg(long = "no-mmap")]
    no_mmap: bool,
    /// Read each file by positioned reads (pread), only the parts scanned, instead of
    /// mapping it: for network file systems.
    #[arg(long, conflicts_with = "no_mmap")]
    pread: bool,
}

/// Scan the files; the exit code is the verdict (`--fail-on`).
pub(crate) fn run(a: &ScanArgs, out: &mut impl Write) -> CliResult<u8> {
    let files = files_to_scan(&a.files)?;
    let request = ScanRequest {
        format: if a.json { ScanFormat::Json } else { a.format },
        fail_on: a.fail_on,
        in_memory: a.no_mmap,
        positioned: a.pread,
    };
    let verdict = scan_files(out, &files, &request)?;
    out.flush()?;
    Ok(verdict)
}

/// How `scan` prints its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ScanFormat {
    Text,
    Json,
    Sarif,
}

/// What `scan` was asked to do.
pub(crate) struct ScanRequest {
    pub(crate) format: ScanFormat,
    pub(crate) fail_on: Level,
    pub(crate) in_memory: bool,
    /// Read local files by positioned reads, only the parts scanned.
    pub(crate) positioned: bool,
}

/// Parse `--fail-on`: a level's name.
pub(crate) fn parse_level(s: &str) -> Result<Level, String> {
    Level::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Level::ALL.iter().map(|l| l.name()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// Extensions a directory walk scans without looking inside (other files
/// are scanned when their first bytes are a zip, a pickle, a tar or an
/// archive torch cannot load).
const CHECKPOINT_EXTENSIONS: &[&str] = &[
    "pt",
    "pth",
    "bin",
    "ckpt",
    "pkl",
    "pickle",
    "model",
    "mar",
    "nemo",
    "tar",
    "7z",
    "gz",
    "tgz",
    "bz2",
    "xz",
    "zst",
    "zip",
    "npy",
    "npz",
    "joblib",
    "safetensors",
];

/// Archives torch.load cannot read by their magic bytes: their contents
/// cannot run when the file is loaded, and are not scanned here.
fn not_loadable(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"7z\xbc\xaf\x27\x1c") {
        Some("7z")
    } else if head.starts_with(b"\x1f\x8b") {
        Some("gzip (tar.gz)")
    } else if head.starts_with(b"BZh") {
        Some("bzip2")
    } else if head.starts_with(b"\xfd7zXZ\x00") {
        Some("xz")
    } else if head.starts_with(b"\x28\xb5\x2f\xfd") {
        Some("zstd")
    } else if head.starts_with(b"Rar!") {
        Some("rar")
    } else {
        None
    }
}

fn head_of(path: &Path) -> Vec<u8> {
    let mut head = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(512).read_to_end(&mut head);
    }
    head
}

/// Whether a file met in a directory walk is scanned: a checkpoint
/// extension, or bytes torch.load would try (zip, pickle, tar) or an
/// archive it cannot load.
fn worth_scanning(path: &Path) -> bool {
    let by_name = path.extension().is_some_and(|x| {
        CHECKPOINT_EXTENSIONS
            .iter()
            .any(|c| x.eq_ignore_ascii_case(c))
    });
    if by_name {
        return true;
    }
    let head = head_of(path);
    head.starts_with(b"PK\x03\x04")
        || matches!(head.as_slice(), [0x80, 2..=5, ..])
        || head.get(257..262) == Some(b"ustar")
        || not_loadable(&head).is_some()
}

/// The files to scan: each named file, and each directory walked
/// recursively (an explicit stack; links to files followed, links to
/// directories not), in name order.
pub(crate) fn files_to_scan(paths: &[PathBuf]) -> CliResult<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let mut found = Vec::new();
        let mut stack = vec![p.clone()];
        while let Some(dir) = stack.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for e in entries {
                let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
                let path = e.path();
                let kind = e
                    .file_type()
                    .map_err(|err| format!("{}: {err}", path.display()))?;
                // Links to files are followed (a Hugging Face cache holds
                // links into its blobs); links to directories are not (a
                // cycle would never end), and are said so.
                let is_file = if kind.is_symlink() {
                    let target = std::fs::metadata(&path);
                    if target.as_ref().is_ok_and(|m| m.is_dir()) {
                        crate::ui::note(&format!(
                            "{}: a link to a directory, not followed",
                            path.display()
                        ));
                    }
                    target.is_ok_and(|m| m.is_file())
                } else {
                    kind.is_file()
                };
                if kind.is_dir() {
                    stack.push(path);
                } else if is_file && worth_scanning(&path) {
                    found.push(path);
                }
            }
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

#[derive(Serialize)]
struct GlobalOut {
    global: String,
    #[serde(rename = "use")]
    usage: &'static str,
    class: String,
    level: &'static str,
    /// The pickle it is in (a zip entry, a stream pickle, a nested pickle).
    pickle: String,
    /// Whether torch.load would unpickle that pickle.
    reachable: bool,
    /// Offset in the pickle.
    offset: u64,
    /// Offset in the file, when the pickle lies there as it is.
    file_offset: Option<u64>,
    /// At or above the --fail-on line.
    finding: bool,
}

#[derive(Serialize)]
struct PickleOut {
    pickle: String,
    reachable: bool,
    complete: bool,
    error: Option<String>,
}

#[derive(Serialize)]
struct AmbiguityOut {
    record: String,
    offset: u64,
    what: String,
}

/// What torch's reading of the container does (a tar member it extracts
/// that is a link).
#[derive(Serialize)]
struct EffectOut {
    record: String,
    offset: u64,
    danger: &'static str,
    what: String,
}

#[derive(Serialize)]
struct FileScan {
    file: String,
    layout: Option<&'static str>,
    /// A level's name, `unreadable` or `not-loadable`.
    verdict: &'static str,
    /// The highest level found (`clean` when nothing was read).
    level: &'static str,
    /// At or above the --fail-on line.
    fails: bool,
    globals: Vec<GlobalOut>,
    pickles: Vec<PickleOut>,
    ambiguities: Vec<AmbiguityOut>,
    effects: Vec<EffectOut>,
    notes: Vec<String>,
    error: Option<String>,
    /// For a URL: the bytes and requests the scan fetched.
    #[serde(skip_serializing_if = "Option::is_none")]
    fetched: Option<crate::remote::Fetched>,
}

impl FileScan {
    fn bare(file: String, verdict: &'static str, error: String) -> FileScan {
        FileScan {
            file,
            layout: None,
            verdict,
            level: Level::Clean.name(),
            fails: false,
            globals: Vec::new(),
            pickles: Vec::new(),
            ambiguities: Vec::new(),
            effects: Vec::new(),
            notes: Vec::new(),
            error: Some(error),
            fetched: None,
        }
    }
}

/// Scan the file at `url` by ranged requests: its directory and pickles
/// (a legacy file's stream), not its tensors. Its first bytes say first
/// whether it is a file torch.load cannot read, as for a local file.
fn scan_url(url: &str, request: &ScanRequest) -> FileScan {
    let unreadable = |e: ptload_reader::Error| {
        FileScan::bare(url.to_owned(), "unreadable", crate::terms::error_text(&e))
    };
    let file = match ptload_reader::remote::open_url(url) {
        Ok(f) => f,
        Err(e) => return unreadable(e),
    };
    let first = file.len().min(512);
    let head = match file.read_at(0, first) {
        Ok(head) => head,
        Err(e) => {
            return FileScan::bare(
                url.to_owned(),
                "unreadable",
                format!("io: cannot read the first {first} bytes of {url}: {e}"),
            )
        }
    };
    if let Some(scan) = not_scanned(url, &head) {
        return scan;
    }
    let (report, (bytes, requests)) = match scan::scan_ranged(file, &Limits::default()) {
        Ok(r) => r,
        Err(e) => return unreadable(e),
    };
    let unreadable = || {
        OpenOptions::new()
            .open_url(url)
            .err()
            .map(|e| crate::terms::error_text(&e))
    };
    let mut scan = file_scan(url.to_owned(), report, request, unreadable);
    // The first bytes read above count too.
    scan.fetched = Some(crate::remote::Fetched {
        bytes: bytes + head.len() as u64,
        requests: requests + 1,
    });
    scan
}

/// A file torch.load cannot read, named from its first bytes `head` and
/// its length: an archive of another kind.
fn not_scanned(file: &str, head: &[u8]) -> Option<FileScan> {
    if let Some(kind) = not_loadable(head) {
        return Some(FileScan::bare(
            file.to_owned(),
            "not-loadable",
            format!(
                "a {kind} archive: torch.load cannot read it; unpack it and scan what it holds"
            ),
        ));
    }
    None
}

/// The URL `path` holds when it names an index (its path ends in `.json`).
fn index_url(path: &Path) -> Option<&str> {
    let input = Input::new(path);
    path.to_str()
        .filter(|_| input.url().is_some() && input.is_index())
}

/// Scan one file as torch.load would read it.
fn scan_file(path: &Path, request: &ScanRequest) -> FileScan {
    if let Input::Url(url) = Input::new(path) {
        return scan_url(&url, request);
    }
    let file = path.display().to_string();
    if let Some(scan) = not_scanned(&file, &head_of(path)) {
        return scan;
    }
    let report = if request.positioned {
        ptload_reader::ranged::LocalFile::open(path)
            .and_then(|f| scan::scan_ranged(std::sync::Arc::new(f), &Limits::default()))
            .map(|(report, _)| report)
    } else {
        scan::scan_file(path, &Limits::default(), request.in_memory)
    };
    let report = match report {
        Ok(r) => r,
        Err(e) => return FileScan::bare(file, "unreadable", crate::terms::error_text(&e)),
    };
    let opened = || {
        OpenOptions::new()
            .in_memory(request.in_memory)
            .positioned(request.positioned)
            .open(path)
            .err()
            .map(|e| crate::terms::error_text(&e))
    };
    file_scan(file, report, request, opened)
}

/// The scan of `file` from its report; `open_error` opens the file (for
/// an unreadable one, to say what it is).
fn file_scan(
    file: String,
    report: scan::ScanReport,
    request: &ScanRequest,
    open_error: impl FnOnce() -> Option<String>,
) -> FileScan {
    let verdict = report.verdict();
    let level = report.level();
    // An unreadable file: say what it is, as opening it would.
    let error = (verdict == Verdict::Unreadable).then(|| {
        open_error()
            .or_else(|| report.pickles.iter().find_map(|p| p.error.clone()))
            .unwrap_or_else(|| "no pickle torch could read".into())
    });
    let mut globals = Vec::new();
    for p in &report.pickles {
        for g in &p.globals {
            globals.push(GlobalOut {
                global: g.path(),
                usage: g.usage.name(),
                class: g.class.label(),
                level: g.level().name(),
                pickle: p.source.to_string(),
                reachable: p.reachable,
                offset: g.offset,
                file_offset: p.base.and_then(|b| b.checked_add(g.offset)),
                finding: g.level() >= request.fail_on,
            });
        }
    }
    FileScan {
        file,
        layout: Some(report.layout),
        verdict: verdict.name(),
        level: level.name(),
        fails: level >= request.fail_on,
        globals,
        pickles: report
            .pickles
            .iter()
            .map(|p| PickleOut {
                pickle: p.source.to_string(),
                reachable: p.reachable,
                complete: p.complete,
                error: p.error.clone(),
            })
            .collect(),
        ambiguities: report
            .ambiguities
            .into_iter()
            .map(|a| AmbiguityOut {
                record: a.record,
                offset: a.offset,
                what: a.what,
            })
            .collect(),
        effects: report
            .effects
            .into_iter()
            .map(|e| EffectOut {
                record: e.record,
                offset: e.offset,
                danger: e.danger.name(),
                what: e.what,
            })
            .collect(),
        notes: report.notes,
        error,
        fetched: None,
    }
}

/// Exit code: 1 if any file is at or above the line (even next to an
/// unreadable one: a gate must not read "error" as "not flagged"), else 2
/// if any file is unreadable, else 0. Archives torch cannot load and
/// safetensors files are named, and do not fail.
fn exit_code(scans: &[FileScan]) -> u8 {
    if scans.iter().any(|s| s.fails) {
        1
    } else if scans.iter().any(|s| s.verdict == "unreadable") {
        2
    } else {
        0
    }
}

/// `scanned 3 files: 1 dangerous, 2 needs-code; 1 fails at unknown-call`.
fn summary(scans: &[FileScan], fail_on: Level) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    let order = Level::ALL
        .iter()
        .rev()
        .map(|l| l.name())
        .chain(["unreadable", "not-loadable"]);
    for name in order {
        let n = scans.iter().filter(|s| s.verdict == name).count();
        if n > 0 {
            counts.push((name, n));
        }
    }
    let counted: Vec<String> = counts.iter().map(|(v, n)| format!("{n} {v}")).collect();
    let failing = scans.iter().filter(|s| s.fails).count();
    format!(
        "scanned {} file{}: {}; {failing} at or above {}",
        scans.len(),
        if scans.len() == 1 { "" } else { "s" },
        if counted.is_empty() {
            "nothing".to_owned()
        } else {
            counted.join(", ")
        },
        fail_on.name(),
    )
}

fn scan_files(out: &mut impl Write, files: &[PathBuf], request: &ScanRequest) -> CliResult<u8> {
    let mut scans: Vec<FileScan> = Vec::new();
    for f in files {
        match index_url(f) {
            // An index's URL: each shard it names, at its own URL.
            Some(url) => match CheckpointSet::index_shard_urls(url, &OpenOptions::new()) {
                Ok(shards) => scans.extend(shards.iter().map(|s| scan_url(s, request))),
                Err(e) => scans.push(FileScan::bare(
                    url.to_owned(),
                    "unreadable",
                    crate::terms::error_text(&e),
                )),
            },
            None => scans.push(scan_file(f, request)),
        }
    }
    let code = exit_code(&scans);
    let summary = summary(&scans, request.fail_on);
    match request.format {
        ScanFormat::Json => {
            #[derive(Serialize)]
            struct ScanOut<'a> {
                fail_on: &'static str,
                files: &'a [FileScan],
                summary: &'a str,
            }
            let doc = ScanOut {
                fail_on: request.fail_on.name(),
                files: &scans,
                summary: &summary,
            };
            serde_json::to_writer(&mut *out, &doc)?;
            writeln!(out)?;
            crate::ui::note(&summary);
        }
        ScanFormat::Sarif => {
            serde_json::to_writer(&mut *out, &sarif(&scans, request.fail_on))?;
            writeln!(out)?;
            crate::ui::note(&summary);
        }
        ScanFormat::Text => {
            text(out, &scans)?;
            writeln!(out, "{summary}")?;
        }
    }
    Ok(code)
}

fn text(out: &mut impl Write, scans: &[FileScan]) -> CliResult<()> {
    for s in scans {
        if let Some(e) = &s.error {
            if s.layout.is_none() {
                writeln!(out, "{}: {}: {e}", s.file, s.verdict.to_uppercase())?;
                continue;
            }
            eprintln!("ptload: {}: cannot be read: {e}", s.file);
        }
        let reachable = s.pickles.iter().filter(|p| p.reachable).count();
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        writeln!(
            out,
            "{}: {} ({}, {} in {}, {reachable} read by torch.load)",
            s.file,
            s.verdict.to_uppercase(),
            s.layout.unwrap_or("?"),
            plural(s.globals.len(), "global"),
            plural(s.pickles.len(), "pickle"),
        )?;
        let width = s.globals.iter().map(|g| g.global.chars().count()).max();
        for g in &s.globals {
            let mut line = String::from(if g.finding { "! " } else { "  " });
            crate::render::pad(&mut line, &g.global, width.unwrap_or(0), false);
            line.push_str("  ");
            crate::render::pad(&mut line, g.usage, 12, false);
            line.push_str("  ");
            crate::render::pad(&mut line, g.level, 12, false);
            line.push_str("  ");
            crate::render::pad(&mut line, &g.class, 32, false);
            let unreached = if g.reachable {
                ""
            } else {
                " (not read by torch.load)"
            };
            writeln!(out, "{line}  {} +{:#x}{unreached}", g.pickle, g.offset)?;
        }
        for e in &s.effects {
            writeln!(
                out,
                "! dangerous ({}): {} +{:#x}: {}",
                e.danger, e.record, e.offset, e.what
            )?;
        }
        for a in &s.ambiguities {
            writeln!(
                out,
                "! ambiguous: {} +{:#x}: {}",
                a.record, a.offset, a.what
            )?;
        }
        for p in &s.pickles {
            if let Some(e) = &p.error {
                writeln!(out, "  {}: stopped: {e}", p.pickle)?;
            }
        }
        for n in &s.notes {
            writeln!(out, "  note: {n}")?;
        }
    }
    Ok(())
}

/// What each SARIF rule stands for.
fn rule_text(rule: &str) -> &'static str {
    match rule {
        "dangerous" => "A global that runs code, spawns processes, touches files or the network, imports by name, or a gadget that reaches a call; or what torch's reading of the container does (a link among the tar members it extracts)",
        "ambiguous" => "Structure other readers read differently from torch (zip directory tricks, bad CRCs, a pickle that reads past its frame)",
        "unknown-call" => "A call of a callable outside the known-safe set",
        "needs-code" => "A class only constructed and filled: loading needs its code installed; not a payload",
        "unreadable" => "No pickle torch.load would unpickle could be read",
        _ => "An archive torch.load cannot read: its contents were not scanned",
    }
}

/// SARIF 2.1.0: one result per global at `needs-code` or above, per
/// ambiguity, and per file that could not be read or loaded; each with
/// the file, the record, and the byte offset (in the file when the record
/// lies there as it is, else in the record).
fn sarif(scans: &[FileScan], fail_on: Level) -> serde_json::Value {
    let severity = |level: Option<Level>| match level {
        Some(l) if l >= fail_on => "error",
        Some(Level::NeedsCode) | None => "note",
        _ => "warning",
    };
    let location = |file: &str, record: &str, offset: Option<u64>, record_offset: u64| {
        let mut physical = json!({ "artifactLocation": { "uri": file } });
        if let Some(o) = offset {
            physical["region"] = json!({ "byteOffset": o, "byteLength": 1 });
        }
        json!({
            "physicalLocation": physical,
            "logicalLocations": [{ "name": record, "fullyQualifiedName": format!("{record}+{record_offset:#x}") }],
        })
    };
    let mut results = Vec::new();
    for s in scans {
        for g in &s.globals {
            let level = Level::from_name(g.level);
            if level.is_none_or(|l| l < Level::NeedsCode) {
                continue;
            }
            let reach = if g.reachable {
                ""
            } else {
                " (a pickle torch.load does not read)"
            };
            results.push(json!({
                "ruleId": g.level,
                "level": severity(level),
                "message": { "text": format!("{} {} ({}) in {} at byte {:#x}{reach}", g.global, g.usage, g.class, g.pickle, g.offset) },
                "locations": [location(&s.file, &g.pickle, g.file_offset, g.offset)],
                "properties": {
                    "global": g.global, "use": g.usage, "class": g.class,
                    "record": g.pickle, "recordOffset": g.offset, "reachable": g.reachable,
                },
            }));
        }
        for e in &s.effects {
            results.push(json!({
                "ruleId": "dangerous",
                "level": severity(Some(Level::Dangerous)),
                "message": { "text": format!("{} at byte {:#x}: {} ({})", e.record, e.offset, e.what, e.danger) },
                "locations": [location(&s.file, &e.record, None, e.offset)],
                "properties": { "record": e.record, "recordOffset": e.offset, "danger": e.danger },
            }));
        }
        for a in &s.ambiguities {
            results.push(json!({
                "ruleId": "ambiguous",
                "level": severity(Some(Level::Ambiguous)),
                "message": { "text": format!("{} at byte {:#x}: {}", a.record, a.offset, a.what) },
                "locations": [location(&s.file, &a.record, None, a.offset)],
                "properties": { "record": a.record, "recordOffset": a.offset },
            }));
        }
        if matches!(s.verdict, "unreadable" | "not-loadable") {
            let what = s.error.clone().unwrap_or_default();
            results.push(json!({
                "ruleId": s.verdict,
                "level": if s.verdict == "unreadable" { "warning" } else { "note" },
                "message": { "text": what },
                "locations": [{ "physicalLocation": { "artifactLocation": { "uri": s.file } } }],
            }));
        }
    }
    let rules: Vec<serde_json::Value> = Level::ALL
        .iter()
        .rev()
        .filter(|l| **l > Level::Clean)
        .map(|l| l.name())
        .chain(["unreadable", "not-loadable"])
        .map(|id| json!({ "id": id, "shortDescription": { "text": rule_text(id) } }))
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "ptload",
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": "https://github.com/ptload/ptload",
                "rules": rules,
            }},
            "artifacts": scans.iter().map(|s| json!({ "location": { "uri": s.file } })).collect::<Vec<_>>(),
            "results": results,
        }],
    })
}
