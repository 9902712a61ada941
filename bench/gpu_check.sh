#!/bin/bash
# One call's worth of GPU checks, for the device machine (see bench/RESULTS.md,
# "CUDA"): the machine, every unit test binary (test_cuda_kernels among them),
# bench_cuda, a CUDA worker end to end (generate on cpu and cuda, then a
# worker serving streamed and whole completions over h2c), the prefix cache
# on the GPU (bench/prefix_check.sh: the same answers with it and without,
# cached tokens reported), the GPU's power read through NVML
# (bench/power_check.sh), tests/integration/test_worker.py with CUDA
# workers, and every architecture of `infergate model gen --arch` on the GPU
# against the CPU (step arch: the logits of a short and a long prompt,
# cosine >= 0.9999 with F16 weights and KV cache and the norms' ratio as
# close to 1 as that cosine allows, one line per case). A failed unit,
# cuda or arch step fails the script.
#
#   bench/gpu_check.sh [--bin DIR] [--steps "env unit cuda bench e2e prefix power worker arch"] [--reps N]
#                      [--devices "cpu cuda"]
#
# --devices: the reference device and the one checked against it in step
# arch ("cpu cpu" runs the step's CPU half on a machine without a GPU).
#
# DIR holds the binaries and the CUDA plugin they load from their own folder
# (default .gpu/bin, made by bench/gpu_pack.sh, with their libraries in
# DIR/../lib). Logs go to $OUT (default /tmp/gpu-check):
# bench_cuda.log and test_cuda_kernels.log as they are, all of them in
# logs.tgz (the device tool brings back at most 8 files).
# Each step runs under a time limit; the script goes on after a failure and
# prints a summary table last.
set -u
bin=.gpu/bin
steps="env unit cuda bench e2e prefix power worker arch"
reps=7
devices="cpu cuda"
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) bin=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    *) echo "usage: $0 [--bin DIR] [--steps LIST] [--reps N] [--devices \"REF DEV\"]" >&2; exit 2 ;;
    esac
