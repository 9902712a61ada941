#!/usr/bin/python3
"""Helpers of bench/bench_gateway.sh (the gateway-overhead benchmark).

Subcommands:
  ports N                      print N free loopback TCP ports
  run H2LOAD_OUT LOGFILE [k=v...]
                               one h2load run -> one JSON line on stdout: the
                               h2load req/s and counters, p50/p99 latency from
                               the per-request log, plus the k=v fields given
                               (server, kind, rep, CPU figures)
  ttft --direct PORT --gateway PORT [--noreplay PORT] [--gateway2 PORT] [--haproxy PORT]
       [--samples N] [--warmup N] [--out FILE]
                               sequential streamed completions, the paths
                               taking turns, time to the first DATA frame
                               that carries a token event
  cgtop ANNOTATE.txt N NAME [ROOT]
                               instructions per request and top inclusive
                               costs from callgrind_annotate --inclusive=yes
  cgdiff B.txt D.txt N ROOT KIND
                               the functions whose own (exclusive)
                               instructions per request differ most between
                               two callgrind_annotate listings (B and D, E and B)
  table RESULTS.jsonl TTFT.json [k=v...]
                               the Markdown table for bench/RESULTS.md

h2load prints no percentiles, so latency comes from its --log-file: one
tab-separated line per request of the measured phase (start time in µs,
status, µs until the end of the response).

The TTFT client speaks HTTP/2 with Debian's python3-h2 over a plain socket
rather than httpx so that the only thing between the timestamps is one
sendall and the recv that brings the first token: a heavier client would add
its own jitter to both sides and hide a difference of tens of µs.

Run with /usr/bin/python3 (Debian's python3-h2).
"""
import json
import os
import re
import socket
import statistics
import sys
import time


def pct(v, p):
    """Linear-interpolated percentile of an already sorted list."""
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def cmd_ports(args):
    socks = []
    for _ in range(int(args[0])):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    print(" ".join(str(s.getsockname()[1]) for s in socks))
    for s in socks:
        s.close()


def parse_h2load(text):
    out = {"rps": float("nan"), "total": 0, "succeeded": 0, "failed": 0, "errored": 0, "timeout": 0}
    m = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", text)
    if m:
        out["rps"] = float(m.group(1))
    m = re.search(r"requests: (\d+) total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", text)
    if m:
        out["total"], out["succeeded"], out["failed"], out["errored"], out["timeout"] = map(int, m.groups())
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    if m:
        out["s2xx"], out["s3xx"], out["s4xx"], out["s5xx"] = map(int, m.groups())
    return out


def cmd_run(args):
    with open(args[0]) as f:
        rec = parse_h2load(f.read())
    lat, non2xx, cut = [], {}, 0
    with open(args[1]) as f:
        for line in f:
            parts = line.split("\t")
            if len(parts) < 3:
                continue
            status = int(parts[1])
            if status == 0:
                # No response head: a stream h2load cut when the measured
                # phase ended (h2load counts it neither failed nor done).
                cut += 1
                continue
            if status < 200 or status > 299:
                non2xx[str(status)] = non2xx.get(str(status), 0) + 1
            lat.append(int(parts[2]))
    lat.sort()
    rec["n_logged"] = len(lat)
    rec["non2xx"] = sum(non2xx.values())
    rec["non2xx_by_status"] = non2xx
    rec["cut_at_end"] = cut
    rec["p50_us"] = pct(lat, 50)
    rec["p99_us"] = pct(lat, 99)
    for kv in args[2:]:
        k, v = kv.split("=", 1)
        try:
            v = float(v)
        except ValueError:
            pass
        rec[k] = v
    # CPU per request: the process's CPU time over a window of the measured
    # phase divided by the requests that window saw (rate x time), so a small
    # misalignment of the window with h2load's own phase costs nothing.
    for who in ("proxy", "worker"):
        t = rec.get(who + "_cpu_s")
        w = rec.get("cpu_wall_s")
        if isinstance(t, float) and isinstance(w, float) and w > 0 and rec["rps"] > 0:
            rec[who + "_us_per_req"] = t / w / rec["rps"] * 1e6
    print(json.dumps(rec))


# ---------------------------------------------------------------- TTFT client


