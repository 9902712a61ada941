"""Spend and budgets (issue 31, item 3), with real processes: one
redis-server (an append-only file, so that a stop and a start keep its
data) and two gateways of one region sharing it, each with its own worker.

- Each request's cost is the region's price per million tokens times the
  usage its answer carried: the fleet's totals in Redis, each gateway's
  /metrics and access log, and `infergate usage` all say the same.
- A daily budget holds across both gateways (429, type and code
  insufficient_quota, read by curl), survives a gateway's restart, and
  moves with a reload.
- x-infergate-max-cost refuses a request whose worst case is over it
  (400 max_cost_exceeded), before any worker sees it.
- Redis stopped: both gateways keep serving and counting; each holds its own
  spend since the outage to the budget minus the last fleet figure it saw
  (one request over at most, whose cost is known only at its end); Redis
  started again, every bit of the spend counted meanwhile arrives in it."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, spawn, stop, tmpdir, wait_until

if not os.path.exists("/usr/bin/redis-server"):
    print("redis-server not installed: skipping")
    sys.exit(77)

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=64, layers=1, heads=4, kv_heads=2, ffn=128, vocab=300, ctx=512)
PRICE_IN, PRICE_OUT = 1000.0, 3000.0  # per million tokens: a token in is 0.001, one out 0.003
CLUSTER = "spend%d" % os.getpid()
FLEET_KEY = "test-fleet-key-0123456789abcdef-0123456789"

# --- redis, with its data kept across a stop ---
redis_port = free_port()
redis_args = ["/usr/bin/redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "yes", "--appendfsync", "always", "--dir", d]


def redis_cli(*args):
    r = subprocess.run(["redis-cli", "-p", str(redis_port)] + list(args), capture_output=True, text=True, timeout=10)
    return r.stdout.strip()


def redis_up():
    return redis_cli("ping") == "PONG"


redis = spawn(redis_args, os.path.join(d, "redis.log"))
wait_until(redis_up, 20, "redis-server")

keys = {"open": "k-open", "capped": "k-capped", "outage": "k-outage", "ops": "k-ops"}


def key_hash(k):
    out = subprocess.run([INFERGATE, "key", "hash", k], capture_output=True, text=True, check=True).stdout
    return re.search(r"[0-9a-f]{64}", out).group(0)


hashes = {n: key_hash(k) for n, k in keys.items()}
CAPPED_DAILY = 0.08
OUTAGE_DAILY = 0.3
names = ["a", "b"]
port = {n: free_port() for n in names}


def config(n, capped_daily=CAPPED_DAILY, open_weight=1):
    return """
listen: [{address: "127.0.0.1:%(port)d"}]
workers: [{model: "%(model)s", name: m, threads: 1, max_seqs: 4}]
region:
  name: eu1
  price: {input: %(pin)s, output: %(pout)s}
cluster: %(cluster)s
redis: {address: "127.0.0.1:%(redis)d", record_keys: ["%(fleet)s"], timeout_ms: 300}
routing: {heartbeat_ms: 200, stale_after_ms: 1000}
tenants:
  - {name: open, keys: ["%(h_open)s"], weight: %(ow)s}
  - {name: capped, keys: ["%(h_capped)s"], budget: {daily: %(capped)s}}
  - {name: outage, keys: ["%(h_outage)s"], budget: {daily: %(outage)s, monthly: 1000}}
  - {name: ops, keys: ["%(h_ops)s"], admin: true}
