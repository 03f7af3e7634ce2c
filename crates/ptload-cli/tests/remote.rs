//! `ptload` on URLs served by a real web server (nginx) on loopback: the
//! answers equal the local files', scanning a large file fetches a small
//! part of it (the server's access log says how much), and the server's
//! refusals and failures give their errors.
//!
//! Needs nginx: `.ci/run` installs it from Debian's packages and runs
//! these tests with `PTLOAD_NGINX` set to its binary and `--ignored`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use serde_json::Value as Json;

mod large;
use large::write_large_checkpoint;

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

/// nginx on a loopback port over a folder of its own; stopped on drop.
struct Nginx {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Nginx {
    fn start(name: &str) -> Nginx {
        let nginx = std::env::var("PTLOAD_NGINX")
            .expect("PTLOAD_NGINX: the nginx binary these tests run (.ci/run sets it)");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nginx-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        let www = dir.join("www");
        for sub in ["files", "norange", "changing/v1", "changing/v2", "temp"] {
            std::fs::create_dir_all(www.join(sub)).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.display();
        let config = format!(
            r#"daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 64; }}
http {{
    log_format ranges '$request_uri $status $bytes_sent "$http_range"';
    access_log {d}/access.log ranges;
    client_body_temp_path {d}/www/temp;
    proxy_temp_path {d}/www/temp;
    fastcgi_temp_path {d}/www/temp;
    uwsgi_temp_path {d}/www/temp;
    scgi_temp_path {d}/www/temp;
    server {{
        listen 127.0.0.1:{port};
        root {d}/www;
        location /norange/ {{ max_ranges 0; }}
        location /forbidden/ {{ return 403; }}
        location /failing/ {{ return 500; }}
        location /moved/ {{ rewrite ^/moved/(.*)$ /files/$1 redirect; }}
        # The first request (the length) sees one file, later ones its
        # replacement: the same length, another ETag.
        location /changing/ {{
            if ($http_range = "bytes=0-0") {{ rewrite ^/changing/(.*)$ /changing/v1/$1 break; }}
            rewrite ^/changing/(.*)$ /changing/v2/$1 break;
        }}
    }}
}}
"#
        );
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config).unwrap();
        let child = Command::new(&nginx)
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(&dir)
            .spawn()
            .unwrap_or_else(|e| panic!("{nginx}: {e}"));
        let server = Nginx { child, dir, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("nginx did not start: {}", server.log("error.log"));
    }

    fn www(&self) -> PathBuf {
        self.dir.join("www")
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Bytes sent for the requests of `path`, and their count.
    /// Bytes sent for the requests of `path`, and their count. nginx
    /// writes a request's log line after the response has gone out, so
    /// the log is read until two readings 20 ms apart agree (at most a
    /// second).
    fn sent(&self, path: &str) -> (u64, usize) {
        let reading = || {
            let log = self.log("access.log");
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.split(' ').next() == Some(path))
                .collect();
            let bytes: u64 = lines
                .iter()
                .map(|l| l.split(' ').nth(2).unwrap().parse::<u64>().unwrap())
                .sum();
            (bytes, lines.len())
        };
        let mut last = reading();
        for _ in 0..50 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let now = reading();
            if now == last {
                break;
            }
            last = now;
        }
        last
    }

