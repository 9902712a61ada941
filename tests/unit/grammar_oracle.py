#!/usr/bin/python3
"""Grammar-constrained answers (runtime/grammar) against Python's
jsonschema (Debian's python3-jsonschema), a validator that is not ours.

A "model" that picks uniformly among the tokens the grammar allows (as the
synthetic random-weight model does; tests/tools/grammar_sample) writes 10
answers to each of 20 schemas of the kinds OpenAI's strict mode, Pydantic
and zod produce, and to random schemas: every answer must end by the
grammar (not by max_tokens), parse as JSON and validate. Keywords we do not
enforce must be refused by name; GBNF grammars must hold too.

usage: grammar_oracle.py GRAMMAR_SAMPLE INFERGATE
Exit 77 (skipped) without python3-jsonschema."""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed: skipped")
    sys.exit(77)

S = lambda n=12, **kw: dict({"type": "string", "maxLength": n}, **kw)

SCHEMAS = [
    # OpenAI strict mode: every property required, no additional ones
    {"type": "object", "properties": {"name": S(), "age": {"type": "integer"}}, "required": ["name", "age"],
     "additionalProperties": False},
    # Pydantic: a model with optional fields, $defs and $ref
    {"$defs": {"Address": {"type": "object", "properties": {"city": S(10), "zip": S(5, minLength=5)},
                           "required": ["city"], "title": "Address"}},
     "type": "object", "title": "User",
     "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                    "address": {"$ref": "#/$defs/Address"},
                    "email": {"type": "string", "format": "email"}},
     "required": ["id", "address"]},
    # zod: nullable via anyOf, enums, arrays with bounds
    {"type": "object", "properties": {
        "status": {"type": "string", "enum": ["active", "inactive", "banned"]},
        "nickname": {"anyOf": [S(8), {"type": "null"}]},
        "scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 100},
                   "minItems": 1, "maxItems": 4}},
     "required": ["status", "nickname", "scores"], "additionalProperties": False},
    # formats
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                      "at": {"type": "string", "format": "date-time"},
                                      "t": {"type": "string", "format": "time"},
                                      "id": {"type": "string", "format": "uuid"}},
     "required": ["day", "at", "t", "id"]},
    # integer bounds, exclusive forms, negatives
    {"type": "array", "prefixItems": [{"type": "integer", "minimum": -50, "maximum": 50},
                                      {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
                                      {"type": "integer", "minimum": 1000},
                                      {"type": "integer", "maximum": -7}],
     "items": False},
    # number bounds
    {"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
                                      "t": {"type": "number", "exclusiveMinimum": -273, "maximum": 1000},
                                      "n": {"type": "number", "exclusiveMaximum": 0}},
     "required": ["p", "t", "n"]},
    # const and enum of mixed values
    {"type": "object", "properties": {"v": {"const": "v1"}, "k": {"enum": [1, "two", None, True, [3], {"x": 4}]}},
     "required": ["v", "k"]},
    # recursion through $ref
    {"$defs": {"node": {"type": "object", "properties": {"label": S(4),
                                                          "children": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                       "maxItems": 2}},
                        "required": ["label"]}},
     "$ref": "#/$defs/node"},
    # oneOf of disjoint shapes
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 0,
                                                                                      "maximum": 99}},
                "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "integer", "minimum": 0,
                                                                                    "maximum": 99}},
                "required": ["kind", "w"], "additionalProperties": False}]},
    # type lists
    {"type": "object", "properties": {"x": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
                                      "y": {"type": ["string", "boolean"], "maxLength": 3}},
     "required": ["x", "y"]},
    # patterns (anchored)
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
                                      "hex": {"type": "string", "pattern": "^(0x)?[0-9a-f]{1,6}$"}},
     "required": ["code", "hex"]},
    # a map: additionalProperties as a schema
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}, "maxProperties": None},
    # strings with minimum lengths and Unicode
    {"type": "array", "items": S(6, minLength=2), "minItems": 2, "maxItems": 3},
    # nested objects and arrays
    {"type": "object", "properties": {
        "a": {"type": "object", "properties": {
            "b": {"type": "object", "properties": {"c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
                  "required": ["c"]}},
              "required": ["b"]},
        "d": {"type": "null"}},
     "required": ["a", "d"]},
    # allOf of one, descriptions and titles ignored
    {"allOf": [{"type": "object", "title": "T", "description": "d",
                "properties": {"q": S(5, description="x")}, "required": ["q"]}]},
    # booleans and empty schemas in properties
    {"type": "object", "properties": {"f": {"type": "boolean"}, "n": {"type": "null"}}, "required": ["f"]},
    # an array of enums
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 5},
    # integer with one bound
    {"type": "object", "properties": {"big": {"type": "integer", "minimum": 123456789}}, "required": ["big"]},
    # a tool call's shape (what tool_choice required forces)
    {"type": "object", "properties": {"name": {"const": "get_weather"},
                                      "arguments": {"type": "object", "properties": {
                                          "city": S(10), "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"], "additionalProperties": False}},
     "required": ["name", "arguments"], "additionalProperties": False},
    # prefixItems then items
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "boolean"}],
     "items": {"type": "integer", "minimum": 0, "maximum": 3}, "maxItems": 4},
    # pattern classes over " and \ (fuzz_grammar's second find: they were written raw)
    {"type": "object", "properties": {"p": {"type": "string", "pattern": "^[ -~]{1,8}$"},
                                      "b": {"type": "string", "pattern": "^[\\\\a]{2,6}$"}},
     "required": ["p", "b"], "additionalProperties": False},
    # a pattern's character past ASCII is one character (a CI fuzz find: its
    # bytes were written one literal each, no UTF-8, and {2} repeated a byte)
    {"type": "object", "properties": {"w": {"type": "string", "pattern": "^\u0764{2}[a-c]\u00e9$"}},
     "required": ["w"], "additionalProperties": False},
    # an enum of 300 values, prefixes shared (country-code-like) and UTF-8: one
    # parse stack per value passed the matcher's bound, and the mask allowed
    # tokens accept refused (enums are now written as prefix trees)
    {"type": "object", "properties": {"c": {"enum": ["%s%s" % (a, b) for a in "ABCDEFGHIJKLMNOPQRSTU" for b in "abcdefghijklmn"]
                                            + ["é", "éa", "eé", 1, 12, 1.5, None, "A"]}},
     "required": ["c"], "additionalProperties": False},
]
# maxProperties is not enforced: that schema is for the refusal checks
REFUSE_ONLY = {11}

