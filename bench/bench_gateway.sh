#!/usr/bin/env bash
# Gateway-overhead benchmark (issue 4): what `infergate serve` costs on the
# request path, against a worker reached directly and against HAProxy 2.6
# (h2 on both sides) in front of the same worker, all in one run.
#
#   A  h2load -> infergate worker (tcp)
#   B  h2load -> infergate serve  (its own worker on the same model, over its unix socket)
#   C  h2load -> haproxy          -> the worker of A
#   D  (--replay-ab) h2load -> infergate serve as B, with routing.replay: false
#   E  (--compare-bin BIN) h2load -> B's gateway run by another build (a
#      change measured before and after in one run)
#
# Two requests that cost the worker almost nothing, so the proxy is what is
# measured: GET /v1/models and POST /v1/completions (max_tokens 1, tiny
# model). h2load at 16 connections x 10 streams, pinned to core 0; proxies and
# workers pinned to core 1. Points alternate A B C per repetition; medians
# with min-max. Then a streamed completion (max_tokens 4), one request at a
# time, direct, gateway and HAProxy taking turns: time to first token
# (bench/bench_gateway.py ttft). CPU per request: utime+stime of the proxy
# and of the worker over the measured phase, divided by the requests served.
#
# Note: the gateway answers GET /v1/models itself (from its config, no
# upstream hop), so that point compares the gateway's own HTTP/2 serving with
# HAProxy forwarding; the completion point is the one that goes through the
# proxy path of both.
#
# Needs (Debian): h2load, haproxy, python3-h2 —
#   apt-get install -y haproxy nghttp2-client python3-h2
#
# Usage: bench/bench_gateway.sh [--infergate BIN] [--reps N] [--duration S]
#            [--warmup S] [--ttft-samples N] [--callgrind] [--replay-ab]
#            [--cg-requests N] [--cg-stream-requests N] [--compare-bin BIN]
#   default BIN: build-bench/infergate, built if missing with
#   cmake -B build-bench -DINFERGATE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release
#
# --callgrind adds instructions per completion of the gateway and of HAProxy
# under valgrind's callgrind (20000 requests each, ~1 minute) and the
# gateway's top inclusive costs, to see where its time goes (diagnostic,
# printed on stderr, not part of the table; needs valgrind).
#
# --replay-ab measures what token replay's bookkeeping (issue 32: the
# worker's ": ig TOKEN" tag lines, read and stripped by the gateway, the
# delivered tokens kept) costs: a second gateway D, as B but with
# `routing: {replay: false}`, in every loop, and a third request kind, a
# streamed completion (max_tokens 16, stream), where the bookkeeping runs.
# With --callgrind too: instructions per request of B, D and HAProxy for the
# completion (--cg-requests, 20000) and the streamed completion
# (--cg-stream-requests, 5000), and the functions whose own instructions
# per streamed completion differ most between B and D (and E and B).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PY=/usr/bin/python3
HELPER=$ROOT/bench/bench_gateway.py
BIN=""
REPS=5
DUR=10
WARM=2
TTFT_N=500
CALLGRIND=0
CG_N=20000
CG_NS=5000
REPLAY_AB=0
BIN_E=""
CONNS=16
STREAMS=10
MAX_SEQS=160
MAX_QUEUE=1024
ARGS_ORIG="$*"

while [ $# -gt 0 ]; do
    case "$1" in
    --infergate) BIN=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --duration) DUR=$2; shift 2 ;;
    --warmup) WARM=$2; shift 2 ;;
    --ttft-samples) TTFT_N=$2; shift 2 ;;
    --callgrind) CALLGRIND=1; shift ;;
    --replay-ab) REPLAY_AB=1; shift ;;
    --cg-requests) CG_N=$2; shift 2 ;;
    --cg-stream-requests) CG_NS=$2; shift 2 ;;
    --compare-bin) BIN_E=$(readlink -f "$2"); shift 2 ;;
    -h|--help) sed -n '2,49p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
    esac
done

