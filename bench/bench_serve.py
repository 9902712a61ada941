#!/usr/bin/python3
"""Serving benchmark of `infergate worker`: closed-loop streaming clients.

Each of C clients sends a streaming completion (prompt of P token ids,
G new tokens, ignore_eos so every request is the same length), and sends the
next one when the last ends. The first round of every client is left out
(warm-up); the next R rounds are measured, more where few clients would
measure fewer than --min-tokens tokens (the single client's figure is the
denominator of the scaling ratio, and a short run of it is noisy). Reported
per C: aggregate generated tokens/s (and, as "all / prefill", the prompt
and generated tokens the worker computed per second against the prefill
rate), p50/p99 time-to-first-token (send -> first token event) and
time-per-output-token (gaps between token events of one stream).

The prefill rate of the same build is measured in the same run with
`infergate generate` on a P-token prompt, for the "aggregate / prefill"
ratio the targets are stated in.

The clients are bench_loadgen (C, nghttp2; built beside infergate) by
default: this machine has two cores, both computing for the worker, and the
load generator takes its CPU from them. `--client httpx` runs the same
closed loop in Python (httpx over HTTP/2), which took a tenth of a core at
16 clients where bench_loadgen takes a hundredth; kept to compare.

Needs Debian's python3-httpx and python3-h2 for `--client httpx` (run with
/usr/bin/python3).

  /usr/bin/python3 bench/bench_serve.py --infergate build/infergate \
      [--model FILE] [--clients 1,4,16,32] [--rounds 3] [--min-tokens 3072] [--prompt 128] [--gen 128] [--threads 2]
      [--kv-type f16|q8_0] [--client loadgen|httpx]
"""
import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time



