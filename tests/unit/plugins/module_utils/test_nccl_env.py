# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nccl_env: key and value checks, profiles, rendering, and the P2P A/B decision."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.nccl import env as ne


# ---- validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value, expected", [
    ("NCCL_P2P_DISABLE", True, "1"),
    ("NCCL_P2P_DISABLE", "false", "0"),
    ("NCCL_P2P_DISABLE", 0, "0"),
    ("NCCL_P2P_LEVEL", "pxb", "PXB"),
    ("NCCL_P2P_LEVEL", "SYS", "SYS"),
    ("NCCL_P2P_LEVEL", 3, "3"),
    # every name ncclGetLevel() (src/graph/paths.cc) matches in topoPathTypeStr (src/graph/topo.cc), exactly, so in
    # upper case: NVB (NCCL 2.8.3+), C2C (2.26.2+), P2C (2.27.3+), PXN (2.12.7+)
    ("NCCL_P2P_LEVEL", "nvb", "NVB"),
    ("NCCL_P2P_LEVEL", "c2c", "C2C"),
    ("NCCL_P2P_LEVEL", "P2C", "P2C"),
    ("NCCL_P2P_LEVEL", "pxn", "PXN"),
    ("NCCL_NET_GDR_LEVEL", "p2c", "P2C"),
    ("NCCL_ALGO", "ring,tree", "Ring,Tree"),
    ("NCCL_ALGO", "^ring", "^Ring"),
    ("NCCL_ALGO", "^NVLS,NVLSTree", "^NVLS,NVLSTree"),
    ("NCCL_ALGO", "allreduce:tree,ring;broadcast:ring", "allreduce:Tree,Ring;broadcast:Ring"),
    ("NCCL_PROTO", "simple,ll", "Simple,LL"),
    ("NCCL_PROTO", "^LL128", "^LL128"),
    ("NCCL_BUFFSIZE", "8M", "8388608"),
    ("NCCL_BUFFSIZE", "4MiB", "4194304"),
    ("NCCL_BUFFSIZE", 4194304, "4194304"),
    ("NCCL_BUFFSIZE", "512k", "524288"),
    ("NCCL_NTHREADS", 512, "512"),
    ("NCCL_MAX_NCHANNELS", "16", "16"),
    ("NCCL_IB_DISABLE", 1, "1"),
    ("NCCL_SOCKET_IFNAME", "^docker,lo", "^docker,lo"),
    ("NCCL_SOCKET_IFNAME", "=eth0", "=eth0"),
    ("NCCL_SOCKET_IFNAME", "^=docker0", "^=docker0"),
    ("NCCL_SOCKET_IFNAME", "ens", "ens"),
    ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1", "=mlx5_0:1,mlx5_1:1"),
    ("NCCL_DEBUG", "info", "INFO"),
    ("NCCL_DEBUG_SUBSYS", "init,coll", "INIT,COLL"),
    ("NCCL_DEBUG_FILE", "/var/log/nccl.%h.%p", "/var/log/nccl.%h.%p"),
    ("CUDA_DEVICE_ORDER", "pci_bus_id", "PCI_BUS_ID"),
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3", "0,1,2,3"),
    ("CUDA_VISIBLE_DEVICES", "GPU-ec48e86b-60dc-8954-e275-c54f017e8990", "GPU-ec48e86b-60dc-8954-e275-c54f017e8990"),
])
def test_valid_values_are_normalised(key, value, expected):
    assert ne.validate({key: value}) == {key: expected}


