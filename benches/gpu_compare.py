#!/usr/bin/env python3
"""GPU load, one command: ptload against the machine's pinned host-to-device
copy limit, torch.load(map_location="cuda") and safetensors' load_file(device="cuda"),
with the page cache warm and cold, and a tensor-parallel rank's load.

On a machine with a CUDA GPU, torch and safetensors (from the repository root):

    python3 benches/gpu_compare.py [--sizes 2,8] [--runs 5] [--cold-runs 3] [--tp-runs 5]
                                   [--dir /tmp/ptload-gpu-bench] [--budget-s S] [--report FILE]

It builds what it needs (`cargo build --release -p ptload-cli`, the
`gpu_load` bench), writes transformer-shaped checkpoints of about each size
in GB with torch.save (reused from --dir on later runs), converts each to
safetensors with `ptload convert`, fsyncs every file once (so eviction can
drop all its pages), then per file:

- warm page cache (the file read once before each reader), medians of
  --runs after one unmeasured run:
  - the Rust bench `benches/gpu_load.rs` (`gpu_load FILE --json`): the
    pinned host-to-device limit it measures itself, and ptload's open +
    load onto cuda:0 in one process whose CUDA context exists before the
    timing starts, with ptload's host memory and where its time goes;
  - torch.load(FILE, map_location="cuda") then torch.cuda.synchronize();
  - safetensors.torch.load_file(FILE.safetensors, device="cuda") then
    synchronize, once per backend the installed safetensors accepts
    (0.8.0: backend="mmap", the default, and "pread"; found with
    inspect.signature and a tiny file): ptload is judged against the
    fastest;
- ptload on the .safetensors file, warm (`gpu_load FILE.safetensors
  --json`): the same load from the same bytes safetensors reads, judged
  against safetensors' fastest path too;
- a tensor-parallel rank, warm: `gpu_load FILE --tp 2 --rank 0` (rank 0
  of 2, the llama split preset, as `ptload load --shard 0/2
  --split-preset llama`), medians of --tp-runs;
- cold page cache, medians of --cold-runs (no unmeasured run): before
  each run the file is dropped from the page cache
  (posix_fadvise(POSIX_FADV_DONTNEED) over it) and the share still cached
  is measured with mincore over a fresh map (ctypes on libc here,
  `gpu_load --cold` for ptload). Over 5% cached (a kernel that ignores the
  advice, a file on tmpfs) the figures are printed as not cold and not
  judged.

torch and safetensors each in a fresh process per run, CUDA initialized
before the timer starts. It prints markdown tables (warm, cold, the rank,
ptload's host memory, where ptload's time goes) and the goals met or not:
ptload at least 85% of the pinned limit (warm), at least 3x torch.load, at
least 1.5x safetensors' fastest path, and ptload's host memory during a
load (peak RssAnon + RssShmem above the start) at most its pinned staging
pool plus 10% of the file. Raw figures go to DIR/gpu_compare-DATE.json,
rewritten after each file, as is --report when given (so a run stopped
part way keeps what it measured). --budget-s: no new measurement starts
after that many seconds from the start; what is left is reported as
skipped. --prepare only writes the checkpoints (benches/gpu_kit.sh all does
so while the tests run).

Smoke check (committed fixtures, the Rust part only, no torch needed:
warm and --cold on multi_gpu.pt, --tp 2 on llama_wide.pt), for instance
on the simulated driver:

    cargo build --release --locked --manifest-path simcuda/Cargo.toml
    LD_LIBRARY_PATH=$PWD/simcuda/target/release python3 benches/gpu_compare.py --smoke

On a GPU machine without a Rust toolchain, `--bins target/gpu-kit` takes
the binaries `bash benches/gpu_kit.sh build` made elsewhere (see that
script).

`--device cpu` runs the torch and safetensors measurements on the host:
only to check this script on a machine without a GPU, never a figure.
"""
import argparse
import ctypes
import ctypes.util
import inspect
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
PTLOAD = os.path.join(TARGET, "release", "ptload")
SMOKE_FILE = os.path.join(ROOT, "fixtures", "files", "multi_gpu.pt")
SMOKE_TP_FILE = os.path.join(ROOT, "fixtures", "files", "llama_wide.pt")

GOAL_PINNED = 0.85
GOAL_TORCH = 3.0
GOAL_SAFETENSORS = 1.5
# ptload's host memory during a load: at most its pinned staging plus this
# share of the file (gpu_load's MEMORY_FILE_SHARE, which computes the budget).
GOAL_MEMORY_FILE_SHARE = 0.10
# Above this share of a file still cached after eviction, a run is not cold
# (gpu_load's COLD_RESIDENT_MAX).
COLD_RESIDENT_MAX = 0.05
TP_WORLD, TP_RANK, TP_PRESET = 2, 0, "llama"

