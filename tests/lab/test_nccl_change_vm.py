"""NCCL settings changes behind the serving verdict, for real, in one VM of the lab (issue 36).

The vLLM unit runs the lab server (extras/lab_inference_server.py) as the lab's VMs always do, through a small stand-in
entry point copied to the VM here (``STAND_IN``): it runs the lab server in the unit's own process with the unit's
arguments, and adds the lab server's documented perturbation ``--output-noise 0.3`` when its environment has an
``NCCL_ALGO`` that forces Tree. That is the stand-in's only tie to NCCL, and it stands for what a forced algorithm does
to a real model: the reduction order changes, and so do the sums. No figure is made up: the gate, the outputs check and
the verdict measure the lab server as it runs.

* ``playbooks/serve.yml`` (nccl_env, vllm_service) writes pcie_safe's files and starts the unit on them;
* a candidate the host lint refuses (``NCCL_PROTO=LL``) is refused before anything changes; checked on the VM: both
  files' bytes, the unit's process (same pid) and no journal;
* ``p2p_off`` serves the same outputs: ``playbooks/nccl_change.yml`` keeps it (``pass``); checked on the VM: the
  EnvironmentFile holds it, the unit's main process environment (``/proc/PID/environ``) holds exactly its NCCL_*
  values, the journal is archived with stage committed, no reboot;
* ``p2p_off`` with ``NCCL_ALGO=Tree`` (the lint finding allowed): the outputs diverge, the change is rolled back
  (``diverged``); checked on the VM: both files hold their bytes from before (sha256), the unit's process environment
  holds the old values again (a new pid: it was restarted), the journal is archived with stage rolled_back, no reboot.

    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock env GPUFLEET_LAB_BASE_PORT=2761 python -m pytest -m e2e -x -v tests/lab/test_nccl_change_vm.py
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.lab.labutil import (INVENTORY_DIR, LAB_DIR, REPO, ansible_env, boot_id, lab_ssh, one_vm, play_recap, run)

# e2e: about 20-40 min under TCG (two changes with benchmarks); opt-in
pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

VM = "lab1"
WORK = LAB_DIR / "nccl_change_vm"
STAND_IN = "/opt/gpufleet/lab/nccl_stand_in.py"
FILES = ("/etc/nccl.conf", "/etc/gpufleet/nccl.env")
JOURNAL = "/var/lib/gpufleet/nccl_change/journal.json"
STAND_IN_SOURCE = """import os
import runpy
import sys

# tests/lab/test_nccl_change_vm.py: the lab server in this process; a forced Tree algorithm perturbs its outputs
SERVER = "/opt/gpufleet/lab/lab_inference_server.py"
flags = ["--output-noise", "0.3"] if "tree" in os.environ.get("NCCL_ALGO", "").lower() else []
sys.argv = [SERVER] + sys.argv[1:] + flags
runpy.run_path(SERVER, run_name="__main__")
"""
SERVE = {"vllm_service_command": ["/usr/bin/python3", STAND_IN], "nccl_env_ab": False}
# the lab's emulated VM: a wide margin for throughput (TCG) and latency left unjudged, as the vLLM upgrade's lab test
# does; the outputs part is what says no here
CHANGE = {
    "nccl_change_restart_ok": True, "nccl_change_serial": [1], "nccl_change_gate_threshold": 0.40,
    "nccl_change_gate_latency_margins": {"ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": None},
    "nccl_change_ready_timeout": 300, "nccl_change_outputs_prompt_lengths": ["short"],
    "nccl_change_outputs_max_tokens": 8,
    "inference_benchmark_url": "http://127.0.0.1:8000", "inference_benchmark_model": "lab",
    "inference_benchmark_prompt_tokens": 16, "inference_benchmark_output_tokens": 16,
    "inference_benchmark_concurrency": [4], "inference_benchmark_requests": 32, "inference_benchmark_warmup": 4,
    "inference_benchmark_settle_runs": 0, "inference_benchmark_timeout": 120,
}


def playbook(path: str, *args: str, timeout: int = 3600):
    r = run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, path, "--limit", VM, *args],
            timeout=timeout, env=ansible_env())
    (WORK / f"{os.path.basename(path)}-{int(time.time())}.log").write_text(r.stdout + "\n" + r.stderr)
    return r


def ok(r, what: str) -> None:
    assert r.returncode == 0, f"{what} failed (rc {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    recap = play_recap(r.stdout).get(VM, {})
    assert recap.get("failed", 1) == 0 and recap.get("unreachable", 1) == 0, recap


def main_pid() -> int:
    return int(lab_ssh(VM, "systemctl show -p MainPID --value vllm.service").strip())


def environ() -> dict:
    """The NCCL_* and CUDA_DEVICE_ORDER variables the unit's main process started with, read on the VM."""
    text = lab_ssh(VM, f"tr '\\0' '\\n' < /proc/{main_pid()}/environ")
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: v for k, v in pairs if k.startswith("NCCL_") or k == "CUDA_DEVICE_ORDER"}


def sums() -> dict:
    return dict(reversed(line.split()) for line in lab_ssh(VM, "sha256sum " + " ".join(FILES)).splitlines())


