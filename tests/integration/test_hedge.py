"""Hedged requests (issue 32, item 2). Two local workers serve model m:
worker 0 a model many times slower than worker 1's. With cache_aware off
an idle gateway sends each request to worker 0 first, so a short answer
not streamed that has not come after routing.hedge_delay_ms gets a copy on
worker 1, whose answer wins: the client gets it whole, worker 0's stream is
reset and its sequence dropped (its requests_cancelled, running back to 0,
requests_done unchanged), and the metrics, the event log and the access log
say so, the access log counting the winner's tokens once. A streamed request
and one past hedge_max_tokens are not hedged; hedge_share bounds hedges
(the one past it counted as suppressed); hedge: false (reloaded) sends none."""
import json
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, spawn, stream_post, tmpdir, wait_until

t = Checks()
d = tmpdir()
# Worker 0 takes tens of ms a token on one thread, worker 1 well under one.
slow = gen_model(os.path.join(d, "slow.gguf"), dim=768, layers=12, heads=12, kv_heads=12, ffn=2048, vocab=512,
                 ctx=512, type="q8_0", seed=3)
fast = gen_model(os.path.join(d, "fast.gguf"), dim=64, layers=2, heads=4, kv_heads=4, ffn=128, vocab=512, ctx=512,
                 type="q8_0", seed=4)
port = free_port()
url = "http://127.0.0.1:%d" % port
cfg = os.path.join(d, "gateway.yaml")
access_log = os.path.join(d, "access.log")
CFG = """
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
routing: {cache_aware: false, hedge: %s, hedge_delay_ms: 40, hedge_max_tokens: 32, hedge_share: %s}
logging: {access_log: "%s"}
stats_interval_ms: 100
runtime_dir: "%s"
"""


def write_cfg(hedge, share):
    open(cfg, "w").write(CFG % (port, slow, fast, "true" if hedge else "false", share, access_log,
                                os.path.join(d, "run")))


write_cfg(False, 1)
log_path = os.path.join(d, "gateway.log")
g = spawn([INFERGATE, "serve", "--config", cfg], log_path)


def ready():
    s, _, b = curl(url + "/readyz", http="--http1.1", timeout=2)
    return s == 200 and json.loads(b)["workers_ready"] == 2


def worker_stats(i):
    s, _, b = curl("http://localhost/internal/stats", unix=os.path.join(d, "run", "worker-%d.sock" % i), timeout=5)
    return json.loads(b) if s == 200 else {}


def hedges():
    _, _, b = curl(url + "/metrics", http="--http1.1")
    return {m.group(1).decode(): int(float(m.group(2)))
            for m in re.finditer(rb'infergate_hedges_total\{outcome="(\w+)"\} (\S+)', b)}


