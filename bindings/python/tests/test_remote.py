"""Checkpoints at http:// URLs, served by a real web server (nginx) on
loopback from the fixtures: ptload.torch.load, safe_open and load_file of
a URL give what they give for the local file, and the server's refusals
give their errors.

Needs nginx: ``.ci/run`` sets ``PTLOAD_NGINX`` to its binary (installed
from Debian's packages) for this run."""

import os
import warnings

import numpy as np
import pytest
import torch

import ptload
import ptload.numpy
import ptload.torch
from conftest import fixture
from served import NGINX, WHY_NOT, Nginx

if not NGINX:
    pytest.skip(WHY_NOT, allow_module_level=True)

warnings.filterwarnings("ignore", category=UserWarning)


@pytest.fixture(scope="module")
def server():
    s = Nginx()
    yield s
    s.stop()


def assert_same(ours, theirs):
    """Walk both objects together, without recursion: the same types,
    keys and plain values, and equal tensors (dtype, shape, strides,
    torch.equal) and arrays. Returns the number of tensors compared."""
    tensors = 0
    stack = [(ours, theirs, "root")]
    while stack:
        a, b, where = stack.pop()
        assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
        if isinstance(a, torch.Tensor):
            assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride()), where
            assert a.requires_grad == b.requires_grad, where
            assert torch.equal(a, b), where
            tensors += 1
        elif isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), where
        elif isinstance(a, dict):
            assert list(a) == list(b), where
            stack.extend((a[k], b[k], f"{where}[{k!r}]") for k in a)
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), where
            stack.extend((x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
        elif isinstance(a, float) and a != a:
            assert b != b, where
        elif a is None or isinstance(a, (bool, int, float, str, bytes)):
            assert a == b, where
        elif hasattr(a, "__dict__"):
            stack.append((vars(a), vars(b), f"{where}.__dict__"))
    return tensors


# A zip file, a deflated one, legacy files (one with storage views), a
# big-endian one, conj/neg bits, a training checkpoint with optimizer
# state and values, a Lightning one, and a model's state dict.
LOADED = [
    "basic.pt",
    "deflated.pt",
    "legacy.pt",
    "legacy_views.pt",
    "bigendian.pt",
    "conj_neg.pt",
    "training.ckpt",
    "lightning.ckpt",
    "llama_tiny.pt",
    "multi_gpu.pt",  # saved on GPUs: uploaded, or kept on the host with a warning
]


@pytest.mark.parametrize("name", LOADED)
def test_torch_load_of_a_url_equals_the_local_file(server, name):
    local = ptload.torch.load(fixture(name), unknown="inert")
    url = server.url(f"files/{name}")
    for mmap in (None, False):
        remote = ptload.torch.load(url, unknown="inert", mmap=mmap)
        assert assert_same(remote, local) > 0


def test_a_url_loads_the_values_torch_saved(server):
    # torch's own load of the local file: the values, not only ptload's
    # agreement with itself.
    theirs = torch.load(fixture("training.ckpt"), weights_only=False)
    ours = ptload.torch.load(server.url("files/training.ckpt"), weights_only=False)
    assert assert_same(ours, theirs) > 0


def test_progress_counts_the_bytes_fetched(server, capsys):
    url = server.url("files/multi_gpu.pt")
    ours = ptload.torch.load(url, map_location="cpu", progress=True)
    err = capsys.readouterr().err
    assert "multi_gpu.pt" in err and "100%" in err, err
    assert assert_same(ours, ptload.torch.load(fixture("multi_gpu.pt"), map_location="cpu")) > 0


def test_tensors_of_a_url_are_memory_of_their_own(server):
    url = server.url("files/basic.pt")
    with pytest.raises(ValueError, match="mmap=True maps a local file"):
        ptload.torch.load(url, mmap=True)
    sd = ptload.torch.load(url)
    local = ptload.torch.load(fixture("basic.pt"))
    # Writable, and a write reaches neither the server's file nor another load.
    name, t = next((k, v) for k, v in sd.items() if isinstance(v, torch.Tensor) and v.numel())
    t.view(-1)[0] += 1
    assert not torch.equal(t, local[name])
    assert torch.equal(ptload.torch.load(url)[name], local[name])


@pytest.mark.parametrize("name", ["basic.pt", "legacy.pt", "training.ckpt", "llama_tiny.pt"])
def test_safe_open_of_a_url_equals_the_local_file(server, name):
    url = server.url(f"files/{name}")
    for framework in ("pt", "numpy"):
        for backend in ("mmap", "pread"):
            with ptload.safe_open(fixture(name), framework, backend=backend) as here, \
                    ptload.safe_open(url, framework, backend=backend) as there:
                assert there.keys() == here.keys()
                assert there.keys()
                for k in here.keys():
                    a, b = there.get_tensor(k), here.get_tensor(k)
                    if framework == "pt":
                        assert a.dtype == b.dtype and torch.equal(a, b), k
                    else:
                        assert a.dtype == b.dtype and a.shape == b.shape, k
                        assert np.array_equal(a, b, equal_nan=True), k
                    sl = there.get_slice(k)
                    assert sl.get_shape() == list(b.shape)


def test_load_file_of_a_url_equals_the_local_file(server):
    url = server.url("files/llama_tiny.pt")
    here, there = ptload.torch.load_file(fixture("llama_tiny.pt")), ptload.torch.load_file(url)
    assert list(there) == list(here)
    for k in here:
        assert torch.equal(there[k], here[k]), k
    here = ptload.numpy.load_file(fixture("llama_tiny.pt"))
    there = ptload.numpy.load_file(url)
    assert list(there) == list(here)
    for k in here:
        assert np.array_equal(there[k], here[k]), k


def test_load_file_of_a_url_reads_ahead_each_byte_once(server):
    # 200 storages of 4 KiB: load_file reads them one by one from Python
    # while the reader's read-ahead fetches them beside it (runs of
    # neighbouring storages per request); every value is the file's, and
    # every byte of the file is sent once, in a few requests.
    path = os.path.join(server.www, "many.pt")
    saved = {f"t{i:03d}": np.full(1024, i, dtype=np.float32) for i in range(200)}
    torch.save({k: torch.from_numpy(v) for k, v in saved.items()}, path)
    size = os.path.getsize(path)
    for load in (ptload.torch.load_file, ptload.numpy.load_file):
        before, asked = server.sent("made/many.pt")
        got = load(server.url("made/many.pt"))
        assert list(got) == list(saved)
        for k, v in saved.items():
            assert np.array_equal(np.asarray(got[k]), v), k
        sent, requests = server.sent("made/many.pt")
        sent, requests = sent - before, requests - asked
        assert 200 * 4096 <= sent < size + requests * 1024
        assert requests < 40, requests
    # The read-ahead runs for a URL read to the host, not for a local file;
    # stopping it twice is harmless.
    with ptload.safe_open(server.url("made/many.pt"), "pt") as f:
        ahead = f._read_ahead()
        assert ahead is not None
        ahead.stop()
        ahead.stop()
    with ptload.safe_open(path, "pt") as f:
        assert f._read_ahead() is None


def test_a_ranks_slices_of_a_url_equal_the_local_files(server):
    url = server.url("files/llama_tiny.pt")
    for rank in range(2):
        opts = {"shard": (rank, 2), "preset": "llama"}
        here = ptload.torch.load_file(fixture("llama_tiny.pt"), **opts)
        there = ptload.torch.load_file(url, **opts)
        assert list(there) == list(here)
        for k in here:
            assert torch.equal(there[k], here[k]), k


def test_a_tensor_of_a_url_fetches_its_storage_once(server):
    # Three 1 MiB storages: opening fetches the file's head and tail and
    # the records' neighbourhoods; a tensor, its storage (with the unread
    # ones after it in the file); each range once.
    path = os.path.join(server.www, "three.pt")
    saved = {k: np.arange(256 * 1024, dtype=np.float32) + i for i, k in enumerate("abc")}
    torch.save({k: torch.from_numpy(v) for k, v in saved.items()}, path)
    size, mib = os.path.getsize(path), 1 << 20
    with ptload.safe_open(server.url("made/three.pt"), "numpy") as f:
        opened, _ = server.sent("made/three.pt")
        assert opened < size // 4
        assert np.array_equal(f.get_tensor("c"), saved["c"])
        c, _ = server.sent("made/three.pt")
        # c's storage (what opening did not fetch of it: the file's last
        # 128 KiB and some neighbourhood were), not a's or b's.
        assert mib // 2 <= c - opened < mib + (4 << 10)
        for k in "ab":
            assert np.array_equal(f.get_tensor(k), saved[k])
        every, requests = server.sent("made/three.pt")
        # a and b once: every byte of the file sent once, with the answers'
        # headers (under 1 KiB each).
        assert 3 * mib <= every < size + requests * 1024
        assert requests <= 8
        # Each tensor handed to the caller is the caller's: nothing is kept
        # behind it, so reading one again fetches its storage again.
        assert np.array_equal(f.get_tensor("a"), saved["a"])
        again, _ = server.sent("made/three.pt")
        assert mib // 2 <= again - every < mib + (4 << 10)


def test_a_missing_file_raises_an_os_error_naming_the_url(server):
    url = server.url("files/no_such_checkpoint.pt")
    for call in (
        lambda: ptload.torch.load(url),
        lambda: ptload.safe_open(url),
        lambda: ptload.numpy.load_file(url),
    ):
        with pytest.raises(ptload.IoError) as e:
            call()
        assert isinstance(e.value, OSError)
        assert e.value.kind == "Io"
        assert url in str(e.value) and "404" in str(e.value)


def test_a_server_ignoring_range_is_refused(server):
    url = server.url("norange/basic.pt")
    for call in (lambda: ptload.torch.load(url), lambda: ptload.safe_open(url)):
        with pytest.raises(ptload.IoError) as e:
            call()
        message = str(e.value)
        assert url in message and "does not serve byte ranges" in message


def test_a_set_by_its_index_url_equals_the_local_set(server):
    index = "llama_tiny_sharded/pytorch_model.bin.index.json"
    url = server.url(f"files/{index}")
    for framework in ("pt", "numpy"):
        with ptload.safe_open(fixture(index), framework) as here, \
                ptload.safe_open(url, framework) as there:
            assert there.keys() == here.keys()
            assert len(here.keys()) > 10
            for k in here.keys():
                a, b = there.get_tensor(k), here.get_tensor(k)
                if framework == "pt":
                    assert a.dtype == b.dtype and torch.equal(a, b), k
                else:
                    assert np.array_equal(a, b), k
    here = ptload.torch.load_file(fixture(index), shard=(1, 2), preset="llama")
    there = ptload.torch.load_file(url, shard=(1, 2), preset="llama")
    assert list(there) == list(here)
    for k in here:
        assert torch.equal(there[k], here[k]), k
    # Each shard was fetched at its URL beside the index.
    for n in range(1, 4):
        shard = f"files/llama_tiny_sharded/pytorch_model-0000{n}-of-00003.bin"
        assert server.sent(shard)[0] > 0, shard


def test_a_directory_url_says_to_give_the_index(server):
    url = server.url("files/llama_tiny_sharded/")
    with pytest.raises(ptload.Error) as e:
        ptload.safe_open(url)
    assert url in str(e.value) and "index" in str(e.value)
    assert server.sent("files/llama_tiny_sharded/") == (0, 0)


def test_an_index_naming_a_missing_shard_names_its_url(server):
    os.makedirs(os.path.join(server.www, "gone"), exist_ok=True)
    with open(os.path.join(server.www, "gone", "model.bin.index.json"), "w") as fh:
        fh.write('{"weight_map": {"w": "absent.bin"}}')
    url = server.url("made/gone/model.bin.index.json")
    with pytest.raises(ptload.IoError) as e:
        ptload.safe_open(url)
    assert "made/gone/absent.bin" in str(e.value) and "404" in str(e.value)
