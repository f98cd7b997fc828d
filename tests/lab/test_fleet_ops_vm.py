"""Fleet operations on one VM of the lab, for real (issue 37): node_exporter serves the collection's metrics, and the
drain hooks hold the host around a reboot and around a vLLM restart, in that order, read from the hooks' own log.

1. ``audit.yml`` and ``health.yml`` (with its short benchmark) with ``gpufleet_metrics: true``: the textfile metrics
   written where Debian's ``prometheus-node-exporter`` (in the lab image, ``tests/lab/build-image``) reads them are
   served on the VM's ``http://127.0.0.1:9100/metrics``, read over HTTP inside the VM and parsed with
   prometheus_client's text parser: every gpufleet_* family has the names, types and labels of the collection's
   catalogue (``metrics/textfile.py``), the same values as the ``.prom`` files, and node_exporter read each file
   without error. The health benchmark ran between a drain and an undrain hook.
2. ``tune.yml --tags pcie_link`` (the ASPM policy on the kernel command line needs a reboot, ``pcie_link_reboot_ok``):
   the hooks' log has the drain in the boot before (the boot id the VM had before the run) and the undrain in the new
   boot, and the kernel started between the two (the drain's time < the boot time < the undrain's time).
3. ``serve.yml --tags vllm_service`` with a changed flag: the vLLM restart runs between a drain and an undrain, the new
   process started between them; outside the maintenance window the restart is refused (the host fails, the old
   process serves on) and stays due on the host, and the next run inside the window makes it, between the hooks.

One VM (``lab up 1``), one reboot, booted and powered off by this module; logs under .lab/fleet_ops_vm/.

    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock env GPUFLEET_LAB_BASE_PORT=2781 python -m pytest -m e2e -x -v tests/lab/test_fleet_ops_vm.py
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.inference.plugins.module_utils.metrics.textfile import CATALOGUE

from tests.lab.labutil import (INVENTORY_DIR, LAB_DIR, REPO, ansible_env, boot_id, lab_ssh, one_vm, play_recap,
                               record_figure, run)

# e2e: 17.5 min under TCG on 2026-12-04 (one VM, one reboot, one short benchmark); opt-in
pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]

VM = "lab1"
WORK = LAB_DIR / "fleet_ops_vm"
FIGURES = WORK / "figures.jsonl"
HOOK_LOG = "/var/log/gpufleet-lab-hooks.log"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # tests/lab/build-image's NODE_EXPORTER_TEXTFILE_DIR


def _hook(phase: str) -> dict:
    # one line per hook run, on the VM: phase|step|boot id|wall clock|seconds since boot
    line = ('echo "$GPUFLEET_HOOK_PHASE|$GPUFLEET_HOOK_STEP|$(cat /proc/sys/kernel/random/boot_id)|$(date +%s.%N)|'
            f'$(cut -d" " -f1 /proc/uptime)" >> {HOOK_LOG}')
    return {"name": f"lab {phase}", "command": ["sh", "-c", line]}


SETTINGS = {
    "gpufleet_drain": [_hook("drain")], "gpufleet_undrain": [_hook("undrain")],
    "gpufleet_metrics": True,
    "health_benchmark_prompt_tokens": 16, "health_benchmark_output_tokens": 16, "health_benchmark_concurrency": [4],
    "health_benchmark_requests": 16, "health_benchmark_repetitions": 2,
}


def playbook(path: str, *args: str, timeout: int = 3600):
    r = run([REPO / ".venv" / "bin" / "ansible-playbook", "-i", INVENTORY_DIR, path, "--limit", VM,
             "-e", f"@{WORK / 'settings.json'}", *args], timeout=timeout, env=ansible_env())
    (WORK / f"{os.path.basename(path)}-{int(time.time())}.log").write_text(r.stdout + "\n" + r.stderr)
    return r


def ok(r, what: str) -> None:
    assert r.returncode == 0, f"{what} failed (rc {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    recap = play_recap(r.stdout).get(VM, {})
    assert recap.get("failed", 1) == 0 and recap.get("unreachable", 1) == 0, recap


def hook_log() -> list[dict]:
    out = lab_ssh(VM, f"cat {HOOK_LOG} 2>/dev/null || true")
    keys = ("phase", "step", "boot_id", "at", "uptime")
    return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line.strip()]


def new_hook_lines(before: list[dict]) -> list[dict]:
    after = hook_log()
    assert after[:len(before)] == before, "the hooks' log lost lines"
    return after[len(before):]


@pytest.fixture(scope="module")
def vm():
    """lab1 alone, serving the lab stand-in through serve.yml; powered off at the module's end."""
    with one_vm(WORK) as lab:
        record_figure(FIGURES, "build-image", seconds=lab["build_s"], image=lab["image"])
        (WORK / "settings.json").write_text(json.dumps(SETTINGS, indent=1))
        record_figure(FIGURES, "lab up 1", seconds=lab["up_s"])
        t0 = time.time()
        r = playbook("playbooks/serve.yml", "--tags", "vllm_service", "-e", "gpufleet_site_benchmark=never", timeout=1800)
        ok(r, "serve.yml --tags vllm_service")
        record_figure(FIGURES, "serve.yml (install)", seconds=round(time.time() - t0))
        yield VM


