//! The safetensors layout: an 8-byte little-endian header length, a JSON
//! header naming each tensor's dtype, shape and byte range in the data that
//! follows, and optional `__metadata__` (string to string).
//!
//! The header is hostile input: its length is bounded before anything is
//! read, its JSON read token by token (`crate::json`, whose nesting limit
//! stops a deep document with an error, never a stack overflow), duplicate
//! names are
//! refused (a JSON map would keep one silently), each tensor's byte range
//! must hold exactly its dtype and shape, and the ranges must tile the data
//! in order with no gap or overlap, as the safetensors library requires.

use crate::error::{Error, ErrorKind, Result};
use crate::json::{JsonError, JsonResult, Reader, Token};
use crate::limits::Limits;
use crate::ranged::FileView;

/// One tensor of the header.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) name: String,
    /// The dtype's name, as safetensors writes it (`F32`, `BF16`...).
    pub(crate) dtype: String,
    pub(crate) shape: Vec<u64>,
    /// Byte range in the data section.
    pub(crate) begin: u64,
    pub(crate) end: u64,
}

/// A checked header.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    /// The tensors, in the header's order.
    pub(crate) entries: Vec<Entry>,
    /// `__metadata__`, in the header's order.
    pub(crate) metadata: Vec<(String, String)>,
    /// Offset of the data section in the file.
    pub(crate) data_start: u64,
    /// Offset just past the data section: the end of the file.
    pub(crate) end: u64,
}

/// The largest header the safetensors library reads (its own bound, below
/// `Limits::max_index_bytes`).
const MAX_HEADER: u64 = 100_000_000;

/// Dimensions a tensor may have: torch's own bound; a longer list in a
/// header is refused while it is read, before it is held.
const MAX_DIMS: usize = 64;

fn bad(message: impl Into<String>) -> Error {
    Error::new(
        ErrorKind::Tensor,
        format!("safetensors: {}", message.into()),
    )
}

/// Parse and check the safetensors header at the start of `view`;
/// `element_size` gives the bytes of an element of a dtype the header
/// names, `None` for a dtype the caller does not read.
pub(crate) fn parse(
    view: FileView<'_>,
    limits: &Limits,
    element_size: impl Fn(&str) -> Option<u64>,
) -> Result<Header> {
    let total = view.len() as u64;
    let len = view
        .get(0..8)
        .ok_or_else(|| bad("shorter than its 8-byte header length"))?;
    let mut b = [0u8; 8];
    b.copy_from_slice(len);
    let n = u64::from_le_bytes(b);
    let most = limits.max_index_bytes.min(MAX_HEADER);
    if n > most {
        return Err(Error::limit_needing("max_index_bytes", most, n));
    }
    let data_start = n.checked_add(8).filter(|&s| s <= total).ok_or_else(|| {
        bad(format!(
            "a header of {n} bytes runs past the file's {total}"
        ))
    })?;
    let text = view
        .get(8..usize::try_from(data_start).map_err(|_| bad("header too large"))?)
        .ok_or_else(|| bad("the header is not fetched yet"))?;
    let data_len = total - data_start;
    let raw = parse_json(text, limits.max_tensors)?;
    let mut entries = Vec::with_capacity(raw.tensors.len());
    for (name, t) in raw.tensors {
        let at = |m: String| bad(m).for_tensor(&name);
        let shape = t.shape;
        let size = element_size(&t.dtype)
            .ok_or_else(|| at(format!("dtype {:?} is not one ptload reads", t.dtype)))?;
        let numel = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| at(format!("shape {shape:?} overflows")))?;
        let nbytes = numel
            .checked_mul(size)
            .ok_or_else(|| at(format!("shape {shape:?} overflows")))?;
        let [begin, end] = t.data_offsets;
        if begin > end || end > data_len {
            return Err(at(format!(
                "data_offsets [{begin}, {end}] outside the {data_len} bytes of data"
            )));
        }
        if end - begin != nbytes {
            return Err(at(format!(
                "data_offsets [{begin}, {end}] hold {} bytes, where {} {shape:?} takes {nbytes}",
                end - begin,
                t.dtype,
            )));
        }
        entries.push(Entry {
            name,
            dtype: t.dtype,
            shape,
            begin,
            end,
        });
    }
    check_tiling(&entries, data_len)?;
    Ok(Header {
        entries,
        metadata: raw.metadata,
        data_start,
        end: total,
    })
}