# Run in a fresh interpreter per measurement: argv = [path, device, reader,
# backend ("" for the default)]. CUDA is initialized before the timer; the
# tensors are checked to be where asked.
CHILD = r"""
import json, sys, time
import torch
path, device, reader, backend = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
cuda = device.startswith("cuda")
if cuda:
    torch.cuda.init()
    torch.empty(1, device=device)
    torch.cuda.synchronize()
if reader == "safetensors":
    from safetensors.torch import load_file
    kw = {"backend": backend} if backend else {}
start = time.perf_counter()
if reader == "torch":
    sd = torch.load(path, map_location=device)
else:
    sd = load_file(path, device=device, **kw)
if cuda:
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
want = torch.device(device).type
elsewhere = [k for k, v in sd.items() if v.device.type != want]
nbytes = sum(v.untyped_storage().nbytes() for v in
             {v.untyped_storage().data_ptr(): v for v in sd.values()}.values())
print(json.dumps({"seconds": seconds, "tensors": len(sd), "bytes": nbytes, "elsewhere": elsewhere[:5]}))
"""

START = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - START:6.1f} s] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, cwd=ROOT, check=True, **kw)


class Budget:
    """No new measurement after `seconds` from the start (None: no limit)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def allows(self, what):
        if self.seconds is None or time.monotonic() - START < self.seconds:
            return True
        log(f"skipped, past the time budget of {self.seconds:g} s: {what}")
        return False


SKIPPED = {"skipped": "time budget"}


# --- page cache -------------------------------------------------------------

def fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(path):
    """Ask the kernel to drop the file's pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


_libc = None


def libc():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_int64]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        _libc = lib
    return _libc


# mincore's answer: bit 0 of each byte says the page is cached.
_CACHED_BIT = bytes(b & 1 for b in range(256))


def resident(path):
    """The share of the file's pages in the page cache: mincore over a
    fresh map of it (which reads nothing)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    lib = libc()
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap {path}: {os.strerror(ctypes.get_errno())}")
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if lib.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}: {os.strerror(ctypes.get_errno())}")
            return bytes(vec).translate(_CACHED_BIT).count(1) / pages
        finally:
            lib.munmap(addr, size)
    finally:
        os.close(fd)


def make_cold(path):
    """Drop the file from the page cache; the share still cached after,
    or None when that could not be measured (said on stderr)."""
    try:
        evict(path)
    except OSError as e:
        log(f"posix_fadvise(DONTNEED) {path}: {e}")
    try:
        return resident(path)
    except OSError as e:
        log(f"{e}: the run is not known to be cold")
        return None


def is_cold(fractions):
    return bool(fractions) and all(f is not None and f <= COLD_RESIDENT_MAX for f in fractions)


def warm(path):
    """Read the whole file once, so every reader finds it in the page cache."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        while f.readinto(buf):
            pass


# --- checkpoints ------------------------------------------------------------

