# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.metrics_textfile executes (``execute()``): turn one result of the collection (an audit, a
health check, a benchmark, a verdict, a tuning state or the tuning roles' changes) into samples (metrics/samples.py),
render them (metrics/textfile.py) and write ``DIRECTORY/NAME.prom`` for node_exporter's textfile collector through the
host's files (_host/files.py ``write_atomic``: a temp file in the same directory, fsync, rename, fsync of the directory,
so that the collector reads the old file or the new one, never a part; its name starts with a dot and does not end in
``.prom``, so the collector never reads it). Written only when the text changes; read back after.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils.metrics import samples as ms
from ansible_collections.gpufleet.inference.plugins.module_utils.metrics.textfile import SOURCES, Sample, render

DEFAULT_DIR = "/var/lib/prometheus/node-exporter"  # Debian's prometheus-node-exporter --collector.textfile.directory
NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,99}$")
# Per source: the type its result has, the key under which a registered module result holds it (None: given as is),
# and its samples (metrics/samples.py) from the result, the host's name and the module's options.
CONVERTERS: dict[str, tuple[type, str | None, Callable[[Any, str, dict], list[Sample | None]]]] = {
    "audit": (dict, "pcie", lambda data, host, p: ms.audit_samples(data, host, p.get("timestamp"))),
    "health": (list, None, lambda data, host, p: ms.health_samples(data, host, p.get("timestamp"))),
    "benchmark": (dict, "benchmark", lambda data, host, p: ms.benchmark_samples(
        data, host, p.get("profile") or data.get("label") or "default")),
    "verdict": (dict, None, lambda data, host, p: ms.verdict_samples(
        data, host, p.get("stage") or "default", p.get("change") or "none")),
    "tuning": (dict, "state", lambda data, host, p: ms.tuning_samples(data, host)),
    "changes": (list, None, lambda data, host, p: ms.change_samples(data, host)),
}


class MetricsError(Exception):
    """A result that cannot be turned into metrics, or a file name no collector would read."""


def source_of(params: dict) -> tuple[str, Any]:
    """The one result given (AnsibleModule's required_one_of and mutually_exclusive have made sure there is one)."""
    given = [s for s in SOURCES if params.get(s) is not None]
    if len(given) != 1:
        raise MetricsError(f"give exactly one of {', '.join(SOURCES)} (got {', '.join(given) or 'none'})")
    source = given[0]
    kind = CONVERTERS[source][0]
    if not isinstance(params[source], kind):
        raise MetricsError(f"{source} must be a {kind.__name__} (the registered result of the task that made "
                           f"it), not a {type(params[source]).__name__}")
    return source, params[source]


def build(source: str, data: Any, params: dict) -> list[Sample | None]:
    """The samples of ``data``, the result given for ``source`` (a registered module result is unwrapped)."""
    _kind, key, convert = CONVERTERS[source]
    if key and isinstance(data.get(key), dict):
        data = data[key]
    return convert(data, params.get("host") or os.uname().nodename, params)


def execute(params: dict, host: Host, check_mode: bool) -> dict[str, Any]:
    """Render the given result's metrics and (outside check mode) write them when they changed; the result says
    which file, how many series and which metrics."""
    source, data = source_of(params)
    name = params.get("name") or f"gpufleet_{source}"
    if not NAME_RE.match(name) or name.endswith(".prom"):
        raise MetricsError(f"name={name!r} is refused: the file is NAME.prom, so give letters, digits, '_', '.' or '-' "
                           "(at most 100, not starting with '.' or ending in .prom)")
    try:
        found = [s for s in build(source, data, params) if s is not None]
        text = render(found)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise MetricsError(f"the {source} given cannot be written as metrics: {err}. Give the registered result of "
                           "the task that made it (docs/fleet_operations.md lists what each option takes)") from None
    path = os.path.join(params.get("directory") or DEFAULT_DIR, name + ".prom")
    before = host.fs.read_optional(path)
    actions = []
    if before is None or before != text.rstrip("\n"):
        actions.append({"action": "write", "path": path, "source": source, "series": len(found)})
    if actions and not check_mode:
        host.fs.write_atomic(path, text, mode=0o644)
        if host.fs.read_optional(path) != text.rstrip("\n"):
            raise MetricsError(f"{path} does not hold the metrics just written: is another writer using that name?")
    return {"changed": bool(actions), "actions": actions, "path": path, "source": source, "series": len(found),
            "metrics": sorted({s.name for s in found}), "diff": {"before": before or "", "after": text,
                                                                 "before_header": path, "after_header": path}}
