"""Tool calling and structured output through a worker, with real clients:
the official OpenAI Node SDK (tests/integration/node/tools.js) calls tools
(tool_choice required and named, streamed and not, the stream helper, a
history with a call and its answer) and asks for JSON matching 20 schemas
(10 answers each) from the synthetic random-weight model, which writes
gibberish unconstrained: every call's arguments and every answer must parse
and validate against its schema with Python's jsonschema (Debian's
python3-jsonschema, not ours), and end by the grammar (finish_reason stop /
tool_calls, never length). curl checks the completions endpoint's grammar
and the 400s that name what they refuse.

Exit 77 (skipped) without node, the SDK or python3-jsonschema."""
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit"))
from harness import INFERGATE, Checks, curl, free_port, gen_model, spawn, tmpdir, wait_until

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed: skipped")
    sys.exit(77)
import grammar_oracle

NODE_DIR = os.path.join(os.path.dirname(__file__), "node")
if not shutil.which("node") or not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")):
    print("node or the OpenAI Node SDK (npm ci in tests/integration/node) is missing: skipped")
    sys.exit(77)

t = Checks()
d = tmpdir()
model = gen_model(os.path.join(d, "m.gguf"), dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512, ctx=4096,
                  type="f32", seed=5)
port = free_port()
URL = "http://127.0.0.1:%d" % port
w = spawn([INFERGATE, "worker", "--model", model, "--model-name", "m", "--listen", "tcp:127.0.0.1:%d" % port,
           "--threads", "2", "--max-seqs", "16"], os.path.join(d, "w.log"))
wait_until(lambda: curl(URL + "/health", timeout=2)[0] == 200 or w.poll() is not None, 60, "worker health")
assert w.poll() is None, open(os.path.join(d, "w.log")).read()

S = lambda n=10: {"type": "string", "maxLength": n}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": S(), "days": {"type": "integer", "minimum": 1,
                                                                             "maximum": 7},
                                                        "unit": {"enum": ["C", "F"]}},
                       "required": ["city", "days", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {"tz": S(6)}, "required": ["tz"],
                                           "additionalProperties": False}}},
    {"type": "function", "function": {"name": "ping"}},  # no parameters: any object
]
PARAMS = {x["function"]["name"]: x["function"].get("parameters", {"type": "object"}) for x in TOOLS}

rng = random.Random(29)
schemas = [s for i, s in enumerate(grammar_oracle.SCHEMAS) if i not in grammar_oracle.REFUSE_ONLY][:20]
while len(schemas) < 20:
    schemas.append(grammar_oracle.random_schema(rng))
PER_SCHEMA = 10
spec = os.path.join(d, "spec.json")
json.dump({"tools": TOOLS, "schemas": schemas, "per_schema": PER_SCHEMA}, open(spec, "w"))

r = subprocess.run(["node", os.path.join(NODE_DIR, "tools.js"), URL + "/v1", "m", spec], capture_output=True,
                   text=True, timeout=540)
out = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"error": r.stderr[-2000:]}
t.ok(r.returncode == 0 and "error" not in out, "tools.js ran: %s" % (out.get("error"), ))


def check_call(c, names):
    """None when c is a call of one of names with arguments valid for it, else why not."""
    if c.get("name") not in names or c.get("type") != "function" or not c.get("id", "").startswith("call_"):
        return "bad call head %s" % c
    try:
        jsonschema.validate(json.loads(c["arguments"]), PARAMS[c["name"]])
    except Exception as e:  # a parse error or a validation error
        return "%s: %s" % (c["arguments"], str(e)[:200])
    return None


def check_answers(key, names, single=False):
    got = out.get(key) or []
    bad = []
    for a in got:
        if a.get("finish") != "tool_calls" or not a.get("calls") or a.get("content") not in (None, ""):
            bad.append("finish %s, %d calls, content %r" % (a.get("finish"), len(a.get("calls") or []),
                                                            a.get("content")))
            continue
        if single and len(a["calls"]) != 1:
            bad.append("%d calls where parallel_tool_calls is false" % len(a["calls"]))
        ids = [c.get("id") for c in a["calls"]]
        if len(set(ids)) != len(ids):
            bad.append("call ids repeat: %s" % ids)
        bad += [why for why in (check_call(c, names) for c in a["calls"]) if why]
    return got, bad


