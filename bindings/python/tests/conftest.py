import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FILES = os.path.join(ROOT, "fixtures", "files")
EXPECTED = os.path.join(ROOT, "fixtures", "expected")
HOSTILE = os.path.join(ROOT, "tests", "hostile")


def fixture(name):
    return os.path.join(FILES, name)


def fixture_files():
    return sorted(
        f for f in os.listdir(FILES) if os.path.isfile(os.path.join(FILES, f))
    )
