"""ptload.torch.load against torch.load(weights_only=True), object for object."""

import collections
import hashlib
import io
import json
import os
import pickle
import warnings

import pytest
import torch

import ptload
import ptload.torch
from conftest import EXPECTED, fixture, fixture_files

warnings.filterwarnings("ignore", category=UserWarning)


def torch_answer(path):
    """torch's own weights-only load, or the exception it raises."""
    try:
        return torch.load(path, weights_only=True), None
    except BaseException as e:  # noqa: BLE001 - any refusal counts
        return None, e


def tensor_equal(a, b):
    if a.layout != torch.strided:
        return True  # sparse: compared through their components
    if a.is_quantized:
        return torch.equal(a.int_repr(), b.int_repr())
    if a.device.type == "meta":
        return True
    a, b = a.resolve_conj().resolve_neg(), b.resolve_conj().resolve_neg()
    return bytes(a.contiguous().view(-1).view(torch.uint8).cpu().numpy()) == bytes(
        b.contiguous().view(-1).view(torch.uint8).cpu().numpy()
    )


def assert_same_object(ours, theirs):
    """Walk both objects together, without recursion: same types, keys,
    values, tensor metadata and bytes, and the same storage sharing."""
    ptrs = {}
    stack = [(ours, theirs, "root")]
    seen = set()
    while stack:
        a, b, where = stack.pop()
        assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
        if id(a) in seen:
            continue
        seen.add(id(a))
        if isinstance(a, torch.Tensor):
            # Python attributes saved with it (t.units = ...), as torch sets them.
            assert sorted(a.__dict__) == sorted(b.__dict__), where + ".__dict__"
            stack.extend((a.__dict__[k], b.__dict__[k], f"{where}.{k}") for k in a.__dict__)
            assert a.dtype == b.dtype, where
            assert a.layout == b.layout, where
            assert a.shape == b.shape, where
            assert a.requires_grad == b.requires_grad, where
            assert a.is_quantized == b.is_quantized, where
            if a.layout == torch.strided:
                assert a.stride() == b.stride(), where
                assert a.storage_offset() == b.storage_offset(), where
                assert a.is_conj() == b.is_conj(), where
                assert a.is_neg() == b.is_neg(), where
                assert tensor_equal(a, b), f"{where}: values differ"
                if a.device.type != "meta":
                    assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes(), where
                if a.device.type != "meta" and a.untyped_storage().nbytes():
                    pa = a.untyped_storage().data_ptr()
                    pb = b.untyped_storage().data_ptr()
                    assert ptrs.setdefault(("a", pa), pb) == pb, f"{where}: sharing differs"
                    assert ptrs.setdefault(("b", pb), pa) == pa, f"{where}: sharing differs"
                if a.is_quantized:
                    assert a.qscheme() == b.qscheme(), where
                    if a.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                        assert a.q_scale() == b.q_scale() and a.q_zero_point() == b.q_zero_point()
                    else:
                        stack.append((a.q_per_channel_scales(), b.q_per_channel_scales(), where + ".scales"))
            elif a.layout == torch.sparse_coo:
                stack.append((a._indices(), b._indices(), where + ".indices"))
                stack.append((a._values(), b._values(), where + ".values"))
            else:
                for part in ("values",):
                    stack.append((getattr(a, part)(), getattr(b, part)(), where + "." + part))
        elif isinstance(a, dict):
            assert list(a.keys()) == list(b.keys()), where
            for (ka, va), (kb, vb) in zip(a.items(), b.items()):
                assert type(ka) is type(kb), where
                stack.append((va, vb, f"{where}[{ka!r}]"))
            assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), where + "._metadata"
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), where
            stack.extend((x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
        elif isinstance(a, (set, frozenset)):
            assert a == b, where
        elif isinstance(a, float) and a != a:
            assert b != b, where
        else:
            assert a == b, f"{where}: {a!r} != {b!r}"


ACCEPTED = []
REFUSED = []
for _name in fixture_files():
    _obj, _err = torch_answer(fixture(_name))
    (ACCEPTED if _err is None else REFUSED).append(_name)


@pytest.mark.parametrize("name", ACCEPTED)
def test_equal_to_torch_weights_only(name):
    theirs = torch.load(fixture(name), weights_only=True)
    ours = ptload.torch.load(fixture(name))
    assert_same_object(ours, theirs)


@pytest.mark.parametrize("name", ["basic.pt", "views.pt", "dtypes.pt"])
def test_sources_and_mmap_modes(name):
    theirs = torch.load(fixture(name), weights_only=True)
    with open(fixture(name), "rb") as fh:
        data = fh.read()
    for ours in (
        ptload.torch.load(fixture(name), mmap=False),
        ptload.torch.load(data),
        ptload.torch.load(io.BytesIO(data)),
    ):
        assert_same_object(ours, theirs)


def test_fast_paths_make_a_state_dict():
    """A state dict's tensors are DLPack views made in one call, and its
    dict is built in the extension; both outlive the checkpoint."""
    from ptload import _graph, _ptload

    path = fixture("basic.pt")
    ckpt = _ptload.open(path, objects=True)
    n = len(ckpt.storages())
    made = ckpt.torch_tensors(torch._C._from_dlpack, path, True, [True] * n)
    assert made and all(t is not None for t in made)
    plain = ckpt.build_plain(made, _graph._set_state)
    assert plain is not None and isinstance(plain[0], dict)
    # Nothing placed on the host: the general path makes every tensor.
    assert all(t is None for t in ckpt.torch_tensors(torch._C._from_dlpack, path, True, [False] * n))
    theirs = torch.load(path, weights_only=True)
    del ckpt, made
    import gc

    gc.collect()
    assert_same_object(plain[0], theirs)


def test_tensors_never_write_the_file(tmp_path):
    path = tmp_path / "basic.pt"
    path.write_bytes(open(fixture("basic.pt"), "rb").read())
    before = path.read_bytes()
    sd = ptload.torch.load(path)
    for t in sd.values():
        t.zero_()
    del sd
    assert path.read_bytes() == before


def expected_tensors(name):
    with open(os.path.join(EXPECTED, name + ".json")) as fh:
        doc = json.load(fh)
    return {(t["dtype"], tuple(t["shape"]), t["sha256"]) for t in doc["tensors"] if t.get("sha256")}


DTYPE_NAMES = {v: k for k, v in ptload.torch._DTYPES.items()}


def reachable_tensors(obj):
    """Every dense tensor reachable from obj (containers, inert records,
    attributes), as (dtype, shape, sha256), the way fixtures/generate.py
    hashes them."""
    out, stack, seen = set(), [obj], set()
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            if o.layout == torch.sparse_coo:
                stack += [o._indices(), o._values()]
                continue
            if o.layout != torch.strided:
                continue
            if o.device.type == "meta":
                continue
            if o.is_quantized:
                if o.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                    stack += [o.q_per_channel_scales(), o.q_per_channel_zero_points()]
                o = o.int_repr()
            t = o.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
            digest = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
            out.add((DTYPE_NAMES[o.dtype], tuple(o.shape), digest))
        elif isinstance(o, dict):
            stack += list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack += list(o)
        elif isinstance(o, ptload.Inert):
            stack += [o.args, o.state, o.items, o.list]
        elif hasattr(o, "__dict__") and not isinstance(o, type):
            stack += list(vars(o).values())
    return out


def plain_values(obj):
    """Plain values under dicts, lists and tuples, named as the answers
    name them (keys and indices joined with dots)."""
    out, stack = {}, [("", obj)]
    while stack:
        name, o = stack.pop()
        if isinstance(o, dict):
            stack += [(f"{name}.{k}" if name else str(k), v) for k, v in o.items()]
        elif isinstance(o, (list, tuple)):
            stack += [(f"{name}.{i}" if name else str(i), v) for i, v in enumerate(o)]
        elif o is None or isinstance(o, (bool, int, float, str)):
            out[name] = o
    return out


GLOBAL_REFUSALS = [
    n for n in REFUSED if n in {"training.ckpt", "training_rng.ckpt", "whole_module.pt"}
]
# torch's weights-only unpickler refuses these for opcodes it lacks (INT,
# LONG...), not for globals: ptload loads them.
OPCODE_REFUSALS = [
    n for n in REFUSED
    if n in {"proto1.pt", "proto4.pt", "proto5.pt", "legacy_proto0.pt", "legacy_proto1.pt",
             "legacy_proto4.pt"}
]


@pytest.mark.parametrize("name", GLOBAL_REFUSALS)
def test_refused_globals_raise_one_error_listing_all(name):
    with pytest.raises(pickle.UnpicklingError) as info:
        ptload.torch.load(fixture(name))
    assert isinstance(info.value, ptload.UnsafeGlobalError)
    assert isinstance(info.value, ptload.Error)
    assert info.value.globals, "the error lists the globals"
    for g in info.value.globals:
        assert g in str(info.value)


@pytest.mark.parametrize("name", GLOBAL_REFUSALS + OPCODE_REFUSALS)
def test_loads_what_torch_refuses_with_torch_full_loads_tensors(name):
    """Tensors equal those torch.load(weights_only=False) gave when
    fixtures/generate.py wrote the answers (never computed here)."""
    ours = ptload.torch.load(fixture(name), unknown="inert")
    expected = expected_tensors(name)
    found = reachable_tensors(ours)
    with open(os.path.join(EXPECTED, name + ".json")) as fh:
        values = json.load(fh)["values"]
    assert expected or values, name
    if name != "whole_module.pt":
        flat = plain_values(ours)
        for key, value in values.items():
            if key in flat:
                assert flat[key] == value, key
        assert set(values) & set(flat) or not values
    if name == "whole_module.pt":
        # The answers hold the module's state_dict(), which leaves out its
        # non-persistent buffers; the inert module holds them too.
        assert expected <= found
    else:
        assert found == expected


def test_plain_types_are_real_objects():
    ours = ptload.torch.load(fixture("training.ckpt"), unknown="inert")
    import numpy as np

    assert isinstance(ours["best_acc"], np.float64) and ours["best_acc"] == 0.875
    assert isinstance(ours["np_array"], np.ndarray)
    assert ours["np_array"].tolist() == [0, 1, 2, 3]


def test_allow_globals_mirrors_add_safe_globals():
    import numpy as np

    path = fixture("training.ckpt")
    with pytest.raises(ptload.UnsafeGlobalError) as info:
        ptload.torch.load(path)
    refused = set(info.value.globals)
    assert refused
    ours = ptload.torch.load(path, unknown="inert", allow_globals=sorted(refused))
    assert ours["best_acc"] == np.float64(0.875)


def test_the_collector_is_restored():
    """The load pauses Python's garbage collector and gives back the state
    it found, after a load and after an error."""
    import gc

    seen = []

    def mapper(storage, location):
        seen.append(gc.isenabled())
        return storage

    assert gc.isenabled()
    ptload.torch.load(fixture("basic.pt"), map_location=mapper)
    assert seen and not any(seen), "the collector runs during the load"
    assert gc.isenabled()
    with pytest.raises(ptload.Error):
        ptload.torch.load(b"not a checkpoint")
    assert gc.isenabled()
    gc.disable()
    try:
        ptload.torch.load(fixture("basic.pt"))
        assert not gc.isenabled()
    finally:
        gc.enable()


class Stop(Exception):
    """Raised by the test's signal handler, as KeyboardInterrupt is by
    Python's (without stopping pytest)."""


def test_a_signal_interrupts_a_long_open(tmp_path):
    """A pickle of 202 million opcodes runs about a second before the
    reader's opcode limit stops it. A signal 50 ms in must stop the load
    from inside the call: had the open run to its end, its own error would
    come first and the handler's exception would carry it as context."""
    import signal
    import zipfile

    path = tmp_path / "long.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + b"N0" * 101_000_000 + b"}.")
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    with pytest.raises(ptload.Error, match="max_opcodes"):
        ptload.torch.load(path)  # uninterrupted: the limit

    def handler(signum, frame):
        raise Stop()

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Stop) as info:
            ptload.torch.load(path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert info.value.__context__ is None, info.value.__context__


def test_progress_shows_the_bytes_read(capsys):
    """progress=True: a tqdm bar over the file's bytes, complete at the end."""
    path = fixture("multi_gpu.pt")
    ours = ptload.torch.load(path, map_location="cpu", mmap=False, progress=True)
    err = capsys.readouterr().err
    assert "multi_gpu.pt" in err and "100%" in err, err
    assert_same_object(ours, torch.load(path, weights_only=True, map_location="cpu"))


def test_names_that_flatten_alike_load_as_torch_loads_them(tmp_path):
    """torch.load never flattens names: {"a.b": t, "a": {"b": u}} and
    {0: t, "0": u} load object for object (safe_open, whose keys are the
    flattened names, refuses them as ambiguous)."""
    for i, obj in enumerate([
        {"a.b": torch.ones(2), "a": {"b": torch.zeros(2)}},
        {0: torch.ones(1), "0": torch.zeros(1)},
        {"l": [torch.ones(1)], "l.0": torch.zeros(1)},
    ]):
        path = tmp_path / f"alike{i}.pt"
        torch.save(obj, path)
        assert_same_object(ptload.torch.load(path), torch.load(path, weights_only=True))
        with pytest.raises(ptload.Error, match="flatten to the name"):
            ptload.safe_open(path)


def test_a_large_expanded_view_loads_as_a_view(tmp_path):
    """A 4-byte storage expanded to 20000 x 20000 is a view in torch, made
    without reading; copying one out (numpy applies a conj bit by copying)
    stays bounded."""
    path = tmp_path / "expanded.pt"
    torch.save({"w": torch.tensor([1.5]).expand(20000, 20000)}, path)
    ours = ptload.torch.load(path)
    theirs = torch.load(path, weights_only=True)
    assert ours["w"].stride() == (0, 0) and ours["w"].untyped_storage().nbytes() == 4
    assert_same_object(ours, theirs)
    from ptload.numpy import load_file

    assert load_file(path)["w"].strides == (0, 0)
    conj = tmp_path / "conj.pt"
    torch.save({"c": torch.tensor([1 + 2j], dtype=torch.complex64).conj().expand(20000, 20000)}, conj)
    assert ptload.torch.load(conj)["c"].is_conj()
    with pytest.raises(ptload.Error, match="max_expanded_view_bytes"):
        load_file(conj)


def test_python2_names_of_protocol_2_are_read_as_python3s(tmp_path):
    """torch.save's protocol 2 writes int as __builtin__.long and range as
    __builtin__.xrange; they are read as builtins.int and builtins.range,
    as torch's unpickler reads them."""
    path = tmp_path / "py2names.pt"
    torch.save({"r": range(3), "d": collections.defaultdict(int), "s": collections.defaultdict(str)}, path)
    with pytest.raises(ptload.UnsafeGlobalError) as info:
        ptload.torch.load(path)
    assert "builtins.range" in info.value.globals, info.value.globals
    assert not any("long" in g or "xrange" in g or "unicode" in g for g in info.value.globals)
    ours = ptload.torch.load(path, unknown="inert")
    assert ours["r"] == range(3)
    assert ours["d"].default_factory is int and ours["s"].default_factory is str
    allowed = ptload.torch.load(path, allow_globals=[range, collections.defaultdict, int, str])
    assert allowed["r"] == range(3) and allowed["d"].default_factory is int


def test_a_deque_is_rebuilt(tmp_path):
    path = tmp_path / "deque.pt"
    torch.save({"d": collections.deque([1, 2], maxlen=5), "e": collections.deque()}, path)
    ours = ptload.torch.load(path, unknown="inert")
    assert ours["d"] == collections.deque([1, 2]) and ours["d"].maxlen == 5
    assert ours["e"] == collections.deque() and ours["e"].maxlen is None


def test_every_reader_error_kind_has_its_exception():
    """The package's one table of the reader's error kinds names every kind
    the reader has (a kind added there and not here fails this), and each
    becomes a ptload.Error carrying its kind."""
    from ptload import _errors, _ptload

    assert sorted(_errors._BY_KIND) == sorted(_ptload.ERROR_KINDS)
    for kind in _ptload.ERROR_KINDS:
        e = _errors.from_reader(kind, f"a {kind} error", file="f.pt", hint="h")
        assert isinstance(e, ptload.Error) and (e.kind, e.file, e.hint) == (kind, "f.pt", "h")
        assert str(e) == f"a {kind} error", kind


def test_globals_are_records_with_where_they_appear():
    """Each global a pickle names comes back once, as a record saying how
    the pickle uses it and where it first appears."""
    from ptload import _ptload

    found = {(g.module, g.name): g for g in _ptload.open(str(fixture("training.ckpt"))).globals()}
    rebuild = found[("torch._utils", "_rebuild_tensor_v2")]
    assert rebuild.torch_allowed and rebuild.called and not rebuild.instantiated
    assert rebuild.record.endswith("data.pkl") and rebuild.offset > 0
    refused = [g for g in found.values() if not g.torch_allowed]
    assert refused, "training.ckpt names globals outside torch's allowlist"
    with pytest.raises(AttributeError):
        rebuild.name = "other"


def test_warnings_are_records_with_a_kind():
    """What the reader noticed without failing comes back as records: a kind
    to branch on and the reader's words (an FSDP rank file holds DTensors,
    each listed as the file's local part)."""
    from ptload import _ptload

    rank_file = fixture("fsdp/world2/model_world_size_2_rank_1.pt")
    warnings = _ptload.open(str(rank_file)).warnings()
    assert [w.kind for w in warnings] == ["local_parts"], warnings
    assert "are DTensors: each is listed as this file's local part" in str(warnings[0])
    assert str(warnings[0]) == warnings[0].message
    assert _ptload.open(str(fixture("basic.pt"))).warnings() == []


def test_errors_pickle_and_carry_their_attributes(tmp_path):
    """Errors cross process boundaries (multiprocessing pickles them) with
    their type, message and attributes; errors of the Python layer have
    the attributes too."""
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n" * 10)
    with pytest.raises(ptload.Error) as info:
        ptload.torch.load(text)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is ptload.NotACheckpointError and str(again) == str(info.value)
    assert (again.kind, again.offset) == (info.value.kind, info.value.offset)
    assert type(info.value).__module__ == "ptload"
    with pytest.raises(ptload.UnsafeGlobalError) as info:
        ptload.torch.load(fixture("training.ckpt"))
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is ptload.UnsafeGlobalError and again.globals == info.value.globals
    with pytest.raises(ptload.Error) as info:
        # A device past those torch sees: missing on any machine.
        missing = torch.cuda.device_count() if torch.cuda.is_available() else 0
        ptload.torch.load(fixture("basic.pt"), map_location=f"cuda:{missing}", strict=True)
    assert info.value.kind == "Other" and info.value.offset is None
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is ptload.DeviceError and isinstance(again, RuntimeError)
    with pytest.raises(IsADirectoryError, match="a directory"):
        ptload.torch.load(tmp_path)
    with pytest.raises(FileNotFoundError):
        ptload.torch.load(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError):
        ptload.safe_open(tmp_path / "missing.pt")


def test_numpy_arrays_come_back_as_numpy_unpickles_them(tmp_path):
    """An array of the other byte order comes in the host's, as numpy
    unpickles it; a structured dtype (fields), which its code alone (V12)
    does not describe, stays inert rather than coming back as raw bytes."""
    import numpy as np

    path = tmp_path / "arrays.pt"
    structured = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])
    torch.save({"big": np.arange(3, dtype=">i4"), "rec": structured, "dt": structured.dtype}, path)
    ours = ptload.torch.load(path, unknown="inert")
    assert ours["big"].dtype == np.dtype("=i4") and ours["big"].tolist() == [0, 1, 2]
    assert isinstance(ours["rec"], ptload.Inert) and ours["rec"].module == "numpy"
    assert isinstance(ours["dt"], ptload.Inert)
    # Not inert in the default mode: said, whatever is trusted.
    import numpy.core.multiarray  # noqa: F401

    trusted = [np.core.multiarray._reconstruct, np.ndarray, np.dtype, type(structured.dtype)]
    with pytest.raises(ptload.Error, match="structured numpy dtype"):
        ptload.torch.load(path, allow_globals=trusted + [type(np.dtype(">i4"))])