ALL = set(PARAMS)
for key, names, single in [("required", ALL, False), ("required_stream", ALL, False),
                           ("named", {"get_time"}, True), ("named_stream", {"get_time"}, True)]:
    got, bad = check_answers(key, names, single)
    t.ok(len(got) == 6 and not bad, "tool_choice %s: %d answers, each tool calls whose arguments validate %s"
         % (key.replace("_", " "), len(got), bad[:3]))
n_calls = sum(len(a.get("calls") or []) for a in out.get("required", []) + out.get("required_stream", []))
t.ok(n_calls > 12, "parallel tool calls come: %d calls in 12 answers" % n_calls)
pieces = [(a.get("chunks"), a.get("pieces")) for a in out.get("required_stream", []) + out.get("named_stream", [])]
t.ok(pieces and all(p > len(a["calls"]) and q > 0 for (p, q), a in
                    zip(pieces, out.get("required_stream", []) + out.get("named_stream", []))),
     "streamed calls arrive as delta.tool_calls chunks, a call's head then its arguments in pieces: %s" % pieces)
helper = out.get("helper") or {}
t.ok(helper.get("finish") == "tool_calls" and helper.get("calls")
     and not [c for c in helper["calls"] if check_call(c, ALL)],
     "the SDK's stream helper folds the streamed calls into message.tool_calls: %s" % helper)
t.ok((out.get("history") or {}).get("finish") in ("stop", "length", "tool_calls"),
     "a history with an assistant's tool_calls and a tool's answer is served: %s" % out.get("history"))

answers = out.get("schemas") or []
bad = []
for k, schema in enumerate(schemas):
    for i, a in enumerate(answers[k * PER_SCHEMA:(k + 1) * PER_SCHEMA]):
        try:
            if a.get("finish") != "stop":
                raise ValueError("finish_reason %s" % a.get("finish"))
            jsonschema.validate(json.loads(a["content"]), schema)
        except Exception as e:
            bad.append("schema %d answer %d (%s): %r: %s" % (k, i, "streamed" if i % 2 else "whole",
                                                              (a.get("content") or "")[:120], str(e)[:200]))
t.ok(len(answers) == 20 * PER_SCHEMA and not bad,
     "response_format json_schema: %d answers to 20 schemas, streamed and not, all end by the grammar, parse and "
     "validate with jsonschema %s" % (len(answers), bad[:3]))
jo = out.get("json_object") or []
t.ok(len(jo) == 3 and all(a.get("finish") == "stop" and isinstance(json.loads(a["content"]), dict) for a in jo),
     "response_format json_object: a JSON object each time")
ref = out.get("refused") or {}
t.ok(ref.get("status") == 400 and ref.get("param") == "response_format.json_schema.schema"
     and "minProperties" in ref.get("message", ""),
     "a schema keyword not enforced is a 400 naming it: %s" % ref)

# --- the completions endpoint, and refusals, with curl ---
s, _, b = curl(URL + "/v1/completions", data={"model": "m", "prompt": "x", "max_tokens": 64, "seed": 3,
                                              "grammar": 'root ::= ("yes" | "no") " " [0-9]{2,3}'})
txt = json.loads(b)["choices"][0]["text"] if s == 200 else None
t.ok(s == 200 and txt is not None and __import__("re").fullmatch(r"(yes|no) [0-9]{2,3}", txt),
     "completions: a GBNF grammar holds the text: %r" % txt)
s, _, b = curl(URL + "/v1/completions", data={"model": "m", "prompt": "x", "max_tokens": 300,
                                              "response_format": {"type": "json_schema", "json_schema": {
                                                  "name": "n", "schema": schemas[0]}}})
