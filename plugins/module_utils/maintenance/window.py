# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Maintenance windows: may a host be disrupted now? Pure: the clock and the time zone are inputs.

A window is days of the week and a start and end time of day, on the host's wall clock (its time zone):
``{"days": ["mon-fri"], "start": "22:00", "end": "04:00"}``. It opens on each listed day at ``start`` and closes at
``end`` the same day, or the next day when ``end`` is not after ``start`` (``22:00``-``04:00`` runs across midnight
and belongs to the day it starts; ``00:00``-``00:00`` is the whole day). Days: ``mon`` ... ``sun``, ranges
(``mon-fri``, ``fri-mon``), ``daily``.

Times are wall-clock times, so on the days the clocks change a window is as long as the wall clock says: a window
across a skipped hour (spring forward) is an hour shorter, one across a repeated hour (fall back) an hour longer; a
start or end inside the skipped hour is the moment the clock jumps over it (02:30 on a day that goes from 02:00 to
03:00 is 03:00), and inside the repeated hour it is the first pass. Instants are compared in UTC, never as wall times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from typing import Any, Sequence

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
TIME_RE = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


class WindowError(ValueError):
    """A window given in a shape no window has: the message names which one and what it should be."""


@dataclass(frozen=True)
class Window:
    """Days (0 = Monday) on which the window opens, and its start and end wall-clock times."""

    days: frozenset
    start: time
    end: time

    def text(self) -> str:
        return f"{_days_text(self.days)} {self.start:%H:%M}-{self.end:%H:%M}"


def _days_text(days: frozenset) -> str:
    if len(days) == 7:
        return "daily"
    return ",".join(DAYS[d] for d in sorted(days))


def _parse_days(value: Any, where: str) -> frozenset:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise WindowError(f"{where}.days must be a list of days (mon ... sun, ranges like mon-fri, or daily), got {value!r}")
    out: set[int] = set()
    for item in items:
        word = str(item).strip().lower()[:20]
        if word in ("daily", "all", "*"):
            out.update(range(7))
            continue
        first, last = (word.split("-", 1) + [""])[:2]
        if first[:3] not in DAYS or (last and last[:3] not in DAYS):
            raise WindowError(f"{where}.days has {item!r}: give mon, tue, wed, thu, fri, sat, sun, a range such as "
                              "mon-fri, or daily")
        a, b = DAYS.index(first[:3]), DAYS.index((last or first)[:3])
        out.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(out)


def _parse_time(value: Any, where: str) -> time:
    m = TIME_RE.match(str(value).strip()) if isinstance(value, str) else None
    if not m:
        raise WindowError(f"{where} must be a time of day HH:MM (00:00 to 23:59), got {value!r}")
    return time(int(m.group(1)), int(m.group(2)))


def parse_windows(raw: Any) -> list[Window]:
    """Windows from their option form (a list of ``{days, start, end}``); WindowError naming the bad one."""
    if not isinstance(raw, (list, tuple)):
        raise WindowError(f"windows must be a list of {{days, start, end}}, got {type(raw).__name__}")
    out = []
    for i, item in enumerate(raw):
        where = f"windows[{i}]"
        if not isinstance(item, dict) or set(item) - {"days", "start", "end"} or not {"start", "end"} <= set(item):
            raise WindowError(f"{where} must be a mapping with days, start and end (days defaults to daily), got {item!r}")
        out.append(Window(_parse_days(item.get("days", "daily"), where), _parse_time(item["start"], f"{where}.start"),
                          _parse_time(item["end"], f"{where}.end")))
    return out


def _at(day: date, when: time, tz: tzinfo) -> datetime:
    """The instant (UTC) of wall-clock ``when`` on ``day`` in ``tz``: a repeated time's first pass (fold 0), and for a
    time the clock skips, the instant of the jump (the first instant whose wall clock is past it)."""
    wall = datetime.combine(day, when)
    first = wall.replace(tzinfo=tz).astimezone(timezone.utc)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # Skipped: fold 1 reads it with the offset after the jump, an instant before the jump; the jump lies between.
    low, high = wall.replace(tzinfo=tz, fold=1).astimezone(timezone.utc), first
    if low > high:
        low, high = high, low
    while (high - low).total_seconds() > 1:
        mid = low + (high - low) / 2
        if mid.astimezone(tz).replace(tzinfo=None) >= wall:
            high = mid
        else:
            low = mid
    return high.replace(microsecond=0)


def occurrence(window: Window, day: date, tz: tzinfo) -> tuple[datetime, datetime]:
    """The (opens, closes) instants in UTC of ``window`` opening on ``day``."""
    end_day = day + timedelta(days=1) if window.end <= window.start else day
    return _at(day, window.start, tz), _at(end_day, window.end, tz)


def decide(now: datetime, tz: tzinfo, windows: Sequence[Window], force: bool = False) -> dict[str, Any]:
    """``{open, forced, window, local_time, closes_at, next_open, reason}`` at instant ``now`` (aware) in zone ``tz``.

    No window at all means always open (no restriction set). ``force`` opens a closed window and says so."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise WindowError("now must be an aware datetime (with its UTC offset)")
    now = now.astimezone(timezone.utc)
    local = now.astimezone(tz)
    out = {"open": True, "forced": False, "window": None, "local_time": local.isoformat(), "closes_at": None,
           "next_open": None}
    if not windows:
        return dict(out, reason="no maintenance window is set: the host may be touched at any time")
    for w in windows:
        for back in (1, 0):  # a window opened yesterday may still run across midnight
            day = local.date() - timedelta(days=back)
            if day.weekday() not in w.days:
                continue
            opens, closes = occurrence(w, day, tz)
            if opens <= now < closes:
                return dict(out, window=w.text(), closes_at=closes.astimezone(tz).isoformat(),
                            reason=f"inside the maintenance window {w.text()} (closes {closes.astimezone(tz):%a %H:%M %Z})")
    upcoming = next_opening(now, tz, windows)
    out.update(open=force, forced=force, next_open=upcoming.astimezone(tz).isoformat() if upcoming else None)
    all_text = "; ".join(w.text() for w in windows)
    head = (f"outside the maintenance windows ({all_text}, time zone {_zone_name(tz)}): it is "
            f"{local:%a %Y-%m-%d %H:%M %Z}")
    nxt = f"; the next window opens {upcoming.astimezone(tz):%a %Y-%m-%d %H:%M %Z}" if upcoming else ""
    out["reason"] = head + nxt + ("; forced" if force else "")
    return out


def next_opening(now: datetime, tz: tzinfo, windows: Sequence[Window]) -> datetime | None:
    """The first instant after ``now`` at which one of ``windows`` opens (within eight days), in UTC."""
    local_day = now.astimezone(tz).date()
    found = [opens for w in windows for i in range(9)
             for opens, closes in [occurrence(w, local_day + timedelta(days=i), tz)]
             if (local_day + timedelta(days=i)).weekday() in w.days and opens > now and closes > opens]
    return min(found) if found else None


def _zone_name(tz: tzinfo) -> str:
    return str(getattr(tz, "key", None) or tz)
