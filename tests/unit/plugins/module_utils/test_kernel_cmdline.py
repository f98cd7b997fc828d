# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure parts of kernel_cmdline: validation, conflicts, parsers, rendering, planning."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import cmdline as kc
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel import grub


@pytest.mark.parametrize("arg", ["iommu=pt", "intel_iommu=on", "amd_iommu=on", "pcie_aspm=off", "pcie_aspm.policy=performance",
                                 "hugepagesz=1G", "hugepages=64", "pci=noacs", "vfio-pci.ids=10de:2335,10de:22a3",
                                 "isolcpus=2-15,18-31", "console=ttyS0,115200n8", "quiet", "rd.driver.pre=vfio-pci",
                                 "intel_iommu=on,sm_on", "default_hugepagesz=1G"])
def test_valid_args(arg):
    assert kc.validate_arg(arg) == arg


@pytest.mark.parametrize("arg,shown", [
    ("pcie_aspm=off;reboot", "';'"), ("a=b c", "' '"), ("x=$(id)", "'$' '(' ')'"), ("x=`id`", "'`'"),
    ('dyndbg="+p"', "'\"'"), ("a=b|c", "'|'"), ("a=b&", "'&'"), ("a=b>c", "'>'"), ("a\nb", "'\\n'"),
    ("x='y'", "\"'\""), ("a=*", "'*'"), ("a=b#c", "'#'"), ("a=b\\c", "'\\\\'"),
])
def test_shell_metacharacters_are_named(arg, shown):
    with pytest.raises(kc.CmdlineError, match="is refused because of") as err:
        kc.validate_arg(arg)
    assert shown in str(err.value)


@pytest.mark.parametrize("arg", ["=on", "-x", ".x", "iommu=", "aé=1", "a=é"])
def test_malformed_args(arg):
    with pytest.raises(kc.CmdlineError):
        kc.validate_arg(arg)


def test_empty_and_long_args():
    with pytest.raises(kc.CmdlineError, match="empty kernel argument"):
        kc.validate_arg("")
    with pytest.raises(kc.CmdlineError, match="characters long"):
        kc.validate_arg("a=" + "b" * 300)


def test_validate_args_dedupes_in_order():
    assert kc.validate_args(["iommu=pt", "intel_iommu=on", "iommu=pt"]) == ["iommu=pt", "intel_iommu=on"]
    assert kc.validate_args(None) == []


@pytest.mark.parametrize("owner", ["pcie_link", "vfio", "hugepages", "a1"])
def test_valid_owner(owner):
    assert kc.validate_owner(owner) == owner


@pytest.mark.parametrize("owner", ["", "PCIe", "1abc", "a-b", "a" * 65, "pcie link"])
def test_invalid_owner(owner):
    with pytest.raises(kc.CmdlineError, match="is not valid"):
        kc.validate_owner(owner)


def test_conflicts_same_key_across_owners():
    out = kc.find_conflicts({"pcie_link": ["pcie_aspm=off"], "power": ["pcie_aspm=force"]})
    assert out == ["pcie_aspm: pcie_aspm=force (owner power) vs pcie_aspm=off (owner pcie_link); "
                   "the kernel would see both and one silently wins"]


def test_same_arg_in_two_owners_is_no_conflict():
    assert kc.find_conflicts({"vfio": ["iommu=pt"], "rdma": ["iommu=pt"]}) == []


def test_flag_vs_value_conflicts():
    assert kc.find_conflicts({"a": ["intel_iommu"], "b": ["intel_iommu=off"]})


def test_repeatable_keys():
    owners = {"hugepages": ["hugepagesz=1G", "hugepages=8"], "dpdk": ["hugepagesz=2M", "hugepages=512"]}
    assert kc.find_conflicts(owners) == []
    out = kc.find_conflicts(owners, grubby=True)
    assert len(out) == 2 and all("grubby keeps one value per key" in m for m in out)


def test_contradictions():
    assert kc.find_conflicts({"a": ["iommu=off"], "b": ["amd_iommu=on"]}) == [
        "iommu=off (owner a) contradicts amd_iommu=on (owner b)"]


def test_split_cmdline_keeps_quoted_values():
    assert kc.split_cmdline('BOOT_IMAGE=/vmlinuz ro  dyndbg="file x.c +p" quiet\n') == [
        "BOOT_IMAGE=/vmlinuz", "ro", 'dyndbg="file x.c +p"', "quiet"]
    assert kc.split_cmdline(None) == [] and kc.split_cmdline("") == []


