#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: maintenance_gate
short_description: Refuse a disruptive step outside the host's maintenance windows or while a blocker says no
version_added: 0.3.0
description:
  - Decides whether the host may be disrupted now (a benchmark that loads its server, a service restart, a reboot, a
    kernel change), before anything changes. The playbooks run it first in C(playbooks/tasks/disruptive.yml), before
    the drain hook.
  - O(windows) are days of the week and wall-clock hours in the host's time zone (O(timezone), else the host's own
    C(/etc/localtime), read from the host's time zone data). A window whose end is not after its start runs across
    midnight. On the days the clocks change a window keeps its wall-clock hours (an hour shorter or longer); a start
    in the skipped hour is the moment of the jump; see C(docs/drain_and_windows.md).
  - Outside every window the step is refused unless O(force). No window at all means no restriction.
  - O(blockers), asked only inside a window, stop the host from being touched - a command must exit 0; a URL must
    answer 2xx and, when it answers a Prometheus query, with an empty result (a firing alert blocks). A timeout, an
    error status or no answer blocks.
  - A refusal fails the task (unless O(refuse=false)) with the reason and changes nothing.
  - The decision is pure Python (C(plugins/module_utils/maintenance/window.py)) with the clock and the zone as inputs.
  - Needs Python 3.9 or later on the host for O(windows) (zoneinfo).
author:
  - gpufleet.inference contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.inference.common
  - gpufleet.inference.common.attributes_readonly
options:
  windows:
    description:
      - The maintenance windows, each C({days, start, end}) - days C(mon) to C(sun), ranges such as C(mon-fri), or
        C(daily) (the default); start and end as C(HH:MM) on the host's wall clock.
    type: list
    elements: dict
    default: []
  timezone:
    description: The IANA time zone of O(windows) (C(Europe/Berlin)); by default the host's own.
    type: str
  force:
    description: Act outside the windows (the result says it was forced). Blockers still apply.
    type: bool
    default: false
  blockers:
    description:
      - Checks that stop the host from being touched, each C({command, name, timeout}) (an argv list, no shell; clear
        when it exits 0) or C({url, name, timeout}) (clear on 2xx with an empty Prometheus result). C(timeout) is in
        seconds, 1 to 600, default 30.
    type: list
    elements: dict
    default: []
  step:
    description: What is about to be done (for the message), such as C(kernel upgrade) or C(benchmark).
    type: str
  now:
    description: The instant to decide for, in seconds since 1970 (a dry run of a schedule); by default the host's clock.
    type: float
  refuse:
    description: Fail the task when the host may not be touched; with C(false) return RV(allowed) false instead.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Only on weeknights in the host's time zone, and only without a firing GPU alert
  gpufleet.inference.maintenance_gate:
    step: kernel upgrade
    windows:
      - {days: [mon-fri], start: "22:00", end: "04:00"}
      - {days: [sat, sun], start: "00:00", end: "00:00"}
    blockers:
      - name: firing alerts
        url: "http://prometheus.example:9090/api/v1/query?query=ALERTS%7Balertstate%3D%22firing%22%2Cinstance%3D~%22{{ inventory_hostname }}.*%22%7D"
      - name: no rollout lock
        command: [test, '!', -e, /run/rollout.lock]
"""

RETURN = r"""
allowed:
  description: Whether the host may be disrupted now.
  returned: always
  type: bool
  sample: false
window:
  description:
    - The window decision - C(open), C(forced), C(window) (the one it is in), C(local_time), C(closes_at),
      C(next_open), C(timezone) and C(reason).
  returned: always
  type: dict
  sample: {open: false, forced: false, window: null, local_time: "2026-12-04T15:03:00+01:00", closes_at: null,
           next_open: "2026-12-04T22:00:00+01:00", timezone: Europe/Berlin,
           reason: "outside the maintenance windows (mon,tue,wed,thu,fri 22:00-04:00, time zone Europe/Berlin)"}
blockers:
  description: Each blocker's answer (C(name), C(blocked), C(reason)); empty when the window was closed.
  returned: always
  type: list
  elements: dict
  sample: [{name: firing alerts, blocked: true, reason: "the Prometheus query returned 1 series: GpuXid"}]
reason:
  description: Why the host may or may not be touched.
  returned: always
  type: str
  sample: "inside the maintenance window mon,tue,wed,thu,fri 22:00-04:00 (closes Thu 04:00 CET); 1 blocker(s) clear"
actions:
  description: Always empty - the module only reads.
  returned: always
  type: list
  elements: dict
  sample: []
"""

from ansible_collections.gpufleet.inference.plugins.module_utils._host.module import ModuleSpec, run_module
from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance.maintenance_gate import execute

ARGUMENT_SPEC = dict(
    windows=dict(type="list", elements="dict", default=[]),
    timezone=dict(type="str"),
    force=dict(type="bool", default=False),
    blockers=dict(type="list", elements="dict", default=[]),
    step=dict(type="str"),
    now=dict(type="float"),
    refuse=dict(type="bool", default=True),
    root=dict(type="path", default="/"),
)


def main():
    run_module(ModuleSpec("maintenance_gate", ARGUMENT_SPEC, "reads the host's time zone and runs its blockers"), execute)


if __name__ == "__main__":
    main()