def complete(max_tokens, **extra):
    body = {"model": "m", "prompt": "hello there", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    body.update(extra)
    t0 = time.monotonic()
    s, h, b = curl(url + "/v1/completions", http="--http1.1", data=body)
    return s, h, b, time.monotonic() - t0


def log_line(request_id):
    for line in open(access_log).read().splitlines():
        rec = json.loads(line)
        if rec.get("request_id") == request_id:
            return rec
    return {}


def settle():
    """Both workers idle, and the gateway has seen it (stats every 100 ms):
    the next request goes to worker 0 first."""
    wait_until(lambda: all(worker_stats(i).get("running") == 0 and worker_stats(i).get("queued") == 0
                           for i in (0, 1)), 20, "both workers idle")
    time.sleep(0.4)


def reload(hedge, share):
    write_cfg(hedge, share)
    n = open(log_path).read().count("infergate: reloaded")
    g.send_signal(signal.SIGHUP)
    wait_until(lambda: open(log_path).read().count("infergate: reloaded") > n, 10, "the reload")
    settle()


try:
    wait_until(ready, 60, "both workers ready")
    settle()
    # Unhedged, for scale: worker 0 answers 32 tokens slower than the delay.
    s, h, b, slow_s = complete(32)
    t.ok(s == 200 and h.get("x-infergate-worker") == "0", "hedging off: worker 0 answers (%d %s, %.2f s)"
         % (s, h.get("x-infergate-worker"), slow_s))
    t.ok(hedges().get("sent", 0) == 0, "hedging off: no hedge sent")
    reload(True, 1)

    # A hedge wins: worker 1's copy answers, worker 0's sequence is dropped.
    done0 = worker_stats(0).get("requests_done")
    s, h, b, hedged_s = complete(32)
    body = json.loads(b) if s == 200 else {}
    t.ok(s == 200 and h.get("x-infergate-worker") == "1",
         "the hedge's answer wins (%d, worker %s, %.2f s against %.2f s unhedged)"
         % (s, h.get("x-infergate-worker"), hedged_s, slow_s))
    t.ok(body.get("usage", {}).get("completion_tokens") == 32 and len(body.get("choices", [])) == 1,
         "the client gets one whole answer (%r)" % body.get("usage"))
    st = wait_until(lambda: (lambda x: x if x.get("running") == 0 and x.get("requests_cancelled", 0) >= 1 else None)(
        worker_stats(0)), 10, "worker 0 drops the losing sequence")
    t.ok(st.get("requests_done") == done0, "worker 0 never finished the losing copy (%s done, %s cancelled)"
         % (st.get("requests_done"), st.get("requests_cancelled")))
    n = hedges()
    t.ok(n.get("sent") == 1 and n.get("won_hedge") == 1 and n.get("cancelled") == 1 and not n.get("won_primary"),
         "metrics: one sent, won by the hedge, the loser cancelled (%r)" % n)
    log = open(log_path).read()
    t.ok(re.search(r'event=hedge request=\S+ from="worker 0" to="worker 1" after_ms=\d+', log) is not None and
         "outcome=won_hedge" in log, "the hedge and its outcome are logged")
    time.sleep(0.3)  # the access log's thread writes the line
    rec = log_line(h.get("x-request-id"))
    t.ok(rec.get("hedge") == "won_hedge" and rec.get("target") == "worker-1" and rec.get("tokens") == 32 and
         rec.get("tries") == 2, "access log: one line, the winner's target and tokens (%r)" % rec)

    # Not hedged: streamed, or past hedge_max_tokens.
    settle()
    s, h, raw = stream_post(port, "/v1/completions", {"model": "m", "prompt": "hello there", "max_tokens": 32,
                                                      "temperature": 0, "ignore_eos": True, "stream": True})
    t.ok(s == 200 and h.get("x-infergate-worker") == "0" and hedges().get("sent") == 1,
         "a streamed request is not hedged")
    settle()
    s, h, b, _ = complete(33)
    t.ok(s == 200 and h.get("x-infergate-worker") == "0" and hedges().get("sent") == 1,
         "max_tokens past hedge_max_tokens: not hedged")

    # hedge_share 0.5: of two hedges due, the first finds the bucket short.
    reload(True, 0.5)
    s1, h1, _, _ = complete(32)
    settle()
    s2, h2, _, _ = complete(32)
    n = hedges()
    t.ok((h1.get("x-infergate-worker"), h2.get("x-infergate-worker")) == ("0", "1") and n.get("suppressed") == 1 and
         n.get("sent") == 2, "hedge_share 0.5: one suppressed, one sent (%s, %s, %r)"
         % (h1.get("x-infergate-worker"), h2.get("x-infergate-worker"), n))
    time.sleep(0.3)
    t.ok(log_line(h1.get("x-request-id")).get("hedge") == "suppressed", "access log: the suppressed one says so")

    # Off again (reloaded): no copy.
    reload(False, 1)
    s, h, _, _ = complete(32)
    t.ok(s == 200 and h.get("x-infergate-worker") == "0" and hedges().get("sent") == 2,
         "hedge: false (reloaded): no copy")
finally:
    g.send_signal(signal.SIGTERM)
    try:
        g.wait(timeout=30)
    except Exception:
        g.kill()
t.finish()
