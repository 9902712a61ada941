"""Mid-stream failover by token replay (issue 32, item 1): a worker killed
(SIGKILL) after the first chunks of a stream it serves, and the client's
stream goes on from its sibling worker with the same id and created, no
text repeated or missing: with greedy or seeded sampling (penalties too)
the text equals an unbroken run's. The gateway's tags (": ig TOKEN") never
reach the client. A non-streamed answer whose worker dies is sent again
whole. A client may not send the internal headers. routing.replay: false
(reloaded) ends such a stream with the error event, as before.

Requests whose answers keep state over their tokens resume too, chunk for
chunk as an unbroken run sends them (every event equal, one id): a grammar
(json_schema), a tool call (tool_choice required: its deltas, index and
id), reasoning (DeepSeek-R1's template: reasoning_content, then content)
and logprobs (top_logprobs too)."""
import json
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import (INFERGATE, Checks, curl, free_port, gen_model, spawn, sse_events, stream_post, tmpdir,
                     wait_until)

t = Checks()
d = tmpdir()
# Slow enough on one thread (a few ms a token) to kill a worker mid-stream.
model = gen_model(os.path.join(d, "m.gguf"), dim=512, layers=8, heads=8, kv_heads=8, ffn=1024, vocab=512, ctx=1024,
                  type="q8_0", seed=5)
# a thinking model's template: the prompt opens <think>
R1 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "templates",
                  "deepseek-r1-distill-qwen-32b.jinja")
port = free_port()
cfg = os.path.join(d, "gateway.yaml")
CFG = """
listen:
  - address: "127.0.0.1:%d"
workers:
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
  - {model: "%s", name: m, threads: 1, max_seqs: 4}
  - {model: "%s", name: r, threads: 1, max_seqs: 2, chat_template: "%s"}
  - {model: "%s", name: r, threads: 1, max_seqs: 2, chat_template: "%s"}
routing: {retry_budget: 1, replay: %s}
stats_interval_ms: 100
runtime_dir: "%s"
"""


def write_cfg(replay):
    open(cfg, "w").write(CFG % (port, model, model, model, R1, model, R1, "true" if replay else "false",
                                os.path.join(d, "run")))


write_cfg(True)
log_path = os.path.join(d, "gateway.log")
g = spawn([INFERGATE, "serve", "--config", cfg], log_path)


def ready():
    s, _, b = curl("http://127.0.0.1:%d/readyz" % port, http="--http1.1", timeout=2)
    return s == 200 and json.loads(b)["workers_ready"] == 4


def worker_pid(i):
    found = re.findall(r"worker %d \(model \w+, device \w+\) started: pid (\d+)" % i, open(log_path).read())
    return int(found[-1])


def stream(path, body, kill_after=None):
    """Streams body; with kill_after, SIGKILLs the serving worker once that
    many data events have come."""
    def kill(n, r):
        if n == kill_after:
            os.kill(worker_pid(int(r.getheader("x-infergate-worker"))), signal.SIGKILL)
    return stream_post(port, path, body, on_event=kill)


def text_of(events, chat):
    if chat:
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    return "".join(e["choices"][0]["text"] for e in events if e.get("choices"))


