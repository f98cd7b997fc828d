# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measured tuning of vLLM flag stages against the LAB STAND-IN server on 127.0.0.1 (not vLLM).

The same decisions as playbooks/tune_measured.yml (module_utils/tuning/tune_measured: baseline, each
stage alone, gated against the state before it, keep or revert), with the playbook's two outside
steps done here for real: "apply" restarts extras/lab_inference_server.py with the stage's flags
(vllm_service_max_num_seqs -> --max-num-seqs; the stand-in batches up to that many sequences per
engine step, as vLLM does), and "benchmark" runs the collection's client (inference_client) at each
profile. The stage table and the history are rendered from what was measured.

    python3 tests/tools/measured_standin.py OUTDIR [--baseline-seqs 2] [--stages 16,1]

Writes OUTDIR/stage_table.md, stage_table.html, state.json, history.sqlite, history.md, history.html.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _p in (os.path.join(REPO, ".collections"), REPO):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history_report as hr  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import stage_table as st  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning import tune_measured as tm  # noqa: E402
from tests.tools.inference_client import (  # noqa: E402
    BenchmarkConfig, benchmark, results_document, run)
from tests.unit.test_lab_inference_server import LabServer  # noqa: E402

FLAG = {"vllm_service_max_num_seqs": "--max-num-seqs"}
SERVER_ARGS = ["--work", "16", "--step-work", "4096", "--max-model-len", "512"]
NOTE = ("Made by tests/tools/measured_standin.py against extras/lab_inference_server.py (the lab stand-in, "
        "not vLLM) on 127.0.0.1 of a shared 2-core machine; the stand-in batches up to --max-num-seqs sequences "
        "per engine step.")


def server_argv(flags: dict) -> list[str]:
    argv = list(SERVER_ARGS)
    for key, value in flags.items():
        if key not in FLAG:
            raise SystemExit(f"the stand-in has no equivalent of {key}")
        if value:
            argv += [FLAG[key], str(value)]
    return argv


def measure(url: str, profile: dict, repetitions: int | None, host: str, stage: str) -> dict:
    cfg = BenchmarkConfig(url=url, prompt_tokens=profile["prompt_tokens"], output_tokens=profile["output_tokens"],
                          concurrency=profile["concurrency"], requests=profile["requests"],
                          warmup=profile.get("warmup", 8), repetitions=repetitions or profile["repetitions"],
                          settle_runs=profile.get("settle_runs", 0), token_id_range=[100, 4000])
    out = run(benchmark(cfg))
    return results_document(out, label=f"tm-{stage}", host=host, kernel=os.uname().release, tuning={"stage": stage})


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--baseline-seqs", type=int, default=2)
    ap.add_argument("--stages", default="16,1", help="max_num_seqs of each stage, in order")
    ap.add_argument("--threshold", default="auto")
    ap.add_argument("--host", default="standin-loopback")
    args = ap.parse_args(argv)
    os.makedirs(args.outdir, exist_ok=True)
    profiles = tm.resolve_profiles([
        {"name": "serving", "prompt_tokens": 32, "output_tokens": 16, "concurrency": [16], "requests": 48,
         "repetitions": 5, "settle_runs": 2},
        {"name": "latency", "prompt_tokens": 32, "output_tokens": 16, "concurrency": [1], "requests": 8,
         "repetitions": 5},
        {"name": "long_context", "prompt_tokens": "near_max", "output_tokens": 16, "concurrency": [2], "requests": 4,
         "repetitions": 5}], max_model_len=512)
    stages = [{"name": f"max_num_seqs_{n}", "kind": "vllm", "role": "gpufleet.inference.vllm_service",
               "vars": {"vllm_service_max_num_seqs": int(n)}} for n in args.stages.split(",")]
    state = tm.new_state(args.host, tm.plan_stages(stages), profiles, {"threshold": args.threshold if args.threshold == "auto" else float(args.threshold)},
                         vllm_defaults={"vllm_service_max_num_seqs": args.baseline_seqs},
                         started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    db = bh.connect(os.path.join(args.outdir, "history.sqlite"))
    model = tempfile.mkdtemp(prefix="standin-model-")
    flags = {"vllm_service_max_num_seqs": args.baseline_seqs}
    server = LabServer(model, *server_argv(flags))
    try:
        while True:
            act = tm.next_action(state)
            if act["action"] == "done":
                break
            docs = []
            if act["action"] in ("apply", "revert"):
                for task in act["tasks"]:
                    flags = {k: v for k, v in task["vars"].items() if k in FLAG}
                server.stop()
                server = LabServer(model, *server_argv(flags))
            elif act["action"] == "benchmark":
                for prof in act["profiles"]:
                    doc = measure(server.url, prof, act["repetitions"], args.host, act["stage"])
                    bh.append(db, doc, source="tune_measured", vllm_version="gpufleet-lab-1", profile=prof["name"],
                              stage=act["stage"])
                    docs.append(doc)
            tm.complete(state, act["id"], docs)
            print(f"{act['action']:9} {act['stage']:18} flags={flags}", flush=True)
        state["final_flags"] = flags
        state["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # the server the loop leaves running serves the kept flags
        state["final_server_argv"] = server.argv[server.argv.index("--port") + 2:]
    finally:
        server.stop()
    with open(os.path.join(args.outdir, "state.json"), "w", encoding="utf-8") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
    with open(os.path.join(args.outdir, "stage_table.md"), "w", encoding="utf-8") as fh:
        fh.write(st.render_markdown([state], note=NOTE))
    with open(os.path.join(args.outdir, "stage_table.html"), "w", encoding="utf-8") as fh:
        fh.write(st.render_html([state], note=NOTE))
    report = hr.build(bh.series(db), threshold=state["gate"]["threshold"])
    with open(os.path.join(args.outdir, "history.md"), "w", encoding="utf-8") as fh:
        fh.write(hr.render_markdown(report))
    with open(os.path.join(args.outdir, "history.html"), "w", encoding="utf-8") as fh:
        fh.write(hr.render_html(report))
    db.close()
    for line in tm.summary(state):
        print(f"{line['stage']:18} {line['status']:9} {line['verdict'] or '':13} {line['reason']}")
    return state


if __name__ == "__main__":
    main()
