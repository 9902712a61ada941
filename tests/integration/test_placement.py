"""Placement by intent (issue 31 items 1, 2 and 5) with real processes: one
`infergate serve` (region gw1, a CPU worker on a tiny synthetic model), a
real redis-server, and two more regions (pa, pb) whose records are kept
fresh in Redis and whose gateways are HTTP/2 stand-ins (fault_region.py)
answering every request. Checks:
  - policy primary [gw1, pa, pb]: gw1's own queue grows past the SLO and
    requests spill to pa; it drains and they come back, once, after the
    hold time (switches counted by the gateway: exactly 2);
  - policy carbon follows `infergate region set-carbon` (the time printed), for
    a peer and for the gateway's own region, and region.carbon_source (a
    URL polled every second) sets gw1's figure, and a file a second
    gateway's; a bad figure or answer is refused and logged naming the key;
  - x-infergate-policy: allowed (tenant's allow_policies), refused (403),
    malformed (400); the intent shows in x-infergate-route, the access log
    and /v1/regions' last decisions;
  - energy and gCO2e per request: access log and /metrics;
  - active health checks (issue 32 point 4): a region (pf, a stand-in) that
    takes connections and answers PINGs but fails every completion is
    ejected by gw1's checks alone, with no user request sent its way, and
    returns when it heals; gw1's own worker, stopped (SIGSTOP), is ejected
    by its checks and returns on SIGCONT."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from fault_region import FaultRegion
from harness import (INFERGATE, Checks, fleet_auth, free_port, gen_model, http_request, spawn, stop, tmpdir,
                     wait_until)

if not os.path.exists("/usr/bin/redis-server"):
    print("redis-server not installed: skipping")
    sys.exit(77)

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=256, layers=4, heads=4, kv_heads=2, ffn=512, vocab=300, ctx=1024,
                  type="q8_0", seed=2)

redis_port = free_port()
redis = spawn(["/usr/bin/redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no"], os.path.join(d, "redis.log"))
wait_until(lambda: subprocess.run(["redis-cli", "-p", str(redis_port), "ping"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() == "PONG", 20, "redis-server")
FLEET_KEY = "test-fleet-key-0123456789abcdef-0123456789"
CLUSTER = "p%d" % redis_port


keys = {"open": "k-open", "strict": "k-strict", "green": "k-green", "ops": "k-ops", "rented": "k-rented"}


def key_hash(k):
    out = subprocess.run([INFERGATE, "key", "hash", k], capture_output=True, text=True, check=True).stdout
    return re.search(r"[0-9a-f]{64}", out).group(0)


h = {n: key_hash(k) for n, k in keys.items()}
# gw1 polls its figure over HTTP; a second gateway (solo) reads it from a file
import http.server
figure = {"body": b"400\n", "status": 200}


class Figure(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(figure["status"])
        self.end_headers()
        self.wfile.write(figure["body"])

    def log_message(self, *a):
        pass


figure_srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Figure)
threading.Thread(target=figure_srv.serve_forever, daemon=True).start()
carbon_url = "http://127.0.0.1:%d/grid/now" % figure_srv.server_address[1]
carbon_file = os.path.join(d, "carbon.txt")
open(carbon_file, "w").write("250\n")
port = free_port()
cfg = os.path.join(d, "gw1.yaml")
open(cfg, "w").write("""
listen:
  - address: "127.0.0.1:%(port)d"
workers:
  - model: "%(model)s"
    name: m
    threads: 1
    max_seqs: 2
    max_queue: 64
    power_watts: 50
region:
  name: gw1
  endpoint: "tcp:127.0.0.1:%(port)d"
  price: {input: 1, output: 1}
  carbon: 400
  carbon_source: "%(carbon_url)s"
  carbon_poll_ms: 1000
cluster: %(cluster)s
redis: {address: "127.0.0.1:%(redis)d", record_keys: ["%(fleet_key)s"]}
routing:
  policy: primary
  primary: [gw1, pa, pb]
  primary_return: 0.5
  primary_hold_ms: 1500
  slo_ms: 1000  # well above the stand-ins' RTT on a loaded machine; gw1's loaded queue is seconds
  spread: false
  heartbeat_ms: 200
  stale_after_ms: 4000  # the records of pa and pb are kept by redis-cli runs, slow on a loaded machine
  ping_interval_ms: 100
  health_check_ms: 300
  health_check_timeout_ms: 2000
  health_check_failures: 2
  health_check_successes: 2
