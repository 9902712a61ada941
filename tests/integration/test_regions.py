"""Three regions on loopback, one real redis-server: each region is an
`infergate serve` with its own CPU worker on a tiny synthetic model; the
gateways reach each other through delay relays (tests/integration/
delay_relay.py) so that their RTTs differ, over mutual TLS with a CA made
here. Checks latency and cost routing, price changes, residency, a region
that stands still (the response timeout), gateway death, Redis outages and
the fleet-wide rate limit."""
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from delay_relay import DelayRelay
from fault_region import EVENT, FaultRegion
import harness
from harness import INFERGATE, Checks, curl, free_port, gen_model, spawn, tmpdir, wait_until

if not os.path.exists("/usr/bin/redis-server"):
    print("redis-server not installed: skipping")
    sys.exit(77)

t = Checks()
d = tmpdir()
# Big enough that a queue of long requests lasts seconds (the load test
# needs the queue to be seen), small enough that short requests are cheap.
model = gen_model(os.path.join(d, "m.gguf"), dim=256, layers=4, heads=4, kv_heads=2, ffn=512, vocab=300, ctx=1024,
                  type="q8_0", seed=2)


# --- a CA and one certificate per region (server and client use) ---
ca, region_cert = harness.test_ca(d)


# --- redis ---
redis_port = free_port()
redis_args = ["/usr/bin/redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no"]
redis = spawn(redis_args, os.path.join(d, "redis.log"))


def redis_up():
    r = subprocess.run(["redis-cli", "-p", str(redis_port), "ping"], capture_output=True, text=True, timeout=5)
    return r.stdout.strip() == "PONG"


wait_until(redis_up, 20, "redis-server")

# --- three regions ---
names = ["eu1", "us1", "ap1"]
tags = {"eu1": ["eu"], "us1": ["us"], "ap1": ["us", "ap"]}
prices = {"eu1": (3.0, 3.0), "us1": (1.0, 1.0), "ap1": (2.0, 2.0)}
carbons = {"eu1": 100, "us1": 300, "ap1": 200}  # gCO2e/kWh
# one-way delays between pairs (ms): RTTs of about 4, 120 and 240 ms — gaps
# wide enough that a loaded machine's (or a sanitizer build's) scheduling
# noise cannot reorder them
delay = {("eu1", "ap1"): 2, ("eu1", "us1"): 60, ("us1", "ap1"): 120}
port = {n: free_port() for n in names}
peer_port = {n: free_port() for n in names}
relays = {}
for (a, b), ms in delay.items():
    relays[(a, b)] = DelayRelay(peer_port[b], ms)
    relays[(b, a)] = DelayRelay(peer_port[a], ms)

keys = {"open": "k-open", "usonly": "k-us", "euonly": "k-eu", "cheap": "k-cheap", "limited": "k-limited",
        "ops": "k-ops"}


def key_hash(k):
    out = subprocess.run([INFERGATE, "key", "hash", k], capture_output=True, text=True, check=True).stdout
    return re.search(r"[0-9a-f]{64}", out).group(0)


hashes = {t_: key_hash(k) for t_, k in keys.items()}
# The fleet key every gateway signs its record with (redis.record_keys), as
# routing/record_auth.h says; the test signs the records it writes by hand.
FLEET_KEY = "test-fleet-key-0123456789abcdef-0123456789"


def fleet_auth(kind, region, fields):
    return harness.fleet_auth(FLEET_KEY, "t%d" % redis_port, kind, region, fields)


certs = {n: region_cert(n) for n in names}


def config(n, resp_to=600000, health_check_ms=0, hedge=False):
    peers = "\n".join('  - {name: %s, endpoint: "tls:127.0.0.1:%d"}' % (m, relays[(n, m)].port)
                      for m in names if m != n)
    crt, key = certs[n]
    return """
listen:
  - address: "127.0.0.1:%(port)d"
  - address: "127.0.0.1:%(peer)d"
    tls: {cert: "%(crt)s", key: "%(key)s", client_ca: "%(ca)s", peer_names: [%(others)s]}
workers:
  - model: "%(model)s"
    name: m
    threads: 1
    max_seqs: 2
    max_queue: 64
    power_watts: 40
region:
  name: %(name)s
  endpoint: "tls:127.0.0.1:%(peer)d"
  tags: [%(tags)s]
  price: {input: %(pin)s, output: %(pout)s}
  carbon: %(carbon)s
cluster: t%(redis)d
redis: {address: "127.0.0.1:%(redis)d", record_keys: ["%(fleet_key)s"]}
routing:
  policy: latency
  slo_ms: 500
  heartbeat_ms: 200
  stale_after_ms: 1000
  ping_interval_ms: 100
  eject_after: 2
  eject_base_ms: 3000
  retry_budget: 0.5
  health_check_ms: %(hc)d
  hedge: %(hedge)s
  hedge_delay_ms: 100
  hedge_max_tokens: 32
  hedge_share: 1
peers:
%(peers)s
peer_tls: {ca: "%(ca)s", cert: "%(crt)s", key: "%(key)s"}
tenants:
  - {name: open, keys: ["%(h_open)s"]}
  - {name: usonly, keys: ["%(h_us)s"], residency: [us]}
  - {name: euonly, keys: ["%(h_eu)s"], residency: [eu]}
  - {name: cheap, keys: ["%(h_cheap)s"], policy: cost, slo_ms: 2000}
  - {name: limited, keys: ["%(h_lim)s"], rps: 5}
  - {name: ops, keys: ["%(h_ops)s"], admin: true}
logging: {access_log: "%(log)s"}
limits: {response_timeout_ms: %(resp_to)d}
drain_grace_s: 5
runtime_dir: "%(run)s"
""" % dict(port=port[n], peer=peer_port[n], crt=crt, key=key, ca=ca, model=model, name=n,
           others=", ".join(m for m in names if m != n),
           tags=", ".join(tags[n]), pin=prices[n][0], pout=prices[n][1], carbon=carbons[n], redis=redis_port,
           peers=peers,
           h_open=hashes["open"], h_us=hashes["usonly"], h_eu=hashes["euonly"], h_cheap=hashes["cheap"],
           h_lim=hashes["limited"], h_ops=hashes["ops"], log=os.path.join(d, n + ".access.log"),
           run=os.path.join(d, "run-" + n), resp_to=resp_to, fleet_key=FLEET_KEY, hc=health_check_ms,
           hedge="true" if hedge else "false")


gws = {}
for n in names:
    cfg = os.path.join(d, n + ".yaml")
    open(cfg, "w").write(config(n))
    gws[n] = spawn([INFERGATE, "serve", "--config", cfg], os.path.join(d, n + ".log"))


def request(n, tenant, path="/v1/completions", body=None, headers=None, timeout=30):
    """One request entering region n: (status, response headers, body)."""
    return harness.http_request(port[n], keys[tenant], path, body, headers, timeout)


def logged(n, headers):
    """Region n's access-log entry for the response with these headers (None
    if none within 5 s: the line is written as the stream closes, which may
    come just after the client has read the whole answer)."""
    rid = headers.get("x-request-id")
    for _ in range(50):
        lines = [l for l in open(os.path.join(d, n + ".access.log")) if rid and rid in l]
        if lines:
            return json.loads(lines[-1])
        time.sleep(0.1)
    return None


def served_by(n, tenant, **kw):
    s, h, _ = request(n, tenant, **kw)
    return h.get("x-infergate-region") if s == 200 else "status-%d" % s


