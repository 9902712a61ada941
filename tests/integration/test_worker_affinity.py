"""Cache-aware choice of local worker with real processes (issue 30, items 3
and 5): a gateway with two workers and two conversations. Each
conversation's later turns land on the worker that served its first (the
worker reports the prompt-prefix hashes it holds in /internal/stats, the
gateway hashes each body the same way), and the worker says so with
usage.prompt_tokens_details.cached_tokens > 0. When that worker is flooded
the next turn goes to the idle one: a hot prefix does not outweigh a long
queue. A session (x-infergate-session, or the body's `user`) keeps its
requests on one worker while the workers are alike; a malformed header is
refused."""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, spawn, stop, tmpdir, wait_until

t = Checks()
d = tmpdir()
# big enough that a flood of long answers stays queued for seconds
model = gen_model(os.path.join(d, "m.gguf"), dim=256, layers=4, heads=4, kv_heads=2, ffn=512, vocab=512, ctx=2048,
                  type="q8_0", seed=5)
port = free_port()
run_dir = os.path.join(d, "run")
cfg = os.path.join(d, "gateway.yaml")
open(cfg, "w").write("""
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 2, kv_cache_mb: 16}
  - {model: "%s", name: m, threads: 1, max_seqs: 2, kv_cache_mb: 16}
stats_interval_ms: 100
runtime_dir: "%s"
""" % (port, model, model, run_dir))
g = spawn([INFERGATE, "serve", "--config", cfg], os.path.join(d, "gateway.log"))
url = "http://127.0.0.1:%d" % port


def ready():
    s, _, b = curl(url + "/readyz", http="--http1.1", timeout=2)
    return s == 200 and json.loads(b)["workers_ready"] == 2


def chat(messages, headers=(), user=None, max_tokens=8):
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if user:
        body["user"] = user
    s, h, b = curl(url + "/v1/chat/completions", data=body, headers=headers, timeout=120)
    assert s == 200, (s, b)
    r = json.loads(b)
    return int(h["x-infergate-worker"]), r["choices"][0]["message"]["content"], \
        r["usage"]["prompt_tokens_details"]["cached_tokens"]


def stats(w):
    s, _, b = curl("http://localhost/internal/stats", unix=os.path.join(run_dir, "worker-%d.sock" % w), timeout=5)
    return json.loads(b) if s == 200 else {}


def gateway_queue(w):
    """Worker w's queue as the gateway last heard it (its /metrics)."""
    _, _, b = curl(url + "/metrics", timeout=10)
    for line in b.decode().splitlines():
        if line.startswith("infergate_worker_queue_depth{") and 'worker="%d"' % w in line:
            return float(line.rsplit(" ", 1)[1])
    return 0


def settle():
    """Until both workers are idle and have reported it (two stats intervals)."""
    wait_until(lambda: all(stats(w).get("running") == 0 and stats(w).get("queued") == 0 for w in (0, 1)), 120,
               "workers idle")
    time.sleep(0.3)


def words(seed, n):
    return " ".join("w%d" % ((seed * 7919 + i * 104729) % 9973) for i in range(n))


class Conv:
    def __init__(self, name, seed):
        self.name = name
        self.msgs = [{"role": "system", "content": "Conversation %s. %s" % (name, words(seed, 120))}]
        self.turn = 0
        self.log = []  # (worker, cached_tokens) per turn

    def step(self, user=None):
        self.turn += 1
        self.msgs.append({"role": "user", "content": "turn %d of %s: %s" % (self.turn, self.name,
                                                                            words(self.turn * 31, 20))})
        w, text, cached = chat(self.msgs, user=user)
        self.msgs.append({"role": "assistant", "content": text})
        self.log.append((w, cached))
        return w, cached


