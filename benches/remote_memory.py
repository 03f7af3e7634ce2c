#!/usr/bin/env python3
"""Peak host memory of ptload reading a checkpoint at a URL, against its size.

A checkpoint read by ranged requests is fetched storage by storage; this
measures what a whole pass over it holds at its peak: the largest resident
set (`ru_maxrss` of the child, which counts the file's fetched bytes, not a
page cache) of one ptload process per command, for the GPT-2-small state
dict of benches/compare.py (475 MiB, its largest tensor 147 MiB, shared by
two names) and a transformer of layers of 8 MiB tensors, served by nginx
on loopback:

- `ptload inspect --hash URL` (every tensor read and hashed);
- `ptload convert URL out.safetensors` (every tensor written);
- `ptload load --hash --map-location cpu URL` (the host tensors left in
  the file, each fetched as it is hashed);
- `ptload diff URL URL` (the file against itself, both sides read a
  piece at a time);
- with --simcuda DIR (the simulated driver, simcuda/target/release):
  `ptload load --hash --map-location cuda:0 URL`. The simulator keeps the
  device's memory in the process's own, so the table also gives the peak
  less the bytes placed on the device (`totals.stored_bytes` of `inspect
  --json`): what the host held besides the GPU;
- the local file's `inspect --hash`, for reference (the map: RSS counts
  the pages it touched, which the kernel may drop).

Each command also runs --runs more times for its median wall time, and
the bytes nginx sent for it are counted. With several --ptload binaries
(a build before a change and one after), each command's runs alternate
between them, so both see the same machine.

Usage (from the repository root, torch from the test environment, a
release CLI: `cargo build --release -p ptload-cli`):

    python benches/remote_memory.py [--ptload BIN ...] [--nginx /usr/sbin/nginx] [--dir DIR] [--runs N]

Prints a Markdown table per binary: MiB at the peak and as a share of the
file, the median time and the MiB sent.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import gpt2_files  # noqa: E402
from remote import Nginx, write_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def peak_mib(argv, env=None):
    """Run argv to completion; the peak resident set of that child, MiB.

    Each measurement runs in a fresh Python so that ru_maxrss of its
    children is this command's alone."""
    probe = (
        "import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, *argv], check=True, capture_output=True, text=True,
                         env=env)
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptload", action="append", help="the CLI binary (repeat to compare builds)")
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--dir", default="/tmp/ptload-bench-remote-memory")
    ap.add_argument("--layers-mb", type=int, default=500, help="size of the 8 MiB-layer file (MB)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per command (default 3)")
    ap.add_argument("--simcuda", help="simulated driver's folder: also load each URL onto its cuda:0")
    args = ap.parse_args()
    binaries = args.ptload or [str(ROOT / "target" / "release" / "ptload")]
    os.makedirs(args.dir, exist_ok=True)
    gpt2, _ = gpt2_files(args.dir)
    layers = os.path.join(args.dir, f"layers-{args.layers_mb}mb.pt")
    if not os.path.exists(layers):
        write_checkpoint(sys.executable, layers, args.layers_mb)
    work = tempfile.mkdtemp(prefix="ptload-nginx-")
    nginx = Nginx(args.nginx, args.dir, work)
    rows = {b: [] for b in binaries}
    try:
        for path in (gpt2, layers):
            name = os.path.basename(path)
            url = nginx.url(name)
            size = os.path.getsize(path) / (1 << 20)
            out = os.path.join(work, name + ".safetensors")
            cases = [
                ("inspect --hash URL", ["inspect", "--hash", url]),
                ("convert URL", ["convert", "--force", url, out]),
                ("load --hash URL", ["load", "--hash", "--map-location", "cpu", url]),
                ("diff URL URL", ["diff", url, url]),
                ("inspect --hash FILE", ["inspect", "--hash", path]),
            ]
            gpu_env = None
            if args.simcuda:
                gpu_env = dict(os.environ, LD_LIBRARY_PATH=os.path.abspath(args.simcuda))
                cases.insert(3, ("load --hash URL to cuda:0 (simulated)",
                                 ["load", "--hash", "--map-location", "cuda:0", url]))
            totals = subprocess.run([binaries[0], "inspect", "--json", path], check=True, capture_output=True,
                                    text=True).stdout
            on_device = json.loads(totals)["totals"]["stored_bytes"] / (1 << 20)
            for label, argv in cases:
                env = gpu_env if "cuda:0" in argv else None
                times = {b: [] for b in binaries}
                peaks = {}
                for b in binaries:
                    mark = nginx.lines()
                    peaks[b] = (peak_mib([b, *argv], env), nginx.sent_since(mark)[0] / (1 << 20))
                for _ in range(args.runs):
                    for b in binaries:
                        t = time.perf_counter()
                        subprocess.run([b, *argv], check=True, stdout=subprocess.DEVNULL, env=env)
                        times[b].append(time.perf_counter() - t)
                for b in binaries:
                    mib, sent = peaks[b]
                    beside = mib - on_device if env else None
                    rows[b].append((name, size, label, mib, beside, statistics.median(times[b]), sent))
                    print(f"{b}: {name} {label}: {mib:.0f} MiB", file=sys.stderr)
            if os.path.exists(out):
                os.remove(out)
    finally:
        nginx.stop()
    for b in binaries:
        print(f"\n{b}\n")
        print("| file | size | command | peak RSS | share of the file | time (median) | sent by nginx |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, size, label, mib, beside, secs, sent in rows[b]:
            held = f"{mib:.0f} MiB" if beside is None else f"{mib:.0f} MiB ({beside:.0f} MiB beside the device's)"
            share = mib if beside is None else beside
            print(f"| {name} | {size:.0f} MiB | `{label}` | {held} | {100 * share / size:.0f}% | {secs:.3f} s"
                  f" | {sent:.0f} MiB |")


if __name__ == "__main__":
    main()
