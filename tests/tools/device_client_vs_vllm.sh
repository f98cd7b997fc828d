#!/usr/bin/env bash
# Our benchmark client against vLLM's own `vllm bench serve`, and the server-noise benchmark, on a
# quiet machine with many cores (the device tool's H200 host: 16 cores, nothing else running), where
# run-to-run noise is small enough to resolve 3%. The server is the lab stand-in
# (extras/lab_inference_server.py, --prefill-work 0 so the two clients' prompt encodings, token IDs
# and text, cost the same), the same server for both clients. Read-only towards the GPU: it is not used.
# Needs .devbench/ (carried): run_vllm_bench.sh, site/vllm (vLLM's python modules that its bench
# client loads), whl/ (the wheels that host lacks), model/ (the tiny tokenizer vLLM's random dataset uses).
# Build it here first: tests/tools/devbench/build. Settings: LEVELS ("16 64"), REQUESTS (256), ROUNDS (3),
# COMPARE_S (480), TAG (suffix of the result files), NOISE (1: also run bench_server_noise.py).
#   usage (from the repo root): OUT=/some/dir tests/tools/device_client_vs_vllm.sh
set -u
export PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8 LANG=C.UTF-8
OUT=${OUT:?set OUT to the output directory}
mkdir -p .collections/ansible_collections/gpufleet
ln -sfn ../../.. .collections/ansible_collections/gpufleet/inference
{ nproc; python3 -V; uptime; } > "$OUT/host.txt" 2>&1

# Work-bound, not HTTP-bound: a step costs 2 MiB + 32 KiB per sequence of hashing (about 3 ms at 16 in
# flight, 5 ms at 64: 5 000-12 000 tok/s), well below what its HTTP side can stream (about 20 000 tok/s,
# where it is noisy), so a client that lags in reading or in sending its next request loses throughput.
python3 extras/lab_inference_server.py --model .devbench/model --served-model-name lab --host 127.0.0.1 --port 8000 \
    --work 32 --step-work 2048 --prefill-work 0 --vocab-size 4096 --max-num-seqs 256 > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _i in $(seq 50); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && break; sleep 0.2; done

# installs the carried wheels once (the script keeps them in /tmp/devsite)
.devbench/run_vllm_bench.sh --help > "$OUT/vllm-help.txt" 2>&1 || { tail -20 "$OUT/vllm-help.txt"; exit 1; }

read -ra levels <<< "${LEVELS:-16 64}"
timeout "${COMPARE_S:-480}" python3 tests/benchmarks/bench_client_vs_vllm.py --url http://127.0.0.1:8000 \
    --vllm-cmd .devbench/run_vllm_bench.sh --tokenizer .devbench/model --prompt-tokens 64 --output-tokens 128 \
    --concurrency "${levels[@]}" --requests "${REQUESTS:-256}" --warmup 32 --rounds "${ROUNDS:-3}" --json \
    > "$OUT/client_vs_vllm${TAG:-}.json" 2> "$OUT/client_vs_vllm${TAG:-}.err"
echo "client_vs_vllm rc=$?"
cat "$OUT/client_vs_vllm${TAG:-}.err"
python3 - "$OUT/client_vs_vllm${TAG:-}.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:  # noqa: BLE001 - a report, not a test
    sys.exit(f"no result: {e}")
for lv in d["levels"]:
    print(lv["concurrency"], lv["ours_median"], lv["vllm_median"], lv["ratio"], lv["within_target"],
          [r["output_throughput"] for r in lv["ours"]], [r["output_throughput"] for r in lv["vllm"]],
          max(r["client_cpu_pct"] for r in lv["ours"]), "in flight", lv["ours_in_flight"], lv["vllm_in_flight"])
PY

[ "${NOISE:-1}" = 1 ] || exit 0
timeout 200 python3 tests/benchmarks/bench_server_noise.py --url http://127.0.0.1:8000 --concurrency 16 \
    --prompt-tokens 64 --output-tokens 128 --requests 64 256 --runs 15 --sim-trials 2000 > "$OUT/noise.txt" 2>&1
echo "noise rc=$?"
cat "$OUT/noise.txt"
