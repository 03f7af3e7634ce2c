#!/usr/bin/env python3
"""`ptload.torch.load_file` against `ptload.torch.load` and safetensors'
`load_file` on the same tensors, in one Python per package, warm cache.

    python benches/load_file.py [--runs N] [--package DIR ...] FILE.pt ...

Each FILE.pt is also written as FILE.safetensors (beside it, in a temporary
directory) for safetensors. With --package, each DIR (a directory holding a
`ptload` package, e.g. an older commit's `bindings/python/python` with the
extension copied in) is measured in a child Python of its own, the packages
interleaved round by round, so a change is compared with what it replaced
on the same machine in the same run. Medians of N runs per round.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, statistics, sys, time, warnings
warnings.simplefilter("ignore")
import torch, ptload, ptload.torch
from safetensors.torch import load_file as st_load_file
pt, st, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
def median_ms(fn):
    fn()
    xs = []
    for _ in range(runs):
        t = time.perf_counter(); fn(); xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e3
print(json.dumps({
    "ptload.torch.load_file": median_ms(lambda: ptload.torch.load_file(pt, key="all", strip_prefix="none")),
    "ptload.torch.load": median_ms(lambda: ptload.torch.load(pt)),
    "safetensors load_file": median_ms(lambda: st_load_file(st)),
}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--package", action="append", default=[])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    packages = args.package or [None]
    tmp = tempfile.mkdtemp(prefix="ptload-load-file-")
    for path in args.files:
        sd = torch.load(path, weights_only=True)
        st = os.path.join(tmp, os.path.basename(path) + ".safetensors")
        save_file({k: v.contiguous() for k, v in sd.items()}, st)
        results = {p: [] for p in packages}
        for r in range(args.rounds):
            order = packages if r % 2 == 0 else list(reversed(packages))
            for p in order:
                env = dict(os.environ)
                if p is not None:
                    env["PYTHONPATH"] = p
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, path, st, str(args.runs)],
                    env=env, capture_output=True, text=True, check=True,
                )
                results[p].append(json.loads(out.stdout))
        for p, rows in results.items():
            med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
            ratio = med["safetensors load_file"] / med["ptload.torch.load_file"]
            print(json.dumps({"file": os.path.basename(path), "package": p or "installed",
                              **{k: round(v, 2) for k, v in med.items()},
                              "load_file vs safetensors": round(ratio, 2)}))


if __name__ == "__main__":
    main()