logging: {access_log: "%(log)s"}
runtime_dir: "%(run)s"
""" % dict(port=port[n], model=model, pin=PRICE_IN, pout=PRICE_OUT, cluster=CLUSTER, redis=redis_port,
           fleet=FLEET_KEY, h_open=hashes["open"], h_capped=hashes["capped"], h_outage=hashes["outage"],
           h_ops=hashes["ops"], capped=capped_daily, outage=OUTAGE_DAILY, log=os.path.join(d, n + ".access.log"),
           run=os.path.join(d, "run-" + n), ow=open_weight)


cfg = {n: os.path.join(d, n + ".yaml") for n in names}
gws = {}


def start(n):
    gws[n] = spawn([INFERGATE, "serve", "--config", cfg[n]], os.path.join(d, n + ".log"))
    wait_until(lambda: curl("http://127.0.0.1:%d/readyz" % port[n], http="--http1.1", timeout=2)[0] == 200
               or gws[n].poll() is not None, 60, "gateway %s ready" % n)
    t.ok(gws[n].poll() is None, "gateway %s started" % n)


for n in names:
    open(cfg[n], "w").write(config(n))
    start(n)

prompts = [[1, 5, 7], [2, 9, 11, 40, 41], [3, 4], [60, 61, 62, 63, 64, 65, 66]]


def ask(n, tenant, i=0, max_tokens=4, headers=()):
    """(status, error object or None, cost by the answer's usage, response headers)."""
    body = {"model": "m", "prompt": prompts[i % len(prompts)], "max_tokens": max_tokens, "temperature": 0}
    st, h, b = curl("http://127.0.0.1:%d/v1/completions" % port[n], http="--http1.1", data=body,
                    headers=["authorization: Bearer " + keys[tenant]] + list(headers), timeout=30)
    try:
        j = json.loads(b)
    except ValueError:
        return st, {"raw": b[:200]}, 0.0, h
    if st != 200:
        return st, j.get("error"), 0.0, h
    u = j["usage"]
    return st, None, (u["prompt_tokens"] * PRICE_IN + u["completion_tokens"] * PRICE_OUT) / 1e6, h


def redis_cost(tenant):
    day = time.strftime("%Y-%m-%d", time.gmtime())
    v = redis_cli("HGET", "infergate:%s:spend:%s:day:%s" % (CLUSTER, tenant, day), "cost")
    return float(v) if v else 0.0


def metric(n, name, **labels):
    st, _, b = curl("http://127.0.0.1:%d/metrics" % port[n], http="--http1.1",
                    headers=["authorization: Bearer " + keys["ops"]])
    total = 0.0
    for line in b.decode().splitlines():
        if not line.startswith(name + "{"):
            continue
        if all('%s="%s"' % (k, v) in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def close(x, y, eps=1e-9):
    return abs(x - y) <= eps * max(1.0, abs(x), abs(y))


# --- 1. cost counted: Redis, /metrics, the access log ---
spent = {n: 0.0 for n in names}
costs = []
for i in range(6):
    n = names[i % 2]
    st, err, c, h = ask(n, "open", i)
    if st == 200:
        spent[n] += c
        costs.append(c)
t.ok(len(costs) == 6 and all(c > 0 for c in costs), "6 requests of tenant open served, each with a cost: %s" % costs)
want = sum(spent.values())
wait_until(lambda: close(redis_cost("open"), want), 10, "open's spend in Redis")
t.ok(close(redis_cost("open"), want), "Redis holds open's spend today: %.6f (the answers' usage: %.6f)"
     % (redis_cost("open"), want))
day, month = time.strftime("%Y-%m-%d", time.gmtime()), time.strftime("%Y-%m", time.gmtime())
ttl = [int(redis_cli("TTL", "infergate:%s:%s" % (CLUSTER, k)) or -9) for k in
       ("spend:open:day:" + day, "spend:open:month:" + month, "usage:" + day)]
t.ok(2 * 86400 < ttl[0] <= 3 * 86400 and 69 * 86400 < ttl[1] <= 70 * 86400 and 399 * 86400 < ttl[2] <= 400 * 86400,
     "the day, month and breakdown keys expire past their period (TTLs %s s)" % ttl)
for n in names:
    m = metric(n, "infergate_spend_total", tenant="open", model="m", region="eu1")
    t.ok(close(m, spent[n]), "gateway %s's infergate_spend_total{tenant=open,model=m,region=eu1} %.6f = %.6f"
         % (n, m, spent[n]))
tok = metric("a", "infergate_tokens_total", tenant="open", kind="completion") + \
    metric("b", "infergate_tokens_total", tenant="open", kind="completion")
t.ok(tok > 0, "infergate_tokens_total{kind=completion} counted (%g)" % tok)
logged = [json.loads(l) for l in open(os.path.join(d, "a.access.log")) if '"tenant":"open"' in l]
t.ok(logged and all("cost" in e for e in logged) and close(sum(e["cost"] for e in logged), spent["a"]),
     "gateway a's access log says each request's cost (sum %.6f)" % sum(e.get("cost", 0) for e in logged))

# --- 2. max cost ---
# prompt [1,5,7] in a body of ~80 bytes: estimated 20 tokens, plus max_tokens 4
st, err, _, _ = ask("a", "open", 0, headers=["x-infergate-max-cost: 0.0001"])
t.ok(st == 400 and err and err.get("code") == "max_cost_exceeded" and err.get("type") == "invalid_request_error",
     "a worst case over x-infergate-max-cost is refused: %d %s" % (st, err))
st, err, _, _ = ask("a", "open", 0, headers=["x-infergate-max-cost: 1"])
t.ok(st == 200, "a worst case under x-infergate-max-cost is served: %d %s" % (st, err))
st, err, _, _ = ask("b", "open", 0, headers=["x-infergate-max-cost: cheap"])
t.ok(st == 400 and err and err.get("code") == "bad_max_cost", "a malformed x-infergate-max-cost: %d %s" % (st, err))

# --- 3. a daily budget across both gateways ---
capped_spent, refused_at, served_after = 0.0, None, 0
max_cost = 0.0
for i in range(60):
    n = names[i % 2]
    st, err, c, _ = ask(n, "capped", i)
    if st == 200:
        capped_spent += c
        max_cost = max(max_cost, c)
        if refused_at is not None:
            served_after += 1
    elif st == 429 and refused_at is None:
        refused_at = i
        t.ok(err and err.get("type") == "insufficient_quota" and err.get("code") == "insufficient_quota",
             "at the budget: 429 %s" % err)
    elif st != 429:
        t.ok(False, "capped request %d: %d %s" % (i, st, err))
    if refused_at is not None and i > refused_at + 5:
        break
t.ok(refused_at is not None and served_after == 0,
     "capped refused from request %s on, on both gateways (%d served after)" % (refused_at, served_after))
t.ok(CAPPED_DAILY <= capped_spent <= CAPPED_DAILY + 2 * max_cost,
     "capped spent %.6f against a daily budget of %g (requests cost at most %.6f)"
     % (capped_spent, CAPPED_DAILY, max_cost))
wait_until(lambda: close(redis_cost("capped"), capped_spent), 10, "capped's spend in Redis")

# curl, plainly, as a user sees it
st, h, b = curl("http://127.0.0.1:%d/v1/chat/completions" % port["b"], http="--http2-prior-knowledge",
                data={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers=["authorization: Bearer " + keys["capped"]])
e = json.loads(b).get("error", {})
t.ok(st == 429 and e.get("code") == "insufficient_quota" and "daily budget" in e.get("message", ""),
     "HTTP/2 chat over the budget: %d %s" % (st, e))

# the OpenAI Node SDK (its default retries on): one 429, not retried
node_dir = os.path.join(os.path.dirname(__file__), "node")
if shutil.which("node") and os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
    log_b = os.path.join(d, "b.access.log")
    count = lambda: sum(1 for l in open(log_b) if '"tenant":"capped"' in l and '"status":429' in l)

    def refusals():
        """The count once the access log's thread has written what it had
        (the curl above's line came after this was first read, once)."""
        a = count()
        for _ in range(25):
            time.sleep(0.2)
            b = count()
            if b == a:
                return b
            a = b
        return a

    before = refusals()
    r = subprocess.run(["node", os.path.join(node_dir, "quota.js"), "http://127.0.0.1:%d/v1" % port["b"],
                        keys["capped"], "m"], capture_output=True, text=True, timeout=120)
    got = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else {}
    t.ok(got.get("status") == 429 and got.get("code") == "insufficient_quota" and
         got.get("type") == "insufficient_quota" and got.get("retry") == "false" and refusals() - before == 1,
         "OpenAI Node SDK: %s, %d request(s) seen (x-should-retry: false) %s"
         % (got, refusals() - before, r.stderr.strip()[-300:]))
else:
    t.ok(False, "OpenAI Node SDK installed (npm ci in tests/integration/node)")

used = metric("b", "infergate_budget_spend", tenant="capped", period="day")
t.ok(close(metric("b", "infergate_budget", tenant="capped", period="day"), CAPPED_DAILY) and used >= CAPPED_DAILY,
     "gateway b's infergate_budget_spend{tenant=capped,period=day} %.6f against infergate_budget %g"
     % (used, CAPPED_DAILY))

# The dashboard (issue 31 item 5): each tenant's spend here and its
# budget's use, the capped tenant's day at its budget.
st, _, page = curl("http://127.0.0.1:%d/dashboard?key=%s" % (port["b"], keys["ops"]), http="--http1.1")
page = page.decode()
row = page[page.find("<td>capped</td>"):][:400]
pcts = [int(x) for x in re.findall(r"\((\d+)%\)", row)]
t.ok(st == 200 and "<h2>tenants</h2>" in page and "<td>capped</td>" in row and "class=bad>" in row
     and pcts and pcts[0] >= 100,
     "the dashboard's tenants table shows capped's spend and its day's budget used (%d): %s" % (st, row[:200]))

# --- 4. the budget survives a restart; a reload moves it ---
stop(gws["a"])
start("a")
st, err, _, _ = ask("a", "capped", 0)
t.ok(st == 429 and err and err.get("code") == "insufficient_quota",
     "gateway a restarted: capped still refused (the day's spend read from Redis): %d" % st)


def open_weight():
    """Tenant open's weight as gateway a's worker last received it: its
    /internal/stats, and the gateway's /metrics from them."""
    s_, _, b_ = curl("http://localhost/internal/stats", unix=os.path.join(d, "run-a", "worker-0.sock"), timeout=5)
    w = [x["weight"] for x in json.loads(b_).get("tenants", []) if x["name"] == "open"] if s_ == 200 else []
    return w[0] if w else None, metric("a", "infergate_worker_tenant_weight", tenant="open")


ask("a", "open", 0)
before = wait_until(lambda: (lambda w: w if w[0] == 1 and w[1] == 1 else None)(open_weight()), 10,
                    "open's weight 1 at the worker")
open(cfg["a"], "w").write(config("a", capped_daily=CAPPED_DAILY * 10, open_weight=2.5))
gws["a"].send_signal(signal.SIGHUP)
ok = wait_until(lambda: ask("a", "capped", 1)[0] == 200, 10, "reloaded budget admits")
t.ok(ok, "a reload raising capped's daily budget admits it again at gateway a")
ask("a", "open", 1)
after = wait_until(lambda: (lambda w: w if w[0] == 2.5 and w[1] == 2.5 else None)(open_weight()), 10,
                   "open's new weight at the worker")
t.ok(before and after, "a reload changing open's weight 1 -> 2.5 reaches the worker (its stats %s -> %s, "
     "the gateway's infergate_worker_tenant_weight %s -> %s)" % (before[0], after[0], before[1], after[1]))
st, err, _, _ = ask("b", "capped", 1)
t.ok(st == 429, "gateway b (not reloaded) still refuses capped: %d" % st)

# --- 5. Redis stopped: counted locally, bounded, none lost ---
outage_before = 0.0
for i in range(4):
    st, err, c, _ = ask(names[i % 2], "outage", i)
    outage_before += c if st == 200 else 0
# each gateway sees the fleet's figure once more (its budget read)
for n in names:
    st, err, c, _ = ask(n, "outage", 0)
    outage_before += c if st == 200 else 0
wait_until(lambda: close(redis_cost("outage"), outage_before), 10, "outage's spend in Redis before the outage")
time.sleep(0.5)
redis.send_signal(signal.SIGTERM)
redis.wait(timeout=20)
time.sleep(1.5)  # both gateways see Redis gone
during = {n: 0.0 for n in names}
refused = {n: False for n in names}
max_cost = 0.0
for i in range(200):
    n = names[i % 2]
    if refused[n]:
        continue
    st, err, c, _ = ask(n, "outage", i)
    if st == 200:
        during[n] += c
        max_cost = max(max_cost, c)
    elif st == 429 and err and err.get("code") == "insufficient_quota":
        refused[n] = True
    else:
        t.ok(False, "outage request %d at %s: %d %s" % (i, n, st, err))
        break
    if all(refused.values()):
        break
t.ok(all(refused.values()), "Redis away: each gateway still refuses the tenant at its budget: %s" % refused)
for n in names:
    # the bound: what it spent since the outage + the fleet's figure it last
    # saw (at most outage_before, at least it less one request) <= budget,
    # one request over at most
    t.ok(OUTAGE_DAILY - outage_before - 2 * max_cost <= during[n] <= OUTAGE_DAILY - outage_before + 2 * max_cost,
         "gateway %s spent %.6f during the outage; budget %g - fleet figure %.6f = %.6f (a request <= %.6f)"
         % (n, during[n], OUTAGE_DAILY, outage_before, OUTAGE_DAILY - outage_before, max_cost))
redis = spawn(redis_args, os.path.join(d, "redis2.log"))
wait_until(redis_up, 20, "redis-server back")
want = outage_before + sum(during.values())
got = wait_until(lambda: close(redis_cost("outage"), want) and redis_cost("outage"), 20,
                 "the outage's spend sent to Redis")
t.ok(close(got, want), "Redis back: outage's spend %.6f = before %.6f + during %.6f (none lost)"
     % (got, outage_before, sum(during.values())))
st, err, _, _ = ask("a", "outage", 0)
t.ok(st == 429, "after the outage the fleet's figure refuses the tenant: %d" % st)

# --- 6. infergate usage ---
r = subprocess.run([INFERGATE, "usage", "--redis", "127.0.0.1:%d" % redis_port, "--cluster", CLUSTER, "--json"],
                   capture_output=True, text=True, timeout=30)
t.ok(r.returncode == 0, "infergate usage --json: rc %d %s" % (r.returncode, r.stderr.strip()))
u = json.loads(r.stdout) if r.returncode == 0 else {"rows": [], "total": {}}
rows = {x["tenant"]: x for x in u["rows"]}
t.ok(set(rows) == {"open", "capped", "outage"} and all(x["model"] == "m" and x["region"] == "eu1" for x in u["rows"]),
     "usage has a row per tenant, model m, region eu1: %s" % sorted(rows))
for tn in ("open", "capped", "outage"):
    if tn in rows:
        t.ok(close(rows[tn]["cost"], redis_cost(tn)) and rows[tn]["prompt_tokens"] > 0 and
             rows[tn]["completion_tokens"] > 0 and "gco2e" in rows[tn],
             "usage: %s cost %.6f, %d prompt and %d completion tokens, %d requests"
             % (tn, rows[tn]["cost"], rows[tn]["prompt_tokens"], rows[tn]["completion_tokens"], rows[tn]["requests"]))
r = subprocess.run([INFERGATE, "usage", "--config", cfg["b"], "--tenant", "capped", "--since",
                    time.strftime("%Y-%m-%d", time.gmtime(time.time() - 3 * 86400))],
                   capture_output=True, text=True, timeout=30)
lines = r.stdout.splitlines()
t.ok(r.returncode == 0 and any(l.startswith("capped ") for l in lines) and not any(l.startswith("open ") for l in lines)
     and any(l.startswith("TOTAL") for l in lines) and "GCO2E" in r.stdout,
     "infergate usage --config --tenant capped --since: a table of capped alone:\n" + r.stdout)
r = subprocess.run([INFERGATE, "usage", "--since", "yesterday"], capture_output=True, text=True, timeout=30)
t.ok(r.returncode == 2 and "YYYY-MM-DD" in r.stderr, "usage --since yesterday: refused (%d)" % r.returncode)

for n in names:
    stop(gws[n])
stop(redis)
t.finish()