def test_numpy_scalars_and_time_units(tmp_path):
    """datetime64/timedelta64 keep their unit; a structured scalar stays
    inert rather than come back as raw void bytes."""
    import numpy as np

    path = tmp_path / "np.pt"
    rec = np.array([(7, 2.5)], np.dtype([("a", "<i4"), ("b", "<f8")]))[0]
    want = {"d": np.array(["2024-01-01", "2024-03-05"], "datetime64[D]"),
            "t": np.timedelta64(5, "s"), "t5": np.array([3], "timedelta64[5m]"),
            "g": np.timedelta64(7), "rec": rec}
    torch.save(want, path)
    ours = ptload.torch.load(path, unknown="inert")
    assert ours["d"].dtype == want["d"].dtype and (ours["d"] == want["d"]).all()
    assert ours["t"] == want["t"] and ours["t"].dtype == np.dtype("m8[s]")
    assert ours["t5"].dtype == np.dtype("m8[5m]") and ours["t5"][0] == want["t5"][0]
    assert ours["g"] == want["g"] and ours["g"].dtype == want["g"].dtype
    assert isinstance(ours["rec"], ptload.Inert)


def test_aware_datetimes_and_mmap_of_a_buffer(tmp_path):
    import datetime

    path = tmp_path / "when.pt"
    zone = datetime.timezone(datetime.timedelta(hours=2), "X")
    when = {"at": datetime.datetime(2024, 1, 2, 3, 4, tzinfo=zone),
            "utc": datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc)}
    torch.save(when, path)
    assert ptload.torch.load(path, unknown="inert") == when
    with pytest.raises(ValueError, match="must be a file path"):
        ptload.torch.load(io.BytesIO(path.read_bytes()), mmap=True)


