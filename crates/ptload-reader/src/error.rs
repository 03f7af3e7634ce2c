//! The reader's one error type: what went wrong, in which layer, and where.

use std::fmt;

use crate::advice::{Advised, Hint, Neutral, Terms};

/// The layer and class of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Reading the file failed (open, metadata, map).
    Io,
    /// The bytes are not a torch checkpoint; the message says what they look like.
    NotACheckpoint,
    /// A checkpoint layout that is recognised but not read (the pre-1.0 tar layout).
    UnsupportedLayout,
    /// The zip container is malformed or uses something the reader refuses.
    Zip,
    /// The legacy (pre-1.6) stream layout is malformed.
    Legacy,
    /// The pickle program is malformed.
    Pickle,
    /// A Python 2 string does not decode in the encoding asked for
    /// ([`StringEncoding`](crate::checkpoint::StringEncoding)).
    Decode,
    /// A global that the strict policy does not allow.
    UnsupportedGlobal,
    /// The scanner's verdict on the file is at or above the level the
    /// caller refuses ([`OpenOptions::refuse_at`](crate::OpenOptions::refuse_at)):
    /// the message names the finding.
    Refused,
    /// A storage or tensor record is inconsistent with its data.
    Tensor,
    /// A configured [`Limits`](crate::Limits) value was exceeded.
    LimitExceeded,
    /// Something valid that this reader does not read.
    Unsupported,
    /// A spec given by the caller (a map location) does not parse.
    InvalidSpec,
    /// Two tensors flatten to the same name (`{"a.b": t0, "a": {"b": t1}}`).
    DuplicateName,
    /// An output file exists and overwriting was not asked for.
    OutputExists,
    /// An output path that is never written: the input itself, or not a
    /// regular file.
    OutputRefused,
    /// The caller cancelled the operation.
    Cancelled,
    /// A typed read asked for a Rust type of another element type
    /// (`as_slice::<f32>()` on an F16 tensor).
    DTypeMismatch,
    /// The elements cannot be borrowed from the file as they lie (strided,
    /// stored in the other byte order, with a pending conj/neg bit, or
    /// misaligned for the type): read them into an owned buffer instead.
    NotBorrowable,
}

impl ErrorKind {
    /// Every kind, for front ends that map each to one of their own (the
    /// Python package's exception classes) and test that none is missing.
    pub const ALL: [ErrorKind; 19] = [
        ErrorKind::Io,
        ErrorKind::NotACheckpoint,
        ErrorKind::UnsupportedLayout,
        ErrorKind::Zip,
        ErrorKind::Legacy,
        ErrorKind::Pickle,
        ErrorKind::Decode,
        ErrorKind::UnsupportedGlobal,
        ErrorKind::Refused,
        ErrorKind::Tensor,
        ErrorKind::LimitExceeded,
        ErrorKind::Unsupported,
        ErrorKind::InvalidSpec,
        ErrorKind::DuplicateName,
        ErrorKind::OutputExists,
        ErrorKind::OutputRefused,
        ErrorKind::Cancelled,
        ErrorKind::DTypeMismatch,
        ErrorKind::NotBorrowable,
    ];

    /// The kind's name as written here (`NotACheckpoint`): stable, what
    /// front ends key on.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Io => "Io",
            ErrorKind::NotACheckpoint => "NotACheckpoint",
            ErrorKind::UnsupportedLayout => "UnsupportedLayout",
            ErrorKind::Zip => "Zip",
            ErrorKind::Legacy => "Legacy",
            ErrorKind::Pickle => "Pickle",
            ErrorKind::Decode => "Decode",
            ErrorKind::UnsupportedGlobal => "UnsupportedGlobal",
            ErrorKind::Refused => "Refused",
            ErrorKind::Tensor => "Tensor",
            ErrorKind::LimitExceeded => "LimitExceeded",
            ErrorKind::Unsupported => "Unsupported",
            ErrorKind::InvalidSpec => "InvalidSpec",
            ErrorKind::DuplicateName => "DuplicateName",
            ErrorKind::OutputExists => "OutputExists",
            ErrorKind::OutputRefused => "OutputRefused",
            ErrorKind::Cancelled => "Cancelled",
            ErrorKind::DTypeMismatch => "DTypeMismatch",
            ErrorKind::NotBorrowable => "NotBorrowable",
        }
    }

    fn layer(self) -> &'static str {
        match self {
            ErrorKind::Io => "io",
            ErrorKind::NotACheckpoint => "format",
            ErrorKind::UnsupportedLayout => "format",
            ErrorKind::Zip => "zip",
            ErrorKind::Legacy => "legacy",
            ErrorKind::Pickle => "pickle",
            ErrorKind::Decode => "decode",
            ErrorKind::UnsupportedGlobal | ErrorKind::Refused => "policy",
            ErrorKind::Tensor => "tensor",
            ErrorKind::LimitExceeded => "limit",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::InvalidSpec => "spec",
            ErrorKind::DuplicateName => "names",
            ErrorKind::OutputExists | ErrorKind::OutputRefused => "output",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::DTypeMismatch | ErrorKind::NotBorrowable => "access",
        }
    }
}

