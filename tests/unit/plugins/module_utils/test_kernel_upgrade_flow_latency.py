# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel upgrade's verdict with the latency part (issue 33, item 3): each side's per-run TTFT/TPOT journaled,
a candidate at the same tok/s with twice the TTFT rolled back naming the metric, journals and roles from before the
latency part still resumed and judged on throughput (``not measured``), latency margins checked before any run.
Whole runs on the simulated host of flow_sim.py."""

from __future__ import annotations

import copy

from tests.unit.plugins.module_utils.flow_sim import NEW, OLD, SETTINGS, Host, drive

WIGGLE = [1.0, 1.01, 0.99, 1.005, 0.995, 1.008, 0.992, 1.003, 0.997, 1.006, 0.994, 1.002, 0.998, 1.004, 0.996]


class Timed(Host):
    """The simulated host whose benchmarks carry each run's latency ({level: {metric: [ms]}}, as the role's
    latency_samples filter sends it); ``ttft_new`` scales the new kernel's TTFT. ``latency_from`` is the first
    benchmark that carries latency (the ones before came from a role without the latency part)."""

    def __init__(self, ttft_new=1.0, settings=None, latency_from=0, **kw):
        super().__init__(**kw)
        self.ttft_new, self.run_settings, self.latency_from = ttft_new, settings or SETTINGS, latency_from

    def observe(self, event, data, settings=None):
        return super().observe(event, data, self.run_settings)

    def benchmark(self, action):
        data = super().benchmark(action)
        if len(self.benchmarks) <= self.latency_from:
            return data
        level = next(iter(data["samples"])) if isinstance(data["samples"], dict) else "4"
        n = len(data["samples"][level] if isinstance(data["samples"], dict) else data["samples"])
        scale = self.ttft_new if self.running == NEW else 1.0
        done = sum(b.get("runs", 0) for b in self.benchmarks[:-1] if b["label"] == action["label"])
        w = [WIGGLE[(done + i) % len(WIGGLE)] for i in range(n)]
        data["latency"] = {level: {"ttft_p50": [50.0 * scale * x for x in w], "ttft_p90": [60.0 * scale * x for x in w],
                                   "tpot_p50": [3.0 * x for x in w], "tpot_p90": [3.3 * x for x in w]}}
        return data


def settings(**gate):
    out = copy.deepcopy(SETTINGS)
    out["gate"].update(gate)
    return out


def test_equal_throughput_with_twice_the_ttft_rolls_back_naming_the_metric():
    host = Timed(ttft_new=2.0)
    result = drive(host)
    assert result["finish"]["decision"] == "regression", result["finish"]
    assert "TTFT p" in result["finish"]["reason"] and "regression on latency" in result["finish"]["reason"]
    assert (host.running, host.default) == (OLD, OLD)  # rolled back, the old kernel the saved default
    record = host.history[0]
    assert record["gate"]["throughput"]["decision"] == "pass"
    assert record["gate"]["latency"]["metrics"]["ttft_p50"]["ratio"] > 1.9
    for side in ("baseline", "candidate"):  # each side's per-run latency is journaled, one figure per run
        assert len(record[side]["latency"]["ttft_p50"]) == len(record[side]["samples"])


def test_the_same_latency_commits_with_the_latency_part_judged():
    host = Timed()
    assert drive(host)["finish"]["decision"] == "pass" and (host.running, host.default) == (NEW, NEW)
    gate = host.history[0]["gate"]
    assert gate["latency"]["status"] == "judged" and set(gate["latency"]["metrics"]) == {
        "ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"}


def test_a_per_run_latency_margin_from_the_role_is_used():
    host = Timed(ttft_new=1.3, settings=settings(latency_margins={"ttft_p50": 0.5, "ttft_p90": 0.5}))
    assert drive(host)["finish"]["decision"] == "pass"
    assert host.history[0]["gate"]["latency"]["margins"]["ttft_p50"] == 0.5
    strict = Timed(ttft_new=1.3)
    assert drive(strict)["finish"]["decision"] == "regression"


def test_a_role_without_the_latency_part_is_judged_on_throughput_marked_not_measured():
    host = Timed(ttft_new=2.0, latency_from=10_000)  # no benchmark carries latency: the old role
    assert drive(host)["finish"]["decision"] == "pass"
    assert host.history[0]["gate"]["latency"]["status"] == "not measured"


def test_a_journal_from_before_the_latency_part_still_resumes():
    """The baseline journaled by the release before (no latency), resumed by this one after a crash at every step:
    the candidate carries latency, the baseline none, so the latency part is not measured and the verdict is
    throughput's, never a guess."""
    old_path = 0
    for crash_after in range(1, 20):
        host = Timed(ttft_new=2.0, latency_from=1)
        result = drive(host, crash_after=crash_after)
        record = host.history[0]
        if record["baseline"]["latency"]:  # the crash came before the baseline was journaled: measured again, whole
            assert result["finish"]["decision"] == "regression", (crash_after, result["finish"])
            continue
        old_path += 1
        assert result["finish"]["decision"] == "pass", (crash_after, result["finish"])
        assert (host.running, host.default) == (NEW, NEW)
        assert record["gate"]["latency"]["status"] == "not measured" and record["candidate"]["latency"]
    assert old_path >= 15


def test_a_bad_latency_margin_is_refused_before_anything_is_measured():
    host = Timed(settings=settings(latency_margins={"ttft_p50": 3}))
    result = drive(host)
    assert result["finish"]["decision"] == "error" and "latency_margins.ttft_p50" in result["finish"]["reason"]
    assert host.benchmarks == [] and (host.running, host.default) == (OLD, OLD)


class OldJournal(Timed):
    """Every journal written holds the baseline as the release before wrote it: no ``latency`` key at all."""

    def write(self, journal):
        if journal and isinstance(journal.get("baseline"), dict):
            journal = copy.deepcopy(journal)
            journal["baseline"].pop("latency", None)
        super().write(journal)


def test_a_journal_without_latency_keys_resumes_at_every_step():
    for crash_after in range(1, 20):
        host = OldJournal(ttft_new=2.0)
        result = drive(host, crash_after=crash_after)
        assert result["finish"]["decision"] == "pass", (crash_after, result["finish"])
        assert host.history[0]["gate"]["latency"]["status"] == "not measured" and "latency" not in host.history[0]["baseline"]
