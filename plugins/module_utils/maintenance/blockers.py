# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Blockers: checks that stop a host from being touched, as kured's Prometheus alert blockers do.

A blocker is a command (``{"command": [argv...]}``: the host may be touched when it exits 0) or a URL
(``{"url": "http://..."}``: the host may be touched when it answers 2xx, and, when the answer is a Prometheus query
result, when that result is empty - ``/api/v1/query?query=ALERTS{alertstate="firing"}`` names the firing alerts).
Anything else blocks: another exit status, a timeout, an error status, no answer, a Prometheus answer that is not a
success. parse() validates, judge_command() and judge_url() are pure; check() runs them through the I/O it is given.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

TIMEOUT_DEFAULT = 30
TIMEOUT_MAX = 600
TIMED_OUT_RC = 124  # coreutils timeout(1)
TAIL = 300


class BlockerError(ValueError):
    """A blocker given in a shape no blocker has: the message names which one and what it should be."""


def parse(raw: Any) -> list[dict[str, Any]]:
    """Blockers in their option form, validated: ``{name, command | url, timeout}`` each."""
    if not isinstance(raw, (list, tuple)):
        raise BlockerError(f"blockers must be a list of {{command: [argv]}} or {{url: URL}}, got {type(raw).__name__}")
    out = []
    for i, item in enumerate(raw):
        where = f"blockers[{i}]"
        shape = isinstance(item, dict) and len({"command", "url"} & set(item)) == 1 \
            and not set(item) - {"name", "command", "url", "timeout"}
        if not shape:
            raise BlockerError(f"{where} must have exactly one of command (an argv list) or url, and optionally name "
                               f"and timeout, got {item!r}")
        timeout = item.get("timeout", TIMEOUT_DEFAULT)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 1 <= timeout <= TIMEOUT_MAX:
            raise BlockerError(f"{where}.timeout={timeout!r} is out of range: give seconds from 1 to {TIMEOUT_MAX}")
        if "command" in item:
            argv = item["command"]
            if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) and a for a in argv):
                raise BlockerError(f"{where}.command must be an argv list of non-empty strings (no shell), got {argv!r}")
            out.append({"name": str(item.get("name") or argv[0]), "command": list(argv), "timeout": timeout})
        else:
            url = item["url"]
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
                raise BlockerError(f"{where}.url must be an http or https URL, got {url!r}")
            out.append({"name": str(item.get("name") or parts.hostname), "url": url, "timeout": timeout})
    return out


def _tail(text: str) -> str:
    text = (text or "").strip()
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def judge_command(blocker: dict[str, Any], rc: int, out: str, err: str) -> dict[str, Any]:
    """A command blocker's answer: clear on exit 0; blocked otherwise, saying how (a timeout is rc 124)."""
    head = f"blocker {blocker['name']} ({' '.join(blocker['command'])})"
    if rc == 0:
        return {"name": blocker["name"], "blocked": False, "reason": f"{head} exited 0"}
    if rc == TIMED_OUT_RC:
        why = f"{head} did not answer in {blocker['timeout']} s"
    else:
        why = f"{head} exited {rc}" + (f": {_tail(err or out)}" if (err or out).strip() else "")
    return {"name": blocker["name"], "blocked": True, "reason": why}


def judge_url(blocker: dict[str, Any], status: int, body: str, error: str | None) -> dict[str, Any]:
    """A URL blocker's answer: clear on 2xx (and an empty result for a Prometheus query); blocked otherwise."""
    head = f"blocker {blocker['name']} ({blocker['url']})"
    result = {"name": blocker["name"], "blocked": True}
    if status < 0:
        return dict(result, reason=f"{head} did not answer: {error}")
    if not 200 <= status < 300:
        return dict(result, reason=f"{head} answered HTTP {status}: {_tail(body) or error}")
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    prometheus = isinstance(doc, dict) and "status" in doc and (
        "errorType" in doc or (isinstance(doc.get("data"), dict) and "result" in doc["data"]))
    if not prometheus:
        return {"name": blocker["name"], "blocked": False, "reason": f"{head} answered HTTP {status}"}
    if doc["status"] != "success" or not isinstance(doc.get("data"), dict):
        return dict(result, reason=f"{head}: the Prometheus query failed: {doc.get('error') or doc['status']}")
    series = doc["data"]["result"]
    if not series:
        return {"name": blocker["name"], "blocked": False, "reason": f"{head}: the Prometheus query is empty"}
    names = sorted({(s.get("metric") or {}).get("alertname") or json.dumps(s.get("metric") or {}, sort_keys=True)
                    for s in series if isinstance(s, dict)})
    return dict(result, reason=f"{head}: the Prometheus query returned {len(series)} series: {', '.join(names[:10])}")


def check(blockers: Sequence[dict[str, Any]], run: Callable[[dict[str, Any]], tuple[int, str, str]],
          fetch: Callable[[dict[str, Any]], tuple[int, str, str | None]]) -> list[dict[str, Any]]:
    """Every blocker's answer, in order: ``run(blocker)`` -> (rc, out, err) for commands, ``fetch(blocker)`` ->
    (status, body, error) for URLs (status -1 for no answer)."""
    out = []
    for b in blockers:
        out.append(judge_command(b, *run(b)) if "command" in b else judge_url(b, *fetch(b)))
    return out
