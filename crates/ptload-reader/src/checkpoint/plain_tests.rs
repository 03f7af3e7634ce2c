//! The plain state dict's shortcut (`torch/plain.rs`) against the general
//! machine: every fixture, damaged copies of some, and tight limits, each
//! opened both ways, must read alike, and scan alike (the scanner takes
//! the same shortcut).

use std::path::PathBuf;

use super::{Checkpoint, OpenOptions};
use crate::container::layout;
use crate::container::zip::{Archive, Headers};
use crate::limits::Limits;
use crate::torch::plain;

fn fixtures() -> Vec<(String, Vec<u8>)> {
    files_in("../../fixtures/files")
}

/// The files of `dir` (relative to the crate), sorted.
fn paths_in(dir: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn files_in(dir: &str) -> Vec<(String, Vec<u8>)> {
    paths_in(dir)
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("read"))
        })
        .collect()
}

/// Whether the shortcut reads the archive's pickle (not the general
/// machine).
fn shortcut_reads(bytes: &[u8]) -> bool {
    let limits = Limits::default();
    let Ok(archive) = Archive::parse(bytes, Headers::Map, &limits) else {
        return false;
    };
    let mut budget = u64::MAX;
    let Ok(records) = layout::torch_records(
        bytes.into(),
        &archive,
        &mut budget,
        crate::bytes::ByteOrder::Little,
    ) else {
        return false;
    };
    let entry = records.data_pkl;
    let Ok(pickle) = layout::record_bytes(bytes, entry, u64::MAX, &mut budget) else {
        return false;
    };
    let dir = format!("{}data/", records.prefix);
    let at = (entry.name, dir.as_str(), archive.entries().len());
    matches!(plain::read(&pickle, at, &limits, None), Ok(Some(_)))
        && records.constants_pkl.is_none()
}

/// Everything a reader sees of a checkpoint, as text.
fn seen(ckpt: &crate::error::Result<Checkpoint>) -> String {
    let ckpt = match ckpt {
        Ok(c) => c,
        Err(e) => return format!("error {:?}: {e}", e.kind()),
    };
    let mut out = format!(
        "{:?} {:?} {} {} end {}\n",
        ckpt.format(),
        ckpt.byte_order(),
        ckpt.pickle_protocol(),
        ckpt.len(),
        ckpt.end_offset()
    );
    for t in ckpt.tensors() {
        let data = t.data().map(|d| crc32fast::hash(&d));
        let by_name = ckpt.position(&t.info().name);
        out.push_str(&format!("{:?} {data:?} {by_name:?}\n", t.info()));
    }
    out.push_str(&format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n",
        ckpt.storages(),
        ckpt.globals(),
        ckpt.values(),
        ckpt.warnings()
    ));
    out
}

fn both(bytes: &[u8]) -> (String, String) {
    both_within(bytes, Limits::default())
}

/// What each reads of `bytes` within `limits`, the scan's report after
/// the open's.
fn both_within(bytes: &[u8], limits: Limits) -> (String, String) {
    let mut general = OpenOptions::new().limits(limits.clone());
    general.general_only = true;
    let fast = seen(
        &OpenOptions::new()
            .limits(limits.clone())
            .open_bytes(bytes.to_vec()),
    );
    let general = seen(&general.open_bytes(bytes.to_vec()));
    let (fast_scan, general_scan) = scans(bytes, &limits);
    (fast + &fast_scan, general + &general_scan)
}

/// The scanner's report of `bytes`, with the shortcut and without
/// (nothing without the scanner).
fn scans(bytes: &[u8], limits: &Limits) -> (String, String) {
    #[cfg(feature = "scan")]
    return (
        format!("{:?}", crate::scan::scan_bytes(bytes, limits)),
        format!("{:?}", crate::scan::scan_bytes_general(bytes, limits)),
    );
    #[cfg(not(feature = "scan"))]
    {
        let _ = (bytes, limits);
        (String::new(), String::new())
    }
}

