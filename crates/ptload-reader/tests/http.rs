//! Checkpoints at HTTP URLs against servers on loopback that behave and
//! that do not: a hostile peer is like a hostile file, its answers must
//! give errors, never wrong tensors.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ptload_reader::{Checkpoint, OpenOptions};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/files")
            .join(name),
    )
    .unwrap()
}

/// What the server does with request `n` (from 0) for `range` (first,
/// last), over `file`: the raw response.
type Behaviour = dyn Fn(usize, Option<(u64, u64)>, &[u8]) -> Vec<u8> + Send + Sync;

/// A server on loopback answering every request with `behaviour`, one
/// connection per request; the URL and the count of requests.
fn serve(file: Vec<u8>, behaviour: Box<Behaviour>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/model.pt", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut range = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(r) = lower.strip_prefix("range: bytes=") {
                    let (a, b) = r.trim().split_once('-').unwrap();
                    range = Some((a.parse().unwrap(), b.parse().unwrap()));
                }
            }
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(&behaviour(n, range, &file));
        }
    });
    (url, count)
}

fn partial(file: &[u8], (a, b): (u64, u64), etag: &str) -> Vec<u8> {
    let body = &file[a as usize..=b as usize];
    let mut out = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{}\r\nContent-Length: {}\r\n\
         ETag: {etag}\r\nConnection: close\r\n\r\n",
        file.len(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn status(line: &str) -> Vec<u8> {
    format!("HTTP/1.1 {line}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").into_bytes()
}

fn tensors(ckpt: &Checkpoint) -> Vec<(String, Vec<u8>)> {
    ckpt.tensors()
        .map(|t| (t.name().to_owned(), t.data().unwrap().into_owned()))
        .collect()
}

fn open(url: &str) -> Result<Checkpoint, String> {
    let ckpt = OpenOptions::new()
        .open_url(url)
        .map_err(|e| e.to_string())?;
    // Read every tensor: later requests are checked like the first.
    for t in ckpt.tensors() {
        t.data().map_err(|e| e.to_string())?;
    }
    Ok(ckpt)
}

#[test]
fn a_server_that_serves_ranges_gives_the_local_tensors() {
    let file = fixture("basic.pt");
    let (url, count) = serve(
        file.clone(),
        Box::new(|_, range, file| partial(file, range.unwrap(), "\"v1\"")),
    );
    let ckpt = open(&url).unwrap();
    let local = Checkpoint::from_bytes(file).unwrap();
    assert_eq!(tensors(&ckpt), tensors(&local));
    let (bytes, requests) = ckpt.fetched_bytes().unwrap();
    assert!(bytes > 0 && requests > 0);
    // One more for the length.
    assert_eq!(count.load(Ordering::SeqCst) as u64, requests + 1);
}

#[test]
fn a_server_that_ignores_range_is_refused() {
    let (url, count) = serve(
        fixture("basic.pt"),
        Box::new(|_, _, file| {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                file.len()
            )
            .into_bytes();
            out.extend_from_slice(file);
            out
        }),
    );
    let err = open(&url).unwrap_err();
    assert!(err.contains("does not serve byte ranges"), "{err}");
    assert!(err.contains(&url), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn client_errors_are_not_retried() {
    for (line, said) in [
        ("404 Not Found", "404 Not Found"),
        ("403 Forbidden", "PTLOAD_HTTP_TOKEN"),
    ] {
        let (url, count) = serve(fixture("basic.pt"), Box::new(move |_, _, _| status(line)));
        let err = open(&url).unwrap_err();
        assert!(err.contains(said) && err.contains(&url), "{err}");
        assert_eq!(count.load(Ordering::SeqCst), 1, "{line}");
    }
}

#[test]
fn server_errors_are_retried_then_reported() {
    let (url, count) = serve(
        fixture("basic.pt"),
        Box::new(|_, _, _| status("500 Internal Server Error")),
    );
    let err = open(&url).unwrap_err();
    assert!(err.contains("500 Internal Server Error"), "{err}");
    assert!(err.contains("after 4 attempts"), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 4);
    // Two failures, then answers: the file reads.
    let (url, _) = serve(
        fixture("basic.pt"),
        Box::new(|n, range, file| match n {
            0 | 1 => status("503 Service Unavailable"),
            _ => partial(file, range.unwrap(), "\"v1\""),
        }),
    );
    open(&url).unwrap();
}

#[test]
fn a_file_replaced_between_requests_is_an_error() {
    let (url, _) = serve(
        fixture("basic.pt"),
        Box::new(|n, range, file| {
            // The length is learnt from the first file, the bytes come
            // from its replacement.
            let etag = if n < 1 { "\"v1\"" } else { "\"v2\"" };
            partial(file, range.unwrap(), etag)
        }),
    );
    let err = open(&url).unwrap_err();
    assert!(err.contains("changed between requests"), "{err}");
}

#[test]
fn a_truncated_body_is_an_error() {
    let (url, count) = serve(
        fixture("basic.pt"),
        Box::new(|n, range, file| {
            let mut out = partial(file, range.unwrap(), "\"v1\"");
            if n > 0 {
                out.truncate(out.len() - 10);
            }
            out
        }),
    );
    let err = open(&url).unwrap_err();
    assert!(
        err.contains("truncated") || err.contains("body held"),
        "{err}"
    );
    // Tried again: a cut connection may be transient.
    assert_eq!(count.load(Ordering::SeqCst), 1 + 4);
}

#[test]
fn other_bytes_than_asked_are_an_error() {
    // The range asked for, announced, with a longer body.
    let (url, _) = serve(
        fixture("basic.pt"),
        Box::new(|n, range, file| {
            let (a, b) = range.unwrap();
            if n == 0 {
                return partial(file, (a, b), "\"v1\"");
            }
            let mut body = file[a as usize..=b as usize].to_vec();
            body.extend_from_slice(b"extra");
            raw_partial(file.len(), (a, b), &body)
        }),
    );
    let err = open(&url).unwrap_err();
    assert!(err.contains("announces"), "{err}");
    // Another range than asked.
    let (url, _) = serve(
        fixture("basic.pt"),
        Box::new(|n, range, file| {
            let (a, b) = range.unwrap();
            if n == 0 {
                return partial(file, (a, b), "\"v1\"");
            }
            partial(file, (a + 1, b), "\"v1\"")
        }),
    );
    let err = open(&url).unwrap_err();
    assert!(err.contains("the server sent"), "{err}");
}

/// A 206 announcing `range` of a `total`-byte file, with `body` as is.
fn raw_partial(total: usize, (a, b): (u64, u64), body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{total}\r\n\
         Content-Length: {}\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A body without a `Content-Length`, ended by closing the connection.
fn unannounced_partial(total: usize, (a, b): (u64, u64), body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{total}\r\n\
         ETag: \"v1\"\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// Reads into a caller's buffer (the staging buffers of a load onto a
/// GPU) are checked like reads into the reader's own: the bytes asked
/// for land in place; a body shorter or longer than the buffer, even
/// unannounced, is an error, never a buffer partly filled or overrun.
#[test]
fn reads_into_a_buffer_are_checked_like_the_others() {
    use ptload_reader::http::HttpFile;
    use ptload_reader::ranged::RangeRead;
    let file = fixture("basic.pt");
    let (url, _) = serve(
        file.clone(),
        Box::new(|_, range, file| partial(file, range.unwrap(), "\"v1\"")),
    );
    let http = HttpFile::open(&url).unwrap();
    let mut out = vec![0u8; 300];
    http.read_into(17, &mut out).unwrap();
    assert_eq!(out, &file[17..317]);
    http.read_into(0, &mut []).unwrap();

    for (what, said, extra) in [
        ("short", "held 290 of 300", -10i64),
        ("long", "more than", 5),
    ] {
        let (url, count) = serve(
            file.clone(),
            Box::new(move |n, range, file| {
                let (a, b) = range.unwrap();
                if n == 0 {
                    return partial(file, (a, b), "\"v1\"");
                }
                let mut body = file[a as usize..=b as usize].to_vec();
                if extra < 0 {
                    body.truncate(body.len() - (-extra) as usize);
                } else {
                    body.extend(std::iter::repeat_n(7u8, extra as usize));
                }
                unannounced_partial(file.len(), (a, b), &body)
            }),
        );
        let http = HttpFile::open(&url).unwrap();
        let mut out = vec![0u8; 300];
        let err = http.read_into(17, &mut out).unwrap_err().to_string();
        assert!(err.contains(said) && err.contains(&url), "{what}: {err}");
        // Tried again, as a cut connection may be transient.
        assert_eq!(count.load(Ordering::SeqCst), 1 + 4, "{what}");
    }
}
