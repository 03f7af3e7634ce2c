//! Checkpoint sets: a model saved as several files, read as one.
//!
//! Big models ship sharded: Hugging Face writes
//! `pytorch_model-00001-of-00008.bin` ... with `pytorch_model.bin.index.json`
//! (its `weight_map` names each tensor's file). A [`CheckpointSet`] opens a
//! directory, such an index, or a list of files, each shard in parallel, and
//! checks them against each other: a name in two shards, a shard the index
//! names but that is missing, and a tensor the index places in a shard that
//! lacks it are errors naming the files. Each tensor stays a view of its own
//! shard's map; [`StateDictOptions::select_set`](crate::state_dict::StateDictOptions::select_set)
//! selects across all of them.
//!
//! ```
//! # fn main() -> Result<(), ptload_reader::Error> {
//! use ptload_reader::set::CheckpointSet;
//!
//! let set = CheckpointSet::open("../../fixtures/files/llama_tiny_sharded")?;
//! assert_eq!(set.files().len(), 3);
//! let (file, tensor) = set.tensor("model.norm.weight").unwrap();
//! println!("{} is in {}", tensor.name(), set.files()[file].path().display());
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "parallel")]
use rayon::prelude::*;

use crate::advice::{Hint, Warning};
use crate::checkpoint::{Checkpoint, OpenOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::name_index::NameIndex;
use crate::ranged::RangeRead;
use crate::source::read_bounded;
use crate::view::TensorView;

/// One file of a set.
#[derive(Debug, Clone)]
pub struct SetFile {
    path: PathBuf,
    checkpoint: Arc<Checkpoint>,
}

impl SetFile {
    /// Where it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its file name (the path when it has none), as errors and reports
    /// name it.
    pub fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    /// The decoded file.
    pub fn checkpoint(&self) -> &Arc<Checkpoint> {
        &self.checkpoint
    }
}

/// What a front end was given to read, decided in one place: a URL read by
/// ranged requests (`http(s)://`, `s3://`, `gs://`, `az://`, see
/// [`crate::ranged::is_url`]) or a local path (a file, a directory of
/// shards, a DCP save, an index). Every front end opens what the user
/// names through [`Input::open`], so each command and function takes the
/// same inputs.
///
/// ```
/// use ptload_reader::set::Input;
///
/// assert!(Input::new("https://host/model.safetensors.index.json").is_index());
/// assert_eq!(Input::new("model.pt").path(), Some(std::path::Path::new("model.pt")));
/// assert_eq!(Input::new("s3://bucket/model.pt").url(), Some("s3://bucket/model.pt"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A file or directory on this machine.
    Path(PathBuf),
    /// A file read by ranged requests.
    Url(String),
}

impl Input {
    /// The input `text` names: a URL when it is one, a path otherwise (a
    /// path that is not UTF-8 is always a path).
    pub fn new(text: impl AsRef<std::ffi::OsStr>) -> Input {
        let text = text.as_ref();
        match text.to_str() {
            Some(s) if crate::ranged::is_url(s) => Input::Url(s.to_owned()),
            _ => Input::Path(PathBuf::from(text)),
        }
    }

    /// The URL, when it is one.
    pub fn url(&self) -> Option<&str> {
        match self {
            Input::Url(u) => Some(u),
            Input::Path(_) => None,
        }
    }

    /// The local path, when it is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Input::Path(p) => Some(p),
            Input::Url(_) => None,
        }
    }

    /// Whether it names a set's index (`*.json`; for a URL, before any
    /// query or fragment).
    pub fn is_index(&self) -> bool {
        match self {
            Input::Url(u) => u
                .split(['?', '#'])
                .next()
                .is_some_and(|p| p.ends_with(".json")),
            Input::Path(p) => p.to_string_lossy().ends_with(".json"),
        }
    }

    /// Open it as a set: [`CheckpointSet::open_url`] or
    /// [`CheckpointSet::open_with`].
    pub fn open(&self, opts: &OpenOptions) -> Result<CheckpointSet> {
        match self {
            Input::Url(u) => CheckpointSet::open_url(u, opts),
            Input::Path(p) => CheckpointSet::open_with(p, opts),
        }
    }

    /// Open the rank files of the directory it names as one state dict, by
    /// `splits` ([`CheckpointSet::open_rank_parts`]); a URL is refused:
    /// a directory cannot be listed by URL.
    pub fn open_rank_parts(
        &self,
        splits: &crate::tp::Splits,
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        match self {
            Input::Path(p) => CheckpointSet::open_rank_parts(p, splits, opts),
            Input::Url(u) => Err(Error::new(
                ErrorKind::InvalidSpec,
                format!("{u}: rank files are read from a local directory, which a URL cannot list"),
            )),
        }
    }
}

