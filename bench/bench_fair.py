#!/usr/bin/python3
"""Noisy neighbour (issue 31 item 4): fair share between tenants inside one
worker, through `infergate serve` and its CPU worker.

Tenant A keeps --streams requests open (a closed loop: each stream sends its
next request when the last ends; a prompt of --prompt words, --gen-a answer
tokens, ignore_eos); tenant B sends one request at a time (--gen-b answer
tokens, streamed). Both weigh 1. Four phases of --seconds each, one after
the other on one gateway and worker (--max-seqs slots), --rounds times
over (tokens/s averaged over the rounds, TTFTs pooled):

  b-alone    B alone: B's time to first token (TTFT)
  a-alone    A alone: the tokens/s the worker gives A
  a+b        both: B's TTFT, and A's and B's tokens/s
  a+b-same   both, B's requests sent with A's key (one tenant: the
             scheduler's order without fair share, for comparison)

Reported: B's TTFT p50/p99 alone, with A, and as A's own (the targets: p99
with A within 2x of alone; tokens/s with B within 10% of A alone), and A's
time between tokens (ITL) p50/p99, from --itl-streams of A's streams,
which are streamed (the others are not). Tokens are counted from the
answers' usage, for requests ending in the phase's window (the first 20%
of each phase is a warm-up, not counted).

With --old OTHER_INFERGATE (e.g. main's build), a second gateway runs that
binary beside the first (each with its worker; the idle one waits), and
every phase runs on the old one and then on the new one, round after
round: the builds compared see the same load.

Clients are Python threads over HTTP/1.1 (http.client). Each phase's CPU
time (cores busy on average) is reported for the gateway process, its
workers and this client: on a machine of few cores they share them.

  /usr/bin/python3 bench/bench_fair.py --infergate build/infergate \\
      [--old OLD/infergate] [--streams 64] [--seconds 20] [--rounds 2] [--max-seqs 32] [--threads 2] \
      [--prompt 48] [--gen-a 64] [--gen-b 8] [--itl-streams 8] [--phases b-alone,a-alone,a+b,a+b-same]
"""
import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefix import pct  # noqa: E402

KEY_A, KEY_B = "ig-bench-fair-tenant-a", "ig-bench-fair-tenant-b"
KEY_ADMIN = "ig-bench-fair-admin"  # reads /metrics
KEYS_AVG = ("a_tps", "b_tps", "p_tps", "cpu_gw", "cpu_worker", "cpu_client", "w_tokens", "w_prompt",
            "w_preempt")  # averaged over the rounds


def key_hash(infergate, k):
    out = subprocess.run([infergate, "key", "hash", k], capture_output=True, text=True, check=True).stdout
    return re.search(r"[0-9a-f]{64}", out).group(0)


def request(port, key, prompt, gen, stream, gaps=None):
    """One completion: (ttft_s or None, completion tokens, prompt tokens, end time); streamed, the times
    between its token events are appended to gaps (when given), then their mean (its TPOT) as a tuple."""
    body = {"model": "m", "prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", json.dumps(body),
              {"content-type": "application/json", "authorization": "Bearer " + key})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("status %d: %s" % (r.status, r.read()[:300]))
    ttft, tokens, prompt_tokens, last = None, 0, 0, None
    if not stream:
        u = json.loads(r.read())["usage"]
        tokens, prompt_tokens = u["completion_tokens"], u["prompt_tokens"]
    else:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens, prompt_tokens = ev["usage"]["completion_tokens"], ev["usage"]["prompt_tokens"]
            if any(ch.get("text") for ch in ev.get("choices") or []):
                now = time.monotonic()
                if ttft is None:
                    ttft = now - t0
                elif gaps is not None:
                    gaps.append(now - last)
                last = now
    c.close()
    if gaps is not None and last is not None and ttft is not None and tokens > 1:
        gaps.append(((last - t0 - ttft) / (tokens - 1),))
    return ttft, tokens, prompt_tokens, time.monotonic()


def cpu_s(pid):
    """CPU seconds (user + system) process pid has used; 0 once it is gone."""
    try:
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_split(gw_pid):
    """CPU seconds so far: (the gateway process, its children (the workers), this client)."""
    kids = []
    try:
        for t in os.listdir("/proc/%d/task" % gw_pid):
            kids += [int(x) for x in open("/proc/%d/task/%s/children" % (gw_pid, t)).read().split()]
    except OSError:
        pass
    me = os.times()
    return cpu_s(gw_pid), sum(cpu_s(k) for k in kids), me.user + me.system


