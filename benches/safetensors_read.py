#!/usr/bin/env python3
"""safetensors files read by ptload against safetensors itself, on the CPU.

Usage (from the repository root, with the package installed and a release
CLI built: `cargo build --release -p ptload-cli`):

    python benches/safetensors_read.py [--runs N] [--out DIR]

Inputs, written to DIR (default /tmp/ptload-bench) once: the 498 MB
GPT-2-small-shaped state dict of benches/compare.py as a safetensors file,
and the committed 20,000-tensor fixture's tensors as one. Timed in this
already-started Python, warm page cache, medians of N runs, each load
followed by reading one element of every tensor so no loader wins by not
building them:

- `safetensors.torch.load_file(path)` (its default, mmap);
- `ptload.torch.load(path)` (torch 2.15's `torch.load` of a `.safetensors`
  path is safetensors' load_file, so this is the drop-in's figure);
- `ptload.torch.load_file(path)`.

And whole processes, opening the header and printing what it holds:
`ptload inspect --json` against a Python that imports safetensors and reads
the header with `safe_open(...).keys()` (the nearest thing safetensors has).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import gpt2_files, median_ms  # noqa: E402

import ptload.torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTLOAD = os.path.join(ROOT, "target", "release", "ptload")


def touched(sd):
    for t in sd.values():
        if t.numel():
            t.view(-1)[0].item()
    return sd


def process_ms(argv, runs):
    def once():
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)

    return median_ms(once, runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out", default="/tmp/ptload-bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    _, gpt2 = gpt2_files(args.out)
    many = os.path.join(args.out, "many_tensors.safetensors")
    if not os.path.exists(many):
        sd = torch.load(os.path.join(ROOT, "fixtures", "files", "many_tensors.pt"), weights_only=True)
        save_file({k: v.contiguous() for k, v in sd.items()}, many)
    rows = []
    for path in (many, gpt2):
        row = {"file": os.path.basename(path), "MB": round(os.path.getsize(path) / 1e6, 1)}
        row["safetensors load_file ms"] = median_ms(lambda: touched(load_file(path)), args.runs)
        row["ptload.torch.load ms"] = median_ms(lambda: touched(ptload.torch.load(path)), args.runs)
        row["ptload load_file ms"] = median_ms(
            lambda: touched(ptload.torch.load_file(path, key="all", strip_prefix="none")), args.runs
        )
        row["process: ptload inspect --json ms"] = process_ms([PTLOAD, "inspect", "--json", path], args.runs)
        header = "import safetensors, sys; f = safetensors.safe_open(sys.argv[1], 'np'); print(len(f.keys()))"
        row["process: python safe_open keys ms"] = process_ms([sys.executable, "-c", header, path], args.runs)
        row["ptload.torch.load vs safetensors"] = row["safetensors load_file ms"] / row["ptload.torch.load ms"]
        rows.append(row)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
