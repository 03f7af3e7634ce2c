"""ptload convert against cp on the same file, same file system, one run.

    python3 benches/convert_vs_cp.py [--pairs 20] [--input PATH] [--ptload BIN ...]

Page cache warm (the input is read once first), `sync` before each round,
the order of the commands rotated every round, outputs deleted after each
command. Prints the median and range of each command and each ptload's
ratio to cp. Several --ptload binaries can be compared in the same run.
The default input is the untied GPT-2-sized state dict benches/compare.py
writes (/tmp/ptload-bench/gpt2_untied.pt).
"""
import argparse
import os
import statistics
import subprocess
import time


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--input", default="/tmp/ptload-bench/gpt2_untied.pt")
    ap.add_argument("--ptload", action="append", default=None)
    args = ap.parse_args()
    bins = args.ptload or ["target/release/ptload"]
    out_dir = os.path.dirname(os.path.abspath(args.input))
    cmds = {"cp": ["cp", args.input, os.path.join(out_dir, "cp-out.pt")]}
    for i, b in enumerate(bins):
        cmds[f"ptload[{i}] {b}"] = [b, "convert", args.input, os.path.join(out_dir, f"out{i}.safetensors")]
    with open(args.input, "rb") as f:
        while f.read(1 << 24):
            pass
    times = {k: [] for k in cmds}
    names = list(cmds)
    for r in range(args.pairs):
        subprocess.run(["sync"], check=True)
        order = names[r % len(names):] + names[: r % len(names)]
        for k in order:
            times[k].append(timed(cmds[k]))
            os.unlink(cmds[k][-1])
    cp = statistics.median(times["cp"])
    for k, v in times.items():
        med = statistics.median(v)
        ratio = "" if k == "cp" else f"  ratio {med / cp:.2f}x"
        print(f"{k:50s} median {med:7.1f} ms  range {min(v):.0f}-{max(v):.0f} ms{ratio}")


if __name__ == "__main__":
    main()