/// Whether the scanner's report of `bytes` holds a pickle the shortcut
/// read (with it, the scan runs no general machine for that pickle: the
/// same report, made without a heap, is the only sign).
#[cfg(feature = "scan")]
fn scan_takes_shortcut(bytes: &[u8]) -> bool {
    let report = crate::scan::scan_bytes(bytes, &Limits::default());
    report.pickles.iter().any(|p| {
        let source = p.source.to_string();
        let Ok(archive) = Archive::parse(bytes, Headers::Map, &Limits::default()) else {
            return false;
        };
        archive.entries().iter().any(|e| {
            e.name == source
                && e.method == crate::container::zip::Method::Stored
                && bytes
                    .get(e.data_start as usize..(e.data_start + e.size) as usize)
                    .is_some_and(|pickle| {
                        matches!(
                            plain::read(pickle, (&source, "", 0), &Limits::default(), None),
                            Ok(Some(_))
                        )
                    })
        })
    })
}

#[test]
fn limits_refuse_alike_by_both() {
    let tight = [
        Limits::default().max_tensors(3),
        Limits::default().max_stack_depth(4),
        Limits::default().max_memo_entries(10),
        Limits::default().max_container_len(2),
        Limits::default().max_opcodes(50),
        Limits::default().max_objects(20),
        Limits::default().max_name_bytes(8),
        Limits::default().max_decoded_bytes(16),
        Limits::default().max_walk_steps(3),
        Limits::default().max_pickle_bytes(64),
    ];
    for name in ["many_tensors.pt", "hf_lm.pt", "views.pt"] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/files")
            .join(name);
        let bytes = std::fs::read(&path).expect("fixture");
        for limits in &tight {
            let (fast, general) = both_within(&bytes, limits.clone());
            assert_eq!(fast, general, "{name} within {limits:?}");
            assert!(
                fast.starts_with("error"),
                "{name} within {limits:?}: {fast}"
            );
        }
        // Limits a file may or may not reach (work below what the
        // shortcut runs with, views larger than their storage): the
        // general machine's answer, whichever it is.
        let maybe = [1, 2, 4, 15, 16]
            .map(|n| Limits::default().max_work_per_byte(n))
            .into_iter()
            .chain([Limits::default().max_expanded_view_bytes(0)]);
        for limits in maybe {
            let (fast, general) = both_within(&bytes, limits.clone());
            assert_eq!(fast, general, "{name} within {limits:?}");
        }
    }
}

#[test]
fn the_shortcut_reads_every_fixture_as_the_general_machine_does() {
    let mut read_by_shortcut = Vec::new();
    for (name, bytes) in fixtures() {
        let (fast, general) = both(&bytes);
        assert_eq!(fast, general, "{name}");
        if shortcut_reads(&bytes) {
            read_by_shortcut.push(name);
        }
    }
    // The plain state dicts among them: a dict of tensors, an
    // nn.Module's (with `_metadata`), views of shared storages, a
    // big-endian archive, a deflated one.
    let deflated: &[&str] = if cfg!(feature = "deflate") {
        &["deflated.pt"]
    } else {
        &[]
    };
    let plain = [
        "many_tensors.pt",
        "hf_lm.pt",
        "plain_model.pt",
        "views.pt",
        "bigendian.pt",
    ];
    for name in plain.iter().chain(deflated) {
        assert!(
            read_by_shortcut.iter().any(|n| n == name),
            "{name} not read by the shortcut: {read_by_shortcut:?}"
        );
    }
    // The rest are the general machine's: values beside the tensors,
    // nested dicts, other rebuilds, TorchScript, legacy files.
    for name in [
        "proto3.pt",
        "training.ckpt",
        "lightning.ckpt",
        "quantized.pt",
        "torchscript.pt",
        "legacy.pt",
    ] {
        assert!(!read_by_shortcut.iter().any(|n| n == name), "{name}");
    }
}