def table(n):
    s, _, b = request(n, "ops", path="/v1/regions")
    return {r["name"]: r for r in json.loads(b)["regions"]} if s == 200 else {}


def all_fresh():
    for n in names:
        tb = table(n)
        if len(tb) != 3 or any(r["stale"] or not r["healthy"] for r in tb.values()):
            return False
        if any(not r["local"] and r["rtt_ms"] is None for r in tb.values()):
            return False
    return True


try:
    wait_until(all_fresh, 90, "three regions see each other, healthy, with RTTs")
except AssertionError:
    for n in names:
        print(n, json.dumps(table(n), indent=1)[:3000])
        print(open(os.path.join(d, n + ".log")).read()[-3000:])
    raise
t.ok(True, "three gateways share their records through Redis and measure RTTs to each other")
eu_view = table("eu1")
t.ok(all((r.get("model_load") or {}).get("m", {}).get("capacity", 0) > 0 for r in eu_view.values()),
     "each region publishes its load per model, which routing ranks by: %s"
     % {n: r.get("model_load") for n, r in eu_view.items()})
s_, _, b_ = request("us1", "open", path="/v1/models")
t.ok(s_ == 200 and [m_["id"] for m_ in json.loads(b_)["data"]] == ["m"],
     "/v1/models lists the local and the regions' models, each once: %s" % b_[:200])
def rtts():
    return {n: {m: r["rtt_ms"] for m, r in table(n).items() if not r["local"]} for n in names}


def rtt_ordered():
    r = rtts()
    return all(r[a][b] < r[a][c] for a, b, c in [("eu1", "ap1", "us1"), ("us1", "eu1", "ap1"), ("ap1", "eu1", "us1")])


# The smoothed RTTs start from samples taken while everything was starting.
ordered = False
try:
    ordered = wait_until(rtt_ordered, 30, "RTT estimates settle")
except AssertionError:
    pass
print("# RTT ms as each gateway sees it:", rtts())
t.ok(ordered, "RTTs follow the relay delays, as each gateway measures them")

# --- who is a peer: a certificate from the CA that names another region ---
# eu1's peer listener takes us1 and ap1 (peer_names); a certificate from
# the same CA for "app" may connect (applications share the listener) but
# its forwarded requests are refused; us1's are served.
rogue = region_cert("app")


def forwarded_with(cert, residency=None):
    crt, key = cert
    extra = ["-H", "x-infergate-residency: " + residency] if residency else []
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", ca, "--cert", crt, "--key",
                        key] + extra + ["-H", "x-infergate-hop: 1", "-H", "x-infergate-tenant: open", "-H",
                        "content-type: application/json", "--data-binary",
                        json.dumps({"model": "m", "prompt": [1, 5, 7], "max_tokens": 1}),
                        "https://127.0.0.1:%d/v1/completions" % peer_port["eu1"]],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.strip()


t.ok(forwarded_with(rogue) == "403" and forwarded_with(certs["us1"]) == "200",
     "peer_names: a CA certificate for another name is no peer (403), us1's is (200)")
got = (forwarded_with(certs["us1"], "eu"), forwarded_with(certs["us1"], "us"))
t.ok(got == ("200", "421"), "a forwarded request needing a tag eu1 lacks is refused there (421), not served: %s"
     % (got,))

# --- latency policy: entering eu1, a us-only tenant goes to the nearer us region ---
got = [served_by("eu1", "usonly") for _ in range(10)]
t.ok(got == ["ap1"] * 10, "latency: us-only requests entering eu1 go to ap1, the nearest us region (%s)" % got)
s, h, _ = request("eu1", "usonly")
t.ok(h.get("x-infergate-route", "").startswith("latency"), "x-infergate-route gives the reason: %s"
     % h.get("x-infergate-route"))
t.ok(served_by("us1", "open") == "us1", "the local region is chosen when it is the nearest")

# the eu1 -> ap1 link slows down: requests move to us1
relays[("eu1", "ap1")].set_delay(150)
relays[("ap1", "eu1")].set_delay(150)
moved = wait_until(lambda: served_by("eu1", "usonly", timeout=3) == "us1", 30, "requests move off the slower link")
t.ok(moved, "a delay change moves requests to the now-nearer region")
relays[("eu1", "ap1")].set_delay(2)
relays[("ap1", "eu1")].set_delay(2)
wait_until(lambda: served_by("eu1", "usonly", timeout=3) == "ap1", 30, "requests come back to ap1")

# ap1's queue grows: requests move to us1
def long_stream(n):
    body = {"model": "m", "prompt": [1, 5, 7], "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    return subprocess.Popen(["curl", "-sS", "--max-time", "120", "-H", "authorization: Bearer " + keys["open"],
                             "-H", "content-type: application/json", "--data-binary", json.dumps(body),
                             "http://127.0.0.1:%d/v1/completions" % port[n]], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


class Load:
    """Keeps n long streams in flight at region n_ until stopped, however
    fast the build runs them (a queue that lasts)."""

    def __init__(self, region, n):
        self.stop_flag = False
        self.procs = [None] * n
        self.threads = [threading.Thread(target=self.loop, args=(region, i), daemon=True) for i in range(n)]
        for th_ in self.threads:
            th_.start()

    def loop(self, region, i):
        while not self.stop_flag:
            self.procs[i] = long_stream(region)
            self.procs[i].wait()

    def kill(self):
        self.stop_flag = True
        for p_ in self.procs:
            if p_ and p_.poll() is None:
                p_.kill()
        for th_ in self.threads:
            th_.join(10)
        for p_ in self.procs:
            if p_:
                p_.wait()


load = Load("ap1", 10)
try:
    moved = wait_until(lambda: served_by("eu1", "usonly", timeout=3) == "us1", 30, "requests move off the loaded region")
except AssertionError:
    print(json.dumps(table("eu1"), indent=1))
    s_, h_, b_ = request("eu1", "usonly")
    print("# last answer:", s_, h_, b_[:300])
    raise
t.ok(moved, "a growing queue at ap1 moves requests to us1: %s" % {k: (v["running"], v["queued"])
                                                                 for k, v in table("eu1").items()})
load.kill()
try:
    wait_until(lambda: served_by("eu1", "usonly", timeout=3) == "ap1", 30, "ap1 back once its queue drains")
except AssertionError:
    print(json.dumps(table("eu1"), indent=1))
    print(json.dumps(table("ap1"), indent=1))
    raise

# --- cost policy: the cheapest region within the SLO, following a price change ---
# The flood at ap1 just ended: a region that took some of it (the open
# tenant spills by latency) may still be over the SLO for a moment.
got = set()


def all_cheap_to_us1():
    got.clear()
    got.update(served_by(n, "cheap") for n in names)
    return got == {"us1"}


try:
    wait_until(all_cheap_to_us1, 15, "the cost tenant at us1 from every region")
except AssertionError:
    pass
t.ok(got == {"us1"}, "cost: every region sends the cost tenant to us1, the cheapest (%s)" % got)


# --- spend: a request eu1 sends to us1 costs us1's price, counted once: by eu1, where it came in ---
def spend_metric(n, tenant, region):
    m = re.search(r'^infergate_spend_total\{tenant="%s",model="m",region="%s"\} (\S+)$' % (tenant, region),
                  request(n, "ops", path="/metrics")[2].decode(), re.M)
    return float(m.group(1)) if m else 0.0


def energy_metric(n, tenant, region):
    m = re.search(r'^infergate_energy_wh_total\{tenant="%s",region="%s"\} (\S+)$' % (tenant, region),
                  request(n, "ops", path="/metrics")[2].decode(), re.M)
    return float(m.group(1)) if m else 0.0


