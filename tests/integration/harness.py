"""Shared helpers for integration tests: free ports, temp dirs, starting
infergate processes, and curl as the HTTP client. Standard library only.
Every wait is bounded; every process started is killed at exit."""
import atexit
import fcntl
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

INFERGATE = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("INFERGATE", "build/infergate")
_procs = []
_t0 = time.monotonic()  # checks print their time from here: where a slow test spends it


def scaled(var, default):
    """A count or duration a test may take smaller where it runs slower
    (the ASan build sets these in tests/CMakeLists.txt); printed, so the
    output says what ran."""
    v = os.environ.get(var)
    if v is None:
        return default
    v = type(default)(v)
    print("# %s=%s (default %s)" % (var, v, default), flush=True)
    return v


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


_PORT_DIR = os.path.join(tempfile.gettempdir(), "infergate-test-ports")
_held_ports = []  # lock files, held until this test process exits


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A loopback port for a server the test starts later. Binding port 0
    and closing is not enough: the kernel may hand the same port to the next
    call, to a test running beside this one, or to an outgoing connection
    before the server binds it. So pick below the ephemeral range (no
    outgoing connection takes those) and hold a lock file per port, which
    tests running side by side respect."""
    os.makedirs(_PORT_DIR, exist_ok=True)
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randrange(low, high)
        f = open(os.path.join(_PORT_DIR, str(port)), "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", port))
        except OSError:
            f.close()
            continue
        _held_ports.append(f)
        return port
    raise RuntimeError("no free loopback port found in %d..%d" % (low, high))


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


def stop(p, timeout=30):
    """SIGTERM, then its exit status within timeout (None: killed)."""
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        return None


def test_ca(d):
    """A CA made in d for mutual TLS between regions: the path of its
    certificate, and a function NAME -> (cert, key) that makes a
    certificate it signs for NAME (CN), for server and client use on
    127.0.0.1 and localhost."""
    def sh(*args):
        subprocess.run(args, check=True, capture_output=True, timeout=60)

    ca_key, ca = os.path.join(d, "ca.key"), os.path.join(d, "ca.pem")
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
       "-subj", "/CN=infergate test CA", "-keyout", ca_key, "-out", ca)
    ext = os.path.join(d, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")

    def region_cert(name):
        key, csr, crt = (os.path.join(d, name + s) for s in (".key", ".csr", ".pem"))
        sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj",
           "/CN=" + name, "-keyout", key, "-out", csr)
        sh("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "1",
           "-extfile", ext, "-out", crt)
        return crt, key

    return ca, region_cert


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


def stream_post(port, path, body, headers=None, on_event=None, timeout=120):
    """POSTs body (JSON) to 127.0.0.1:port over HTTP/1.1 and reads the SSE
    answer line by line, calling on_event(n, response) after its n-th data
    event. Returns (status, headers dict, raw body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"content-type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, json.dumps(body), h)
    r = c.getresponse()
    raw, n = b"", 0
    while True:
        line = r.readline()
        if not line:
            break
        raw += line
        if line.startswith(b"data: "):
            n += 1
            if on_event:
                on_event(n, r)
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, raw


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
        at = " [%.1fs]" % (time.monotonic() - _t0)
        if cond:
            self.passed += 1
            print("ok   - " + what + at, flush=True)
        else:
            self.failed += 1
            print("FAIL - " + what + at, flush=True)
        return cond

    def finish(self):
        print("%d passed, %d failed" % (self.passed, self.failed), flush=True)
        sys.exit(1 if self.failed else 0)


def fleet_auth(fleet_key, cluster, kind, region, fields):
    """The auth field of a record or price hash written by hand, signed with
    the fleet key as routing/record_auth.h says."""
    import hashlib
    import hmac
    ns = lambda b: b"%d:%s," % (len(b), b)
    msg = ns(b"infergate-record-v1") + ns(kind.encode()) + ns(cluster.encode()) + ns(region.encode())
    msg += b"".join(ns(k.encode()) + ns(v.encode()) for k, v in sorted(fields.items()))
    return "v1:" + hmac.new(fleet_key.encode(), msg, hashlib.sha256).hexdigest()


def http_request(port, key, path="/v1/completions", body=None, headers=None, timeout=30):
    """One HTTP/1.1 request to a gateway on 127.0.0.1 with an API key: (status,
    lower-cased response headers, body); a completion of two tokens when path
    is /v1/completions and body is None; status 0 when it could not be made."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hd = {"authorization": "Bearer " + key, "content-type": "application/json"}
    hd.update(headers or {})
    try:
        if body is None and path.startswith("/v1/completions"):
            body = {"model": "m", "prompt": [1, 5, 7], "max_tokens": 2, "temperature": 0}
        c.request("POST" if body is not None else "GET", path, json.dumps(body) if body is not None else None, hd)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    except OSError as e:
        return 0, {}, str(e).encode()
    finally:
        c.close()
