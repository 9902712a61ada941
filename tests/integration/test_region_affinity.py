"""Cache-aware choice of region with real processes (issue 30, item 4):
three regions on loopback (mutual TLS, as test_regions) and one real
redis-server, all about as fast, with spreading on, so that without the
prefix a conversation's turns would be drawn among them. Each region's
record carries its workers' prompt-prefix hashes; a conversation's later
turns stay in the region that served its first (cached_tokens > 0 there),
whichever gateway they enter; when that region's worker is flooded, the
next turn goes elsewhere."""
import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, free_port, gen_model, spawn, stop, tmpdir, test_ca, wait_until

if not os.path.exists("/usr/bin/redis-server"):
    print("redis-server not installed: skipping")
    sys.exit(77)

t = Checks()
d = tmpdir()
# big enough that a flood of long answers stays queued for seconds
model = gen_model(os.path.join(d, "m.gguf"), dim=256, layers=4, heads=4, kv_heads=2, ffn=512, vocab=512, ctx=2048,
                  type="q8_0", seed=5)


ca, region_cert = test_ca(d)


redis_port = free_port()
procs = [spawn(["/usr/bin/redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no"], os.path.join(d, "redis.log"))]
wait_until(lambda: subprocess.run(["redis-cli", "-p", str(redis_port), "ping"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() == "PONG", 20, "redis-server")

names = ["eu1", "us1", "ap1"]
port = {n: free_port() for n in names}
peer_port = {n: free_port() for n in names}
KEY = "k-open"
key_hash = re.search(r"[0-9a-f]{64}", subprocess.run([INFERGATE, "key", "hash", KEY], capture_output=True,
                                                     text=True, check=True).stdout).group(0)
certs = {n: region_cert(n) for n in names}


def config(n):
    crt, key = certs[n]
    peers = "\n".join('  - {name: %s, endpoint: "tls:127.0.0.1:%d"}' % (m, peer_port[m]) for m in names if m != n)
    return """
listen:
  - address: "127.0.0.1:%(port)d"
  - address: "127.0.0.1:%(peer)d"
    tls: {cert: "%(crt)s", key: "%(key)s", client_ca: "%(ca)s", peer_names: [%(others)s]}
workers:
  - {model: "%(model)s", name: m, threads: 1, max_seqs: 2, max_queue: 64, kv_cache_mb: 16}
region:
  name: %(name)s
  endpoint: "tls:127.0.0.1:%(peer)d"
cluster: t%(redis)d
redis: {address: "127.0.0.1:%(redis)d", record_keys: ["test-fleet-key-0123456789abcdef-0123456789"]}
routing: {policy: latency, heartbeat_ms: 200, stale_after_ms: 1000, ping_interval_ms: 100, spread: true}
peers:
%(peers)s
peer_tls: {ca: "%(ca)s", cert: "%(crt)s", key: "%(key)s"}
tenants:
  - {name: open, keys: ["%(h)s"], admin: true}
stats_interval_ms: 100
runtime_dir: "%(run)s"
""" % dict(port=port[n], peer=peer_port[n], crt=crt, key=key, ca=ca, model=model, name=n, peers=peers,
           others=", ".join(m for m in names if m != n), redis=redis_port, h=key_hash, run=os.path.join(d, "run-" + n))


for n in names:
    cfg = os.path.join(d, n + ".yaml")
    open(cfg, "w").write(config(n))
    procs.append(spawn([INFERGATE, "serve", "--config", cfg], os.path.join(d, n + ".log")))


def request(n, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port[n], timeout=timeout)
    try:
        c.request("POST" if body is not None else "GET", path, json.dumps(body) if body is not None else None,
                  {"authorization": "Bearer " + KEY, "content-type": "application/json"})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except OSError as e:
        return 0, {}, str(e).encode()
    finally:
        c.close()


def table(n):
    s, _, b = request(n, "/v1/regions")
    return {r["name"]: r for r in json.loads(b)["regions"]} if s == 200 else {}


def all_fresh():
    return all(len(tb) == 3 and all(not r["stale"] and r["healthy"] for r in tb.values())
               for tb in (table(n) for n in names))


def worker_stats(n):
    r = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "5", "--unix-socket",
                        os.path.join(d, "run-" + n, "worker-0.sock"), "http://localhost/internal/stats"],
                       capture_output=True)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {}