REFUSED = [
    ({"type": "object", "minProperties": 1}, "minProperties"),
    ({"type": "number", "multipleOf": 3}, "multipleOf"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "string", "pattern": "abc"}, "anchored"),
    ({"type": "number", "minimum": 0.5}, "fractional"),
    ({"$ref": "http://example.com/s.json"}, "local"),
    ({"type": "string", "format": "hostname"}, "hostname"),
    ({"type": "object", "properties": {"a": {"type": "integer", "if": {}}}}, "'if' is not supported at #/properties/a"),
    # fuzz_grammar's first find: these went on to GBNF that did not compile
    ({"type": "string", "pattern": "^[A-Z]{-}02$"}, "repetition other than"),
    ({"type": "string", "pattern": "^a{3,1}$"}, "n below m"),
    ({"type": "string", "pattern": "^(*a)$"}, "nothing to repeat"),
    ({"type": "string", "pattern": "^a+?$"}, "nothing to repeat"),
    ({"type": "string", "pattern": "^[z-a]$"}, "end is before its start"),
    ({"type": "string", "pattern": "^[\\t]$"}, "class with \\t"),
]

GBNF = [
    ('root ::= "yes" | "no"', re.compile(r"^(yes|no)$")),
    ('root ::= [a-c]{2,4} "!"', re.compile(r"^[a-c]{2,4}!$")),
    ('root ::= item ("," item){0,3}\nitem ::= [0-9]+ | "x"', None),
    ('root ::= "é" [α-γ] .', re.compile(r"^é[α-γ].$", re.S)),
]


