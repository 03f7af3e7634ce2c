#!/usr/bin/env python3
"""GPU load, one command: ptload against the machine's pinned host-to-device
copy limit, torch.load(map_location="cuda") and safetensors' load_file(device="cuda").

On a machine with a CUDA GPU, torch and safetensors (from the repository root):

    python3 benches/gpu_compare.py [--sizes 2,8] [--runs 5] [--dir /tmp/ptload-gpu-bench]

It builds what it needs (`cargo build --release -p ptload-cli`, the
`gpu_load` bench), writes transformer-shaped checkpoints of about each size
in GB with torch.save (reused from --dir on later runs), converts each to
safetensors with `ptload convert`, reads every file once (warm page cache),
then per file measures medians of --runs:

- the Rust bench `benches/gpu_load.rs` (`cargo bench -p ptload-device
  --bench gpu_load -- FILE --json`): the pinned host-to-device limit it
  measures itself, and ptload's open + load onto cuda:0, in one process
  whose CUDA context exists before the timing starts;
- torch.load(FILE, map_location="cuda") then torch.cuda.synchronize();
- safetensors.torch.load_file(FILE.safetensors, device="cuda") then
  synchronize;

torch and safetensors each in a fresh process per run, CUDA initialized
before the timer starts, one unmeasured run first. It prints a markdown
table, the goals (ptload at least 80% of the pinned limit, at least 3x
torch.load, at least 2x safetensors) met or not, and the machine; the raw
figures go to DIR/gpu_compare-DATE.json.

Smoke check (the committed fixture, the Rust part only, no torch needed),
for instance on the simulated driver:

    cargo build --release --locked --manifest-path simcuda/Cargo.toml
    LD_LIBRARY_PATH=$PWD/simcuda/target/release python3 benches/gpu_compare.py --smoke

On a GPU machine without a Rust toolchain, `--bins target/gpu-kit` takes
the binaries `bash benches/gpu_kit.sh build` made elsewhere (see that
script).

`--device cpu` runs the torch and safetensors measurements on the host:
only to check this script on a machine without a GPU, never a figure.
"""
import argparse
import json
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

GOAL_PINNED = 0.80
GOAL_TORCH = 3.0
GOAL_SAFETENSORS = 2.0

# Run in a fresh interpreter per measurement: argv = [path, device, reader]. CUDA is
# initialized before the timer; the tensors are checked to be where asked.
CHILD = r"""
import json, sys, time
import torch
path, device, reader = sys.argv[1], sys.argv[2], sys.argv[3]
cuda = device.startswith("cuda")
if cuda:
    torch.cuda.init()
    torch.empty(1, device=device)
    torch.cuda.synchronize()
if reader == "safetensors":
    from safetensors.torch import load_file
start = time.perf_counter()
if reader == "torch":
    sd = torch.load(path, map_location=device)
else:
    sd = load_file(path, device=device)
if cuda:
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
want = torch.device(device).type
elsewhere = [k for k, v in sd.items() if v.device.type != want]
nbytes = sum(v.untyped_storage().nbytes() for v in
             {v.untyped_storage().data_ptr(): v for v in sd.values()}.values())
print(json.dumps({"seconds": seconds, "tensors": len(sd), "bytes": nbytes, "elsewhere": elsewhere[:5]}))
"""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, cwd=ROOT, check=True, **kw)


def transformer_state_dict(target_bytes, seed=0):
    """A decoder-only transformer's state dict (Llama-like names and shapes):
    bf16 projection matrices, fp32 norms and rotary buffers, an fp16 untied
    lm_head; as many layers as make about `target_bytes`."""
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

    def t(shape, dtype, std=0.02):
        return torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=g)

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
        os.replace(pt + ".partial", pt)
    if not os.path.exists(st):
        log(f"converting to {st} ...")
        run([PTLOAD, "convert", "--force", pt, st + ".partial"], stdout=subprocess.DEVNULL)
        os.replace(st + ".partial", st)
    return pt, st


