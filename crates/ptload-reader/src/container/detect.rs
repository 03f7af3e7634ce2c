//! Format detection by content, never by file name.

use crate::bytes::{after, head};
use crate::error::{Error, ErrorKind, Result};
use crate::ranged::FileView;

/// Bytes from the start of a file that detection looks at.
const HEAD: usize = 4096;

/// What the first bytes of a file say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detected {
    /// A zip archive (torch >= 1.6, TorchScript); the archive may start after
    /// a prefix, found from the end-of-central-directory record.
    Zip,
    /// A stream of pickles starting with torch's legacy magic number.
    Legacy,
    /// A safetensors file (what `torch.load` of a `.safetensors` path
    /// hands to safetensors since torch 2.15), found by its content.
    Safetensors,
}

/// The pickled magic number of the legacy layout, as torch writes it:
/// PROTO 2, LONG1 of 10 bytes, 0x1950a86a20f9469cfc6c little-endian.
/// (Protocol 4 and 5 put a FRAME between the two.)
#[cfg(test)]
const LEGACY_MAGIC: [u8; 14] = [
    0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19,
];

/// The magic number itself: the LONG1 payload, 10 little-endian bytes.
pub(crate) const LEGACY_MAGIC_VALUE: [u8; 10] =
    [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

/// LONG1 (opcode 0x8a) of 10 bytes, then the value.
const LEGACY_MAGIC_LONG1: [u8; 12] = [
    0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19,
];

/// The magic number as protocols 0 and 1 write it: a text LONG.
const LEGACY_MAGIC_TEXT: &[u8] = b"L119547037146038801333356L\n";

/// Whether `block` (a file's first 512 bytes) is a tar header as Python's
/// `tarfile` accepts one, which is what makes torch.load read a non-zip
/// file as a pre-1.0 tar checkpoint: not all zeros, and the checksum
/// field (octal, or base-256) equal to the sum of the header's bytes with
/// that field counted as spaces, summed unsigned or signed. The `ustar`
/// magic is not needed (old v7 headers have none).
pub(crate) fn is_tar_header(block: &[u8]) -> bool {
    let Some(block) = block.get(..512) else {
        return false;
    };
    if block.iter().all(|&b| b == 0) {
        return false;
    }
    let (Some(before), Some(field), Some(after)) =
        (block.get(..148), block.get(148..156), block.get(156..))
    else {
        return false;
    };
    let Some(stored) = tar_number(field) else {
        return false;
    };
    let spaces = 8 * i64::from(b' ');
    let unsigned: i64 = before
        .iter()
        .chain(after)
        .map(|&b| i64::from(b))
        .sum::<i64>()
        + spaces;
    let signed: i64 = before
        .iter()
        .chain(after)
        .map(|&b| i64::from(b as i8))
        .sum::<i64>()
        + spaces;
    stored == unsigned || stored == signed
}

/// A tar header's number field as Python's `tarfile.nti` reads it:
/// base-256 when its first byte is 0x80 or 0xff, else octal text up to
/// the first NUL, surrounding whitespace ignored (empty is 0), read as
/// Python's `int(text, 8)` reads it: an optional sign, an optional `0o`
/// prefix, underscores between digits (and after the prefix).
pub(crate) fn tar_number(field: &[u8]) -> Option<i64> {
    let (&first, rest) = field.split_first()?;
    if first == 0x80 || first == 0xff {
        let mut n: i64 = 0;
        for &b in rest {
            n = n.checked_mul(256)?.checked_add(i64::from(b))?;
        }
        if first == 0xff {
            let span = 256i64.checked_pow(u32::try_from(rest.len()).ok()?)?;
            n = n.checked_sub(span)?;
        }
        return Some(n);
    }
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    let text = field.get(..end)?;
    if !text.is_ascii() {
        return None;
    }
    let text = std::str::from_utf8(text).ok()?;
    // Python's `str.strip()`: ASCII whitespace and the separators 0x1c-0x1f.
    let text = text.trim_matches(|c: char| {
        c.is_ascii_whitespace() || c == '\x0b' || ('\x1c'..='\x1f').contains(&c)
    });
    if text.is_empty() {
        return Some(0);
    }
    python_int(text, 8)
}

/// Text read as Python's `int(text, base)` reads it (base 8 or 10):
/// surrounding whitespace, an optional sign, for base 8 an optional `0o`
/// prefix, and single underscores between digits (after the prefix too).
pub(crate) fn python_int(text: &str, base: u32) -> Option<i64> {
    let text = text.trim_matches(|c: char| {
        c.is_ascii_whitespace() || c == '\x0b' || ('\x1c'..='\x1f').contains(&c)
    });
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, text.get(1..)?),
        Some(b'+') => (false, text.get(1..)?),
        _ => (false, text),
    };
    let prefixed = base == 8 && (rest.starts_with("0o") || rest.starts_with("0O"));
    let digits = if prefixed {
        let after = rest.get(2..)?;
        after.strip_prefix('_').unwrap_or(after)
    } else {
        rest
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let mut n: i64 = 0;
    for c in digits.chars().filter(|&c| c != '_') {
        n = n
            .checked_mul(i64::from(base))?
            .checked_add(i64::from(c.to_digit(base)?))?;
    }
    Some(if negative { -n } else { n })
}

