# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vLLM flag profiles as measured-tuning stages (logic in module_utils/tuning/tune_measured)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.tuning.tune_measured import TuneError, vllm_stages


def tune_measured_vllm_stages(profiles, role="gpufleet.inference.vllm_service"):
    try:
        return vllm_stages(list(profiles or []), role=str(role))
    except TuneError as err:
        raise AnsibleFilterError(f"tune_measured_vllm_stages: {err}") from err


class FilterModule:
    """Measured-tuning filters."""

    def filters(self):
        return {"tune_measured_vllm_stages": tune_measured_vllm_stages}