def test_torchs_safe_globals_registry_is_read(tmp_path):
    """Globals trusted through torch.serialization (add_safe_globals, the
    safe_globals context) are trusted here too, as torch.load trusts them;
    an alias pair maps the file's name to the object given; a trusted name
    that cannot be imported is a ptload.Error."""
    import argparse

    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(lr=0.1)}, path)
    with pytest.raises(ptload.UnsafeGlobalError):
        ptload.torch.load(path)
    with torch.serialization.safe_globals([argparse.Namespace]):
        got = ptload.torch.load(path)
    assert type(got["args"]) is argparse.Namespace and got["args"].lr == 0.1

    class Stand(argparse.Namespace):
        pass

    got = ptload.torch.load(path, allow_globals=[(Stand, "argparse.Namespace")])
    assert type(got["args"]) is Stand and got["args"].lr == 0.1
    import sys
    import types

    module = types.ModuleType("ptload_ghost_module")

    class Ghost:
        pass

    Ghost.__module__, Ghost.__qualname__ = module.__name__, "Ghost"
    module.Ghost = Ghost
    sys.modules[module.__name__] = module
    try:
        torch.save({"g": Ghost()}, tmp_path / "ghost.pt")
    finally:
        del sys.modules[module.__name__]
    with pytest.raises(ptload.Error, match="cannot be imported"):
        ptload.torch.load(tmp_path / "ghost.pt", allow_globals=["ptload_ghost_module.Ghost"])


