"""Tokens per minute against prompts the byte estimate undercounts (issue
33, item 4): random text is about a token a byte for a byte-level
tokenizer, not four bytes a token, and a token-id array is two or three
bytes an id. The gateway admits on its estimate and corrects the charge to
the worker's count (x-infergate-prompt-tokens, which the worker sends on
every answer, streamed or whole, usage asked for or not); the debt carries
into the next minute. So 60 s of such prompts at 5 requests a second
(half streamed without usage, half whole; half random text, half token
ids) get through no more tokens than the policy allows: its burst (one
minute's worth) and a minute's refill, and one request over at most.

Without the correction (and the ids' count), the same load got 24341
tokens in the 60 s (100 of 301 admitted), 9018 in the last 30 s: three
times the policy's rate; with it, 11920 (49 admitted), 2927."""
import http.client
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, scaled, spawn, stop, tmpdir, wait_until

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=64, layers=1, heads=4, kv_heads=2, ffn=128, vocab=300, ctx=1024)
key = "ig-tpm-test-key"
key_hash = subprocess.run([INFERGATE, "key", "hash", key], capture_output=True, text=True, check=True).stdout.split()[-1]
TPM = 6000
# The ASan build runs half of it: the burst spent and the refill rate seen.
SECS = scaled("INFERGATE_TPM_SECONDS", 60)
HALF = SECS / 2
port = free_port()
cfg = os.path.join(d, "gateway.yaml")
open(cfg, "w").write("""
listen: [{address: "127.0.0.1:%d"}]
workers: [{model: "%s", name: m, threads: 1, max_seqs: 8}]
tenants:
  - {name: metered, keys: ["%s"], tpm: %d}
logging: {access_log: "%s"}
runtime_dir: "%s"
""" % (port, model, key_hash, TPM, os.path.join(d, "access.log"), os.path.join(d, "run")))
log_path = os.path.join(d, "gateway.log")
g = spawn([INFERGATE, "serve", "--config", cfg], log_path)
wait_until(lambda: curl("http://127.0.0.1:%d/readyz" % port, http="--http1.1", timeout=2)[0] == 200
           or g.poll() is not None, 60, "gateway ready")
t.ok(g.poll() is None, "gateway with a tpm tenant started")

rnd = random.Random(33)


def prompt(i):
    if i % 2:
        return [rnd.randrange(1, 300) for _ in range(240)]  # ~2.6 bytes an id
    return "".join(chr(rnd.randrange(33, 127)) for _ in range(240))  # random text, ~1 token a byte


def ask(conn, i):
    """One request; (status, prompt tokens, completion tokens) as the
    worker counted them."""
    stream = i % 4 >= 2
    body = json.dumps({"model": "m", "prompt": prompt(i), "max_tokens": 2, "temperature": 0, "stream": stream})
    conn.request("POST", "/v1/completions", body, {"authorization": "Bearer " + key,
                                                   "content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        return r.status, 0, 0
    said = int(r.getheader("x-infergate-prompt-tokens", "-1"))
    if stream:
        events = [e for e in data.split(b"\n\n") if e.startswith(b"data: {")]
        return 200, said, max(len(events) - 1, 1)
    u = json.loads(data)["usage"]
    return 200, u["prompt_tokens"] if said < 0 else said, u["completion_tokens"]


try:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start, i, results = time.time(), 0, []
    while time.time() - start < SECS:
        due = start + i * 0.2  # 5 a second
        if due > time.time():
            time.sleep(due - time.time())
        results.append((time.time() - start,) + ask(conn, i))
        i += 1
    ok = [r for r in results if r[1] == 200]
    got = sum(r[2] + r[3] for r in ok)
    biggest = max((r[2] + r[3] for r in ok), default=0)
    second_half = sum(r[2] + r[3] for r in ok if r[0] >= HALF)
    per_request = [r[2] for r in ok]
    print("# %d requests, %d admitted, %d tokens got (prompt %d..%d each), %d in the last %g s"
          % (len(results), len(ok), got, min(per_request, default=0), max(per_request, default=0), second_half,
             HALF))
    t.ok(len(results) >= SECS * 5 - 10 and all(r[1] in (200, 429) for r in results),
         "%g s at 5 requests a second: each admitted or 429 (%d requests)" % (SECS, len(results)))
    t.ok(all(r[2] >= 200 for r in ok), "every answer says its prompt's tokens as the worker counted them "
         "(%d..%d for 240 bytes or ids)" % (min(per_request, default=0), max(per_request, default=0)))
    # A bucket of TPM refilled at TPM a minute: at most TPM + the refill
    # (2 * TPM in the first minute), and one request past it (admitted on
    # its estimate).
    cap = TPM + TPM * SECS / 60
    t.ok(got <= cap + biggest,
         "random text and token ids get no more than the tpm policy: %d tokens in %g s, at most %d "
         "(tpm %d: its burst and %g s of refill, and one request over)" % (got, SECS, cap + biggest, TPM, SECS))
    t.ok(second_half <= TPM * HALF / 60 + biggest,
         "once the burst is spent, the rate is the policy's: %d tokens in the last %g s (tpm %d: %d in that "
         "time)" % (second_half, HALF, TPM, TPM * HALF / 60))
finally:
    rc = stop(g)
t.ok(rc == 0, "gateway exits 0 (%s)" % rc)
if t.failed:
    print("# gateway log:\n" + open(log_path).read()[-3000:])
t.finish()