spent_eu, spent_us = spend_metric("eu1", "cheap", "us1"), spend_metric("us1", "cheap", "us1")
wh_eu, wh_us = energy_metric("eu1", "cheap", "us1"), energy_metric("us1", "cheap", "us1")
s, h, b = request("eu1", "cheap")
u = json.loads(b)["usage"] if s == 200 else {"prompt_tokens": 0, "completion_tokens": 0}
cost = (u["prompt_tokens"] * prices["us1"][0] + u["completion_tokens"] * prices["us1"][1]) / 1e6
counted = wait_until(lambda: spend_metric("eu1", "cheap", "us1") - spent_eu > 0, 5, "eu1 counts the spend") and \
    spend_metric("eu1", "cheap", "us1") - spent_eu
t.ok(s == 200 and h.get("x-infergate-region") == "us1" and abs(counted - cost) < 1e-12 and
     spend_metric("us1", "cheap", "us1") == spent_us,
     "spend: eu1 counts %.9f for the request us1 served (its usage at us1's price: %.9f); us1 counts none of it"
     % (counted, cost))
# its energy: measured at us1 (its worker, its intensity), sent back in the
# answer's trailer, and counted once, by eu1, as us1's
line_eu, line_us = logged("eu1", h), logged("us1", h)
wh = (line_eu or {}).get("energy_wh", 0)
m_us = request("us1", "ops", path="/metrics")[2].decode()
t.ok(wh > 0 and abs(line_eu["gco2e"] - wh * carbons["us1"] / 1000) <= 1e-5 * line_eu["gco2e"]
     and abs(energy_metric("eu1", "cheap", "us1") - wh_eu - wh) <= 1e-5 * wh
     and line_us is not None and "energy_wh" not in line_us and energy_metric("us1", "cheap", "us1") == wh_us
     and "infergate_spend_energy_wh_total" not in m_us,
     "energy: eu1 logs and counts %.3g Wh (%.3g gCO2e at us1's intensity) for the request us1 served; us1 "
     "neither: %s / %s" % (wh, (line_eu or {}).get("gco2e", 0), line_eu, line_us))


# An answer cut short is counted all the same, by the gateway it came in
# to: here its client goes away mid-stream, us1's trailer never comes, and
# eu1 counts the rate us1's answer said (x-infergate-power) for as long as
# the stream ran, as us1's.
def energy_by_region(n, tenant):
    text = request(n, "ops", path="/metrics")[2].decode()
    return {m_.group(1): float(m_.group(2)) for m_ in re.finditer(
        r'^infergate_energy_wh_total\{tenant="%s",region="([^"]*)"\} (\S+)$' % tenant, text, re.M)}


def spend_by_region(n, tenant):
    """{(what, region): value} for tenant's spend and prompt and completion
    tokens in region n's /metrics."""
    text = request(n, "ops", path="/metrics")[2].decode()
    out = {}
    for m_ in re.finditer(r'^infergate_(spend|tokens)_total\{tenant="%s",model="[^"]*",region="([^"]*)"'
                          r'(?:,kind="(\w+)")?\} (\S+)$' % tenant, text, re.M):
        key = (m_.group(3) or "cost", m_.group(2))
        out[key] = out.get(key, 0) + float(m_.group(4))
    return out


def energy_delta(before, after):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def gone_mid_stream(n, tenant, events=5):
    """A stream entering region n whose client leaves after `events` data
    events: its response headers."""
    c = http.client.HTTPConnection("127.0.0.1", port[n], timeout=30)
    body = {"model": "m", "prompt": [1, 5, 7], "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    c.request("POST", "/v1/completions", json.dumps(body),
              {"authorization": "Bearer " + keys[tenant], "content-type": "application/json"})
    r = c.getresponse()
    hd = {k.lower(): v for k, v in r.getheaders()}
    seen = 0
    while seen < events:
        line = r.readline()
        if not line:
            break
        seen += line.startswith(b"data: ")
    c.close()
    return hd


before = energy_by_region("eu1", "cheap")
h = gone_mid_stream("eu1", "cheap")
line_eu = logged("eu1", h) or {}
wh = line_eu.get("energy_wh", 0)
got = energy_delta(before, energy_by_region("eu1", "cheap"))
t.ok(h.get("x-infergate-region") == "us1" and line_eu.get("complete") is False and wh > 0
     and abs(line_eu["gco2e"] - wh * carbons["us1"] / 1000) <= 1e-5 * line_eu["gco2e"]
     and list(got) == ["us1"] and abs(got["us1"] - wh) <= 1e-5 * wh and "cost" in line_eu,
     "energy: a stream whose client left mid-way is counted by eu1 as us1's (%.3g Wh, %s), its spend too: %s"
     % (wh, got, line_eu))



# What every gateway's access log says each tenant spent and used (cost,
# energy) is what the fleet's rows in Redis hold (infergate usage).
def logs_by_tenant():
    out = {}
    for n in names:
        for l in open(os.path.join(d, n + ".access.log")):
            e = json.loads(l)
            o = out.setdefault(e.get("tenant") or "-", [0.0, 0.0])
            o[0] += e.get("cost", 0)
            o[1] += e.get("energy_wh", 0)
    return {k: v for k, v in out.items() if v != [0.0, 0.0]}


def usage_by_tenant():
    r = subprocess.run([INFERGATE, "usage", "--redis", "127.0.0.1:%d" % redis_port, "--cluster", "t%d" % redis_port,
                        "--json"], capture_output=True, text=True, timeout=30)
    out = {}
    for x in (json.loads(r.stdout)["rows"] if r.returncode == 0 else []):
        o = out.setdefault(x["tenant"], [0.0, 0.0])
        o[0] += x["cost"]
        o[1] += x["energy_wh"]
    return out


def same_totals():
    a, b = logs_by_tenant(), usage_by_tenant()
    return set(a) == set(b) and all(abs(a[k][i] - b[k][i]) <= 1e-4 * max(a[k][i], 1e-9) for k in a for i in (0, 1))


try:
    agree = wait_until(same_totals, 10, "Redis's rows hold what the access logs say")
except AssertionError:
    agree = False
t.ok(agree, "spend and energy by tenant: the access logs' sums %s, Redis's rows %s"
     % (logs_by_tenant(), usage_by_tenant()))
# x-infergate-max-cost: the worst case is the estimate the tenant is charged
# (body bytes / 4, and max_tokens 2) at each candidate's price; eu1 (3 per
# million) is over 2.5 x that, ap1 (2) and us1 (1) under it
body = {"model": "m", "prompt": [1, 5, 7], "max_tokens": 2, "temperature": 0}
worst = (len(json.dumps(body)) / 4 + 2) / 1e6
s, h, b = request("eu1", "open", body=body, headers={"x-infergate-max-cost": "%.12f" % (2.5 * worst)})
t.ok(s == 200 and h.get("x-infergate-region") in ("ap1", "us1"),
     "max cost: eu1, over it at its own price, passes the request to a cheaper region (%d, %s)"
     % (s, h.get("x-infergate-region")))
s, h, b = request("eu1", "open", body=body, headers={"x-infergate-max-cost": "%.12f" % (0.5 * worst)})
t.ok(s == 400 and json.loads(b)["error"]["code"] == "max_cost_exceeded",
     "max cost: under every region's worst case, 400 max_cost_exceeded: %s" % b[:200])