def test_overlapping_views_cost_nothing_or_are_bounded(tmp_path):
    """A quantized tensor expanded to 2^31 x 2^31 is set over its 1-byte
    storage without allocating (torch's own load cannot make it); a sparse
    tensor whose components are such views, which torch would check
    element by element, is refused at the reader's bound."""
    q = torch.quantize_per_tensor(torch.tensor([1.0]), 0.1, 0, torch.qint8)
    path = tmp_path / "q.pt"
    torch.save({"q": q.expand(2**31, 2**31), "small": q.expand(3, 4)}, path)
    ours = ptload.torch.load(path)
    assert ours["q"].is_quantized and ours["q"].shape == (2**31, 2**31)
    assert ours["q"].stride() == (0, 0) and ours["q"].q_scale() == pytest.approx(0.1)
    assert torch.equal(ours["small"].int_repr(), q.expand(3, 4).int_repr())
    values = torch.tensor([1.0]).expand(300_000_000)
    indices = torch.zeros(1, 1, dtype=torch.long).expand(1, 300_000_000)
    path = tmp_path / "sparse.pt"
    torch.save({"s": torch.sparse_coo_tensor(indices, values, (1,), check_invariants=False)}, path)
    with pytest.raises(ptload.Error, match="max_expanded_view_bytes"):
        ptload.torch.load(path)


