//! An inference engine's weight store on `ptload_reader::engine`: a model
//! struct that keeps its weights (no lifetime tied to a selection, no
//! `unsafe`), read as f32 whatever float type the file holds, and a
//! forward pass checked against torch's output.
//!
//! The model is fixtures/files/basic.pt, `nn.Sequential(Linear(4, 8),
//! ReLU(), Linear(8, 2))`'s state dict; fixtures/engine.json holds a batch
//! and torch's output for it. Exit status 0 when the numbers agree, 1 when
//! not.
//!
//! Run: `cargo run -p ptload-reader --example engine [CHECKPOINT ANSWERS]`
//! (an engine's own build: `--no-default-features --features scan`).

use std::path::PathBuf;
use std::sync::Arc;

use ptload_reader::engine::*;

/// The engine's own result: ptload's errors convert into it with `?`.
type Fallible<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A linear layer: `y = x W^T + b`, its weights read once, as f32.
struct Linear {
    weight: Vec<f32>,
    bias: Vec<f32>,
    inputs: usize,
}

impl Linear {
    fn new(weights: &Weights, prefix: &str) -> Fallible<Linear> {
        let tensor = |name: &str| {
            weights
                .get(&format!("{prefix}.{name}"))
                .ok_or(format!("no {prefix}.{name}"))
        };
        let (weight, bias) = (tensor("weight")?, tensor("bias")?);
        let inputs = usize::try_from(*weight.shape().last().ok_or("a weight of no dims")?)?;
        Ok(Linear {
            weight: weight.read_as()?,
            bias: bias.read_as()?,
            inputs,
        })
    }

    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let rows = self.weight.chunks_exact(self.inputs);
        rows.zip(&self.bias)
            .map(|(w, b)| b + w.iter().zip(x).map(|(w, x)| w * x).sum::<f32>())
            .collect()
    }
}

/// The engine's model: it owns its layers; `Weights` could be kept too.
struct Mlp {
    first: Linear,
    second: Linear,
}

impl Mlp {
    fn load(path: &str) -> Fallible<Mlp> {
        let ckpt = OpenOptions::new()
            .refuse_at(Some(Level::Dangerous))
            .open(path)?;
        let weights = Weights::select(&StateDictOptions::default(), Arc::new(ckpt))?;
        Ok(Mlp {
            first: Linear::new(&weights, "0")?,
            second: Linear::new(&weights, "2")?,
        })
    }

    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let hidden: Vec<f32> = self
            .first
            .forward(x)
            .into_iter()
            .map(|v| v.max(0.0))
            .collect();
        self.second.forward(&hidden)
    }
}

fn main() -> Fallible<()> {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut args = std::env::args().skip(1);
    let file = args
        .next()
        .map_or_else(|| fixtures.join("files/basic.pt"), PathBuf::from);
    let answers = args
        .next()
        .map_or_else(|| fixtures.join("engine.json"), PathBuf::from);
    let model = Mlp::load(&file.to_string_lossy())?;
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&answers)?)?;
    let rows = |key: &str| -> Vec<Vec<f32>> {
        let rows = doc[key].as_array().map(Vec::as_slice).unwrap_or_default();
        rows.iter()
            .map(|r| r.as_array().map(Vec::as_slice).unwrap_or_default().iter())
            .map(|r| {
                r.filter_map(serde_json::Value::as_f64)
                    .map(|v| v as f32)
                    .collect()
            })
            .collect()
    };
    let (input, output) = (rows("input"), rows("output"));
    let mut worst = 0f32;
    for (x, want) in input.iter().zip(&output) {
        let got = model.forward(x);
        println!("{got:?}");
        if got.len() != want.len() {
            return Err(format!("{} outputs, torch gave {}", got.len(), want.len()).into());
        }
        worst = got
            .iter()
            .zip(want)
            .fold(worst, |m, (g, w)| m.max((g - w).abs()));
    }
    if input.is_empty() || input.len() != output.len() {
        return Err(format!("{}: no batch to check", answers.display()).into());
    }
    println!(
        "{} rows, largest difference from torch {worst:e}",
        input.len()
    );
    if worst > 1e-5 {
        std::process::exit(1);
    }
    Ok(())
}
