"""Checkpoints at URLs and on local disk read by ranges: ptload against
downloading, and positioned reads against the map.

Writes model-like checkpoints with torch (layers of 8 MiB float32
tensors, plus small ones) of the sizes asked for, serves them with nginx
on loopback (its access log counts the bytes sent), and times:

- `inspect --json` and `scan --json` of the URL, and the bytes they fetch;
- `curl -o FILE URL`, the download they avoid;
- `load --map-location cpu` of the URL (every tensor fetched into memory)
  against `curl`, and `load --hash` (every tensor read and hashed) against
  downloading then loading the local file;
- locally: `inspect --json --hash` and `load --hash` mapped and `--pread`;
- with --s3s (the s3s-fs binary): `inspect` and `scan` of the same file as
  an `s3://` object (bytes from ptload's `fetched`).

Usage (torch from the test environment, nginx from Debian's packages):

    python benches/remote.py --ptload target/release/ptload --sizes 500,2000

Prints a Markdown table per size (median and range of --runs runs) and
writes the raw timings as JSON (--out). The files are written under
--dir (default target/bench-remote) and removed at the end unless --keep.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

LAYER_ELEMENTS = 2048 * 1024  # 8 MiB of float32


def write_checkpoint(python, path, megabytes):
    """A state dict of `megabytes` MB: layers of 8 MiB, norms, a step."""
    script = f"""