ok = False
if s == 200:
    try:
        jsonschema.validate(json.loads(json.loads(b)["choices"][0]["text"]), schemas[0])
        ok = True
    except Exception:
        pass
t.ok(ok, "completions: response_format json_schema holds the text too")
for body, param, needle in [
        ({"grammar": "root ::= undefined"}, "grammar", "undefined"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
          "tool_choice": "required"}, "tools", "'not'"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
         "nope"),
        ({"functions": [{"name": "f"}]}, "functions", "not supported"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": "yes",
                                                                     "schema": {"type": "object"}}}},
         "response_format.json_schema.strict", "boolean"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]}, "tools[0].function.strict",
         "boolean")]:
    s, _, b = curl(URL + "/v1/chat/completions", data=dict({"model": "m", "messages": [
        {"role": "user", "content": "hi"}]}, **body))
    e = json.loads(b).get("error", {}) if s else {}
    t.ok(s == 400 and e.get("param") == param and needle in e.get("message", ""),
         "400 naming %s: %s" % (param, e))

w.terminate()
w.wait(timeout=30)

# --- a thinking model's reasoning goes to reasoning_content: DeepSeek-R1's
# template opens <think> in the prompt; a grammar makes the random model
# close it and answer ---
tmpl = open(os.path.join(os.path.dirname(__file__), "..", "fixtures", "templates",
                         "deepseek-r1-distill-qwen-32b.jinja")).read()
r1 = gen_model(os.path.join(d, "r1.gguf"), dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512, ctx=1024,
               type="f32", seed=5, chat_template=tmpl)
port = free_port()
URL = "http://127.0.0.1:%d" % port
w = spawn([INFERGATE, "worker", "--model", r1, "--model-name", "m", "--listen", "tcp:127.0.0.1:%d" % port,
           "--threads", "2"], os.path.join(d, "w2.log"))
wait_until(lambda: curl(URL + "/health", timeout=2)[0] == 200 or w.poll() is not None, 60, "worker health")
think = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "seed": 4,
         "grammar": 'root ::= [a-z ]{3,20} "</think>" "\\n\\n" [a-z]{1,10}'}
s, _, b = curl(URL + "/v1/chat/completions", data=think)
msg = json.loads(b)["choices"][0]["message"] if s == 200 else {}
s2, _, b2 = curl(URL + "/v1/chat/completions", data=dict(think, stream=True))
deltas = [json.loads(x[6:])["choices"][0]["delta"] for x in b2.decode().split("\n\n")
          if x.startswith("data: {")] if s2 == 200 else []
t.ok(__import__("re").fullmatch(r"[a-z ]{3,20}", msg.get("reasoning_content") or "")
     and __import__("re").fullmatch(r"[a-z]{1,10}", msg.get("content") or ""),
     "reasoning_content holds the thinking, content the answer: %d %s" % (s, msg or b[:300]))
t.ok("".join(x.get("reasoning_content", "") for x in deltas) == msg.get("reasoning_content")
     and "".join(x.get("content") or "" for x in deltas) == msg.get("content"),
     "streamed: delta.reasoning_content then delta.content, the same texts")
w.terminate()
w.wait(timeout=30)

# --- gpt-oss's harmony channels: the model's own template (tools in the
# prompt); a grammar makes the random model write an analysis and a final
# message, and tool_choice required a commentary message to a function ---
tmpl = open(os.path.join(os.path.dirname(__file__), "..", "fixtures", "templates", "gpt-oss-120b.jinja")).read()
oss = gen_model(os.path.join(d, "oss.gguf"), dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=512, ctx=2048,
                type="f32", seed=5, chat_template=tmpl)
port = free_port()
URL = "http://127.0.0.1:%d" % port
w = spawn([INFERGATE, "worker", "--model", oss, "--model-name", "m", "--listen", "tcp:127.0.0.1:%d" % port,
           "--threads", "2"], os.path.join(d, "w3.log"))
