# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is the stand-in driver's 1.2 measurably slower than 1.1 through the serving benchmark? On this machine (no VM): the
stand-in's user-space packages of both versions are built (tests/lab/dkms/build-standin-debs) and unpacked, the lab
inference server is started with each one's runtime.json (--gpu-runtime) over a version file that says the module of
the same version is loaded, and the collection's benchmark client (bench/sweep.py, what inference_benchmark runs)
measures output tok/s: REPS runs each, alternating, and the throughput gate's statistics judge them.

    . scripts/lib.sh; gpufleet_env; PYTHONPATH=.collections:. python tests/tools/standin_driver_speed.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.sweep import benchmark, config_from_params, run
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.throughput_gate import decide

REPO = Path(__file__).resolve().parents[2]
REPS = 5


def runtime(work: Path, version: str) -> Path:
    out = work / version
    subprocess.run(["dpkg-deb", "-x", str(work / f"gpufleet-nvidia-standin-utils_{version}_all.deb"), str(out)], check=True)
    proc = work / f"proc-{version}"
    proc.write_text(f"NVRM version: gpufleet stand-in Kernel Module  {version}  Release Build  (gpufleet lab)\n")
    path = out / "usr/lib/gpufleet-nvidia-standin/runtime.json"
    doc = json.loads(path.read_text())
    doc["module_version_file"] = str(proc)  # the module "loaded" for this run
    path.write_text(json.dumps(doc))
    return path


def measure(work: Path, version: str, port: int) -> float:
    model = work / "model"
    model.mkdir(exist_ok=True)
    server = subprocess.Popen([sys.executable, str(REPO / "extras/lab_inference_server.py"), "--model", str(model),
                               "--served-model-name", "lab", "--port", str(port), "--gpu-runtime",
                               str(runtime(work, version))], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        cfg = config_from_params({"url": f"http://127.0.0.1:{port}", "model": "lab", "prompt_tokens": 16,
                                  "output_tokens": 32, "concurrency": [4], "requests": 24, "warmup": 4,
                                  "repetitions": 1, "settle_runs": 0, "timeout": 60.0})
        doc = run(benchmark(cfg))
        return doc["levels"][0]["runs"][0]["output_throughput"]
    finally:
        server.terminate()
        server.wait(10)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([str(REPO / "tests/lab/dkms/build-standin-debs"), str(work)], check=True, capture_output=True)
        tok = {"1.1": [], "1.2": []}
        for rep in range(REPS):
            for version in tok:
                tok[version].append(measure(work, version, 18700 + rep * 2 + (version == "1.2")))
        verdict = decide(tok["1.1"], tok["1.2"])
        print(json.dumps({"tok_s": tok, "ratio_median": sorted(tok["1.2"])[REPS // 2] / sorted(tok["1.1"])[REPS // 2],
                          "gate": {k: verdict.get(k) for k in ("verdict", "ratio", "p_value", "reason") if k in verdict}},
                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