/// Whether a pickle stream starts with the legacy magic number, whatever its
/// protocol: the LONG1 of the magic within the first opcodes (protocols
/// 2 to 5), or its text form first (protocols 0 and 1).
fn starts_with_legacy_magic(data: &[u8]) -> bool {
    let long1 = LEGACY_MAGIC_LONG1;
    data.starts_with(LEGACY_MAGIC_TEXT)
        || data.first() == Some(&0x80)
            && data
                .get(..data.len().min(32))
                .is_some_and(|head| head.windows(long1.len()).any(|w| w == long1))
}

fn not_a_checkpoint(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::NotACheckpoint, what)
}

/// Classify `data`. Returns the layout to read, or an error that says what
/// the bytes are when they are recognisably something else. Only the first
/// bytes and the end of the file are read.
pub(crate) fn detect<'d>(data: impl Into<FileView<'d>>) -> Result<Detected> {
    let view = data.into();
    let total = view.len();
    let data = view.up_to(0, HEAD);
    if total == 0 {
        return Err(not_a_checkpoint("empty file (0 bytes)"));
    }
    if data.starts_with(b"PK\x03\x04") || data.starts_with(b"PK\x05\x06") {
        // A zip from its first byte: the directory must be at the end.
        return if super::zip::find_eocd_in(view).is_some() {
            Ok(Detected::Zip)
        } else {
            Err(not_a_checkpoint(format!(
                "truncated zip archive: no end-of-central-directory record in {total} bytes \
                 (an interrupted download or copy?)"
            ))
            .truncated())
        };
    }
    if data.starts_with(b"version https://git-lfs.github.com/spec/") {
        // The pointer names the real file's size; without it the message
        // says less.
        let size = match std::str::from_utf8(head(data, 512))
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("size ")))
        {
            Some(s) => format!(" of a {}-byte file", s.trim()),
            None => String::new(),
        };
        return Err(not_a_checkpoint(format!(
            "this is a Git LFS pointer{size}, not the checkpoint: the repository was cloned \
             without LFS; run `git lfs pull` (or install git-lfs and clone again)"
        )));
    }
    if looks_like_html(data) {
        return Err(not_a_checkpoint(
            "this is an HTML page, not a checkpoint: the download probably returned an error \
             or login page",
        ));
    }
    if let Some(what) = other_format(data, total) {
        return Err(not_a_checkpoint(what));
    }
    if looks_like_safetensors(data, total) {
        return Ok(Detected::Safetensors);
    }
    if starts_with_legacy_magic(data) {
        return Ok(Detected::Legacy);
    }
    if is_tar_header(data) {
        return Err(Error::new(
            ErrorKind::UnsupportedLayout,
            "pre-1.0 tar checkpoint layout (members `storages`, `tensors`, `pickle`) is \
             detected but not read: re-save it with torch >= 1.6",
        ));
    }
    // A zip preceded by other bytes.
    if super::zip::find_eocd_in(view).is_some() {
        return Ok(Detected::Zip);
    }
    if data.first() == Some(&0x80) {
        return Err(not_a_checkpoint(
            "a Python pickle without torch's magic number: not a torch checkpoint \
             (torch says: Invalid magic number; corrupt file?)",
        ));
    }
    let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Err(not_a_checkpoint(format!(
        "unknown format: {} bytes starting with {}",
        total,
        head.join(" ")
    )))
}

