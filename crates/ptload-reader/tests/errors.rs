//! What an engine branches on when an open fails: the file named, and
//! whether the file ended early (fetch it again) or is of another kind
//! (it will not change).

use std::path::{Path, PathBuf};

use ptload_reader::{Checkpoint, ErrorKind};

fn files() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files")
}

fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ptload-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_file_cut_short_says_so_and_other_files_do_not() {
    // torch.save's zip cut before its directory (an interrupted copy).
    let e = Checkpoint::open(files().join("truncated.pt")).expect_err("cut");
    assert!(e.is_truncated(), "{e}");
    assert_eq!(e.kind(), ErrorKind::NotACheckpoint);
    // A legacy file cut inside its pickles: the pickle runs out.
    let legacy = std::fs::read(files().join("legacy.pt")).unwrap();
    let cut = scratch("cut_legacy.pt", &legacy[..300]);
    let e = Checkpoint::open(&cut).expect_err("cut");
    assert!(e.is_truncated(), "{e}");
    // Files of another kind are not truncated: bytes that are no
    // checkpoint, a web page, a Git LFS pointer, an empty file.
    for name in [
        "random.bin",
        "download.html.pt",
        "lfs_pointer.pt",
        "empty.pt",
    ] {
        let e = Checkpoint::open(files().join(name)).expect_err(name);
        assert!(!e.is_truncated(), "{name}: {e}");
        assert_eq!(e.kind(), ErrorKind::NotACheckpoint, "{name}");
    }
}

#[test]
fn every_open_error_names_the_file() {
    for name in ["truncated.pt", "random.bin", "download.html.pt"] {
        let path = files().join(name);
        let e = Checkpoint::open(&path).expect_err(name);
        assert_eq!(e.file(), Some(path.display().to_string().as_str()), "{e}");
        assert!(e.to_string().contains(name), "{e}");
    }
    let missing = files().join("no-such-file.pt");
    let e = Checkpoint::open(&missing).expect_err("missing");
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.to_string().contains("no-such-file.pt"), "{e}");
}
