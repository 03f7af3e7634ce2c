"""Checkpoints in object storage (``s3://``), served by a real S3 server
(s3s-fs) on loopback over a folder of fixtures: ptload.torch.load,
safe_open and load_file of an ``s3://`` URL give what they give for the
local file, and the store's refusals give their errors.

Needs s3s-fs: ``.ci/run`` builds it (crates.io, pinned) and sets
``PTLOAD_S3S`` to its binary for this run."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import warnings

import pytest
import torch

import ptload
import ptload.torch
from conftest import fixture
from ptload._io import is_url

S3S = os.environ.get("PTLOAD_S3S")
if not S3S:
    pytest.skip(
        "PTLOAD_S3S is not set: these tests read fixtures from an S3 server (s3s-fs) on "
        "loopback; .ci/run builds it and sets PTLOAD_S3S to its binary",
        allow_module_level=True,
    )

warnings.filterwarnings("ignore", category=UserWarning)

KEY, SECRET = "ptloadtestkey", "ptloadtestsecret"


@pytest.fixture(scope="module")
def bucket():
    """s3s-fs over a folder holding bucket ``bucket``; the environment
    points object_store's S3 client at it."""
    root = tempfile.mkdtemp(prefix="ptload-s3s-")
    folder = os.path.join(root, "bucket")
    os.mkdir(folder)
    for name in ("basic.pt", "legacy.pt", "training.ckpt", "llama_tiny.pt"):
        shutil.copy(fixture(name), os.path.join(folder, name))
    shutil.copytree(fixture("llama_tiny_sharded"), os.path.join(folder, "sharded"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [S3S, "--host", "127.0.0.1", "--port", str(port),
         "--access-key", KEY, "--secret-key", SECRET, root],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            break
        except OSError:
            time.sleep(0.025)
    else:
        server.kill()
        raise RuntimeError(f"s3s-fs did not start on port {port}")
    saved = {k: os.environ.get(k) for k in (
        "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_REGION",
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
    )}
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.update({
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
    })
    yield folder
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.kill()
    server.wait()
    shutil.rmtree(root, ignore_errors=True)


def assert_state_dicts_equal(ours, theirs):
    assert list(ours) == list(theirs)
    for k in theirs:
        assert ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k


@pytest.mark.parametrize("name", ["basic.pt", "legacy.pt", "llama_tiny.pt"])
def test_torch_load_of_an_s3_url_equals_the_local_file(bucket, name):
    assert is_url(f"s3://bucket/{name}")
    ours = ptload.torch.load(f"s3://bucket/{name}")
    theirs = ptload.torch.load(fixture(name))
    assert_state_dicts_equal(ours, theirs)
    assert len(theirs) > 0


def test_a_training_checkpoint_from_s3_equals_torchs_load(bucket):
    ours = ptload.torch.load("s3://bucket/training.ckpt", weights_only=False)
    theirs = torch.load(fixture("training.ckpt"), weights_only=False)
    assert_state_dicts_equal(ours["model_state_dict"], theirs["model_state_dict"])
    assert ours["epoch"] == theirs["epoch"]


def test_safe_open_and_load_file_of_s3_urls_equal_the_local_files(bucket):
    with ptload.safe_open("s3://bucket/llama_tiny.pt", "pt") as there, \
            ptload.safe_open(fixture("llama_tiny.pt"), "pt") as here:
        assert there.keys() == here.keys()
        for k in here.keys():
            assert torch.equal(there.get_tensor(k), here.get_tensor(k)), k
    index = "pytorch_model.bin.index.json"
    there = ptload.torch.load_file(f"s3://bucket/sharded/{index}")
    here = ptload.torch.load_file(fixture(f"llama_tiny_sharded/{index}"))
    assert_state_dicts_equal(there, here)
    there = ptload.torch.load_file("s3://bucket/llama_tiny.pt", shard=(1, 2), preset="llama")
    here = ptload.torch.load_file(fixture("llama_tiny.pt"), shard=(1, 2), preset="llama")
    assert_state_dicts_equal(there, here)


def test_a_missing_object_and_a_wrong_key_raise_os_errors_naming_the_url(bucket):
    for url, said in (
        ("s3://bucket/missing.pt", "not found"),
        ("s3://nobucket/basic.pt", "not found"),
    ):
        with pytest.raises(ptload.IoError) as e:
            ptload.torch.load(url)
        assert isinstance(e.value, OSError)
        assert url in str(e.value) and said in str(e.value)
    os.environ["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    try:
        with pytest.raises(ptload.IoError) as e:
            ptload.safe_open("s3://bucket/basic.pt")
        assert "s3://bucket/basic.pt" in str(e.value)
        assert "access denied" in str(e.value)
    finally:
        os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET
