# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pcie_payload module_utils: sizes and registers, the hierarchy model on fake trees, the path- and
peer-safe plan, records, persistence rendering, and apply_writes with the real setpci."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import payload as pp
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import boot
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.reapply import render_script
from tests.unit.fakesysfs import load_capture, payload_switch, two_gpus_one_switch, two_numa_nodes
from tests.unit.plugins.modules.uthelper import needs_tools

SETPCI = shutil.which("setpci")
needs_setpci = needs_tools("setpci")


def run(argv):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False,
                          env=dict(os.environ, LC_ALL="C"))
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def switch(tmp_path):
    payload_switch(tmp_path)
    return HostFS(str(tmp_path))


# ---- sizes and registers ------------------------------------------------------------------------
@pytest.mark.parametrize("value,size", [(128, 128), ("256", 256), (" 4096 ", 4096), (1024, 1024)])
def test_parse_size(value, size):
    assert pp.parse_size(value, "mps") == size


@pytest.mark.parametrize("value", [0, 64, 100, 300, 8192, 16384, "max", "-256", "2.5e2", None, True])
def test_parse_size_rejects(value):
    with pytest.raises(pp.PayloadError, match="is not a PCIe payload size"):
        pp.parse_size(value, "mrrs")


def test_parse_mps():
    assert pp.parse_mps(None) is None and pp.parse_mps("max_safe") == "max_safe" and pp.parse_mps("512") == 512


@pytest.mark.parametrize("register,size,spec", [
    ("mps", 128, "CAP_EXP+8.w=0000:00e0"), ("mps", 256, "CAP_EXP+8.w=0020:00e0"), ("mps", 4096, "CAP_EXP+8.w=00a0:00e0"),
    ("mrrs", 128, "CAP_EXP+8.w=0000:7000"), ("mrrs", 512, "CAP_EXP+8.w=2000:7000"), ("mrrs", 4096, "CAP_EXP+8.w=5000:7000"),
])
def test_setpci_spec_writes_only_the_field(register, size, spec):
    assert pp.setpci_spec(register, size) == spec
    value, mask = (int(x, 16) for x in spec.split("=")[1].split(":"))
    assert value & ~mask == 0
    assert pp.field(value, register) == size


def test_setpci_argv():
    # always the sysfs access method only, always the given tree: never a fallback to another method
    assert pp.setpci_argv("/usr/bin/setpci", "/", "0000:3b:00.0", "mps", 256) == [
        "/usr/bin/setpci", "-A", "linux-sysfs", "-O", "sysfs.path=/sys/bus/pci", "-s", "0000:3b:00.0", "CAP_EXP+8.w=0020:00e0"]
    assert pp.setpci_argv("/usr/bin/setpci", "/tmp/x/", "0000:3b:00.0", "mrrs", 4096) == [
        "/usr/bin/setpci", "-A", "linux-sysfs", "-O", "sysfs.path=/tmp/x/sys/bus/pci", "-s", "0000:3b:00.0",
        "CAP_EXP+8.w=5000:7000"]


@needs_setpci
def test_setpci_on_a_missing_tree_fails_instead_of_reaching_the_real_bus(tmp_path):
    argv = pp.setpci_argv(SETPCI, str(tmp_path / "nothing-here"), "0000:00:00.0", "mps", 256)
    argv[-1] = "VENDOR_ID.w"  # a read: even a wrong outcome of this test touches no hardware
    rc, out, err = run(argv)
    assert rc != 0 and out == "", (rc, out, err)


def test_field_decodes_real_h200_devctl():
    # DevCtl 0x5134 from the device tool's H200: MPS 256, MRRS 4096
    assert (pp.field(0x5134, "mps"), pp.field(0x5134, "mrrs")) == (256, 4096)


# ---- reading and the model ----------------------------------------------------------------------
def test_read_payload_real_capture(tmp_path):
    fs = HostFS(str(load_capture("gpu-h200-microvm", tmp_path)))
    want = {"readable": True, "error": None, "pcie_offset": 0x60, "port_type": "endpoint", "mps_supported": 256, "mps": 256,
            "mrrs": 4096, "devctl": 0x5134}
    assert pp.read_payload(fs, "0000:00:06.0") == want
    missing = pp.read_payload(fs, "0000:00:01.0")  # captured without config space
    assert missing["readable"] is False and "No such file or directory" in missing["error"]


def test_read_payload_conventional_and_short(tmp_path, switch):
    fs = HostFS(str(load_capture("dev-vm-firecracker", tmp_path / "fc")))
    conv = pp.read_payload(fs, "0000:00:03.0")
    assert conv["readable"] is True and conv["pcie_offset"] is None
    cfg = switch.path("/sys/bus/pci/devices/0000:03:00.0/config")
    with open(cfg, "rb") as fh:
        data = fh.read()
    with open(cfg, "wb") as fh:
        fh.write(data[:64])
    short = pp.read_payload(switch, "0000:03:00.0")
    assert short["readable"] is False and "only 64 bytes" in short["error"]


def test_gather_default_gpus_and_hierarchies(switch):
    model = pp.gather(switch)
    assert model["targets"] == ["0000:03:00.0", "0000:04:00.0"]
    assert model["hierarchies"] == {"0000:00:01.0": ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0",
                                                     "0000:03:00.0", "0000:04:00.0"]}
    assert "0000:06:00.0" not in model["functions"]  # the NVMe drive sits below another root port
    gpu = model["functions"]["0000:03:00.0"]
    assert (gpu["path"], gpu["depth"], gpu["class_name"]) == (
        ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"], 4, "3D controller")


def test_gather_root_bus_gpu_is_its_own_hierarchy(tmp_path):
    fs = HostFS(str(load_capture("gpu-h200-microvm", tmp_path)))
    model = pp.gather(fs)
    assert model["targets"] == ["0000:00:06.0"] and model["hierarchies"] == {"0000:00:06": ["0000:00:06.0"]}


def test_gather_skips_conventional_gpus_by_default(tmp_path):
    host = two_numa_nodes(tmp_path)
    hb = host.host_bridge(0, 0)
    host.add("0000:00:02.0", hb, kind="pci", class_code="0x030000", vendor="0x1234", device="0x1111")
    model = pp.gather(HostFS(str(tmp_path)))
    assert model["targets"] == ["0000:17:00.0", "0000:97:00.0"]
    assert model["warnings"] == ["0000:00:02.0 (VGA controller [1234:1111]) has no PCI Express capability (conventional PCI); "
                                 "it is skipped."]
    with pytest.raises(pp.PayloadError, match="has no PCI Express capability: MaxPayload and MaxReadReq exist only"):
        pp.gather(HostFS(str(tmp_path)), ["0000:00:02.0"])


def test_gather_errors(switch):
    with pytest.raises(pp.PayloadError, match="not found under"):
        pp.gather(switch, ["0000:3b:00.0"])
    with pytest.raises(pp.PayloadError, match="is not a PCI address"):
        pp.gather(switch, ["zz"])


# ---- the plan -----------------------------------------------------------------------------------
def test_plan_max_safe_path_and_peer(switch):
    plan = pp.plan_present(pp.gather(switch), "max_safe", 4096)
    a, b = plan["devices"]["0000:03:00.0"], plan["devices"]["0000:04:00.0"]
    assert (a["path_limit"], a["path_limiting_device"], a["peer_limit"], a["peer_limiting_device"]) == (
        512, "0000:00:01.0", 256, "0000:04:00.0")
    assert (b["path_limit"], b["path_limiting_device"], b["peer_limit"]) == (256, "0000:04:00.0", 512)
    assert {d["limit"] for d in plan["devices"].values()} == {256}
    writes = [(w["device"], w["register"], w["before"], w["after"]) for w in plan["writes"]]
    assert writes == [("0000:00:01.0", "mps", 128, 256), ("0000:01:00.0", "mps", 128, 256), ("0000:02:00.0", "mps", 128, 256),
                      ("0000:02:01.0", "mps", 128, 256), ("0000:03:00.0", "mps", 128, 256), ("0000:03:00.0", "mrrs", 512, 4096),
                      ("0000:04:00.0", "mps", 128, 256), ("0000:04:00.0", "mrrs", 512, 4096)]


def test_plan_peer_safe_equals_path_safe_when_peers_agree(tmp_path):
    payload_switch(tmp_path, gpu_b_mps_supported=512)
    plan = pp.plan_present(pp.gather(HostFS(str(tmp_path))), "max_safe")
    assert {w["after"] for w in plan["writes"]} == {512}


def test_plan_explicit_above_limit_names_device(switch):
    with pytest.raises(pp.PayloadError) as err:
        pp.plan_present(pp.gather(switch, ["0000:03:00.0"]), 512)
    msg = str(err.value)
    # 04:00.0 is not listed, so neither it nor its port 02:01.0 is written: they hold 128, which fixes the hierarchy
    assert "0000:02:01.0 (PCI bridge [1000:c030]) (a peer of 0000:03:00.0) is set to 128 and is not written" in msg
    assert "largest safe value is 128" in msg


def test_plan_lowering_is_allowed(tmp_path):
    payload_switch(tmp_path, mps=256)
    plan = pp.plan_present(pp.gather(HostFS(str(tmp_path))), 128)
    assert {(w["before"], w["after"]) for w in plan["writes"]} == {(256, 128)}


def test_plan_fixed_peers_that_disagree(tmp_path):
    host = payload_switch(tmp_path, nic=True)
    cfg = host.real("/sys/bus/pci/devices/0000:05:00.0/config")
    data = bytearray(cfg.read_bytes())
    data[0x68] = (data[0x68] & 0x1F) | 1 << 5  # NIC at 256, its port at 128
    cfg.write_bytes(bytes(data))
    with pytest.raises(pp.PayloadError, match="already mixes MaxPayload values on functions this task does not write"):
        pp.plan_present(pp.gather(HostFS(str(tmp_path))), "max_safe")


def test_plan_max_safe_below_a_fixed_peer_fails(tmp_path):
    payload_switch(tmp_path, nic=True, mps=512)
    with pytest.raises(pp.PayloadError) as err:
        pp.plan_present(pp.gather(HostFS(str(tmp_path))), "max_safe")
    assert "Cannot set MaxPayload 256 below 0000:00:01.0: 0000:02:02.0 (PCI bridge [1000:c030]) shares that hierarchy" in str(err.value)
    assert "Add 0000:02:02.0 to devices (it supports 512), or set mps: 512" in str(err.value)


def test_plan_mrrs_only_leaves_mps_and_ignores_unreadable_peers(switch):
    cfg = switch.path("/sys/bus/pci/devices/0000:02:01.0/config")
    os.unlink(cfg)
    plan = pp.plan_present(pp.gather(switch, ["0000:03:00.0"]), None, 2048)
    assert [(w["device"], w["register"], w["after"]) for w in plan["writes"]] == [("0000:03:00.0", "mrrs", 2048)]
    with pytest.raises(pp.PayloadError, match="Cannot read the payload settings of 0000:02:01.0"):
        pp.plan_present(pp.gather(switch, ["0000:03:00.0"]), "max_safe")


def test_plan_mrrs_cap(switch):
    model = pp.gather(switch, ["0000:03:00.0"])
    assert [w["after"] for w in pp.plan_present(model, None, 4096, 1024)["writes"]] == [1024]
    assert pp.plan_present(model, None, 256, 1024)["writes"][0]["after"] == 256
    assert pp.plan_present(model, None, None, 1024)["writes"] == []  # 512 is below the cap
    assert pp.plan_present(model, None, None, 256)["writes"][0]["after"] == 256


def test_plan_include_path_false(switch):
    plan = pp.plan_present(pp.gather(switch), "max_safe", include_path=False)
    assert plan["writes"] == [] and plan["devices"]["0000:03:00.0"]["limiting_device"] == "0000:00:01.0"
    assert set(plan["devices"]) == {"0000:03:00.0", "0000:04:00.0"}


def test_plan_eight_gpu_style_independent_hierarchies(tmp_path):
    two_numa_nodes(tmp_path)
    plan = pp.plan_present(pp.gather(HostFS(str(tmp_path))), "max_safe", 4096)
    assert {d["hierarchy"] for d in plan["devices"].values()} == {"0000:16:01.0", "0000:96:01.0"}
    assert [w["hierarchy"] for w in plan["writes"]] == ["0000:16:01.0", "0000:96:01.0"]


# ---- records and persistence --------------------------------------------------------------------
def test_merge_record_keeps_the_first_original(switch):
    model = pp.gather(switch)
    first = pp.merge_record(pp.empty_record(), pp.plan_present(model, "max_safe")["writes"], model["functions"])
    want = {"vendor_id": "0x10de", "device_id": "0x2330", "hierarchy": "0000:00:01.0", "depth": 4, "original": {"mps": 128}}
    assert first["devices"]["0000:03:00.0"] == want
    later = [{"device": "0000:03:00.0", "register": "mps", "before": 256, "after": 128, "hierarchy": "0000:00:01.0"},
             {"device": "0000:03:00.0", "register": "mrrs", "before": 512, "after": 4096, "hierarchy": "0000:00:01.0"}]
    second = pp.merge_record(first, later, model["functions"])
    assert second["devices"]["0000:03:00.0"]["original"] == {"mps": 128, "mrrs": 512}
    assert first["devices"]["0000:03:00.0"]["original"] == {"mps": 128}  # not modified


def test_parse_record():
    assert pp.parse_record(None, "x") == pp.empty_record()
    for empty in ("", "\n", "  "):  # a truncated record is an error, never "nothing was changed"
        with pytest.raises(pp.PayloadError, match="is empty: it should hold the original"):
            pp.parse_record(empty, "/var/lib/gpufleet/pcie_payload/originals.json")
    with pytest.raises(pp.PayloadError, match="is not valid JSON"):
        pp.parse_record("{", "/var/lib/gpufleet/pcie_payload/originals.json")
    with pytest.raises(pp.PayloadError, match="is not a gpufleet.inference.pcie_payload record"):
        pp.parse_record('{"format": "x", "devices": {}}', "f")


def test_plan_restore(switch):
    model = pp.gather(switch)
    plan = pp.plan_present(model, "max_safe", 4096)
    record = pp.merge_record(pp.empty_record(), plan["writes"], model["functions"])
    record["devices"]["0000:09:00.0"] = {"vendor_id": "0x1", "device_id": "0x2", "hierarchy": "0000:00:09.0", "depth": 2,
                                         "original": {"mps": 128}}
    everything = pp.restore_scope(record, {})
    assert everything == {"0000:00:01.0", "0000:00:09.0"}
    # nothing was written yet: the live values are the originals already
    restore = pp.plan_restore(record, pp.gather_recorded(switch, list(record["devices"])), everything)
    assert restore["writes"] == [] and restore["gone"] == ["0000:09:00.0"]
    # a subset expands to its whole hierarchy
    scope = pp.restore_scope(record, {}, ["0000:03:00.0"])
    sub = pp.plan_restore(record, pp.gather_recorded(switch, list(record["devices"])), scope)
    assert sorted(sub["restore"]) == ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0", "0000:03:00.0",
                                      "0000:04:00.0"]
    with pytest.raises(pp.PayloadError, match="has neither recorded original values nor persisted values"):
        pp.restore_scope(record, {}, ["0000:06:00.0"])
    assert pp.restore_scope(record, {"0000:06:00.0": {"hierarchy": "0000:00:02.0"}}, ["0000:06:00.0"]) == {"0000:00:02.0"}
    record["devices"]["0000:03:00.0"]["original"]["mps"] = 1024
    with pytest.raises(pp.PayloadError, match="is above what it supports"):
        pp.plan_restore(record, pp.gather_recorded(switch, list(record["devices"])), everything)


