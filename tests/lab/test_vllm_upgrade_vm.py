"""vLLM upgrades behind the serving verdict, for real, in one VM of the lab (issue 36).

The "vLLM" here is the lab server (extras/lab_inference_server.py, copied to the VM by the lab) packaged as a wheel
named ``vllm``: its ``vllm.entrypoints.openai.api_server`` runs the lab server in its own process with the unit's
arguments. The wheels are built offline in this test (zipfile, a RECORD with sha256 hashes) into wheelhouses with the
controller's pip wheel (the VM has no ensurepip), and the vllm_service role installs them into versioned venvs under
/opt/gpufleet/vllm, exactly as it installs vLLM:

* 0.32.0 is served first (playbooks/serve.yml, vllm_service_install true, from its wheelhouse);
* 0.33.1 serves the same outputs: ``playbooks/vllm_upgrade.yml`` keeps it (``pass``); checked on the VM: the unit's
  link points at 0.33.1's venv, the old venv is still there, the unit's process runs from the new venv, the journal
  is archived with stage committed;
* 0.34.0 adds ``--output-noise 0.3`` (a release whose arithmetic went wrong): the upgrade is switched back
  (``diverged``, the outputs part says no, the throughput part yes); checked on the VM: the link points at 0.33.1's
  venv again, the unit runs from it and serves, no reboot happened (same boot id);
* 0.35.0 serves the same outputs; the controller (ansible-playbook and its session) is killed with SIGKILL once the
  host's journal reaches stage candidate; a plain re-run takes over the dead run's lease, resumes from the journal
  (the recorded baseline, not a new one) and keeps it; checked on the VM.

    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock env GPUFLEET_LAB_BASE_PORT=2701 python -m pytest -m e2e -x -v tests/lab/test_vllm_upgrade_vm.py
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from tests.lab.labutil import (INVENTORY_DIR, LAB_DIR, REPO, ansible_env, boot_id, lab_ssh, one_vm, play_recap, run)

# e2e: about 30-50 min under TCG (three upgrades with benchmarks, one of them killed and resumed); opt-in
pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

VM = "lab1"
WORK = LAB_DIR / "vllm_upgrade_vm"
SERVER = "/opt/gpufleet/lab/lab_inference_server.py"
BASE = "/opt/gpufleet/vllm"
JOURNAL = "/var/lib/gpufleet/vllm_upgrade/journal.json"
PIP_WHEELS = sorted(Path("/usr/share/python-wheels").glob("pip-*.whl"))
# the release each wheel stands for, and the flags it adds to the lab server
RELEASES = {"0.32.0": [], "0.33.1": [], "0.34.0": ["--output-noise", "0.3"], "0.35.0": []}
SERVE = {"vllm_service_install": True, "vllm_service_command": [], "vllm_service_python": "/usr/bin/python3",
         "vllm_service_keep_venvs": 5}
# the lab's emulated VM: a wide margin for throughput (TCG) and latency left unjudged, as the kernel's lab test does;
# the outputs part is what says no here
UPGRADE = {
    "vllm_upgrade_restart_ok": True, "vllm_upgrade_serial": [1], "vllm_upgrade_gate_threshold": 0.40,
    "vllm_upgrade_gate_latency_margins": {"ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": None, "itl_p99": None},
    "vllm_upgrade_ready_timeout": 300, "vllm_upgrade_outputs_prompt_lengths": ["short"],
    "vllm_upgrade_outputs_max_tokens": 8,
    "inference_benchmark_url": "http://127.0.0.1:8000", "inference_benchmark_model": "lab",
    "inference_benchmark_prompt_tokens": 16, "inference_benchmark_output_tokens": 16,
    "inference_benchmark_concurrency": [4], "inference_benchmark_requests": 32, "inference_benchmark_warmup": 4,
    "inference_benchmark_settle_runs": 0, "inference_benchmark_timeout": 120,
}
# the release the unit's process runs, written at its start into the unit's only writable directory
STARTED = "/var/lib/vllm/lab-vllm-started.json"
API_SERVER = """import json
import os
import runpy
import sys

# tests/lab/test_vllm_upgrade_vm.py: "vLLM" {version}, the lab server with {flags}
try:
    with open({started!r}, "w") as fh:
        json.dump({{"version": {version!r}, "prefix": os.path.realpath(sys.prefix), "flags": {flags!r},
                   "pid": os.getpid()}}, fh)
except OSError:
    pass
