//! Checkpoints opened by ranged reads give what the local file gives,
//! having fetched only what parsing and the tensors read need.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ptload_reader::ranged::RangeRead;
use ptload_reader::{Checkpoint, OpenOptions};

fn files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files");
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

/// A file in memory, read by ranges; every range asked for is logged.
#[derive(Debug)]
struct Logged {
    bytes: Vec<u8>,
    reads: Mutex<Vec<(u64, u64)>>,
}

impl RangeRead for Logged {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        self.reads.lock().unwrap().push((offset, len));
        Ok(self.bytes[offset as usize..(offset + len) as usize].to_vec())
    }
    fn name(&self) -> &str {
        "memory://file"
    }
}

fn logged(bytes: Vec<u8>) -> Arc<Logged> {
    Arc::new(Logged {
        bytes,
        reads: Mutex::new(Vec::new()),
    })
}

/// Each tensor's name, dtype, shape and bytes (or why they cannot be read).
type Read = (String, String, Vec<u64>, Result<Vec<u8>, String>);

fn tensors(ckpt: &Checkpoint) -> Vec<Read> {
    ckpt.tensors()
        .map(|t| {
            let mut bytes = Vec::new();
            let read = t
                .visit_bytes(|b| bytes.extend_from_slice(b))
                .map(|()| bytes)
                .map_err(|e| e.to_string());
            (
                t.name().to_owned(),
                t.dtype().to_string(),
                t.shape().to_vec(),
                read,
            )
        })
        .collect()
}

#[test]
fn every_fixture_reads_alike_by_ranges() {
    let mut opened = 0;
    for path in files() {
        let name = path.display();
        let bytes = std::fs::read(&path).unwrap();
        let reader = logged(bytes.clone());
        let ranged = OpenOptions::new().open_ranged(reader.clone());
        let local = Checkpoint::open(&path);
        match (local, ranged) {
            (Ok(local), Ok(ranged)) => {
                opened += 1;
                assert_eq!(local.format(), ranged.format(), "{name}");
                assert_eq!(local.values(), ranged.values(), "{name}");
                assert_eq!(tensors(&local), tensors(&ranged), "{name}");
                let (fetched, _) = ranged.fetched_bytes().unwrap();
                let logged: u64 = reader.reads.lock().unwrap().iter().map(|r| r.1).sum();
                assert_eq!(fetched, logged, "{name}");
                // Every range is read once.
                let mut reads = reader.reads.lock().unwrap().clone();
                reads.sort_unstable();
                for pair in reads.windows(2) {
                    assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{name}: {reads:?}");
                }
            }
            (Err(local), Err(ranged)) => {
                assert_eq!(local.kind(), ranged.kind(), "{name}: {local} / {ranged}");
                assert_eq!(local.message(), ranged.message(), "{name}");
            }
            (local, ranged) => panic!(
                "{name}: local {:?}, ranged {:?}",
                local.map(|_| ()),
                ranged.map(|_| ())
            ),
        }
    }
    assert!(opened > 30, "{opened}");
}

