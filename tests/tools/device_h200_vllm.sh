#!/usr/bin/env bash
# The vllm_service role's vLLM on the device tool's H200, measured with the collection's own client
# beside `vllm bench serve`, the gate at 0.95 and the measured-tuning stages (tests/tools/h200_vllm.py).
# Read-only towards the hardware: no config-space writes, binds, resets or GPU settings; NVLink multicast
# stays off (the rendered environment must hold the three variables, or the server is not started).
#
# Runs from a copy of the worktree (.h200tree in the device tool's checkout) with the payload of
# tests/tools/device_vllm (build_chunks.sh: chunk folders c01.. for every model, m01.. for MoE models only, each
# at most 17 MiB) carried beside it in .vllmchunks, and the ansible-core wheels in .h200tree/whl (the role's filter
# renders the command line on the device too). Phases, one device call each, back to back (what is stashed and
# installed in /tmp lives only while the machine stays warm, 30 s after a call):
#   stash   probe the machine, stash the carried chunk folders in /tmp/acc (carry as many chunk folders as fit
#           under the 64 MiB a call carries beside the checkout's tracked files, and .h200tree/tests/tools);
#           MODEL7B=1 also makes the 7B-architecture model (the image's torch and transformers suffice)
#   run     install the payload (first call only: every c chunk stashed or carried), make the model, render and start
#           the baseline server under
#           setsid on the unit's CPUAffinity, then a resumable work list, in the order of what matters most:
#           our client (its default request and with per-chunk usage) beside vllm bench serve, CPU contention (hog),
#           pcie_facts with the bandwidth probe during a run, noise, max_num_seqs 32 at c=64, the tuning stages
#           (call it again, back to back, until it has nothing left)
#   verify  install and start the baseline as `run` does, then the gate's A/A, CPU contention and --enforce-eager at
#           short runs (GATE_LEVEL x GATE_SLOTS requests, the cell quiet enough to decide), then our client against
#           vllm bench serve in ROUNDS paired rounds per level (the fourth session; resumable like `run`; GATE=0 skips
#           the gate, GATE_CELLS/GATE_CANDIDATES/GATE_MAX_RUNS choose its cells, cases and cap, COMPARE_CLIENTS/LEVELS/REQUESTS/OUT
#           choose the comparison)
#   tune    install and start the baseline as `run` does, then only the measured-tuning stages, resumed from
#           a stored tune.json (SEED, e.g. docs/examples/h200-vllm/run2/tune.json: its records are kept and the
#           stages after them run, gated against SEED_CURRENT, default the baseline server at :8000)
#   restarts  install, make DeepSeek-R1-Distill-Qwen-7B's architecture with random weights (device_vllm/make_qwen7b.py,
#           refused unless its tokenizer round-trips), render, then h200_vllm.py restarts: the server starts of PLAN
#           one after another (profiles of h200/profiles.yml, default four qwen7b then qwen7b_seqs48), RUNS whole runs
#           each at LEVEL (64) with PROMPT/OUTPUT tokens (512/256) and SLOTS requests per slot (4), more while the kernel
#           upgrade's gate over a pair of GATES asks for them, then EXTRA_RUNS at EXTRA_LEVELS (16) and in the CELLS
#           (LEVELxPROMPT/OUTPUT[@PROFILE[=JSON]][~ARRIVALS_JSON], a workload profile of bench/profiles.py each); a
#           plan entry's cmp=N runs N paired rounds of our client against vllm bench serve (COMPARE_LEVELS,
#           COMPARE_REQUESTS, COMPARE_LENGTHS, COMPARE_CLIENTS: "ours vllm" by default, ours being the collection's
#           default request, "ours_usage" per-chunk usage; TOKENIZER, default /tmp/tok7b); resumable: call
#           it again, back to back, until it has nothing left (the server of an unfinished start keeps running)
# (The first H200 session's phases `main` and `gate` are in git history at 68c555b, docs/gpu_h200.md.)
# Settings: BUDGET (s of work before the phase stops starting new runs, default 540), ROUNDS (compare, 3),
# TABLE_LEVELS (tune: the levels each stage is also measured at, default "16 64 256"),
# PCU (our client's per-chunk usage in noise/gate/tune, default --no-per-chunk-usage), CLIENT_CPUS (12-15).
#   usage (device tool, from the checkout root): cd .h200tree && OUT=$OUT bash tests/tools/device_h200_vllm.sh PHASE
set -u
PHASE=${1:?phase: stash, run, verify, tune or restarts}
OUT=${OUT:?set OUT to the output directory}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)          # .h200tree
CHUNKS=${CHUNKS:-$ROOT/../.vllmchunks}
S=$(date +%s); DL=$((S + ${BUDGET:-540}))
# shellcheck source=/dev/null
source "$ROOT/tests/tools/device_vllm/common.sh"    # NVLink multicast off, hub offline, PYTHONPATH=/tmp/site
export PYTHONPATH=/tmp/site:/tmp/ansite:$ROOT/.collections LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1
W=/tmp/h200; mkdir -p "$W"
exec > >(tee -a "$OUT/phase-$PHASE.log") 2>&1
# results are written to $W as they come and packed into $OUT/h200.tar every few seconds (a killed call keeps
# them; at most 8 files come back from a call, so the JSON travel as one tar and the server logs as another)
pack() { (cd "$W" && tar -cf "$OUT/.h200.tar" ./*.json) 2>/dev/null && mv "$OUT/.h200.tar" "$OUT/h200.tar"; }
( while sleep 5; do pack; done ) &
copier=$!
finish() { kill "$copier" 2>/dev/null; pack; (cd "$W" && ls ./*.log > /dev/null 2>&1 && tar -cJf "$OUT/logs.tar.xz" ./*.log); echo "$PHASE took $(( $(date +%s) - S )) s"; }
trap finish EXIT
cd "$ROOT" || exit 1
mkdir -p .collections/ansible_collections/gpufleet
ln -sfn ../../.. .collections/ansible_collections/gpufleet/inference
D=(python3 tests/tools/h200_vllm.py)

# the carried chunk folders into /tmp/acc (each holds SHA256SUMS; install.py checks every piece)
stash() {
  mkdir -p /tmp/acc
  for d in "$CHUNKS"/[cm][0-9]*; do [ -d "$d" ] && cp "$d"/* /tmp/acc/; done
  echo "stashed: $(find /tmp/acc -maxdepth 1 -type f -printf '%f ')"
}
install_payload() {
  [ -d /tmp/site/vllm ] && return 0
  stash
  python3 "$ROOT/tests/tools/device_vllm/install.py" /tmp/acc /tmp/site || return 2
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ansite "$ROOT"/whl/*.whl
}

make7b() {
  if [ ! -f /tmp/model7b/config.json ]; then
    python3 tests/tools/device_vllm/make_qwen7b.py /tmp/model7b /tmp/tok7b 2>&1 | grep -v Writing
    [ "${PIPESTATUS[0]}" = 0 ] || { rm -rf /tmp/model7b; echo "make_qwen7b failed"; return 2; }
  fi
  cp /tmp/model7b.made.json "$W/model7b.json"
  echo "model at t=$(( $(date +%s) - S ))"
}

case $PHASE in
stash)
  echo "== probe $(date -u)"; uname -r; nproc; free -g | head -2; df -h /tmp | tail -1
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv
  python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, torch.version.cuda, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)' 2>&1 | tail -1
  # GPU health as NVML reports it (issue 37's fields), read-only: queries only, nothing set or reset
  python3 tests/tools/h200_nvml_capture.py "$W/nvml.json" 2>&1 | tail -3
  nvidia-smi -q -x > "$OUT/nvidia-smi-q.xml" 2> /dev/null; echo "nvidia-smi -q -x rc=$? $(wc -c < "$OUT/nvidia-smi-q.xml") B"
  { command -v dcgmi || echo "dcgmi: not installed"; dmesg 2>&1 | grep -i -E "xid|NVRM" | tail -20 || true; } > "$W/xid.json.txt"
  python3 -c 'import json,sys; json.dump({"lines": open(sys.argv[1]).read().splitlines()}, open(sys.argv[2], "w"))' "$W/xid.json.txt" "$W/dmesg-xid.json"
  stash
  if [ "${MODEL7B:-0}" = 1 ]; then make7b; fi   # the model needs only the image's torch and transformers, not the payload
  ;;
restarts)
  install_payload || exit 2
  echo "installed at t=$(( $(date +%s) - S ))"
  make7b || exit 2
  if [ ! -f "$W/rendered.json" ]; then
    "${D[@]}" render --host-vars tests/tools/h200/host_vars.yml --profiles tests/tools/h200/profiles.yml --out "$W/rendered" || exit 2
    python3 - "$W/rendered" "$W/rendered.json" <<'PY'
import json, os, sys
d = sys.argv[1]
json.dump({f[:-5]: json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.startswith(("qwen7b", "dsv2"))},
          open(sys.argv[2], "w"), indent=1)
PY
  fi
  read -r -a PL <<< "${PLAN:-qwen7b qwen7b qwen7b qwen7b qwen7b_seqs48}"
  # what the plan's starts need beyond the 7B model: its corrupted copy (one layer's weights x2, the rest hard-linked),
  # DeepSeek-V2-Lite's config and tokenizer (weights drawn by vLLM: --load-format dummy)
  if [[ " ${PL[*]} " == *"swap=/tmp/model7b.bad"* ]] && [ ! -f /tmp/model7b.bad/corrupt.json ] && [ ! -f /tmp/model7b/corrupt.json ]; then
    python3 tests/tools/device_vllm/corrupt_model.py /tmp/model7b /tmp/model7b.bad 14 2.0 | cut -c1-400 || exit 2
    cp /tmp/model7b.bad/corrupt.json "$W/corrupt.json"
  fi
  if [[ " ${PL[*]} " == *" dsv2lite"* ]] && [ ! -f /tmp/dsv2lite/config.json ]; then
    python3 tests/tools/device_vllm/make_dsv2lite.py /tmp/dsv2lite /tmp/tokds | cut -c1-400 || exit 2
    cp /tmp/dsv2lite.made.json "$W/dsv2lite.json"
  fi
  read -r -a CE <<< "${CELLS-}"
  read -r -a GP <<< "${GATES:-0:1 2:3 3:4}"
  read -r -a XL <<< "${EXTRA_LEVELS-16}"
  read -r -a P <<< "${PCU---no-per-chunk-usage}"
  read -r -a CML <<< "${COMPARE_LEVELS:-16 64 256}"
  read -r -a CMR <<< "${COMPARE_REQUESTS:-64 256 512}"
  read -r -a CMC <<< "${COMPARE_CLIENTS:-ours vllm}"
  timeout $((DL - $(date +%s) + 10)) taskset -c "${CLIENT_CPUS:-12-15}" "${D[@]}" restarts --out "$W/restarts.json" "${P[@]}" \
    --rendered-dir "$W/rendered" --logdir "$W" --plan "${PL[@]}" --gates "${GP[@]}" --concurrency "${LEVEL:-64}" \
    --requests-per-slot "${SLOTS:-4}" --prompt-tokens "${PROMPT:-512}" --output-tokens "${OUTPUT:-256}" --runs "${RUNS:-8}" \
    --extra-levels "${XL[@]}" --cells "${CE[@]}" --extra-runs "${EXTRA_RUNS:-6}" --start-timeout 400 --deadline "$DL" --warmup 0 \
    --compare-levels "${CML[@]}" --compare-requests "${CMR[@]}" --compare-clients "${CMC[@]}" \
    --compare-lengths "${COMPARE_LENGTHS:-512/256}" --tokenizer "${TOKENIZER:-/tmp/tok7b}"
  echo "restarts rc=$? at t=$(( $(date +%s) - S ))"
  ;;
run|verify|tune)
  # One work list, resumable: every step skips what an earlier call of this machine finished (results in
  # /tmp/h200) and starts nothing it cannot finish before BUDGET. The same command for every call after
  # the stash calls; the first of them carries the chunks not yet stashed (the install), the later ones only .h200tree.
  read -r -a P <<< "${PCU---no-per-chunk-usage}"   # how our client asks in noise, gate and tune (compare runs both)
  T=(taskset -c "${CLIENT_CPUS:-12-15}")       # the clients' CPUs; the server's are the unit's CPUAffinity
  left() { echo $((DL - $(date +%s))); }
  read -r -a TL <<< "${TABLE_LEVELS:-16 64 256}"
  # the measured-tuning stages, each gated at c=64 (4 requests per slot) against the kept configuration
  tune_stages() {
    timeout $(($(left) + 10)) "${T[@]}" "${D[@]}" tune --out "$W/tune.json" "${R[@]}" "${P[@]}" \
      --profiles tests/tools/h200/profiles.yml --host-vars tests/tools/h200/host_vars.yml --logdir "$W" --concurrency 64 \
      --requests-per-slot 4 --table-levels "${TL[@]}" --deadline "$DL"
  }
  install_payload || exit 2
  [ -f /tmp/model/config.json ] || python3 tests/tools/device_vllm/make_model.py /tmp/model 2>&1 | grep -v Writing
  if [ ! -f "$W/rendered.json" ]; then
    "${D[@]}" render --host-vars tests/tools/h200/host_vars.yml --profiles tests/tools/h200/profiles.yml --out "$W/rendered" || exit 2
    python3 - "$W/rendered" "$W/rendered.json" <<'PY'
import json, os, sys
d = sys.argv[1]
json.dump({f[:-5]: json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d))}, open(sys.argv[2], "w"), indent=1)
PY
  fi
  echo "installed, model, rendered at t=$(( $(date +%s) - S ))"
  curl -sf http://127.0.0.1:8000/health > /dev/null || {
    "${T[@]}" "${D[@]}" serve --rendered "$W/rendered/baseline.json" --log "$W/server-baseline.log" --record "$W/server-baseline.json" \
      --timeout 300 || { tail -60 "$W/server-baseline.log"; exit 1; }; }
  echo "baseline ready at t=$(( $(date +%s) - S )); its CPUs: $(taskset -pc "$(python3 -c "import json;print(json.load(open('$W/server-baseline.json'))['pid'])")")"
  R=(--server-record "$W/server-baseline.json")
  if [ "$PHASE" = tune ]; then
    if [ ! -f "$W/tune.json" ]; then
      python3 - "${SEED:?tune: set SEED to a stored tune.json}" "$W/tune.json" "${SEED_CURRENT:-http://127.0.0.1:8000}" <<'PY'
import json, sys
state = json.load(open(sys.argv[1]))
# the stages after the stored records are gated against SEED_CURRENT (the baseline server by default: a
# server of the stored session is gone); the stored records stay as they were measured
state["current"] = {"vars": {}, "url": sys.argv[3], "pid": None, "name": "baseline"}
state["seeded_from"] = {"file": sys.argv[1], "records": len(state["records"])}
state.pop("pending", None); state.pop("deadline_hit", None)
json.dump(state, open(sys.argv[2], "w"), indent=1)
PY
    fi
    tune_stages
    echo "tune rc=$? at t=$(( $(date +%s) - S ))"
    exit 0
  fi
  if [ "$PHASE" = verify ]; then
    # the gate at 0.95 where the server is quiet enough to decide (short runs), A/A first: pass; then two
    # regressions of known size: one busy loop on each of the server's CPUs, and CUDA graphs off
    # GATE_CELLS: "LEVELxSLOTS ..." (default one cell, GATE_LEVEL x GATE_SLOTS, into gate-short.json; several cells
    # go to gate-cLEVEL-sSLOTS.json each); GATE_CANDIDATES: the regressions after each cell's A/A (empty: A/A only)
    read -r -a GC <<< "${GATE_CELLS:-${GATE_LEVEL:-16}x${GATE_SLOTS:-2}}"
    read -r -a GK <<< "${GATE_CANDIDATES-hog eager}"
    for cell in "${GC[@]}"; do
      GL=${cell%x*}; GS=${cell#*x}; gout=$W/gate-short.json
      [ ${#GC[@]} -gt 1 ] && gout=$W/gate-c$GL-s$GS.json
      [ "${GATE:-1}" = 1 ] && [ "$(left)" -gt 100 ] && timeout $(($(left) + 10)) "${T[@]}" "${D[@]}" gate --out "$gout" "${R[@]}" "${P[@]}" \
        --rendered-dir "$W/rendered" --logdir "$W" --concurrency "$GL" --requests-per-slot "$GS" \
        --candidates "${GK[@]}" --candidate-s 100 --max-runs "${GATE_MAX_RUNS:-15}" --deadline $((DL - 30))
      echo "gate $cell rc=$? at t=$(( $(date +%s) - S ))"
    done
    # our client and vllm bench serve in paired rounds (the same seed, back to back, order alternating)
    read -r -a CL <<< "${COMPARE_LEVELS:-16 64 256}"
    read -r -a CR <<< "${COMPARE_REQUESTS:-64 256 1024}"
    read -r -a CC <<< "${COMPARE_CLIENTS:-ours vllm}"
    [ "$(left)" -gt 30 ] && timeout $(($(left) + 10)) "${T[@]}" "${D[@]}" compare --out "$W/${COMPARE_OUT:-compare-paired}.json" "${R[@]}" \
      --tokenizer /tmp/model --clients "${CC[@]}" --concurrency "${CL[@]}" --requests "${CR[@]}" \
      --rounds "${ROUNDS:-40}" --deadline $((DL - 15))
    echo "compare rc=$? at t=$(( $(date +%s) - S ))"
    exit 0
  fi
  # 1. our client (its default request and with per-chunk usage) beside vllm bench serve (one long-lived worker)
  timeout $(($(left) + 10)) "${T[@]}" "${D[@]}" compare --out "$W/compare.json" "${R[@]}" --tokenizer /tmp/model \
    --concurrency 16 64 256 --requests 128 512 1024 --rounds "${ROUNDS:-3}" --deadline $((DL - 20))
  echo "compare rc=$? at t=$(( $(date +%s) - S ))"
  # 2. CPU contention on the server's CPUs: one busy loop pinned to each of them during every candidate run
  [ "$(left)" -gt 100 ] && timeout $(($(left) + 10)) "${T[@]}" "${D[@]}" gate --out "$W/gate.json" "${R[@]}" "${P[@]}" --skip-aa \
    --rendered-dir "$W/rendered" --logdir "$W" --concurrency 64 --requests-per-slot 4 --candidates hog --candidate-s 60 --deadline $((DL - 30))
  # 5. pcie_facts with the bandwidth probe while two runs at c=64 stream from the server
  if [ ! -f "$W/pcie_facts.json" ] && [ "$(left)" -gt 60 ]; then
    echo '{"ANSIBLE_MODULE_ARGS": {"bandwidth_probe": true, "probe_size_mb": 256}}' > "$W/pcie-args.in"
    ( sleep 3; python3 plugins/modules/pcie_facts.py "$W/pcie-args.in" > "$W/pcie_facts.json" 2> "$W/pcie_facts.err" ) &
    probe=$!
    "${T[@]}" "${D[@]}" noise --out "$W/pcie_run.json" "${R[@]}" "${P[@]}" --concurrency 64 --lengths 16 --runs 2 --deadline $((DL - 40))
    wait "$probe"   # not a bare wait: the copier runs in the background until the end
    tail -3 "$W/pcie_facts.err"
  fi
  # 3. run-to-run noise: 8 whole runs per level and run length (requests per slot)
  for cell in "64 16" "256 4" "16 16"; do
    read -r level slots <<< "$cell"
    [ "$(left)" -gt 95 ] && timeout $(($(left) + 10)) "${T[@]}" "${D[@]}" noise --out "$W/noise.json" "${R[@]}" "${P[@]}" \
      --concurrency "$level" --lengths "$slots" --runs 8 --deadline $((DL - 90))
  done
  # 2. a smaller max_num_seqs (32) than the gate's concurrency (64): its own server beside the baseline
  [ "$(left)" -gt 110 ] && timeout $(($(left) + 10)) "${T[@]}" "${D[@]}" gate --out "$W/gate.json" "${R[@]}" "${P[@]}" --skip-aa \
    --rendered-dir "$W/rendered" --logdir "$W" --concurrency 64 --requests-per-slot 4 --candidates hog seqs32 --candidate-s 100 \
    --deadline $((DL - 20))
  # 4. the measured-tuning stages, each gated at c=64 (4 requests per slot) against the kept configuration
  [ "$(left)" -gt 150 ] && tune_stages
  echo "tune rc=$? at t=$(( $(date +%s) - S ))"
  [ "$(left)" -gt 130 ] && timeout $(($(left) + 10)) "${T[@]}" "${D[@]}" noise --out "$W/noise.json" "${R[@]}" "${P[@]}" \
      --concurrency 16 --lengths 32 --runs 8 --deadline $((DL - 120))
  ;;
*) echo "unknown phase $PHASE: stash, run, verify, tune or restarts"; exit 2 ;;
esac