sys.argv = [{server!r}] + sys.argv[1:] + {flags!r}
runpy.run_path({server!r}, run_name="__main__")
"""


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path, version: str, flags: list[str]) -> Path:
    """A wheel named vllm of ``version`` whose api_server runs the lab server with ``flags``; offline, by zipfile."""
    dist = f"vllm-{version}.dist-info"
    files = {
        "vllm/__init__.py": f'__version__ = "{version}"\n'.encode(),
        "vllm/entrypoints/__init__.py": b"",
        "vllm/entrypoints/openai/__init__.py": b"",
        "vllm/entrypoints/openai/api_server.py":
            API_SERVER.format(version=version, flags=flags, server=SERVER, started=STARTED).encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: lab stand-in\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpufleet-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([_record_line(n, d) for n, d in files.items()] + [f"{dist}/RECORD,,", ""])
    path = directory / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr(f"{dist}/RECORD", record)
    return path


def wheelhouse(version: str) -> Path:
    """A directory with the wheel of ``version`` and pip (the VM's python3 has no ensurepip)."""
    directory = WORK / f"wheelhouse-{version}"
    directory.mkdir(parents=True, exist_ok=True)
    build_wheel(directory, version, RELEASES[version])
    shutil.copy(PIP_WHEELS[-1], directory)
    return directory


def playbook(path: str, *args: str, timeout: int = 3600):
    r = run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, path, "--limit", VM, *args],
            timeout=timeout, env=ansible_env())
    (WORK / f"{os.path.basename(path)}-{int(time.time())}.log").write_text(r.stdout + "\n" + r.stderr)
    return r


def ok(r, what: str) -> None:
    assert r.returncode == 0, f"{what} failed (rc {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    recap = play_recap(r.stdout).get(VM, {})
    assert recap.get("failed", 1) == 0 and recap.get("unreachable", 1) == 0, recap


def settings(version: str) -> Path:
    path = WORK / f"upgrade-{version}.json"
    path.write_text(json.dumps({**UPGRADE, **SERVE, "vllm_upgrade_version": version,
                                "vllm_upgrade_wheelhouse": str(wheelhouse(version))}, indent=1))
    return path


def current() -> tuple[str, str]:
    """(the venv the unit's link points at, the version its marker records), read on the VM."""
    venv = lab_ssh(VM, f"readlink {BASE}/current").strip()
    marker = json.loads(lab_ssh(VM, f"cat {venv}/.gpufleet-complete"))
    return venv, marker["version"]


def running_release() -> dict:
    """What the unit's main process runs: the release, its venv (sys.prefix: the link resolved at its start) and
    flags, as its api_server wrote them at start; checked to be this process's (its pid)."""
    started = json.loads(lab_ssh(VM, f"cat {STARTED}"))
    assert started["pid"] == int(lab_ssh(VM, "systemctl show -p MainPID --value vllm.service").strip()), started
    return started


def serving() -> bool:
    return '"lab"' in lab_ssh(VM, "python3 -c \"import urllib.request;print(urllib.request.urlopen("
                                  "'http://127.0.0.1:8000/v1/models').read().decode())\"")


def archived(version: str) -> dict:
    """The newest journal of ``version`` in the host's history."""
    names = lab_ssh(VM, f"ls -t /var/lib/gpufleet/vllm_upgrade/history/ | grep -- '-{version}.json$' | head -1").strip()
    assert names, f"no archived journal of {version}"
    return json.loads(lab_ssh(VM, f"cat /var/lib/gpufleet/vllm_upgrade/history/{names}"))


@pytest.fixture(scope="module")
def vm():
    """lab1 alone, serving "vLLM" 0.32.0 from its venv; powered off at the module's end."""
    if not PIP_WHEELS:
        pytest.skip("no pip wheel in /usr/share/python-wheels for the offline wheelhouses (python3-pip-whl)")
    with one_vm(WORK):
        serve = WORK / "serve.json"
        serve.write_text(json.dumps({**SERVE, "vllm_service_version": "0.32.0",
                                     "vllm_service_wheelhouse": str(wheelhouse("0.32.0"))}))
        r = playbook("playbooks/serve.yml", "--tags", "vllm_service", "-e", "gpufleet_site_benchmark=never",
                     "-e", f"@{serve}", timeout=1800)
        ok(r, "serve.yml with vLLM 0.32.0 from its wheelhouse")
        assert current()[1] == "0.32.0" and serving()
        yield VM


def upgrade(version: str, timeout: int = 3600):
    report = WORK / f"report-{version}"
    t0 = time.time()
    r = playbook("playbooks/vllm_upgrade.yml", "-e", f"@{settings(version)}", "-e",
                 f"vllm_upgrade_fleet_report_dir={report}", timeout=timeout)
    print(f"vllm_upgrade {version}: {time.time() - t0:.0f} s")
    return r, report


