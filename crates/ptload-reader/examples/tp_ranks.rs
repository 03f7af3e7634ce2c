//! Tensor-parallel reading across processes, as torchrun would run it.
//!
//! `cargo run -p ptload-reader --example tp_ranks -- [SET] [WORLD]`
//! (defaults: the `llama_tiny_sharded` fixture, world 4).
//!
//! Without `RANK` in the environment this is the launcher: it starts WORLD
//! copies of itself with the variables torchrun sets (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), waits
//! for all, and checks that the ranks' parts of each split dimension tile
//! it exactly. With `RANK` set it is one rank: it selects the set with the
//! `llama` preset, reads its slices, checks each against the whole tensor
//! narrowed here by hand, and prints what it read.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ptload_reader::set::CheckpointSet;
use ptload_reader::state_dict::StateDictOptions;
use ptload_reader::tp::{Shard, Splits};

type Res<T> = Result<T, Box<dyn Error>>;

/// A split tensor's dim and size, and the `(start, len)` of each rank's part.
type Parts = (String, String, Vec<(u64, u64)>);

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let set = args.next().map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../fixtures/files/llama_tiny_sharded")
        },
        PathBuf::from,
    );
    let world: u32 = args.next().map_or(Ok(4), |w| w.parse())?;
    if std::env::var_os("RANK").is_some() {
        rank(&set)
    } else {
        launch(&set, world)
    }
}

/// Rows `start..start + len` along `dim` of a row-major tensor's bytes.
fn narrow(whole: &[u8], shape: &[u64], elem: usize, dim: usize, start: u64, len: u64) -> Vec<u8> {
    let prod = |s: &[u64]| s.iter().product::<u64>() as usize;
    let outer = prod(&shape[..dim]);
    let inner = prod(&shape[dim + 1..]) * elem;
    let row = shape[dim] as usize * inner;
    let (start, len) = (start as usize * inner, len as usize * inner);
    let mut out = Vec::with_capacity(outer * len);
    for o in 0..outer {
        out.extend_from_slice(&whole[o * row + start..o * row + start + len]);
    }
    out
}

fn rank(path: &PathBuf) -> Res<()> {
    let shard = Shard::from_env()?;
    let set = CheckpointSet::open(path)?;
    let opts = StateDictOptions {
        parallel: Some((shard, Splits::preset("llama")?)),
        ..Default::default()
    };
    let sd = opts.select_set(&set)?;
    // The reference: the same set opened again, every tensor whole.
    let whole_set = CheckpointSet::open(path)?;
    let whole = StateDictOptions::default().select_set(&whole_set)?;
    let whole_bytes: u64 = whole.tensors().map(|(_, t)| t.info().nbytes).sum();
    let (mut tensors, mut sliced, mut read) = (0usize, 0usize, 0u64);
    for (name, view) in sd.tensors() {
        let got = view.data()?;
        let full = whole
            .get(name)
            .ok_or_else(|| format!("{name}: not in the whole set"))?;
        let full_data = full.data()?;
        let want = match sd.selected(name).and_then(|e| e.slice) {
            None => full_data.to_vec(),
            Some(slice) => {
                let shape = full.shape();
                let (start, len) = shard.part(shape[slice.dim]);
                if (start, len) != (slice.start, slice.len) {
                    return Err(
                        format!("{name}: slice {slice:?}, Shard::part says {start}+{len}").into(),
                    );
                }
                // Parseable by the launcher: name, dim, start, len, size.
                println!(
                    "part {name} {} {start} {len} {}",
                    slice.dim, shape[slice.dim]
                );
                sliced += 1;
                narrow(
                    &full_data,
                    shape,
                    full.dtype().size(),
                    slice.dim,
                    start,
                    len,
                )
            }
        };
        if *got != *want {
            return Err(
                format!("{name}: the slice's bytes differ from the narrowed tensor's").into(),
            );
        }
        tensors += 1;
        read += got.len() as u64;
    }
    println!(
        "rank {}/{}: {tensors} tensors, {sliced} sliced, read {read} of the set's {whole_bytes} bytes ({:.1}%)",
        shard.rank,
        shard.world,
        100.0 * read as f64 / whole_bytes.max(1) as f64
    );
    Ok(())
}

fn launch(set: &PathBuf, world: u32) -> Res<()> {
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for r in 0..world {
        let child = Command::new(&exe)
            .arg(set)
            .arg(world.to_string())
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "29500")
            .stdout(Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    let mut parts: BTreeMap<String, Parts> = BTreeMap::new();
    let mut failed = Vec::new();
    for (r, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output()?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            match line.split(' ').collect::<Vec<_>>()[..] {
                ["part", name, dim, start, len, size] => {
                    let e = parts
                        .entry(name.to_owned())
                        .or_insert_with(|| (dim.to_owned(), size.to_owned(), Vec::new()));
                    if (e.0.as_str(), e.1.as_str()) != (dim, size) {
                        return Err(format!("{name}: ranks disagree on its dim or size").into());
                    }
                    e.2.push((start.parse()?, len.parse()?));
                }
                _ => println!("{line}"),
            }
        }
        if !out.status.success() {
            failed.push(format!("rank {r} ({})", out.status));
        }
    }
    if !failed.is_empty() {
        return Err(format!(
            "{} of {world} ranks failed: {}",
            failed.len(),
            failed.join(", ")
        )
        .into());
    }
    // Every split dimension is covered exactly once: the parts, in order,
    // run end to end from 0 to its size, one part per rank.
    for (name, (dim, size, ranges)) in &mut parts {
        ranges.sort_unstable();
        let mut next = 0u64;
        for &(start, len) in ranges.iter() {
            if start != next {
                return Err(format!("{name}: dim {dim} has a gap or overlap at {next}").into());
            }
            next = start + len;
        }
        if next != size.parse::<u64>()? || ranges.len() != world as usize {
            return Err(format!("{name}: the parts cover {next} of {size} along dim {dim}").into());
        }
    }
    println!(
        "all {world} ranks passed; the parts of {} split tensors cover each split dimension exactly",
        parts.len()
    );
    Ok(())
}
