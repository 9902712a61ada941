"""infergate serve, the front door of one region, with real workers and real
clients: curl over HTTP/1.1, HTTP/2 cleartext and TLS (ALPN h2), nghttp,
python3-h2 (a client that stops reading), and the official OpenAI Node SDK.
Auth failures, rate limits, token limits, a worker killed mid-stream or
before answering, workers frozen (the response timeout), SIGHUP with a
broken config, SIGTERM drain, metrics and the access log."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import (INFERGATE, Checks, curl, free_port, gen_model, parse_curl, spawn, sse_events, tmpdir,
                     wait_until)

t = Checks()
d = tmpdir()
small = gen_model(os.path.join(d, "small.gguf"), dim=128, layers=2, heads=4, kv_heads=2, ffn=256, vocab=512,
                  ctx=1024, type="q8_0", seed=3)
slow = gen_model(os.path.join(d, "slow.gguf"), dim=512, layers=8, heads=8, kv_heads=4, ffn=1024, vocab=512,
                 ctx=2048, type="q8_0", seed=5)

key_a, key_b, key_admin = "ig-test-key-alpha", "ig-test-key-beta", "ig-test-key-admin"
key_m = "ig-test-key-metered"
key_chatty = "ig-test-key-chatty"
key_hangup = "ig-test-key-hangup"
key_stall = "ig-test-key-stall"
beta = "beta-" + "x" * 59  # the longest name a tenant may have: its limits must hold all the same


def key_hash(k):
    out = subprocess.run([INFERGATE, "key", "hash", k], capture_output=True, text=True, check=True).stdout
    return re.search(r"[0-9a-f]{64}", out).group(0)


r = subprocess.run([INFERGATE, "key", "new"], capture_output=True, text=True)
t.ok(r.returncode == 0 and re.search(r"[0-9a-f]{64}", r.stdout) and "key" in r.stdout, "key new prints a key and hash")

# TLS material for the front door: a self-signed certificate.
cert, keyf = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days",
                "1", "-subj", "/CN=localhost", "-keyout", keyf, "-out", cert], check=True, capture_output=True)

port, tls_port = free_port(), free_port()
access_log = os.path.join(d, "access.log")


def config(tenant_a_keys, rps_a=1000, response_timeout_ms=600000, stream_buffer=65536, small_seqs=8,
           max_body=1572864):
    return """
listen:
  - address: "127.0.0.1:%d"
  - address: "127.0.0.1:%d"
    tls: {cert: "%s", key: "%s"}
workers:
  - model: "%s"
    name: small
    devices: [cpu, cpu]
    threads: 1
    max_seqs: %d
  - model: "%s"
    name: slow
    threads: 1
    max_seqs: 4
    kv_type: q8_0
tenants:
  - name: alpha
    keys: [%s]
    models: ["*"]
    rps: %s
  - name: %s
    keys: ["%s"]
    models: [small]
    rps: 2
  - name: ops
    keys: ["%s"]
    admin: true
    priority: batch
  - name: metered
    keys: ["%s"]
    tpm: 1000
  - name: chatty
    keys: ["%s"]
    tpm: 1000
  - name: hangup
    keys: ["%s"]
    tpm: 1000
  - name: stall
    keys: ["%s"]
    tpm: 1000
limits:
  max_body_bytes: %d
  stream_buffer_bytes: %d
  response_timeout_ms: %d
  idle_timeout_ms: 4000
logging:
  access_log: "%s"
