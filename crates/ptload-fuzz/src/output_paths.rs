//! The output rules of `Export::to_file` (what `ptload convert`
//! writes through), on generated directory trees: files, symbolic links
//! (relative, absolute, dangling, looping, through directories), hard links
//! to the input, directories and sockets under the names the output may
//! take. Whatever the tree, the checkpoint being read is never changed, a
//! failed or cancelled write changes nothing at all (no partial file), and
//! a successful one changes exactly one regular file: the output path with
//! its links followed, which did not exist before unless overwriting was
//! asked for, and which now holds a safetensors file of every tensor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arbitrary::Arbitrary;
use ptload_reader::export::SafetensorsOptions;
use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
use ptload_reader::OpenOptions;

/// The checkpoint every scene converts (a real torch file, 4 tensors).
const INPUT: &[u8] = include_bytes!("../../../fixtures/files/basic.pt");

/// Names a scene may use, relative to its scratch directory. `in.pt` is
/// the checkpoint being read.
const NAMES: [&str; 8] = ["in.pt", "out", "a", "b", "d", "d/x", "d/in.pt", "d/d"];

#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Name(u8);

impl Name {
    fn path(self) -> &'static str {
        NAMES[self.0 as usize % NAMES.len()]
    }
}

#[derive(Debug, Arbitrary)]
pub enum LinkTo {
    /// Relative to the link's own directory (`../x` from inside `d/`).
    Relative(Name),
    /// An absolute path inside the scratch directory.
    Absolute(Name),
    /// Somewhere inside the scratch directory that does not exist.
    Dangling,
}

#[derive(Debug, Arbitrary)]
pub enum Entry {
    File(Name, u8),
    Symlink(Name, LinkTo),
    HardLink(Name, Name),
    Dir(Name),
    Socket(Name),
}

/// One generated directory tree and one write into it.
#[derive(Debug, Arbitrary)]
pub struct Scene {
    pub entries: Vec<Entry>,
    pub output: Name,
    pub overwrite: bool,
    pub cancelled: bool,
    pub in_memory: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Link(PathBuf),
    Dir,
    Other,
}

/// Everything under `root`, without following links (at most 4 levels).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(PathBuf::new(), 0usize)];
    while let Some((rel, depth)) = todo.pop() {
        let Ok(read) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for entry in read.flatten() {
            let rel = rel.join(entry.file_name());
            let path = root.join(&rel);
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let node = if meta.file_type().is_symlink() {
                Node::Link(std::fs::read_link(&path).unwrap_or_default())
            } else if meta.is_file() {
                Node::File(std::fs::read(&path).unwrap_or_default())
            } else if meta.is_dir() {
                if depth < 4 {
                    todo.push((rel.clone(), depth + 1));
                }
                Node::Dir
            } else {
                Node::Other
            };
            out.insert(rel, node);
        }
    }
    out
}

fn build(root: &Path, entries: &[Entry]) -> Vec<std::os::unix::net::UnixListener> {
    let mut sockets = Vec::new();
    for e in entries.iter().take(12) {
        // Each step may fail (a name taken, a parent missing): the tree is
        // whatever the steps that worked made.
        match e {
            Entry::File(n, c) => {
                let _ = std::fs::write(root.join(n.path()), [*c; 3]);
            }
            Entry::Symlink(n, to) => {
                let link = root.join(n.path());
                let target = match to {
                    LinkTo::Relative(t) => {
                        let depth = n.path().matches('/').count();
                        PathBuf::from("../".repeat(depth)).join(t.path())
                    }
                    LinkTo::Absolute(t) => root.join(t.path()),
                    LinkTo::Dangling => root.join("missing/nothing"),
                };
                let _ = std::os::unix::fs::symlink(target, link);
            }
            Entry::HardLink(n, to) => {
                let _ = std::fs::hard_link(root.join(to.path()), root.join(n.path()));
            }
            Entry::Dir(n) => {
                let _ = std::fs::create_dir(root.join(n.path()));
            }
            Entry::Socket(n) => {
                if let Ok(l) = std::os::unix::net::UnixListener::bind(root.join(n.path())) {
                    sockets.push(l);
                }
            }
        }
    }
    sockets
}

/// A fresh scratch directory, removed (without following links) on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("ptload-output-paths-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn output_paths(scene: &Scene) {
    let scratch = Scratch::new();
    // The scene lives one level down: a relative link moved up a level (a
    // hard link to a symbolic link keeps its text) still points inside
    // the scratch directory, which is what the snapshots cover.
    let root = &scratch.0.join("w");
    std::fs::create_dir(root).expect("work directory");
    let input = root.join("in.pt");
    std::fs::write(&input, INPUT).expect("input");
    let _sockets = build(root, &scene.entries);
    // The scene may have replaced in.pt itself; the write reads whatever
    // was opened, and that file must come through untouched.
    let mut open = OpenOptions::new();
    if scene.in_memory {
        open = open.in_memory(true);
    }
    let Ok(ckpt) = open.open(&input) else {
        return;
    };
    let every = StateDictOptions {
        key: KeySelect::All,
        strip: Strip::None,
        ..Default::default()
    };
    let Ok(selection) = every.select(&ckpt) else {
        return;
    };
    let output = root.join(scene.output.path());
    let resolved_before = std::fs::canonicalize(&output).ok();
    let input_id = std::fs::metadata(&input).ok().map(|m| id(&m));
    let target_before = resolved_before
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok());
    let before = snapshot(&scratch.0);
    let opts = SafetensorsOptions {
        overwrite: scene.overwrite,
        cancel: Some(Arc::new(AtomicBool::new(scene.cancelled))),
        ..Default::default()
    };
    let result = ptload_reader::export::Export::state_dict(&selection, &opts).to_file(&output);
    let after = snapshot(&scratch.0);
    match result {
        Err(e) => {
            assert!(!e.message().is_empty());
            assert!(
                before == after,
                "a failed write ({e}) changed the directory: {:?}",
                changed(&before, &after)
            );
        }
        Ok(written) => {
            assert!(!scene.cancelled, "a cancelled write succeeded");
            let diff = changed(&before, &after);
            let resolved = std::fs::canonicalize(&output).expect("the output exists");
            let rel = resolved
                .strip_prefix(std::fs::canonicalize(&scratch.0).expect("scratch"))
                .expect("the output stays in the scratch directory")
                .to_path_buf();
            assert_eq!(diff, vec![rel.clone()], "the write changed other paths");
            if let Some(meta) = target_before {
                assert!(
                    scene.overwrite,
                    "replaced {} without overwrite",
                    rel.display()
                );
                assert!(meta.is_file(), "replaced a non-regular file");
                assert!(
                    Some(id(&meta)) != input_id,
                    "replaced the checkpoint being read"
                );
            }
            let bytes = std::fs::read(&resolved).expect("read the output");
            let st = safetensors::SafeTensors::deserialize(&bytes)
                .unwrap_or_else(|e| panic!("the output is not a safetensors file: {e}"));
            assert_eq!(st.len(), written.tensors);
            assert_eq!(st.len(), selection.len());
        }
    }
}

fn id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

fn changed(before: &BTreeMap<PathBuf, Node>, after: &BTreeMap<PathBuf, Node>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(after.keys().filter(|k| !before.contains_key(*k)).cloned());
    out.sort();
    out.dedup();
    out
}

/// The target on raw bytes (for replaying seeds and regression files).
pub fn output_paths_bytes(data: &[u8]) {
    let mut u = arbitrary::Unstructured::new(data);
    if let Ok(scene) = Scene::arbitrary(&mut u) {
        output_paths(&scene);
    }
}
