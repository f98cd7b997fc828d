# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the vllm_service role: the checked vLLM command line and environment, and the venv name.

The logic lives in module_utils/vllm/args.py (unit tested); these wrappers turn its errors into
AnsibleFilterError with the same message.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm import args as va


def _vllm_args(params):
    if not isinstance(params, dict):
        raise AnsibleFilterError("vllm_args: expects a mapping of the vllm_service settings (without the prefix)")
    try:
        out = va.build(dict(params))
    except va.VllmArgsError as err:
        raise AnsibleFilterError(f"Invalid vLLM service settings: {err}") from None
    out["env_file"] = va.render_envfile(out["environment"], "# Managed by Ansible (gpufleet.inference.vllm_service); "
                                                            "local edits are overwritten.")
    return out


def _vllm_venv_name(package, version, source=None):
    try:
        return va.venv_name(package, version, source or {})
    except va.VllmArgsError as err:
        raise AnsibleFilterError(f"Invalid vLLM install settings: {err}") from None


def _vllm_secret_envfile(api_key, secret_env=None):
    """The root-only EnvironmentFile's text. Its values are never put in an error message."""
    try:
        va.check_api_key(api_key or "")
        va.check_secret_env({"secret_env": secret_env or {}})
    except va.VllmArgsError as err:
        raise AnsibleFilterError(f"Invalid vLLM service secrets: {err}") from None
    return va.render_secret_envfile(api_key or "", secret_env or {})


class FilterModule:
    """vLLM service filters."""

    def filters(self):
        return {
            "vllm_args": _vllm_args,
            "vllm_venv_name": _vllm_venv_name,
            "vllm_secret_envfile": _vllm_secret_envfile,
        }