/// Files often found where a checkpoint was expected, by their first
/// bytes: compressed archives, error bodies from storage services, other
/// model and array formats.
fn other_format(data: &[u8], total: usize) -> Option<String> {
    const MAGIC: &[(&[u8], &str)] = &[
        (
            b"\x1f\x8b",
            "this is gzip-compressed data, not a checkpoint: decompress it first (gunzip)",
        ),
        (
            b"\xfd7zXZ\0",
            "this is xz-compressed data, not a checkpoint: decompress it first (unxz)",
        ),
        (
            b"\x28\xb5\x2f\xfd",
            "this is zstd-compressed data, not a checkpoint: decompress it first (unzstd)",
        ),
        (
            b"BZh",
            "this is bzip2-compressed data, not a checkpoint: decompress it first (bunzip2)",
        ),
        (
            b"GGUF",
            "this is a GGUF model file (llama.cpp), not a torch checkpoint",
        ),
        (
            b"\x93NUMPY",
            "this is a numpy .npy array, not a torch checkpoint: read it with numpy.load",
        ),
        (
            b"\x89HDF\r\n\x1a\n",
            "this is an HDF5 file (Keras .h5?), not a torch checkpoint",
        ),
    ];
    if let Some((_, what)) = MAGIC.iter().find(|(magic, _)| data.starts_with(magic)) {
        return Some((*what).to_owned());
    }
    // Text bodies a storage service or API returns instead of the file.
    let first = head(data, 512);
    let first = first.strip_prefix(b"\xef\xbb\xbf").unwrap_or(first);
    let start = first.iter().position(|b| !b.is_ascii_whitespace())?;
    let text = after(first, start);
    if text.starts_with(b"<?xml") || text.starts_with(b"<Error>") {
        // An error document without a code is named without one.
        let code = match std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.split("<Code>").nth(1))
            .and_then(|t| t.split('<').next())
        {
            Some(c) => format!(" ({c})"),
            None => String::new(),
        };
        return Some(format!(
            "this is an XML document{code}, not a checkpoint: the download probably returned \
             a storage service's error (S3, GCS)"
        ));
    }
    if (text.starts_with(b"{\"") || text.starts_with(b"[")) && total < 1 << 20 {
        return Some(
            "this is a JSON document, not a checkpoint: the download probably returned an API \
             error, or this is a config or index file (a sharded checkpoint's index names its \
             shards)"
                .to_owned(),
        );
    }
    None
}

fn looks_like_html(data: &[u8]) -> bool {
    let first = head(data, 1024);
    let first = first.strip_prefix(b"\xef\xbb\xbf").unwrap_or(first);
    let start = first
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(first.len());
    let rest = after(first, start);
    let lower: Vec<u8> = rest.iter().take(15).map(u8::to_ascii_lowercase).collect();
    lower.starts_with(b"<!doctype html")
        || lower.starts_with(b"<html")
        || lower.starts_with(b"<head")
}

