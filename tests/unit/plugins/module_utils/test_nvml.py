# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVML reader and merge.

No test machine has an NVIDIA GPU, so FakeNVML (tests/unit/fakenvml.py) stands in for the pynvml LIBRARY ONLY: it
answers the few calls nvml.collect() makes, with the value conventions of nvidia-ml-py (busId with
an 8-digit domain, topology levels 0-50, P2P status codes). Everything else is real code. The
real library is exercised where it can be: test_real_pynvml_without_a_driver_fails_cleanly.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import nvml

from tests.unit.fakenvml import FakeNVML


def gpu(bus, **kw):
    return dict({"bus": bus, "name": "NVIDIA H100 PCIe", "uuid": "GPU-" + bus[-7:-5], "gen": 1, "gen_max": 5, "width": 16, "width_max": 16,
                 "replays": 0, "numa": 0}, **kw)


def test_collect_per_gpu_and_pairs():
    fake = FakeNVML([gpu("00000000:03:00.0"), gpu("00000000:04:00.0", replays=7), gpu("00000000:97:00.0", numa=1)],
                    levels={(0, 1): 10, (0, 2): 50, (1, 2): 50}, p2p={(0, 2, 0): 3, (0, 2, 1): 3},
                    unsupported={"nvmlDeviceGetNvLinkState"})
    got = nvml.collect(fake)
    assert fake.shutdown
    assert got["available"] and got["driver_version"] == "580.159.04" and got["unsupported"] == []
    assert list(got["gpus"]) == ["0000:03:00.0", "0000:04:00.0", "0000:97:00.0"]
    g = got["gpus"]["0000:04:00.0"]
    assert (g["index"], g["link_gen_current"], g["link_gen_max"], g["link_width_current"], g["pcie_replay_counter"]) == (1, 1, 5, 16, 7)
    assert g["nvlink_peers"] == {} and g["name"] == "NVIDIA H100 PCIe"
    pairs = {(p["a"], p["b"]): p for p in got["pairs"]}
    assert pairs[("0000:03:00.0", "0000:04:00.0")]["level"] == "PIX"
    far = pairs[("0000:03:00.0", "0000:97:00.0")]
    assert far["level"] == "SYS" and far["p2p"]["read"] == "IOH_TOPOLOGY_NOT_SUPPORTED" and far["p2p"]["pci"] == "OK"


def test_unsupported_calls_are_listed_not_fatal():
    fake = FakeNVML([gpu("00000000:00:06.0")], unsupported={"nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNvLinkState"})
    g = nvml.collect(fake)["gpus"]["0000:00:06.0"]
    assert g["numa_node"] is None and g["unsupported"] == ["numa_node"] and g["link_gen_max"] == 5


def test_nvlink_peers_are_counted():
    fake = FakeNVML([gpu("00000000:03:00.0"), gpu("00000000:04:00.0")], levels={(0, 1): 30},
                    nvlinks={0: ["00000000:04:00.0"] * 4, 1: ["00000000:03:00.0"] * 4})
    got = nvml.collect(fake)
    assert got["gpus"]["0000:03:00.0"]["nvlink_peers"] == {"0000:04:00.0": 4}
    assert got["pairs"][0]["nvlinks"] == 4


def test_init_failure_raises_unavailable():
    with pytest.raises(nvml.NvmlUnavailable, match="nvmlInit failed: Driver Not Loaded"):
        nvml.collect(FakeNVML([], init_error="Driver Not Loaded"))


def test_real_pynvml_without_a_driver_fails_cleanly():
    """The real nvidia-ml-py on a machine without the NVIDIA driver: a clear NvmlUnavailable."""
    if not nvml.HAS_PYNVML:
        pytest.skip("nvidia-ml-py not installed")
    try:
        got = nvml.collect()
    except nvml.NvmlUnavailable as err:
        assert str(err).startswith("nvmlInit failed:")
    else:  # a GPU host: the real library answered
        assert got["available"] is True


