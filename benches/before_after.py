"""Two ptload builds on the same files: whole-process `inspect --json`
(or the command given with --args), interleaved (old, new, then new, old),
medians of N runs, warm cache.

    git worktree add /tmp/old <commit>
    CARGO_TARGET_DIR=/tmp/oldtarget cargo build --release -p ptload-cli
    cargo build --release -p ptload-cli
    python3 benches/before_after.py /tmp/oldtarget/release/ptload \\
        target/release/ptload fixtures/files/many_tensors.pt ...
    python3 benches/before_after.py --args "load --map-location cpu --dtype bf16" \\
        --runs 11 OLD NEW gpt2.pt
"""

import statistics
import subprocess
import sys
import time


ARGS = ["inspect", "--json"]


def run(binary, path):
    subprocess.run([binary, *ARGS, path], stdout=subprocess.DEVNULL, check=True)


def main():
    global ARGS
    argv = sys.argv[1:]
    runs = 31
    while argv and argv[0].startswith("--"):
        if argv[0] == "--args" and len(argv) > 1:
            ARGS = argv[1].split()
        elif argv[0] == "--runs" and len(argv) > 1:
            runs = int(argv[1])
        else:
            sys.exit(__doc__)
        argv = argv[2:]
    if len(argv) < 3:
        sys.exit(__doc__)
    old, new, files = argv[0], argv[1], argv[2:]
    for path in files:
        times = {old: [], new: []}
        for _ in range(3):
            run(old, path)
            run(new, path)
        for i in range(runs):
            for binary in (old, new) if i % 2 == 0 else (new, old):
                start = time.perf_counter()
                run(binary, path)
                times[binary].append(time.perf_counter() - start)
        before = statistics.median(times[old]) * 1e3
        after = statistics.median(times[new]) * 1e3
        print(f"{path}: before {before:.2f} ms, after {after:.2f} ms, ratio {after / before:.3f}")


if __name__ == "__main__":
    main()
