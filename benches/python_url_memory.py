#!/usr/bin/env python3
"""Host memory of `ptload.torch.load_file(URL)` beyond the tensors it returns.

`load_file` of a URL hands each storage it fetches to the tensor made of
it; what the process holds besides the interpreter, torch and the
returned tensors is the read-ahead and the piece being read. For each URL
this prints the resident set after importing torch and ptload (the base),
the peak (`ru_maxrss`), the bytes of the returned tensors' storages (each
once: tied weights share one), and the peak less both.

Usage (the package installed in the test environment, a server such as
benches/remote_memory.py's nginx serving the files):

    python benches/python_url_memory.py URL [URL ...]

Each URL is measured in a fresh Python, so that each peak is its own.
"""

import resource
import subprocess
import sys
import time


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure(url):
    import gc

    import ptload.torch
    import torch  # noqa: F401  (imported before the base is taken)

    gc.collect()
    base = rss_mib()
    started = time.perf_counter()
    tensors = ptload.torch.load_file(url)
    seconds = time.perf_counter() - started
    storages = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors.values()}
    held = sum(storages.values()) / (1 << 20)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{url}: base {base:.0f} MiB, peak {peak:.0f} MiB, tensors {held:.0f} MiB, "
        f"beyond them {peak - base - held:.0f} MiB, {seconds:.2f} s"
    )


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        measure(sys.argv[2])
        return
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for url in sys.argv[1:]:
        subprocess.run([sys.executable, __file__, "--one", url], check=True)


if __name__ == "__main__":
    main()
