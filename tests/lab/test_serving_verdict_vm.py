"""The serving verdict says no, for real, in one VM of the lab (issue 33, item 6).

1. ``playbooks/tune_measured.yml`` on lab1 with one vLLM flag stage that holds every streamed request's first
   token back 800 ms (the lab server's ``--first-token-hold-ms``: its tokens are generated as before, so the
   throughput stays): the stage is measured, its outputs compared with the reference recorded at the baseline, the
   host audited; the verdict is a latency ``regression`` while the throughput part says yes, and the stage is
   reverted. Checked on the VM: the server's unit runs without the hold again.
2. ``playbooks/kernel_upgrade.yml`` on lab1 (6.1.0-50 -> 6.1.0-56), the server started through a Python wrapper that
   adds ``--output-noise 0.3`` only under the new kernel (a build whose arithmetic went wrong with the kernel): the output
   reference is recorded on the old kernel, the candidate is as fast but ``diverged``, and the upgrade rolls back.
   Checked on the VM: the old kernel runs and is GRUB's saved default with no one-shot entry, it is held again, the
   reference file is there, the server serves.

The module boots its own single VM (``lab up 1``) and powers it off at its end, like test_measured_vm.py. The
reports and logs go to .lab/serving_verdict_vm/.

    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock env GPUFLEET_LAB_BASE_PORT=2621 python -m pytest -m e2e -x -v tests/lab/test_serving_verdict_vm.py
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.lab.labutil import (INVENTORY_DIR, LAB_DIR, REPO, ansible_env, lab_ssh, one_vm, play_recap, run)

# e2e: about 30-45 min under TCG (a kernel install, two reboots, benchmarks); opt-in
pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

VM = "lab1"
WORK = LAB_DIR / "serving_verdict_vm"
OLD = "6.1.0-50-cloud-amd64"
NEW = "6.1.0-56-cloud-amd64"
SERVER = "/opt/gpufleet/lab/lab_inference_server.py"
# the lab's own server arguments (inventories/lab/group_vars/lab_vms.yml), and the same with the first token held
LAB_ARGS = ["--work", "4", "--step-work", "32", "--prefill-work", "1"]
HOLD_MS = 800
# 128 output tokens at 4 in flight take about 2 s a request under TCG: the 800 ms hold ends long before the request
# does, so the runs' tok/s stay, and their TTFT (about 0.1-0.3 s) grows several-fold
PROFILE = {"name": "lab_interactive", "prompt_tokens": 16, "output_tokens": 128, "concurrency": [4], "requests": 16,
           "repetitions": 5, "warmup": 4, "settle_runs": 0}
# the short prompts only (the stand-in's context is 1024 tokens here), 8 tokens each: under a minute under TCG
OUTPUTS = {"prompt_lengths": ["short"], "max_tokens": 8}
# The server changed under the new kernel only: a Python wrapper that runs the lab server in its own process
# (vllm_service checks the live process's argv against the unit's, so no exec to another program), adding its flags
# when the new kernel runs. Written to /opt/gpufleet/lab/<name>.py by serve_through_wrapper().


def wrapper(name: str, flags: list[str]) -> str:
    return f"""import os
import runpy
import sys

# tests/lab/test_serving_verdict*_vm.py ({name}): the lab server with {' '.join(flags)} under kernel {NEW} only
if os.uname().release == "{NEW}":
    sys.argv += {json.dumps(flags)}
