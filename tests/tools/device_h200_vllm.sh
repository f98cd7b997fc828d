#!/usr/bin/env bash
# The vllm_service role's vLLM on the device tool's H200, measured with the collection's own client
# beside `vllm bench serve`, the gate at 0.95 and the measured-tuning stages (tests/tools/h200_vllm.py).
# Read-only towards the hardware: no config-space writes, binds, resets or GPU settings; NVLink multicast
# stays off (the rendered environment must hold the three variables, or the server is not started).
#
# Runs from a copy of the worktree (.h200tree in the device tool's checkout) with the vLLM chunks of
# ../shared/device-vllm carried beside it (.vllmchunks/{01,02,scripts}) and the ansible-core wheels
# in .h200tree/whl (the role's filter renders the command line on the device too). Phases, one device call
# each, back to back (the install in /tmp lives only while the machine stays warm):
#   stage1  probe the machine, stash chunk 01                       (carry .vllmchunks/01 .vllmchunks/scripts)
#   main    install chunk 02, make the model, render and start the baseline server under setsid, then
#           client vs vllm bench serve (compare), run-to-run noise, pcie_facts with the bandwidth probe
#                                                                   (carry .vllmchunks/02 .vllmchunks/scripts)
#   gate    A/A and the known regressions at 0.95, then the measured-tuning stages (resumable: run again)
# Settings: BUDGET (s of work before the phase stops starting new runs, default 540).
#   usage (device tool, from the checkout root): cd .h200tree && OUT=$OUT bash tests/tools/device_h200_vllm.sh PHASE
set -u
PHASE=${1:?phase: stage1, main or gate}
OUT=${OUT:?set OUT to the output directory}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)          # .h200tree
CHUNKS=${CHUNKS:-$ROOT/../.vllmchunks}
S=$(date +%s); DL=$((S + ${BUDGET:-540}))
# shellcheck source=/dev/null
source "$CHUNKS/scripts/common.sh"                  # NVLink multicast off, hub offline, PYTHONPATH=/tmp/site
export PYTHONPATH=/tmp/site:/tmp/ansite:$ROOT/.collections LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1
W=/tmp/h200; mkdir -p "$W"
exec > >(tee -a "$OUT/phase-$PHASE.log") 2>&1
# results are written to $W as they come and copied to $OUT every few seconds (a killed call keeps them)
( while sleep 5; do cp "$W"/*.json "$OUT"/ 2>/dev/null; done ) &
copier=$!
finish() { kill "$copier" 2>/dev/null; cp "$W"/*.json "$OUT"/ 2>/dev/null; for f in "$W"/server-*.log; do [ -f "$f" ] && cp "$f" "$OUT"/; done; echo "$PHASE took $(( $(date +%s) - S )) s"; }
trap finish EXIT
cd "$ROOT" || exit 1
mkdir -p .collections/ansible_collections/gpufleet
ln -sfn ../../.. .collections/ansible_collections/gpufleet/inference
D=(python3 tests/tools/h200_vllm.py)

case $PHASE in
stage1)
  (cd "$ROOT/.." && bash .vllmchunks/scripts/stage1.sh)
  ls -la /opt/torch/.venv/bin/python* "$(dirname "$(dirname "$(command -v python3)")")"/pyvenv.cfg 2>&1
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  ;;
main)
  [ -f /tmp/acc/C.so ] || { echo "chunk 01 missing: the machine was not kept warm; run stage1 again"; exit 2; }
  cp "$CHUNKS"/02/* /tmp/acc/ && python3 "$CHUNKS/scripts/install.py" || exit 2
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ansite whl/*.whl || exit 2
  python3 "$CHUNKS/scripts/make_model.py" /tmp/model 2>&1 | grep -v Writing
  echo "installed and model made at t=$(( $(date +%s) - S ))"
  "${D[@]}" render --host-vars tests/tools/h200/host_vars.yml --profiles tests/tools/h200/profiles.yml --out "$W/rendered" || exit 2
  python3 - "$W/rendered" "$W/rendered.json" <<'PY'
import json, os, sys
d = sys.argv[1]
json.dump({f[:-5]: json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d))}, open(sys.argv[2], "w"), indent=1)
PY
  "${D[@]}" serve --rendered "$W/rendered/baseline.json" --log "$W/server-baseline.log" --record "$W/server-baseline.json" --timeout 300 \
    || { tail -60 "$W/server-baseline.log"; exit 1; }
  echo "baseline ready at t=$(( $(date +%s) - S ))"
  VB=".vllmbench"; printf '#!/bin/sh\nexec python3 -c "%s" "$@"\n' \
    "import sys; from vllm.benchmarks import serve; from vllm.utils.argparse_utils import FlexibleArgumentParser as P; p=P(prog='vllm bench serve'); serve.add_cli_args(p); serve.main(p.parse_args(sys.argv[1:]))" > $VB
  chmod +x $VB
  timeout $((DL - $(date +%s) + 30)) "${D[@]}" compare --out "$W/compare.json" --vllm-cmd "./$VB" --tokenizer /tmp/model \
    --concurrency 16 64 256 --requests-per-slot 8 --rounds 3 --deadline $((DL - 170))
  echo "compare rc=$? at t=$(( $(date +%s) - S ))"
  # pcie_facts with the bandwidth probe while one run at c=64 streams from the server
  echo '{"ANSIBLE_MODULE_ARGS": {"bandwidth_probe": true, "probe_size_mb": 256}}' > "$W/pcie-args.json"
  ( sleep 3; python3 plugins/modules/pcie_facts.py "$W/pcie-args.json" > "$W/pcie_facts.json" 2> "$W/pcie_facts.err" ) &
  probe=$!
  "${D[@]}" noise --out "$W/pcie_run.json" --concurrency 64 --lengths 16 --runs 2 --deadline $((DL - 120))
  wait "$probe"   # not a bare wait: the copier runs in the background until the end (the H200 run lost its noise step to that)
  tail -3 "$W/pcie_facts.err"
  timeout $((DL - $(date +%s) + 20)) "${D[@]}" noise --out "$W/noise.json" --concurrency 16 64 256 --lengths 2 8 --runs 8 --deadline $((DL - 10))
  echo "noise rc=$?"
  ;;
gate)
  [ -d /tmp/site/vllm ] || { echo "site missing: the machine was not kept warm; run stage1 and main again"; exit 2; }
  rec=$(python3 -c "import json;print(json.load(open('$W/server-baseline.json'))['pid'])")
  curl -sf http://127.0.0.1:8000/health > /dev/null || {
    echo "baseline server $rec not answering: starting it again"
    "${D[@]}" serve --rendered "$W/rendered/baseline.json" --log "$W/server-baseline.log" --record "$W/server-baseline.json" --timeout 300 || exit 1; }
  if [ ! -f "$W/gate.done" ]; then
    timeout $((DL - $(date +%s) + 30)) "${D[@]}" gate --out "$W/gate.json" --rendered-dir "$W/rendered" --logdir "$W" \
      --concurrency 64 --requests-per-slot 8 --candidates eager seqs8 hog --server-record "$W/server-baseline.json" \
      --deadline $((DL - 60)) && touch "$W/gate.done"
    echo "gate rc=$? at t=$(( $(date +%s) - S ))"
  fi
  timeout $((DL - $(date +%s) + 30)) "${D[@]}" tune --out "$W/tune.json" --profiles tests/tools/h200/profiles.yml \
    --host-vars tests/tools/h200/host_vars.yml --logdir "$W" --concurrency 64 --requests-per-slot 8 --deadline "$DL"
  echo "tune rc=$?"
  ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