    fn clear_log(&self) {
        std::fs::write(self.dir.join("access.log"), "").unwrap();
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers (killed outright, it would
        // leave them serving the port).
        let stopped = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            let _ = self.child.kill();
        }
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
#[ignore = "needs nginx: .ci/run sets PTLOAD_NGINX and runs it with --ignored"]
fn inspect_and_scan_of_a_url_equal_the_local_files() {
    let server = Nginx::start("alike");
    let names = [
        "basic.pt",
        "legacy.pt",
        "deflated.pt",
        "torchscript.pt",
        "training.ckpt",
        "multi_gpu.pt",
        "many_tensors.pt",
        "llama_tiny.pt",
        "prefixed.pt",
        "wide_storages.pt",
        "st_dtypes.safetensors",
        "weights.safetensors.pt",
    ];
    for name in names {
        std::fs::copy(fixture(name), server.www().join("files").join(name)).unwrap();
        let local = fixture(name).display().to_string();
        let url = server.url(&format!("files/{name}"));
        let here = json(&ptload(&["inspect", "--json", "--hash", &local]));
        let there = json(&ptload(&["inspect", "--json", "--hash", &url]));
        assert!(there["fetched"]["bytes"].as_u64().unwrap() > 0, "{name}");
        assert_eq!(located(here), located(there), "{name}");
        let (here, there) = (
            ptload(&["scan", "--json", &local]),
            ptload(&["scan", "--json", &url]),
        );
        assert_eq!(here.status.code(), there.status.code(), "{name}");
        let here: Json = serde_json::from_slice(&here.stdout).unwrap();
        let there: Json = serde_json::from_slice(&there.stdout).unwrap();
        let (here, there) = (&here["files"][0], &there["files"][0]);
        assert_eq!(here["verdict"], there["verdict"], "{name}");
        assert_eq!(here["globals"], there["globals"], "{name}");
        assert_eq!(here["pickles"], there["pickles"], "{name}");
    }
    // Files that are no checkpoint scan as the local file does.
    for name in ["download.html.pt", "pre1.0_tar.pt", "empty.pt"] {
        std::fs::copy(fixture(name), server.www().join("files").join(name)).unwrap();
        let local = fixture(name).display().to_string();
        let url = server.url(&format!("files/{name}"));
        let (here, there) = (
            ptload(&["scan", "--json", &local]),
            ptload(&["scan", "--json", &url]),
        );
        assert_eq!(here.status.code(), there.status.code(), "{name}");
        let here: Json = serde_json::from_slice(&here.stdout).unwrap();
        let there: Json = serde_json::from_slice(&there.stdout).unwrap();
        assert_eq!(
            here["files"][0]["verdict"], there["files"][0]["verdict"],
            "{name}"
        );
        // The same words, each naming what it read: the file, the URL.
        let (here, there) = (&here["files"][0]["error"], &there["files"][0]["error"]);
        let alike = match (here.as_str(), there.as_str()) {
            (Some(h), Some(t)) => {
                let h = h.strip_suffix(&format!(" in file {local}"));
                let t = t.strip_suffix(&format!(" in file {url}"));
                h.is_some() && h == t
            }
            _ => here == there,
        };
        assert!(alike, "{name}: {here} / {there}");
    }
    // convert, diff and load read the tensors from the URL.
    for name in ["basic.pt", "legacy.pt", "llama_tiny.pt"] {
        let local = fixture(name).display().to_string();
        let url = server.url(&format!("files/{name}"));
        let out = server.dir.join(format!("{name}.safetensors"));
        let out_here = server.dir.join(format!("{name}.local.safetensors"));
        let (o, h) = (out.display().to_string(), out_here.display().to_string());
        assert!(ptload(&["convert", &url, &o]).status.success(), "{name}");
        assert!(ptload(&["convert", &local, &h]).status.success(), "{name}");
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(&out_here).unwrap(),
            "{name}"
        );
        let diff = ptload(&["diff", &url, &local]);
        assert_eq!(
            diff.status.code(),
            Some(0),
            "{name}: {}",
            String::from_utf8_lossy(&diff.stdout)
        );
        let here = json(&ptload(&[
            "load",
            "--json",
            "--hash",
            "--map-location",
            "cpu",
            &local,
        ]));
        let there = json(&ptload(&[
            "load",
            "--json",
            "--hash",
            "--map-location",
            "cpu",
            &url,
        ]));
        assert!(
            there["tensors"].as_array().is_some_and(|t| !t.is_empty()),
            "{name}"
        );
        assert!(there["tensors"][0]["sha256"].is_string(), "{name}: {there}");
        assert_eq!(here["tensors"], there["tensors"], "{name}");
    }
    // A redirect is followed.
    let url = server.url("moved/basic.pt");
    let there = json(&ptload(&["inspect", "--json", "--hash", &url]));
    let here = json(&ptload(&[
        "inspect",
        "--json",
        "--hash",
        &fixture("basic.pt").display().to_string(),
    ]));
    assert_eq!(located(here), located(there));
}

#[test]
#[ignore = "needs nginx: .ci/run sets PTLOAD_NGINX and runs it with --ignored"]
fn scanning_a_large_url_fetches_under_one_percent() {
    let server = Nginx::start("large");
    let path = server.www().join("files").join("large.pt");
    let size = write_large_checkpoint(&path, 500 << 20);
    let url = server.url("files/large.pt");
    let local = path.display().to_string();

    let here = json(&ptload(&["scan", "--json", &local]));
    server.clear_log();
    let there = json(&ptload(&["scan", "--json", &url]));
    assert_eq!(here["files"][0]["verdict"], there["files"][0]["verdict"]);
    assert_eq!(here["files"][0]["globals"], there["files"][0]["globals"]);
    let (sent, requests) = server.sent("/files/large.pt");
    assert!(
        sent * 100 < size,
        "scan: {sent} of {size} bytes in {requests} requests"
    );
    let fetched = there["files"][0]["fetched"]["bytes"].as_u64().unwrap();
    assert!(fetched <= sent, "{fetched} fetched, {sent} sent");

    server.clear_log();
    let here = json(&ptload(&["inspect", "--json", &local]));
    let there = json(&ptload(&["inspect", "--json", &url]));
    assert_eq!(located(here), located(there));
    let (sent, requests) = server.sent("/files/large.pt");
    assert!(
        sent * 100 < size,
        "inspect: {sent} of {size} bytes in {requests} requests"
    );
}

#[test]
#[ignore = "needs nginx: .ci/run sets PTLOAD_NGINX and runs it with --ignored"]
fn what_the_server_refuses_or_fails_gives_its_error() {
    let server = Nginx::start("faults");
    std::fs::copy(fixture("basic.pt"), server.www().join("norange/basic.pt")).unwrap();
    // Two files of one length, written at different times: other ETags.
    let v1 = server.www().join("changing/v1/basic.pt");
    let v2 = server.www().join("changing/v2/basic.pt");
    let bytes = std::fs::read(fixture("basic.pt")).unwrap();
    std::fs::write(&v1, &bytes).unwrap();
    let mut other = bytes.clone();
    let last = other.len() - 30;
    other[last] ^= 1;
    std::fs::File::create(&v2)
        .unwrap()
        .write_all(&other)
        .unwrap();
    let earlier = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&v1)
        .unwrap()
        .set_modified(earlier)
        .unwrap();