missing=""
command -v h2load >/dev/null || missing="$missing nghttp2-client"
command -v haproxy >/dev/null || missing="$missing haproxy"
command -v taskset >/dev/null || missing="$missing util-linux"
$PY -c 'import h2' 2>/dev/null || missing="$missing python3-h2"
if [ -n "$missing" ]; then
    echo "missing:$missing — run: apt-get install -y haproxy nghttp2-client python3-h2" >&2
    exit 1
fi
if [ "$(nproc)" -lt 2 ]; then
    echo "needs at least 2 CPUs (load generator on core 0, system under test on core 1)" >&2
    exit 1
fi

if [ -z "$BIN" ]; then
    BIN=$ROOT/build-bench/infergate
    if [ ! -x "$BIN" ]; then
        cmake -B build-bench -DINFERGATE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
        cmake --build build-bench -j2 --target infergate
    fi
fi
BIN=$(readlink -f "$BIN")

TMP=$(mktemp -d /tmp/bench-gateway.XXXXXX)
PIDS=()
cleanup() {
    local p
    # Reverse order: proxies before the worker they talk to; the gateway
    # stops its own worker on SIGTERM.
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        p=${PIDS[i]}
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r P1 P2 P3 P4 P8 <<<"$($PY "$HELPER" ports 5)"
MODEL=$TMP/tiny.gguf
"$BIN" model gen --out "$MODEL" --dim 64 --layers 1 --heads 2 --kv-heads 2 --ffn 128 --vocab 300 \
    --ctx 128 --type q8_0 >/dev/null

# A: the worker, also HAProxy's backend.
taskset -c 1 "$BIN" worker --model "$MODEL" --model-name m --listen "tcp:127.0.0.1:$P1" --threads 1 \
    --max-seqs "$MAX_SEQS" --max-queue "$MAX_QUEUE" >"$TMP/worker.log" 2>&1 &
W_PID=$!
PIDS+=("$W_PID")

# B: the gateway with its own worker on the same model and knobs.
cat >"$TMP/gateway.yaml" <<EOF
listen:
  - address: "127.0.0.1:$P2"
workers:
  - model: $MODEL
    name: m
    devices: [cpu]
    threads: 1
    max_seqs: $MAX_SEQS
    max_queue: $MAX_QUEUE
logging:
  access_log: "off"
runtime_dir: $TMP/run
EOF
mkdir -p "$TMP/run"
taskset -c 1 "$BIN" serve --config "$TMP/gateway.yaml" >"$TMP/gateway.log" 2>&1 &
G_PID=$!
PIDS+=("$G_PID")

# C: HAProxy, h2 on both sides, one thread, no logging.
cat >"$TMP/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend fe
    bind 127.0.0.1:$P3 proto h2
    default_backend be
backend be
    http-reuse always
    server w 127.0.0.1:$P1 proto h2
EOF
taskset -c 1 haproxy -f "$TMP/haproxy.cfg" -db >"$TMP/haproxy.log" 2>&1 &
H_PID=$!
PIDS+=("$H_PID")

# B's configuration on another port and runtime directory, with more YAML
# if given: $TMP/gateway-NAME.yaml.
gateway_config() { # NAME PORT [YAML]
    sed -e "s/127.0.0.1:$P2/127.0.0.1:$2/" -e "s|$TMP/run|$TMP/run-$1|" "$TMP/gateway.yaml" >"$TMP/gateway-$1.yaml"
    if [ -n "${3:-}" ]; then printf '%s\n' "$3" >>"$TMP/gateway-$1.yaml"; fi
    mkdir -p "$TMP/run-$1"
}
start_gateway() { # NAME BIN -> STARTED: its pid
    taskset -c 1 "$2" serve --config "$TMP/gateway-$1.yaml" >"$TMP/gateway-$1.log" 2>&1 &
    STARTED=$!
    PIDS+=("$STARTED")
}
REPLAY_OFF=$'routing:\n  replay: false'
# D: B with token replay off (its own worker).
D_PID=""
if [ "$REPLAY_AB" = 1 ]; then
    gateway_config d "$P4" "$REPLAY_OFF"
    start_gateway d "$BIN"
    D_PID=$STARTED
fi
# E: B's configuration, another build.
E_PID=""
if [ -n "$BIN_E" ]; then
    gateway_config e "$P8"
    start_gateway e "$BIN_E"
    E_PID=$STARTED
fi

wait_ready() { # URL NAME LOG
    for _ in $(seq 100); do
        if [ "$(curl -s --http2-prior-knowledge -o /dev/null -w '%{http_code}' "$1" || true)" = 200 ]; then
            return 0
        fi
        sleep 0.1
    done
    echo "$2 did not become ready; its log:" >&2
    cat "$3" >&2
    exit 1
}
wait_ready "http://127.0.0.1:$P1/health" worker "$TMP/worker.log"
wait_ready "http://127.0.0.1:$P2/readyz" gateway "$TMP/gateway.log"
wait_ready "http://127.0.0.1:$P3/health" haproxy "$TMP/haproxy.log"
worker_of_gateway() { # PID NAME -> FOUND: the worker it started
    FOUND=$(pgrep -P "$1" | head -1)
    if [ -z "$FOUND" ]; then
        echo "cannot find the $2's worker process" >&2
        exit 1
    fi
}
worker_of_gateway "$G_PID" gateway
GW_WORKER=$FOUND
D_WORKER=""
if [ -n "$D_PID" ]; then
    wait_ready "http://127.0.0.1:$P4/readyz" "gateway D (replay off)" "$TMP/gateway-d.log"
    worker_of_gateway "$D_PID" "gateway D"
    D_WORKER=$FOUND
fi
E_WORKER=""
if [ -n "$E_PID" ]; then
    wait_ready "http://127.0.0.1:$P8/readyz" "gateway E (--compare-bin)" "$TMP/gateway-e.log"
    worker_of_gateway "$E_PID" "gateway E"
    E_WORKER=$FOUND
fi

cpu_s() { # PID -> user+system CPU seconds (fields 14 and 15 of /proc/PID/stat)
    local s
    s=$(cat "/proc/$1/stat")
    s=${s##*) }
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.4f", ($12 + $13) / hz }' <<<"$s"
}
now_s() { date +%s.%N; }

printf '{"model":"m","prompt":[1,5,6],"max_tokens":1,"temperature":0}' >"$TMP/body.json"
printf '{"model":"m","prompt":[1,5,6],"max_tokens":16,"temperature":0,"stream":true}' >"$TMP/body-stream.json"
RESULTS=$TMP/results.jsonl
: >"$RESULTS"

port_of() { case $1 in direct) echo "$P1" ;; gateway) echo "$P2" ;; haproxy) echo "$P3" ;; noreplay) echo "$P4" ;; gateway2) echo "$P8" ;; esac; }
proxy_of() { case $1 in direct) echo "" ;; gateway) echo "$G_PID" ;; haproxy) echo "$H_PID" ;; noreplay) echo "$D_PID" ;; gateway2) echo "$E_PID" ;; esac; }
worker_of() { case $1 in gateway) echo "$GW_WORKER" ;; noreplay) echo "$D_WORKER" ;; gateway2) echo "$E_WORKER" ;; *) echo "$W_PID" ;; esac; }
body_of() { case $1 in stream) echo "$TMP/body-stream.json" ;; *) echo "$TMP/body.json" ;; esac; }

