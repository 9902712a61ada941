"""infergate worker with real processes and a real HTTP/2 client (curl):
batched greedy output equals solo output, streaming equals non-streaming,
cancellation frees every KV block, queue limit -> 429, deadline -> 504,
and each error case gets an OpenAI error object without disturbing others."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import (INFERGATE, Checks, curl, gen_model, sse_events, spawn, tmpdir, wait_until)

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=128, layers=2, heads=4, kv_heads=2, ffn=256, vocab=512, ctx=512,
                  type="f32", seed=3)
sock = os.path.join(d, "w.sock")
URL = "http://localhost"


# INFERGATE_TEST_DEVICE=cuda runs the workers on the GPU (bench/gpu_check.sh);
# the Q8_0 KV cache is CPU-only, so that worker stays on the CPU.
DEVICE = os.environ.get("INFERGATE_TEST_DEVICE", "cpu")


def start_worker(sock, *extra, model_path=model, device=None):
    dev = device or ("cpu" if "--kv-type" in extra else DEVICE)
    p = spawn([INFERGATE, "worker", "--model", model_path, "--model-name", "m", "--listen", "unix:" + sock,
               "--threads", "2", "--device", dev] + list(extra), os.path.join(d, os.path.basename(sock) + ".log"))
    wait_until(lambda: curl(URL + "/health", unix=sock, timeout=2)[0] == 200 or p.poll() is not None, 60,
               "worker health")
    assert p.poll() is None, open(os.path.join(d, os.path.basename(sock) + ".log")).read()
    return p


def post(path, body, sock=sock, headers=(), timeout=60):
    return curl(URL + path, unix=sock, data=body, headers=headers, timeout=timeout)


def stats(sock=sock):
    s, _, b = curl(URL + "/internal/stats", unix=sock, timeout=5)
    return json.loads(b) if s == 200 else None


def popen_post(path, body, sock=sock, extra=()):
    args = ["curl", "-sS", "--http2-prior-knowledge", "--unix-socket", sock, "--max-time", "120", "-D", "-",
            "-H", "content-type: application/json", "--data-binary", json.dumps(body), URL + path] + list(extra)
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


w = start_worker(sock, "--max-seqs", "32", "--max-queue", "64", "--kv-cache-mb", "64")

# --- HEAD is GET without the body (over HTTP/2: no DATA); 405 says Allow ---
r = subprocess.run(["curl", "-sS", "-I", "--http2-prior-knowledge", "--unix-socket", sock, "--max-time", "10",
                    URL + "/v1/models"], capture_output=True, timeout=20)
s405, h405, _ = curl(URL + "/v1/completions", unix=sock)
t.ok(r.returncode == 0 and r.stdout.startswith(b"HTTP/2 200") and s405 == 405 and h405.get("allow") == "POST",
     "HEAD /v1/models 200 with no body (curl %d); GET /v1/completions 405 allow %s"
     % (r.returncode, h405.get("allow")))

# --- 32 concurrent greedy requests return what each returns alone ---
prompts = [[1] + [(7 * i + 13 * j) % 500 + 5 for j in range(3 + i % 11)] for i in range(32)]
def body(p, stream=False, n=12):
    return {"model": "m", "prompt": p, "max_tokens": n, "temperature": 0, "stream": stream}
alone = []
for p in prompts:
    s, _, b = post("/v1/completions", body(p))
    alone.append(json.loads(b)["choices"][0]["text"] if s == 200 else None)
t.ok(all(a is not None for a in alone), "32 solo completions answered 200")
procs = [popen_post("/v1/completions", body(p)) for p in prompts]
together = []
for pr in procs:
    out, _ = pr.communicate(timeout=120)
    s, _, b = __import__("harness").parse_curl(out)
    together.append(json.loads(b)["choices"][0]["text"] if s == 200 else None)
t.ok(together == alone, "32 concurrent greedy completions equal their solo runs")
# The last answer can reach its client before the step that sent it is
# counted and published, so the stats are read until they settle.
st = wait_until(lambda: (lambda x: x if x and x["requests_done"] >= 64 and x["tokens_generated"] >= 64
                         and x["running"] == 0 and x["queued"] == 0 else None)(stats()), 10,
                "stats counting the 64 requests")
t.ok(st is not None, "stats count the requests and tokens: %s" % st)

# --- logit_bias steers the greedy choice; the model object by its id ---
def text_of(extra):
    s, _, b = post("/v1/completions", dict(body(prompts[0], n=4), **extra))
    return json.loads(b)["choices"][0]["text"] if s == 200 else (s, b)
forced = [text_of({"logit_bias": {str(tok): 100}}) for tok in (300, 301)]
t.ok(isinstance(forced[0], str) and forced[0] != alone[0][:len(forced[0])] and forced[0] != forced[1]
     and text_of({"logit_bias": {"300": 100}}) == forced[0],
     "logit_bias +100 makes the token the greedy choice: %r" % forced)
# --- chat logprobs: each token's, and the likeliest; streamed the same ---
lp_req = {"model": "m", "messages": [{"role": "user", "content": "count"}], "max_tokens": 8,
          "temperature": 0, "logprobs": True, "top_logprobs": 3}
s, _, b = post("/v1/chat/completions", lp_req)
whole = json.loads(b) if s == 200 else {}
content = (((whole.get("choices") or [{}])[0].get("logprobs") or {}).get("content")) or []
text = whole["choices"][0]["message"]["content"] if content else None
t.ok(len(content) == whole.get("usage", {}).get("completion_tokens")
     and bytes(x for e in content for x in e["bytes"]).decode("utf-8", "replace") == text
     and all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 and e["top_logprobs"][0]["logprob"] == e["logprob"]
             and e["top_logprobs"][0]["bytes"] == e["bytes"]
             and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"] >= e["top_logprobs"][2]["logprob"]
             for e in content),
     "chat logprobs: one entry per token, bytes make the text, greedy picks the top one")
s, _, b = post("/v1/chat/completions", dict(lp_req, stream=True))
events, done = sse_events(b) if s == 200 else ([], False)
streamed = [e for ev in events for c in ev["choices"] if c.get("logprobs") for e in c["logprobs"]["content"]]
t.ok(done and [e["bytes"] for e in streamed] == [e["bytes"] for e in content]
     and all(abs(a["logprob"] - b_["logprob"]) < 1e-6 for a, b_ in zip(streamed, content)),
     "streamed chunks carry the same logprobs, each with its text")
s, _, b = post("/v1/chat/completions", dict(lp_req, logprobs=False))
t.ok(s == 400 and json.loads(b)["error"]["param"] == "top_logprobs", "top_logprobs without logprobs -> 400")
# A stop string's tokens count as generated, but their text is no part of
# the answer and neither are their log-probabilities. The stop is two of the
# greedy answer's tokens, first found where they begin, and the text before
# them ends in no start of it (else the stream holds that text back, and it
# goes out with the stop's first token and its log-probability).
s, _, b = post("/v1/chat/completions", dict(lp_req, max_tokens=24))
long_ch = json.loads(b)["choices"][0] if s == 200 else {}
pieces = [bytes(e["bytes"]) for e in long_ch["logprobs"]["content"]] if long_ch else []
cut = next((i for i in range(1, len(pieces) - 2)
            if (pieces[i] + pieces[i + 1]).strip() and (pieces[i] + pieces[i + 1]).isascii()
            and b"".join(pieces).find(pieces[i] + pieces[i + 1]) == len(b"".join(pieces[:i]))
            and not any(b"".join(pieces[:i]).endswith((pieces[i] + pieces[i + 1])[:k])
                        for k in range(1, len(pieces[i] + pieces[i + 1])))), None)
if cut is None:
    t.ok(False, "a stop string made of two answer tokens: none found in %r" % pieces)
else:
    stop = (pieces[cut] + pieces[cut + 1]).decode()
    stop_req = dict(lp_req, max_tokens=24, stop=[stop])
    s, _, b = post("/v1/chat/completions", stop_req)
    ch = json.loads(b) if s == 200 else {}
    got = [bytes(e["bytes"]) for e in ch["choices"][0]["logprobs"]["content"]] if ch else None
    t.ok(ch and ch["choices"][0]["finish_reason"] == "stop" and got == pieces[:cut]
         and ch["choices"][0]["message"]["content"] == long_ch["message"]["content"].split(stop)[0]
         and ch["usage"]["completion_tokens"] == cut + 2,
         "a matched stop string's tokens have no logprobs: %d of %d tokens" % (len(got or []), cut + 2))
    s, _, b = post("/v1/chat/completions", dict(stop_req, stream=True))
    events, done = sse_events(b) if s == 200 else ([], False)
    got = [bytes(e["bytes"]) for ev in events for c in ev["choices"] if c.get("logprobs")
           for e in c["logprobs"]["content"]]
    t.ok(done and got == pieces[:cut], "streamed, the same: %d entries" % len(got))

# A stop string whose start the text before it also ends in: that start is
# held back, and goes out when the stop's first token proves it no stop,
# while that token's own text is held in its turn. Its log-probability
# waits with its text, and is dropped with it at the match: streamed or
# not, the entries are the tokens' before the stop. Looked for among
# seeded answers (temperature 1).
def releases_held_text(pieces, i):
    """Whether, stopping on pieces[i] + pieces[i + 1] (where it first
    occurs), pieces[i] releases text before it that was held back."""
    stop, before = pieces[i] + pieces[i + 1], b"".join(pieces[:i])
    def hold(buf):  # the longest end of buf that begins the stop
        return next((h for h in range(len(stop) - 1, 0, -1) if buf.endswith(stop[:h])), 0)
    return (stop.isascii() and stop.strip() and b"".join(pieces).find(stop) == len(before)
            and 0 < hold(before) and hold(before + pieces[i]) < hold(before) + len(pieces[i]))
seeded = {"model": "m", "messages": [{"role": "user", "content": "z"}], "max_tokens": 40, "temperature": 1,
          "logprobs": True}
case = None
for seed in range(1, 81):
    s, _, b = post("/v1/chat/completions", dict(seeded, seed=seed))
    ps = [bytes(e["bytes"]) for e in json.loads(b)["choices"][0]["logprobs"]["content"]] if s == 200 else []
    cut = next((i for i in range(1, len(ps) - 1) if releases_held_text(ps, i)), None)
    if cut is not None:
        case = (seed, ps, cut)
        break
if case is None:
    t.ok(False, "a stop string whose start ends the text before it: none in 80 seeded answers")
else:
    seed, ps, cut = case
    stop_req = dict(seeded, seed=seed, stop=[(ps[cut] + ps[cut + 1]).decode()])
    s, _, b = post("/v1/chat/completions", stop_req)
    whole = [bytes(e["bytes"]) for e in json.loads(b)["choices"][0]["logprobs"]["content"]] if s == 200 else None
    s, _, b = post("/v1/chat/completions", dict(stop_req, stream=True))
    events, done = sse_events(b) if s == 200 else ([], False)
    got = [bytes(e["bytes"]) for ev in events for c in ev["choices"] if c.get("logprobs")
           for e in c["logprobs"]["content"]]
    t.ok(done and whole == ps[:cut] and got == ps[:cut],
         "a held-back start of the stop, released: the same logprobs streamed (%d) and not (%s), %d expected "
         "(seed %d, stop %r)" % (len(got), None if whole is None else len(whole), cut, seed, stop_req["stop"][0]))

# --- a completion's prompt reads the special tokens written in it ---
def prompt_tokens(prompt):
    s, _, b = post("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0})
    return json.loads(b)["usage"]["prompt_tokens"] if s == 200 else (s, b)
t.ok(prompt_tokens("</s>") == 2 and prompt_tokens("<x/s>") > 2,
     "'</s>' in a completion prompt is the one token (BOS, then it)")
t.ok(prompt_tokens("<s> hi") == prompt_tokens(" hi"), "a prompt that writes BOS gets no second one")

s, _, b = curl(URL + "/v1/models/m", unix=sock, timeout=5)
t.ok(s == 200 and json.loads(b)["id"] == "m" and json.loads(b)["object"] == "model", "GET /v1/models/m")
s, _, b = curl(URL + "/v1/models/%6D", unix=sock, timeout=5)
t.ok(s == 200 and json.loads(b)["id"] == "m", "GET /v1/models/%6D: the id's escapes decoded")
s, _, b = curl(URL + "/v1/models/x", unix=sock, timeout=5)
t.ok(s == 404 and json.loads(b)["error"]["code"] == "model_not_found", "GET /v1/models/x -> 404")

# --- a Q8_0 KV cache: the same batch invariance, in half the memory ---
sock_q8 = os.path.join(d, "wq8.sock")
wq8 = start_worker(sock_q8, "--max-seqs", "32", "--kv-cache-mb", "64", "--kv-type", "q8_0")
st_q8 = stats(sock_q8)
t.ok(st_q8["kv_type"] == "q8_0" and st["kv_type"] == "f16"
     and st_q8["kv_blocks_total"] > 1.8 * st["kv_blocks_total"],
     "--kv-type q8_0: %d blocks in 64 MiB, f16: %d" % (st_q8["kv_blocks_total"], st["kv_blocks_total"]))
alone_q8 = []
for p in prompts:
    s, _, b = post("/v1/completions", body(p), sock=sock_q8)
    alone_q8.append(json.loads(b)["choices"][0]["text"] if s == 200 else None)
procs = [popen_post("/v1/completions", body(p), sock=sock_q8) for p in prompts]
together_q8 = []
for pr in procs:
    out, _ = pr.communicate(timeout=120)
    s, _, b = __import__("harness").parse_curl(out)
    together_q8.append(json.loads(b)["choices"][0]["text"] if s == 200 else None)
t.ok(all(a is not None for a in alone_q8) and together_q8 == alone_q8,
     "q8_0 KV: 32 concurrent greedy completions equal their solo runs")
same = sum(a == b for a, b in zip(alone_q8, alone))
t.ok(same >= 16, "q8_0 KV: %d of 32 greedy completions equal the f16 cache's" % same)
wq8.send_signal(15)
t.ok(wq8.wait(timeout=40) == 0, "SIGTERM: q8_0 worker exits 0")
r = subprocess.run([INFERGATE, "worker", "--model", model, "--listen", "unix:" + sock_q8, "--kv-type", "q4_0"],
                   capture_output=True, text=True, timeout=30)
t.ok(r.returncode == 2 and "--kv-type: f16 or q8_0" in r.stderr, "--kv-type q4_0 is refused: %r" % r.stderr)
# --- a Q4_K_M file, llama.cpp's mixture (model gen --type quantizes as model
# quantize does), served with the same batch invariance; on the CPU, where
# the K-quants have kernels ---
qk = os.path.join(d, "q4km.gguf")
r = subprocess.run([INFERGATE, "model", "gen", "--out", qk, "--dim", "256", "--layers", "2", "--heads", "4",
                    "--kv-heads", "2", "--ffn", "512", "--vocab", "512", "--ctx", "256", "--type", "Q4_K_M",
                    "--seed", "3"], capture_output=True, text=True)
ri = subprocess.run([INFERGATE, "model", "inspect", qk], capture_output=True, text=True)
t.ok(r.returncode == 0 and ri.returncode == 0 and "q4_K " in ri.stdout and "q6_K " in ri.stdout
     and "bits per weight" in ri.stdout,
     "model gen --type Q4_K_M mixes q4_K and q6_K: %r" % (r.stderr or ri.stdout[-300:]))
sock_qk = os.path.join(d, "wqk.sock")
wqk = start_worker(sock_qk, "--max-seqs", "8", "--kv-cache-mb", "16", model_path=qk, device="cpu")
alone_qk = []
for p in prompts[:8]:
    s, _, b = post("/v1/completions", body(p), sock=sock_qk)
    alone_qk.append(json.loads(b)["choices"][0]["text"] if s == 200 else None)
procs = [popen_post("/v1/completions", body(p), sock=sock_qk) for p in prompts[:8]]
together_qk = []
for pr in procs:
    out, _ = pr.communicate(timeout=120)
    s, _, b = __import__("harness").parse_curl(out)
    together_qk.append(json.loads(b)["choices"][0]["text"] if s == 200 else None)
t.ok(all(a for a in alone_qk) and together_qk == alone_qk,
     "Q4_K_M: 8 concurrent greedy completions equal their solo runs")
wqk.send_signal(15)
t.ok(wqk.wait(timeout=40) == 0, "SIGTERM: Q4_K_M worker exits 0")

# --- the model commands: a seed that would wrap is refused; inspect's estimate ---
r = subprocess.run([INFERGATE, "model", "gen", "--seed", "-1", "--out", os.path.join(d, "never.gguf")],
                   capture_output=True, text=True)
t.ok(r.returncode == 2 and "--seed must be a whole number" in r.stderr, "model gen --seed -1 is refused: %r" % r.stderr)
r = subprocess.run([INFERGATE, "model", "inspect", model], capture_output=True, text=True)
t.ok(r.returncode == 0 and "KV cache (f16)" in r.stdout, "model inspect estimates the f16 cache: %r" % r.stdout[-160:])

# --- streaming and non-streaming give the same text; usage chunk; [DONE] ---
for i in (0, 5, 17):
    s, h, b = post("/v1/completions", dict(body(prompts[i], stream=True), stream_options={"include_usage": True}))
    events, done = sse_events(b)
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    usage = [e["usage"] for e in events if e.get("usage")]
    finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")]
    t.ok(s == 200 and h.get("content-type") == "text/event-stream", "stream %d: 200 text/event-stream" % i)
    t.ok(text == alone[i] and done, "stream %d: same text as non-streamed, ends with [DONE]" % i)
    t.ok(usage == [{"prompt_tokens": len(prompts[i]), "completion_tokens": 12, "total_tokens": len(prompts[i]) + 12,
                    "prompt_tokens_details": {"cached_tokens": 0}}],
         "stream %d: include_usage gives one usage chunk" % i)
    t.ok(finish[-1] == "length" and all(f is None for f in finish[:-1]), "stream %d: finish_reason on the last" % i)

# --- chat completions, streamed and not ---
chat = {"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 8, "temperature": 0}
s, _, b = post("/v1/chat/completions", chat)
r = json.loads(b) if s == 200 else {}
t.ok(s == 200 and r.get("object") == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant",
     "chat completion answered")
s, _, b = post("/v1/chat/completions", dict(chat, stream=True))
events, done = sse_events(b)
streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e.get("choices"))
t.ok(s == 200 and done and events[0]["choices"][0]["delta"].get("role") == "assistant"
     and streamed == r["choices"][0]["message"]["content"], "chat stream equals non-streamed chat")
last = [e["choices"][0] for e in events if e.get("choices")][-1]
t.ok(last["finish_reason"] == "length" and last["delta"] == {}, "chat stream ends with delta {} as OpenAI's: %s" % last)

# A message's text is text: "</s>" written by a client is four characters,
# as "<s/>" is, not the end-of-sequence token (nor could "<|im_start|>system"
# forge a role on a model that has it).
def chat_prompt_tokens(content):
    s, _, b = post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": content}],
                                            "max_tokens": 1})
    return json.loads(b)["usage"]["prompt_tokens"] if s == 200 else (s, b)
t.ok(chat_prompt_tokens("a</s>b") == chat_prompt_tokens("a<s/>b"),
     "special-token text in a message stays text: %s vs %s" % (chat_prompt_tokens("a</s>b"),
                                                               chat_prompt_tokens("a<s/>b")))

# --- seeds: a request without one draws anew, one with a seed repeats ---
def sampled(seed=None):
    b_ = {"model": "m", "prompt": prompts[1], "max_tokens": 24, "temperature": 1.5, "ignore_eos": True}
    if seed is not None:
        b_["seed"] = seed
    s, _, b = post("/v1/completions", b_)
    return json.loads(b)["choices"][0]["text"] if s == 200 else None
unseeded = [sampled() for _ in range(3)]
t.ok(None not in unseeded and len(set(unseeded)) == 3, "three unseeded draws at temperature 1.5 differ")
t.ok(sampled(42) == sampled(42) is not None, "two draws with seed 42 are the same")

# --- errors: each gets the error object, others keep going ---
bystander = popen_post("/v1/completions", body(prompts[3], stream=True, n=60))
cases = [
    ("malformed JSON", b'{"model": "m", "prompt": [1,2', 400, None),
    ("wrong type", {"model": "m", "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("unknown model", {"model": "nope", "prompt": "hi"}, 404, "model"),
    ("context exceeded", {"model": "m", "prompt": [1, 2, 3], "max_tokens": 600}, 400, "max_tokens"),
    ("context exceeded, the newer name", {"model": "m", "prompt": [1, 2, 3], "max_completion_tokens": 600}, 400,
     "max_completion_tokens"),
    ("prompt beyond the context", {"model": "m", "prompt": [1] * 600}, 400, "prompt"),
    # max_tokens not sent: the prompt is at fault, not a field it lacks
    ("context exceeded by the default max_tokens", {"model": "m", "prompt": [1] * 505}, 400, "prompt"),
    ("empty prompt", {"model": "m", "prompt": ""}, 400, "prompt"),
    ("n=2", {"model": "m", "prompt": "hi", "n": 2}, 400, "n"),
]
for what, b_, status, param in cases:
    s, h, b = post("/v1/completions", b_)
    try:
        e = json.loads(b)["error"]
        shape = all(k in e for k in ("message", "type", "param", "code")) and e["message"]
    except Exception:
        e, shape = {}, False
    t.ok(s == status and shape and (param is None or e.get("param") == param),
         "%s -> %d with an error object%s" % (what, status, " (param %s)" % param if param else ""))
out, _ = bystander.communicate(timeout=120)
events, done = sse_events(__import__("harness").parse_curl(out)[2])
t.ok(done and len([e for e in events if e.get("choices") and e["choices"][0]["text"]]) > 0,
     "a stream running alongside the errors finished normally")
s, _, _ = curl(URL + "/nope", unix=sock)
t.ok(s == 404, "unknown path -> 404")

# --- long prompts are parsed and encoded off the event loop ---
# A prompt past the context still gets its token count; clients that give up
# while theirs is being encoded leave nothing behind.
big = {"model": "m", "prompt": "long prompts are encoded on their own thread " * 6000, "max_tokens": 1}
s, _, b = post("/v1/completions", big)
e = json.loads(b).get("error", {}) if b else {}
t.ok(s == 400 and e.get("code") == "context_length_exceeded" and e.get("param") == "prompt",
     "a 270 KB prompt -> 400 context_length_exceeded: %s" % e.get("message"))
big_path = os.path.join(d, "big.json")
with open(big_path, "w") as f:
    json.dump(big, f)
quitters = [subprocess.Popen(["curl", "-sS", "--http2-prior-knowledge", "--unix-socket", sock, "--max-time", "0.05",
                              "-H", "content-type: application/json", "--data-binary", "@" + big_path,
                              URL + "/v1/completions"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(6)]
for pr in quitters:
    pr.communicate(timeout=30)
s, _, b = post("/v1/completions", body(prompts[0]))
t.ok(s == 200 and json.loads(b)["choices"][0]["text"] == alone[0],
     "after six clients left mid-encoding, the worker answers as before")

# --- deadline passed before start -> 504 ---
past = str(int(time.time() * 1000) - 1000)
s, _, b = post("/v1/completions", body(prompts[0]), headers=["x-infergate-deadline-ms: " + past])
t.ok(s == 504 and "error" in json.loads(b), "deadline in the past -> 504")
future = str(int(time.time() * 1000) + 60000)
s, _, _ = post("/v1/completions", body(prompts[0]), headers=["x-infergate-deadline-ms: " + future,
                                                               "x-infergate-priority: batch"])
t.ok(s == 200, "deadline in the future and batch priority -> 200")

# --- the tenant the gateway serves a request for, and its weight (fair share) ---
s, _, b = post("/v1/completions", body(prompts[0]), headers=["x-infergate-tenant: acme",
                                                               "x-infergate-tenant-weight: 2.5"])
t.ok(s == 200 and json.loads(b)["choices"][0]["text"] == alone[0], "a tenant and its weight -> 200, the same answer")
bad = [post("/v1/completions", body(prompts[0]), headers=h)[0]
       for h in (["x-infergate-tenant-weight: 0"], ["x-infergate-tenant-weight: heavy"],
                 ["x-infergate-tenant-weight: 1e9"], ["x-infergate-tenant: " + "t" * 65])]
t.ok(bad == [400] * 4, "a weight out of 0.001..1e6 or not a number, or a tenant name past 64 bytes -> 400: %s" % bad)

# --- a slower model for long-lived streams: cancellation and the queue limit ---
slow = gen_model(os.path.join(d, "slow.gguf"), dim=512, layers=8, heads=8, kv_heads=4, ffn=1024, vocab=512,
                 ctx=2048, type="q8_0", seed=5)
sock2 = os.path.join(d, "w2.sock")
w2 = start_worker(sock2, "--max-seqs", "4", "--max-queue", "2", model_path=slow)
long_body = lambda i: dict(body(prompts[i], stream=True, n=1900), ignore_eos=True)

# Cancellation: clients that vanish, running or queued, free every KV block.
total = stats(sock2)["kv_blocks_total"]
long_reqs = [popen_post("/v1/completions", long_body(i), sock=sock2) for i in range(6)]
# A sequence takes its blocks as its prompt is prefilled, a step after it is
# counted as running, so the stats are read until both show.
st = wait_until(lambda: (lambda x: x if x and x["running"] == 4 and x["queued"] == 2
                         and x["kv_blocks_free"] < total else None)(stats(sock2)), 30,
                "four streams running, holding KV blocks, and two queued")
t.ok(st["kv_blocks_free"] < total, "running streams hold KV blocks: %d of %d free" % (st["kv_blocks_free"], total))

# Queue limit: a seventh request finds the queue full.
s, h, b = post("/v1/completions", body(prompts[2], n=4), sock=sock2)
t.ok(s == 429 and 1 <= int(h.get("retry-after", "0")) <= 60 and json.loads(b)["error"]["type"] == "rate_limit_error",
     "queue full -> 429 with Retry-After")
s, h, b = post("/v1/completions", b'{"model": "m", "prompt": [1, 2', sock=sock2)
t.ok(s == 429 and "retry-after" in h, "queue full: a request is turned away before its body is parsed: %d" % s)
# The queue's fair share: the six are the nameless tenant's; another
# tenant's request takes the place of its youngest queued one, answered 429.
other = popen_post("/v1/completions", long_body(3), sock=sock2, extra=["-H", "x-infergate-tenant: other"])
gone = wait_until(lambda: [pr for pr in long_reqs if pr.poll() is not None], 15, "a queued request pushed out")
out = gone[0].communicate(timeout=10)[0] if gone else b""
st = stats(sock2)
t.ok(len(gone) == 1 and out.startswith(b"HTTP/2 429") and b"another tenant" in out and other.poll() is None
     and st and st["pushed_out"] == 1 and st["queued"] == 2,
     "queue full: another tenant's request takes the youngest queued one's place (429 to it); pushed_out %s"
     % (st and st["pushed_out"]))
long_reqs.append(other)

for pr in long_reqs:
    pr.kill()
    pr.wait()
freed = wait_until(lambda: (lambda x: x if x and x["running"] == 0 and x["queued"] == 0
                            and x["kv_blocks_free"] == total else None)(stats(sock2)),
                   15, "KV blocks back after the clients vanished")
t.ok(freed is not None, "cancelled streams left the batch and the queue and freed every KV block")
s, _, _ = post("/v1/completions", body(prompts[2], n=4), sock=sock2)
t.ok(s == 200, "the worker serves again after the cancellations")

# --- a KV pool smaller than the context: 1 MiB holds 128 of 2048 positions ---
# (the slow model's layers with a 16x wider feed-forward: ~4 ms a token, so
# that a request is still running when the next one comes)
wide = gen_model(os.path.join(d, "wide.gguf"), dim=512, layers=8, heads=8, kv_heads=4, ffn=8192, vocab=512,
                 ctx=2048, type="q8_0", seed=6)
sock3 = os.path.join(d, "w3.sock")
w3 = start_worker(sock3, "--kv-cache-mb", "1", model_path=wide)
pool = (lambda x: x["kv_blocks_total"] * x["kv_block_tokens"])(stats(sock3))
s, _, b = post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                        "temperature": 0, "ignore_eos": True}, sock=sock3)
r = json.loads(b) if s == 200 else {}
u = r.get("usage", {})
t.ok(s == 200 and r["choices"][0]["finish_reason"] == "length"
     and u["prompt_tokens"] + u["completion_tokens"] == pool,
     "no max_tokens: the chat runs until the %d-token pool is full, not 503: %d %s" % (pool, s, u))
s, _, b = post("/v1/completions", body(prompts[2], n=pool), sock=sock3)
e = json.loads(b).get("error", {}) if b else {}
t.ok(s == 503 and e.get("code") == "kv_cache_too_small" and ("holds %d tokens" % pool) in e.get("message", ""),
     "max_tokens past the pool -> 503 saying what fits: %s" % e.get("message"))
# The pool runs short with a batch and an interactive request running: the
# batch one gives its blocks back and waits, although it is the older.
pre = stats(sock3)["preemptions"]
batch = popen_post("/v1/completions", dict(body(prompts[2], stream=True, n=118), ignore_eos=True), sock=sock3,
                   extra=["-H", "x-infergate-priority: batch"])
wait_until(lambda: (stats(sock3) or {}).get("running") == 1, 30, "the batch request running", interval=0.02)
inter = popen_post("/v1/completions", dict(body(prompts[4], n=100), ignore_eos=True), sock=sock3)
order, until = [], time.time() + 120
while len(order) < 2 and time.time() < until:
    order += [n for n, pr in (("batch", batch), ("interactive", inter)) if n not in order and pr.poll() is not None]
    time.sleep(0.01)
outs = [__import__("harness").parse_curl(pr.communicate(timeout=10)[0]) for pr in (batch, inter)]
t.ok([o[0] for o in outs] == [200, 200] and sse_events(outs[0][2])[1], "both requests finished")
t.ok(order == ["interactive", "batch"] and stats(sock3)["preemptions"] > pre,
     "a short pool preempts the batch request, not the younger interactive one: %s" % order)
w3.send_signal(15)
t.ok(w3.wait(timeout=40) == 0, "SIGTERM: small-pool worker exits 0")

# --- a chat template we cannot render (it does not parse as our Jinja): ChatML, with a warning; or the
# family named ---
odd = gen_model(os.path.join(d, "odd.gguf"), dim=64, layers=1, heads=2, kv_heads=2, ffn=128, vocab=512, ctx=512,
                type="f32", seed=7, chat_template="{{ bos_token }}{% for m in messages %}<start_of_turn>{% endfor %}"
                "{% call x() %}{% endcall %}")
chat_msgs = {"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
             "max_tokens": 1, "temperature": 0}
llama2_text = "[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nhi [/INST]"
prompt_tokens = {}
for name, extra in (("fallback", ()), ("llama2", ("--chat-template", "llama2"))):
    sock4 = os.path.join(d, "w4%s.sock" % name)
    w4 = start_worker(sock4, *extra, model_path=odd)
    s, _, b = post("/v1/chat/completions", chat_msgs, sock=sock4)
    s2, _, b2 = post("/v1/completions", {"model": "m", "prompt": llama2_text, "max_tokens": 1}, sock=sock4)
    prompt_tokens[name] = (json.loads(b)["usage"]["prompt_tokens"] if s == 200 else s,
                           json.loads(b2)["usage"]["prompt_tokens"] if s2 == 200 else s2)
    w4.send_signal(15)
    w4.wait(timeout=40)
    prompt_tokens[name + " log"] = open(os.path.join(d, os.path.basename(sock4) + ".log")).read()
t.ok("chat template chatml (unrecognised template: fallback)" in prompt_tokens["fallback log"]
     and "warning: the model's chat template is none we render" in prompt_tokens["fallback log"]
     and prompt_tokens["fallback"][0] != prompt_tokens["fallback"][1],
     "an unrecognised chat template: ChatML, and a warning naming --chat-template: %s" % (prompt_tokens["fallback"],))
# ChatML's turns end at <|im_end|>, which this vocabulary has no token of:
# chats stop at its text; Llama-2's end at </s>, its EOS, which stops them.
t.ok("chat template chatml (unrecognised template: fallback), turns end at the text <|im_end|>;"
     in prompt_tokens["fallback log"] and "turns end at" not in prompt_tokens["llama2 log"],
     "a turn's end that no token ends generation at is an implicit stop string of chats")
t.ok("chat template llama2 (--chat-template)" in prompt_tokens["llama2 log"]
     and prompt_tokens["llama2"][0] == prompt_tokens["llama2"][1],
     "--chat-template llama2 renders the chat as Llama-2's template does: %s" % (prompt_tokens["llama2"],))
r = subprocess.run([INFERGATE, "worker", "--model", odd, "--listen", "unix:" + sock + "x", "--chat-template", "jinja"],
                   capture_output=True, text=True, timeout=30)
t.ok(r.returncode == 2 and "--chat-template: one of chatml, llama2" in r.stderr, "--chat-template jinja: refused by name")

# --- the model's own Jinja template; a Jinja file named instead; a template that raises ---
jin = gen_model(os.path.join(d, "jinja.gguf"), dim=64, layers=1, heads=2, kv_heads=2, ffn=128, vocab=512, ctx=512,
                type="f32", seed=7, chat_template="{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}\n"
                "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
                "{% if messages|length > 3 %}{{ raise_exception('at most 3 messages, please') }}{% endif %}")
tmpl_file = os.path.join(d, "mine.jinja")
with open(tmpl_file, "w") as f:
    f.write("{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}{% endfor %}[ASSISTANT]")
rendered = {}
for name, extra in (("model", ()), ("file", ("--chat-template", tmpl_file))):
    sock6 = os.path.join(d, "w6%s.sock" % name)
    w6 = start_worker(sock6, *extra, model_path=jin)
    s, _, b = post("/v1/chat/completions", chat_msgs, sock=sock6)
    want = {"model": "<system>be brief\n<user>hi\n<assistant>", "file": "[SYSTEM] be brief[USER] hi[ASSISTANT]"}
    s2, _, b2 = post("/v1/completions", {"model": "m", "prompt": want[name], "max_tokens": 1}, sock=sock6)
    s3, _, b3 = post("/v1/chat/completions", dict(chat_msgs, messages=chat_msgs["messages"] * 2), sock=sock6)
    rendered[name] = (json.loads(b)["usage"]["prompt_tokens"] if s == 200 else b,
                      json.loads(b2)["usage"]["prompt_tokens"] if s2 == 200 else b2, s3, b3)
    w6.send_signal(15)
    w6.wait(timeout=40)
    rendered[name + " log"] = open(os.path.join(d, os.path.basename(sock6) + ".log")).read()
t.ok(rendered["model"][0] == rendered["model"][1] and "chat template the model's (Jinja)" in rendered["model log"],
     "a chat renders through the model's own Jinja template: %s" % (rendered["model"][:2],))
t.ok(rendered["model"][2] == 400 and "the chat template failed: at most 3 messages, please" in rendered["model"][3].decode(),
     "a template's raise_exception is a 400 with its message: %s" % (rendered["model"][2:],))
t.ok(rendered["file"][0] == rendered["file"][1] and ("chat template %s (Jinja)" % tmpl_file) in rendered["file log"],
     "--chat-template FILE renders chats through that file: %s" % (rendered["file"][:2],))
bad_file = os.path.join(d, "bad.jinja")
with open(bad_file, "w") as f:
    f.write("line one\n{% if x %}\n{{ y }\n")
r = subprocess.run([INFERGATE, "worker", "--model", jin, "--listen", "unix:" + sock + "y", "--chat-template", bad_file],
                   capture_output=True, text=True, timeout=30)
t.ok(r.returncode != 0 and (bad_file + ": template line 3") in r.stderr,
     "a template file that does not parse stops the worker, naming its line: %r" % r.stderr[-300:])

# --- threads unset: one per CPU the worker may run on, not per CPU of the host ---
sock5 = os.path.join(d, "w5.sock")
w5 = spawn(["taskset", "-c", "0", INFERGATE, "worker", "--model", model, "--model-name", "m", "--listen",
            "unix:" + sock5], os.path.join(d, "w5.sock.log"))
st5 = wait_until(lambda: stats(sock5) if w5.poll() is None else {"threads": "exited"}, 60, "pinned worker stats")
t.ok(st5["threads"] == 1, "a worker pinned to one CPU with threads unset runs 1 thread: %s (host: %d CPUs)"
     % (st5["threads"], os.cpu_count()))
w5.send_signal(15)
w5.wait(timeout=40)

# --- threads unset under a CPU quota (a container's CPU limit): no more than it allows ---
# A cgroup of our own with a quota of one CPU, where this machine lets us
# make one (root, cgroup v1's cpu hierarchy or v2 with the cpu controller).
def make_cpu_cgroup():
    name = "infergate-test-%d" % os.getpid()
    for base, files in (("/sys/fs/cgroup/cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}),
                        ("/sys/fs/cgroup", {"cpu.max": "100000 100000"})):
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            for f, v in files.items():
                with open(os.path.join(path, f), "w") as fh:
                    fh.write(v)
            return path
        except OSError:
            os.rmdir(path)
    return None


cg = make_cpu_cgroup() if os.cpu_count() >= 2 else None
if cg:
    sock6 = os.path.join(d, "w6.sock")
    w6 = spawn(["/bin/sh", "-c", 'echo $$ > "%s/cgroup.procs" && exec "$@"' % cg, "sh", INFERGATE, "worker",
                "--model", model, "--model-name", "m", "--listen", "unix:" + sock6], os.path.join(d, "w6.sock.log"))
    try:
        st6 = wait_until(lambda: stats(sock6) if w6.poll() is None else {"threads": "exited"}, 60,
                         "worker stats under a quota")
        t.ok(st6["threads"] == 1, "a worker in a cgroup with a quota of one CPU, threads unset, runs 1 thread: %s "
             "(host: %d CPUs)" % (st6["threads"], os.cpu_count()))
    finally:
        w6.send_signal(15)
        w6.wait(timeout=40)
        os.rmdir(cg)
else:
    print("# no cgroup with a CPU quota can be made here (not root, or no cpu controller): quota check skipped")

# --- SIGTERM drains and exits ---
w.send_signal(15)
try:
    rc = w.wait(timeout=40)
except subprocess.TimeoutExpired:
    rc = None
t.ok(rc == 0, "SIGTERM: worker drains and exits 0")
w2.send_signal(15)
t.ok(w2.wait(timeout=40) == 0, "SIGTERM: second worker exits 0")
t.finish()
