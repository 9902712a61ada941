"""A gateway drains itself on POST /admin/drain (with a deadline) or on
SIGUSR1, as a spot instance does when told it will be reclaimed (issue 32,
point 3): the answer says so (202), a stream in flight finishes whole, no
new connection is taken, and the gateway and its workers stop, exit 0."""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, spawn, tmpdir, wait_until

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512, ctx=4096,
                  seed=7)


def start(name):
    port = free_port()
    cfg = os.path.join(d, name + ".yaml")
    open(cfg, "w").write("""
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
drain_grace_s: 20
stats_interval_ms: 100
runtime_dir: "%s"
""" % (port, model, os.path.join(d, name)))
    log = os.path.join(d, name + ".log")
    g = spawn([INFERGATE, "serve", "--config", cfg], log)
    url = "http://127.0.0.1:%d" % port
    wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None, 60,
               "ready")
    return g, url, log


def exited(g, secs):
    try:
        return g.wait(timeout=secs)
    except subprocess.TimeoutExpired:
        return None


g, url, log = start("a")
t.ok(curl(url + "/admin/drain")[0] == 405, "GET /admin/drain: 405")
t.ok(curl(url + "/admin/drain?deadline_s=0", "-X", "POST")[0] == 400, "a deadline_s of 0 is refused (400)")
body = '{"model":"m","prompt":"a long story","max_tokens":1500,"ignore_eos":true,"stream":true}'
stream = subprocess.Popen(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "60", url + "/v1/completions",
                           "-H", "content-type: application/json", "--data-binary", body],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
time.sleep(0.3)
st, _, b = curl(url + "/admin/drain?deadline_s=15", "-X", "POST")
t.ok(st == 202 and b'"draining":true' in b and b'"deadline_s":15' in b,
     "POST /admin/drain?deadline_s=15: 202 %s" % b[:80])
out, err = stream.communicate(timeout=60)
t.ok(stream.returncode == 0 and out.rstrip().endswith(b"data: [DONE]"),
     "a stream in flight finishes whole during the drain (curl %d, %d bytes)" % (stream.returncode, len(out)))
t.ok(curl(url + "/healthz", http="--http1.1", timeout=2)[0] == 0, "no new connection is taken")
rc = exited(g, 30)
text = open(log).read()
t.ok(rc == 0 and "POST /admin/drain: draining" in text, "the gateway stops after its drain, exit %s" % rc)

g, url, log = start("b")
os.kill(g.pid, signal.SIGUSR1)
rc = exited(g, 30)
text = open(log).read()
t.ok(rc == 0 and "SIGUSR1 (reclaim notice): draining" in text, "SIGUSR1 drains and stops it too, exit %s" % rc)
t.finish()
