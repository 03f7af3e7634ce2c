"""ptload scan against picklescan, fickling, modelscan and modelaudit, on the same files.

Each file gets two facts that do not depend on any scanner:
- its intent, from the corpus that holds it (a payload or a harmless file:
  file names in picklescan's and modelscan's test data, the expected
  verdicts of ptload's tests/scan corpus, ptload's torch-written fixtures);
- what torch.load(weights_only=False) would resolve in it, found with
  torch's own zip-or-stream decision and an unpickler whose find_class
  records the name and returns a stand-in (fixtures/generate.py's
  torch_reach), so nothing in the corpus ever runs. A payload is "reached"
  when torch would resolve a global outside its weights_only allowlist.

Then every scanner judges every file: flagged, clean, or an error (a tool
that cannot read a file has not flagged it; errors are counted apart).

Setup (outside the repository):
    python3 -m venv ~/scanenv && ~/scanenv/bin/pip install picklescan fickling modelscan modelaudit typing_extensions
    the corpora: picklescan's tests/data and tests/data2, modelscan's
    tests/data, fickling's test/fixtures (their public repositories); each
    is optional: without them, the run covers this project's corpora only
Run, with torch installed (~/torchenv):
    cargo build --release -p ptload-cli
    ~/torchenv/bin/python benches/scanner_compare.py --tools ~/scanenv/bin \\
        --picklescan DIR --modelscan DIR --fickling DIR --out results.json

Corpora nobody here wrote (held out: never used to tune the scanner before
they are measured) come in as `--corpus NAME:INTENT:DIR`, any number:
INTENT is `harmless` (every file an ordinary file: checkpoints taken from
public repositories), `payload`, or `byname` (a scanner's own test data:
harmless when the file's path says so, see HARMLESS_BY_NAME). With
`--held-out-only`, this project's corpora are left out. Each corpus gets
its own line per tool (recall on reached payloads, false alarms).
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "fixtures"))

import torch  # noqa: E402

from generate import torch_reach  # noqa: E402

# Harmless files in picklescan's test data (everything else there is a
# payload; broken_model.pkl names builtins.exec before its stream breaks).
PICKLESCAN_HARMLESS = {
    "pytorch_model.bin",
    "new_pytorch_model.bin",
    "not_a_pickle.bin",
    "int_array.npy",
    "int_arrays.npz",
    "int_arrays_compressed.npz",
}
MODELSCAN_HARMLESS = {"password_protected.zip"}
# `byname` corpora: a file is harmless when its path says so (modelaudit's
# tests/assets: safe_*, the license scenarios, and simple_nested.pkl, whose
# inner pickle is plain data); every other file there is a payload.
HARMLESS_BY_NAME = re.compile(r"(^|[_/])(safe|benign)|license_scenarios|simple_nested")
# ptload's verdicts, most severe first.
LEVELS = ["dangerous", "ambiguous", "unknown-call", "needs-code", "clean", "unreadable", "not-loadable", "error"]


def files_in(path):
    out = []
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            if not name.endswith((".py", ".md", ".json", ".txt")):
                out.append(os.path.join(dirpath, name))
    return sorted(out)


def scan_corpus_intent():
    """tests/scan's expected verdicts, from crates/ptload-reader/tests/scan.rs."""
    text = open(os.path.join(ROOT, "crates", "ptload-reader", "tests", "scan.rs")).read()
    found = re.findall(r'\(\s*"([^"]+)",\s*(Clean|NeedsCode|Dangerous|Ambiguous|UnknownCall|Unreadable)\b', text)
    return {name: verdict for name, verdict in found}


