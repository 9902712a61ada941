#!/bin/bash
# A GPU worker's power draw read through NVML (issue 31), for
# bench/gpu_check.sh's `power` step: `infergate serve` runs one worker on
# DEVICE with power_watts 1 in its config, answers a few requests, and the
# energy /metrics counts for them, over the requests' time, gives the
# draw the gateway used. NVML read: a GPU's draw, tens of watts at least;
# not read: the configured 1 W.
#
#   bench/power_check.sh BIN_DIR DEVICE OUT_DIR   (DEVICE: a GPU index or UUID; cpu to check the script)
#
# Prints the implied watts and "power check: ok" (NVML's reading was used)
# or "power check: FAIL"; exit 0 or 1.
set -u
bin=$1
dev=$2
out=$3
mkdir -p "$out"
rm -f "$out/power_answers.json"
m=$out/power.gguf
"$bin/infergate" model gen --out "$m" --dim 512 --layers 8 --heads 8 --kv-heads 4 --ffn 1408 \
    --vocab 4096 --type q8_0 >"$out/power_gen.log" 2>&1 || { echo "power check: model gen failed"; exit 1; }
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$out/power.yaml" <<EOF
listen:
  - address: "127.0.0.1:$port"
workers:
  - model: $m
    name: power
    devices: [$dev]
    power_watts: 1
EOF
"$bin/infergate" serve --config "$out/power.yaml" >"$out/power_serve.log" 2>&1 &
spid=$!
ready=0
for _ in $(seq 600); do # ready: a one-token answer comes back
    curl -sf --max-time 10 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
        -d '{"model":"power","prompt":"x","max_tokens":1}' >/dev/null 2>&1 && { ready=1; break; }
    sleep 0.1
done
busy=0
if [ $ready = 1 ]; then
    t0=$(date +%s.%N)
    for _ in 1 2 3 4; do
        curl -sS --max-time 120 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
            -d '{"model":"power","prompt":"energy","max_tokens":256,"temperature":0,"ignore_eos":true}' \
            >>"$out/power_answers.json" 2>&1
    done
    busy=$(python3 -c "import time; print(time.time() - $t0)")
    curl -sS "http://127.0.0.1:$port/metrics" >"$out/power_metrics.txt" 2>&1
fi
kill -TERM $spid
wait $spid
wh=$(awk '/^infergate_energy_wh_total/ { s += $NF } END { printf "%.9g", s + 0 }' "$out/power_metrics.txt" 2>/dev/null)
watts=$(python3 -c "print('%.1f' % (float('${wh:-0}') * 3600 / $busy) if $busy > 0 else 0)")
echo "power: ${wh:-0} Wh over ${busy} s of requests: ${watts} W (1 W configured)"
# a reading below 10 W is the configured fallback (or nothing): NVML was not used
if python3 -c "import sys; sys.exit(0 if float('$watts') >= 10 else 1)"; then
    echo "power check: ok"
    exit 0
fi
echo "power check: FAIL"
exit 1