drain_grace_s: 20
runtime_dir: "%s"
""" % (port, tls_port, cert, keyf, small, small_seqs, slow, ", ".join('"%s"' % h for h in tenant_a_keys), rps_a, beta, key_hash(key_b),
       key_hash(key_admin), key_hash(key_m), key_hash(key_chatty), key_hash(key_hangup), key_hash(key_stall), max_body, stream_buffer, response_timeout_ms, access_log, os.path.join(d, "run"))


cfg = os.path.join(d, "gateway.yaml")
open(cfg, "w").write(config([key_hash(key_a)]))
log_path = os.path.join(d, "gateway.log")
g = spawn([INFERGATE, "serve", "--config", cfg], log_path)
URL = "http://127.0.0.1:%d" % port
TLS_URL = "https://localhost:%d" % tls_port
AUTH = "authorization: Bearer " + key_a


def access_logged(pred, what):
    """The access log once pred(its text) holds, within 5 s: a line is
    written as its stream closes, which may come just after the client has
    read the whole answer."""
    def text():
        try:
            return open(access_log).read()
        except FileNotFoundError:
            return ""
    return wait_until(lambda: (lambda x: x if pred(x) else None)(text()), 5, what)


def ready():
    s, _, b = curl(URL + "/readyz", http="--http1.1", timeout=2)
    return s == 200 and json.loads(b)["workers_ready"] == 3


try:
    wait_until(lambda: ready() or g.poll() is not None, 90, "gateway ready with 3 workers")
except AssertionError:
    print(open(log_path).read())
    raise
t.ok(g.poll() is None, "gateway started with three workers ready")
kv_types = re.findall(r"worker: ready: model '(\w+)'.* tokens of (\w+);", open(log_path).read())
t.ok(sorted(kv_types) == [("slow", "q8_0"), ("small", "f16"), ("small", "f16")],
     "workers[].kv_type reaches the workers: %s" % kv_types)

chat = {"model": "small", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}
comp = {"model": "small", "prompt": "hello world", "max_tokens": 8, "temperature": 0}

# --- the same answer over every protocol ---
answers = {}
for name, http, url in [("HTTP/1.1", "--http1.1", URL), ("h2c", "--http2-prior-knowledge", URL),
                        ("TLS h2", "--http2", TLS_URL), ("TLS HTTP/1.1", "--http1.1", TLS_URL)]:
    s, h, b = curl(url + "/v1/completions", "-k", "-w", "\n%{http_version}", http=http, data=comp, headers=[AUTH])
    body, _, ver = b.rpartition(b"\n")
    answers[name] = json.loads(body)["choices"][0]["text"] if s == 200 else None
    t.ok(s == 200 and h.get("x-request-id"), "%s: completion 200 with x-request-id" % name)
    want = {"--http1.1": b"1.1", "--http2-prior-knowledge": b"2", "--http2": b"2"}[http]
    t.ok(ver.strip() == want, "%s: spoken as HTTP %s" % (name, want.decode()))
t.ok(len(set(answers.values())) == 1, "every protocol gives the same greedy text")

# HEAD is GET without the body, on every protocol: over HTTP/2 a body
# after it is a protocol error to the client (curl exit 92). One URL per
# curl: curl 7.88 cannot reuse an h2c prior-knowledge connection (curl#10634).
for name, http, url in [("HTTP/1.1", "--http1.1", URL), ("h2c", "--http2-prior-knowledge", URL),
                        ("TLS h2", "--http2", TLS_URL)]:
    got = []
    for path in ("/healthz", "/v1/models"):
        r = subprocess.run(["curl", "-sS", "-k", "-I", http, "--max-time", "10", "-H", AUTH, url + path],
                           capture_output=True, timeout=20)
        got.append((r.returncode, r.stdout.split(b"\r\n")[0].decode(errors="replace"), r.stderr[-60:]))
    t.ok(all(rc == 0 and " 200" in line for rc, line, _ in got),
         "%s: HEAD /healthz and /v1/models: 200 without a body %s" % (name, got))
heads = [json.loads(x) for x in access_logged(lambda x: x.count('"method":"HEAD","path":"/v1/models"') >= 3,
                                              "the HEAD /v1/models log lines").splitlines()
         if '"method":"HEAD","path":"/v1/models"' in x]
t.ok(len(heads) == 3 and all(x["bytes"] == 0 for x in heads),
     "HEAD: the access log counts no body bytes %s" % [x["bytes"] for x in heads])
s, h, _ = curl(URL + "/healthz", "-X", "POST", http="--http1.1")  # no key: /healthz is public
s2, h2, _ = curl(URL + "/v1/completions", headers=[AUTH])
t.ok(s == 405 and h.get("allow") == "GET, HEAD" and s2 == 405 and h2.get("allow") == "POST",
     "405 names the methods the path takes: %d %s, %d %s" % (s, h.get("allow"), s2, h2.get("allow")))

# A whole answer relayed from the worker keeps its length: an HTTP/1.0
# client gets Content-Length (it can tell a cut body) and keeps its
# connection; HTTP/1.1 and HTTP/2 clients get it too, not chunked.
for http in ("--http1.0", "--http1.1", "--http2-prior-knowledge"):
    s, h, b = curl(URL + "/v1/completions", http=http, data=comp,
                   headers=[AUTH, "connection: keep-alive"] if http == "--http1.0" else [AUTH])
    t.ok(s == 200 and h.get("content-length") == str(len(b)) and "transfer-encoding" not in h
         and h.get("connection") != "close" and json.loads(b)["choices"][0]["text"],
         "%s: a non-streamed completion comes with its content-length (%s for %d bytes, connection %s)"
         % (http, h.get("content-length"), len(b), h.get("connection")))

# HTTP/1.1 streaming: SSE over chunked transfer, keep-alive
s, h, b = curl(URL + "/v1/chat/completions", http="--http1.1", data=dict(chat, stream=True), headers=[AUTH])
events, done = sse_events(b)
t.ok(s == 200 and h.get("transfer-encoding") == "chunked" and done and len(events) >= 2
     and h.get("x-accel-buffering") == "no",
     "HTTP/1.1: streamed chat arrives as SSE over chunked transfer (x-accel-buffering: no, for nginx)")
r = subprocess.run(["curl", "-s", "--http1.1", "-o", "/dev/null", "-o", "/dev/null", "-w", "%{num_connects} ",
                    URL + "/healthz", URL + "/healthz"], capture_output=True, text=True, timeout=20)
t.ok(r.stdout.split() == ["1", "0"], "HTTP/1.1 keep-alive reuses the connection")
# chunked request body
r = subprocess.run(["curl", "-sS", "--http1.1", "-H", "transfer-encoding: chunked", "-H",
                    "content-type: application/json", "-H", AUTH, "--data-binary", json.dumps(comp),
                    URL + "/v1/completions"], capture_output=True, timeout=30)
t.ok(json.loads(r.stdout)["choices"][0]["text"] == answers["HTTP/1.1"], "HTTP/1.1 chunked request body")

# nghttp
body_file = os.path.join(d, "body.json")
open(body_file, "w").write(json.dumps(dict(comp, stream=True)))
r = subprocess.run(["nghttp", "-d", body_file, "-H", "content-type: application/json", "-H", AUTH,
                    URL + "/v1/completions"], capture_output=True, timeout=30)
t.ok(r.returncode == 0 and b"data: [DONE]" in r.stdout, "nghttp streams a completion")

# OpenAI Node SDK
node_dir = os.path.join(os.path.dirname(__file__), "node")
if shutil.which("node") and os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
    r = subprocess.run(["node", os.path.join(node_dir, "chat.js"), URL + "/v1", key_a, "small"],
                       capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"error": r.stderr}
    t.ok(r.returncode == 0 and out.get("text") == out.get("streamed") and out.get("finish") in ("stop", "length")
         and out.get("usage", {}).get("completion_tokens", 0) > 0,
         "OpenAI Node SDK: chat completion, streamed and not, agree: %s" % out)
    t.ok(out.get("refusal", "absent") is None and out.get("null_usage") == out.get("chunks", 0) - 1
         and out.get("model_id") == "small",
         "OpenAI Node SDK: refusal null, usage null on every chunk but the last, models.retrieve")
    t.ok(out.get("refused") == {"status": 400, "code": "unsupported_parameter", "param": "functions"},
         "OpenAI Node SDK: the legacy functions are refused by name, not ignored: %s" % out.get("refused"))
    t.ok(out.get("tools_auto") in ("stop", "length", "tool_calls") and out.get("tools_none") in ("stop", "length"),
         "OpenAI Node SDK: tools are served, with tool_choice auto and none: %s %s"
         % (out.get("tools_auto"), out.get("tools_none")))
    lps = out.get("logprobs") or []
    t.ok(len(lps) == 4 and all(lp <= 0 and n == 2 for _, lp, n in lps),
         "OpenAI Node SDK: chat logprobs with top_logprobs: %s" % lps)
    t.ok(out.get("helper_tokens") == [tok for tok, _, _ in lps] and out.get("helper_text") == "".join(out["helper_tokens"]),
         "OpenAI Node SDK: the stream helper's final completion has each token's logprob once: %s %r"
         % (out.get("helper_tokens"), out.get("helper_text")))
else:
    t.ok(False, "OpenAI Node SDK installed (npm ci in tests/integration/node)")

# --- auth ---
s, _, b = curl(URL + "/v1/completions", http="--http1.1", data=comp)
t.ok(s == 401 and json.loads(b)["error"]["code"] == "missing_api_key", "no key -> 401")
s, _, b = curl(URL + "/v1/completions", http="--http1.1", data=comp, headers=["authorization: Bearer nope"])
t.ok(s == 401 and json.loads(b)["error"]["code"] == "invalid_api_key", "wrong key -> 401")
s, _, b = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, model="slow"),
               headers=["authorization: Bearer " + key_b])
t.ok(s == 403 and "error" in json.loads(b), "model outside the tenant's list -> 403")
s, _, b = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, model="nope"), headers=[AUTH])
t.ok(s == 404 and json.loads(b)["error"]["code"] == "model_not_found", "unknown model -> 404")
s, _, b = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, model="m" * 300), headers=[AUTH])
t.ok(s == 404 and json.loads(b)["error"]["code"] == "model_not_found", "a model name longer than any -> 404")
s, _, b = curl(URL + "/v1/models/small", http="--http1.1", headers=[AUTH])
t.ok(s == 200 and json.loads(b)["id"] == "small" and json.loads(b)["created"] > 1700000000,
     "GET /v1/models/{id} answers the model object")
s, _, b = curl(URL + "/v1/models/sm%61ll", http="--http1.1", headers=[AUTH])
t.ok(s == 200 and json.loads(b)["id"] == "small", "GET /v1/models/{id} decodes the id's escapes (SDKs send / as %2F)")
s, _, b = curl(URL + "/v1/models/nope", http="--http1.1", headers=[AUTH])
t.ok(s == 404 and json.loads(b)["error"]["code"] == "model_not_found", "GET /v1/models/{unknown} -> 404")
s, _, b = curl(URL + "/metrics", http="--http1.1", headers=[AUTH])
t.ok(s == 403, "/metrics with a non-admin key -> 403")

# --- rate limit: tenant beta (a 64-character name) has rps 2 ---
codes = []
for _ in range(6):
    s, h, b = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, max_tokens=1),
                   headers=["authorization: Bearer " + key_b])
    codes.append((s, h.get("retry-after")))
t.ok(any(c == 429 and ra for c, ra in codes) and codes[0][0] == 200,
     "rate limit: a burst past 2 req/s gets 429 with Retry-After (%s)" % [c for c, _ in codes])

# --- a request without a valid key is refused by its head, its body unread ---
def head_only_h1(auth, path="/v1/completions"):
    """An upload's head alone (Expect: 100-continue): what comes back in 5 s."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(("POST %s HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n%s"
               "Expect: 100-continue\r\nContent-Length: 1000000\r\n\r\n" % (path, auth)).encode())
    got = b""
    try:
        while b"\r\n\r\n" not in got:
            data = s.recv(4096)
            if not data:
                break
            got += data
    except socket.timeout:
        pass
    s.close()
    return got.decode("latin-1")
