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
    fn sent(&self, path: &str) -> (u64, usize) {
        let log = self.log("access.log");
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.split(' ').next() == Some(path))
            .collect();
        let bytes = lines
            .iter()
            .map(|l| l.split(' ').nth(2).unwrap().parse::<u64>().unwrap())
            .sum();
        (bytes, lines.len())
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
    for name in [
        "weights.safetensors.pt",
        "download.html.pt",
        "pre1.0_tar.pt",
    ] {
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
        // The same words, the URL named after them.
        let (here, there) = (&here["files"][0]["error"], &there["files"][0]["error"]);
        let alike = match (here.as_str(), there.as_str()) {
            (Some(h), Some(t)) => t.starts_with(h),
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
