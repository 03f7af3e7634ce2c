"""Sharded sets and tensor-parallel ranks through safe_open / load_file."""

import os

import numpy as np
import pytest
import torch

import ptload
import ptload.numpy
import ptload.torch
from conftest import fixture

SHARDED = fixture("llama_tiny_sharded")
INDEX = os.path.join(SHARDED, "pytorch_model.bin.index.json")


def whole():
    return torch.load(fixture("llama_tiny.pt"), weights_only=True)


@pytest.mark.parametrize("path", [SHARDED, INDEX])
def test_a_set_is_one_state_dict(path):
    theirs = whole()
    ours = ptload.torch.load_file(path, key="all")
    assert list(ours) == list(theirs)
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype and torch.equal(ours[name], t), name


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rank_slices_are_tensor_split(world):
    theirs = whole()
    split_dims = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 0,
                  "up_proj": 0, "down_proj": 1}
    rules = [f"*.{k}.weight={d}" for k, d in split_dims.items()]
    for rank in range(world):
        ours = ptload.torch.load_file(SHARDED, key="all", shard=(rank, world), splits=rules)
        arrays = ptload.numpy.load_file(SHARDED, key="all", shard=(rank, world), splits=rules)
        assert list(ours) == list(theirs)
        sliced = 0
        for name, t in theirs.items():
            part = name.split(".")[-2]
            if name.endswith(".weight") and part in split_dims:
                want = torch.tensor_split(t, world, split_dims[part])[rank]
                sliced += 1
            else:
                want = t
            assert ours[name].shape == want.shape, name
            assert torch.equal(ours[name], want), name
            raw = want.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            assert arrays[name].shape == tuple(want.shape), name
            assert np.ascontiguousarray(arrays[name]).tobytes() == raw, name
        assert sliced >= 7


def test_a_preset_and_safe_open_get_slice():
    with ptload.safe_open(SHARDED, framework="pt", key="all", shard=(1, 2), preset="llama") as f:
        name = "model.layers.0.self_attn.q_proj.weight"
        t = f.get_tensor(name)
        assert t.shape[0] * 2 == whole()[name].shape[0]
        assert torch.equal(f.get_slice(name)[1:3], t[1:3])


def test_rules_need_a_rank():
    with pytest.raises(ptload.Error, match="rank"):
        ptload.torch.load_file(SHARDED, splits=["*=0"])
    with pytest.raises(ptload.Error, match="rank 2 of world 2"):
        ptload.torch.load_file(SHARDED, shard=(2, 2), splits=["*=0"])
    with pytest.raises(ptload.Error, match="preset"):
        ptload.torch.load_file(SHARDED, shard=(0, 2), preset="no-such-model")


def test_progress_through_tqdm(capsys):
    import tqdm  # noqa: F401 - .ci/run installs it; without it this fails, never skips
    sd = ptload.torch.load_file(SHARDED, key="all", progress=True)
    err = capsys.readouterr().err
    assert f"{len(sd)}/{len(sd)}" in err and "tensor" in err


# The package is built with the reader's zstd feature: the zstd save too.
# And the Hugging Face-format saves (HuggingFaceStorageWriter), whose
# answers are torch's HuggingFaceStorageReader's (fixtures/hf_dcp.json).
DCP_SAVES = ["world1", "world2", "world4", "world2_threads", "world2_safetensors", "world2_zstd", "world2_rank_metadata", "fsdp2_adamw", "hf_world1", "hf_world2", "hf_world2_split"]


def _dcp_answers():
    import json

    from conftest import ROOT

    saves = {}
    for doc in ("dcp.json", "hf_dcp.json"):
        with open(os.path.join(ROOT, "fixtures", doc)) as fh:
            saves.update(json.load(fh)["saves"])
    return saves


def _sha(t):
    import hashlib

    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("save", DCP_SAVES)
def test_a_distributed_checkpoint_reads_as_torch_wrote_it(save):
    """A torch.distributed.checkpoint directory (written by torch on gloo)
    through load_file and safe_open: every tensor's dtype, shape and
    sha256 as torch's own dcp_to_torch_save gave them, and each rank of
    another world size gets torch.tensor_split of the whole."""
    answers = _dcp_answers()[save]["tensors"]
    path = fixture(os.path.join("dcp", save))
    whole = ptload.torch.load_file(path, key="all")
    assert sorted(whole) == sorted(answers)
    dtype_names = {v: k for k, v in ptload.torch._DTYPES.items()}
    for name, want in answers.items():
        t = whole[name]
        assert list(t.shape) == want["shape"], name
        assert dtype_names[t.dtype] == want["dtype"], name
        assert _sha(t) == want["sha256"], name
    split = [n for n, w in answers.items() if len(w["shape"]) >= 1]
    for rank in range(3):
        rules = [f"{n}=0" for n in split] + ["*=replicate"]
        with ptload.safe_open(path, framework="pt", key="all", shard=(rank, 3), splits=rules) as f:
            for name in split:
                assert torch.equal(f.get_tensor(name), torch.tensor_split(whole[name], 3, 0)[rank]), (save, name, rank)