def _model_pairs():
    return {"pairs": [{"a": "0000:03:00.0", "b": "0000:04:00.0", "level": "PIX", "level_source": "sysfs", "sysfs_level": "PIX",
                       "nvml_level": None, "p2p": None},
                      {"a": "0000:03:00.0", "b": "0000:97:00.0", "level": "SYS", "level_source": "sysfs", "sysfs_level": "SYS",
                       "nvml_level": None, "p2p": None}]}


def test_merge_takes_nvml_level_and_p2p():
    data = {"pairs": [{"a": "0000:04:00.0", "b": "0000:03:00.0", "level": "PXB", "p2p": {"read": "OK"}, "nvlinks": 0}]}
    model = nvml.merge(_model_pairs(), data)
    first, second = model["pairs"]
    assert (first["level"], first["level_source"], first["sysfs_level"], first["nvml_level"]) == ("PXB", "nvml", "PIX", "PXB")
    assert first["p2p"] == {"read": "OK"}
    assert second["level_source"] == "sysfs" and second["p2p"] is None
    assert model["nvml"] is data


def test_merge_nvlink_level():
    data = {"pairs": [{"a": "0000:03:00.0", "b": "0000:97:00.0", "level": "SYS", "p2p": {}, "nvlinks": 12}]}
    pair = nvml.merge(_model_pairs(), data)["pairs"][1]
    assert pair["level"] == "NV12" and pair["nvml_level"] == "SYS"


def test_nvlink_through_an_nvswitch_fabric_counts_like_nvidia_smi():
    """HGX-style: each GPU's links end on NVSwitches (remote type 2), not on the peer GPU."""
    fake = FakeNVML([gpu("00000000:18:00.0"), gpu("00000000:2a:00.0"), gpu("00000000:3a:00.0")],
                    levels={(0, 1): 50, (0, 2): 50, (1, 2): 50},
                    nvlinks={0: ["00000000:05:00.0"] * 18, 1: ["00000000:06:00.0"] * 18, 2: ["00000000:05:00.0"] * 12},
                    remote_types={0: [2] * 18, 1: [2] * 18, 2: [2] * 12})
    got = nvml.collect(fake)
    assert got["gpus"]["0000:18:00.0"]["nvswitch_links"] == 18 and got["gpus"]["0000:18:00.0"]["nvlink_peers"] == {}
    pairs = {(p["a"], p["b"]): p for p in got["pairs"]}
    assert pairs[("0000:18:00.0", "0000:2a:00.0")]["nvlinks"] == 18
    assert pairs[("0000:18:00.0", "0000:2a:00.0")]["nvlink_via"] == "nvswitch"
    assert pairs[("0000:18:00.0", "0000:3a:00.0")]["nvlinks"] == 12  # the weaker side bounds the pair


def test_nvswitch_links_need_working_nvlink_p2p():
    """Both GPUs on the fabric but NVML says NVLink P2P between them does not work: no NV level."""
    fake = FakeNVML([gpu("00000000:18:00.0"), gpu("00000000:2a:00.0")], levels={(0, 1): 30},
                    p2p={(0, 1, 2): 5}, nvlinks={0: ["00000000:05:00.0"] * 4, 1: ["00000000:05:00.0"] * 4},
                    remote_types={0: [2] * 4, 1: [2] * 4})
    pair = nvml.collect(fake)["pairs"][0]
    assert pair["nvlinks"] == 0 and pair["nvlink_via"] is None and pair["level"] == "PHB"


def test_direct_gpu_links_stay_direct_when_the_type_is_answered():
    fake = FakeNVML([gpu("00000000:03:00.0"), gpu("00000000:04:00.0")], levels={(0, 1): 30},
                    nvlinks={0: ["00000000:04:00.0"] * 4, 1: ["00000000:03:00.0"] * 4},
                    remote_types={0: [0] * 4, 1: [0] * 4})
    got = nvml.collect(fake)
    assert got["gpus"]["0000:03:00.0"]["nvswitch_links"] == 0
    assert got["pairs"][0]["nvlinks"] == 4 and got["pairs"][0]["nvlink_via"] == "direct"
