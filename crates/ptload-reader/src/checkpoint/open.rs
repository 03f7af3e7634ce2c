//! How a checkpoint is opened: [`OpenOptions`], and the sources it opens
//! (a path, mapped or read by positioned reads; bytes; a URL or any
//! [`RangeRead`]).

use super::*;

/// Options for opening a checkpoint.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub(super) limits: Limits,
    pub(super) policy: Policy,
    pub(super) encoding: StringEncoding,
    pub(super) allowed_globals: Vec<String>,
    pub(super) in_memory: bool,
    pub(super) positioned: bool,
    pub(super) objects: bool,
    pub(super) cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    pub(super) assumed_byte_order: ByteOrder,
    /// Read every pickle with the general machine, never the plain state
    /// dict's shortcut (tests compare the two).
    pub(crate) general_only: bool,
    #[cfg(feature = "scan")]
    pub(super) refuse_at: Option<crate::scan::Level>,
    #[cfg(feature = "scan")]
    pub(super) scan: bool,
}

impl OpenOptions {
    /// Default limits, the default policy, UTF-8 for Python 2 strings.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn limits_ref(&self) -> &Limits {
        &self.limits
    }

    #[cfg_attr(not(feature = "dcp"), allow(dead_code))]
    pub(crate) fn in_memory_ref(&self) -> bool {
        self.in_memory
    }

    /// Bounds on the work the file may cause.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// What to do with globals outside torch's safe allowlist.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Refuse a file the scanner ([`crate::scan`], `ptload scan`) puts at
    /// `level` or above, with an error of kind
    /// [`Refused`](crate::ErrorKind::Refused) naming what it found; read
    /// the rest as the policy says. `Level::Dangerous` refuses what runs
    /// code, spawns processes, touches files or the network and gadgets,
    /// and reads ordinary training files (argparse namespaces, full
    /// models); `Level::UnknownCall` also refuses calls of anything
    /// outside the known-safe set; `Level::NeedsCode` every pickled class.
    /// Off by default (`None`): the default policy reads any checkpoint's
    /// tensors, running nothing, and lists the globals it did not allow.
    ///
    /// The scan reads the file's pickles a second time (for a file read by
    /// ranges, fetching what it needs); tensors' bytes are not read.
    #[cfg(feature = "scan")]
    pub fn refuse_at(mut self, level: Option<crate::scan::Level>) -> Self {
        self.refuse_at = level;
        self
    }

    /// Scan the file as [`crate::scan`] does while it is decoded, on a
    /// second thread, and keep the report: [`Checkpoint::suspicious`] then
    /// scans nothing more, and a caller that wants both (`inspect`) waits
    /// for the longer of the two, not their sum. [`refuse_at`](Self::refuse_at)
    /// scans this way too. A file read by ranges is scanned when
    /// `suspicious` asks, over what the decode fetched (to refuse, before
    /// it is decoded). Off by default.
    #[cfg(feature = "scan")]
    pub fn scan(mut self, yes: bool) -> Self {
        self.scan = yes;
        self
    }

    /// How Python 2 strings decode (torch.load's `encoding`).
    pub fn encoding(mut self, encoding: StringEncoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// The byte order of a zip checkpoint that has no `byteorder` record
    /// (torch before 1.12, or saved with `_disable_byteorder_record`):
    /// little-endian unless told otherwise, as torch's
    /// `set_default_load_endianness` tells it. Files with the record, and
    /// legacy files (whose header says), are read as they say.
    pub fn assume_byte_order(mut self, order: ByteOrder) -> Self {
        self.assumed_byte_order = order;
        self
    }

    /// Allow `module.name` under [`Policy::Strict`] (torch's
    /// `add_safe_globals`), or every global a glob matches (`mymodels.*`,
    /// see [`Policy::allowlist_admits`]). Globals of `sys`, `os`, `posix`
    /// and `nt` stay refused.
    pub fn allow_global(mut self, path: impl Into<String>) -> Self {
        self.allowed_globals.push(path.into());
        self
    }

    /// Keep the unpickled object as a graph of nodes (see
    /// [`Checkpoint::objects`]): what `torch.load` returns, built without
    /// running anything. Off by default (it costs a node per value).
    ///
    /// torch.load never refuses two tensors whose flattened names agree
    /// (`{"a.b": t, "a": {"b": u}}`), so with objects the later one is
    /// named by its Python path (`['a']['b']`) instead of the open failing;
    /// without, such a file is refused as ambiguous.
    pub fn objects(mut self, yes: bool) -> Self {
        self.objects = yes;
        self
    }

    /// Stop the open with an error of kind
    /// [`Cancelled`](crate::ErrorKind::Cancelled) soon after `flag` is set
    /// (from another thread: a Ctrl-C handler, a request timeout). The
    /// pickle machine looks at it every few thousand opcodes.
    pub fn cancel(mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self
    }

    /// Read the whole file into memory at open instead of mapping it.
    ///
    /// A mapped file must not change while its `Checkpoint` is alive: if
    /// another process truncates it, reading the lost pages kills this
    /// process with SIGBUS, and if it rewrites it, tensors show the new
    /// bytes. Services that read files they do not control (uploads, shared
    /// volumes) should open in memory: it costs one read of the file and
    /// its size in memory, and nothing done to the file afterwards reaches
    /// the checkpoint.
    pub fn in_memory(mut self, yes: bool) -> Self {
        self.in_memory = yes;
        self
    }

    /// Read the file by positioned reads (`pread`) instead of mapping it:
    /// opening reads only the parts it parses, as for a URL (see
    /// [`open_ranged`](Self::open_ranged)), and each storage's bytes are
    /// read into memory when a tensor over it is first read.
    ///
    /// For network file systems, where a map's page faults and readahead
    /// are slow or stall, and for files that may change underneath: a
    /// shrunk file gives an error, never SIGBUS. [`in_memory`](Self::in_memory)
    /// takes precedence. The `.distcp` files of a distributed checkpoint
    /// are mapped whatever this says.
    pub fn positioned(mut self, yes: bool) -> Self {
        self.positioned = yes;
        self
    }

    /// Open the file at `path`: memory-mapped, read into memory with
    /// [`in_memory`](Self::in_memory), or by positioned reads with
    /// [`positioned`](Self::positioned).
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        // Every error names the file (an engine's log has nothing else).
        let named = |e: Error| e.in_file(&path.display().to_string());
        let source = if self.in_memory {
            Source::read(path).map_err(named)?
        } else if self.positioned {
            let (file, meta) = crate::ranged::LocalFile::open_with_metadata(path).map_err(named)?;
            let fetcher = Fetcher::new(std::sync::Arc::new(file));
            return self
                .open_fetched(fetcher, crate::source::FileId::of(&meta))
                .map_err(named);
        } else {
            Source::map(path).map_err(named)?
        };
        Checkpoint::load(source, self).map_err(named)
    }

    /// Open a file read by ranges: `reader` fetches the parts of it that
    /// opening parses (the end of a zip, its directory, the pickles and
    /// their neighbourhood; a legacy file's pickle stream), at most
    /// [`Limits::max_open_fetch_bytes`] in all, and later each storage's
    /// bytes when a tensor over it is first read (coalesced with the
    /// storages after it that are not read yet, each range read once).
    /// Tensors' bytes are then owned buffers, never borrowed from a map.
    pub fn open_ranged(&self, reader: std::sync::Arc<dyn RangeRead>) -> Result<Checkpoint> {
        self.open_fetched(Fetcher::new(reader), None)
    }

    /// Open what `fetcher` reads; `identity` is the local file it reads,
    /// if it is one (outputs never overwrite it).
    fn open_fetched(
        &self,
        fetcher: Fetcher,
        identity: Option<crate::source::FileId>,
    ) -> Result<Checkpoint> {
        let fetcher = std::sync::Arc::new(fetcher);
        fetch_until(&fetcher, self.limits.max_open_fetch_bytes, |extents| {
            Checkpoint::load(Source::ranged(fetcher.clone(), extents, identity), self)
        })?
        .map_err(|e| e.in_file(fetcher.name()))
    }

    /// Open the checkpoint at a URL by ranged requests (see
    /// [`open_ranged`](Self::open_ranged)): `http://` and `https://`
    /// (feature `http`, `http::HttpFile`), `s3://`, `gs://`, `az://`
    /// (feature `object-store`, `bucket::BucketFile`). A scheme whose
    /// feature is not compiled in is an error naming the feature; see
    /// [`remote::open_url`](crate::remote::open_url).
    pub fn open_url(&self, url: &str) -> Result<Checkpoint> {
        self.open_ranged(crate::remote::open_url(url)?)
    }

    /// Read a checkpoint held in memory, without copying it: `bytes` may be
    /// a `Vec<u8>`, a `&'static [u8]` (`include_bytes!`), an `Arc<[u8]>`
    /// shared with the caller, or any other owner of bytes; the checkpoint
    /// keeps it alive and its tensors borrow from it.
    pub fn open_bytes(
        &self,
        bytes: impl AsRef<[u8]> + Send + Sync + 'static,
    ) -> Result<Checkpoint> {
        Checkpoint::load(Source::given(bytes), self)
    }
}

impl Checkpoint {
    /// Open the checkpoint at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        OpenOptions::new().open(path)
    }

    /// Read a checkpoint held in memory, with default options (see
    /// [`OpenOptions::open_bytes`]).
    pub fn from_bytes(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Result<Checkpoint> {
        OpenOptions::new().open_bytes(bytes)
    }

    pub(super) fn load(source: Source, opts: &OpenOptions) -> Result<Checkpoint> {
        source.advise(true);
        let checkpoint = Checkpoint::scan_and_decode(&source, opts);
        source.advise(false);
        checkpoint
    }
}