def test_plan_managed_registers(switch):
    plan = pp.plan_present(pp.gather(switch, ["0000:03:00.0", "0000:04:00.0"]), "max_safe", None, 1024)
    assert plan["managed"]["0000:03:00.0"]["registers"] == ["mps", "mrrs"]
    assert plan["managed"]["0000:00:01.0"] == {"vendor_id": "0x8086", "device_id": "0x347a", "hierarchy": "0000:00:01.0",
                                               "depth": 1, "registers": ["mps"]}
    assert set(pp.plan_present(pp.gather(switch), None, 4096)["managed"]) == {"0000:03:00.0", "0000:04:00.0"}


def test_persist_entries_replace_managed_hierarchies_and_keep_others():
    managed = {
        "0000:03:00.0": {"vendor_id": "0x10de", "device_id": "0x2330", "hierarchy": "h", "depth": 4, "registers": ["mps", "mrrs"]},
        "0000:00:01.0": {"vendor_id": "0x8086", "device_id": "0x347a", "hierarchy": "h", "depth": 1, "registers": ["mps"]},
        "0000:17:00.0": {"vendor_id": "0x10de", "device_id": "0x2330", "hierarchy": "r", "depth": 2, "registers": ["mrrs"]}}
    existing = {"0000:97:00.0": {"bdf": "0000:97:00.0", "hierarchy": "g", "depth": 2, "mrrs": 4096},
                "0000:02:00.0": {"bdf": "0000:02:00.0", "hierarchy": "h", "depth": 3, "mps": 512}}
    live = {"0000:03:00.0": {"mps": 256, "mrrs": 4096}, "0000:00:01.0": {"mps": 256, "mrrs": 512},
            "0000:17:00.0": {"mps": 256, "mrrs": 512}}
    entries = pp.persist_entries(managed, existing, live, skip={"r"})
    assert [(e["bdf"], e.get("mps"), e.get("mrrs")) for e in entries] == [
        ("0000:00:01.0", 256, None), ("0000:97:00.0", None, 4096), ("0000:03:00.0", 256, 4096)]
    text = boot.render_persist(entries)
    assert boot.parse_persist(text)["0000:03:00.0"]["mrrs"] == 4096
    assert boot.parse_persist("{") == {} and boot.parse_persist('{"format": "x"}') == {} and boot.parse_persist(None) == {}