@pytest.mark.parametrize("key, value, reason", [
    ("NCCL_P2P_DISABLE", "2", "expected 0 or 1"),
    ("NCCL_P2P_LEVEL", "NODE", "expected one of LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS or an integer 0..5"),
    ("NCCL_P2P_LEVEL", "PCI", "expected one of LOC, NVL, NVB"),
    # NET and DIS follow SYS in topoPathTypeStr, but ncclGetLevel() compares only up to PATH_SYS
    ("NCCL_P2P_LEVEL", "NET", "expected one of"),
    ("NCCL_P2P_LEVEL", "DIS", "expected one of"),
    ("NCCL_NET_GDR_LEVEL", "NET", "expected one of"),
    ("NCCL_P2P_LEVEL", 9, "9 is outside 0..5"),
    ("NCCL_ALGO", "Ring,Fast", "unknown Fast"),
    ("NCCL_ALGO", "NVLS", "NVLink multicast"),
    ("NCCL_ALGO", "gather:ring", "is not <collective>:<algorithms>"),
    ("NCCL_PROTO", "LL256", "unknown LL256"),
    ("NCCL_PROTO", "Simple,", "empty name"),
    ("NCCL_BUFFSIZE", "4potatoes", "expected bytes"),
    ("NCCL_BUFFSIZE", "2G", "outside 65536..1073741824"),
    ("NCCL_BUFFSIZE", 0, "must be positive"),
    ("NCCL_NTHREADS", 100, "expected one of 64, 128, 256, 512"),
    ("NCCL_MAX_NCHANNELS", 0, "0 is outside 1..64"),
    ("NCCL_MAX_NCHANNELS", "many", "expected an integer from 1 to 64"),
    ("NCCL_SOCKET_IFNAME", "eth0 eth1", "whitespace"),
    ("NCCL_SOCKET_IFNAME", "^averyveryverylongname0", "bad interface name"),
    ("NCCL_DEBUG", "LOUD", "expected one of VERSION, WARN, INFO, TRACE"),
    ("NCCL_DEBUG_FILE", "nccl.log", "absolute path"),
    ("NCCL_DEBUG", "$(reboot)", "not allowed"),
    ("CUDA_VISIBLE_DEVICES", "0,gpu1", "bad device"),
    ("NCCL_IB_HCA", "mlx5_0:port", "bad HCA"),
    ("NCCL_DEBUG", ["WARN"], "expected a string or an integer"),
])
def test_bad_values_name_key_value_and_what_is_accepted(key, value, reason):
    with pytest.raises(ne.NcclEnvError) as err:
        ne.validate({key: value})
    msg = str(err.value)
    assert msg.startswith("Invalid NCCL settings: ")
    assert f"{key}={value!r}" in msg
    assert reason in msg


def test_unknown_key_is_an_error_with_a_suggestion():
    with pytest.raises(ne.NcclEnvError) as err:
        ne.validate({"NCCL_P2P_LEVLE": "PXB"})
    msg = str(err.value)
    assert "NCCL_P2P_LEVLE: unknown key" in msg
    assert "did you mean NCCL_P2P_LEVEL?" in msg
    assert "nccl_env_allow_unknown" in msg


def test_unknown_key_without_a_close_match_has_no_suggestion():
    with pytest.raises(ne.NcclEnvError) as err:
        ne.validate({"NCCL_FROBNICATE": "1"})
    assert "did you mean" not in str(err.value)


def test_allowed_unknown_key_passes_with_the_safe_text_check():
    assert ne.validate({"NCCL_NEW_THING": "3"}, allow_unknown=["NCCL_NEW_THING"]) == {"NCCL_NEW_THING": "3"}
    with pytest.raises(ne.NcclEnvError, match="whitespace"):
        ne.validate({"NCCL_NEW_THING": "a b"}, allow_unknown=["NCCL_NEW_THING"])


def test_every_problem_is_listed_at_once():
    with pytest.raises(ne.NcclEnvError) as err:
        ne.validate({"NCCL_DEBUG": "LOUD", "NCCL_NTHREADS": 3, "nccl_lower": "1", "NCCL_BOGUS": "1"})
    msg = str(err.value)
    for part in ("NCCL_DEBUG='LOUD'", "NCCL_NTHREADS=3", "'nccl_lower': not an environment variable name",
                 "NCCL_BOGUS: unknown key"):
        assert part in msg


def test_nvlink_multicast_cannot_be_turned_on():
    with pytest.raises(ne.NcclEnvError) as err:
        ne.validate({"NCCL_NVLS_ENABLE": 1})
    assert "NVLink multicast stays off" in str(err.value)
    assert ne.validate({"NCCL_NVLS_ENABLE": 0}) == {"NCCL_NVLS_ENABLE": "0"}


