"""Tensor-parallel reading from a cold page cache: what each of 8 ranks
reads of a Llama-shaped sharded set, against one reader of the whole set.

    cargo build --release -p ptload-cli
    ~/torchenv/bin/python benches/tp_read.py [--dir /tmp/ptload-tp-bench]
        [--layers 5] [--world 8] [--reps 3] [--bin target/release/ptload]

Once, the script has torch write a Llama-7B-shaped set (hidden 4096,
intermediate 11008, vocabulary 32000, bf16, LlamaForCausalLM names) of
--layers layers into --dir, sharded as Hugging Face's save_pretrained does
(shards of at most 1 GB, `pytorch_model-0000K-of-0000N.bin` plus
`pytorch_model.bin.index.json`), one shard in memory at a time. Later runs
reuse it.

Then, for every rank R of --world, and for the whole set: it syncs and
drops the set's files from the page cache (posix_fadvise DONTNEED on each
file), runs `ptload inspect --json --hash --quiet [--shard R/W
--split-preset llama] DIR` and records
  - the library's bytes: `bytes_read` of the JSON (tensor bytes hashed: a
    rank's slices and the replicated tensors),
  - the OS's bytes: the child's ru_inblock x 512 (the RUSAGE_CHILDREN delta
    across the run: bytes the kernel read from storage on its behalf) and
    /proc/PID/io read_bytes read before the child is reaped,
  - the wall time, from spawn to exit.
Each measurement is repeated --reps times (the median is reported), the
repetitions interleaved (whole set, rank 0, ..., rank W-1, then again).

Why OS bytes can exceed the library's: ptload reads slices through a
memory map, and the kernel reads whole 4 KiB pages, and more. A
row-parallel (dim 1) slice is a block of every row of the matrix (o_proj:
1 KiB of each 8 KiB row at world 8, down_proj: 2.7 KiB of each 21.5 KiB
row), so its rank touches a page (or two) of every row. The script asks
`ptload plan` for each rank's byte ranges (the library's ReadPlan) and
reports the 4 KiB pages they touch: the least any page-granular reader can
read. On top of that, a fault in a map with normal advice reads a window of
read_ahead_kb around it (printed below; 8 MiB on the VM this was written
on), which inflates column-parallel (dim 0) slices too. The table reports
what the kernel accounted, not what it should have.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDDEN, INTERMEDIATE, VOCAB = 4096, 11008, 32000
MAX_SHARD = 10**9  # save_pretrained's "1GB" is 10**9 bytes


def llama_tensors(layers):
    """(name, shape) in LlamaForCausalLM's state_dict order."""
    h, i = HIDDEN, INTERMEDIATE
    out = [("model.embed_tokens.weight", (VOCAB, h))]
    for n in range(layers):
        p = f"model.layers.{n}."
        out += [(p + f"self_attn.{x}_proj.weight", (h, h)) for x in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h))]
        out += [(p + "mlp.down_proj.weight", (h, i))]
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (VOCAB, h))]
    return out


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def write_set(directory, layers):
    """Write the set unless a complete one with this layout is there."""
    tensors = llama_tensors(layers)
    stamp = {"layers": layers, "hidden": HIDDEN, "intermediate": INTERMEDIATE, "vocab": VOCAB}
    stamp_path = os.path.join(directory, "tp_bench.json")
    index_path = os.path.join(directory, "pytorch_model.bin.index.json")
    try:
        with open(stamp_path) as f:
            if json.load(f) == stamp and os.path.exists(index_path):
                print(f"reusing the set in {directory}", file=sys.stderr)
                return
    except (OSError, ValueError):
        pass
    import torch

    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.startswith("pytorch_model") or name == "tp_bench.json":
            os.remove(os.path.join(directory, name))
    # Shards as transformers' shard_checkpoint cuts them: in order, a new
    # shard when the next tensor would take this one past the limit.
    shards, size = [[]], 0
    for name, shape in tensors:
        nbytes = numel(shape) * 2
        if shards[-1] and size + nbytes > MAX_SHARD:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    gen = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    started = time.perf_counter()
    for k, shard in enumerate(shards):
        file = f"pytorch_model-{k + 1:05d}-of-{len(shards):05d}.bin"
        # One shard in memory at a time (~1 GB), each tensor made in bf16.
        sd = {}
        for name, shape in shard:
            if len(shape) == 1:
                sd[name] = 1 + 0.02 * torch.randn(shape, generator=gen, dtype=torch.bfloat16)
            else:
                sd[name] = 0.02 * torch.randn(shape, generator=gen, dtype=torch.bfloat16)
            weight_map[name] = file
            total += sd[name].numel() * sd[name].element_size()
        torch.save(sd, os.path.join(directory, file))
        del sd
        print(f"wrote {file} ({len(shard)} tensors)", file=sys.stderr)
    with open(index_path, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    os.sync()
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    print(f"wrote {total / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def set_files(directory):
    return sorted(
        os.path.join(directory, n)
        for n in os.listdir(directory)
        if n.startswith("pytorch_model")
    )


def drop_cache(files):
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def proc_read_bytes(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def measure(binary, directory, files, shard=None):
    """One cold run: (library bytes, OS bytes, /proc io bytes, seconds, json)."""
    args = [binary, "inspect", "--json", "--hash", "--quiet"]
    if shard is not None:
        args += ["--shard", shard, "--split-preset", "llama"]
    args.append(directory)
    drop_cache(files)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err)
        out = child.stdout.read()
        # Exited but not reaped: its /proc entry still holds its counters.
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        seconds = time.perf_counter() - start
        proc_io = proc_read_bytes(child.pid)
        code = child.wait()
        if code != 0:
            err.seek(0)
            sys.exit(f"{' '.join(args)} failed ({code}): {err.read().decode(errors='replace')}")
    inblock = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock - before
    doc = json.loads(out)
    return doc["bytes_read"], inblock * 512, proc_io, seconds, doc


def page_bytes(binary, directory, world):
    """Per rank, the bytes of the 4 KiB pages its planned ranges touch."""
    out = subprocess.run(
        [binary, "plan", "--quiet", "--world", str(world), "--split-preset", "llama", directory],
        capture_output=True, check=True,
    ).stdout
    plan = json.loads(out)
    result = []
    for rank in plan["ranks"]:
        pages = set()
        for r in rank["ranges"]:
            for c in range(r["count"]):
                start = r["offset"] + c * r["step"]
                end = start + r["len"]
                if end > start:
                    pages.update((r["file"], p) for p in range(start // 4096, (end - 1) // 4096 + 1))
        result.append(len(pages) * 4096)
    return result


def machine(directory):
    model = "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    ram = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    st = os.stat(directory)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    ra = "?"
    for p in (f"/sys/dev/block/{dev}/queue/read_ahead_kb", f"/sys/dev/block/{dev}/../queue/read_ahead_kb"):
        try:
            with open(p) as f:
                ra = f.read().strip() + " KiB"
                break
        except OSError:
            pass
    return model, os.cpu_count(), ram, platform.release(), dev, ra


def mb(n):
    return "n/a" if n is None else f"{n / 1e6:,.1f}"


def measure_job(binary, directory, files, world):
    """All ranks at once, as a job on one node runs them: (seconds until the
    last rank finishes, OS bytes read by all of them)."""
    drop_cache(files)
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [binary, "inspect", "--json", "--hash", "--quiet", "--shard", f"{r}/{world}",
             "--split-preset", "llama", directory],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for r in range(world)
    ]
    total = 0
    for p in procs:
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            sys.exit(f"rank failed ({p.returncode})")
        total += usage.ru_inblock * 512
    return time.perf_counter() - start, total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/ptload-tp-bench")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "ptload"))
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"{a.bin} not found: run `cargo build --release -p ptload-cli` first")
    write_set(a.dir, a.layers)
    files = set_files(a.dir)
    file_bytes = sum(os.path.getsize(f) for f in files)

    targets = [None] + [f"{r}/{a.world}" for r in range(a.world)]
    runs = {t: [] for t in targets}
    docs = {}
    started = time.perf_counter()
    for rep in range(a.reps):
        for t in targets:
            lib, os_bytes, proc_io, secs, doc = measure(a.bin, a.dir, files, t)
            runs[t].append((lib, os_bytes, proc_io, secs))
            docs[t] = doc
            print(f"rep {rep + 1}/{a.reps} {t or 'whole'}: {secs:.2f} s, "
                  f"library {mb(lib)} MB, OS {mb(os_bytes)} MB", file=sys.stderr)
    jobs = [measure_job(a.bin, a.dir, files, a.world) for _ in range(a.reps)]
    elapsed = time.perf_counter() - started

    def med(t, i):
        vals = [r[i] for r in runs[t] if r[i] is not None]
        return statistics.median(vals) if vals else None

    whole_doc = docs[None]
    whole_nbytes = {x["name"]: x["nbytes"] for x in whole_doc["tensors"]}
    total = whole_doc["totals"]["bytes"]
    rank0 = docs[targets[1]]["tensors"]
    replicated = sum(x["nbytes"] for x in rank0 if "slice" not in x)
    share = (total - replicated) / a.world + replicated
    dim0 = [x for x in rank0 if x.get("slice", {}).get("dim") == 0]
    dim1 = [x for x in rank0 if x.get("slice", {}).get("dim") == 1]
    dim1_whole = sum(whole_nbytes[x["name"]] for x in dim1)
    # The least a page-granular reader of each rank's ranges can read.
    pages = page_bytes(a.bin, a.dir, a.world)

    ranks = targets[1:]
    lib_r = [med(t, 0) for t in ranks]
    os_r = [med(t, 1) for t in ranks]
    sec_r = [med(t, 3) for t in ranks]
    w_lib, w_os, w_sec = med(None, 0), med(None, 1), med(None, 3)
    m_lib, m_os, m_sec = statistics.median(lib_r), statistics.median(os_r), statistics.median(sec_r)

    model, cores, ram, kernel, dev, ra = machine(a.dir)
    print(f"## ptload tensor-parallel read, world {a.world}, cold page cache\n")
    print(f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"- machine: {model}, {cores} cores, {ram} RAM, kernel {kernel}; "
          f"set on block device {dev}, read_ahead_kb {ra}")
    print(f"- set: {a.dir}: Llama shape (hidden {HIDDEN}, intermediate {INTERMEDIATE}, "
          f"vocab {VOCAB}, {a.layers} layers, bf16) written by torch, {len(files) - 1} shards "
          f"+ index, {file_bytes / 1e9:.2f} GB on disk, {total / 1e9:.3f} GB of tensors "
          f"({len(whole_doc['tensors'])} tensors)")
    print(f"- command: `{os.path.relpath(a.bin, ROOT)} inspect --json --hash --quiet "
          f"[--shard R/{a.world} --split-preset llama] DIR`, page cache of the set dropped "
          f"before every run (os.sync + POSIX_FADV_DONTNEED); median of {a.reps} run(s); "
          f"{elapsed:.0f} s measuring")
    print(f"- replicated (not split by the preset: norms): {replicated:,} bytes; "
          f"each rank's share = (total - replicated)/{a.world} + replicated = {share:,.0f} bytes "
          f"({share / 1e6:,.1f} MB)")
    print(f"- row-parallel (dim 1) tensors: {len(dim1)}, a rank's slices of them "
          f"{sum(x['nbytes'] for x in dim1) / 1e6:,.1f} MB, the tensors whole "
          f"{dim1_whole / 1e6:,.1f} MB; column-parallel (dim 0): {len(dim0)}, "
          f"{sum(x['nbytes'] for x in dim0) / 1e6:,.1f} MB a rank")
    print("- 4 KiB pages: the pages each rank's planned ranges (`ptload plan`) touch, "
          "the least a page-granular reader reads\n")
    print("| reader | library bytes (MB) | 4 KiB pages (MB) | OS bytes, ru_inblock x 512 (MB) "
          "| /proc io read_bytes (MB) | OS / library | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t, lib, pg, osb, sec in zip(ranks, lib_r, pages, os_r, sec_r):
        print(f"| rank {t} | {mb(lib)} | {mb(pg)} | {mb(osb)} | {mb(med(t, 2))} | "
              f"{osb / lib:.2f} | {sec:.2f} |")
    print(f"| **rank median** | {mb(m_lib)} | {mb(statistics.median(pages))} | {mb(m_os)} | "
          f"{mb(statistics.median([med(t, 2) or 0 for t in ranks]))} | {m_os / m_lib:.2f} | {m_sec:.2f} |")
    print(f"| **whole set** | {mb(w_lib)} | {mb(total)} | {mb(w_os)} | {mb(med(None, 2))} | "
          f"{w_os / w_lib:.2f} | {w_sec:.2f} |")
    speed = w_sec / m_sec
    print()
    print(f"- whole / rank time (medians): {speed:.2f}x (goal >= 4x: "
          f"{'met' if speed >= 4 else 'NOT met'})")
    print(f"- rank / whole bytes: library {m_lib / w_lib:.3f}, OS {m_os / w_os:.3f} "
          f"(1/{a.world} = {1 / a.world:.3f})")
    over_lib = [t for t, b in zip(ranks, lib_r) if b > share]
    over_os = [t for t, b in zip(ranks, os_r) if b > share]
    print(f"- share goal (each rank <= its share {share / 1e6:,.1f} MB): library bytes "
          f"{'met by every rank' if not over_lib else 'NOT met by ' + ', '.join(over_lib)}; "
          f"OS bytes {'met by every rank' if not over_os else 'NOT met by ' + ', '.join(over_os)} "
          f"(max {max(os_r) / share:.2f}x the share)")
    job_sec = statistics.median(j[0] for j in jobs)
    job_bytes = statistics.median(j[1] for j in jobs)
    print(f"- the {a.world} ranks at once (one node, {cores} cores): the last done after "
          f"{job_sec:.2f} s (median of {a.reps}), {mb(job_bytes)} MB read from storage by all "
          f"of them; one reader of the whole set: {w_sec:.2f} s, {mb(w_os)} MB")
    print(f"- note: the OS reads whole 4 KiB pages, and a row-parallel (dim 1) slice is a "
          f"block of every row, so a rank touches pages of every row of those tensors "
          f"(pages / library = {statistics.median(pages) / m_lib:.2f}); OS / pages = "
          f"{m_os / statistics.median(pages):.2f} (read-ahead, up to {ra}, around faults "
          f"the views' own page requests did not cover). The OS column is what the "
          f"kernel accounted to the process.")


if __name__ == "__main__":
    main()
