# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kernel_cmdline guards on fake trees (the real /bin/sh sources the drop-ins as grub-mkconfig does):
a command line over the architecture's limit is refused before any write, a later drop-in that resets
GRUB_CMDLINE_LINUX_DEFAULT is named (refused before the write; after one, changed true and the file named),
and the ';' device lists of pci=disable_acs_redir= survive the shell and GRUB escaping to the kernel."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import cmdline as kc
from ansible_collections.gpufleet.inference.plugins.modules import kernel_cmdline
from tests.unit.plugins.modules.test_kernel_cmdline import FakeUpdateGrub, debian_tree, grub_mkconfig_variables, reboot, run
from tests.unit.plugins.modules.uthelper import target_side


@pytest.fixture(autouse=True)
def _target_side(monkeypatch):
    target_side(monkeypatch)


def x86(root):
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/arch").write_text("x86_64\n")
    return root


# ---- pure ---------------------------------------------------------------------------------------
def test_length_check_counts_the_nul_and_knows_x86():
    assert kc.check_length("a" * 2047, "x86_64") is None
    msg = kc.check_length("a" * 2048, "x86_64")
    assert "2048 bytes, over the 2048-byte limit of x86_64" in msg and "Nothing was changed" in msg
    assert kc.check_length("a" * 5000, "riscv64") is None  # no limit known here: not guessed


def test_predicted_cmdline():
    line = kc.predicted_cmdline(["BOOT_IMAGE=/x", "root=UUID=1", "ro", "old=1"], "/vmlinuz", ["new=2", "ro"], ["old=1"])
    assert line == "BOOT_IMAGE=/vmlinuz root=UUID=1 ro new=2"


def test_overriding_dropins_are_those_after_ours_that_reset_the_variable():
    files = [("/etc/default/grub.d/50-cloudimg-settings.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1"'),
             ("/etc/default/grub.d/99-gpufleet.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} x"'),
             ("/etc/default/grub.d/99z-local.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"'),
             ("/etc/default/grub.d/99zz-append.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT nosmt"'),
             ("/etc/default/grub.d/99zzz-comment.cfg", '# GRUB_CMDLINE_LINUX_DEFAULT="quiet"')]
    assert kc.overriding_dropins(files) == ["/etc/default/grub.d/99z-local.cfg"]


def test_semicolon_only_in_acs_device_lists():
    assert kc.validate_arg("pci=disable_acs_redir=0000:02:00.0;0000:02:01.0") == "pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"
    assert kc.validate_arg("pci=config_acs=x0x00xx@0000:02:00.0;x0x00xx@0000:02:01.0")
    for bad in ("foo=a;b", "pci=disable_acs_redir=a;;b", "pci=disable_acs_redir=a;", "pci=disable_acs_redir=a;$(reboot)"):
        with pytest.raises(kc.CmdlineError, match="is refused"):
            kc.validate_arg(bad)


# ---- the module on a Debian tree -----------------------------------------------------------------
def test_a_command_line_over_2048_bytes_is_refused_before_any_write(tmp_path, capsys, monkeypatch):
    root = x86(debian_tree(tmp_path))
    fake = FakeUpdateGrub(root)
    assert run(kernel_cmdline, {"root": str(root), "owner": "a", "args": ["quiet"]}, capsys, monkeypatch, fake)["changed"]
    before = (root / "etc/default/grub.d/99-gpufleet.cfg").read_text()
    long_args = [f"dyndbg{i}=" + "x" * 200 for i in range(10)]
    out = run(kernel_cmdline, {"root": str(root), "owner": "b", "args": long_args}, capsys, monkeypatch, fake)
    assert out["failed"] is True and out["changed"] is False and "over the 2048-byte limit of x86_64" in out["msg"], out
    assert out["cmdline_bytes"] > 2048
    assert (root / "etc/default/grub.d/99-gpufleet.cfg").read_text() == before and len(fake.calls) == 1
    # within the limit it goes through
    assert run(kernel_cmdline, {"root": str(root), "owner": "b", "args": long_args[:5]}, capsys, monkeypatch, fake)["changed"]


def test_a_later_dropin_that_resets_the_variable_is_named_and_nothing_is_written(tmp_path, capsys, monkeypatch):
    root = debian_tree(tmp_path)
    (root / "etc/default/grub.d/99z-local.cfg").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n')
    fake = FakeUpdateGrub(root)
    out = run(kernel_cmdline, {"root": str(root), "owner": "pcie_acs", "args": ["pci=disable_acs_redir=0000:02:00.0"]},
              capsys, monkeypatch, fake)
    assert out["failed"] is True and out["changed"] is False
    assert out["overriding"] == ["/etc/default/grub.d/99z-local.cfg"] and "99z-local.cfg sets GRUB_CMDLINE_LINUX_DEFAULT" in out["msg"]
    assert not (root / "etc/default/grub.d/99-gpufleet.cfg").exists() and fake.calls == []


def test_an_override_that_appears_after_our_write_is_reported_with_changed_true(tmp_path, capsys, monkeypatch):
    root = debian_tree(tmp_path)
    fake = FakeUpdateGrub(root)

    def sneaky(module, args, **kw):  # another tool drops its file in while update-grub runs
        (root / "etc/default/grub.d/99z-local.cfg").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
        return fake(module, args, **kw)

    out = run(kernel_cmdline, {"root": str(root), "owner": "pcie_link", "args": ["pcie_aspm.policy=performance"]},
              capsys, monkeypatch, sneaky)
    assert out["failed"] is True and out["changed"] is True and out["overriding"] == ["/etc/default/grub.d/99z-local.cfg"], out
    assert "99z-local.cfg overrides GRUB_CMDLINE_LINUX_DEFAULT after 99-gpufleet.cfg" in out["msg"]


def test_acs_device_list_survives_the_shell_and_grub_to_the_kernel(tmp_path, capsys, monkeypatch):
    root = debian_tree(tmp_path)
    fake = FakeUpdateGrub(root)
    arg = "pci=disable_acs_redir=0000:02:00.0;0000:02:01.0"
    first = run(kernel_cmdline, {"root": str(root), "owner": "pcie_acs", "args": [arg]}, capsys, monkeypatch, fake)
    assert first["changed"] is True and first["missing"] == [arg], first
    assert "pci=disable_acs_redir=0000:02:00.0\\;0000:02:01.0" in (root / "etc/default/grub.d/99-gpufleet.cfg").read_text()
    # the real shell keeps the backslash inside double quotes: grub.cfg gets GRUB's escape, not a command separator
    assert "pci=disable_acs_redir=0000:02:00.0\\;0000:02:01.0" in grub_mkconfig_variables(root)["GRUB_CMDLINE_LINUX_DEFAULT"]
    assert kc.grub_cfg_args((root / "boot/grub/grub.cfg").read_text())[-1] == arg
    again = run(kernel_cmdline, {"root": str(root), "owner": "pcie_acs", "args": [arg]}, capsys, monkeypatch, fake)
    assert again["changed"] is False and len(fake.calls) == 1
    # GRUB unescapes '\;' on the way to the kernel
    reboot(root)
    cmdline = (root / "proc/cmdline").read_text().replace("\\;", ";")
    (root / "proc/cmdline").write_text(cmdline)
    live = run(kernel_cmdline, {"root": str(root), "owner": "pcie_acs", "args": [arg]}, capsys, monkeypatch, fake)
    assert (live["changed"], live["missing"], live["reboot_required"]) == (False, [], False), live