def pct(v, p):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def run_level_loadgen(loadgen, sock, clients, rounds, prompt_len, gen, vocab):
    r = subprocess.run([loadgen, "--unix", sock, "--clients", str(clients), "--rounds", str(rounds),
                        "--prompt", str(prompt_len), "--gen", str(gen), "--vocab", str(vocab)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("bench_loadgen failed: %s" % r.stderr.strip())
    return json.loads(r.stdout)


async def one_request(client, prompt, gen, rec):
    body = {"model": "m", "prompt": prompt, "max_tokens": gen, "temperature": 0, "stream": True,
            "ignore_eos": True}
    t0 = time.monotonic()
    stamps = []
    async with client.stream("POST", "http://localhost/v1/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            rec["errors"] += 1
            await r.aread()
            return
        async for line in r.aiter_lines():
            line = line.rstrip("\r\n")
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                ev = json.loads(line[6:])
            except ValueError:
                raise RuntimeError("bad SSE line: %r" % line[:200])
            ch = ev.get("choices") or []
            if ch and ch[0].get("finish_reason") is None:
                stamps.append(time.monotonic())
    if not stamps:
        rec["errors"] += 1
        return
    rec["ttft"].append(stamps[0] - t0)
    rec["tpot"].extend(b - a for a, b in zip(stamps, stamps[1:]))
    rec["tokens"] += gen
    rec["first_start"] = min(rec["first_start"], t0)
    rec["last_end"] = max(rec["last_end"], time.monotonic())


async def client_loop(client, rounds, prompt_len, gen, vocab, rec, warm, seed):
    rng = random.Random(seed)
    for i in range(rounds + 1):
        prompt = [1] + [rng.randrange(3, vocab) for _ in range(prompt_len - 1)]
        await one_request(client, prompt, gen, warm if i == 0 else rec)


async def run_level(sock, clients, rounds, prompt_len, gen, vocab):
    import httpx
    rec = {"ttft": [], "tpot": [], "tokens": 0, "errors": 0, "first_start": float("inf"), "last_end": 0.0}
    warm = {"ttft": [], "tpot": [], "tokens": 0, "errors": 0, "first_start": float("inf"), "last_end": 0.0}
    transport = httpx.AsyncHTTPTransport(uds=sock, http2=True)
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
    async with httpx.AsyncClient(transport=transport, http2=True, limits=limits) as client:
        await asyncio.gather(*(client_loop(client, rounds, prompt_len, gen, vocab, rec, warm, 1000 * clients + c)
                               for c in range(clients)))
    rec["errors"] += warm["errors"]
    return rec


def prefill_rate(infergate, model, prompt_len, threads, reps=3):
    rates = []
    toks = ",".join(["1"] + [str(3 + (i * 7919) % 31000) for i in range(prompt_len - 1)])
    for _ in range(reps):
        r = subprocess.run([infergate, "generate", "--model", model, "--prompt-tokens", toks, "-n", "1",
                            "--threads", str(threads)], capture_output=True, text=True, check=True)
        line = [l for l in r.stderr.splitlines() if l.startswith("prefill:")][0]
        rates.append(float(line.split("(")[1].split()[0]))
    return statistics.median(rates), min(rates), max(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--infergate", default="build/infergate")
    ap.add_argument("--model", default=None)
    ap.add_argument("--clients", default="1,4,16,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-tokens", type=int, default=3072,
                    help="more rounds where fewer clients would measure fewer tokens than this")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seqs", type=int, default=32)
    ap.add_argument("--kv-type", default="f16", help="the worker's --kv-type (f16 or q8_0)")
    ap.add_argument("--client", default="loadgen", choices=["loadgen", "httpx"])
    a = ap.parse_args()

    model = a.model
    if not model:
        model = "/tmp/infergate-bench/synth-768-12-2048-32000-q8_0.gguf"
        if not os.path.exists(model):
            os.makedirs(os.path.dirname(model), exist_ok=True)
            subprocess.run([a.infergate, "model", "gen", "--out", model, "--dim", "768", "--layers", "12", "--heads",
                            "12", "--kv-heads", "12", "--ffn", "2048", "--vocab", "32000", "--ctx", "2048",
                            "--type", "q8_0"], check=True)
    vocab = 32000
    d = tempfile.mkdtemp(prefix="infergate-bench-")
    sock = os.path.join(d, "w.sock")
    log = open(os.path.join(d, "worker.log"), "wb")
    w = subprocess.Popen([a.infergate, "worker", "--model", model, "--model-name", "m", "--listen", "unix:" + sock,
                          "--threads", str(a.threads), "--max-seqs", str(a.max_seqs), "--max-queue", "256",
                          "--kv-cache-mb", "2048", "--kv-type", a.kv_type], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        pre = prefill_rate(a.infergate, model, a.prompt, a.threads)
        print("clients: %s; model %s, worker --threads %d --max-seqs %d --kv-type %s; prompt %d tokens, %d new tokens, %d measured rounds "
              "per client (at least %d tokens per level) after one warm-up round" %
              (a.client, model, a.threads, a.max_seqs, a.kv_type, a.prompt, a.gen, a.rounds, a.min_tokens))
        print("prefill rate of this build (infergate generate, %d-token prompt, %d threads): %.1f tok/s "
              "(min %.1f, max %.1f)\n" % (a.prompt, a.threads, pre[0], pre[1], pre[2]))
        print("| clients | aggregate tok/s | x single | / prefill | all / prefill | TTFT p50 ms | TTFT p99 ms "
              "| TPOT p50 ms | TPOT p99 ms | p99/p50 TPOT | errors |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        single = None
        for c in [int(x) for x in a.clients.split(",")]:
            rounds = max(a.rounds, -(-a.min_tokens // (c * a.gen)))
            if a.client == "loadgen":
                lg = run_level_loadgen(os.path.join(os.path.dirname(a.infergate), "bench_loadgen"), sock, c,
                                       rounds, a.prompt, a.gen, vocab)
                agg = lg["tokens"] / lg["wall_s"] if lg["tokens"] else 0.0
                t50, t99, p50, p99 = (float("nan") if lg[k] is None else lg[k]
                                      for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"))
                rec = {"errors": lg["errors"]}
            else:
                rec = asyncio.run(run_level(sock, c, rounds, a.prompt, a.gen, vocab))
                agg = rec["tokens"] / (rec["last_end"] - rec["first_start"]) if rec["tokens"] else 0.0
                t50, t99 = pct(rec["ttft"], 50) * 1e3, pct(rec["ttft"], 99) * 1e3
                p50, p99 = pct(rec["tpot"], 50) * 1e3, pct(rec["tpot"], 99) * 1e3
            single = single or agg
            # "all": prompt and generated tokens, both of which each step
            # computes (every request has the same lengths, ignore_eos)
            allr = agg * (a.prompt + a.gen) / a.gen
            print("| %d | %.1f | %.2f | %.0f%% | %.0f%% | %.0f | %.0f | %.1f | %.1f | %.2f | %d |" %
                  (c, agg, agg / single, 100 * agg / pre[0], 100 * allr / pre[0], t50, t99, p50, p99, p99 / p50,
                   rec["errors"]), flush=True)
    finally:
        w.terminate()
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.kill()
        subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    sys.exit(main())