#[cfg(feature = "scan")]
#[test]
fn the_scanner_reports_every_scan_fixture_alike_both_ways() {
    // The scanner's corpus: payloads hidden in state dicts, benign files
    // of every kind, archives torch and other readers read differently.
    let mut shortcut = 0;
    for (name, bytes) in files_in("../../tests/scan") {
        let (fast, general) = scans(&bytes, &Limits::default());
        assert_eq!(fast, general, "{name}");
        shortcut += usize::from(scan_takes_shortcut(&bytes));
    }
    assert!(shortcut >= 10, "{shortcut}");
    // And the plain state dicts among the fixtures.
    for name in ["many_tensors.pt", "hf_lm.pt", "plain_model.pt", "views.pt"] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/files")
            .join(name);
        assert!(
            scan_takes_shortcut(&std::fs::read(path).expect("fixture")),
            "{name}"
        );
    }
}

/// The archive `bytes` with its pickle record's bytes changed by
/// `change`, its CRC fixed (so the change reaches the pickle readers).
fn with_pickle(bytes: &[u8], change: impl FnOnce(&mut [u8])) -> Option<Vec<u8>> {
    let limits = Limits::default();
    let archive = Archive::parse(bytes, Headers::Map, &limits).ok()?;
    let mut budget = u64::MAX;
    let records = layout::torch_records(
        bytes.into(),
        &archive,
        &mut budget,
        crate::bytes::ByteOrder::Little,
    )
    .ok()?;
    let entry = records.data_pkl;
    if entry.method != crate::container::zip::Method::Stored {
        return None;
    }
    let (start, len) = (entry.data_start as usize, entry.size as usize);
    let old_crc = entry.crc32.to_le_bytes();
    let local = entry.local as usize;
    let mut out = bytes.to_vec();
    change(out.get_mut(start..start + len)?);
    let new_crc = crc32fast::hash(out.get(start..start + len)?).to_le_bytes();
    out.get_mut(local + 14..local + 18)?
        .copy_from_slice(&new_crc);
    // The central directory's record of the same entry.
    let mut at = 0;
    while let Some(i) = out.get(at..)?.windows(4).position(|w| w == b"PK\x01\x02") {
        let rec = at + i;
        let crc_at = rec + 16;
        let offset = out
            .get(rec + 42..rec + 46)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize);
        if offset == Some(local) && out.get(crc_at..crc_at + 4) == Some(&old_crc[..]) {
            out.get_mut(crc_at..crc_at + 4)?.copy_from_slice(&new_crc);
        }
        at = rec + 4;
    }
    Some(out)
}

#[test]
fn damaged_pickles_read_alike_by_both() {
    // A deterministic generator: every run damages the same bytes.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut compared = 0;
    let mut differing_runs = 0;
    #[cfg(feature = "scan")]
    let mut scanned_by_shortcut = 0;
    for name in [
        "basic.pt",
        "plain_model.pt",
        "hf_lm.pt",
        "multi_gpu.pt",
        "views.pt",
    ] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/files")
            .join(name);
        let bytes = std::fs::read(&path).expect("fixture");
        assert!(shortcut_reads(&bytes), "{name}");
        for _ in 0..300 {
            let (a, b, c) = (next(), next(), next());
            let Some(damaged) = with_pickle(&bytes, |p| {
                let n = p.len();
                match a % 4 {
                    // One byte set to a value.
                    0 => p[(b as usize) % n] = c as u8,
                    // A byte plus or minus one (lengths, indices).
                    1 => {
                        let i = (b as usize) % n;
                        p[i] = p[i].wrapping_add(if c % 2 == 0 { 1 } else { 255 });
                    }
                    // Two bytes swapped.
                    2 => p.swap((b as usize) % n, (c as usize) % n),
                    // An opcode's neighbour copied over it.
                    _ => {
                        let i = (b as usize) % (n - 1);
                        p[i] = p[i + 1];
                    }
                }
            }) else {
                continue;
            };
            let (fast, general) = both(&damaged);
            assert_eq!(fast, general, "{name}, damaged");
            compared += 1;
            if shortcut_reads(&damaged) && !fast.starts_with("error") {
                differing_runs += 1;
            }
            #[cfg(feature = "scan")]
            {
                scanned_by_shortcut += usize::from(scan_takes_shortcut(&damaged));
            }
        }
    }
    assert_eq!(compared, 1500);
    // Some damaged files still take the shortcut (a changed number, a
    // name), so the comparison covers its checks, not only its giving up.
    assert!(differing_runs > 100, "{differing_runs}");
    #[cfg(feature = "scan")]
    assert!(scanned_by_shortcut > 100, "{scanned_by_shortcut}");
}