fn looks_like_safetensors(data: &[u8], total: usize) -> bool {
    let Some(len) = data.get(..8) else {
        return false;
    };
    let mut b = [0u8; 8];
    b.copy_from_slice(len);
    let n = u64::from_le_bytes(b);
    let total = u64::try_from(total).unwrap_or(u64::MAX);
    n >= 2 && n <= total.saturating_sub(8) && data.get(8) == Some(&b'{')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(data: &[u8]) -> String {
        detect(data)
            .map(|d| format!("{d:?}"))
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn magic_number_forms_agree() {
        assert_eq!(LEGACY_MAGIC[2..], LEGACY_MAGIC_LONG1);
        assert_eq!(LEGACY_MAGIC_LONG1[2..], LEGACY_MAGIC_VALUE);
        let text = std::str::from_utf8(&LEGACY_MAGIC_TEXT[1..LEGACY_MAGIC_TEXT.len() - 2]).unwrap();
        let mut value = [0u8; 16];
        value[..10].copy_from_slice(&LEGACY_MAGIC_VALUE);
        assert_eq!(text.parse::<u128>().unwrap(), u128::from_le_bytes(value));
    }

    #[test]
    fn names_what_is_not_a_checkpoint() {
        assert!(message(b"").contains("empty file"));
        assert!(
            message(b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 42\n")
                .contains("Git LFS pointer of a 42-byte file")
        );
        assert!(message(b"\n  <!DOCTYPE html><html>").contains("HTML page"));
        assert!(message(b"\x02\0\0\0\0\0\0\0{}").contains("Safetensors"));
        assert!(message(b"\x1f\x8b\x08\0rest").contains("gzip-compressed"));
        assert!(message(b"\xfd7zXZ\0rest").contains("xz-compressed"));
        assert!(message(b"GGUF\x03\0").contains("GGUF"));
        assert!(message(b"\x93NUMPY\x01\0").contains("numpy"));
        let s3 = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code>\
                   <Message>Access Denied</Message></Error>";
        assert!(
            message(s3).contains("XML document (AccessDenied)"),
            "{}",
            message(s3)
        );
        assert!(message(b"<Error><Code>NoSuchKey</Code></Error>").contains("(NoSuchKey)"));
        assert!(message(b"  {\"error\": \"Repository not found\"}").contains("JSON document"));
        assert!(message(b"[1, 2]").contains("JSON document"));
        assert!(message(b"PK\x03\x04abc").contains("truncated zip"));
        assert!(message(b"\x80\x02}q\x00.").contains("magic number"));
        assert!(message(b"\x01\x02\x03").contains("unknown format: 3 bytes starting with 01 02 03"));
        let mut tar = vec![0u8; 600];
        tar[..7].copy_from_slice(b"storage");
        tar[257..262].copy_from_slice(b"ustar");
        checksummed(&mut tar);
        assert!(message(&tar).contains("pre-1.0 tar"));
        assert_eq!(message(&LEGACY_MAGIC), "Legacy");
    }

    /// Write the checksum Python's tarfile writes (six octal digits, NUL,
    /// space) into a header.
    fn checksummed(block: &mut [u8]) {
        block[148..156].fill(b' ');
        let sum: u32 = block[..512].iter().map(|&b| u32::from(b)).sum();
        block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    }

    /// A header is tar as Python's tarfile decides (torch.load asks it
    /// first): by its checksum, with or without the `ustar` magic; the
    /// magic alone is not enough, and all zeros is the end, not a header.
    #[test]
    fn tar_headers_are_told_by_their_checksum_as_tarfile_does() {
        let mut v7 = vec![0u8; 512];
        v7[..6].copy_from_slice(b"pickle");
        checksummed(&mut v7);
        assert!(is_tar_header(&v7), "a v7 header without the magic");
        // Bytes that also read as a pickle: byte 0 is where a pickle starts.
        let mut both = vec![0u8; 512];
        both[..4].copy_from_slice(b"\x80\x02}.");
        checksummed(&mut both);
        assert!(is_tar_header(&both));
        let mut magic_only = vec![0u8; 512];
        magic_only[257..262].copy_from_slice(b"ustar");
        assert!(!is_tar_header(&magic_only), "the magic without a checksum");
        assert!(!is_tar_header(&[0u8; 512]));
        assert!(!is_tar_header(&v7[..511]), "short");
        // The field as Python's int() reads it: spaces, a sign,
        // underscores; base-256.
        assert_eq!(tar_number(b"  0644 \0"), Some(0o644));
        assert_eq!(tar_number(b"+1_0\0\0\0\0"), Some(0o10));
        assert_eq!(tar_number(b"\0       "), Some(0));
        assert_eq!(tar_number(b"0_\0"), None);
        assert_eq!(tar_number(b"9\0"), None);
        assert_eq!(tar_number(b"\x80\0\0\0\0\0\x01\x02"), Some(258));
        assert_eq!(tar_number(b"\xff\xff\xff\xff\xff\xff\xff\xff"), Some(-1));
        // int(text, 8) takes a 0o prefix, an underscore after it, and
        // stops at the first NUL (what follows is not read).
        assert_eq!(tar_number(b"0o164\0\0\0"), Some(0o164));
        assert_eq!(tar_number(b" -0O_17 \0"), Some(-0o17));
        assert_eq!(tar_number(b"0_1_7_3\0"), Some(0o173));
        assert_eq!(tar_number(b"13\0junk\0"), Some(0o13));
        assert_eq!(tar_number(b"0o\0"), None);
        assert_eq!(tar_number(b"0_o17\0"), None);
        // PAX numbers: int(text) in base 10.
        assert_eq!(python_int("1_17", 10), Some(117));
        assert_eq!(python_int(" 010\n", 10), Some(10));
        assert_eq!(python_int("0o10", 10), None);
        assert_eq!(python_int("1__7", 10), None);
        // A checksum summed over signed bytes is accepted too.
        let mut signed = vec![0u8; 512];
        signed[..3].copy_from_slice(b"\xe9ab");
        signed[148..156].fill(b' ');
        let sum: i64 = signed.iter().map(|&b| i64::from(b as i8)).sum();
        signed[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        assert!(is_tar_header(&signed));
    }
}
