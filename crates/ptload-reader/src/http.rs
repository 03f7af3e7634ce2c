//! Checkpoints at `http://` and `https://` URLs, read by ranged `GET`s
//! (feature `http`).
//!
//! The first request (`Range: bytes=0-0`) learns the length and the
//! validator (`ETag`, else `Last-Modified`); each read is then one ranged
//! request, and every answer is checked before its bytes are used:
//!
//! - a server that answers a ranged request with the whole body (`200`)
//!   does not serve ranges: refused, never downloaded whole in silence;
//! - `Content-Range` must name exactly the range asked for and the length
//!   first announced, the body must be exactly that long (read with that
//!   limit, never more), and the validator must not change between
//!   requests (the file was replaced);
//! - redirects are followed (hubs answer with a CDN address), at most 10;
//! - `5xx`, `408`, `429` and failed connections are tried again, 4 times
//!   in all, after 0.25, 0.5 and 1 s; other statuses are errors at once,
//!   naming the URL and the status.
//!
//! A bearer token is sent from `PTLOAD_HTTP_TOKEN` to any host, or from
//! `HF_TOKEN` to `huggingface.co` and its subdomains only; it is never
//! sent on to the host a redirect names.

use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::ranged::RangeRead;

/// Attempts per request, and the pause before the first retry (doubled
/// after each).
const ATTEMPTS: u32 = 4;
const FIRST_PAUSE: Duration = Duration::from_millis(250);

/// A file at an HTTP(S) URL, read by ranges.
#[derive(Debug)]
pub struct HttpFile {
    url: String,
    agent: ureq::Agent,
    token: Option<String>,
    len: u64,
    /// `ETag` (or `Last-Modified`) of the first answer: every later
    /// answer must carry the same.
    validator: Option<(&'static str, String)>,
}

fn http_err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Io, message)
}

