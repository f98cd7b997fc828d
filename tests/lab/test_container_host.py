"""The main command's container-host setup (tests/lab/lab.py, what `scripts/run-site` runs), in CI.

`scripts/run-site` once failed on a fresh machine while it set up its container host: `apt-get
update` ran while the container's systemd was still booting (`Unknown error executing apt-key`), the
half set-up container was left running, and the next `up` reused it as if it were ready. These tests
run the same code on a new container of the lab's image (image, wheelhouse and model built here when
the cache lacks them): set-up waits for systemd and ends with every need met; a half set-up host is
found and finished; a host whose setup fails is removed; and site.yml converges the host with the
real vLLM, then changes nothing on its second run."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.lab.labutil import INVENTORY_DIR, REPO, run

pytestmark = pytest.mark.vmlab

NAME = "labct"  # not one of `lab up`'s names (labc1, ...): a lab left up is not touched
CNAME = f"gpufleet-{NAME}"


def _lab_module():
    spec = importlib.util.spec_from_file_location("gpufleet_lab", REPO / "tests" / "lab" / "lab.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpufleet_lab"] = mod
    spec.loader.exec_module(mod)
    return mod


lab = _lab_module()


def _gone(cname: str) -> bool:
    return subprocess.run(["podman", "container", "exists", cname], check=False).returncode != 0


@pytest.fixture(scope="module")
def built():
    """The container image, the offline vLLM wheelhouse and the tiny model (each cached by content hash)."""
    if os.geteuid() != 0 or not shutil.which("podman"):
        pytest.skip("needs root and podman (scripts/bootstrap)")
    for c in (CNAME, "gpufleet-labcx"):
        subprocess.run(["podman", "rm", "-f", "-t", "0", c], capture_output=True, check=False)
    b = run([REPO / "tests" / "containers" / "build-image", "bookworm"], timeout=1800)
    assert b.returncode == 0, f"build-image failed:\n{b.stderr[-3000:]}"
    wh = lab.wheelhouse()
    return {"wheelhouse": wh, "model": lab.tiny_model(wh)}


@pytest.fixture(scope="module")
def host(built):
    st = lab.start_container(NAME, built["model"], built["wheelhouse"])
    yield st
    subprocess.run(["podman", "rm", "-f", "-t", "5", CNAME], capture_output=True, check=False)
    assert _gone(CNAME), f"{CNAME} left behind"


def test_a_new_container_host_is_set_up_after_its_systemd_booted(host):
    assert lab.container_missing(CNAME) == []
    state = subprocess.run(["podman", "exec", CNAME, "systemctl", "is-system-running"], capture_output=True,
                           text=True, check=False).stdout.strip()
    assert state in ("running", "degraded")


def test_a_half_set_up_host_is_found_and_finished(host, built):
    r = subprocess.run(["podman", "exec", CNAME, "sh", "-c",
                        f"rm -rf {lab.CONTAINER_MODEL} && dpkg -r python3-apt >/dev/null"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert lab.container_missing(CNAME) == ["python3-apt", "model"]
    lab.setup_container(NAME, CNAME, built["model"])
    assert lab.container_missing(CNAME) == []


def test_a_host_whose_setup_fails_is_removed_and_the_error_shows_the_command(built, tmp_path):
    with pytest.raises(lab.LabError) as err:
        lab.start_container("labcx", str(tmp_path / "no-such-model"), built["wheelhouse"])
    assert _gone("gpufleet-labcx"), "a container whose setup failed was left running"
    text = str(err.value)
    assert "`podman cp " in text and "no-such-model" in text and "exit " in text


def _inventory(tmp_path, wheelhouse: str) -> str:
    inv = tmp_path / "inventory"
    inv.mkdir()
    shutil.copytree(INVENTORY_DIR / "group_vars", inv / "group_vars")
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    lab_containers:\n      hosts:\n"
        f"        {NAME}:\n          ansible_host: {CNAME}\n          gpufleet_lab_wheelhouse: {wheelhouse}\n"
        "      vars:\n        ansible_connection: containers.podman.podman\n"
        "        ansible_python_interpreter: /usr/bin/python3\n")
    return str(inv)


def _recap(out: str) -> dict[str, int]:
    m = re.search(rf"^{NAME}\s*:\s*(.*)$", out, re.M)
    assert m, f"no PLAY RECAP line for {NAME}:\n{out[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def test_site_yml_converges_the_container_host_and_changes_nothing_the_second_time(host, built, tmp_path):
    inv = _inventory(tmp_path, built["wheelhouse"])
    reports = tmp_path / "reports"
    # --limit the host alone, as a user runs one host: the reports are still written, once, on the controller
    argv = ["ansible-playbook", "-i", inv, "site.yml", "--limit", NAME,
            "-e", f"gpufleet_report_dir={reports}/audit", "-e", f"gpufleet_benchmark_dir={reports}/benchmarks"]
    # check mode on the fresh host first: a preview that neither fails on the server this run would install (the
    # site benchmark has nothing to reach yet) nor changes the host
    check = run([*argv, "--check", "--diff"], timeout=1800)
    assert check.returncode == 0, f"check mode failed:\n{check.stdout[-5000:]}\n{check.stderr[-2000:]}"
    assert _recap(check.stdout)["failed"] == 0
    gone = subprocess.run(["podman", "exec", CNAME, "test", "-e", "/etc/systemd/system/vllm.service"], check=False)
    assert gone.returncode != 0, "check mode wrote the vllm unit"
    first = run(argv, timeout=2400)
    assert first.returncode == 0, f"converge failed:\n{first.stdout[-5000:]}\n{first.stderr[-2000:]}"
    assert _recap(first.stdout)["failed"] == 0
    assert (reports / "audit" / f"{NAME}.json").is_file() and (reports / "audit" / "fleet.html").is_file()
    fetched = list((reports / "benchmarks" / NAME).glob("site-*.json"))
    assert fetched, "the site benchmark's results were not fetched to the controller"
    page = (reports / "audit" / "fleet.html").read_text()
    assert "Latest benchmark" in page and "Generated <time" in page
    summary = (reports / "audit" / "fleet.md").read_text()
    second = run(argv, timeout=1800)
    assert second.returncode == 0, f"second run failed:\n{second.stdout[-5000:]}"
    recap = _recap(second.stdout)
    assert recap["changed"] == 0 and recap["failed"] == 0, f"second run is not idempotent: {recap}\n" + "\n".join(
        ln for ln in second.stdout.splitlines() if ln.startswith("changed:"))
    # the controller's reports are written by tasks delegated from the host's plays (counted in its recap):
    # a run that changes nothing leaves them as they were, generation time included
    assert (reports / "audit" / "fleet.html").read_text() == page, "the fleet report was rewritten on a run that changed nothing"
    assert (reports / "audit" / "fleet.md").read_text() == summary