def both(a, b):
    """A turn of each conversation at once, so that neither is alone."""
    out = {}
    th = [threading.Thread(target=lambda c=c: out.__setitem__(c.name, c.step())) for c in (a, b)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    return out


try:
    wait_until(lambda: ready() or g.poll() is not None, 90, "gateway ready with 2 workers")
    t.ok(g.poll() is None, "gateway with two workers started")
    st = stats(0)
    t.ok(st.get("prefix_hashes") == [], "an idle worker reports no prefix hashes: %r" % st.get("prefix_hashes"))

    a, b = Conv("A", 1), Conv("B", 2)
    # Turn 1 of each names a session (`user`), the only thing that tells the
    # idle workers apart: these two names hash to different workers. The
    # later turns name none: only the prefix keeps them.
    first = {"A": a.step(user="alice")}
    settle()
    first["B"] = b.step(user="carol")
    t.ok(first["A"][0] != first["B"][0], "turn 1 of A and of B, sessions alice and carol: one on each worker (%r)"
         % first)
    settle()
    t.ok(len(stats(first["A"][0]).get("prefix_hashes", [])) >= 2,
         "the worker that served A reports its prefix hashes (%d)" % len(stats(first["A"][0])["prefix_hashes"]))
    for _ in range(3):
        both(a, b)
        settle()
    for c, w0 in ((a, first["A"][0]), (b, first["B"][0])):
        later = c.log[1:]
        t.ok(all(w == w0 for w, _ in later) and all(cached > 0 for _, cached in later),
             "conversation %s: turns 2-4 on worker %d, where its prefix is, each with cached tokens: %r"
             % (c.name, w0, c.log))

    # Flood A's worker directly (its own socket: the gateway sees only its
    # queue in the stats), then A's next turn goes to the idle worker.
    wa = a.log[-1][0]
    sock = os.path.join(run_dir, "worker-%d.sock" % wa)
    flood_body = json.dumps({"model": "m", "prompt": words(99, 60), "max_tokens": 1500, "ignore_eos": True,
                             "temperature": 0})
    flood = [subprocess.Popen(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "300", "--unix-socket", sock,
                               "-H", "content-type: application/json", "--data-binary", flood_body,
                               "http://localhost/v1/completions"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for _ in range(12)]
    try:
        wait_until(lambda: stats(wa).get("queued", 0) >= 6 and stats(wa).get("est_ttft_ms", 0) > 1000, 60,
                   "the flood queued on worker %d" % wa)
        # and the gateway has seen it (its stats poll can lag a loaded worker)
        wait_until(lambda: gateway_queue(wa) >= 6, 60, "the gateway sees the flood on worker %d" % wa)
    except AssertionError:
        print(stats(wa), [p.poll() for p in flood], flood[0].communicate(timeout=30)[0][-300:])
        raise
    time.sleep(0.3)
    w, cached = a.step()
    # (the other worker shares only the chat template's first block or two)
    t.ok(w != wa and cached < a.log[-2][1] // 4,
         "A's next turn, its worker flooded (%d queued): sent to the idle worker %d (cached %d of B's template)"
         % (stats(wa).get("queued", -1), w, cached))
    for p in flood:
        p.kill()
        p.wait()
    settle()

    # Sessions: prompts that share nothing, so only the session tells them
    # apart; the same session lands on the same worker each time.
    for label, mk in (("x-infergate-session", lambda s: ({"headers": ["x-infergate-session: " + s]})),
                      ("user", lambda s: ({"user": s}))):
        where = {}
        for s in ("alice", "bob", "carol", "dave", "erin", "frank"):
            seen = set()
            for i in range(3):
                w, _, _ = chat([{"role": "user", "content": "%s %s %d %s" % (label, s, i, words(i + len(s), 5))}],
                               **mk(s))
                seen.add(w)
                settle()
            where[s] = seen
        # That the sessions spread over both workers is test_prefix_route's
        # (exact): here it holds only while the two workers' measured
        # prefill rates are within the near-equal margin, which a slow
        # build (ASan) on a loaded machine does not keep.
        t.ok(all(len(v) == 1 for v in where.values()),
             "%s: each session's requests on one worker: %r" % (label, where))
        if len(set().union(*where.values())) != 2:
            print("# %s: the sessions all went to one worker (its measured prefill rate the lower by more than "
                  "the near-equal margin)" % label)
    s, _, body = curl(url + "/v1/chat/completions", data={"model": "m", "messages": [{"role": "user",
                                                                                      "content": "x"}]},
                      headers=["x-infergate-session: " + "x" * 300], timeout=30)
    t.ok(s == 400 and json.loads(body)["error"]["code"] == "bad_session",
         "an x-infergate-session of 300 bytes: 400 bad_session (%d)" % s)
finally:
    stop(g)

t.finish()
