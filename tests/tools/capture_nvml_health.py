#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record what gpu_health's NVML reader (plugins/module_utils/gpu/readings.py) asks a real host's NVML, as a fixture.

Run it from a checkout on a GPU host (nvidia-ml-py installed; READ-ONLY: it makes exactly the Get calls of the
reader, through a proxy that records each call's arguments and answer or error):

  python tests/tools/capture_nvml_health.py --name h200 > tests/unit/plugins/module_utils/fixtures/nvml_health/h200.json

The output: ``{"meta": {...}, "gpus": [{"bus": BUSID, "name": NAME, "calls": {CALL: VALUE | {"ARG,ARG": VALUE} |
{"error": TEXT}}}]}``, the format tests/unit/fakenvml.py's FakeNVML replays (its ``calls``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, ".collections"))

from ansible_collections.gpufleet.inference.plugins.module_utils.gpu.readings import read  # noqa: E402


def plain(value):
    """NVML's answers as JSON: bytes as text, ctypes structs as their fields, tuples and lists as lists."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "_fields_"):
        return {field[0]: plain(getattr(value, field[0])) for field in value._fields_}
    return value


class Recorder:
    """Forwards every call to the real library and records, per GPU handle, what a health read asked and got."""

    def __init__(self, lib):
        self.lib = lib
        self.handles = {}   # id(handle) -> {"bus", "name", "calls"}

    def __getattr__(self, name):
        real = getattr(self.lib, name)
        if not name.startswith("nvmlDevice") or name in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"):
            return real

        def call(handle, *args):
            gpu = self.handles.setdefault(id(handle), {"calls": {}})
            try:
                value = real(handle, *args)
                answer = plain(value)
            except Exception as err:  # pylint: disable=broad-except  # NVMLError: recorded, then raised as the reader expects
                answer, value = {"error": str(err)}, err
            if name == "nvmlDeviceGetPciInfo":
                gpu["bus"] = plain(value.busId)
            elif args:
                gpu["calls"].setdefault(name, {})[",".join(str(a) for a in args)] = answer
            else:
                gpu["calls"][name] = answer
            if isinstance(value, Exception):
                raise value
            return value
        return call


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="what the capture is (h200, a100-vm, ...)")
    args = parser.parse_args(argv)
    import pynvml  # pylint: disable=import-outside-toplevel
    pynvml.nvmlInit()
    try:
        rec = Recorder(pynvml)
        read(rec)
        driver = plain(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()
    gpus = []
    for gpu in rec.handles.values():
        name = gpu["calls"].pop("nvmlDeviceGetName", None)
        gpus.append({"bus": gpu.get("bus"), "name": name, "calls": gpu["calls"]})
    json.dump({"meta": {"name": args.name, "driver_version": driver, "captured": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                               time.gmtime())},
               "gpus": gpus}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
