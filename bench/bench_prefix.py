#!/usr/bin/python3
"""Multi-turn chat against `infergate worker`, prefix cache on against off
(issue 30), in one run on one model.

C conversations run at once, each T turns in a closed loop: a shared system
prompt of about S tokens, then per turn about U new user tokens and an
answer of G tokens (greedy, ignore_eos), the whole conversation sent again
each turn (/v1/chat/completions, streamed), as chat clients do. The same
workload runs on a worker with the cache (the default) and one with
`--prefix-cache false`, one after the other. Reported per turn: time to
first token p50 and p99 over the conversations, and the prompt tokens the
worker computed (its /internal/stats, before and after); per run: total
time, tokens generated per second, hit rate, cached_tokens the responses
reported, and the time between tokens (ITL: the gaps between a stream's
content chunks after its first, p50 and p99 over every stream's gaps).
With --baseline OTHER_BINARY (an older build; may be given more than once)
the same workload runs on it too, in the same invocation (new on, old on,
new off, old off), and every build's tables are printed; with --on-only,
the cache-on runs alone, one line per build.

Text is made of words from a fixed list; the tokens a word takes are
measured first (one request), so S and U are met to a few percent.
Answers go back as text and are tokenized again, as a real client's are:
where that gives other tokens than the model generated, the blocks holding
the answer are not found and are computed again.

The clients are curl processes (HTTP/2 cleartext on the worker's socket)
read by threads: Debian's python3 has no HTTP/2 client.

  /usr/bin/python3 bench/bench_prefix.py --infergate build/infergate \
      [--model FILE] [--conversations 16] [--turns 8] [--system 1000] [--user 100] [--gen 32] [--threads 2] \
      [--baseline OTHER_INFERGATE]... [--on-only]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud light market "
         "window garden summer winter number letter system answer question model token cache block").split()


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    f = int(k)
    return xs[f] if f + 1 >= len(xs) else xs[f] + (xs[f + 1] - xs[f]) * (k - f)


def text(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def chat(sock, messages, gen, stream=True, url=None, headers_to=None, gaps_to=None):
    """One streamed chat completion: (ttft_s, answer text, usage). On the
    worker's socket, or at url (a gateway); headers_to: a list that gets the
    response's header lines; gaps_to: a list that gets the seconds between
    the content chunks after the first."""
    body = {"model": "m", "messages": messages, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
            "stream": stream, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    where = ["--unix-socket", sock, "http://localhost/v1/chat/completions"] if url is None else \
        [url + "/v1/chat/completions"]
    p = subprocess.Popen(["curl", "-sS", "-N", "-D", "/dev/stderr", "--http2-prior-knowledge", "--max-time", "1200",
                          "-H", "content-type: application/json", "--data-binary", "@-"] + where,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write(json.dumps(body).encode())
    p.stdin.close()
    ttft, out, usage, last = None, [], None, None
    for line in p.stdout:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices") or []:
            delta = ch.get("delta", {})
            if ttft is None and "role" not in delta and ch.get("finish_reason") is None:
                ttft = time.monotonic() - t0  # the first token's chunk (after the role's)
            if delta.get("content"):
                out.append(delta["content"])
                now = time.monotonic()
                if gaps_to is not None and last is not None:
                    gaps_to.append(now - last)
                last = now
    p.wait()
    err = p.stderr.read().decode(errors="replace")
    if headers_to is not None:
        headers_to.extend(err.splitlines())
    if usage is None:
        raise RuntimeError("no usage: %s" % err[-300:])
    return (ttft if ttft is not None else time.monotonic() - t0), "".join(out), usage


def stats(sock):
    r = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "--unix-socket", sock, "--max-time", "10",
                        "http://localhost/internal/stats"], capture_output=True, check=True)
    return json.loads(r.stdout)


def start_worker(infergate, model, d, name, threads, extra):
    sock = os.path.join(d, name + ".sock")
    log = open(os.path.join(d, name + ".log"), "wb")
    w = subprocess.Popen([infergate, "worker", "--model", model, "--model-name", "m", "--listen", "unix:" + sock,
                          "--threads", str(threads), "--max-seqs", "32", "--max-queue", "256",
                          "--kv-cache-mb", "1024"] + extra, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(1200):
        if os.path.exists(sock):
            try:
                stats(sock)
                return w, sock
            except subprocess.CalledProcessError:
                pass
        time.sleep(0.1)
    raise RuntimeError("worker did not start")


def run(sock, convs, turns, gen):
    """Runs every conversation's turns; returns per-turn TTFTs, cached_tokens, wall time."""
    ttft = [[] for _ in range(turns)]
    cached = [[] for _ in range(turns)]
    prompt = [[] for _ in range(turns)]
    answers = {}
    errors = []
    gaps = []

    def one(ci, conv):
        try:
            msgs = [{"role": "system", "content": conv["system"]}]
            for ti in range(turns):
                msgs.append({"role": "user", "content": conv["users"][ti]})
                t, ans, u = chat(sock, msgs, gen, gaps_to=gaps)
                ttft[ti].append(t)
                cached[ti].append(u.get("prompt_tokens_details", {}).get("cached_tokens", 0))
                prompt[ti].append(u["prompt_tokens"])
                answers[(ci, ti)] = ans
                msgs.append({"role": "assistant", "content": ans})
        except Exception as e:  # reported after the run
            errors.append(repr(e))

    s0 = stats(sock)
    t0 = time.monotonic()
    th = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(convs)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    wall = time.monotonic() - t0
    time.sleep(0.5)
    s1 = stats(sock)
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    return {"ttft": ttft, "cached": cached, "prompt": prompt, "answers": answers, "wall": wall, "gaps": gaps,
            "computed": s1["prompt_tokens_computed"] - s0["prompt_tokens_computed"],
            "reused": s1["prompt_tokens_cached"] - s0["prompt_tokens_cached"],
            "generated": s1["tokens_generated"] - s0["tokens_generated"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--infergate", default="build/infergate")
    ap.add_argument("--model", default=None)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system", type=int, default=1000)
    ap.add_argument("--user", type=int, default=100)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", action="append", default=[],
                    help="another infergate binary run on the same workload (repeatable)")
    ap.add_argument("--on-only", action="store_true", help="the cache-on runs alone")
    a = ap.parse_args()

    model = a.model
    if not model:
        model = "/tmp/infergate-bench/synth-768-12-2048-32000-ctx4096-q8_0.gguf"  # turn 8 passes 2048
        if not os.path.exists(model):
            os.makedirs(os.path.dirname(model), exist_ok=True)
            subprocess.run([a.infergate, "model", "gen", "--out", model, "--dim", "768", "--layers", "12", "--heads",
                            "12", "--kv-heads", "12", "--ffn", "2048", "--vocab", "32000", "--ctx", "4096",
                            "--type", "q8_0"], check=True)
    d = tempfile.mkdtemp(prefix="infergate-bench-prefix-")
    builds = [("", a.infergate)] + [(" (baseline%s)" % (" %d" % (i + 1) if len(a.baseline) > 1 else ""), b)
                                    for i, b in enumerate(a.baseline)]
    cases = (("on", []),) + (() if a.on_only else (("off", ["--prefix-cache", "false"]),))
    runs = [(case + tag, binary, extra) for case, extra in cases for tag, binary in builds]
    results, convs = {}, None
    try:
        for name, binary, extra in runs:
            w, sock = start_worker(binary, model, d, name.split()[0] + str(len(results)), a.threads, extra)
            try:
                if convs is None:
                    # tokens per word of this tokenizer: a 400-word message alone
                    # against an empty one (the template's tokens cancel)
                    rng = random.Random(1)
                    _, _, u0 = chat(sock, [{"role": "user", "content": "x"}], 1)
                    _, _, u1 = chat(sock, [{"role": "user", "content": text(rng, 400)}], 1)
                    per_word = (u1["prompt_tokens"] - u0["prompt_tokens"]) / 399.0
                    rng = random.Random(2)
                    system = text(rng, max(1, round(a.system / per_word)))
                    convs = [{"system": system,
                              "users": ["%d: %s" % (c, text(rng, max(1, round(a.user / per_word))))
                                        for _ in range(a.turns)]} for c in range(a.conversations)]
                results[name] = run(sock, convs, a.turns, a.gen)
                print("%s: %.1f s (load average %s)" % (name, results[name]["wall"],
                                                       " ".join(open("/proc/loadavg").read().split()[:3])),
                      file=sys.stderr, flush=True)
            finally:
                w.terminate()
                w.wait(timeout=60)
    finally:
        subprocess.run(["rm", "-rf", d])

    print("model %s, worker --threads %d --max-seqs 32 --kv-cache-mb 1024; %d conversations x %d turns at once, "
          "system prompt ~%d tokens, ~%d user tokens and %d answer tokens a turn (%.2f tokens a word)"
          % (model, a.threads, a.conversations, a.turns, a.system, a.user, a.gen, per_word))
    if a.on_only:
        report_on_only(a, builds, results)
    else:
        for tag, binary in builds:
            report(a, binary, results["on" + tag], results["off" + tag])
    for case, _ in cases:
        for tag, binary in builds[1:]:
            x, y = results[case]["answers"], results[case + tag]["answers"]
            print("\ncache %s: %d of %d answers of %s identical with %s's"
                  % (case, sum(x[k] == y[k] for k in x), len(x), binary, a.infergate))
    return 0


def report_on_only(a, builds, results):
    print("\n| build | " + " | ".join("turn %d TTFT p50 / p99 (ms)" % (t + 1) for t in range(a.turns))
          + " | turns 2-%d p50 / p99 | total s | ITL p50 / p99 (ms) |" % a.turns)
    print("|---" * (a.turns + 4) + "|")
    for tag, binary in builds:
        r = results["on" + tag]
        late = [x for t in range(1, a.turns) for x in r["ttft"][t]]
        print("| %s | " % binary
              + " | ".join("%.0f / %.0f" % (pct(r["ttft"][t], 50) * 1e3, pct(r["ttft"][t], 99) * 1e3)
                           for t in range(a.turns))
              + " | %.0f / %.0f | %.1f | %.1f / %.1f |" % (pct(late, 50) * 1e3, pct(late, 99) * 1e3, r["wall"],
                                                          pct(r["gaps"], 50) * 1e3, pct(r["gaps"], 99) * 1e3))


def report(a, binary, on, off):
    same = sum(on["answers"][k] == off["answers"][k] for k in on["answers"])
    print("\n%s\n" % binary)
    print("| turn | prompt tokens p50 | TTFT p50 on / off (ms) | TTFT p99 on / off (ms) | p50 off / on "
          "| cached_tokens p50 on |")
    print("|---|---|---|---|---|---|")
    for ti in range(a.turns):
        p50on, p50off = pct(on["ttft"][ti], 50) * 1e3, pct(off["ttft"][ti], 50) * 1e3
        print("| %d | %d | %.0f / %.0f | %.0f / %.0f | %.1fx | %d |"
              % (ti + 1, statistics.median(on["prompt"][ti]), p50on, p50off, pct(on["ttft"][ti], 99) * 1e3,
                 pct(off["ttft"][ti], 99) * 1e3, p50off / p50on, statistics.median(on["cached"][ti])))
    late_on = [x for ti in range(1, a.turns) for x in on["ttft"][ti]]
    late_off = [x for ti in range(1, a.turns) for x in off["ttft"][ti]]
    print("\nturns 2-%d pooled: TTFT p50 on %.0f ms, off %.0f ms (%.1fx); p99 on %.0f ms, off %.0f ms"
          % (a.turns, pct(late_on, 50) * 1e3, pct(late_off, 50) * 1e3, pct(late_off, 50) / pct(late_on, 50),
             pct(late_on, 99) * 1e3, pct(late_off, 99) * 1e3))
    print("\n| cache | total s | prompt tokens computed | taken from the cache | hit rate | generated tok/s "
          "| ITL p50 / p99 (ms) | ITL p99 / p50 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in (("on", on), ("off", off)):
        allp = r["computed"] + r["reused"]
        g50, g99 = pct(r["gaps"], 50) * 1e3, pct(r["gaps"], 99) * 1e3
        print("| %s | %.1f | %d | %d | %.1f%% | %.1f | %.1f / %.1f | %.1f |"
              % (name, r["wall"], r["computed"], r["reused"], 100.0 * r["reused"] / allp if allp else 0,
                 r["generated"] / r["wall"], g50, g99, g99 / g50 if g50 > 0 else float("nan")))
    print("\nwhole workload %.2fx sooner with the cache; %d of %d answers identical on and off"
          % (off["wall"] / on["wall"], same, len(on["answers"])))


if __name__ == "__main__":
    sys.exit(main())
