#!/usr/bin/env python3
"""PyTorch's own serialization tests with ptload.torch.load in torch.load's
place: every test torch passes must pass, except the deliberate differences
below (each one listed, with its reason, in docs/python.md).

    torch_suite.py PYTHON [RESULTS.json]

PYTHON is the test environment's interpreter (torch, pytest, expecttest,
hypothesis and ptload installed). The suite and its runner are read from
``../shared/torch-suite`` beside the repository, and never modified. Exits 1
on any other test torch passes that fails here, and on a deliberate
difference that no longer differs (so the list stays true).
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "torch-suite"))

# Test (class::name) -> why ptload differs from torch there on purpose.
DELIBERATE = {
    "TestOldSerialization::test_load_nonexistent_device": (
        "a storage saved on a missing CUDA device stays on the host with a warning "
        "(strict=True raises, as torch does)"
    ),
    "TestSerialization::test_load_nonexistent_device": (
        "a storage saved on a missing CUDA device stays on the host with a warning "
        "(strict=True raises, as torch does)"
    ),
    "TestOldSerialization::test_pickle_module": (
        "a custom pickle_module is refused: ptload never runs an unpickler"
    ),
    "TestSerialization::test_pickle_module": (
        "a custom pickle_module is refused: ptload never runs an unpickler"
    ),
}


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    python = os.path.abspath(sys.argv[1])
    results = sys.argv[2] if len(sys.argv) == 3 else os.path.join(tempfile.mkdtemp(), "suite.json")
    run = os.path.join(SUITE, "run.py")
    if not os.path.exists(run):
        sys.exit(f"torch suite: {run} is missing (the shared folder sits beside the repository)")
    proc = subprocess.run(
        [python, run, "--python", python, "--loader", "ptload.torch:load", "--out", results],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if not os.path.exists(results):
        print(proc.stdout[-4000:])
        sys.exit(f"torch suite: the runner wrote no results (exit {proc.returncode})")
    with open(results) as fh:
        doc = json.load(fh)
    full = {t.split("::", 1)[1]: t for t in doc["vs_baseline"]["regressions"]}
    regressions = sorted(full)
    unexpected = [t for t in regressions if t not in DELIBERATE]
    stale = [t for t in DELIBERATE if t not in regressions]
    counts = doc["counts"]
    print(
        f"torch's serialization suite with ptload.torch.load: {counts.get('passed', 0)} of "
        f"{counts.get('total', 0)} tests pass (torch itself: {doc['vs_baseline']['baseline_passed']}); "
        f"{len(regressions)} differ from torch, {len(regressions) - len(unexpected)} of them deliberately"
    )
    for t in regressions:
        reason = DELIBERATE.get(t)
        why = reason or (doc["reasons"].get(full[t], "").splitlines() or [""])[0][:300]
        print(f"  {'deliberate' if reason else 'REGRESSION'}: {t}: {why}")
    for t in stale:
        print(f"  STALE: {t} is listed as a deliberate difference but now behaves as torch")
    sys.exit(1 if unexpected or stale else 0)


if __name__ == "__main__":
    main()
