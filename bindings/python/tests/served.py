"""nginx on loopback serving the fixtures, for the tests of checkpoints at
URLs (``test_remote.py``, and the GPU upload of a URL in
``test_gpu_simulated.py``). ``PTLOAD_NGINX`` names the binary; ``.ci/run``
sets it."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

from conftest import FILES

NGINX = os.environ.get("PTLOAD_NGINX")
WHY_NOT = (
    "PTLOAD_NGINX is not set: these tests serve the fixtures with nginx on loopback; "
    ".ci/run sets it to the nginx binary"
)


class Nginx:
    """nginx on a loopback port: ``/files/`` serves the fixtures with byte
    ranges, ``/norange/`` the same files without them; an access log of the
    bytes sent per request."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ptload-nginx-")
        # Files a test writes, served under /made/ (readable by nginx's
        # workers, which may run as another user).
        self.www = os.path.join(self.dir, "www")
        os.mkdir(self.www)
        os.chmod(self.dir, 0o755)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        d = self.dir
        config = f"""daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 64; }}
http {{
    log_format ranges '$request_uri $status $bytes_sent "$http_range"';
    access_log {d}/access.log ranges;
    client_body_temp_path {d}/temp;
    proxy_temp_path {d}/temp;
    fastcgi_temp_path {d}/temp;
    uwsgi_temp_path {d}/temp;
    scgi_temp_path {d}/temp;
    server {{
        listen 127.0.0.1:{self.port};
        location /files/ {{ alias {FILES}/; }}
        location /norange/ {{ alias {FILES}/; max_ranges 0; }}
        location /made/ {{ alias {d}/www/; }}
    }}
}}
"""
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(config)
        self.proc = subprocess.Popen([NGINX, "-c", conf, "-p", d])
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.025)
        log = self.log("error.log")
        self.stop()
        raise RuntimeError(f"nginx did not start: {log}")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}/{path}"

    def log(self, name):
        try:
            with open(os.path.join(self.dir, name)) as f:
                return f.read()
        except OSError:
            return ""

    def sent(self, path):
        """Bytes sent for the requests of ``/path``, and their count.

        nginx writes a request's log line after the response has gone out,
        so a client may see the last byte before the line is there: the log
        is read until two readings 20 ms apart agree (at most a second)."""

        def reading():
            lines = [l.split(" ") for l in self.log("access.log").splitlines()]
            mine = [l for l in lines if l[0] == "/" + path]
            return sum(int(l[2]) for l in mine), len(mine)

        last = reading()
        for _ in range(50):
            time.sleep(0.02)
            now = reading()
            if now == last:
                return now
            last = now
        return last

    def stop(self):
        # SIGTERM: the master stops its workers before it exits.
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
