"""Write the seed corpora that are not files of their own elsewhere.

pickle_vm: every pickle record inside the fixtures (zip and legacy files are
seeded to the container and checkpoint targets directly from
fixtures/files). differential: plain-data pickles written by CPython's
pickle module at every protocol. map_location: example specs. dcp: each
distributed checkpoint of fixtures/files/dcp as one input (records of a
one-byte name length, the name, a little-endian u32 length and the bytes).

Run with any Python 3 (stdlib only): python3 fuzz/seeds/make.py
"""
import hashlib
import os
import pickle
import struct
import zipfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def put(target, data):
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(here, target, name), "wb") as f:
        f.write(data)


files = os.path.join(root, "fixtures", "files")
for name in sorted(os.listdir(files)):
    path = os.path.join(files, name)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.filename.endswith(".pkl") and info.file_size < 65536:
                    put("pickle_vm", z.read(info))

values = [
    None, True, False, 0, 1, -1, 255, 256, 65535, 65536, 2**31 - 1, -2**31, 2**63 - 1,
    -2**63, 2**64, -2**100, 1.5, -0.0, float("inf"), float("nan"), "", "text", "ünï\u20ac",
    b"", b"\x00\xff", bytearray(b"ba"), (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], [1, [2, [3]]],
    {}, {"a": 1, "b": [1.0, None]}, {1: "x", 2.5: b"y", (1, 2): "t"}, {1, 2, 3}, frozenset({"f"}),
    {"nested": {"deep": [{"k": (None, True)}]}},
]
shared = [1, 2]
values.append([shared, shared, {"s": shared}])
for proto in range(0, pickle.HIGHEST_PROTOCOL + 1):
    for v in values:
        put("differential", pickle.dumps(v, protocol=proto))
    put("differential", pickle.dumps(values, protocol=proto))

for spec in ["cpu", "cuda", "cuda:3", "meta", "auto", "cuda:1=cuda:0,cuda:3=cpu", "npu:0=cpu",
             "cuda:1=", "a=b=c", "encoder.*\nencoder.layer.0.weight", "*a*b?c*\nxaxbycz"]:
    put("map_location", spec.encode())

dcp = os.path.join(files, "dcp")
os.makedirs(os.path.join(here, "dcp"), exist_ok=True)
for save in sorted(os.listdir(dcp)):
    out = b""
    for name in sorted(os.listdir(os.path.join(dcp, save))):
        with open(os.path.join(dcp, save, name), "rb") as f:
            data = f.read()
        out += bytes([len(name)]) + name.encode() + struct.pack("<I", len(data)) + data
    put("dcp", out)
