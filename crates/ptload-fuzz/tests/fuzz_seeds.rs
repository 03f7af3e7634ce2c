//! Replays every fuzz target on its fixed seeds: the torch fixtures, the
//! hostile corpus, the seed corpora in fuzz/seeds, every regression file in
//! fuzz/regressions, and a deterministic stream of generated checkpoints.
//! A fuzz finding, once fixed, is kept here as a file and stays fixed.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir` (not recursive), sorted; none when it is absent.
fn files(dir: &str) -> Vec<PathBuf> {
    let Ok(read) = fs::read_dir(root().join(dir)) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_none_or(|e| e != "json" && e != "md" && e != "py")
        })
        .collect();
    out.sort();
    out
}

/// `count` inputs of up to `max_len` bytes from a fixed xorshift stream.
fn generated(seed: u64, count: usize, max_len: u64) -> Vec<Vec<u8>> {
    let mut state = seed;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count)
        .map(|_| {
            let len = next() % max_len;
            (0..len).map(|_| next() as u8).collect()
        })
        .collect()
}

fn replay(target: fn(&[u8]), dirs: &[&str]) -> usize {
    let mut n = 0;
    for dir in dirs {
        for path in files(dir) {
            let data = fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(outcome.is_ok(), "{} failed on {}", dir, path.display());
            n += 1;
        }
    }
    n
}

#[test]
fn checkpoint_target() {
    let n = replay(
        ptload_fuzz::checkpoint,
        &[
            "fixtures/files",
            "tests/hostile",
            "fuzz/regressions/checkpoint",
        ],
    );
    assert!(n >= 36, "only {n} seeds");
}

#[test]
fn container_target() {
    let n = replay(
        ptload_fuzz::container,
        &[
            "fixtures/files",
            "tests/hostile",
            "fuzz/regressions/container",
        ],
    );
    assert!(n >= 36, "only {n} seeds");
}

#[test]
fn pickle_vm_target() {
    let n = replay(
        ptload_fuzz::pickle_vm,
        &[
            "fuzz/seeds/pickle_vm",
            "fuzz/seeds/differential",
            "fuzz/regressions/pickle_vm",
        ],
    );
    assert!(n >= 20, "only {n} seeds");
}

#[test]
fn differential_target() {
    let n = replay(
        ptload_fuzz::differential,
        &["fuzz/seeds/differential", "fuzz/regressions/differential"],
    );
    assert!(n >= 200, "only {n} seeds");
}

#[test]
fn map_location_target() {
    let n = replay(
        ptload_fuzz::map_location,
        &["fuzz/seeds/map_location", "fuzz/regressions/map_location"],
    );
    assert!(n >= 10, "only {n} seeds");
}

#[test]
fn structured_target_regressions() {
    replay(
        ptload_fuzz::structured_bytes,
        &["fuzz/regressions/structured"],
    );
}

/// Generated checkpoints from a fixed pseudo-random stream: each is checked
/// to read back exactly, then damaged.
#[test]
fn structured_target_generated() {
    for data in generated(0x9e37_79b9_7f4a_7c15, 300, 400) {
        ptload_fuzz::structured_bytes(&data);
    }
}

/// The differential oracle itself: it must see a difference when there is one.
#[test]
fn differential_detects_a_difference() {
    // CPython's pickle of [1, "a"], protocol 2.
    let good = b"\x80\x02]q\x00(K\x01X\x01\x00\x00\x00aq\x01e.";
    assert!(ptload_fuzz::serde_pickle_agrees(good).is_ok());
    assert_eq!(
        ptload_fuzz::plain(good).map(|p| ptload_fuzz::canonical(&p)),
        Some("[1,\"a\",]".to_owned())
    );
}

/// Output paths: regression files, then scenes from a fixed pseudo-random
/// stream (directory trees of files, links, hard links, directories and
/// sockets under the names the output may take).
#[test]
fn output_paths_target() {
    replay(
        ptload_fuzz::output_paths_bytes,
        &["fuzz/regressions/output_paths"],
    );
    for data in generated(0x2545_f491_4f6c_dd1d, 400, 64) {
        ptload_fuzz::output_paths_bytes(&data);
    }
}

/// The fixtures' distributed checkpoints as inputs of the dcp target.
fn dcp_fixture_inputs() -> Vec<Vec<u8>> {
    let base = root().join("fixtures/files/dcp");
    let mut dirs: Vec<PathBuf> = fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|dir| {
            let mut names: Vec<String> = fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let files: Vec<(String, Vec<u8>)> = names
                .into_iter()
                .map(|n| {
                    let bytes = fs::read(dir.join(&n)).unwrap();
                    (n, bytes)
                })
                .collect();
            let refs: Vec<(&str, &[u8])> = files
                .iter()
                .map(|(n, b)| (n.as_str(), b.as_slice()))
                .collect();
            ptload_fuzz::dcp_input(&refs)
        })
        .collect()
}

#[test]
fn dcp_target() {
    let inputs = dcp_fixture_inputs();
    assert!(inputs.len() >= 8, "{}", inputs.len());
    for (i, data) in inputs.iter().enumerate() {
        assert!(ptload_fuzz::dcp(data) >= 7, "fixture {i}");
        // Damaged copies: every 97th byte flipped, and cut short.
        let mut flipped = data.clone();
        for b in flipped.iter_mut().skip(i).step_by(97) {
            *b ^= 0x5a;
        }
        ptload_fuzz::dcp(&flipped);
        ptload_fuzz::dcp(&data[..data.len() * 2 / 3]);
        // A few bytes changed at a time, from a fixed stream.
        for (j, noise) in generated(0x1234_5678 + i as u64, 150, 12)
            .iter()
            .enumerate()
        {
            let mut mutated = data.clone();
            for pair in noise.chunks(3) {
                if let [a, b, v] = pair {
                    // Mostly in the metadata, which comes first.
                    let span = if j % 2 == 0 { 3000 } else { mutated.len() };
                    let at = (usize::from(*a) << 8 | usize::from(*b)) % span.min(mutated.len());
                    mutated[at] = *v;
                }
            }
            ptload_fuzz::dcp(&mutated);
        }
    }
    let n = replay(
        |data| {
            ptload_fuzz::dcp(data);
        },
        &["fuzz/seeds/dcp", "fuzz/regressions/dcp"],
    );
    assert!(n >= 6, "only {n} seeds");
    for data in generated(0x51_7cc1_b727_220a, 300, 600) {
        ptload_fuzz::dcp(&data);
    }
}
