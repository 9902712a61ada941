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
t.finish()
