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


def test_place_budget_balance_decide_as_the_cli():
    """place rules, a budget and a balance decide per storage as the CLI's
    --place, --budget and --balance do (the reader's mappers): rules by
    tensor name first; a budget fills each GPU in checkpoint order, a
    storage that does not fit going on to the next, then the host; a
    balance splits by bytes, each storage where its midpoint falls."""
    from ptload._io import open_checkpoint

    ckpt = open_checkpoint(fixture("llama_tiny.pt"))
    names = ckpt.storage_names()
    sizes = [s.nbytes for s in ckpt.storages()]
    rules = ckpt.placement(place=[("*embed*", "cpu"), ("model.layers.0.*", "cuda:1")])
    for storage_names, decided in zip(names, rules):
        first = storage_names[0]
        expected = "cpu" if "embed" in first else "cuda:1" if first.startswith("model.layers.0.") else None
        assert decided == expected, first
    room = sum(sizes) // 3
    left, expected = room, []
    for n in sizes:
        fits = n <= left
        left -= n if fits else 0
        expected.append("cuda:0" if fits else "cpu")
    assert ckpt.placement(budget=[(0, room)]) == expected
    assert "cpu" in expected and "cuda:0" in expected
    total, seen, expected = sum(sizes), 0, []
    for n in sizes:
        middle, seen = seen + n // 2, seen + n
        expected.append(f"cuda:{min(middle * 3 // total, 2)}")
    assert ckpt.placement(balance=3) == expected
    assert set(expected) == {"cuda:0", "cuda:1", "cuda:2"}
    # Rules first, then the budget for what they left.
    both = ckpt.placement(place=[("*embed*", "cpu")], budget=[(0, 10**12)])
    assert both == ["cpu" if "embed" in n[0] else "cuda:0" for n in names]


def test_placements_from_load_fall_back_naming_tensors():
    """What place/budget/balance send to a GPU that is not there stays on
    the host, in one warning that names the tensors (not storage keys);
    strict=True raises DeviceError, a RuntimeError, naming the tensor.
    The missing GPU is the first ordinal past those torch sees, so this
    holds on a machine with GPUs too."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = f"cuda:{count}"
    with pytest.warns(RuntimeWarning, match=r"layers\.0\.") as record:
        ours = ptload.torch.load(fixture("llama_tiny.pt"), place={"model.layers.0.*": missing})
    assert len(record) == 1
    theirs = torch.load(fixture("llama_tiny.pt"), weights_only=True)
    assert all(torch.equal(ours[k].cpu(), theirs[k]) for k in theirs)
    if count == 0:
        # balance=2 puts the first storages on cuda:0, which is missing here.
        with pytest.raises(RuntimeError, match=r"model\.embed_tokens\.weight .* cannot go to cuda:0") as info:
            ptload.torch.load(fixture("llama_tiny.pt"), balance=2, strict=True)
        with pytest.warns(RuntimeWarning, match="no CUDA device is visible"):
            ptload.torch.load(fixture("llama_tiny.pt"), budget=0.9)
    else:
        with pytest.raises(RuntimeError, match=rf"model\.embed_tokens\.weight .* cannot go to {missing}") as info:
            ptload.torch.load(fixture("llama_tiny.pt"), place={"*embed*": missing}, strict=True)
    assert isinstance(info.value, ptload.DeviceError)
    with pytest.raises(ValueError, match="give one"):
        ptload.torch.load(fixture("llama_tiny.pt"), budget=0.9, balance=2)
    with pytest.raises(ValueError, match="map_location would never apply"):
        ptload.torch.load(fixture("llama_tiny.pt"), balance=2, map_location="cpu")
    with pytest.raises(ValueError, match="budget"):
        ptload.torch.load(fixture("llama_tiny.pt"), budget=1.5)
    with pytest.raises(ValueError, match=r"place rule '\*': 'tpu:0'"):
        ptload.torch.load(fixture("llama_tiny.pt"), place={"*": "tpu:0"})


def test_placements_parse_as_the_cli_parses_them():
    """place= and budget= go through the reader's parsers, the ones the
    CLI's --place and --budget use: the CLI's spellings work, its refusals
    hold, and errors name the keyword and the rule."""
    name = fixture("llama_tiny.pt")
    theirs = torch.load(name, weights_only=True)
    # Every storage to the host by a rule string, as --place spells it.
    ours = ptload.torch.load(name, place="model.*=cpu,*=cpu")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    ours = ptload.torch.load(name, place=["*embed*=cpu", ("*", torch.device("cpu"))])
    assert all(ours[k].device.type == "cpu" for k in ours)
    with pytest.raises(ValueError, match=r"place='encoder\.\*': .*PATTERN=DEVICE"):
        ptload.torch.load(name, place="encoder.*")
    with pytest.raises(ValueError, match=r"place rule '\*': 'gpu0': .*cpu, cuda, cuda:N, meta"):
        ptload.torch.load(name, place={"*": "gpu0"})
    with pytest.raises(TypeError, match="place rule 3"):
        ptload.torch.load(name, place=[3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no GPU here: all on the host
        for budget in ("20GiB", "90%", 0.9, 20 << 30):
            ptload.torch.load(name, budget=budget)
    with pytest.raises(ValueError, match=r"budget=2: .*write the unit"):
        ptload.torch.load(name, budget=2)
    with pytest.raises(ValueError, match=r"budget='lots': "):
        ptload.torch.load(name, budget="lots")
    with pytest.raises(TypeError, match="budget"):
        ptload.torch.load(name, budget=True)


def test_a_strict_refusal_names_the_keyword_that_placed_it():
    """A rule that sends storages to a GPU that is not there, with
    strict=True: the error names place=, not map_location."""
    with pytest.raises(ptload.DeviceError) as info:
        ptload.torch.load(fixture("llama_tiny.pt"), place={"*": "cuda:63"}, strict=True)
    assert "place=" in str(info.value) and "map_location" not in str(info.value)
    with pytest.raises(ptload.DeviceError, match="pass map_location"):
        ptload.torch.load(fixture("llama_tiny.pt"), map_location="cuda:63", strict=True)


def test_a_mapper_can_place_by_tensor_name():
    """The storage a map_location callable gets names its tensors
    (`.tensors`); torch's callable sees only the location tag."""
    seen = {}

    def by_name(storage, location):
        seen[storage.tensors] = location
        return storage if any("embed" in n for n in storage.tensors) else "cpu"

    ours = ptload.torch.load(fixture("llama_tiny.pt"), map_location=by_name)
    from ptload._io import open_checkpoint

    assert sorted(seen) == sorted(tuple(n) for n in open_checkpoint(fixture("llama_tiny.pt")).storage_names())
    assert all(ours[k].device.type == "cpu" for k in ours)