def test_a_candidate_that_serves_as_well_is_kept(vm):
    old_venv = current()[0]
    boot = boot_id(VM)
    r, report = upgrade("0.33.1")
    ok(r, "vllm_upgrade.yml to 0.33.1")
    rec = json.loads((report / "hosts" / f"{VM}.json").read_text())
    print(json.dumps({k: {"says": p["says"], "reason": p["reason"]} for k, p in rec["verdict"]["parts"].items()}, indent=1))
    assert rec["decision"] == "pass" and rec["kind"] == "vllm", rec["reason"]
    # on the VM: the link on the new venv, the unit's process from it, the old venv kept, the journal archived
    venv, version = current()
    assert version == "0.33.1" and venv != old_venv
    assert running_release()["prefix"] == venv and running_release()["version"] == "0.33.1"
    assert lab_ssh(VM, f"test -d {old_venv} && echo kept").strip() == "kept"
    assert lab_ssh(VM, f"test -e {JOURNAL} && echo open || echo none").strip() == "none"
    assert archived("0.33.1")["stage"] == "committed"
    assert serving() and boot_id(VM) == boot


def test_a_candidate_whose_outputs_diverge_is_switched_back_without_a_reboot(vm):
    kept_venv, kept = current()
    boot = boot_id(VM)
    r, report = upgrade("0.34.0")
    assert r.returncode != 0, "the upgrade must fail: the candidate's outputs diverged"
    rec = json.loads((report / "hosts" / f"{VM}.json").read_text())
    parts = rec["verdict"]["parts"]
    print(json.dumps({k: {"says": p["says"], "reason": p["reason"]} for k, p in parts.items()}, indent=1))
    assert rec["decision"] == "diverged", (rec["reason"], r.stdout[-6000:])
    assert parts["outputs"]["answer"] == "diverged" and parts["throughput"]["says"] == "yes", parts
    # on the VM: back on the kept venv, its process serving, no reboot, the journal archived as rolled back
    assert current() == (kept_venv, kept)
    assert running_release()["prefix"] == kept_venv and running_release()["flags"] == []
    assert serving() and boot_id(VM) == boot
    assert archived("0.34.0")["stage"] == "rolled_back"


# The server's own in-flight count (what the benchmark's load monitor reads), run on the host.
IN_FLIGHT = r"""
import re, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:8000/metrics", timeout=20).read().decode()
print(sum(float(v) for v in re.findall(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (\S+)", text, re.M)))
"""


def settle(timeout: float = 900) -> float:
    """Seconds until the server has had no request in flight for 15 s: a controller killed during a benchmark leaves
    the host's benchmark module running to its end (it would load the re-run's first runs, as foreign load)."""
    t0 = time.monotonic()
    quiet_since = None
    while time.monotonic() - t0 < timeout:
        try:
            idle = float(lab_ssh(VM, "python3 -", stdin=IN_FLIGHT).strip()) == 0
        except (AssertionError, subprocess.TimeoutExpired, ValueError):
            idle = False
        quiet_since = (quiet_since or time.monotonic()) if idle else None
        if quiet_since and time.monotonic() - quiet_since >= 15:
            return time.monotonic() - t0
        time.sleep(3)
    raise AssertionError(f"the server did not settle within {timeout} s")


def journal_stage() -> str | None:
    text = lab_ssh(VM, f"cat {JOURNAL} 2>/dev/null || true").strip()
    return json.loads(text)["stage"] if text else None


def test_a_controller_killed_during_the_candidate_is_finished_by_a_plain_rerun(vm):
    log = WORK / "killed.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(INVENTORY_DIR),
             str(REPO / "playbooks" / "vllm_upgrade.yml"), "-e", f"@{settings('0.35.0')}", "--limit", VM],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=ansible_env(),
            start_new_session=True)
    try:
        deadline = time.monotonic() + 2400
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if journal_stage() == "candidate":
                    break
            except (AssertionError, subprocess.TimeoutExpired, ValueError):
                pass
            time.sleep(2.0)
        assert proc.poll() is None, f"the run ended before the candidate stage:\n{log.read_text()[-4000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    killed = json.loads(lab_ssh(VM, f"cat {JOURNAL}"))
    assert killed["stage"] == "candidate" and current()[1] == "0.35.0"
    print(f"settled {settle():.0f} s after the kill")
    r, report = upgrade("0.35.0")
    ok(r, "the re-run of vllm_upgrade.yml to 0.35.0")
    assert "Benchmark the inference server (baseline)" not in r.stdout, "the re-run must not measure a second baseline"
    rec = json.loads((report / "hosts" / f"{VM}.json").read_text())
    assert rec["decision"] == "pass", rec["reason"]
    done = archived("0.35.0")
    # the re-run took the dead run's journal over and judged against the baseline measured once, before the kill
    assert done["stage"] == "committed" and done["taken_over"] and done["resumed"][0]["stage"] == "candidate"
    assert done["baseline"]["samples"] == killed["baseline"]["samples"]
    venv, version = current()
    assert version == "0.35.0" and running_release()["prefix"] == venv and serving()
