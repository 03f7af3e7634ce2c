//! `ptload` on `s3://` URLs served by a real S3 server (`s3s-fs`, an S3
//! server over a local folder) on loopback: the answers equal the local
//! files', scanning a large object fetches a small part of it, and a
//! missing object, a missing bucket and wrong credentials give errors
//! naming the URL.
//!
//! Needs s3s-fs: `.ci/run` installs it and runs these tests with
//! `PTLOAD_S3S` set to its binary and `--ignored`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use serde_json::Value as Json;

mod large;
use large::write_large_checkpoint;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
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

    /// `ptload args` with the store's configuration in the environment,
    /// the secret key given.
    fn ptload_with(&self, secret: &str, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ptload"));
        for var in [
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_DEFAULT_REGION",
            "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE",
        ] {
            command.env_remove(var);
        }
        command
            .env(
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            )
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .args(args)
            .output()
            .expect("run ptload")
    }

    fn ptload(&self, args: &[&str]) -> Output {
        self.ptload_with(SECRET, args)
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The large file is hundreds of megabytes: not left behind.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn json(o: &Output) -> Json {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `doc` without the keys that name where it was read from.
fn located(mut doc: Json) -> Json {
    let map = doc.as_object_mut().unwrap();
    map.remove("file");
    map.remove("fetched");
    doc
}

#[test]
#[ignore = "needs s3s-fs: .ci/run sets PTLOAD_S3S and runs it with --ignored"]
fn inspect_scan_load_and_convert_of_an_s3_url_equal_the_local_files() {
    let s3 = S3::start("alike");
    let names = [
        "files/basic.pt",
        "files/legacy.pt",
        "files/llama_tiny.pt",
        "files/deflated.pt",
        "bucket/wide.pt",
    ];
    for name in names {
        let base = Path::new(name).file_name().unwrap().to_str().unwrap();
        std::fs::copy(fixture(name), s3.bucket().join(base)).unwrap();
        let local = fixture(name).display().to_string();
        let url = format!("s3://bucket/{base}");

        let here = json(&s3.ptload(&["inspect", "--json", "--hash", &local]));
        let there = json(&s3.ptload(&["inspect", "--json", "--hash", &url]));
        assert!(there["fetched"]["bytes"].as_u64().unwrap() > 0, "{name}");
        assert_eq!(there["file"], url.as_str(), "{name}");
        assert_eq!(located(here), located(there), "{name}");

        let (here, there) = (
            s3.ptload(&["scan", "--json", &local]),
            s3.ptload(&["scan", "--json", &url]),
        );
        assert_eq!(here.status.code(), there.status.code(), "{name}");
        let here: Json = serde_json::from_slice(&here.stdout).unwrap();
        let there: Json = serde_json::from_slice(&there.stdout).unwrap();
        let (here, there) = (&here["files"][0], &there["files"][0]);
        assert_eq!(here["verdict"], there["verdict"], "{name}");
        assert_eq!(here["globals"], there["globals"], "{name}");
        assert_eq!(here["pickles"], there["pickles"], "{name}");
        assert!(there["fetched"]["bytes"].as_u64().unwrap() > 0, "{name}");

        let load = |path: &str| {
            json(&s3.ptload(&["load", "--json", "--hash", "--map-location", "cpu", path]))
        };
        let (here, there) = (load(&local), load(&url));
        assert!(
            there["tensors"].as_array().is_some_and(|t| !t.is_empty()),
            "{name}"
        );
        assert!(there["tensors"][0]["sha256"].is_string(), "{name}: {there}");
        assert_eq!(here["tensors"], there["tensors"], "{name}");

        let out = s3.dir.join(format!("{base}.safetensors"));
        let out_here = s3.dir.join(format!("{base}.local.safetensors"));
        let (o, h) = (out.display().to_string(), out_here.display().to_string());
        let converted = s3.ptload(&["convert", &url, &o]);
        assert!(
            converted.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&converted.stderr)
        );
        assert!(
            s3.ptload(&["convert", &local, &h]).status.success(),
            "{name}"
        );
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(&out_here).unwrap(),
            "{name}"
        );
        let diff = s3.ptload(&["diff", &url, &local]);
        assert_eq!(
            diff.status.code(),
            Some(0),
            "{name}: {}",
            String::from_utf8_lossy(&diff.stdout)
        );
    }
    // The tensor of wide.pt is torch's.
    let answers: Json =
        serde_json::from_slice(&std::fs::read(fixture("bucket/wide.pt.json")).unwrap()).unwrap();
    let there = json(&s3.ptload(&[
        "load",
        "--json",
        "--hash",
        "--map-location",
        "cpu",
        "s3://bucket/wide.pt",
    ]));
    for (got, torch) in there["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .zip(answers["tensors"].as_array().unwrap())
    {
        assert_eq!(got["name"], torch["name"]);
        assert_eq!(got["sha256"], torch["sha256"]);
    }
}

/// An object loaded onto a GPU from the bucket: every tensor lands on
/// cuda:0, and its elements read back from the device are the local
/// file's (the load streams the object's ranges into the staging buffers).
#[test]
#[ignore = "needs a CUDA device, real or simulated, and s3s-fs (.ci/run runs it on simcuda with PTLOAD_S3S)"]
fn load_of_an_s3_object_onto_a_gpu_gives_the_local_files_bytes() {
    assert!(
        ptload_device::device_count() > 0,
        "this test needs a CUDA device"
    );
    let s3 = S3::start("gpu");
    for name in ["files/wide_storages.pt", "files/llama_tiny.pt"] {
        let base = Path::new(name).file_name().unwrap().to_str().unwrap();
        std::fs::copy(fixture(name), s3.bucket().join(base)).unwrap();
        let local = fixture(name).display().to_string();
        let url = format!("s3://bucket/{base}");
        let load = |path: &str| {
            json(&s3.ptload(&["load", "--json", "--hash", "--map-location", "cuda:0", path]))
        };
        let (here, there) = (load(&local), load(&url));
        let tensors = there["tensors"].as_array().unwrap();
        assert!(!tensors.is_empty(), "{name}");
        for t in tensors {
            assert_eq!(t["device"], "cuda:0", "{name}: {t}");
            assert!(t["sha256"].is_string(), "{name}: {t}");
        }
        assert_eq!(here["tensors"], there["tensors"], "{name}");
    }
}

#[test]
#[ignore = "needs s3s-fs: .ci/run sets PTLOAD_S3S and runs it with --ignored"]
fn scanning_a_large_s3_object_fetches_under_one_percent() {
    let s3 = S3::start("large");
    let path = s3.bucket().join("large.pt");
    let size = write_large_checkpoint(&path, 500 << 20);
    let url = "s3://bucket/large.pt";
    let local = path.display().to_string();

    let here = json(&s3.ptload(&["scan", "--json", &local]));
    let there = json(&s3.ptload(&["scan", "--json", url]));
    assert_eq!(here["files"][0]["verdict"], there["files"][0]["verdict"]);
    assert_eq!(here["files"][0]["globals"], there["files"][0]["globals"]);
    let fetched = there["files"][0]["fetched"]["bytes"].as_u64().unwrap();
    assert!(
        fetched > 0 && fetched * 100 < size,
        "scan: {fetched} of {size}"
    );

    let here = json(&s3.ptload(&["inspect", "--json", &local]));
    let there = json(&s3.ptload(&["inspect", "--json", url]));
    let fetched = there["fetched"]["bytes"].as_u64().unwrap();
    assert!(
        fetched > 0 && fetched * 100 < size,
        "inspect: {fetched} of {size}"
    );
    assert_eq!(located(here), located(there));
}

#[test]
#[ignore = "needs s3s-fs: .ci/run sets PTLOAD_S3S and runs it with --ignored"]
fn a_missing_object_or_bucket_and_wrong_credentials_give_errors_naming_the_url() {
    let s3 = S3::start("faults");
    std::fs::copy(fixture("files/basic.pt"), s3.bucket().join("basic.pt")).unwrap();
    let cases = [
        ("s3://bucket/missing.pt", SECRET, "not found"),
        ("s3://nobucket/basic.pt", SECRET, "not found"),
        ("s3://bucket/basic.pt", "not-the-secret", "access denied"),
        // A set opens it as a directory, which a URL cannot list; the
        // scanner opens it as one object.
        (
            "s3://bucket/",
            SECRET,
            "names a directory|names a bucket, not an object",
        ),
    ];
    for (url, secret, said) in cases {
        for command in ["inspect", "scan", "load"] {
            let out = s3.ptload_with(secret, &[command, "--json", url]);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(2), "{command} {url}: {text}");
            assert!(
                said.split('|').any(|s| text.contains(s)),
                "{command} {url}: {text}"
            );
            assert!(text.contains(url), "{command} {url}: {text}");
        }
    }
    // The right key reads the object the wrong one could not.
    let ok = s3.ptload(&["inspect", "--json", "s3://bucket/basic.pt"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// A set's index in a bucket opens as the local set: each shard at the
/// key beside the index.
#[test]
#[ignore = "needs s3s-fs: .ci/run sets PTLOAD_S3S and runs it with --ignored"]
fn an_index_in_a_bucket_reads_as_the_local_set() {
    let s3 = S3::start("index");
    let local_dir = fixture("files/llama_tiny_sharded");
    let there_dir = s3.bucket().join("sharded");
    std::fs::create_dir_all(&there_dir).unwrap();
    for entry in std::fs::read_dir(&local_dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), there_dir.join(entry.file_name())).unwrap();
    }
    let index = "pytorch_model.bin.index.json";
    let local = local_dir.join(index).display().to_string();
    let url = format!("s3://bucket/sharded/{index}");
    let here = json(&s3.ptload(&["inspect", "--json", "--hash", &local]));
    let there = json(&s3.ptload(&["inspect", "--json", "--hash", &url]));
    assert!(there["fetched"]["bytes"].as_u64().unwrap() > 0, "{there}");
    assert_eq!(here["tensors"], there["tensors"]);
    assert!(here["tensors"].as_array().is_some_and(|t| t.len() > 10));
}