/// What came back for one request.
enum Answer {
    /// A part, exactly the range asked for: the file's total length as
    /// `Content-Range` gives it, the body, the validator.
    Part(u64, Vec<u8>, Option<(&'static str, String)>),
    /// `416` (the range is past the end; the total length when given), or
    /// a `200` with an empty body (an empty file served whole: length 0).
    Unsatisfiable(Option<u64>),
}

impl HttpFile {
    /// Learn the length of the file at `url` with one ranged request.
    pub fn open(url: &str) -> Result<HttpFile> {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(10)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_recv_body(Some(Duration::from_secs(600)))
            .user_agent(concat!("ptload/", env!("CARGO_PKG_VERSION")))
            .build();
        let mut file = HttpFile {
            url: url.to_owned(),
            agent: config.new_agent(),
            token: token_for(url),
            len: 0,
            validator: None,
        };
        match file.request(0, 0, None)? {
            Answer::Part(total, _, validator) => {
                file.len = total;
                file.validator = validator;
            }
            Answer::Unsatisfiable(Some(0)) => file.len = 0,
            Answer::Unsatisfiable(_) => {
                return Err(http_err(format!(
                    "GET {url}: 416 Range Not Satisfiable for its first byte, without saying \
                     the file is empty"
                )))
            }
        }
        Ok(file)
    }

    /// One ranged GET of `start..=end`, tried again on transient failures;
    /// the body lands in `into` when given (see
    /// [`request_once`](Self::request_once)).
    fn request(&self, start: u64, end: u64, mut into: Option<&mut [u8]>) -> Result<Answer> {
        let mut pause = FIRST_PAUSE;
        let mut attempt = 1;
        loop {
            match self.request_once(start, end, into.as_deref_mut()) {
                Ok(answer) => return Ok(answer),
                Err((_, true)) if attempt < ATTEMPTS => {
                    std::thread::sleep(pause);
                    pause = pause.saturating_mul(2);
                    attempt += 1;
                }
                Err((e, transient)) => {
                    return Err(if transient {
                        e.with_note(format!("gave up after {attempt} attempts"), None)
                    } else {
                        e
                    })
                }
            }
        }
    }

    /// One ranged GET; an error says whether trying again may help.
    /// The body lands in `into` when given (exactly the range's length;
    /// the answer's body is then empty), in a buffer of its own if not.
    fn request_once(
        &self,
        start: u64,
        end: u64,
        into: Option<&mut [u8]>,
    ) -> std::result::Result<Answer, (Error, bool)> {
        let url = &self.url;
        let mut req = self
            .agent
            .get(url)
            .header("Range", format!("bytes={start}-{end}"))
            .header("Accept-Encoding", "identity");
        if let Some(token) = &self.token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        let mut resp = req.call().map_err(|e| {
            let transient = !matches!(
                e,
                ureq::Error::BadUri(_)
                    | ureq::Error::HostNotFound
                    | ureq::Error::TooManyRedirects
                    | ureq::Error::RedirectFailed
            );
            (http_err(format!("GET {url}: {e}")), transient)
        })?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_range = header("content-range");
        let validator = header("etag")
            .map(|v| ("ETag", v))
            .or_else(|| header("last-modified").map(|v| ("Last-Modified", v)));
        let reason = resp.status().canonical_reason().unwrap_or("");
        match status {
            206 => {}
            // An empty file has no byte to give: some servers (nginx)
            // answer its ranged request with the whole (empty) body.
            200 if header("content-length").is_some_and(|n| n.trim() == "0") => {
                return Ok(Answer::Unsatisfiable(Some(0)));
            }
            200 => {
                let size = header("content-length")
                    .map(|n| format!(" ({n} bytes)"))
                    .unwrap_or_default();
                return Err((
                    http_err(format!(
                        "GET {url}: the server answered a ranged request with the whole \
                         file{size} (200 OK, not 206 Partial Content): it does not serve byte \
                         ranges, so reading it here would download all of it; download it and \
                         open the local file instead"
                    )),
                    false,
                ));
            }
            416 => {
                let total = content_range
                    .as_deref()
                    .and_then(|r| r.strip_prefix("bytes */"))
                    .and_then(|t| t.trim().parse().ok());
                return Ok(Answer::Unsatisfiable(total));
            }
            _ => {
                let hint = match status {
                    401 | 403 => {
                        " (a private file? set PTLOAD_HTTP_TOKEN, or HF_TOKEN for huggingface.co)"
                    }
                    _ => "",
                };
                let transient = status >= 500 || status == 408 || status == 429;
                return Err((
                    http_err(format!("GET {url}: {status} {reason}{hint}")),
                    transient,
                ));
            }
        }
        let (first, last, total) = content_range
            .as_deref()
            .and_then(parse_content_range)
            .ok_or_else(|| {
                (
                    http_err(format!(
                        "GET {url}: 206 without a Content-Range of bytes (got {:?})",
                        content_range.as_deref().unwrap_or("none")
                    )),
                    false,
                )
            })?;
        let want = end - start + 1;
        if (first, last) != (start, end) {
            return Err((
                http_err(format!(
                    "GET {url}: asked for bytes {start}-{end}, the server sent {first}-{last}"
                )),
                false,
            ));
        }
        if let Some(declared) = header("content-length") {
            if declared.trim().parse::<u64>().ok() != Some(want) {
                return Err((
                    http_err(format!(
                        "GET {url}: asked for {want} bytes, the server announces {declared}"
                    )),
                    false,
                ));
            }
        }
        let body = match into {
            // Straight into the caller's buffer, which is `want` long.
            Some(out) => {
                read_body_into(&mut resp, out).map_err(|e| {
                    (
                        http_err(format!(
                            "GET {url}: reading bytes {start}-{end} failed (truncated?): {e}"
                        )),
                        true,
                    )
                })?;
                Vec::new()
            }
            None => {
                // Held once, at its size (a size the memory cannot hold
                // is an error, not an abort); never more than asked is
                // read: one byte over is enough to tell.
                let mut body = Vec::new();
                let size =
                    usize::try_from(want).map_err(|_| (http_err("range too large"), false))?;
                body.try_reserve_exact(size).map_err(|_| {
                    (
                        http_err(format!("GET {url}: cannot hold {want} bytes in memory")),
                        false,
                    )
                })?;
                use std::io::Read;
                let reader = resp.body_mut().with_config().limit(want.saturating_add(1));
                reader
                    .reader()
                    .take(want.saturating_add(1))
                    .read_to_end(&mut body)
                    .map_err(|e| {
                        (
                            http_err(format!(
                                "GET {url}: reading bytes {start}-{end} failed (truncated?): {e}"
                            )),
                            true,
                        )
                    })?;
                if body.len() as u64 != want {
                    return Err((
                        http_err(format!(
                            "GET {url}: asked for {want} bytes at {start}, the body held {}",
                            body.len()
                        )),
                        true,
                    ));
                }
                body
            }
        };
        Ok(Answer::Part(total, body, validator))
    }
}

/// `bytes FIRST-LAST/TOTAL`, with `FIRST <= LAST < TOTAL`.
fn parse_content_range(value: &str) -> Option<(u64, u64, u64)> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let (first, last, total): (u64, u64, u64) = (
        first.trim().parse().ok()?,
        last.trim().parse().ok()?,
        total.trim().parse().ok()?,
    );
    (first <= last && last < total).then_some((first, last, total))
}

/// The bearer token for `url`: `PTLOAD_HTTP_TOKEN`, or `HF_TOKEN` for
/// Hugging Face's hosts.
fn token_for(url: &str) -> Option<String> {
    token_from(
        url,
        std::env::var("PTLOAD_HTTP_TOKEN").ok(),
        std::env::var("HF_TOKEN").ok(),
    )
}

/// [`token_for`] with the variables' values given.
fn token_from(url: &str, ptload: Option<String>, hf: Option<String>) -> Option<String> {
    let nonempty = |v: String| (!v.trim().is_empty()).then(|| v.trim().to_owned());
    if let Some(t) = ptload.and_then(nonempty) {
        return Some(t);
    }
    let host = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.split(['/', '?', '#']).next())
        .map(|authority| {
            let host = authority.rsplit('@').next().unwrap_or(authority);
            host.split(':').next().unwrap_or(host).to_ascii_lowercase()
        })?;
    let hub = host == "huggingface.co" || host.ends_with(".huggingface.co");
    if hub {
        hf.and_then(nonempty)
    } else {
        None
    }
}

