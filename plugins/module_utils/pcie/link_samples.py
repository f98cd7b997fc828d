# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCIe links read under load: the pure classification of a link's sampled states (``classify_link_samples``), and
``LinkMonitor``, which samples the links of GPUs and of the bridges above them (sysfs ``current_link_speed`` and
``current_link_width``, through the HostFS seam) while a benchmark run is in flight and judges them when it stops:
a link that changed speed or width during the run is flapping. NVIDIA GPUs drop their link speed when idle, so a
link that only trains up as the load starts is no finding.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import threading
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def classify_link_samples(samples: list, cap: dict) -> dict[str, Any]:
    """Judge a link's state sampled in time order under load, ``samples`` as ``[speed_gts, width]`` pairs, against
    ``cap`` (``{speed_gts, width}``, what both ends can do). Returns ``{state, top, changes}``:

    - ``flapping``: the width changed, or the speed dropped after the link had trained up to its highest reading
      (a marginal slot, riser or cable retraining under load);
    - ``at_capability``: it reached ``cap`` (an idle link that trains up as the load starts counts here);
    - ``stays_down``: it never reached ``cap`` under load;
    - ``no_samples``: nothing to judge.
    ``top`` is the highest reading, ``changes`` the number of readings that differ from the one before.
    """
    pairs = [(float(s[0]), int(s[1])) for s in samples or [] if s and s[0] and s[1]]
    if not pairs:
        return {"state": "no_samples", "top": None, "changes": 0}
    top = max(pairs)
    changes = sum(1 for a, b in zip(pairs, pairs[1:]) if a != b)
    reached = pairs.index(top)
    dropped = any(speed < top[0] for speed, _w in pairs[reached:])
    if len({w for _s, w in pairs}) > 1 or dropped:
        state = "flapping"
    elif top[0] >= (cap.get("speed_gts") or 0) and top[1] >= (cap.get("width") or 0):
        state = "at_capability"
    else:
        state = "stays_down"
    return {"state": state, "top": list(top), "changes": changes}


def parse_speed(text: str | None) -> float | None:
    """``32.0 GT/s PCIe`` -> 32.0; None for ``Unknown`` or nothing."""
    try:
        return float((text or "").split()[0])
    except (IndexError, ValueError):
        return None


def read_link(fs: HostFS, bdf: str, kind: str = "current") -> list | None:
    """``[speed GT/s, width]`` of a function's link from sysfs (``kind`` current or max); None when unreadable."""
    base = f"/sys/bus/pci/devices/{bdf}"
    speed = parse_speed(fs.read_optional(f"{base}/{kind}_link_speed"))
    width = (fs.read_optional(f"{base}/{kind}_link_width") or "").strip()
    return [speed, int(width)] if speed and width.isdigit() and int(width) else None


def path_devices(fs: HostFS, gpus: list[str]) -> list[str]:
    """The GPUs and every PCI function above them (bridges and ports), from the sysfs device path, top first."""
    out: list[str] = []
    for gpu in gpus:
        hops = [p for p in fs.realpath(f"/sys/bus/pci/devices/{gpu}").split("/") if _BDF.match(p)]
        out += [h for h in hops if h not in out]
    return out


def link_caps(fs: HostFS, devices: list[str]) -> dict[str, dict]:
    """What each device's link can do: the smaller of its own and its parent's maximum (both ends of the link)."""
    caps = {}
    for bdf in devices:
        own = read_link(fs, bdf, "max")
        parent = posixpath.basename(posixpath.dirname(fs.realpath(f"/sys/bus/pci/devices/{bdf}")))
        up = read_link(fs, parent, "max") if _BDF.match(parent) else None
        if own:
            caps[bdf] = {"speed_gts": min(own[0], up[0]) if up else own[0], "width": min(own[1], up[1]) if up else own[1]}
    return caps


def judge_links(samples: dict[str, list], caps: dict[str, dict]) -> dict[str, Any]:
    """Every device's verdict over one run: ``{devices: {bdf: {state, top, changes, cap}}, flapping: [bdf],
    stays_down: [bdf]}`` (``cap``: what both ends of the link can do, None when unreadable)."""
    verdicts = {bdf: dict(classify_link_samples(seq, caps.get(bdf) or {}), cap=caps.get(bdf)) for bdf, seq in samples.items()}
    return {"devices": verdicts, "flapping": sorted(b for b, v in verdicts.items() if v["state"] == "flapping"),
            "stays_down": sorted(b for b, v in verdicts.items() if v["state"] == "stays_down")}


class LinkMonitor:
    """Samples the links of ``devices`` every ``interval`` seconds while a run is in flight (start(), then stop());
    the interface of load_monitor.InFlightMonitor, so that a benchmark can hold both."""

    def __init__(self, fs: HostFS, devices: list[str], interval: float = 0.5):
        self.fs = fs
        self.devices = list(devices)
        self.interval = interval
        self.caps = link_caps(fs, self.devices)
        self.samples: dict[str, list] = {b: [] for b in self.devices}
        self._task: asyncio.Task | None = None
        self._lock = threading.Lock()

    def sample(self) -> None:
        """One reading of every device, appended whole (a sample cancelled by stop() may still be running in its
        thread when stop() takes the last one)."""
        states = {bdf: read_link(self.fs, bdf) for bdf in self.devices}
        with self._lock:
            for bdf, state in states.items():
                if state:
                    self.samples[bdf].append(state)

    async def _sample_off_loop(self) -> None:
        """One sample in a worker thread: the reads (about 0.6 ms for the 24 links of 8 GPUs behind switches, in the
        lab) would otherwise hold up the benchmark client's event loop and its token timestamps."""
        await asyncio.get_event_loop().run_in_executor(None, self.sample)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._sample_off_loop()

    async def start(self) -> None:
        """Takes the first sample (the run's start), then one every ``interval`` until stop()."""
        self.samples = {b: [] for b in self.devices}
        await self._sample_off_loop()
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self, _concurrency: int | None = None) -> dict[str, Any]:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self._sample_off_loop()  # the last moment of the run too
        return judge_links(self.samples, self.caps)

    def close(self) -> None:
        """Nothing is held open: sysfs is read per sample."""


class WithLinks:
    """A benchmark's per-run monitor (the InFlightMonitor interface) that also samples the links: its verdict is the
    server-load verdict (when ``load`` is given) with the links' under ``links``."""

    def __init__(self, load, links: LinkMonitor):
        self.load = load
        self.links = links

    async def start(self) -> None:
        if self.load is not None:
            await self.load.start()
        await self.links.start()

    async def stop(self, concurrency: int) -> dict[str, Any]:
        verdict = dict(await self.load.stop(concurrency)) if self.load is not None else {}
        verdict["links"] = await self.links.stop(concurrency)
        return verdict

    def close(self) -> None:
        if self.load is not None:
            self.load.close()
        self.links.close()


def flapping_runs(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured runs during which a link changed speed or width, each with its tokens/s:
    ``[{concurrency, repetition, devices, output_throughput}]``."""
    out = []
    for level in levels:
        for rep, run in enumerate(level.get("runs") or []):
            flapping = (((run.get("server_load") or {}).get("links")) or {}).get("flapping")
            if flapping:
                out.append({"concurrency": level["concurrency"], "repetition": run.get("repetition", rep),
                            "devices": flapping, "output_throughput": run.get("output_throughput")})
    return out
