"""With routing on (a region section, here with no Redis and no peers), a
local worker that fails before answering is retried on another local
worker, as it is without one. The region is one routing candidate however
many workers it has: the request used to move on to the next region, and
with none left was answered 503 while a sibling worker stood ready."""
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, parse_curl, spawn, tmpdir, wait_until

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512, ctx=512,
                  type="q8_0", seed=9)
port = free_port()
access_log = os.path.join(d, "access.log")
cfg = os.path.join(d, "gateway.yaml")
open(cfg, "w").write("""
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
region: {name: solo}
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
finally:
    g.send_signal(signal.SIGTERM)
    try:
        rc = g.wait(timeout=30)
    except subprocess.TimeoutExpired:
        g.kill()
        rc = None
t.ok(rc == 0, "gateway exits 0 (%s)" % rc)
if t.failed:
    print("# gateway log:\n" + open(log_path).read()[-3000:])
t.finish()