def test_none_values_are_dropped_and_mapping_is_required():
    assert ne.validate({"NCCL_DEBUG": None}) == {}
    with pytest.raises(ne.NcclEnvError, match="must be a mapping"):
        ne.validate(["NCCL_DEBUG=WARN"])


@pytest.mark.parametrize("text, expected", [("1", 1), ("64K", 65536), ("1g", 1 << 30), ("2MB", 2 << 20)])
def test_parse_bytes(text, expected):
    assert ne.parse_bytes(text) == expected


# ---- profiles and P2P ----------------------------------------------------------------------------------
def test_pcie_safe_profile():
    assert ne.resolve("pcie_safe") == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0",
        "NCCL_P2P_LEVEL": "PXB", "NCCL_PROTO": "^LL128"}


def test_p2p_off_profile_disables_p2p_and_has_no_level():
    out = ne.resolve("p2p_off")
    assert out["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in out


def test_custom_profile_is_the_baseline_plus_user_keys():
    assert ne.resolve("custom", {"NCCL_SOCKET_IFNAME": "^docker,lo"}) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "^docker,lo"}


def test_user_settings_override_and_none_removes_a_profile_key():
    out = ne.resolve("pcie_safe", {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": None, "NCCL_DEBUG": "INFO"})
    assert out["NCCL_P2P_LEVEL"] == "SYS" and out["NCCL_DEBUG"] == "INFO" and "NCCL_PROTO" not in out


def test_unknown_profile():
    with pytest.raises(ne.NcclEnvError, match="Unknown NCCL profile 'fast': expected one of pcie_safe, p2p_off, custom"):
        ne.resolve("fast")


def test_a_p2p_winner_is_applied_on_top_of_the_profile():
    on = ne.resolve("p2p_off", p2p="p2p_on")
    assert "NCCL_P2P_DISABLE" not in on
    off = ne.resolve("pcie_safe", p2p="p2p_off")
    assert off["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in off
    with pytest.raises(ne.NcclEnvError, match="Unknown P2P mode"):
        ne.resolve("pcie_safe", p2p="maybe")


def test_ab_candidates_differ_only_in_p2p():
    cands = ne.ab_candidates(ne.resolve("pcie_safe"))
    assert set(cands) == {"p2p_on", "p2p_off"}
    assert cands["p2p_on"]["NCCL_P2P_LEVEL"] == "PXB" and "NCCL_P2P_DISABLE" not in cands["p2p_on"]
    assert cands["p2p_off"]["NCCL_P2P_DISABLE"] == "1"
    common = set(cands["p2p_on"]) & set(cands["p2p_off"])
    assert all(cands["p2p_on"][k] == cands["p2p_off"][k] for k in common)
    assert all(c["NCCL_NVLS_ENABLE"] == "0" for c in cands.values())


def test_ab_key_is_stable_and_follows_settings_and_bench():
    cands = ne.ab_candidates(ne.resolve("pcie_safe"))
    key = ne.ab_key(cands, {"max_bytes": 1 << 28})
    assert key == ne.ab_key(dict(reversed(list(cands.items()))), {"max_bytes": 1 << 28})
    assert key != ne.ab_key(cands, {"max_bytes": 1 << 27})
    assert key != ne.ab_key(ne.ab_candidates(ne.resolve("pcie_safe", {"NCCL_DEBUG": "INFO"})), {"max_bytes": 1 << 28})
    assert len(key) == 16


# ---- rendering ---------------------------------------------------------------------------------------
def test_render_conf_has_nccl_keys_only_sorted():
    text = ne.render_conf(ne.resolve("pcie_safe"), "pcie_safe")
    lines = text.splitlines()
    assert lines[0].startswith("# Managed by Ansible (gpufleet.inference.nccl_env, profile pcie_safe)")
    assert lines[1:] == ["NCCL_DEBUG=WARN", "NCCL_IB_DISABLE=1", "NCCL_NVLS_ENABLE=0", "NCCL_P2P_LEVEL=PXB",
                         "NCCL_PROTO=^LL128"]


def test_render_envfile_has_every_key_and_the_note():
    text = ne.render_envfile(ne.resolve("pcie_safe"), "pcie_safe", note="P2P A/B abc: p2p_on")
    lines = text.splitlines()
    assert lines[1] == "# P2P A/B abc: p2p_on"
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in lines and "NCCL_NVLS_ENABLE=0" in lines
    assert text.endswith("\n")


# ---- the A/B decision ---------------------------------------------------------------------------------
SIZES = [1 << 18, 1 << 20, 1 << 24, 1 << 28]


def run(values, ok=True, error=None):
    return {"ok": ok, "error": error, "busbw_gbps": {str(s): v for s, v in zip(SIZES, values)}}


def test_p2p_off_wins_when_clearly_faster():
    d = ne.ab_decide({"p2p_on": run([2, 8, 10, 11]), "p2p_off": run([3, 10, 12, 13])})
    assert d["winner"] == "p2p_off"
    assert d["sizes"] == SIZES
    assert d["ratio"] > 1.05
    assert "p2p_off is" in d["reason"] and "faster than p2p_on" in d["reason"]
    assert set(d["scores"]) == {"p2p_on", "p2p_off"}


def test_within_the_margin_the_preferred_mode_stays():
    d = ne.ab_decide({"p2p_on": run([10, 10, 10, 10]), "p2p_off": run([10.4, 10.4, 10.4, 10.4])}, margin_pct=5)
    assert d["winner"] == "p2p_on" and d["ratio"] == pytest.approx(1.04)
    assert "within the 5% margin" in d["reason"]


def test_preferring_p2p_off_flips_the_tie():
    d = ne.ab_decide({"p2p_on": run([10, 10, 10, 10]), "p2p_off": run([10, 10, 10, 10])}, prefer="p2p_off")
    assert d["winner"] == "p2p_off" and d["prefer"] == "p2p_off"


def test_p2p_on_wins_when_faster():
    d = ne.ab_decide({"p2p_on": run([5, 20, 24, 25]), "p2p_off": run([3, 10, 12, 13])}, prefer="p2p_off")
    assert d["winner"] == "p2p_on"


def test_geometric_mean_weighs_every_size_the_same():
    # p2p_off is 3x faster at the smallest size, 1.2x slower at the three others: (3 / 1.2^3)^(1/4) = 1.148
    d = ne.ab_decide({"p2p_on": run([1, 12, 12, 12]), "p2p_off": run([3, 10, 10, 10])})
    assert d["winner"] == "p2p_off" and d["ratio"] == pytest.approx((3 / 1.2 ** 3) ** 0.25, rel=1e-3)


def test_min_bytes_drops_small_sizes():
    d = ne.ab_decide({"p2p_on": run([1, 12, 12, 12]), "p2p_off": run([3, 10, 10, 10])}, min_bytes=1 << 20)
    assert d["winner"] == "p2p_on" and d["sizes"] == SIZES[1:]


def test_a_hung_mode_loses():
    d = ne.ab_decide({"p2p_on": {"ok": False, "error": "did not finish in 300 s (a hang)"}, "p2p_off": run([3, 4, 5, 6])})
    assert d["winner"] == "p2p_off"
    assert "p2p_on gave no figure (did not finish in 300 s (a hang))" in d["reason"]


def test_no_figure_at_all_means_no_winner():
    d = ne.ab_decide({"p2p_on": {"ok": False, "error": "boom"}, "p2p_off": {"ok": True, "busbw_gbps": {}}})
    assert d["winner"] is None
    assert "p2p_on gave no figure (boom)" in d["reason"] and "p2p_off gave no figure" in d["reason"]


def test_zero_bandwidth_is_no_figure():
    d = ne.ab_decide({"p2p_on": run([0, 0, 0, 0]), "p2p_off": run([1, 1, 1, 1])})
    assert d["winner"] == "p2p_off"


def test_only_common_sizes_are_compared():
    on = {"ok": True, "busbw_gbps": {"1024": 1.0, "2048": 2.0}}
    off = {"ok": True, "busbw_gbps": {"2048": 4.0, "4096": 8.0}}
    d = ne.ab_decide({"p2p_on": on, "p2p_off": off})
    assert d["sizes"] == [2048] and d["winner"] == "p2p_off" and d["ratio"] == 2.0


def test_no_common_size_keeps_the_preferred_mode():
    d = ne.ab_decide({"p2p_on": {"ok": True, "busbw_gbps": {"1024": 1.0}}, "p2p_off": {"ok": True, "busbw_gbps": {"2048": 9.0}}})
    assert d["winner"] == "p2p_on" and "share no message size" in d["reason"]


def test_bad_decision_parameters():
    with pytest.raises(ne.NcclEnvError, match="Unknown preferred P2P mode"):
        ne.ab_decide({}, prefer="p2p_maybe")
    with pytest.raises(ne.NcclEnvError, match="margin must be >= 0"):
        ne.ab_decide({}, margin_pct=-1)


def test_malformed_sizes_are_ignored():
    d = ne.ab_decide({"p2p_on": {"ok": True, "busbw_gbps": {"x": 1.0, "1024": "2.5"}},
                      "p2p_off": {"ok": True, "busbw_gbps": {"1024": None}}})
    assert d["winner"] == "p2p_on" and d["scores"] == {"p2p_on": 2.5}


# ---- the A/B on a real multi-GPU host ------------------------------------------------------------
def _fixture(name):
    import json
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "nccl", name)
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@pytest.mark.parametrize("host, slower", [("h200-x2", "89.0"), ("h200-x4", "90.9")])
def test_real_h200_ab_keeps_p2p_and_says_how_much_slower_off_is(host, slower):
    """The role's A/B as measured on 2x and 4x H200 over an NVSwitch fabric
    (tests/tools/device_multi_gpu.sh): the decision recomputed from the recorded figures is the one
    the host recorded, and the reason reads as a person would say it."""
    record = _fixture(host + "-role-ab.json")
    d = ne.ab_decide(record["results"], prefer=record["decision"]["prefer"], margin_pct=record["decision"]["margin_pct"])
    assert d["winner"] == record["decision"]["winner"] == "p2p_on"
    assert d["scores"] == record["decision"]["scores"]
    assert d["sizes"] == [8 << 20 << i for i in range(7)]  # 8 MiB .. 512 MiB
    assert d["reason"].startswith(f"p2p_on kept: p2p_off is {slower}% slower")


@pytest.mark.parametrize("host", ["h200-x2", "h200-x4"])
def test_real_h200_four_settings_rank_as_measured(host):
    """NCCL defaults and pcie_safe both keep P2P on and land within a few percent of each other;
    turning P2P off costs about 9-11x on these hosts, under either setting."""
    four = _fixture(host + "-four-settings.json")["results"]
    for base in ("nccl_defaults", "pcie_safe"):
        on = four[base] if base == "nccl_defaults" else four["pcie_safe_p2p_on"]
        d = ne.ab_decide({"p2p_on": on, "p2p_off": four[base + "_p2p_off"]})
        assert d["winner"] == "p2p_on" and d["ratio"] < 0.15, (base, d)
    d = ne.ab_decide({"p2p_on": four["nccl_defaults"], "p2p_off": four["pcie_safe_p2p_on"]})
    assert 0.95 < d["ratio"] <= 1.0  # pcie_safe costs under 5% against the defaults here


# ---- the p2p_on arm really allows P2P for the group's pair levels ------------------------------------
@pytest.mark.parametrize("levels,want", [(["PIX"], "PXB"), (["PIX", "PXB"], "PXB"), (["PHB"], "PHB"), (["NODE", "PIX"], "PHB"),
                                         (["SYS", "PHB"], "SYS"), ([], "PXB")])
def test_p2p_on_arm_level_covers_the_farthest_pair(levels, want):
    cands = ne.ab_candidates(ne.resolve("pcie_safe"), levels)
    assert cands["p2p_on"]["NCCL_P2P_LEVEL"] == want  # pcie_safe's PXB is raised, never lowered
    assert cands["p2p_off"]["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in cands["p2p_off"]
    # the winner written to the service is the arm that was measured
    assert ne.resolve("pcie_safe", p2p="p2p_on", pair_levels=levels) == cands["p2p_on"]


def test_a_farther_user_level_is_kept():
    cands = ne.ab_candidates(ne.resolve("pcie_safe", {"NCCL_P2P_LEVEL": "SYS"}), ["PHB"])
    assert cands["p2p_on"]["NCCL_P2P_LEVEL"] == "SYS"


def test_group_pair_levels_from_the_real_h200_capture_facts():
    pcie = {"pairs": [{"a": "0000:00:06.0", "b": "0000:00:07.0", "level": "PHB"},
                      {"a": "0000:00:06.0", "b": "0000:00:08.0", "level": "PHB"},
                      {"a": "0000:00:07.0", "b": "0000:00:08.0", "level": "SYS"}]}
    assert ne.group_pair_levels(pcie, ["0000:00:06.0", "0000:00:07.0"]) == ["PHB"]
    assert ne.group_pair_levels(pcie) == ["PHB", "PHB", "SYS"] and ne.p2p_allow_level(ne.group_pair_levels(pcie)) == "SYS"


SMALL = [8192, 65536, 1 << 20]
LARGE = [1 << 24, 1 << 27, 1 << 29]


def two(small_us, large_gbps):
    return {"ok": True, "error": None, "time_us": {str(s): v for s, v in zip(SMALL + LARGE, small_us + [1000, 8000, 30000])},
            "busbw_gbps": {str(s): v for s, v in zip(SMALL + LARGE, [0.5, 3, 9] + large_gbps)}}


def test_decode_latency_and_bandwidth_both_decide():
    # p2p_off: small all-reduces 30% faster (host staging beats a slow P2P path), bandwidth equal: p2p_off wins
    d = ne.ab_decide({"p2p_on": two([20, 25, 60], [20, 22, 22]), "p2p_off": two([14, 17.5, 42], [20, 22, 22])})
    assert d["winner"] == "p2p_off" and d["small_sizes"] == SMALL and d["large_sizes"] == LARGE
    assert d["latency_ratio"] == pytest.approx(1 / 0.7, rel=1e-3) and d["ratio"] == pytest.approx(1.0)
    assert "small all-reduces" in d["reason"] and "us" in d["reason"]


def test_mixed_result_keeps_the_preferred_mode():
    # p2p_off has 20% more bandwidth but 20% slower small all-reduces: the decode path would pay
    d = ne.ab_decide({"p2p_on": two([10, 12, 30], [20, 20, 20]), "p2p_off": two([12, 14.4, 36], [24, 24, 24])})
    assert d["winner"] == "p2p_on" and "mixed result" in d["reason"]


def test_within_margin_on_both_keeps_the_preferred_mode():
    d = ne.ab_decide({"p2p_on": two([10, 12, 30], [20, 20, 20]), "p2p_off": two([9.8, 11.8, 29.5], [20.5, 20.5, 20.5])})
    assert d["winner"] == "p2p_on" and "not better beyond the margin" in d["reason"]


def test_pci_is_not_a_p2p_level():  # docs/tuning_myths.md: NCCL_P2P_LEVEL=PCI is widely copied and means nothing
    with pytest.raises(ne.NcclEnvError, match="NCCL_P2P_LEVEL"):
        ne.resolve("custom", {"NCCL_P2P_LEVEL": "PCI"})


def test_level_names_follow_ncclgetlevel_in_nccl_order():
    # topoPathTypeStr[] of NCCL master (src/graph/topo.cc) up to PATH_SYS, nearest first
    assert ne.LEVELS == ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
    assert set(ne.LEVEL_SINCE) == {"NVB", "C2C", "P2C", "PXN"}


@pytest.mark.parametrize("have, pairs, level", [
    ("PXN", ["PHB"], "PHB"),   # PXN is nearer than PHB: raised so that the PHB pairs get P2P
    ("PHB", ["PXB"], "PHB"),   # already farther: kept
    ("P2C", ["PXB"], "P2C"),   # P2C is farther than PXB: kept
    ("NVB", ["PIX"], "PIX"),
])
def test_p2p_on_compares_the_new_levels_in_nccl_order(have, pairs, level):
    assert ne.with_p2p({"NCCL_P2P_LEVEL": have}, "p2p_on", pairs)["NCCL_P2P_LEVEL"] == level
