//! Objects saved one after another in one file (`torch.save` called
//! several times on one file object): `torch.load` on the stream reads
//! the first and leaves the stream after it, where the next one starts.
//! `inspect` shows each in turn, and stops where the file ends.

use std::path::Path;
use std::sync::Arc;

use ptload_reader::ranged::{LocalFile, RangeRead};
use ptload_reader::set::CheckpointSet;
use ptload_reader::OpenOptions;

use crate::render::Trailing;

/// Objects shown at most after the first; a file holding more says so.
/// Each later object keeps what opening it fetched (up to 256 KiB), so
/// this bounds what a small file of many objects makes `inspect` hold.
const MAX_OBJECTS: usize = 64;

/// The objects of a file after its first, and what follows the last.
#[derive(Default)]
pub(crate) struct Stream {
    /// Each object after the first: the byte it starts at, and it.
    pub(crate) objects: Vec<(u64, CheckpointSet)>,
    /// Bytes after the last object that are not another object.
    pub(crate) trailing: Option<Trailing>,
}

/// The objects that follow the first checkpoint of the local file `path`
/// (the one `set` holds), each opened where the previous one ended, until
/// the file ends. Nothing for a URL, a directory or a set of several
/// files, or a file whose checkpoint reaches its end.
pub(crate) fn after_first(path: &Path, set: &CheckpointSet, opts: &OpenOptions) -> Stream {
    let mut stream = Stream::default();
    let [first] = set.files() else {
        return stream;
    };
    if ptload_reader::set::Input::new(path).url().is_some() || !path.is_file() {
        return stream;
    }
    let Ok(file) = LocalFile::open(path) else {
        return stream;
    };
    let len = file.len();
    let file = Arc::new(file);
    let mut at = first.checkpoint().end_offset();
    // Each object takes at least one byte, so the loop ends with the file.
    while at > 0 && at < len {
        if stream.objects.len() == MAX_OBJECTS {
            stream.trailing = Some(Trailing {
                offset: at,
                bytes: len - at,
                error: format!("more objects follow; inspect shows the first {MAX_OBJECTS}"),
            });
            break;
        }
        let rest = Window {
            file: Arc::clone(&file),
            start: at,
            len: len - at,
            name: format!("{} at byte {at}", path.display()),
        };
        let opened = opts
            .open_ranged(Arc::new(rest))
            .map_err(|e| e.render(&crate::terms::Flags))
            .and_then(|ckpt| {
                let end = ckpt.end_offset();
                CheckpointSet::of(path, Arc::new(ckpt))
                    .map(|set| (end, set))
                    .map_err(|e| e.render(&crate::terms::Flags))
            });
        match opened {
            Ok((end, set)) => {
                stream.objects.push((at, set));
                match at.checked_add(end) {
                    Some(next) if end > 0 => at = next,
                    _ => break,
                }
            }
            Err(error) => {
                stream.trailing = Some(Trailing {
                    offset: at,
                    bytes: len - at,
                    error,
                });
                break;
            }
        }
    }
    stream
}

/// The bytes of a file from `start` on, read by positioned reads: an
/// object of a stream, opened as a file of its own.
#[derive(Debug)]
struct Window {
    file: Arc<LocalFile>,
    start: u64,
    len: u64,
    name: String,
}

impl RangeRead for Window {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        let past = || {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{}: a read past the end of the file", self.name),
            )
        };
        let end = offset.checked_add(len).ok_or_else(past)?;
        if end > self.len {
            return Err(past());
        }
        let at = self.start.checked_add(offset).ok_or_else(past)?;
        self.file.read_at(at, len)
    }

    fn name(&self) -> &str {
        &self.name
    }
}