def test_render_unit():
    unit = boot.render_unit()
    assert "Type=oneshot" in unit and "RemainAfterExit=yes" in unit and "DefaultDependencies=no" in unit
    # before udev coldplug loads the GPU drivers, so no DMA is in flight when a register changes
    assert "Before=systemd-udev-trigger.service sysinit.target shutdown.target nvidia-persistenced.service" in unit
    assert "After=systemd-remount-fs.service\n" in unit and "systemd-udev-trigger.service\nBefore" not in unit
    assert f"ConditionPathExists={boot.PERSIST_CONFIG}" in unit
    assert f"ExecStart={boot.APPLY_SCRIPT} {boot.PERSIST_CONFIG}" in unit
    assert render_script("/usr/bin/python3").startswith("#!/usr/bin/python3\n# -*- coding: utf-8 -*-")


# ---- applying with the real setpci --------------------------------------------------------------
@needs_setpci
def test_apply_writes_reads_back(switch):
    plan = pp.plan_present(pp.gather(switch), "max_safe", 4096)
    out = pp.apply_writes(switch, plan["writes"], run, SETPCI)
    assert out["failures"] == [] and len(out["done"]) == 8
    assert all(d["argv"][:5] == [SETPCI, "-A", "linux-sysfs", "-O", f"sysfs.path={switch.root}/sys/bus/pci"] for d in out["done"])
    assert pp.read_payload(switch, "0000:04:00.0")["mrrs"] == 4096