class H2Client:
    """One HTTP/2 cleartext connection, one request at a time."""

    def __init__(self, port):
        import h2.config
        import h2.connection

        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=cfg)
        self.conn.initiate_connection()
        # A large window: the stream is never held up by flow control.
        self.conn.increment_flow_control_window(16 << 20)
        self.sock.sendall(self.conn.data_to_send())
        self.port = port

    def completion(self, body):
        """Returns (ttft_s, head_s, status): time to the first token event and
        to the response head; ttft is None when no token came."""
        import h2.events

        sid = self.conn.get_next_available_stream_id()
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"127.0.0.1"),
                   (b":path", b"/v1/completions"), (b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        self.conn.send_headers(sid, headers)
        self.conn.send_data(sid, body, end_stream=True)
        out = self.conn.data_to_send()
        t0 = time.perf_counter_ns()
        self.sock.sendall(out)
        ttft, head, status, done = None, None, 0, False
        while not done:
            data = self.sock.recv(65536)
            t = time.perf_counter_ns()
            if not data:
                raise RuntimeError("connection to port %d closed" % self.port)
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    status = int(dict(ev.headers).get(b":status", b"0"))
                    head = t - t0
                elif isinstance(ev, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    # A token event: an SSE event with a choice still open.
                    if ttft is None and ev.stream_id == sid and b'"finish_reason":null' in ev.data:
                        ttft = t - t0
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)) and ev.stream_id == sid:
                    done = True
            pending = self.conn.data_to_send()
            if pending:
                self.sock.sendall(pending)
        return (None if ttft is None else ttft / 1e9), (None if head is None else head / 1e9), status


def cmd_ttft(args):
    import argparse

    ap = argparse.ArgumentParser(prog="bench_gateway.py ttft")
    ap.add_argument("--direct", type=int, required=True)
    ap.add_argument("--gateway", type=int, required=True)
    ap.add_argument("--noreplay", type=int, help="also a gateway with routing.replay: false")
    ap.add_argument("--gateway2", type=int, help="also the gateway run by another build")
    ap.add_argument("--haproxy", type=int, help="also HAProxy, the reference for one proxy hop")
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--out")
    a = ap.parse_args(args)
    body = json.dumps({"model": "m", "prompt": [1, 5, 6], "max_tokens": a.max_tokens, "temperature": 0,
                       "stream": True}, separators=(",", ":")).encode()
    ports = {"direct": a.direct, "gateway": a.gateway}
    if a.gateway2:
        ports["gateway2"] = a.gateway2
    if a.noreplay:
        ports["noreplay"] = a.noreplay
    if a.haproxy:
        ports["haproxy"] = a.haproxy
    sides = list(ports)
    clients = {side: H2Client(port) for side, port in ports.items()}
    ttft = {side: [] for side in sides}
    errors = {side: 0 for side in sides}
    for i in range(a.warmup + a.samples):
        # Rotate which side goes first so none always follows another.
        k = i % len(sides)
        for side in sides[k:] + sides[:k]:
            t, _, status = clients[side].completion(body)
            if i < a.warmup:
                continue
            if status != 200 or t is None:
                errors[side] += 1
            else:
                ttft[side].append(t * 1e6)
    res = {"samples": a.samples, "max_tokens": a.max_tokens, "errors": errors, "sides": sides}
    for side in sides:
        v = sorted(ttft[side])
        res[side] = {"p50_us": pct(v, 50), "p99_us": pct(v, 99), "min_us": v[0] if v else float("nan"),
                     "n": len(v)}
    for side in sides[1:]:
        res[side]["added_p50_us"] = res[side]["p50_us"] - res["direct"]["p50_us"]
        res[side]["added_p99_us"] = res[side]["p99_us"] - res["direct"]["p99_us"]
    text = json.dumps(res)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


def read_annotate(path):
    """(total, [(instructions, function, object)]) of a callgrind_annotate
    listing, in its order."""
    total, rows = None, []
    line_re = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*?)(?: \[(.*)\])?$")
    with open(path) as f:
        for line in f:
            m = line_re.match(line.rstrip("\n"))
            if not m:
                continue
            ir, fn, obj = int(m.group(1).replace(",", "")), m.group(2), m.group(3) or ""
            if fn == "PROGRAM TOTALS":
                total = ir
                continue
            rows.append((ir, fn, obj))
    return total, rows


