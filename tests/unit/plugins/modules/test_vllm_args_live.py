# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_service role's live-process reader (roles/vllm_service/files/vllm_live.py): reading a
file as another user, the way it reads /proc/PID/environ where root lacks CAP_SYS_PTRACE."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import tempfile

import pytest

from tests.helpers import REPO

SCRIPT = os.path.join(REPO, "roles", "vllm_service", "files", "vllm_live.py")


@pytest.fixture(scope="module")
def live():
    spec = importlib.util.spec_from_file_location("vllm_live", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_read_as_the_files_owner(live):
    nobody = pwd.getpwnam("nobody")
    tmp = tempfile.mkdtemp(dir="/tmp")  # pytest's tmp_path sits in a 0700 directory nobody cannot cross
    try:
        os.chmod(tmp, 0o755)
        check_read_as(live, nobody, tmp)
    finally:
        shutil.rmtree(tmp)


def check_read_as(live, nobody, tmp):
    import pathlib  # pylint: disable=import-outside-toplevel
    tmp_path = pathlib.Path(tmp)
    mine = tmp_path / "nobody-only"
    mine.write_bytes(b"NCCL_P2P_LEVEL=PXB\0VLLM_API_KEY=x\0" * 5000)  # more than one pipe buffer
    os.chown(mine, nobody.pw_uid, nobody.pw_gid)
    os.chmod(mine, 0o400)
    assert live.read_as(str(mine), nobody.pw_uid, nobody.pw_gid) == mine.read_bytes()

    roots = tmp_path / "root-only"
    roots.write_bytes(b"secret")
    os.chmod(roots, 0o600)
    assert live.read_as(str(roots), nobody.pw_uid, nobody.pw_gid) is None


def test_visible_keeps_the_settings_and_drops_the_key(live):
    env = {"NCCL_P2P_LEVEL": "PXB", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "HF_HUB_OFFLINE": "1", "VLLM_API_KEY": "secret",
           "VLLM_CPU_KVCACHE_SPACE": "1", "PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "x"}
    assert live.visible(env) == {"NCCL_P2P_LEVEL": "PXB", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "HF_HUB_OFFLINE": "1",
                                 "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_secret_names_are_never_shown_only_named(live):
    env = {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz", "HF_HUB_OFFLINE": "1", "VLLM_API_KEY": "k", "NCCL_DEBUG": "WARN"}
    assert live.visible(env) == {"HF_HUB_OFFLINE": "1", "NCCL_DEBUG": "WARN"}
    assert live.secret_names(env) == ["HF_TOKEN", "VLLM_API_KEY"]
