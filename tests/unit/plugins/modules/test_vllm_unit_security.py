# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_service unit as the role renders it (its own template and defaults, Jinja2 with Ansible's
filters) scored by systemd's own `systemd-analyze security --offline`: exposure at most 2.0, with the
settings the issue lists, and a unit without them scoring worse (the check can fail)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters

from ansible_collections.gpufleet.inference.plugins.filter.vllm_args import FilterModule as VllmFilters
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.vllm.vllm_service_files import nccl_state, stamp_unit
from tests.helpers import REPO

ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
ROLE = os.path.join(REPO, "roles", "vllm_service")


def render(nccl_root: str = "/nonexistent", **overrides) -> str:
    """The unit as the role writes it: the template, then the vllm_service_files module's NCCL stamp (the
    NCCL file read under ``nccl_root``)."""
    with open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8") as fh:
        defaults = yaml.safe_load(fh)
    vars_ = {k: v for k, v in defaults.items() if not isinstance(v, str) or "{{" not in v}
    vars_.update(overrides)
    params = {"model": "/srv/models/m", "api_key": vars_.get("vllm_service_api_key", ""),
              "secret_env": vars_.get("vllm_service_secret_env", {}), "host": vars_["vllm_service_host"]}
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, "templates")), keep_trailing_newline=True)
    env.filters.update(CoreFilters().filters())
    vars_.update(ansible_managed="Ansible managed", __vllm_service=VllmFilters().filters()["vllm_args"](params),
                 __vllm_service_venv_target="/opt/gpufleet/vllm/vllm-x")
    text = env.get_template("vllm.service.j2").render(**vars_)
    return stamp_unit(text, nccl_state(HostFS(nccl_root), vars_["vllm_service_nccl_env_file"]))


def exposure(tmp_path, text: str) -> float:
    unit = tmp_path / "vllm.service"
    unit.write_text(text)
    proc = subprocess.run([ANALYZE, "security", "--offline=yes", "--no-pager", str(unit)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False, env=dict(os.environ, LC_ALL="C", SYSTEMD_COLORS="0"))
    m = re.search(r"Overall exposure level for vllm\.service: ([0-9.]+)", proc.stdout)
    assert m, proc.stdout[-2000:]
    return float(m.group(1))


def test_the_rendered_unit_scores_at_most_2_0(tmp_path):
    text = render()
    for setting in ("CapabilityBoundingSet=\n", "AmbientCapabilities=\n", "SystemCallArchitectures=native",
                    "SystemCallFilter=@system-service", "DevicePolicy=closed", "DeviceAllow=char-nvidia-frontend rw",
                    "DeviceAllow=char-nvidia-uvm rw", "DeviceAllow=char-drm rw", "PrivateMounts=yes", "ProtectProc=invisible",
                    "RemoveIPC=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "UMask=0077"):
        assert setting in text, setting
    score = exposure(tmp_path, text)
    assert score <= 2.0, f"systemd-analyze security exposure {score}"


def test_the_check_can_fail_without_the_hardening(tmp_path):
    text = render()
    weak = "\n".join(ln for ln in text.splitlines()
                     if not ln.startswith(("CapabilityBoundingSet", "SystemCall", "DevicePolicy", "DeviceAllow", "ProtectProc",
                                           "PrivateMounts", "RemoveIPC"))) + "\n"
    assert exposure(tmp_path, weak) > 2.0


def test_the_secret_file_is_loaded_only_when_there_is_a_secret(tmp_path):
    assert ".secret.env" not in render()
    assert "EnvironmentFile=/etc/gpufleet/vllm/vllm.secret.env" in render(vllm_service_secret_env={"HF_TOKEN": "hf_x"})
    assert "hf_x" not in render(vllm_service_secret_env={"HF_TOKEN": "hf_x"})
