#!/usr/bin/python3
"""Cache-aware choice of local worker against least-loaded (issue 30, item
3): `infergate serve` with two workers of one model, multi-turn chats
through the gateway, once with routing.cache_aware true (the default) and
once false, one after the other.

C conversations run at once, each T turns in a closed loop: a system
prompt of about S tokens shared by all, then per turn about U new user
tokens and an answer of G tokens (greedy, ignore_eos), the whole
conversation sent again each turn (streamed /v1/chat/completions). With
--distinct-system each conversation has a system prompt of its own (agents
with their own contexts): only its own worker holds its prefix. Reported
per run: time to first token p50 and p99 of turns 2..T, the hit rate (the
workers' prompt tokens taken from their prefix caches over all prompt
tokens, from /internal/stats), the share of turns 2..T that landed on the
worker of the turn before, and the total time.

  /usr/bin/python3 bench/bench_affinity.py --infergate build/infergate \
      [--model FILE] [--conversations 8] [--turns 6] [--system 500] [--user 60] [--gen 16] [--threads 1] \
      [--distinct-system]
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_prefix  # noqa: E402
from bench_prefix import pct, text  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat(url, messages, gen):
    """One streamed chat completion through the gateway: (ttft_s, answer, usage, worker)."""
    head = []
    ttft, text_, usage = bench_prefix.chat(None, messages, gen, url=url, headers_to=head)
    worker = next((l.split(":", 1)[1].strip() for l in head if l.lower().startswith("x-infergate-worker:")), "?")
    return ttft, text_, usage, worker


def stats(sock):
    r = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "--unix-socket", sock, "--max-time", "10",
                        "http://localhost/internal/stats"], capture_output=True, check=True)
    return json.loads(r.stdout)


def serve(a, model, d, cache_aware):
    port = free_port()
    run_dir = os.path.join(d, "run-%s" % cache_aware)
    cfg = os.path.join(d, "gw-%s.yaml" % cache_aware)
    w = "  - {model: \"%s\", name: m, threads: %d, max_seqs: 16, kv_cache_mb: 512, max_queue: 256}\n" % (
        model, a.threads)
    open(cfg, "w").write("listen:\n  - address: \"127.0.0.1:%d\"\nworkers:\n%s%s"
                         "routing: {cache_aware: %s}\nstats_interval_ms: 100\nruntime_dir: \"%s\"\n"
                         % (port, w, w, "true" if cache_aware else "false", run_dir))
    g = subprocess.Popen([a.infergate, "serve", "--config", cfg], stdout=open(os.path.join(d, "gw.log"), "ab"),
                         stderr=subprocess.STDOUT)
    socks = [os.path.join(run_dir, "worker-%d.sock" % i) for i in (0, 1)]
    for _ in range(1800):
        try:
            if all(stats(s) for s in socks):
                return g, "http://127.0.0.1:%d" % port, socks
        except (subprocess.CalledProcessError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError("gateway did not start")


def run(url, socks, convs, turns, gen):
    ttft = [[] for _ in range(turns)]
    stayed = []
    errors = []

    def one(conv):
        try:
            msgs = [{"role": "system", "content": conv["system"]}]
            last = None
            for ti in range(turns):
                msgs.append({"role": "user", "content": conv["users"][ti]})
                t, ans, _, w = chat(url, msgs, gen)
                ttft[ti].append(t)
                if last is not None:
                    stayed.append(w == last)
                last = w
                msgs.append({"role": "assistant", "content": ans})
        except Exception as e:
            errors.append(repr(e))

    s0 = [stats(s) for s in socks]
    t0 = time.monotonic()
    th = [threading.Thread(target=one, args=(c,)) for c in convs]
    for x in th:
        x.start()
    for x in th:
        x.join()
    wall = time.monotonic() - t0
    time.sleep(0.5)
    s1 = [stats(s) for s in socks]
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    computed = sum(b["prompt_tokens_computed"] - a["prompt_tokens_computed"] for a, b in zip(s0, s1))
    cached = sum(b["prompt_tokens_cached"] - a["prompt_tokens_cached"] for a, b in zip(s0, s1))
    late = [x for ti in range(1, turns) for x in ttft[ti]]
    return {"wall": wall, "p50": pct(late, 50), "p99": pct(late, 99), "hit": cached / max(1, computed + cached),
            "computed": computed, "stayed": sum(stayed) / max(1, len(stayed)),
            "per_worker": [b["requests_done"] - a["requests_done"] for a, b in zip(s0, s1)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--infergate", default="build/infergate")
    ap.add_argument("--model", default=None)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system", type=int, default=500)
    ap.add_argument("--user", type=int, default=60)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--distinct-system", action="store_true")
    a = ap.parse_args()
    model = a.model
    if not model:
        model = "/tmp/infergate-bench/synth-384-6-1024-32000-ctx4096-q8_0.gguf"
        if not os.path.exists(model):
            os.makedirs(os.path.dirname(model), exist_ok=True)
            subprocess.run([a.infergate, "model", "gen", "--out", model, "--dim", "384", "--layers", "6", "--heads",
                            "6", "--kv-heads", "6", "--ffn", "1024", "--vocab", "32000", "--ctx", "4096",
                            "--type", "q8_0"], check=True)
    d = tempfile.mkdtemp(prefix="infergate-bench-affinity-")
    rng = random.Random(2)
    per_word = 1.3  # refined below, on the first gateway
    results = {}
    try:
        for aware in (True, False):
            g, url, socks = serve(a, model, d, aware)
            try:
                if aware:
                    _, _, u0, _ = chat(url, [{"role": "user", "content": "x"}], 1)
                    _, _, u1, _ = chat(url, [{"role": "user", "content": text(random.Random(1), 400)}], 1)
                    per_word = (u1["prompt_tokens"] - u0["prompt_tokens"]) / 399.0
                    system = text(rng, max(1, round(a.system / per_word)))
                    convs = [{"system": ("%d: " % c if a.distinct_system else "") + system,
                              "users": ["%d: %s" % (c, text(rng, max(1, round(a.user / per_word))))
                                        for _ in range(a.turns)]} for c in range(a.conversations)]
                results[aware] = run(url, socks, convs, a.turns, a.gen)
            finally:
                g.terminate()
                g.wait(timeout=60)
    finally:
        subprocess.run(["rm", "-rf", d])
    print("model %s; two workers (threads %d, max_seqs 16); %d conversations x %d turns at once, system prompt ~%d "
          "tokens %s, ~%d user and %d answer tokens a turn\n"
          % (model, a.threads, a.conversations, a.turns, a.system,
             "one per conversation" if a.distinct_system else "shared", a.user, a.gen))
    print("| routing | turns 2-%d TTFT p50 (ms) | p99 (ms) | hit rate | prompt tokens computed "
          "| turns on the previous turn's worker | requests per worker | total s |" % a.turns)
    print("|---|---|---|---|---|---|---|---|")
    for aware in (True, False):
        r = results[aware]
        print("| %s | %.0f | %.0f | %.1f%% | %d | %.0f%% | %s | %.1f |"
              % ("cache_aware" if aware else "least loaded", r["p50"] * 1e3, r["p99"] * 1e3, 100 * r["hit"],
                 r["computed"], 100 * r["stayed"], "/".join(map(str, r["per_worker"])), r["wall"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