def test_modules_torch_blocks_stay_blocked_whatever_is_allowed(tmp_path):
    """os.system (posix.system) named by the caller or torch's registry is
    still refused, as torch refuses it; inert, it is never resolved."""
    import os

    path = tmp_path / "system.pt"
    torch.save({"f": os.system}, path)
    name = f"{os.system.__module__}.system"
    with pytest.raises(ptload.UnsafeGlobalError) as info:
        ptload.torch.load(path, allow_globals=[name, os.system])
    assert info.value.globals == [name]
    with torch.serialization.safe_globals([os.system]):
        with pytest.raises(ptload.UnsafeGlobalError):
            ptload.torch.load(path)
        inert = ptload.torch.load(path, unknown="inert", allow_globals=[name])
    assert isinstance(inert["f"], ptload.Global) and inert["f"].name == "system"


def test_calling_conventions_torch_users_have(tmp_path):
    """weights_only=None is torch's default; a text-mode file object is a
    TypeError, never a path; one allow_globals name may be a string; an
    allow_globals entry that names nothing is a TypeError; a blocked
    module's global that the caller allowed says so."""
    import argparse
    import os

    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(lr=0.1), "w": torch.ones(2)}, path)
    assert ptload.torch.load(path, weights_only=None, unknown="inert")["w"].tolist() == [1, 1]
    with pytest.raises(TypeError, match="binary mode"):
        ptload.torch.load(io.StringIO(str(path)))
    with open(path, encoding="latin-1") as text:
        with pytest.raises(TypeError, match="binary mode"):
            ptload.torch.load(text)
    assert ptload.torch.load(path, allow_globals="argparse.Namespace")["args"].lr == 0.1
    # Globs, by the rule of the CLI's --allow-global and the Rust API.
    assert ptload.torch.load(path, allow_globals=["argparse.*"])["args"].lr == 0.1
    assert ptload.torch.load(path, allow_globals=["argparse.N?mespace"])["args"].lr == 0.1
    with pytest.raises(ptload.UnsafeGlobalError):
        ptload.torch.load(path, allow_globals=["argparse.Other*"])
    with pytest.raises(TypeError, match="allow_globals takes"):
        ptload.torch.load(path, allow_globals=[42])
    system = tmp_path / "system.pt"
    torch.save({"f": os.system}, system)
    name = f"{os.system.__module__}.system"
    with pytest.raises(ptload.UnsafeGlobalError):
        ptload.torch.load(system, allow_globals=["*"])  # a glob never admits os
    with pytest.raises(ptload.UnsafeGlobalError, match="its module is blocked"):
        ptload.torch.load(system, allow_globals=[name])