def words(seed, n):
    return " ".join("w%d" % ((seed * 7919 + i * 104729) % 9973) for i in range(n))


def turn(conv, entry):
    conv["msgs"].append({"role": "user", "content": "turn %d: %s" % (len(conv["msgs"]), words(len(conv["msgs"]), 20))})
    s, h, b = request(entry, "/v1/chat/completions", {"model": "m", "messages": conv["msgs"], "max_tokens": 8,
                                                       "temperature": 0, "ignore_eos": True})
    assert s == 200, (s, b[:300])
    r = json.loads(b)
    conv["msgs"].append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
    where = (h.get("x-infergate-region"), r["usage"]["prompt_tokens_details"]["cached_tokens"])
    conv["log"].append(where)
    return where


try:
    wait_until(all_fresh, 90, "three regions see each other, fresh and healthy")
    t.ok(True, "three gateways share their records through Redis")
    # Every worker measures its rates first (straight to its socket): a
    # region that has run nothing says its queue costs 0 ms, which no hit
    # can beat.
    for n in names:
        for i in range(3):
            subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "60", "--unix-socket",
                            os.path.join(d, "run-" + n, "worker-0.sock"), "-H", "content-type: application/json",
                            "--data-binary", json.dumps({"model": "m", "prompt": words(50 + i, 60), "max_tokens": 4}),
                            "http://localhost/v1/completions"], capture_output=True, check=True)
    wait_until(lambda: all(r["ttft_est_ms"] > 0 for r in table("eu1").values()), 20, "every region's estimate")
    convs = [{"msgs": [{"role": "system", "content": "Conversation %d. %s" % (i, words(i + 1, 120))}], "log": []}
             for i in range(4)]
    for c in convs:
        turn(c, "eu1")
    home = [c["log"][0][0] for c in convs]

    def carried():
        # each worker holds its 3 warm-up prompts' 2 chunks, and each
        # conversation's turn 1 adds 2 (system, user): every gateway must
        # see them all before turn 2
        want = {n: 6 + 2 * home.count(n) for n in names}
        return all(all(tb[n]["prefixes"] >= want[n] for n in names) for tb in (table(x) for x in names))

    wait_until(carried, 20, "the serving regions' records carry prefixes")
    t.ok(True, "the records of the regions that served turn 1 carry prompt prefixes: %r"
         % {r: x["prefixes"] for r, x in table("eu1").items()})
    # Later turns, entering by turns at each gateway.
    for k in range(3):
        for c in convs:
            turn(c, names[k % 3])
        time.sleep(0.5)  # the records take in the new turns
    for i, c in enumerate(convs):
        t.ok(all(r == home[i] and cached > 0 for r, cached in c["log"][1:]),
             "conversation %d: turns 2-4 in %s, where turn 1 left its KV, each with cached tokens: %r"
             % (i, home[i], c["log"]))

    # The home region of conversation 0 is flooded: its next turn goes
    # elsewhere (the prefill it would save is far less than the queue).
    r0 = home[0]
    sock = os.path.join(d, "run-" + r0, "worker-0.sock")
    flood_body = json.dumps({"model": "m", "prompt": words(99, 60), "max_tokens": 1500, "ignore_eos": True,
                             "temperature": 0})
    flood = [subprocess.Popen(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "300", "--unix-socket", sock,
                               "-H", "content-type: application/json", "--data-binary", flood_body,
                               "http://localhost/v1/completions"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(12)]
    entry = [n for n in names if n != r0][0]
    wait_until(lambda: worker_stats(r0).get("queued", 0) >= 6 and table(entry)[r0]["ttft_est_ms"] > 1000, 60,
               "the flood queued in %s, seen by %s" % (r0, entry))
    est = {n: x["ttft_est_ms"] for n, x in table(entry).items()}
    r, cached = turn(convs[0], entry)
    t.ok(r != r0, "conversation 0, its region %s flooded (%d queued; estimates %r): the next turn in %s (cached %d)"
         % (r0, worker_stats(r0).get("queued", -1), est, r, cached))
    for p in flood:
        p.kill()
        p.wait()
finally:
    for p in reversed(procs):
        stop(p)

t.finish()