impl std::fmt::Display for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Input::Url(u) => f.write_str(u),
            Input::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Several checkpoint files read as one: every tensor of every file under
/// its own name, each name in exactly one file.
#[derive(Debug)]
pub struct CheckpointSet {
    files: Vec<SetFile>,
    index: Option<PathBuf>,
    /// `(file, tensor)` pairs, by the tensor's name.
    by_name: NameIndex<(u32, u32)>,
    warnings: Vec<Warning>,
    /// Model-parallel rank files: names repeat, `by_name` is rank 0's.
    ranks: bool,
}

/// File names a directory's checkpoints may have.
const EXTENSIONS: &[&str] = &["pt", "pth", "bin", "ckpt", "safetensors"];

impl CheckpointSet {
    /// Open `path` with default options: a directory (a
    /// `torch.distributed.checkpoint` save when it holds `.metadata`, see
    /// [`open_dcp`](Self::open_dcp); its `*.index.json` if it has one, else every `.pt`, `.pth`, `.bin`, `.ckpt` and
    /// `.safetensors` file in it, in name order, only the `.safetensors`
    /// ones where both kinds are there, as transformers takes them), an
    /// index file, or one checkpoint file (a set of one).
    pub fn open(path: impl AsRef<Path>) -> Result<CheckpointSet> {
        CheckpointSet::open_with(path, &OpenOptions::new())
    }