one_run() { # SERVER KIND REP
    local server=$1 kind=$2 rep=$3 port proxy worker url extra=() hp c0p c0w c1p c1w t0 t1
    port=$(port_of "$server")
    proxy=$(proxy_of "$server")
    worker=$(worker_of "$server")
    if [ "$kind" = models ]; then
        url="http://127.0.0.1:$port/v1/models"
    else
        url="http://127.0.0.1:$port/v1/completions"
        extra=(-d "$(body_of "$kind")" -H "content-type: application/json")
    fi
    taskset -c 0 h2load -c "$CONNS" -m "$STREAMS" -D "$DUR" --warm-up-time "$WARM" "${extra[@]}" \
        --log-file="$TMP/req.log" "$url" >"$TMP/h2load.out" 2>&1 &
    hp=$!
    # CPU window: from the end of the warm-up to the end of the run.
    sleep "$(awk -v w="$WARM" 'BEGIN { print w + 0.2 }')"
    t0=$(now_s)
    c0w=$(cpu_s "$worker")
    c0p=0
    [ -n "$proxy" ] && c0p=$(cpu_s "$proxy")
    sleep "$(awk -v d="$DUR" 'BEGIN { print d - 0.4 }')"
    t1=$(now_s)
    c1w=$(cpu_s "$worker")
    c1p=0
    [ -n "$proxy" ] && c1p=$(cpu_s "$proxy")
    wait "$hp" || { echo "h2load failed:" >&2; cat "$TMP/h2load.out" >&2; exit 1; }
    local kv=(server="$server" kind="$kind" rep="$rep"
        cpu_wall_s="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')"
        worker_cpu_s="$(awk -v a="$c0w" -v b="$c1w" 'BEGIN { printf "%.4f", b - a }')")
    [ -n "$proxy" ] && kv+=(proxy_cpu_s="$(awk -v a="$c0p" -v b="$c1p" 'BEGIN { printf "%.4f", b - a }')")
    taskset -c 0 $PY "$HELPER" run "$TMP/h2load.out" "$TMP/req.log" "${kv[@]}" | tee -a "$RESULTS" |
        $PY -c 'import json,sys; r=json.load(sys.stdin); print("  rep %d %-10s %-8s %8.0f req/s  p50 %6.0f us  p99 %6.0f us  non-2xx %d  failed %d  proxy %s us/req  worker %.1f us/req" % (r["rep"], r["kind"], r["server"], r["rps"], r["p50_us"], r["p99_us"], r["non2xx"], r["failed"] + r["errored"], ("%.1f" % r["proxy_us_per_req"]) if "proxy_us_per_req" in r else "-", r.get("worker_us_per_req", float("nan"))))' >&2
    rm -f "$TMP/req.log"
}

