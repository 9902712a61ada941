"""Kills at random points (issue 32, token replay): the worker serving a
stream is SIGKILLed after a random number of its events (within its first
three quarters: later, the worker may have finished), and so is the
gateway of the region serving a stream while the origin gateway relays it.
Every stream completes ([DONE], no error event), with the unbroken greedy
answer's text byte for byte, one id and created, and usage for the whole
answer; no replay tag reaches the client.

Two regions on loopback and a real redis-server: o (the origin, two CPU
workers, tags [home]) and p (one worker, tags [away]), mutual TLS between
them. o's policy is primary [p, o]: a request without a residency goes to
p, and when p's gateway dies o resumes it on its own workers; one that
needs `home` stays on o's workers, and when the one serving it dies the
other resumes it. p's gateway is started again after each kill.

INFERGATE_KILLS (default 2) kills of each kind; the issue's run is 20, with a
slower model (below).
INFERGATE_KILL_SEED (default: from the clock) draws the kill points; it
is printed, so that a failure can be run again with the same points."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import (INFERGATE, Checks, curl, free_port, gen_model, spawn, sse_events, stream_post, test_ca, tmpdir,
                     wait_until)

if not os.path.exists("/usr/bin/redis-server"):
    print("redis-server not installed: skipping")
    sys.exit(77)

KILLS = int(os.environ.get("INFERGATE_KILLS", "2"))
SEED = int(os.environ.get("INFERGATE_KILL_SEED", str(int(time.time()) % 100000)))
MAX_TOKENS = 160 if KILLS > 2 else 120
print("# %d kills of each kind, kill points from seed %d (INFERGATE_KILL_SEED=%d to draw them again)"
      % (KILLS, SEED, SEED), flush=True)
rng = random.Random(SEED)

t = Checks()
d = tmpdir()
# Slow enough on one thread that the client, which reads tens of ms behind
# the worker, kills it mid-stream: the full run's model takes 3-4 ms a
# token on a quiet machine; CI's (test_replay's), a few times less, keeps
# the sanitizer build's run short.
dims = dict(dim=768, layers=12, ffn=1536) if KILLS > 2 else dict(dim=512, layers=8, ffn=1024)
model = gen_model(os.path.join(d, "m.gguf"), heads=8, kv_heads=8, vocab=512, ctx=1024, type="q8_0", seed=5, **dims)
ca, region_cert = test_ca(d)
certs = {n: region_cert(n) for n in ("o", "p")}

redis_port = free_port()
spawn(["/usr/bin/redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
      os.path.join(d, "redis.log"))
wait_until(lambda: subprocess.run(["redis-cli", "-p", str(redis_port), "ping"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() == "PONG", 20, "redis-server")

port, p_peer = free_port(), free_port()
COMMON = """
cluster: k%(redis)d
redis: {address: "127.0.0.1:%(redis)d", record_keys: ["test-fleet-key-0123456789abcdef-0123456789"]}
stats_interval_ms: 100
drain_grace_s: 1
"""
O_CFG = COMMON + """
listen:
  - address: "127.0.0.1:%(port)d"
workers:
  - {model: "%(model)s", name: m, threads: 1, max_seqs: 4}
  - {model: "%(model)s", name: m, threads: 1, max_seqs: 4}
region: {name: o, endpoint: "tcp:127.0.0.1:%(port)d", tags: [home]}
routing:
  policy: primary
  primary: [p, o]
  slo_ms: 60000
  primary_hold_ms: 100
  spread: false
  heartbeat_ms: 200
  stale_after_ms: 1000
  ping_interval_ms: 100
  eject_after: 0  # p dies on purpose, over and over: what is checked is each stream, not ejection
  retry_budget: 1
peer_tls: {ca: "%(ca)s", cert: "%(crt)s", key: "%(key)s"}
runtime_dir: "%(run)s"
"""
P_CFG = COMMON + """
listen:
  - address: "127.0.0.1:%(peer)d"
    tls: {cert: "%(crt)s", key: "%(key)s", client_ca: "%(ca)s", peer_names: [o]}
workers:
  - {model: "%(model)s", name: m, threads: 1, max_seqs: 4}
