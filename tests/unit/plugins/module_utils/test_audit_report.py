"""Fleet report rendering: link text, degraded links, ordering and escaping."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import audit_report as ar


def _dev(cur_gts, cur_w, max_gts, max_w, name="GH100"):
    return {"device_name": name, "driver": "nvidia",
            "config": {"pcie": {"link_cap": {"speed_gts": max_gts, "width": max_w},
                                "link_sta": {"speed_gts": cur_gts, "width": cur_w}}}}


def _entry(host="gpu1", findings=None):
    return {"host": host, "kernel": "6.1.0-50-cloud-amd64", "pcie": {
        "gpus": [{"bdf": "0000:01:00.0", "numa_node": 0}, {"bdf": "0000:02:00.0", "numa_node": 1}],
        "devices": {"0000:01:00.0": _dev(16.0, 16, 16.0, 16), "0000:02:00.0": _dev(8.0, 8, 16.0, 16)},
        "pairs": [{"a": "0000:01:00.0", "b": "0000:02:00.0", "level": "SYS"}],
        "findings": findings if findings is not None else [
            {"severity": "info", "device": None, "message": "no hugepages", "fix": "reserve some"},
            {"severity": "critical", "device": "0000:02:00.0", "message": "link 8GT/s x8 below 16GT/s x16",
             "fix": "reseat | check riser"}]}}


def test_link_text_and_degraded():
    up = ar._link(_dev(16.0, 16, 16.0, 16))
    down = ar._link(_dev(8.0, 8, 16.0, 16))
    assert ar.link_text(up) == "Gen4 (16GT/s) x16" and not ar.link_degraded(up)
    assert ar.link_text(down) == "Gen3 (8GT/s) x8 of Gen4 (16GT/s) x16" and ar.link_degraded(down)
    assert ar.link_text(None) == "n/a" and not ar.link_degraded(None)


def test_sysfs_link_is_the_fallback():
    dev = {"config": None, "link_sysfs": {"current_speed_gts": 2.5, "current_width": 1, "max_speed_gts": 8.0, "max_width": 4}}
    assert ar.link_text(ar._link(dev)) == "Gen1 (2.5GT/s) x1 of Gen3 (8GT/s) x4"


def test_summary_ranks_critical_first_and_counts():
    s = ar.host_summary(_entry())
    assert [f["severity"] for f in s["findings"]] == ["critical", "info"]
    assert s["counts"] == {"critical": 1, "warning": 0, "info": 1}
    assert s["pair_levels"] == ["SYS"]


def test_markdown_has_fleet_row_and_escapes_pipes():
    md = ar.render_markdown([_entry("gpu1"), _entry("gpu2", findings=[])])
    assert "| gpu1 | 6.1.0-50-cloud-amd64 | 2 | Gen3 (8GT/s) x8 of Gen4 (16GT/s) x16 | SYS | 1 | 0 | 1 | link 8GT/s x8 below 16GT/s x16 |" in md
    assert "reseat \\| check riser" in md
    assert "## gpu2" in md and "No findings." in md


def test_html_escapes_and_marks_severity():
    entry = _entry("<gpu&1>")
    page = ar.render_html([entry])
    assert "&lt;gpu&amp;1&gt;" in page and "<gpu&1>" not in page
    assert '<td class="critical">critical</td>' in page
    assert '<td class="bad">Gen3 (8GT/s) x8 of Gen4 (16GT/s) x16</td>' in page


def test_fleet_audits_skips_hosts_without_a_result():
    hostvars = {"a": {"__audit_result": {"pcie": {"gpus": []}}, "ansible_facts": {"kernel": "k"}}, "b": {}}
    assert ar.fleet_audits(hostvars, ["a", "b"]) == [{"host": "a", "kernel": "k", "pcie": {"gpus": []}}]


def test_nvml_name_wins_over_ids():
    entry = _entry()
    entry["pcie"]["nvml"] = {"gpus": {"0000:01:00.0": {"name": "NVIDIA H200"}}}
    entry["pcie"]["devices"]["0000:02:00.0"].update(device_name=None, vendor_id="0x10de", device_id="0x2335")
    names = [g["name"] for g in ar.host_summary(entry)["gpus"]]
    assert names == ["NVIDIA H200", "0x10de 0x2335"]


# ---- generation time, benchmarks and tuning changes on the controller ---------------------------
def _bench_doc(finished, medians, cv=0.02, label="site"):
    return {"label": label, "kernel": "6.1.0-50-cloud-amd64", "finished_at": finished, "levels": [
        {"concurrency": c, "output_throughput": {"median": m, "cv": cv, "values": [m] * 3},
         "ttft_ms": {"p50": 12.5}, "tpot_ms": {"p50": 3.4}, "errors": 0} for c, m in medians]}


def test_same_content_keeps_its_generation_time_and_new_content_gets_a_new_one():
    fleet = [_entry("gpu1")]
    first = ar.render_html(fleet, now="2026-12-01T10:00:00Z")
    assert '<time datetime="2026-12-01T10:00:00Z">' in first
    again = ar.render_html(fleet, previous=first, now="2026-12-01T11:00:00Z")
    assert again == first  # nothing changed: the same bytes, so Ansible's copy reports changed=false
    changed = ar.render_html([_entry("gpu1", findings=[])], previous=first, now="2026-12-01T11:00:00Z")
    assert "2026-12-01T11:00:00Z" in changed and "2026-12-01T10:00:00Z" not in changed
    md = ar.render_markdown(fleet, now="2026-12-01T10:00:00Z")
    assert md.startswith("# GPU fleet PCIe audit\n\nGenerated 2026-12-01T10:00:00Z.")
    assert ar.render_markdown(fleet, previous=md, now="2026-12-01T12:00:00Z") == md
    # a report of another content does not lend its time (the digest differs)
    assert "2026-12-01T10:00:00Z" not in ar.render_markdown([_entry("gpu2")], previous=md, now="2026-12-01T12:00:00Z")


def test_controller_extras_take_the_newest_benchmark_and_the_tuning_changes(tmp_path):
    bdir = tmp_path / "benchmarks" / "gpu1"
    bdir.mkdir(parents=True)
    (bdir / "site-a.json").write_text(json.dumps(_bench_doc("2026-12-01T09:00:00Z", [(4, 100.0)])))
    (bdir / "site-b.json").write_text(json.dumps(_bench_doc("2026-12-01T10:00:00Z", [(4, 250.5), (16, 900.0)], cv=None)))
    (bdir / "broken.json").write_text("{not json")
    tdir = tmp_path / "tuning"
    tdir.mkdir()
    (tdir / "gpu1.json").write_text(json.dumps({"host": "gpu1", "time": "2026-12-01T09:30:00Z", "changes": [
        {"role": "pcie_link", "what": "ASPM policy", "actions": ["set policy performance"]}]}))
    hostvars = {"gpu1": {"__audit_result": _entry("gpu1"), "ansible_facts": {"kernel": "k"}},
                "gpu2": {"__audit_result": _entry("gpu2"), "ansible_facts": {"kernel": "k"}}}
    fleet = ar.fleet_audits(hostvars, ["gpu1", "gpu2"], benchmark_dir=str(tmp_path / "benchmarks"),
                            tuning_dir=str(tdir))
    assert fleet[0]["benchmark"]["file"] == "site-b.json" and fleet[0]["benchmark"]["levels"][1]["output_throughput"] == 900.0
    assert fleet[1]["benchmark"] is None and fleet[1]["tuning"] is None
    page = ar.render_html(fleet, now="2026-12-01T10:00:00Z")
    assert "<td>250.5</td><td>n/a (one run)</td>" in page and "site-b.json" in page
    assert "<li>pcie_link, ASPM policy: set policy performance</li>" in page
    md = ar.render_markdown(fleet, now="2026-12-01T10:00:00Z")
    assert "| 16 | 900.0 | n/a (one run) | 3 | 12.5 | 3.4 | 0 |" in md
    assert "- pcie_link, ASPM policy: set policy performance" in md


def test_tuning_changes_lists_only_results_that_changed():
    hv = {"__pcie_link_aspm": {"changed": True, "actions": [{"action": "set_policy", "policy": "performance"}]},
          "__pcie_link_payload": {"changed": False, "actions": []},
          "__irq_affinity_result": {"changed": True, "actions": [{"action": "pin", "irq": 33, "before": "0-7", "after": "0-3"}]},
          "__hugepages_state": {"skipped": True, "changed": False}}
    assert ar.tuning_changes(hv) == [
        {"role": "pcie_link", "what": "ASPM policy", "actions": ["set_policy (policy performance)"]},
        {"role": "irq_affinity", "what": "IRQ affinity", "actions": ["pin (after 0-3, before 0-7, irq 33)"]}]
    assert ar.tuning_changes({}) == []


def test_hosts_not_audited_in_this_run_come_from_the_stored_audits(tmp_path):
    """audit_dir: a host without a result in this run is shown with its stored audit, marked; an unreadable
    or foreign file is left out, and a host audited in this run is never replaced by its stored file."""
    (tmp_path / "gpu2.json").write_text(json.dumps(_entry("gpu2")))
    (tmp_path / "gpu3.json").write_text("{not json")
    (tmp_path / "gpu4.json").write_text(json.dumps({"host": "gpu4", "something": "else"}))
    (tmp_path / "gpu1.json").write_text(json.dumps(_entry("gpu1", findings=[])))
    hostvars = {"gpu1": {"__audit_result": {"pcie": _entry("gpu1")["pcie"]}, "ansible_facts": {"kernel": "6.1.0-56"}},
                "gpu2": {}, "gpu3": {}, "gpu4": {}, "gpu5": {}}
    hosts = ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"]
    assert [e["host"] for e in ar.fleet_audits(hostvars, hosts)] == ["gpu1"]
    fleet = ar.fleet_audits(hostvars, hosts, audit_dir=str(tmp_path))
    assert [(e["host"], e.get("stored")) for e in fleet] == [("gpu1", None), ("gpu2", "gpu2.json")]
    assert fleet[0]["kernel"] == "6.1.0-56" and len(fleet[0]["pcie"]["findings"]) == 2  # this run's, not the file's
    md = ar.render_markdown(fleet, now="2026-12-02T00:00:00Z")
    assert "| gpu2 (stored) | 6.1.0-50-cloud-amd64 |" in md and "| gpu1 | 6.1.0-56 |" in md
    assert "## gpu2\n\nNot audited in this run: the audit last stored on the controller (gpu2.json).\n" in md
    assert md.count("Not audited in this run") == 1
    assert "Not audited in this run" in ar.render_html(fleet, now="2026-12-02T00:00:00Z")
    # a name that is not an inventory host is still bad input, stored file or not
    with pytest.raises(KeyError):
        ar.fleet_audits(hostvars, ["gpu1", "gpu9"], audit_dir=str(tmp_path))


def test_lint_findings_show_their_file_and_line():
    lint = {"severity": "warning", "device": None, "file": "/etc/nccl.conf", "line": 3, "code": "nccl_p2p_level_unknown",
            "message": "/etc/nccl.conf:3 sets NCCL_P2P_LEVEL=PCI", "fix": "use PXB"}
    sysfs = {"severity": "critical", "device": None, "file": "/sys/bus/pci/devices/0000:17:00.0/driver", "line": None,
             "message": "bound to vfio-pci", "fix": "rebind"}
    assert [ar.finding_where(f) for f in (lint, sysfs, {"device": "0000:01:00.0"}, {})] == [
        "/etc/nccl.conf:3", "/sys/bus/pci/devices/0000:17:00.0/driver", "0000:01:00.0", "-"]
    md = ar.render_markdown([_entry(findings=[lint])])
    assert "| warning | /etc/nccl.conf:3 | /etc/nccl.conf:3 sets NCCL_P2P_LEVEL=PCI | use PXB |" in md
    assert "<td>/etc/nccl.conf:3</td>" in ar.render_html([_entry(findings=[lint])])
