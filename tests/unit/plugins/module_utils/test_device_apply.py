# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""device_apply.apply_steps, the one apply / read back / roll back loop, on a simulated device: registers
that take a value, ignore it (read-only), take another one, refuse the write, or refuse the undo."""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils._host.device_apply import IGNORE, SKIP_GROUP, STOP, apply_steps


class Device:
    """Registers by name; ``readonly`` ignore writes, ``odd`` take ``value + 1``, ``refuse`` answer rc 1,
    ``stuck_undo`` refuse every write after the first."""

    def __init__(self, values, readonly=(), odd=(), refuse=(), stuck_undo=(), unreadable=()):
        self.values = dict(values)
        self.readonly, self.odd, self.refuse, self.stuck_undo, self.unreadable = (
            set(readonly), set(odd), set(refuse), set(stuck_undo), set(unreadable))
        self.writes = []
        self.written = set()

    def write(self, step, value):
        name = step["name"]
        self.writes.append((name, value))
        argv = ["setreg", name, str(value)]
        if name in self.refuse or (name in self.stuck_undo and name in self.written):
            return 1, " refused \n", argv
        self.written.add(name)
        if name not in self.readonly:
            self.values[name] = value + 1 if name in self.odd else value
        return 0, "", argv

    def read(self, step):
        if step["name"] in self.unreadable:
            return None, f"cannot read {step['name']}"
        return self.values[step["name"]], None


def steps(*names, group=None):
    return [{"name": n, "before": 0, "after": 10, "group": (group or {}).get(n)} for n in names]


def run(dev, todo, **kw):
    return apply_steps(todo, dev.write, dev.read, lambda step, reads, value: reads == value, **kw)


def test_every_step_written_and_read_back():
    dev = Device({"a": 0, "b": 0})
    out = run(dev, steps("a", "b"))
    assert [a["step"]["name"] for a in out["done"]] == ["a", "b"] and dev.values == {"a": 10, "b": 10}
    assert (out["failures"], out["rolled_back"], out["rollback_failed"], out["ignored"]) == ([], [], [], [])
    assert [(a["phase"], a["ok"], a["argv"]) for a in out["journal"]] == [
        ("apply", True, ["setreg", "a", "10"]), ("apply", True, ["setreg", "b", "10"])]


def test_stop_undoes_everything_newest_first_and_classifies_readonly():
    dev = Device({"a": 0, "b": 0, "c": 0, "d": 0}, readonly={"c"})
    out = run(dev, steps("a", "b", "c", "d"))
    assert [(f["step"]["name"], f["kind"], f["reads"]) for f in out["failures"]] == [("c", "readonly", 0)]
    assert [a["step"]["name"] for a in out["rolled_back"]] == ["b", "a"] and out["done"] == []
    assert dev.values == {"a": 0, "b": 0, "c": 0, "d": 0} and ("d", 10) not in dev.writes


def test_skip_group_keeps_the_other_groups_going():
    group = {"a": "h1", "b": "h1", "c": "h2", "d": "h1"}
    dev = Device({n: 0 for n in group}, readonly={"b"})
    out = run(dev, steps("a", "b", "c", "d", group=group), group=lambda s: s["group"], on_failure=lambda a: SKIP_GROUP)
    assert [a["step"]["name"] for a in out["rolled_back"]] == ["a"]  # only its own group is undone
    assert [a["step"]["name"] for a in out["done"]] == ["c"]
    assert dev.values == {"a": 0, "b": 0, "c": 10, "d": 0} and ("d", 10) not in dev.writes  # the rest of h1 is skipped


def test_a_third_value_is_an_error_and_is_undone_too():
    dev = Device({"a": 0, "b": 0}, odd={"b"})
    out = run(dev, steps("a", "b"))
    assert [(f["step"]["name"], f["kind"], f["reads"]) for f in out["failures"]] == [("b", "error", 11)]
    # b is undone first (newest first); it reads 1 after its undo (the device adds one), so that undo failed, and says so
    assert [(a["phase"], a["step"]["name"]) for a in out["journal"]] == [
        ("apply", "a"), ("apply", "b"), ("rollback", "b"), ("rollback", "a")]
    assert [a["step"]["name"] for a in out["rolled_back"]] == ["a"]
    assert [(a["step"]["name"], a["reads"]) for a in out["rollback_failed"]] == [("b", 1)]
    assert dev.values == {"a": 0, "b": 1} and out["done"] == []


def test_a_refused_write_carries_its_stderr_and_an_unreadable_one_the_read_error():
    dev = Device({"a": 0, "b": 0}, refuse={"a"})
    out = run(dev, steps("a", "b"))
    assert [(f["rc"], f["stderr"], f["kind"]) for f in out["failures"]] == [(1, "refused", "error")]
    dev = Device({"a": 0}, unreadable={"a"})
    out = run(dev, steps("a"))
    assert [(f["reads"], f["stderr"], f["kind"]) for f in out["failures"]] == [(None, "cannot read a", "error")]


def test_an_undo_that_fails_is_reported_not_hidden():
    dev = Device({"a": 0, "b": 0}, readonly={"b"}, stuck_undo={"a"})
    out = run(dev, steps("a", "b"))
    assert out["rolled_back"] == [] and [(a["step"]["name"], a["reads"]) for a in out["rollback_failed"]] == [("a", 10)]
    assert [a["phase"] for a in out["journal"]] == ["apply", "apply", "rollback"]


def test_ignore_goes_on_without_undoing():
    dev = Device({"a": 0, "b": 0, "c": 0}, refuse={"b"})
    out = run(dev, steps("a", "b", "c"), on_failure=lambda a: IGNORE if a["rc"] == 1 else STOP)
    assert [a["step"]["name"] for a in out["ignored"]] == ["b"] and out["failures"] == []
    assert [a["step"]["name"] for a in out["done"]] == ["a", "c"] and out["rolled_back"] == []
