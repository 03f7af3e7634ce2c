#!/usr/bin/env python3
"""transformers' ``from_pretrained`` on a ``.bin`` model, with torch's
``torch.load`` and under ``ptload.patch()``.

Usage (from the repository root, with the package and transformers
installed in the environment):

    target/ci-python/bin/python benches/from_pretrained.py [--runs N] [--out DIR]

Input, written once to DIR (default /tmp/ptload-bench/gpt2-medium-bin): a
GPT-2-shaped model (12 layers, 1024 wide, 50,257 tokens, 1,024 positions,
lm_head tied to the token embedding) randomly initialised and saved as
older hub repos have it: ``config.json`` and ``pytorch_model.bin`` from
``torch.save(model.state_dict())`` (about 0.8 GB). Both ways load the same
directory in this already-started Python, interleaved (torch, ptload,
ptload, torch, ...), warm page cache, after one untimed load each; the
first loaded models are compared tensor for tensor. Medians of N runs.
transformers maps ``.bin`` files (``mmap=True``) and keeps the loaded
tensors as the model's weights, so ``from_pretrained`` alone may never read
most of the file: a second figure adds reading every weight once (a sum
of each parameter and buffer) after the load. The loader alone
(``torch.load(..., weights_only=True, mmap=True)``, as transformers calls
it, and ``ptload.torch.load``) is timed the same way, for the share of
``from_pretrained`` it accounts for.
"""
import argparse
import gc
import json
import os
import platform
import statistics
import time
import warnings

import torch
import transformers

import ptload
import ptload.torch

warnings.simplefilter("ignore")
transformers.logging.set_verbosity_error()


def model_dir(out):
    path = os.path.join(out, "pytorch_model.bin")
    if not os.path.exists(path):
        os.makedirs(out, exist_ok=True)
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=12, n_embd=1024, n_head=16, n_positions=1024)
        model = transformers.GPT2LMHeadModel(config)
        config.save_pretrained(out)
        torch.save(model.state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)
        del model
    return out, path


def load(directory, patched):
    if patched:
        with ptload.patch():
            return transformers.AutoModelForCausalLM.from_pretrained(directory)
    return transformers.AutoModelForCausalLM.from_pretrained(directory)


def read_all(model):
    """Sum every parameter and buffer: each byte of the weights read once,
    so a loader that maps the file pays for its page faults here."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.sum()
    return model


def timed(fn):
    gc.collect()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result
    return elapsed * 1000


def interleaved(a, b, runs):
    """Medians (ms) of ``a`` and ``b`` over ``runs`` each, in the order
    a, b, b, a, a, b, ... so neither always goes first."""
    times = {"a": [], "b": []}
    for i in range(runs):
        order = ("a", "b") if i % 2 == 0 else ("b", "a")
        for which in order:
            times[which].append(timed(a if which == "a" else b))
    return statistics.median(times["a"]), statistics.median(times["b"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default="/tmp/ptload-bench/gpt2-medium-bin")
    args = parser.parse_args()
    directory, path = model_dir(args.out)
    size = os.path.getsize(path)
    assert size >= 500_000_000, size

    # The same weights either way, first (and a warm cache for both).
    theirs, ours = load(directory, False).state_dict(), load(directory, True).state_dict()
    assert list(theirs) == list(ours)
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
    del theirs, ours

    torch_ms, ptload_ms = interleaved(lambda: load(directory, False), lambda: load(directory, True), args.runs)
    torch_read_ms, ptload_read_ms = interleaved(
        lambda: read_all(load(directory, False)), lambda: read_all(load(directory, True)), args.runs
    )
    torch_load_ms, ptload_load_ms = interleaved(
        lambda: torch.load(path, map_location="cpu", weights_only=True, mmap=True),
        lambda: ptload.torch.load(path, map_location="cpu", weights_only=True, mmap=True),
        args.runs,
    )
    print(json.dumps({
        "info": {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.release()}",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "ptload": ptload.__version__,
            "file": f"{path} ({size / 1e6:.0f} MB)",
            "runs": args.runs,
        },
        "from_pretrained (torch.load) ms": round(torch_ms, 1),
        "from_pretrained under ptload.patch() ms": round(ptload_ms, 1),
        "from_pretrained ratio (torch / ptload)": round(torch_ms / ptload_ms, 2),
        "from_pretrained + read every weight (torch.load) ms": round(torch_read_ms, 1),
        "from_pretrained + read every weight under ptload.patch() ms": round(ptload_read_ms, 1),
        "read-every-weight ratio (torch / ptload)": round(torch_read_ms / ptload_read_ms, 2),
        "torch.load(map_location='cpu', weights_only=True, mmap=True) ms": round(torch_load_ms, 1),
        "ptload.torch.load(map_location='cpu', mmap=True) ms": round(ptload_load_ms, 1),
        "loader ratio (torch / ptload)": round(torch_load_ms / ptload_load_ms, 2),
    }, indent=2))


if __name__ == "__main__":
    main()
