#!/usr/bin/env python3
"""Whole-process `ptload inspect --json` against torch.load and safetensors.

Usage (from the repository root, after `cargo build --release`):

    ~/torchenv/bin/python benches/compare.py [--runs N] [--out DIR]

It writes its inputs to DIR (default /tmp/ptload-bench): a 498 MB
GPT-2-small-shaped state_dict (149 float32 tensors, lm_head tied to the token
embedding) saved by torch.save, the same 148 distinct tensors as a
safetensors file, and uses the committed 20,000-tensor fixture. torch and safetensors are timed inside this (already started)
Python; ptload is timed as a whole process (start, open, print JSON, exit).
Medians of N runs; the page cache is warm for every reader.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTLOAD = os.path.join(ROOT, "target", "release", "ptload")


def gpt2_state_dict():
    """GPT-2 small shapes: 12 layers, 768 wide, 50257 tokens, 1024 positions."""
    g = torch.Generator().manual_seed(0)
    d, ff, layers = 768, 3072, 12

    def t(*shape):
        return torch.randn(*shape, generator=g)

    sd = {"wte.weight": t(50257, d), "wpe.weight": t(1024, d)}
    for i in range(layers):
        p = f"h.{i}."
        sd.update({
            p + "ln_1.weight": t(d), p + "ln_1.bias": t(d),
            p + "attn.c_attn.weight": t(d, 3 * d), p + "attn.c_attn.bias": t(3 * d),
            p + "attn.c_proj.weight": t(d, d), p + "attn.c_proj.bias": t(d),
            p + "ln_2.weight": t(d), p + "ln_2.bias": t(d),
            p + "mlp.c_fc.weight": t(d, ff), p + "mlp.c_fc.bias": t(ff),
            p + "mlp.c_proj.weight": t(ff, d), p + "mlp.c_proj.bias": t(d),
        })
    sd["ln_f.weight"] = t(d)
    sd["ln_f.bias"] = t(d)
    # Tied to the token embedding, as in GPT-2: one storage, two names.
    sd["lm_head.weight"] = sd["wte.weight"]
    return sd



def gpt2_files(out):
    """gpt2.pt and its safetensors conversion in `out`, written once."""
    gpt2_pt = os.path.join(out, "gpt2.pt")
    gpt2_st = os.path.join(out, "gpt2.safetensors")
    if not (os.path.exists(gpt2_pt) and os.path.exists(gpt2_st)):
        sd = gpt2_state_dict()
        torch.save(sd, gpt2_pt)
        # safetensors refuses shared tensors: it gets the 148 distinct ones.
        save_file({k: v for k, v in sd.items() if k != "lm_head.weight"}, gpt2_st)
        del sd
    return gpt2_pt, gpt2_st

def median_ms(fn, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def ptload_ms(path, runs):
    """Whole process: spawn, open, print the JSON to /dev/null, exit.

    posix_spawn (vfork) keeps the cost of starting a child from this large
    Python process out of the figure; what remains is ptload's own time.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    actions = [(os.POSIX_SPAWN_DUP2, devnull, 1)]

    def run():
        pid = os.posix_spawn(PTLOAD, [PTLOAD, "inspect", "--json", path], os.environ, file_actions=actions)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise RuntimeError(f"ptload failed on {path}: status {status}")

    run()  # warm the page cache and the binary
    try:
        return median_ms(run, runs)
    finally:
        os.close(devnull)


def ptload_rss_kb(path):
    """Peak resident set of one `ptload inspect --json` process, in KiB."""
    out = subprocess.run(["/usr/bin/time", "-f", "%M", PTLOAD, "inspect", "--json", path],
                         check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return int(out.stderr.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--out", default="/tmp/ptload-bench")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not os.path.exists(PTLOAD):
        sys.exit("build first: cargo build --release")

    gpt2_pt, gpt2_st = gpt2_files(args.out)
    many = os.path.join(ROOT, "fixtures", "files", "many_tensors.pt")
    small = os.path.join(ROOT, "fixtures", "files", "basic.pt")

    results = {}
    for name, path in [("many_tensors.pt (20,000 tensors)", many), ("gpt2.pt (149 tensors, 498 MB)", gpt2_pt)]:
        n = len(torch.load(path, mmap=True, weights_only=True))
        size = os.path.getsize(path)
        row = {
            "tensors": n,
            "bytes": size,
            "torch.load(mmap=True, weights_only=True) ms": median_ms(
                lambda: torch.load(path, mmap=True, weights_only=True), args.runs),
            "ptload inspect --json (whole process) ms": ptload_ms(path, args.runs),
        }
        if path == gpt2_pt:
            row["safetensors load_file ms"] = median_ms(lambda: load_file(gpt2_st), args.runs)
            row["torch.load(weights_only=True) ms"] = median_ms(
                lambda: torch.load(path, weights_only=True), max(3, args.runs // 4))
        results[name] = row
    rss = {os.path.basename(p): {"file_bytes": os.path.getsize(p), "peak_rss_kib": ptload_rss_kb(p)}
           for p in (small, gpt2_pt)}
    info = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {os.uname().machine}, {os.uname().release}",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "runs": args.runs,
    }
    print(json.dumps({"info": info, "results": results, "ptload_peak_rss": rss}, indent=2))


if __name__ == "__main__":
    main()