def test_dropin_round_trip_and_order():
    owners = {"vfio": ["intel_iommu=on", "iommu=pt"], "pcie_link": ["pcie_aspm=off"], "empty": []}
    text = kc.render_dropin(owners)
    assert text.startswith(kc.DROPIN_HEADER)
    lines = text[len(kc.DROPIN_HEADER):].splitlines()
    assert lines == ['GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} pcie_aspm=off" # gpufleet-owner=pcie_link',
                     'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} intel_iommu=on iommu=pt" # gpufleet-owner=vfio']
    parsed, foreign = kc.parse_dropin(text)
    assert parsed == {"pcie_link": ["pcie_aspm=off"], "vfio": ["intel_iommu=on", "iommu=pt"]} and foreign == []
    assert kc.render_dropin({}) is None and kc.render_dropin({"a": []}) is None


def test_parse_dropin_reports_foreign_lines():
    owners, foreign = kc.parse_dropin('# comment\n\nGRUB_CMDLINE_LINUX="x"\n'
                                      'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} a=1" # gpufleet-owner=o\n')
    assert owners == {"o": ["a=1"]} and foreign == ['GRUB_CMDLINE_LINUX="x"']


def test_foreign_grub_args():
    texts = ['GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\nGRUB_CMDLINE_LINUX="console=ttyS0 $EXTRA"\n',
             "export GRUB_CMDLINE_LINUX_DEFAULT='iommu=pt'\n", "GRUB_CMDLINE_LINUX=nomodeset # comment\n",
             "GRUB_TIMEOUT=5\n"]
    assert kc.foreign_grub_args(texts) == ["quiet", "splash", "console=ttyS0", "iommu=pt", "nomodeset"]


def test_grub_cfg_args_first_entry():
    cfg = ("set default=0\nmenuentry 'Debian' {\n\tlinux\t/boot/vmlinuz-6.1 root=UUID=1 ro quiet pcie_aspm=off\n}\n"
           "menuentry 'recovery' {\n\tlinux\t/boot/vmlinuz-6.1 root=UUID=1 ro single\n}\n")
    assert kc.grub_cfg_args(cfg) == ["root=UUID=1", "ro", "quiet", "pcie_aspm=off"]
    assert kc.grub_cfg_args("\tlinuxefi /vmlinuz ro x=1\n") == ["ro", "x=1"]
    assert kc.grub_cfg_args("no entries") is None and kc.grub_cfg_args(None) is None


def test_parse_grubby_info():
    text = ('index=0\nkernel="/boot/vmlinuz-5.14"\nargs="ro quiet iommu=pt"\nroot="/dev/sda"\ntitle="Rocky (5.14)"\n'
            'index=1\nkernel="/boot/vmlinuz-0-rescue-abc"\nargs="ro"\ntitle="Rocky (0-rescue-abc)"\n'
            "non-entry line\n")
    entries = grub.parse_grubby_info(text)
    got = [(e["index"], e["args"], e["rescue"]) for e in entries]
    assert got == [(0, ["ro", "quiet", "iommu=pt"], False), (1, ["ro"], True)]


def test_state_parse_and_render():
    assert kc.parse_state(None) == kc.empty_state()
    state = {"format": kc.STATE_FORMAT, "owners": {"vfio": ["iommu=pt"], "x": []}, "pending_removal": {"pci=noacs": "vfio"}}
    text = kc.render_state(state)
    assert kc.parse_state(text) == {"format": kc.STATE_FORMAT, "owners": {"vfio": ["iommu=pt"]},
                                    "pending_removal": {"pci=noacs": "vfio"}}
    assert kc.render_state(kc.empty_state()) is None
    with pytest.raises(kc.CmdlineError, match="not valid JSON"):
        kc.parse_state("{", "/etc/gpufleet/kernel_cmdline.json")
    with pytest.raises(kc.CmdlineError, match="not a gpufleet.inference.kernel_cmdline state file"):
        kc.parse_state('{"format": "other"}')


def test_change_owner_and_wanted():
    owners = {"b": ["x=1"], "a": ["y=2", "x=1"]}
    assert kc.wanted_args(owners) == ["y=2", "x=1"]
    assert kc.change_owner(owners, "c", ["z"], "present") == {"b": ["x=1"], "a": ["y=2", "x=1"], "c": ["z"]}
    assert kc.change_owner(owners, "a", ["z"], "absent") == {"b": ["x=1"]}
    assert kc.change_owner(owners, "a", [], "present") == {"b": ["x=1"]}
    assert owners == {"b": ["x=1"], "a": ["y=2", "x=1"]}  # not modified


