//! The JSON ptload writes: a safetensors header, the values in its
//! `__metadata__`, and a sharded set's index. Serialized with serde_json;
//! strings escape control characters as `\n`, `\r`, `\t` or `\u00XX`
//! (backspace and form feed included), so headers keep the bytes earlier
//! versions wrote.

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter, PrettyFormatter, Serializer};

use crate::error::{Error, ErrorKind, Result};
use crate::torch::dtype::DType;
use crate::torch::names::Scalar;

/// A safetensors header: `__metadata__` (when not empty) first, then one
/// entry per tensor in the order written. Keys keep their order.
#[derive(Serialize)]
pub(super) struct Header<'a> {
    #[serde(rename = "__metadata__", skip_serializing_if = "<[_]>::is_empty")]
    #[serde(serialize_with = "as_map")]
    pub(super) metadata: &'a [(String, String)],
    #[serde(flatten)]
    #[serde(serialize_with = "as_map")]
    pub(super) tensors: Vec<(&'a str, Entry<'a>)>,
}

/// One tensor of a safetensors header.
#[derive(Serialize)]
pub(super) struct Entry<'a> {
    #[serde(serialize_with = "dtype_name")]
    pub(super) dtype: DType,
    pub(super) shape: &'a [u64],
    pub(super) data_offsets: [u64; 2],
}

fn dtype_name<S: serde::Serializer>(d: &DType, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(d.name())
}

fn as_map<S, K, V>(pairs: &[(K, V)], s: S) -> std::result::Result<S::Ok, S::Error>
where
    S: serde::Serializer,
    K: Serialize,
    V: Serialize,
{
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

impl Header<'_> {
    /// The header's bytes, padded with spaces so the data after its 8-byte
    /// length starts 8-byte aligned.
    pub(super) fn to_padded(&self) -> Result<String> {
        let mut header = compact(self)?;
        while (header.len() + 8) % 8 != 0 {
            header.push(' ');
        }
        Ok(header)
    }
}

/// A sharded set's `model.safetensors.index.json`, as Hugging Face writes
/// it: two-space indents, names sorted, a final newline.
pub(super) fn index(total_size: u64, weight_map: &[(String, String)]) -> Result<String> {
    #[derive(Serialize)]
    struct Index<'a> {
        metadata: Total,
        #[serde(serialize_with = "as_map")]
        weight_map: &'a [(String, String)],
    }
    #[derive(Serialize)]
    struct Total {
        total_size: u64,
    }
    let mut out = Vec::new();
    let mut ser = Serializer::with_formatter(&mut out, Escapes(PrettyFormatter::new()));
    Index {
        metadata: Total { total_size },
        weight_map,
    }
    .serialize(&mut ser)
    .map_err(json_failed)?;
    let mut text = String::from_utf8(out).map_err(|_| json_failed_text())?;
    text.push('\n');
    Ok(text)
}

/// `value` as compact JSON text.
pub(super) fn compact<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    let mut out = Vec::new();
    let mut ser = Serializer::with_formatter(&mut out, Escapes(CompactFormatter));
    value.serialize(&mut ser).map_err(json_failed)?;
    String::from_utf8(out).map_err(|_| json_failed_text())
}

fn json_failed(e: serde_json::Error) -> Error {
    Error::new(ErrorKind::Tensor, format!("cannot write the header: {e}"))
}

fn json_failed_text() -> Error {
    Error::new(ErrorKind::Tensor, "cannot write the header: not UTF-8")
}

/// A float as Rust prints it (`1e-5`, `0.5`), which is the text these
/// values have always had; `None` when not finite.
fn float_text(f: f64) -> Option<String> {
    f.is_finite().then(|| format!("{f:?}"))
}

/// A plain value as JSON text, or `None` for values that are not plain.
pub(super) fn plain_json(v: &Scalar) -> Option<String> {
    match v {
        Scalar::Bool(b) => Some(b.to_string()),
        Scalar::Int(i) => Some(i.to_string()),
        Scalar::Float(f) => float_text(*f),
        Scalar::Str(s) => compact(s).ok(),
        _ => None,
    }
}

/// serde_json's layout (`F`), with backspace and form feed escaped as
/// `\u0008` and `\u000c` like every other control character but `\n`, `\r`
/// and `\t`.
struct Escapes<F>(F);

impl<F: Formatter> Formatter for Escapes<F> {
    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        escape: CharEscape,
    ) -> std::io::Result<()> {
        match escape {
            CharEscape::Backspace => writer.write_all(b"\\u0008"),
            CharEscape::FormFeed => writer.write_all(b"\\u000c"),
            other => self.0.write_char_escape(writer, other),
        }
    }
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn end_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_key(w)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The escapes earlier versions wrote by hand, control characters
    /// included.
    #[test]
    fn strings_escape_as_before() {
        let s = "a\"b\\c\nd\re\tf\u{8}g\u{c}h\u{1}i\u{1f}j\u{7f}é";
        assert_eq!(
            compact(s).unwrap(),
            "\"a\\\"b\\\\c\\nd\\re\\tf\\u0008g\\u000ch\\u0001i\\u001fj\u{7f}é\""
        );
    }

    #[test]
    fn floats_keep_their_text() {
        assert_eq!(plain_json(&Scalar::Float(1e-5)).as_deref(), Some("1e-5"));
        assert_eq!(plain_json(&Scalar::Float(0.5)).as_deref(), Some("0.5"));
        assert_eq!(plain_json(&Scalar::Float(f64::NAN)), None);
    }

    #[test]
    fn an_index_is_laid_out_as_hugging_face_writes_it() {
        let map = [
            ("a".to_owned(), "m-1.safetensors".to_owned()),
            ("b".to_owned(), "m-2.safetensors".to_owned()),
        ];
        assert_eq!(
            index(12, &map).unwrap(),
            "{\n  \"metadata\": {\n    \"total_size\": 12\n  },\n  \"weight_map\": {\n    \
             \"a\": \"m-1.safetensors\",\n    \"b\": \"m-2.safetensors\"\n  }\n}\n"
        );
    }
}
