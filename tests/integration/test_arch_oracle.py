"""An independent oracle for the architectures of issue 28: a small numpy
re-implementation of each family's forward pass, written from llama.cpp's
graphs (not from our C), over the same synthetic F32 file that `infergate
model gen --arch` writes; its logits after a prompt must match what
`infergate generate --dump-logits` prints. The prompt is longer than the
sliding windows (5), so windows, sinks, soft-caps, YaRN, LongRoPE, the
local RoPE base and the experts' routing all count.

Needs python3-numpy (Debian); skips (77) without it."""
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

try:
    import numpy as np
except ImportError:
    print("# numpy missing (apt-get install python3-numpy): skipped")
    sys.exit(77)

PROMPT = [1, 300, 301, 450, 17, 99, 260, 302, 303, 511, 42, 277, 310, 288, 401, 12, 77, 5, 64]


# ---- GGUF (F32 tensors) ----

def read_gguf(path):
    data = open(path, "rb").read()
    off = [0]

    def take(fmt):
        v = struct.unpack_from("<" + fmt, data, off[0])
        off[0] += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        n = take("Q")
        s = data[off[0]:off[0] + n].decode("utf-8", "replace")
        off[0] += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF"
    off[0] = 4
    take("I")
    n_t, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        infos.append((name, ne, take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    start = (off[0] + align - 1) // align * align
    tensors = {}
    for name, ne, t, o in infos:
        assert t == 0, name + " is not f32"
        n = int(np.prod(ne))
        a = np.frombuffer(data, np.float32, n, start + o).astype(np.float64)
        tensors[name] = a.reshape(list(reversed(ne)))
    return meta, tensors


# ---- the families ----

FAMILIES = {
    # arch: (neox, act, qk_norm, post_norms, no_pre, swa_pattern, embd_sqrt)
    "llama": dict(neox=False),
    "qwen3": dict(neox=True, qk="head"),
    "qwen3moe": dict(neox=True, qk="head", norm_w=True),
    "gemma2": dict(neox=True, act="gelu", post=True, swa=2, embd_sqrt=True, softcap=True),
    "gemma3": dict(neox=True, act="gelu", post=True, swa=6, embd_sqrt=True, qk="head", local_base=10000.0),
    "phi3": dict(neox=True, fused=True, swa=1),
    "gpt-oss": dict(neox=True, act="oai", swa=2, sinks=True, topk_softmax=True, ffn_norm="post_attention_norm"),
    "granite": dict(neox=False, granite=True),
    "olmo2": dict(neox=True, qk="row", post=True, no_pre=True),
    "smollm3": dict(neox=False, no_rope_every=4),
}


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def f16(x):
    return x.astype(np.float16).astype(np.float64)


def inv_freqs(meta, arch, n_rot, base, kind, factor, factors):
    """Per pair: the angle per position, and the cos/sin magnitude."""
    i = np.arange(n_rot // 2)
    theta = base ** (-2.0 * i / n_rot)
    if factors is not None:
        theta = theta / factors
    mscale = meta.get(arch + ".rope.scaling.attn_factor", 1.0)
    if kind == "linear":
        theta = theta / factor
    elif kind == "yarn":
        # ggml's rope_yarn: ramp between the correction dims, ext_factor 1
        orig = meta.get(arch + ".rope.scaling.original_context_length")

        def corr(rot):
            return n_rot * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(base))
        lo = max(0.0, np.floor(corr(32.0)))
        hi = min(n_rot - 1.0, np.ceil(corr(1.0)))
        ramp = 1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)
        theta = theta * ((1 / factor) * (1 - ramp) + ramp)
        mscale *= 1 + 0.1 * np.log(factor)
    return theta, mscale


def rope(x, pos, n_rot, theta, mscale, neox):
    """x: (T, H, hd)."""
    ang = np.outer(pos, theta)  # (T, n_rot/2)
    c, s = (np.cos(ang) * mscale)[:, None, :], (np.sin(ang) * mscale)[:, None, :]
    y = x.copy()
    if neox:
        a, b = x[..., :n_rot // 2], x[..., n_rot // 2:n_rot]
        y[..., :n_rot // 2] = a * c - b * s
        y[..., n_rot // 2:n_rot] = a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = a * c - b * s
        y[..., 1:n_rot:2] = a * s + b * c
    return y


def forward(meta, W, tokens, seq_max):
    arch = meta["general.architecture"]
    F = FAMILIES[arch]
    K = lambda k, d=None: meta.get(arch + "." + k, d)  # noqa: E731
    n_layer, n_embd = K("block_count"), K("embedding_length")
    n_head, n_kv = K("attention.head_count"), K("attention.head_count_kv")
    hd = n_embd // n_head
    n_rot, eps = K("rope.dimension_count", hd), K("attention.layer_norm_rms_epsilon")
    base = K("rope.freq_base", 10000.0)
    kind = K("rope.scaling.type", "linear" if K("rope.scaling.factor") else "none")
    factor = K("rope.scaling.factor", 1.0)
    n_exp, n_used = K("expert_count", 0), K("expert_used_count", 0)
    window = K("attention.sliding_window", 0)
    T = len(tokens)
    pos = np.arange(T)
    x = W["token_embd.weight"][tokens]
    if F.get("embd_sqrt"):
        x = x * np.sqrt(n_embd)
    if F.get("granite"):
        x = x * K("embedding_scale")
    factors = W.get("rope_freqs.weight")
    if "rope_factors_long.weight" in W:  # LongRoPE: long past the original context
        long_ = seq_max > K("rope.scaling.original_context_length")
        factors = W["rope_factors_long.weight" if long_ else "rope_factors_short.weight"]
        kind = "longrope"
    main = inv_freqs(meta, arch, n_rot, base, kind, factor, factors)
    local = main
    if F.get("local_base"):
        local = (F["local_base"] ** (-2.0 * np.arange(n_rot // 2) / n_rot), 1.0)
    scale = 1 / np.sqrt(hd)
    if F.get("granite"):
        scale = K("attention.scale")
    res = K("residual_scale", 1.0) if F.get("granite") else 1.0
    for l in range(n_layer):
        b = "blk.%d." % l
        pat = F.get("swa", 0)
        slides = window > 0 and pat > 0 and (pat == 1 or l % pat < pat - 1)
        h = x if F.get("no_pre") else rmsnorm(x, W[b + "attn_norm.weight"], eps)
        if F.get("fused"):
            qkv = h @ W[b + "attn_qkv.weight"].T
            q, k, v = np.split(qkv, [n_head * hd, n_head * hd + n_kv * hd], axis=1)
        else:
            q, k, v = h @ W[b + "attn_q.weight"].T, h @ W[b + "attn_k.weight"].T, h @ W[b + "attn_v.weight"].T
        for name, t in (("q", "attn_q.bias"), ("k", "attn_k.bias"), ("v", "attn_v.bias")):
            if b + t in W:
                if name == "q":
                    q = q + W[b + t]
                elif name == "k":
                    k = k + W[b + t]
                else:
                    v = v + W[b + t]
        if F.get("qk") == "row":
            q, k = rmsnorm(q, W[b + "attn_q_norm.weight"], eps), rmsnorm(k, W[b + "attn_k_norm.weight"], eps)
        q, k, v = q.reshape(T, n_head, hd), k.reshape(T, n_kv, hd), v.reshape(T, n_kv, hd)
        if F.get("qk") == "head":
            q, k = rmsnorm(q, W[b + "attn_q_norm.weight"], eps), rmsnorm(k, W[b + "attn_k_norm.weight"], eps)
        nre = F.get("no_rope_every", 0)
        if not (nre and (l + 1) % nre == 0):
            th, ms = local if slides else main
            q, k = rope(q, pos, n_rot, th, ms, F["neox"]), rope(k, pos, n_rot, th, ms, F["neox"])
        k, v = f16(k), f16(v)  # the cache keeps halves
        out = np.zeros((T, n_head, hd))
        for hh in range(n_head):
            g = hh // (n_head // n_kv)
            s = q[:, hh, :] @ k[:, g, :].T * scale
            if F.get("softcap"):
                cap = K("attn_logit_softcapping")
                s = cap * np.tanh(s / cap)
            mask = np.tril(np.ones((T, T), bool))
            if slides:
                mask &= (pos[:, None] - pos[None, :]) < window
            s = np.where(mask, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            if F.get("sinks"):
                sink = W[b + "attn_sinks.weight"][hh]
                m = np.maximum(m, sink)
                e = np.exp(s - m)
                p = e / (e.sum(axis=1, keepdims=True) + np.exp(sink - m))
            else:
                e = np.exp(s - m)
                p = e / e.sum(axis=1, keepdims=True)
            out[:, hh, :] = p @ v[:, g, :]
        a = out.reshape(T, n_head * hd) @ W[b + "attn_output.weight"].T
        if b + "attn_output.bias" in W:
            a = a + W[b + "attn_output.bias"]
        if F.get("post"):
            a = rmsnorm(a, W[b + "post_attention_norm.weight"], eps)
        x = x + a * res
        fn = F.get("ffn_norm", "ffn_norm")
        h = x if F.get("no_pre") else rmsnorm(x, W[b + fn + ".weight"], eps)
        act = F.get("act", "silu")

        def glu(gate, up):
            if act == "gelu":
                return gelu(gate) * up
            if act == "oai":
                gt, u = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
                return gt / (1 + np.exp(-1.702 * gt)) * (u + 1)
            return silu(gate) * up

        if n_exp:
            logits = h @ W[b + "ffn_gate_inp.weight"].T
            if b + "ffn_gate_inp.bias" in W:
                logits = logits + W[b + "ffn_gate_inp.bias"]
            y = np.zeros_like(h)
            for t in range(T):
                order = np.argsort(-logits[t], kind="stable")[:n_used]
                if F.get("topk_softmax"):
                    w = np.exp(logits[t][order] - logits[t][order].max())
                    w = w / w.sum()
                else:
                    p = np.exp(logits[t] - logits[t].max())
                    p = p / p.sum()
                    w = p[order]
                    if F.get("norm_w", arch in ("llama", "granite")):
                        w = w / w.sum()
                for e, we in zip(order, w):
                    gate = W[b + "ffn_gate_exps.weight"][e] @ h[t]
                    up = W[b + "ffn_up_exps.weight"][e] @ h[t]
                    if b + "ffn_gate_exps.bias" in W:
                        gate, up = gate + W[b + "ffn_gate_exps.bias"][e], up + W[b + "ffn_up_exps.bias"][e]
                    d = W[b + "ffn_down_exps.weight"][e] @ glu(gate, up)
                    if b + "ffn_down_exps.bias" in W:
                        d = d + W[b + "ffn_down_exps.bias"][e]
                    y[t] += we * d
        elif F.get("fused"):
            gu = h @ W[b + "ffn_up.weight"].T
            n_ff = gu.shape[1] // 2
            y = glu(gu[:, :n_ff], gu[:, n_ff:]) @ W[b + "ffn_down.weight"].T
        else:
            y = glu(h @ W[b + "ffn_gate.weight"].T, h @ W[b + "ffn_up.weight"].T) @ W[b + "ffn_down.weight"].T
        if F.get("post"):
            y = rmsnorm(y, W[b + "post_ffw_norm.weight"], eps)
        x = x + y * res
    h = rmsnorm(x[-1], W["output_norm.weight"], eps)
    out = W.get("output.weight", W["token_embd.weight"])
    logits = out @ h
    if F.get("granite"):
        logits = logits / K("logit_scale")
    if F.get("softcap"):
        cap = K("final_logit_softcapping")
        logits = cap * np.tanh(logits / cap)
    return logits


def main():
    d = harness.tmpdir()
    cases = [("qwen3", []), ("qwen3moe", []), ("mixtral", []), ("gemma2", []), ("gemma3", []),
             ("phi3", []), ("phi3", ["--ctx", "64"]), ("gpt-oss", []), ("granite", []), ("olmo2", []),
             ("smollm3", [])]
    worst = 1.0
    for arch, extra in cases:
        path = os.path.join(d, arch + "".join(extra) + ".gguf")
        shape = ["--dim", "64", "--layers", "6", "--heads", "4", "--kv-heads", "2", "--ffn", "96", "--vocab", "512",
                 "--ctx", "256", "--seed", "3", "--swa", "5", "--type", "f32"] + extra
        if arch in ("mixtral", "qwen3moe", "gpt-oss"):
            shape += ["--experts", "4", "--experts-used", "2"]
        subprocess.run([harness.INFERGATE, "model", "gen", "--out", path, "--arch", arch] + shape, check=True,
                       stdout=subprocess.DEVNULL)
        dump = path + ".logits"
        subprocess.run([harness.INFERGATE, "generate", "--model", path, "--prompt-tokens",
                        ",".join(map(str, PROMPT)), "-n", "1", "--dump-logits", dump, "--threads", "2"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        got = np.array([float(v) for v in open(dump).read().split()])
        meta, W = read_gguf(path)
        # the worker's sequence holds the prompt and -n 1: LongRoPE's long
        # factors once that passes the original context (16 at --ctx 64)
        want = forward(meta, W, PROMPT, len(PROMPT) + 1)
        cos = float(got @ want / np.sqrt((got @ got) * (want @ want)))
        rel = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print("# %-8s %-10s cosine %.8f, max |diff| / max |logit| %.2e, argmax %d vs %d"
              % (arch, " ".join(extra), cos, rel, int(np.argmax(got)), int(np.argmax(want))))
        worst = min(worst, cos)
        assert cos > 0.99999 and rel < 1e-3, arch
        assert int(np.argmax(got)) == int(np.argmax(want)), arch
    print("ok: every family matches the numpy oracle (worst cosine %.8f)" % worst)


if __name__ == "__main__":
    main()