    /// [`open`](Self::open) with options for every file.
    pub fn open_with(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<CheckpointSet> {
        let path = path.as_ref();
        if crate::dcp::is_dcp_dir(path) {
            #[cfg(feature = "dcp")]
            return CheckpointSet::open_dcp(path, opts);
            #[cfg(not(feature = "dcp"))]
            return Err(Error::new(
                ErrorKind::Unsupported,
                "a distributed checkpoint (a torch.distributed.checkpoint directory): reading \
                 it needs ptload-reader's feature `dcp` (off in this build)",
            )
            .in_file(&path.display().to_string()));
        }
        if path.is_dir() {
            let mut indexes = Vec::new();
            let mut files = Vec::new();
            let entries = std::fs::read_dir(path)
                .map_err(|e| Error::io(format!("cannot list {}", path.display()), e))?;
            for entry in entries {
                let entry =
                    entry.map_err(|e| Error::io(format!("cannot list {}", path.display()), e))?;
                let p = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".index.json") {
                    indexes.push(p);
                } else if p.is_file()
                    && p.extension()
                        .is_some_and(|e| EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
                {
                    files.push(p);
                }
                if files.len() + indexes.len() > opts.limits_ref().max_set_files {
                    return Err(Error::limit(
                        "max_set_files",
                        opts.limits_ref().max_set_files as u64,
                    ));
                }
            }
            indexes.sort();
            match indexes.as_slice() {
                [index] => return CheckpointSet::open_index(index, opts),
                [] => {}
                more => {
                    let names: Vec<String> = more.iter().map(|p| file_name(p)).collect();
                    return Err(Error::new(
                        ErrorKind::InvalidSpec,
                        format!(
                            "{} holds {} indexes ({}): open the one you mean",
                            path.display(),
                            more.len(),
                            names.join(", ")
                        ),
                    ));
                }
            }
            // A model saved both ways (`model.safetensors` beside
            // `pytorch_model.bin`): two copies of one state dict, of which
            // transformers reads the safetensors one.
            let is_st = |p: &PathBuf| {
                p.extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
            };
            if files.iter().any(is_st) && !files.iter().all(is_st) {
                files.retain(is_st);
            }
            files.sort_by_cached_key(|p| (rank_in_name(p), p.clone()));
            let sidecar = path.join(crate::dcp::fsdp::SIDECAR);
            if sidecar.is_file() && !files.is_empty() {
                let text = read_bounded(
                    &sidecar,
                    opts.limits_ref().max_index_bytes,
                    "max_index_bytes",
                )
                .map_err(|e| e.in_file(crate::dcp::fsdp::SIDECAR))?;
                let layout = crate::dcp::fsdp::LocalLayout::from_json(&text)
                    .map_err(|e| e.in_file(crate::dcp::fsdp::SIDECAR))?;
                return CheckpointSet::open_fsdp_files(&files, Some(&layout), opts);
            }
            if files.is_empty() {
                return Err(Error::new(
                    ErrorKind::NotACheckpoint,
                    format!(
                        "{} holds no checkpoint (no *.index.json, no .pt, .pth, .bin, .ckpt or .safetensors file)",
                        path.display()
                    ),
                ));
            }
            return CheckpointSet::open_files(&files, opts);
        }
        if path.to_string_lossy().ends_with(".json") {
            return CheckpointSet::open_index(path, opts);
        }
        CheckpointSet::open_files(&[path], opts)
    }

    /// The rank files in the directory `dir` (each rank's `torch.save` of
    /// its part of a sharded model, `model_world_size_W_rank_R.pt`, with no
    /// placement recorded), read as one state dict by `splits`: the rules
    /// the caller states for how each tensor was cut among the ranks (see
    /// [`LocalLayout::of_splits`](crate::dcp::fsdp::LocalLayout::of_splits)).
    /// Files are ranks in the order their names give; every part is
    /// checked against the others (shapes that tile, replicated copies
    /// equal).
    pub fn open_rank_parts(
        dir: impl AsRef<Path>,
        splits: &crate::tp::Splits,
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        let dir = dir.as_ref();
        let entries = std::fs::read_dir(dir)
            .map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
            let p = entry.path();
            if p.is_file()
                && p.extension()
                    .is_some_and(|e| EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
            {
                files.push(p);
            }
            if files.len() > opts.limits_ref().max_set_files {
                return Err(Error::limit(
                    "max_set_files",
                    opts.limits_ref().max_set_files as u64,
                ));
            }
        }
        if files.is_empty() {
            return Err(Error::new(
                ErrorKind::NotACheckpoint,
                format!("{} holds no rank file", dir.display()),
            ));
        }
        files.sort_by_cached_key(|p| (rank_in_name(p), p.clone()));
        // Names that give ranks must give each of 0..N once, and a world
        // size they all name must be the number of files.
        let ranks: Vec<u64> = files.iter().map(|p| rank_in_name(p)).collect();
        let world = files.len() as u64;
        if ranks.iter().all(|&r| r != u64::MAX) && !ranks.iter().copied().eq(0..world) {
            return Err(Error::new(
                ErrorKind::InvalidSpec,
                format!(
                    "{}: the file names give ranks {ranks:?}; rank files are ranks 0 to {} once each",
                    dir.display(),
                    world - 1
                ),
            ));
        }
        let named_world: Vec<Option<u64>> = files.iter().map(|p| world_in_name(p)).collect();
        if let Some(Some(w)) = named_world.first() {
            if named_world.iter().all(|n| *n == Some(*w)) && *w != world {
                return Err(Error::new(
                    ErrorKind::InvalidSpec,
                    format!(
                        "{}: the file names say a world of {w}, and {world} rank files are there",
                        dir.display()
                    ),
                ));
            }
        }
        let layout = crate::dcp::fsdp::LocalLayout::of_splits(world, splits)?;
        CheckpointSet::open_fsdp_files(&files, Some(&layout), opts)
    }

    /// A `torch.distributed.checkpoint` directory as a set of one: its
    /// tensors put together from their chunks when their data is read
    /// (each read afresh, so a pass over the set holds one tensor at a
    /// time; see [`crate::dcp::Dcp::into_checkpoint`]), its non-tensor
    /// items as values. The set's one file is the directory.
    #[cfg(feature = "dcp")]
    pub fn open_dcp(dir: impl AsRef<Path>, opts: &OpenOptions) -> Result<CheckpointSet> {
        let dir = dir.as_ref();
        let dcp = Arc::new(crate::dcp::Dcp::open_with(dir, opts)?);
        let file = SetFile {
            path: dir.to_path_buf(),
            checkpoint: Arc::new(dcp.into_checkpoint()?),
        };
        CheckpointSet::build(vec![file], None, opts)
    }

    /// A set of one checkpoint already open (from bytes, say), named
    /// `path` in reports.
    pub fn of(path: impl Into<PathBuf>, checkpoint: Arc<Checkpoint>) -> Result<CheckpointSet> {
        let file = SetFile {
            path: path.into(),
            checkpoint,
        };
        CheckpointSet::build(vec![file], None, &OpenOptions::new())
    }

    /// Model-parallel rank files as one set: a directory's
    /// `consolidated.NN.pth` files (Meta's layout), or the files given, in
    /// rank order. Every file holds a part of every tensor, so the names
    /// repeat: each file must hold the same names, and [`tensor`](Self::tensor)
    /// finds rank 0's part. [`crate::merge`] puts the parts together.
    pub fn open_ranks(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<CheckpointSet> {
        let path = path.as_ref();
        let mut paths: Vec<PathBuf> = Vec::new();
        if path.is_dir() {
            let entries = std::fs::read_dir(path)
                .map_err(|e| Error::io(format!("cannot list {}", path.display()), e))?;
            for entry in entries {
                let entry =
                    entry.map_err(|e| Error::io(format!("cannot list {}", path.display()), e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("consolidated.") && name.ends_with(".pth") {
                    paths.push(entry.path());
                }
                if paths.len() > opts.limits_ref().max_set_files {
                    return Err(Error::limit(
                        "max_set_files",
                        opts.limits_ref().max_set_files as u64,
                    ));
                }
            }
            paths.sort();
            if paths.is_empty() {
                return Err(Error::new(
                    ErrorKind::NotACheckpoint,
                    format!("{} holds no consolidated.NN.pth file", path.display()),
                ));
            }
        } else {
            paths.push(path.to_path_buf());
        }
        CheckpointSet::open_rank_files(&paths, opts)
    }

    /// These files, rank 0 first, as model-parallel rank files (see
    /// [`open_ranks`](Self::open_ranks)).
    pub fn open_rank_files<P: AsRef<Path> + Sync>(
        paths: &[P],
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        let files = open_all(paths, opts)?;
        let Some((first, rest)) = files.split_first() else {
            return Err(Error::new(ErrorKind::InvalidSpec, "no rank files"));
        };
        let single = CheckpointSet::build(vec![first.clone()], None, opts)?;
        for file in rest {
            let ckpt = &file.checkpoint;
            if ckpt.len() != first.checkpoint.len() {
                return Err(Error::new(
                    ErrorKind::Tensor,
                    format!(
                        "{} tensors, where {} holds {}: rank files hold the same tensors",
                        ckpt.len(),
                        first.name(),
                        first.checkpoint.len()
                    ),
                )
                .in_file(&file.name()));
            }
            for t in ckpt.tensors() {
                if single.tensor(t.name()).is_none() {
                    return Err(Error::new(
                        ErrorKind::Tensor,
                        format!("not in {}: rank files hold the same tensors", first.name()),
                    )
                    .for_tensor(t.name())
                    .in_file(&file.name()));
                }
            }
        }
        Ok(CheckpointSet {
            files,
            index: None,
            by_name: single.by_name,
            warnings: Vec::new(),
            ranks: true,
        })
    }

    /// Whether the files are model-parallel ranks ([`open_ranks`](Self::open_ranks)).
    pub fn is_ranks(&self) -> bool {
        self.ranks
    }

    /// These files as one set, opened in parallel. Per-rank files of
    /// DTensors (`torch.save` of an FSDP2 model's state dict on each rank)
    /// are put together as one state dict (see
    /// [`open_fsdp_files`](Self::open_fsdp_files)).
    pub fn open_files<P: AsRef<Path> + Sync>(
        paths: &[P],
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        let files = open_all(paths, opts)?;
        if files.len() > 1 && files.iter().any(|f| f.checkpoint.has_dtensors()) {
            return CheckpointSet::merge_ranks(files, None, opts);
        }
        CheckpointSet::build(files, None, opts)
    }

    /// FSDP rank files (one `torch.save` per rank, in rank order) as one
    /// set of whole tensors, put together in memory by
    /// [`crate::dcp::fsdp::merge`]: DTensors by the mesh and placements
    /// they record, plain local shards by `layout`, other tensors taken
    /// once and checked equal on every rank. The set's one file is the
    /// folder of the first.
    pub fn open_fsdp_files<P: AsRef<Path> + Sync>(
        paths: &[P],
        layout: Option<&crate::dcp::fsdp::LocalLayout>,
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        let files = open_all(paths, opts)?;
        CheckpointSet::merge_ranks(files, layout, opts)
    }

    fn merge_ranks(
        files: Vec<SetFile>,
        layout: Option<&crate::dcp::fsdp::LocalLayout>,
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        let named: Vec<(String, &Checkpoint)> = files
            .iter()
            .map(|f| (f.name(), f.checkpoint.as_ref()))
            .collect();
        let inputs = files
            .iter()
            .flat_map(|f| f.checkpoint.inputs().cloned())
            .collect();
        let merged = crate::dcp::fsdp::merge(&named, layout, opts.limits_ref())?.read_from(inputs);
        let folder = files
            .first()
            .and_then(|f| f.path.parent())
            .map_or_else(PathBuf::new, Path::to_path_buf);
        let file = SetFile {
            path: folder,
            checkpoint: Arc::new(merged),
        };
        CheckpointSet::build(vec![file], None, opts)
    }

    /// The set a Hugging Face index names: `{"weight_map": {tensor: file}}`,
    /// files relative to the index's directory.
    pub fn open_index(index: impl AsRef<Path>, opts: &OpenOptions) -> Result<CheckpointSet> {
        let index = index.as_ref();
        let name = file_name(index);
        let text = read_bounded(index, opts.limits_ref().max_index_bytes, "max_index_bytes")
            .map_err(|e| e.in_file(&name))?;
        let weight_map = parse_index(&text, &name, opts)?;
        let dir = index.parent().unwrap_or(Path::new(""));
        let mut paths = Vec::new();
        for shard in shard_names(&weight_map, opts)? {
            // The index names files beside it: a path with a directory in
            // it is not a shard of this set. (Symbolic links in the
            // directory are followed: they are its owner's, not the
            // index's.)
            if !plain_file_name(shard) {
                return Err(not_beside(shard, &name));
            }
            let p = dir.join(shard);
            if !p.is_file() {
                let count = weight_map.values().filter(|v| *v == shard).count();
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "shard {shard} is missing: the index places {count} tensor{} in it",
                        if count == 1 { "" } else { "s" }
                    ),
                )
                .in_file(&name));
            }
            paths.push(p);
        }
        let files = open_all(&paths, opts)?;
        let set = CheckpointSet::build(files, Some(index.to_path_buf()), opts)?;
        set.matching(&weight_map, &name)
    }

    /// The set at `url`, read by ranges: an index (a URL whose path ends
    /// in `.json`, see [`open_ranged_index`](Self::open_ranged_index))
    /// with its shards at the URLs beside it, or one checkpoint (a set of
    /// one). A directory (a path ending in `/`) cannot be listed over the
    /// network: the error says to give its index's URL.
    pub fn open_url(url: &str, opts: &OpenOptions) -> Result<CheckpointSet> {
        let path = url.split(['?', '#']).next().unwrap_or(url);
        if path.ends_with('/') {
            return Err(Error::new(
                ErrorKind::InvalidSpec,
                format!(
                    "{url} names a directory, which cannot be listed by URL: give the URL of \
                     its index (such as {path}pytorch_model.bin.index.json) or of one \
                     checkpoint file"
                ),
            ));
        }
        if Input::Url(url.to_owned()).is_index() {
            let index = crate::remote::open_url(url)?;
            return CheckpointSet::open_index_with(index, crate::remote::open_url, opts);
        }
        CheckpointSet::of(url, Arc::new(opts.open_url(url)?))
    }

    /// The set a Hugging Face index read by ranges names (an engine's own
    /// storage, or a URL): the index is read whole (at most
    /// [`Limits::max_index_bytes`](crate::Limits)), each shard name must
    /// be a plain file name (no directory, `..`, scheme, query, fragment
    /// or `%` escape), resolved against the index's name (its URL) up to
    /// its last `/`, and opened with `shard` (which gets the shard's full
    /// name) and [`OpenOptions::open_ranged`], in parallel.
    pub fn open_ranged_index(
        index: Arc<dyn RangeRead>,
        shard: impl Fn(&str) -> std::io::Result<Arc<dyn RangeRead>> + Sync,
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        let open = |url: &str| {
            shard(url).map_err(|e| Error::new(ErrorKind::Io, format!("cannot open {url}: {e}")))
        };
        CheckpointSet::open_index_with(index, open, opts)
    }

    /// [`open_ranged_index`](Self::open_ranged_index), the shards opened
    /// by `shard`.
    fn open_index_with(
        index: Arc<dyn RangeRead>,
        shard: impl Fn(&str) -> Result<Arc<dyn RangeRead>> + Sync,
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        let url = index.name().to_owned();
        let (weight_map, urls) = read_ranged_index(index.as_ref(), opts)?;
        let one = urls.len() == 1;
        let files = map_each(&urls, |u| {
            shard(u)
                .and_then(|file| opts.open_ranged(file))
                .map(|c| SetFile {
                    path: PathBuf::from(u),
                    checkpoint: Arc::new(c),
                })
                .map_err(|e| {
                    if one {
                        e
                    } else {
                        e.in_file(&file_name(Path::new(u)))
                    }
                })
        })
        .into_iter()
        .collect::<Result<Vec<SetFile>>>()?;
        let set = CheckpointSet::build(files, Some(PathBuf::from(&url)), opts)?;
        set.matching(&weight_map, &url)
    }

    /// The URLs of the shards the index at `url` names (checked as
    /// [`open_ranged_index`](Self::open_ranged_index) checks them), in
    /// name order, without opening them: for a scan of each.
    pub fn index_shard_urls(url: &str, opts: &OpenOptions) -> Result<Vec<String>> {
        let index = crate::remote::open_url(url)?;
        Ok(read_ranged_index(index.as_ref(), opts)?.1)
    }

    /// This set, checked against the index `weight_map` (named `index` in
    /// errors): every entry is where it says; tensors it does not list are
    /// a warning.
    fn matching(
        mut self,
        weight_map: &BTreeMap<String, String>,
        index: &str,
    ) -> Result<CheckpointSet> {
        for (tensor, shard) in weight_map {
            match self.tensor(tensor) {
                Some((at, _)) if self.files.get(at).is_some_and(|f| f.name() == *shard) => {}
                Some((at, _)) => {
                    // `at` is the set's own answer: always one of its files.
                    let found = self.files.get(at).map_or_else(String::new, SetFile::name);
                    return Err(Error::new(
                        ErrorKind::Tensor,
                        format!("the index places it in {shard}, but it is in {found}"),
                    )
                    .for_tensor(tensor)
                    .in_file(index));
                }
                None => {
                    return Err(Error::new(
                        ErrorKind::Tensor,
                        format!("the index places it in {shard}, which has no such tensor"),
                    )
                    .for_tensor(tensor)
                    .in_file(index));
                }
            }
        }
        let unlisted = self
            .files
            .iter()
            .flat_map(|f| f.checkpoint.tensors().map(move |t| (f, t)))
            .filter(|(_, t)| !weight_map.contains_key(t.name()))
            .count();
        if unlisted > 0 {
            self.warnings.push(Warning::NotInIndex { count: unlisted });
        }
        Ok(self)
    }

    fn build(
        files: Vec<SetFile>,
        index: Option<PathBuf>,
        opts: &OpenOptions,
    ) -> Result<CheckpointSet> {
        let total: usize = files.iter().map(|f| f.checkpoint.len()).sum();
        if total > opts.limits_ref().max_tensors {
            return Err(Error::limit(
                "max_tensors",
                opts.limits_ref().max_tensors as u64,
            ));
        }
        let mut by_name = NameIndex::with_capacity(total);
        let name_of = |(f, t): (u32, u32)| {
            let file = files.get(f as usize)?;
            Some(file.checkpoint.tensor_at(t as usize)?.info().name.as_str())
        };
        for (f, file) in files.iter().enumerate() {
            let f =
                u32::try_from(f).map_err(|_| Error::limit("max_set_files", u64::from(u32::MAX)))?;
            for (t, view) in file.checkpoint.tensors().enumerate() {
                let t = u32::try_from(t)
                    .map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
                let name = view.name();
                if let Err((first, _)) = by_name.insert(name, (f, t), name_of) {
                    let first = files
                        .get(first as usize)
                        // Indices of files already read: always there.
                        .map_or_else(String::new, SetFile::name);
                    let error = Error::new(
                        ErrorKind::DuplicateName,
                        format!(
                            "in two files of the set: {first} and {}{}",
                            file.name(),
                            ranks_hint(&files)
                        ),
                    )
                    .for_tensor(name);
                    // Files that name their ranks: a sharded model's parts.
                    let ranks = files.iter().all(|f| rank_in_name(&f.path) != u64::MAX);
                    return Err(if ranks {
                        error.with_hint(Hint::RankFiles)
                    } else {
                        error
                    });
                }
            }
        }
        Ok(CheckpointSet {
            files,
            index,
            by_name,
            warnings: Vec::new(),
            ranks: false,
        })
    }

    /// The files, in the set's order (name order, or the index's).
    pub fn files(&self) -> &[SetFile] {
        &self.files
    }

    /// The index the set was opened from, if any.
    pub fn index(&self) -> Option<&Path> {
        self.index.as_deref()
    }

    /// The tensor named `name`, and the position of its file in
    /// [`files`](Self::files).
    pub fn tensor(&self, name: &str) -> Option<(usize, TensorView<'_>)> {
        let (f, t) = self.by_name.find(name, |(f, t)| {
            let file = self.files.get(f as usize)?;
            Some(file.checkpoint.tensor_at(t as usize)?.info().name.as_str())
        })?;
        Some((f as usize, self.view(f as usize, t as usize)?))
    }

    fn view(&self, file: usize, tensor: usize) -> Option<TensorView<'_>> {
        self.files.get(file)?.checkpoint.tensor_at(tensor)
    }