r = head_only_h1("")
t.ok(r.startswith("HTTP/1.1 401 ") and "connection: close" in r.lower() and "100 Continue" not in r,
     "HTTP/1.1: no key -> 401 from the head, no 100 Continue, connection closed: %r" % r[:60])
r = head_only_h1("Authorization: Bearer wrong\r\n")
t.ok(r.startswith("HTTP/1.1 401 "), "HTTP/1.1: a wrong key -> 401 before the body")
r = head_only_h1("", "/v1/completions?key=" + key_a)
t.ok(r.startswith("HTTP/1.1 401 "), "HTTP/1.1: a key in the query (the dashboard's way) is no key for an upload: "
     "401 before the body: %r" % r[:40])
# A field that must be single, sent twice (issue 33): the first of two
# Authorization headers won, and a proxy in front that reads the last
# would authenticate someone else. Both protocols answer 400.
twice = {"authorization": ["Authorization: Bearer %s" % key_a, "Authorization: Bearer %s" % key_b],
         "content-type": ["Content-Type: application/json", "Content-Type: text/plain"]}
got = {}
for name, hs in twice.items():
    for proto in ("--http1.1", "--http2-prior-knowledge"):
        got[(name, proto[2:8])] = curl(URL + "/v1/completions", http=proto, data=b'{"model":"small","prompt":"a"}',
                                       headers=hs + ([AUTH] if name != "authorization" else []))[0]


def raw_h1(head):
    c = socket.create_connection(("127.0.0.1", port), timeout=5)
    c.sendall(head.encode())
    data = c.recv(4096)
    c.close()
    return data.decode("latin-1")


got[("content-length", "http1.")] = int(raw_h1(
    "POST /v1/completions HTTP/1.1\r\nHost: a\r\n%s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
    "Content-Length: 2\r\n\r\n{}" % AUTH).split()[1])
got[("host", "http1.")] = int(raw_h1("GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n%s\r\n\r\n" % AUTH).split()[1])
t.ok(set(got.values()) == {400}, "a field that must be single sent twice is a 400: %s" % got)
r = head_only_h1("Authorization: Bearer %s\r\n" % key_a)
t.ok(r.startswith("HTTP/1.1 100 Continue"), "HTTP/1.1: a valid key gets 100 Continue and sends its body")

def h2_client(timeout):
    """A python-h2 client connection to the gateway, its preface queued."""
    import h2.config
    import h2.connection
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    return s, c


def h2_head(method, path, extra=()):
    return [(":method", method), (":path", path), (":scheme", "http"), (":authority", "127.0.0.1")] + list(extra)


def h2_run(s, c, seen, after, done, secs=10):
    """Reads, hands each event to seen(ev), then after(data) (data None on a
    read timeout), and writes what is due, until done() or secs pass."""
    until = time.time() + secs
    while not done() and time.time() < until:
        try:
            data = s.recv(65536)
        except socket.timeout:
            data = None
        if data == b"":
            break
        for ev in c.receive_data(data or b""):
            seen(ev)
        after(data)
        s.sendall(c.data_to_send())
    s.close()


def head_only_h2(extra):
    """A request's head alone over h2c, with content-length 10; its body
    (10 bytes, not JSON) once it is answered or after 1 s; then a GET
    /healthz on the same connection. Returns the first stream's status,
    whether it came before the body was sent, the healthz status, and
    whether the first stream closed cleanly."""
    import h2.events
    s, c = h2_client(1)
    c.send_headers(1, h2_head("POST", "/v1/completions", [("content-type", "application/json"),
                                                         ("content-length", "10")] + extra))
    s.sendall(c.data_to_send())
    status, ended, reset, st = {}, set(), set(), {"sent": False, "early": False}

    def seen(ev):
        if isinstance(ev, h2.events.ResponseReceived):
            status[ev.stream_id] = dict(ev.headers).get(":status")
            st["early"] = st["early"] or (ev.stream_id == 1 and not st["sent"])
        elif isinstance(ev, h2.events.StreamEnded):
            ended.add(ev.stream_id)
        elif isinstance(ev, h2.events.StreamReset):
            reset.add(ev.stream_id)

    def after(data):
        if not st["sent"] and (1 in status or data is None):
            st["sent"] = True
            c.send_data(1, b"x" * 10, end_stream=True)
            c.send_headers(3, h2_head("GET", "/healthz"), end_stream=True)

    h2_run(s, c, seen, after, lambda: 3 in status)
    return status.get(1), st["early"], status.get(3), 1 in ended and 1 not in reset
t.ok(head_only_h2([]) == ("401", True, "200", True),
     "HTTP/2: no key -> 401 from the head; the body after it is dropped, the connection goes on")
t.ok(head_only_h2([("x-infergate-hop", "1")])[:2] == ("403", True),
     "HTTP/2: a forwarded request from no verified peer -> 403 from the head")
t.ok(head_only_h2([("authorization", "Bearer " + key_a)]) == ("400", False, "200", True),
     "HTTP/2: a valid key waits for its body, then answers it (here: not JSON, 400)")

def head_then_silence_h2():
    """No key, the head alone, and then nothing: the stream answered from
    its head is reset (NO_ERROR) within idle_timeout_ms, not held open."""
    import h2.events
    s, c = h2_client(15)
    c.send_headers(1, h2_head("POST", "/v1/completions", [("content-length", "10")]))
    s.sendall(c.data_to_send())
    t0, closed = time.time(), None
    try:
        while closed is None:
            data = s.recv(65536)
            if not data:
                closed = "connection"
                break
            for ev in c.receive_data(data):
                if isinstance(ev, h2.events.StreamReset):
                    closed = "stream"
            s.sendall(c.data_to_send())
    except socket.timeout:
        pass
    s.close()
    return closed, time.time() - t0
closed, took = head_then_silence_h2()
t.ok(closed in ("stream", "connection") and took < 10,
     "HTTP/2: a stream answered from its head whose body never comes goes within idle_timeout_ms (%s, %.1f s)"
     % (closed, took))

