# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""FakeNVML: a stand-in for the pynvml LIBRARY ONLY (no test machine has an NVIDIA GPU).

It answers the calls nvml.collect() and gpu/readings.py make, with the value conventions of nvidia-ml-py (busId
with an 8-digit domain, topology levels 0-50, P2P status codes), either from values a test gives or
from the readings of a real host (from_readings). Everything else in the tests is real code.
"""

from __future__ import annotations


class FakeNVML:
    """FAKE pynvml (library stand-in, see the module docstring)."""

    class NVMLError(Exception):
        pass

    class _Pci:
        def __init__(self, bus_id):
            self.busId = bus_id

    def __init__(self, gpus, levels=None, p2p=None, nvlinks=None, unsupported=(), init_error=None, remote_types=None,
                 driver_version="580.159.04"):
        self.gpus = gpus                      # [{"bus": "00000000:03:00.0", "name": ..., fields...}]
        self.levels = levels or {}            # {(i, j): level}
        self.p2p = p2p or {}                  # {(i, j, cap): status}
        self.nvlinks = nvlinks or {}          # {i: [peer bus ids per active link]}
        self.remote_types = remote_types      # {i: [remote device type per active link]}; None: not answered
        self.unsupported = set(unsupported)   # call names that raise NotSupported
        self.init_error = init_error
        self.driver_version = driver_version  # nvmlSystemGetDriverVersion's answer
        self.shutdown = False

    def _check(self, name):
        if name in self.unsupported:
            raise self.NVMLError("Not Supported")

    def nvmlInit(self):
        if self.init_error:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self):
        return self.driver_version

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetPciInfo(self, h):
        return self._Pci(self.gpus[h]["bus"].encode())

    def __getattr__(self, name):
        field = {"nvmlDeviceGetName": "name", "nvmlDeviceGetUUID": "uuid",
                 "nvmlDeviceGetCurrPcieLinkGeneration": "gen", "nvmlDeviceGetMaxPcieLinkGeneration": "gen_max",
                 "nvmlDeviceGetGpuMaxPcieLinkGeneration": "gen_max", "nvmlDeviceGetCurrPcieLinkWidth": "width",
                 "nvmlDeviceGetMaxPcieLinkWidth": "width_max", "nvmlDeviceGetPcieReplayCounter": "replays",
                 "nvmlDeviceGetNumaNodeId": "numa"}.get(name)
        if field is None:
            if name.startswith("nvmlDevice"):
                return lambda h, *args: self._recorded(name, h, args)
            raise AttributeError(name)

        def call(h):
            self._check(name)
            if field not in self.gpus[h]:
                return self._recorded(name, h, ())
            return self.gpus[h][field]
        return call

    def _recorded(self, name, h, args):
        """A health call answered from the GPU's ``calls`` (the format of tests/unit/plugins/module_utils/fixtures/
        nvml_health/*.json and of tests/tools/capture_nvml_health.py): the value, or {"ARG,ARG": value} for a call
        with arguments, or {"error": "..."}; a call not recorded is Not Supported, as on a GPU without it."""
        self._check(name)
        calls = self.gpus[h].get("calls") or {}
        if name not in calls:
            raise self.NVMLError("Not Supported")
        value = calls[name]
        if isinstance(value, dict) and "error" in value:
            raise self.NVMLError(value["error"])
        if args:
            key = ",".join(str(a) for a in args)
            if not isinstance(value, dict) or key not in value:
                raise self.NVMLError("Not Supported")
            value = value[key]
            if isinstance(value, dict) and "error" in value:
                raise self.NVMLError(value["error"])
        return value

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.levels[(a, b)]

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        return self.p2p.get((a, b, cap), 0)

    def nvmlDeviceGetNvLinkState(self, h, link):
        self._check("nvmlDeviceGetNvLinkState")
        peers = self.nvlinks.get(h, [])
        if link >= len(peers):
            raise self.NVMLError("Invalid Argument")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return self._Pci(self.nvlinks[h][link])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        if self.remote_types is None:
            raise self.NVMLError("Function Not Found")
        return self.remote_types[h][link]

    # The readings of a real host (tests/fixtures/pci/*/nvml-readings.json), replayed.
    STATUS_CODES = {"OK": 0, "CHIPSET_NOT_SUPPORTED": 1, "GPU_NOT_SUPPORTED": 2, "IOH_TOPOLOGY_NOT_SUPPORTED": 3,
                    "DISABLED_BY_REGKEY": 4, "NOT_SUPPORTED": 5, "UNKNOWN": 6}
    LEVEL_CODES = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
    CAP_CODES = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}

    @classmethod
    def from_readings(cls, readings, remote_types=None, answer_remote_types=True):
        """The fake for a recorded host; answer_remote_types=False plays an older driver that does
        not answer nvmlDeviceGetNvLinkRemoteDeviceType."""
        gpus = [dict(g, bus="0000" + g["bus"] if len(g["bus"]) == 12 else g["bus"]) for g in readings["gpus"]]
        index = {g["bus"][-12:].lower(): i for i, g in enumerate(gpus)}
        levels, p2p = {}, {}
        for pair in readings["pairs"]:
            i, j = index[pair["a"]], index[pair["b"]]
            levels[(i, j)] = levels[(j, i)] = cls.LEVEL_CODES[pair["level"]]
            for cap, status in pair["p2p"].items():
                p2p[(i, j, cls.CAP_CODES[cap])] = p2p[(j, i, cls.CAP_CODES[cap])] = cls.STATUS_CODES[status]
        nvlinks = {i: g.get("nvlinks", []) for i, g in enumerate(gpus)}
        if remote_types is None and all("nvlink_remote_types" in g for g in gpus):
            remote_types = {i: g["nvlink_remote_types"] for i, g in enumerate(gpus)}
        if not answer_remote_types:
            remote_types = None
        return cls(gpus, levels=levels, p2p=p2p, nvlinks=nvlinks, remote_types=remote_types or None)

    @classmethod
    def from_health_capture(cls, capture):
        """The fake for a health capture (tests/tools/capture_nvml_health.py's output): each GPU's recorded calls."""
        return cls([{"bus": g["bus"], "name": g.get("name"), "calls": g["calls"]} for g in capture["gpus"]])

    # nvml.h's enum values, by the names a raw NVML dump (docs/examples/h200-nvml/nvml.json) keys its calls with.
    DUMP_ENUMS = {"NVML_CLOCK_GRAPHICS": 0, "NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2, "NVML_TEMPERATURE_GPU": 0,
                  "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
                  "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1, "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
                  "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0, "NVML_AGGREGATE_ECC": 1}

    @classmethod
    def from_nvml_dump(cls, dump):
        """The fake for a raw NVML dump (tests/tools/h200_nvml_capture.py's nvml.json): per GPU, ``CALL`` or
        ``CALL/ENUM_NAME`` -> ``{"value": V}`` or ``{"error": NAME, "text": TEXT}``, and ``ecc`` ->
        ``TYPE/COUNTER`` -> the same, turned into the ``calls`` of from_health_capture()."""
        def answer(entry):
            return {"error": entry.get("text") or entry["error"]} if "error" in entry else entry["value"]
        gpus = []
        for g in dump["gpus"]:
            calls = {}
            for key, entry in g.items():
                if key == "ecc":
                    for pair, counted in entry.items():
                        kind, counter = pair.split("/")
                        calls.setdefault("nvmlDeviceGetTotalEccErrors", {})[
                            f"{cls.DUMP_ENUMS[kind]},{cls.DUMP_ENUMS[counter]}"] = answer(counted)
                    continue
                call, _sep, arg = key.partition("/")
                if arg:
                    calls.setdefault(call, {})[str(cls.DUMP_ENUMS[arg])] = answer(entry)
                else:
                    calls[call] = answer(entry)
            pci = calls.pop("nvmlDeviceGetPciInfo")
            gpus.append({"bus": pci["busId"], "name": calls.pop("nvmlDeviceGetName", None), "calls": calls})
        return cls(gpus, driver_version=(dump.get("driver") or {}).get("value", "580.159.04"))