wait_until(lambda: curl(URL + "/health", timeout=2)[0] == 200 or w.poll() is not None, 60, "worker health")


def sse(b):
    return [json.loads(x[6:])["choices"][0] for x in b.decode().split("\n\n")
            if x.startswith("data: {") and json.loads(x[6:])["choices"]]


hm = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 120, "seed": 4,
      "grammar": 'root ::= "<|channel|>analysis<|message|>" [a-z ]{3,20} '
                 '"<|end|><|start|>assistant<|channel|>final<|message|>" [a-z]{1,10}'}
s, _, b = curl(URL + "/v1/chat/completions", data=hm)
msg = json.loads(b)["choices"][0]["message"] if s == 200 else {}
s2, _, b2 = curl(URL + "/v1/chat/completions", data=dict(hm, stream=True))
deltas = [c["delta"] for c in sse(b2)] if s2 == 200 else []
t.ok(__import__("re").fullmatch(r"[a-z ]{3,20}", msg.get("reasoning_content") or "")
     and __import__("re").fullmatch(r"[a-z]{1,10}", msg.get("content") or ""),
     "harmony: the analysis channel is reasoning_content, the final one content: %d %s" % (s, msg or b[:300]))
t.ok("".join(x.get("reasoning_content", "") for x in deltas) == msg.get("reasoning_content")
     and "".join(x.get("content") or "" for x in deltas) == msg.get("content"),
     "harmony streamed: the same reasoning and content")
# (gpt-oss's template writes every tool's description: Python's jinja2 fails without one too)
described = [dict(x, function=dict(x["function"], description=x["function"].get("description", "A tool")))
             for x in TOOLS]
call = {"model": "m", "max_tokens": 200, "seed": 7, "tools": described, "tool_choice": "required",
        "messages": [{"role": "user", "content": "weather?"},
                     # content "": the template tests `"..." in message.content` (null fails in jinja2 too)
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
                     {"role": "user", "content": "and the weather?"}]}
s, _, b = curl(URL + "/v1/chat/completions", data=call)
ch = json.loads(b)["choices"][0] if s == 200 else {}
calls = (ch.get("message") or {}).get("tool_calls") or []
flat = [{"name": c["function"]["name"], "type": c.get("type"), "id": c.get("id", ""),
         "arguments": c["function"]["arguments"]} for c in calls]
t.ok(ch.get("finish_reason") == "tool_calls" and len(calls) == 1 and check_call(flat[0], PARAMS) is None,
     "harmony: tool_choice required gives a call whose arguments validate: %d %s" % (s, ch or b[:300]))
s2, _, b2 = curl(URL + "/v1/chat/completions", data=dict(call, stream=True))
chunks = sse(b2) if s2 == 200 else []
pieces = [tc for c in chunks for tc in (c["delta"].get("tool_calls") or [])]
args = "".join(p["function"].get("arguments") or "" for p in pieces)
t.ok(len(pieces) >= 2 and pieces[0].get("id") and pieces[0]["function"].get("name") == calls[0]["function"]["name"]
     and args == calls[0]["function"]["arguments"] and chunks[-1].get("finish_reason") == "tool_calls",
     "harmony streamed: the call's head, then its arguments in pieces, the same call; finish tool_calls")
# The history as the SDKs send it: the assistant's turn of tool calls with
# content null (the template reads it as "", which it takes for none).
with_null = dict(call, messages=[dict(m, content=None) if m.get("tool_calls") else m for m in call["messages"]])
s3, _, b3 = curl(URL + "/v1/chat/completions", data=with_null)
ch3 = json.loads(b3)["choices"][0] if s3 == 200 else {}
strip = lambda c: [(x["function"]["name"], x["function"]["arguments"]) for x in (c.get("message") or {}).get("tool_calls") or []]
t.ok(s3 == 200 and strip(ch3) == strip(ch) and strip(ch),
     "harmony: a tool-call turn with content null renders as with \"\", the same call (%d %s)" % (s3, b3[:200]))
t.finish()
