"""The example configs in configs/ stay true: each passes `infergate serve
--check` once the files it names exist (their absolute paths are mapped
into a temporary folder holding a generated model and certificate), a
missing file fails the check by name, configs/default.yaml names every key
of the schema in gateway/config/config.h, and serving it gives what serving
no config gives (the demo model on 127.0.0.1)."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, curl, free_port, gen_model, spawn, tmpdir, wait_until

SRC = os.environ.get("INFERGATE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
PREFIXES = ["/etc/infergate/", "/var/lib/infergate/models/", "/var/log/infergate/", "/run/infergate"]

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "tiny.gguf"), dim=64, layers=1, heads=4, kv_heads=2, ffn=128, vocab=300)
cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-days", "1", "-subj", "/CN=localhost", "-keyout", key, "-out", cert],
               check=True, capture_output=True, timeout=60)


def mapped(text, root):
    """The config's absolute paths moved under root, and the files it names
    made there: models from the generated one, keys and certificates from
    the generated pair."""
    for p in PREFIXES:
        text = text.replace(p, os.path.join(root, p.strip("/").replace("/", "_")) + "/")
    for path in set(re.findall(re.escape(root) + r"/[^\s,\]}\"']+", text)):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if path.endswith("/"):
            os.makedirs(path, exist_ok=True)
        elif path.endswith(".gguf"):
            shutil.copy(model, path)
        elif not path.endswith(".log"):
            shutil.copy(key if "key" in os.path.basename(path) else cert, path)
    return text


def check(path, text):
    cfg = os.path.join(d, os.path.basename(path))
    with open(cfg, "w") as f:
        f.write(text)
    r = subprocess.run([INFERGATE, "serve", "--check", "--config", cfg], capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout + r.stderr


configs = sorted(glob.glob(os.path.join(SRC, "configs", "**", "*.yaml"), recursive=True))
t.ok(len(configs) >= 5, "configs/ holds the default, the TLS front door and three regions (%d files)" % len(configs))
for i, path in enumerate(configs):
    name = os.path.relpath(path, SRC)
    root = os.path.join(d, "root%d" % i)
    text = mapped(open(path).read(), root)
    rc, out = check(path, text)
    t.ok(rc == 0 and "is valid" in out, "%s passes serve --check%s" % (name, "" if rc == 0 else ": " + out.strip()))

# The check can fail: the TLS example without its certificate names it.
tls = os.path.join(SRC, "configs", "tls-front.yaml")
text = mapped(open(tls).read(), os.path.join(d, "missing"))
os.unlink(os.path.join(d, "missing", "etc_infergate", "fullchain.pem"))
rc, out = check(tls, text)
t.ok(rc == 1 and "listen[].tls.cert" in out and "fullchain.pem" in out,
     "a certificate the config names that is missing fails the check, named")

# Every key of the schema (config.h's comment) is in the written-out default.
schema = open(os.path.join(SRC, "gateway", "config", "config.h")).read().split("*/")[0]
keys = set(re.findall(r"^ \*\s+(?:- )?([a-z_]+):", schema, re.M))
keys |= set(re.findall(r"[{,]\s*([a-z_]+):", schema))
default = open(os.path.join(SRC, "configs", "default.yaml")).read()
missing = sorted(k for k in keys if not re.search(r"(^|[\s{,#-])%s:" % k, default, re.M))
t.ok(len(keys) > 50 and not missing, "configs/default.yaml names all %d keys of the schema%s" %
     (len(keys), "; missing: " + ", ".join(missing) if missing else ""))

# Serving the written-out default is serving no config.
port = free_port()
env = dict(os.environ, INFERGATE_CACHE_DIR=os.path.join(d, "cache"))
g = spawn([INFERGATE, "serve", "--config", os.path.join(SRC, "configs", "default.yaml"), "--listen",
           "127.0.0.1:%d" % port], os.path.join(d, "serve.log"), env=env)
url = "http://127.0.0.1:%d" % port
wait_until(lambda: curl(url + "/readyz", http="--http1.1", timeout=2)[0] == 200 or g.poll() is not None, 120,
           "the default config's gateway ready")
s, _, b = curl(url + "/v1/models", http="--http1.1")
t.ok(s == 200 and json.loads(b)["data"][0]["id"] == "demo", "configs/default.yaml serves the demo model")
g.terminate()
t.ok(g.wait(timeout=60) == 0, "and stops cleanly on SIGTERM")
t.finish()
