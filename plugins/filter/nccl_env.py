# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the nccl_env role: resolve and render the NCCL settings, decide the P2P A/B.

The logic lives in module_utils/nccl/env.py (unit tested); these wrappers turn its errors into
AnsibleFilterError with the same message.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl import env as ne


def _nccl_env(profile, settings=None, allow_unknown=None, p2p=None, bench=None, note="", pcie=None, gpus=None):
    try:
        levels = ne.group_pair_levels(pcie, gpus)
        resolved = ne.resolve(profile, settings or {}, allow_unknown or (), p2p=p2p or None, pair_levels=levels)
        base = ne.resolve(profile, settings or {}, allow_unknown or ())
        candidates = ne.ab_candidates(base, levels)
        return {
            "profile": profile,
            "p2p": p2p or None,
            "pair_levels": levels,
            "p2p_level": ne.p2p_allow_level(levels),
            "settings": resolved,
            # the name of the settings (the NCCL change's target): nccl- and 12 hex digits of their SHA-256
            "id": ne.settings_id(resolved),
            "nccl_conf": ne.render_conf(resolved, profile, note),
            "env_file": ne.render_envfile(resolved, profile, note),
            "ab_candidates": candidates,
            "ab_key": ne.ab_key(candidates, bench),
        }
    except ne.NcclEnvError as err:
        raise AnsibleFilterError(str(err)) from None


def _nccl_env_ab_decide(bench, prefer="p2p_on", margin_pct=5.0, min_bytes=0):
    if not isinstance(bench, dict):
        raise AnsibleFilterError("nccl_env_ab_decide: expects the JSON object printed by nccl_ab_bench.py")
    try:
        return ne.ab_decide(bench.get("results") or {}, prefer=prefer, margin_pct=float(margin_pct),
                            min_bytes=int(min_bytes))
    except (ne.NcclEnvError, TypeError, ValueError) as err:
        raise AnsibleFilterError(f"nccl_env_ab_decide: {err}") from None


class FilterModule:
    """NCCL settings filters."""

    def filters(self):
        return {
            "nccl_env": _nccl_env,
            "nccl_env_ab_decide": _nccl_env_ab_decide,
        }