def test_pending_after_removal_and_pruning():
    before = {"vfio": ["intel_iommu=on", "iommu=pt"], "rdma": ["iommu=pt"]}
    after = kc.change_owner(before, "vfio", [], "absent")
    pending = kc.pending_after({}, before, after, "vfio", ["ro", "intel_iommu=on", "iommu=pt"])
    assert pending == {"intel_iommu=on": "vfio"}  # iommu=pt is still wanted by rdma
    # an arg only in the configuration (never booted) stays pending until it is gone from there too
    assert kc.pending_after({}, before, after, "vfio", ["ro"], ["intel_iommu=on"]) == {"intel_iommu=on": "vfio"}
    assert kc.pending_after({"pci=noacs": "x"}, {}, {}, "x", ["ro"]) == {}
    # re-adding a pending argument takes it off the list
    assert kc.pending_after({"pci=noacs": "x"}, {}, {"x": ["pci=noacs"]}, "x", ["pci=noacs"]) == {}


def test_status_as_sets():
    owners = {"pcie_link": ["pcie_aspm=off"], "vfio": ["iommu=pt"]}
    st = kc.status(owners, ["ro", "iommu=pt", "pci=noacs"], {"pci=noacs": "vfio", "gone=1": "vfio"}, owner="pcie_link")
    assert st["missing"] == ["pcie_aspm=off"] and st["unexpected"] == ["pci=noacs"]
    assert st["reboot_required"] is True and st["owner_reboot_required"] is True
    st = kc.status(owners, ["iommu=pt", "pcie_aspm=off", "pci=noacs"], {"pci=noacs": "vfio"}, owner="pcie_link")
    assert st["owner_reboot_required"] is False and st["reboot_required"] is True
    st = kc.status(owners, ["iommu=pt", "pcie_aspm=off", "pci=noacs"], {"pci=noacs": "vfio"}, foreign=["pci=noacs"])
    assert st["reboot_required"] is False and "owner_reboot_required" not in st


def test_foreign_conflicts():
    out = kc.foreign_conflicts({"a": ["pcie_aspm=off", "hugepages=8"]}, ["pcie_aspm=force", "hugepages=4"], {})
    assert out == ["the running kernel has pcie_aspm=force, set outside gpufleet.inference, and pcie_aspm=off is wanted"]
    assert kc.foreign_conflicts({"a": ["pcie_aspm=off"]}, ["pcie_aspm=force"], {"pcie_aspm=force": "b"}) == []


def test_plan_dropin():
    owners = {"pcie_link": ["pcie_aspm=off"]}
    text = kc.render_dropin(owners)
    cfg_ok = "\tlinux /vmlinuz ro pcie_aspm=off\n"
    assert kc.plan_dropin(text, owners, cfg_ok, [])["actions"] == []
    assert [a["action"] for a in kc.plan_dropin(None, owners, cfg_ok, [])["actions"]] == ["write_dropin", "update_grub"]
    assert [a["action"] for a in kc.plan_dropin(text, {}, cfg_ok, ["pcie_aspm=off"])["actions"]] == ["remove_dropin", "update_grub"]
    stale = kc.plan_dropin(text, owners, "\tlinux /vmlinuz ro\n", [])["actions"]
    assert [a["action"] for a in stale] == ["update_grub"] and "(pcie_aspm=off)" in stale[0]["reason"]
    removed = kc.plan_dropin(None, {}, "\tlinux /vmlinuz ro pci=noacs\n", ["pci=noacs"])["actions"]
    assert [a["action"] for a in removed] == ["update_grub"]
    # an argument set by /etc/default/grub is not ours to chase out of grub.cfg
    assert kc.plan_dropin(None, {}, "\tlinux /vmlinuz ro pci=noacs\n", ["pci=noacs"], foreign=["pci=noacs"])["actions"] == []
    # no grub.cfg to compare with: only a drop-in change triggers update-grub
    assert kc.plan_dropin(text, owners, None, [])["actions"] == []


def test_plan_grubby_ignores_rescue_entries():
    entries = [{"args": ["ro", "iommu=pt"], "rescue": False}, {"args": ["ro"], "rescue": True}]
    assert kc.plan_grubby(entries, {"vfio": ["iommu=pt"]}, []) == {"add": [], "remove": []}
    assert kc.plan_grubby(entries, {}, ["iommu=pt"]) == {"add": [], "remove": ["iommu=pt"]}
    assert kc.plan_grubby(entries, {"v": ["iommu=pt", "intel_iommu=on"]}, []) == {"add": ["intel_iommu=on"], "remove": []}
    only_rescue = [{"args": ["ro"], "rescue": True}]
    assert kc.plan_grubby(only_rescue, {"v": ["x=1"]}, []) == {"add": ["x=1"], "remove": []}
