# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kernel_cmdline and kernel_cmdline_info: the YAML cases (every update-grub, grub-mkconfig and
grubby path), the drop-in sourced by a real shell the way grub-mkconfig sources it, and the full
add / reboot / remove / reboot cycle on one fake tree."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import kernel_cmdline as kernel_cmdline_exec
from ansible_collections.gpufleet.inference.plugins.modules import kernel_cmdline, kernel_cmdline_info
from tests.unit.plugins.modules.uthelper import UTHelper, target_side

test_yaml_case = UTHelper(kernel_cmdline, __file__).test_function()

CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.1.0-50-cloud-amd64 root=UUID=4a1c ro console=ttyS0,115200n8 quiet"


@pytest.fixture(autouse=True)
def _target_side(monkeypatch):
    target_side(monkeypatch)


def debian_tree(root):
    files = {
        "proc/cmdline": CMDLINE + "\n",
        "etc/default/grub": 'GRUB_DEFAULT=saved\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX="console=ttyS0,115200n8"\n',
        "etc/default/grub.d/50-cloudimg-settings.cfg": 'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n',
        "usr/sbin/update-grub": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def grub_mkconfig_variables(root) -> dict:
    """Source /etc/default/grub and grub.d/*.cfg with /bin/sh exactly as grub-mkconfig does, and
    return the two variables it builds the linux lines from."""
    script = ('set -e; sysconfdir="$1/etc"; . "${sysconfdir}/default/grub"; '
              'for x in "${sysconfdir}"/default/grub.d/*.cfg; do if [ -e "${x}" ]; then . "${x}"; fi; done; '
              'printf "%s\\n%s\\n" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"')
    proc = subprocess.run(["/bin/sh", "-c", script, "sh", str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, check=True)
    linux, default = proc.stdout.split("\n")[:2]
    return {"GRUB_CMDLINE_LINUX": linux, "GRUB_CMDLINE_LINUX_DEFAULT": default}


class FakeUpdateGrub:
    """Stands in for update-grub: writes grub.cfg from the variables the real shell sourcing yields."""

    def __init__(self, root):
        self.root = root
        self.calls = []

    def __call__(self, module, args, **kwargs):
        self.calls.append(list(args))
        assert args[-1] == "/usr/sbin/update-grub" and args[1] == str(self.root)
        v = grub_mkconfig_variables(self.root)
        cfg = self.root / "boot/grub/grub.cfg"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text("menuentry 'Debian GNU/Linux' {\n\tlinux\t/boot/vmlinuz-6.1.0-50-cloud-amd64 root=UUID=4a1c ro "
                       f"{v['GRUB_CMDLINE_LINUX']} {v['GRUB_CMDLINE_LINUX_DEFAULT']}\n}}\n"
                       "menuentry 'Debian GNU/Linux (recovery mode)' {\n\tlinux\t/boot/vmlinuz-6.1.0-50-cloud-amd64 "
                       f"root=UUID=4a1c ro single {v['GRUB_CMDLINE_LINUX']}\n}}\n")
        return 0, "Generating grub configuration file ...\ndone\n", ""


def run(module, args, capsys, monkeypatch, runner=None):
    monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda self, arg, required=False, opt_dirs=None: f"/testbin/{arg}")
    if runner is not None:
        def run_command(self, argv, **kwargs):
            return runner(self, argv, **kwargs)

        monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)


def reboot(root):
    """What the next boot does: the kernel gets the first entry's linux line."""
    line = [ln for ln in (root / "boot/grub/grub.cfg").read_text().splitlines() if ln.strip().startswith("linux")][0]
    parts = line.split()
    (root / "proc/cmdline").write_text(f"BOOT_IMAGE={parts[1]} " + " ".join(parts[2:]) + "\n")


def test_dropin_is_valid_shell_that_appends_after_the_cloud_image_setting(tmp_path, capsys, monkeypatch):
    root = debian_tree(tmp_path)
    fake = FakeUpdateGrub(root)
    result = run(kernel_cmdline, {"root": str(root), "owner": "pcie_link", "args": ["pcie_aspm=off"]}, capsys, monkeypatch, fake)
    assert result["changed"] is True, result
    vfio = ["intel_iommu=on", "iommu=pt", "vfio-pci.ids=10de:2335,10de:22a3"]
    result = run(kernel_cmdline, {"root": str(root), "owner": "vfio", "args": vfio}, capsys, monkeypatch, fake)
    assert result["changed"] is True, result
    v = grub_mkconfig_variables(root)
    # 50-cloudimg-settings.cfg replaced the value of /etc/default/grub; the drop-in sorts after it and appends.
    assert v["GRUB_CMDLINE_LINUX_DEFAULT"].split() == ["console=tty1", "console=ttyS0", "pcie_aspm=off", "intel_iommu=on",
                                                       "iommu=pt", "vfio-pci.ids=10de:2335,10de:22a3"]
    assert v["GRUB_CMDLINE_LINUX"] == "console=ttyS0,115200n8"  # untouched: recovery entries stay clean
    recovery = (root / "boot/grub/grub.cfg").read_text().split("recovery mode")[1]
    assert "pcie_aspm=off" not in recovery and "iommu=pt" not in recovery