@needs_setpci
def test_apply_writes_third_value_is_an_error_and_is_undone(switch):
    """A device that reads back a value neither old nor new: failure, and that field is put back too."""
    plan = pp.plan_present(pp.gather(switch), "max_safe")

    def odd(argv):
        if argv[-2] == "0000:02:00.0" and argv[-1].endswith("0020:00e0"):
            return run(argv[:-1] + ["CAP_EXP+8.w=0040:00e0"])  # ends up at 512
        return run(argv)

    out = pp.apply_writes(switch, plan["writes"], odd, SETPCI)
    assert [(f["device"], f["kind"], f["reads"]) for f in out["failures"]] == [("0000:02:00.0", "error", 512)]
    assert [r["device"] for r in out["rolled_back"]] == ["0000:02:00.0", "0000:01:00.0", "0000:00:01.0"]
    assert {pp.read_payload(switch, b)["mps"] for b in ("0000:00:01.0", "0000:01:00.0", "0000:02:00.0")} == {128}
    msg = pp.failure_message(out["failures"][0], pp.gather(switch)["functions"], out)
    assert msg.startswith("Writing MaxPayload 256 to 0000:02:00.0 (PCI bridge [1000:c030]) failed") and "it reads 512" in msg


@needs_setpci
def test_apply_writes_rollback_failure_is_reported(switch):
    plan = pp.plan_present(pp.gather(switch), "max_safe")

    def stuck(argv):
        if argv[-2] == "0000:01:00.0":
            return 0, "", ""  # read-only: the write "succeeds" and nothing changes
        if argv[-2] == "0000:00:01.0" and argv[-1].endswith("0000:00e0"):
            return 1, "", "setpci: Unable to write: Operation not permitted"
        return run(argv)

    out = pp.apply_writes(switch, plan["writes"], stuck, SETPCI)
    assert out["failures"][0]["kind"] == "readonly" and out["rolled_back"] == []
    assert [(r["device"], r["reads"]) for r in out["rollback_failed"]] == [("0000:00:01.0", 256)]
    msg = pp.failure_message(out["failures"][0], pp.gather(switch)["functions"], out)
    assert "ROLLBACK FAILED, these keep the new value: 0000:00:01.0 mps reads 256 (was 128)" in msg