def worker_counts(port):
    """From the gateway's /metrics: the worker's tokens charged per tenant (prompt and generated, not
    recomputes), prompt tokens it computed (recomputes included) and fair-share preemptions; {} when
    they cannot be read."""
    out = {}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics", headers={"authorization": "Bearer " + KEY_ADMIN})
        r = c.getresponse()
        text = r.read().decode()
        if r.status != 200:
            return {}
    except OSError:
        return {}
    for line in text.splitlines():
        m = re.match(r'(infergate_worker_tenant_tokens_total|infergate_worker_tenant_preemptions_total|'
                     r'infergate_worker_prompt_tokens_total)\{([^}]*)\} ([0-9.e+]+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if m.group(1) == "infergate_worker_prompt_tokens_total":
            if labels.get("source") == "computed":
                out["prompt_computed"] = out.get("prompt_computed", 0) + float(m.group(3))
        else:
            k = ("tokens_" if "tokens" in m.group(1) else "preempted_") + labels.get("tenant", "")
            out[k] = out.get(k, 0) + float(m.group(3))
    return out


def phase(port, streams, b_key, seconds, prompt_a, prompt_b, gen_a, gen_b, itl_streams, gw_pid):
    """Runs A's streams (if any; itl_streams of them streamed) and B's loop (if b_key) for `seconds`:
    B's TTFTs, A's times between tokens, and the tokens of A and B ending in the window."""
    t_start = time.monotonic()
    t_from, t_end = t_start + 0.2 * seconds, t_start + seconds
    lock = threading.Lock()
    out = {"a": 0, "b": 0, "prompts": 0, "ttft": [], "itl": [], "tpot": [], "errors": []}

    def loop(who, key, prompt, gen, stream):
        try:
            i = 0
            while time.monotonic() < t_end:
                gaps = [] if who == "a" and stream else None
                ttft, n, n_prompt, t = request(port, key, "%s %d %s" % (who, i, prompt), gen, stream, gaps)
                i += 1
                with lock:
                    if t_from <= t <= t_end:
                        out[who] += n
                        out["prompts"] += n_prompt
                        if who == "b":
                            out["ttft"].append(ttft)
                        out["itl"] += [g for g in gaps or [] if not isinstance(g, tuple)]
                        out["tpot"] += [g[0] for g in gaps or [] if isinstance(g, tuple)]
        except Exception as e:  # reported after the phase
            out["errors"].append(repr(e))

    th = [threading.Thread(target=loop, args=("a", KEY_A, prompt_a, gen_a, k < itl_streams))
          for k in range(streams)]
    if b_key:
        th.append(threading.Thread(target=loop, args=("b", b_key, prompt_b, gen_b, True)))
    cpu0, w0 = cpu_split(gw_pid), worker_counts(port)
    for x in th:
        x.start()
    for x in th:
        x.join()
    cpu = [(b - a) / (time.monotonic() - t_start) for a, b in zip(cpu0, cpu_split(gw_pid))]
    time.sleep(0.5)  # the gateway reads its workers' figures every few hundred ms
    w1 = worker_counts(port)
    wk = {k: (w1[k] - w0.get(k, 0)) / (time.monotonic() - 0.5 - t_start) for k in w1}
    if out["errors"]:
        raise RuntimeError("; ".join(out["errors"][:3]))
    window = t_end - t_from
    return {"ttft": out["ttft"], "itl": out["itl"], "tpot": out["tpot"], "a_tps": out["a"] / window, "b_tps": out["b"] / window,
            "p_tps": out["prompts"] / window, "cpu_gw": cpu[0], "cpu_worker": cpu[1], "cpu_client": cpu[2],
            "w_tokens": wk.get("tokens_a", 0) + wk.get("tokens_b", 0), "w_prompt": wk.get("prompt_computed", 0),
            "w_preempt": wk.get("preempted_a", 0) + wk.get("preempted_b", 0)}


def free_port(taken=set()):
    """A TCP port below the ephemeral range (the clients' thousands of connections a second leave theirs in
    TIME_WAIT there) that nothing holds now, and not one given before."""
    for k in range(12000):
        port = 20000 + (os.getpid() * 7 + k) % 12000
        if port in taken:
            continue
        try:
            with socket.socket() as so:
                so.bind(("127.0.0.1", port))
        except OSError:
            continue
        taken.add(port)
        return port
    raise RuntimeError("no free port")


def start_gateway(infergate, d, port, model, a):
    """`infergate serve` in d with one worker and tenants a and b, on port."""
    os.makedirs(d)
    cfg = os.path.join(d, "gateway.yaml")
    open(cfg, "w").write("""
listen:
  - address: "127.0.0.1:%d"
workers:
  - model: "%s"
    name: m
    threads: %d
    max_seqs: %d
    max_queue: %d
tenants:
  - name: a
    keys: ["%s"]
  - name: b
    keys: ["%s"]
  - name: admin
    keys: ["%s"]
    admin: true
limits:
  max_concurrent_streams: 1024
logging:
  access_log: "off"
runtime_dir: "%s"
""" % (port, model, a.threads, a.max_seqs, 2 * a.streams, key_hash(infergate, KEY_A), key_hash(infergate, KEY_B),
       key_hash(infergate, KEY_ADMIN), os.path.join(d, "run")))
    log = open(os.path.join(d, "gateway.log"), "wb")
    g = subprocess.Popen([infergate, "serve", "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(900):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/readyz")
            r = c.getresponse()
            if r.status == 200 and json.loads(r.read()).get("workers_ready") == 1:
                return g
        except (OSError, ValueError):
            pass
        if g.poll() is not None:
            raise RuntimeError("gateway exited: " + open(os.path.join(d, "gateway.log")).read()[-2000:])
        time.sleep(0.1)
    raise RuntimeError("gateway not ready: " + open(os.path.join(d, "gateway.log")).read()[-2000:])


def report(label, res, a):
    """The table and the targets' ratios for one build's phases."""
    print("%s:" % label)
    print("%-10s %6s %9s %9s %9s %9s %9s %13s %9s %9s  %s" % ("phase", "B reqs", "B p50 ms", "B p99 ms", "A tok/s",
                                                            "B tok/s", "all tok/s", "+prompts tok/s", "A ITL p50",
                                                            "A ITL p99", "CPU gateway/worker/client (cores)"))
    for name, r in res.items():
        t, itl = r["ttft"], r["itl"]
        print("%-10s %6d %9.1f %9.1f %9.1f %9.1f %9.1f %13.1f %9.1f %9.1f  %.2f / %.2f / %.2f"
              % (name, len(t), pct(t, 50) * 1e3 if t else float("nan"), pct(t, 99) * 1e3 if t else float("nan"),
                 r["a_tps"], r["b_tps"], r["a_tps"] + r["b_tps"], r["a_tps"] + r["b_tps"] + r["p_tps"],
                 pct(itl, 50) * 1e3 if itl else float("nan"), pct(itl, 99) * 1e3 if itl else float("nan"),
                 r["cpu_gw"], r["cpu_worker"], r["cpu_client"]))
    print("the worker's own counts (/metrics), per second of phase: tokens charged to tenants (prompt and generated, "
          "no recomputes), prompt tokens computed (recomputes included), fair-share preemptions; tokens charged per "
          "worker CPU-second")
    for name, r in res.items():
        print("  %-10s %9.0f %9.0f %7.1f %9.0f" % (name, r["w_tokens"], r["w_prompt"], r["w_preempt"],
                                                 r["w_tokens"] / r["cpu_worker"] if r["cpu_worker"] else 0))
    if "b-alone" in res and "a+b" in res:
        alone, both = res["b-alone"]["ttft"], res["a+b"]["ttft"]
        print("B's TTFT p99 with A / alone: %.2fx (target <= 2), p50 %.2fx"
              % (pct(both, 99) / pct(alone, 99), pct(both, 50) / pct(alone, 50)))
    if "a-alone" in res and "a+b" in res:
        aa, ab = res["a-alone"], res["a+b"]
        print("generated tokens/s with B / A alone: %.3f (target >= 0.9); with prompt tokens: %.3f"
              % ((ab["a_tps"] + ab["b_tps"]) / aa["a_tps"],
                 (ab["a_tps"] + ab["b_tps"] + ab["p_tps"]) / (aa["a_tps"] + aa["p_tps"])))
        if aa["itl"] and ab["itl"]:
            print("A's ITL p99/p50: alone %.2f, with B %.2f; A's TPOT (a request's mean time between tokens) "
                  "p50 / p99 ms: alone %.1f / %.1f, with B %.1f / %.1f"
                  % (pct(aa["itl"], 99) / pct(aa["itl"], 50), pct(ab["itl"], 99) / pct(ab["itl"], 50),
                     pct(aa["tpot"], 50) * 1e3, pct(aa["tpot"], 99) * 1e3, pct(ab["tpot"], 50) * 1e3,
                     pct(ab["tpot"], 99) * 1e3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--infergate", default="build/infergate")
    ap.add_argument("--old", default=None, help="another infergate binary, run beside and alternated with it")
    ap.add_argument("--model", default=None)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-seqs", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=48, help="prompt words (each request's begins differently)")
    ap.add_argument("--gen-a", type=int, default=64)
    ap.add_argument("--gen-b", type=int, default=8)
    ap.add_argument("--itl-streams", type=int, default=8, help="of A's streams, those streamed (A's ITL)")
    ap.add_argument("--phases", default="b-alone,a-alone,a+b,a+b-same")
    ap.add_argument("--rounds", type=int, default=2, help="the phases, this many times over (the machine's "
                    "load drifts: rounds interleave the phases compared)")
    a = ap.parse_args()
    phases = {"b-alone": (0, KEY_B), "a-alone": (a.streams, None), "a+b": (a.streams, KEY_B),
              "a+b-same": (a.streams, KEY_A)}
    wanted = a.phases.split(",")
    for p in wanted:
        if p not in phases:
            ap.error("--phases: unknown phase %r (of %s)" % (p, ", ".join(phases)))

    d = tempfile.mkdtemp(prefix="infergate-bench-fair-")
    model = a.model or os.path.join(d, "m.gguf")
    if not a.model:
        subprocess.run([a.infergate, "model", "gen", "--out", model, "--dim", "256", "--layers", "4", "--heads", "8",
                        "--kv-heads", "4", "--ffn", "768", "--vocab", "1024", "--ctx", "2048", "--type", "q8_0"],
                       check=True, capture_output=True)
    builds = [("new", a.infergate, free_port())] + ([("old", a.old, free_port())] if a.old else [])
    words = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
             "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
    prompt = " ".join(words[i % len(words)] for i in range(a.prompt))
    procs = []
    try:
        for name, binary, p in builds:
            procs.append(start_gateway(binary, os.path.join(d, name), p, model, a))
        pids = {name: g.pid for (name, _, _), g in zip(builds, procs)}
        prompt_tokens = 0
        for _, _, p in builds:
            prompt_tokens = request(p, KEY_B, prompt, 4, True)[2]  # and a warm-up
        res = {name: {} for name, _, _ in builds}
        for _ in range(a.rounds):
            for ph in wanted:
                streams, b_key = phases[ph]
                for name, _, p in sorted(builds, key=lambda b: b[0] != "old"):  # the old one first
                    r = phase(p, streams, b_key, a.seconds, prompt, prompt, a.gen_a, a.gen_b, a.itl_streams,
                              pids[name])
                    rb = res[name]
                    if ph in rb:
                        for k in KEYS_AVG:
                            rb[ph][k] += r[k] / a.rounds
                        rb[ph]["ttft"] += r["ttft"]
                        rb[ph]["itl"] += r["itl"]
                        rb[ph]["tpot"] += r["tpot"]
                    else:
                        rb[ph] = dict(r)
                        for k in KEYS_AVG:
                            rb[ph][k] = r[k] / a.rounds
    finally:
        for g in procs:
            g.terminate()
        for g in procs:
            g.wait(timeout=60)
        subprocess.run(["rm", "-rf", d])

    print("worker: %s model; --threads %d, max_seqs %d; A: %d streams (%d of them streamed), prompt %d words "
          "(%d tokens), %d tokens each; B: one request at a time, streamed, the same prompt, %d tokens; "
          "%.0f s a phase, %d rounds"
          % ("generated (dim 256, 4 layers, q8_0)" if not a.model else a.model, a.threads, a.max_seqs, a.streams,
             min(a.itl_streams, a.streams), a.prompt, prompt_tokens, a.gen_a, a.gen_b, a.seconds, a.rounds))
    print("load average %s" % open("/proc/loadavg").read().split()[:3])
    for name, binary, _ in sorted(builds, key=lambda b: b[0] != "old"):
        report("%s (%s)" % (name, binary), res[name], a)


if __name__ == "__main__":
    main()
