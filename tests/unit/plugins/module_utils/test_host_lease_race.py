# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lease race: two real processes call the real host_lease.execute() on one fake root at the same
moment (a barrier releases both), 200 times per scenario: both take a free lease, both break an expired
one, and the holder renews its expired lease while another run breaks it. Exactly one of each pair may
win, and the lease on disk must name that one. Before the lease was locked (commit 39940dd) two runs were
both told they held the host in most of these pairs."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.lease import host_lease as hl
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host

PAIRS = 200
NOW = time.time()
LEASE = "/var/lib/gpufleet/lease.json"
EXPIRED = {"run_id": "A", "operator": "ops", "play": "tune", "taken_at": NOW - 9000, "expires_at": NOW - 1800}
FORMER = dict(EXPIRED, run_id="Z")


def request(run_id: str, state: str = "acquired", break_expired: bool = False) -> dict:
    return {"path": LEASE, "state": state, "run_id": run_id, "ttl": 600, "operator": "ops", "play": "race",
            "break_expired": break_expired, "holder": None, "take_over": ""}


SCENARIOS = {
    # name: (the lease on the host before the pair, what the first and the second process ask)
    "take_a_free_lease": (None, request("A"), request("B")),
    "both_break_an_expired_lease": (FORMER, request("A", break_expired=True), request("B", state="broken")),
    "renew_against_a_take": (EXPIRED, request("A", state="renewed"), request("B", break_expired=True)),
}


def contender(side: int, roots: list[str], ask: dict, barrier, results) -> None:
    """One process of every pair: wait for the other at the barrier, then take/renew/break the lease."""
    out = []
    for i, root in enumerate(roots):
        barrier.wait(timeout=30)
        if side and i % 4:
            time.sleep((i % 4) * 0.0003)  # spread the second process over the first one's read-decide-write
        try:
            out.append(("won", hl.execute(dict(ask), Host(fs=HostFS(root), cmd=None, warn=None), False)["what"]))
        except hl.LeaseError as err:
            out.append(("refused", str(err)))
        except Exception as err:  # pylint: disable=broad-except  # any other failure is reported by the parent
            out.append(("error", repr(err)))
    results.put((side, out))


def race(tmp_path, before, asks) -> list[tuple]:
    roots = []
    for i in range(PAIRS):
        root = tmp_path / f"pair{i:03d}"
        if before is not None:
            (root / "var/lib/gpufleet").mkdir(parents=True)
            (root / LEASE.lstrip("/")).write_text(json.dumps(before))
        roots.append(str(root))
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=contender, args=(side, roots, ask, barrier, results)) for side, ask in enumerate(asks)]
    for proc in procs:
        proc.start()
    got = dict(results.get(timeout=120) for _proc in procs)
    for proc in procs:
        proc.join(timeout=30)
    return [(root, got[0][i], got[1][i]) for i, root in enumerate(roots)]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_exactly_one_of_two_synchronised_runs_holds_the_lease(scenario, tmp_path):
    before, *asks = SCENARIOS[scenario]
    t0 = time.monotonic()
    pairs = race(tmp_path, before, asks)
    errors = [(first, second) for _root, first, second in pairs if "error" in (first[0], second[0])]
    assert not errors, f"{len(errors)} pairs raised something other than LeaseError, first: {errors[0]}"
    double = single = wrong = unnamed = 0
    for root, first, second in pairs:
        winners = [asks[side]["run_id"] for side, outcome in enumerate((first, second)) if outcome[0] == "won"]
        on_disk = json.loads((tmp_path / root / LEASE.lstrip("/")).read_text())["run_id"]
        double += len(winners) == 2
        single += len(winners) == 1
        wrong += len(winners) == 1 and on_disk != winners[0]
        # the loser is told which run holds the host (a renewal that lost the lease says so)
        unnamed += len(winners) == 1 and f"held by run {winners[0]}" not in (first[1] if first[0] == "refused" else second[1])
    print(f"lease race {scenario}: {PAIRS} synchronised pairs, {double} double grants, {single} single, "
          f"{PAIRS - double - single} with no winner, {wrong} with another run on disk, {time.monotonic() - t0:.1f} s")
    assert (double, wrong) == (0, 0), f"{scenario}: {double} of {PAIRS} pairs both held the lease, {wrong} named another run on disk"
    assert single == PAIRS, f"{scenario}: {PAIRS - single} of {PAIRS} pairs had no winner"
    assert unnamed == 0, f"{scenario}: {unnamed} refusals do not name the run that won"
