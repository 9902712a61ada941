"""The worker's prefix cache with real processes (issue 30): two workers on one
model, one with the cache (the default) and one with --prefix-cache false,
answer a conversation's turns with the same greedy text; the cached one
reports usage.prompt_tokens_details.cached_tokens (streamed usage too) as the
whole blocks of the turn before, the other 0; /internal/stats counts prompt
tokens computed and cached, the hit rate and the blocks cached."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import (INFERGATE, Checks, curl, gen_model, sse_events, spawn, tmpdir, wait_until)

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=128, layers=2, heads=4, kv_heads=2, ffn=256, vocab=512, ctx=512,
                  type="f32", seed=5)
URL = "http://localhost"
BT = 16  # the worker's KV block


def start_worker(name, *extra):
    sock = os.path.join(d, name + ".sock")
    log = os.path.join(d, name + ".log")
    p = spawn([INFERGATE, "worker", "--model", model, "--model-name", "m", "--listen", "unix:" + sock,
               "--threads", "2", "--kv-cache-mb", "16"] + list(extra), log)
    wait_until(lambda: curl(URL + "/health", unix=sock, timeout=2)[0] == 200 or p.poll() is not None, 60,
               "worker health")
    assert p.poll() is None, open(log).read()
    return sock


def complete(sock, prompt, stream=False):
    body = {"model": "m", "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    s, _, b = curl(URL + "/v1/completions", unix=sock, data=body, timeout=60)
    assert s == 200, (s, b)
    if not stream:
        r = json.loads(b)
        return r["choices"][0]["text"], r["usage"]
    events, done = sse_events(b)
    assert done
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    usage = [e["usage"] for e in events if e.get("usage")]
    assert len(usage) == 1, usage
    return text, usage[0]


def stats(sock):
    s, _, b = curl(URL + "/internal/stats", unix=sock, timeout=5)
    return json.loads(b) if s == 200 else None


on = start_worker("on")
off = start_worker("off", "--prefix-cache", "false")

p1 = [(11 * j) % 500 + 5 for j in range(150)]
p2 = p1 + [(13 * j) % 500 + 7 for j in range(30)]

a1, u1 = complete(on, p1)
b1, v1 = complete(off, p1)
t.ok(a1 == b1 and u1["prompt_tokens_details"]["cached_tokens"] == 0
     and v1["prompt_tokens_details"]["cached_tokens"] == 0,
     "turn 1: the same greedy text with and without the cache, nothing cached (%r)" % u1)

# Turn 2 begins with turn 1's prompt: its whole blocks are cached (the block
# holding turn 1's answer differs from turn 2's new tokens).
a2, u2 = complete(on, p2)
b2, v2 = complete(off, p2)
n1, n2 = u1["prompt_tokens"], u2["prompt_tokens"]
want2 = min(n1 // BT, (n2 - 1) // BT) * BT
t.ok(a2 == b2, "turn 2: the same greedy text with and without the cache")
t.ok(u2["prompt_tokens_details"]["cached_tokens"] == want2 and v2["prompt_tokens_details"]["cached_tokens"] == 0,
     "turn 2: cached_tokens %d of %d (want %d), 0 without the cache"
     % (u2["prompt_tokens_details"]["cached_tokens"], n2, want2))

# The same prompt again, streamed: its own blocks but the last token's.
a3, u3 = complete(on, p2, stream=True)
want3 = (n2 - 1) // BT * BT
t.ok(a3 == a2 and u3["prompt_tokens_details"]["cached_tokens"] == want3 and u3["prompt_tokens"] == n2,
     "streamed repeat: the same text, usage chunk says cached_tokens %d (want %d)"
     % (u3["prompt_tokens_details"]["cached_tokens"], want3))

st_on = wait_until(lambda: (lambda x: x if x and x["requests_done"] >= 3 else None)(stats(on)), 10, "stats")
st_off = stats(off)
cached = want2 + want3
computed = n1 + n2 + n2 - cached
t.ok(st_on["prefix_cache"] is True and st_on["prompt_tokens_cached"] == cached
     and st_on["prompt_tokens_computed"] == computed
     and abs(st_on["prefix_cache_hit_rate"] - cached / (cached + computed)) < 1e-6
     and st_on["kv_blocks_cached"] > 0 and st_on["kv_blocks_free"] == st_on["kv_blocks_total"],
     "stats with the cache: %d computed, %d cached, hit rate %.3f, %d blocks cached, all free or evictable"
     % (st_on["prompt_tokens_computed"], st_on["prompt_tokens_cached"], st_on["prefix_cache_hit_rate"],
        st_on["kv_blocks_cached"]))
t.ok(st_off["prefix_cache"] is False and st_off["prompt_tokens_cached"] == 0
     and st_off["prompt_tokens_computed"] == n1 + n2 and st_off["kv_blocks_cached"] == 0,
     "stats without: every prompt token computed, nothing cached")

t.finish()