def cmd_cgtop(args):
    """Instructions per request and the top inclusive costs from a
    `callgrind_annotate --inclusive=yes` listing."""
    path, n, name = args[0], int(args[1]), args[2]
    root = args[3].rstrip("/") + "/" if len(args) > 3 else ""
    total, rows = read_annotate(path)
    if not total:
        print("%s: no callgrind totals in %s" % (name, path))
        return
    print("%s: %.2fk instructions per request (%d requests)" % (name, total / n / 1e3, n))
    if name != "gateway":
        return
    # The frames every event passes through say nothing; unnamed addresses
    # inside libraries neither.
    skip = ("(below main)", "__libc_start", "main", "gw_cmd_serve", "event_base_", "bufferevent_run_",
            "0x")
    shown, seen = 0, set()
    for ir, fn, obj in rows:
        func = fn.split(":")[-1]
        if any(func.startswith(k) for k in skip) or fn.startswith("???:0x"):
            continue
        if ir < total * 0.02 or shown >= 25:
            break
        where = fn[len(root):] if root and fn.startswith(root) else fn
        # callgrind_annotate lists some functions twice, by absolute and by
        # relative source path: the first is the one to show.
        if where in seen:
            continue
        seen.add(where)
        if where.startswith("???:"):
            where = "%s (%s)" % (where[4:], os.path.basename(obj))
        print("  %6.1fk/req %5.1f%%  %s" % (ir / n / 1e3, 100.0 * ir / total, where))
        shown += 1


def cmd_cgdiff(args):
    """Where one listing's extra instructions go: own (exclusive) cost per
    request of each function in X and Y, the largest differences first."""
    pb, pd, n, root, kind = args[0], args[1], int(args[2]), args[3].rstrip("/") + "/", args[4]
    tb, rb = read_annotate(pb)
    td, rd = read_annotate(pd)
    if not tb or not td:
        print("cgdiff: no callgrind totals in %s or %s" % (pb, pd))
        return

    def by_fn(rows):
        out = {}
        for ir, fn, obj in rows:
            # one function can be listed by absolute and by relative path
            key = fn[len(root):] if fn.startswith(root) else fn
            if key.startswith("???:"):
                key = "%s (%s)" % (key[4:], os.path.basename(obj))
            out[key] = out.get(key, 0) + ir
        return out

    b, d = by_fn(rb), by_fn(rd)
    # The frames on the stack when the counters were zeroed and dumped
    # (main, the event loop) carry about the whole total: none of it their own.
    keys = [k for k in set(b) | set(d) if b.get(k, 0) < 0.9 * tb and d.get(k, 0) < 0.9 * td]
    diff = sorted(((b.get(k, 0) - d.get(k, 0), k) for k in keys), key=lambda x: -abs(x[0]))
    print("cgdiff (%s): %.2fk against %.2fk instructions per request, %+.2fk (%+.1f%%); "
          "own cost per request, largest differences:" %
          (kind, tb / n / 1e3, td / n / 1e3, (tb - td) / n / 1e3, 100.0 * (tb - td) / td))
    for delta, k in diff[:16]:
        if abs(delta) < abs(tb - td) * 0.01 and abs(delta) < n * 5:
            break
        print("  %+8.0f/req  %8.0f against %8.0f  %s" % (delta / n, b.get(k, 0) / n, d.get(k, 0) / n, k))


# ---------------------------------------------------------------------- table

SERVERS = (("A", "direct"), ("B", "gateway"), ("E", "gateway2"), ("D", "noreplay"), ("C", "haproxy"))
KINDS = (("models", "`GET /v1/models`"), ("completion", "`POST /v1/completions` max_tokens 1"),
         ("stream", "`POST /v1/completions` max_tokens 16, stream"))
SERVER_NAMES = {"direct": "direct", "gateway": "gateway", "noreplay": "gateway, replay off", "haproxy": "haproxy",
                "gateway2": "gateway, --compare-bin"}


def med_range(vals, fmt):
    vals = [v for v in vals if isinstance(v, (int, float)) and v == v]
    if not vals:
        return "–"
    return "%s (%s–%s)" % (fmt % statistics.median(vals), fmt % min(vals), fmt % max(vals))


def med(vals):
    vals = [v for v in vals if isinstance(v, (int, float)) and v == v]
    return statistics.median(vals) if vals else float("nan")