    /// Every tensor with the position of its file, file by file.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, TensorView<'_>)> + '_ {
        self.files
            .iter()
            .enumerate()
            .flat_map(|(f, file)| file.checkpoint.tensors().map(move |t| (f, t)))
    }

    /// Number of tensors in all files.
    pub fn len(&self) -> usize {
        self.files.iter().map(|f| f.checkpoint.len()).sum()
    }

    /// Whether no file holds a tensor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the set's checks found that is not an error (tensors the index
    /// does not list), one line each; each file's own warnings are in its
    /// checkpoint.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }
}

/// Meta's model-parallel files repeat every name, one part per rank.
fn ranks_hint(files: &[SetFile]) -> &'static str {
    let ranks = files.len() > 1
        && files.iter().all(|f| {
            let n = f.name();
            n.starts_with("consolidated.") && n.ends_with(".pth")
        });
    if ranks {
        " (consolidated.NN.pth files are one model-parallel rank each, not shards: \
         each holds part of every tensor)"
    } else {
        ""
    }
}

/// The world size a rank file's name gives (`model_world_size_4_rank_2.pt`:
/// 4), if any.
fn world_in_name(p: &Path) -> Option<u64> {
    let name = p.file_stem()?.to_string_lossy().to_ascii_lowercase();
    let rest = name.get(name.find("world_size")? + "world_size".len()..)?;
    let digits: String = rest
        .trim_start_matches(['_', '-'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The rank a file's name gives (`model_world_size_4_rank_2.pt`: 2), to
/// order rank files by; `u64::MAX` when it names none.
fn rank_in_name(p: &Path) -> u64 {
    // A path without a file name names no rank.
    let Some(stem) = p.file_stem() else {
        return u64::MAX;
    };
    let name = stem.to_string_lossy().to_ascii_lowercase();
    name.rfind("rank")
        .and_then(|at| name.get(at + 4..))
        .map(|rest| rest.trim_start_matches(['_', '-']))
        .and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .unwrap_or(u64::MAX)
}

/// An index's `weight_map` (named `index` in errors), within the limits:
/// `{"weight_map": {tensor: file}, ...}`, other keys passed over, a name
/// given twice taking the last file.
fn parse_index(text: &[u8], index: &str, opts: &OpenOptions) -> Result<BTreeMap<String, String>> {
    let max = opts.limits_ref().max_tensors;
    let read = || -> std::result::Result<Option<BTreeMap<String, String>>, Error> {
        let bad = |e: crate::json::JsonError| {
            Error::new(
                ErrorKind::InvalidSpec,
                format!("not a checkpoint index ({{\"weight_map\": {{tensor: file}}}}): {e}"),
            )
        };
        let mut r = crate::json::Reader::new(text).map_err(bad)?;
        r.begin_object("the index").map_err(bad)?;
        let mut map = None;
        while let Some(key) = r.key().map_err(bad)? {
            if key != "weight_map" {
                let t = r.token().map_err(bad)?;
                r.skip(&t).map_err(bad)?;
                continue;
            }
            if map.is_some() {
                return Err(bad(r.error("duplicate field `weight_map`")));
            }
            r.begin_object("weight_map").map_err(bad)?;
            let mut m = BTreeMap::new();
            while let Some(name) = r.key().map_err(bad)? {
                let file = r.string_value("a file of weight_map").map_err(bad)?;
                m.insert(name.into_owned(), file);
                if m.len() > max {
                    return Err(Error::limit("max_tensors", max as u64));
                }
            }
            map = Some(m);
        }
        r.end().map_err(bad)?;
        Ok(map)
    };
    read()
        .and_then(|map| {
            map.ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidSpec,
                    "not a checkpoint index ({\"weight_map\": {tensor: file}}): missing field `weight_map`",
                )
            })
        })
        .map_err(|e| e.in_file(index))
}

