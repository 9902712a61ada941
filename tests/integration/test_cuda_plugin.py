"""The CUDA backend is a plugin (runtime/device.h): the binary links no CUDA
library; the plugin, where built, exports its entry alone and takes kernels/
and runtime/ from the binary; and a worker or `generate` asking for cuda
where the plugin, a plugin that fits, or the NVIDIA driver is missing fails
at once with one line naming what is missing. On a machine with a driver
the driver case is left to bench/gpu_check.sh."""
import ctypes
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import INFERGATE, Checks, gen_model, tmpdir

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=64, layers=1, heads=2, kv_heads=1, ffn=128, vocab=512, ctx=128,
                  type="f32", seed=1)
bindir = os.path.dirname(os.path.abspath(INFERGATE))
plugin = os.path.join(bindir, "libinfergate_cuda.so")


def built_with_cuda():
    # A build folder says what it was configured with (a stale plugin may
    # lie next to a binary reconfigured without CUDA); a packed folder
    # (bench/gpu_pack.sh) holds the plugin only when it was built.
    cache = os.path.join(bindir, "CMakeCache.txt")
    if os.path.exists(cache):
        return re.search(r"^INFERGATE_CUDA:BOOL=ON$", open(cache).read(), re.M) is not None
    return os.path.exists(plugin)


def have_driver():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def run(args, plugin_env=None):
    env = dict(os.environ)
    env.pop("INFERGATE_CUDA_PLUGIN", None)
    if plugin_env is not None:
        env["INFERGATE_CUDA_PLUGIN"] = plugin_env
    p = subprocess.run([INFERGATE] + args, capture_output=True, timeout=60, env=env)
    return p.returncode, p.stderr.decode(errors="replace")


def worker(plugin_env=None):
    return run(["worker", "--model", model, "--listen", "unix:" + os.path.join(d, "w.sock"), "--device", "cuda"],
               plugin_env)


def one_line(err, *needles):
    lines = [l for l in err.splitlines() if l.strip()]
    return len(lines) == 1 and all(n in lines[0] for n in needles)


ldd = subprocess.run(["ldd", INFERGATE], capture_output=True, timeout=30).stdout.decode()
t.ok(re.search(r"libcud|libcublas", ldd) is None, "ldd infergate names no CUDA library")

# --- the plugin missing, or not a plugin of ours ---
missing = os.path.join(d, "nowhere", "libinfergate_cuda.so")
rc, err = worker(missing)
t.ok(rc != 0 and one_line(err, "worker: ", "no CUDA device: cannot load the CUDA plugin", missing),
     "a cuda worker without its plugin fails with one line naming the file (rc %d: %r)" % (rc, err))
libm = next((p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6", "/lib64/libm.so.6")
             if os.path.exists(p)), None)
if libm:
    rc, err = worker(libm)
    t.ok(rc != 0 and one_line(err, "no CUDA device: the CUDA plugin", "rt_device_plugin"),
         "a library that is not a plugin is refused: it has no entry (rc %d: %r)" % (rc, err))

if not built_with_cuda():
    rc, err = worker()
    t.ok(rc != 0 and one_line(err, "no CUDA device: this build has no CUDA plugin"),
         "without CUDA in the build, a cuda worker says the build has no plugin (rc %d: %r)" % (rc, err))
else:
    # Exports: the entry alone; imports: only what the binary exports, so
    # that kernels/ and runtime/ (and their globals) exist once per process.
    nm = shutil.which("nm")
    if nm:
        defined = subprocess.run([nm, "-D", "--defined-only", plugin], capture_output=True, timeout=30).stdout
        names = [l.split()[-1] for l in defined.decode().splitlines() if l.split()]
        t.ok(names == ["rt_device_plugin"], "the plugin exports rt_device_plugin alone (%s)" % names)
        undef = subprocess.run([nm, "-D", "-u", plugin], capture_output=True, timeout=30).stdout.decode()
        ours = sorted({l.split()[-1] for l in undef.splitlines() if re.search(r"\s(kn|rt|gw)_", l)})
        exe = subprocess.run([nm, "-D", "--defined-only", INFERGATE], capture_output=True, timeout=30).stdout
        exported = {l.split()[-1] for l in exe.decode().splitlines() if l.split()}
        t.ok(ours and all(s in exported for s in ours),
             "what the plugin takes of kernels/ and runtime/ the binary exports (%s)" % ours)
    if not have_driver():
        rc, err = worker()
        t.ok(rc != 0 and one_line(err, "no CUDA device: the NVIDIA driver is missing", "libcuda.so.1"),
             "without the driver, a cuda worker fails with one line naming libcuda.so.1 (rc %d: %r)" % (rc, err))
        rc, err = run(["generate", "--model", model, "--prompt-tokens", "1,2,3", "-n", "2", "--device", "cuda"])
        t.ok(rc != 0 and one_line(err, "generate: ", "the NVIDIA driver is missing", "libcuda.so.1"),
             "so does generate --device cuda (rc %d: %r)" % (rc, err))
    else:
        print("# a driver is installed: the missing-driver case is not tried here")

# The CPU is untouched by all this.
rc, err = run(["generate", "--model", model, "--prompt-tokens", "1,2,3", "-n", "2", "--device", "cpu"], missing)
t.ok(rc == 0, "generate on the cpu needs no plugin (rc %d: %r)" % (rc, err))
t.finish()