def corpus(args):
    """(path, corpus, intent) for every file."""
    items = []
    for spec in args.corpus:
        name, intent, folder = spec.split(":", 2)
        for path in files_in(folder):
            if intent == "byname":
                base = os.path.basename(path)
                harmless = (
                    HARMLESS_BY_NAME.search(os.path.relpath(path, folder))
                    or base.endswith(tuple(PICKLESCAN_HARMLESS | MODELSCAN_HARMLESS))
                )
                items.append((path, name, "harmless" if harmless else "payload"))
            else:
                items.append((path, name, intent))
    if args.held_out_only:
        return items
    for path in files_in(args.picklescan) if args.picklescan else []:
        name = os.path.basename(path)
        harmless = name.startswith("benign") or name in PICKLESCAN_HARMLESS
        items.append((path, "picklescan", "harmless" if harmless else "payload"))
    for path in files_in(args.modelscan) if args.modelscan else []:
        harmless = os.path.basename(path) in MODELSCAN_HARMLESS
        items.append((path, "modelscan", "harmless" if harmless else "payload"))
    for path in files_in(args.fickling) if args.fickling else []:
        items.append((path, "fickling", "harmless"))
    verdicts = scan_corpus_intent()
    for path in files_in(os.path.join(ROOT, "tests", "scan")):
        verdict = verdicts.get(os.path.basename(path))
        if verdict is None:
            continue
        items.append((path, "ptload tests/scan", "harmless" if verdict in ("Clean", "NeedsCode") else "payload"))
    for path in files_in(os.path.join(ROOT, "tests", "hostile")):
        name = os.path.basename(path)
        if name.startswith("x_") or name.startswith("torch_payload_"):
            items.append((path, "ptload tests/hostile", "payload"))
    for path in files_in(os.path.join(ROOT, "fixtures", "files")):
        items.append((path, "ptload fixtures", "harmless"))
    return items


def allowed_globals():
    from torch import _weights_only_unpickler as wo

    allowed = set(wo._get_allowed_globals())
    allowed |= {f"{k.__module__}.{k.__name__}" for k in getattr(wo, "_get_user_allowed_globals", dict)().values() if hasattr(k, "__name__")}
    return allowed


def run(cmd, timeout=300, env=None):
    try:
        full_env = dict(os.environ, **(env or {}))
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, env=full_env)
        return p.returncode, p.stdout.decode("utf-8", "replace") + p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return None, "timeout"


def judge_ptload(path, binary):
    rc, out = run([binary, "scan", "--json", path])
    return {0: "clean", 1: "flagged"}.get(rc, "error")


def ptload_verdict(path, binary):
    rc, out = run([binary, "scan", "--json", path])
    try:
        return json.loads(out[: out.rindex("}") + 1])["files"][0]["verdict"]
    except (ValueError, KeyError, IndexError):
        return "error"


def judge_picklescan(path, tools):
    rc, _ = run([os.path.join(tools, "picklescan"), "--path", path])
    return {0: "clean", 1: "flagged"}.get(rc, "error")


def judge_modelscan(path, tools):
    rc, _ = run([os.path.join(tools, "modelscan"), "-p", path])
    return {0: "clean", 1: "flagged"}.get(rc, "error")


def judge_modelaudit(path, tools):
    # modelaudit scan: 0 no issues, 1 issues found, 2 scan errors.
    rc, _ = run([os.path.join(tools, "modelaudit"), "scan", path], env={"PROMPTFOO_DISABLE_TELEMETRY": "1"})
    return {0: "clean", 1: "flagged"}.get(rc, "error")


FICKLING_DRIVER = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import fickling
from fickling.analysis import Severity
for path in sys.argv[1:]:
    try:
        r = fickling.scan_file(path, graceful=True)
        out = "clean" if r.severity == Severity.LIKELY_SAFE else "flagged"
    except Exception as e:  # noqa: BLE001
        out = "error"
    print(json.dumps([path, out]), flush=True)