tenants:
  - {name: open, keys: ["%(h_open)s"], allow_policies: [carbon, latency]}
  - {name: strict, keys: ["%(h_strict)s"]}
  - {name: green, keys: ["%(h_green)s"], policy: carbon, slo_ms: 5000}
  - {name: ops, keys: ["%(h_ops)s"], admin: true}
  - {name: rented, keys: ["%(h_rented)s"], policy: primary, primary: [pb, pa]}
logging: {access_log: "%(log)s"}
runtime_dir: "%(run)s"
""" % dict(port=port, model=model, carbon_url=carbon_url, cluster=CLUSTER, redis=redis_port, fleet_key=FLEET_KEY,
           h_open=h["open"], h_strict=h["strict"], h_green=h["green"], h_ops=h["ops"], h_rented=h["rented"],
           log=os.path.join(d, "access.log"), run=os.path.join(d, "run")))
gw = spawn([INFERGATE, "serve", "--config", cfg], os.path.join(d, "gw1.log"))
solo_port = free_port()
solo_cfg = os.path.join(d, "solo.yaml")
open(solo_cfg, "w").write("""
listen: [{address: "127.0.0.1:%d"}]
workers: [{model: "%s", name: m, threads: 1}]
region: {name: solo, carbon_source: "%s", carbon_poll_ms: 1000}
runtime_dir: "%s"
""" % (solo_port, model, carbon_file, os.path.join(d, "run-solo")))
solo = spawn([INFERGATE, "serve", "--config", solo_cfg], os.path.join(d, "solo.log"))

fakes = {"pa": FaultRegion(), "pb": FaultRegion()}
fields = {"pa": {"carbon": "300"}, "pb": {"carbon": "200"}}
stop_records = threading.Event()


def keep_records():
    while not stop_records.is_set():
        for name, extra in list(fields.items()):  # the health checks' part adds pf
            f = dict(endpoint="tcp:127.0.0.1:%d" % fakes[name].port, models="m", price_in="1", price_out="1",
                     healthy="1", ttft_ms="5", **extra)
            f["updated_ms"] = str(int(time.time() * 1000))
            f["auth"] = fleet_auth(FLEET_KEY, CLUSTER, "region", name, f)
            subprocess.run(["redis-cli", "-p", str(redis_port), "HSET", "infergate:%s:region:%s" % (CLUSTER, name)]
                           + [x for kv in f.items() for x in kv], capture_output=True, timeout=5)
        stop_records.wait(0.15)


threading.Thread(target=keep_records, daemon=True).start()


def request(tenant, **kw):
    return http_request(port, keys[tenant], **kw)


def served_by(tenant, **kw):
    s, hd, _ = request(tenant, **kw)
    return hd.get("x-infergate-region") if s == 200 else "status-%d" % s


def regions():
    s, _, b = request("ops", path="/v1/regions")
    return json.loads(b) if s == 200 else {}


def table():
    return {r["name"]: r for r in regions().get("regions", [])}


def logged(hd):
    rid = hd.get("x-request-id")
    for _ in range(50):
        lines = [l for l in open(os.path.join(d, "access.log")) if rid and rid in l]
        if lines:
            return json.loads(lines[-1])
        time.sleep(0.1)
    return None


def all_fresh():
    tb = table()
    return len(tb) == 3 and all(not r["stale"] and r["healthy"] for r in tb.values())


try:
    wait_until(all_fresh, 60, "gw1 sees pa and pb")
except AssertionError:
    print(json.dumps(regions(), indent=1)[:3000])
    print(open(os.path.join(d, "gw1.log")).read()[-3000:])
    raise

# --- x-infergate-policy ---
s, hd, _ = request("open", headers={"x-infergate-policy": "carbon"})
route = hd.get("x-infergate-route", "")
t.ok(s == 200 and "intent carbon (header)" in route and route.startswith("carbon "),
     "an allowed x-infergate-policy routes by it, and x-infergate-route says so: %d %s" % (s, route))
line = logged(hd)
t.ok(line and line.get("policy") == "carbon" and line.get("intent") == "header" and "intent carbon" in line["route"],
     "the access log has the policy and who chose it: %s" % line)
s, _, b = request("strict", headers={"x-infergate-policy": "carbon"})
t.ok(s == 403 and b"policy_not_allowed" in b and b"x-infergate-policy" in b,
     "a tenant without allow_policies is refused the header (403): %d %s" % (s, b[:200]))
s, _, b = request("open", headers={"x-infergate-policy": "greenest"})
t.ok(s == 400 and b"bad_policy" in b, "a value that is no policy is a 400: %d %s" % (s, b[:200]))
s, _, b = request("open", headers={"x-infergate-policy": "primary"})
t.ok(s == 403, "a policy the tenant's list leaves out is refused too: %d" % s)
dec = regions().get("placement", {}).get("decisions", [])
t.ok(any(e["intent"] == "header" and e["policy"] == "carbon" for e in dec) and dec[0]["region"],
     "/v1/regions explains the last decisions with their intent: %s" % dec[:2])

# --- a tenant's own primary list ---
got = [served_by("rented") for _ in range(3)]
lists = regions().get("placement", {}).get("primary", [])
t.ok(got == ["pb"] * 3 and any(p_.get("tenant") == "rented" and p_["regions"] == ["pb", "pa"] for p_ in lists),
     "a tenant's own primary list ([pb, pa]) is followed, and has its own state: %s %s" % (got, lists))

# --- carbon: lowest intensity within the SLO, following set-carbon ---
t.ok(served_by("green") == "pb", "carbon: pb (200 g/kWh) before pa (300) and gw1 (400)")


def set_carbon(region, g):
    r = subprocess.run([INFERGATE, "region", "set-carbon", region, "--carbon", str(g), "--redis",
                        "127.0.0.1:%d" % redis_port, "--cluster", CLUSTER], capture_output=True, text=True,
                       env=dict(os.environ, INFERGATE_RECORD_KEY=FLEET_KEY), timeout=30)
    t.ok(r.returncode == 0, "region set-carbon %s %s: %s%s" % (region, g, r.stdout, r.stderr))
    return time.monotonic()


t0 = set_carbon("pa", 50)
moved = wait_until(lambda: served_by("green") == "pa", 5, "carbon follows set-carbon", interval=0.05)
took = time.monotonic() - t0
print("# carbon: pa chosen %.2f s after set-carbon" % took)
# the time is printed, not asserted (a loaded machine): 0.01-0.1 s where measured
t.ok(moved, "set-carbon pa 50: requests move to pa (%.2f s after)" % took)
t0 = set_carbon("gw1", 10)
moved = wait_until(lambda: served_by("green") == "gw1", 5, "own region's set-carbon", interval=0.05)
took = time.monotonic() - t0
t.ok(moved, "set-carbon on the gateway's own region applies too (%.2f s after)" % took)
t.ok(table()["gw1"]["carbon"] == 10, "/v1/regions shows gw1's carbon: %s" % table()["gw1"].get("carbon"))

# --- drain through Redis (issue 32 point 3): no new request goes to a
# drained region, from any gateway, its own included; nothing fails, no
# process exits; undrain brings it back. The times are printed, not
# asserted (a loaded machine). ---


def region_cmd(*args):
    r = subprocess.run([INFERGATE, "region"] + list(args) + ["--redis", "127.0.0.1:%d" % redis_port, "--cluster",
                       CLUSTER], capture_output=True, text=True,
                       env=dict(os.environ, INFERGATE_RECORD_KEY=FLEET_KEY), timeout=30)
    t.ok(r.returncode == 0, "region %s: %s%s" % (" ".join(args), r.stdout.strip(), r.stderr.strip()))
    return time.monotonic()


def moved_off(tenant, drained, seen):
    x = served_by(tenant)
    seen.append(x)
    return x != drained


for tenant, drained in (("rented", "pb"), ("green", "gw1")):
    before = served_by(tenant)
    seen = []
    t0 = region_cmd("drain", drained)
    moved = wait_until(lambda: moved_off(tenant, drained, seen), 5, "off drained %s" % drained, interval=0.02)
    took = time.monotonic() - t0
    after = [served_by(tenant) for _ in range(5)]
    print("# drain: %s's requests left %s %.2f s after region drain" % (tenant, drained, took))
    t.ok(before == drained and moved and drained not in after and all(not x.startswith("status") for x in seen + after),
         "region drain %s: %s's requests go elsewhere (%.2f s after), none fails: %s"
         % (drained, tenant, took, after))
    row = table().get(drained, {})
    t.ok(row.get("draining") is True and gw.poll() is None,
         "/v1/regions shows %s draining, and no process exited: %s" % (drained, row.get("draining")))
    t0 = region_cmd("undrain", drained)
    back = wait_until(lambda: served_by(tenant) == drained, 10, "back to %s" % drained, interval=0.05)
    t.ok(back, "region undrain %s: %s's requests return (%.2f s after)" % (drained, tenant, time.monotonic() - t0))
# the carbon_source file: an override stands over it, so drop gw1's override first
subprocess.run(["redis-cli", "-p", str(redis_port), "DEL", "infergate:%s:price:gw1" % CLUSTER], capture_output=True)
subprocess.run(["redis-cli", "-p", str(redis_port), "PUBLISH", "infergate:%s:events" % CLUSTER, "gw1"],
               capture_output=True)
figure["body"] = b"123.5\n"
t.ok(wait_until(lambda: table()["gw1"]["carbon"] == 123.5, 10, "carbon_source polled"),
     "region.carbon_source over http: the polled figure becomes gw1's")
figure["body"] = b"lots\n"
t.ok(wait_until(lambda: "region.carbon_source" in open(os.path.join(d, "gw1.log")).read(), 10, "bad figure logged"),
     "a bad figure is logged naming the key")
figure["body"], figure["status"] = b"77", 503
t.ok(wait_until(lambda: "no HTTP 200 answer" in open(os.path.join(d, "gw1.log")).read(), 10, "503 logged"),
     "a non-200 answer is logged too")
t.ok(table()["gw1"]["carbon"] == 123.5, "and refused: the figure stays")
figure["body"], figure["status"] = b"123.5\n", 200


def solo_carbon():
    s_, _, b_ = http_request(solo_port, "", path="/v1/regions", timeout=5)
    try:
        return json.loads(b_)["regions"][0]["carbon"] if s_ == 200 else None
    except (ValueError, KeyError, IndexError):
        return None


t.ok(wait_until(lambda: solo_carbon() == 250, 30, "solo reads its file"), "region.carbon_source as a file")
open(carbon_file, "w").write("60\n")
t.ok(wait_until(lambda: solo_carbon() == 60, 10, "solo reads the file again"), "and reads it again each poll")

# --- energy and gCO2e per request (gw1's worker: power_watts 50) ---
def energy_metrics():
    m = request("ops", path="/metrics")[2].decode()
    got = [re.search(r'^infergate_%s_total\{tenant="strict",region="gw1"\} (\S+)$' % k, m, re.M)
           for k in ("energy_wh", "gco2e")]
    return [float(g.group(1)) if g else 0.0 for g in got], m


before, _ = energy_metrics()
s, hd, _ = request("strict", body={"model": "m", "prompt": [1, 5, 7], "max_tokens": 8, "temperature": 0})
line = logged(hd)
t.ok(s == 200 and hd.get("x-infergate-region") == "gw1" and line and line.get("energy_wh", 0) > 0
     and abs(line["gco2e"] - line["energy_wh"] * 123.5 / 1000) < 1e-9,
     "the access log has the request's energy and gCO2e (energy x gw1's intensity): %s" % line)
after, m = energy_metrics()
t.ok(line and all(abs(after[i] - before[i] - line[k]) <= 1e-5 * line[k] for i, k in enumerate(("energy_wh", "gco2e")))
     and "infergate_spend_energy_wh_total" not in m and "infergate_spend_gco2e_total" not in m,
     "/metrics counts the logged energy and gCO2e per tenant and region, in one set of metrics (%s -> %s)"
     % (before, after))


# --- primary: gw1's queue grows past the SLO, traffic spills to pa, then comes back once ---
class Load:
    """Keeps n long streams in flight on gw1's worker, sent to its socket
    straight (routing would move them off gw1 once it spills), until killed."""

    def __init__(self, n):
        self.stop_flag = False
        self.procs = [None] * n
        self.threads = [threading.Thread(target=self.loop, args=(i,), daemon=True) for i in range(n)]
        for th in self.threads:
            th.start()

    def loop(self, i):
        body = {"model": "m", "prompt": [1, 5, 7], "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
                "stream": True}
        while not self.stop_flag:
            self.procs[i] = subprocess.Popen(
                ["curl", "-sS", "--max-time", "120", "--http2-prior-knowledge", "--unix-socket",
                 os.path.join(d, "run", "worker-0.sock"), "-H", "content-type: application/json", "--data-binary",
                 json.dumps(body), "http://localhost/v1/completions"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            self.procs[i].wait()

    def kill(self):
        self.stop_flag = True
        for p in self.procs:
            if p and p.poll() is None:
                p.kill()
        for th in self.threads:
            th.join(10)
        for p in self.procs:
            if p:
                p.wait()


def primary_state():
    for p in regions().get("placement", {}).get("primary", []):
        if not p.get("tenant"):
            return p
    return {}


got = [served_by("strict") for _ in range(5)]
t.ok(got == ["gw1"] * 5, "primary: gw1, the first of the list, while it meets the SLO: %s" % got)
base = primary_state().get("switches", 0)
load = Load(10)
try:
    spilled = wait_until(lambda: served_by("strict", timeout=5) == "pa", 60, "requests spill to pa")
except AssertionError:
    load.kill()
    print(json.dumps(table(), indent=1)[:4000])
    raise
print("# gw1 expected %.0f ms at the spill" % table()["gw1"]["expected_ms"])
t.ok(spilled, "gw1's queue past the SLO: requests spill to pa, the next of the list: %s" % primary_state())
s, hd, _ = request("strict")
t.ok("primary 2nd of 3 (1 spilled)" in hd.get("x-infergate-route", ""),
     "x-infergate-route says why: %s" % hd.get("x-infergate-route"))
load.kill()
t0 = time.monotonic()
seen = []
back = False
while time.monotonic() - t0 < 60:
    r = served_by("strict", timeout=5)
    seen.append(r)
    if r == "gw1" and seen.count("gw1") >= 1:
        back = True
        break
    time.sleep(0.05)
took = time.monotonic() - t0
# (the streams may have ended before the kill: the hold is timed in test_router's unit test)
print("# primary: back at gw1 %.1f s after the load was stopped" % took)
if not back:
    print(json.dumps(table()["gw1"], indent=1))
t.ok(back, "drained, gw1 takes the traffic back")
# no flapping: every request from here on goes to gw1, and the gateway counted two switches
after = [served_by("strict") for _ in range(20)]
st = primary_state()
t.ok(after == ["gw1"] * 20, "and keeps it: %s" % after)
t.ok(st.get("switches", 0) - base == 2 and st.get("current") == "gw1",
     "exactly two switches (spill, return): no flapping: %s" % st)

# --- active health checks (issue 32 point 4) ---
# pf takes connections and answers PINGs but fails every completion (500).
# No user request goes its way: gw1's checks alone must eject it. With the
# lowest carbon of all it would be the green tenant's first choice.
def soon(pred, timeout, what):
    try:
        return wait_until(pred, timeout, what, interval=0.05)
    except AssertionError:
        return False


def gw1_log():
    return open(os.path.join(d, "gw1.log")).read()


s, _, b = request("open", headers={"x-infergate-health-check": "1"})
t.ok(s == 400 and b"internal_header" in b, "a client's x-infergate-health-check is refused (400): %d %s" % (s, b[:160]))
pf = FaultRegion()
pf.fail_status = 500
fakes["pf"] = pf
fields["pf"] = {"carbon": "1"}
row = {}


def pf_row():
    row.clear()
    row.update(table().get("pf", {}))
    return row


t0 = time.monotonic()
ejected = soon(lambda: pf_row().get("ejected") is True, 30, "pf ejected by its checks")
print("# health: pf ejected %.2f s after its record was written" % (time.monotonic() - t0))
logged_eject = soon(lambda: re.search(r"event=region_ejected region=pf failures=\d+ ejections=1 by=check", gw1_log()),
                    5, "the ejection logged")
t.ok(ejected and logged_eject and pf.checks >= 2 and not pf.requests,
     "a region that takes connections but fails every request is ejected by the checks alone, no user request "
     "sent to it (%d checks, %d requests): %s" % (pf.checks, len(pf.requests), row.get("check")))
check = row.get("check") or {}
t.ok(check.get("state") == "ejected" and check.get("last") == "status 500" and check.get("failures", 0) >= 2,
     "/v1/regions shows its checks: %s" % check)
# prompts no region holds: a held prefix may put gw1 first among near-equal regions
s, hd, _ = request("green", body={"model": "m", "prompt": "while pf is out", "max_tokens": 2})
t.ok(s == 200 and hd.get("x-infergate-region") not in (None, "pf") and not pf.requests,
     "the green tenant's request (pf first by carbon) goes elsewhere: %d %s" % (s, hd.get("x-infergate-region")))
m = request("ops", path="/metrics")[2].decode()
t.ok(re.search(r'^infergate_health_checks_total\{target="region-pf",outcome="fail"\} [1-9]', m, re.M)
     and re.search(r'^infergate_health_ejections_total\{target="region-pf"\} 1$', m, re.M)
     and re.search(r'^infergate_health_checks_total\{target="worker-0",outcome="ok"\} [1-9]', m, re.M)
     and re.search(r'^infergate_health_checks_total\{target="region-pa",outcome="ok"\} [1-9]', m, re.M),
     "/metrics counts the checks by target and outcome, and the ejection")
t.ok(not any('"request_id":"health-' in l for l in open(os.path.join(d, "access.log"))),
     "no check is in the access log")
pf.fail_status = None
t0 = time.monotonic()
back = soon(lambda: pf_row().get("ejected") is False and (row.get("check") or {}).get("state") == "passing", 30,
            "pf back")
print("# health: pf back %.2f s after it healed" % (time.monotonic() - t0))
t.ok(back and soon(lambda: "event=region_returned region=pf was=ejected" in gw1_log(), 5, "return logged"),
     "healed, it passes its checks and returns (logged): %s" % row.get("check"))
s, hd, _ = request("green", body={"model": "m", "prompt": "pf is back", "max_tokens": 2})
t.ok(s == 200 and hd.get("x-infergate-region") == "pf" and len(pf.requests) == 1,
     "and takes the green tenant's request again: %d %s (%s)%s" % (s, hd.get("x-infergate-region"),
     hd.get("x-infergate-route"), "" if hd.get("x-infergate-region") == "pf" else json.dumps(table())[:3000]))
del fields["pf"]

# gw1's worker stopped: it takes connections and answers nothing. Its
# checks eject it, gw1's record says unhealthy and its traffic goes to the
# next of the primary list; SIGCONT, and it returns.
wpid = int(re.findall(r"worker 0 \(model \w+, device \w+\) started: pid (\d+)", gw1_log())[-1])
os.kill(wpid, signal.SIGSTOP)
try:
    t0 = time.monotonic()
    down = soon(lambda: "event=worker_ejected worker=0 model=m by=check" in gw1_log(), 30, "worker 0 ejected")
    print("# health: worker 0 ejected %.2f s after SIGSTOP" % (time.monotonic() - t0))
    moved = soon(lambda: served_by("strict", timeout=10) in ("pa", "pb"), 10, "traffic off gw1")
finally:
    os.kill(wpid, signal.SIGCONT)
t.ok(down and moved, "a local worker that answers nothing is ejected by its checks and its traffic moves (%s)"
     % moved)
back = soon(lambda: "event=worker_returned worker=0 model=m by=check" in gw1_log(), 30, "worker 0 back")
t.ok(back and soon(lambda: served_by("strict", timeout=10) == "gw1", 30, "traffic back at gw1"),
     "resumed, it passes its checks and takes its traffic again")
m = request("ops", path="/metrics")[2].decode()
t.ok(re.search(r'^infergate_health_ejections_total\{target="worker-0"\} 1$', m, re.M)
     and re.search(r'^infergate_worker_check_down\{worker="0",[^}]*\} 0$', m, re.M),
     "/metrics counts the worker's ejection, and shows it back")

stop_records.set()
# a drain and a clean exit (under the sanitizer build: nothing leaked, nothing misused)
for name, proc in (("gw1", gw), ("solo", solo)):
    rc = stop(proc, timeout=60)
    log = open(os.path.join(d, name + ".log")).read()
    t.ok(rc == 0 and "Sanitizer" not in log and "runtime error" not in log,
         "%s exits cleanly on SIGTERM (%s)%s" % (name, rc, "" if "Sanitizer" not in log else log[-2000:]))
t.finish()
