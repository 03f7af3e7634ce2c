//! The reader's layers only look down: each module may name only modules of
//! its own layer or of the layers below it. The layers are the table in
//! docs/architecture.md, read here: a `crate::` path in code that points
//! up, or at an item through the crate root instead of its module, fails
//! with the file and line, and so do a module the table does not place, a
//! file it names that does not exist, and two files that import each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The layer table of docs/architecture.md: each row's source paths
/// (backticked names ending in `.rs` or `/`), bottom to top.
fn table() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let (begin, end) = ("<!-- layers:begin -->", "<!-- layers:end -->");
    let start = doc.find(begin).expect("layers:begin marker") + begin.len();
    let stop = doc.find(end).expect("layers:end marker");
    doc[start..stop]
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|row| {
            let modules = row.split('|').nth(2).expect("a modules column");
            modules
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|p| p.ends_with(".rs") || p.ends_with('/'))
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

/// Bottom to top: the top-level modules of each row. Modules in one
/// layer may use each other.
fn layers() -> Vec<Vec<String>> {
    table()
        .iter()
        .map(|row| {
            let mut modules: Vec<String> = row
                .iter()
                .map(|p| {
                    let first = p.split('/').next().unwrap();
                    first.trim_end_matches(".rs").to_owned()
                })
                .collect();
            modules.dedup();
            modules
        })
        .collect()
}

fn layer_of(layers: &[Vec<String>], module: &str) -> Option<usize> {
    layers
        .iter()
        .position(|layer| layer.iter().any(|m| m == module))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`torch/names.rs` ->
/// `torch`, `lib.rs` -> `lib`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// Each `crate::<module>` named on a line outside comments, and brace
/// groups `crate::{a, b}`.
fn referenced_modules(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

fn violations(src: &Path) -> Vec<String> {
    let layers = layers();
    let mut files = Vec::new();
    sources(src, &mut files);
    assert!(files.len() > 20, "too few sources under {}", src.display());
    let mut found = Vec::new();
    for file in &files {
        let module = module_of(src, file);
        let own = layer_of(&layers, &module).unwrap_or_else(|| {
            panic!(
                "{}: module {module} is in no layer of docs/architecture.md",
                file.display()
            )
        });
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for target in referenced_modules(line) {
                let where_ = format!("{}:{}", file.display(), n + 1);
                match layer_of(&layers, &target) {
                    None => found.push(format!(
                        "{where_}: crate::{target} is not a module: name items by their module"
                    )),
                    Some(l) if l > own => found.push(format!(
                        "{where_}: {module} (layer {own}) uses {target} (layer {l}), above it"
                    )),
                    Some(_) => {}
                }
            }
        }
    }
    found
}

#[test]
fn reader_layers_only_look_down() {
    let found = violations(&src_dir());
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn an_upward_import_is_caught() {
    assert_eq!(referenced_modules("use crate::torch::TorchObj;"), ["torch"]);
    assert_eq!(
        referenced_modules("use crate::{bytes::slice, error::Error};"),
        ["bytes", "error"]
    );
    assert!(referenced_modules("/// See [`Limits`](crate::Limits).").is_empty());
    let layers = layers();
    assert!(layer_of(&layers, "torch") > layer_of(&layers, "pickle"));
    // A copy of the reader with the pickle layer naming the torch layer.
    let dir = std::env::temp_dir().join(format!("ptload-layers-{}", std::process::id()));
    let src = dir.join("src");
    let real = src_dir();
    let mut files = Vec::new();
    sources(&real, &mut files);
    for file in &files {
        let to = src.join(file.strip_prefix(&real).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(file, &to).unwrap();
    }
    let value = src.join("pickle/value.rs");
    let text = std::fs::read_to_string(&value).unwrap();
    std::fs::write(&value, format!("use crate::torch::TorchObj;\n{text}")).unwrap();
    let found = violations(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("pickle (layer 4) uses torch (layer 5)"),
        "{}",
        found[0]
    );
}

/// Every path the table names exists, and every module of the reader is in
/// a row.
#[test]
fn the_layer_table_places_every_module_in_files_that_exist() {
    let src = src_dir();
    let rows = table();
    assert!(rows.len() > 10, "too few layers: {rows:?}");
    for path in rows.iter().flatten() {
        assert!(
            src.join(path).exists(),
            "docs/architecture.md names {path}, which is not in the reader's src/"
        );
    }
    let placed: BTreeSet<String> = layers().into_iter().flatten().collect();
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs");
        assert!(
            placed.contains(module),
            "src/{name}: module {module} is in no layer of docs/architecture.md"
        );
    }
}

/// The module a source file is (`torch/interp/mod.rs` -> `torch::interp`,
/// `lib.rs` -> the root).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned()
        })
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The paths a line names after `anchor` (`crate::`, `super::`), each
/// item of a brace group its own path.
fn paths_after(code: &str, anchor: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let split = |p: &str| -> Vec<String> {
        p.split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(anchor) {
        // `super::super::` is not used in the reader; one level is read.
        rest = &rest[at + anchor.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let path: String = part.trim().chars().take_while(|&c| ident(c)).collect();
                out.push(split(&path));
            }
        } else {
            let path: String = rest.chars().take_while(|&c| ident(c)).collect();
            out.push(split(&path));
        }
    }
    out
}

