#!/usr/bin/env python3
"""ptload.torch.load against torch.load and safetensors, in one Python.

Usage (from the repository root, with the package installed in the
environment: `pip install ./bindings/python`):

    ~/torchenv/bin/python benches/python_load.py [--runs N] [--out DIR] [--cuda]

Inputs: the committed 20,000-tensor fixture and the 498 MB GPT-2-small-shaped
state_dict of benches/compare.py (written to DIR, default /tmp/ptload-bench),
each also converted to safetensors (the tied lm_head once), and (CPU only)
32 tensors of 1.2 MB in the legacy layout, where `mmap=False` is compared
with torch.load (whose mmap=True refuses legacy files). Every loader is
timed in this already-started Python, warm page cache, medians of N runs.
Each load is followed by reading one element of every tensor (`t.view(-1)[0]`
on non-empty tensors), so a lazy loader cannot win by not building them.

With --cuda (a GPU machine): every loader puts the tensors on cuda:0
(`map_location="cuda"`, safetensors' `device="cuda:0"`), and each load is
followed by `torch.cuda.synchronize()` instead; the goal there is
ptload.torch.load at least 3x torch.load.
"""
import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import gpt2_files  # noqa: E402

import ptload  # noqa: E402
import ptload.torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
warnings.simplefilter("ignore")


def touch(obj):
    for t in obj.values():
        if t.numel():
            t.view(-1)[0].item()


def median_ms(fn, runs, cuda=False):
    times = []
    for _ in range(runs):
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if cuda:
            torch.cuda.synchronize()
        else:
            touch(result)
        times.append((time.perf_counter() - start) * 1000)
        del result
    return statistics.median(times)


def interleaved_ms(fns, runs):
    """Median ms of each of ``fns`` (name -> loader), runs taken in turn:
    one of each, then again; each followed by the element read."""
    times = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            result = fn()
            touch(result)
            times[name].append((time.perf_counter() - start) * 1000)
            del result
    return {name: statistics.median(t) for name, t in times.items()}


def cuda_row(path, st, runs):
    ours = ptload.torch.load(path, map_location="cuda")
    theirs = torch.load(path, weights_only=True, map_location="cuda")
    assert list(ours) == list(theirs)
    assert all(ours[k].is_cuda and torch.equal(ours[k], theirs[k]) for k in ours)
    del ours, theirs
    row = {
        "torch.load(weights_only=True, map_location='cuda') ms": median_ms(
            lambda: torch.load(path, weights_only=True, map_location="cuda"), runs, True),
        "ptload.torch.load(map_location='cuda') ms": median_ms(
            lambda: ptload.torch.load(path, map_location="cuda"), runs, True),
        "safetensors.torch.load_file(device='cuda:0') ms": median_ms(
            lambda: load_file(st, device="cuda:0"), runs, True),
    }
    ptl = row["ptload.torch.load(map_location='cuda') ms"]
    row["vs torch.load"] = row["torch.load(weights_only=True, map_location='cuda') ms"] / ptl
    row["vs safetensors"] = row["safetensors.torch.load_file(device='cuda:0') ms"] / ptl
    return row


def legacy_file(out):
    """32 tensors of 1.2 MB in the legacy layout
    (``_use_new_zipfile_serialization=False``): each storage's bytes follow
    an 8-byte header, so none is aligned in the file."""
    path = os.path.join(out, "legacy32.pt")
    if not os.path.exists(path):
        g = torch.Generator().manual_seed(0)
        sd = {f"t{i}": torch.randn(300, 1000, generator=g) for i in range(32)}
        torch.save(sd, path, _use_new_zipfile_serialization=False)
    return path


def legacy_row(path, runs):
    # torch.load(mmap=True) refuses legacy files; the columns that apply.
    ours, theirs = ptload.torch.load(path, mmap=False), torch.load(path, weights_only=True)
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    del ours, theirs
    # A few ms each: interleaved, so a busy moment of the machine falls on
    # every loader alike.
    row = interleaved_ms({
        "torch.load(weights_only=True) ms": lambda: torch.load(path, weights_only=True),
        "ptload.torch.load ms": lambda: ptload.torch.load(path),
        "ptload.torch.load(mmap=False) ms": lambda: ptload.torch.load(path, mmap=False),
    }, runs)
    row["mmap=False vs torch.load"] = (
        row["torch.load(weights_only=True) ms"] / row["ptload.torch.load(mmap=False) ms"]
    )
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--out", default="/tmp/ptload-bench")
    parser.add_argument("--cuda", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gpt2_pt, gpt2_st = gpt2_files(args.out)
    many = os.path.join(ROOT, "fixtures", "files", "many_tensors.pt")
    many_st = os.path.join(args.out, "many_tensors.safetensors")
    if not os.path.exists(many_st):
        sd = torch.load(many, weights_only=True)
        save_file({k: v.contiguous().clone() for k, v in sd.items()}, many_st)
    results = {}
    for name, path, st in [
        ("many_tensors.pt (20,000 tensors)", many, many_st),
        ("gpt2.pt (149 tensors, 498 MB)", gpt2_pt, gpt2_st),
    ]:
        if args.cuda:
            results[name] = cuda_row(path, st, args.runs)
            continue
        # The same objects, first: a benchmark of different answers is void.
        ours, theirs = ptload.torch.load(path), torch.load(path, weights_only=True)
        assert list(ours) == list(theirs)
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
        row = {
            "torch.load(weights_only=True) ms": median_ms(
                lambda: torch.load(path, weights_only=True), args.runs),
            "torch.load(weights_only=True, mmap=True) ms": median_ms(
                lambda: torch.load(path, weights_only=True, mmap=True), args.runs),
            "ptload.torch.load ms": median_ms(lambda: ptload.torch.load(path), args.runs),
            "ptload.torch.load(mmap=False) ms": median_ms(
                lambda: ptload.torch.load(path, mmap=False), args.runs),
            "safetensors.torch.load_file ms": median_ms(lambda: load_file(st), args.runs),
        }
        row["vs torch mmap"] = row["torch.load(weights_only=True, mmap=True) ms"] / row["ptload.torch.load ms"]
        row["vs safetensors"] = row["safetensors.torch.load_file ms"] / row["ptload.torch.load ms"]
        results[name] = row
    if not args.cuda:
        results["legacy32.pt (32 tensors of 1.2 MB, legacy layout)"] = legacy_row(
            legacy_file(args.out), args.runs)
    print(json.dumps({
        "info": {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.release()}",
            "torch": torch.__version__,
            "ptload": ptload.__version__,
            "python": platform.python_version(),
            "runs": args.runs,
            "device": torch.cuda.get_device_name(0) if args.cuda else "cpu",
        },
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