def h2_header_abuse(reps, streams):
    """`streams` POSTs with a valid key whose heads each repeat one 4000-byte
    field `reps` times (HPACK sends the repeats as one-byte references to
    it) and whose bodies never come; then a GET /healthz. Returns the first
    stream's status (or "reset", or "calm" for GOAWAY ENHANCE_YOUR_CALM),
    how many streams were reset, the healthz status, and the reset codes
    seen."""
    import h2.events
    import h2.settings
    s, c = h2_client(2)
    c.local_settings = h2.settings.Settings(client=True, initial_values={
        h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
    big = "v" * 4000
    ids = []
    for i in range(streams):
        ids.append(c.get_next_available_stream_id())
        c.send_headers(ids[-1], h2_head("POST", "/v1/completions", [("authorization", "Bearer " + key_a),
                                                                    ("content-length", "10")]
                                        + [("x-big", big)] * reps))
    s.sendall(c.data_to_send())
    status, reset, codes, hz, goaway = {}, set(), set(), {}, {}

    def seen(ev):
        if isinstance(ev, h2.events.ConnectionTerminated):
            goaway["code"] = int(ev.error_code)
        elif isinstance(ev, h2.events.ResponseReceived):
            status[ev.stream_id] = dict(ev.headers).get(":status")
        elif isinstance(ev, h2.events.StreamReset):
            reset.add(ev.stream_id)
            codes.add(int(ev.error_code))

    def after(data):
        if "id" not in hz and not goaway and (data is None or len(status) + len(reset) >= streams):
            hz["id"] = c.get_next_available_stream_id()
            c.send_headers(hz["id"], h2_head("GET", "/healthz"), end_stream=True)

    h2_run(s, c, seen, after, lambda: hz.get("id") in status or goaway)
    first = "calm" if goaway.get("code") == 11 else "reset" if ids[0] in reset else status.get(ids[0])
    return first, len(reset & set(ids)), status.get(hz.get("id")), codes
first, _, hz, _ = h2_header_abuse(20, 1)  # 80 KB decoded: past max_header_list (64 KiB)
t.ok(first == "431" and hz == "200", "HTTP/2: a head past max_header_list gets 431 (%s, healthz %s)" % (first, hz))
first, _, _, _ = h2_header_abuse(40, 1)  # 160 KB decoded from ~4 KB sent
hz = curl(URL + "/healthz")[0]
t.ok(first == "calm" and hz == 200, "HTTP/2: a head decoding to past twice max_header_list (an HPACK bomb) gets "
     "GOAWAY ENHANCE_YOUR_CALM, not decoded on (%s, healthz %s)" % (first, hz))
first, n_reset, hz, codes = h2_header_abuse(2, 200)  # 8 KB kept by each of 200 open streams
t.ok(n_reset >= 50 and hz == "200" and codes == {7},
     "HTTP/2: the headers a connection's open streams keep are bounded: the rest are refused, to be sent "
     "again (%d of 200 reset, codes %s, healthz %s)" % (n_reset, codes, hz))

def h2_windows():
    """The stream and connection windows the gateway opens for request bodies."""
    s, c = h2_client(1)
    s.sendall(c.data_to_send())
    try:
        for _ in range(4):
            data = s.recv(65536)
            if not data:
                break
            c.receive_data(data)
            s.sendall(c.data_to_send())
    except socket.timeout:
        pass
    s.close()
    return c.remote_settings.initial_window_size, c.outbound_flow_control_window
windows = h2_windows()
t.ok(windows == (1 << 20, 4 * 1572864),
     "HTTP/2: request bodies get a 1 MiB stream window and a max_conn_body connection window, not 64 KiB: %s"
     % (windows,))

# --- a client that stops reading for a while ---
# python3-h2 as the client: it acknowledges data only when told, so the
# stream's window (64 KiB) fills and the rest waits at the gateway, whose
# stream_buffer_bytes is 64 KiB. The worker may not send more than fits:
# before, its 256 KiB window overran the buffer and the stream was reset.
def held_stream(body, hold_s, request_id="held"):
    import h2.config
    import h2.connection
    import h2.events
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    c.send_headers(1, [(":method", "POST"), (":path", "/v1/completions"), (":scheme", "http"),
                       (":authority", "127.0.0.1"), ("content-type", "application/json"),
                       ("authorization", "Bearer " + key_a), ("x-request-id", request_id)])
    c.send_data(1, json.dumps(body).encode(), end_stream=True)
    s.sendall(c.data_to_send())
    got, unacked, held, outcome, until = b"", 0, False, None, time.time() + 60
    while outcome is None and time.time() < until:
        data = s.recv(65536)
        if not data:
            outcome = "closed"
            break
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.DataReceived):
                got += ev.data
                unacked += ev.flow_controlled_length
            elif isinstance(ev, h2.events.StreamEnded):
                outcome = "ended"
            elif isinstance(ev, h2.events.StreamReset):
                outcome = "reset"
        if not held and len(got) >= 60000:
            time.sleep(hold_s)  # the window is spent: the worker goes on generating meanwhile
            held = True
        if held and unacked:
            c.acknowledge_received_data(unacked, 1)
            unacked = 0
        s.sendall(c.data_to_send())
    s.close()
    return outcome, got, held


long_stream = {"model": "small", "prompt": "hello", "max_tokens": 900, "temperature": 0, "stream": True,
               "ignore_eos": True}
outcome, got, held = held_stream(long_stream, 2.0, "held-2s")
events, done = sse_events(got) if outcome == "ended" else ([], False)
_, _, b = curl(URL + "/v1/completions", data=long_stream, headers=[AUTH])
read_at_once, _ = sse_events(b)
text = lambda evs: "".join(e["choices"][0]["text"] for e in evs if e.get("choices"))
t.ok(held and outcome == "ended" and done and text(events) == text(read_at_once) and len(got) > 100000,
     "a client that stops reading for 2 s gets its whole stream after (%s, %d events, %d bytes)"
     % (outcome, len(events), len(got)))
# The events piled up meanwhile came on in frames that cut them anywhere:
# the log still counts its events (a token each, but for those whose bytes
# wait for the rest of their character), all but the last.
line = [json.loads(x) for x in access_logged(lambda x: '"held-2s"' in x, "the held stream logged").splitlines()
        if '"held-2s"' in x]
t.ok(line and line[-1]["tokens"] == len(events) - 1, "the held stream's tokens, counted in its events: %s of %d"
     % (line[-1]["tokens"] if line else None, len(events) - 1))

# --- tokens per minute: tenant metered has 1000 ---
# A request is charged its prompt (4 bytes a token) and max_tokens up
# front. An answer that is an error gives all of it back: three requests
# of 400 each on a bucket of 1000 all reach the worker (and get its 400).
METERED = "authorization: Bearer " + key_m
bad = {"model": "small", "prompt": [1, 99999], "max_tokens": 400}
codes = [curl(URL + "/v1/completions", http="--http1.1", data=bad, headers=[METERED])[0] for _ in range(3)]
t.ok(codes == [400, 400, 400], "tpm: an error answer gives its charge back: %s" % codes)
# What max_tokens over-counted comes back, the prompt's estimate does not:
# 640 token ids in ~3.2 KB (~800 tokens charged), max_tokens 1.
heavy = {"model": "small", "prompt": [1] + [100] * 639, "max_tokens": 1, "temperature": 0}
codes = [curl(URL + "/v1/completions", http="--http1.1", data=heavy, headers=[METERED])[0] for _ in range(2)]
t.ok(codes == [200, 429], "tpm: a prompt's tokens stay charged: %s" % codes)
# A chat request without max_tokens is charged a guess (256); the worker's
# bound is the context (1024 here). What it generates past the guess is
# charged when it ends: the bucket goes into debt and the next waits.
# Before, three such requests of ~970 tokens each passed on a 1000 budget.
CHATTY = "authorization: Bearer " + key_chatty
open_ended = {"model": "small", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
got = [curl(URL + "/v1/chat/completions", http="--http1.1", data=open_ended, headers=[CHATTY]) for _ in range(2)]
used = json.loads(got[0][2])["usage"]["completion_tokens"] if got[0][0] == 200 else 0
t.ok([g_[0] for g_ in got] == [200, 429] and used > 900,
     "tpm: tokens generated past the estimate are charged (%d completion tokens, then %d)" % (used, got[1][0]))

# A client that hangs up on a request sent on keeps the charge for its
# prompt and for what it could have got in the time: the bucket is no
# longer full, so the next asking for (nearly) all of it waits. Before,
# the whole charge came back and tpm bounded nothing for a client that
# hung up.
HANGUP = "authorization: Bearer " + key_hangup
long_one = {"model": "slow", "prompt": "hi", "max_tokens": 1000, "ignore_eos": True}
r = subprocess.run(["curl", "-sS", "--http1.1", "--max-time", "0.5", "-H", "content-type: application/json",
                    "-H", HANGUP, "--data-binary", json.dumps(long_one), URL + "/v1/completions"],
                   capture_output=True, timeout=30)
s2, _, _ = curl(URL + "/v1/completions", http="--http1.1", data=dict(long_one, max_tokens=990), headers=[HANGUP])
t.ok(r.returncode == 28 and s2 == 429, "tpm: a client that hangs up is charged (curl %d, then %d)" % (r.returncode, s2))

# --- a worker killed mid-stream ---
def stream_proc(model, n):
    body = {"model": model, "prompt": "hello", "max_tokens": n, "temperature": 0, "stream": True,
            "ignore_eos": True}
    return subprocess.Popen(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "120", "-H", AUTH, "-H",
                             "content-type: application/json", "--data-binary", json.dumps(body),
                             URL + "/v1/completions"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def worker_pids():
    pids = {}
    for line in open(log_path):
        m = re.search(r"worker (\d+) \(model (\w+), device \w+\) started: pid (\d+)", line)
        if m:
            pids[int(m.group(1))] = int(m.group(3))
    return pids


victim = stream_proc("slow", 1500)
bystander = stream_proc("small", 300)
# Killed once its first token is out: a fixed sleep let a fast CPU finish
# the whole stream first (curl's --max-time bounds the read).
first = victim.stdout.readline()
slow_pid = worker_pids()[2]
os.kill(slow_pid, 9)
out, _ = victim.communicate(timeout=60)
out = first + out
t.ok(b"upstream_failed" in out or victim.returncode != 0,
     "killed worker: its client gets an error event or a reset, not a hang")
out, _ = bystander.communicate(timeout=120)
events, done = sse_events(out)
t.ok(done and bystander.returncode == 0, "the other worker's stream finished")
back = wait_until(lambda: worker_pids().get(2) != slow_pid and ready(), 20, "killed worker back")
t.ok(back, "the killed worker is back and ready within seconds")
t.ok(re.search(r"worker 2 .*killed by signal 9", open(log_path).read()) is not None,
     "the supervisor logged the worker's exit status")
s, _, _ = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, model="slow"), headers=[AUTH])
t.ok(s == 200, "the restarted worker serves")

# --- a worker that dies before answering: the request moves to the other ---
# Worker 0 is frozen, so that the next request (both idle: worker 0 first)
# waits on it with nothing answered, then killed.
small_pid = worker_pids()[0]
os.kill(small_pid, signal.SIGSTOP)
mover = subprocess.Popen(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "60", "-D", "-", "-H", AUTH, "-H",
                          "content-type: application/json", "--data-binary", json.dumps(comp),
                          URL + "/v1/completions"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
time.sleep(0.5)
os.kill(small_pid, signal.SIGKILL)
s, h, b = parse_curl(mover.communicate(timeout=60)[0])
t.ok(s == 200 and h.get("x-infergate-worker") == "1" and json.loads(b)["choices"][0]["text"] == answers["h2c"],
     "a worker killed before answering: the request is retried on the other worker: %s %s" % (s, h))
wait_until(lambda: worker_pids().get(0) != small_pid and ready(), 20, "killed small worker back")

# --- a tenant with priority: batch is batch whatever its requests ask ---
# The slow worker's four slots taken, the ops tenant's request waits in its
# queue, where the worker's own stats say which priority it has.
slow_sock = os.path.join(d, "run", "worker-2.sock")


def slow_stats():
    s, _, b = curl("http://localhost/internal/stats", unix=slow_sock, timeout=5)
    return json.loads(b) if s == 200 else {}


hogs = [stream_proc("slow", 1500) for _ in range(4)]
wait_until(lambda: slow_stats().get("running") == 4, 30, "four streams on the slow worker")
asks_interactive = subprocess.Popen(
    ["curl", "-sS", "--http2-prior-knowledge", "--max-time", "60", "-o", "/dev/null", "-H",
     "authorization: Bearer " + key_admin, "-H", "x-infergate-priority: interactive", "-H",
     "content-type: application/json", "--data-binary", json.dumps(dict(comp, model="slow", max_tokens=2)),
     URL + "/v1/completions"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
st = wait_until(lambda: (lambda x: x if x.get("queued") == 1 else None)(slow_stats()), 30, "the ops request queued")
t.ok(st.get("queued_batch") == 1, "a tenant with priority: batch queues as batch, though it asked interactive: %s"
     % {k: st.get(k) for k in ("queued", "queued_batch", "running")})
for pr in hogs:
    pr.kill()
    pr.wait()
asks_interactive.communicate(timeout=60)

# --- metrics, health, access log ---
made_up = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, model="made-up-model-7"),
               headers=[AUTH])[0]
# a body past the worker's own default (1 MiB) within the gateway's limit
# (1.5 MiB) reaches the model: the prompt of 400k token ids is too long
# for its context, which is the worker's answer, not a 413
s, _, b = curl(URL + "/v1/completions", data=dict(comp, prompt=[5] * 400000), headers=[AUTH])
t.ok(s == 400 and b"context_length_exceeded" in b,
     "a 1.2 MB body the gateway takes is read by its worker too: %d %r" % (s, b[:160]))
# residency asked of a gateway with no region (so no tags) cannot be met
s, _, b = curl(URL + "/v1/completions", data=comp, headers=[AUTH, "x-infergate-residency: eu"])
t.ok(s == 400 and b"bad_residency" in b, "residency asked of a gateway without a region: 400 (%d %r)" % (s, b[:120]))
# a request the HTTP server answers itself (an upload past max_body)
big = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, prompt="x" * (1 << 21)), headers=[AUTH])[0]