/// Which files (modules) each file imports, outside its tests.
fn imports(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(src, f)).collect();
    // The longest prefix of `path` that is a file of its own.
    let resolve = |path: &[String]| {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| modules.contains(p))
    };
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_path(src, file);
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        let parent = module[..module.len().saturating_sub(1)].to_vec();
        let mut deps = BTreeSet::new();
        for line in code.lines() {
            let line = line.split("//").next().unwrap();
            let named = paths_after(line, "crate::").into_iter().chain(
                paths_after(line, "super::")
                    .into_iter()
                    .map(|p| parent.iter().cloned().chain(p).collect()),
            );
            for path in named {
                // A module's own ancestors declare it: using them is no
                // circle.
                if let Some(to) = resolve(&path).filter(|to| !module.starts_with(to)) {
                    deps.insert(to);
                }
            }
        }
        graph.insert(module, deps);
    }
    graph
}

fn circles(src: &Path) -> Vec<String> {
    let graph = imports(src);
    let mut found = Vec::new();
    for (a, deps) in &graph {
        for b in deps {
            if a < b && graph.get(b).is_some_and(|back| back.contains(a)) {
                found.push(format!("{} <-> {}", a.join("/"), b.join("/")));
            }
        }
    }
    found
}

/// In the reader, and in the device crate beside it (its pipeline, driver
/// helpers and probe).
#[test]
fn no_two_files_import_each_other() {
    let found = circles(&src_dir());
    assert!(found.is_empty(), "import circles: {found:?}");
    let device = repo().join("crates/ptload-device/src");
    let found = circles(&device);
    assert!(
        found.is_empty(),
        "import circles in ptload-device: {found:?}"
    );
    // The check sees one: a copy of the reader whose pickle VM names the
    // value module that already names it.
    let dir = std::env::temp_dir().join(format!("ptload-circles-{}", std::process::id()));
    let src = dir.join("src");
    let real = src_dir();
    let mut files = Vec::new();
    sources(&real, &mut files);
    for file in &files {
        let to = src.join(file.strip_prefix(&real).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(file, &to).unwrap();
    }
    let value = src.join("pickle/value.rs");
    let text = std::fs::read_to_string(&value).unwrap();
    std::fs::write(&value, format!("use super::vm::Vm;\n{text}")).unwrap();
    let found = circles(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, ["pickle/value <-> pickle/vm"]);
}

/// The root holds what reading needs, at most twelve items; every other
/// concern is a public module.
#[test]
fn the_root_holds_at_most_twelve_items() {
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).unwrap();
    let mut items = Vec::new();
    for stmt in lib.split(';') {
        let stmt = stmt.trim();
        let Some(used) = stmt
            .lines()
            .map(str::trim)
            .skip_while(|l| l.starts_with("//") || l.starts_with("#["))
            .collect::<Vec<_>>()
            .join(" ")
            .strip_prefix("pub use ")
            .map(str::to_owned)
        else {
            continue;
        };
        match used.split_once('{') {
            Some((_, group)) => items.extend(
                group
                    .trim_end_matches('}')
                    .split(',')
                    .map(|i| i.trim().to_owned())
                    .filter(|i| !i.is_empty()),
            ),
            None => items.push(used.rsplit("::").next().unwrap().to_owned()),
        }
    }
    assert!(items.contains(&"Checkpoint".to_owned()), "{items:?}");
    assert!(items.len() <= 12, "{} root items: {items:?}", items.len());
}

/// Every repository path docs/architecture.md names exists.
#[test]
fn the_architecture_names_files_that_exist() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let roots = [
        "crates/",
        "benches/",
        "examples/",
        "simcuda/",
        "fixtures/",
        "tests/",
        "docs/",
        "fuzz/",
        "bindings/",
    ];
    let named: Vec<&str> = doc
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| roots.iter().any(|r| t.starts_with(r)))
        .filter(|t| !t.contains(['<', '*', ' ']))
        .collect();
    assert!(named.len() > 5, "{named:?}");
    for path in named {
        assert!(
            repo().join(path).exists(),
            "docs/architecture.md names {path}, which does not exist"
        );
    }
}
