"""`infergate serve` with no config: a synthetic demo model written to the
cache on first run, one CPU worker, no key, loopback only, and a startup
message that says the weights are random and prints a curl command."""
import json
import os
import re
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, spawn, tmpdir, wait_until

t = Checks()
d = tmpdir()
env = dict(os.environ, INFERGATE_CACHE_DIR=os.path.join(d, "cache"))
port = free_port()
log = os.path.join(d, "serve.log")
g = spawn([INFERGATE, "serve", "--listen", "127.0.0.1:%d" % port], log, env=env)
url = "http://127.0.0.1:%d" % port
wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None, 120,
           "default gateway ready")
text = open(log).read()
t.ok(g.poll() is None, "serve starts with no config")
t.ok(os.path.exists(os.path.join(d, "cache", "demo.gguf")), "the demo model was written to the cache directory")
t.ok("RANDOM" in text and "gibberish" in text and "--config" in text,
     "the startup message says the weights are random and how to serve a real model")
m = re.search(r"curl (\S+)/v1/chat/completions .*-d '(.*)'", text)
t.ok(m is not None and "no API key is needed" in text, "a ready-to-paste curl command, and no key needed")
s, _, b = curl(url + "/v1/chat/completions", http="--http1.1", data=json.loads(m.group(2)) if m else {})
t.ok(s == 200 and json.loads(b)["object"] == "chat.completion", "the pasted request gets a chat completion")
s, _, b = curl(url + "/v1/models", http="--http1.1")
t.ok(s == 200 and json.loads(b)["data"][0]["id"] == "demo", "/v1/models lists the demo model")
g.terminate()
t.ok(g.wait(timeout=60) == 0, "SIGTERM stops it cleanly")
# A second start finds the model in the cache. Under an open-file limit of
# 400 (hard as soft: nothing to raise), max_connections (10000) is cut to
# fit, leaving descriptors for the worker, and says so.
g = spawn(["prlimit", "--nofile=400:400", INFERGATE, "serve", "--listen", "127.0.0.1:%d" % port], log + "2",
          env=env)
wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None, 60,
           "second start ready")
t.ok("first run" not in open(log + "2").read(), "the second start reuses the cached demo model")
t.ok("max_connections 10000 does not fit the open-file limit 400" in open(log + "2").read()
     and "taking 200" in open(log + "2").read(), "max_connections is cut to the open-file limit, with a warning")
g.terminate()
g.wait(timeout=60)
# The binary replaced on disk while it runs (a package upgrade renames the
# new file over the old): a worker that dies is started again from the
# image the gateway runs, not from whatever the path holds now.
bindir = os.path.join(d, "bin")
os.makedirs(bindir)
exe = os.path.join(bindir, "infergate")
shutil.copy(INFERGATE, exe)
g = spawn([exe, "serve", "--listen", "127.0.0.1:%d" % port], log + "3", env=env)
wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None, 60,
           "third start ready")
marker = os.path.join(d, "new-binary-ran")
with open(exe + ".new", "w") as f:
    f.write("#!/bin/sh\ntouch '%s'\nexit 3\n" % marker)
os.chmod(exe + ".new", 0o755)
os.rename(exe + ".new", exe)
pid = int(re.findall(r"started: pid (\d+)", open(log + "3").read())[-1])
os.kill(pid, signal.SIGKILL)
wait_until(lambda: open(log + "3").read().count(" is ready") >= 2 or os.path.exists(marker), 60,
           "the killed worker started again")
s, _, b = curl(url + "/v1/models", http="--http1.1")
t.ok(not os.path.exists(marker) and open(log + "3").read().count(" is ready") == 2 and s == 200,
     "a worker restarted after its binary was replaced on disk runs the gateway's own image")
g.terminate()
g.wait(timeout=60)

# The access log on a stdout that nobody reads (a stalled log shipper): the
# pipe fills, then the log's queue; lines are dropped and counted, and
# the gateway goes on answering. A write on the loop stopped it all.
import http.client
import subprocess
g = subprocess.Popen([INFERGATE, "serve", "--listen", "127.0.0.1:%d" % port], stdout=subprocess.PIPE,
                     stderr=open(log + "4", "wb"), env=env, start_new_session=True)
wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None, 60,
           "fourth start ready")
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
statuses = []
for i in range(600):  # ~2.5 MB of log lines: a 64 KiB pipe, then a 1 MiB queue
    conn.request("GET", "/healthz?" + "q%d-" % i + "x" * 4000)
    r = conn.getresponse()
    r.read()
    statuses.append(r.status)
s, _, metrics = curl(url + "/metrics", http="--http1.1", timeout=10)
dropped = re.search(rb"^infergate_access_log_dropped_total (\d+)", metrics or b"", re.M)
t.ok(statuses == [200] * 600 and s == 200 and dropped and int(dropped.group(1)) > 0,
     "with stdout unread, 600 requests logged with 4 KB paths are all answered, and the lines past the queue are "
     "dropped and counted (%s dropped)" % (dropped.group(1).decode() if dropped else None))
g.terminate()
out = g.stdout.read()  # unblocks the log's writer; what it had queued follows
lines = [l for l in out.split(b"\n") if l.startswith(b"{")]  # the startup message goes to stdout too
t.ok(g.wait(timeout=60) == 0 and lines and all(json.loads(l)["method"] == "GET" for l in lines)
     and len(lines) + int(dropped.group(1) if dropped else 0) >= 600,
     "the lines that were written are whole JSON lines: %d written (exit %s)" % (len(lines), g.returncode))
t.finish()