def cmd_table(args):
    recs = []
    with open(args[0]) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    ttft = None
    if len(args) > 1 and os.path.exists(args[1]) and os.path.getsize(args[1]) > 0:
        with open(args[1]) as f:
            ttft = json.load(f)
    meta = dict(kv.split("=", 1) for kv in args[2:])

    def sel(server, kind, key):
        return [r.get(key) for r in recs if r.get("server") == server and r.get("kind") == kind]

    out = []
    out.append("### Gateway overhead (h2load, 16 connections x 10 streams, loopback) — %s" % meta.get("date", ""))
    out.append("")
    ab = any(r.get("server") == "noreplay" for r in recs)
    have = [letter for letter, server in SERVERS if any(r.get("server") == server for r in recs)]
    out.append("commit `%s`, %s CPUs (%s); h2load on core 0, proxies and workers on core 1; "
               "HAProxy %s; %s repetitions per point, alternating %s, median (min–max)." %
               (meta.get("commit", "?"), meta.get("nproc", "?"), meta.get("cpu", "?"), meta.get("haproxy", "?"),
                meta.get("reps", "?"), " ".join(have)))
    out.append("")
    out.append("```")
    out.append(meta.get("command", ""))
    out.append("```")
    out.append("")
    out.append("| request | path | req/s | p50 µs | p99 µs | proxy CPU µs/req | worker CPU µs/req | non-2xx / failed / cut at end |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, kname in KINDS:
        for letter, server in SERVERS:
            if not sel(server, kind, "rps"):
                continue
            bad = sum(int(x or 0) for x in sel(server, kind, "non2xx"))
            failed = sum(int(x or 0) for x in sel(server, kind, "failed")) + \
                sum(int(x or 0) for x in sel(server, kind, "errored"))
            cut = sum(int(x or 0) for x in sel(server, kind, "cut_at_end"))
            out.append("| %s | %s %s | %s | %s | %s | %s | %s | %d / %d / %d |" % (
                kname, letter, SERVER_NAMES[server], med_range(sel(server, kind, "rps"), "%.0f"),
                med_range(sel(server, kind, "p50_us"), "%.0f"), med_range(sel(server, kind, "p99_us"), "%.0f"),
                med_range(sel(server, kind, "proxy_us_per_req"), "%.1f") if server != "direct" else "–",
                med_range(sel(server, kind, "worker_us_per_req"), "%.1f"), bad, failed, cut))
    out.append("")
    out.append("The gateway answers `GET /v1/models` itself (worker CPU 0 there): that row is its own HTTP/2 "
               "serving against HAProxy forwarding; the completion rows go through the proxy path of both.")
    out.append("")
    out.append("| request | gateway / HAProxy req/s | added p99 µs, gateway | added p99 µs, HAProxy | "
               "added p50 µs, gateway | added p50 µs, HAProxy |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    for kind, kname in KINDS:
        # Ratios per repetition (A, B and C of one repetition ran back to back),
        # then the median of those.
        reps = sorted({r.get("rep") for r in recs if r.get("kind") == kind})
        ratio, add99g, add99h, add50g, add50h = [], [], [], [], []
        for rep in reps:
            by = {r["server"]: r for r in recs if r.get("kind") == kind and r.get("rep") == rep}
            if not all(s in by for s in ("direct", "gateway", "haproxy")):
                continue
            d, g, h = by["direct"], by["gateway"], by["haproxy"]
            ratio.append(g["rps"] / h["rps"] if h["rps"] else float("nan"))
            add99g.append(g["p99_us"] - d["p99_us"])
            add99h.append(h["p99_us"] - d["p99_us"])
            add50g.append(g["p50_us"] - d["p50_us"])
            add50h.append(h["p50_us"] - d["p50_us"])
        if ratio:
            out.append("| %s | %s | %s | %s | %s | %s |" % (
                kname, med_range(ratio, "%.2f"), med_range(add99g, "%+.0f"), med_range(add99h, "%+.0f"),
                med_range(add50g, "%+.0f"), med_range(add50h, "%+.0f")))
    if ab:
        out.extend(replay_ab_table(recs))
    if ttft:
        out.append("")
        out.append("Streamed completion (max_tokens %d, tiny model), time to first token, %d sequential requests "
                   "per side, one at a time, the paths taking turns (added: over direct):" % (ttft["max_tokens"], ttft["samples"]))
        out.append("")
        out.append("| path | TTFT p50 µs | TTFT p99 µs | added p50 µs | added p99 µs | errors |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        for side in ttft["sides"]:
            d = ttft[side]
            added = ("%+.0f | %+.0f" % (d["added_p50_us"], d["added_p99_us"])) if side != "direct" else "– | –"
            out.append("| %s | %.0f | %.0f | %s | %d |" % (SERVER_NAMES.get(side, side), d["p50_us"], d["p99_us"],
                                                          added, ttft["errors"][side]))
        if "noreplay" in ttft:
            out.append("")
            out.append("TTFT p50, gateway less gateway with replay off: %+.0f µs (p99 %+.0f µs)." % (
                ttft["gateway"]["p50_us"] - ttft["noreplay"]["p50_us"],
                ttft["gateway"]["p99_us"] - ttft["noreplay"]["p99_us"]))
    if "cg_completion_noreplay" in meta:
        out.extend(callgrind_ab_table(meta))
    elif "cg_completion_gateway" in meta and "cg_completion_haproxy" in meta:
        out.append("")
        out.append("Instructions per completion under callgrind (%s requests at 16x10, workers native): "
                   "gateway %s, HAProxy %s." % (meta.get("cg_n_completion", "?"), meta["cg_completion_gateway"],
                                                meta["cg_completion_haproxy"]))
    print("\n".join(out))


def replay_ab_table(recs):
    """B (replay on) against D (replay off), per repetition, then medians:
    what the bookkeeping costs the proxy and the worker (and E, another
    build, against B and D)."""
    out = ["", "Token replay's bookkeeping: B (replay on, the default) against D (`routing: {replay: false}`), "
           "ratios per repetition (the two ran back to back), median (min–max):", "",
           "| request | pair | X / Y req/s | X − Y proxy CPU µs/req | X / Y proxy CPU | X / Y worker CPU | "
           "X − Y p50 µs |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for x, y in (("gateway", "noreplay"), ("gateway2", "noreplay"), ("gateway2", "gateway")):
        out.extend(pair_rows(recs, x, y))
    return out


def pair_rows(recs, x, y):
    letter = dict((s, l) for l, s in SERVERS)
    out = []
    for kind, kname in KINDS:
        reps = sorted({r.get("rep") for r in recs if r.get("kind") == kind})
        rps, dcpu, rcpu, rwork, d50 = [], [], [], [], []
        for rep in reps:
            by = {r["server"]: r for r in recs if r.get("kind") == kind and r.get("rep") == rep}
            if x not in by or y not in by:
                continue
            b, d = by[x], by[y]
            rps.append(b["rps"] / d["rps"] if d["rps"] else float("nan"))
            if "proxy_us_per_req" in b and "proxy_us_per_req" in d:
                dcpu.append(b["proxy_us_per_req"] - d["proxy_us_per_req"])
                rcpu.append(b["proxy_us_per_req"] / d["proxy_us_per_req"] if d["proxy_us_per_req"] else float("nan"))
            if b.get("worker_us_per_req") and d.get("worker_us_per_req"):
                rwork.append(b["worker_us_per_req"] / d["worker_us_per_req"])
            d50.append(b["p50_us"] - d["p50_us"])
        if rps:
            out.append("| %s | %s / %s | %s | %s | %s | %s | %s |" % (
                kname, letter[x], letter[y], med_range(rps, "%.3f"), med_range(dcpu, "%+.1f"), med_range(rcpu, "%.3f"),
                med_range(rwork, "%.3f"), med_range(d50, "%+.0f")))
    return out


def callgrind_ab_table(meta):
    def kilo(v):
        try:
            return float(v.rstrip("k"))
        except (AttributeError, ValueError):
            return float("nan")

    e_on = any(k.endswith("_gateway2") for k in meta)
    out = ["", "Instructions per request under callgrind (thousands; 16x10, the proxy under callgrind, "
           "its worker native; the counters zeroed once ready):", "",
           "| request | requests | B gateway | %sD gateway, replay off | C HAProxy | B / D | %sB / C | D / C |" %
           ("E gateway, --compare-bin | " if e_on else "", "E / D | E / B | " if e_on else ""),
           "| --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- | --- |" if e_on else "")]
    for kind, kname in KINDS:
        b, e, d, c = (kilo(meta.get("cg_%s_%s" % (kind, s))) for s in ("gateway", "gateway2", "noreplay", "haproxy"))
        if b != b and d != d:
            continue
        out.append("| %s | %s | %.2f | %s%.2f | %.2f | %.3f | %s%.2f | %.2f |" % (
            kname, meta.get("cg_n_" + kind, "?"), b, ("%.2f | " % e) if e_on else "", d, c, b / d,
            ("%.3f | %.3f | " % (e / d, e / b)) if e_on else "", b / c, d / c))
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    fn = {"ports": cmd_ports, "run": cmd_run, "ttft": cmd_ttft, "table": cmd_table, "cgtop": cmd_cgtop,
          "cgdiff": cmd_cgdiff}.get(cmd)
    if fn is None:
        sys.exit("unknown subcommand %r\n%s" % (cmd, __doc__))
    fn(args)


if __name__ == "__main__":
    main()