r = subprocess.run([INFERGATE, "region", "set-price", "us1", "--input", "9", "--output", "9", "--redis",
                    "127.0.0.1:%d" % redis_port, "--cluster", "t%d" % redis_port], capture_output=True, text=True,
                   env=dict(os.environ, INFERGATE_RECORD_KEY=FLEET_KEY))
t.ok(r.returncode == 0, "infergate region set-price: %s" % (r.stdout + r.stderr).strip())
# The change is announced, not waited for until the next full read; how
# fast is reported, not asserted (a test is no benchmark), but the bound
# is well short of the full read and the heartbeat TTL.
t0 = time.monotonic()
wait_until(lambda: all(table(n).get("us1", {}).get("price_input") == 9 for n in names), 10, "price change seen")
price_s = time.monotonic() - t0
switched = wait_until(lambda: all(served_by(n, "cheap") == "ap1" for n in names), 10, "cost routing follows it")
t.ok(switched, "every gateway follows the price change (seen by all in %.2f s)" % price_s)

# --- residency: an eu-pinned tenant is only ever served in eu ---
rng = random.Random(7)
seen = {}
for _ in range(300):
    n = rng.choice(names)
    hdrs = {"x-infergate-residency": "eu"} if rng.random() < 0.3 else None
    where = served_by(n, "euonly", headers=hdrs)
    seen[where] = seen.get(where, 0) + 1
t.ok(set(seen) == {"eu1"}, "300 random eu-tenant requests entering every region were all served in eu1: %s" % seen)
relays[("us1", "eu1")].set_delay(250)
relays[("eu1", "us1")].set_delay(250)
time.sleep(1.5)
t.ok(all(served_by("us1", "euonly") == "eu1" for _ in range(10)), "even when eu1 is the slowest, eu stays in eu1")
# The worker's count of the prompt's tokens (what tpm charges) comes back
# through the region that served it to the gateway that forwarded it.
s, h, b = request("us1", "euonly", body={"model": "m", "prompt": [1, 5, 7, 9], "max_tokens": 2, "temperature": 0})
t.ok(s == 200 and h.get("x-infergate-region") == "eu1" and h.get("x-infergate-prompt-tokens") == "4",
     "a forwarded answer carries the worker's prompt token count back (%d, %s)"
     % (s, h.get("x-infergate-prompt-tokens")))
t.ok(served_by("us1", "usonly", headers={"x-infergate-residency": "eu"}) in ("status-503", "status-404"),
     "a request narrowed to eu by its tenant us-only has nowhere to go: clean error")

# --- fleet-wide rate limit: 5 rps shared by eu1 and us1 ---
time.sleep(1.2)
t0 = time.monotonic()
codes = [request(["eu1", "us1"][i % 2], "limited", body={"model": "m", "prompt": [1], "max_tokens": 1})[0]
         for i in range(20)]
el = time.monotonic() - t0
allowed = codes.count(200)
# The shared bucket allows its burst of 5 and then 5 a second of the time
# the 20 took; each gateway's own bucket would allow twice that.
t.ok(4 <= allowed <= 5 + int(5 * el) + 1 and codes.count(429) == 20 - allowed,
     "shared limit: %d of 20 requests in %.2f s across two gateways allowed at 5 rps (local buckets: 10 + 10 a second)"
     % (allowed, el))

# --- Redis away: zero failed requests, stale marked; back: resync ---
redis.terminate()
redis.wait(10)
fails = 0
t_end = time.monotonic() + 4
while time.monotonic() < t_end:
    for n in names:
        s, _, _ = request(n, "usonly")
        fails += s != 200
tb = table("eu1")
s, _, b = request("eu1", "ops", path="/v1/regions")
body = json.loads(b)
t.ok(fails == 0, "Redis stopped for 4 s: zero failed requests")
t.ok(not body["redis_connected"] and any(r["stale"] for r in tb.values() if not r["local"]),
     "/v1/regions says Redis is away and the records are stale")
redis = spawn(redis_args, os.path.join(d, "redis2.log"))
wait_until(redis_up, 20, "redis-server back")
wait_until(all_fresh, 20, "state resynced after Redis returned")
t.ok(True, "Redis back: every gateway republished and resynced")

# --- regions that exist only as records in Redis ---
class Records:
    """Keeps records of made-up regions fresh in Redis, as their heartbeats
    would: every 0.15 s each is written with a new updated_ms and announced,
    signed with the fleet key unless signed is False."""

    def __init__(self, records, signed=True):
        self.records = records
        self.signed = signed
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.th.start()

    def loop(self):
        while not self.stop_ev.is_set():
            for name, fields in self.records.items():
                f = dict(dict(models="m", price_in="0.1", price_out="0.1", healthy="1"), **fields)
                f["updated_ms"] = str(int(time.time() * 1000))
                if self.signed:
                    f["auth"] = fleet_auth("region", name, f)
                subprocess.run(["redis-cli", "-p", str(redis_port), "HSET", "infergate:t%d:region:%s" % (redis_port, name)]
                               + [x for kv in f.items() for x in kv], capture_output=True, timeout=5)
                subprocess.run(["redis-cli", "-p", str(redis_port), "PUBLISH", "infergate:t%d:events" % redis_port,
                                name], capture_output=True, timeout=5)
            self.stop_ev.wait(0.15)

    def stop(self):
        self.stop_ev.set()
        self.th.join(10)
        subprocess.run(["redis-cli", "-p", str(redis_port), "DEL"]
                       + ["infergate:t%d:region:%s" % (redis_port, n) for n in self.records],
                       capture_output=True, timeout=5)


def fresh_everywhere(name):
    return all(not table(n).get(name, {"stale": True})["stale"] for n in names)


# zz1, cheapest of all, points at a closed port: a failed connect, region
# told, next candidate tried. zz2's endpoint is a Unix socket, which a
# record may not name (anyone who can write to Redis would have gateways
# forward tenants' requests to a local socket): it never enters a table.
# zz3's is cleartext, which a record may not name where peers use mutual
# TLS (prompts would go in clear to a peer never verified): it never enters
# a table either, and is never dialled, though a real h2c server listens
# there.
clear = FaultRegion()
recs = Records({"zz1": {"endpoint": "tls:127.0.0.1:%d" % free_port(), "tags": "zz"},
                "zz2": {"endpoint": "unix:" + os.path.join(d, "run-eu1", "worker-0.sock"), "tags": "zz"},
                "zz3": {"endpoint": "tcp:127.0.0.1:%d" % clear.port, "tags": "zz3"}})
try:
    wait_until(lambda: fresh_everywhere("zz1"), 20, "zz1 seen")
    t.ok(all("zz2" not in table(n) for n in names), "a record naming a Unix socket is refused by every gateway")
    s, h, b = request("eu1", "cheap")
    zz = table("eu1")["zz1"]
    t.ok(s == 200 and h.get("x-infergate-region") in names and zz["consecutive_failures"] >= 1,
         "a peer whose endpoint refuses connections, first by price, fails and the next region serves "
         "(%d from %s; zz1 failures %d)" % (s, h.get("x-infergate-region"), zz["consecutive_failures"]))
    s, h, b = request("eu1", "open", headers={"x-infergate-residency": "zz"})
    err = json.loads(b).get("error", {}) if s else {}
    t.ok(s == 503 and err.get("code") == "no_region_available" and "zz1" in err.get("message", ""),
         "the only region a request may use refuses connections: 503 naming it (%d %s)" % (s, b[:200]))
    s, h, b = request("eu1", "open", headers={"x-infergate-residency": "zz"})
    t.ok(s == 503 and table("eu1")["zz1"]["ejected"], "after eject_after failures it is ejected (%d %s)"
         % (s, b[:200]))
    t.ok(gws["eu1"].poll() is None, "eu1 still runs")
    s, h, b = request("eu1", "open", headers={"x-infergate-residency": "zz3"})
    t.ok(s == 503 and not clear.requests and all("zz3" not in table(n) for n in names),
         "a record naming a cleartext endpoint is refused where peers use mutual TLS, and not dialled "
         "(%d, %d requests there)" % (s, len(clear.requests)))
