//! `ptload convert` never loses a user's data: it refuses to write over
//! its input (by any path, link or hard link), follows symbolic links to
//! their target, replaces an existing file only with `--force`, streams to
//! standard output with `-`, and leaves no partial file behind on an error
//! or an interrupt.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/files")
        .join(name)
}

fn ptload(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ptload"))
        .args(args)
        .output()
        .expect("run ptload")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh directory for one test, removed when the test ends (pass or
/// fail).
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("ptload-output-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    TempDir(dir)
}

/// A copy of basic.pt in `dir`, and its bytes.
fn input_in(dir: &Path) -> (PathBuf, Vec<u8>) {
    let bytes = std::fs::read(fixture("basic.pt")).expect("fixture");
    let path = dir.join("model.pt");
    std::fs::write(&path, &bytes).expect("copy");
    (path, bytes)
}

/// Files in `dir` whose name marks a partial write.
fn partial_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("ptload-partial"))
        .collect()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn the_input_is_never_the_output() {
    let dir = temp_dir("same");
    let (input, bytes) = input_in(&dir);
    let symlink = dir.join("link.safetensors");
    std::os::unix::fs::symlink(&input, &symlink).expect("symlink");
    let hardlink = dir.join("hard.safetensors");
    std::fs::hard_link(&input, &hardlink).expect("hard link");
    let dotted = dir.join(".").join("model.pt");
    for output in [&input, &symlink, &hardlink, &dotted] {
        for (force, pread) in [(false, false), (true, false), (true, true)] {
            let mut args = vec!["convert", s(&input), s(output)];
            if force {
                args.push("--force");
            }
            if pread {
                args.push("--pread");
            }
            let out = ptload(&args);
            assert_eq!(out.status.code(), Some(2), "{output:?}: {}", stderr(&out));
            assert!(
                stderr(&out).contains("is the checkpoint being read"),
                "{output:?}: {}",
                stderr(&out)
            );
            assert_eq!(std::fs::read(&input).expect("input"), bytes, "{output:?}");
        }
    }
    assert!(partial_files(&dir).is_empty(), "{:?}", partial_files(&dir));
}

#[test]
fn an_existing_file_is_replaced_only_with_force() {
    let dir = temp_dir("exists");
    let (input, _) = input_in(&dir);
    let output = dir.join("out.safetensors");
    std::fs::write(&output, b"keep me").expect("write");
    let out = ptload(&["convert", s(&input), s(&output)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&output).expect("output"), b"keep me");

    let out = ptload(&["convert", s(&input), s(&output), "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let written = std::fs::read(&output).expect("output");
    let st = safetensors::SafeTensors::deserialize(&written).expect("safetensors");
    assert!(!st.names().is_empty());
    assert!(partial_files(&dir).is_empty());
}

#[test]
fn a_symbolic_link_is_written_through_to_its_target() {
    let dir = temp_dir("symlink");
    let (input, _) = input_in(&dir);
    let target = dir.join("real.safetensors");
    let link = dir.join("link.safetensors");
    std::os::unix::fs::symlink("real.safetensors", &link).expect("symlink");
    // The target does not exist yet: it is created, the link stays.
    let out = ptload(&["convert", s(&input), s(&link)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(std::fs::symlink_metadata(&link)
        .expect("link")
        .file_type()
        .is_symlink());
    let written = std::fs::read(&target).expect("target written");
    safetensors::SafeTensors::deserialize(&written).expect("safetensors");
    // Now it exists: the same rules as for a plain path.
    let out = ptload(&["convert", s(&input), s(&link)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    let out = ptload(&["convert", s(&input), s(&link), "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(std::fs::symlink_metadata(&link)
        .expect("link")
        .file_type()
        .is_symlink());
    assert!(partial_files(&dir).is_empty());
}

#[test]
fn only_regular_files_are_written() {
    let dir = temp_dir("special");
    let (input, _) = input_in(&dir);
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).expect("dir");
    for output in [sub.as_path(), Path::new("/dev/null")] {
        let out = ptload(&["convert", s(&input), s(output), "--force"]);
        assert_eq!(out.status.code(), Some(2), "{output:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not a regular file"),
            "{output:?}: {}",
            stderr(&out)
        );
    }
    assert!(std::fs::symlink_metadata("/dev/null")
        .expect("/dev/null")
        .file_type()
        .is_char_device_like());
    assert!(partial_files(&dir).is_empty());
}

trait CharDevice {
    fn is_char_device_like(&self) -> bool;
}

impl CharDevice for std::fs::FileType {
    fn is_char_device_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_char_device()
    }
}

#[test]
fn dash_streams_to_standard_output() {
    let dir = temp_dir("stdout");
    let (input, _) = input_in(&dir);
    let file = dir.join("file.safetensors");
    let out = ptload(&["convert", s(&input), s(&file)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let streamed = ptload(&["convert", s(&input), "-"]);
    assert_eq!(streamed.status.code(), Some(0), "{}", stderr(&streamed));
    assert_eq!(streamed.stdout, std::fs::read(&file).expect("file"));
    assert!(
        stderr(&streamed).contains("wrote -"),
        "{}",
        stderr(&streamed)
    );
}

#[test]
fn a_failed_conversion_leaves_nothing() {
    let dir = temp_dir("failed");
    let input = fixture("dtypes.pt");
    let output = dir.join("out.safetensors");
    // complex128 has no safetensors dtype: the write fails part-way.
    let out = ptload(&["convert", s(&input), s(&output)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!output.exists());
    assert!(partial_files(&dir).is_empty(), "{:?}", partial_files(&dir));
}

/// A zip checkpoint of `n` float32 tensors of `numel` elements each.
fn many_tensors(path: &Path, n: usize, numel: usize) {
    use std::io::Write as _;
    let mut pickle = b"\x80\x02}(".to_vec();
    for i in 0..n {
        let name = format!("t{i}");
        let key = format!("{i}");
        pickle.push(b'X');
        pickle.extend_from_slice(&(name.len() as u32).to_le_bytes());
        pickle.extend_from_slice(name.as_bytes());
        pickle.extend_from_slice(
            b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n",
        );
        pickle.push(b'X');
        pickle.extend_from_slice(&(key.len() as u32).to_le_bytes());
        pickle.extend_from_slice(key.as_bytes());
        pickle.extend_from_slice(b"X\x03\x00\x00\x00cpuJ");
        pickle.extend_from_slice(&(numel as i32).to_le_bytes());
        pickle.extend_from_slice(b"tQK\x00J");
        pickle.extend_from_slice(&(numel as i32).to_le_bytes());
        pickle.extend_from_slice(b"\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR");
    }
    pickle.extend_from_slice(b"u.");
    let file = std::fs::File::create(path).expect("create");
    let mut zip = zip::ZipWriter::new(file);
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("m/data.pkl", stored).expect("entry");
    zip.write_all(&pickle).expect("write");
    let data: Vec<u8> = (0..numel).flat_map(|i| (i as f32).to_le_bytes()).collect();
    for i in 0..n {
        zip.start_file(format!("m/data/{i}"), stored)
            .expect("entry");
        zip.write_all(&data).expect("write");
    }
    zip.finish().expect("finish");
}

#[test]
fn an_interrupt_removes_the_partial_file() {
    let dir = temp_dir("interrupt");
    let input = dir.join("big.pt");
    many_tensors(&input, 256, 1 << 16);
    let output = dir.join("out.safetensors");
    // Converting to bf16 in a debug build is slow enough to interrupt:
    // wait until the partial file exists, then send SIGINT.
    let mut child = Command::new(env!("CARGO_BIN_EXE_ptload"))
        .args(["convert", s(&input), s(&output), "--dtype", "bf16"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Polled until the partial file appears or the child ends; a child
    // that neither makes it nor ends stops the test after 120,000 polls
    // (two minutes at least: a hang, never a slow machine).
    let mut polls = 0u32;
    while partial_files(&dir).is_empty() {
        polls += 1;
        assert!(polls < 120_000, "no partial file appeared");
        assert!(
            child.try_wait().expect("wait").is_none(),
            "finished too early"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("cancelled"), "{}", stderr(&out));
    assert!(!output.exists(), "a complete output after an interrupt");
    assert!(partial_files(&dir).is_empty(), "{:?}", partial_files(&dir));
}

#[test]
fn a_replaced_input_is_not_read_by_path() {
    // The kernel copy reads through the handle the checkpoint holds: a file
    // moved over the input's path meanwhile changes nothing.
    let dir = temp_dir("replaced");
    let (input, _) = input_in(&dir);
    let ckpt = ptload_reader::Checkpoint::open(&input).expect("open");
    let other = dir.join("other.pt");
    std::fs::write(&other, vec![0x55u8; 4096]).expect("other");
    std::fs::rename(&other, &input).expect("replace");
    let selection = ptload_reader::state_dict::StateDictOptions::default()
        .select(&ckpt)
        .expect("select");
    let output = dir.join("out.safetensors");
    ptload_reader::export::Export::state_dict(&selection, &Default::default())
        .to_file(&output)
        .expect("write");
    let written = std::fs::read(&output).expect("output");
    let st = safetensors::SafeTensors::deserialize(&written).expect("safetensors");
    for t in ckpt.tensors() {
        let view = st.tensor(t.name()).expect("tensor");
        assert_eq!(view.data(), &*t.data().expect("data"), "{}", t.name());
    }
}

#[test]
fn no_mmap_reads_the_same() {
    for name in ["basic.pt", "legacy.pt", "bigendian.pt"] {
        let path = fixture(name);
        let mapped = ptload(&["inspect", "--json", "--hash", s(&path)]);
        let read = ptload(&["inspect", "--json", "--hash", "--no-mmap", s(&path)]);
        assert_eq!(mapped.status.code(), Some(0), "{name}: {}", stderr(&mapped));
        assert_eq!(mapped.stdout, read.stdout, "{name}");
    }
}

/// `--pread` reads by positioned reads what a map gives, and says how
/// much it read; `scan --pread` gives the mapped verdict.
#[test]
fn positioned_reads_read_the_same() {
    let without_fetched = |o: &Output| {
        let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let fetched = v.as_object_mut().and_then(|m| m.remove("fetched"));
        (v, fetched)
    };
    for name in ["basic.pt", "legacy.pt", "bigendian.pt", "many_tensors.pt"] {
        let path = fixture(name);
        let mapped = ptload(&["inspect", "--json", "--hash", s(&path)]);
        let pread = ptload(&["inspect", "--json", "--hash", "--pread", s(&path)]);
        assert_eq!(mapped.status.code(), Some(0), "{name}: {}", stderr(&mapped));
        assert_eq!(pread.status.code(), Some(0), "{name}: {}", stderr(&pread));
        let (mapped, none) = without_fetched(&mapped);
        let (pread, fetched) = without_fetched(&pread);
        assert_eq!(mapped, pread, "{name}");
        assert!(none.is_none(), "{name}");
        let read = fetched.expect("bytes read")["bytes"]
            .as_u64()
            .expect("bytes");
        let len = std::fs::metadata(&path).expect("size").len();
        assert!(read > 0 && read <= len, "{name}: {read} of {len}");
        let scans: Vec<_> = [&["scan", "--json"][..], &["scan", "--json", "--pread"][..]]
            .iter()
            .map(|a| {
                let mut args = a.to_vec();
                args.push(s(&path));
                let o = ptload(&args);
                let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
                (o.status.code(), v["files"][0]["level"].clone())
            })
            .collect();
        assert_eq!(scans[0], scans[1], "{name}");
    }
    let both = ptload(&["inspect", "--pread", "--no-mmap", s(&fixture("basic.pt"))]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
}
