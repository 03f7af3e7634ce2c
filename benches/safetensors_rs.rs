//! Open and read of a safetensors file in-process: ptload-reader against
//! the safetensors crate (safetensors-rs), on the CPU.
//!
//! Run with `cargo bench -p ptload-reader --bench safetensors_rs [-- RUNS
//! [FILE.pt...]]` (default 15 runs). Inputs, written once to
//! `$TMPDIR/ptload-bench-st/` with the safetensors crate: 20,000 F32
//! tensors of 20 elements (1.6 MB, many small tensors: the header's cost)
//! and 148 tensors of GPT-2 small's shapes (about 500 MB). Each run maps
//! the file, checks its header, and reads the first byte of every tensor
//! (so neither side wins by not making its views); the median of the runs,
//! warm page cache, is printed per reader and file.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ptload_reader::Checkpoint;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

fn inputs() -> Vec<(&'static str, PathBuf)> {
    let dir = std::env::temp_dir().join("ptload-bench-st");
    std::fs::create_dir_all(&dir).expect("bench dir");
    let many = dir.join("many_tensors.safetensors");
    if !many.is_file() {
        let data = vec![0u8; 80];
        let views: HashMap<String, TensorView<'_>> = (0..20_000)
            .map(|i| {
                let v = TensorView::new(Dtype::F32, vec![4, 5], &data).expect("view");
                (format!("layers.{}.block.{}.weight", i / 100, i % 100), v)
            })
            .collect();
        write(&many, views);
    }
    let wide = dir.join("gpt2_shapes.safetensors");
    if !wide.is_file() {
        let (h, layers, vocab, ctx) = (768usize, 12usize, 50257usize, 1024usize);
        let mut shapes: Vec<(String, Vec<usize>)> = vec![
            ("wte.weight".into(), vec![vocab, h]),
            ("wpe.weight".into(), vec![ctx, h]),
            ("ln_f.weight".into(), vec![h]),
            ("ln_f.bias".into(), vec![h]),
        ];
        for l in 0..layers {
            for (name, shape) in [
                ("ln_1.weight", vec![h]),
                ("ln_1.bias", vec![h]),
                ("attn.c_attn.weight", vec![h, 3 * h]),
                ("attn.c_attn.bias", vec![3 * h]),
                ("attn.c_proj.weight", vec![h, h]),
                ("attn.c_proj.bias", vec![h]),
                ("ln_2.weight", vec![h]),
                ("ln_2.bias", vec![h]),
                ("mlp.c_fc.weight", vec![h, 4 * h]),
                ("mlp.c_fc.bias", vec![4 * h]),
                ("mlp.c_proj.weight", vec![4 * h, h]),
                ("mlp.c_proj.bias", vec![h]),
            ] {
                shapes.push((format!("h.{l}.{name}"), shape));
            }
        }
        let buffers: Vec<Vec<u8>> = shapes
            .iter()
            .enumerate()
            .map(|(i, (_, s))| vec![i as u8; s.iter().product::<usize>() * 4])
            .collect();
        let views: HashMap<String, TensorView<'_>> = shapes
            .iter()
            .zip(&buffers)
            .map(|((n, s), b)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::F32, s.clone(), b).expect("view"),
                )
            })
            .collect();
        write(&wide, views);
    }
    vec![("many_tensors", many), ("gpt2_shapes", wide)]
}

/// A checkpoint torch saved (`pt`) and a safetensors file of the same
/// tensors (names, dtypes, shapes, bytes), written once from it with the
/// safetensors crate: the same job for each reader in its own format.
fn same_tensors(pt: &Path) -> PathBuf {
    let dir = std::env::temp_dir().join("ptload-bench-st");
    std::fs::create_dir_all(&dir).expect("bench dir");
    let stem = pt
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a file name");
    let st = dir.join(format!("{stem}_pt.safetensors"));
    if !st.is_file() {
        let ckpt = Checkpoint::open(pt).expect("open");
        let tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = ckpt
            .tensors()
            .map(|t| {
                let dtype = match t.dtype() {
                    ptload_reader::DType::F32 => Dtype::F32,
                    ptload_reader::DType::F16 => Dtype::F16,
                    ptload_reader::DType::BF16 => Dtype::BF16,
                    other => panic!("{}: {other:?} is not compared here", t.name()),
                };
                (
                    t.name().to_string(),
                    dtype,
                    t.shape().iter().map(|&d| d as usize).collect(),
                    t.data().expect("data").to_vec(),
                )
            })
            .collect();
        let views: HashMap<String, TensorView<'_>> = tensors
            .iter()
            .map(|(n, d, s, b)| {
                let v = TensorView::new(*d, s.clone(), b).expect("view");
                (n.clone(), v)
            })
            .collect();
        write(&st, views);
    }
    st
}

fn write(path: &Path, views: HashMap<String, TensorView<'_>>) {
    let tmp = path.with_extension("partial");
    safetensors::serialize_to_file(views, None, &tmp).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn ptload(path: &Path) -> usize {
    let ckpt = Checkpoint::open(path).expect("open");
    let mut sum = 0usize;
    for t in ckpt.tensors() {
        sum += t.data().expect("data").first().copied().unwrap_or(0) as usize;
    }
    sum + ckpt.len()
}

fn safetensors_rs(path: &Path) -> usize {
    let file = std::fs::File::open(path).expect("open");
    // SAFETY: the file is not modified while the map lives (this bench
    // wrote it and only reads it).
    let map = unsafe { memmap2::Mmap::map(&file) }.expect("map");
    let st = SafeTensors::deserialize(&map).expect("deserialize");
    let mut sum = 0usize;
    for (_, view) in st.iter() {
        sum += view.data().first().copied().unwrap_or(0) as usize;
    }
    sum + st.len()
}

fn median(runs: usize, mut f: impl FnMut() -> usize) -> Duration {
    black_box(f());
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            black_box(f());
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let runs = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(15);
    println!(
        "{:<14} {:>14} {:>16} {:>8}",
        "file", "ptload-reader", "safetensors-rs", "ratio"
    );
    for (name, path) in inputs() {
        assert_eq!(
            ptload(&path),
            safetensors_rs(&path),
            "{name}: the readers disagree"
        );
        let ours = median(runs, || ptload(&path));
        let theirs = median(runs, || safetensors_rs(&path));
        println!(
            "{name:<14} {:>11.3} ms {:>13.3} ms {:>7.2}x",
            ours.as_secs_f64() * 1e3,
            theirs.as_secs_f64() * 1e3,
            theirs.as_secs_f64() / ours.as_secs_f64()
        );
    }
    // The repository's many_tensors.pt (20,000 tensors torch saved), then
    // any `.pt` given on the command line (GPT-2 from benches/compare.py,
    // say).
    let many =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files/many_tensors.pt");
    let given = std::env::args()
        .skip(1)
        .filter(|a| a.ends_with(".pt"))
        .map(PathBuf::from);
    for pt in std::iter::once(many).chain(given) {
        let st = same_tensors(&pt);
        assert_eq!(ptload(&pt), safetensors_rs(&st), "the same tensors differ");
        let ours = median(runs, || ptload(&pt));
        let theirs = median(runs, || safetensors_rs(&st));
        let name = pt.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        println!(
            "{name:<14} {:>11.3} ms {:>13.3} ms {:>7.2}x   (ptload: the .pt torch saved; safetensors-rs: the same tensors as .safetensors)",
            ours.as_secs_f64() * 1e3,
            theirs.as_secs_f64() * 1e3,
            theirs.as_secs_f64() / ours.as_secs_f64()
        );
    }
}