    // With the requests inspect and scan make (scan reads the first bytes
    // on their own first).
    let cases = [
        ("norange/basic.pt", "does not serve byte ranges", 1 + 1),
        ("files/missing.pt", "404 Not Found", 1 + 1),
        ("forbidden/basic.pt", "403 Forbidden", 1 + 1),
        ("failing/basic.pt", "500 Internal Server Error", 4 + 4),
        ("changing/basic.pt", "changed between requests", 2 + 2),
    ];
    for (path, said, requests) in cases {
        let url = server.url(path);
        server.clear_log();
        for command in ["inspect", "scan"] {
            let out = ptload(&[command, "--json", &url]);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(2), "{command} {path}: {text}");
            assert!(text.contains(said), "{command} {path}: {text}");
            assert!(text.contains(&url), "{command} {path}: {text}");
        }
        // Retried only when the failure may pass: per command.
        let (_, made) = server.sent(&format!("/{path}"));
        assert_eq!(made, requests, "{path}: {}", server.log("access.log"));
    }
}

impl Nginx {
    /// The byte ranges asked for `path` (the first byte alone, asked for
    /// to learn the length, left out).
    fn ranges(&self, path: &str) -> Vec<(u64, u64)> {
        let log = self.log("access.log");
        let mut out = Vec::new();
        for line in log.lines().filter(|l| l.split(' ').next() == Some(path)) {
            let range = line.rsplit('"').nth(1).unwrap();
            let (a, b) = range
                .strip_prefix("bytes=")
                .unwrap()
                .split_once('-')
                .unwrap();
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            if (a, b) != (0, 0) {
                out.push((a, b));
            }
        }
        out.sort_unstable();
        out
    }

    /// No byte of `path` was asked for twice since the log was cleared.
    fn each_byte_once(&self, path: &str) {
        let ranges = self.ranges(path);
        assert!(!ranges.is_empty(), "{path}: {}", self.log("access.log"));
        for pair in ranges.windows(2) {
            assert!(pair[0].1 < pair[1].0, "{path}: {ranges:?}");
        }
    }
}

/// The JSON of `load --json --hash` onto `device`.
fn load_hashes(device: &str, file: &str) -> Json {
    json(&ptload(&[
        "load",
        "--json",
        "--hash",
        "--map-location",
        device,
        file,
    ]))
}

