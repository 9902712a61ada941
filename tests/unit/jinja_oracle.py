#!/usr/bin/python3
"""Our Jinja renderer (runtime/jinja) against Python's Jinja2, as Hugging
Face's apply_chat_template sets it up, on the published chat templates in
tests/fixtures/templates and hundreds of random conversations each (system
prompts or none, tools, tool calls and their results, reasoning, odd
whitespace, Unicode, text that looks like control tokens): the output must
be byte for byte the same, a template error must be an error on both sides
(raise_exception's message the same), and the plain spans must lie in the
output. Also a set of small templates for the corners of the language.

usage: jinja_oracle.py JINJA_RENDER TEMPLATE_DIR [CASES_PER_TEMPLATE]
Exit 77 (skipped) without python3-jinja2."""
import json
import os
import random
import string
import subprocess
import sys
import tempfile
from datetime import datetime

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("python3-jinja2 is not installed: skipped")
    sys.exit(77)

NOW = 1735787045  # 2025-01-02 03:04:05 UTC: strftime_now's time on both sides
os.environ["TZ"] = "UTC"


class AssistantTracker(Extension):
    """Hugging Face's {% generation %}: for a prompt, its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

    def _gen(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def oracle(src, case):
    try:
        tmpl = ENV.from_string(src)
        return {"text": tmpl.render(**case.get("plain", {}), **case.get("trusted", {}))}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": "syntax: %s" % e, "syntax": True}
    except jinja2.exceptions.UndefinedError as e:
        return {"error": "undefined: %s" % e}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e), "raised": True}
    except Exception as e:  # TypeError and friends: a failed render too
        return {"error": "%s: %s" % (type(e).__name__, e)}


def ours(render, src_path, cases):
    lines = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
    p = subprocess.run([render, src_path], input=lines.encode(), capture_output=True, timeout=240)
    if p.returncode != 0:
        return [{"error": "parse: " + p.stderr.decode(errors="replace"), "parse": True}] * len(cases)
    return [json.loads(l) for l in p.stdout.decode().splitlines()]


# ---- random conversations ----

WORDS = ["hello", "world", "What", "is", "the", "weather", "in", "Paris", "?", "Sure", "thanks", "x", "42",
         "3.14", "café", "naïve", "日本語", "中文", "😀", "Ünïcödé", "tab\there", "quote\"d", "it's",
         "back\\slash", "<|im_start|>", "<|eot_id|>", "[INST]", "</s>", "<s>", "{{ x }}", "{% if %}",
         "<tool_call>", "</tool_call>", "<tool_response>", "\u00a0", "\u3000", "a\r\nb", "@user", "#tag",
         "[TOOL_CALLS]", "<|channel|>", "/think", "/no_think", "json", "null", "None", "True"]


def text(rng, allow_empty=True):
    r = rng.random()
    if allow_empty and r < 0.04:
        return ""
    if r < 0.10:
        return rng.choice(["  padded  ", "\n\nnewlines\n\n", " \t mixed \n", "\u00a0nbsp\u00a0", "trailing\n"])
    n = rng.randint(1, 12)
    s = " ".join(rng.choice(WORDS) for _ in range(n))
    if rng.random() < 0.2:
        s = "\n".join(s.split(" ", 2))
    return s


def schema(rng, depth=0):
    kinds = ["string", "integer", "number", "boolean"] + (["object", "array"] if depth < 2 else [])
    k = rng.choice(kinds)
    s = {"type": k}
    if rng.random() < 0.6:
        s["description"] = text(rng, False)
    if k == "string" and rng.random() < 0.3:
        s["enum"] = [rng.choice(["celsius", "fahrenheit", "kelvin", "a b", "é"]) for _ in range(rng.randint(1, 3))]
    if k == "number" and rng.random() < 0.3:
        s["minimum"] = rng.choice([0, 0.5, -1.25, 1e-7, 100.0])
    if k == "integer" and rng.random() < 0.3:
        s["default"] = rng.randint(-5, 100)
    if k == "object":
        props = {}
        for i in range(rng.randint(0, 3)):
            props[rng.choice(["a", "b", "city", "unit", "n_days", "q", "ü"]) + str(i)] = schema(rng, depth + 1)
        s["properties"] = props
        s["required"] = [p for p in props if rng.random() < 0.5]
    if k == "array":
        s["items"] = schema(rng, depth + 1)
    if rng.random() < 0.1:
        s["nullable"] = True
    return s


def tool(rng, i):
    props = {}
    for j in range(rng.randint(0, 4)):
        props[rng.choice(["location", "unit", "query", "count", "flag", "items"]) + str(j)] = schema(rng, 1)
    fn = {"name": rng.choice(["get_weather", "search", "calc", "send_email", "lookup"]) + "_%d" % i,
          "description": text(rng, False),
          "parameters": {"type": "object", "properties": props,
                         "required": [p for p in props if rng.random() < 0.5]}}
    return {"type": "function", "function": fn}


def value_for(rng, depth=0):
    r = rng.random()
    if r < 0.3 or depth > 2:
        return text(rng)
    if r < 0.45:
        return rng.randint(-1000, 1000)
    if r < 0.55:
        return rng.choice([0.5, 1e-5, 3.0, -2.75, 1e16, 123.456])
    if r < 0.62:
        return rng.choice([True, False, None])
    if r < 0.8:
        return [value_for(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice("abcdefg") + str(i): value_for(rng, depth + 1) for i in range(rng.randint(0, 3))}


def call_id(rng):
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(9))


def conversation(rng, tools, style):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng)})
    turns = rng.randint(1, 4)
    for t in range(turns):
        msgs.append({"role": "user", "content": text(rng)})
        last = t == turns - 1
        if last and rng.random() < 0.8:
            break
        if tools and rng.random() < 0.5:
            calls = []
            for _ in range(1 if style == "single_call" else rng.randint(1, 2)):
                fn = rng.choice(tools)["function"]
                args = {k: value_for(rng) for k in list(fn["parameters"]["properties"])[:3]}
                calls.append({"id": call_id(rng), "type": "function",
                              "function": {"name": fn["name"], "arguments": args}})
            m = {"role": "assistant", "tool_calls": calls}
            m["content"] = rng.choice(["", text(rng), None]) if style != "content_str" else text(rng)
            msgs.append(m)
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                             "content": rng.choice([text(rng), json.dumps({"temp": 21.5, "ok": True})])})
            if rng.random() < 0.5:
                continue
        a = {"role": "assistant", "content": text(rng)}
        if rng.random() < 0.25:
            a["content"] = "<think>\n" + text(rng) + "\n</think>\n\n" + text(rng)
        if rng.random() < 0.1:
            a["reasoning_content"] = text(rng)
        msgs.append(a)
    return msgs


FAMILIES = {  # file -> bos, eos, what its conversations may hold
    "llama-2-7b-chat.jinja": ("<s>", "</s>", {}),
    "llama-3.2-3b-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>", {"tools": True, "style": "single_call"}),
    "llama-3.3-70b-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>", {"tools": True, "style": "single_call"}),
    "qwen2.5-7b-instruct.jinja": ("", "<|im_end|>", {"tools": True}),
    "qwen3-0.6b.jinja": ("", "<|im_end|>", {"tools": True, "thinking": True, "style": "content_str"}),
    "hermes-3-llama-3.1-70b.tool_use.jinja": ("<|begin_of_text|>", "<|im_end|>", {"tools": True, "style": "content_str"}),
    "mixtral-8x7b-instruct-v0.1.jinja": ("<s>", "</s>", {}),
    "mistral-7b-instruct-v0.3.jinja": ("<s>", "</s>", {"tools": True}),
    "mistral-nemo-instruct-2407.jinja": ("<s>", "</s>", {"tools": True}),
    "mistral-small-3.2-24b-instruct-2506.jinja": ("<s>", "</s>", {"tools": True}),
    "gemma-2-2b-it.jinja": ("<bos>", "<eos>", {}),
    "gemma-3-4b-it.jinja": ("<bos>", "<eos>", {}),
    "phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>", {}),
    "phi-4-mini-instruct.jinja": ("<|endoftext|>", "<|endoftext|>", {"tools": True}),
    "gpt-oss-120b.jinja": ("<|startoftext|>", "<|return|>", {"tools": True, "style": "single_call"}),
    "granite-3.3-2b-instruct.jinja": ("", "<|end_of_text|>", {"tools": True}),
    "deepseek-r1-distill-qwen-32b.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", {"tools": True}),
    "deepseek-r1-distill-llama-8b.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", {}),
    "smollm3-3b.jinja": ("", "<|im_end|>", {"thinking": True}),
    "zephyr-7b-beta.jinja": ("<s>", "</s>", {}),
}


def case_for(rng, bos, eos, traits):
    tools = [tool(rng, i) for i in range(rng.randint(1, 3))] if traits.get("tools") and rng.random() < 0.5 else None
    msgs = conversation(rng, tools, traits.get("style"))
    plain = {"messages": msgs}
    if tools:
        plain["tools"] = tools
    if traits.get("thinking") and rng.random() < 0.5:
        plain["enable_thinking"] = rng.random() < 0.5
    trusted = {"bos_token": bos, "eos_token": eos, "add_generation_prompt": rng.random() < 0.85}
    return {"plain": plain, "trusted": trusted, "now": NOW}


# ---- the corners of the language ----

CORNERS = [
    "{{ 1.0 }} {{ 1e16 }} {{ 0.00001 }} {{ 10/4 }} {{ 7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ -7.5 // 2 }} {{ 7 % -3 }}",
    "{{ [1,'a',none,true, 2.5] }} {{ {'a': 'it\\'s', 'b': [1, (2, 3)]} }} {{ (1,) }} {{ () }}",
    "{{ 'abc'[::-1] }}|{{ 'abcdef'[1:4] }}|{{ 'héllo'[1] }}|{{ 'héllo'[-2:] }}|{{ [1,2,3,4][::2] }}|{{ [1,2,3][-1] }}",
    "{{ x }}|{{ x|length }}|{{ 'a' in x }}|{{ x is defined }}|{{ x|default('d') }}|{{ none|default('n') }}|{{ ''|default('e', true) }}",
    "{% for i in range(3) %}{% if i == 0 %}{% set y = 1 %}{% endif %}[{{ y }}]{% endfor %}|{{ y }}",
    "{% set x = 5 %}{% for i in range(3) %}{% if i == 0 %}{% set x = 1 %}{% endif %}[{{ x }}]{% endfor %}{{x}}",
    "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}",
    "{% macro m(a, b=2, c='z') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, c=3) }} {{ m(a=0, b=none) }}",
    "{% macro f(n) %}{% if n > 0 %}{{ n }},{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
    "{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'x': 1} %}{{ k }}{% endfor %}",
    "{% for x in [1,2,3,4,5] if x is odd %}{{ loop.index }}/{{ loop.length }}:{{ x }}{{ ',' if not loop.last }}{% endfor %}",
    "{% for x in [] %}no{% else %}empty{% endfor %}{% for x in 'ab' %}{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }}{% endfor %}",
    "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% set ns = namespace(a=1, b=[]) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}{{ ns.b }}",
    "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}",
    "{{ 'Hello'.upper() }}{{ 'Hello'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'|capitalize }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}",
    "{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'abc'|replace('b', '') }}|{{ 'ab'.replace('', '-') }}|{{ 'hello'.find('l') }}|{{ 'hello'.rfind('l') }}|{{ 'hello'.count('l') }}",
    "{{ [3,1,2]|sort }}|{{ ['b','A','c']|sort }}|{{ [1,2,2,3,1]|unique|list }}|{{ [1,2,3]|reverse|list }}|{{ 'abc'|reverse }}|{{ [1,2,3]|first }}{{ [1,2,3]|last }}",
    "{{ [1,2,3]|join(', ') }}|{{ [{'a': 1}, {'a': 2}]|map(attribute='a')|join }}|{{ ['a','b']|map('upper')|list }}|{{ [1,2,3]|sum }}|{{ [4,2,8]|max }}{{ [4,2,8]|min }}",
    "{{ [{'r': 'u', 'c': 1}, {'r': 'a', 'c': 2}, {'r': 'u', 'c': 3}]|selectattr('r', 'equalto', 'u')|map(attribute='c')|list }}|{{ [1,0,2]|select|list }}|{{ [1,2,3]|reject('odd')|list }}|{{ [{'x': 1}, {}]|rejectattr('x')|list }}",
    "{{ {'b': 1, 'a': 2}|dictsort }}|{{ {'b': 1, 'a': 2}|items|list }}|{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('z', 'd') }}|{{ {'a': 1}.keys()|list }}{{ {'a': 1}.values()|list }}",
    "{{ {'a': [1, 2.5, none, true, 'é\\n\"'], 'b': {}}|tojson }}|{{ {'a': [1, {'b': []}]}|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ [1,2]|tojson(separators=(',', ':')) }}",
    "{{ '42'|int }}{{ '3.5'|float }}{{ 3.7|int }}{{ 'x'|int(7) }}{{ -3|abs }}{{ 2.5|round }}{{ '  x  '|trim }}{{ 'xax'|trim('x') }}{{ 1|string }}{{ none|string }}",
    "{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' ~ 1 ~ none ~ true }}{{ 'x' * 3 }}{{ [1] * 2 }}{{ true + 1 }}",
    "{{ none is none }}{{ 1 is number }}{{ 1.5 is float }}{{ true is boolean }}{{ 'a' is string }}{{ {} is mapping }}{{ 'a' is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ x is undefined }}{{ true is sameas true }}{{ 1 is in [1] }}{{ 'ab' is lower }}",
    "{{ a or b }}|{{ a and b }}|{{ 0 or 'z' }}|{{ [] or [1] }}|{{ 'q' if x else 'r' }}|{{ 'q' if x }}|{{ not x }}",
    "  {% if true %}\n    indented\n  {% endif %}\n{%- if true %} stripped {% endif -%}\n  after\n{# comment #}\n  {#- dash #}x{%+ if true %}plus{% endif +%}\n",
    "line1\n  {{- 'a' -}}  \n  line2 {{ 'b' }}\n{% raw %}{{ not parsed }}{% endraw %}\n{% set s %}block {{ 1 + 1 }}{% endset %}[{{ s }}]",
    "{{ \"\\u00e9\\x41\\n\\t\\\\\" }}|{{ 'a' 'b' }}|{{ \"q'\" }}|{{ 'tab\\there' }}|{{ '\\d' }}",
    "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
    "{{ x.y }}", "{{ x + 'a' }}", "{{ none + 1 }}", "{{ raise_exception('boom: ' ~ 42) }}", "{{ [1][5] }}|{{ {'a':1}.b }}|{{ none.x }}",
    "{{ 1 / 0 }}", "{% for x in none %}{% endfor %}", "{{ range(200000)|length }}", "{{ 'abc'|items|list }}",
    "{% for m in msgs %}{{ m.content }}{% endfor %}", "{{ msgs|length }}{{ msgs[0] == msgs[1] }}{{ msgs[0] is mapping }}",
    "{{ strftime_now('%Y-%m-%d %H:%M %d %b %B %A') }}",
    "{{ 'x'|indent }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(1, blank=true) }}",
    "{{ 'a\\nb\\r\\nc'.splitlines() }}{{ '12'.isdigit() }}{{ 'ab1'.isalpha() }}{{ ' '.join(['x', 'y']) }}{{ 'A'.islower() }}",
    "{{ -2 ** 2 }}{{ (-2) ** 2 }}{{ 2 ** -1 }}{{ 5 - -3 }}{{ +3 }}{{ - 'x'|length }}",
    "{% if x is not defined and y is not defined %}ok{% elif z %}no{% else %}else{% endif %}",
    "{{ loop }}{% for i in [1] %}{{ loop.cycle('a', 'b') }}{{ loop.depth }}{{ loop.first }}{% endfor %}",
    "{{ [1, 2, 3][1:] }}{{ 'ab'[5:] }}{{ [1,2,3][-5:-1] }}{{ [1,2,3][:: -1] }}{{ 'abc'[10] }}",
    "{{ {'items': 5}['items'] }}|{{ {'a': 1}['items'] is callable }}|{{ {'x': 1}.x }}",
    "{% for x in [3] %}{% set n = x %}{% endfor %}{{ n }}",
]


def corner_cases():
    msgs = [{"role": "user", "content": "hi <|im_start|>"}, {"role": "user", "content": "hi <|im_start|>"}]
    return [(src, {"plain": {"msgs": msgs}, "trusted": {}, "now": NOW}) for src in CORNERS]


def compare(name, src, case, want, got):
    if "text" in want:
        if "text" not in got:
            return "%s: jinja2 rendered, we failed: %s" % (name, got.get("error"))
        if got["text"] != want["text"]:
            w, g = want["text"], got["text"]
            i = next((k for k in range(min(len(w), len(g))) if w[k] != g[k]), min(len(w), len(g)))
            return "%s: differs at %d:\n  jinja2: %r\n  ours:   %r\n  case: %s" % (
                name, i, w[max(0, i - 60):i + 60], g[max(0, i - 60):i + 60], json.dumps(case)[:2000])
        n = len(got["text"].encode())
        last = 0
        for off, ln in got["plain"]:
            if off < last or off + ln > n or ln <= 0:
                return "%s: bad plain spans %r (output %d bytes)" % (name, got["plain"], n)
            last = off + ln
        return None
    if "text" in got:
        return "%s: jinja2 failed (%s), we rendered %r; case %s" % (name, want["error"], got["text"][:300],
                                                                   json.dumps(case)[:1500])
    if want.get("raised") and got.get("error") != want["error"]:
        return "%s: raise_exception said %r, we said %r" % (name, want["error"], got.get("error"))
    return None


def main():
    render, tdir = sys.argv[1], sys.argv[2]
    per = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    failures, renders, errors_both = [], 0, 0
    for fname, (bos, eos, traits) in sorted(FAMILIES.items()):
        path = os.path.join(tdir, fname)
        src = open(path, encoding="utf-8").read()
        rng = random.Random(fname)
        cases = [case_for(rng, bos, eos, traits) for _ in range(per)]
        got = ours(render, path, cases)
        ok = 0
        for case, g in zip(cases, got):
            want = oracle(src, case)
            err = compare(fname, src, case, want, g)
            renders += 1
            if err:
                failures.append(err)
            elif "text" in want:
                ok += 1
            else:
                errors_both += 1
        print("%-45s %4d rendered the same, %4d failed on both sides" % (fname, ok, per - ok), flush=True)
    with tempfile.TemporaryDirectory() as d:
        for i, (src, case) in enumerate(corner_cases()):
            path = os.path.join(d, "corner%d.jinja" % i)
            with open(path, "w", encoding="utf-8") as f:
                f.write(src)
            want = oracle(src, case)
            got = ours(render, path, [case])[0]
            err = compare("corner %d (%s)" % (i, src[:50]), src, case, want, got)
            renders += 1
            if err:
                failures.append(err)
    for f in failures[:30]:
        print("FAIL", f)
    print("%d renders, %d failures (%d cases failed on both sides)" % (renders, len(failures), errors_both))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
