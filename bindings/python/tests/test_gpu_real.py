"""On a real CUDA GPU (skipped elsewhere, with the reason): ptload.torch.load
onto the device, compared object for object with torch's own load there.
This is where torch consumes ptload's device capsules (the simulated-driver
tests replace that consumer). benches/gpu_kit.sh runs these on a GPU
machine."""

import gc
import warnings

import pytest
import torch

import ptload.torch
from conftest import fixture
from test_torch_load import assert_same_object

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU torch can use"
)

# quantized.pt is left out: torch has no CUDA quantized tensors of its types.
ON_ONE_GPU = ["views.pt", "dtypes.pt", "bigendian.pt", "conj_neg.pt", "sparse.pt",
              "parameter_state.pt", "llama_tiny.pt", "legacy.pt", "many_tensors.pt"]


@pytest.mark.parametrize("name", ON_ONE_GPU)
def test_a_fixture_lands_on_the_gpu_as_torch_puts_it(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to the host
        ours = ptload.torch.load(fixture(name), map_location="cuda:0")
    theirs = torch.load(fixture(name), weights_only=True, map_location="cuda:0")
    assert_same_object(ours, theirs)
    # Dense and sparse alike (sparse.pt holds only sparse tensors).
    tensors = _tensors(ours)
    assert tensors and all(t.device == torch.device("cuda", 0) for t in tensors)


def test_saved_devices_past_the_last_stay_on_the_host():
    """multi_gpu.pt was saved on cuda:0..cuda:3: with map_location=None,
    storages saved on a visible device land there; the others stay on the
    host with one warning (torch raises instead)."""
    count = torch.cuda.device_count()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = ptload.torch.load(fixture("multi_gpu.pt"))
    theirs = torch.load(fixture("multi_gpu.pt"), weights_only=True, map_location="cpu")
    texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if count < 4:
        assert len(texts) == 1 and f"only {count} CUDA device(s) are visible" in texts[0], texts
    for key, t in ours.items():
        assert torch.equal(t.cpu(), theirs[key]), key
    assert any(t.is_cuda for t in ours.values())


def test_device_tensors_outlive_the_load_and_share_storage():
    """The arena lives while any tensor views it; writes through one tied
    tensor show through the other; freeing the last returns the memory.

    torch loads its kernels lazily (CUDA_MODULE_LOADING=LAZY), into device
    memory the process keeps: the kernels this test launches (copies,
    comparisons, zero_) run once on torch's own tensors before the free
    memory is read, so what is measured is ptload's arena alone. (A GPU
    run without this warm-up found 32 MiB not free again; torch's lazy
    kernels are the suspect, and the warm-up takes them out of the
    figure.)"""
    warm = torch.arange(64, dtype=torch.float32, device="cuda:0")
    for dtype in (torch.float32, torch.float64, torch.int64, torch.float16, torch.bfloat16):
        t = warm.to(dtype)
        torch.equal(t.cpu().to("cuda:0"), t)
        t[::2].zero_()
        t.zero_()
    del warm, t
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info(0)[0]
    ours = ptload.torch.load(fixture("views.pt"), map_location="cuda:0")
    theirs = torch.load(fixture("views.pt"), weights_only=True, map_location="cpu")
    keys = [k for k, v in ours.items() if isinstance(v, torch.Tensor) and v.numel()]
    kept = {k: ours[k] for k in keys}
    del ours
    gc.collect()
    torch.cuda.synchronize()
    for k, t in kept.items():
        assert torch.equal(t.cpu(), theirs[k]), k
    by_storage = {}
    for k, t in kept.items():
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(k)
    shared = [ks for ks in by_storage.values() if len(ks) > 1]
    assert shared, "views.pt ties tensors to one storage"
    group = shared[0]
    first = next(k for k in group if kept[k].is_contiguous())  # zero_ needs no overlap
    second = next(k for k in group if k != first)
    kept[first].zero_()
    theirs[first].zero_()  # torch's load ties them too
    torch.cuda.synchronize()
    assert torch.equal(kept[second].cpu(), theirs[second])
    del kept
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.mem_get_info(0)[0] >= free_before - (2 << 20)


def test_a_large_storage_goes_up_whole(tmp_path):
    """A storage larger than one staging buffer (16 MiB at most) and an odd-sized
    one after it arrive byte for byte."""
    path = tmp_path / "big.pt"
    big = torch.arange(20_000_000, dtype=torch.float32)  # 80 MB
    odd = torch.arange(1_000_003, dtype=torch.int8)
    torch.save({"big": big, "odd": odd}, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ours = ptload.torch.load(path, map_location="cuda")
    assert ours["big"].is_cuda and torch.equal(ours["big"].cpu(), big)
    assert ours["odd"].is_cuda and torch.equal(ours["odd"].cpu(), odd)


def test_load_file_onto_the_gpu():
    """Through ptload-device's pipeline: its memory is not torch's
    allocator's, so moving each tensor with Tensor.to would show here."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # what key="auto" chose
        ours = ptload.torch.load_file(fixture("llama_tiny.pt"), device="cuda:0")
        assert torch.cuda.memory_allocated(0) == before
        want = ptload.torch.load_file(fixture("llama_tiny.pt"))
    assert list(ours) == list(want)
    for k, t in want.items():
        assert ours[k].is_cuda and torch.equal(ours[k].cpu(), t), k


@pytest.mark.parametrize("world", [2, 3])
def test_a_ranks_slices_land_on_the_gpu_as_tensor_split(world):
    """A rank's slices of a sharded set, loaded by ptload-device (gathered
    into the staging buffers), equal torch's ``tensor_split`` on the GPU;
    ptload's memory is not torch's allocator's, so a tensor moved by
    ``Tensor.to`` instead would show there."""
    theirs = torch.load(fixture("llama_tiny.pt"), weights_only=True, map_location="cuda:0")
    dims = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 0,
            "up_proj": 0, "down_proj": 1}
    rules = [f"*.{k}.weight={d}" for k, d in dims.items()]
    for rank in range(world):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(0)
        ours = ptload.torch.load_file(fixture("llama_tiny_sharded"), device="cuda:0",
                                      key="all", shard=(rank, world), splits=rules)
        assert torch.cuda.memory_allocated(0) == before
        assert list(ours) == list(theirs)
        for name, t in theirs.items():
            part = name.split(".")[-2]
            if name.endswith(".weight") and part in dims:
                t = torch.tensor_split(t, world, dims[part])[rank]
            assert ours[name].is_cuda and torch.equal(ours[name], t), name


def _tensors(obj):
    """Every tensor in a loaded object, without recursion."""
    stack, out = [obj], []
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            out.append(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
    return out