finally:
    recs.stop()
    clear.stop()
# --- who may add a region, and who is a region ---
# zz4 is written by hand without the fleet key: whoever can write to Redis
# would otherwise add a region that tenants' prompts go to. zz5 is signed
# (as if its writer held the fleet key) but its endpoint serves a
# certificate of the fleet's CA made for another name ("app"): it is no
# region zz5, and gets no request.
def log_of(n):
    return open(os.path.join(d, n + ".log")).read()


def metric(n, name):
    m = re.search(r"^%s (\S+)$" % name, request(n, "ops", path="/metrics")[2].decode(), re.M)
    return float(m.group(1)) if m else 0


impostor = FaultRegion(tls=rogue)
unsigned = Records({"zz4": {"endpoint": "tls:127.0.0.1:%d" % impostor.port, "tags": "zz4"}}, signed=False)
recs = Records({"zz5": {"endpoint": "tls:127.0.0.1:%d" % impostor.port, "tags": "zz5"}})
try:
    wait_until(lambda: fresh_everywhere("zz5") and "record of region zz4: no auth field" in log_of("eu1"), 20,
               "zz5 seen, zz4 refused")
    t.ok(all("zz4" not in table(n) for n in names) and metric("eu1", "infergate_region_records_refused_total") > 0,
         "a record no fleet key proves is ignored by every gateway, logged and counted")
    s, h, b = request("eu1", "open", headers={"x-infergate-residency": "zz5"})
    zz = table("eu1")["zz5"]
    t.ok(s == 503 and not impostor.requests and zz["consecutive_failures"] >= 1,
         "a region whose endpoint's certificate names another gets no request, and the try counts against it "
         "(%d, %d requests there, %d failures)" % (s, len(impostor.requests), zz["consecutive_failures"]))
    t.ok("is not region zz5: its certificate (CN app) does not name it" in log_of("eu1")
         and metric("eu1", "infergate_peer_identity_refused_total") > 0,
         "the refused peer is logged and counted")
finally:
    recs.stop()
    unsigned.stop()
    impostor.stop()

# gone from Redis, the zz records leave the candidates as they go stale
wait_until(lambda: all(table(n).get(z, {"stale": True})["stale"] for n in names for z in ("zz1", "zz3", "zz5")), 20,
           "the zz records stale")

# --- what a region answers that a real one produces only by accident ---
# fk1 is a fault-injecting stand-in (fault_region.py), the cheapest of all
# and the only region tagged fk.
fault = FaultRegion(tls=region_cert("fk1"))
recs = Records({"fk1": {"endpoint": "tls:127.0.0.1:%d" % fault.port, "tags": "fk", "price_in": "0.01",
                        "price_out": "0.01"}})