@pytest.mark.parametrize("form", ["dict of devices", "callable returns str", "callable returns device", "storage.to(positional)"])
def test_forms_torch_refuses_are_accepted_with_one_warning(form):
    """map_location forms torch.load raises TypeError for: ptload places
    as asked, and says once per load that torch would raise, so code
    headed back to torch is told."""
    mapper = {
        "dict of devices": {"cpu": torch.device("cpu")},
        "callable returns str": lambda s, loc: "cpu",
        "callable returns device": lambda s, loc: torch.device("cpu"),
        "storage.to(positional)": lambda s, loc: s.to("cpu"),
    }[form]
    with pytest.raises(TypeError):
        torch.load(fixture("llama_tiny.pt"), map_location=mapper, weights_only=True)
    for _ in range(2):
        with pytest.warns(UserWarning, match="torch.load raises TypeError") as record:
            ours = ptload.torch.load(fixture("llama_tiny.pt"), map_location=mapper)
        assert len([w for w in record if "TypeError" in str(w.message)]) == 1
    theirs = torch.load(fixture("llama_tiny.pt"), weights_only=True)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ptload.torch.load(fixture("llama_tiny.pt"), map_location=lambda s, loc: s.to(device="cpu"))


def test_the_readers_advice_names_keyword_arguments(tmp_path):
    """A storage saved on a device ptload cannot restore: the reader's
    advice comes as data and is worded with this package's map_location,
    never the Rust API's names."""
    import io

    from ptload._io import open_checkpoint

    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    assert data.count(b"cpu") == 1  # the storage's location, in the pickle
    path = tmp_path / "npu.pt"
    path.write_bytes(data.replace(b"cpu", b"npu"))
    ckpt = open_checkpoint(path, objects=False)
    with pytest.raises(ptload.UnsupportedError) as info:
        ckpt.placement()
    said = str(info.value)
    assert 'map it with map_location={"npu": "cpu"}' in said, said
    assert "Mapper" not in said and "placement::" not in said, said