def check_case(name, path, body, kill_after):
    chat = "chat" in path
    s0, _, raw0 = stream(path, body)
    ev0, done0 = sse_events(raw0)
    wait_until(ready, 60, "both workers ready")
    s1, h1, raw1 = stream(path, body, kill_after)
    t.ok(b": ig" not in raw1 and b": ig" not in raw0, "%s: no replay tag reaches the client" % name)
    try:
        ev1, done1 = sse_events(raw1)
    except (AssertionError, ValueError) as e:
        t.ok(False, "%s: the resumed stream parses (%s): %r" % (name, e, raw1[-400:]))
        return
    t.ok(s0 == s1 == 200 and done0 and done1 and not any("error" in e for e in ev1),
         "%s: the stream whose worker was killed after %d events completes ([DONE], no error event)"
         % (name, kill_after))
    ids = {e["id"] for e in ev1}
    created = {e["created"] for e in ev1}
    t.ok(len(ids) == 1 and len(created) == 1, "%s: one id and created throughout: %s %s" % (name, ids, created))
    a, b = text_of(ev0, chat), text_of(ev1, chat)
    t.ok(a == b and len(a) > 0, "%s: the text equals the unbroken run's (%d vs %d chars)" % (name, len(a), len(b)))
    if chat:
        roles = sum(1 for e in ev1 if e.get("choices") and "role" in e["choices"][0]["delta"])
        t.ok(roles == 1, "%s: the role opens the stream once (%d)" % (name, roles))
    u0 = [e["usage"] for e in ev0 if e.get("usage")]
    u1 = [e["usage"] for e in ev1 if e.get("usage")]
    t.ok(u0 and u1 and u0[-1]["completion_tokens"] == u1[-1]["completion_tokens"] and
         u0[-1]["prompt_tokens"] == u1[-1]["prompt_tokens"],
         "%s: usage counts the whole answer: %s vs %s" % (name, u0[-1:], u1[-1:]))
    wait_until(ready, 60, "the killed worker back")


def n_replays():
    return len(re.findall(r"event=replay request=", open(log_path).read()))


def check_chunks(name, path, body, kill_after, want):
    """A request whose answer keeps state over its tokens, killed after
    kill_after events: resumed, its events equal an unbroken run's one for
    one; want(events) says the unbroken answer is of the kind tested."""
    s0, _, raw0 = stream(path, body)
    ev0, done0 = sse_events(raw0)
    wait_until(ready, 60, "the workers ready")
    before = n_replays()
    s1, _, raw1 = stream(path, body, kill_after)
    try:
        ev1, done1 = sse_events(raw1)
    except (AssertionError, ValueError) as e:
        ev1, done1 = [], False
        print("%s: %s: %r" % (name, e, raw1[-400:]))
    t.ok(s0 == s1 == 200 and done0 and want(ev0) and len(ev0) > kill_after,
         "%s: the unbroken answer is of its kind (%d events)" % (name, len(ev0)))
    t.ok(n_replays() == before + 1 and done1 and b": ig" not in raw1,
         "%s: killed after %d events, the stream was resumed (%d replays)" % (name, kill_after,
                                                                             n_replays() - before))
    if n_replays() != before + 1:
        print("\n".join([x for x in open(log_path).read().splitlines() if "replay" in x or "worker" in x][-8:]))
    one_id = len({e.get("id") for e in ev1}) == 1
    ev0, ev1 = same_run(ev0), same_run(ev1)
    diff = [i for i in range(max(len(ev0), len(ev1))) if ev0[i:i + 1] != ev1[i:i + 1]]
    t.ok(not diff and one_id,
         "%s: the resumed events equal the unbroken run's, one id (first difference at %s: %s vs %s)"
         % (name, diff[:1], ev0[diff[0]:diff[0] + 1] if diff else "", ev1[diff[0]:diff[0] + 1] if diff else ""))
    wait_until(ready, 60, "the killed worker back")


def same_run(evs):
    """Events with their run's id and created (and so the tool calls' ids,
    made of it) written the same for every run."""
    if not evs:
        return evs
    uniq = evs[0]["id"].split("-", 1)[1]
    return [json.loads(json.dumps(dict(e, created=0)).replace(uniq, "ID")) for e in evs]


def deltas(evs, key):
    return [e["choices"][0]["delta"].get(key) for e in evs if e.get("choices")]