/// The `weight_map` of an index read by ranges, and the URL of each shard
/// it names (resolved against the index's name), in name order.
fn read_ranged_index(
    index: &dyn RangeRead,
    opts: &OpenOptions,
) -> Result<(BTreeMap<String, String>, Vec<String>)> {
    let url = index.name();
    let max = opts.limits_ref().max_index_bytes;
    if index.len() > max {
        return Err(Error::limit("max_index_bytes", max).in_file(url));
    }
    let text = index
        .read_at(0, index.len())
        .map_err(|e| Error::new(ErrorKind::Io, format!("cannot read {url}: {e}")))?;
    if text.len() as u64 != index.len() {
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "{url}: asked for {} bytes, received {}",
                index.len(),
                text.len()
            ),
        ));
    }
    let weight_map = parse_index(&text, url, opts)?;
    let path = url.split(['?', '#']).next().unwrap_or(url);
    // The directory is within the path, after the host: an index URL
    // without a path (`https://host.json`) has no directory beside it, and
    // a shard name must never become a host.
    let authority = path.find("://").map_or(0, |at| at + 3);
    let dir = match path.get(authority..).and_then(|rest| rest.rfind('/')) {
        Some(at) => path.get(..=authority + at).unwrap_or(path),
        None if authority > 0 => {
            return Err(Error::new(
                ErrorKind::InvalidSpec,
                format!("{url}: an index URL needs a path after its host, where its shards lie"),
            ))
        }
        None => "",
    };
    let odd =
        |c: char| matches!(c, '?' | '#' | '%' | '\\' | ':') || c.is_whitespace() || c.is_control();
    let mut urls = Vec::new();
    for name in shard_names(&weight_map, opts)? {
        if !plain_file_name(name) || name.contains(odd) {
            return Err(not_beside(name, url));
        }
        urls.push(format!("{dir}{name}"));
    }
    Ok((weight_map, urls))
}