/// An error from reading a checkpoint.
///
/// Its `Display` reads like `pickle: unknown opcode 0xff at offset 0x1a in
/// model/data.pkl`: the layer, what went wrong, then where (byte offset inside
/// the record, the record, the tensor) when known.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    message: Advised,
    offset: Option<u64>,
    record: Option<String>,
    tensor: Option<String>,
    /// The file of a checkpoint set the failure is in.
    file: Option<String>,
    /// More the reader found, after the location (every refused global).
    note: Option<Advised>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
    /// The bytes at hand ended before what was being read: with more of
    /// the file (a read by ranges), the same read may succeed.
    ran_out: bool,
    /// The file ends before what it says it holds (see
    /// [`Error::is_truncated`]).
    truncated: bool,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                message: Advised::plain(message.into()),
                offset: None,
                record: None,
                tensor: None,
                file: None,
                note: None,
                source: None,
                ran_out: false,
                truncated: false,
            }),
        }
    }

    /// The bytes at hand ended before what was being read (`message` says
    /// what was wanted): [`ran_out`](Self::ran_out) is true.
    pub(crate) fn end_of_data(kind: ErrorKind, message: impl Into<String>) -> Self {
        let mut e = Error::new(kind, message);
        e.inner.ran_out = true;
        e
    }

    /// Whether the bytes at hand ended before what was being read, so
    /// that more of the file could let the same read succeed.
    pub(crate) fn ran_out(&self) -> bool {
        self.inner.ran_out
    }

    /// Mark the error as the file ending early (see
    /// [`is_truncated`](Self::is_truncated)).
    pub(crate) fn truncated(mut self) -> Self {
        self.inner.truncated = true;
        self
    }

    /// Whether the file ends before what it says it holds: a zip whose
    /// directory is missing from its end, a pickle or a record that runs
    /// past the last byte. An interrupted download or copy looks like
    /// this: fetching the file again may help, where a file of another
    /// kind ([`ErrorKind::NotACheckpoint`] without this) will not change.
    /// The kind stays the layer's (`NotACheckpoint`, `Pickle`, `Zip`...).
    pub fn is_truncated(&self) -> bool {
        self.inner.truncated || self.inner.ran_out
    }

    pub(crate) fn io(message: impl Into<String>, source: std::io::Error) -> Self {
        Error::new(ErrorKind::Io, message).caused_by(source)
    }

    /// The OS error behind this one (kept as its source).
    pub(crate) fn caused_by(mut self, source: std::io::Error) -> Self {
        self.inner.source = Some(Box::new(source));
        self
    }

    pub(crate) fn limit(name: &'static str, value: u64) -> Self {
        Error::new(
            ErrorKind::LimitExceeded,
            format!("{name} ({value}) exceeded"),
        )
        .with_hint(Hint::RaiseLimit {
            limit: name,
            value,
            needed: None,
        })
    }

    /// [`Error::limit`] where the value that would do is known.
    pub(crate) fn limit_needing(name: &'static str, value: u64, needed: u64) -> Self {
        Error::limit(name, value).with_hint(Hint::RaiseLimit {
            limit: name,
            value,
            needed: Some(needed),
        })
    }

    /// End the message with `hint` (see [`Terms`] for where it goes).
    pub(crate) fn with_hint(mut self, hint: Hint) -> Self {
        self.inner.message.hint = Some(hint);
        self
    }

    pub(crate) fn at(mut self, offset: u64) -> Self {
        if self.inner.offset.is_none() {
            self.inner.offset = Some(offset);
        }
        self
    }

    pub(crate) fn in_record(mut self, record: &str) -> Self {
        if self.inner.record.is_none() {
            self.inner.record = Some(record.to_owned());
        }
        self
    }

    pub(crate) fn with_note(mut self, note: String, hint: Option<Hint>) -> Self {
        self.inner.note = Some(Advised { text: note, hint });
        self
    }

    pub(crate) fn for_tensor(mut self, tensor: &str) -> Self {
        if self.inner.tensor.is_none() {
            self.inner.tensor = Some(tensor.to_owned());
        }
        self
    }

    pub(crate) fn in_file(mut self, file: &str) -> Self {
        if self.inner.file.is_none() {
            self.inner.file = Some(file.to_owned());
        }
        self
    }

    /// The class of failure.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// What went wrong, without the location or the hint.
    pub fn message(&self) -> &str {
        &self.inner.message.text
    }

    /// What the caller could do about it, as data for a front end to word.
    pub fn hint(&self) -> Option<&Hint> {
        let note = self.inner.note.as_ref().and_then(|n| n.hint.as_ref());
        note.or(self.inner.message.hint.as_ref())
    }

    /// The whole account for a user: [`Display`](fmt::Display)'s text with
    /// the hint in `terms`, then each [`source`](std::error::Error::source)
    /// in the chain after a colon.
    pub fn render(&self, terms: &dyn Terms) -> String {
        let mut out = self.render_one(terms);
        let mut next = std::error::Error::source(self);
        while let Some(source) = next {
            out.push_str(": ");
            out.push_str(&source.to_string());
            next = source.source();
        }
        out
    }

    fn render_one(&self, terms: &dyn Terms) -> String {
        use std::fmt::Write;
        let inner = &self.inner;
        let mut out = format!("{}: {}", inner.kind.layer(), inner.message.render(terms));
        // Writing to a String does not fail.
        if let Some(offset) = inner.offset {
            let _ = write!(out, " at offset {offset:#x}");
        }
        if let Some(record) = &inner.record {
            let _ = write!(out, " in {record}");
        }
        if let Some(tensor) = &inner.tensor {
            let _ = write!(out, " (tensor '{tensor}')");
        }
        if let Some(file) = &inner.file {
            let _ = write!(out, " in file {file}");
        }
        if let Some(note) = &inner.note {
            let _ = write!(out, ". {}", note.render(terms));
        }
        out
    }

    /// Byte offset of the failure: inside the record when [`record`](Self::record)
    /// is set, otherwise inside the file.
    pub fn offset(&self) -> Option<u64> {
        self.inner.offset
    }

    /// The archive record (e.g. `model/data.pkl`) or legacy section concerned.
    pub fn record(&self) -> Option<&str> {
        self.inner.record.as_deref()
    }

    /// The flattened name of the tensor concerned.
    pub fn tensor(&self) -> Option<&str> {
        self.inner.tensor.as_deref()
    }

    /// The file of a checkpoint set (a shard) the failure concerns.
    pub fn file(&self) -> Option<&str> {
        self.inner.file.as_deref()
    }
}