try:
    wait_until(lambda: ready() or g.poll() is not None, 90, "gateway ready with 4 workers")
    t.ok(g.poll() is None, "gateway with four workers started")
    usage = {"include_usage": True}
    check_case("completion, greedy", "/v1/completions",
               {"model": "m", "prompt": [1, 5, 7], "max_tokens": 300, "temperature": 0, "stream": True,
                "stream_options": usage}, 20)
    check_case("completion, seeded, penalties, a stop string", "/v1/completions",
               {"model": "m", "prompt": [3, 9], "max_tokens": 300, "temperature": 1.0, "seed": 42,
                "frequency_penalty": 0.5, "presence_penalty": 0.3, "stop": ["zzzq"], "stream": True,
                "stream_options": usage}, 35)
    check_case("chat, seeded", "/v1/chat/completions",
               {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 300,
                "temperature": 0.8, "seed": 7, "stream": True, "stream_options": usage}, 10)
    chat = [{"role": "user", "content": "hello there"}]
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 350, "maxLength": 400}},
              "required": ["a"], "additionalProperties": False}
    check_chunks("grammar (json_schema)", "/v1/chat/completions",
                 {"model": "m", "messages": chat, "max_tokens": 400, "temperature": 0, "stream": True,
                  "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
                 8, lambda evs: json.loads("".join(x or "" for x in deltas(evs, "content")))["a"])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]
    check_chunks("tool call (tool_choice required)", "/v1/chat/completions",
                 {"model": "m", "messages": chat, "max_tokens": 400, "temperature": 0, "stream": True,
                  "tools": tools, "tool_choice": "required"},
                 15, lambda evs: any(deltas(evs, "tool_calls")) and
                 evs[-1]["choices"][0]["finish_reason"] == "tool_calls")
    check_chunks("reasoning (<think>)", "/v1/chat/completions",
                 {"model": "r", "messages": chat, "max_tokens": 400, "temperature": 0, "stream": True,
                  "grammar": 'root ::= [a-z ]{180,200} "</think>" "\\n\\n" [a-z ]{150,180}'},
                 8, lambda evs: any(deltas(evs, "reasoning_content")) and any(deltas(evs, "content")))
    # ASCII only: a token that ends within a UTF-8 character has its text
    # held back, and its log-probabilities with it; a cut there is refused
    # (they went with the failed run)
    check_chunks("logprobs (top_logprobs 2)", "/v1/chat/completions",
                 {"model": "m", "messages": chat, "max_tokens": 400, "temperature": 0.7, "seed": 3,
                  "stream": True, "logprobs": True, "top_logprobs": 2, "grammar": "root ::= [a-z ]{500,560}"},
                 8, lambda evs: all(e["choices"][0].get("logprobs") for e in evs[1:-1] if e.get("choices")))
    log = open(log_path).read()
    t.ok(len(re.findall(r"event=replay request=\S+ from=\"worker \d\" to=\"worker \d\" tokens=\d+", log)) >= 3,
         "each replay logged with its tokens")
    s, _, b = curl("http://127.0.0.1:%d/metrics" % port, http="--http1.1")
    t.ok(re.search(rb'infergate_replays_total\{outcome="resumed"\} [3-9]', b) is not None,
         "infergate_replays_total counts the replays")

    # Not streamed: nothing went out, so the request is sent again whole.
    body = {"model": "m", "prompt": [2, 4], "max_tokens": 300, "temperature": 0}
    s0, _, b0 = curl("http://127.0.0.1:%d/v1/completions" % port, data=body)
    import subprocess
    mover = subprocess.Popen(["curl", "-sS", "--http1.1", "--max-time", "60", "-D", "-", "-H",
                              "content-type: application/json", "--data-binary", json.dumps(body),
                              "http://127.0.0.1:%d/v1/completions" % port], stdout=subprocess.PIPE)
    time.sleep(0.4)
    os.kill(worker_pid(0), signal.SIGKILL)
    out = mover.communicate(timeout=90)[0]
    head, _, b1 = out.partition(b"\r\n\r\n")
    t.ok(head.startswith(b"HTTP/1.1 200") and
         json.loads(b1)["choices"][0]["text"] == json.loads(b0)["choices"][0]["text"],
         "not streamed: a worker killed mid-answer, the answer sent again whole equals the unbroken one")
    wait_until(ready, 60, "the killed worker back")

    # A client may not send the gateways' own headers.
    for h in ("x-infergate-resume: chatcmpl-x 1 1 1,2", "x-infergate-replay: 1"):
        s, _, b = curl("http://127.0.0.1:%d/v1/completions" % port, data={"model": "m", "prompt": "a"},
                       headers=[h])
        t.ok(s == 400 and json.loads(b)["error"]["code"] == "internal_header",
             "a client's %s is refused (%d)" % (h.split(":")[0], s))

    # The worker's side of the header (only a gateway reaches its socket).
    sock = os.path.join(d, "run", "worker-1.sock")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    # a letter's token, read from its tag
    s, _, b = curl("http://localhost/v1/completions", unix=sock, headers=["x-infergate-replay: 1"],
                   data={"model": "m", "prompt": "a", "stream": True, "max_tokens": 1, "grammar": "root ::= [a-z]"})
    NOT_DIGIT = int(re.search(rb": ig (\d+)", b).group(1))
    for h, body, code in (
            ("x-infergate-resume: cmpl-x 1 1 1,2,", {"model": "m", "prompt": "a", "stream": True}, "bad_resume"),
            ("x-infergate-resume: cmpl-x 1", {"model": "m", "prompt": "a", "stream": True}, "bad_resume"),
            # a token the grammar refuses: the resume cannot go on
            ("x-infergate-resume: cmpl-x 1 1 %d" % NOT_DIGIT, {"model": "m", "prompt": "a", "stream": True,
                                                               "grammar": "root ::= [0-9]+"}, "resume_refused"),
            ("x-infergate-resume: cmpl-x 1 1 5", {"model": "m", "prompt": "a"}, "resume_refused")):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        s, _, b = curl("http://localhost" + path, unix=sock, data=body, headers=[h])
        t.ok(s == 400 and json.loads(b)["error"]["code"] == code,
             "worker: %s with %s: 400 %s (%d %s)" % (h, sorted(body), code, s, b[:120]))
    # A resume with no tokens (the run failed before its first): the same
    # run from the start, its id kept, the role not sent again.
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    s, h, b = curl("http://localhost/v1/chat/completions", unix=sock, data=body,
                   headers=["x-infergate-resume: chatcmpl-kept 123 9", "x-infergate-replay: 1"])
    evs = []
    for e in b.decode().split("\n\n"):
        if "data: {" in e:
            evs.append(json.loads(e[e.index("data: {") + 6:]))
    usage = [e["usage"] for e in evs if e.get("usage")]
    t.ok(s == 200 and h.get("x-infergate-replay") == "chatcmpl-kept 123 9" and evs and
         all(e["id"] == "chatcmpl-kept" and e["created"] == 123 for e in evs) and
         not any("role" in e["choices"][0]["delta"] for e in evs if e.get("choices")) and usage and
         b.count(b": ig ") == usage[0]["completion_tokens"],
         "worker: a resume with no tokens keeps the run's id and created, no role again, each token tagged "
         "(%d %s)" % (s, h.get("x-infergate-replay")))

    # Replay off: the stream ends with the error event, as before.
    write_cfg(False)
    n_reload = open(log_path).read().count("reload")
    g.send_signal(signal.SIGHUP)
    wait_until(lambda: open(log_path).read().count("reload") > n_reload, 10, "the reload")
    time.sleep(0.5)
    s, h, raw = stream("/v1/completions", {"model": "m", "prompt": [1, 5, 7], "max_tokens": 300,
                                           "temperature": 0, "stream": True}, 20)
    blocks = [x for x in raw.decode().split("\n\n") if x.strip()]
    last = json.loads(blocks[-1][6:]) if blocks and blocks[-1].startswith("data: {") else {}
    t.ok(last.get("error", {}).get("code") == "upstream_failed",
         "routing.replay false: the stream ends with the upstream_failed error event (%d, last: %r)"
         % (s, blocks[-1:]))
    if not last:
        print(open(log_path).read()[-3000:])
    t.ok(b": ig" not in raw, "replay off: no tag reaches the client either")
finally:
    g.send_signal(signal.SIGTERM)
    try:
        g.wait(timeout=30)
    except Exception:
        g.kill()
t.finish()
