"""The serving verdict's stability part says no, for real, in one VM of the lab (issue 33, item 6; the outputs and
latency noes are test_serving_verdict_vm.py's).

``playbooks/kernel_upgrade.yml`` on lab1 (6.1.0-50 -> 6.1.0-56), the server started through a Python wrapper that adds
``--fail-share 0.2`` only under the new kernel (an engine that fails a share of its requests with the new kernel: the
lab server answers them HTTP 500). The benchmark is told to go on past failures (``inference_benchmark_max_error_rate``
0.6; at its default 0 the first failed request stops the candidate's benchmark and the upgrade rolls back with
``error``, which is also a no, but not the verdict's); it counts them, the verdict's stability part compares each
side's failed share and says ``unstable``, and the upgrade rolls back. The outputs part is left out
(``kernel_upgrade_verdict_outputs: false``: a server that refuses prompts is an error of the output check, not a verdict),
and named so. Checked on the VM over SSH: the old kernel runs and is GRUB's saved default with no one-shot entry, it is
held again, and the server serves.

Its own VM (``lab up 1``), powered off at its end; reports under .lab/serving_verdict_vm/ like its sibling:

    . scripts/lib.sh; gpufleet_env
    flock /work/lab.lock env GPUFLEET_LAB_BASE_PORT=2621 python -m pytest -m e2e -x -v tests/lab/test_serving_verdict_stability_vm.py
"""

from __future__ import annotations

import json
import time

import pytest

from tests.lab.labutil import lab_ssh
from tests.lab.test_serving_verdict_vm import (
    KERNEL, OLD, VM, WORK, playbook, serve_through_wrapper, serving, single_vm)

pytestmark = [pytest.mark.vmlab, pytest.mark.e2e]


@pytest.fixture(scope="module")
def vm():
    """lab1 alone, booted for this module and powered off at its end."""
    yield from single_vm()


def test_a_kernel_under_which_requests_fail_is_rolled_back_as_unstable(vm):
    failing = serve_through_wrapper("failing_on_new_kernel", ["--fail-share", "0.2"])
    assert serving()
    settings = WORK / "kernel-stability.json"
    settings.write_text(json.dumps({**KERNEL, "vllm_service_command": failing, "kernel_upgrade_verdict_outputs": False,
                                    "inference_benchmark_max_error_rate": 0.6}))
    report = WORK / "kernel_upgrade_stability"
    t0 = time.time()
    r = playbook("playbooks/kernel_upgrade.yml", "-e", f"@{settings}", "-e", f"kernel_upgrade_fleet_report_dir={report}",
                 timeout=5400)
    print(f"kernel_upgrade: {time.time() - t0:.0f} s")
    assert r.returncode != 0, "the upgrade must fail: requests fail under the new kernel"
    rec = json.loads((report / "hosts" / f"{VM}.json").read_text())
    parts = rec["verdict"]["parts"]
    print(json.dumps({k: {"says": p["says"], "reason": p["reason"]} for k, p in parts.items()}, indent=1))
    assert rec["decision"] == "unstable", (rec["reason"], r.stdout[-6000:])
    assert parts["stability"]["says"] == "no", parts["stability"]
    assert parts["outputs"]["says"] == "not measured", parts["outputs"]
    assert rec["final_kernel"] == OLD and rec["default_kernel"] == OLD
    # on the VM: the old kernel runs and is the saved default, nothing pending, held again, serving every request
    assert lab_ssh(VM, "uname -r").strip() == OLD
    env = dict(line.split("=", 1) for line in lab_ssh(VM, "grub-editenv /boot/grub/grubenv list").splitlines() if "=" in line)
    assert OLD in env.get("saved_entry", "") and not env.get("next_entry"), env
    assert f"linux-image-{OLD}" in lab_ssh(VM, "apt-mark showhold").split()
    assert serving()
    assert f"| {VM} | **unstable** |" in (report / "fleet.md").read_text()