def test_one_broadcast_tensor_does_not_refuse_a_file(tmp_path):
    """safe_open hands views out as views: a 20000 x 20000 broadcast of one
    float is a stride-0 view, and the file's other tensors read; copying
    it out (a numpy array of the other byte order would be) is bounded."""
    path = tmp_path / "broadcast.pt"
    torch.save({"x": torch.ones(1).expand(20000, 20000), "w": torch.arange(3.0)}, path)
    with ptload.safe_open(path, framework="pt") as f:
        assert f.get_tensor("w").tolist() == [0.0, 1.0, 2.0]
        x = f.get_tensor("x")
        assert x.shape == (20000, 20000) and x.stride() == (0, 0)
    from ptload.numpy import load_file

    arrays = load_file(path)
    assert arrays["x"].shape == (20000, 20000) and arrays["x"].strides == (0, 0)


def test_python2_strings_follow_the_encoding_torch_takes(tmp_path):
    """A protocol 2 pickle holding a Python 2 str (SHORT_BINSTRING) of
    Latin-1 bytes: torch.load's encoding decides what it becomes, here as
    there; a pickle_module is refused, as torch refuses one with
    weights_only."""
    import zipfile

    path = tmp_path / "py2.pt"
    pickle_bytes = b"\x80\x02}q\x00(U\x04nameq\x01U\x03\xe9t\xe9q\x02u."
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    with pytest.raises(ptload.Error):
        ptload.torch.load(path)  # utf-8, torch's default: not UTF-8
    assert ptload.torch.load(path, encoding="latin1") == {"name": "\u00e9t\u00e9"}
    assert ptload.torch.load(path, encoding="bytes") == {b"name": b"\xe9t\xe9"}
    with pytest.raises(ValueError, match="encoding"):
        ptload.torch.load(path, encoding="cp1252")
    with pytest.raises(ptload.Error, match="pickle_module"):
        ptload.torch.load(path, None, pickle)
