# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The executor of maintenance_gate: may this host be disrupted now? Its maintenance windows in its own time zone
(window.py) and its blockers (blockers.py). Read-only; a refusal fails the task before anything changes."""

from __future__ import annotations

import io
import re
import time as clock
from datetime import datetime, timezone, tzinfo
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed, bounded
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import request_text
from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance.blockers import BlockerError, check
from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance.blockers import parse as parse_blockers
from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance.window import WindowError, decide, parse_windows

try:
    from zoneinfo import ZoneInfo
except ImportError:  # Python 3.8 on the host
    ZoneInfo = None

ZONE_RE = re.compile(r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+){0,3}$")
ZONEINFO = "/usr/share/zoneinfo"
UTC_NAMES = ("UTC", "Etc/UTC", "Etc/UCT", "UCT", "Zulu", "Etc/Zulu", "Universal", "Etc/Universal")


def host_zone(host: Host, name: str | None) -> tuple[str, tzinfo]:
    """(name, zone) of ``name`` (an IANA name) or of the host's own zone (the /etc/localtime link, else /etc/timezone,
    else UTC), read from the host's own time zone data under root."""
    fs = host.fs
    if not name:
        link = fs.readlink("/etc/localtime") or ""
        name = link.split("zoneinfo/", 1)[1] if "zoneinfo/" in link else (fs.read_optional("/etc/timezone") or "").strip()
        if not name and fs.exists("/etc/localtime"):
            return "localtime", _zone(fs.read_bytes("/etc/localtime"), "localtime")
        name = name or "UTC"
    if not ZONE_RE.match(name) or ".." in name.split("/"):
        raise Failed(f"timezone={name!r} is no time zone name: give an IANA name such as Europe/Berlin. Nothing was done.",
                     changed=False)
    path = f"{ZONEINFO}/{name}"
    if not fs.exists(path):
        if name in UTC_NAMES:
            return name, timezone.utc
        raise Failed(f"time zone {name} is not in the host's time zone data ({path} under root {fs.root}): install "
                     "tzdata or give timezone. Nothing was done.", changed=False)
    return name, _zone(fs.read_bytes(path), name)


def _zone(data: bytes, name: str) -> tzinfo:
    if ZoneInfo is None:
        raise Failed("maintenance windows need Python 3.9 or later on the host (zoneinfo) for the host's time zone: run "
                     "the module with a newer ansible_python_interpreter. Nothing was done.", changed=False)
    try:
        return ZoneInfo.from_file(io.BytesIO(data), key=name)
    except ValueError as err:
        raise Failed(f"time zone {name} could not be read from the host's time zone data: {err}. Nothing was done.",
                     changed=False) from None


def execute(params: dict, host: Host, check_mode: bool) -> dict[str, Any]:
    """``{allowed, window, blockers, reason}``; Failed with the same keys when the host may not be touched now."""
    try:
        windows = parse_windows(params.get("windows") or [])
        blockers = parse_blockers(params.get("blockers") or [])
    except (WindowError, BlockerError) as err:
        raise Failed(f"{err}. Nothing was done.", changed=False) from None
    now_s = params.get("now")
    now_s = clock.time() if now_s is None else bounded("now", now_s, 0, 253402300799, "seconds since 1970")
    name, zone = host_zone(host, params.get("timezone")) if windows else ("UTC", timezone.utc)
    window = decide(datetime.fromtimestamp(now_s, timezone.utc), zone, windows, bool(params.get("force")))
    window["timezone"] = name
    answers = check(blockers, lambda b: _run(host, b), _fetch) if window["open"] else []
    blocked = [a for a in answers if a["blocked"]]
    allowed = window["open"] and not blocked
    if not window["open"]:
        reason = f"{params.get('step') or 'this step'} refused: {window['reason']}; set force to act anyway"
    elif blocked:
        reason = f"{params.get('step') or 'this step'} refused: " + "; ".join(a["reason"] for a in blocked)
    else:
        reason = window["reason"] + (f"; {len(answers)} blocker(s) clear" if answers else "")
    result = {"changed": False, "actions": [], "allowed": allowed, "window": window, "blockers": answers,
              "reason": reason}
    if not allowed and params.get("refuse", True):
        raise Failed(reason + ". Nothing was changed.", **result)
    return result


def _run(host: Host, blocker: dict[str, Any]) -> tuple[int, str, str]:
    timeout_bin = host.cmd.find("timeout", required=True, hint="install coreutils")
    return host.cmd.run(host.cmd.argv([timeout_bin, str(int(blocker["timeout"]))] + blocker["command"]))


def _fetch(blocker: dict[str, Any]) -> tuple[int, str, str | None]:
    return request_text("GET", blocker["url"], None, {"Accept": "application/json"}, float(blocker["timeout"]))
