//! Explicit bounds on the work a checkpoint can make the reader do.

/// Bounds on every resource a file can make the reader spend.
///
/// ```
/// use ptload_reader::Limits;
///
/// // From the defaults, one limit at a time (each field has a setter).
/// let limits = Limits::default().max_tensors(10_000).max_pickle_bytes(64 << 20);
/// assert_eq!(limits.max_tensors, 10_000);
/// ```
///
/// The defaults admit a real 100 GB checkpoint (hundreds of thousands of
/// tensors, a pickle of tens of megabytes) and stop the known bombs. Each
/// limit is named in the error that reports it, so a user knows which field
/// to raise.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest pickle record (`data.pkl`, `constants.pkl`, a legacy section).
    pub max_pickle_bytes: u64,
    /// Opcodes executed across all pickles of one file.
    pub max_opcodes: u64,
    /// Work per pickle byte: every opcode costs one unit, plus one per byte
    /// or item it hashes, compares or copies (a memo reference lets a few
    /// bytes name a long string or list again and again). The allowance is
    /// this many units for each byte of the pickles run (64 KiB at least),
    /// so reading costs time linear in the file whatever it holds. Real
    /// checkpoints use a few units per byte.
    pub max_work_per_byte: u64,
    /// Items on the pickle stack, plus open MARKs.
    pub max_stack_depth: usize,
    /// Memo entries.
    pub max_memo_entries: usize,
    /// Elements of one list, tuple, dict or set.
    pub max_container_len: usize,
    /// Objects created by the pickle VM.
    pub max_objects: usize,
    /// Bytes of strings, bytes and big integers decoded from pickles.
    pub max_decoded_bytes: u64,
    /// Bytes produced by inflating deflated zip entries, all entries together.
    /// torch writes records uncompressed; deflate appears only in repacked
    /// archives, and this bounds what a deflate bomb can make us hold.
    pub max_decompressed_bytes: u64,
    /// Entries in the zip central directory.
    pub max_zip_entries: usize,
    /// Tensors in one checkpoint (after flattening).
    pub max_tensors: usize,
    /// Steps of the walk that names tensors (charges shared references).
    pub max_walk_steps: u64,
    /// Times the naming walk enters a container it has already entered by
    /// another path (tied weights do this a few times; reference bombs,
    /// exponentially).
    pub max_shared_visits: u64,
    /// Bytes of all tensor and value names built by the walk.
    pub max_name_bytes: u64,
    /// Row-major size of a view whose elements overlap (stride-0 expands):
    /// such a view may be larger than its storage, but not beyond this.
    pub max_expanded_view_bytes: u64,
    /// Files in one checkpoint set.
    pub max_set_files: usize,
    /// Size of a set's index (`*.index.json`).
    pub max_index_bytes: u64,
    /// Bytes a file read by ranges (a URL) may fetch while it is opened or
    /// scanned, before any tensor is read: its directory, its pickles and
    /// their neighbourhood.
    pub max_open_fetch_bytes: u64,
    /// Ranged requests a prefetch ([`Checkpoint::prefetch`](crate::Checkpoint::prefetch))
    /// keeps in flight at once, each on its own thread (1 reads one range
    /// at a time).
    pub max_fetches_in_flight: usize,
    /// Bytes one request of a prefetch fetches at most, storages close in
    /// the file together (a larger storage is one request of its own):
    /// small enough that a prefetch of a few hundred megabytes keeps
    /// several requests in flight.
    pub max_fetch_request_bytes: u64,
}

/// One setter per limit, named as its field, each taking `self` and
/// handing it back: `Limits` is `#[non_exhaustive]` (a new limit is not a
/// breaking change), so other crates build one from the defaults by these
/// instead of struct update syntax.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty,)*) => {
        impl Limits {
            $(
                $(#[$doc])*
                #[must_use]
                pub fn $name(mut self, value: $ty) -> Self {
                    self.$name = value;
                    self
                }
            )*
        }
    };
}

setters! {
        /// Set [`max_pickle_bytes`](Limits#structfield.max_pickle_bytes).
        max_pickle_bytes: u64,
        /// Set [`max_opcodes`](Limits#structfield.max_opcodes).
        max_opcodes: u64,
        /// Set [`max_work_per_byte`](Limits#structfield.max_work_per_byte).
        max_work_per_byte: u64,
        /// Set [`max_stack_depth`](Limits#structfield.max_stack_depth).
        max_stack_depth: usize,
        /// Set [`max_memo_entries`](Limits#structfield.max_memo_entries).
        max_memo_entries: usize,
        /// Set [`max_container_len`](Limits#structfield.max_container_len).
        max_container_len: usize,
        /// Set [`max_objects`](Limits#structfield.max_objects).
        max_objects: usize,
        /// Set [`max_decoded_bytes`](Limits#structfield.max_decoded_bytes).
        max_decoded_bytes: u64,
        /// Set [`max_decompressed_bytes`](Limits#structfield.max_decompressed_bytes).
        max_decompressed_bytes: u64,
        /// Set [`max_zip_entries`](Limits#structfield.max_zip_entries).
        max_zip_entries: usize,
        /// Set [`max_tensors`](Limits#structfield.max_tensors).
        max_tensors: usize,
        /// Set [`max_walk_steps`](Limits#structfield.max_walk_steps).
        max_walk_steps: u64,
        /// Set [`max_shared_visits`](Limits#structfield.max_shared_visits).
        max_shared_visits: u64,
        /// Set [`max_name_bytes`](Limits#structfield.max_name_bytes).
        max_name_bytes: u64,
        /// Set [`max_expanded_view_bytes`](Limits#structfield.max_expanded_view_bytes).
        max_expanded_view_bytes: u64,
        /// Set [`max_set_files`](Limits#structfield.max_set_files).
        max_set_files: usize,
        /// Set [`max_index_bytes`](Limits#structfield.max_index_bytes).
        max_index_bytes: u64,
        /// Set [`max_open_fetch_bytes`](Limits#structfield.max_open_fetch_bytes).
        max_open_fetch_bytes: u64,
        /// Set [`max_fetches_in_flight`](Limits#structfield.max_fetches_in_flight).
        max_fetches_in_flight: usize,
        /// Set [`max_fetch_request_bytes`](Limits#structfield.max_fetch_request_bytes).
        max_fetch_request_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pickle_bytes: 1 << 30,
            max_opcodes: 200_000_000,
            max_work_per_byte: 64,
            max_stack_depth: 1_000_000,
            max_memo_entries: 20_000_000,
            max_container_len: 20_000_000,
            max_objects: 50_000_000,
            max_decoded_bytes: 1 << 30,
            max_decompressed_bytes: 4 << 30,
            max_zip_entries: 4_000_000,
            max_tensors: 4_000_000,
            max_walk_steps: 20_000_000,
            max_shared_visits: 100_000,
            max_name_bytes: 256 << 20,
            max_expanded_view_bytes: 1 << 30,
            max_set_files: 100_000,
            max_index_bytes: 256 << 20,
            max_open_fetch_bytes: 2 << 30,
            max_fetches_in_flight: 4,
            max_fetch_request_bytes: 8 << 20,
        }
    }
}
