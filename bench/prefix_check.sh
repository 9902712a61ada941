#!/bin/bash
# The prefix cache on a device (issue 30), for bench/gpu_check.sh's `prefix`
# step: one worker with the cache and one without answer the same prompts,
# greedy; the answers must be the same, and the worker with the cache must
# report cached prompt tokens for a prompt sent again, one that extends it,
# one that shares only its start, and eight at once that share it (their
# blocks shared on the device while all eight run).
#
#   bench/prefix_check.sh BIN_DIR DEVICE OUT_DIR     (DEVICE cpu or cuda)
#
# Prints one line per check and "prefix check: ok" or "prefix check: FAIL";
# exit 0, or 1 on a failed check. Runs on the CPU too, to check the script.
set -u
bin=$1
dev=$2
out=$3
mkdir -p "$out"
m=$out/prefix.gguf
"$bin/infergate" model gen --out "$m" --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 512 \
    --vocab 4096 --type q8_0 >"$out/prefix_gen.log" 2>&1 || { echo "prefix check: model gen failed"; exit 1; }

# Prompts of token ids: a base of 160, the base and 48 more, the base's
# first 96 and others; each answer 16 tokens.
seq_json() { seq -s, "$1" "$2"; }
base=$(seq_json 300 459)
declare -A prompt=(
    [first]="$base"
    [again]="$base"
    [longer]="$base,$(seq_json 1000 1047)"
    [shares96]="$(seq_json 300 395),$(seq_json 2000 2063)"
)
order="first again longer shares96"
fail=0

ask() { # SOCK PROMPT OUTFILE
    curl -sS --max-time 120 --http2-prior-knowledge --unix-socket "$1" -H 'content-type: application/json' \
        -d "{\"model\":\"prefix\",\"prompt\":[$2],\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true}" \
        http://localhost/v1/completions >"$3" 2>&1
}

# TEXT CACHED of an answer, tab-separated; "ERROR ..." when it is not one.
answer_of() {
    python3 -c '
import json, sys
try:
    o = json.load(open(sys.argv[1]))
    u = o["usage"]
    print("%s\t%d" % (json.dumps(o["choices"][0]["text"]), u.get("prompt_tokens_details", {}).get("cached_tokens", 0)))
except Exception as e:
    print("ERROR %s: %s" % (e, open(sys.argv[1]).read()[:300]))' "$1"
}

for pc in true false; do
    sock=$out/prefix-$pc.sock
    rm -f "$sock"
    "$bin/infergate" worker --model "$m" --model-name prefix --listen "unix:$sock" --device "$dev" \
        --prefix-cache $pc --threads 2 >"$out/prefix_worker_$pc.log" 2>&1 &
    wpid=$!
    for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
    for name in $order; do
        ask "$sock" "${prompt[$name]}" "$out/prefix_${pc}_$name.json"
    done
    # eight at once, each the base and its own tail
    pids=()
    for i in $(seq 8); do
        ask "$sock" "$base,$(seq_json $((3000 + 10 * i)) $((3009 + 10 * i)))" "$out/prefix_${pc}_par$i.json" &
        pids+=($!)
    done
    wait "${pids[@]}"
    kill -TERM $wpid
    wait $wpid
done

for name in $order $(for i in $(seq 8); do echo par$i; done); do
    on=$(answer_of "$out/prefix_true_$name.json")
    off=$(answer_of "$out/prefix_false_$name.json")
    cached=${on##*$'\t'}
    verdict=ok
    case "$on$off" in *ERROR*) verdict="FAIL (no answer)" ;; esac
    [ "$verdict" = ok ] && [ "${on%%$'\t'*}" != "${off%%$'\t'*}" ] && verdict="FAIL (answers differ)"
    # every request after the first has at least the base's first 96 tokens cached
    [ "$verdict" = ok ] && [ "$name" != first ] && [ "$cached" -lt 96 ] && verdict="FAIL (cached $cached < 96)"
    [ "$verdict" = ok ] || fail=1
    printf 'prefix %-9s cached %-4s %s\n' "$name" "${cached:-?}" "$verdict"
done
if [ $fail = 0 ]; then echo "prefix check: ok"; else echo "prefix check: FAIL"; fi
exit $fail
