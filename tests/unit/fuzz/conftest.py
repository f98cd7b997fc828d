# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prints the fuzz suite's counts (calls and problems found, per module) at the end of the run."""

from __future__ import annotations

import os

from tests.unit.fuzz.harness import COUNTS, PROBLEMS


def pytest_terminal_summary(terminalreporter):
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section("fuzz suite (issue 31): module calls and problems found")
    for name in sorted(COUNTS):
        first = f"  first: {PROBLEMS[name][0][:150]}" if PROBLEMS[name] else ""
        tr.write_line(f"{name:26} calls {COUNTS[name]['calls']:5}  problems {COUNTS[name]['problems']:4}{first}")
    tr.write_line(f"{'total':26} calls {sum(c['calls'] for c in COUNTS.values()):5}  "
                  f"problems {sum(c['problems'] for c in COUNTS.values()):4}")
    report = os.environ.get("GPUFLEET_FUZZ_REPORT")
    if report:  # every problem found, for a closer look
        with open(report, "w", encoding="utf-8") as fh:
            for name in sorted(PROBLEMS):
                fh.writelines(f"{name}: {p}\n" for p in PROBLEMS[name])