def tpot_count():
    s_, _, b_ = curl(URL + "/metrics", http="--http1.1", headers=["authorization: Bearer " + key_admin])
    c = re.search(r'^infergate_tpot_seconds_count\{model="small"\} (\d+)', b_.decode(), re.M)
    return int(c.group(1)) if c else 0


# TPOT is time between tokens: a one-token stream has none, usage chunk or not
# (its event once counted as a token).
tp0 = tpot_count()
one = curl(URL + "/v1/completions", data=dict(comp, max_tokens=1, stream=True,
                                               stream_options={"include_usage": True}), headers=[AUTH])[0]
tp1 = tpot_count()
three = curl(URL + "/v1/completions", data=dict(comp, max_tokens=3, ignore_eos=True, stream=True,
                                                 stream_options={"include_usage": True}), headers=[AUTH])[0]
tp2 = tpot_count()
t.ok(one == 200 and three == 200 and tp1 == tp0 and tp2 == tp0 + 1,
     "a one-token stream with include_usage records no TPOT, a three-token one records one (%d -> %d -> %d)"
     % (tp0, tp1, tp2))
s, _, b = curl(URL + "/metrics", http="--http1.1", headers=["authorization: Bearer " + key_admin])
m = b.decode()
t.ok(big == 413 and 'infergate_http_refused_total{status="413"} ' in m,
     "an answer of the HTTP server's own (413) is counted in /metrics")
