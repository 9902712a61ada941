#!/usr/bin/python3
"""Trickling readers against the gateway's response buffers (issue 32,
point 5): C HTTP/2 connections of S streams each, every stream a long
streamed chat answer with top_logprobs (a few kB an event), the client's
windows opened one byte per stream per second, held for a while; then read
at full speed to the end.

Before the bounds, one such connection of 250 streams held about 170 MB of
the gateway's memory until it closed. Now the bytes the gateway holds are
bounded per connection (limits.conn_buffer_bytes, default 16 MiB) and in
all (limits.buffer_bytes, default 256 MiB), the workers' sequences pause
instead, and no stream is cut.

Reported: the gateway process's resident memory (VmRSS of `infergate
serve`, which holds the response buffers; the worker is another process)
before the connections, its peak while they trickle, and after; the bound
the configuration sets (min(C x conn_buffer_bytes, buffer_bytes)); and at
the end how many streams completed whole ([DONE], no error event), were
reset, or ended with an error event.

The client is python3-h2 over plain sockets (one thread, select), as
tests/integration/test_slow_reader.py uses it.

  /usr/bin/python3 bench/bench_trickle.py --infergate build/infergate \
      [--conns 10] [--streams 250] [--tokens 160] [--hold 20] [--conn-buffer BYTES] [--buffer BYTES]
"""
import argparse
import json
import os
import select
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))

