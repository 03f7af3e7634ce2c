//! Opening cost: proportional to the number of tensors, never to the bytes.
//!
//! Run with `cargo bench -p ptload-reader`. The whole-process comparison
//! against torch.load and safetensors is `benches/compare.py`.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use ptload_reader::Checkpoint;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/files")
        .join(name)
}

fn open(c: &mut Criterion) {
    let mut group = c.benchmark_group("open");
    for name in [
        "basic.pt",
        "training.ckpt",
        "multi_gpu.pt",
        "many_tensors.pt",
        "legacy.pt",
    ] {
        let path = fixture(name);
        group.bench_function(name, |b| {
            b.iter(|| {
                let ckpt = Checkpoint::open(black_box(&path)).expect("open");
                black_box(ckpt.len())
            })
        });
    }
    group.finish();
}

fn read(c: &mut Criterion) {
    let ckpt = Checkpoint::open(fixture("views.pt")).expect("open");
    c.bench_function("data/views.pt all tensors", |b| {
        b.iter(|| {
            let mut total = 0;
            for t in ckpt.tensors() {
                total += t.data().expect("data").len();
            }
            black_box(total)
        })
    });
}

criterion_group!(benches, open, read);
criterion_main!(benches);
