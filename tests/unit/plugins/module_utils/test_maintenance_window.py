# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Maintenance windows (maintenance/window.py): inside, outside, across midnight, on the days the clocks change, forced.

The clock and the zone are inputs: each case names an instant in UTC and a real IANA zone (the system's tzdata)."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.maintenance.window import (
    WindowError, decide, next_opening, occurrence, parse_windows,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
NIGHTS = parse_windows([{"days": ["mon-fri"], "start": "22:00", "end": "04:00"}])


def utc(text):
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


@pytest.mark.parametrize("instant, is_open", [
    ("2026-12-02T20:59:00", False),   # Wed 21:59 CET
    ("2026-12-02T21:00:00", True),    # Wed 22:00 CET: opens
    ("2026-12-03T02:59:00", True),    # Thu 03:59: Wednesday's window, across midnight
    ("2026-12-03T03:00:00", False),   # Thu 04:00: closed (the end is not inside)
    ("2026-12-05T01:00:00", True),    # Sat 02:00: Friday's window, across midnight into a day not listed
    ("2026-12-05T22:30:00", False),   # Sat 23:30: Saturday is not listed
])
def test_inside_outside_and_across_midnight(instant, is_open):
    assert decide(utc(instant), BERLIN, NIGHTS)["open"] is is_open


def test_outside_says_when_the_next_window_opens_and_force_opens_it():
    got = decide(utc("2026-12-04T14:03:00"), BERLIN, NIGHTS)
    assert (got["open"], got["forced"]) == (False, False)
    assert got["next_open"] == "2026-12-04T22:00:00+01:00"
    assert got["reason"] == ("outside the maintenance windows (mon,tue,wed,thu,fri 22:00-04:00, time zone Europe/Berlin): "
                             "it is Fri 2026-12-04 15:03 CET; the next window opens Fri 2026-12-04 22:00 CET")
    weekend = decide(utc("2026-12-05T12:00:00"), BERLIN, NIGHTS)
    assert weekend["next_open"] == "2026-12-07T22:00:00+01:00"
    forced = decide(utc("2026-12-04T14:03:00"), BERLIN, NIGHTS, force=True)
    assert (forced["open"], forced["forced"]) == (True, True) and forced["reason"].endswith("; forced")


def test_inside_names_the_window_and_when_it_closes():
    got = decide(utc("2026-12-02T23:00:00"), BERLIN, NIGHTS)
    assert got["window"] == "mon,tue,wed,thu,fri 22:00-04:00" and got["closes_at"] == "2026-12-03T04:00:00+01:00"
    assert got["reason"] == "inside the maintenance window mon,tue,wed,thu,fri 22:00-04:00 (closes Thu 04:00 CET)"


def test_no_window_is_always_open():
    assert decide(utc("2026-12-04T14:03:00"), BERLIN, [])["open"] is True


def test_the_same_window_in_another_zone_is_another_instant():
    assert decide(utc("2026-12-03T03:30:00"), NEW_YORK, NIGHTS)["open"] is True    # Wed 22:30 EST
    assert decide(utc("2026-12-03T03:30:00"), BERLIN, NIGHTS)["open"] is False     # Thu 04:30 CET


# Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST (spring forward); 2026-10-25 03:00 CEST -> 02:00 CET (fall back).
def test_dst_spring_forward_a_window_across_the_jump_is_an_hour_shorter():
    w = parse_windows([{"days": ["sun"], "start": "01:00", "end": "05:00"}])[0]
    opens, closes = occurrence(w, datetime(2026, 3, 29).date(), BERLIN)
    assert (opens.isoformat(), closes.isoformat()) == ("2026-03-29T00:00:00+00:00", "2026-03-29T03:00:00+00:00")
    assert (closes - opens).total_seconds() == 3 * 3600


def test_dst_spring_forward_a_start_in_the_skipped_hour_is_the_jump():
    w = parse_windows([{"days": ["sun"], "start": "02:30", "end": "04:00"}])
    assert decide(utc("2026-03-29T00:59:00"), BERLIN, w)["open"] is False   # 01:59 CET
    assert decide(utc("2026-03-29T01:00:00"), BERLIN, w)["open"] is True    # 03:00 CEST, 02:30 never happened
    assert decide(utc("2026-03-29T01:59:00"), BERLIN, w)["open"] is True    # 03:59 CEST
    assert decide(utc("2026-03-29T02:00:00"), BERLIN, w)["open"] is False   # 04:00 CEST
    empty = parse_windows([{"days": ["sun"], "start": "02:00", "end": "02:59"}])   # wholly inside the skipped hour
    assert not any(decide(utc(f"2026-03-29T0{h}:{m:02d}:00"), BERLIN, empty)["open"] for h in (0, 1, 2) for m in (0, 30))


def test_dst_fall_back_a_window_across_the_repeated_hour_is_an_hour_longer():
    w = parse_windows([{"days": ["sun"], "start": "01:00", "end": "04:00"}])
    opens, closes = occurrence(w[0], datetime(2026, 10, 25).date(), BERLIN)
    assert (closes - opens).total_seconds() == 4 * 3600
    # both passes of 02:30 are inside
    assert decide(utc("2026-10-25T00:30:00"), BERLIN, w)["open"] is True   # 02:30 CEST
    assert decide(utc("2026-10-25T01:30:00"), BERLIN, w)["open"] is True   # 02:30 CET
    # a window ending at 02:30 ends at the first pass
    first = parse_windows([{"days": ["sun"], "start": "01:00", "end": "02:30"}])
    assert decide(utc("2026-10-25T00:29:00"), BERLIN, first)["open"] is True
    assert decide(utc("2026-10-25T01:00:00"), BERLIN, first)["open"] is False   # 02:00 CET, the second pass


def test_dst_new_york_a_night_window_keeps_its_wall_clock_hours():
    w = parse_windows([{"days": ["daily"], "start": "23:00", "end": "05:00"}])
    # 2026-03-08 02:00 EST -> 03:00 EDT: Saturday's night window is 5 real hours, Sunday's 6
    sat = occurrence(w[0], datetime(2026, 3, 7).date(), NEW_YORK)
    sun = occurrence(w[0], datetime(2026, 3, 8).date(), NEW_YORK)
    assert ((sat[1] - sat[0]).total_seconds(), (sun[1] - sun[0]).total_seconds()) == (5 * 3600, 6 * 3600)
    assert decide(utc("2026-03-08T09:30:00"), NEW_YORK, w)["open"] is False    # 05:30 EDT
    assert decide(utc("2026-03-08T08:30:00"), NEW_YORK, w)["open"] is True     # 04:30 EDT


def test_next_opening_skips_an_empty_occurrence():
    empty = parse_windows([{"days": ["sun"], "start": "02:00", "end": "02:59"}])
    assert next_opening(utc("2026-03-28T12:00:00"), BERLIN, empty).isoformat() == "2026-04-05T00:00:00+00:00"


@pytest.mark.parametrize("days, expected", [
    (["mon-fri"], {0, 1, 2, 3, 4}), (["fri-mon"], {4, 5, 6, 0}), ("daily", set(range(7))), (["sat", "Sunday"], {5, 6}),
])
def test_days(days, expected):
    assert set(parse_windows([{"days": days, "start": "00:00", "end": "00:00"}])[0].days) == expected


def test_whole_day_window():
    w = parse_windows([{"days": ["wed"], "start": "00:00", "end": "00:00"}])
    assert decide(utc("2026-12-02T22:59:00"), BERLIN, w)["open"] is True    # Wed 23:59
    assert decide(utc("2026-12-02T23:00:00"), BERLIN, w)["open"] is False   # Thu 00:00


@pytest.mark.parametrize("raw, message", [
    ({"days": ["mon"]}, "windows must be a list"),
    ([{"days": ["mon"], "start": "22:00"}], r"windows\[0\] must be a mapping with days, start and end"),
    ([{"days": ["mon"], "start": "24:00", "end": "01:00"}], r"windows\[0\].start must be a time of day HH:MM"),
    ([{"days": ["someday"], "start": "22:00", "end": "01:00"}], r"windows\[0\].days has 'someday'"),
    ([{"days": [], "start": "22:00", "end": "01:00"}], r"windows\[0\].days must be a list of days"),
    ([{"days": ["mon"], "start": "22:00", "end": "01:00", "tz": "UTC"}], r"windows\[0\] must be a mapping"),
])
def test_bad_windows_are_refused_with_what_to_give(raw, message):
    with pytest.raises(WindowError, match=message):
        parse_windows(raw)


def test_a_naive_now_is_refused():
    with pytest.raises(WindowError, match="aware"):
        decide(datetime(2026, 12, 4, 12, 0), BERLIN, NIGHTS)