def test_add_reboot_remove_reboot_cycle(tmp_path, capsys, monkeypatch):
    """The lab's sequence on a fake tree: each step's second run changes nothing."""
    root = debian_tree(tmp_path)
    fake = FakeUpdateGrub(root)
    args = {"root": str(root), "owner": "pcie_link", "args": ["pcie_aspm=off"]}
    first = run(kernel_cmdline, args, capsys, monkeypatch, fake)
    assert (first["changed"], first["reboot_required"], first["missing"]) == (True, True, ["pcie_aspm=off"])
    again = run(kernel_cmdline, args, capsys, monkeypatch, fake)
    assert (again["changed"], again["reboot_required"]) == (False, True)
    reboot(root)
    assert "pcie_aspm=off" in (root / "proc/cmdline").read_text()
    after = run(kernel_cmdline, args, capsys, monkeypatch, fake)
    assert (after["changed"], after["reboot_required"], after["missing"]) == (False, False, [])
    info = run(kernel_cmdline_info, {"root": str(root), "owner": "pcie_link"}, capsys, monkeypatch)
    assert (info["changed"], info["missing"], info["reboot_required"], info["source"]) == (False, [], False, "dropin")

    gone = {"root": str(root), "owner": "pcie_link", "state": "absent"}
    removed = run(kernel_cmdline, gone, capsys, monkeypatch, fake)
    assert (removed["changed"], removed["reboot_required"], removed["unexpected"]) == (True, True, ["pcie_aspm=off"])
    assert not (root / "etc/default/grub.d/99-gpufleet.cfg").exists()
    again = run(kernel_cmdline, gone, capsys, monkeypatch, fake)
    assert (again["changed"], again["reboot_required"], again["owner_reboot_required"]) == (False, True, True)
    info = run(kernel_cmdline_info, {"root": str(root)}, capsys, monkeypatch)
    assert info["unexpected"] == ["pcie_aspm=off"] and info["reboot_required"] is True
    reboot(root)
    done = run(kernel_cmdline, gone, capsys, monkeypatch, fake)
    assert (done["changed"], done["reboot_required"], done["unexpected"]) == (False, False, [])
    assert len(fake.calls) == 2  # update-grub ran once per real change


def test_info_reads_the_el_state_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cmdline").write_text("BOOT_IMAGE=(hd0,gpt2)/vmlinuz ro iommu=pt\n")
    (tmp_path / "etc/gpufleet").mkdir(parents=True)
    (tmp_path / "etc/gpufleet/kernel_cmdline.json").write_text(json.dumps({
        "format": "gpufleet-kernel-cmdline/1", "owners": {"vfio": ["intel_iommu=on", "iommu=pt"]}, "pending_removal": {}}))
    info = run(kernel_cmdline_info, {"root": str(tmp_path), "owner": "vfio"}, capsys, monkeypatch)
    assert info["source"] == "state" and info["missing"] == ["intel_iommu=on"]
    assert info["reboot_required"] is True and info["owner_reboot_required"] is True


def test_info_without_any_record(tmp_path, capsys, monkeypatch):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cmdline").write_text("ro quiet\n")
    info = run(kernel_cmdline_info, {"root": str(tmp_path)}, capsys, monkeypatch)
    assert (info["source"], info["wanted"], info["reboot_required"], info["current"]) == ("none", [], False, ["ro", "quiet"])


def test_info_without_proc(tmp_path, capsys, monkeypatch):
    info = run(kernel_cmdline_info, {"root": str(tmp_path)}, capsys, monkeypatch)
    assert info["failed"] is True and "Cannot read /proc/cmdline" in info["msg"]


def test_chroot_is_not_used_on_the_real_root(monkeypatch):
    """With root / the tool runs directly, found by get_bin_path."""
    class Module:
        def get_bin_path(self, name, required=False):
            return {"update-grub": "/usr/sbin/update-grub"}.get(name)

        def fail_json(self, **kw):
            raise AssertionError(kw)

    class FS:
        root = "/"

        def exists(self, path):
            return path == "/etc/default/grub"

    cmd = HostCmd(Module(), FS())
    assert kernel_cmdline_exec.detect(cmd, "auto") == ("grub_dropin", ["/usr/sbin/update-grub"])
    assert cmd.argv(["/usr/sbin/update-grub"]) == ["/usr/sbin/update-grub"]


@pytest.mark.skipif(shutil.which("sh") is None, reason="no shell")
def test_dropin_with_no_owner_sources_cleanly(tmp_path):
    root = debian_tree(tmp_path)
    assert grub_mkconfig_variables(root)["GRUB_CMDLINE_LINUX_DEFAULT"] == "console=tty1 console=ttyS0"