impl HttpFile {
    /// The body of `answer` to a request for `offset..=end`, if it is a
    /// part of the same file as the first answer.
    fn checked(&self, offset: u64, end: u64, answer: Result<Answer>) -> std::io::Result<Vec<u8>> {
        let answer = answer.map_err(|e| std::io::Error::other(e.to_string()))?;
        let (total, body, validator) = match answer {
            Answer::Part(total, body, validator) => (total, body, validator),
            Answer::Unsatisfiable(total) => {
                return Err(std::io::Error::other(format!(
                    "GET {}: no bytes {offset}-{end} (416, or an empty body) in a file \
                     first {} bytes long (now {}): it changed",
                    self.url,
                    self.len,
                    total.map_or("unknown".into(), |t| t.to_string())
                )))
            }
        };
        if total != self.len {
            return Err(std::io::Error::other(format!(
                "GET {}: the file was {} bytes, it is now {total}: it changed between requests",
                self.url, self.len
            )));
        }
        if validator != self.validator {
            let show = |v: &Option<(&str, String)>| {
                v.as_ref()
                    .map_or("none".to_owned(), |(k, v)| format!("{k} {v}"))
            };
            return Err(std::io::Error::other(format!(
                "GET {}: the file changed between requests ({} at first, {} now)",
                self.url,
                show(&self.validator),
                show(&validator)
            )));
        }
        Ok(body)
    }
}

/// Read a response's body into `out`, which must be exactly its length:
/// a body shorter or longer than `out` is an error (one byte past it is
/// read to tell).
fn read_body_into(
    resp: &mut ureq::http::Response<ureq::Body>,
    out: &mut [u8],
) -> std::io::Result<()> {
    use std::io::Read;
    let want = out.len() as u64;
    let mut reader = resp
        .body_mut()
        .with_config()
        .limit(want.saturating_add(1))
        .reader();
    let mut filled = 0;
    while let Some(rest) = out.get_mut(filled..).filter(|r| !r.is_empty()) {
        match reader.read(rest) {
            Ok(0) => {
                return Err(std::io::Error::other(format!(
                    "the body held {filled} of {want} bytes"
                )))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut extra = [0u8; 1];
    loop {
        match reader.read(&mut extra) {
            Ok(0) => return Ok(()),
            Ok(_) => {
                return Err(std::io::Error::other(format!(
                    "the body held more than the {want} bytes asked for"
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

impl RangeRead for HttpFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        let Some(end) = offset.checked_add(len).and_then(|e| e.checked_sub(1)) else {
            return Ok(Vec::new());
        };
        self.checked(offset, end, self.request(offset, end, None))
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let Some(end) = offset
            .checked_add(out.len() as u64)
            .and_then(|e| e.checked_sub(1))
        else {
            return Ok(());
        };
        let answer = self.request(offset, end, Some(out));
        self.checked(offset, end, answer).map(drop)
    }

    fn name(&self) -> &str {
        &self.url
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse_and_lies_do_not() {
        assert_eq!(parse_content_range("bytes 0-0/10"), Some((0, 0, 10)));
        assert_eq!(parse_content_range("bytes 5-9/10"), Some((5, 9, 10)));
        assert_eq!(parse_content_range("bytes 5-10/10"), None);
        assert_eq!(parse_content_range("bytes 9-5/10"), None);
        assert_eq!(parse_content_range("bytes */10"), None);
        assert_eq!(parse_content_range("items 0-1/2"), None);
    }

    #[test]
    fn hub_tokens_go_to_the_hub_only() {
        let t = |url: &str, p: Option<&str>, h: Option<&str>| {
            token_from(url, p.map(str::to_owned), h.map(str::to_owned))
        };
        let hub = "https://huggingface.co/org/m/resolve/main/pytorch_model.bin";
        assert_eq!(t(hub, None, Some("hf")), Some("hf".into()));
        assert_eq!(
            t("https://cdn.huggingface.co/x", None, Some("hf")),
            Some("hf".into())
        );
        assert_eq!(
            t("https://user@HuggingFace.co:443/x", None, Some("hf")),
            Some("hf".into())
        );
        assert_eq!(
            t("https://huggingface.co.evil.example/x", None, Some("hf")),
            None
        );
        assert_eq!(t("http://127.0.0.1:8080/x", None, Some("hf")), None);
        assert_eq!(
            t("http://127.0.0.1/x", Some("mine"), Some("hf")),
            Some("mine".into())
        );
        assert_eq!(t(hub, Some(" "), None), None);
    }
}
