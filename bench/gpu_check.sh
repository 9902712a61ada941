#!/bin/bash
# One call's worth of GPU checks, for the device machine (see bench/RESULTS.md,
# "CUDA"): the machine, every unit test binary (test_cuda_kernels among them),
# bench_cuda, a CUDA worker end to end (generate on cpu and cuda, then a
# worker serving streamed and whole completions over h2c), the prefix cache
# on the GPU (bench/prefix_check.sh: the same answers with it and without,
# cached tokens reported), the GPU's power read through NVML
# (bench/power_check.sh), and
# tests/integration/test_worker.py with CUDA workers.
#
#   bench/gpu_check.sh [--bin DIR] [--steps "env unit cuda bench e2e prefix power worker"] [--reps N]
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
steps="env unit cuda bench e2e prefix power worker"
reps=7
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) bin=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    *) echo "usage: $0 [--bin DIR] [--steps LIST] [--reps N]" >&2; exit 2 ;;
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
note() { summary+=("$(printf '%-28s %s' "$1" "$2")"); }

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
        done
        ;;
    cuda)
        if ! run_step test_cuda_kernels 300 "$bin/test_cuda_kernels"; then
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
    esac
done
printf '%s\n' "${summary[@]}" >"$out/summary.txt"
tar czf "$dest/logs.tgz" -C "$out" .
cp "$out"/summary.txt "$out"/bench_cuda.log "$out"/test_cuda_kernels.log "$dest/" 2>/dev/null
rm -rf "$out"
echo "== gpu_check summary (logs in $dest)"
printf '%s\n' "${summary[@]}"