/// The ranges, taken in order, must cover the data exactly: each starts
/// where the one before ended, and the last ends with the file.
fn check_tiling(entries: &[Entry], data_len: u64) -> Result<()> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| entries.get(i).map(|e| (e.begin, e.end)));
    let mut at = 0u64;
    for e in order.iter().filter_map(|&i| entries.get(i)) {
        if e.begin != at {
            let what = if e.begin < at {
                "overlaps"
            } else {
                "leaves a gap before"
            };
            return Err(bad(format!(
                "data_offsets [{}, {}] {what} the tensor before it (which ends at {at})",
                e.begin, e.end
            ))
            .for_tensor(&e.name));
        }
        at = e.end;
    }
    if at != data_len {
        return Err(bad(format!(
            "the tensors end at byte {at} of the data, which has {data_len}"
        )));
    }
    Ok(())
}

/// What the JSON says, before the checks against the file.
struct RawHeader {
    tensors: Vec<(String, RawTensor)>,
    metadata: Vec<(String, String)>,
}

struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// The header's JSON, read token by token: tensors in order, counted as
/// they are read (past `max_tensors` is refused before more is held),
/// names once each (a JSON map would keep one silently).
fn parse_json(text: &[u8], max_tensors: usize) -> Result<RawHeader> {
    let header = |e: JsonError| bad(format!("header: {e}"));
    let mut r = Reader::new(text).map_err(header)?;
    r.begin_object("the header").map_err(header)?;
    let mut tensors: Vec<(String, RawTensor)> = Vec::new();
    let mut metadata = None;
    let mut seen = hashbrown::HashSet::new();
    while let Some(key) = r.key().map_err(header)? {
        // A name borrowed from the text unless it has escapes: counted
        // once without a copy.
        if !seen.insert(key.clone()) {
            return Err(header(r.error(format!("{key:?} is named twice"))));
        }
        if key == "__metadata__" {
            metadata = Some(read_metadata(&mut r).map_err(header)?);
        } else {
            if tensors.len() == max_tensors {
                return Err(Error::limit("max_tensors", max_tensors as u64));
            }
            let t = read_tensor(&mut r).map_err(|e| header(e).for_tensor(&key))?;
            tensors.push((key.into_owned(), t));
        }
    }
    r.end().map_err(header)?;
    Ok(RawHeader {
        tensors,
        metadata: metadata.unwrap_or_default(),
    })
}