def test_node_exporter_serves_the_collections_textfile_metrics(vm):
    assert lab_ssh(VM, "systemctl is-active prometheus-node-exporter.service").strip() == "active"
    args = lab_ssh(VM, "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value prometheus-node-exporter.service)/cmdline")
    assert f"--collector.textfile.directory={TEXTFILE_DIR}" in args, args
    before = hook_log()
    t0 = time.time()
    ok(playbook("playbooks/audit.yml", "-e", f"gpufleet_report_dir={WORK / 'audit'}"), "audit.yml")
    ok(playbook("playbooks/health.yml", "-e", f"gpufleet_report_dir={WORK / 'health'}",
                "-e", f"gpufleet_history_db={WORK / 'history.sqlite'}"), "health.yml")
    record_figure(FIGURES, "audit.yml + health.yml", seconds=round(time.time() - t0))
    # the health benchmark ran between the hooks
    lines = new_hook_lines(before)
    assert [(x["phase"], x["step"]) for x in lines] == [("drain", "health benchmark"), ("undrain", "health benchmark")], lines

    files = sorted(lab_ssh(VM, f"cd {TEXTFILE_DIR} && ls *.prom").split())
    assert {"gpufleet_audit.prom", "gpufleet_health.prom", "gpufleet_benchmark_health.prom"} <= set(files), files
    on_disk = {}
    for name in files:
        if name.startswith("gpufleet_"):
            for fam in text_string_to_metric_families(lab_ssh(VM, f"cat {TEXTFILE_DIR}/{name}")):
                for s in fam.samples:
                    on_disk[(s.name, tuple(sorted(s.labels.items())))] = s.value
    # node_exporter's answer, over HTTP inside the VM, parsed as Prometheus parses it
    text = lab_ssh(VM, "python3 -c \"import urllib.request; print(urllib.request.urlopen("
                       "'http://127.0.0.1:9100/metrics', timeout=30).read().decode())\"")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    catalogue = {m.name: m for m in CATALOGUE}
    ours = {name: fam for name, fam in families.items() if name.startswith("gpufleet_")}
    served = {}
    for name, fam in ours.items():
        # prometheus_client names a counter's family without _total
        metric = catalogue.get(name) or catalogue.get(name + "_total")
        assert metric is not None, f"{name} is served but not in the catalogue"
        assert fam.type == metric.type, (name, fam.type, metric.type)
        for s in fam.samples:
            assert set(s.labels) == set(metric.labels), (s.name, s.labels, metric.labels)
            assert s.labels["host"] == VM, s
            served[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert served == on_disk, "node_exporter serves other gpufleet_* series than the .prom files hold"
    for metric in ("gpufleet_audit_gpus", "gpufleet_audit_timestamp_seconds",
                   "gpufleet_pcie_link_current_speed_transfers_per_second", "gpufleet_health_timestamp_seconds",
                   "gpufleet_benchmark_output_tokens_per_second", "gpufleet_benchmark_timestamp_seconds"):
        assert metric in ours, f"{metric} not served; served: {sorted(ours)}"
    assert next(s.value for s in ours["gpufleet_audit_gpus"].samples) == 3  # the lab's three GPU stand-ins
    links = {s.labels["gpu"] for s in ours["gpufleet_pcie_link_current_speed_transfers_per_second"].samples}
    assert {"0000:01:00.0", "0000:05:00.0", "0000:06:00.0"} <= links, links
    tok = [s for s in ours["gpufleet_benchmark_output_tokens_per_second"].samples if s.labels["profile"] == "health"]
    assert tok and all(s.value > 0 for s in tok), tok
    # node_exporter read every file of the directory, without error
    errors = [s.value for s in families["node_textfile_scrape_error"].samples]
    assert errors == [0.0], errors
    read = {os.path.basename(s.labels["file"]) for s in families["node_textfile_mtime_seconds"].samples}
    assert set(files) <= read, (files, read)
    record_figure(FIGURES, "node_exporter", families=len(ours), series=len(served), files=files)


def test_the_drain_hook_runs_before_the_reboot_and_the_undrain_after(vm):
    old_boot = boot_id(VM)
    before = hook_log()
    t0 = time.time()
    r = playbook("playbooks/tune.yml", "--tags", "pcie_link", timeout=3600)
    ok(r, "tune.yml --tags pcie_link")
    record_figure(FIGURES, "tune.yml --tags pcie_link (one reboot)", seconds=round(time.time() - t0))
    new_boot = boot_id(VM)
    assert new_boot != old_boot, "tune.yml did not reboot the VM"
    assert "pcie_aspm.policy=performance" in lab_ssh(VM, "cat /proc/cmdline")
    lines = new_hook_lines(before)
    assert [(x["phase"], x["step"]) for x in lines] == [("drain", "reboot"), ("undrain", "reboot")], lines
    drain, undrain = lines
    # the drain in the boot before, the undrain in the new one, the kernel started between them
    assert drain["boot_id"] == old_boot and undrain["boot_id"] == new_boot, (lines, old_boot, new_boot)
    btime = int(next(x for x in lab_ssh(VM, "cat /proc/stat").splitlines() if x.startswith("btime ")).split()[1])
    assert float(drain["at"]) < btime < float(undrain["at"]), (drain, btime, undrain)
    record_figure(FIGURES, "reboot between the hooks", drain_at=drain["at"], boot_at=btime, undrain_at=undrain["at"],
                  boot_before=old_boot, boot_after=new_boot)


def _service() -> dict:
    """vllm.service's main process: pid, start (seconds since boot), command line, and whether a restart is due."""
    pid = int(lab_ssh(VM, "systemctl show -p MainPID --value vllm.service").strip())
    started = int(lab_ssh(VM, "systemctl show -p ExecMainStartTimestampMonotonic --value vllm.service").strip()) / 1e6
    cmdline = lab_ssh(VM, f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    pending = lab_ssh(VM, "test -e /run/gpufleet/vllm.service.restart-pending && echo yes || echo no").strip() == "yes"
    return {"pid": pid, "started": started, "cmdline": cmdline, "pending": pending}


def test_the_vllm_restart_runs_between_the_hooks_and_only_inside_the_window(vm):
    first = _service()
    assert not first["pending"], first
    # outside the window (a one-minute window three days from now, in the VM's time zone, UTC): refused, the old
    # process serves on, the restart stays due on the host
    day = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")[(datetime.now(timezone.utc).weekday() + 3) % 7]
    closed = {"gpufleet_maintenance_windows": [{"days": [day], "start": "00:00", "end": "00:01"}],
              "gpufleet_maintenance_timezone": "UTC"}
    flag = {"vllm_service_max_num_seqs": 8}
    before = hook_log()
    r = playbook("playbooks/serve.yml", "--tags", "vllm_service", "-e", "gpufleet_site_benchmark=never",
                 "-e", json.dumps({**flag, **closed}), timeout=1800)
    assert r.returncode != 0 and "vLLM restart refused: outside the maintenance windows" in r.stdout, r.stdout[-4000:]
    refused = _service()
    assert refused["pid"] == first["pid"] and refused["pending"], refused
    assert "--max-num-seqs 8" not in refused["cmdline"], refused
    assert new_hook_lines(before) == []
    # inside the window (no window: no restriction): the next run restarts, between the hooks, and forgets the mark
    before = hook_log()
    t0 = time.time()
    r = playbook("playbooks/serve.yml", "--tags", "vllm_service", "-e", "gpufleet_site_benchmark=never",
                 "-e", json.dumps(flag), timeout=1800)
    ok(r, "serve.yml --tags vllm_service (the restart left due)")
    record_figure(FIGURES, "serve.yml (the restart left due)", seconds=round(time.time() - t0))
    after = _service()
    assert after["pid"] != first["pid"] and not after["pending"] and "--max-num-seqs 8" in after["cmdline"], after
    lines = new_hook_lines(before)
    assert [(x["phase"], x["step"]) for x in lines] == [("drain", "vLLM restart"), ("undrain", "vLLM restart")], lines
    assert float(lines[0]["uptime"]) < after["started"] < float(lines[1]["uptime"]), (lines, after)
    record_figure(FIGURES, "vLLM restart between the hooks", drain_uptime=lines[0]["uptime"], started=after["started"],
                  undrain_uptime=lines[1]["uptime"])
    # a run that changes nothing restarts nothing and drains nothing
    before = hook_log()
    ok(playbook("playbooks/serve.yml", "--tags", "vllm_service", "-e", "gpufleet_site_benchmark=never",
                "-e", json.dumps(flag)), "serve.yml --tags vllm_service (no change)")
    assert _service()["pid"] == after["pid"] and new_hook_lines(before) == []