n_refused = [int(l.split()[-1]) for l in m.splitlines()
             if l.startswith('infergate_http_refused_total{status="refused_stream"} ')]
t.ok(n_refused and n_refused[0] >= 50,
     "HTTP/2 streams refused for the headers they held are counted in /metrics: %s" % n_refused)
t.ok('infergate_http_refused_total{status="enhance_your_calm"} 1' in m,
     "the HPACK bomb's connection, told ENHANCE_YOUR_CALM, is counted in /metrics")
refused_lines = [json.loads(l) for l in access_logged(lambda x: '"status":413,"refused_by"' in x,
                                                       "the 413 logged").splitlines() if '"refused_by"' in l]
t.ok(any(l["status"] == 413 and l["method"] == "POST" and l["path"] == "/v1/completions"
         and l["protocol"] == "HTTP/1.1" for l in refused_lines),
     "... and logged, with what was read of it: %s" % refused_lines[-1:])
t.ok(any(l["status"] == 0 and l.get("h2_error") == "REFUSED_STREAM" and l["protocol"] == "HTTP/2"
         for l in refused_lines), "... refused HTTP/2 streams too")
t.ok(made_up == 404 and "made-up-model-7" not in m and 'model="-",tenant="alpha",status="404"' in m,
     "a model name a client made up starts no metric series of its own (counted under model \"-\")")
t.ok(s == 200 and 'infergate_requests_total{model="small",tenant="alpha",status="200"' in m
     and "infergate_ttft_seconds_bucket" in m and "infergate_workers_up 3" in m
     and "infergate_upstream_errors_total" in m and "infergate_worker_queue_depth" in m, "/metrics has the families")
s, _, _ = curl(URL + "/healthz", http="--http1.1")
t.ok(s == 200, "/healthz 200")
lines = [json.loads(l) for l in open(access_log) if l.strip()]
t.ok(len(lines) >= 10 and all(k in lines[-1] for k in ("request_id", "tenant", "model", "target", "status", "bytes",
                                                         "ttft_ms", "duration_ms", "tokens")),
     "one JSON access-log line per request with the fields")
s, _, _ = curl(URL + "/healthz", http="--http1.1", headers=["x-request-id: trace-me-123"])
logged = access_logged(lambda x: '"trace-me-123"' in x, "the request id logged")
t.ok(any(l.get("request_id") == "trace-me-123" for l in (json.loads(x) for x in logged.splitlines() if x.strip())),
     "x-request-id from the client is logged")
s, _, _ = curl(URL + "/dashboard?key=" + key_admin, http="--http1.1")
logged = access_logged(lambda x: "/dashboard?key=" in x, "the dashboard request logged")
t.ok(s == 200 and key_admin not in logged and "/dashboard?key=REDACTED" in logged,
     "the dashboard's ?key= is not written to the access log (%d)" % s)
# A key in any query form a client might use (issue 33): by name, without
# regard to case, percent-encoded, or under a name no list has but shaped
# as `infergate key` makes them. Each is answered (401: none is where the
# gateway looks for a key) and logged with the key left out.
forms = ["/v1/models?x=1&key=%s", "/v1/models?KEY=%s", "/v1/models?%%6bey=%s", "/v1/models?api_key=%s",
         "/v1/models?token=%s", "/v1/models?Access_Token=%s", "/v1/models?k%%45y=%s&marker=q-forms"]
secret = "ig-" + "Q" * 43
for i, f in enumerate(forms):
    curl(URL + f % secret, http="--http1.1" if i % 2 else "--http2-prior-knowledge")
logged = access_logged(lambda x: "q-forms" in x, "the query forms logged")
paths = [json.loads(x)["path"] for x in logged.splitlines() if x.strip() and "/v1/models?" in x]
t.ok(secret not in logged and sum("REDACTED" in p_ for p_ in paths) >= len(forms),
     "a key in any query form (%s) is absent from the access log: %s" % (", ".join(forms), paths[-len(forms):]))
# The dashboard in a browser (issue 33): a login form whose POST sets the
# admin key as a cookie (HttpOnly, SameSite=Strict, /dashboard only); every
# page says no scripts, frames, referrers or caches.
PAGE_HEADERS = {"content-security-policy": "default-src 'none'", "x-frame-options": "DENY",
                "referrer-policy": "no-referrer", "cache-control": "no-store"}
page_ok = lambda h: all(h.get(k, "").startswith(v) for k, v in PAGE_HEADERS.items())
s, h, b = curl(URL + "/dashboard", http="--http1.1")
t.ok(s == 401 and b"<form method=post action=/dashboard/login>" in b and "type=password" in b.decode()
     and page_ok(h), "/dashboard without a key: the login form, with the page's headers (%d, %s)"
     % (s, {k: h.get(k) for k in PAGE_HEADERS}))
s, h, _ = curl(URL + "/dashboard/login", "--data-urlencode", "key=" + key_admin, http="--http1.1")
cookie = h.get("set-cookie", "")
t.ok(s == 303 and h.get("location") == "/dashboard" and cookie.startswith("infergate_dashboard=")
     and all(a_ in cookie for a_ in ("HttpOnly", "SameSite=Strict", "Path=/dashboard", "Secure")),
     "an admin key posted to the login form: 303 to /dashboard with the key in a cookie (%d %s)" % (s, cookie))
jar = "cookie: " + cookie.split(";")[0]
s, h, b = curl(URL + "/dashboard", headers=[jar])
t.ok(s == 200 and b"<table>" in b and page_ok(h) and b"url=/dashboard" in b and key_admin.encode() not in b,
     "the cookie opens the dashboard, over HTTP/2 too, its refresh without a key in the URL (%d)" % s)