def random_schema(rng, depth=0):
    k = rng.choice(["string", "integer", "number", "boolean", "enum"] + (["object", "array"] if depth < 2 else []))
    if k == "string":
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 8)}
    if k == "integer":
        s = {"type": "integer"}
        if rng.random() < 0.7:
            a = rng.randint(-1000, 1000)
            s["minimum"] = a
            s["maximum"] = a + rng.randint(0, 2000)
        if rng.random() < 0.3:
            s["exclusiveMaximum"] = s.get("maximum", 0) + 1
        return s
    if k == "number":
        a = rng.randint(-10, 10)
        return {"type": "number", "minimum": a, "maximum": a + rng.randint(1, 20)}
    if k == "boolean":
        return {"type": "boolean"}
    if k == "enum":
        return {"enum": rng.sample(["x", "y", 1, 2.5, None, False, "z w"], rng.randint(1, 4))}
    if k == "object":
        props = {"p%d" % i: random_schema(rng, depth + 1) for i in range(rng.randint(0, 4))}
        return {"type": "object", "properties": props, "required": [p for p in props if rng.random() < 0.6],
                "additionalProperties": False}
    return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}


def run(sample, model, cases):
    lines = "".join(json.dumps(c) + "\n" for c in cases)
    p = subprocess.run([sample, model], input=lines.encode(), capture_output=True, timeout=240)
    if p.returncode:
        raise SystemExit("grammar_sample failed: %s" % p.stderr.decode()[-2000:])
    return [json.loads(l) for l in p.stdout.decode().splitlines()]


def main():
    sample, infergate = sys.argv[1], sys.argv[2]
    failures = []
    d = tempfile.mkdtemp()
    model = os.path.join(d, "m.gguf")
    subprocess.run([infergate, "model", "gen", "--out", model, "--dim", "64", "--layers", "1", "--heads", "2",
                    "--kv-heads", "2", "--ffn", "128", "--type", "f32", "--vocab", "4096"], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    V = jsonschema.Draft202012Validator
    fc = V.FORMAT_CHECKER
    rng = random.Random(7)
    schemas = [s for i, s in enumerate(SCHEMAS) if i not in REFUSE_ONLY]
    schemas += [random_schema(rng) for _ in range(30)]
    cases = [{"schema": s, "n": 10, "seed": i, "max_tokens": 1500} for i, s in enumerate(schemas)]
    answers = 0
    for i, (s, r) in enumerate(zip(schemas, run(sample, model, cases))):
        if "error" in r:
            failures.append("schema %d refused: %s\n  %s" % (i, r["error"], json.dumps(s)))
            continue
        for out, ended in zip(r["outputs"], r["ended"]):
            answers += 1
            try:
                v = json.loads(out)
                V(s, format_checker=fc).validate(v)
                if not ended:
                    raise ValueError("did not end by the grammar")
            except Exception as e:
                failures.append("schema %d: %s\n  answer %r\n  schema %s" % (i, str(e)[:300], out[:500], json.dumps(s)))
    print("%d constrained answers to %d schemas" % (answers, len(schemas)))
    for s, want in REFUSED + [(SCHEMAS[11], "maxProperties")]:
        r = run(sample, model, [{"schema": s, "n": 1}])[0]
        if "error" not in r or want not in r["error"]:
            failures.append("%s: not refused naming %r: %s" % (json.dumps(s), want, r))
    for g, pattern in GBNF:
        r = run(sample, model, [{"gbnf": g, "n": 20, "seed": 3, "max_tokens": 100}])[0]
        if "error" in r:
            failures.append("gbnf %r: %s" % (g, r["error"]))
            continue
        for out, ended in zip(r["outputs"], r["ended"]):
            if not ended or (pattern and not pattern.match(out)):
                failures.append("gbnf %r gave %r (ended %s)" % (g, out, ended))
    for g, want in [('root ::= x', "not defined"), ('root ::= root "a"', "without consuming"),
                    ('x ::= "a"', "root"), ('root ::= "a', "unterminated"), ('root ::= [b-a]', "range")]:
        r = run(sample, model, [{"gbnf": g, "n": 1}])[0]
        if "error" not in r or want not in r["error"]:
            failures.append("gbnf %r: not refused with %r: %s" % (g, want, r))
    for f in failures[:20]:
        print("FAIL", f)
    print("%d failures" % len(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
