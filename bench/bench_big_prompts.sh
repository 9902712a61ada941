#!/usr/bin/env bash
# Streams beside long prompts (issue 3, item 7): 16 closed-loop streaming
# clients (bench_loadgen: prompt 128 token ids, 128 new tokens) on the ~110M
# Q8_0 model, alone and then with a side client that posts a 256 KiB text
# prompt every 0.2 s (too long for the 2048-token context: the worker
# parses and encodes it, then answers 400). What the side load costs the
# streams is the figure: time per output token p99 and the level's wall
# time. Builds given with --infergate are run in turn, each for every
# repetition, so that they share the hour.
#
# Usage: bench/bench_big_prompts.sh [--reps N] --infergate BIN [--infergate BIN2 ...]
#   bench_loadgen is taken from the first BIN's directory.
set -euo pipefail

cd "$(dirname "$0")/.."
REPS=2
BINS=()
while [ $# -gt 0 ]; do
    case $1 in
    --reps) REPS=$2; shift 2 ;;
    --infergate) BINS+=("$(realpath "$2")"); shift 2 ;;
    *) echo "usage: $0 [--reps N] --infergate BIN [--infergate BIN2 ...]" >&2; exit 2 ;;
    esac
done
[ ${#BINS[@]} -gt 0 ] || BINS=("$(realpath build/infergate)")
LOADGEN=$(dirname "${BINS[0]}")/bench_loadgen
MODEL=/tmp/infergate-bench/synth-768-12-2048-32000-q8_0.gguf
if [ ! -f "$MODEL" ]; then
    mkdir -p "$(dirname "$MODEL")"
    "${BINS[0]}" model gen --out "$MODEL" --dim 768 --layers 12 --heads 12 --kv-heads 12 --ffn 2048 \
        --vocab 32000 --ctx 2048 --type q8_0 >/dev/null
fi

D=$(mktemp -d /tmp/infergate-bench-big-XXXXXX)
WP= SP=
cleanup() {
    [ -n "$SP" ] && kill "$SP" 2>/dev/null || true
    [ -n "$WP" ] && kill "$WP" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$D"
}
trap cleanup EXIT

# A 256 KiB prompt of English-like words (encodes to ~90k tokens).
/usr/bin/python3 - "$D/big.json" <<'EOF'
import json, random, sys
random.seed(1)
words = "the quick brown fox jumps over a lazy dog while infergate encodes long prompts".split()
text = " ".join(random.choice(words) for _ in range(60000))[:256 * 1024]
json.dump({"model": "m", "prompt": text, "max_tokens": 1}, open(sys.argv[1], "w"))
EOF

level() { # BIN SIDE
    local sock=$D/w.sock
    rm -f "$sock"
    "$1" worker --model "$MODEL" --model-name m --listen "unix:$sock" --threads 2 --max-seqs 32 \
        --max-queue 256 --kv-cache-mb 512 >"$D/worker.log" 2>&1 &
    WP=$!
    for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
    sleep 0.5
    if [ "$2" = 1 ]; then
        (for _ in $(seq 600); do
            curl -s -o /dev/null --http2-prior-knowledge --unix-socket "$sock" --max-time 30 \
                -H 'content-type: application/json' --data-binary @"$D/big.json" http://localhost/v1/completions
            sleep 0.2
        done) &
        SP=$!
    fi
    "$LOADGEN" --unix "$sock" --clients 16 --rounds 3 --prompt 128 --gen 128
    if [ -n "$SP" ]; then kill "$SP" 2>/dev/null || true; wait "$SP" 2>/dev/null || true; SP=; fi
    kill "$WP"; wait "$WP" 2>/dev/null || true; WP=
}

echo "model $MODEL, worker --threads 2 --max-seqs 32; 16 streaming clients, prompt 128, 128 new tokens"
for rep in $(seq "$REPS"); do
    for side in 0 1; do
        for b in "${BINS[@]}"; do
            echo "rep $rep, big prompts $side, $b: $(level "$b" "$side")"
        done
    done
done