def warm(path):
    """Read the whole file once, so every reader finds it in the page cache."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        while f.readinto(buf):
            pass


def rust_bench(path, runs, bins=None):
    if bins:
        cmd = [os.path.join(bins, "gpu_load"), path, "--json", "--runs", str(runs)]
    else:
        cmd = ["cargo", "bench", "-q", "-p", "ptload-device", "--bench", "gpu_load", "--",
               path, "--json", "--runs", str(runs)]
    log("$ " + " ".join(cmd))
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        # 2: no usable CUDA device; 1: a load failed or fell back (said above).
        log(f"gpu_load failed on {path} (exit status {out.returncode}): nothing to report")
        sys.exit(out.returncode)
    return json.loads(out.stdout.strip().splitlines()[-1])


def python_reader(reader, path, device, runs):
    """Medians of fresh-process runs of one Python reader, after one unmeasured run."""
    results = []
    for i in range(runs + 1):
        out = subprocess.run([sys.executable, "-c", CHILD, path, device, reader],
                             check=True, stdout=subprocess.PIPE, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if r["elsewhere"]:
            sys.exit(f"{reader}: tensors not on {device}: {r['elsewhere']}")
        if i > 0:
            results.append(r)
    seconds = [r["seconds"] for r in results]
    return {"seconds_median": statistics.median(seconds), "seconds": seconds,
            "tensors": results[0]["tensors"], "bytes": results[0]["bytes"]}


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


def goal(ok):
    return "met" if ok else "**not met**"


def report(rows, info, smoke, judged):
    lines = []
    if smoke:
        lines.append("Smoke check: the Rust part only, on a tiny file. Not a speed figure.")
        lines.append("")
    lines.append("| file | bytes | pinned H2D limit | ptload open + load | % of limit |"
                 + ("" if smoke else " torch.load | ptload vs torch.load | safetensors load_file | ptload vs safetensors |"))
    lines.append("| --- | --- | --- | --- | --- |" + ("" if smoke else " --- | --- | --- | --- |"))
    for row in rows:
        b = row["rust"]
        gbps = b["storage_bytes"] / b["ptload"]["seconds_median"] / 1e9
        line = (f"| {os.path.basename(row['file'])} ({b['tensors']} tensors) | {size(b['storage_bytes'])}"
                f" | {b['pinned']['gbps_median']:.2f} GB/s | {b['ptload']['seconds_median']:.4f} s ({gbps:.2f} GB/s)"
                f" | {100 * b['ptload']['fraction_of_pinned']:.1f}% |")
        if not smoke:
            ts, ss = row["torch"]["seconds_median"], row["safetensors"]["seconds_median"]
            line += (f" {ts:.3f} s | {ts / b['ptload']['seconds_median']:.2f}x |"
                     f" {ss:.3f} s | {ss / b['ptload']['seconds_median']:.2f}x |")
        lines.append(line)
    lines.append("")
    goals = (f"Goals (ptload >= {GOAL_PINNED:.0%} of the pinned limit, >= {GOAL_TORCH:g}x torch.load, "
             f">= {GOAL_SAFETENSORS:g}x safetensors)")
    if smoke:
        pass
    elif not judged:
        lines.append(goals + ": not judged, these are not GPU figures.")
        lines.append("")
    else:
        lines.append(goals + ":")
        lines.append("")
        for row in rows:
            b = row["rust"]
            fraction = b["ptload"]["fraction_of_pinned"]
            p = b["ptload"]["seconds_median"]
            vs_torch = row["torch"]["seconds_median"] / p
            vs_st = row["safetensors"]["seconds_median"] / p
            lines.append(f"- {os.path.basename(row['file'])}: "
                         f"{fraction:.0%} of the pinned limit: {goal(fraction >= GOAL_PINNED)}; "
                         f"{vs_torch:.2f}x torch.load: {goal(vs_torch >= GOAL_TORCH)}; "
                         f"{vs_st:.2f}x safetensors: {goal(vs_st >= GOAL_SAFETENSORS)}")
        lines.append("")
    device = rows[0]["rust"]["device"] if rows else {}
    lines.append(f"Device (CUDA driver): cuda:0 {device.get('name')}, {device.get('total_bytes', 0) / 2**30:.1f} GiB")
    if rows:
        lines.append(f"Machine (bench): {rows[0]['rust']['machine']}")
    for k, v in info.items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2,8", help="checkpoint sizes in GB, comma-separated (default 2,8)")
    ap.add_argument("--runs", type=int, default=5, help="measured runs per reader (default 5)")
    ap.add_argument("--dir", default="/tmp/ptload-gpu-bench", help="where checkpoints are made and reused")
    ap.add_argument("--bins", default=None,
                    help="take ptload and gpu_load from this folder instead of building them"
                         " (target/gpu-kit, made by benches/gpu_kit.sh build)")
    ap.add_argument("--smoke", action="store_true",
                    help="the committed fixture, the Rust bench only, no torch (for the simulated driver)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="where torch and safetensors load to; cpu only checks this script, never a figure")
    args = ap.parse_args()
    if args.runs < 1:
        sys.exit("--runs must be at least 1")
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]

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

    files = []
    if args.smoke:
        files.append((SMOKE_FILE, None))
    else:
        os.makedirs(args.dir, exist_ok=True)
        files = [checkpoint(args.dir, gb) for gb in sizes]
        total = sum(os.path.getsize(p) for pair in files for p in pair)
        with open("/proc/meminfo") as f:
            avail = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable")), 0)
        if avail and total > avail:
            log(f"warning: {total / 1e9:.1f} GB of files, {avail / 1e9:.1f} GB of memory available:"
                " the page cache may not hold them all (the cache would not be warm)")

    rows = []
    for pt, st in files:
        row = {"file": pt}
        warm(pt)
        log(f"{os.path.basename(pt)}: gpu_load (pinned limit, ptload) ...")
        row["rust"] = rust_bench(pt, args.runs, args.bins)
        if st is not None:
            log(f"{os.path.basename(pt)}: torch.load(map_location={args.device!r}) x {args.runs + 1} ...")
            row["torch"] = python_reader("torch", pt, args.device, args.runs)
            warm(st)
            log(f"{os.path.basename(st)}: load_file(device={args.device!r}) x {args.runs + 1} ...")
            row["safetensors"] = python_reader("safetensors", st, args.device, args.runs)
            row["safetensors_file"] = st
            for reader in ("torch", "safetensors"):
                if row[reader]["bytes"] != row["rust"]["storage_bytes"]:
                    log(f"warning: {reader} loaded {row[reader]['bytes']} bytes of storages,"
                        f" ptload {row['rust']['storage_bytes']}: not the same work")
        rows.append(row)

    info = machine_info(None if args.smoke else args.device)
    info["runs"] = args.runs
    if not args.smoke and args.device != "cuda":
        info["note"] = f"torch and safetensors loaded to {args.device}: a check of the script, not a figure"
    simulated = bool(rows) and rows[0]["rust"]["device"]["name"].startswith("simcuda")
    if simulated:
        info["note (driver)"] = "the simulated driver (simcuda): not a speed figure"
    judged = not args.smoke and not simulated and args.device == "cuda"
    print(report(rows, info, args.smoke, judged))
    if not args.smoke:
        raw = os.path.join(args.dir, time.strftime("gpu_compare-%Y%m%d-%H%M%S.json"))
        with open(raw, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=2)
        print(f"\nRaw figures: {raw}")


if __name__ == "__main__":
    main()