/// The files an index names, each once, in name order.
fn shard_names<'m>(
    weight_map: &'m BTreeMap<String, String>,
    opts: &OpenOptions,
) -> Result<Vec<&'m str>> {
    let mut names: Vec<&str> = weight_map.values().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    if names.len() > opts.limits_ref().max_set_files {
        return Err(Error::limit(
            "max_set_files",
            opts.limits_ref().max_set_files as u64,
        ));
    }
    Ok(names)
}

/// Whether `name` is one file name: no directory, no `.` or `..`, not
/// absolute.
fn plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    )
}

fn not_beside(shard: &str, index: &str) -> Error {
    Error::new(
        ErrorKind::InvalidSpec,
        format!("the index names shard {shard:?}, which is not a file beside it"),
    )
    .in_file(index)
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// `f` of each item, in order: on rayon's pool when there are several
/// (feature `parallel`: a set's files open at once), else on this thread
/// (one file starts no pool: a pool's threads are a process's start-up
/// cost, one per core).
fn map_each<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    #[cfg(feature = "parallel")]
    if items.len() > 1 {
        return items.par_iter().map(f).collect();
    }
    items.iter().map(f).collect()
}

/// Open every file (in parallel with feature `parallel`); the first failure (in set order) names
/// its file.
fn open_all<P: AsRef<Path> + Sync>(paths: &[P], opts: &OpenOptions) -> Result<Vec<SetFile>> {
    if paths.len() > opts.limits_ref().max_set_files {
        return Err(Error::limit(
            "max_set_files",
            opts.limits_ref().max_set_files as u64,
        ));
    }
    // Each file's errors name it (`OpenOptions::open` does).
    map_each(paths, |p| {
        let path = p.as_ref();
        opts.open(path).map(|c| SetFile {
            path: path.to_path_buf(),
            checkpoint: Arc::new(c),
        })
    })
    .into_iter()
    .collect()
}
