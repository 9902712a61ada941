"""A worker that hangs is killed and restarted (worker_hang_timeout_s).
Stopping `infergate serve` while a stream cannot finish: a client that
reads nothing holds a long completion past drain_grace_s. The gateway cuts
it at the end of its grace, and its worker hears of it at once (its
connection to the gateway closes) and exits 0 — it is not left draining
that stream until the gateway's SIGKILL. The worker is started in its own
process group, told the gateway's grace, and holds none of the gateway's
files; a worker that dies while the gateway drains is not restarted."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, spawn, tmpdir, wait_until

GRACE_S = 4
t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=128, layers=2, heads=4, kv_heads=2, ffn=256, vocab=512, ctx=2048,
                  type="q8_0", seed=3)
port = free_port()
access_log = os.path.join(d, "access.log")
cfg = os.path.join(d, "gateway.yaml")
open(cfg, "w").write("""
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
limits: {stream_buffer_bytes: 65536}
logging: {access_log: "%s"}
drain_grace_s: %d
stats_interval_ms: 100
worker_hang_timeout_s: 2
runtime_dir: "%s"
""" % (port, model, model, access_log, GRACE_S, os.path.join(d, "run")))
log_path = os.path.join(d, "gateway.log")
g = spawn([INFERGATE, "serve", "--config", cfg], log_path)
url = "http://127.0.0.1:%d" % port
wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None, 60, "ready")
pids = [int(p) for p in re.findall(r"started: pid (\d+)", open(log_path).read())]
t.ok(len(pids) == 2, "two workers started: %s" % pids)


def stat_field(pid, n):
    """Field n (1-based) of /proc/PID/stat, after the command name."""
    return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[n - 3]


t.ok(all(stat_field(p, 5) != stat_field(g.pid, 5) for p in pids),
     "workers run in their own process group (a terminal's Ctrl-C reaches only the gateway)")
cmdline = open("/proc/%d/cmdline" % pids[0]).read().split("\0")
t.ok("--drain-grace-s" in cmdline and cmdline[cmdline.index("--drain-grace-s") + 1] == str(GRACE_S),
     "a worker is told the gateway's drain_grace_s")
fds = [os.readlink("/proc/%d/fd/%s" % (pids[0], f)) for f in os.listdir("/proc/%d/fd" % pids[0])]
t.ok(not any(f == access_log for f in fds), "a worker does not hold the gateway's access log open (%s)" % fds)

# A worker whose loop stops answering (SIGSTOP stands in for a wedged
# process) is killed after worker_hang_timeout_s and started again: once
# it has answered (one still loading is left alone).
wait_until(lambda: "worker 1 (model m, device cpu, pid %d) is ready" % pids[1] in open(log_path).read(), 60,
           "worker 1 ready")
os.kill(pids[1], signal.SIGSTOP)
t0 = time.monotonic()
restarted = wait_until(lambda: len(re.findall(r"worker 1 .*started: pid (\d+)", open(log_path).read())) == 2, 20,
                       "the hung worker restarted")
took = time.monotonic() - t0
text = open(log_path).read()
t.ok(restarted and "answered no stats request for 2 s (worker_hang_timeout_s): SIGKILL" in text,
     "a worker answering no stats for worker_hang_timeout_s (2 s) is killed and restarted (%.1f s)" % took)
pids[1] = int(re.findall(r"worker 1 .*started: pid (\d+)", text)[-1])
wait_until(lambda: "worker 1 (model m, device cpu, pid %d) is ready" % pids[1] in open(log_path).read(), 30,
           "the restarted worker ready")

# A client that sends a long streaming completion and takes nothing: an
# HTTP/2 window of 0 (kernel buffers would hold a whole HTTP/1.1 answer).
import h2.config
import h2.connection
import h2.settings

stuck = socket.create_connection(("127.0.0.1", port))
c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
c.initiate_connection()
c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
body = b'{"model":"m","prompt":[1,5,7],"max_tokens":1500,"ignore_eos":true,"temperature":0,"stream":true}'
c.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/v1/completions"),
                   ("content-type", "application/json"), ("content-length", str(len(body)))])
c.send_data(1, body, end_stream=True)
stuck.sendall(c.data_to_send())
time.sleep(1.0)
t0 = time.monotonic()
g.send_signal(signal.SIGTERM)
time.sleep(0.3)
try:
    os.kill(pids[1], signal.SIGKILL)  # dies during the drain
except ProcessLookupError:
    pass
g.send_signal(signal.SIGHUP)  # a log rotation during the drain
try:
    rc = g.wait(timeout=60)
except Exception:
    rc = None
took = time.monotonic() - t0
stuck.close()
text = open(log_path).read()
t.ok(rc == 0, "the gateway exits 0 (%s)" % rc)
t.ok("did not stop within" not in text and re.search(r"worker 0 \(pid %d\) exited with status 0" % pids[0], text),
     "the worker of the cut stream exits 0 without a SIGKILL")
t.ok(took < GRACE_S + 3, "stopped %.1f s after SIGTERM, with a grace of %d s (workers waited out too: twice it)" % (took, GRACE_S))
t.ok(text.count("restarting") == 1, "the worker that died during the drain was not restarted (only the hung one was)")
t.ok("SIGHUP while draining: log reopened, config not reloaded" in text and "infergate: reloaded" not in text,
     "a SIGHUP during the drain reopens the log and reloads nothing (the listeners are gone)")
if t.failed:
    print("# gateway log:\n" + text[-3000:])

# A second SIGTERM stops now: a worker that does not stop (frozen here) is
# killed a second later, not after drain_grace_s (20 s).
port2 = free_port()
cfg2 = os.path.join(d, "now.yaml")
open(cfg2, "w").write("""
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
drain_grace_s: 20
runtime_dir: "%s"
""" % (port2, model, os.path.join(d, "run2")))
log2 = os.path.join(d, "now.log")
g2 = spawn([INFERGATE, "serve", "--config", cfg2], log2)
wait_until(lambda: curl("http://127.0.0.1:%d/readyz" % port2, http="--http1.1", timeout=2)[0] == 200
           or g2.poll() is not None, 60, "second gateway ready")
frozen = int(re.findall(r"started: pid (\d+)", open(log2).read())[-1])
os.kill(frozen, signal.SIGSTOP)
t0 = time.monotonic()
g2.send_signal(signal.SIGTERM)
time.sleep(0.2)
g2.send_signal(signal.SIGTERM)
try:
    rc = g2.wait(timeout=40)
except subprocess.TimeoutExpired:
    rc = None
took = time.monotonic() - t0
t.ok(rc == 0 and took < 5 and "did not stop within 1 s: SIGKILL" in open(log2).read(),
     "a second SIGTERM: a worker that does not stop is killed after a second (%.1f s, grace 20 s)" % took)
t.finish()
