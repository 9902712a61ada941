#!/usr/bin/env bash
# CI fuzz smoke: builds every libFuzzer target of tests/fuzz/ (clang,
# -DINFERGATE_FUZZ=ON: ASan + UBSan + libFuzzer) and runs each one for a
# bounded time over a copy of its committed seed corpus (corpus_NAME/) with
# its dictionary (NAME.dict, where it has one), a few at a time. Any crash,
# sanitizer report, leak, per-input timeout or a run that does not finish
# fails the step, and the reproducer is printed: the kept file, its bytes
# (base64 and hex) and the command that replays it. The tree is not written
# to: corpora are copied to a temporary folder, findings kept in the build
# folder.
#
# Usage: tests/fuzz/smoke.sh [TARGET...]   (default: every fuzz_*.c)
# Environment: FUZZ_BUILD (build folder, default build-fuzz), FUZZ_SECONDS
# (per target, default 15: the seed corpus is replayed whole first, whatever
# the time, and the step checks it was), FUZZ_JOBS (targets at once, default 2),
# FUZZ_TIMEOUT (seconds one input may take, default 20), FUZZ_CMAKE_ARGS
# (more -D options for the build).
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
fuzz_dir=$src/tests/fuzz
build=${FUZZ_BUILD:-$src/build-fuzz}
secs=${FUZZ_SECONDS:-15}
jobs=${FUZZ_JOBS:-2}
per_input=${FUZZ_TIMEOUT:-20}
# A run past this is a hang the per-input timeout did not catch.
deadline=$((secs + per_input + 60))
start=$(date +%s)

if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in "$fuzz_dir"/fuzz_*.c; do
        targets+=("$(basename "$f" .c)")
    done
fi

# Every target needs seeds: a new parser's target joins with its corpus.
for t in "${targets[@]}"; do
    name=${t#fuzz_}
    if [ ! -f "$fuzz_dir/$t.c" ]; then
        echo "fuzz smoke: no target $t ($fuzz_dir/$t.c)" >&2
        exit 2
    fi
    if [ -z "$(ls -A "$fuzz_dir/corpus_$name" 2>/dev/null)" ]; then
        echo "fuzz smoke: $t has no seed corpus: add tests/fuzz/corpus_$name/" >&2
        exit 2
    fi
done

echo "fuzz smoke: building ${#targets[@]} targets in $build"
# shellcheck disable=SC2086 # FUZZ_CMAKE_ARGS is a list of options
CC=clang cmake -S "$src" -B "$build" -DINFERGATE_FUZZ=ON -DINFERGATE_CUDA=OFF ${FUZZ_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
built=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/infergate-fuzz-smoke-XXXXXX")
trap 'rm -rf "$work"' EXIT
keep=$build/fuzz-smoke-findings
rm -rf "$keep"

# One target: its own folder with the corpus copy, the log and any finding.
run_one() {
    local t=$1 name=${1#fuzz_} dir=$work/$1
    mkdir -p "$dir/corpus"
    cp -R "$fuzz_dir/corpus_$name/." "$dir/corpus/"
    local dict=()
    [ -f "$fuzz_dir/$name.dict" ] && dict=(-dict="$fuzz_dir/$name.dict")
    local rc=0
    (cd "$dir" && ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
        UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
        timeout -k 10 "$deadline" "$build/$t" -max_total_time="$secs" -timeout="$per_input" \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/" "${dict[@]}" corpus \
        >"$dir/log" 2>&1) || rc=$?
    echo "$rc" >"$dir/rc"
}

# A few at a time: wait -n for the first to end before starting another.
running=0
for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    echo "fuzz smoke: $t for ${secs}s"
    run_one "$t" &
    running=$((running + 1))
done
wait || true
end=$(date +%s)

stat_of() { # STAT LOG: libFuzzer's final stat::STAT figure
    sed -n "s/^stat::$1: *\([0-9]*\).*/\1/p" "$2" | tail -1
}

# Prints what replays a finding, from the log and the kept files.
show_finding() {
    local t=$1 dir=$work/$1 rc=$2
    echo
    echo "==== fuzz smoke: $t FAILED (exit $rc) ===="
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "the run did not end within ${deadline}s (a hang between inputs?)"
    fi
    echo "---- last lines of its log ----"
    tail -n 80 "$dir/log"
    local found=0
    for f in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* "$dir"/slow-unit-*; do
        [ -f "$f" ] || continue
        found=1
        local k
        k=$keep/$t-$(basename "$f")
        mkdir -p "$keep"
        cp "$f" "$k"
        echo "---- reproducer: $k ($(wc -c <"$k") bytes) ----"
        xxd "$k" | head -n 64
        echo "replay here:  $build/$t $k"
        echo "replay elsewhere (paste into a shell at the source root, after the build above):"
        echo "base64 -d > repro-$t <<'EOF'"
        base64 -w 76 "$k"
        echo "EOF"
        echo "./$(basename "$build")/$t repro-$t"
    done
    [ "$found" = 1 ] || echo "(no input was kept: see the log above)"
}

failed=0
printf '\n%-22s %10s %8s %6s %7s %6s %6s %s\n' target execs exec/s cov ft corp rss_mb result
for t in "${targets[@]}"; do
    dir=$work/$t log=$work/$t/log rc=$(cat "$work/$t/rc" 2>/dev/null || echo 1)
    ok=1
    [ "$rc" = 0 ] || ok=0
    # a report libFuzzer ended on without a failing status is still one
    grep -qE '^==[0-9]+==ERROR|^SUMMARY: |runtime error:|ERROR: libFuzzer' "$log" && ok=0
    grep -q '^Done [0-9]* runs' "$log" || ok=0
    # every seed ran (libFuzzer says INITED once the corpus is replayed)
    grep -qE '^#[0-9]+[[:space:]]+INITED' "$log" || ok=0
    last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.*corp: \([0-9]*\).*/\1/p' <<<"$last")
    printf '%-22s %10s %8s %6s %7s %6s %6s %s\n' "$t" "$(stat_of number_of_executed_units "$log")" \
        "$(stat_of average_exec_per_sec "$log")" "${cov:--}" "${ft:--}" "${corp:--}" \
        "$(stat_of peak_rss_mb "$log")" "$([ $ok = 1 ] && echo ok || echo FAILED)"
    if [ $ok = 0 ]; then
        failed=$((failed + 1))
        [ "$rc" = 0 ] && rc="0, with a report"
        show_finding "$t" "$rc" >"$dir/finding"
    fi
done
echo "fuzz smoke: build $((built - start))s, runs $((end - built))s, total $((end - start))s;" \
    "${#targets[@]} targets x ${secs}s, $jobs at a time"
if [ "$failed" -gt 0 ]; then
    for t in "${targets[@]}"; do
        [ -f "$work/$t/finding" ] && cat "$work/$t/finding"
    done
    echo "fuzz smoke: $failed target(s) failed; findings kept in $keep" >&2
    exit 1
fi
echo "fuzz smoke: all ${#targets[@]} targets clean"
