# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The throughput gate's settings, defined once: ``GateSettings`` holds every setting of the gate with its default and
checks them in one place (``check()`` for the throughput part, ``latency_in_force()`` for the latency part); ``GATE``
is the defaults. ``RunFacts`` holds what a comparison knows beside the runs (failed requests, workloads).

Every other place reads these: the module's argument spec (``default=GATE.threshold``), the filter, the kernel
upgrade flow, measured tuning (its one documented override, ``tuning/tune_measured.py``), the history's change-point
rule. The roles' defaults keep their YAML values (they document them); a unit test holds them equal to ``GATE``.
Standard library only; the design and the calibration of each default are in docs/benchmark.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError

CANDIDATE_MIN_RUNS = 4  # the first look: with 5 baseline runs a quiet host is decided after 9 runs in all
ORDERS = ("sequential", "interleaved")
SPENDING = ("obf", "pocock")
MAX_RUNS = 1000  # runs per side at most (the looks' schedule and the t tables are built up to it)
MAX_BOOTSTRAP = 100000  # bootstrap resamples at most (about a second of CPU per look)

# The latency part (docs/benchmark.md, "The latency part"): one figure per run and metric, in ms.
LATENCY_METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "itl_p99")
LATENCY_LABELS = {"ttft_p50": "TTFT p50", "ttft_p90": "TTFT p90", "tpot_p50": "TPOT p50", "tpot_p90": "TPOT p90",
                  "itl_p99": "ITL p99"}
# the largest increase (a fraction: 0.10 = +10%) each metric may take before the change is a regression; ITL p99's
# +25% from the stored H200 A/A runs (docs/benchmark.md, "ITL p99")
DEFAULT_LATENCY_MARGINS = {"ttft_p50": 0.10, "ttft_p90": 0.15, "tpot_p50": 0.075, "tpot_p90": 0.10, "itl_p99": 0.25}
LATENCY_MARGIN_RANGE = (0.01, 1.0)
# each metric's false-regression rate: the five together spend 0.01, the throughput part's alpha (Bonferroni; a
# pass needs every part's pass, so pass_alpha bounds a false pass of each part without a correction)
LATENCY_ALPHA = 0.002
# A tail metric is judged only where the baseline's own runs can tell its margin (its smallest detectable increase
# at the cap within the margin); elsewhere it is "not judged", said, and never stops a change: the p99 of a run's
# inter-token gaps sits on the edge between decode steps and prefill stalls when about 1% of the gaps are stalls,
# and jumps run to run (sd 13-31% at 512/256, c=64 on the H200) where the p50s are steady.
LATENCY_TAIL_METRICS = ("itl_p99",)
# A closed loop with fewer requests per slot than this starts most of its requests in waves: whole runs fall into one
# of two latency regimes (TTFT p50 about 730 or 1,600 ms at 2 per slot on the H200, one regime at 4 per slot), so
# these metrics are not judged there (docs/benchmark.md, "Closed loops in waves"). Open loops and mixed lengths are.
MIN_REQUESTS_PER_SLOT = 4
WAVE_METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
WAVE_FREE_PROFILES = ("mixed_lengths",)  # workload profiles whose lengths break the waves up
# The noise between server starts (between_start_sd): a standard deviation of the log of a start's mean throughput
# (about the fraction for small values), at most this; None or 0: the runs' own, within-start noise only.
MAX_BETWEEN_START_SD = 0.2