done
dest=${OUT:-/tmp/gpu-check}
out=$(mktemp -d)
mkdir -p "$dest"
bin=$(cd "$bin" && pwd)
cublas=$(ldconfig -p | awk '/libcublas.so.13 / { print $NF; exit }')
[ -n "$cublas" ] || cublas=$(find / -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$bin/../lib${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary=()
failed=0
note() { summary+=("$(printf '%-28s %s' "$1" "$2")"); }

# The cases of step arch: the least cosine, then an architecture (every
# name of `model gen --arch`) and its `model gen` options. F16 weights at
# 0.9999; then Q8_0, where gpt-oss's experts are MXFP4, at 0.999 (the CPU
# quantizes the activations of quantized dots, the GPU's grouped expert
# products and large batches take them as floats). Sliding windows of 16
# positions, so that both prompts pass the window; phi3 with a context of
# 256 (original 64) turns the long prompt by its long factors and the short
# one by its short ones. gemma2's soft-caps of 2 and 5 act on these small
# models (its usual 50 and 30 would not); gemma3 with 7 layers has a global
# layer (no window, linear RoPE scaling) among its local ones (a pattern of 6).
arch_cases=(
    "0.9999 llama" "0.9999 qwen2" "0.9999 qwen3" "0.9999 qwen3moe --experts 8 --experts-used 2"
    "0.9999 mixtral --experts 4 --experts-used 2" "0.9999 gemma2 --swa 16 --softcap 2,5"
    "0.9999 gemma3 --swa 16 --layers 7"
    "0.9999 phi3 --swa 16 --ctx 256" "0.9999 gpt-oss --experts 4 --experts-used 2 --swa 16" "0.9999 granite"
    "0.9999 granitemoe" "0.9999 olmo2" "0.9999 smollm3" "0.9999 mistral3"
    "0.999 gpt-oss --experts 4 --experts-used 2 --swa 16 --type q8_0" "0.999 qwen3moe --type q8_0"
    "0.999 gemma3 --swa 16 --layers 7 --type q8_0"
)

# cosine of two files of one number a line, then the second's norm over the
# first's (the overall scale the cosine ignores: a skipped logit_scale or
# soft-cap); "nan nan" when either is empty
cosine() {
    paste "$1" "$2" | awk '{ d += $1 * $2; a += $1 * $1; b += $2 * $2; n++ }
        END { if (n == 0 || a == 0 || b == 0) print "nan nan"
              else printf "%.7f %.7f\n", d / sqrt(a * b), sqrt(b / a) }'
}

# One architecture on the two devices: prompts of 20 and 200 tokens (with
# 8 heads, the attention kernel splits the keys of the short one on a GPU
# of more than 80 SMs, not of the long one), the logits after each prompt
# (the gate: a cosine under the case's, a norm ratio off 1 by more than
# sqrt(2 (1 - that cosine)), the relative error such a cosine allows, or a
# failed run fails the step) and 16
# greedy tokens (reported: a near tie may flip one; test_cuda_kernels'
# test_model_archs checks teacher-forced decode steps).
arch_check() { # min-cosine name gen-options...
    local min=$1 name=$2; shift 2
    local type
    type=$(grep -o -- '--type [a-z0-9_]*' <<<"$*" | tail -1 | cut -c8-)
    local tag=$name${type:+-$type} ref=${devices%% *} dev=${devices##* } line="" bad=0
    local m="$models/arch-$tag.gguf" # not in $out: the logs' tarball stays small
    # F16 unless the case names a type (the last --type wins)
    if ! "$bin/infergate" model gen --arch "$name" --type f16 "$@" --out "$m" >"$out/arch-$tag.log" 2>&1; then
        printf '%-16s FAIL: model gen (see arch-%s.log)\n' "$tag" "$tag"
        return 1
    fi
    for len in 20 200; do
        local prompt
        prompt=$(seq -s, 300 $((300 + len - 1)))
        for d in $ref $dev; do
            timeout 120 "$bin/infergate" generate --model "$m" --prompt-tokens "$prompt" -n 16 --ignore-eos \
                --show-tokens --device "$d" --dump-logits "$out/arch-$tag-$len-$d.logits" \
                >"$out/arch-$tag-$len-$d.txt" 2>&1 || echo "exit $?" >>"$out/arch-$tag-$len-$d.txt"
        done
        local cos ratio same
        read -r cos ratio < <(cosine "$out/arch-$tag-$len-$ref.logits" "$out/arch-$tag-$len-$dev.logits" \
            2>/dev/null || echo nan nan)
        if diff -q <(grep '^tokens:' "$out/arch-$tag-$len-$ref.txt") <(grep '^tokens:' "$out/arch-$tag-$len-$dev.txt") \
            >/dev/null 2>&1 && grep -q '^tokens:' "$out/arch-$tag-$len-$dev.txt"; then
            same="same"
        else
            same="differ"
        fi
        awk -v c="$cos" -v r="$ratio" -v min="$min" 'BEGIN { d = r - 1; if (d < 0) d = -d
            exit !(c + 0 >= min + 0 && c != "nan" && r != "nan" && r != "" && d <= max_scale(min)) }
            function max_scale(m) { return sqrt(2 * (1 - m)) }' || bad=1
        line+=" prompt $len: cosine $cos, norm $dev / $ref $ratio, 16 greedy tokens $same;"
    done
    local max_scale
    max_scale=$(awk -v m="$min" 'BEGIN { printf "%.4f", sqrt(2 * (1 - m)) }')
    printf '%-16s %s (cosine >= %s, norm ratio within %s of 1)%s\n' "$tag" \
        "$([ $bad = 0 ] && echo ok || echo FAIL)" "$min" "$max_scale" "$line"
    if [ $bad != 0 ]; then
        for f in "$out"/arch-"$tag"-*-"$dev".txt; do tail -3 "$f" | sed "s|^|    $(basename "$f"): |"; done
    fi
    return $bad
}

run_step() { # name limit_s cmd...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    note "$name" "rc=$rc ($((SECONDS - t0)) s)"
    return $rc
}

for step in $steps; do
    case $step in
    env)
        { nvidia-smi; nvidia-smi -L; cat /etc/os-release; nproc; echo "cublas: $cublas";
          for t in curl nghttp python3 compute-sanitizer; do printf '%s: %s\n' $t "$(command -v $t)"; done;
          ldd "$bin/infergate" "$bin/test_cuda_kernels" "$bin/libinfergate_cuda.so" | grep -i 'not found'; } >"$out/env.log" 2>&1
        note env "$(nvidia-smi -L | head -1)"
        ;;
    prefix)
        # issue 30: the prefix cache's blocks in device memory
        run_step prefix_cache 300 bash bench/prefix_check.sh "$bin" cuda "$out/prefix"
        note "prefix cache cuda" "$(tail -1 "$out/prefix_cache.log")"
        ;;
    power)
        # issue 31: a GPU worker's energy from NVML's reading, not its configured power_watts
        run_step power_nvml 300 bash bench/power_check.sh "$bin" 0 "$out/power"
        note "power via NVML" "$(head -1 "$out/power_nvml.log")"
        ;;
    worker)
        # tests/integration/test_worker.py with its workers on the GPU
        INFERGATE_TEST_DEVICE=cuda PYTHONUNBUFFERED=1 run_step test_worker_cuda 300 \
            python3 tests/integration/test_worker.py "$bin/infergate"
        ;;
    unit)
        for t in "$bin"/test_*; do
            [ "$(basename "$t")" = test_cuda_kernels ] && continue
            run_step "$(basename "$t")" 300 "$t"
            rc=$?
            # 77: a test that skips (no network, no Node ...) is no failure
            [ $rc = 0 ] || [ $rc = 77 ] || failed=1
        done
        ;;
    cuda)
        # on the GPU a skip (77) fails too: it means the device was not found
        if ! run_step test_cuda_kernels 300 "$bin/test_cuda_kernels"; then
            failed=1
            run_step cuda_memcheck 300 compute-sanitizer --tool memcheck "$bin/test_cuda_kernels"
        fi
        ;;
    bench)
        run_step bench_cuda 480 "$bin/bench_cuda" --reps "$reps" --dir /tmp/infergate-bench
        ;;
    e2e)
        m=/tmp/e2e.gguf
        "$bin/infergate" model gen --out $m --dim 512 --layers 4 --heads 8 --kv-heads 4 --ffn 1408 \
            --vocab 4096 --type q8_0 >"$out/e2e.log" 2>&1
        for dev in cpu cuda; do
            "$bin/infergate" generate --model $m --prompt-tokens 1,300,301,450,17 -n 32 \
                --ignore-eos --show-tokens --device $dev >"$out/gen_$dev.txt" 2>&1
        done
        cat "$out"/gen_*.txt >>"$out/e2e.log"
        if diff <(grep "^tokens:" "$out/gen_cpu.txt") <(grep "^tokens:" "$out/gen_cuda.txt") >>"$out/e2e.log"; then
            note "e2e generate cpu==cuda" ok
        else
            note "e2e generate cpu==cuda" DIFFER
        fi
        sock=/tmp/e2e-worker.sock
        rm -f $sock
        "$bin/infergate" worker --model $m --listen unix:$sock --device cuda --max-seqs 32 \
            >"$out/worker.log" 2>&1 &
        wpid=$!
        for _ in $(seq 100); do [ -S $sock ] && break; sleep 0.1; done
        body='{"model":"e2e","prompt":[1,300,301,450,17],"max_tokens":32,"temperature":0,"ignore_eos":true}'
        curl -sS --http2-prior-knowledge --unix-socket $sock -H 'content-type: application/json' \
            -d "$body" http://localhost/v1/completions >"$out/worker_whole.json" 2>&1
        curl -sS -N --http2-prior-knowledge --unix-socket $sock -H 'content-type: application/json' \
            -d "${body%\}},\"stream\":true}" http://localhost/v1/completions >"$out/worker_stream.txt" 2>&1
        curl -sS --http2-prior-knowledge --unix-socket $sock http://localhost/internal/stats \
            >"$out/worker_stats.json" 2>&1
        kill -TERM $wpid
        wait $wpid
        wrc=$?
        note "e2e worker" "whole=$(wc -c <"$out/worker_whole.json")B stream=$(grep -c '^data:' "$out/worker_stream.txt") events, exit=$wrc"
        ;;
    arch)
        # every architecture's logits on the GPU against the CPU's
        n_bad=0
        models=$(mktemp -d)
        for case in "${arch_cases[@]}"; do
            # shellcheck disable=SC2086
            arch_check $case >"$out/arch-line.txt" || n_bad=$((n_bad + 1))
            tee -a "$out/arch.log" <"$out/arch-line.txt"
        done
        rm -rf "$models"
        if [ $n_bad = 0 ]; then
            note "arch $devices" "ok (${#arch_cases[@]} cases)"
        else
            note "arch $devices" "FAIL: $n_bad of ${#arch_cases[@]} cases"
            failed=1
        fi
        ;;
    esac
done
printf '%s\n' "${summary[@]}" >"$out/summary.txt"
tar czf "$dest/logs.tgz" -C "$out" .
cp "$out"/summary.txt "$out"/bench_cuda.log "$out"/test_cuda_kernels.log "$out"/arch.log "$dest/" 2>/dev/null
rm -rf "$out"
echo "== gpu_check summary (logs in $dest)"
printf '%s\n' "${summary[@]}"
exit $failed
