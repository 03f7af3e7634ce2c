//! A small inference engine on ptload: read a torch checkpoint's weights
//! (no Python, no pickle code run), hand them to candle, run the model.
//!
//! The model is fixtures/files/basic.pt: `nn.Sequential(Linear(4, 8),
//! ReLU(), Linear(8, 2))`'s state dict. fixtures/engine.json holds a batch
//! and torch's output for it (fixtures/generate.py); the forward pass here
//! must give the same numbers. Exit status 0 when it does, 1 when not.
//!
//! Run: `cargo run --manifest-path examples/candle-engine/Cargo.toml`
//! (optionally with the checkpoint and the answers as arguments).

use std::borrow::Cow;
use std::error::Error;
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use candle_nn::{Linear, Module};
use ptload_reader::state_dict::StateDict;
use ptload_reader::{Checkpoint, DType, TensorView};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// One tensor of the checkpoint as a candle tensor. The typed read borrows
/// from the memory map when the bytes lie there as they are (`Cow::Borrowed`)
/// and copies only when they must be gathered or swapped; candle then takes
/// its own copy.
fn to_candle(view: TensorView<'_>, device: &Device, borrowed: &mut usize) -> Result<Tensor> {
    let shape: Vec<usize> = view
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<_, _>>()?;
    fn from<T: ptload_reader::Element + candle_core::WithDType>(
        view: &TensorView<'_>,
        shape: Vec<usize>,
        device: &Device,
        borrowed: &mut usize,
    ) -> Result<Tensor> {
        let values = view.to_cow::<T>()?;
        if matches!(values, Cow::Borrowed(_)) {
            *borrowed += 1;
        }
        Ok(Tensor::from_slice(&values, shape, device)?)
    }
    match view.dtype() {
        DType::F32 => from::<f32>(&view, shape, device, borrowed),
        DType::F16 => from::<half::f16>(&view, shape, device, borrowed),
        DType::BF16 => from::<half::bf16>(&view, shape, device, borrowed),
        DType::F64 => from::<f64>(&view, shape, device, borrowed),
        other => Err(format!(
            "{}: {other} weights are not used by this engine",
            view.name()
        )
        .into()),
    }
}

struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    /// `prefix.weight` and `prefix.bias` of each layer, by the state dict's
    /// final names.
    fn load(weights: &StateDict<'_>, prefixes: &[&str], device: &Device) -> Result<(Mlp, usize)> {
        let mut borrowed = 0;
        let mut get = |name: String| -> Result<Tensor> {
            let view = weights
                .get(&name)
                .ok_or_else(|| format!("the checkpoint has no tensor {name:?}"))?;
            to_candle(view, device, &mut borrowed)
        };
        let mut layers = Vec::new();
        for p in prefixes {
            let weight = get(format!("{p}.weight"))?;
            let bias = get(format!("{p}.bias"))?;
            layers.push(Linear::new(weight, Some(bias)));
        }
        Ok((Mlp { layers }, borrowed))
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = x.relu()?;
            }
        }
        Ok(x)
    }
}

fn matrix(json: &serde_json::Value, key: &str) -> Result<Vec<Vec<f32>>> {
    let rows = json[key].as_array().ok_or(format!("{key}: not a list"))?;
    rows.iter()
        .map(|row| {
            row.as_array()
                .ok_or(format!("{key}: a row is not a list"))?
                .iter()
                .map(|v| Ok(v.as_f64().ok_or(format!("{key}: not a number"))? as f32))
                .collect()
        })
        .collect()
}

fn main() -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut args = std::env::args_os().skip(1);
    let checkpoint = args
        .next()
        .map_or(root.join("files/basic.pt"), PathBuf::from);
    let answers = args.next().map_or(root.join("engine.json"), PathBuf::from);

    let device = Device::Cpu;
    let ckpt = Checkpoint::open(&checkpoint)?;
    let weights = StateDict::of(&ckpt)?;
    let (model, borrowed) = Mlp::load(&weights, &["0", "2"], &device)?;
    println!(
        "{}: {} tensors, {} read in place from the map",
        checkpoint.display(),
        weights.len(),
        borrowed
    );

    let answers: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&answers)?)?;
    let input = matrix(&answers, "input")?;
    let want = matrix(&answers, "output")?;
    let x = Tensor::new(input, &device)?;
    let got: Vec<Vec<f32>> = model.forward(&x)?.to_vec2()?;

    let mut worst = 0f32;
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        worst = worst.max((g - w).abs());
    }
    let shapes_agree =
        got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| g.len() == w.len());
    println!("candle: {got:?}");
    println!("torch:  {want:?}");
    // Both sum 8 products in f32, possibly in another order.
    if shapes_agree && worst <= 1e-5 {
        println!("forward pass matches torch (largest difference {worst:e})");
        Ok(())
    } else {
        eprintln!("forward pass differs from torch: largest difference {worst:e}");
        std::process::exit(1)
    }
}