region: {name: p, endpoint: "tls:127.0.0.1:%(peer)d", tags: [away]}
routing: {heartbeat_ms: 200, stale_after_ms: 1000}
runtime_dir: "%(run)s"
"""


def start(name, template, incarnation=0):
    crt, key = certs[name]
    cfg = os.path.join(d, "%s-%d.yaml" % (name, incarnation))
    open(cfg, "w").write(template % dict(redis=redis_port, port=port, peer=p_peer, model=model, ca=ca, crt=crt,
                                         key=key, run=os.path.join(d, "run-%s-%d" % (name, incarnation))))
    log = os.path.join(d, "%s-%d.log" % (name, incarnation))
    return spawn([INFERGATE, "serve", "--config", cfg], log), log


o, o_log = start("o", O_CFG)
p, p_log = start("p", P_CFG)
HOME = {"x-infergate-residency": "home"}


def o_ready():
    s, _, b = curl("http://127.0.0.1:%d/readyz" % port, http="--http1.1", timeout=2)
    return s == 200 and json.loads(b)["workers_ready"] == 2


def p_serves():
    """A request without a residency is served by p (o has seen p's record
    and reached its gateway)."""
    s, h, _ = curl("http://127.0.0.1:%d/v1/completions" % port, http="--http1.1", timeout=10,
                   data={"model": "m", "prompt": [1], "max_tokens": 1})
    return s == 200 and h.get("x-infergate-region") == "p"


def pid_of_worker(log, i):
    found = re.findall(r"worker %d \(model m, device \w+\) started: pid (\d+)" % i, open(log).read())
    return int(found[-1])


PROMPTS = [[1, 5, 7], [3, 9, 11, 2], [42, 17]]


def body(i):
    return {"model": "m", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def parts(raw):
    """The answer's text, its events but usage, the usage, and [DONE]."""
    events, done = sse_events(raw)
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    return text, [e for e in events if e.get("choices")], [e["usage"] for e in events if e.get("usage")], done


def check(kind, i, k, ref, status, headers, raw, killed):
    name = "%s kill %d (after %d events)" % (kind, i + 1, k)
    t.ok(b": ig" not in raw, "%s: no replay tag reaches the client" % name)
    try:
        text, events, usage, done = parts(raw)
    except (AssertionError, ValueError) as e:
        t.ok(False, "%s: the stream parses (%s): %r" % (name, e, raw[-400:]))
        return False
    errors = [e for e in sse_events(raw)[0] if "error" in e]
    t.ok(status == 200 and done and not errors and killed,
         "%s: the stream completes ([DONE], no error event%s)" % (name, "" if killed else "; NOT KILLED"))
    t.ok(text == ref["text"], "%s: the text equals the unbroken greedy answer (%d vs %d bytes%s)"
         % (name, len(text.encode()), len(ref["text"].encode()),
            "" if text == ref["text"] else "; first difference at %d" %
            next((j for j, (a, b) in enumerate(zip(text, ref["text"])) if a != b),
                 min(len(text), len(ref["text"])))))
    t.ok(len({e["id"] for e in events}) == 1 and len({e["created"] for e in events}) == 1,
         "%s: one id and created" % name)
    u = usage[-1] if usage else {}
    t.ok(u.get("completion_tokens") == ref["usage"]["completion_tokens"] == MAX_TOKENS and
         u.get("prompt_tokens") == ref["usage"]["prompt_tokens"],
         "%s: usage counts the whole answer: %s" % (name, u))
    strip = lambda evs: [dict(e, id=None, created=None) for e in evs]  # this run's own
    t.ok(strip(events) == strip(ref["events"]), "%s: the same chunks as the unbroken answer" % name)
    replayed = re.search(r"event=replay request=%s " % re.escape(headers.get("x-request-id", "-")),
                         open(o_log).read()) is not None
    print("#   %s: %s" % (name, "replayed" if replayed else "not replayed (the kill came after the answer)"),
          flush=True)
    return replayed