import torch
torch.manual_seed(0)
layers = max(1, ({megabytes} * 1000 * 1000) // ({LAYER_ELEMENTS} * 4))
sd = {{}}
for i in range(layers):
    sd[f"layers.{{i}}.weight"] = torch.randn(2048, 1024)
    sd[f"layers.{{i}}.norm"] = torch.ones(1024)
sd["step"] = torch.tensor(7)
torch.save(sd, {str(path)!r})
"""
    subprocess.run([python, "-c", script], check=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx serving `root` on a loopback port, logging bytes sent."""

    def __init__(self, binary, root, work):
        self.work = Path(work)
        self.port = free_port()
        self.log = self.work / "access.log"
        temp = self.work / "temp"
        temp.mkdir(parents=True, exist_ok=True)
        conf = self.work / "nginx.conf"
        conf.write_text(
            f"""daemon off;
worker_processes 1;
pid {self.work}/nginx.pid;
error_log {self.work}/error.log;
events {{ worker_connections 64; }}
http {{
    log_format sent '$request_uri $status $bytes_sent "$http_range"';
    access_log {self.log} sent;
    client_body_temp_path {temp};
    proxy_temp_path {temp};
    fastcgi_temp_path {temp};
    uwsgi_temp_path {temp};
    scgi_temp_path {temp};
    server {{
        listen 127.0.0.1:{self.port};
        root {root};
    }}
}}
"""
        )
        self.proc = subprocess.Popen(
            [binary, "-c", str(conf), "-p", str(self.work)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def url(self, name):
        return f"http://127.0.0.1:{self.port}/{name}"

    def sent_since(self, mark):
        """Bytes and requests the log records after `mark` (a line count)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        new = lines[mark:]
        return sum(int(line.split()[2]) for line in new), len(new), len(lines)

    def lines(self):
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def timed(cmd, runs, nginx=None, before=None):
    """Median, min, max seconds of `runs` runs of `cmd`, and the bytes and
    requests the server saw per run (from the last run)."""
    times = []
    sent = (None, None)
    for _ in range(runs):
        if before:
            before()
        mark = nginx.lines() if nginx else 0
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
        if nginx:
            time.sleep(0.05)  # the log line is written after the response
            b, r, _ = nginx.sent_since(mark)
            sent = (b, r)
    return {
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "runs": runs,
        "bytes_sent": sent[0],
        "requests": sent[1],
    }


def timed_json(cmd, runs, env):
    """As `timed`, for a command printing JSON with `fetched` (bytes and
    requests, from the last run)."""
    times = []
    doc = {}
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run(cmd, check=False, capture_output=True, env=env)
        times.append(time.perf_counter() - start)
        if out.returncode not in (0, 1):
            raise RuntimeError(out.stderr.decode())
        doc = json.loads(out.stdout)
    fetched = doc.get("fetched") or (doc.get("files") or [{}])[0].get("fetched") or {}
    return {
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "runs": runs,
        "bytes_sent": fetched.get("bytes"),
        "requests": fetched.get("requests"),
    }


class S3s:
    """s3s-fs over `root` (bucket = each folder in it) on a loopback port."""

    def __init__(self, binary, root):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", str(self.port),
             "--access-key", "benchkey", "--secret-key", "benchsecret", str(root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        self.env = dict(
            os.environ,
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{self.port}",
            AWS_ALLOW_HTTP="true",
            AWS_REGION="us-east-1",
            AWS_ACCESS_KEY_ID="benchkey",
            AWS_SECRET_ACCESS_KEY="benchsecret",
        )

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def fmt_time(t):
    s = t["median"]
    show = (lambda x: f"{x * 1000:.1f} ms") if s < 1 else (lambda x: f"{x:.2f} s")
    return f"{show(s)} ({show(t['min'])} to {show(t['max'])})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptload", default="target/release/ptload")
    ap.add_argument("--python", default=sys.executable, help="a python with torch")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--sizes", default="500,2000", help="MB, comma-separated")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default="target/bench-remote")
    ap.add_argument("--out", default=None, help="write the timings here (JSON)")
    ap.add_argument("--keep", action="store_true", help="keep the files")
    ap.add_argument("--s3s", default=None, help="the s3s-fs binary: also read s3:// objects")
    a = ap.parse_args()
    ptload = str(Path(a.ptload).resolve())
    base = Path(a.dir).resolve()
    www = base / "www"
    www.mkdir(parents=True, exist_ok=True)
    results = {}
    nginx = Nginx(a.nginx, www, base / "nginx")
    s3 = S3s(a.s3s, base) if a.s3s else None
    try:
        for mb in [int(s) for s in a.sizes.split(",")]:
            name = f"model-{mb}MB.pt"
            path = www / name
            if not path.exists():
                write_checkpoint(a.python, path, mb)
            size = path.stat().st_size
            url = nginx.url(name)
            download = base / f"download-{name}"

            def remove_download():
                if download.exists():
                    download.unlink()

            def download_then(cmd):
                return [
                    "sh",
                    "-c",
                    f"curl -s -o {download} {url} && " + " ".join(cmd),
                ]

            quiet = ["-q", "--no-progress"]
            rows = {
                "inspect URL": timed([ptload, "inspect", "--json", *quiet, url], a.runs, nginx),
                "scan URL": timed([ptload, "scan", "--json", *quiet, url], a.runs, nginx),
                "curl -o FILE URL": timed(
                    ["curl", "-s", "-o", str(download), url], a.runs, nginx, remove_download
                ),
                "inspect FILE": timed([ptload, "inspect", "--json", *quiet, str(path)], a.runs),
                "scan FILE": timed([ptload, "scan", "--json", *quiet, str(path)], a.runs),
                "load URL": timed(
                    [ptload, "load", "--map-location", "cpu", "--json", *quiet, url],
                    a.runs,
                    nginx,
                ),
                "load --hash URL": timed(
                    [ptload, "load", "--map-location", "cpu", "--hash", "--json", *quiet, url],
                    a.runs,
                    nginx,
                ),
                "curl, then load --hash FILE": timed(
                    download_then(
                        [ptload, "load", "--map-location", "cpu", "--hash", "--json", *quiet,
                         str(download)]
                    ),
                    a.runs,
                    nginx,
                    remove_download,
                ),
                "load --hash FILE (map)": timed(
                    [ptload, "load", "--map-location", "cpu", "--hash", "--json", *quiet,
                     str(path)],
                    a.runs,
                ),
                "load --hash --pread FILE": timed(
                    [ptload, "load", "--map-location", "cpu", "--hash", "--json", "--pread",
                     *quiet, str(path)],
                    a.runs,
                ),
                "inspect --hash FILE (map)": timed(
                    [ptload, "inspect", "--json", "--hash", *quiet, str(path)], a.runs
                ),
                "inspect --hash --pread FILE": timed(
                    [ptload, "inspect", "--json", "--hash", "--pread", *quiet, str(path)], a.runs
                ),
            }
            if s3:
                obj = f"s3://www/{name}"
                rows["inspect s3://"] = timed_json(
                    [ptload, "inspect", "--json", *quiet, obj], a.runs, s3.env
                )
                rows["scan s3://"] = timed_json(
                    [ptload, "scan", "--json", *quiet, obj], a.runs, s3.env
                )
            remove_download()
            results[name] = {"bytes": size, "rows": rows}
            print(f"\n### {name}: {size:,} bytes\n")
            print("| command | time (median; range) | bytes sent | requests |")
            print("| --- | --- | --- | --- |")
            for label, t in rows.items():
                sent = "" if t["bytes_sent"] is None else f"{t['bytes_sent']:,} ({100 * t['bytes_sent'] / size:.3f}%)"
                reqs = "" if t["requests"] is None else str(t["requests"])
                print(f"| `{label}` | {fmt_time(t)} | {sent} | {reqs} |")
            sys.stdout.flush()
            if not a.keep:
                path.unlink()
    finally:
        nginx.stop()
        if s3:
            s3.stop()
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