/// The hostile corpus (tests/hostile) and the scanner's corpus
/// (tests/scan): by ranges, each file opens or fails as the local file
/// does, and scans alike.
#[test]
fn hostile_and_scan_corpora_read_alike_by_ranges() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests");
    let limits = ptload_reader::Limits::default();
    let (mut seen, mut flagged) = (0, 0);
    for dir in ["hostile", "scan"] {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        paths.sort();
        for path in paths {
            seen += 1;
            let name = path.display();
            let bytes = std::fs::read(&path).unwrap();
            let local = Checkpoint::from_bytes(bytes.clone());
            let ranged = OpenOptions::new().open_ranged(logged(bytes.clone()));
            // Scanned on a second thread while decoded (`inspect`'s way):
            // the same checkpoint, findings and errors.
            let scanned = OpenOptions::new().scan(true).open_bytes(bytes.clone());
            match (&local, &scanned) {
                (Ok(l), Ok(s)) => assert_eq!(tensors(l), tensors(s), "{name}"),
                (Err(l), Err(s)) => assert_eq!(l.to_string(), s.to_string(), "{name}"),
                _ => panic!("{name}: scanned while opened, it opened otherwise"),
            }
            match (local, ranged) {
                (Ok(local), Ok(ranged)) => {
                    assert_eq!(tensors(&local), tensors(&ranged), "{name}");
                    // What inspect lists as suspicious: scan's findings,
                    // fetched by ranges for the ranged file.
                    let found = |c: &Checkpoint| format!("{:?}", c.suspicious().unwrap());
                    assert_eq!(found(&local), found(&ranged), "{name}");
                    let scanned = scanned.expect("opened");
                    assert_eq!(found(&local), found(&scanned), "{name}");
                    flagged += usize::from(!local.suspicious().unwrap().is_empty());
                }
                (Err(local), Err(ranged)) => {
                    assert_eq!(local.kind(), ranged.kind(), "{name}: {local} / {ranged}");
                    assert_eq!(local.message(), ranged.message(), "{name}");
                }
                (local, ranged) => panic!(
                    "{name}: local {:?}, ranged {:?}",
                    local.map(|_| ()).map_err(|e| e.to_string()),
                    ranged.map(|_| ()).map_err(|e| e.to_string())
                ),
            }
            let here = ptload_reader::scan::scan_bytes(&bytes, &limits);
            let (there, _) = ptload_reader::scan::scan_ranged(logged(bytes), &limits).unwrap();
            assert_eq!(format!("{here:?}"), format!("{there:?}"), "{name}");
        }
    }
    assert!(seen > 150, "{seen}");
    // Payloads that open (inertly) and have findings: the comparison
    // above is not between two empty lists.
    assert!(flagged > 20, "{flagged}");
}

/// A zip checkpoint with a large record in the middle: opening it fetches
/// its head, its tail and the local headers, not the record.
#[test]
fn a_large_file_opens_from_a_few_ranges() {
    let base = std::fs::read(files().iter().find(|p| p.ends_with("basic.pt")).unwrap()).unwrap();
    let big = pad_zip(&base, 64 << 20);
    let local = Checkpoint::from_bytes(big.clone()).unwrap();
    let reader = logged(big.clone());
    let ranged = OpenOptions::new().open_ranged(reader.clone()).unwrap();
    let (fetched, requests) = ranged.fetched_bytes().unwrap();
    assert!(fetched < 1 << 20, "{fetched} bytes in {requests} reads");
    assert_eq!(tensors(&local), tensors(&ranged));
}

#[test]
fn a_legacy_file_reads_its_stream_then_its_storages() {
    let base = std::fs::read(files().iter().find(|p| p.ends_with("legacy.pt")).unwrap()).unwrap();
    let reader = logged(base.clone());
    let ranged = OpenOptions::new().open_ranged(reader.clone()).unwrap();
    let local = Checkpoint::from_bytes(base).unwrap();
    assert_eq!(tensors(&local), tensors(&ranged));
}

/// A limit on what opening may fetch is named when a file needs more.
#[test]
fn the_open_budget_is_enforced() {
    let base = std::fs::read(files().iter().find(|p| p.ends_with("basic.pt")).unwrap()).unwrap();
    let mut limits = ptload_reader::Limits::default();
    limits.max_open_fetch_bytes = 1000;
    let err = OpenOptions::new()
        .limits(limits)
        .open_ranged(logged(base))
        .unwrap_err();
    assert!(err.to_string().contains("max_open_fetch_bytes"), "{err}");
}