@dataclass(frozen=True)
class GateSettings:  # pylint: disable=too-many-instance-attributes  # the gate's settings, one field each
    """Every setting of the gate, with its default (the module's options of the same names; ``bootstrap`` is its
    ``bootstrap_resamples``). ``step`` 0/None means 2 and ``baseline_step`` 0/None means 1, as the gate always took
    them; ``detect`` None means min(1.6 x the margin, the margin + half the rest); ``candidate_min_runs`` None means
    ``min_runs``."""

    threshold: float = 0.95
    alpha: float = 0.01
    pass_alpha: float = 0.005
    min_runs: int = 5
    max_runs: int = 15
    step: int | None = 2
    bootstrap: int = 2000
    seed: int = 0
    ci_level: float = 0.95
    unit: str = "tok/s"
    noisy_cv: float = 0.05
    max_baseline_runs: int = 15
    baseline_step: int | None = 1
    power: float = 0.8
    spending: str = "pocock"
    screen_alpha: float = 0.001
    drift_alpha: float = 0.001
    requests_per_run: int | None = None
    detect: float | None = None
    candidate_min_runs: int | None = CANDIDATE_MIN_RUNS
    trend_guard: float = 0.1
    guard_from: int = 2
    pass_floor: float = 0.75
    reserve: float = 0.3
    order: str = "sequential"
    latency_margins: Any = None
    latency_alpha: float = LATENCY_ALPHA
    between_start_sd: float | None = None

    @property
    def first_look(self) -> Any:
        """The candidate's first look (``candidate_min_runs``, else ``min_runs``)."""
        return self.candidate_min_runs or self.min_runs

    @property
    def look_step(self) -> Any:
        """Candidate runs between looks (0/None: 2)."""
        return self.step or 2

    @property
    def margin(self) -> float:
        return 1.0 - self.threshold

    def drop_to_detect(self) -> float:
        """``detect``, or its default from the margin."""
        margin = self.margin
        return min(1.6 * margin, margin + (1.0 - margin) / 2.0) if self.detect is None else self.detect

    def check(self) -> None:
        """GateError, with the allowed range, for the first throughput setting that cannot give a sound decision."""
        self._check_rates()
        self._check_counts()
        self._check_design()

    def _check_rates(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise GateError(f"threshold must be in (0, 1) (0.95 = a 5% drop is a regression), got {self.threshold}")
        for name in ("alpha", "pass_alpha", "screen_alpha", "drift_alpha"):
            if not 0.0 < getattr(self, name) < 0.5:
                raise GateError(f"{name} must be in (0, 0.5), got {getattr(self, name)}")
        if not 0.5 <= self.power < 1.0:
            raise GateError(f"power must be in [0.5, 1) (0.8: the smallest detectable drop is caught 80% of the time), "
                            f"got {self.power}")

    def _check_counts(self) -> None:
        min_runs, max_runs, cap = self.min_runs, self.max_runs, self.max_baseline_runs
        for name, value in (("min_runs", min_runs), ("max_runs", max_runs), ("max_baseline_runs", cap),
                            ("step", self.look_step), ("baseline_step", self.baseline_step or 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RUNS):
                raise GateError(f"{name} must be a whole number of runs between 1 and {MAX_RUNS}, got {value!r}")
        if min_runs < 3:
            raise GateError(f"min_runs must be at least 3 (a side's spread needs two runs and the test a degree of freedom "
                            f"more), got {min_runs}")
        if max_runs < min_runs:
            raise GateError(f"max_runs ({max_runs}) must be at least min_runs ({min_runs}): allowed {min_runs}..{MAX_RUNS}")
        if cap is not None and cap < min_runs:
            raise GateError(f"max_baseline_runs ({cap}) must be at least min_runs ({min_runs}): allowed "
                            f"{min_runs}..{MAX_RUNS} (kernel_upgrade_gate_max_baseline_runs in the kernel_upgrade role)")
        if self.spending not in SPENDING:
            raise GateError(f"spending must be one of {', '.join(SPENDING)}, got {self.spending!r}")
        bootstrap = self.bootstrap
        if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or not 0 <= bootstrap <= MAX_BOOTSTRAP:
            raise GateError(f"bootstrap_resamples must be a whole number between 0 (off) and {MAX_BOOTSTRAP}, got "
                            f"{bootstrap!r}")

    def _check_design(self) -> None:
        if not 0.0 < self.pass_floor <= 1.0:
            raise GateError(f"pass_floor must be in (0, 1] (a share of the margin: 0.75 at threshold 0.95 passes from "
                            f"0.9625), got {self.pass_floor}")
        if not 0.0 <= self.reserve < 1.0:
            raise GateError(f"reserve must be in [0, 1) (the share of each error rate kept for the last look), got {self.reserve}")
        if not 0.0 <= self.trend_guard < 0.5:
            raise GateError(f"trend_guard must be in [0, 0.5) (0 turns the shared-trend guard off), got {self.trend_guard}")
        if self.order not in ORDERS:
            raise GateError(f"order must be one of {', '.join(ORDERS)} (how baseline and candidate runs were taken), "
                            f"got {self.order!r}")
        if self.guard_from < 1:
            raise GateError(f"guard_from must be at least 1 (the look from which the trend guard applies), got {self.guard_from}")
        detect = self.drop_to_detect()
        if not self.margin < detect < 1.0:
            raise GateError(f"detect must be a drop larger than the margin {self.margin:.3g} and below 1, got {detect}")
        if not 3 <= self.first_look <= self.max_runs:
            raise GateError(f"candidate_min_runs must be between 3 and max_runs ({self.max_runs}), got {self.first_look}")
        self.start_sd()

    def start_sd(self) -> float:
        """``between_start_sd`` checked, as a number (0.0 for None: within-start noise only); GateError when it is no
        number or outside [0, MAX_BETWEEN_START_SD]."""
        value = self.between_start_sd
        if value is None:
            return 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= MAX_BETWEEN_START_SD:
            raise GateError(f"between_start_sd must be a standard deviation between 0 and {MAX_BETWEEN_START_SD} (0.008: "
                            f"the means of two server starts differ with an sd of 0.8% each; null: within-start noise "
                            f"only), got {value!r}")
        return float(value)

    def latency_in_force(self) -> dict[str, float]:
        """The latency margins in force (DEFAULT_LATENCY_MARGINS with ``latency_margins`` over them; a metric set to
        null or 0 is not judged), ``latency_alpha`` checked; GateError for an unknown metric or a value out of range."""
        in_force = _margins_in_force(self.latency_margins)
        if not 0.0 < self.latency_alpha < 0.5:
            raise GateError(f"latency_alpha must be in (0, 0.5) (each latency metric's false-regression rate), got "
                            f"{self.latency_alpha}")
        return in_force


@dataclass(frozen=True)
class RunFacts:
    """What a comparison knows beside the runs: each side's failed and sent requests (a candidate that fails more
    cannot pass), its workload (a benchmark result or its fingerprint: different workloads are refused) and the
    change under test (bench/workload.py CHANGES: the fingerprint fields it lets differ; "none": nothing)."""

    baseline_failed: Any = 0
    baseline_requests: Any = 0
    candidate_failed: Any = 0
    candidate_requests: Any = 0
    baseline_workload: Any = None
    candidate_workload: Any = None
    change: Any = "none"


GATE = GateSettings()
NO_FACTS = RunFacts()
SETTING_NAMES = tuple(f.name for f in fields(GateSettings))
FACT_NAMES = tuple(f.name for f in fields(RunFacts))


def gate_inputs(settings: GateSettings | None, facts: RunFacts | None, options: dict[str, Any],
                caller: str = "decide") -> tuple[GateSettings, RunFacts]:
    """The settings and facts of one call: ``settings``/``facts`` (GATE, NO_FACTS when None) with the keyword
    ``options`` over them, each to its own; TypeError for an option that is neither (as a Python call gives)."""
    unknown = sorted(k for k in options if k not in SETTING_NAMES and k not in FACT_NAMES)
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    chosen = {k: v for k, v in options.items() if k in SETTING_NAMES}
    known = {k: v for k, v in options.items() if k in FACT_NAMES}
    out_settings = replace(settings or GATE, **chosen) if chosen else (settings or GATE)
    out_facts = replace(facts or NO_FACTS, **known) if known else (facts or NO_FACTS)
    return out_settings, out_facts


def check_latency_margins(margins: Any) -> dict[str, float]:
    """The margins in force: DEFAULT_LATENCY_MARGINS with the given ones over them. A metric set to null or 0 is not
    judged (left out). GateError for an unknown metric or a margin outside LATENCY_MARGIN_RANGE."""
    return _margins_in_force(margins)


def _margins_in_force(margins: Any) -> dict[str, float]:
    if margins is None:
        margins = {}
    if not isinstance(margins, dict):
        raise GateError(f"latency_margins must be a dict of metric: margin ({', '.join(LATENCY_METRICS)}), got "
                        f"{type(margins).__name__}")
    unknown = sorted(str(k) for k in margins if k not in LATENCY_METRICS)
    if unknown:
        raise GateError(f"latency_margins: unknown metric(s) {', '.join(unknown)}; known: {', '.join(LATENCY_METRICS)}")
    out = dict(DEFAULT_LATENCY_MARGINS)
    low, high = LATENCY_MARGIN_RANGE
    for key, value in margins.items():
        if value is None or (not isinstance(value, bool) and value == 0):
            out.pop(key)
            continue
        try:
            value = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not low <= value <= high:
            raise GateError(f"latency_margins.{key} must be an increase between {low} and {high} (0.10: +10% is still a "
                            f"pass), or null/0 to leave {LATENCY_LABELS[key]} unjudged; got {margins[key]!r}")
        out[key] = value
    return out