#[test]
#[ignore = "needs nginx: .ci/run sets PTLOAD_NGINX and runs it with --ignored"]
fn load_and_convert_of_a_url_read_each_range_once() {
    let server = Nginx::start("ahead");
    for name in [
        "wide_storages.pt",
        "llama_tiny.pt",
        "multi_gpu.pt",
        "legacy.pt",
    ] {
        std::fs::copy(fixture(name), server.www().join("files").join(name)).unwrap();
        let local = fixture(name).display().to_string();
        let url = server.url(&format!("files/{name}"));
        let path = format!("/files/{name}");

        server.clear_log();
        let there = load_hashes("cpu", &url);
        server.each_byte_once(&path);
        let here = load_hashes("cpu", &local);
        assert!(there["tensors"][0]["sha256"].is_string(), "{name}: {there}");
        assert_eq!(here["tensors"], there["tensors"], "{name}");

        let out = server.dir.join(format!("{name}.safetensors"));
        let out_here = server.dir.join(format!("{name}.local.safetensors"));
        let (o, h) = (out.display().to_string(), out_here.display().to_string());
        server.clear_log();
        assert!(ptload(&["convert", &url, &o]).status.success(), "{name}");
        server.each_byte_once(&path);
        assert!(ptload(&["convert", &local, &h]).status.success(), "{name}");
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(&out_here).unwrap(),
            "{name}"
        );
    }
}

/// An `#[ignore]`d GPU test run where there is none fails, never passes.
fn require_gpu() {
    assert!(
        ptload_device::device_count() > 0,
        "this test needs a CUDA device"
    );
}

#[test]
#[ignore = "needs a CUDA device, real or simulated (.ci/run runs it on simcuda), and nginx (PTLOAD_NGINX)"]
fn load_of_a_url_onto_a_gpu_gives_the_local_files_bytes() {
    require_gpu();
    let server = Nginx::start("gpu");
    for name in ["wide_storages.pt", "multi_gpu.pt", "llama_tiny.pt"] {
        std::fs::copy(fixture(name), server.www().join("files").join(name)).unwrap();
        let local = fixture(name).display().to_string();
        let url = server.url(&format!("files/{name}"));
        server.clear_log();
        // The hashes are read back from the device.
        let there = load_hashes("cuda:0", &url);
        server.each_byte_once(&format!("/files/{name}"));
        let here = load_hashes("cuda:0", &local);
        let tensors = there["tensors"].as_array().unwrap();
        assert!(!tensors.is_empty(), "{name}");
        for t in tensors {
            assert_eq!(t["device"], "cuda:0", "{name}: {t}");
        }
        assert_eq!(here["tensors"], there["tensors"], "{name}");
    }
}

