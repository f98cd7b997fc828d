# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one apply / read back / roll back loop of the settings that live in a device and are lost at
every reset: PCIe MaxPayload/MaxReadReq (pcie_payload), ACS Control (pcie_acs) and IRQ affinity
(irq_affinity). The modules run it when they change the host, and the boot-time scripts (the
boot unit of pcie_boot, the irq_affinity role's re-apply script) run the same code, shipped to the
host in their bundle (reapply_bundle).

Standard library only and no I/O of its own: the caller gives the writer, the reader and the
comparison. A step is a dict with ``before`` and ``after`` (anything else is the caller's). Each
write is read back; a write whose value does not read back fails, as ``readonly`` when the old value
is still there (the device or the hypervisor ignored it) and ``error`` otherwise. A failed step is
undone too when it left a third value. What happens next is the caller's policy, per failure:

- ``STOP``: undo, newest first, the steps of its group that took, then every other step that took,
  and stop (a module run: all or nothing);
- ``SKIP_GROUP``: undo its group's steps and skip the rest of the group; the other groups go on (the
  boot unit: one PCIe hierarchy that cannot take its values must not leave mixed MaxPayload, and
  must not keep the others from theirs);
- ``IGNORE``: nothing changed and nothing is undone; the step is reported and the run goes on (a
  kernel-managed IRQ, whose affinity writes answer EIO).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

STOP = "stop"
SKIP_GROUP = "skip_group"
IGNORE = "ignore"


def apply_steps(steps: list[dict], write: Callable, read: Callable, holds: Callable,
                group: Callable | None = None, on_failure: Callable | None = None) -> dict[str, list[dict[str, Any]]]:
    """Run ``steps`` in order: write ``after``, read back, and undo by the policy above when one fails.

    - ``write(step, value) -> (rc, stderr, argv)``: rc 0 when the write was accepted; ``argv`` names
      the command (or None for a plain file write);
    - ``read(step) -> (value, error)``: the value now, or None and why it cannot be read;
    - ``holds(step, reads, value) -> bool``: whether what was read is ``value`` (a masked compare for
      register bits, a CPU-list compare for affinities);
    - ``group(step)``: the group a failure rolls back (default: one group, every step);
    - ``on_failure(attempt) -> STOP | SKIP_GROUP | IGNORE`` (default STOP).

    Every attempt is a dict ``{step, value, argv, rc, stderr, reads, error, ok, phase}``, failures with ``kind``
    (``readonly`` or ``error``; ``stderr`` falls back to the read error). Returns ``{done, failures,
    ignored, rolled_back, rollback_failed, journal}``: ``done`` the forward attempts that took and were
    not undone, ``rolled_back``/``rollback_failed`` the undo attempts, ``journal`` every attempt in the
    order made (``phase`` is ``apply`` or ``rollback``).
    """
    group = group or (lambda step: None)
    on_failure = on_failure or (lambda attempt: STOP)
    done: list[dict] = []
    failures: list[dict] = []
    ignored: list[dict] = []
    rolled_back: list[dict] = []
    rollback_failed: list[dict] = []
    journal: list[dict] = []
    skipped: set = set()

    def attempt(step: dict, value, phase: str) -> dict:
        rc, stderr, argv = write(step, value)
        reads, error = read(step)
        made = {"step": step, "value": value, "argv": argv, "rc": rc, "stderr": (stderr or "").strip(), "reads": reads,
                "error": error}
        made["ok"] = rc == 0 and reads is not None and holds(step, reads, value)
        made["phase"] = phase
        journal.append(made)
        return made

    def roll_back(items: list[dict]) -> None:
        for item in reversed(items):
            back = attempt(item["step"], item["step"]["before"], "rollback")
            (rolled_back if back["ok"] else rollback_failed).append(back)
            done[:] = [d for d in done if d is not item]

    for step in steps:
        if group(step) in skipped:
            continue
        made = attempt(step, step["after"], "apply")
        if made["ok"]:
            done.append(made)
            continue
        unchanged = made["reads"] is not None and holds(step, made["reads"], step["before"])
        made["kind"] = "readonly" if made["rc"] == 0 and unchanged else "error"
        made["stderr"] = made["stderr"] or (made["error"] or "")
        policy = on_failure(made)
        if policy == IGNORE:
            ignored.append(made)
            continue
        failures.append(made)
        same = [d for d in done if group(d["step"]) == group(step)]
        if made["reads"] is not None and not unchanged:
            done.append(made)  # it took a third value: undo it too
            same.append(made)
        roll_back(same)
        if policy == SKIP_GROUP:
            skipped.add(group(step))
            continue
        roll_back(list(done))
        break
    return {"done": done, "failures": failures, "ignored": ignored, "rolled_back": rolled_back,
            "rollback_failed": rollback_failed, "journal": journal}


# ---- the record of original values (what state=default restores) ----------------------------------
def empty_originals(fmt: str) -> dict[str, Any]:
    return {"format": fmt, "devices": {}}


def parse_originals(text: str | None, where: str, fmt: str, owner: str, holds: str,
                    error: type[Exception]) -> dict[str, Any]:
    """The JSON record of the original values that ``owner``'s state=default restores (``holds`` names them).

    An absent file (None) is no record. An empty file is an error (a crash or a full disk truncated it),
    never read as "nothing was changed"; so is text that is not JSON or not ``owner``'s record of ``fmt``.
    Every error is raised as ``error`` with the file, what it holds and what to do."""
    if text is None:
        return empty_originals(fmt)
    if not text.strip():
        raise error(f"{where} is empty: it should hold the original {holds} that state=default restores, and an "
                    "empty file means they were lost (a crash or a full disk). Restore it from a backup, or, if the "
                    "values are known to be the firmware's, remove the file and reboot.")
    try:
        data = json.loads(text)
    except ValueError as err:
        raise error(f"{where} is not valid JSON ({err}): it holds the original {holds} that state=default restores. "
                    "Restore it from a backup or fix it by hand; it is not treated as empty.") from None
    if not isinstance(data, dict) or data.get("format") != fmt or not isinstance(data.get("devices"), dict):
        raise error(f"{where} is not a gpufleet.inference.{owner} record (format {fmt}); move it away and run again.")
    return data


def merge_originals(record: dict, writes: list[dict], first_seen: Callable[[dict, dict], None]) -> dict:
    """The record after ``writes`` (a copy): ``first_seen(devices, write)`` adds the write's original value to
    ``devices`` unless one is there already, so the first value ever seen is what a restore puts back."""
    out = copy.deepcopy(record)
    for w in writes:
        first_seen(out["devices"], w)
    return out
