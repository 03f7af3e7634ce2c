"""Two ptload builds on the same files: whole-process `inspect --json`,
interleaved (old, new, then new, old), medians of N runs, warm cache.

    git worktree add /tmp/old <commit>
    CARGO_TARGET_DIR=/tmp/oldtarget cargo build --release -p ptload-cli
    cargo build --release -p ptload-cli
    python3 benches/before_after.py /tmp/oldtarget/release/ptload \\
        target/release/ptload fixtures/files/many_tensors.pt ...
"""

import statistics
import subprocess
import sys
import time


def run(binary, path):
    subprocess.run([binary, "inspect", "--json", path], stdout=subprocess.DEVNULL, check=True)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    old, new, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    runs = 31
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