s, h, _ = curl(URL + "/dashboard", http="--http1.1", headers=["cookie: a=1; " + jar.split(": ")[1] + "; b=2"])
t.ok(s == 200, "... among other cookies (%d)" % s)
s_user = curl(URL + "/dashboard/login", "--data-urlencode", "key=" + key_a, http="--http1.1")[0]
s_bad, h_bad, _ = curl(URL + "/dashboard/login", "--data-urlencode", "key=ig-not-a-key", http="--http1.1")
s_bad_cookie = curl(URL + "/dashboard", http="--http1.1", headers=["cookie: infergate_dashboard=ig-not-a-key"])[0]
s_get = curl(URL + "/dashboard/login", http="--http1.1")[0]
s_big = curl(URL + "/dashboard/login", "--data-binary", "key=" + "x" * 5000, http="--http1.1")[0]
t.ok((s_user, s_bad, s_bad_cookie, s_get, s_big) == (403, 401, 401, 405, 413) and "Max-Age=0" in h_bad.get("set-cookie", ""),
     "a tenant's key is no admin's (403), a bad key or cookie is refused (401, the cookie cleared), the form "
     "takes POST alone (405) and no body larger than a key (413): %s" % [s_user, s_bad, s_bad_cookie, s_get, s_big])
s, h, _ = curl(URL + "/dashboard?key=" + key_admin, http="--http1.1")
t.ok(s == 200 and h.get("set-cookie", "").startswith("infergate_dashboard=") and page_ok(h),
     "a link with ?key= (made before the form) still opens the page, and moves the key to the cookie")
mode = os.stat(access_log).st_mode & 0o777
t.ok(mode & 0o007 == 0 and mode & ~0o640 == 0, "the access log is created 0640, not for other users (%o)" % mode)

# A path that is not UTF-8 is answered (404) and logged, its bytes escaped
def raw_h2_get(path):
    import h2.config
    import h2.connection
    import h2.events
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    c.send_headers(1, [(b":method", b"GET"), (b":path", path), (b":scheme", b"http"), (b":authority", b"a"),
                       (b"authorization", ("Bearer " + key_a).encode())], end_stream=True)
    s.sendall(c.data_to_send())
    status, body, done = None, b"", False
    while not done:
        data = s.recv(65536)
        if not data:
            break
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = dict(ev.headers).get(b":status")
            elif isinstance(ev, h2.events.DataReceived):
                body += ev.data
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                done = True
        s.sendall(c.data_to_send())
    s.close()
    return status, body
st, body = raw_h2_get(b"/v1/models/\xff\xfeabc")
logged = access_logged(lambda x: "xFEabc" in x, "the path that is not UTF-8 logged")
t.ok(st == b"404" and json.loads(body)["error"]["code"] == "model_not_found"
     and '"path":"/v1/models/\\\\xFF\\\\xFEabc"' in logged,
     "a path that is not UTF-8: 404, and logged with its bytes escaped (%r)" % (st,))

# --- SIGHUP: a broken config keeps the old one; a good one adds a key ---
# (and the access log, renamed as logrotate does, is opened again)
os.rename(access_log, access_log + ".1")
open(cfg, "w").write("listen: [\n  bad yaml")
r = subprocess.run([INFERGATE, "serve", "--check", "--config", cfg], capture_output=True, text=True, timeout=30)
t.ok(r.returncode == 1 and cfg in r.stderr, "serve --check: a broken config is said, exit 1: %s" % r.stderr.strip())
g.send_signal(1)
time.sleep(0.5)
s, _, _ = curl(URL + "/v1/completions", http="--http1.1", data=comp, headers=[AUTH])
t.ok(s == 200 and g.poll() is None and "reload failed" in open(log_path).read(),
     "SIGHUP with a broken config: still serving on the old config")
t.ok(os.path.exists(access_log) and access_logged(lambda x: '"status":200' in x, "a line in the new access log"),
     "SIGHUP opens the access log again: the request after it is in the new file")
key_c = "ig-test-key-gamma"
open(cfg + ".nomodel", "w").write(config([key_hash(key_a)]).replace(small, small + ".gone"))
r = subprocess.run([INFERGATE, "serve", "--check", "--config", cfg + ".nomodel"], capture_output=True, text=True,
                   timeout=30)
t.ok(r.returncode == 1 and "workers[].model %s.gone: No such file" % small in r.stderr,
     "serve --check: a model file that is not there: %s" % r.stderr.strip())
open(cfg, "w").write(config([key_hash(key_a), key_hash(key_c)]))
r = subprocess.run([INFERGATE, "serve", "--check", "--config", cfg], capture_output=True, text=True, timeout=30)
t.ok(r.returncode == 0 and "is valid: 2 listeners, 2 workers, 7 tenants" in r.stdout,
     "serve --check: a good config, exit 0: %s" % (r.stdout + r.stderr).strip())


def served_cn():
    import ssl
    pem = ssl.get_server_certificate(("127.0.0.1", tls_port))
    r = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=pem, capture_output=True, text=True)
    return r.stdout.strip()


# the TLS listener's certificate renewed in place, as certbot does: the
# reload serves the new one (it took a restart, which drains)
cn_before = served_cn()
subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days",
                "1", "-subj", "/CN=renewed.localhost", "-keyout", keyf, "-out", cert], check=True, capture_output=True)
g.send_signal(1)
ok = wait_until(lambda: curl(URL + "/v1/models", http="--http1.1", headers=["authorization: Bearer " + key_c],
                             timeout=5)[0] == 200, 10, "new key accepted after reload")
t.ok(ok, "SIGHUP with a good config: the new key works without a restart")
cn_after = served_cn()
t.ok("CN = localhost" in cn_before and "CN = renewed.localhost" in cn_after,
     "SIGHUP: a certificate renewed in place is served without a restart (%s -> %s)" % (cn_before, cn_after))
t.ok("kept as started" not in open(log_path).read(), "a reload of keys alone names nothing kept as started")
# A region section is kept as started: a tenant given a residency with
# one added in the same edit would be served here, with no tags to hold
# it to. The reload is refused.
good = config([key_hash(key_a), key_hash(key_c)])
open(cfg, "w").write(good.replace("    tpm: 1000\n  - name: stall", "    tpm: 1000\n    residency: [eu]\n"
                                  "  - name: stall", 1) + "region: {name: solo, tags: [eu]}\n")
r = subprocess.run([INFERGATE, "serve", "--check", "--config", cfg], capture_output=True, text=True, timeout=30)
g.send_signal(1)
try:
    refused = wait_until(lambda: "reload refused: tenant 'hangup' has a residency" in open(log_path).read(), 10,
                         "the reload refused")
except AssertionError:
    refused = False
t.ok(r.returncode == 0 and refused, "SIGHUP adding a region and a tenant's residency: refused, the file valid "
     "(check rc %d)" % r.returncode)
open(cfg, "w").write(good)
# A larger body limit by reload holds for the workers started before it:
# a 2.4 MB body reaches the model (whose context is too short for it).
open(cfg, "w").write(config([key_hash(key_a), key_hash(key_c)], max_body=4 << 20))
g.send_signal(1)
wait_until(lambda: open(log_path).read().count("reloaded") >= 2, 10, "reload raising max_body_bytes")
s, _, b = curl(URL + "/v1/completions", data=dict(comp, prompt=[5] * 800000), headers=[AUTH])
t.ok(s == 400 and b"context_length_exceeded" in b,
     "a body limit raised by SIGHUP holds for running workers: 2.4 MB -> %d %r" % (s, b[:120]))
# `pkill -HUP infergate` reaches the workers too: they carry on
before, deaths = worker_pids(), open(log_path).read().count("killed by signal")
for pid in before.values():
    os.kill(pid, signal.SIGHUP)