/// Each JSON document of `o`'s output (one a line: a set's files are
/// reported one by one).
fn documents(o: &Output) -> Vec<Json> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
#[ignore = "needs nginx: .ci/run sets PTLOAD_NGINX and runs it with --ignored"]
fn an_index_url_reads_as_the_local_set() {
    let server = Nginx::start("sets");
    let dir = fixture("llama_tiny_sharded");
    let served = server.www().join("files/sharded");
    std::fs::create_dir_all(&served).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), served.join(entry.file_name())).unwrap();
    }
    let local = dir
        .join("pytorch_model.bin.index.json")
        .display()
        .to_string();
    let url = server.url("files/sharded/pytorch_model.bin.index.json");
    let here = json(&ptload(&["inspect", "--json", "--hash", &local]));
    let there = json(&ptload(&["inspect", "--json", "--hash", &url]));
    assert!(there["fetched"]["bytes"].as_u64().unwrap() > 0, "{there}");
    assert_eq!(located(here), located(there));
    // A sharded safetensors set (transformers' save_pretrained) by its index.
    let st = server.www().join("files/st_sharded");
    std::fs::create_dir_all(&st).unwrap();
    for entry in std::fs::read_dir(fixture("st_sharded")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), st.join(entry.file_name())).unwrap();
    }
    let st_local = fixture("st_sharded/model.safetensors.index.json")
        .display()
        .to_string();
    let st_url = server.url("files/st_sharded/model.safetensors.index.json");
    let st_here = json(&ptload(&["inspect", "--json", "--hash", &st_local]));
    let st_there = json(&ptload(&["inspect", "--json", "--hash", &st_url]));
    assert_eq!(st_there["format"], "safetensors");
    assert_eq!(located(st_here), located(st_there));
    // Every shard was asked for at its URL beside the index.
    for n in 1..=3 {
        let (_, made) = server.sent(&format!(
            "/files/sharded/pytorch_model-0000{n}-of-00003.bin"
        ));
        assert!(made > 0, "shard {n}");
    }
    // A rank's slices across the set, as from the local index.
    let rank = [
        "load",
        "--json",
        "--hash",
        "--map-location",
        "cpu",
        "--shard",
        "1/2",
        "--split-preset",
        "llama",
    ];
    let here = documents(&ptload(&[&rank[..], &[local.as_str()]].concat()));
    let there = documents(&ptload(&[&rank[..], &[url.as_str()]].concat()));
    assert_eq!(here.len(), 3);
    let parts = |docs: &[Json]| {
        docs.iter()
            .map(|d| (d["file"].clone(), d["tensors"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(parts(&here), parts(&there));
    assert!(there[0]["tensors"][0]["slice"].is_object(), "{}", there[0]);
    // scan: each shard at its URL, as each local file.
    let here = json(&ptload(&["scan", "--json", &dir.display().to_string()]));
    let there = json(&ptload(&["scan", "--json", &url]));
    let verdicts = |doc: &Json| {
        doc["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["verdict"].clone(), f["globals"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(verdicts(&there).len(), 3, "{there}");
    assert_eq!(verdicts(&here), verdicts(&there));
    // convert and diff take the index URL too.
    let out = server.dir.join("set.safetensors");
    let out_here = server.dir.join("set.local.safetensors");
    let (o, h) = (out.display().to_string(), out_here.display().to_string());
    assert!(ptload(&["convert", &url, &o]).status.success());
    assert!(ptload(&["convert", &local, &h]).status.success());
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&out_here).unwrap()
    );
    assert_eq!(ptload(&["diff", &url, &local]).status.code(), Some(0));
}

/// `--shard` of a URL fetches the rank's slices and the parse reads, not
/// the whole file: the server's log counts the bytes it sent.
#[test]
#[ignore = "needs nginx: .ci/run sets PTLOAD_NGINX and runs it with --ignored"]
fn a_rank_of_a_url_fetches_its_slices() {
    let server = Nginx::start("slices");
    let name = "llama_wide.pt";
    std::fs::copy(fixture(name), server.www().join("files").join(name)).unwrap();
    let size = std::fs::metadata(fixture(name)).unwrap().len();
    let local = fixture(name).display().to_string();
    let url = server.url(&format!("files/{name}"));
    for rank in ["0/2", "1/2"] {
        let args = |file: &str| {
            ptload(&[
                "load",
                "--json",
                "--hash",
                "--map-location",
                "cpu",
                "--shard",
                rank,
                "--split-preset",
                "llama",
                file,
            ])
        };
        let here = json(&args(&local));
        server.clear_log();
        let there = json(&args(&url));
        assert_eq!(here["tensors"], there["tensors"], "{rank}");
        let (sent, requests) = server.sent(&format!("/files/{name}"));
        // The slices' bytes: the rank's part of each tensor.
        let slices: u64 = there["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let numel: u64 = t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .product();
                let elem = if t["dtype"] == "BF16" { 2 } else { 4 };
                numel * elem
            })
            .sum();
        println!("{rank}: {sent} bytes sent in {requests} requests for {slices} bytes of slices, of a file of {size}");
        // Besides the slices: the parse reads (the first and last 128 KiB,
        // the layer's records with 64 KiB around them), the norms whole,
        // and the span covering o_proj's and down_proj's halves.
        assert!(
            sent >= slices && sent <= slices + (512 << 10),
            "{rank}: {sent} sent, {slices} in the slices"
        );
        assert!(
            sent * 10 < size * 6,
            "{rank}: {sent} of {size} bytes in {requests} requests"
        );
    }
}

/// `plan` takes URLs as every other command does: the plan of a URL (a
/// file, and a set by its index) is the local file's, byte range for byte
/// range, and planning fetches no tensor data.
#[test]
#[ignore = "needs nginx: .ci/run sets PTLOAD_NGINX and runs it with --ignored"]
fn plan_of_a_url_is_the_local_files_plan() {
    let server = Nginx::start("plan");
    let name = "llama_wide.pt";
    std::fs::copy(fixture(name), server.www().join("files").join(name)).unwrap();
    let shards = "llama_tiny_sharded";
    let dir = server.www().join("files").join(shards);
    std::fs::create_dir_all(&dir).unwrap();
    let mut index = None;
    for f in std::fs::read_dir(fixture(shards)).unwrap() {
        let f = f.unwrap();
        let n = f.file_name().to_string_lossy().into_owned();
        if n.ends_with(".index.json") {
            index = Some(n.clone());
        }
        std::fs::copy(f.path(), dir.join(&n)).unwrap();
    }
    let index = index.expect("the set's index");
    for (local, remote, args) in [
        (
            fixture(name),
            server.url(&format!("files/{name}")),
            vec!["--world", "2", "--split-preset", "llama"],
        ),
        (
            fixture(shards).join(&index),
            server.url(&format!("files/{shards}/{index}")),
            vec!["--world", "4", "--nodes", "2", "--read-once"],
        ),
    ] {
        let run = |input: &str| {
            let mut all = vec!["plan"];
            all.extend(&args);
            all.push(input);
            let out = ptload(&all);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{input}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            json(&out)
        };
        let mut here = run(&local.display().to_string());
        server.clear_log();
        let mut there = run(&remote);
        let size = std::fs::metadata(&local).unwrap().len();
        // The files are named as given; everything else is the same.
        let files = there["files"].as_array().unwrap().len();
        assert_eq!(files, here["files"].as_array().unwrap().len());
        here["files"] = Json::Null;
        there["files"] = Json::Null;
        assert_eq!(here, there, "{remote}");
        if !args.contains(&"--read-once") {
            let (sent, _) = server.sent(&format!("/files/{name}"));
            assert!(sent * 4 < size, "{sent} of {size} bytes fetched to plan");
        }
    }
}

/// Indexes that name shards elsewhere, that are too large, that name a
/// missing shard, and directories, each give their error.
#[test]
#[ignore = "needs nginx: .ci/run sets PTLOAD_NGINX and runs it with --ignored"]
fn hostile_index_urls_give_their_errors() {
    let server = Nginx::start("hostile-sets");
    let files = server.www().join("files");
    std::fs::copy(fixture("basic.pt"), files.join("basic.pt")).unwrap();
    let run = |index: &str| {
        let url = server.url(&format!("files/{index}"));
        server.clear_log();
        let out = ptload(&["inspect", "--json", &url]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(2), "{index}: {text}");
        text
    };
    // A shard name that is not a plain file beside the index: refused,
    // and nothing but the index asked for.
    for (n, shard) in [
        "../basic.pt",
        "/files/basic.pt",
        "http://127.0.0.1:1/basic.pt",
        "basic.pt?x=1",
        "%2e%2e/basic.pt",
    ]
    .iter()
    .enumerate()
    {
        let index = format!("bad{n}.index.json");
        let doc = serde_json::json!({"weight_map": {"0.weight": shard}});
        std::fs::write(files.join(&index), doc.to_string()).unwrap();
        let text = run(&index);
        assert!(text.contains("not a file beside it"), "{shard}: {text}");
        let log = server.log("access.log");
        assert!(
            log.lines()
                .all(|l| l.starts_with(&format!("/files/{index} "))),
            "{shard}: {log}"
        );
    }
    // Larger than max_index_bytes (256 MiB): refused from its length,
    // without reading it (a sparse file: no disk used).
    let big = std::fs::File::create(files.join("big.index.json")).unwrap();
    big.set_len((256 << 20) + 1).unwrap();
    let text = run("big.index.json");
    assert!(text.contains("max_index_bytes"), "{text}");
    let (sent, _) = server.sent("/files/big.index.json");
    assert!(sent < 4096, "{sent}");
    // A shard the server does not have: 404, naming its URL.
    let doc = serde_json::json!({"weight_map": {
        "0.weight": "basic.pt",
        "x": "missing-00002-of-00002.bin",
    }});
    std::fs::write(files.join("missing.index.json"), doc.to_string()).unwrap();
    let text = run("missing.index.json");
    let shard = server.url("files/missing-00002-of-00002.bin");
    assert!(
        text.contains(&format!("GET {shard}: 404 Not Found")),
        "{text}"
    );
    // A directory cannot be listed.
    let url = server.url("files/");
    let out = ptload(&["inspect", &url]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("give the URL of its index"), "{text}");
}
