#!/usr/bin/env python3
"""A deflate bomb: a 1 MB checkpoint whose one storage inflates to 1 GiB.

torch.save writes a 1 GiB float32 tensor of zeros; Python's zipfile
rewrites every record deflated (level 9), which torch.load reads. Each
reader loads the file in a fresh process (so each peak resident set is its
own): `torch.load(weights_only=True)`, `ptload.torch.load`, and the CLI's
`ptload inspect --hash` and `ptload load --hash --map-location cpu`. Each
is run --runs times, alternated; the table gives the median wall time of
the load (Python: inside the process; CLI: the whole process) and the
largest peak RSS seen.

Usage (from the repository root, the test environment's Python with the
package installed, a release CLI):

    target/ci-python/bin/python benches/deflate_bomb.py [--runs N] [--dir DIR]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTLOAD = os.path.join(ROOT, "target", "release", "ptload")

PY = """
import resource, sys, time
import torch
if sys.argv[1] == "ptload":
    import ptload.torch
    load = lambda p: ptload.torch.load(p)
else:
    load = lambda p: torch.load(p, weights_only=True)
start = time.perf_counter()
out = load(sys.argv[2])
took = time.perf_counter() - start
assert out["w"].numel() == 256 << 20 and not out["w"].any()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

CLI = """
import resource, subprocess, sys, time
start = time.perf_counter()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
took = time.perf_counter() - start
print(took, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def write_bomb(path):
    import torch

    plain = path + ".stored"
    torch.save({"w": torch.zeros(256 << 20)}, plain)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename), compress_type=zipfile.ZIP_DEFLATED,
                         compresslevel=9)
    os.remove(plain)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/ptload-bench-bomb")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    bomb = os.path.join(args.dir, "bomb.pt")
    if not os.path.exists(bomb):
        write_bomb(bomb)
    cases = {
        "torch.load(weights_only=True)": [sys.executable, "-c", PY, "torch", bomb],
        "ptload.torch.load": [sys.executable, "-c", PY, "ptload", bomb],
        "ptload inspect --hash (whole process)": [sys.executable, "-c", CLI, PTLOAD, "inspect", "--hash", bomb],
        "ptload load --hash --map-location cpu (whole process)": [
            sys.executable, "-c", CLI, PTLOAD, "load", "--hash", "--map-location", "cpu", bomb],
    }
    seen = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, argv in cases.items():
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()
            seen[name].append((float(out[-2]), int(out[-1])))
    print(f"file: {os.path.getsize(bomb)} bytes, one storage of {1 << 30} bytes inflated; {args.runs} runs each\n")
    print("| reader | load (median) | peak RSS (largest) |")
    print("| --- | --- | --- |")
    for name, runs in seen.items():
        secs = statistics.median(t for t, _ in runs)
        rss = max(r for _, r in runs) / (1 << 20)
        print(f"| {name} | {secs:.2f} s | {rss:.2f} GiB |")


if __name__ == "__main__":
    main()
