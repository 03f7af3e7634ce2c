"""The hostile corpus through the Python API: every file raises a
ptload.Error (or loads); none crashes the interpreter. Run in a child
process, so a crash would fail the test instead of killing pytest."""

import json
import os
import subprocess
import sys

from conftest import HOSTILE

SCRIPT = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
import ptload, ptload.torch, ptload.numpy
out = {}
for path in sys.argv[1:]:
    results = []
    for call in (
        lambda: ptload.torch.load(path),
        lambda: ptload.torch.load(path, unknown="inert"),
        lambda: ptload.numpy.load_file(path),
    ):
        try:
            call()
            results.append("loaded")
        except ptload.Error as e:
            results.append("error")
        except (ValueError, TypeError, RuntimeError, KeyError, OverflowError, MemoryError) as e:
            results.append("python:" + type(e).__name__)
    out[os.path.basename(path)] = results
print(json.dumps(out))
"""


def test_hostile_corpus_never_crashes(tmp_path):
    files = sorted(
        os.path.join(HOSTILE, f) for f in os.listdir(HOSTILE) if os.path.isfile(os.path.join(HOSTILE, f))
    )
    assert len(files) > 50
    marker = tmp_path / "marker"
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, *files],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout)
    assert len(results) == len(files)
    assert not marker.exists()
    assert list(tmp_path.iterdir()) == []
    # Python-level exceptions other than ptload.Error are defects to know of.
    odd = {k: v for k, v in results.items() if any(r.startswith("python:") for r in v)}
    assert not odd, odd


def test_refuse_at_follows_the_scan():
    """refuse_at= refuses what ``ptload scan`` puts at that level or above
    (an UnsafeGlobalError naming the finding, kind "Refused"), whatever
    weights_only says, and reads the rest."""
    import pytest

    import ptload
    import ptload.torch
    from conftest import ROOT, fixture

    payload = os.path.join(ROOT, "tests", "scan", "polyglot_pickle_then_zip.pt")
    with pytest.raises(ptload.UnsafeGlobalError, match="os.system") as caught:
        ptload.torch.load(payload, weights_only=False, refuse_at="dangerous")
    assert caught.value.kind == "Refused"
    # A whole pickled model: its classes are only constructed.
    model = ptload.torch.load(fixture("whole_module.pt"), weights_only=False, refuse_at="dangerous")
    assert model is not None
    with pytest.raises(ptload.UnsafeGlobalError, match="needs-code"):
        ptload.torch.load(fixture("whole_module.pt"), weights_only=False, refuse_at="needs-code")
    plain = ptload.torch.load(fixture("basic.pt"), refuse_at="needs-code")
    assert len(plain) > 0
    with pytest.raises(ValueError, match="refuse_at"):
        ptload.torch.load(fixture("basic.pt"), refuse_at="sometimes")