def _fsdp_answers():
    import json

    from conftest import ROOT

    with open(os.path.join(ROOT, "fixtures", "fsdp.json")) as fh:
        return json.load(fh)["sets"]


@pytest.mark.parametrize("name", ["world2", "world4", "local2"])
def test_fsdp_rank_files_read_as_torchs_full_tensors(name):
    """A directory of FSDP2 rank files (DTensors, or local shards with
    their placements sidecar) through load_file and safe_open: every
    tensor as DTensor.full_tensor() gave it."""
    answers = _fsdp_answers()[name]["tensors"]
    path = fixture(os.path.join("fsdp", name))
    whole = ptload.torch.load_file(path, key="all")
    assert sorted(whole) == sorted(answers)
    dtype_names = {v: k for k, v in ptload.torch._DTYPES.items()}
    for key, want in answers.items():
        t = whole[key]
        assert list(t.shape) == want["shape"], key
        assert dtype_names[t.dtype] == want["dtype"], key
        assert _sha(t) == want["sha256"], key
    with ptload.safe_open(path, framework="pt", key="all") as f:
        assert torch.equal(f.get_tensor("model.fc1.weight"), whole["model.fc1.weight"])


@pytest.mark.parametrize("name", ["local2", "local4"])
def test_fsdp2_local_shards_read_by_the_stated_rule(name):
    """Each rank's torch.save of its to_local() shards, no placement
    recorded, at worlds 2 and 4: read with rank_files= as torch's whole
    tensors."""
    import shutil
    import tempfile

    answers = _fsdp_answers()[name]["tensors"]
    with tempfile.TemporaryDirectory() as tmp:
        src = fixture(os.path.join("fsdp", name))
        for f in os.listdir(src):
            if f.endswith(".pt"):
                shutil.copy(os.path.join(src, f), tmp)
        whole = ptload.torch.load_file(tmp, key="all", rank_files="model.scale=replicate,fsdp2")
    assert sorted(whole) == sorted(answers)
    for key, want in answers.items():
        assert list(whole[key].shape) == want["shape"], key
        assert _sha(whole[key]) == want["sha256"], key


def test_fsdp_replicated_copies_that_differ_are_an_error():
    with pytest.raises(Exception, match="rank 0 and rank 1 hold different values"):
        ptload.torch.load_file(fixture(os.path.join("fsdp", "replicate_mismatch2")), key="all")


def test_rank_files_without_placements_read_by_stated_rules(tmp_path):
    """FSDP rank files that record no placement: refused as duplicate names
    with rank_files= named; read with it as the placements sidecar reads
    them (the same tensors, bytes for bytes)."""
    import shutil

    for r in range(2):
        name = f"model_world_size_2_rank_{r}.pt"
        shutil.copy(fixture(f"fsdp/local2/{name}"), tmp_path / name)
    with pytest.raises(ptload.Error, match="rank_files="):
        ptload.torch.load_file(tmp_path, key="all")
    stated = ptload.torch.load_file(tmp_path, key="all", rank_files="model.scale=replicate,fsdp2")
    sidecar = ptload.torch.load_file(fixture("fsdp/local2"), key="all")
    assert sorted(stated) == sorted(sidecar)
    for k in sidecar:
        assert torch.equal(stated[k], sidecar[k]), k


def test_a_share_without_split_rules_is_refused():
    """shard=(rank, world) with nothing to cut would hand every rank every
    whole tensor: refused, naming the keywords that say what to cut."""
    with pytest.raises(ptload.Error, match=r'splits=\["GLOB=DIM", ...\] or preset="llama"'):
        with ptload.safe_open(fixture("llama_tiny.pt"), framework="pt", shard=(0, 2)) as f:
            f.keys()
    with ptload.safe_open(fixture("llama_tiny.pt"), framework="pt", shard=(0, 2), preset="llama") as f:
        assert len(f.keys()) > 0


def test_an_error_in_a_shard_names_its_file(tmp_path):
    """A reader error in one file of a set carries that file (and the
    message says it), so a caller can retry or report the right one."""
    import shutil

    broken = tmp_path / "set"
    shutil.copytree(SHARDED, broken)
    shard = broken / "pytorch_model-00002-of-00003.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ptload.Error) as info:
        ptload.torch.load_file(str(broken), key="all")
    assert info.value.file is not None and info.value.file.endswith(shard.name), info.value.file
    assert shard.name in str(info.value)


def test_an_error_carries_its_hint():
    """What the caller could do is an attribute as well as part of the
    message, in the package's keywords: a share with nothing to cut."""
    with pytest.raises(ptload.Error) as info:
        with ptload.safe_open(fixture("llama_tiny.pt"), framework="pt", shard=(0, 2)) as f:
            f.keys()
    hint = info.value.hint
    assert hint is not None and 'preset="llama"' in hint and hint in str(info.value)
    assert info.value.file is not None and info.value.file.endswith("llama_tiny.pt")