time.sleep(0.5)
t.ok(worker_pids() == before and all(os.path.exists("/proc/%d" % pid) for pid in before.values())
     and open(log_path).read().count("killed by signal") == deaths, "workers ignore SIGHUP")
# What a reload cannot apply is named, and a stream buffer too small for
# the upstream window set at start is kept at 4 x that window (a smaller
# one would reset the streams of clients that merely read slowly).
open(cfg, "w").write(config([key_hash(key_a), key_hash(key_c)], stream_buffer=16384, small_seqs=6))
g.send_signal(1)
wait_until(lambda: "kept as started until a restart: workers" in open(log_path).read(), 10, "reload with workers")
t.ok("stream_buffer_bytes 16384 is below 4 x the upstream window of 16384 bytes set at start; keeping 65536"
     in open(log_path).read(), "a reload naming a changed worker and keeping the stream buffer at 4 x the window")
outcome, got, held = held_stream(long_stream, 1.0)
events, done = sse_events(got) if outcome == "ended" else ([], False)
t.ok(held and outcome == "ended" and done, "after that reload a client that stops reading for 1 s still gets its "
     "whole stream (%s, %d events)" % (outcome, len(events)))

# --- a worker that stops answering: limits.response_timeout_ms ---
# Reloaded down to 1.5 s. The slow worker is frozen (SIGSTOP: its socket
# open, nothing sent; without regions nothing PINGs it) with a stream
# running: the stream ends with an error event. Small worker 0 is frozen
# too, and a request sent to it (both idle: worker 0 first) gets a 504: a
# worker that had the request all along is not worth a second try on
# worker 1.
open(cfg, "w").write(config([key_hash(key_a), key_hash(key_c)], response_timeout_ms=1500))
g.send_signal(1)
wait_until(lambda: open(log_path).read().count("reloaded") >= 4, 10, "fourth reload")
body = {"model": "slow", "prompt": "hello", "max_tokens": 2000, "temperature": 0, "stream": True, "ignore_eos": True}
stalled = subprocess.Popen(["curl", "-sS", "-N", "--http2-prior-knowledge", "--max-time", "30", "-H", AUTH, "-H",
                            "content-type: application/json", "--data-binary", json.dumps(body),
                            URL + "/v1/completions"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
# its first token read, so the stream is surely under way when frozen
first_chunk = os.read(stalled.stdout.fileno(), 65536)
slow_pid, small_pid = worker_pids()[2], worker_pids()[0]
os.kill(slow_pid, signal.SIGSTOP)
os.kill(small_pid, signal.SIGSTOP)
try:
    # a prompt no worker holds: the cache-aware choice (issue 30) would
    # send the repeated one to the worker whose prefix cache has it
    s, _, b = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, prompt="frozen"), headers=[AUTH],
                   timeout=30)
    t.ok(s == 504 and json.loads(b)["error"]["code"] == "upstream_timeout",
         "a frozen worker: a request waiting on it gets 504 upstream_timeout, not a retry: %s %s" % (s, b[:200]))
    # The 504 keeps what the request could have had in the time it held
    # the worker (as a hang-up does): a long answer not streamed is a 504
    # on demand, and each gave its whole charge back, so tpm bounded nothing.
    STALL = "authorization: Bearer " + key_stall
    os.kill(worker_pids()[1], signal.SIGSTOP)  # both small workers frozen
    s, _, _ = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, max_tokens=900), headers=[STALL],
                   timeout=30)
    # the whole minute's worth (with its prompt, more): admitted only into a full bucket
    s2, _, _ = curl(URL + "/v1/completions", http="--http1.1", data=dict(comp, max_tokens=990), headers=[STALL],
                    timeout=30)
    t.ok(s == 504 and s2 == 429, "tpm: a 504 for a stalled worker keeps its charge (%d, then %d)" % (s, s2))
    out, _ = stalled.communicate(timeout=40)
    events, _ = sse_events(first_chunk + out)
    t.ok(stalled.returncode == 0 and len(events) > 1 and events[-1].get("error", {}).get("code") == "upstream_timeout",
         "a frozen worker: its stream ends with an upstream_timeout error event (rc %s, %d events, last %s)"
         % (stalled.returncode, len(events), events[-1] if events else None))
finally:
    os.kill(slow_pid, signal.SIGCONT)
    os.kill(small_pid, signal.SIGCONT)
    os.kill(worker_pids()[1], signal.SIGCONT)
t.ok(wait_until(ready, 20, "workers ready again"), "the workers, thawed, are ready again")
# The drain below holds a worker still for as long as its checks take:
# response_timeout_ms back to its default, so a slow run cannot end that
# stream with upstream_timeout.
open(cfg, "w").write(config([key_hash(key_a), key_hash(key_c)]))
g.send_signal(1)
wait_until(lambda: open(log_path).read().count("reloaded") >= 5, 10, "fifth reload")

# --- SIGTERM drains ---
# a connection accepted before the drain whose protocol is only known after
# it: it gets a GOAWAY taking no stream, as every other connection does
import h2.config
import h2.connection
import h2.events
late = socket.create_connection(("127.0.0.1", port), timeout=5)
inflight = stream_proc("slow", 200)
# streaming: SIGTERM comes while it is in flight (read unbuffered: communicate() reads the fd),
# and its worker is held still meanwhile (well within response_timeout_ms), whatever the build's speed
first_chunk = os.read(inflight.stdout.fileno(), 65536)
slow_pid = worker_pids()[2]
os.kill(slow_pid, signal.SIGSTOP)
g.send_signal(15)
wait_until(lambda: "infergate: signal 15: draining" in open(log_path).read(), 10, "the drain begun")
lc = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
lc.initiate_connection()
lc.send_headers(1, [(":method", "GET"), (":path", "/healthz?late=1"), (":scheme", "http"), (":authority", "x")],
                end_stream=True)
late.sendall(lc.data_to_send())
late_events = []
try:
    while True:
        data = late.recv(65536)
        if not data:
            break
        late_events += lc.receive_data(data)
except (socket.timeout, OSError):
    pass
late.close()
os.kill(slow_pid, signal.SIGCONT)  # before response_timeout_ms (1.5 s) could end the in-flight stream
goaway = [e for e in late_events if isinstance(e, h2.events.ConnectionTerminated)]
answered = [e for e in late_events if isinstance(e, h2.events.ResponseReceived)]
time.sleep(0.2)  # its access-log line, had it been taken, is written as the stream closes
t.ok(goaway and goaway[0].last_stream_id == 0 and not answered and "late=1" not in open(access_log).read(),
     "draining: a connection whose protocol came after the drain gets GOAWAY(0), its request not even taken (%s)"
     % [type(e).__name__ for e in late_events])
s, _, _ = curl(URL + "/healthz", http="--http1.1", timeout=3)
t.ok(s == 0, "draining: new connections are refused")
out, _ = inflight.communicate(timeout=120)
events, done = sse_events(first_chunk + out)
t.ok(done and events and events[-1]["choices"][0]["finish_reason"] == "length",
     "draining: the in-flight stream finished")
try:
    rc = g.wait(timeout=60)
except subprocess.TimeoutExpired:
    rc = None
t.ok(rc == 0, "gateway exits 0 after draining and stopping its workers")
t.ok("stopped" in open(log_path).read(), "gateway logged its stop")
t.finish()