def serving() -> bool:
    return '"lab"' in lab_ssh(VM, "python3 -c \"import urllib.request;print(urllib.request.urlopen("
                                  "'http://127.0.0.1:8000/v1/models').read().decode())\"")


def archived(target: str) -> dict:
    names = lab_ssh(VM, f"ls -t /var/lib/gpufleet/nccl_change/history/ | grep -- '-{target}.json$' | head -1").strip()
    assert names, f"no archived journal of {target}"
    return json.loads(lab_ssh(VM, f"cat /var/lib/gpufleet/nccl_change/history/{names}"))


@pytest.fixture(scope="module")
def vm():
    """lab1 alone, serving the lab server on pcie_safe's NCCL files; powered off at the module's end."""
    with one_vm(WORK):
        lab_ssh(VM, f"mkdir -p /opt/gpufleet/lab && cat > {STAND_IN} && chmod 0755 {STAND_IN}", stdin=STAND_IN_SOURCE)
        serve = WORK / "serve.json"
        serve.write_text(json.dumps(SERVE))
        r = playbook("playbooks/serve.yml", "--tags", "nccl_env,vllm_service", "-e", "gpufleet_site_benchmark=never",
                     "-e", f"@{serve}", timeout=1800)
        ok(r, "serve.yml with pcie_safe's NCCL files")
        assert serving() and environ().get("NCCL_P2P_LEVEL") == "PXB", environ()
        yield VM


def change(name: str, extra: dict, timeout: int = 3600):
    path, report = WORK / f"change-{name}.json", WORK / f"report-{name}"
    path.write_text(json.dumps({**CHANGE, **SERVE, **extra}, indent=1))
    t0 = time.time()
    r = playbook("playbooks/nccl_change.yml", "-e", f"@{path}", "-e", f"nccl_change_fleet_report_dir={report}",
                 timeout=timeout)
    print(f"nccl_change {name}: {time.time() - t0:.0f} s")
    rec = json.loads((report / "hosts" / f"{VM}.json").read_text())
    return r, rec


def test_a_candidate_the_lint_refuses_changes_nothing(vm):
    before, pid = sums(), main_pid()
    r, rec = change("refused", {"nccl_change_profile": "p2p_off", "nccl_change_settings": {"NCCL_PROTO": "LL"}},
                    timeout=900)
    assert r.returncode != 0 and rec["decision"] == "refused", rec["reason"]
    assert "[nccl_proto_forced]" in rec["reason"] and "Nothing was changed" in rec["reason"], rec["reason"]
    assert sums() == before and main_pid() == pid
    assert lab_ssh(VM, f"test -e {JOURNAL} && echo open || echo none").strip() == "none"


def test_settings_that_serve_as_well_are_kept_and_the_process_runs_them(vm):
    boot = boot_id(VM)
    r, rec = change("p2p_off", {"nccl_change_profile": "p2p_off"})
    ok(r, "nccl_change.yml to p2p_off")
    print(json.dumps({k: {"says": p["says"], "reason": p["reason"]} for k, p in rec["verdict"]["parts"].items()}, indent=1))
    assert rec["decision"] == "pass" and rec["kind"] == "nccl", rec["reason"]
    want = {k: v for k, v in rec["settings"].items() if k.startswith("NCCL_") or k == "CUDA_DEVICE_ORDER"}
    assert want["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in want
    # on the VM: the EnvironmentFile holds the candidate, the unit's process runs exactly it, the journal is archived
    assert "NCCL_P2P_DISABLE=1" in lab_ssh(VM, f"cat {FILES[1]}").splitlines()
    assert environ() == want
    done = archived(rec["target"])
    assert done["stage"] == "committed" and done["verify"]["environ"] == rec["settings"]
    assert lab_ssh(VM, f"test -e {JOURNAL} && echo open || echo none").strip() == "none"
    assert serving() and boot_id(VM) == boot


def test_settings_whose_outputs_diverge_are_put_back_byte_for_byte(vm):
    before, old_env, old_pid, boot = sums(), environ(), main_pid(), boot_id(VM)
    r, rec = change("tree", {"nccl_change_profile": "p2p_off", "nccl_change_settings": {"NCCL_ALGO": "Tree"},
                             "nccl_change_allow_findings": ["nccl_algo_forced"]})
    assert r.returncode != 0, "the change must fail: the outputs diverged under the forced Tree algorithm"
    parts = rec["verdict"]["parts"]
    print(json.dumps({k: {"says": p["says"], "reason": p["reason"]} for k, p in parts.items()}, indent=1))
    assert rec["decision"] == "diverged", (rec["reason"], r.stdout[-6000:])
    assert parts["outputs"]["answer"] == "diverged", parts
    # on the VM: both files hold their bytes from before, the restarted process runs the old values, no reboot
    assert sums() == before
    assert environ() == old_env and "NCCL_ALGO" not in environ() and main_pid() != old_pid
    done = archived(rec["target"])
    assert done["stage"] == "rolled_back" and done["verify"]["environ"]["NCCL_ALGO"] == "Tree"
    assert serving() and boot_id(VM) == boot