/// A mapped file opened with its scan, whose plain read of `data.pkl` the
/// decode then takes instead of reading it again, reads as it does
/// without a scan; and the scan keeps a read of every plain state dict
/// whose `data.pkl` is stored.
#[cfg(feature = "scan")]
#[test]
fn a_scanned_open_reads_as_one_without_a_scan() {
    let mut plain_files = 0;
    for path in paths_in("../../fixtures/files") {
        let name = path.display().to_string();
        let scanned = OpenOptions::new().scan(true).open(&path);
        let unscanned = OpenOptions::new().open(&path);
        assert_eq!(seen(&scanned), seen(&unscanned), "{name}");
        let bytes = std::fs::read(&path).expect("read");
        if shortcut_reads(&bytes) && data_pkl_stored(&bytes) {
            plain_files += 1;
            let source = crate::source::Source::map(&path).expect("map");
            let file = source.file().expect("a mapped file");
            let reads = crate::container::zip::KeptReads::new(file);
            let kept = plain::KeptPlain::default();
            crate::scan::scan_file_bytes(source.bytes(), &reads, Some(&kept), &Limits::default());
            assert!(kept.holds(), "{name}: the scan kept no read");
        }
    }
    assert!(plain_files >= 10, "{plain_files} plain state dicts");
}

/// Whether the archive's `data.pkl` is stored (a deflated one is read
/// into a buffer of its own: no read of it is kept).
#[cfg(feature = "scan")]
fn data_pkl_stored(bytes: &[u8]) -> bool {
    let limits = Limits::default();
    let Ok(archive) = Archive::parse(bytes, Headers::Map, &limits) else {
        return false;
    };
    layout::find_data_pkl(&archive).is_ok_and(|e| e.method == crate::container::zip::Method::Stored)
}

/// What the scan keeps is taken only for the same bytes of the map (not
/// equal bytes elsewhere) read with the same arguments, and only once.
#[test]
fn a_kept_plain_read_is_taken_only_for_the_same_bytes_and_arguments() {
    let file = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files/basic.pt"),
    )
    .expect("read");
    let limits = Limits::default();
    let archive = Archive::parse(file.as_slice(), Headers::Map, &limits).expect("zip");
    let mut budget = u64::MAX;
    let records = layout::torch_records(
        file.as_slice().into(),
        &archive,
        &mut budget,
        crate::bytes::ByteOrder::Little,
    )
    .expect("torch zip");
    let entry = records.data_pkl;
    let pickle = layout::record_bytes(file.as_slice(), entry, u64::MAX, &mut budget).expect("pkl");
    let dir = format!("{}data/", records.prefix);
    let at = (entry.name, dir.as_str(), archive.entries().len());
    let kept = plain::KeptPlain::default();
    let seen = kept
        .read_and_keep(&pickle, at, &limits, None)
        .expect("read");
    assert!(seen.is_some_and(|(globals, opcodes)| !globals.is_empty() && opcodes > 0));
    let copy = pickle.to_vec();
    assert!(kept.take(&copy, at).is_none(), "equal bytes elsewhere");
    assert!(kept
        .take(&pickle, (entry.name, "other/data/", at.2))
        .is_none());
    assert!(kept
        .take(&pickle, (entry.name, dir.as_str(), at.2 + 1))
        .is_none());
    let taken = kept
        .take(&pickle, at)
        .expect("the same bytes and arguments");
    let again = plain::read(&pickle, at, &limits, None)
        .expect("read")
        .expect("plain");
    assert_eq!(
        format!("{:?}", taken.tensors),
        format!("{:?}", again.tensors)
    );
    assert!(kept.take(&pickle, at).is_none(), "taken once");
}