KINDS="models completion"
SERVERS="direct gateway haproxy"
if [ "$REPLAY_AB" = 1 ]; then
    KINDS="models completion stream"
    SERVERS="direct gateway noreplay haproxy"
fi
[ -n "$BIN_E" ] && SERVERS="${SERVERS/gateway /gateway gateway2 }"
echo "throughput and latency: $REPS reps x $(wc -w <<<"$KINDS") kinds x $(wc -w <<<"$SERVERS") paths," \
    "${DUR}s each (+${WARM}s warm-up)" >&2
for rep in $(seq "$REPS"); do
    for kind in $KINDS; do
        for server in $SERVERS; do
            one_run "$server" "$kind" "$rep"
        done
    done
done

echo "time to first token: $TTFT_N sequential streamed completions per side" >&2
TTFT_D=()
[ "$REPLAY_AB" = 1 ] && TTFT_D=(--noreplay "$P4")
[ -n "$BIN_E" ] && TTFT_D+=(--gateway2 "$P8")
taskset -c 0 $PY "$HELPER" ttft --direct "$P1" --gateway "$P2" ${TTFT_D[@]+"${TTFT_D[@]}"} --haproxy "$P3" \
    --samples "$TTFT_N" --out "$TMP/ttft.json" >&2

CG_META=()
if [ "$CALLGRIND" = 1 ]; then
    # Instructions per request cannot be moved by the neighbours' load: the
    # gateway and HAProxy each under callgrind (counters zeroed once ready,
    # dumped after a fixed number of completions), the workers native.
    if ! command -v valgrind >/dev/null || ! command -v callgrind_control >/dev/null; then
        echo "callgrind: valgrind is not installed (apt-get install -y valgrind), skipped" >&2
    else
        read -r P5 P6 P7 P9 <<<"$($PY "$HELPER" ports 4)"
        gateway_config cg "$P5"
        gateway_config cgd "$P7" "$REPLAY_OFF"
        gateway_config cge "$P9"
        sed -e "s/127.0.0.1:$P3 /127.0.0.1:$P6 /" "$TMP/haproxy.cfg" >"$TMP/haproxy-cg.cfg"
        cg_one() { # NAME KIND N PORT READY-PATH CMD...
            local name=$1 kind=$2 n=$3 port=$4 ready=$5 vp ok=0
            shift 5
            taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$kind.$name" "$@" \
                >"$TMP/cg.$kind.$name.log" 2>&1 &
            vp=$!
            PIDS+=("$vp")
            for _ in $(seq 300); do
                if [ "$(curl -s --http2-prior-knowledge -o /dev/null -w '%{http_code}' \
                    "http://127.0.0.1:$port$ready" || true)" = 200 ]; then
                    ok=1
                    break
                fi
                sleep 0.1
            done
            if [ "$ok" = 1 ]; then
                callgrind_control -z "$vp" >/dev/null 2>&1
                taskset -c 0 h2load -c "$CONNS" -m "$STREAMS" -n "$n" -d "$(body_of "$kind")" \
                    -H "content-type: application/json" "http://127.0.0.1:$port/v1/completions" |
                    grep -E '^(requests|status codes):' >&2
                callgrind_control -d "$vp" >/dev/null 2>&1
            else
                echo "callgrind: $name did not become ready" >&2
            fi
            kill -TERM "$vp" 2>/dev/null || true
            wait "$vp" 2>/dev/null || true
        }
        CG_KINDS="completion"
        CG_NAMES="gateway haproxy"
        if [ "$REPLAY_AB" = 1 ]; then
            CG_KINDS="completion stream"
            CG_NAMES="gateway noreplay haproxy"
        fi
        [ -n "$BIN_E" ] && CG_NAMES="${CG_NAMES/gateway /gateway gateway2 }"
        for kind in $CG_KINDS; do
            n=$CG_N
            [ "$kind" = stream ] && n=$CG_NS
            echo "callgrind: $n requests ($kind) through each proxy" >&2
            for name in $CG_NAMES; do
                case $name in
                gateway) cg_one gateway "$kind" "$n" "$P5" /readyz "$BIN" serve --config "$TMP/gateway-cg.yaml" ;;
                gateway2) cg_one gateway2 "$kind" "$n" "$P9" /readyz "$BIN_E" serve --config "$TMP/gateway-cge.yaml" ;;
                noreplay) cg_one noreplay "$kind" "$n" "$P7" /readyz "$BIN" serve --config "$TMP/gateway-cgd.yaml" ;;
                haproxy) cg_one haproxy "$kind" "$n" "$P6" /health haproxy -f "$TMP/haproxy-cg.cfg" -db ;;
                esac
                f=$TMP/cg.$kind.$name.1
                [ -f "$f" ] || continue
                callgrind_annotate --auto=no --inclusive=yes "$f" >"$f.incl" 2>/dev/null || true
                # the top inclusive costs: B's only (cgtop lists them for "gateway")
                $PY "$HELPER" cgtop "$f.incl" "$n" "$name" "$ROOT" | tee "$f.top" >&2
                CG_META+=("cg_${kind}_$name=$(awk 'NR == 1 { print $2 }' "$f.top")")
            done
            CG_META+=("cg_n_$kind=$n")
            # where one's extra instructions go: own (exclusive) costs, B less D, E less B
            for pair in gateway:noreplay gateway2:gateway; do
                x=${pair%:*} y=${pair#*:}
                [ -f "$TMP/cg.$kind.$x.1" ] && [ -f "$TMP/cg.$kind.$y.1" ] || continue
                for name in "$x" "$y"; do
                    [ -f "$TMP/cg.$kind.$name.excl" ] ||
                        callgrind_annotate --auto=no --threshold=100 "$TMP/cg.$kind.$name.1" \
                            >"$TMP/cg.$kind.$name.excl" 2>/dev/null || true
                done
                $PY "$HELPER" cgdiff "$TMP/cg.$kind.$x.excl" "$TMP/cg.$kind.$y.excl" "$n" "$ROOT" \
                    "$kind, $x less $y" >&2
            done
        done
    fi
fi

CPU=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
HAPV=$(haproxy -v | awk 'NR == 1 { print $3 }')
$PY "$HELPER" table "$RESULTS" "$TMP/ttft.json" "date=$(date -u +%Y-%m-%d)" \
    "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" "nproc=$(nproc)" "cpu=$CPU" \
    "haproxy=$HAPV" "reps=$REPS" "command=bench/bench_gateway.sh${ARGS_ORIG:+ $ARGS_ORIG}" ${CG_META[@]+"${CG_META[@]}"}
