# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nccl_env and nccl_env_ab_decide filters: what the role gets, and errors as AnsibleFilterError."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.inference.plugins.filter.nccl_env import FilterModule

F = FilterModule().filters()


def test_filters_are_registered():
    assert set(F) == {"nccl_env", "nccl_env_ab_decide"}


def test_nccl_env_gives_everything_the_role_writes():
    out = F["nccl_env"]("pcie_safe", {"NCCL_DEBUG": "info"}, [], bench={"max_bytes": 1})
    assert out["profile"] == "pcie_safe" and out["p2p"] is None
    assert out["settings"]["NCCL_DEBUG"] == "INFO"
    assert "NCCL_DEBUG=INFO\n" in out["nccl_conf"] and "CUDA_DEVICE_ORDER" not in out["nccl_conf"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID\n" in out["env_file"]
    assert set(out["ab_candidates"]) == {"p2p_on", "p2p_off"}
    assert out["ab_key"] != F["nccl_env"]("pcie_safe", {"NCCL_DEBUG": "info"}, [], bench={"max_bytes": 2})["ab_key"]


def test_the_winner_changes_the_files_but_not_the_key():
    base = F["nccl_env"]("pcie_safe")
    won = F["nccl_env"]("pcie_safe", p2p="p2p_off", note="P2P A/B k: p2p_off")
    assert won["settings"]["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in won["settings"]
    assert won["ab_key"] == base["ab_key"] and won["ab_candidates"] == base["ab_candidates"]
    assert "# P2P A/B k: p2p_off\n" in won["nccl_conf"]


def test_an_empty_p2p_means_none():
    assert F["nccl_env"]("pcie_safe", p2p="")["p2p"] is None


@pytest.mark.parametrize("args, match", [
    (("pcie_safe", {"NCCL_NOPE": 1}), "NCCL_NOPE: unknown key"),
    (("pcie_safe", {"NCCL_ALGO": "Fastest"}), "NCCL_ALGO='Fastest': unknown Fastest"),
    (("turbo",), "Unknown NCCL profile 'turbo'"),
    (("custom", {"NCCL_NVLS_ENABLE": "1"}), "NVLink multicast stays off"),
])
def test_errors_are_filter_errors(args, match):
    with pytest.raises(AnsibleFilterError, match=match):
        F["nccl_env"](*args)


def test_ab_decide_reads_the_bench_report():
    report = {"results": {"p2p_on": {"ok": True, "busbw_gbps": {"1024": 10.0}},
                          "p2p_off": {"ok": True, "busbw_gbps": {"1024": 12.0}}}}
    assert F["nccl_env_ab_decide"](report, "p2p_on", "5")["winner"] == "p2p_off"
    assert F["nccl_env_ab_decide"](report, "p2p_on", 25)["winner"] == "p2p_on"


@pytest.mark.parametrize("report, args, match", [
    ("not a dict", (), "expects the JSON object"),
    ({"results": {}}, ("p2p_sideways",), "Unknown preferred P2P mode"),
    ({"results": {}}, ("p2p_on", "five"), "could not convert"),
])
def test_ab_decide_errors(report, args, match):
    with pytest.raises(AnsibleFilterError, match=match):
        F["nccl_env_ab_decide"](report, *args)