impl fmt::Display for Error {
    /// The neutral text, without the source (a chain printer prints it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render_one(&Neutral))
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.inner.kind)
            .field("message", &self.inner.message)
            .field("offset", &self.inner.offset)
            .field("record", &self.inner.record)
            .field("tensor", &self.inner.tensor)
            .field("file", &self.inner.file)
            .field("note", &self.inner.note)
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_ref()
            .map(|s| s.as_ref() as &(dyn std::error::Error + 'static))
    }
}

/// The reader's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` lists every kind once, in order, and each name is the kind's
    /// own: the match below fails to compile when a kind is added and not
    /// placed here (and so in `ALL`).
    #[test]
    fn every_kind_is_listed_once_under_its_own_name() {
        let position = |k: ErrorKind| match k {
            ErrorKind::Io => 0,
            ErrorKind::NotACheckpoint => 1,
            ErrorKind::UnsupportedLayout => 2,
            ErrorKind::Zip => 3,
            ErrorKind::Legacy => 4,
            ErrorKind::Pickle => 5,
            ErrorKind::Decode => 6,
            ErrorKind::UnsupportedGlobal => 7,
            ErrorKind::Refused => 8,
            ErrorKind::Tensor => 9,
            ErrorKind::LimitExceeded => 10,
            ErrorKind::Unsupported => 11,
            ErrorKind::InvalidSpec => 12,
            ErrorKind::DuplicateName => 13,
            ErrorKind::OutputExists => 14,
            ErrorKind::OutputRefused => 15,
            ErrorKind::Cancelled => 16,
            ErrorKind::DTypeMismatch => 17,
            ErrorKind::NotBorrowable => 18,
        };
        for (i, kind) in ErrorKind::ALL.into_iter().enumerate() {
            assert_eq!(position(kind), i, "{kind:?}");
            assert_eq!(kind.name(), format!("{kind:?}"));
        }
    }
}
