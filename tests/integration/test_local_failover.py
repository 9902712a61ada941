"""With routing on (a region section, here with no Redis and no peers), a
local worker that fails before answering is retried on another local
worker, as it is without one. The region is one routing candidate however
many workers it has: the request used to move on to the next region, and
with none left was answered 503 while a sibling worker stood ready. So is
a request a local worker turns away unstarted (its KV cache too small,
503; its queue full, 429, by the same path): the sibling has its own.

The gateway runs with the smallest stream buffer (4 KiB): a client that
reads slowly a stream whose events are larger than a quarter of it
(top_logprobs) still gets the whole stream.

Who may stand in for a worker (issue 33): a process that takes a dead
worker's socket and answers its stats as a ready worker would is not the
process the supervisor started (SO_PEERCRED), is never called ready and
gets no request; a runtime_dir others may write to is refused at start."""
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, parse_curl, spawn, stop, tmpdir, wait_until
from fault_region import FaultRegion

t = Checks()
d = tmpdir()
# 2 KiB of KV cache a token: worker 0's 1 MiB holds 512 of them, fewer
# than the context; worker 1's 4 MiB holds all 1024.
model = gen_model(os.path.join(d, "m.gguf"), dim=128, layers=4, heads=4, kv_heads=4, ffn=256, vocab=512, ctx=1024,
                  type="q8_0", seed=9)
port = free_port()
access_log = os.path.join(d, "access.log")
cfg = os.path.join(d, "gateway.yaml")
open(cfg, "w").write("""
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 4, kv_cache_mb: 1}
  - {model: "%s", name: m, threads: 1, max_seqs: 4, kv_cache_mb: 4}
region: {name: solo}
limits: {stream_buffer_bytes: 4096}
logging: {access_log: "%s"}
stats_interval_ms: 100
runtime_dir: "%s"
""" % (port, model, model, access_log, os.path.join(d, "run")))
log_path = os.path.join(d, "gateway.log")
g = spawn([INFERGATE, "serve", "--config", cfg], log_path)
url = "http://127.0.0.1:%d" % port


def ready():
    s, _, b = curl(url + "/readyz", http="--http1.1", timeout=2)
    return s == 200 and json.loads(b)["workers_ready"] == 2