sys.argv[0] = "{SERVER}"
runpy.run_path("{SERVER}", run_name="__main__")
"""


def serve_through_wrapper(name: str, flags: list[str]) -> list[str]:
    """Install wrapper(name, flags) on the VM and serve through it (serve.yml); its command, for the kernel run."""
    path = f"/opt/gpufleet/lab/{name}.py"
    lab_ssh(VM, f"cat > {path} && chmod 0644 {path}", stdin=wrapper(name, flags))
    command = ["/usr/bin/python3", path]
    r = playbook("playbooks/serve.yml", "--tags", "vllm_service", "-e", "gpufleet_site_benchmark=never",
                 "-e", json.dumps({"vllm_service_command": command}), timeout=1800)
    ok(r, "serve.yml with the wrapper")
    assert f"{name}.py" in exec_start() and lab_ssh(VM, "uname -r").strip() == OLD
    return command


# The kernel test is about the outputs: its latency part is left unjudged (margins null), as the emulated VM's TTFT
# and TPOT vary by 60-90% run to run on a loaded host (a first run, 2026-12-04, stopped before any change with
# "inconclusive on latency: TTFT p50 too noisy for a +10% margin (CV 73.3%)", honestly); the latency no is the flag
# stage's test above, where the hold is a 13x change.
KERNEL = {
    "kernel_upgrade_gate_latency_margins": {"ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": None, "itl_p99": None},
    "kernel_upgrade_target": NEW, "kernel_upgrade_reboot_ok": True, "kernel_upgrade_serial": [1],
    "kernel_upgrade_reboot_timeout": 1500, "kernel_upgrade_gate_threshold": 0.40, "kernel_upgrade_vllm_timeout": 300,
    "kernel_upgrade_outputs_prompt_lengths": OUTPUTS["prompt_lengths"], "kernel_upgrade_outputs_max_tokens": OUTPUTS["max_tokens"],
    "inference_benchmark_url": "http://127.0.0.1:8000", "inference_benchmark_model": "lab",
    "inference_benchmark_prompt_tokens": 16, "inference_benchmark_output_tokens": 16,
    "inference_benchmark_concurrency": [4], "inference_benchmark_requests": 32, "inference_benchmark_warmup": 4,
    "inference_benchmark_settle_runs": 0, "inference_benchmark_timeout": 120,
}


def playbook(path: str, *args: str, timeout: int = 3600, work=WORK):
    """ansible-playbook on the VM; its output is logged to ``work``."""
    r = run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, path, "--limit", VM, *args],
            timeout=timeout, env=ansible_env())
    (work / f"{os.path.basename(path)}-{int(time.time())}.log").write_text(r.stdout + "\n" + r.stderr)
    return r


def ok(r, what: str) -> None:
    assert r.returncode == 0, f"{what} failed (rc {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    recap = play_recap(r.stdout).get(VM, {})
    assert recap.get("failed", 1) == 0 and recap.get("unreachable", 1) == 0, recap


def exec_start() -> str:
    return lab_ssh(VM, "systemctl show -p ExecStart --value vllm.service; tr '\\0' ' ' < /proc/$(systemctl show -p "
                       "MainPID --value vllm.service)/cmdline")


def serving() -> bool:
    return '"lab"' in lab_ssh(VM, "python3 -c \"import urllib.request;print(urllib.request.urlopen("
                                  "'http://127.0.0.1:8000/v1/models').read().decode())\"")


@pytest.fixture(scope="module")
def vm():
    """lab1 alone, booted for this module and powered off at its end."""
    yield from single_vm()


def single_vm(work=WORK, serve_vars: dict | None = None):
    """lab1 alone, its image built, booted and serving through serve.yml (with ``serve_vars`` as extra vars); powered
    off when the generator ends (the module fixture of this file, of test_serving_verdict_stability_vm.py and of
    test_profiles_vm.py; ``work``, made anew, holds the logs)."""
    with one_vm(work):
        more = ["-e", json.dumps(serve_vars)] if serve_vars else []
        r = playbook("playbooks/serve.yml", "--tags", "vllm_service", "-e", "gpufleet_site_benchmark=never", *more,
                     timeout=1800, work=work)
        ok(r, "serve.yml --tags vllm_service")
        yield VM


def test_a_flag_stage_slower_to_its_first_token_at_equal_throughput_is_reverted(vm):
    assert "--first-token-hold-ms" not in exec_start()
    settings = WORK / "tune.json"
    report = WORK / "tune_measured"
    settings.write_text(json.dumps({
        "tune_measured_stages": [], "tune_measured_profiles": [PROFILE],
        "tune_measured_vllm_profiles": [{"name": "first_token_hold", "description": f"first token held {HOLD_MS} ms",
                                         "vars": {"vllm_service_extra_args": LAB_ARGS + ["--first-token-hold-ms",
                                                                                         str(HOLD_MS)]}}],
        "tune_measured_gate": {"threshold": 0.40}, "tune_measured_more_rounds": 1,
        "tune_measured_outputs_prompt_lengths": OUTPUTS["prompt_lengths"],
        "tune_measured_outputs_max_tokens": OUTPUTS["max_tokens"], "tune_measured_served_model_name": "lab",
        "tune_measured_report_dir": str(report), "gpufleet_history_db": str(WORK / "history.sqlite"),
        "tune_measured_ready_timeout": 600}, indent=1))
    t0 = time.time()
    r = playbook("playbooks/tune_measured.yml", "-e", f"@{settings}", timeout=3600)
    print(f"tune_measured: {time.time() - t0:.0f} s")
    ok(r, "tune_measured.yml")
    state = json.loads((report / f"{VM}.json").read_text())
    stage = next(s for s in state["stages"] if s["name"] == "first_token_hold")
    parts = stage["serving"]["parts"]
    print(json.dumps({k: {"says": p["says"], "reason": p["reason"]} for k, p in parts.items()}, indent=1))
    assert stage["status"] == "reverted" and stage["verdict"] == "regression", stage["reason"]
    assert parts["latency"]["says"] == "no" and "ttft" in parts["latency"]["reason"].lower(), parts["latency"]
    assert parts["throughput"]["says"] == "yes", parts["throughput"]
    assert parts["outputs"]["answer"] == "equivalent" and parts["stability"]["says"] == "yes", parts
    # on the VM: the unit runs the server without the hold again
    assert "--first-token-hold-ms" not in exec_start() and serving()
    assert "| first_token_hold | regression | yes" in (report / "stages.md").read_text()


def test_a_kernel_that_changes_the_outputs_is_rolled_back_as_diverged(vm):
    noisy = serve_through_wrapper("noisy_on_new_kernel", ["--output-noise", "0.3"])
    settings = WORK / "kernel.json"
    settings.write_text(json.dumps({**KERNEL, "vllm_service_command": noisy}))
    report = WORK / "kernel_upgrade"
    t0 = time.time()
    r = playbook("playbooks/kernel_upgrade.yml", "-e", f"@{settings}", "-e", f"kernel_upgrade_fleet_report_dir={report}",
                 timeout=5400)
    print(f"kernel_upgrade: {time.time() - t0:.0f} s")
    assert r.returncode != 0, "the upgrade must fail: the new kernel's outputs diverged"
    rec = json.loads((report / "hosts" / f"{VM}.json").read_text())
    parts = rec["verdict"]["parts"]
    print(json.dumps({k: {"says": p["says"], "reason": p["reason"]} for k, p in parts.items()}, indent=1))
    assert rec["decision"] == "diverged", (rec["reason"], r.stdout[-6000:])
    assert parts["outputs"]["answer"] == "diverged" and parts["outputs"]["figures"]["top1_agreement"] < 0.9
    assert parts["throughput"]["says"] == "yes", parts["throughput"]
    assert rec["final_kernel"] == OLD and rec["default_kernel"] == OLD
    # on the VM: the old kernel runs and is the saved default, nothing pending, held again, serving, reference kept
    assert lab_ssh(VM, "uname -r").strip() == OLD
    env = dict(line.split("=", 1) for line in lab_ssh(VM, "grub-editenv /boot/grub/grubenv list").splitlines() if "=" in line)
    assert OLD in env.get("saved_entry", "") and not env.get("next_entry"), env
    assert f"linux-image-{OLD}" in lab_ssh(VM, "apt-mark showhold").split()
    assert lab_ssh(VM, "test -s /var/lib/gpufleet/kernel_upgrade/outputs-reference.json && echo kept").strip() == "kept"
    assert serving()
    md = (report / "fleet.md").read_text()
    assert f"| {VM} | **diverged** |" in md and "  - outputs: no (diverged)" in md