try:
    wait_until(lambda: fresh_everywhere("fk1"), 20, "fk1 seen")
    # A stream whose region fails after one whole event and half of the
    # next: the client gets the whole event, then the error event, and
    # never the half (which would have glued the two into broken JSON).
    fk = {"x-infergate-residency": "fk"}
    s, h, b = request("eu1", "open", headers=fk, body={"model": "m", "prompt": "split", "stream": True})
    events = [e for e in b.split(b"\n\n") if e]

    def error_code(ev):
        try:
            return json.loads(ev[6:])["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None

    t.ok(s == 200 and len(events) == 2 and events[0] + b"\n\n" == EVENT and error_code(events[1]) == "upstream_failed",
         "a region failing mid-event: the whole event, then a clean error event (%r)" % b[:400])
    e = logged("eu1", h) or {}
    t.ok(e.get("status") == 200 and e.get("complete") is False and e.get("upstream_error") == "reset",
         "the cut stream is logged as its 200, not complete: %s" % e)
    # Its energy: fk1 said its rate (50 W at 200 gCO2e/kWh) and no trailer
    # came; eu1 counts that rate for as long as the stream ran, as fk1's.
    wh = e.get("energy_wh", 0)
    t.ok(wh > 0 and abs(e["gco2e"] - wh * 0.2) <= 1e-5 * e["gco2e"],
         "energy: the cut stream is counted at the rate fk1 said: %s" % e)
    # A stream that ends cleanly on an error event (a worker whose model
    # failed mid-stream) is passed on whole, and counts as fk1's failure.
    request("eu1", "open", headers=fk, body={"model": "m", "prompt": "hello", "max_tokens": 1})
    fails0 = table("eu1")["fk1"]["consecutive_failures"]
    before = energy_by_region("eu1", "open")
    s, h, b = request("eu1", "open", headers=fk, body={"model": "m", "prompt": "error", "stream": True}, timeout=10)
    events = [e for e in b.split(b"\n\n") if e]
    fails1 = table("eu1")["fk1"]["consecutive_failures"]
    t.ok(s == 200 and len(events) == 2 and b'"the model failed"' in events[1] and fails0 == 0 and fails1 == 1,
         "an error event mid-stream is passed on and counts against the region (failures %d -> %d)"
         % (fails0, fails1))
    e = logged("eu1", h) or {}
    got = energy_delta(before, energy_by_region("eu1", "open"))
    t.ok(e.get("energy_wh", 0) > 0 and list(got) == ["fk1"] and abs(got["fk1"] - e["energy_wh"]) <= 1e-5 * got["fk1"],
         "energy: a stream ended by an error event is counted as fk1's, in the log and /metrics (%s): %s" % (got, e))
    # A stream whose last event lacks its blank line: what was held back
    # goes out as it is, and the response ends.
    s, h, b = request("eu1", "open", headers=fk, body={"model": "m", "prompt": "tail", "stream": True}, timeout=10)
    t.ok(s == 200 and b == EVENT + b"data: [DONE]\n", "a stream ending without a blank line ends, whole (%d %r)"
         % (s, b[-80:]))
    t.ok((logged("eu1", h) or {}).get("complete") is True, "and is logged complete")
    m = request("eu1", "ops", path="/metrics")[2].decode()
    t.ok('infergate_requests_incomplete_total{reason="reset"} ' in m
         and 'infergate_requests_incomplete_total{reason="stream_error"} ' in m,
         "/metrics counts the answers cut short, by why")
    # A region's 504 (its worker stood still) is passed on, not tried at the
    # next region; its 502 (its worker failed before answering) is. A good
    # answer before each clears fk1's failures, so it is not ejected
    # (eject_after 2) and each request really goes to it first.
    def fk_ok():
        return request("eu1", "open", headers=fk, body={"model": "m", "prompt": "hello", "max_tokens": 1})[0]

    def via_fk1(fault_kind, timeout=30):
        """A cost-tenant request (fk1 first) that fk1 answers with fault_kind:
        status, headers, body, whether fk1 got exactly it, fk1's failures."""
        before = len(fault.requests)
        s, h, b = request("eu1", "cheap", body={"model": "m", "prompt": fault_kind, "max_tokens": 1},
                          timeout=timeout)
        return s, h, b, fault.requests[before:] == [fault_kind], table("eu1")["fk1"]["consecutive_failures"]

    t.ok(fk_ok() == 200, "fk1 answers")

    def unknown_fk1():
        m_ = re.search(r'^infergate_energy_unknown_tries_total\{region="fk1"\} (\S+)$',
                       request("eu1", "ops", path="/metrics")[2].decode(), re.M)
        return float(m_.group(1)) if m_ else 0

    # fk1's plain answer says no power (as an older version's would): its
    # energy is not known, and is counted as such, not as 0 Wh.
    u0 = unknown_fk1()
    fk_ok()
    u1 = unknown_fk1()
    t.ok(u1 == u0 + 1, "an answer that says no power counts in infergate_energy_unknown_tries_total (%s -> %s)"
         % (u0, u1))
    # Token replay (issue 32): fk1 plays a region that dies mid-stream
    # after a real worker's first events (tags and run included); eu1
    # resumes the stream at us1 from the tokens delivered, and the client's
    # text equals the unbroken answer's, under one id, no tag leaked.
    body = {"model": "m", "prompt": [2, 6, 9], "max_tokens": 60, "temperature": 0, "stream": True}
    s, h, ref = curl("http://localhost/v1/completions", unix=os.path.join(d, "run-eu1", "worker-0.sock"),
                     data=body, headers=["x-infergate-replay: 1"])
    ref_events = [e + b"\n\n" for e in ref.split(b"\n\n") if e]
    fault.replay_script = (h.get("x-infergate-replay"), b"".join(ref_events[:12]))

    def texts(raw):
        evs = [json.loads(e[e.index(b"data: {") + 6:]) for e in raw.split(b"\n\n") if b"data: {" in e]
        return "".join(e["choices"][0]["text"] for e in evs if e.get("choices")), evs

    before = energy_by_region("eu1", "cheap")
    spent0 = spend_by_region("eu1", "cheap")
    s2, h2_, b2 = request("eu1", "cheap", body=body)
    text0, _ = texts(ref)
    text1, evs1 = texts(b2)
    t.ok(s == 200 and s2 == 200 and h2_.get("x-infergate-region") == "fk1" and b": ig" not in b2 and
         b2.endswith(b"data: [DONE]\n\n") and len({e["id"] for e in evs1}) == 1 and not
         any("error" in e for e in evs1) and text1 == text0 and text0,
         "a stream whose region dies mid-stream goes on at the next region by token replay: one id, the unbroken "
         "text (%d %d %d vs %d chars, %r)" % (s, s2, len(text1), len(text0), b2[-160:]))
    t.ok(re.search(r'event=replay request=\S+ from="region fk1" to="region us1" tokens=\d+',
                   open(os.path.join(d, "eu1.log")).read()) is not None, "eu1 replayed it at us1 (logged)")
    # Both regions' shares count, once each, each as its own: fk1's at the
    # rate it said, the next one's by its trailer.
    e = logged("eu1", h2_) or {}
    got = energy_delta(before, energy_by_region("eu1", "cheap"))
    nxt = [r_ for r_ in got if r_ != "fk1"]
    t.ok(len(got) == 2 and "fk1" in got and len(nxt) == 1 and abs(sum(got.values()) - e.get("energy_wh", 0))
         <= 1e-5 * e.get("energy_wh", 1) and abs(e["gco2e"] - got["fk1"] * 0.2 - got[nxt[0]] * carbons[nxt[0]] / 1000)
         <= 1e-5 * e["gco2e"],
         "energy: a stream replayed mid-way counts fk1's share and %s's, the log their sum (%s): %s"
         % (nxt, got, e))
    # Spend likewise: fk1's share (the prompt and the tokens it delivered)
    # at fk1's prices, the rest at the next region's; the log's cost is
    # their sum, its tokens theirs.
    k = [int(x) for x in re.findall(r'event=replay request=%s from="region fk1" to="region \S+" tokens=(\d+)'
                                    % re.escape(h2_.get("x-request-id", "")), open(os.path.join(d, "eu1.log")).read())]
    spent = energy_delta(spent0, spend_by_region("eu1", "cheap"))
    rec_ = table("eu1").get(nxt[0], {}) if nxt else {}
    p_fk = spent.get(("prompt", "fk1"), 0)
    want_fk = (p_fk * 0.01 + k[-1] * 0.01) / 1e6 if k else -1
    want_nxt = (e.get("tokens", 0) - k[-1]) * rec_.get("price_output", -1) / 1e6 if k else -1
    t.ok(k and p_fk >= 3 and spent.get(("completion", "fk1")) == k[-1] and 0 < k[-1] < e.get("tokens", 0)
         and spent.get(("completion", nxt[0])) == e["tokens"] - k[-1] and ("prompt", nxt[0]) not in spent
         and abs(spent.get(("cost", "fk1"), 0) - want_fk) <= 1e-6 * want_fk
         and abs(spent.get(("cost", nxt[0]), 0) - want_nxt) <= 1e-6 * want_nxt
         and abs(e.get("cost", 0) - want_fk - want_nxt) <= 1e-6 * (want_fk + want_nxt),
         "spend: a stream replayed mid-way counts fk1's share at fk1's prices (prompt and %s tokens) and the rest "
         "at %s's, the log's cost their sum (%s): %s" % (k, nxt, spent, e))
    fault.replay_script = None
    t.ok(fk_ok() == 200, "fk1 answers after the replay")
    s, h, b, only, _ = via_fk1("504")
    t.ok(s == 504 and only, "a region's 504 is not retried elsewhere (%d %s)" % (s, b[:200]))
    t.ok(fk_ok() == 200, "fk1 answers again")
    s, h, b, only, _ = via_fk1("502")
    t.ok(s == 200 and h.get("x-infergate-region") in names and only
         and h.get("x-infergate-route", "").startswith("failover to candidate 2 of ")
         and "first choice fk1: " in h.get("x-infergate-route", ""),
         "a region's 502 is retried at the next region, and the route header says so (%d %s %r)"
         % (s, h.get("x-infergate-region"), h.get("x-infergate-route")))
    # A region that says it lacks the residency (421: its record, as we
    # read it, was out of date) is wrong for the request: the next one.
    t.ok(fk_ok() == 200, "fk1 answers before the 421")
    s, h, b, only, fails = via_fk1("421")
    t.ok(s == 200 and h.get("x-infergate-region") in names and only and fails == 1,
         "a region's 421 is retried at the next region and counts against it (%d %s, fk1 failures %d)"
         % (s, h.get("x-infergate-region"), fails))
    t.ok(fault.residency[-2:] == ["fk", None],
         "the residency a request needs goes with it to the region, for that region to check: %s"
         % fault.residency[-2:])
    # With no region left to try, a region's 421 (or 401, 403, 404) is not
    # passed on: to the client it would say the client misdirected it.
    t.ok(fk_ok() == 200, "fk1 answers before a last-candidate 421")
    s, _, b = request("eu1", "open", headers=fk, body={"model": "m", "prompt": "421", "max_tokens": 1})
    t.ok(s == 502 and b"upstream_failed" in b and b"answered 421" in b,
         "a region's 421 with no region left to try is a 502 to the client (%d %r)" % (s, b[:200]))
    # A region at capacity (429) is alive, only busy: the next region takes
    # the request and nothing counts against fk1; with none left, the
    # client is told to retry when fk1 said.
    t.ok(fk_ok() == 200, "fk1 answers before the 429")
    s, h, b, only, fails = via_fk1("429")
    t.ok(s == 200 and h.get("x-infergate-region") in names and only and fails == 0,
         "a region's 429 is retried at the next region and is no failure of fk1's (%d %s, fk1 failures %d)"
         % (s, h.get("x-infergate-region"), fails))
    s, h, b = request("eu1", "open", headers=fk, body={"model": "m", "prompt": "429", "max_tokens": 1})
    t.ok(s == 429 and b"queue_full" in b and h.get("retry-after") == "7",
         "a region's 429 with no region left to try: 429 queue_full, its Retry-After kept (%d %s %r)"
         % (s, h.get("retry-after"), b[:200]))
    # A refused stream (RFC 9113 8.7: not processed) goes to the next region
    # and does not count against fk1.
    t.ok(fk_ok() == 200, "fk1 answers once more")
    s, h, b, only, fails = via_fk1("refuse")
    t.ok(s == 200 and h.get("x-infergate-region") in names and only and fails == 0,
         "a refused stream is sent to the next region and is no failure of fk1's (%d %s, fk1 failures %d)"
         % (s, h.get("x-infergate-region"), fails))
    # So is a stream above a GOAWAY's last stream id (RFC 9113 6.8: never
    # processed), as from a region that began draining.
    t.ok(fk_ok() == 200, "fk1 answers after the refusal")
    s, h, b, only, fails = via_fk1("goaway")
    t.ok(s == 200 and h.get("x-infergate-region") in names and only and fails == 0,
         "a stream past a GOAWAY is sent to the next region and is no failure of fk1's (%d %s, fk1 failures %d)"
         % (s, h.get("x-infergate-region"), fails))
    t.ok(fk_ok() == 200, "fk1 answers on a new connection after its GOAWAY")
    # A region that said GOAWAY, keeping this stream, and then wedged: the
    # PINGs go on while the draining connection still carries streams, so
    # the stream fails as a timeout after ten missed ones (ping_interval_ms
    # 100) and goes to the next region; without them it was held until the
    # wedged peer closed (here after 20 s: then a reset).
    s, h, b, only, _ = via_fk1("hang", timeout=60)
    e = logged("eu1", h) or {}
    t.ok(s == 200 and only and e.get("upstream_error") == "timeout",
         "a stream on a draining connection whose peer wedged fails on missed PINGs and moves on (%d %s %s)"
         % (s, h.get("x-infergate-region"), e.get("upstream_error")))
finally:
    recs.stop()
    fault.stop()

# --- a region that stands still: limits.response_timeout_ms ---
# eu1 is reloaded with response_timeout_ms 500 and sends the us-only tenant
# to ap1, whose one worker is then frozen (SIGSTOP): ap1's gateway takes the
# request and sends nothing back. eu1 answers 504 at 0.5 s, before ap1's
# own PINGs to its worker (every 100 ms, failing after ten) would turn it
# into a 502 that eu1 retries at us1; and eu1 does not try us1 for a stall.
def worker_pid(n):
    pids = re.findall(r"worker 0 \(model \w+, device \w+\) started: pid (\d+)",
                      open(os.path.join(d, n + ".log")).read())
    return int(pids[-1])


def reload_eu1(resp_to, health_check_ms=0, hedge=False):
    before = open(os.path.join(d, "eu1.log")).read().count("reloaded")
    open(os.path.join(d, "eu1.yaml"), "w").write(config("eu1", resp_to, health_check_ms, hedge))
    gws["eu1"].send_signal(signal.SIGHUP)
    wait_until(lambda: open(os.path.join(d, "eu1.log")).read().count("reloaded") > before, 10, "eu1 reloaded")


reload_eu1(500)
wait_until(lambda: served_by("eu1", "usonly", timeout=3) == "ap1", 30, "eu1 sends the us-only tenant to ap1")
ap1_worker = worker_pid("ap1")
os.kill(ap1_worker, signal.SIGSTOP)
try:
    t0 = time.monotonic()
    s, h, b = request("eu1", "usonly", timeout=30)
    took = time.monotonic() - t0
    code = json.loads(b).get("error", {}).get("code") if s else None
    t.ok(s == 504 and code == "upstream_timeout",
         "a region that sends nothing back for response_timeout_ms: 504 upstream_timeout after %.1f s, no retry "
         "at us1 (%d %s)" % (took, s, b[:160]))
finally:
    os.kill(ap1_worker, signal.SIGCONT)
reload_eu1(600000)
wait_until(lambda: served_by("eu1", "usonly", timeout=3) == "ap1", 30, "ap1 serves again once thawed")
t.ok("certificates updated, peer_tls's too" in open(os.path.join(d, "eu1.log")).read(),
     "a reload reads peer_tls's certificate and key again, as the listeners' (renewed in place)")

# --- active health checks (issue 32 point 4), turned on and off by reload ---
# eu1 checks us1 and ap1 over mutual TLS as forwarded one-token requests;
# the peers serve them and keep them out of their access logs.
reload_eu1(600000, health_check_ms=200)


def checks_pass():
    tb = table("eu1")
    return all((tb.get(n_, {}).get("check") or {}).get("state") == "passing" for n_ in ("us1", "ap1"))


passing = wait_until(checks_pass, 30, "eu1's checks of us1 and ap1 pass")
served = metric("us1", "infergate_health_checks_served_total")
t.ok(passing and served > 0 and table("eu1")["eu1"].get("check") is None,
     "a reload turns the checks on: eu1 checks its peers (not itself) and us1 served %d of them" % served)
t.ok(not any('"request_id":"health-' in l for n_ in names for l in open(os.path.join(d, n_ + ".access.log"))),
     "the peers keep the checks out of their access logs")
reload_eu1(600000)
t.ok(wait_until(lambda: "health checks off" in log_of("eu1") and table("eu1")["us1"].get("check") is None, 10,
                "checks off"), "a reload turns them off")

# --- hedged requests (issue 32 point 2): a slow region loses to the hedge ---
# eu1 sends the cost tenant to us1, the cheapest; with us1 behind 600 ms
# relays each way (within the tenant's 2 s SLO) and hedging on, the copy
# that goes 100 ms later to the next region answers first, and us1's copy
# is reset.
def hedges(n):
    text = request(n, "ops", path="/metrics")[2].decode()
    return {k: float(v) for k, v in re.findall(r'^infergate_hedges_total\{outcome="(\w+)"\} (\S+)$', text, re.M)}


reload_eu1(600000, hedge=True)
relays[("eu1", "us1")].set_delay(600)
relays[("us1", "eu1")].set_delay(600)
try:
    h0 = hedges("eu1")
    t0 = time.time()
    s, h, b = request("eu1", "cheap", body={"model": "m", "prompt": [1, 5, 7, 9], "max_tokens": 8, "temperature": 0})
    took = time.time() - t0
    h1 = wait_until(lambda: (lambda x: x if x.get("cancelled", 0) > h0.get("cancelled", 0) else None)(hedges("eu1")),
                    10, "the losing copy cancelled")
    t.ok(s == 200 and h.get("x-infergate-region") not in (None, "us1") and
         h1.get("won_hedge", 0) == h0.get("won_hedge", 0) + 1 and h1.get("sent", 0) == h0.get("sent", 0) + 1 and
         h.get("x-infergate-route", "").startswith("hedged copy to candidate 2 of "),
         "a slow region (600 ms relays) loses to the hedge: answered by %s in %.2f s, us1's copy cancelled (%r); "
         "route: %s" % (h.get("x-infergate-region"), took, h1, h.get("x-infergate-route")))
finally:
    relays[("eu1", "us1")].set_delay(250)
    relays[("us1", "eu1")].set_delay(250)
    reload_eu1(600000)

# --- a restarted worker has no estimates yet: its region keeps its last ones ---
# (averaged in as 0, they made a region of fresh workers look free)
before = wait_until(lambda: (lambda r: r if r and r["ttft_ms"] > 0 and r["tpot_ms"] > 0 else None)(
    table("ap1").get("ap1")), 10, "ap1's estimates")
killed = worker_pid("ap1")
os.kill(killed, signal.SIGKILL)
wait_until(lambda: worker_pid("ap1") != killed and "pid %d) is ready" % worker_pid("ap1")
           in open(os.path.join(d, "ap1.log")).read(), 60, "ap1's worker restarted and ready")
time.sleep(0.5)  # a heartbeat (200 ms) with the fresh worker counted
after = table("ap1").get("ap1") or {}
m_after = (after.get("model_load") or {}).get("m", {})
t.ok(after.get("healthy") and after.get("ttft_ms", 0) > 0 and after.get("tpot_ms", 0) > 0
     and m_after.get("ttft_ms", 0) > 0,
     "a region whose only worker restarted keeps its last estimates, not 0: ttft %.1f -> %.1f ms, tpot %.1f -> "
     "%.1f ms" % (before["ttft_ms"], after.get("ttft_ms", 0), before["tpot_ms"], after.get("tpot_ms", 0)))

# --- a second gateway in ap1, behind the same endpoint (a load balancer's) ---
# Both write their entry in ap1's record; peers add their capacity up. When
# one stops (SIGTERM: a drain), ap1 stays healthy in every peer's view on
# the other's entry: one record per region name had turned it unhealthy
# for its peers at each rolling restart.
ap1b_port, ap1b_peer = free_port(), free_port()
ap1b_cfg = (config("ap1").replace('address: "127.0.0.1:%d"' % port["ap1"], 'address: "127.0.0.1:%d"' % ap1b_port)
            .replace('address: "127.0.0.1:%d"' % peer_port["ap1"], 'address: "127.0.0.1:%d"' % ap1b_peer)
            .replace(os.path.join(d, "ap1.access.log"), os.path.join(d, "ap1b.access.log"))
            .replace(os.path.join(d, "run-ap1"), os.path.join(d, "run-ap1b")))
open(os.path.join(d, "ap1b.yaml"), "w").write(ap1b_cfg)
ap1b = spawn([INFERGATE, "serve", "--config", os.path.join(d, "ap1b.yaml")], os.path.join(d, "ap1b.log"))


def ap1_seen(n_inst, capacity):
    return all((lambda r: r.get("instances") == n_inst and r.get("capacity") == capacity and r.get("healthy"))(
        table(n).get("ap1", {})) for n in ("eu1", "us1"))


try:
    wait_until(lambda: ap1_seen(2, 4), 30, "ap1's two gateways merged")
except AssertionError:
    print(json.dumps(table("eu1").get("ap1"), indent=1))
    print(open(os.path.join(d, "ap1b.log")).read()[-3000:])
    raise
t.ok(True, "two gateways under the name ap1: peers see one region of both gateways' capacity (2 + 2)")
unhealthy_seen = []
ap1b.terminate()
t_end = time.monotonic() + 20
while ap1b.poll() is None and time.monotonic() < t_end:
    unhealthy_seen += [n for n in ("eu1", "us1") if not table(n).get("ap1", {}).get("healthy")]
t_end = time.monotonic() + 2
while time.monotonic() < t_end:  # its entry, drained, is still there for a TTL
    unhealthy_seen += [n for n in ("eu1", "us1") if not table(n).get("ap1", {}).get("healthy")]
t.ok(ap1b.poll() == 0 and not unhealthy_seen and wait_until(lambda: ap1_seen(1, 2), 10, "ap1b's entry gone"),
     "SIGTERM of one of ap1's gateways: ap1 stayed healthy for its peers throughout (%d unhealthy views), and "
     "counts the other's capacity alone" % len(unhealthy_seen))

# --- a region's gateway dies: within a second nothing goes there, nothing fails ---
results = []
kill_at = [None]


def hammer(duration):
    end = time.monotonic() + duration
    while time.monotonic() < end:
        s, h, _ = request("eu1", "usonly")
        results.append((time.monotonic(), s, h.get("x-infergate-region")))


th = threading.Thread(target=hammer, args=(4,))
th.start()
time.sleep(1.0)
kill_at[0] = time.monotonic()
gws["ap1"].kill()
th.join()
failed = [r for r in results if r[1] != 200]
to_ap1 = [r[0] - kill_at[0] for r in results if r[0] > kill_at[0] and r[2] == "ap1"]
failover = max(to_ap1) if to_ap1 else 0.0
t.ok(not failed, "SIGKILL of ap1's gateway: no request failed (%d requests, %d failed)" % (len(results), len(failed)))
t.ok(failover < 1.0, "no request served by ap1 later than %.3f s after the kill" % failover)
first_us1 = min((r[0] - kill_at[0] for r in results if r[0] > kill_at[0] and r[2] == "us1"), default=None)
print("# failover: first request served by us1 %.3f s after the kill" % (first_us1 or -1))
t.ok(first_us1 is not None, "requests fail over to us1")

# --- the eu region down: the eu tenant gets a clean 503, never a foreign region ---
gws["eu1"].kill()
wait_until(lambda: served_by("us1", "euonly") not in ("eu1",), 10, "eu1 gone")
got = [served_by("us1", "euonly") for _ in range(10)]
t.ok(all(g_ == "status-503" for g_ in got), "eu1 down: the eu tenant gets 503, not another region (%s)" % got)

# --- a clean stop says so at once: peers do not wait out the record's TTL ---
import socket
redis_conn = socket.create_connection(("127.0.0.1", redis_port), timeout=5)
redis_in = redis_conn.makefile("rb")


def record_field(name, field):
    """HGET on one connection (a redis-cli per read was tens of ms under
    load, against a record that lapses 600 ms after its last write);
    "" for none."""
    args = [b"HGET", b"infergate:t%d:region:%s" % (redis_port, name.encode()), field.encode()]
    redis_conn.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a_), a_) for a_ in args))
    head = redis_in.readline()
    if not head.startswith(b"$") or head.startswith(b"$-1"):
        return ""
    return redis_in.read(int(head[1:]) + 2)[:-2].decode()


was_healthy = record_field("us1", "healthy")
gws["us1"].terminate()
# Read while it stops: the record says healthy 0 from the drain's start and
# lapses a TTL (3 heartbeats) after its last write, so one read after the
# exit found it gone when a loaded machine's worker shutdown took longer.
seen = []
t_end = time.monotonic() + 20
while gws["us1"].poll() is None and time.monotonic() < t_end:
    seen.append(record_field("us1", "healthy"))
    time.sleep(0.02)
stopped_rc = gws["us1"].wait(20)
seen.append(record_field("us1", "healthy"))  # "" once the TTL is over
said = "".join(v or "-" for v in seen)
# after the first 0: never healthy again, the record kept or lapsed
after = said[said.find("0"):] if "0" in said else ""
t.ok(was_healthy == "1" and stopped_rc == 0 and after and set(after) <= {"0", "-"},
     "SIGTERM of us1's gateway: its record says healthy 0 once it stops, and never 1 again (was %s, then %s)"
     % (was_healthy, said[-40:]))

for n in names:
    if gws[n].poll() is None:
        gws[n].terminate()
        gws[n].wait(20)
for r_ in relays.values():
    r_.close()
t.finish()