def transformer_state_dict(target_bytes, seed=0):
    """A decoder-only transformer's state dict (Llama-like names and shapes):
    bf16 projection matrices, fp32 norms and rotary buffers, an fp16 untied
    lm_head; as many layers as make about `target_bytes`. Values: windows of
    one pool of normal noise (std 0.02), each tensor its own storage and
    bytes; cheaper to make than fresh noise for every element."""
    import torch

    if target_bytes >= 1e9:
        d, ff, vocab = 4096, 11008, 32000
    else:  # small files for checking the script
        d, ff, vocab = 512, 1408, 8000
    head_dim = 128 if d >= 1024 else 64
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    per_layer = (4 * d * d + 3 * d * ff) * 2 + 2 * d * 4 + head_dim // 2 * 4
    fixed = vocab * d * 2 * 2 + d * 4
    layers = max(1, round((target_bytes - fixed) / per_layer))
    g = torch.Generator().manual_seed(seed)
    pool = torch.empty(min(64 << 20, int(target_bytes) // 2 + 1), dtype=fp32).normal_(0.0, 0.02, generator=g)
    at = 0

    def t(shape, dtype):
        nonlocal at
        n = 1
        for s in shape:
            n *= s
        out = torch.empty(n, dtype=dtype)
        done = 0
        while done < n:
            k = min(n - done, pool.numel() - at)
            out[done:done + k].copy_(pool[at:at + k])
            done += k
            # Step by a prime, so consecutive tensors differ.
            at = (at + k + 7919) % pool.numel()
        return out.view(shape)

    sd = {"model.embed_tokens.weight": t((vocab, d), bf16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = t((d, d), bf16)
        sd[p + "self_attn.k_proj.weight"] = t((d, d), bf16)
        sd[p + "self_attn.v_proj.weight"] = t((d, d), bf16)
        sd[p + "self_attn.o_proj.weight"] = t((d, d), bf16)
        sd[p + "self_attn.rotary_emb.inv_freq"] = 1.0 / (
            10000 ** (torch.arange(0, head_dim, 2, dtype=fp32) / head_dim))
        sd[p + "mlp.gate_proj.weight"] = t((ff, d), bf16)
        sd[p + "mlp.up_proj.weight"] = t((ff, d), bf16)
        sd[p + "mlp.down_proj.weight"] = t((d, ff), bf16)
        sd[p + "input_layernorm.weight"] = 1.0 + t((d,), fp32)
        sd[p + "post_attention_layernorm.weight"] = 1.0 + t((d,), fp32)
    sd["model.norm.weight"] = 1.0 + t((d,), fp32)
    sd["lm_head.weight"] = t((vocab, d), fp16)
    return sd, f"{layers} layers, d={d}, ff={ff}, vocab={vocab}"


def checkpoint(out_dir, gb):
    """(the .pt path, the .safetensors path), made once and reused."""
    name = f"transformer-{gb:g}gb"
    pt = os.path.join(out_dir, name + ".pt")
    st = os.path.join(out_dir, name + ".safetensors")
    if not os.path.exists(pt):
        import torch

        log(f"writing {pt} (about {gb:g} GB) ...")
        sd, shape = transformer_state_dict(gb * 1e9)
        log(f"  {len(sd)} tensors: {shape}")
        torch.save(sd, pt + ".partial")
        del sd
        fsync_file(pt + ".partial")
        os.replace(pt + ".partial", pt)
    if not os.path.exists(st):
        log(f"converting to {st} ...")
        run([PTLOAD, "convert", "--force", pt, st + ".partial"], stdout=subprocess.DEVNULL)
        fsync_file(st + ".partial")
        os.replace(st + ".partial", st)
    return pt, st


# --- measurements -----------------------------------------------------------

class GpuLoadFailed(Exception):
    pass


def rust_bench(path, runs, bins=None, extra=()):
    args = [path, "--json", "--runs", str(runs), *extra]
    if bins:
        cmd = [os.path.join(bins, "gpu_load"), *args]
    else:
        cmd = ["cargo", "bench", "-q", "-p", "ptload-device", "--bench", "gpu_load", "--", *args]
    log("$ " + " ".join(cmd))
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if out.returncode == 2:
        # No usable CUDA device (said above): nothing can be measured.
        log(f"gpu_load could not measure on {path} (exit status 2): nothing to report")
        sys.exit(2)
    if out.returncode != 0:
        # A load failed or fell back to the host (said above).
        raise GpuLoadFailed(f"gpu_load {' '.join(extra) or '(warm)'} failed on {path}"
                            f" (exit status {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def python_reader(reader, path, device, runs, backend=None, cold=False):
    """Medians of fresh-process runs of one Python reader: warm, after one
    unmeasured run; cold, each run after the file is dropped from the page
    cache (and the share still cached measured)."""
    results, cached = [], []
    for i in range(runs + (0 if cold else 1)):
        if cold:
            cached.append(make_cold(path))
        out = subprocess.run([sys.executable, "-c", CHILD, path, device, reader, backend or ""],
                             stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            # Its error is on stderr, above.
            return {"error": f"{reader} {backend or ''} failed on {os.path.basename(path)}"
                             f" (exit status {out.returncode})".replace("  ", " ")}
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if r["elsewhere"]:
            sys.exit(f"{reader}: tensors not on {device}: {r['elsewhere']}")
        if cold or i > 0:
            results.append(r)
    seconds = [r["seconds"] for r in results]
    row = {"seconds_median": statistics.median(seconds), "seconds": seconds,
           "tensors": results[0]["tensors"], "bytes": results[0]["bytes"]}
    if cold:
        row["cold"] = {"resident_before": cached, "effective": is_cold(cached)}
    return row


def safetensors_backends(out_dir):
    """The backends of load_file the installed safetensors accepts: [None]
    (its one path) when it takes no `backend`, else those of "mmap" and
    "pread" a tiny file loads with."""
    import torch
    from safetensors.torch import load_file, save_file

    if "backend" not in inspect.signature(load_file).parameters:
        return [None]
    probe = os.path.join(out_dir, "backend-probe.safetensors")
    save_file({"x": torch.arange(4)}, probe)
    accepted = []
    for backend in ("mmap", "pread"):
        try:
            load_file(probe, device="cpu", backend=backend)
            accepted.append(backend)
        except Exception as e:  # the installed version's refusal, whatever its type
            log(f"safetensors load_file(backend={backend!r}) refused: {e}")
    os.remove(probe)
    return accepted or [None]


def st_name(backend):
    return f"safetensors {backend}" if backend else "safetensors"


def measure_python(row, mode, pt, st, args, backends, budget):
    """torch.load and each safetensors backend, `mode` warm or cold."""
    cold = mode == "cold"
    runs = args.cold_runs if cold else args.runs
    base = os.path.basename(pt)
    out = row[mode]
    if budget.allows(f"{base} torch.load {mode}"):
        if not cold:
            warm(pt)
        log(f"{base}: torch.load(map_location={args.device!r}) {mode} x {runs + (0 if cold else 1)} ...")
        out["torch"] = python_reader("torch", pt, args.device, runs, cold=cold)
    else:
        out["torch"] = SKIPPED
    out["safetensors"] = {}
    for backend in backends:
        key = backend or "default"
        if not budget.allows(f"{base} {st_name(backend)} {mode}"):
            out["safetensors"][key] = SKIPPED
            continue
        if not cold:
            warm(st)
        log(f"{os.path.basename(st)}: load_file(device={args.device!r}, backend={backend!r}) {mode} ...")
        out["safetensors"][key] = python_reader("safetensors", st, args.device, runs, backend, cold)


def measure_rust(row, key, pt, runs, args, budget, extra=()):
    what = f"{os.path.basename(pt)} gpu_load {' '.join(extra) or '(warm)'}"
    if not budget.allows(what):
        row[key] = SKIPPED
        return
    if "--cold" not in extra:
        warm(pt)
    log(f"{what} ...")
    try:
        row[key] = rust_bench(pt, runs, args.bins, extra)
    except GpuLoadFailed as e:
        log(str(e))
        row[key] = {"error": str(e)}


TP_ARGS = ("--tp", str(TP_WORLD), "--rank", str(TP_RANK), "--split-preset", TP_PRESET)

# --sweep-runs: ptload's staging choices on the smallest file, warm, after
# everything else (so they never take the comparison's time): how many
# copy workers, how large their buffers, filled from the map or by
# positioned reads, registered or allocated by the driver, kept in the
# process's pool or pinned by every load (each run then pays what a
# process's first load pays). The first is the default (Staging::default:
# a worker per core from 4 to 16 sharing 128 MiB, read, registered, kept).
SWEEP = [
    ("default (worker per core, read, registered, kept)", ()),
    ("default, map", ("--fill", "map")),
    ("default, allocated by the driver", ("--pin", "alloc")),
    ("default, pinned every load", ("--no-keep",)),
    ("default, allocated every load", ("--no-keep", "--pin", "alloc")),
    ("8 x 8 MiB", ("--streams", "8", "--buffer-mib", "8")),
    ("16 x 16 MiB", ("--streams", "16", "--buffer-mib", "16")),
    ("32 x 2 MiB", ("--streams", "32", "--buffer-mib", "2")),
]


def sweep_table(sweep):
    """The staging sweep as markdown lines."""
    if not sweep:
        return []
    lines = [f"**Staging choices** (warm, {os.path.basename(sweep['file'])}, medians of {sweep['runs']};"
             " copy workers' thread-seconds)", "",
             "| staging | ptload open + load | GB/s | % of pinned limit | setup | fill | wait | minor faults"
             " | first load (% of limit, pinning calls) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, b in sweep["configs"].items():
        if not measured(b):
            lines.append(f"| {label} | {why_not(b)} | | | | | | |")
            continue
        p, prof = b["ptload"], b.get("profile", {})
        minor = [f for f in prof.get("minor_faults", []) if f is not None]
        faults = f"{statistics.median(minor):.0f}" if minor else "?"
        lines.append(
            f"| {label} | {p['seconds_median']:.4f} s | {p['gbps']:.2f} | {p['fraction_of_pinned']:.0%} |"
            f" {prof.get('setup_seconds_median', 0):.3f} | {prof.get('fill_seconds_median', 0):.3f} |"
            f" {prof.get('wait_seconds_median', 0):.3f} | {faults} | {first_cell(b)} |")
    return lines + [""]


def first_cell(b):
    """The first load of the process (nothing pinned yet), as a cell."""
    f = b.get("first") if measured(b) else None
    if not f:
        return "-"
    return f"{f['seconds']:.4f} s ({f['fraction_of_pinned']:.0%}, {f['pinnings']})"


# --- the report ---------------------------------------------------------------

def machine_info(device):
    info = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["memory"] = f.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        q = "name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if out.returncode == 0 and out.stdout.strip():
            info["gpu (nvidia-smi: name, memory, driver, PCIe gen, width)"] = out.stdout.strip().splitlines()[0]
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, check=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
        info["ptload commit"] = commit
    except (OSError, subprocess.CalledProcessError):
        pass
    if device is not None:
        import safetensors
        import torch

        info["torch"] = torch.__version__
        info["safetensors"] = safetensors.__version__
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu (torch)"] = torch.cuda.get_device_name(0)
    return info


def size(n):
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def mib(n):
    return f"{n / 2**20:.0f} MiB" if n >= 2**24 else f"{n / 2**20:.1f} MiB"


def goal(ok):
    return "met" if ok else "**not met**"


def measured(x):
    """A measurement that was made (not skipped, not failed)."""
    return isinstance(x, dict) and "skipped" not in x and "error" not in x


def why_not(x):
    if x is None:
        return "not run"
    return x.get("skipped") and "skipped (time budget)" or x.get("error", "not run")


def secs(x):
    return x["ptload"]["seconds_median"] if "ptload" in x else x["seconds_median"]


def cell_s(x):
    return f"{secs(x):.3f} s" if measured(x) else why_not(x)


def fastest_st(mode_row):
    """(name, result) of the fastest measured safetensors backend, or None."""
    done = [(k, v) for k, v in mode_row.get("safetensors", {}).items() if measured(v)]
    if not done:
        return None
    return min(done, key=lambda kv: kv[1]["seconds_median"])


def ratio(other, ptload):
    return f"{secs(other) / secs(ptload):.2f}x" if measured(other) and measured(ptload) else "-"


def errors(rows):
    """What failed: a bench that exited 1, a reader's process that failed."""
    found = []
    for row in rows:
        for mode in ("warm", "cold"):
            m = row[mode]
            found += [x for x in (m.get("ptload"), m.get("torch"), *m.get("safetensors", {}).values())
                      if isinstance(x, dict) and "error" in x]
        if isinstance(row.get("tp"), dict) and "error" in row["tp"]:
            found.append(row["tp"])
    return [x["error"] for x in found]


def cold_state(mode_row):
    """Whether every cold run of every reader started cold: (cold, the
    most of a file found cached, any unknown)."""
    fractions = []
    b = mode_row.get("ptload")
    if measured(b):
        fractions += b["cold"]["resident_before"]
    for r in [mode_row.get("torch"), *mode_row.get("safetensors", {}).values()]:
        if measured(r):
            fractions += r["cold"]["resident_before"]
    unknown = any(f is None for f in fractions)
    known = [f for f in fractions if f is not None]
    return is_cold(fractions), (max(known) if known else None), unknown


def report(rows, info, smoke, judged, backends, simulated):
    lines = []
    if smoke:
        lines += ["Smoke check: the Rust part only, on small fixtures. Not a speed figure.", ""]
    st_cols = [st_name(b) for b in backends]

    def speed_table(mode, title=None):
        if title:
            lines.append(f"**{title}**")
            lines.append("")
        head = "| file | storage bytes | pinned H2D limit | ptload open + load | % of limit |"
        if mode == "warm":
            head += " first load of the process (% of limit, pinning calls) |"
        if not smoke:
            head += " torch.load | ptload vs torch.load |" + "".join(f" {c} |" for c in st_cols)
            head += " ptload vs fastest safetensors |"
            if mode == "warm":
                head += " ptload on the .safetensors | its % of limit | it vs fastest safetensors |"
        lines.append(head)
        lines.append("|" + " --- |" * (head.count("|") - 1))
        for row in rows:
            m = row[mode]
            b = m.get("ptload")
            label = os.path.basename(row["file"])
            if not measured(b):
                lines.append(f"| {label} | {why_not(b)} |")
                continue
            gbps = b["storage_bytes"] / secs(b) / 1e9
            line = (f"| {label} ({b['tensors']} tensors) | {size(b['storage_bytes'])}"
                    f" | {b['pinned']['gbps_median']:.2f} GB/s | {secs(b):.4f} s ({gbps:.2f} GB/s)"
                    f" | {100 * b['ptload']['fraction_of_pinned']:.1f}% |")
            if mode == "warm":
                line += f" {first_cell(b)} |"
            if not smoke:
                line += f" {cell_s(m.get('torch'))} | {ratio(m.get('torch'), b)} |"
                for key in [b_ or "default" for b_ in backends]:
                    line += f" {cell_s(m.get('safetensors', {}).get(key))} |"
                fast = fastest_st(m)
                line += f" {ratio(fast[1], b)} ({st_name(None if fast[0] == 'default' else fast[0])}) |" \
                    if fast else " - |"
                if mode == "warm":
                    s_ = m.get("ptload_st")
                    if measured(s_):
                        line += (f" {secs(s_):.4f} s | {100 * s_['ptload']['fraction_of_pinned']:.1f}% |"
                                 f" {ratio(fast[1], s_) if fast else '-'} |")
                    else:
                        line += f" {why_not(s_)} | | |"
            lines.append(line)
        lines.append("")

    speed_table("warm", "Warm page cache (each file read once before each reader)")
    lines.append("**Cold page cache** (each file dropped from the page cache before every run,"
                 " posix_fadvise DONTNEED; the share still cached measured with mincore)")
    lines.append("")
    for row in rows:
        cold, most, unknown = cold_state(row["cold"])
        label = os.path.basename(row["file"])
        if unknown:
            lines.append(f"- {label}: **NOT COLD**: mincore could not say what was cached;"
                         " the figures below are not cold and not judged")
        elif most is None:
            lines.append(f"- {label}: no cold run measured")
        elif cold:
            lines.append(f"- {label}: cold (at most {100 * most:.1f}% of the file cached before a run)")
        else:
            lines.append(f"- {label}: **NOT COLD**: up to {100 * most:.1f}% of the file stayed cached"
                         f" (over {100 * COLD_RESIDENT_MAX:.0f}%; eviction does not work here);"
                         " the figures below are not cold and not judged")
    lines.append("")
    speed_table("cold")

    lines.append(f"**Tensor-parallel rank** (rank {TP_RANK} of {TP_WORLD}, the {TP_PRESET} split preset,"
                 " warm; as `ptload load --shard 0/2 --split-preset llama`)")
    lines.append("")
    lines.append("| file | rank's storage bytes | tensors split | ptload open + load | % of pinned limit |")
    lines.append("| --- | --- | --- | --- | --- |")
    for row in rows:
        b = row.get("tp")
        label = os.path.basename(row.get("tp_file", row["file"]))
        if not measured(b):
            lines.append(f"| {label} | {why_not(b)} |")
            continue
        gbps = b["storage_bytes"] / secs(b) / 1e9
        lines.append(f"| {label} | {size(b['storage_bytes'])} of {size(b['file_bytes'])} file"
                     f" | {b['tp']['split_tensors']} of {b['tensors']} | {secs(b):.4f} s ({gbps:.2f} GB/s)"
                     f" | {100 * b['ptload']['fraction_of_pinned']:.1f}% |")
    lines.append("")

    loads = []
    for row in rows:
        for key, what in (("warm", "warm"), ("cold", "cold"), ("tp", "rank 0 of 2")):
            b = row[key].get("ptload") if key != "tp" else row.get("tp")
            file = row.get("tp_file", row["file"]) if key == "tp" else row["file"]
            loads.append((os.path.basename(file), what, b))

    lines.append(f"**ptload's host memory** (peak RssAnon + RssShmem above the start of the load,"
                 f" sampled about every ms; budget: its pinned staging + {GOAL_MEMORY_FILE_SHARE:.0%}"
                 " of the file; RssFile, the mapped file's page cache, not counted)")
    lines.append("")
    if simulated:
        lines.append("On the simulated driver device memory is host memory, so the copies count here too.")
        lines.append("")
    lines.append("| file | load | peak | budget (staging + share of file) | within | RssFile peak |")
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for label, what, b in loads:
        if not measured(b):
            continue
        m = b.get("memory")
        if not m:
            lines.append(f"| {label} | {what} | not measured (no RssAnon/RssShmem/RssFile) | | | |")
            continue
        lines.append(f"| {label} | {what} | {mib(m['peak_bytes'])} | {mib(m['budget_bytes'])}"
                     f" ({mib(m['pinned_bytes'])} + {mib(m['budget_bytes'] - m['pinned_bytes'])})"
                     f" | {'yes' if m['within_budget'] else '**no**'} | {mib(m['file_peak_bytes'])} |")
    lines.append("")

    lines.append("**Where ptload's time goes** (medians; the copy workers' thread-seconds summed over"
                 " them, so they can exceed the wall time; page faults of the process during the load)")
    lines.append("")
    lines.append("| file | load | open + load | load() | setup | fill | wait | copies | minor faults | major faults |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, what, b in loads:
        if not measured(b):
            continue
        p = b["profile"]

        def faults(key):
            v = [f for f in p[key] if f is not None]
            return f"{statistics.median(v):.0f}" if v else "-"

        lines.append(f"| {label} | {what} | {secs(b):.4f} s | {b['ptload']['load_seconds_median']:.4f} s"
                     f" | {p['setup_seconds_median']:.4f} | {p['fill_seconds_median']:.4f}"
                     f" | {p['wait_seconds_median']:.4f} | {p['copies']} | {faults('minor_faults')}"
                     f" | {faults('major_faults')} |")
    lines.append("")

    goals = (f"Goals (ptload >= {GOAL_PINNED:.0%} of the pinned limit (warm), >= {GOAL_TORCH:g}x torch.load,"
             f" >= {GOAL_SAFETENSORS:g}x safetensors' fastest path, host memory <= pinned staging +"
             f" {GOAL_MEMORY_FILE_SHARE:.0%} of the file)")
    if smoke:
        pass
    elif not judged:
        lines += [goals + ": not judged, these are not GPU figures.", ""]
    else:
        lines += [goals + ":", ""]
        for row in rows:
            label = os.path.basename(row["file"])
            for mode in ("warm", "cold"):
                m = row[mode]
                b = m.get("ptload")
                if mode == "cold":
                    cold, _, unknown = cold_state(m)
                    if not cold or unknown:
                        lines.append(f"- {label} cold: not judged (not cold)")
                        continue
                if not measured(b):
                    lines.append(f"- {label} {mode}: not judged ({why_not(b)})")
                    continue
                parts = []
                if mode == "warm":
                    f = b["ptload"]["fraction_of_pinned"]
                    parts.append(f"{f:.0%} of the pinned limit: {goal(f >= GOAL_PINNED)}")
                    if b.get("first"):
                        f = b["first"]["fraction_of_pinned"]
                        parts.append(f"first load of the process {f:.0%} of it: {goal(f >= GOAL_PINNED)}")
                if measured(m.get("torch")):
                    r = secs(m["torch"]) / secs(b)
                    parts.append(f"{r:.2f}x torch.load: {goal(r >= GOAL_TORCH)}")
                fast = fastest_st(m)
                if fast:
                    r = secs(fast[1]) / secs(b)
                    parts.append(f"{r:.2f}x safetensors ({fast[0]}, the fastest): {goal(r >= GOAL_SAFETENSORS)}")
                if b.get("memory"):
                    parts.append(f"host memory {mib(b['memory']['peak_bytes'])}:"
                                 f" {goal(b['memory']['within_budget'])}")
                lines.append(f"- {label} {mode}: " + "; ".join(parts))
            b = row.get("tp")
            if measured(b) and b.get("memory"):
                lines.append(f"- {label} rank 0 of 2: host memory {mib(b['memory']['peak_bytes'])}:"
                             f" {goal(b['memory']['within_budget'])}")
        lines.append("")
        lines.append("The pinned-limit goal is judged warm only: a cold load also waits for the disk.")
        lines.append("")
    failures = errors(rows)
    if failures:
        lines += ["**Failed** (the log says why):", ""] + [f"- {e}" for e in failures] + [""]
    benches = [b for row in rows for b in (row["warm"].get("ptload"), row.get("tp")) if measured(b)]
    if benches:
        d = benches[0]["device"]
        lines.append(f"Device (CUDA driver): cuda:0 {d.get('name')}, {d.get('total_bytes', 0) / 2**30:.1f} GiB")
        lines.append(f"Machine (bench): {benches[0]['machine']}")
    for k, v in info.items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2,8", help="checkpoint sizes in GB, comma-separated (default 2,8)")
    ap.add_argument("--runs", type=int, default=5, help="measured warm runs per reader (default 5)")
    ap.add_argument("--cold-runs", type=int, default=3, help="measured cold runs per reader (default 3)")
    ap.add_argument("--tp-runs", type=int, default=5, help="measured runs of the rank's load (default 5)")
    ap.add_argument("--dir", default="/tmp/ptload-gpu-bench", help="where checkpoints are made and reused")
    ap.add_argument("--bins", default=None,
                    help="take ptload and gpu_load from this folder instead of building them"
                         " (target/gpu-kit, made by benches/gpu_kit.sh build)")
    ap.add_argument("--smoke", action="store_true",
                    help="committed fixtures, the Rust bench only, no torch (for the simulated driver)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="where torch and safetensors load to; cpu only checks this script, never a figure")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no measurement after this many seconds; the rest is reported as skipped")
    ap.add_argument("--report", default=None, help="also write the report (markdown) here, after each measurement")
    ap.add_argument("--sweep-runs", type=int, default=0,
                    help="after everything else, measure ptload's staging choices (streams, buffer size,"
                         " map or positioned reads, kept buffers) on the smallest file, warm, with this"
                         " many runs each (default 0: not measured)")
    ap.add_argument("--prepare", action="store_true",
                    help="only write (or find) the checkpoints in --dir and fsync them; measure nothing")
    args = ap.parse_args()
    if min(args.runs, args.cold_runs, args.tp_runs) < 1:
        sys.exit("--runs, --cold-runs and --tp-runs must be at least 1")
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    budget = Budget(args.budget_s)

    if not args.smoke:
        try:
            import safetensors.torch  # noqa: F401
            import torch  # noqa: F401
        except ImportError as e:
            sys.exit(f"{e}: the comparison needs torch and safetensors (or use --smoke)")
    # Build first, so no compilation happens between measurements; or take
    # the binaries benches/gpu_kit.sh built (a machine without Rust).
    global PTLOAD
    if args.bins:
        args.bins = os.path.abspath(args.bins)  # the bench runs from ROOT
        PTLOAD = os.path.join(args.bins, "ptload")
        for exe in (PTLOAD, os.path.join(args.bins, "gpu_load")):
            if not os.access(exe, os.X_OK):
                sys.exit(f"{exe}: missing (bash benches/gpu_kit.sh build makes it)")
    else:
        if not args.smoke:
            run(["cargo", "build", "--release", "-q", "-p", "ptload-cli"])
        run(["cargo", "bench", "-q", "-p", "ptload-device", "--bench", "gpu_load", "--no-run"])

    if args.smoke and args.prepare:
        sys.exit("--prepare makes the checkpoints, which --smoke does not use")
    if args.smoke:
        files = [(SMOKE_FILE, None)]
        backends = []
    else:
        os.makedirs(args.dir, exist_ok=True)
        files = [checkpoint(args.dir, gb) for gb in sizes]
        for pair in files:
            for p in pair:
                fsync_file(p)  # made by an earlier run too: clean pages, which eviction can drop
        total = sum(os.path.getsize(p) for pair in files for p in pair)
        with open("/proc/meminfo") as f:
            avail = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable")), 0)
        if avail and total > avail:
            log(f"warning: {total / 1e9:.1f} GB of files, {avail / 1e9:.1f} GB of memory available:"
                " the page cache may not hold them all (the cache would not be warm)")
        if args.prepare:
            log(f"prepared: {', '.join(p for pair in files for p in pair)}")
            return
        backends = safetensors_backends(args.dir)
        log(f"safetensors load_file backends: {', '.join(b or 'default' for b in backends)}")

    info = machine_info(None if args.smoke else args.device)
    info["runs"] = (f"warm {args.runs}, cold {args.cold_runs}, rank {args.tp_runs}" if not args.smoke
                    else f"{args.runs} each")
    if not args.smoke and args.device != "cuda":
        info["note"] = f"torch and safetensors loaded to {args.device}: a check of the script, not a figure"
    raw = None if args.smoke else os.path.join(args.dir, time.strftime("gpu_compare-%Y%m%d-%H%M%S.json"))
    rows = []
    sweep = {}

    def write():
        simulated = any(measured(b) and b["device"]["name"].startswith("simcuda")
                        for row in rows for b in [row["warm"].get("ptload")])
        if simulated:
            info["note (driver)"] = "the simulated driver (simcuda): not a speed figure"
        judged = not args.smoke and not simulated and args.device == "cuda"
        text = report(rows, info, args.smoke, judged, backends, simulated)
        if sweep:
            text += "\n\n" + "\n".join(sweep_table(sweep))
        if args.report:
            with open(args.report + ".partial", "w") as f:
                f.write(text + "\n")
            os.replace(args.report + ".partial", args.report)
        if raw:
            with open(raw + ".partial", "w") as f:
                json.dump({"info": info, "rows": rows, "sweep": sweep}, f, indent=2)
            os.replace(raw + ".partial", raw)
        return text

    for pt, st in files:
        row = {"file": pt, "warm": {}, "cold": {}}
        rows.append(row)
        tp_file = SMOKE_TP_FILE if args.smoke else pt
        if tp_file != pt:
            row["tp_file"] = tp_file
        steps = [lambda: measure_rust(row["warm"], "ptload", pt, args.runs, args, budget)]
        if st is not None:
            row["safetensors_file"] = st
            steps.append(lambda: measure_python(row, "warm", pt, st, args, backends, budget))
            steps.append(lambda: measure_rust(row["warm"], "ptload_st", st, args.runs, args, budget))
        steps.append(lambda: measure_rust(row, "tp", tp_file, args.tp_runs if not args.smoke else args.runs,
                                          args, budget, TP_ARGS))
        steps.append(lambda: measure_rust(row["cold"], "ptload", pt, args.cold_runs if not args.smoke else args.runs,
                                          args, budget, ("--cold",)))
        if st is not None:
            steps.append(lambda: measure_python(row, "cold", pt, st, args, backends, budget))
        for measure in steps:
            measure()
            write()  # what is measured so far, should the run be stopped
        for mode in ("warm", "cold"):
            b = row[mode].get("ptload")
            if not measured(b):
                continue
            for reader, r in [("torch", row[mode].get("torch")),
                              *((st_name(k), v) for k, v in row[mode].get("safetensors", {}).items())]:
                if measured(r) and r["bytes"] != b["storage_bytes"]:
                    log(f"warning: {reader} loaded {r['bytes']} bytes of storages,"
                        f" ptload {b['storage_bytes']}: not the same work")

    if args.sweep_runs > 0 and files:
        pt = min((pair[0] for pair in files), key=os.path.getsize)
        sweep.update({"file": pt, "runs": args.sweep_runs, "configs": {}})
        for label, extra in SWEEP:
            measure_rust(sweep["configs"], label, pt, args.sweep_runs, args, budget, extra)
            write()

    print(write())
    if raw:
        print(f"\nRaw figures: {raw}")
    if errors(rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