"""


def judge_fickling_all(paths, tools):
    rc, text = run([os.path.join(tools, "python"), "-c", FICKLING_DRIVER, *paths], timeout=1800)
    got = {}
    for line in text.splitlines():
        try:
            path, out = json.loads(line)
            got[path] = out
        except (ValueError, TypeError):
            continue
    return got


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tools", required=True, help="bin/ of a venv with picklescan, fickling, modelscan, modelaudit")
    parser.add_argument("--ptload", default=os.path.join(ROOT, "target", "release", "ptload"))
    parser.add_argument("--picklescan", help="picklescan's test data folder(s) parent")
    parser.add_argument("--modelscan", help="modelscan's tests/data")
    parser.add_argument("--fickling", help="fickling's test/fixtures")
    parser.add_argument("--corpus", action="append", default=[], help="NAME:INTENT:DIR (INTENT: harmless, payload, byname)")
    parser.add_argument("--held-out-only", action="store_true", help="only the --corpus folders")
    parser.add_argument("--out", default="scanner_compare.json")
    args = parser.parse_args()

    allowed = allowed_globals()
    items = corpus(args)
    fickling = judge_fickling_all([p for p, _, _ in items], args.tools)
    rows = []
    for path, source, intent in items:
        layout, names = torch_reach(path)
        outside = sorted({n for n in names if n not in allowed})
        reached = intent == "payload" and bool(outside)
        row = {
            "file": os.path.relpath(path, ROOT) if path.startswith(ROOT) else path,
            "corpus": source,
            "intent": intent,
            "torch_resolves_outside_allowlist": outside,
            "reached": reached,
            "ptload": judge_ptload(path, args.ptload),
            "ptload_verdict": ptload_verdict(path, args.ptload),
            "picklescan": judge_picklescan(path, args.tools),
            "fickling": fickling.get(path, "error"),
            "modelscan": judge_modelscan(path, args.tools),
            "modelaudit": judge_modelaudit(path, args.tools),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)

    tools = ["ptload", "picklescan", "fickling", "modelscan", "modelaudit"]
    print()
    print("| tool | reached payloads flagged | all payloads flagged | false alarms on harmless files | errors |")
    print("| --- | --- | --- | --- | --- |")
    reached = [r for r in rows if r["reached"]]
    payloads = [r for r in rows if r["intent"] == "payload"]
    harmless = [r for r in rows if r["intent"] == "harmless"]
    for t in tools:
        caught = sum(r[t] == "flagged" for r in reached)
        caught_all = sum(r[t] == "flagged" for r in payloads)
        alarms = sum(r[t] == "flagged" for r in harmless)
        errors = sum(r[t] == "error" for r in rows)
        print(
            f"| {t} | {caught} of {len(reached)} | {caught_all} of {len(payloads)} | "
            f"{alarms} of {len(harmless)} | {errors} |"
        )
    # Per corpus: what each tool flags of the reached payloads and of the
    # harmless files.
    print()
    print("| corpus | tool | reached payloads flagged | harmless files flagged | errors |")
    print("| --- | --- | --- | --- | --- |")
    for source in sorted({r["corpus"] for r in rows}):
        mine = [r for r in rows if r["corpus"] == source]
        got_reached = [r for r in mine if r["reached"]]
        got_harmless = [r for r in mine if r["intent"] == "harmless"]
        for t in tools:
            print(
                f"| {source} | {t} | {sum(r[t] == 'flagged' for r in got_reached)} of {len(got_reached)} | "
                f"{sum(r[t] == 'flagged' for r in got_harmless)} of {len(got_harmless)} | "
                f"{sum(r[t] == 'error' for r in mine)} |"
            )
    print()
    by = collections.Counter((r["corpus"], r["intent"], r["reached"]) for r in rows)
    for (source, intent, was_reached), n in sorted(by.items()):
        print(f"{source}: {n} {intent}{' (reached)' if was_reached else ''}")
    print()
    for r in reached:
        if r["ptload"] != "flagged":
            print("ptload misses", r["file"], r["torch_resolves_outside_allowlist"])
    for r in harmless:
        if r["ptload"] == "flagged":
            print("ptload false alarm", r["file"], r["ptload_verdict"])
    # ptload's verdicts (levels) by corpus and intent: what a different
    # --fail-on line would flag.
    print()
    print("| corpus | intent | " + " | ".join(LEVELS) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in LEVELS) + " |")
    groups = collections.defaultdict(collections.Counter)
    for r in rows:
        intent = r["intent"] + (" (reached)" if r["reached"] else "")
        groups[(r["corpus"], intent)][r["ptload_verdict"]] += 1
    for (source, intent), counts in sorted(groups.items()):
        print(f"| {source} | {intent} | " + " | ".join(str(counts.get(v, 0)) for v in LEVELS) + " |")


if __name__ == "__main__":
    main()