/// `zip` with a stored record of `pad` bytes inserted after its first
/// entry: every later offset moves, the directory says so.
fn pad_zip(zip: &[u8], pad: usize) -> Vec<u8> {
    let le16 = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
    let le32 = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    // The end record (no ZIP64 for this small file), then the directory.
    let eocd = (0..zip.len() - 21)
        .rev()
        .find(|&i| zip[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
        .unwrap();
    let (count, cd_size, cd_offset) = (
        le16(zip, eocd + 10),
        le32(zip, eocd + 12),
        le32(zip, eocd + 16),
    );
    let mut entries = Vec::new();
    let mut at = cd_offset;
    for _ in 0..count {
        let n = 46 + le16(zip, at + 28) + le16(zip, at + 30) + le16(zip, at + 32);
        entries.push(zip[at..at + n].to_vec());
        at += n;
    }
    assert_eq!(at, cd_offset + cd_size);
    let first_end = {
        let e = &entries[0];
        let local = le32(e, 42);
        local + 30 + le16(zip, local + 26) + le16(zip, local + 28) + le32(e, 20)
    };
    let name = b"archive/pad";
    let mut local = Vec::new();
    local.extend_from_slice(&[0x50, 0x4b, 0x03, 0x04, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    local.extend_from_slice(&0u32.to_le_bytes()); // CRC not computed
    local.extend_from_slice(&(pad as u32).to_le_bytes());
    local.extend_from_slice(&(pad as u32).to_le_bytes());
    local.extend_from_slice(&(name.len() as u16).to_le_bytes());
    local.extend_from_slice(&0u16.to_le_bytes());
    local.extend_from_slice(name);
    let shift = local.len() + pad;
    let mut out = zip[..first_end].to_vec();
    out.extend_from_slice(&local);
    out.resize(out.len() + pad, 0x5a);
    out.extend_from_slice(&zip[first_end..cd_offset]);
    let new_cd = out.len();
    let mut pad_central = vec![0x50, 0x4b, 0x01, 0x02, 20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    pad_central.extend_from_slice(&0u32.to_le_bytes());
    pad_central.extend_from_slice(&(pad as u32).to_le_bytes());
    pad_central.extend_from_slice(&(pad as u32).to_le_bytes());
    pad_central.extend_from_slice(&(name.len() as u16).to_le_bytes());
    pad_central.extend_from_slice(&[0; 8]);
    pad_central.extend_from_slice(&[0; 4]);
    pad_central.extend_from_slice(&(first_end as u32).to_le_bytes());
    pad_central.extend_from_slice(name);
    for (i, mut e) in entries.into_iter().enumerate() {
        if i > 0 {
            let local = le32(&e, 42) + shift;
            e[42..46].copy_from_slice(&(local as u32).to_le_bytes());
        }
        out.extend_from_slice(&e);
        if i == 0 {
            out.extend_from_slice(&pad_central);
        }
    }
    let cd_len = out.len() - new_cd;
    let mut end = zip[eocd..].to_vec();
    end[8..10].copy_from_slice(&((count + 1) as u16).to_le_bytes());
    end[10..12].copy_from_slice(&((count + 1) as u16).to_le_bytes());
    end[12..16].copy_from_slice(&(cd_len as u32).to_le_bytes());
    end[16..20].copy_from_slice(&(new_cd as u32).to_le_bytes());
    out.extend_from_slice(&end);
    out
}

#[test]
fn every_fixture_scans_alike_by_ranges() {
    let limits = ptload_reader::Limits::default();
    for path in files() {
        let bytes = std::fs::read(&path).unwrap();
        let local = ptload_reader::scan::scan_bytes(&bytes, &limits);
        let reader = logged(bytes);
        let (ranged, (fetched, _)) =
            ptload_reader::scan::scan_ranged(reader.clone(), &limits).unwrap();
        assert_eq!(
            format!("{local:?}"),
            format!("{ranged:?}"),
            "{}",
            path.display()
        );
        let logged: u64 = reader.reads.lock().unwrap().iter().map(|r| r.1).sum();
        assert_eq!(fetched, logged);
    }
}

/// Scanning a large zip fetches its directory and pickles, not its records.
#[test]
fn a_large_file_scans_from_a_few_ranges() {
    let base = std::fs::read(files().iter().find(|p| p.ends_with("basic.pt")).unwrap()).unwrap();
    let big = pad_zip(&base, 64 << 20);
    let limits = ptload_reader::Limits::default();
    let local = ptload_reader::scan::scan_bytes(&big, &limits);
    let (ranged, (fetched, _)) = ptload_reader::scan::scan_ranged(logged(big), &limits).unwrap();
    assert_eq!(format!("{local:?}"), format!("{ranged:?}"));
    assert!(fetched < 1 << 20, "{fetched}");
}

/// A legacy stream longer than the first fetch: the pickles run over the
/// bytes fetched from the start, and ask for more when they run out.
#[test]
fn a_long_legacy_stream_is_fetched_as_it_runs() {
    let mut file = vec![0x80, 0x02, 0x8a, 0x0a];
    file.extend_from_slice(&[0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19]);
    file.push(b'.');
    file.extend_from_slice(b"\x80\x02M\xe9\x03.");
    file.extend_from_slice(b"\x80\x02}.");
    let long = "x".repeat(3 << 20);
    file.extend_from_slice(b"\x80\x02}X\x04\x00\x00\x00noteX");
    file.extend_from_slice(&(long.len() as u32).to_le_bytes());
    file.extend_from_slice(long.as_bytes());
    file.extend_from_slice(b"s.");
    file.extend_from_slice(b"\x80\x02].");
    let local = Checkpoint::from_bytes(file.clone()).unwrap();
    let reader = logged(file.clone());
    let ranged = OpenOptions::new().open_ranged(reader.clone()).unwrap();
    assert_eq!(local.values(), ranged.values());
    assert_eq!(local.values().len(), 1);
    let (fetched, requests) = ranged.fetched_bytes().unwrap();
    assert_eq!(fetched, file.len() as u64);
    assert!(requests > 2, "{requests}");
    let limits = ptload_reader::Limits::default();
    let (scanned, _) = ptload_reader::scan::scan_ranged(logged(file.clone()), &limits).unwrap();
    let scanned_locally = ptload_reader::scan::scan_bytes(&file, &limits);
    assert_eq!(format!("{scanned:?}"), format!("{scanned_locally:?}"));
}

#[test]
fn every_fixture_reads_alike_by_positioned_reads() {
    let mut opened = 0;
    for path in files() {
        let name = path.display();
        let local = Checkpoint::open(&path);
        let pread = OpenOptions::new().positioned(true).open(&path);
        match (local, pread) {
            (Ok(local), Ok(pread)) => {
                opened += 1;
                assert!(!pread.is_mapped(), "{name}");
                assert_eq!(tensors(&local), tensors(&pread), "{name}");
                assert_eq!(local.values(), pread.values(), "{name}");
                let (read, _) = pread.fetched_bytes().expect("read by ranges");
                let len = std::fs::metadata(&path).unwrap().len();
                assert!(read <= len, "{name}: {read} bytes read of {len}");
            }
            (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind(), "{name}: {a} / {b}"),
            (a, b) => panic!(
                "{name}: mapped {:?}, positioned {:?}",
                a.map(|_| ()),
                b.map(|_| ())
            ),
        }
    }
    assert!(opened > 20, "only {opened} fixtures opened");
}

#[test]
fn positioned_reads_of_a_large_file_read_little_until_tensors_are_read() {
    let dir = tempdir();
    let path = dir.join("large.pt");
    let zip = std::fs::read(fixture("basic.pt")).unwrap();
    std::fs::write(&path, pad_zip(&zip, 64 << 20)).unwrap();
    let ckpt = OpenOptions::new().positioned(true).open(&path).unwrap();
    let (opened, _) = ckpt.fetched_bytes().unwrap();
    assert!(opened < 1 << 20, "opening read {opened} bytes");
    let mapped = Checkpoint::open(&path).unwrap();
    assert_eq!(tensors(&ckpt), tensors(&mapped));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A file cut short after opening gives an error naming it when a read
/// reaches past its new end, never SIGBUS or stale bytes.
#[test]
fn a_file_that_shrinks_under_positioned_reads_is_an_error() {
    use ptload_reader::ranged::LocalFile;
    let dir = tempdir();
    let path = dir.join("shrinks.pt");
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
    let file = LocalFile::open(&path).unwrap();
    assert_eq!(file.len(), 1 << 20);
    assert_eq!(file.read_at(1000, 10).unwrap(), vec![7; 10]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    assert_eq!(file.read_at(0, 4096).unwrap(), vec![7; 4096]);
    assert!(file.read_at(4000, 200).is_err());
    // Through a checkpoint: the reader names the file.
    let zip = std::fs::read(fixture("basic.pt")).unwrap();
    std::fs::write(&path, &zip).unwrap();
    let file = LocalFile::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    let err = OpenOptions::new()
        .open_ranged(Arc::new(file))
        .unwrap_err()
        .to_string();
    assert!(err.contains("shrinks.pt"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/files")
        .join(name)
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ptload-pread-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Storages far apart (`wide_storages.pt`: ten of 256 KiB): opening and scanning
/// by ranges fetch the head, the tail and each local header with a little
/// around it, never the storages between (a search for hidden headers or
/// a directory that did not parse yet must wait for the headers, not
/// fetch every byte).
#[test]
fn far_apart_storages_are_not_fetched_to_open_or_scan() {
    let bytes = std::fs::read(fixture("wide_storages.pt")).unwrap();
    let len = bytes.len() as u64;
    let reader = logged(bytes.clone());
    let ckpt = OpenOptions::new().open_ranged(reader.clone()).unwrap();
    let (opened, _) = ckpt.fetched_bytes().unwrap();
    // Head and tail (128 KiB each), then 4 KiB around each header.
    let bound = 2 * 128 * 1024 + 10 * 9 * 1024;
    assert!(opened < bound, "opening fetched {opened} of {len}");
    assert!(ckpt.suspicious().unwrap().is_empty());
    let (after_scan, _) = ckpt.fetched_bytes().unwrap();
    assert_eq!(after_scan, opened, "the scan fetched again");
    let (report, (scanned, _)) =
        ptload_reader::scan::scan_ranged(logged(bytes.clone()), &Default::default()).unwrap();
    assert!(scanned < bound, "scanning fetched {scanned} of {len}");
    assert_eq!(
        report.level(),
        ptload_reader::scan::scan_bytes(&bytes, &Default::default()).level()
    );
    let local = Checkpoint::from_bytes(bytes).unwrap();
    assert_eq!(tensors(&local), tensors(&ckpt));
}

/// A file read by ranges whose reads take a while, counting how many are
/// in flight at once.
#[derive(Debug)]
struct Slow {
    bytes: Vec<u8>,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    fail_from: Option<u64>,
}

impl RangeRead for Slow {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(30));
        self.now.fetch_sub(1, SeqCst);
        let tail = self.bytes.len() as u64 - 128 * 1024;
        if self.fail_from.is_some_and(|f| offset >= f && offset < tail) {
            return Err(std::io::Error::other("503 Service Unavailable"));
        }
        Ok(self.bytes[offset as usize..(offset + len) as usize].to_vec())
    }
    fn name(&self) -> &str {
        "slow://wide_storages.pt"
    }
}

/// The local headers a round misses are fetched several at once; a
/// failed one is the open's error, naming the file.
#[test]
fn scattered_ranges_are_fetched_several_at_once() {
    let bytes = std::fs::read(fixture("wide_storages.pt")).unwrap();
    let slow = |fail_from| {
        Arc::new(Slow {
            bytes: bytes.clone(),
            now: Default::default(),
            most: Default::default(),
            fail_from,
        })
    };
    let reader = slow(None);
    let ckpt = OpenOptions::new().open_ranged(reader.clone()).unwrap();
    let most = reader.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most > 1, "at most {most} in flight");
    let local = Checkpoint::from_bytes(bytes.clone()).unwrap();
    assert_eq!(tensors(&local), tensors(&ckpt));
    // Past the head and before the tail: a local header's read fails.
    let err = OpenOptions::new()
        .open_ranged(slow(Some(300_000)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("slow://wide_storages.pt") && err.contains("503"),
        "{err}"
    );
}
/// A tensor-parallel rank's slices of a file read by ranges fetch their
/// own bytes: after opening, what rank 0 of 2 reads of llama_wide.pt
/// (its half of the embeddings and lm_head, which hold most of the file)
/// costs about its slices' bytes, never a sliced storage whole; the
/// elements are the local file's.
#[test]
fn a_ranks_slices_fetch_their_ranges_only() {
    use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
    use ptload_reader::tp::{Shard, Splits};
    let path = files()
        .into_iter()
        .find(|p| p.ends_with("llama_wide.pt"))
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let size = bytes.len() as u64;
    let local = Checkpoint::open(&path).unwrap();
    let reader = logged(bytes);
    let ranged = OpenOptions::new().open_ranged(reader.clone()).unwrap();
    let (opened, _) = ranged.fetched_bytes().unwrap();
    for rank in 0..2 {
        let opts = StateDictOptions {
            key: KeySelect::All,
            strip: Strip::None,
            parallel: Some((
                Shard::new(rank, 2).unwrap(),
                Splits::preset("llama").unwrap(),
            )),
            ..Default::default()
        };
        let (here, there) = (opts.select(&local).unwrap(), opts.select(&ranged).unwrap());
        let (before, _) = ranged.fetched_bytes().unwrap();
        let mut slices = 0;
        for (a, b) in here.iter().zip(there.iter()) {
            let (a, b) = (here.view(a).unwrap(), there.view(b).unwrap());
            assert_eq!(a.data().unwrap(), b.data().unwrap(), "{}", a.name());
            slices += b.info().nbytes;
        }
        let (after, _) = ranged.fetched_bytes().unwrap();
        let read = after - before;
        // o_proj and down_proj are split on dim 1: their rows lie close
        // together, so the span covering a rank's halves is read (64 KiB
        // at most here), and the small norms are fetched whole.
        assert!(
            read >= slices / 2 && read <= slices + (64 << 10),
            "rank {rank}: {read} for {slices}"
        );
        assert!(
            (opened + read) * 10 < size * 6,
            "rank {rank}: {opened} + {read} of {size}"
        );
        let embed = ranged.tensor("model.embed_tokens.weight").unwrap();
        let whole = embed.info().nbytes;
        assert!(
            reader.reads.lock().unwrap().iter().all(|r| r.1 < whole),
            "a sliced storage was fetched whole"
        );
    }
}

/// A file in memory whose reads are recorded with how many were in flight
/// at once. Until a second read is in flight each read waits for one (a
/// few seconds at most) once `company` is set, so a prefetch that keeps
/// one request at a time shows a most-in-flight of 1 rather than passing
/// by chance. Reads that reach past `fail_from` fail.
#[derive(Debug)]
struct Concurrent {
    bytes: Vec<u8>,
    /// Every read asked for, and those answered.
    reads: Mutex<Vec<(u64, u64)>>,
    delivered: Mutex<Vec<(u64, u64)>>,
    state: Mutex<(usize, usize)>,
    changed: std::sync::Condvar,
    fail_from: std::sync::atomic::AtomicU64,
    /// Set: a read waits for a second one to be in flight.
    company: std::sync::atomic::AtomicBool,
}

impl Concurrent {
    fn new(bytes: Vec<u8>) -> Arc<Concurrent> {
        Arc::new(Concurrent {
            bytes,
            reads: Mutex::new(Vec::new()),
            delivered: Mutex::new(Vec::new()),
            state: Mutex::new((0, 0)),
            changed: std::sync::Condvar::new(),
            fail_from: std::sync::atomic::AtomicU64::new(u64::MAX),
            company: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn most_in_flight(&self) -> usize {
        self.state.lock().unwrap().1
    }
}

impl RangeRead for Concurrent {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        self.reads.lock().unwrap().push((offset, len));
        {
            let mut state = self.state.lock().unwrap();
            state.0 += 1;
            state.1 = state.1.max(state.0);
            self.changed.notify_all();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while state.1 < 2 && self.company.load(std::sync::atomic::Ordering::SeqCst) {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                state = self.changed.wait_timeout(state, left).unwrap().0;
            }
        }
        let fail = offset + len > self.fail_from.load(std::sync::atomic::Ordering::SeqCst);
        self.state.lock().unwrap().0 -= 1;
        if fail {
            return Err(std::io::Error::other("503 Service Unavailable"));
        }
        self.delivered.lock().unwrap().push((offset, len));
        Ok(self.bytes[offset as usize..(offset + len) as usize].to_vec())
    }
    fn name(&self) -> &str {
        "memory://wide_storages.pt"
    }
}

/// Storages of 256 KiB, more than opening fetches (written by torch).
fn wide_storages() -> (PathBuf, Vec<u8>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files/wide_storages.pt");
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

/// Small requests (a storage each), so a fixture of a few megabytes
/// makes several.
fn small_requests() -> OpenOptions {
    let mut limits = ptload_reader::Limits::default();
    limits.max_fetches_in_flight = 4;
    limits.max_fetch_request_bytes = 256 << 10;
    OpenOptions::new().limits(limits)
}

/// No two reads of `reads` overlap.
fn each_byte_once(reads: &[(u64, u64)]) {
    let mut reads = reads.to_vec();
    reads.sort_unstable();
    for pair in reads.windows(2) {
        assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{reads:?}");
    }
}

#[test]
fn a_prefetch_keeps_several_requests_in_flight_and_reads_each_byte_once() {
    let (path, bytes) = wide_storages();
    let reader = Concurrent::new(bytes);
    let ranged = small_requests().open_ranged(reader.clone()).unwrap();
    let local = Checkpoint::open(&path).unwrap();
    let opened = reader.reads.lock().unwrap().len();
    let all: Vec<usize> = (0..ranged.storages().len()).collect();
    assert_eq!(all.len(), 10);
    reader
        .company
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let fetched = ranged.prefetch(&all, None).unwrap();
    let requests = reader.reads.lock().unwrap().len() - opened;
    assert!(requests >= 4, "{requests} requests");
    assert!(reader.most_in_flight() > 1, "{}", reader.most_in_flight());
    assert!(fetched > 1 << 20, "{fetched}");
    assert_eq!(
        ranged.fetched_bytes().unwrap().0,
        reader
            .reads
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.1)
            .sum::<u64>()
    );
    // Everything read after is a hit: no further request, the local bytes.
    for i in all {
        assert_eq!(
            ranged.storage_bytes(i).unwrap(),
            local.storage_bytes(i).unwrap(),
            "storage {i}"
        );
    }
    assert_eq!(reader.reads.lock().unwrap().len(), opened + requests);
    assert_eq!(tensors(&local), tensors(&ranged));
    each_byte_once(&reader.delivered.lock().unwrap());
    // A second prefetch has nothing left to fetch.
    assert_eq!(ranged.prefetch(&[0, 1, 2], None).unwrap(), 0);
}

/// A tensor larger than one request, which its reader streams in pieces,
/// is not fetched whole again by a read-ahead that comes after it (it
/// was, for storages between one request and the read-ahead's window).
#[test]
fn a_storage_streamed_in_pieces_is_not_fetched_again_by_a_read_ahead() {
    let path = fixture("llama_wide.pt");
    let reader = Concurrent::new(std::fs::read(&path).unwrap());
    let mut limits = ptload_reader::Limits::default();
    limits.max_fetches_in_flight = 4;
    limits.max_fetch_request_bytes = 1 << 20;
    let ranged = OpenOptions::new()
        .limits(limits)
        .open_ranged(reader.clone())
        .unwrap();
    let local = Checkpoint::open(&path).unwrap();
    // Two tensors of 3.9 MiB: over one request, within the window.
    let mut streamed = 0;
    for t in ranged.tensors().filter(|t| t.info().nbytes > 1 << 20) {
        let mut got = Vec::new();
        t.visit_bytes(|b| got.extend_from_slice(b)).unwrap();
        let want = local.tensors().find(|l| l.name() == t.name()).unwrap();
        assert_eq!(got, want.data().unwrap().as_ref(), "{}", t.name());
        streamed += 1;
    }
    assert_eq!(streamed, 2);
    let big: Vec<usize> = ranged
        .tensors()
        .filter(|t| t.info().nbytes > 1 << 20)
        .filter_map(|t| t.info().storage)
        .collect();
    // Nothing left for a read-ahead of them to fetch. (Were they fetched
    // again, nobody would take them: the read-ahead would wait for room
    // until stopped.)
    let stop = std::sync::atomic::AtomicBool::new(false);
    let done = std::sync::atomic::AtomicBool::new(false);
    let fetched = std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..500 {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let n = ranged.read_ahead(&big, Some(&stop)).unwrap();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        n
    });
    assert_eq!(fetched, 0);
    each_byte_once(&reader.delivered.lock().unwrap());
    assert_eq!(tensors(&local), tensors(&ranged));
}

#[test]
fn readers_beside_a_prefetch_wait_for_its_bytes_instead_of_fetching_them_again() {
    let (path, bytes) = wide_storages();
    let reader = Concurrent::new(bytes);
    let ranged = small_requests().open_ranged(reader.clone()).unwrap();
    let local = Checkpoint::open(&path).unwrap();
    let all: Vec<usize> = (0..ranged.storages().len()).collect();
    std::thread::scope(|s| {
        s.spawn(|| ranged.prefetch(&all, None).unwrap());
        // Read from the end, against the prefetch's order: some storages
        // are fetched here, the others waited for.
        for &i in all.iter().rev() {
            assert_eq!(
                ranged.storage_bytes(i).unwrap(),
                local.storage_bytes(i).unwrap(),
                "storage {i}"
            );
        }
    });
    each_byte_once(&reader.delivered.lock().unwrap());
    assert_eq!(tensors(&local), tensors(&ranged));
}

#[test]
fn a_failed_request_of_a_prefetch_is_an_error_naming_the_file() {
    let (path, bytes) = wide_storages();
    let half = bytes.len() as u64 / 2;
    let reader = Concurrent::new(bytes);
    let ranged = small_requests().open_ranged(reader.clone()).unwrap();
    let local = Checkpoint::open(&path).unwrap();
    reader
        .fail_from
        .store(half, std::sync::atomic::Ordering::SeqCst);
    let all: Vec<usize> = (0..ranged.storages().len()).collect();
    // Readers waiting for the failing requests get an error, not a hang:
    // they read once the prefetch made its first request (it claimed
    // every storage before that).
    let opened = reader.reads.lock().unwrap().len();
    let (prefetched, read) = std::thread::scope(|s| {
        let ahead = s.spawn(|| ranged.prefetch(&all, None));
        while reader.reads.lock().unwrap().len() == opened && !ahead.is_finished() {
            std::thread::yield_now();
        }
        let read: Vec<_> = all
            .iter()
            .map(|&i| ranged.storage_bytes(i).map(<[u8]>::to_vec))
            .collect();
        (ahead.join().unwrap(), read)
    });
    let err = prefetched.unwrap_err().to_string();
    assert!(err.contains("memory://wide_storages.pt"), "{err}");
    assert!(err.contains("503 Service Unavailable"), "{err}");
    let mut failed = 0;
    for (i, r) in read.iter().enumerate() {
        let s = &ranged.storages()[i];
        match r {
            Ok(b) => assert_eq!(&b[..], local.storage_bytes(i).unwrap(), "storage {i}"),
            Err(e) => {
                failed += 1;
                assert!(
                    s.file_offset.unwrap() + s.nbytes > half - (256 << 10),
                    "storage {i}: {e}"
                );
                assert!(e.to_string().contains("memory://wide_storages.pt"), "{e}");
            }
        }
    }
    assert!(failed > 0);
    // Once the server recovers, what failed is fetched when read.
    reader
        .fail_from
        .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
    for &i in &all {
        assert_eq!(
            ranged.storage_bytes(i).unwrap(),
            local.storage_bytes(i).unwrap(),
            "storage {i}"
        );
    }
    each_byte_once(&reader.delivered.lock().unwrap());
}

#[test]
fn a_stopped_prefetch_starts_no_request_and_leaves_nothing_claimed() {
    let (path, bytes) = wide_storages();
    let reader = Concurrent::new(bytes);
    let ranged = small_requests().open_ranged(reader.clone()).unwrap();
    let local = Checkpoint::open(&path).unwrap();
    let opened = reader.reads.lock().unwrap().len();
    let all: Vec<usize> = (0..ranged.storages().len()).collect();
    let stop = std::sync::atomic::AtomicBool::new(true);
    assert_eq!(ranged.prefetch(&all, Some(&stop)).unwrap(), 0);
    assert_eq!(reader.reads.lock().unwrap().len(), opened);
    // Read afterwards, each storage is fetched then (none waits for a
    // claim left behind), each byte once.
    for &i in &all {
        assert_eq!(
            ranged.storage_bytes(i).unwrap(),
            local.storage_bytes(i).unwrap(),
            "storage {i}"
        );
    }
    each_byte_once(&reader.delivered.lock().unwrap());
    // A local file has nothing to fetch.
    assert_eq!(local.prefetch(&all, None).unwrap(), 0);
}

/// A reader that panics on its first read past the file's first 256 KiB
/// (after opening), then reads normally.
#[derive(Debug)]
struct PanicsOnce {
    bytes: Vec<u8>,
    armed: std::sync::atomic::AtomicBool,
}

impl RangeRead for PanicsOnce {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        let tail = self.bytes.len() as u64 - 128 * 1024;
        if offset >= 256 * 1024
            && offset < tail
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("the store's client panicked");
        }
        Ok(self.bytes[offset as usize..(offset + len) as usize].to_vec())
    }
    fn name(&self) -> &str {
        "panics://wide_storages.pt"
    }
}

/// A fetch that panics releases its claims while unwinding: reading the
/// storages afterwards fetches them, it does not wait for ever.
#[test]
fn a_panicking_fetch_leaves_no_claim_behind() {
    let bytes = std::fs::read(fixture("wide_storages.pt")).unwrap();
    let reader = Arc::new(PanicsOnce {
        bytes: bytes.clone(),
        armed: std::sync::atomic::AtomicBool::new(false),
    });
    let ckpt = OpenOptions::new().open_ranged(reader.clone()).unwrap();
    reader
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let all: Vec<usize> = (0..ckpt.storages().len()).collect();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = ckpt.prefetch(&all, None);
    }));
    assert!(panicked.is_err(), "the reader's panic comes through");
    // The same from a single read.
    reader
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let last = ckpt.tensors().count() - 1;
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = ckpt.tensor_at(last).unwrap().data();
    }));
    assert!(panicked.is_err() || !reader.armed.load(std::sync::atomic::Ordering::SeqCst));
    let local = Checkpoint::from_bytes(bytes).unwrap();
    assert_eq!(tensors(&local), tensors(&ckpt));
}
