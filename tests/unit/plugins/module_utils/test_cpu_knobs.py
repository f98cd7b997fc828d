# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""cpu/knobs.py on fake trees: the governor, EPP, C-state limit and THP plans, their checks before any write, the
skips of a host that lacks a knob, the apply with read-back and undo, and the record of originals."""

from __future__ import annotations

import errno

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils.cpu import knobs
from tests.unit.fakesysfs import FakeHost, cpu_knobs

GOV0 = "/sys/devices/system/cpu/cpufreq/policy0/scaling_governor"
EPP0 = "/sys/devices/system/cpu/cpufreq/policy0/energy_performance_preference"
C6 = "/sys/devices/system/cpu/cpu{}/cpuidle/state3/disable"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


class KernelFS(HostFS):
    """Writes as the kernel takes them: a THP word becomes the bracketed one of the list; ``refuse`` {path: errno}."""

    def __init__(self, root, refuse=None):
        super().__init__(str(root))
        self.refuse = dict(refuse or {})

    def write_text(self, host_path, data):
        if host_path in self.refuse:
            code = self.refuse[host_path]
            raise HostFSError("write", host_path, OSError(code, errno.errorcode[code]))
        if host_path in knobs.THP_FILES.values():
            _current, words = knobs.parse_bracketed(self.read_optional(host_path))
            data = " ".join(f"[{w}]" if w == data.strip() else w for w in words)
        super().write_text(host_path, data)


def tree_of(tmp_path, **kw):
    host = FakeHost(tmp_path)
    cpu_knobs(host, **kw)
    return knobs.read_tree(HostFS(str(tmp_path)))


@pytest.mark.parametrize("text,current,words", [
    ("always [madvise] never\n", "madvise", ["always", "madvise", "never"]),
    ("[always] defer defer+madvise madvise never", "always", ["always", "defer", "defer+madvise", "madvise", "never"]),
    ("never", "never", ["never"]), ("", None, []), (None, None, []),
])
def test_parse_bracketed(text, current, words):
    assert knobs.parse_bracketed(text) == (current, words)


def test_knob_of_names_only_the_files_written():
    assert knobs.knob_of(GOV0) == "governor" and knobs.knob_of(EPP0) == "energy_performance_preference"
    assert knobs.knob_of(C6.format(12)) == "cstate" and knobs.knob_of(THP_ENABLED) == "thp_enabled"
    for other in ("/etc/passwd", "/sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq",
                  "/sys/devices/system/cpu/cpu0/cpuidle/state3/../../online"):
        assert knobs.knob_of(other) is None


def test_read_tree(tmp_path):
    tree = tree_of(tmp_path, cpus=2)
    assert tree["policies"]["policy1"] == {"cpus": "1", "driver": "intel_pstate", "governor": "powersave",
                                           "governors": ["performance", "powersave"], "epp": "balance_performance",
                                           "epps": knobs.parse_bracketed("default performance balance_performance balance_power power")[1]}
    assert tree["cpus"] == [0, 1] and tree["cpuidle_driver"] == "intel_idle"
    assert [(s["name"], s["latency"], s["disable"]) for s in tree["idle"][1].values()] == [
        ("POLL", 0, "0"), ("C1", 2, "0"), ("C1E", 10, "0"), ("C6", 170, "0")]
    assert tree["thp"]["thp_enabled"][0] == "always" and tree["thp"]["thp_defrag"][0] == "madvise"


def test_governor_plan_one_step_per_policy_that_differs(tmp_path):
    tree = tree_of(tmp_path)
    tree["policies"]["policy2"]["governor"] = "performance"
    steps, skips = knobs.plan(tree, {"governor": "performance"}, {})
    assert skips == {} and [s["path"].split("/")[-2] for s in steps] == ["policy0", "policy1", "policy3"]
    assert steps[0] == {"action": "set_value", "knob": "governor", "path": GOV0, "before": "powersave", "after": "performance"}


def test_governor_not_offered_is_an_error_before_any_write(tmp_path):
    tree = tree_of(tmp_path, driver="acpi-cpufreq", governors="conservative ondemand userspace powersave performance schedutil")
    tree["policies"]["policy3"]["governors"] = ["powersave"]
    with pytest.raises(knobs.CpuTuningError, match=r"policy3 \(driver acpi-cpufreq\) offers the governors powersave, not performance"):
        knobs.plan(tree, {"governor": "performance", "thp_enabled": "never"}, {})


def test_a_host_without_a_knob_gets_a_clear_skip(tmp_path):
    tree = tree_of(tmp_path, driver=None, idle_driver=None, thp=None)
    steps, skips = knobs.plan(tree, {"governor": "performance", "energy_performance_preference": "performance",
                                     "cstate_max_latency_us": 10, "thp_enabled": "never", "thp_defrag": "never"}, {})
    assert steps == []
    assert set(skips) == set(knobs.KNOBS)
    assert "no cpufreq driver" in skips["governor"]
    assert "cpuidle driver: none" in skips["cstate"] and "QEMU TCG" not in skips["cstate"]
    assert "CONFIG_TRANSPARENT_HUGEPAGE" in skips["thp_enabled"]


def test_epp(tmp_path):
    steps, skips = knobs.plan(tree_of(tmp_path), {"energy_performance_preference": "performance"}, {})
    assert skips == {} and len(steps) == 4 and steps[0]["path"] == EPP0
    with pytest.raises(knobs.CpuTuningError, match="offers the energy-performance preferences .* not turbo"):
        knobs.plan(tree_of(tmp_path), {"energy_performance_preference": "turbo"}, {})
    with pytest.raises(knobs.CpuTuningError, match="refuses balance_power \\(EBUSY\\)"):
        knobs.plan(tree_of(tmp_path), {"governor": "performance", "energy_performance_preference": "balance_power"}, {})
    steps, _skips = knobs.plan(tree_of(tmp_path), {"governor": "performance", "energy_performance_preference": "performance"}, {})
    assert [s["knob"] for s in steps] == ["governor"] * 4 + ["energy_performance_preference"] * 4  # governor first


def test_epp_missing_is_a_skip(tmp_path):
    _steps, skips = knobs.plan(tree_of(tmp_path, driver="acpi-cpufreq", epp=None), {"energy_performance_preference": "performance"}, {})
    assert "driver acpi-cpufreq" in skips["energy_performance_preference"]


def test_cstate_limit_disables_the_deeper_states_and_a_relaxed_limit_puts_originals_back(tmp_path):
    tree = tree_of(tmp_path, cpus=2)
    steps, _skips = knobs.plan(tree, {"cstate_max_latency_us": 10}, {})
    assert [(s["path"], s["after"]) for s in steps] == [(C6.format(0), "1"), (C6.format(1), "1")]
    steps, _skips = knobs.plan(tree, {"cstate_max_latency_us": 2}, {})
    assert len(steps) == 4 and {s["path"].split("/")[-2] for s in steps} == {"state2", "state3"}
    tree["idle"][0]["state2"]["disable"] = "1"  # an earlier limit of 2 us disabled C1E; the record holds its original
    steps, _skips = knobs.plan(tree, {"cstate_max_latency_us": 10}, {C6.format(0).replace("state3", "state2"): "0"})
    assert ("/sys/devices/system/cpu/cpu0/cpuidle/state2/disable", "0") in [(s["path"], s["after"]) for s in steps]
    assert knobs.plan(tree_of(tmp_path, cpus=2), {"cstate_max_latency_us": 1000}, {})[0] == []  # nothing above 1000 us


def test_thp(tmp_path):
    steps, _skips = knobs.plan(tree_of(tmp_path), {"thp_enabled": "madvise", "thp_defrag": "madvise"}, {})
    assert steps == [{"action": "set_value", "knob": "thp_enabled", "path": THP_ENABLED, "before": "always", "after": "madvise"}]


@pytest.mark.parametrize("settings,match", [
    ({"cstate_max_latency_us": -1}, "out of range"), ({"cstate_max_latency_us": 10 ** 8}, "out of range"),
    ({"cstate_max_latency_us": True}, "out of range"), ({"cstate_max_latency_us": "5"}, "out of range"),
    ({"governor": "perf ormance"}, "not a sysfs word"), ({"governor": "../x"}, "not a sysfs word"),
    ({"governor": "a\nb"}, "not a sysfs word"), ({"nohz": "on"}, "not a CPU setting"),
])
def test_check_settings_refuses(settings, match):
    with pytest.raises(knobs.CpuTuningError, match=match):
        knobs.check_settings(settings)


def test_apply_reads_back_and_undoes_everything_when_one_write_is_refused(tmp_path):
    tree = tree_of(tmp_path, cpus=2)
    steps, _skips = knobs.plan(tree, {"governor": "performance", "thp_enabled": "never"}, {})
    fs = KernelFS(tmp_path, refuse={THP_ENABLED: errno.EBUSY})
    outcome = knobs.apply(fs, steps)
    assert len(outcome["failures"]) == 1 and len(outcome["rolled_back"]) == 2
    assert "EBUSY" in knobs.failure_text(outcome)
    assert knobs.summary(knobs.read_tree(fs))["governor"] == {"policy0": "powersave", "policy1": "powersave"}
    fs.refuse = {}
    outcome = knobs.apply(fs, steps)
    assert outcome["failures"] == [] and len(outcome["done"]) == 3
    assert (tmp_path / THP_ENABLED.lstrip("/")).read_text() == "always madvise [never]"


def test_restore_plan_writes_back_exactly_the_recorded_originals(tmp_path):
    fs = KernelFS(tmp_path)
    tree = tree_of(tmp_path, cpus=2)
    steps, _skips = knobs.plan(tree, {"governor": "performance", "cstate_max_latency_us": 10, "thp_enabled": "never"}, {})
    record = knobs.record_after({}, steps)
    assert record[GOV0] == "powersave" and record[THP_ENABLED] == "always" and record[C6.format(1)] == "0"
    assert knobs.record_after(record, [dict(steps[0], before="performance")])[GOV0] == "powersave"  # first seen stays
    knobs.apply(fs, steps)
    back, gone = knobs.restore_plan(fs, record, ["governor", "thp_enabled"])
    assert gone == [] and {s["knob"] for s in back} == {"governor", "thp_enabled"}
    knobs.apply(fs, back)
    after = knobs.summary(knobs.read_tree(fs))
    assert after["governor"] == {"policy0": "powersave", "policy1": "powersave"} and after["thp_enabled"] == "always"
    assert after["cstates_disabled"]["cpu0"] == ["state3 (C6, 170 us)"]  # not restored: not asked


def test_record_file_round_trip_and_damage(tmp_path):
    record = {GOV0: "powersave"}
    assert knobs.load_record(knobs.render_record(record), "r.json") == record
    assert knobs.load_record(None, "r.json") == {}
    with pytest.raises(knobs.CpuTuningError, match="is empty"):
        knobs.load_record("\n", "r.json")
    with pytest.raises(knobs.CpuTuningError, match="not valid JSON"):
        knobs.load_record("{", "r.json")
    with pytest.raises(knobs.CpuTuningError, match="not a CPU setting this module writes"):
        knobs.load_record(knobs.render_record({"/etc/shadow": "x"}), "r.json")


def test_simulate_matches_what_apply_reads_back(tmp_path):
    fs = KernelFS(tmp_path)
    tree = tree_of(tmp_path, cpus=2)
    steps, _skips = knobs.plan(tree, {"governor": "performance", "energy_performance_preference": "performance",
                                      "cstate_max_latency_us": 2, "thp_enabled": "madvise", "thp_defrag": "never"}, {})
    predicted = knobs.summary(knobs.simulate(tree, steps))
    knobs.apply(fs, steps)
    assert knobs.summary(knobs.read_tree(fs)) == predicted
    assert predicted["cstates_disabled"]["cpu1"] == ["state2 (C1E, 10 us)", "state3 (C6, 170 us)"]


def test_boot_applier_logs_skips_and_failures(tmp_path, capsys):
    from ansible_collections.gpufleet.inference.plugins.module_utils.cpu import boot, reapply
    host = FakeHost(tmp_path / "vm")
    cpu_knobs(host, driver=None, idle_driver=None)
    config = tmp_path / "cpu_tuning.json"
    config.write_text(boot.render_persist({"governor": "performance", "thp_enabled": "never"}))
    assert reapply.main(["--root", str(tmp_path / "vm"), str(config)]) == 0
    out = capsys.readouterr().out
    assert "governor: skipped, no cpufreq policy" in out and "transparent_hugepage/enabled: always -> never" in out
    config.write_text(boot.render_persist({"thp_enabled": "sometimes"}))
    assert reapply.main(["--root", str(tmp_path / "vm"), str(config)]) == 1
    assert "thp_enabled='sometimes'" in capsys.readouterr().out
    config.write_text("{}")
    assert reapply.main(["--root", str(tmp_path / "vm"), str(config)]) == 2
    assert reapply.main(["--root", str(tmp_path / "vm"), str(tmp_path / "missing.json")]) == 2
