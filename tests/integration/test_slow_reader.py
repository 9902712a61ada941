"""Slow readers (issue 32, point 5): a client that reads a long streamed
answer slowly holds it back all the way to its worker, which pauses the
sequence, instead of having it cut. A 2,000-token chat stream with
top_logprobs 20 (about 4 MB of events) is read at a few bytes a second
(the client's HTTP/2 window opened a byte at a time) for a while, with
small gateway buffers (stream_buffer_bytes 65536), then read at full
speed: it arrives whole (every token's logprobs entry, [DONE], no error
event), and nothing is counted as an upstream error. Before, the worker
cut it at its own per-stream buffer (1 MiB behind), and the gateway said
"the worker serving this stream failed" and counted it against the worker."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import Checks, curl, free_port, gen_model, spawn, tmpdir, wait_until, INFERGATE

import h2.config
import h2.connection
import h2.events
import h2.settings

TOKENS = 2000
SLOW_S = 8

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512, ctx=4096,
                  seed=5)
port = free_port()
cfg = os.path.join(d, "gateway.yaml")
open(cfg, "w").write("""
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
limits: {stream_buffer_bytes: 65536, conn_buffer_bytes: 1048576}
logging: {access_log: "%s"}
stats_interval_ms: 100
runtime_dir: "%s"
""" % (port, model, os.path.join(d, "access.log"), os.path.join(d, "run")))
log_path = os.path.join(d, "gateway.log")
g = spawn([INFERGATE, "serve", "--config", cfg], log_path)
url = "http://127.0.0.1:%d" % port
wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None, 60, "ready")

body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "tell me everything"}],
                   "max_tokens": TOKENS, "ignore_eos": True, "stream": True, "logprobs": True,
                   "top_logprobs": 20, "temperature": 0}).encode()
s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
c.local_settings = h2.settings.Settings(client=True, initial_values={
    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1})
c.initiate_connection()
sid = c.get_next_available_stream_id()
c.send_headers(sid, [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "http"),
                     (":authority", "127.0.0.1"), ("content-type", "application/json"),
                     ("content-length", str(len(body)))])
c.send_data(sid, body, end_stream=True)
s.sendall(c.data_to_send())

got = bytearray()
state = {"status": None, "ended": False, "reset": None, "closed": False}


def pump(grant):
    """Reads what came; acknowledges at most `grant` bytes of it (None: all)."""
    try:
        data = s.recv(1 << 20)
    except socket.timeout:
        data = None
    if data == b"":
        state["closed"] = True
        return
    unacked = 0
    for ev in c.receive_data(data or b""):
        if isinstance(ev, h2.events.ResponseReceived):
            state["status"] = dict(ev.headers).get(":status")
        elif isinstance(ev, h2.events.DataReceived):
            got.extend(ev.data)
            unacked += ev.flow_controlled_length
            pump.owed += ev.flow_controlled_length
        elif isinstance(ev, h2.events.StreamEnded):
            state["ended"] = True
        elif isinstance(ev, h2.events.StreamReset):
            state["reset"] = int(ev.error_code)
        elif isinstance(ev, h2.events.ConnectionTerminated):
            state["closed"] = True
    n = pump.owed if grant is None else min(grant, pump.owed)
    if n and not state["ended"] and state["reset"] is None:
        c.acknowledge_received_data(n, sid)
        pump.owed -= n
    s.sendall(c.data_to_send())


pump.owed = 0
# A few bytes a second: the window opened by one byte every 0.2 s.
until = time.monotonic() + SLOW_S
while time.monotonic() < until and not state["closed"]:
    pump(1)
slow_bytes = len(got)
t.ok(state["reset"] is None and not state["closed"] and not state["ended"],
     "a client reading a few bytes a second for %d s keeps its stream (%d bytes read, reset %s)"
     % (SLOW_S, slow_bytes, state["reset"]))
# Full speed: the windows opened wide (the stream's maximum is the 1 byte
# of its initial window until the settings say more).
c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
c.increment_flow_control_window(1 << 24, sid)
c.increment_flow_control_window(1 << 30)
s.sendall(c.data_to_send())
until = time.monotonic() + 120
while time.monotonic() < until and not state["ended"] and state["reset"] is None and not state["closed"]:
    pump(None)
s.close()
print("# read %d bytes in all, %d while slow; ended %s, reset %s, closed %s"
      % (len(got), slow_bytes, state["ended"], state["reset"], state["closed"]))

def read_events(raw):
    """The events' data, their logprobs entries, the text, and any errors."""
    events = [e[6:] for e in raw.decode(errors="replace").split("\n\n") if e.startswith("data: ")]
    entries, errors, text = 0, [], []
    for e in events:
        if e == "[DONE]":
            continue
        try:
            o = json.loads(e)
        except ValueError:
            errors.append("not JSON: %r" % e[:80])
            continue
        if "error" in o:
            errors.append(o["error"])
            continue
        for ch in o.get("choices", []):
            entries += len(((ch.get("logprobs") or {}).get("content")) or [])
            text.append((ch.get("delta") or {}).get("content") or "")
    return events, entries, "".join(text), errors


events, entries, text, errors = read_events(got)
t.ok(state["status"] == "200" and state["ended"] and events and events[-1] == "[DONE]" and not errors,
     "... and then gets it whole: %d bytes, ending in [DONE], no error event (%s)" % (len(got), errors[:1]))
# The same request read at once, unbroken: the slow read got the same answer.
ref = curl(url + "/v1/chat/completions", data=json.loads(body), timeout=120)[2]
_, ref_entries, ref_text, ref_errors = read_events(ref)
t.ok(not ref_errors and entries == ref_entries and entries >= TOKENS - 8 and text == ref_text,
     "every token came, as an unbroken read gets them: %d logprobs entries (unbroken: %d), text equal: %s"
     % (entries, ref_entries, text == ref_text))
t.ok(len(got) > 2 * (1 << 20), "the answer was larger than the buffers that used to cut it (%d bytes)" % len(got))
m = curl(url + "/metrics", http="--http1.1")[2].decode()
t.ok("infergate_upstream_errors_total{" not in m, "no upstream error was counted")
t.finish()
