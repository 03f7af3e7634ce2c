"""safetensors files through every Python entry point, each checked in the
same run against safetensors' own reading (0.8) and torch 2.15's
``torch.load``, which hands a ``.safetensors`` path to safetensors."""

import shutil
import warnings

import pytest
import safetensors
import safetensors.torch
import torch

import ptload
import ptload.torch
from conftest import fixture

FILES = ["st_dtypes.safetensors", "st_sharded/model-00001-of-00002.safetensors"]


def raw(t):
    """A tensor's bytes, so NaNs in random data compare equal."""
    return t.reshape(-1).contiguous().view(torch.uint8)


def assert_same(ours, theirs):
    assert list(ours) == list(theirs)
    for k, want in theirs.items():
        got = ours[k]
        assert (got.dtype, got.shape, got.device) == (want.dtype, want.shape, want.device), k
        assert torch.equal(raw(got), raw(want)), k


@pytest.mark.parametrize("name", FILES)
def test_torch_load_of_a_safetensors_file_is_torchs(name):
    """ptload.torch.load gives what torch.load (2.15) gives: safetensors'
    load_file, a dict in the file's order."""
    path = fixture(name)
    theirs = torch.load(path)
    assert_same(ptload.torch.load(path), theirs)
    assert_same(ptload.torch.load(path), safetensors.torch.load_file(path))
    with ptload.patch():
        assert_same(torch.load(path), theirs)


def test_map_location_and_placements_apply():
    path = fixture("st_dtypes.safetensors")
    meta = ptload.torch.load(path, map_location="meta")
    assert all(t.device.type == "meta" for t in meta.values())
    # Beyond torch, which refuses a dict for a safetensors file.
    cpu = ptload.torch.load(path, map_location={"cpu": "cpu"})
    assert_same(cpu, safetensors.torch.load_file(path))
    with pytest.warns(RuntimeWarning, match="stays on the CPU"):
        ptload.torch.load(path, place="*matrix=cuda:63")


def test_content_decides_not_the_name(tmp_path):
    """A safetensors file named .pt (torch refuses it: it goes by the
    extension) reads as the safetensors file it is; a torch file named
    .safetensors reads as the torch file it is."""
    named_pt = fixture("weights.safetensors.pt")
    assert_same(ptload.torch.load(named_pt), safetensors.torch.load_file(named_pt))
    torch_file = tmp_path / "model.safetensors"
    shutil.copy(fixture("basic.pt"), torch_file)
    ours = ptload.torch.load(torch_file)
    want = torch.load(fixture("basic.pt"))
    assert list(ours) == list(want) and all(torch.equal(ours[k], want[k]) for k in want)


@pytest.mark.parametrize("name", FILES)
def test_safe_open_answers_as_safetensors(name):
    path = fixture(name)
    with safetensors.safe_open(path, "pt") as theirs, ptload.safe_open(path, "pt") as ours:
        assert ours.keys() == theirs.keys()
        assert ours.metadata() == theirs.metadata()
        for k in theirs.keys():
            assert torch.equal(raw(ours.get_tensor(k)), raw(theirs.get_tensor(k))), k
            if theirs.get_slice(k).get_shape():
                assert torch.equal(raw(ours.get_slice(k)[:1]), raw(theirs.get_slice(k)[:1])), k


def test_a_sharded_set_loads_by_directory_and_by_index():
    """transformers' sharded save, opened by its directory and its index:
    every tensor, each safetensors' own, and no note (a plain state dict)."""
    directory = fixture("st_sharded")
    theirs = {}
    for shard in ("model-00001-of-00002", "model-00002-of-00002"):
        theirs.update(safetensors.torch.load_file(f"{directory}/{shard}.safetensors"))
    for path in (directory, f"{directory}/model.safetensors.index.json"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ours = ptload.torch.load_file(path)
        assert sorted(ours) == sorted(theirs)
        for k in theirs:
            assert torch.equal(ours[k], theirs[k]), k


@pytest.mark.parametrize(
    "header",
    [
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
        b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}',
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
        b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}}',
    ],
)
def test_hostile_headers_are_errors(tmp_path, header):
    """What safetensors refuses, ptload refuses, with a ptload.Error."""
    data = len(header).to_bytes(8, "little") + header + bytes(16)
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(data)
    with pytest.raises(Exception):
        safetensors.torch.load_file(path)
    with pytest.raises(ptload.Error, match="safetensors"):
        ptload.torch.load(path)
    with pytest.raises(ptload.Error, match="safetensors"):
        ptload.safe_open(path, "pt")


def test_the_safetensors_version_is_the_pinned_one():
    assert safetensors.__version__ == "0.8.0"


def test_metadata_is_none_where_the_header_has_none(tmp_path):
    path = tmp_path / "bare.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, path)
    with safetensors.safe_open(path, "pt") as theirs, ptload.safe_open(path, "pt") as ours:
        assert theirs.metadata() is None and ours.metadata() is None
