"""Shared helpers for integration tests: free ports, temp dirs, starting
infergate processes, and curl as the HTTP client. Standard library only.
Every wait is bounded; every process started is killed at exit."""
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

INFERGATE = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("INFERGATE", "build/infergate")
_procs = []


def _cleanup():
    for p in _procs:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


atexit.register(_cleanup)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))


def tmpdir():
    d = tempfile.mkdtemp(prefix="infergate-it-")
    if os.environ.get("INFERGATE_TEST_KEEP"):  # keep logs and configs to read after a failure
        print("# test files kept in", d)
    else:
        atexit.register(lambda: subprocess.run(["rm", "-rf", d]))
    return d


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gen_model(path, **kw):
    args = [INFERGATE, "model", "gen", "--out", path]
    for k, v in kw.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, timeout=120)
    return path


def spawn(args, log_path, env=None):
    log = open(log_path, "wb")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    _procs.append(p)
    return p


def curl(url, *extra, unix=None, http="--http2-prior-knowledge", data=None, headers=(), timeout=60, check=False):
    """Runs curl; returns (status, headers dict, body bytes)."""
    args = ["curl", "-sS", http, "--max-time", str(timeout), "-D", "-", url]
    if unix:
        args += ["--unix-socket", unix]
    for h in headers:
        args += ["-H", h]
    if data is not None:
        args += ["-H", "content-type: application/json", "--data-binary", "@-"]
    args += list(extra)
    inp = data if isinstance(data, (bytes, type(None))) else json.dumps(data).encode()
    r = subprocess.run(args, input=inp, capture_output=True, timeout=timeout + 10)
    return parse_curl(r.stdout, r.returncode, r.stderr)


def parse_curl(out, rc=0, err=b""):
    if rc != 0 and not out:
        return 0, {}, err
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP") else 0
    hdrs = {}
    for l in lines[1:]:
        if ":" in l:
            k, v = l.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, body


def wait_until(pred, timeout, what, interval=0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


def sse_events(body):
    """The JSON payloads of an SSE body, and whether it ended with [DONE]."""
    events, done = [], False
    for block in body.decode().split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[6:]
        if payload == "[DONE]":
            done = True
        else:
            assert not done, "event after [DONE]"
            events.append(json.loads(payload))
    return events, done


class Checks:
    """Counts checks; prints a closing line ctest and CI can read."""

    def __init__(self):
        self.passed = self.failed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
            print("ok   - " + what, flush=True)
        else:
            self.failed += 1
            print("FAIL - " + what, flush=True)
        return cond

    def finish(self):
        print("%d passed, %d failed" % (self.passed, self.failed), flush=True)
        sys.exit(1 if self.failed else 0)