/// `{"dtype": ..., "shape": [...], "data_offsets": [begin, end]}`; other
/// keys are passed over, each of these is needed once.
fn read_tensor(r: &mut Reader<'_>) -> JsonResult<RawTensor> {
    r.begin_object("a tensor")?;
    let (mut dtype, mut shape, mut offsets) = (None, None, None);
    while let Some(key) = r.key()? {
        let twice = || r.error(format!("duplicate field {key:?}"));
        match &*key {
            "dtype" if dtype.is_some() => return Err(twice()),
            "shape" if shape.is_some() => return Err(twice()),
            "data_offsets" if offsets.is_some() => return Err(twice()),
            "dtype" => dtype = Some(r.string_value("dtype")?),
            "shape" => shape = Some(r.u64_list("a shape", MAX_DIMS)?),
            "data_offsets" => offsets = Some(r.u64_pair("data_offsets")?),
            _ => {
                let t = r.token()?;
                r.skip(&t)?;
            }
        }
    }
    let missing = |field: &str| r.error(format!("missing field {field:?}"));
    Ok(RawTensor {
        dtype: dtype.ok_or_else(|| missing("dtype"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
        data_offsets: offsets.ok_or_else(|| missing("data_offsets"))?,
    })
}

/// `__metadata__`: strings by string, in order, names once each; `null`
/// (which some safetensors versions write for none) is none.
fn read_metadata(r: &mut Reader<'_>) -> JsonResult<Vec<(String, String)>> {
    match r.token()? {
        Token::BeginObject => {}
        Token::Null => return Ok(Vec::new()),
        t => {
            return Err(r.error(format!(
                "__metadata__ is {}, not an object of strings",
                t.what()
            )))
        }
    }
    let mut out: Vec<(String, String)> = Vec::new();
    let mut seen = hashbrown::HashSet::new();
    while let Some(key) = r.key()? {
        let key = key.into_owned();
        if !seen.insert(key.clone()) {
            return Err(r.error(format!("__metadata__ names {key:?} twice")));
        }
        let value = r.string_value("a value of __metadata__")?;
        out.push((key, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.resize(out.len() + data, 0);
        out
    }

    fn sizes(name: &str) -> Option<u64> {
        match name {
            "F32" => Some(4),
            "BF16" => Some(2),
            _ => None,
        }
    }

    fn parsed(header: &str, data: usize) -> Result<Header> {
        let bytes = file(header, data);
        parse(FileView::from(bytes.as_slice()), &Limits::default(), sizes)
    }

    #[test]
    fn a_well_formed_header_reads_in_order() {
        let h = parsed(
            r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[],"data_offsets":[8,10]}}"#,
            10,
        )
        .unwrap();
        let names: Vec<&str> = h.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!(h.metadata, [("format".to_owned(), "pt".to_owned())]);
        assert_eq!(h.entries[1].dtype, "BF16");
    }

    #[test]
    fn hostile_headers_are_errors() {
        let t = |s: &str| format!("{{{s}}}");
        let cases = [
            (
                t(
                    r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}"#,
                ),
                16,
                "twice",
            ),
            (
                t(
                    r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}"#,
                ),
                12,
                "overlaps",
            ),
            (
                t(r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#),
                4,
                "outside",
            ),
            (
                t(r#""a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}"#),
                8,
                "takes 12",
            ),
            (
                t(r#""a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}"#),
                8,
                "overflows",
            ),
            (
                t(r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#),
                12,
                "which has 12",
            ),
            (
                t(r#""a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}"#),
                8,
                "gap",
            ),
            (
                t(r#""a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}"#),
                1,
                "not one ptload reads",
            ),
            (t(r#""__metadata__":{"k":1}"#), 0, "header"),
            ("[1,2]".to_owned(), 0, "header"),
            (
                format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
                0,
                "header",
            ),
            (
                t(r#""a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} trailing"#),
                4,
                "header",
            ),
        ];
        for (header, data, says) in cases {
            let e = parsed(&header, data).unwrap_err().to_string();
            assert!(e.contains(says), "{header:.80}: {e}");
        }
        let mut not_utf8 = file(
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            4,
        );
        not_utf8[10] = 0xff;
        assert!(parse(
            FileView::from(not_utf8.as_slice()),
            &Limits::default(),
            sizes
        )
        .is_err());
    }

    #[test]
    fn an_enormous_header_length_is_refused_before_reading() {
        let mut bytes = (MAX_HEADER + 1).to_le_bytes().to_vec();
        bytes.push(b'{');
        let e = parse(FileView::from(bytes.as_slice()), &Limits::default(), sizes).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LimitExceeded);
        let mut bytes = 1000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let e = parse(FileView::from(bytes.as_slice()), &Limits::default(), sizes).unwrap_err();
        assert!(e.to_string().contains("runs past"), "{e}");
    }
}

#[cfg(test)]
mod count_tests {
    use super::*;

    #[test]
    fn tensors_past_the_limit_are_refused_while_read() {
        let header = r#"{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[],"data_offsets":[4,8]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + 8, 0);
        let limits = Limits {
            max_tensors: 1,
            ..Limits::default()
        };
        let e = parse(FileView::from(bytes.as_slice()), &limits, |_| Some(4)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    }
}
