# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/tools/capture_pci_tree.py: a capture replays exactly what the module read, it reads only
its allowlist (checked with a Python audit hook on every open), and writes only into --out."""

from __future__ import annotations

import json
import os
import sys
import tarfile

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.modules.pcie_facts import gather
from tests.unit.fakesysfs import capture_tool, eight_gpus, two_gpus_one_switch

OPENED: list | None = None


def _audit(event, args):
    if OPENED is not None and event == "open" and isinstance(args[0], (str, bytes)):
        OPENED.append((os.fsdecode(args[0]), args[1]))


sys.addaudithook(_audit)  # hooks stay for the process; _audit records only inside watch_opens()


class watch_opens:  # pylint: disable=invalid-name
    def __enter__(self):
        global OPENED  # pylint: disable=global-statement
        OPENED = []
        return OPENED

    def __exit__(self, *exc):
        global OPENED  # pylint: disable=global-statement
        OPENED = None


def audit(root: str) -> dict:
    facts, _w = gather(HostFS(root), {"include_nvml": "never"})
    return {k: v for k, v in facts.items() if k != "root"}


@pytest.fixture(scope="module")
def tool():
    return capture_tool()


def test_capture_replays_identically(tmp_path, tool):
    host = eight_gpus(tmp_path / "host")
    host.write("/usr/share/misc/pci.ids", "10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n15b3  Mellanox\n")
    data = tool.capture(str(tmp_path / "host"))
    assert len(data["meta"]["targets"]) == 8
    assert data["files"]["/usr/share/misc/pci.ids"].splitlines()[1:] == ["10de  NVIDIA Corporation", "\t2330  GH100 [H100 SXM5 80GB]"]
    capture_json, tar_path = tool.write_outputs(data, str(tmp_path / "out"), "eight")
    restored = tool.restore(tool.load(os.path.dirname(capture_json)), str(tmp_path / "restored"))
    with tarfile.open(tar_path) as tar:
        tar.extractall(tmp_path / "untarred")  # nosec: our own archive
    original = audit(str(tmp_path / "host"))
    assert original["gpus"][0]["name"] == "GH100 [H100 SXM5 80GB]"
    assert audit(restored) == original
    assert audit(str(tmp_path / "untarred")) == original


def test_capture_reads_only_its_allowlist_and_writes_only_out(tmp_path, tool):
    host = two_gpus_one_switch(tmp_path / "host")
    for bdf in ("0000:03:00.0", "0000:01:00.0"):
        for name in ("rom", "resource0", "resource", "reset", "remove", "rescan", "driver_override", "power_state"):
            host.write(f"{host.dirs[bdf]}/{name}", "do not read")
    out = tmp_path / "out"
    with watch_opens() as opened:
        tool.write_outputs(tool.capture(str(tmp_path / "host")), str(out), "switch")
    reads = [p for p, mode in opened if str(p).startswith(str(tmp_path / "host"))]
    writes = [p for p, mode in opened if isinstance(mode, str) and ("w" in mode or "a" in mode)
              or isinstance(mode, int) and mode & (os.O_WRONLY | os.O_RDWR)]
    assert reads, "the audit hook saw no reads"
    names = {os.path.basename(p) for p in reads}
    assert not names & {"rom", "resource0", "resource", "reset", "remove", "rescan", "driver_override", "power_state"}
    assert names <= {"class", "vendor", "device", "subsystem_vendor", "subsystem_device", "revision", "numa_node", "local_cpulist",
                     "current_link_speed", "current_link_width", "max_link_speed", "max_link_width", "aer_dev_correctable",
                     "aer_dev_nonfatal", "aer_dev_fatal", "config", "smp_affinity_list", "effective_affinity_list", "type",
                     "cpulist", "nr_hugepages", "free_hugepages", "meminfo", "cmdline", "policy", "pci.ids"} | \
        {str(i) for i in range(100, 200)}  # msi_irqs/<n> hold the mode
    assert writes and all(str(p).startswith(str(out)) for p in writes)


def test_capture_format_is_sanity_safe(tmp_path, tool):
    two_gpus_one_switch(tmp_path / "host")
    capture_json, _tar = tool.write_outputs(tool.capture(str(tmp_path / "host")), str(tmp_path / "out"), "switch")
    assert sorted(os.listdir(os.path.dirname(capture_json))) == ["capture.json"]  # no ':' names, no symlinks
    data = json.loads(open(capture_json, encoding="utf-8").read())
    cfg = data["binary"]["/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/config"]
    assert cfg["size"] == 4096 and len(bytes.fromhex("".join(cfg["hex"]))) < 4096  # trailing zeros trimmed
    assert data["links"]["/sys/bus/pci/devices/0000:03:00.0"] == "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"


def test_capture_selects_listed_functions_and_their_paths(tmp_path, tool):
    two_gpus_one_switch(tmp_path / "host")
    data = tool.capture(str(tmp_path / "host"), devices=["0000:04:00.0"])
    assert data["meta"]["full_records"] == ["0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:00.0"]
    assert not any(p.endswith("0000:03:00.0/config") for p in data["binary"])
    assert any(p.endswith("0000:03:00.0/class") for p in data["files"])  # identities of every function stay


def test_capture_cli_refuses_bad_targets(tmp_path, tool):
    with pytest.raises(SystemExit, match="refusing to write under /sys"):
        tool.write_outputs({"meta": {}, "files": {}, "binary": {}, "links": {}, "dirs": []}, "/sys/kernel", "x")
    two_gpus_one_switch(tmp_path / "host")
    with pytest.raises(SystemExit, match="0000:99:00.0 not under /sys/bus/pci/devices"):
        tool.capture(str(tmp_path / "host"), devices=["0000:99:00.0"])
    with pytest.raises(SystemExit):
        tool.main(["--name", "bad/name", "--root", str(tmp_path / "host"), "--out", str(tmp_path / "out")])


def test_capture_cli_round_trip(tmp_path, tool, capsys):
    two_gpus_one_switch(tmp_path / "host")
    assert tool.main(["--name", "sw", "--root", str(tmp_path / "host"), "--out", str(tmp_path / "out"), "--note", "x"]) == 0
    assert tool.main(["--restore", str(tmp_path / "out" / "sw"), str(tmp_path / "tree")]) == 0
    assert "capture.json" in capsys.readouterr().out
    assert audit(str(tmp_path / "tree")) == audit(str(tmp_path / "host"))