@needs_setpci
def test_apply_writes_readonly_warn_goes_on_with_other_hierarchies(tmp_path):
    two_gpus_one_switch(tmp_path / "a")
    two_numa_nodes(tmp_path / "b")
    fs = HostFS(str(tmp_path / "b"))
    plan = pp.plan_present(pp.gather(fs), None, 1024)

    def ro_first(argv):
        return (0, "", "") if argv[-2] == "0000:17:00.0" else run(argv)

    out = pp.apply_writes(fs, plan["writes"], ro_first, SETPCI, stop_on_readonly=False)
    assert [f["device"] for f in out["failures"]] == ["0000:17:00.0"] and [d["device"] for d in out["done"]] == ["0000:97:00.0"]
    stop = pp.apply_writes(HostFS(str(tmp_path / "b")), pp.plan_present(pp.gather(fs), None, 2048)["writes"], ro_first, SETPCI)
    assert [d["device"] for d in stop["done"]] == [] and len(stop["failures"]) == 1


def test_record_json_is_stable(switch):
    model = pp.gather(switch)
    rec = pp.merge_record(pp.empty_record(), pp.plan_present(model, "max_safe")["writes"], model["functions"])
    assert boot.render_json(rec) == boot.render_json(json.loads(boot.render_json(rec)))


def test_payload_mismatches_against_pcie_facts(switch):
    from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import build_model
    model = pp.gather(switch)
    plan = pp.plan_present(model, "max_safe", 4096)
    facts = build_model(switch, list(plan["devices"]), with_names=False)
    mismatches = pp.payload_mismatches(plan["devices"], facts)
    assert "0000:03:00.0: MaxPayload is 128, expected 256" in mismatches
    assert "0000:03:00.0: MaxReadReq is 512, expected 4096" in mismatches
    assert len(mismatches) == 8
    if SETPCI:
        pp.apply_writes(switch, plan["writes"], run, SETPCI)
        assert pp.payload_mismatches(plan["devices"], build_model(switch, list(plan["devices"]), with_names=False)) == []
    assert pp.payload_mismatches({"0000:09:00.0": {"mps_after": 128}}, {"devices": {}}) == [
        "0000:09:00.0: pcie_facts could not read its PCI Express capability"]
