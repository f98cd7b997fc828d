"""testinfra checks for the audit scenario: the JSON on the host matches the host's own sysfs."""

from __future__ import annotations

import json
import os

testinfra_hosts = ["podman://gpufleet-audit-bookworm", "podman://gpufleet-audit-trixie"]


def _report(host):
    f = host.file("/var/lib/gpufleet/audit/pcie.json")
    assert f.exists and f.is_file
    assert f.user == "root" and f.mode == 0o644
    return json.loads(f.content_string)


def test_report_names_the_host(host):
    report = _report(host)
    assert report["host"] in testinfra_hosts[0] + testinfra_hosts[1]
    assert report["kernel"] == host.check_output("uname -r")


def test_every_network_controller_is_audited(host):
    report = _report(host)
    expected = set()
    for bdf in host.check_output("ls /sys/bus/pci/devices").split():
        if host.file(f"/sys/bus/pci/devices/{bdf}/class").content_string.strip().startswith("0x02"):
            expected.add(bdf)
    assert expected, "the CI machine has no network controller to audit"
    audited = {gpu["bdf"] for gpu in report["pcie"]["gpus"]}
    assert audited == expected


def test_audit_agrees_with_sysfs(host):
    report = _report(host)
    for gpu in report["pcie"]["gpus"]:
        bdf = gpu["bdf"]
        dev = report["pcie"]["devices"][bdf]
        sysfs = f"/sys/bus/pci/devices/{bdf}"
        assert dev["vendor_id"] == host.file(f"{sysfs}/vendor").content_string.strip()
        assert dev["device_id"] == host.file(f"{sysfs}/device").content_string.strip()
        # the decoder read the same IDs from config space
        assert dev["config"]["vendor_id"] == dev["vendor_id"]
        driver = host.file(f"{sysfs}/driver")
        if driver.exists:
            assert dev["driver"] == os.path.basename(driver.linked_to)
