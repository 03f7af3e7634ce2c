//! Checkpoints in object storage against a real S3 server (`s3s-fs`, an
//! S3 server over a local folder) on loopback: what is read equals the
//! local file, and an object replaced between opening and reading a
//! tensor is an error, never the new object's bytes.
//!
//! Needs s3s-fs: `.ci/run` installs it and runs these tests with
//! `PTLOAD_S3S` set to its binary and `--ignored`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use ptload_reader::OpenOptions;
use sha2::{Digest, Sha256};

/// A file of `fixtures/bucket/`.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/bucket")
        .join(name)
}

const KEY: &str = "ptloadtestkey";
const SECRET: &str = "ptloadtestsecret";

/// s3s-fs on a loopback port over a folder of its own (bucket `bucket`);
/// stopped, and its folder removed, on drop.
struct S3 {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl S3 {
    fn start(name: &str) -> S3 {
        let bin = std::env::var("PTLOAD_S3S")
            .expect("PTLOAD_S3S: the s3s-fs binary these tests run (.ci/run sets it)");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("s3s-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bucket")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", KEY, "--secret-key", SECRET])
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{bin}: {e}"));
        let server = S3 { child, dir, port };
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("s3s-fs did not start on port {port}");
    }

    fn bucket(&self) -> PathBuf {
        self.dir.join("bucket")
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
#[ignore = "needs s3s-fs: .ci/run sets PTLOAD_S3S and runs it with --ignored"]
fn an_object_replaced_after_opening_is_an_error_never_other_bytes() {
    let s3 = S3::start("replaced");
    // The only test in this binary: the environment is the store's
    // configuration, read when an object is opened.
    for var in ["AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION"] {
        std::env::remove_var(var);
    }
    std::env::set_var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", s3.port));
    std::env::set_var("AWS_ALLOW_HTTP", "true");
    std::env::set_var("AWS_REGION", "us-east-1");
    std::env::set_var("AWS_ACCESS_KEY_ID", KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);

    // A file larger than what opening fetches (its first and last
    // 128 KiB), so that reading its tensor makes a request of its own.
    let object = s3.bucket().join("model.pt");
    let original = std::fs::read(fixture("wide.pt")).unwrap();
    std::fs::write(&object, &original).unwrap();
    let url = "s3://bucket/model.pt";
    let answers: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("wide.pt.json")).unwrap()).unwrap();
    let name = answers["tensors"][0]["name"].as_str().unwrap().to_owned();
    let torch_sha = answers["tensors"][0]["sha256"].as_str().unwrap();

    // Read as it is: torch's answer.
    let there = OpenOptions::new().open_url(url).unwrap();
    let tensor = there.tensor(&name).unwrap();
    let want = tensor.data().unwrap().into_owned();
    assert_eq!(hex::encode(Sha256::digest(&want)), torch_sha);
    let at = tensor.storage().and_then(|s| s.file_offset).unwrap() as usize;
    assert_eq!(original[at..at + want.len()], want[..]);

    // Opened, then replaced: the same length, one byte of the tensor's
    // storage other.
    let opened = OpenOptions::new().open_url(url).unwrap();
    let (before, _) = opened.fetched_bytes().unwrap();
    assert!(before < original.len() as u64, "opening fetched {before}");
    let mut other = original.clone();
    other[at + want.len() / 2] ^= 0x40;
    std::fs::write(&object, &other).unwrap();
    let err = match opened.tensor(&name).unwrap().data() {
        Ok(read) => panic!("{} bytes of another object read", read.len()),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(text.contains("changed"), "{text}");
    assert!(text.contains(url), "{text}");
    // The server does serve the new bytes: a fresh open reads them.
    let fresh = OpenOptions::new().open_url(url).unwrap();
    let now = fresh.tensor(&name).unwrap().data().unwrap().into_owned();
    assert_eq!(now, other[at..at + want.len()]);
    assert_ne!(now, want);

    // Replaced by a shorter object: an error too.
    let opened = OpenOptions::new().open_url(url).unwrap();
    std::fs::write(&object, &original[..original.len() - 100]).unwrap();
    let err = match opened.tensor(&name).unwrap().data() {
        Ok(read) => panic!("{} bytes of a shorter object read", read.len()),
        Err(e) => e,
    };
    assert!(err.to_string().contains("changed"), "{err}");
}