try:
    wait_until(lambda: ready() or g.poll() is not None, 60, "gateway ready with 2 workers")
    t.ok(g.poll() is None, "gateway with a region section and two workers started")
    pid0 = int(re.search(r"worker 0 \(model m, device \w+\) started: pid (\d+)", open(log_path).read()).group(1))
    body = {"model": "m", "prompt": [1, 5, 7], "max_tokens": 4, "temperature": 0}
    # Worker 0 (both idle, nothing sent yet: worker 0 first) is frozen so
    # the request waits on it with nothing answered, then killed.
    os.kill(pid0, signal.SIGSTOP)
    mover = subprocess.Popen(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "60", "-D", "-", "-H",
                              "content-type: application/json", "-H", "x-request-id: moved", "--data-binary",
                              json.dumps(body), url + "/v1/completions"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    time.sleep(0.5)
    os.kill(pid0, signal.SIGKILL)
    s, h, b = parse_curl(mover.communicate(timeout=60)[0])
    line = wait_until(lambda: [json.loads(x) for x in open(access_log) if '"moved"' in x], 5, "its log line")[-1]
    t.ok(s == 200 and h.get("x-infergate-worker") == "1" and json.loads(b)["choices"][0]["text"],
         "a local worker killed before answering: retried on the other local worker, not failed for want of a "
         "region (%d, worker %s, tries %s)" % (s, h.get("x-infergate-worker"), line.get("tries")))
    t.ok(h.get("x-infergate-region") == "solo", "answered in this region: %s" % h.get("x-infergate-route"))
    wait_until(ready, 60, "the killed worker back")

    # Both idle: worker 0 is picked first, and its cache cannot hold a
    # 600-token prompt. Worker 1's can.
    long_body = {"model": "m", "prompt": [(7 * i) % 500 + 3 for i in range(600)], "max_tokens": 4,
                 "temperature": 0}
    s, h, b = curl(url + "/v1/completions", data=long_body, headers=["x-request-id: too-long-for-0"])
    line = wait_until(lambda: [json.loads(x) for x in open(access_log) if '"too-long-for-0"' in x], 5,
                      "its log line")[-1]
    t.ok(s == 200 and h.get("x-infergate-worker") == "1" and line.get("tries") == 2,
         "a local worker whose KV cache cannot hold the prompt (503): the request goes to the other one (%d, "
         "worker %s, tries %s: %s)" % (s, h.get("x-infergate-worker"), line.get("tries"), b[:200]))

    # Events of ~2.8 KiB (20 top_logprobs each) against a 4 KiB buffer, to
    # a client that reads slowly: a window of 4 KiB, 1 KiB more every
    # 20 ms. An event held whole (up to 16 KiB) and written at once on top
    # of what the stream already held went past the buffer, and the stream
    # was reset.
    import socket
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.local_settings = h2.settings.Settings(client=True, initial_values={
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 4096})
    c.initiate_connection()
    lp_body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
                          "temperature": 0, "stream": True, "logprobs": True, "top_logprobs": 20}).encode()
    c.send_headers(1, [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "http"),
                       (":authority", "127.0.0.1"), ("content-type", "application/json")])
    c.send_data(1, lp_body, end_stream=True)
    s.sendall(c.data_to_send())
    s.settimeout(0.02)
    got, outcome, unacked, until = b"", None, 0, time.time() + 60
    while outcome is None and time.time() < until:
        try:
            data = s.recv(65536)
        except socket.timeout:
            data = None
        if data == b"":
            outcome = "closed"
            break
        for ev in c.receive_data(data) if data else []:
            if isinstance(ev, h2.events.DataReceived):
                got += ev.data
                unacked += ev.flow_controlled_length
            elif isinstance(ev, h2.events.StreamEnded):
                outcome = "ended"
            elif isinstance(ev, h2.events.StreamReset):
                outcome = "reset"
        if unacked and outcome is None:
            n = min(unacked, 1024)
            c.acknowledge_received_data(n, 1)
            unacked -= n
            time.sleep(0.02)
        s.sendall(c.data_to_send())
    s.close()
    events = [e for e in got.split(b"\n\n") if e.startswith(b"data: {")]
    finished = [e for e in events if b'"finish_reason":"' in e]
    t.ok(outcome == "ended" and got.rstrip().endswith(b"data: [DONE]") and len(events) >= 20 and finished
         and max(len(e) for e in events) > 1024,
         "a 4 KiB stream buffer: a client that reads events of %d bytes slowly still gets them all (%s, %d events)"
         % (max(len(e) for e in events) if events else 0, outcome, len(events)))

    # --- an impostor on a worker's socket ---
    # Worker 0 dies; before its restart, another process (here the test,
    # as another local user would with a writable runtime_dir) takes its
    # socket's name and answers /internal/stats as a ready worker does.
    log_at = len(open(log_path).read())
    pid0 = int(re.findall(r"worker 0 \(model m, device \w+\) started: pid (\d+)", open(log_path).read())[-1])
    sock0 = os.path.join(d, "run", "worker-0.sock")
    os.kill(pid0, signal.SIGKILL)
    os.unlink(sock0)
    impostor = FaultRegion(unix=sock0)
    try:
        time.sleep(3)  # stats every 100 ms: 30 chances to be called ready
        said = open(log_path).read()[log_at:]
        _, _, rb = curl(url + "/readyz", http="--http1.1", timeout=5)
        sent = [curl(url + "/v1/completions", data=body)[1].get("x-infergate-worker") for _ in range(4)]
        t.ok(impostor.connections > 0 and not impostor.paths and json.loads(rb)["workers_ready"] == 1
             and sent == ["1"] * 4,
             "a process on a dead worker's socket that is not the worker started there is never called ready "
             "nor sent a request (%d connections, paths asked %s, %s, requests went to workers %s)"
             % (impostor.connections, impostor.paths, rb.decode().strip(), sent))
        # The line comes with the first refused connection, which on a
        # loaded machine may be later than the 3 s above: up to 10 s more.
        told = r"worker-0\.sock is served by pid %d \(uid \d+\), not by pid \d+" % os.getpid()
        for _ in range(100):
            said = open(log_path).read()[log_at:]
            if re.search(told, said):
                break
            time.sleep(0.1)
        t.ok(re.search(told, said),
             "the gateway says who answered in its place: %s"
             % [l for l in said.splitlines() if "served by" in l][:1])
    finally:
        impostor.stop()
        os.unlink(sock0)
    wait_until(ready, 30, "worker 0 back once its socket is free")
    t.ok(True, "with the impostor gone, worker 0 is started again and ready")

    # --- a runtime_dir others may write to ---
    open_run = os.path.join(d, "open-run")
    os.mkdir(open_run)
    os.chmod(open_run, 0o777)
    cfg2 = os.path.join(d, "open.yaml")
    open(cfg2, "w").write("listen: [{address: \"127.0.0.1:%d\"}]\nworkers: [{model: \"%s\", name: m}]\n"
                          "runtime_dir: \"%s\"\n" % (free_port(), model, open_run))
    r = subprocess.run([INFERGATE, "serve", "--config", cfg2], capture_output=True, text=True, timeout=60)
    t.ok(r.returncode != 0 and "has mode 0777" in r.stderr and "every local user" in r.stderr
         and not os.listdir(open_run),
         "a world-writable runtime_dir is refused at start, its mode named: %s" % r.stderr.strip()[-300:])
finally:
    rc = stop(g)
t.ok(rc == 0, "gateway exits 0 (%s)" % rc)
if t.failed:
    print("# gateway log:\n" + open(log_path).read()[-3000:])
t.finish()