import h2.config
import h2.connection
import h2.events
import h2.settings


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Conn:
    """One client connection: its streams' bytes, how each ended."""

    def __init__(self, port, n_streams, body):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
        self.h2.initiate_connection()
        self.data, self.ended, self.reset, self.owed = {}, set(), {}, {}
        self.closed = False
        for _ in range(n_streams):
            sid = self.h2.get_next_available_stream_id()
            self.h2.send_headers(sid, [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "http"),
                                       (":authority", "127.0.0.1"), ("content-type", "application/json"),
                                       ("content-length", str(len(body)))])
            self.h2.send_data(sid, body, end_stream=True)
            self.data[sid] = bytearray()
            self.owed[sid] = 0
        self.out = bytearray(self.h2.data_to_send())

    def flush(self):
        self.out += self.h2.data_to_send()
        while self.out:
            try:
                n = self.sock.send(self.out)
            except BlockingIOError:
                return
            except OSError:
                self.closed = True
                return
            del self.out[:n]

    def on_readable(self, grant_all):
        try:
            raw = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            raw = b""
        if raw == b"":
            self.closed = True
            return
        for ev in self.h2.receive_data(raw):
            if isinstance(ev, h2.events.DataReceived):
                self.data[ev.stream_id].extend(ev.data)
                self.owed[ev.stream_id] += ev.flow_controlled_length
                if grant_all and ev.flow_controlled_length:
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    self.owed[ev.stream_id] -= ev.flow_controlled_length
            elif isinstance(ev, h2.events.StreamEnded):
                self.ended.add(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self.reset[ev.stream_id] = int(ev.error_code)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.closed = True
        self.flush()

    def trickle(self):
        """One byte more of window to every open stream (and the connection)."""
        n = 0
        for sid in self.data:
            if sid not in self.ended and sid not in self.reset:
                self.h2.increment_flow_control_window(1, sid)
                n += 1
        if n:
            self.h2.increment_flow_control_window(n)
        self.flush()

    def open_wide(self):
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
        for sid in self.data:
            if sid not in self.ended and sid not in self.reset:
                self.h2.increment_flow_control_window(1 << 24, sid)
        self.h2.increment_flow_control_window(1 << 30)
        self.flush()

    def done(self):
        return self.closed or len(self.ended) + len(self.reset) >= len(self.data)


def outcome(raw):
    """('whole', None), or ('error', what) when an error event came or [DONE] did not."""
    text = raw.decode(errors="replace")
    events = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
    for e in events:
        if e == "[DONE]":
            continue
        try:
            o = json.loads(e)
        except ValueError:
            return "error", "not JSON: " + e[:80]
        if "error" in o:
            return "error", json.dumps(o["error"])[:160]
    if not events or events[-1] != "[DONE]":
        return "error", "no [DONE]: " + text[:160]
    return "whole", None


def pump(conns, grant_all, seconds):
    socks = {c.sock: c for c in conns if not c.closed}
    r, _, _ = select.select(list(socks), [], [], seconds)
    for s in r:
        socks[s].on_readable(grant_all)
    for c in conns:
        if c.out:
            c.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--infergate", default="build/infergate")
    ap.add_argument("--conns", type=int, default=10)
    ap.add_argument("--streams", type=int, default=250)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--hold", type=float, default=20.0, help="seconds of trickling")
    ap.add_argument("--conn-buffer", type=int, default=0, help="limits.conn_buffer_bytes (0: the default)")
    ap.add_argument("--buffer", type=int, default=0, help="limits.buffer_bytes (0: the default)")
    a = ap.parse_args()
    sys.argv[1:] = [a.infergate]
    from harness import curl, free_port, gen_model, spawn, stop, tmpdir, wait_until

    d = tmpdir()
    model = gen_model(os.path.join(d, "m.gguf"), dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512,
                      ctx=1024, seed=5)
    port = free_port()
    limits = []
    if a.conn_buffer:
        limits.append("conn_buffer_bytes: %d" % a.conn_buffer)
    if a.buffer:
        limits.append("buffer_bytes: %d" % a.buffer)
    cfg = os.path.join(d, "gateway.yaml")
    with open(cfg, "w") as f:
        f.write("listen:\n  - address: \"127.0.0.1:%d\"\n" % port)
        f.write("workers:\n  - {model: \"%s\", name: m, threads: 2, max_seqs: 256, max_queue: %d}\n"
                % (model, a.conns * a.streams + 16))
        if limits:
            f.write("limits: {%s}\n" % ", ".join(limits))
        f.write("runtime_dir: \"%s\"\n" % os.path.join(d, "run"))
    g = spawn([a.infergate, "serve", "--config", cfg], os.path.join(d, "gateway.log"))
    url = "http://127.0.0.1:%d" % port
    wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None,
               60, "ready")
    if g.poll() is not None:
        sys.exit("bench_trickle: the gateway exited; see %s" % os.path.join(d, "gateway.log"))

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "tell me everything"}],
                       "max_tokens": a.tokens, "ignore_eos": True, "stream": True, "logprobs": True,
                       "top_logprobs": 20, "temperature": 0}).encode()
    rss0 = rss_bytes(g.pid)
    conns = [Conn(port, a.streams, body) for _ in range(a.conns)]
    peak, t0, next_grant = rss0, time.monotonic(), time.monotonic() + 1
    while time.monotonic() - t0 < a.hold:
        pump(conns, False, 0.1)
        if time.monotonic() >= next_grant:
            for c in conns:
                c.trickle()
            next_grant += 1
        peak = max(peak, rss_bytes(g.pid))
    slow_bytes = sum(len(b) for c in conns for b in c.data.values())
    held_rss = rss_bytes(g.pid)
    for c in conns:
        c.open_wide()
    t1 = time.monotonic()
    while not all(c.done() for c in conns) and time.monotonic() - t1 < 900:
        pump(conns, True, 0.2)
        peak = max(peak, rss_bytes(g.pid))
    drain_s = time.monotonic() - t1
    res = {"whole": 0, "error": 0, "reset": 0, "unfinished": 0}
    errors = {}
    for c in conns:
        for sid, raw in c.data.items():
            if sid in c.reset:
                res["reset"] += 1
            elif sid not in c.ended:
                res["unfinished"] += 1
            else:
                kind, what = outcome(raw)
                res[kind] += 1
                if what:
                    errors[what] = errors.get(what, 0) + 1
        c.sock.close()
    time.sleep(1)
    rss_after = rss_bytes(g.pid)
    stop(g)

    mib = 1 << 20
    conn_bound = a.conn_buffer or 16 * mib
    all_bound = a.buffer or 256 * mib
    bound = min(a.conns * conn_bound, all_bound)
    print("gateway VmRSS: before %.1f MiB, trickling %.1f MiB (peak %.1f MiB over the whole run), after %.1f MiB"
          % (rss0 / mib, held_rss / mib, peak / mib, rss_after / mib))
    print("held while trickling: %.1f MiB above the start; the bound configured: min(%d x %.0f MiB, %.0f MiB) "
          "= %.0f MiB" % ((held_rss - rss0) / mib, a.conns, conn_bound / mib, all_bound / mib, bound / mib))
    print("%d connections x %d streams, %d tokens each with top_logprobs 20; %.0f s at 1 byte/s a stream "
          "(%d bytes read), then read to the end in %.1f s" % (a.conns, a.streams, a.tokens, a.hold, slow_bytes,
                                                              drain_s))
    print("streams: %d whole, %d with an error event or no [DONE], %d reset, %d unfinished"
          % (res["whole"], res["error"], res["reset"], res["unfinished"]))
    for what, n in sorted(errors.items(), key=lambda kv: -kv[1])[:5]:
        print("  %d x %s" % (n, what))
    return 0 if res["whole"] == a.conns * a.streams else 1


if __name__ == "__main__":
    sys.exit(main())