def kill_case(kind, i, headers, kill, killed_ok):
    """Streams prompt i, calls kill(response) after a random number of its
    events, and checks the stream against the unbroken answer; whether it
    was replayed."""
    ref = refs[i % len(PROMPTS)]
    k = rng.randint(1, max(1, len(ref["events"]) * 3 // 4))  # later, the worker may be done already
    killed = []

    def on_event(n, r):
        if n == k:
            killed.append(kill(r))

    s, h, raw = stream_post(port, "/v1/completions", body(i), headers=headers, on_event=on_event)
    return check(kind, i, k, ref, s, h, raw, killed_ok(killed))


refs = {}
replays = {"worker": 0, "region": 0}
try:
    wait_until(lambda: o.poll() is not None or o_ready(), 90, "o with two workers")
    wait_until(lambda: o.poll() is not None or p.poll() is not None or p_serves(), 90, "p serving o's requests")
    t.ok(o.poll() is None and p.poll() is None, "two regions, o with two workers, p with one, see each other")

    # The unbroken answers (o's workers); p's is the same (greedy, the same model file).
    for i in range(min(max(KILLS, 1), len(PROMPTS))):
        s0, _, raw0 = stream_post(port, "/v1/completions", body(i), headers=HOME)
        text0, events0, usage0, done0 = parts(raw0)
        refs[i] = {"text": text0, "events": events0, "usage": usage0[-1] if usage0 else {}}
        t.ok(s0 == 200 and done0 and len(events0) >= MAX_TOKENS // 2,
             "prompt %d: the unbroken answer, %d events" % (i, len(events0)))
    s1, h1, raw1 = stream_post(port, "/v1/completions", body(0))
    t.ok(s1 == 200 and h1.get("x-infergate-region") == "p" and parts(raw1)[0] == refs[0]["text"],
         "p's unbroken answer is o's workers' (%s)" % h1.get("x-infergate-region"))

    # --- the worker serving the stream, SIGKILLed; its sibling resumes ---
    def kill_worker(r):
        w = int(r.getheader("x-infergate-worker"))
        os.kill(pid_of_worker(o_log, w), signal.SIGKILL)
        return "worker %d" % w

    t0 = time.monotonic()
    for i in range(KILLS):
        wait_until(o_ready, 120, "both of o's workers ready")
        replays["worker"] += kill_case("worker", i, HOME, kill_worker, lambda killed: bool(killed))
    worker_s = time.monotonic() - t0

    # --- the gateway of the region serving the stream, SIGKILLed; o resumes ---
    def kill_region(r):
        p.kill()
        return r.getheader("x-infergate-region")

    t0 = time.monotonic()
    for i in range(KILLS):
        wait_until(o_ready, 120, "both of o's workers ready")
        wait_until(p_serves, 120, "p's gateway serving again")
        replays["region"] += kill_case("region", i, {}, kill_region, lambda killed: killed == ["p"])
        p.wait(10)
        p_worker = pid_of_worker(p_log, 0)
        p, p_log = start("p", P_CFG, i + 1)
        # p's worker went with its gateway (PR_SET_PDEATHSIG, then its drain_grace_s)
        try:
            gone = wait_until(lambda: not os.path.exists("/proc/%d" % p_worker) or
                              open("/proc/%d/stat" % p_worker).read().split()[2] == "Z", 10, "p's old worker gone")
        except (AssertionError, OSError):
            gone = not os.path.exists("/proc/%d" % p_worker)
        if not gone:
            t.ok(False, "region kill %d: p's worker (pid %d) outlived its gateway" % (i + 1, p_worker))
    region_s = time.monotonic() - t0

    s, _, m = curl("http://127.0.0.1:%d/metrics" % port, http="--http1.1")
    counted = {o_: int(n_) for o_, n_ in re.findall(rb'infergate_replays_total\{outcome="(\w+)"\} (\d+)', m)}
    resumed, refused = counted.get(b"resumed", 0), counted.get(b"refused", 0)
    waits = [int(x) for x in re.findall(r"restarting in (\d+) ms", open(o_log).read())]
    print("# o's supervisor restarted its killed workers after %s ms (back-off; it starts over after 30 s up)"
          % waits)
    print("# %d worker kills in %.1f s (%d replayed), %d region kills in %.1f s (%d replayed); "
          "infergate_replays_total resumed %d, refused %d; seed %d"
          % (KILLS, worker_s, replays["worker"], KILLS, region_s, replays["region"],
             resumed, refused, SEED))
    if KILLS > 2:  # a short run's few kills may all come after a fast worker's answer
        t.ok(replays["worker"] > 0 and replays["region"] > 0,
             "kills landed mid-stream and were replayed: %d of %d worker kills, %d of %d region kills"
             % (replays["worker"], KILLS, replays["region"], KILLS))
    t.ok(refused == 0, "no replay was refused (infergate_replays_total)")
finally:
    for proc in (o, p):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
t.finish()
